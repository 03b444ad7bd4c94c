# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""A node's upgrade progress, recorded on its Node object so that a rerun resumes.

Annotations (prefix ``gpufleet.io/``, shared with ``node_drain`` which writes the first two):

- ``initial-unschedulable``: ``"true"``/``"false"``, the cordon state before the rollout
  touched the node (written once by ``node_drain`` when it cordons);
- ``upgrade-state``: the last phase completed (``cordoned``, ``draining``, ``drained`` from
  ``node_drain``; ``snapshotted``, ``installed``, ``activated``, ``validated``, ``failed``,
  ``rolled-back`` from the roles);
- ``upgrade-target``: the target the recorded phases belong to (``key=value,...`` of the tuple);
  phases recorded for another target, or without a target, do not count; phases from
  ``drained`` on count only while the node is cordoned (``validated`` also after our own
  uncordon);
- ``upgraded-to``: written when the node finished (uncordoned or left as the operator had it);
  a rerun for the same target skips the node;
- ``snapshot-sha256``: the digest of the target's rollback snapshot, recorded with ``snapshotted`` and
  kept at ``done`` (a rollback after ``done`` checks the snapshot it fetches against it), until
  progress for another target replaces it.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ._fleet import is_ready, node_identity
from ._managed_fields import describe, owners

# The keys and the phase vocabulary are the phase model's (_node_record); named here too for the callers.
from ._node_record import (  # noqa: F401 (re-exported)
    ALIASES, ANN_DONE, ANN_INITIAL, ANN_ISOLATED_BY, ANN_SNAPSHOT, ANN_STATE, ANN_STOPPED_VMS, ANN_TARGET,
    CANARY_KEY, PHASES, SETTABLE, TERMINAL, snapshot_target,
)


class StateError(ValueError):
    pass


def target_key(target: Dict[str, Any]) -> str:
    """Canonical text of a target tuple: sorted ``key=value`` pairs, comma separated."""
    if not isinstance(target, dict) or not target:
        raise StateError('target: expected a non-empty mapping of tuple components, got %r' % (target,))
    parts = []
    for key in sorted(target):
        value = target[key]
        if value is None or isinstance(value, (dict, list)):
            raise StateError('target.%s: expected a version string, got %r' % (key, value))
        text = str(value)
        if ',' in text or '=' in text:
            raise StateError('target.%s: %r may not contain "," or "="' % (key, text))
        parts.append('%s=%s' % (key, text))
    return ','.join(parts)


def _annotations(node: Dict[str, Any]) -> Dict[str, str]:
    return dict((node.get('metadata') or {}).get('annotations') or {})


def view(node: Dict[str, Any], key: str) -> Dict[str, Any]:
    """What a role needs to resume: the phases done for `key`, the pre-rollout cordon, readiness."""
    ann = _annotations(node)
    unschedulable = bool((node.get('spec') or {}).get('unschedulable'))
    recorded = ann.get(ANN_STATE)
    # A record that names no target is stale: it may belong to any rollout.
    same_target = ann.get(ANN_TARGET) == key
    phase = ALIASES.get(recorded, recorded) if (recorded and same_target) else None
    # From `drained` on, the progress holds only while the node is cordoned: a node uncordoned since
    # (by hand: our own cordon record is still there) may run GPU pods again, so holders and drain
    # must run again before anything is installed. `validated` after our own uncordon (which removes
    # initial-unschedulable and keeps `validated`, KEPT_ON_UNCORDON) is the one exception.
    cordon_lost = bool(phase in PHASES[PHASES.index('drained'):] and not unschedulable
                       and not (phase == 'validated' and ANN_INITIAL not in ann))
    if cordon_lost:
        phase = None
    done_phases: List[str] = []
    if phase in PHASES:
        done_phases = list(PHASES[:PHASES.index(phase) + 1])
    elif phase in TERMINAL:
        done_phases = [phase]
    initial = ann.get(ANN_INITIAL)
    return {
        'name': (node.get('metadata') or {}).get('name'),
        'phase': phase,
        'recorded': recorded,
        'done_phases': done_phases,
        'completed': ann.get(ANN_DONE) == key and recorded is None,
        'target': key,
        # '' when progress is recorded without a target (a stale record as well).
        'stale_target': None if same_target or not (recorded or ANN_TARGET in ann) else ann.get(ANN_TARGET, ''),
        'cordon_lost': cordon_lost,
        'unschedulable': unschedulable,
        # Before our first cordon the node's own state is the initial one.
        'was_cordoned': (initial == 'true') if initial is not None else unschedulable,
        'ready': is_ready(node),
        'kernel': ((node.get('status') or {}).get('nodeInfo') or {}).get('kernelVersion'),
        # RKE2 as the kubelet reports it (kubeletVersion, e.g. v1.35.3+rke2r3), as fleet_info says.
        'rke2': ((node.get('status') or {}).get('nodeInfo') or {}).get('kubeletVersion'),
        # Any record of halted VMs (even one node_drain would refuse as malformed): start_vms has work.
        'vms_to_start': ann.get(ANN_STOPPED_VMS, '').strip() not in ('', '[]'),
        # The digest of this target's rollback snapshot, as recorded with `snapshotted` (kept after `done`).
        'snapshot_sha256': ann.get(ANN_SNAPSHOT) if snapshot_target(ann) == key else None,
        # Node UID, machine-id and system UUID: the evidence names the machine, not only the name.
        **node_identity(node),
    }


