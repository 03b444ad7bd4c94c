# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside gpufleet.upgrade.
"""What a rollback of one node may do (seed 004, rollback boundary). A pure decision.

- Driver and kernel are rolled back only when the qualification record proves that rollback
  and no GPU holder is left on the node. The record is read from its text with the upgrade gate's
  strict loader (``_qualification.parse_record``: a mapping that a lax YAML reader produced is not
  accepted) and must pass every rule of the gate that judges a record: state ``qualified``, an
  approver, a source revision, every canary check passed with evidence (``rollbackPassed``
  included), its hardware the node's PCI ids, the canary neither in the future nor older than
  ``max_canary_age``; and the record's target must be the version the node runs now, so the
  proven rollback is this one.
- RKE2 is never downgraded: the decision points to the platform's recovery procedure instead.
- GPU Operator and DCGM exporter are cluster-wide operands, not rolled back per node.
- The node stays cordoned throughout, and is uncordoned only after every gate passes (accelerator
  health, a real allocation, GPU alerts clear, cluster health), and only if it was schedulable
  before the rollout.

The result lists ordered steps (what the rollback role runs) and refusals, each with a reason.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show

COMPONENTS = ('kernel', 'rke2', 'driver', 'gpu_operator', 'dcgm_exporter')
RECORD_KEYS = {'kernel': 'kernel', 'rke2': 'rke2', 'driver': 'driver', 'gpu_operator': 'gpuOperator',
               'dcgm_exporter': 'dcgmExporter'}
DEFAULT_PLATFORM_RECOVERY = (
    'the platform recovery procedure for RKE2 (restore the control plane from an etcd snapshot taken on '
    'the previous minor; see the RKE2 roll-back documentation and the cluster runbook)')
# What the rollback role runs after a restore (roles/rollback: kernel_boot verify, then node_upgrade's host gates).
# Not the workload or metric gates: a rolled-back node stays cordoned unless asked, and the canary's re-upgrade
# and the observation windows run those.
GATES = ('the snapshot\'s kernel running with the previous driver\'s module', 'accelerator health against the snapshot '
         '(NVML/Xid/ECC)', 'the node gate (Ready, the device plugin, the expected GPU resources, taints)')


@dataclass
class Step:
    action: str
    reason: str
    component: Optional[str] = None
    from_version: Optional[str] = None
    to_version: Optional[str] = None

    def as_dict(self) -> Dict[str, Any]:
        return {'action': self.action, 'component': self.component, 'from': self.from_version,
                'to': self.to_version, 'reason': self.reason}


@dataclass
class Refusal:
    component: str
    reason: str
    pointer: Optional[str] = None

    def as_dict(self) -> Dict[str, Any]:
        return {'component': self.component, 'reason': self.reason, 'pointer': self.pointer}


@dataclass
class RollbackDecision:
    node: str
    outcome: str  # rollback | partial | refused | nothing_to_roll_back
    steps: List[Step]
    refusals: List[Refusal]
    changed: Dict[str, Dict[str, Optional[str]]] = field(default_factory=dict)

    @property
    def allowed(self) -> bool:
        return self.outcome in ('rollback', 'partial')

    def as_dict(self) -> Dict[str, Any]:
        return {'node': self.node, 'outcome': self.outcome, 'allowed': self.allowed,
                'steps': [s.as_dict() for s in self.steps], 'refusals': [r.as_dict() for r in self.refusals],
                'changed': self.changed}


class RollbackPolicyError(ValueError):
    """Malformed input; the message names the field and the value."""


def _describe_holder(h: Any) -> str:
    if isinstance(h, dict):
        kind = h.get('kind') or h.get('type') or 'holder'
        name = h.get('name') or h.get('pid') or '?'
        ns = h.get('namespace')
        return '%s %s/%s' % (kind, ns, name) if ns else '%s %s' % (kind, name)
    return str(h)


def _tuple(value: Any, what: str) -> Dict[str, Optional[str]]:
    if not isinstance(value, dict):
        raise RollbackPolicyError('%s: %r is not a mapping of %s' % (what, value, ', '.join(COMPONENTS)))
    unknown = sorted(set(value) - set(COMPONENTS))
    if unknown:
        raise RollbackPolicyError('%s: unknown component(s) %s; expected %s'
                                  % (what, ', '.join(unknown), ', '.join(COMPONENTS)))
    out: Dict[str, Optional[str]] = {}
    for comp in COMPONENTS:
        v = value.get(comp)
        if v is not None and not isinstance(v, str):
            raise RollbackPolicyError('%s.%s: %r is not a version string' % (what, comp, v))
        out[comp] = v
    return out


def load_record(qualification: Any) -> Tuple[Optional[_qualification.Record], List[str]]:
    """(record, problems loading it): the record's text (str or bytes) is read by the gate's strict
    loader; an already loaded ``_qualification.Record`` is taken as it is. A mapping is refused: a
    lax YAML reader may have turned what the gate refuses (``yes``, a duplicate key, an unquoted
    timestamp) into valid-looking values."""
    if qualification is None:
        return None, ['no qualification record given: the rollback is not proven']
    if isinstance(qualification, _qualification.Record):
        return qualification, []
    if isinstance(qualification, (str, bytes)):
        try:
            return _qualification.parse_record(qualification), []
        except _qualification.QualificationError as exc:
            return None, exc.problems
    return None, ['qualification: a %s is not accepted; give the record as read from its file (the upgrade '
                  'gate\'s strict loader must see its text)' % type(qualification).__name__]


def _proof_problems(qualification: Any, current: Dict[str, Optional[str]], comps: List[str], pci_ids: Any,
                    max_canary_age: Any, now: Optional[datetime.datetime]) -> List[str]:
    """Why the record does not prove rolling back ``comps`` from ``current`` (empty when it does):
    every problem the upgrade gate finds in the record, then the target check."""
    record, problems = load_record(qualification)
    if record is None:
        if qualification is None:
            return problems
        return ['the qualification record does not load (the upgrade gate refuses it): %s' % '; '.join(problems)]
    rid = show(record.id)
    gate = _qualification.record_problems(record)
    if pci_ids is None:
        gate.append('the node\'s PCI ids were not given, so the record\'s hardware cannot be checked')
    else:
        gate.extend(p for p in _qualification.hardware_problems(record, pci_ids) if p not in gate)
    gate.extend(_qualification.age_problems(record, max_canary_age, now))
    problems = []
    if record.rollback_passed is not True:
        problems.append('the qualification record %s has canary.rollbackPassed = false, not true: the rollback was '
                        'not proven on the canary' % rid)
    if gate:
        problems.append('the upgrade gate refuses the qualification record %s: %s' % (rid, '; '.join(gate)))
    for comp in comps:
        recorded = record.target.get(RECORD_KEYS[comp])
        if recorded != current.get(comp):
            problems.append('the qualification record %s qualifies %s %r, but the node runs %r: it does not prove '
                            'this rollback' % (rid, comp, recorded, current.get(comp)))
    return problems


def decide_rollback(node: str, previous: Any, current: Any, qualification: Any = None,
                    holders: Any = None, was_cordoned_before: bool = False,
                    platform_recovery: str = DEFAULT_PLATFORM_RECOVERY, pci_ids: Any = None,
                    max_canary_age: Any = _qualification.DEFAULT_MAX_CANARY_AGE,
                    now: Optional[datetime.datetime] = None) -> RollbackDecision:
    """Decide the rollback of ``node`` from ``current`` back to ``previous`` (tuples, snake_case keys).

    ``qualification``: the GPUUpgradeQualification record's text (read by the gate's strict loader),
    or a ``_qualification.Record``. ``pci_ids``: the node's GPUs (the record's hardware must match);
    ``max_canary_age`` and ``now`` as for the gate.
    ``holders``: GPU holders still on the node (Pods, VMIs, processes); any holder blocks driver and
    kernel changes. ``was_cordoned_before``: the node was unschedulable before the rollout.
    """
    if not isinstance(node, str) or not node:
        raise RollbackPolicyError('node: %r is not a node name' % (node,))
    prev = _tuple(previous, 'previous')
    cur = _tuple(current, 'current')
    if holders is None:
        holders = []
    if not isinstance(holders, list):
        raise RollbackPolicyError('holders: %r is not a list' % (holders,))

    changed = {c: {'from': cur[c], 'to': prev[c]} for c in COMPONENTS
               if prev[c] is not None and cur[c] is not None and prev[c] != cur[c]}
    unknown = [c for c in ('kernel', 'driver') if (prev[c] is None) != (cur[c] is None)]
    refusals: List[Refusal] = []
    for comp in unknown:
        refusals.append(Refusal(comp, '%s is known only on one side (previous %r, current %r): cannot tell what to '
                                'restore' % (comp, prev[comp], cur[comp])))

    if 'rke2' in changed:
        refusals.append(Refusal('rke2', 'RKE2 is never downgraded (%s → %s refused): validate each one-minor hop '
                                'and, if the control plane cannot recover, follow the platform recovery procedure'
                                % (changed['rke2']['from'], changed['rke2']['to']), pointer=platform_recovery))
    for comp in ('gpu_operator', 'dcgm_exporter'):
        if comp in changed:
            refusals.append(Refusal(comp, '%s is a cluster-wide operand, not rolled back per node (%s → %s): revert it '
                                    'through its reviewed release change'
                                    % (comp, changed[comp]['from'], changed[comp]['to'])))

    node_comps = [c for c in ('driver', 'kernel') if c in changed]
    restores: List[Step] = []
    if node_comps:
        problems = _proof_problems(qualification, cur, node_comps, pci_ids, max_canary_age, now)
        if holders:
            problems.append('%d GPU holder(s) still on node %s (%s): stop them first; nothing changes under a holder'
                            % (len(holders), node, ', '.join(_describe_holder(h) for h in holders)))
        if problems:
            for comp in node_comps:
                refusals.append(Refusal(comp, '%s rollback %s → %s refused: %s' % (
                    comp, changed[comp]['from'], changed[comp]['to'], '; '.join(problems))))
        else:
            if 'driver' in changed:
                restores.append(Step('restore_driver', 'reinstall and pin the driver packages of the snapshot',
                                     'driver', changed['driver']['from'], changed['driver']['to']))
            if 'kernel' in changed:
                restores.append(Step('restore_kernel', 'make the snapshot kernel the boot default',
                                     'kernel', changed['kernel']['from'], changed['kernel']['to']))
                restores.append(Step('reboot', 'boot the restored kernel, then wait for Node Ready (bounded)', 'kernel'))
            else:
                restores.append(Step('reload_driver', 'unload the driver modules and load the restored ones '
                                     '(or reboot if they cannot be unloaded)', 'driver'))

    steps: List[Step] = [Step('keep_cordoned', 'the node stays cordoned until every gate passes')]
    if restores:
        steps.extend(restores)
        steps.append(Step('run_gates', 'run the gates: %s' % ', '.join(GATES)))
        if was_cordoned_before:
            steps.append(Step('leave_cordoned', 'the node was cordoned before the rollout: never uncordon it'))
        else:
            steps.append(Step('uncordon_if_gates_pass', 'uncordon only when every gate passed; otherwise leave the '
                              'node cordoned and escalate'))
        outcome = 'partial' if refusals else 'rollback'
    elif refusals:
        steps.append(Step('escalate', 'nothing may be rolled back automatically: the node stays cordoned; see the '
                          'refusals'))
        outcome = 'refused'
    else:
        outcome = 'nothing_to_roll_back'
    return RollbackDecision(node=node, outcome=outcome, steps=steps, refusals=refusals, changed=changed)
