# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""GPU facts through NVML (the nvidia-ml-py binding, `import pynvml`), with the
`nvidia-smi -q -x` fallback, plus the host facts around them: `collect_facts()` builds the
gpu_info dict of CONTRACTS.md.

Every NVML call that fails (Not Supported, GPU is lost, No Permission, ...) leaves its field None
and records the NVML error text under the GPU's `errors[<field>]`; it never aborts the collection.
"""
from __future__ import annotations

import datetime as _dt
import os
import warnings
from typing import Any, Callable, Optional

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost, _nvidia_smi, _xid

try:
    with warnings.catch_warnings():
        # The deprecated `pynvml` shim package warns on import; nvidia-ml-py is what we want.
        warnings.simplefilter('ignore')
        import pynvml  # provided by nvidia-ml-py
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError as _e:  # pragma: no cover - depends on the host
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = _e

__all__ = ['collect_facts', 'collect_nvml', 'pci_id', 'cuda_version_text',
           'BackendError', 'MissingBackend', 'NO_BINDING', 'BACKENDS', 'HAS_PYNVML', 'PYNVML_IMPORT_ERROR']

BACKENDS = ('auto', 'nvml', 'nvidia-smi')
MIB = 1024 * 1024


BackendError = _gpuhost.BackendError

# Pass as `nvml=` to behave as if the binding were not installed.
NO_BINDING = object()


class MissingBackend(Exception):
    """Neither the nvidia-ml-py binding nor nvidia-smi is available (or the chosen one is not)."""


def pci_id(device_id: int, subsystem_id: int) -> str:
    """`vendor:device/subvendor:subdevice` from NVML's pciDeviceId and pciSubSystemId."""
    return '%04x:%04x/%04x:%04x' % (device_id & 0xffff, (device_id >> 16) & 0xffff,
                                    subsystem_id & 0xffff, (subsystem_id >> 16) & 0xffff)


