"""Build and drive the stand-in libnvidia-ml.so.1 (tests/tools/nvml_stub/fake_nvml.c).

The library is compiled with gcc on first use and cached by the hash of its source, so `make test`
on a clean clone builds it and later runs reuse it. Code under test loads it the way it loads the
real one: `CDLL("libnvidia-ml.so.1")` inside nvidia-ml-py, found through LD_LIBRARY_PATH, so the
process that imports pynvml must be started with `env()` (a subprocess, or an ansible-runner run).

    lib_dir = build()                         # directory holding libnvidia-ml.so.1
    path = write_state(tmp_path / 'nvml.state', {...})
    subprocess.run([...], env={**os.environ, **env(lib_dir, path)})

`write_state` renders the dict form below into the text format documented in
tests/tools/nvml_stub/README.md (the lab writes one such file per emulated node).

    {'driver_version': '580.126.20', 'cuda_version': 13000,
     'init_error': 'DRIVER_NOT_LOADED',            # optional: nvmlInit fails with it
     'fail': {'nvmlSystemGetCudaDriverVersion': 'NOT_SUPPORTED'},
     'gpus': [{'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-…', 'bus_id': '00000000:17:00.0',
               'pci': '10de:2330/10de:16c1', 'mig': (1, 1), 'ecc_mode': (1, 1),
               'ecc': {'corrected_volatile': 0, 'corrected_aggregate': 0,
                       'uncorrected_volatile': 0, 'uncorrected_aggregate': 0},
               'retired_pages_pending': 0, 'remapped_rows': (0, 0, 0, 0), 'temperature': 41,
               'processes': [{'pid': 4242, 'used_bytes': 1 << 30, 'name': 'python3'}],
               'fail': {'nvmlDeviceGetRemappedRows': 'NOT_SUPPORTED'},   # or {'*': 'GPU_IS_LOST'}
               'xids': [79]}]}
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Any, Iterator, Mapping

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / 'nvml_stub' / 'fake_nvml.c'
DEFAULT_CACHE = HERE.parent / 'output' / 'nvml_stub'
LIB_NAME = 'libnvidia-ml.so.1'
STATE_ENV = 'GPUFLEET_FAKE_NVML_STATE'


class BuildError(RuntimeError):
    pass


def build(dest_dir: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Compile the stand-in (once per source hash) and return the directory holding it."""
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    out_dir = pathlib.Path(dest_dir) if dest_dir is not None else DEFAULT_CACHE
    out_dir = out_dir / digest
    lib = out_dir / LIB_NAME
    if lib.is_file():
        return out_dir
    cc = os.environ.get('CC') or shutil.which('gcc') or shutil.which('cc')
    if not cc:
        raise BuildError('gcc not found: the NVML stand-in needs a C compiler (apt-get install gcc)')
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.build-', suffix='.so', dir=out_dir)
    os.close(fd)
    cmd = [cc, '-shared', '-fPIC', '-O1', '-std=gnu11', '-Wall', '-Wextra', '-Werror',
           '-Wl,-soname,' + LIB_NAME, '-o', tmp, str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise BuildError('building the NVML stand-in failed (%s):\n%s' % (' '.join(cmd), proc.stderr))
    os.replace(tmp, lib)  # atomic: parallel builders never see a half-written library
    return out_dir


def env(lib_dir: str | os.PathLike[str], state_path: str | os.PathLike[str]) -> dict[str, str]:
    """Environment variables that make a new process load the stand-in with this state."""
    ld = os.environ.get('LD_LIBRARY_PATH', '')
    return {
        'LD_LIBRARY_PATH': str(lib_dir) + (os.pathsep + ld if ld else ''),
        STATE_ENV: str(state_path),
    }


def _pci_fields(pci: str) -> str:
    vendor_device, sub = pci.split('/')
    vendor, device = vendor_device.split(':')
    subvendor, subdevice = sub.split(':')
    return '%s %s %s %s' % (vendor, device, subvendor, subdevice)


def _flag(value: Any) -> int:
    return 1 if value else 0


def render_state(state: Mapping[str, Any]) -> str:
    """The text form of a state dict (see the module docstring and README.md)."""
    lines = ['# gpufleet.upgrade fake NVML state (tests/tools/nvml_stub/README.md)']
    if state.get('driver_version') is not None:
        lines.append('driver_version %s' % state['driver_version'])
    if state.get('cuda_version') is not None:
        lines.append('cuda_version %d' % int(state['cuda_version']))
    if state.get('init_error'):
        lines.append('init_error %s' % state['init_error'])
    for fn, err in (state.get('fail') or {}).items():
        lines.append('fail %s %s' % (fn, err))
    for gpu in state.get('gpus') or []:
        lines.append('gpu')
        for key in ('name', 'uuid', 'bus_id'):
            if gpu.get(key) is not None:
                lines.append('%s %s' % (key, gpu[key]))
        if gpu.get('pci'):
            lines.append('pci %s' % _pci_fields(gpu['pci']))
        if gpu.get('mig') is not None:
            lines.append('mig %d %d' % tuple(_flag(v) for v in gpu['mig']))
        if gpu.get('ecc_mode') is not None:
            lines.append('ecc_mode %d %d' % tuple(_flag(v) for v in gpu['ecc_mode']))
        for key, value in (gpu.get('ecc') or {}).items():
            lines.append('ecc_%s %s' % (key, '-' if value is None else int(value)))
        if gpu.get('retired_pages_pending') is not None:
            lines.append('retired_pages_pending %d' % _flag(gpu['retired_pages_pending']))
        if gpu.get('remapped_rows') is not None:
            lines.append('remapped_rows %d %d %d %d' % tuple(int(v) for v in gpu['remapped_rows']))
        if gpu.get('temperature') is not None:
            lines.append('temperature %d' % int(gpu['temperature']))
        for p in gpu.get('processes') or []:
            used = p.get('used_bytes')
            lines.append(('process %d %s %s' % (p['pid'], '-' if used is None else int(used), p.get('name') or '')).rstrip())
        for fn, err in (gpu.get('fail') or {}).items():
            lines.append('fail %s %s' % (fn, err))
        for code in gpu.get('xids') or []:
            lines.append('xid %d' % int(code))
    return '\n'.join(lines) + '\n'


def write_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> pathlib.Path:
    p = pathlib.Path(path)
    p.write_text(render_state(state))
    return p


@dataclasses.dataclass
class FakeNvml:
    """One test's handle on the stand-in: write a state, get the environment for a subprocess."""
    lib_dir: pathlib.Path
    state_path: pathlib.Path

    def write(self, state: Mapping[str, Any]) -> pathlib.Path:
        return write_state(self.state_path, state)

    @property
    def env(self) -> dict[str, str]:
        return env(self.lib_dir, self.state_path)


@pytest.fixture(scope='session')
def nvml_stub_lib() -> pathlib.Path:
    """Directory holding the compiled stand-in libnvidia-ml.so.1 (built on first use)."""
    return build()


@pytest.fixture
def fake_nvml(nvml_stub_lib: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[FakeNvml]:
    yield FakeNvml(lib_dir=nvml_stub_lib, state_path=tmp_path / 'nvml.state')
