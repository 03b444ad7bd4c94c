# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""Host facts around the GPU driver: a command-runner abstraction, loaded kernel modules
(/proc/modules), boot time (/proc/stat), installed driver packages (dpkg-query / rpm) and the
kernel log (journalctl / dmesg / a file).

Every command goes through a `Runner` so modules use `AnsibleModule.run_command` and unit tests
replay recorded outputs; paths under /proc are parameters so tests point them at fixtures.
"""
from __future__ import annotations

import datetime as _dt
import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

__all__ = ['BackendError', 'CommandResult', 'Runner', 'ModuleRunner', 'NullRunner', 'HostError',
           'read_proc_modules', 'nvidia_modules', 'boot_time', 'installed_driver_packages',
           'read_kernel_log', 'empty_gpu', 'NVIDIA_MODULE_NAMES', 'PACKAGE_PATTERNS']

# Kernel modules that belong to the NVIDIA driver stack (names as /proc/modules spells them).
NVIDIA_MODULE_NAMES = ('nvidia', 'nvidia_modeset', 'nvidia_uvm', 'nvidia_drm', 'nvidia_peermem',
                       'nvidia_fs', 'nvidia_vgpu_vfio', 'nvidia_vgpu', 'gdrdrv', 'nv_peer_mem')

# Driver-related package name patterns (glob, as dpkg-query -W and rpm -qa take them): the Ubuntu
# and CUDA-repository driver, utils, compute and precompiled-module packages, Fabric Manager,
# libnvidia-nscq, the CUDA-repository meta packages and DCGM.
PACKAGE_PATTERNS = ('*nvidia*', 'cuda-drivers*', 'datacenter-gpu-manager*')


def empty_gpu(index: int) -> dict[str, Any]:
    """One GPU's facts before any is read: the shape both backends (NVML, nvidia-smi) fill in."""
    return {
        'index': index, 'uuid': None, 'name': None, 'bus_id': None, 'pci_id': None,
        'mig_mode': {'current': None, 'pending': None},
        'ecc': {'enabled': None, 'volatile_uncorrected': None, 'aggregate_uncorrected': None,
                'volatile_corrected': None, 'aggregate_corrected': None},
        'retired_pages_pending': None, 'remapped_rows': None, 'temperature_c': None,
        'processes': [], 'errors': {},
    }


class HostError(Exception):
    pass


class BackendError(Exception):
    """The GPU backend exists but could not answer (driver not loaded, library mismatch)."""


class CommandResult(NamedTuple):
    rc: int
    stdout: str
    stderr: str


class Runner:
    """Runs a command (argv list, never a shell) and finds programs."""

    def run(self, argv: Sequence[str], timeout: Optional[int] = None) -> CommandResult:
        raise NotImplementedError

    def which(self, name: str) -> Optional[str]:
        raise NotImplementedError


def _bounded(argv: Sequence[str], timeout: Optional[int], which: Callable[[str], Optional[str]]) -> list[str]:
    """Prefix coreutils `timeout` so a hung command (nvidia-smi on a broken GPU) cannot block."""
    argv = list(argv)
    if timeout:
        tool = which('timeout')
        if tool:
            return [tool, '-k', '5', str(int(timeout))] + argv
    return argv


class ModuleRunner(Runner):
    """Runner over an AnsibleModule (run_command with LANG=C, get_bin_path)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def which(self, name: str) -> Optional[str]:
        return self.module.get_bin_path(name, required=False)

    def run(self, argv: Sequence[str], timeout: Optional[int] = None) -> CommandResult:
        rc, out, err = self.module.run_command(_bounded(argv, timeout, self.which), check_rc=False,
                                               environ_update={'LANG': 'C', 'LC_ALL': 'C'})
        return CommandResult(rc, out, err)


class NullRunner(Runner):
    """Runs nothing and finds no program: for callers that only want NVML facts (no packages,
    kernel log from a file or none, no nvidia-smi)."""

    def which(self, name: str) -> Optional[str]:
        return None

    def run(self, argv: Sequence[str], timeout: Optional[int] = None) -> CommandResult:
        raise HostError('no command runner was given, so %s cannot run' % argv[0])


def read_proc_modules(path: str = '/proc/modules') -> list[dict[str, Any]]:
    """Every loaded module: name, size, refcount, used_by, state."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            used_by = [] if len(parts) < 4 or parts[3] == '-' else [u for u in parts[3].split(',') if u]
            out.append({'name': parts[0], 'size': int(parts[1]), 'refcount': int(parts[2]),
                        'used_by': used_by, 'state': parts[4] if len(parts) > 4 else None})
    return out