def cordon_lost_message(node: Dict[str, Any]) -> Optional[str]:
    """None while the node is cordoned; else why nothing that takes its pods down (a reboot, a trial
    boot, a driver unload, an operand move) may run now, naming the node and, when the object records
    one (a managedFields entry owning spec.unschedulable), who set it and when. The kube-apiserver
    records none after an uncordon (the field is dropped, and with it its owner: measured on
    tests/cluster for kubectl uncordon and for a PATCH of false), so the message points to its audit log."""
    if (node.get('spec') or {}).get('unschedulable'):
        return None
    name = (node.get('metadata') or {}).get('name')
    found = uncordoned_by(node)
    who = ('spec.unschedulable was set to false by %s' % describe(found) if found else
           'the API keeps no record of who uncordoned it: the API server\'s audit log does')
    return ('node %s is no longer cordoned (%s): the scheduler may have placed pods on it since the drain, and '
            'they would go down without eviction; nothing is activated on a schedulable node' % (name, who))


def uncordoned_by(node: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Who set spec.unschedulable of a node that is not cordoned ({manager, operation, time}; [] when
    the API records no owner, or the node is cordoned)."""
    if (node.get('spec') or {}).get('unschedulable'):
        return []
    return owners(node, ('spec', 'unschedulable'))


def set_patch(node: Dict[str, Any], phase: str, key: str,
              snapshot_sha256: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """Merge patch recording `phase` for target `key` (with `snapshotted`, the snapshot's digest),
    or None when the node already says so."""
    if phase not in SETTABLE:
        raise StateError('phase: %r is not one of %s' % (phase, ', '.join(SETTABLE)))
    if snapshot_sha256 is not None:
        if phase != 'snapshotted':
            raise StateError('snapshot_sha256: only with phase snapshotted, got phase %r' % (phase,))
        if not re.fullmatch(r'[0-9a-f]{64}', snapshot_sha256.lower()):
            raise StateError('snapshot_sha256: %r is not a SHA-256 hex digest' % (snapshot_sha256,))
    ann = _annotations(node)
    want: Dict[str, Optional[str]]
    if phase == 'done':
        # The digest stays with `upgraded-to`: a rollback after `done` checks what it fetches against it.
        want = {ANN_DONE: key, ANN_STATE: None, ANN_TARGET: None}
        if snapshot_target(ann) != key:
            want[ANN_SNAPSHOT] = None   # another target's snapshot
    else:
        want = {ANN_STATE: phase, ANN_TARGET: key}
        if ann.get(ANN_DONE) is not None:
            want[ANN_DONE] = None
        if snapshot_sha256 is not None:
            want[ANN_SNAPSHOT] = snapshot_sha256.lower()
        elif snapshot_target(ann) != key:
            want[ANN_SNAPSHOT] = None   # another target's snapshot
    patch = {k: v for k, v in want.items() if ann.get(k) != v}
    return {'metadata': {'annotations': patch}} if patch else None


def isolation_patch(node: Dict[str, Any], present: bool, key: str = CANARY_KEY,
                    effect: str = 'NoSchedule', owner: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """Merge patch that adds (or removes) the canary label `key=true` and taint `key=true:effect`,
    or None when the node is already so. Other taints are kept in their order.

    `owner`: with `present`, recorded in the annotation `gpufleet.io/isolated-by` when this call
    isolates the node (not when someone else's label was already there); with `absent`, the node is
    released only when that annotation names `owner` (None when it does not: someone else's)."""
    meta = node.get('metadata') or {}
    labels = meta.get('labels') or {}
    annotations = meta.get('annotations') or {}
    taints = list((node.get('spec') or {}).get('taints') or [])
    ours = [t for t in taints if t.get('key') == key]
    others = [t for t in taints if t.get('key') != key]
    patch: Dict[str, Any] = {}
    if present:
        if labels.get(key) != 'true':
            patch['metadata'] = {'labels': {key: 'true'}}
            if owner:
                patch['metadata']['annotations'] = {ANN_ISOLATED_BY: owner}
        want = {'key': key, 'value': 'true', 'effect': effect}
        if [{k: t.get(k) for k in ('key', 'value', 'effect')} for t in ours] != [want]:
            patch['spec'] = {'taints': others + [want]}
    else:
        if owner is not None and annotations.get(ANN_ISOLATED_BY) != owner:
            return None
        if key in labels:
            patch['metadata'] = {'labels': {key: None}}
        if ANN_ISOLATED_BY in annotations:
            patch.setdefault('metadata', {})['annotations'] = {ANN_ISOLATED_BY: None}
        if ours:
            patch['spec'] = {'taints': others or None}
    return patch or None
