# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""Safe NVIDIA driver unload: stop host GPU clients, find who holds /dev/nvidia*, unload modules.

The order and the client list follow NVIDIA's k8s-driver-manager (unload `nvidia_modeset,
nvidia_uvm, nvidia_peermem, nvidia_fs, nvidia_vgpu_vfio, gdrdrv, nvidia`) and the GPU Operator's
host GPU clients (nvidia-persistenced, nvidia-fabricmanager, nvidia-dcgm, dcgm, dcgm-exporter).
`nvidia_drm` goes first when loaded because it holds `nvidia_modeset`.

Nothing is half-done by choice: every blocker (a holder that is not a service being stopped, with
`kill_holders` off) is found before anything is stopped. A holder that appears between the stop
and the unload fails the run with what was already stopped reported.
"""
from __future__ import annotations

import os
import re
import signal
import time
from typing import Any, Callable, Iterable, Optional, Sequence

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost
from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import poll

__all__ = ['DEFAULT_SERVICES', 'UNLOAD_ORDER', 'UnloadError', 'find_holders', 'service_states',
           'plan_unload', 'execute', 'unit_of']

DEFAULT_SERVICES = ('nvidia-persistenced', 'nvidia-fabricmanager', 'nvidia-dcgm', 'dcgm', 'dcgm-exporter')
UNLOAD_ORDER = ('nvidia_drm', 'nvidia_modeset', 'nvidia_uvm', 'nvidia_peermem', 'nvidia_fs',
                'nvidia_vgpu_vfio', 'gdrdrv', 'nvidia')

_DEVICE_RE = re.compile(r'^/dev/nvidia')
_UNIT_RE = re.compile(r'/([^/]+\.service)(?:/|$)')


class UnloadError(Exception):
    def __init__(self, msg: str, **details: Any) -> None:
        super().__init__(msg)
        self.details = details


def _read(path: str) -> Optional[str]:
    try:
        with open(path, 'rb') as f:
            return f.read().decode('utf-8', 'replace')
    except OSError:
        return None


def unit_of(cgroup_text: Optional[str]) -> Optional[str]:
    """The systemd service a process runs in, from /proc/<pid>/cgroup (v1 or v2)."""
    for line in (cgroup_text or '').splitlines():
        m = _UNIT_RE.search(line.split(':', 2)[-1])
        if m:
            return m.group(1)
    return None


def find_holders(proc_root: str = '/proc', exclude_pids: Iterable[int] = ()) -> list[dict[str, Any]]:
    """Processes with an open file descriptor on /dev/nvidia* (like `fuser -v /dev/nvidia*`).

    Each: pid, comm, cmdline, unit (systemd service or None) and the sorted device paths.
    Processes that vanish or cannot be read while scanning are skipped.
    """
    skip = {int(p) for p in exclude_pids}
    holders = []
    try:
        entries = os.listdir(proc_root)
    except OSError as e:
        raise UnloadError('cannot list %s: %s' % (proc_root, e.strerror or e))
    for name in sorted((e for e in entries if e.isdigit()), key=int):
        pid = int(name)
        if pid in skip:
            continue
        fd_dir = os.path.join(proc_root, name, 'fd')
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        devices = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if _DEVICE_RE.match(target):
                devices.add(target)
        if not devices:
            continue
        comm = (_read(os.path.join(proc_root, name, 'comm')) or '').strip() or None
        cmdline = (_read(os.path.join(proc_root, name, 'cmdline')) or '').replace('\0', ' ').strip() or None
        holders.append({'pid': pid, 'comm': comm, 'cmdline': cmdline,
                        'unit': unit_of(_read(os.path.join(proc_root, name, 'cgroup'))),
                        'devices': sorted(devices)})
    return holders


def _unit(name: str) -> str:
    return name if '.' in name else name + '.service'


def service_states(runner: _gpuhost.Runner, services: Sequence[str]) -> dict[str, str]:
    """`systemctl is-active` of each service: active, inactive, failed, unknown (not installed), ..."""
    if not services:
        return {}
    systemctl = runner.which('systemctl')
    if not systemctl:
        return {s: 'unknown' for s in services}
    res = runner.run([systemctl, 'is-active'] + [_unit(s) for s in services], timeout=60)
    # rc is non-zero when any unit is not active; one output line per unit, in order.
    states = [line.strip() for line in res.stdout.splitlines() if line.strip()]
    if len(states) != len(services):
        raise UnloadError('systemctl is-active gave %d states for %d services (rc %d): %s'
                          % (len(states), len(services), res.rc, (res.stderr or res.stdout).strip()))
    return dict(zip(services, states))


def plan_unload(loaded: Iterable[str], states: dict[str, str], holders: list[dict[str, Any]],
                kill_holders: bool) -> dict[str, Any]:
    """What the unload will do: services to stop, holders that block or will be killed, modules in order."""
    to_stop = [s for s, st in states.items() if st in ('active', 'activating', 'reloading', 'deactivating')]
    stopping_units = {_unit(s) for s in to_stop}
    released = [h for h in holders if h['unit'] in stopping_units]
    others = [h for h in holders if h['unit'] not in stopping_units]
    loaded_set = set(loaded)
    return {
        'stop_services': to_stop,
        'released_by_stop': released,
        'kill': others if kill_holders else [],
        'blocking': [] if kill_holders else others,
        'unload_modules': [m for m in UNLOAD_ORDER if m in loaded_set],
    }


def describe_holders(holders: Iterable[dict[str, Any]]) -> str:
    parts = []
    for h in holders:
        unit = ', ' + h['unit'] if h['unit'] else ''
        parts.append('%s (pid %d%s: %s)' % (h['comm'] or '?', h['pid'], unit, ' '.join(h['devices'])))
    return ', '.join(parts)


def _loaded_modules(proc_root: str) -> list[str]:
    path = os.path.join(proc_root, 'modules')
    if not os.path.exists(path):
        return []
    return [m['name'] for m in _gpuhost.read_proc_modules(path)]


def _wait_gone(pids: Iterable[int], proc_root: str, timeout: float, sleep: Callable[[float], None],
               clock: Callable[[], float]) -> list[int]:
    left = list(pids)

    def still_there() -> list[int]:   # narrowed each look: a pid once gone is not looked at again
        left[:] = [p for p in left if os.path.exists(os.path.join(proc_root, str(p)))]
        return list(left)
    return poll(still_there, timeout, 0.2, clock, sleep, done=lambda remaining: not remaining).value


def send_signal(pid: int, sig: int) -> None:
    """os.kill, ignoring processes that are already gone (a seam for unit tests)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def execute(runner: _gpuhost.Runner, services: Sequence[str], kill_holders: bool = False,
            kill_timeout: int = 30, check_mode: bool = False, proc_root: str = '/proc',
            sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
            kill: Optional[Callable[[int, int], None]] = None) -> dict[str, Any]:
    """Plan, then (unless check_mode) stop services, kill holders if allowed, unload modules.

    Returns changed, plan, services_stopped, killed, modules_unloaded and diff (before/after
    active services and loaded NVIDIA modules). Raises UnloadError with the same fields in
    `details` on failure.
    """
    kill = kill or send_signal
    me = {os.getpid(), os.getppid()}
    loaded = _loaded_modules(proc_root)
    states = service_states(runner, services)
    holders = find_holders(proc_root, exclude_pids=me)
    plan = plan_unload(loaded, states, holders, kill_holders)
    before = {'services_active': list(plan['stop_services']), 'modules_loaded': list(plan['unload_modules'])}
    result: dict[str, Any] = {'plan': plan, 'holders': holders, 'services_stopped': [], 'killed': [],
                              'modules_unloaded': []}

    def fail(msg: str) -> UnloadError:
        return UnloadError(msg, **result)

    if plan['blocking']:
        raise fail('processes hold NVIDIA devices and kill_holders is false; stop them first: %s'
                   % describe_holders(plan['blocking']))
    changed = bool(plan['stop_services'] or plan['kill'] or plan['unload_modules'])
    after = {'services_active': [], 'modules_loaded': []}
    result.update(changed=changed, diff={'before': before, 'after': after})
    if check_mode or not changed:
        return result

    systemctl = runner.which('systemctl') or 'systemctl'
    rmmod = runner.which('rmmod') or 'rmmod'
    for svc in plan['stop_services']:
        res = runner.run([systemctl, 'stop', _unit(svc)], timeout=300)
        if res.rc != 0:
            raise fail('systemctl stop %s failed (rc %d): %s' % (_unit(svc), res.rc, res.stderr.strip()))
        result['services_stopped'].append(svc)

    # Processes of the stopped services must be gone; look again for anyone else.
    holders = find_holders(proc_root, exclude_pids=me)
    if holders and kill_holders:
        pids = [h['pid'] for h in holders]
        for pid in pids:
            kill(pid, signal.SIGTERM)
        left = _wait_gone(pids, proc_root, kill_timeout, sleep, clock)
        for pid in left:
            kill(pid, signal.SIGKILL)
        left = _wait_gone(left, proc_root, 5, sleep, clock)
        result['killed'] = [p for p in pids if p not in left]
        holders = find_holders(proc_root, exclude_pids=me)
    if holders:
        result['holders'] = holders
        raise fail('processes still hold NVIDIA devices after stopping %s: %s'
                   % (', '.join(result['services_stopped']) or 'no services', describe_holders(holders)))

    for mod in plan['unload_modules']:
        if mod not in _loaded_modules(proc_root):
            continue   # went away with a module unloaded before it
        res = runner.run([rmmod, mod], timeout=120)
        if res.rc != 0:
            raise fail('rmmod %s failed (rc %d): %s' % (mod, res.rc, res.stderr.strip()))
        result['modules_unloaded'].append(mod)
    return result
