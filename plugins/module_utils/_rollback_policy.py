# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside gpufleet.upgrade.
"""What a rollback of one node may do (seed 004, rollback boundary). A pure decision.

- Driver and kernel are rolled back only when the qualification record proves that rollback
  (``canary.rollbackPassed`` is true, and the record's target is the version the node runs now,
  so the proven rollback is this one) and no GPU holder is left on the node.
- RKE2 is never downgraded: the decision points to the platform's recovery procedure instead.
- GPU Operator and DCGM exporter are cluster-wide operands, not rolled back per node.
- The node stays cordoned throughout, and is uncordoned only after every gate passes (accelerator
  health, a real allocation, GPU alerts clear, cluster health), and only if it was schedulable
  before the rollout.

The result lists ordered steps (what the rollback role runs) and refusals, each with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

COMPONENTS = ('kernel', 'rke2', 'driver', 'gpu_operator', 'dcgm_exporter')
RECORD_KEYS = {'kernel': 'kernel', 'rke2': 'rke2', 'driver': 'driver', 'gpu_operator': 'gpuOperator',
               'dcgm_exporter': 'dcgmExporter'}
DEFAULT_PLATFORM_RECOVERY = (
    'the platform recovery procedure for RKE2 (restore the control plane from an etcd snapshot taken on '
    'the previous minor; see the RKE2 roll-back documentation and the cluster runbook)')
GATES = ('accelerator health (NVML/Xid/ECC)', 'a real GPU allocation', 'GPU alerts clear',
         'normal cluster health checks')


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


def _proof_problems(qualification: Any, current: Dict[str, Optional[str]], comps: List[str]) -> List[str]:
    """Why the record does not prove rolling back ``comps`` from ``current`` (empty when it does)."""
    if qualification is None:
        return ['no qualification record given: the rollback is not proven']
    if not isinstance(qualification, dict):
        return ['qualification: %r is not a record' % (qualification,)]
    problems = []
    canary = qualification.get('canary')
    passed = canary.get('rollbackPassed') if isinstance(canary, dict) else None
    if passed is not True:
        problems.append('the qualification record %s has canary.rollbackPassed = %r, not true: the rollback was not '
                        'proven on the canary' % (qualification.get('id', '(no id)'), passed))
    target = qualification.get('target') if isinstance(qualification.get('target'), dict) else {}
    for comp in comps:
        recorded = target.get(RECORD_KEYS[comp])
        if recorded != current.get(comp):
            problems.append('the qualification record %s qualifies %s %r, but the node runs %r: it does not prove '
                            'this rollback' % (qualification.get('id', '(no id)'), comp, recorded, current.get(comp)))
    return problems


def decide_rollback(node: str, previous: Any, current: Any, qualification: Any = None,
                    holders: Any = None, was_cordoned_before: bool = False,
                    platform_recovery: str = DEFAULT_PLATFORM_RECOVERY) -> RollbackDecision:
    """Decide the rollback of ``node`` from ``current`` back to ``previous`` (tuples, snake_case keys).

    ``qualification``: the GPUUpgradeQualification record as a mapping (seed 004 schema, camelCase).
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
        problems = _proof_problems(qualification, cur, node_comps)
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
