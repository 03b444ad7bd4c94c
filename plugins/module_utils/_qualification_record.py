# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Used by the qualification_record module.
"""Build the seed-004 ``GPUUpgradeQualification`` record from a canary evidence bundle.

``state`` is ``qualified`` only when, on the canary scope (the canary nodes and the fleet gates of
canary batches), at least one gate of each of the allocation, monitoring and rollback categories
ran, every critical gate of those categories passed, and no other critical gate failed.
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
    required = {c for c, _field in REQUIRED_CATEGORIES}
    others = [g['id'] for g in gates if g['category'] not in required and g['critical'] and not g['passed']]
    if others:
        reasons.append('other critical gate(s) failed: %s' % ', '.join(others))
    canary['evidence'] = evidence_ref or '%s@%s' % (bundle['id'], revision)
    record = {
        'apiVersion': API_VERSION, 'kind': KIND, 'id': rid,
        'state': 'qualified' if not reasons else 'failed',
        'approvedBy': '', 'sourceRevision': revision, 'hardware': hardware,
        'target': dict((RECORD_NAMES[k], after[k]) for k in TUPLE_KEYS),
        'canary': canary,
    }
    return record, reasons


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return json.dumps(str(value), ensure_ascii=True)


def dump_yaml(record: Dict[str, Any], reasons: Optional[List[str]] = None) -> str:
    """The record as YAML in the seed's field order, with comments for the reviewer."""
    lines = ['# GPUUpgradeQualification written by gpufleet.upgrade.qualification_record.',
             '# ' + APPROVAL_NOTE]
    for r in reasons or []:
        lines.append('# not qualified: ' + r.replace('\n', ' '))
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
