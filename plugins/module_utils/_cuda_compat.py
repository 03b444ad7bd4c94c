# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the collection: no compatibility promise. Used by the cuda_compat module and filter.

"""CUDA compatibility of declared applications against a target driver.

Rules, checked in this order for an application built with toolkit T that runs on driver D
(data and sources in ``_cuda_data.py``):

1. **Backward compatibility**: D is at or above the driver T shipped with -> compatible.
2. **Minor-version compatibility** (CUDA 11 and later): D is at or above the floor of T's major
   family -> compatible with a limited feature set (APIs newer than the driver fail with
   cudaErrorCallRequiresNewerDriver); to be tested explicitly. An application that JIT-compiles
   PTX from a toolkit newer than D's CUDA version fails (cudaErrorUnsupportedPtxVersion): flagged
   and incompatible.
3. **Forward compatibility**: otherwise only the cuda-compat-<major>-<minor> package in the
   application's image, and only on data-center GPUs (and NGC-Server-Ready RTX, Jetson), lets it run.
4. Anything else is incompatible.
"""

from __future__ import annotations

import bisect
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _cuda_data
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import named_entry

__all__ = ['CudaCompatError', 'GPU_CLASSES', 'check', 'check_application', 'driver_cuda_version',
           'minimum_drivers', 'parse_driver', 'parse_toolkit']

GPU_CLASSES = _cuda_data.FORWARD_COMPAT_GPU_CLASSES + ('other',)

_TOOLKIT_RE = re.compile(r'^\s*(\d+)\.(\d+)(?:\.(\d+)|\s*(?:u|update)\s*(\d+))?\s*$', re.IGNORECASE)
_DRIVER_RE = re.compile(r'^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*$')

_TABLE = sorted((k, tuple(int(x) for x in v.split('.')), v) for k, v in _cuda_data.TOOLKIT_DRIVERS)
_TABLE_KEYS = [row[0] for row in _TABLE]
_TABLE_DRIVERS = dict((k, v) for k, v in _cuda_data.TOOLKIT_DRIVERS)
_FAMILIES = dict((major, (branch, floor, upper)) for major, branch, floor, upper in _cuda_data.FAMILIES)


class CudaCompatError(ValueError):
    """Bad input: the message names the field and the value."""


def parse_toolkit(version: Any, field: str = 'toolkit') -> Tuple[int, int, int]:
    """'12.4', '12.4.1', '12.4U1', '12.4 Update 1' -> (12, 4, 1); update 0 is the GA release."""
    if isinstance(version, (int, float)) and not isinstance(version, bool):
        version = str(version)
    m = _TOOLKIT_RE.match(version) if isinstance(version, str) else None
    if not m:
        raise CudaCompatError('%s: %r is not a CUDA toolkit version (e.g. 12.4, 12.4.1 or 12.4U1)' % (field, version))
    update = m.group(3) or m.group(4) or '0'
    return int(m.group(1)), int(m.group(2)), int(update)


def parse_driver(version: Any, field: str = 'driver') -> Tuple[int, ...]:
    """'580.126.20' -> (580, 126, 20)."""
    m = _DRIVER_RE.match(version) if isinstance(version, str) else None
    if not m:
        raise CudaCompatError('%s: %r is not an NVIDIA driver version (e.g. 580.126.20)' % (field, version))
    return tuple(int(g) for g in m.groups() if g is not None)


def _fmt_toolkit(t: Tuple[int, int, int]) -> str:
    return '%d.%d' % t[:2] + ('U%d' % t[2] if t[2] else '')


def driver_cuda_version(driver: Any) -> Optional[str]:
    """The newest CUDA major.minor the driver supports (what nvidia-smi prints as CUDA Version).

    None when the driver is older than every toolkit in the table. A driver newer than the table's
    newest toolkit reports that toolkit (at least).
    """
    d = parse_driver(driver)
    best = None
    for key, drv, dummy in _TABLE:
        if key[2] == 0 and d >= drv:
            best = key
    return None if best is None else '%d.%d' % best[:2]


def minimum_drivers(toolkit: Any) -> Dict[str, Any]:
    """The drivers an application built with `toolkit` needs: for backward and for minor-version compatibility."""
    t = parse_toolkit(toolkit)
    exact = _TABLE_DRIVERS.get(t)
    fam = _FAMILIES.get(t[0])
    return {
        'toolkit': _fmt_toolkit(t),
        'backward': exact,
        'backward_known': exact is not None,
        'minor_version': fam[1] if fam else None,
        'family_branch': fam[0] if fam else None,
    }


def _backward_floor(t: Tuple[int, int, int]) -> Tuple[Optional[Tuple[int, ...]], str, bool]:
    """(driver, as written, exact) - the driver that proves backward compatibility for toolkit t.

    For a toolkit release missing from the table the next newer release's driver is used (drivers
    only grow with the toolkit); None when the toolkit is newer than the whole table.
    """
    exact = _TABLE_DRIVERS.get(t)
    if exact is not None:
        return tuple(int(x) for x in exact.split('.')), exact, True
    i = bisect.bisect_right(_TABLE_KEYS, t)
    if i < len(_TABLE):
        return _TABLE[i][1], _TABLE[i][2], False
    return None, '', False


