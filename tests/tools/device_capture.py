#!/usr/bin/env python3
"""Capture real-GPU fixtures on a machine with an NVIDIA driver (issue 4's last step).

Read only: it changes no GPU setting, loads no module, installs nothing. It needs only Python >= 3.9
and the nvidia-ml-py binding; the device machine has no network, so `make device-bundle` puts the
binding's wheel under .device/ beforehand and this script puts it on sys.path.

    make device-bundle                       # on the build machine (downloads nvidia-ml-py)
    python3 tests/tools/device_capture.py --out "$OUT"     # on the GPU machine

It writes to --out:
  gpu_info.json        the facts gpufleet.upgrade.gpu_info returns (NVML backend, real driver)
  gpu_info_smi.json    the same facts through the nvidia-smi fallback backend
  nvidia-smi-q-x.xml   `nvidia-smi -q -x` (board serials replaced by placeholders)
  host.txt             uname -r, /proc/modules NVIDIA lines, driver packages, NVRM kernel-log lines
Then copy the XML to tests/unit/fixtures/nvidia_smi/<model>x<count>_r<branch>.xml and the JSON to
tests/unit/fixtures/gpu_info/, and write the parsing tests against them (see the fixtures README).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]


def _import_path() -> None:
    """Make `ansible_collections.gpufleet.upgrade` importable from this checkout, and the bundled binding."""
    root = pathlib.Path(tempfile.mkdtemp(prefix='gpufleet-capture-'))
    (root / 'ansible_collections' / 'gpufleet').mkdir(parents=True)
    (root / 'ansible_collections' / 'gpufleet' / 'upgrade').symlink_to(REPO)
    sys.path[:0] = [str(root)] + sorted(glob.glob(str(REPO / '.device' / '*.whl')))


_import_path()

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost, _nvml  # noqa: E402


class SubprocessRunner(_gpuhost.Runner):
    def which(self, name: str) -> Optional[str]:
        return shutil.which(name)

    def run(self, argv: Sequence[str], timeout: Optional[int] = None) -> _gpuhost.CommandResult:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout or 120,
                           env=dict(os.environ, LANG='C', LC_ALL='C'))
        return _gpuhost.CommandResult(p.returncode, p.stdout, p.stderr)


def scrub(xml: str) -> str:
    return re.sub(r'<serial>[^<]*</serial>', '<serial>0000000000000</serial>', xml)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', required=True, help='folder for the captured files')
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runner = SubprocessRunner()
    log = 'dmesg' if os.geteuid() == 0 else None
    status = 0
    for name, backend in (('gpu_info.json', 'nvml'), ('gpu_info_smi.json', 'nvidia-smi')):
        try:
            facts = _nvml.collect_facts(backend=backend, runner=runner, kernel_log=log, xid_since='boot')
        except Exception as e:  # a capture tool: record what failed and go on with the rest
            facts = {'capture_error': '%s: %s' % (type(e).__name__, e)}
            status = 1
        (out / name).write_text(json.dumps(facts, indent=2, sort_keys=True, default=str) + '\n')
        print('%s: %s' % (name, facts.get('capture_error') or '%d GPU(s), driver %s' % (
            len(facts['gpus']), facts['driver_version'])))
    smi = shutil.which('nvidia-smi')
    if smi:
        p = subprocess.run([smi, '-q', '-x'], capture_output=True, text=True, timeout=120)
        (out / 'nvidia-smi-q-x.xml').write_text(scrub(p.stdout))
    host = ['uname -r: ' + os.uname().release]
    modules = pathlib.Path('/proc/modules')
    host += [line for line in modules.read_text().splitlines() if 'nvidia' in line] if modules.exists() else []
    for argv in (['dpkg-query', '-W', '-f', '${Package} ${Version}\n', '*nvidia*'], ['rpm', '-qa', '*nvidia*'],
                 ['dmesg']):
        if shutil.which(argv[0]):
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                host.append(' '.join(argv) + ': timed out')
                continue
            lines = p.stdout.splitlines()
            host += [' '.join(argv)] + ([ln for ln in lines if 'NVRM' in ln] if argv[0] == 'dmesg' else lines)
    (out / 'host.txt').write_text('\n'.join(host) + '\n')
    return status


if __name__ == '__main__':
    sys.exit(main())
