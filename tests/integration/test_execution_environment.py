"""meta/execution-environment.yml with the real ansible-builder: schema, build context, introspection."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import yaml
from ansible_builder import _target_scripts
from ansible_builder.ee_schema import validate_schema

REPO = pathlib.Path(__file__).resolve().parents[2]
EE = REPO / 'meta' / 'execution-environment.yml'
INTROSPECT = pathlib.Path(_target_scripts.__file__).parent / 'introspect.py'


def _requirements():
    lines = [ln.split('#')[0].strip() for ln in (REPO / 'requirements.txt').read_text().splitlines()]
    return [ln for ln in lines if ln]


def test_schema_v3_and_documented_base_image():
    data = yaml.safe_load(EE.read_text())
    validate_schema(data)  # raises on any schema error
    assert data['version'] == 3
    assert data['images']['base_image']['name'] == 'quay.io/centos/centos:stream9'
    assert data['dependencies']['python'] == 'requirements.txt'
    assert 'system' not in data['dependencies']  # no kubectl, no compiler
    assert data['dependencies']['ansible_core']['package_pip'] == 'ansible-core>=2.19,<2.22'


def test_build_context_from_the_collection_root(tmp_path):
    root = tmp_path / 'collection'
    root.mkdir()
    shutil.copy(REPO / 'requirements.txt', root / 'requirements.txt')
    shutil.copy(EE, root / 'execution-environment.yml')
    ctx = tmp_path / 'context'
    res = subprocess.run([str(pathlib.Path(sys.executable).parent / 'ansible-builder'), 'create',
                          '-f', str(root / 'execution-environment.yml'), '-c', str(ctx),
                          '--output-filename', 'Containerfile'],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    containerfile = (ctx / 'Containerfile').read_text()
    assert 'ARG EE_BASE_IMAGE="quay.io/centos/centos:stream9"' in containerfile
    assert 'ARG PYCMD="/usr/bin/python3.12"' in containerfile
    copied = (ctx / '_build' / 'requirements.txt').read_text()
    for req in _requirements():
        assert req in copied


def test_introspection_takes_python_deps_from_the_installed_collection():
    # .venv/collections holds ansible_collections/gpufleet/upgrade (the checkout), as an EE would.
    res = subprocess.run([sys.executable, str(INTROSPECT), 'introspect', str(REPO / '.venv' / 'collections')],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    data = yaml.safe_load(res.stdout)
    python = [ln.split('#')[0].strip() for ln in data['python']]
    assert 'kubernetes>=31.0.0,<38' in python and 'nvidia-ml-py>=12.535,<14' in python
    # ansible-core and pyyaml come with the EE itself: introspection leaves them out
    assert not any(p.startswith(('ansible-core', 'pyyaml')) for p in python)
    assert data['system'] == []
