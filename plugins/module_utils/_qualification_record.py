# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Used by the qualification_record module and
# the canary_measured_nodes filter.
"""Build the seed-004 ``GPUUpgradeQualification`` record from a canary evidence bundle.

The record's ``target`` is the tuple *measured* on the canaries, not the plan copied: every canary
node (``role: canary``, or a member of a batch of kind ``canary``) must have a node entry with
``measured: true`` whose ``tuple_after`` (what node_upgrade measured after activation, recorded by the
canary role through ``canary_measured_nodes``) has all five components; all canaries must agree, and
the measurement must equal the bundle's declared ``tuple.after``. Otherwise ``RecordError`` names the
nodes and the components, and no record is written.

``state`` is ``qualified`` only when, on the canary scope (the canary nodes and the fleet gates of
canary batches), at least one gate of each of the allocation, monitoring and rollback categories
ran, every critical gate of those categories passed, no other critical gate failed, a real
allocation ran (a workload gate: the node gate's allocatable count allocates nothing), and the
monitoring path was read (a metric gate on every canary node, or a fleet metric gate: the GPU gate
reads NVML on the host, not the node's exporter series in Prometheus).
Otherwise the state is ``failed`` and ``reasons`` says why. ``approvedBy`` is always written
empty: a second operator fills it in a reviewed commit (or an AWX approval node), and
``upgrade_check`` blocks until then.

The YAML is written without a YAML library: every string is a double-quoted scalar (JSON string
syntax, which YAML reads the same way), booleans are ``true``/``false``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence import (
    TUPLE_KEYS, category_results, parse_rfc3339, rfc3339)

API_VERSION = 'kube-dc.io/v1alpha1'
KIND = 'GPUUpgradeQualification'
RECORD_NAMES = {'kernel': 'kernel', 'rke2': 'rke2', 'driver': 'driver', 'gpu_operator': 'gpuOperator',
                'dcgm_exporter': 'dcgmExporter'}
REQUIRED_CATEGORIES = (('allocation', 'allocationPassed'), ('monitoring', 'monitoringPassed'),
                       ('rollback', 'rollbackPassed'))
_REVISION = re.compile(r'^[0-9a-f]{40}$')
_ID = re.compile(r'^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$')
_PCI = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{4}/[0-9a-f]{4}:[0-9a-f]{4}$')

# What the canary's rollback exercise restores on the node (node_snapshot, kernel_boot; the rollback gates
# judge the restored pair), and the components it never rolls back, each with the reason the record gives.
HOST_RESTORED = ('kernel', 'driver')
ONE_WAY = {
    'rke2': 'RKE2 is never downgraded; a failed RKE2 upgrade follows the platform recovery procedure',
    'gpu_operator': 'cluster-side: the canary rollback restores the node only; the operator goes back only when '
                    'the canary stage fails (gpu_operator_back)',
    'dcgm_exporter': 'cluster-side: the canary rollback restores the node only; the exporter goes back with the '
                     'GPU Operator when the canary stage fails',
}
CLAIMS = ('completedAt', 'allocationPassed', 'monitoringPassed', 'rollbackPassed')
# Gate kinds that allocate GPUs for real (a Job or pod that requested them and ran).
REAL_ALLOCATION = ('workload', 'allocation')
# Gate kinds that read the monitoring path itself (the node's DCGM exporter series in Prometheus, judged by the
# metric gate): host NVML (the GPU gate) proves the GPUs' health, not that the fleet's monitoring sees them.
REAL_MONITORING = ('metric',)

APPROVAL_NOTE = ('approvedBy is empty on purpose: a second operator reviews the evidence at sourceRevision and '
                 'fills it in a reviewed commit (or an AWX approval node); upgrade_check blocks until then.')


class RecordError(ValueError):
    """The bundle cannot give a record (the message names what is missing)."""


def canary_scope(bundle: Dict[str, Any]) -> Tuple[List[str], List[int]]:
    """(canary node names, indexes of canary batches)."""
    batches = [b['index'] for b in bundle['batches'] if b.get('kind') == 'canary']
    nodes = {n for n, v in bundle['nodes'].items() if v.get('role') == 'canary'}
    for b in bundle['batches']:
        if b['index'] in batches:
            nodes.update(b['nodes'])
    return sorted(nodes), batches


def _components(names: List[str]) -> str:
    return ', '.join(names)


def measured_target(bundle: Dict[str, Any], nodes: List[str]) -> Dict[str, str]:
    """The tuple measured on every canary node in ``nodes``, equal to the declared ``tuple.after``.

    RecordError when no canary, or not every canary, has a measured tuple (``measured: true`` on its node
    entry), when a canary's measurement lacks a component, when the canaries disagree, or when the
    measurement differs from the declared target; the message names the nodes and the components."""
    entries = bundle['nodes']
    measured = {n: entries[n].get('tuple_after') or {} for n in nodes
                if isinstance(entries.get(n), dict) and entries[n].get('measured') is True}
    unmeasured = [n for n in nodes if n not in measured]
    how = ('the canary role records node_upgrade_result.measured of the final upgrade as the node\'s tuple_after '
           'with measured: true; a tuple_after without it is the declared target copied in when the bundle was '
           'opened')
    if not measured:
        raise RecordError('no canary node has a measured tuple (canary node(s) %s): %s'
                          % (_components(unmeasured), how))
    if unmeasured:
        raise RecordError('canary node(s) %s have no measured tuple (measured on %s only): %s'
                          % (_components(unmeasured), _components(sorted(measured)), how))
    lacking = ['%s lacks %s' % (n, _components([k for k in TUPLE_KEYS if not t.get(k)]))
               for n, t in sorted(measured.items()) if not all(t.get(k) for k in TUPLE_KEYS)]
    if lacking:
        raise RecordError('the measured tuple is incomplete (not measured on the node): %s' % '; '.join(lacking))
    disagree = []
    for k in TUPLE_KEYS:
        values = sorted({t[k] for t in measured.values()})
        if len(values) > 1:
            disagree.append('%s: %s' % (k, ', '.join('%s on %s' % (v, _components(
                sorted(n for n, t in measured.items() if t[k] == v))) for v in values)))
    if disagree:
        raise RecordError('the canaries disagree on the measured tuple: %s' % '; '.join(disagree))
    target = dict((k, measured[nodes[0]][k]) for k in TUPLE_KEYS)
    declared = bundle['tuple'].get('after') or {}
    differ = ['%s measured %s, declared %s' % (k, target[k], declared.get(k)) for k in TUPLE_KEYS
              if target[k] != declared.get(k)]
    if differ:
        raise RecordError('the tuple measured on the canary node(s) %s differs from the declared target '
                          '(tuple.after): %s' % (_components(nodes), '; '.join(differ)))
    return target


def canary_measured_nodes(node: Any, result: Any) -> List[Dict[str, Any]]:
    """The canary's node entry for the evidence bundle, from node_upgrade's public result
    (node_upgrade_result) of its final upgrade: ``[{name, role: canary, tuple_after: <measured>,
    measured: true, verdict}]``, or ``[]`` when there is no result or it has no ``measured`` (nothing
    new is recorded; qualification_record then refuses, naming the node). A component measured as
    null or blank is left out of tuple_after (it could not be measured)."""
    if not isinstance(node, str) or not node.strip():
        raise RecordError('node: %r is not a node name' % (node,))
    name = node.strip()
    if result is None or result == '':
        return []
    if not isinstance(result, dict):
        raise RecordError('result: %r is not node_upgrade_result (a dict)' % (result,))
    if result.get('measured') is None:
        return []
    owner = result.get('node')
    if owner not in (None, '') and owner != name:
        raise RecordError('result: node_upgrade_result is for node %r, not the canary %r' % (owner, name))
    raw = result['measured']
    if not isinstance(raw, dict):
        raise RecordError('result.measured: %r is not a dict of %s' % (raw, ', '.join(TUPLE_KEYS)))
    unknown = sorted(str(k) for k in raw if k not in TUPLE_KEYS)
    if unknown:
        raise RecordError('result.measured: unknown key(s) %s (use %s)' % (', '.join(unknown), ', '.join(TUPLE_KEYS)))
    tuple_after = {}
    for k in TUPLE_KEYS:
        v = raw.get(k)
        if v is not None and not isinstance(v, str):
            raise RecordError('result.measured.%s: %r is not a string (or null when it could not be measured)'
                              % (k, v))
        if v and v.strip():
            tuple_after[k] = v.strip()
    entry = {'name': name, 'role': 'canary', 'tuple_after': tuple_after, 'measured': True}  # type: Dict[str, Any]
    outcome = result.get('outcome')
    if outcome in ('upgraded', 'failed'):
        entry['verdict'] = outcome
    elif outcome not in (None, ''):
        raise RecordError('result.outcome: %r is not upgraded or failed' % (outcome,))
    if result.get('artifacts'):
        # What the final upgrade installed and the node runs, with their digests (the evidence module checks them).
        entry['artifacts'] = result['artifacts']
    return [entry]


def build_record(bundle: Dict[str, Any], source_revision: str, record_id: Optional[str] = None,
                 evidence_ref: Optional[str] = None) -> Tuple[Dict[str, Any], List[str]]:
    """(record dict in the seed schema, reasons why it is not qualified: empty when qualified)."""
    revision = (source_revision or '').strip().lower()
    if not _REVISION.match(revision):
        raise RecordError('source_revision: %r is not a 40-hex commit id' % (source_revision,))
    rid = record_id or bundle['id']
    if not _ID.match(rid or ''):
        raise RecordError('id: %r must be lowercase letters and digits with . or - inside' % (rid,))
    after = bundle['tuple'].get('after') or {}
    missing = [k for k in TUPLE_KEYS if not after.get(k)]
    if missing:
        raise RecordError('the bundle has no complete target tuple (tuple.after lacks %s)' % ', '.join(missing))
    nodes, batches = canary_scope(bundle)
    if not nodes:
        raise RecordError('the bundle names no canary node (role: canary, or a batch of kind canary)')
    hardware = sorted({p for n in nodes for p in bundle['nodes'].get(n, {}).get('pci_ids', [])})
    if not hardware:
        raise RecordError('no PCI ids recorded for the canary node(s) %s' % ', '.join(nodes))
    bad = [p for p in hardware if not _PCI.match(p)]
    if bad:
        raise RecordError('canary PCI id(s) %s are not vendor:device/subvendor:subdevice' % ', '.join(bad))
    target = measured_target(bundle, nodes)
    gates = [g for g in bundle['gates'] if g['node'] in nodes or (g['node'] is None and g['batch'] in batches)]
    finished = [parse_rfc3339(g['finished'], 'finished') for g in gates if g.get('finished')]
    if not finished:
        raise RecordError('no canary gate has a finished time: the canary has not completed')
    scoped = dict(bundle, gates=gates)
    cats = category_results(scoped)
    reasons = []
    canary = {'completedAt': rfc3339(max(finished))}  # type: Dict[str, Any]
    for cat, field in REQUIRED_CATEGORIES:
        canary[field] = cats[cat]['passed']
        if not cats[cat]['gates']:
            reasons.append('no %s gate ran on the canary' % cat)
        elif cats[cat]['failed']:
            reasons.append('%s gate(s) failed: %s' % (cat, ', '.join(cats[cat]['failed'])))
    # A real allocation (issue 16): the node gate counts allocatable GPUs and allocates none, so the
    # allocation claim needs a workload gate that ran on the canary scope (Jobs that requested GPUs, were
    # scheduled and completed with the expected result: the shipped suite or the operator's cases).
    if cats['allocation']['gates'] and not [g for g in gates if g['kind'] in REAL_ALLOCATION]:
        canary['allocationPassed'] = False
        reasons.append('no real allocation ran on the canary: no workload gate (the node gate counts allocatable GPUs '
                       'and allocates none; run the workload suite, canary_workload_suite)')
    # The monitoring claim (issue 16): every canary node's exporter series reached Prometheus and passed the
    # metric gate (a metric gate on that node, or a fleet metric gate of its canary batch); the GPU gate reads
    # NVML on the host and says nothing about the monitoring path.
    unmonitored = unmonitored_canaries(gates, nodes)
    if cats['monitoring']['gates'] and unmonitored:
        canary['monitoringPassed'] = False
        reasons.append('no metric gate on canary node(s) %s: monitoringPassed needs the node\'s DCGM exporter series '
                       'in Prometheus and the metric gate passed over them (node_upgrade_metric_gate); the GPU gate '
                       'reads NVML on the host, not the monitoring path' % ', '.join(unmonitored))
    uncovered = rollback_scope(bundle)['uncovered']
    if uncovered:
        canary['rollbackPassed'] = False
        reasons.append('the target changes %s, which the canary rollback neither restores nor declares one-way'
                       % ', '.join(uncovered))
    required = {c for c, _field in REQUIRED_CATEGORIES}
    others = [g['id'] for g in gates if g['category'] not in required and g['critical'] and not g['passed']]
    if others:
        reasons.append('other critical gate(s) failed: %s' % ', '.join(others))
    canary['evidence'] = evidence_ref or '%s@%s' % (bundle['id'], revision)
    record = {
        'apiVersion': API_VERSION, 'kind': KIND, 'id': rid,
        'state': 'qualified' if not reasons else 'failed',
        'approvedBy': '', 'sourceRevision': revision, 'hardware': hardware,
        'target': dict((RECORD_NAMES[k], target[k]) for k in TUPLE_KEYS),
        'canary': canary,
    }
    return record, reasons


def unmonitored_canaries(gates: List[Dict[str, Any]], nodes: List[str]) -> List[str]:
    """The canary nodes no metric gate covers: none on the node itself, and no fleet metric gate (no node)."""
    metric = [g for g in gates if g['kind'] in REAL_MONITORING]
    if any(g['node'] is None for g in metric):
        return []
    covered = {g['node'] for g in metric}
    return [n for n in nodes if n not in covered]


def rollback_scope(bundle: Dict[str, Any]) -> Dict[str, Any]:
    """Which components the target changes (``tuple.before`` against ``tuple.after``; every component
    when the bundle has no ``before``), which of them the canary's rollback restores on the node, and
    which are one-way, with the reason: ``{changed, restored, one_way: {component: reason}, uncovered}``.
    ``uncovered`` (changed, neither restored nor declared one-way) makes ``rollbackPassed`` false."""
    before = bundle['tuple'].get('before') or {}
    after = bundle['tuple'].get('after') or {}
    changed = [k for k in TUPLE_KEYS if not before or before.get(k) != after.get(k)]
    restored = [k for k in changed if k in HOST_RESTORED]
    one_way = dict((k, ONE_WAY[k]) for k in changed if k in ONE_WAY)
    uncovered = [k for k in changed if k not in restored and k not in one_way]
    return {'changed': changed, 'restored': restored, 'one_way': one_way, 'uncovered': uncovered}


def claim_evidence(bundle: Dict[str, Any]) -> Dict[str, Any]:
    """Each canary claim of the record with the ids of the evidence entries (gates of the bundle, on
    the canary scope) that prove it: ``completedAt`` the gate that finished last, each ``*Passed``
    the gates of its category; plus ``rollback_scope``. Empty lists where nothing proves a claim."""
    nodes, batches = canary_scope(bundle)
    gates = [g for g in bundle['gates'] if g['node'] in nodes or (g['node'] is None and g['batch'] in batches)]
    cats = category_results(dict(bundle, gates=gates))
    finished = [(parse_rfc3339(g['finished'], 'finished'), g['id']) for g in gates if g.get('finished')]
    out = {'completedAt': [max(finished)[1]] if finished else []}  # type: Dict[str, Any]
    for cat, field in REQUIRED_CATEGORIES:
        out[field] = list(cats[cat]['gates'])
    out['rollback_scope'] = rollback_scope(bundle)
    return out


def claim_comments(claims: Dict[str, Any], bundle_id: str) -> List[str]:
    """The reviewer's pointers, as YAML comment lines (the seed schema has no field for them)."""
    lines = ['# Evidence of each canary claim: entry ids in evidence bundle %s at sourceRevision.' % bundle_id]
    for claim in CLAIMS:
        lines.append('#   canary.%s: %s' % (claim, ', '.join(claims.get(claim) or []) or 'NO EVIDENCE'))
    scope = claims.get('rollback_scope') or {}
    lines.append('#   canary.rollbackPassed scope: restored on the node: %s; one-way, not rolled back: %s'
                 % (', '.join(scope.get('restored') or []) or 'none',
                    '; '.join('%s (%s)' % kv for kv in sorted((scope.get('one_way') or {}).items())) or 'none'))
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return json.dumps(str(value), ensure_ascii=True)