def check_application(app: Any, driver: Any, gpu_class: str = 'other', index: int = 0) -> Dict[str, Any]:
    """One application's verdict against the driver."""
    where = 'applications[%d]' % index
    name = named_entry(app, where, CudaCompatError, 'a dict with name, toolkit and ptx_jit')
    where = '%s (%s)' % (where, name)
    unknown = set(app) - {'name', 'toolkit', 'ptx_jit', 'forward_compat'}
    if unknown:
        raise CudaCompatError('%s: unknown field(s) %s (expected name, toolkit, ptx_jit, forward_compat)'
                              % (where, ', '.join(sorted(unknown))))
    t = parse_toolkit(app.get('toolkit'), '%s.toolkit' % where)
    for field in ('ptx_jit', 'forward_compat'):
        if not isinstance(app.get(field, False), bool):
            raise CudaCompatError('%s.%s: %r is not a boolean' % (where, field, app.get(field)))
    ptx_jit = app.get('ptx_jit', False)
    fwd = app.get('forward_compat', False)
    d = parse_driver(driver)
    dtext = driver.strip()
    dcuda = driver_cuda_version(driver)
    dcuda_t = tuple(int(x) for x in dcuda.split('.')) if dcuda else (0, 0)
    fam = _FAMILIES.get(t[0])
    backward, btext, exact = _backward_floor(t)
    mins = minimum_drivers(_fmt_toolkit(t))
    out: Dict[str, Any] = {
        'name': name, 'toolkit': _fmt_toolkit(t), 'ptx_jit': ptx_jit, 'forward_compat': fwd,
        'driver': dtext, 'driver_cuda': dcuda,
        'minimum_driver': {'backward': mins['backward'], 'minor_version': mins['minor_version']},
        'status': 'incompatible', 'compatible': False, 'flags': [], 'reasons': [],
    }
    reasons = out['reasons']
    flags = out['flags']
    if backward is not None and d >= backward:
        out.update(status='backward', compatible=True)
        if exact:
            reasons.append('driver %s >= %s, the driver CUDA %s shipped with (backward compatibility)'
                           % (dtext, btext, out['toolkit']))
        else:
            reasons.append('CUDA %s is not in the table; driver %s >= %s, the driver of the next known toolkit '
                           '(backward compatibility)' % (out['toolkit'], dtext, btext))
        return out
    if not exact:
        flags.append('toolkit_not_in_table')
    floor = tuple(int(x) for x in fam[1].split('.')) if fam else None
    if fam and d >= floor:
        reasons.append('driver %s >= %s, the CUDA %d.x family minimum: minor-version compatibility with a limited '
                       'feature set (APIs newer than the driver fail with %s); test it explicitly'
                       % (dtext, fam[1], t[0], _cuda_data.ERR_REQUIRES_NEWER_DRIVER))
        flags.append('limited_feature_set')
        out.update(status='minor_version', compatible=True)
        if ptx_jit and t[:2] > dcuda_t:
            flags.append('ptx_newer_than_driver')
            reasons.append('the application JIT-compiles PTX from CUDA %d.%d, newer than the driver\'s CUDA %s: the '
                           'driver\'s JIT rejects it (%s)' % (t[0], t[1], dcuda, _cuda_data.ERR_UNSUPPORTED_PTX))
            out.update(status='incompatible', compatible=False)
        return out
    if fam is None and t[0] >= 11:
        flags.append('family_not_in_table')
    need = []
    if backward is not None:
        need.append('>= %s (backward)' % btext)
    if fam:
        need.append('>= %s (CUDA %d.x minor-version floor)' % (fam[1], t[0]))
    elif t[0] < 11:
        need.append('no minor-version compatibility before CUDA 11')
    package = 'cuda-compat-%d-%d' % t[:2]
    if fwd:
        if gpu_class in _cuda_data.FORWARD_COMPAT_GPU_CLASSES:
            out.update(status='forward', compatible=True)
            flags.append('forward_compat_package')
            reasons.append('driver %s is too old for CUDA %s (%s); the image carries %s, and forward compatibility '
                           'is supported on %s GPUs: check NVIDIA\'s forward-compatibility support for this driver '
                           'branch' % (dtext, out['toolkit'], '; '.join(need), package, gpu_class))
        else:
            reasons.append('driver %s is too old for CUDA %s (%s); forward compatibility (%s) is supported only on '
                           'NVIDIA data-center GPUs, NGC-Server-Ready RTX and Jetson, not on gpu_class %r'
                           % (dtext, out['toolkit'], '; '.join(need), package, gpu_class))
        return out
    reasons.append('driver %s is too old for CUDA %s (needs %s); on data-center GPUs the %s forward-compatibility '
                   'package could bridge it' % (dtext, out['toolkit'], '; '.join(need), package))
    return out


def check(applications: Sequence[Any], driver: Any, gpu_class: str = 'other') -> Dict[str, Any]:
    """Every application against the driver. `passed` is false when any is incompatible."""
    if not isinstance(applications, (list, tuple)):
        raise CudaCompatError('applications: %r is not a list' % (applications,))
    if gpu_class not in GPU_CLASSES:
        raise CudaCompatError('gpu_class: %r is not one of %s' % (gpu_class, ', '.join(GPU_CLASSES)))
    parse_driver(driver)
    results: List[Dict[str, Any]] = []
    names = set()
    for i, app in enumerate(applications):
        r = check_application(app, driver, gpu_class, i)
        if r['name'] in names:
            raise CudaCompatError('applications[%d].name: %r repeats an earlier application' % (i, r['name']))
        names.add(r['name'])
        results.append(r)
    return {
        'driver': driver, 'driver_cuda': driver_cuda_version(driver), 'gpu_class': gpu_class,
        'passed': all(r['compatible'] for r in results),
        'applications': results,
        'incompatible': [r['name'] for r in results if not r['compatible']],
        'minor_version': [r['name'] for r in results if r['status'] == 'minor_version'],
        'forward': [r['name'] for r in results if r['status'] == 'forward'],
        'flagged': [r['name'] for r in results if 'ptx_newer_than_driver' in r['flags']],
        'source': _cuda_data.SOURCE,
    }