def cuda_version_text(value: Optional[int]) -> Optional[str]:
    """NVML's CUDA driver version integer (12040) as text (`12.4`)."""
    if value is None:
        return None
    return '%d.%d' % (value // 1000, (value % 1000) // 10)


def _text(value: Any) -> Any:
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else value


def collect_nvml(nvml: Any) -> dict[str, Any]:
    """driver_version, cuda_driver_version and gpus from an NVML binding module (pynvml)."""
    NVMLError = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except NVMLError as e:
        raise BackendError('NVML could not be initialised: %s' % e)
    try:
        out: dict[str, Any] = {'driver_version': None, 'cuda_driver_version': None, 'errors': {}}

        def system(field: str, call: Callable[[], Any]) -> Any:
            try:
                return call()
            except NVMLError as e:
                out['errors'][field] = str(e)
                return None

        out['driver_version'] = _text(system('driver_version', nvml.nvmlSystemGetDriverVersion))
        out['cuda_driver_version'] = cuda_version_text(
            system('cuda_driver_version', nvml.nvmlSystemGetCudaDriverVersion))
        try:
            count = nvml.nvmlDeviceGetCount()
        except NVMLError as e:
            raise BackendError('NVML could not count the GPUs: %s' % e)
        out['gpus'] = [_collect_gpu(nvml, i) for i in range(count)]
        return out
    finally:
        try:
            nvml.nvmlShutdown()
        except NVMLError:
            pass


def _collect_gpu(nvml: Any, index: int) -> dict[str, Any]:
    NVMLError = nvml.NVMLError
    gpu = _gpuhost.empty_gpu(index)
    errors = gpu['errors']

    def call(field: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except NVMLError as e:
            errors[field] = str(e)
            return None

    handle = call('handle', nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return gpu
    gpu['uuid'] = _text(call('uuid', nvml.nvmlDeviceGetUUID, handle))
    gpu['name'] = _text(call('name', nvml.nvmlDeviceGetName, handle))
    pci = call('pci', nvml.nvmlDeviceGetPciInfo, handle)
    if pci is not None:
        gpu['bus_id'] = _text(pci.busId)
        gpu['pci_id'] = pci_id(pci.pciDeviceId, pci.pciSubSystemId)
    mig = call('mig_mode', nvml.nvmlDeviceGetMigMode, handle)
    if mig is not None:
        enable = getattr(nvml, 'NVML_DEVICE_MIG_ENABLE', 1)
        gpu['mig_mode'] = {'current': mig[0] == enable, 'pending': mig[1] == enable}
    ecc = call('ecc', nvml.nvmlDeviceGetEccMode, handle)
    if ecc is not None:
        gpu['ecc']['enabled'] = bool(ecc[0])
        if ecc[0]:
            for key, etype, counter in (
                    ('volatile_uncorrected', nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
                    ('aggregate_uncorrected', nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC),
                    ('volatile_corrected', nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC),
                    ('aggregate_corrected', nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_AGGREGATE_ECC)):
                gpu['ecc'][key] = call('ecc.' + key, nvml.nvmlDeviceGetTotalEccErrors, handle, etype, counter)
    pending = call('retired_pages_pending', nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    if pending is not None:
        gpu['retired_pages_pending'] = bool(pending)
    rows = call('remapped_rows', nvml.nvmlDeviceGetRemappedRows, handle)
    if rows is not None:
        gpu['remapped_rows'] = {'correctable': int(rows[0]), 'uncorrectable': int(rows[1]),
                                'pending': bool(rows[2]), 'failure': bool(rows[3])}
    gpu['temperature_c'] = call('temperature_c', nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
    procs = call('processes', _running_processes, nvml, handle)
    for p in procs or []:
        try:
            name = _text(nvml.nvmlSystemGetProcessName(p.pid))
        except NVMLError:
            name = None
        used = p.usedGpuMemory
        gpu['processes'].append({'pid': int(p.pid), 'name': name,
                                 'used_memory_mib': None if used is None else int(used) // MIB})
    return gpu


def _running_processes(nvml: Any, handle: Any) -> Any:
    """Compute processes through the newest call the driver has (_v3, else _v2 on older drivers)."""
    mismatch = getattr(nvml, 'NVMLLibraryMismatchError', None)
    not_found = getattr(nvml, 'NVMLError_FunctionNotFound', None)
    older = tuple(e for e in (mismatch, not_found) if e is not None)
    try:
        return nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception as e:  # pylint: disable=broad-exception-caught
        if not isinstance(e, older):
            raise
        if not hasattr(nvml, 'nvmlDeviceGetComputeRunningProcesses_v2'):
            raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)


def _choose_backend(backend: str, runner: _gpuhost.Runner, nvml: Any) -> str:
    if backend not in BACKENDS:
        raise ValueError('backend=%r: expected one of %s' % (backend, ', '.join(BACKENDS)))
    if backend == 'nvml':
        if nvml is None:
            raise MissingBackend('backend=nvml: the nvidia-ml-py Python binding (import pynvml) is not installed')
        return 'nvml'
    if backend == 'nvidia-smi':
        if not runner.which('nvidia-smi'):
            raise MissingBackend('backend=nvidia-smi: nvidia-smi is not on this host')
        return 'nvidia-smi'
    if nvml is not None:
        return 'nvml'
    if runner.which('nvidia-smi'):
        return 'nvidia-smi'
    raise MissingBackend('neither the nvidia-ml-py Python binding (import pynvml) nor nvidia-smi is available')


def collect_facts(backend: str = 'auto', runner: Optional[_gpuhost.Runner] = None,
                  kernel_log: Optional[str] = 'journal', xid_since: Any = 'boot',
                  proc_modules: str = '/proc/modules', proc_stat: str = '/proc/stat',
                  packages: bool = True, require_driver: bool = True,
                  now: Optional[_dt.datetime] = None, nvml: Any = None) -> dict[str, Any]:
    """The gpu_info facts dict (CONTRACTS.md), plus `errors` for host-level failures.

    `runner` runs the commands (nvidia-smi, journalctl, dmesg, dpkg-query, rpm); without one
    nothing is run and no program is found (NVML facts only).

    `kernel_log` is `journal`, `dmesg`, a file path, or None to skip Xid events. With
    `require_driver` False an NVML/nvidia-smi failure (driver unloaded mid-upgrade) is reported
    in `errors.backend` with no GPUs instead of raising BackendError.
    """
    runner = runner or _gpuhost.NullRunner()
    nvml = None if nvml is NO_BINDING else (nvml if nvml is not None else pynvml)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    booted = _gpuhost.boot_time(proc_stat)
    since_boot = isinstance(xid_since, str) and xid_since.strip() == 'boot'
    since = _xid.parse_since(xid_since, now=now, boot_time=booted) if kernel_log else None

    chosen = _choose_backend(backend, runner, nvml)
    facts: dict[str, Any] = {'backend': chosen, 'driver_version': None, 'cuda_driver_version': None,
                             'kernel': os.uname().release, 'modules': [], 'pci_ids': [], 'gpus': [],
                             'xid_events': [], 'packages': [], 'errors': {}}
    try:
        if chosen == 'nvml':
            got = collect_nvml(nvml)
        else:
            got = _nvidia_smi.collect(runner)
    except BackendError as e:
        if require_driver:
            raise
        facts['errors']['backend'] = str(e)
    else:
        facts['driver_version'] = got['driver_version']
        facts['cuda_driver_version'] = got['cuda_driver_version']
        facts['gpus'] = got['gpus']
        facts['errors'].update(got.get('errors') or {})
    facts['pci_ids'] = sorted({g['pci_id'] for g in facts['gpus'] if g['pci_id']})
    facts['modules'] = _gpuhost.nvidia_modules(proc_modules)
    if kernel_log:
        lines = _gpuhost.read_kernel_log(runner, kernel_log, since, since_boot)
        events = _xid.parse_lines(lines, since=since, now=now, boot_time=booted)
        by_pci = {_xid.pci_of_bus_id(g['bus_id']): g['index'] for g in facts['gpus'] if g['bus_id']}
        for ev in events:
            ev['gpu_index'] = by_pci.get(ev['pci'])
        facts['xid_events'] = events
    if packages:
        facts['packages'] = _gpuhost.installed_driver_packages(runner)
    return facts
