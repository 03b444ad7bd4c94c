# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Used by the gpu_gate module (on GPU nodes, Python >= 3.9)
# and by its action plugin (on the controller, when the facts are given).
"""GPU health gate over ``gpu_info`` facts, against a baseline snapshot of the same facts.

Checks, each one a named verdict with its evidence (all must pass):

``driver``       the loaded driver version equals the target, byte for byte;
``pci_identity`` the set of PCI ids, and the GPU at each bus id, are what the baseline had (a GPU
                 that fell off the bus changes the bus-id map even when the id set is unchanged);
``xid``          no Xid event absent from the baseline at or above the severity threshold
                 (``unknown`` codes count as ``high``: an unexplained event is not harmless);
``ecc``          the uncorrected ECC count did not grow on any GPU (aggregate counts persist across
                 driver reloads; volatile counts reset, so a lower volatile count is a reset);
``row_remap``    no row-remap failure and no remap pending, no retired page pending;
``temperature``  every GPU below the limit (an unreadable temperature fails: unknown is not cool).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

SEVERITY_RANK = {'low': 1, 'medium': 2, 'high': 3, 'critical': 4}
UNKNOWN_RANK = SEVERITY_RANK['high']
CHECKS = ('driver', 'pci_identity', 'xid', 'ecc', 'row_remap', 'temperature')

# The gpu_gate module's options (its action plugin checks them too). `backend`'s choices are _nvml.BACKENDS,
# written out so that this module need not import the NVML reader (a unit test holds the two equal).
ARGUMENT_SPEC: Dict[str, Dict[str, Any]] = dict(
    facts=dict(type='dict'),
    backend=dict(type='str', default='auto', choices=['auto', 'nvml', 'nvidia-smi']),
    kernel_log=dict(type='str', default='journal'),
    xid_since=dict(type='str', default='boot'),
    baseline=dict(type='dict', required=True),
    target_driver=dict(type='str', required=True),
    xid_severity_threshold=dict(type='str', default='medium', choices=list(SEVERITY_RANK)),
    temperature_max=dict(type='float', default=85),
    skip=dict(type='list', elements='str', default=[], choices=list(CHECKS)),
)


class GpuGateError(ValueError):
    """Bad input: the message names the field and the value."""


def _gpus(facts: Dict[str, Any], field: str) -> List[Dict[str, Any]]:
    gpus = facts.get('gpus')
    if gpus is None:
        return []
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise GpuGateError('%s.gpus: %r is not a list of dicts' % (field, gpus))
    return gpus


def _label(gpu: Dict[str, Any]) -> str:
    return 'GPU %s (%s)' % (gpu.get('index', '?'), gpu.get('bus_id') or gpu.get('uuid') or 'unknown bus')


def _match(gpu: Dict[str, Any], baseline_gpus: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    for key in ('uuid', 'bus_id'):
        if gpu.get(key):
            for b in baseline_gpus:
                if b.get(key) == gpu[key]:
                    return b
    return None


def _pci_ids(facts: Dict[str, Any], field: str) -> List[str]:
    ids = facts.get('pci_ids')
    if ids is None:
        ids = [g.get('pci_id') for g in _gpus(facts, field) if g.get('pci_id')]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise GpuGateError('%s.pci_ids: %r is not a list of strings' % (field, ids))
    return sorted({i.strip().lower() for i in ids if i.strip()})


def check_driver(facts: Dict[str, Any], target: str) -> Tuple[List[str], Dict[str, Any]]:
    loaded = facts.get('driver_version')
    ev = {'target': target, 'loaded': loaded, 'backend': facts.get('backend')}
    if not loaded:
        return ['driver: the loaded driver version is unknown (is the nvidia module loaded?); target %s' % target], ev
    if loaded != target:
        return ['driver: loaded %s, target %s' % (loaded, target)], ev
    return [], ev


def check_pci(facts: Dict[str, Any], baseline: Dict[str, Any]) -> Tuple[List[str], Dict[str, Any]]:
    now, before = _pci_ids(facts, 'facts'), _pci_ids(baseline, 'baseline')
    problems = []
    if not before:
        problems.append('pci_identity: the baseline has no PCI ids: take the snapshot with the GPUs visible')
    if now != before:
        gone = sorted(set(before) - set(now))
        new = sorted(set(now) - set(before))
        problems.append('pci_identity: PCI id set changed since the baseline (missing: %s; new: %s)'
                        % (', '.join(gone) or 'none', ', '.join(new) or 'none'))
    bus_now = dict((g.get('bus_id'), g.get('pci_id')) for g in _gpus(facts, 'facts') if g.get('bus_id'))
    bus_before = dict((g.get('bus_id'), g.get('pci_id')) for g in _gpus(baseline, 'baseline') if g.get('bus_id'))
    for bus in sorted(set(bus_before) - set(bus_now)):
        problems.append('pci_identity: GPU at %s (%s) is missing since the baseline' % (bus, bus_before[bus]))
    for bus in sorted(set(bus_now) - set(bus_before)):
        if bus_before:
            problems.append('pci_identity: GPU at %s (%s) was not in the baseline' % (bus, bus_now[bus]))
    for bus in sorted(set(bus_now) & set(bus_before)):
        if (bus_now[bus] or '').lower() != (bus_before[bus] or '').lower():
            problems.append('pci_identity: GPU at %s changed from %s to %s' % (bus, bus_before[bus], bus_now[bus]))
    return problems, {'pci_ids': now, 'baseline_pci_ids': before, 'gpus': len(bus_now) or len(_gpus(facts, 'facts')),
                      'baseline_gpus': len(bus_before) or len(_gpus(baseline, 'baseline'))}


def _xid_key(e: Dict[str, Any]) -> Tuple[Any, ...]:
    return (e.get('time'), e.get('pci'), e.get('code'), e.get('raw'))


def check_xid(facts: Dict[str, Any], baseline: Dict[str, Any], threshold: str) -> Tuple[List[str], Dict[str, Any]]:
    if threshold not in SEVERITY_RANK:
        raise GpuGateError('xid_severity_threshold: %r is not one of %s' % (threshold, ', '.join(SEVERITY_RANK)))
    events = facts.get('xid_events') or []
    seen = set(_xid_key(e) for e in (baseline.get('xid_events') or []) if isinstance(e, dict))
    new = [e for e in events if isinstance(e, dict) and _xid_key(e) not in seen]
    limit = SEVERITY_RANK[threshold]
    failing, tolerated = [], []
    for e in new:
        sev = e.get('severity') or 'unknown'
        rank = SEVERITY_RANK.get(sev, UNKNOWN_RANK)
        (failing if rank >= limit else tolerated).append(e)
    problems = ['xid: new Xid %s (%s, severity %s) on %s%s' % (
        e.get('code'), e.get('mnemonic') or 'no catalog entry', e.get('severity') or 'unknown', e.get('pci') or 'unknown PCI',
        ' at %s' % e['time'] if e.get('time') else '') for e in failing]
    return problems, {'threshold': threshold, 'new_events': new, 'failing': len(failing), 'tolerated': len(tolerated),
                      'baseline_events': len(seen)}


def _int_or_none(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def check_ecc(facts: Dict[str, Any], baseline: Dict[str, Any]) -> Tuple[List[str], Dict[str, Any]]:
    problems = []
    per_gpu = []
    base_gpus = _gpus(baseline, 'baseline')
    for g in _gpus(facts, 'facts'):
        ecc = g.get('ecc') or {}
        b = (_match(g, base_gpus) or {}).get('ecc') or {}
        row = {'gpu': _label(g), 'enabled': ecc.get('enabled'), 'aggregate_delta': None, 'volatile_delta': None}
        if ecc.get('enabled') is False:
            row['note'] = 'ECC disabled'
            per_gpu.append(row)
            continue
        agg, agg0 = _int_or_none(ecc.get('aggregate_uncorrected')), _int_or_none(b.get('aggregate_uncorrected'))
        vol, vol0 = _int_or_none(ecc.get('volatile_uncorrected')), _int_or_none(b.get('volatile_uncorrected'))
        if agg is not None and agg0 is not None:
            row['aggregate_delta'] = agg - agg0
        if vol is not None:
            # A lower volatile count than the baseline means the counter was reset (driver reload).
            row['volatile_delta'] = vol - vol0 if vol0 is not None and vol >= vol0 else vol
        deltas = [d for d in (row['aggregate_delta'], row['volatile_delta']) if d is not None]
        if not deltas:
            problems.append('ecc: %s uncorrected ECC count unavailable, so the delta cannot be shown to be 0' % _label(g))
        elif max(deltas) > 0:
            problems.append('ecc: %s uncorrected ECC errors grew by %d since the baseline' % (_label(g), max(deltas)))
        per_gpu.append(row)
    return problems, {'gpus': per_gpu}


def check_row_remap(facts: Dict[str, Any]) -> Tuple[List[str], Dict[str, Any]]:
    problems = []
    per_gpu = []
    for g in _gpus(facts, 'facts'):
        rr = g.get('remapped_rows')
        row = {'gpu': _label(g), 'remapped_rows': rr, 'retired_pages_pending': g.get('retired_pages_pending')}
        if isinstance(rr, dict):
            if rr.get('failure'):
                problems.append('row_remap: %s reports a row-remapping failure' % _label(g))
            if rr.get('pending'):
                problems.append('row_remap: %s has a row remap pending (GPU reset required)' % _label(g))
        if g.get('retired_pages_pending'):
            problems.append('row_remap: %s has retired pages pending (GPU reset required)' % _label(g))
        per_gpu.append(row)
    return problems, {'gpus': per_gpu}


def check_temperature(facts: Dict[str, Any], limit: float) -> Tuple[List[str], Dict[str, Any]]:
    problems = []
    temps = {}
    for g in _gpus(facts, 'facts'):
        t = g.get('temperature_c')
        temps[_label(g)] = t
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            problems.append('temperature: %s temperature unavailable' % _label(g))
        elif t >= limit:
            problems.append('temperature: %s at %s C, limit %s C' % (_label(g), t, limit))
    return problems, {'limit_c': limit, 'gpus': temps}


def evaluate(facts: Any, baseline: Any, target_driver: str, xid_severity_threshold: str = 'medium',
             temperature_max: float = 85.0, skip: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run every check; returns {passed, msg, problems, checks: {name: {passed, problems, evidence}}}."""
    if not isinstance(facts, dict):
        raise GpuGateError('facts: %r is not a dict (gpu_info facts)' % (facts,))
    if not isinstance(baseline, dict):
        raise GpuGateError('baseline: %r is not a dict (gpu_info facts of the snapshot)' % (baseline,))
    if not isinstance(target_driver, str) or not target_driver.strip():
        raise GpuGateError('target_driver: %r must be a non-blank string' % (target_driver,))
    skip = list(skip or [])
    bad = [s for s in skip if s not in CHECKS]
    if bad:
        raise GpuGateError('skip: %s not one of %s' % (', '.join(repr(b) for b in bad), ', '.join(CHECKS)))
    if isinstance(temperature_max, bool) or not isinstance(temperature_max, (int, float)) or not 0 < temperature_max < 150:
        raise GpuGateError('temperature_max: %r must be a number between 0 and 150' % (temperature_max,))
    if xid_severity_threshold not in SEVERITY_RANK:
        raise GpuGateError('xid_severity_threshold: %r is not one of %s'
                           % (xid_severity_threshold, ', '.join(SEVERITY_RANK)))
    runs = {
        'driver': lambda: check_driver(facts, target_driver.strip()),
        'pci_identity': lambda: check_pci(facts, baseline),
        'xid': lambda: check_xid(facts, baseline, xid_severity_threshold),
        'ecc': lambda: check_ecc(facts, baseline),
        'row_remap': lambda: check_row_remap(facts),
        'temperature': lambda: check_temperature(facts, float(temperature_max)),
    }
    checks = {}
    problems = []  # type: List[str]
    for name in CHECKS:
        if name in skip:
            checks[name] = {'passed': None, 'skipped': True, 'problems': [], 'evidence': {}}
            continue
        found, evidence = runs[name]()
        checks[name] = {'passed': not found, 'skipped': False, 'problems': found, 'evidence': evidence}
        problems.extend(found)
    if not _gpus(facts, 'facts'):
        problems.append('no GPU in the facts: nothing to judge')
    passed = not problems
    msg = ('GPU gate: PASS (driver %s, %d GPU(s))' % (facts.get('driver_version'), len(_gpus(facts, 'facts')))
           if passed else 'GPU gate: FAIL: ' + '; '.join(problems))
    return {'passed': passed, 'msg': msg, 'problems': problems, 'checks': checks}


def judge(facts: Any, params: Dict[str, Any]) -> Dict[str, Any]:
    """The gpu_gate module's result for `facts` and its validated options `params` (ARGUMENT_SPEC): the verdict,
    with ``failed`` when the node did not pass or the input is bad; the facts included when the module read them
    (``params['facts']`` is None)."""
    try:
        verdict = evaluate(facts, params['baseline'], params['target_driver'], params['xid_severity_threshold'],
                           params['temperature_max'], params['skip'])
    except GpuGateError as exc:
        return {'failed': True, 'changed': False, 'passed': False, 'msg': 'GPU gate: invalid input: %s' % exc,
                'problems': [str(exc)]}
    result = dict(changed=False, **verdict)
    if params['facts'] is None:
        result['facts'] = facts
    if not verdict['passed']:
        result['failed'] = True
    return result