def nvidia_modules(path: str = '/proc/modules') -> list[dict[str, Any]]:
    """The NVIDIA driver-stack modules loaded now, as gpu_info reports them (name, refcount, used_by)."""
    if not os.path.exists(path):
        return []
    return [{'name': m['name'], 'refcount': m['refcount'], 'used_by': m['used_by']}
            for m in read_proc_modules(path)
            if m['name'] in NVIDIA_MODULE_NAMES or m['name'].startswith('nvidia')]


def boot_time(proc_stat: str = '/proc/stat') -> Optional[_dt.datetime]:
    """When this host booted (the `btime` line of /proc/stat), or None."""
    try:
        with open(proc_stat) as f:
            for line in f:
                if line.startswith('btime '):
                    return _dt.datetime.fromtimestamp(int(line.split()[1]), _dt.timezone.utc)
    except (OSError, ValueError):
        return None
    return None


def installed_driver_packages(runner: Runner) -> list[dict[str, str]]:
    """Installed driver-related packages with their versions, sorted by name.

    dpkg-query where dpkg exists (Debian/Ubuntu), else rpm (RHEL family; version is
    `[epoch:]version-release`). An empty list when neither tool exists.
    """
    if runner.which('dpkg-query'):
        res = runner.run(['dpkg-query', '-W', '-f', '${db:Status-Abbrev}\\t${Package}\\t${Version}\\n']
                         + list(PACKAGE_PATTERNS), timeout=60)
        # rc 1 only means some pattern matched nothing; the matches are still on stdout.
        if res.rc not in (0, 1):
            raise HostError('dpkg-query failed (rc %d): %s' % (res.rc, res.stderr.strip()))
        pkgs = {}
        for line in res.stdout.splitlines():
            parts = line.split('\t')
            if len(parts) != 3:
                continue
            status, name, version = parts
            # Second letter: i installed, W/t triggers pending (still installed); "un" and "rc"
            # are known to dpkg but not installed.
            if len(status) >= 2 and status[1] in 'iWt' and version:
                pkgs[name] = version
        return [{'name': n, 'version': pkgs[n]} for n in sorted(pkgs)]
    if runner.which('rpm'):
        res = runner.run(['rpm', '-qa', '--qf', '%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\n']
                         + list(PACKAGE_PATTERNS), timeout=60)
        if res.rc != 0:
            raise HostError('rpm -qa failed (rc %d): %s' % (res.rc, res.stderr.strip()))
        pkgs = {}
        for line in res.stdout.splitlines():
            parts = line.split('\t')
            if len(parts) == 2 and parts[0]:
                version = parts[1][2:] if parts[1].startswith('0:') else parts[1]
                pkgs[parts[0]] = version
        return [{'name': n, 'version': pkgs[n]} for n in sorted(pkgs)]
    return []


def read_kernel_log(runner: Runner, source: str, since: Optional[_dt.datetime], since_boot: bool) -> list[str]:
    """Kernel-log lines from `journal` (journalctl -k), `dmesg`, or a file path.

    The journal is asked for `-o short-iso-precise` (every line has a wall-clock time) and
    restricted to this boot or to `since`; dmesg is asked for ISO times and falls back to its raw
    `[seconds]` form. Filtering by time happens in the caller as well, so a coarse source is safe.
    """
    if source == 'journal':
        if not runner.which('journalctl'):
            raise HostError("kernel_log=journal: journalctl not found on this host; use kernel_log=dmesg or a file path")
        argv = ['journalctl', '-k', '--no-pager', '-q', '-o', 'short-iso-precise']
        if since_boot:
            argv.append('-b')
        elif since is not None:
            argv += ['--since', '@%d' % int(since.timestamp())]
        res = runner.run(argv, timeout=120)
        if res.rc != 0:
            raise HostError('journalctl -k failed (rc %d): %s' % (res.rc, res.stderr.strip()))
        return res.stdout.splitlines()
    if source == 'dmesg':
        if not runner.which('dmesg'):
            raise HostError('kernel_log=dmesg: dmesg not found on this host')
        res = runner.run(['dmesg', '--time-format', 'iso'], timeout=60)
        if res.rc != 0:
            res = runner.run(['dmesg'], timeout=60)
        if res.rc != 0:
            raise HostError('dmesg failed (rc %d): %s' % (res.rc, res.stderr.strip()))
        return res.stdout.splitlines()
    try:
        with open(source, errors='replace') as f:
            return f.read().splitlines()
    except OSError as e:
        raise HostError('kernel_log=%s: cannot read the file: %s' % (source, e.strerror or e))