_UNSAFE_IN_COMMENT = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff]')


def _comment(text: str) -> str:
    """`text` safe on one YAML comment line: control characters, YAML's line breaks (NEL, LS, PS), BOM and lone
    surrogates (not encodable as UTF-8) escaped as \\uXXXX, so the comment neither ends early nor breaks the write."""
    return _UNSAFE_IN_COMMENT.sub(lambda m: '\\u%04x' % ord(m.group(0)), text)


def dump_yaml(record: Dict[str, Any], reasons: Optional[List[str]] = None,
              comments: Optional[List[str]] = None) -> str:
    """The record as YAML in the seed's field order, with comments for the reviewer (`comments`:
    further comment lines, e.g. claim_comments)."""
    lines = ['# GPUUpgradeQualification written by gpufleet.upgrade.qualification_record.',
             '# ' + APPROVAL_NOTE]
    for r in reasons or []:
        lines.append('# not qualified: ' + _comment(r.replace('\n', ' ')))
    lines.extend(_comment((c if c.startswith('#') else '# ' + c).replace('\n', ' ')) for c in comments or [])
    for key in ('apiVersion', 'kind', 'id', 'state', 'approvedBy', 'sourceRevision'):
        lines.append('%s: %s' % (key, _scalar(record[key])))
    lines.append('hardware:')
    lines.extend('  - %s' % _scalar(p) for p in record['hardware'])
    lines.append('target:')
    for key in ('kernel', 'rke2', 'driver', 'gpuOperator', 'dcgmExporter'):
        lines.append('  %s: %s' % (key, _scalar(record['target'][key])))
    lines.append('canary:')
    for key in ('completedAt', 'allocationPassed', 'monitoringPassed', 'rollbackPassed', 'evidence'):
        lines.append('  %s: %s' % (key, _scalar(record['canary'][key])))
    return '\n'.join(lines) + '\n'
