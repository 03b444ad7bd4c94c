"""tests/tools/zipimport_cache (issue 36): a module process and the collection loader compile each file once per
source; a changed source is compiled again; without GPUFLEET_ZIPIMPORT_CACHE nothing is cached; a cached code
object runs as the compiled one does."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import zipfile

from tools import zipimport_cache

HERE = pathlib.Path(zipimport_cache.__file__).resolve().parent / 'zipimport_cache'


def run(tmp_path: pathlib.Path, zipped: pathlib.Path, cache: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'GPUFLEET_ZIPIMPORT_CACHE')}
    env['PYTHONPATH'] = str(HERE)
    if cache:
        env['GPUFLEET_ZIPIMPORT_CACHE'] = cache
    code = 'import sys; sys.path.insert(0, %r); import payload_mod; print(payload_mod.answer())' % str(zipped)
    return subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True, cwd=tmp_path)


def payload(tmp_path: pathlib.Path, value: int) -> pathlib.Path:
    zipped = tmp_path / ('payload-%d.zip' % value)
    with zipfile.ZipFile(zipped, 'w') as z:
        z.writestr('payload_mod.py', textwrap.dedent('''
            def answer():
                return %d
        ''' % value))
    return zipped


def cached_files(cache: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in cache.rglob('*') if p.is_file()) if cache.exists() else []


def test_a_zipped_module_is_compiled_once_per_source(tmp_path):
    cache = tmp_path / 'cache'
    assert run(tmp_path, payload(tmp_path, 41), str(cache)).stdout.strip() == '41'
    first = cached_files(cache)
    assert len(first) == 1, first
    # the same source from another zip (each AnsiballZ payload is a new file): the cached code, the same answer
    other = tmp_path / 'other'
    other.mkdir()
    assert run(tmp_path, payload(other, 41), str(cache)).stdout.strip() == '41'
    assert cached_files(cache) == first
    # a changed source is compiled again, never answered from the old entry
    assert run(tmp_path, payload(tmp_path, 42), str(cache)).stdout.strip() == '42'
    assert len(cached_files(cache)) == 2


def test_without_the_setting_nothing_is_patched(tmp_path):
    assert run(tmp_path, payload(tmp_path, 7), None).stdout.strip() == '7'
    env = {k: v for k, v in os.environ.items() if k != 'GPUFLEET_ZIPIMPORT_CACHE'}
    env['PYTHONPATH'] = str(HERE)
    code = ('import sitecustomize, zipimport; from ansible.utils.collection_loader import _collection_finder as f; '
            'print(sitecustomize.__file__.endswith("zipimport_cache/sitecustomize.py"), '
            'zipimport._compile_source.__module__, hasattr(f, "compile"))')
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ['True', 'zipimport', 'False'], out.stdout + out.stderr


def test_the_collection_loader_compiles_through_the_cache(tmp_path):
    cache = tmp_path / 'cache'
    env = dict(os.environ, PYTHONPATH=str(HERE), GPUFLEET_ZIPIMPORT_CACHE=str(cache))
    code = ('from ansible.utils.collection_loader import _collection_finder as f; '
            'c = f.compile("x = 1\\n", "/c/x.py", "exec", flags=0, dont_inherit=True); ns = {}; exec(c, ns); '
            'print(f.compile.__name__, ns["x"])')
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ['_loader_compile', '1'], out.stdout + out.stderr
    assert len(cached_files(cache)) == 1


def test_the_environment_names_the_cache_and_can_be_turned_off(monkeypatch):
    monkeypatch.delenv('GPUFLEET_ZIPIMPORT_CACHE', raising=False)
    monkeypatch.setenv('PYTHONPATH', '/elsewhere')
    env = zipimport_cache.env()
    assert env['PYTHONPATH'].split(os.pathsep) == [str(HERE), '/elsewhere']
    assert env['GPUFLEET_ZIPIMPORT_CACHE'] == str(pathlib.Path(sys.prefix) / 'zipimport-cache')
    monkeypatch.setenv('GPUFLEET_ZIPIMPORT_CACHE', 'off')
    assert zipimport_cache.env() == {}
