# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""The one phase model: what a node's upgrade records on its Node, and the steps that record it.

Every ``gpufleet.io/*`` key the collection writes on a Node is defined here (``_drain``,
``_upgrade_state``, the roles and the playbooks read them from here or through the filters of
``plugins/filter/rollout.py``), with the phase vocabulary of the ``gpufleet.io/upgrade-state``
annotation and the declared steps of ``roles/node_upgrade``: the phase each step records when it
completes and whether a failure in it is rolled back. The role names its current step in a
variable at the start of each step (``__node_upgrade_step``) and its rescue decides from that
name, through :func:`failure`; no behaviour depends on a task's name.
"""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence

PREFIX = 'gpufleet.io/'

# ---- Node annotations
# The cordon state before the rollout touched the node ("true"/"false"), written once by node_drain.
ANN_INITIAL = 'gpufleet.io/initial-unschedulable'
# The last phase completed (PHASES, TERMINAL, node_drain's `draining`/`drain-failed`).
ANN_STATE = 'gpufleet.io/upgrade-state'
# The target the recorded phases belong to (target_key of the tuple).
ANN_TARGET = 'gpufleet.io/upgrade-target'
# Written when the node finished a target; a rerun for the same target skips the node.
ANN_DONE = 'gpufleet.io/upgraded-to'
# SHA-256 of the rollback snapshot taken for the target (recorded with `snapshotted`; kept at `done`, for the
# target `upgraded-to` names, so that a rollback after `done` checks what it fetches against it: snapshot_target).
ANN_SNAPSHOT = 'gpufleet.io/snapshot-sha256'
# The VMs node_drain halted, with their previous runStrategy, to start after the gates.
ANN_STOPPED_VMS = 'gpufleet.io/stopped-vms'
# The timeAdded of the node.kubernetes.io/unschedulable taint of our own cordon, as versions before issue 37 (4)
# recorded it: no longer written (managedFields say whose the cordon is), removed where found.
ANN_CORDON_TAINT = 'gpufleet.io/cordon-taint-added'
# Who isolated a canary (node_isolation's owner): only that owner releases it.
ANN_ISOLATED_BY = 'gpufleet.io/isolated-by'

# ---- Node label and taint of an isolated canary
CANARY_KEY = 'gpufleet.io/canary'

# ---- The phase vocabulary of ANN_STATE
# The phases of one node's upgrade in order. `draining` (node_drain's in-flight mark) counts as
# `cordoned`: the drain is not finished and is run again (evicting only what is left).
PHASES = ('cordoned', 'drained', 'snapshotted', 'installed', 'activated', 'validated')
ALIASES = {'draining': 'cordoned'}
TERMINAL = ('failed', 'rolled-back')
SETTABLE = PHASES + TERMINAL + ('done',)


class Step(NamedTuple):
    """One step of a node's upgrade (roles/node_upgrade, then the rollout's postflight)."""
    name: str
    # The phase recorded on the Node when the step completed (None: the step records nothing).
    records: Optional[str]
    # Whether a failure in this step is rolled back from the snapshot (the node's packages changed,
    # the snapshot holds the way back, and the step is not past RKE2's rollback boundary).
    rolls_back: bool
    # What the failure message tells the operator beyond "the node stays cordoned".
    hint: str = ''


# In order. `holders` is not a step: node_drain lists what holds the GPUs itself.
# The steps an evidence entry lists (`phases`): not the bookkeeping ones, not `vms`.
EVIDENCE_EXCLUDED = ('preflight', 'progress', 'packages', 'vms')
# The steps that run only when the target changes the kernel.
KERNEL_STEPS = ('kernel_check', 'kernel_default')
# The steps that run only where the GPU Operator runs the node's operands.
OPERATOR_STEPS = ('operands',)
STEPS = (
    Step('preflight', None, False),
    Step('progress', None, False),
    # The package lists refreshed (bounded by their age) and the target driver offered, before the drain.
    Step('packages', None, False, 'nothing was changed on the node: make the repositories (or the mirror) offer the '
                                  'packages named, or refresh its package lists'),
    # The kernel's preflight (kernel_check) again before the drain: nothing has changed on the node.
    Step('kernel_check', None, False, 'nothing was changed on the node: make the repositories offer the packages named'),
    Step('drain', 'drained', False),
    Step('snapshot', 'snapshotted', False),
    # RKE2 cannot be rolled back (seed 004's rollback boundary): a failure leaves the driver untouched.
    Step('rke2', None, False, 'RKE2 cannot be rolled back: follow the platform recovery procedure'),
    Step('install', 'installed', True),
    Step('activate', None, True),
    Step('ready', 'activated', False,
         'it did not come back Ready within node_upgrade_reboot_timeout: recover it by hand, then run '
         'gpufleet.upgrade.rollback'),
    # The GPU Operator's operands of the node moved to their DaemonSets' current revision (fleets whose
    # operands the operator runs; docs/gpu-operator.md): before the gates, which read them.
    Step('operands', None, True),
    # What came up after the activation: the target kernel (a trial boot falls back to the saved one) and driver.
    Step('verify', None, True),
    Step('gates', 'validated', True),
    # The trial kernel kept as GRUB's saved default (after every gate passed).
    Step('kernel_default', None, True),
    Step('vms', None, False),
    # The rollout's DRA postflight: between the gates and the uncordon (the node stays cordoned until it passed).
    Step('postflight', None, False),
    Step('uncordon', 'done', False),
)
STEP_NAMES = tuple(s.name for s in STEPS)
_BY_NAME = dict((s.name, s) for s in STEPS)


class RecordError(ValueError):
    pass


def step(name: str) -> Step:
    if name not in _BY_NAME:
        raise RecordError('step: %r is not one of %s' % (name, ', '.join(STEP_NAMES)))
    return _BY_NAME[name]


# The hint of a failure because the node was not cordoned any more (upgrade_state require_cordoned).
CORDON_LOST_HINT = ('someone uncordoned the node during its upgrade: it is cordoned again, but pods the scheduler '
                    'placed on it since still run, and it is not rolled back (a rollback reboots or reloads the '
                    'driver as well): drain it, then run gpufleet.upgrade.rollback or the rollout again')


# The first step that changes the node: node_drain cordons it before anything else.
FIRST_CHANGE = 'drain'


def records_progress(progress: Optional[Dict[str, Any]]) -> bool:
    """Whether the Node records progress of the rollout's target (upgrade_state's `state`: any phase,
    `drain-failed` and `failed` too, a cordon lost since included): an earlier run of this target
    changed the node, so it is mid-upgrade. None (not read) counts as recorded."""
    if progress is None:
        return True
    if not isinstance(progress, dict):
        raise RecordError('progress: expected the state upgrade_state returns (a mapping), got %r' % (progress,))
    recorded = progress.get('recorded')
    if recorded is not None and not isinstance(recorded, str):
        raise RecordError('progress.recorded: expected a phase name or none, got %r' % (recorded,))
    # stale_target is None when the record is this target's (or nothing is recorded).
    return bool(recorded) and progress.get('stale_target') is None


def failure(name: str, rollback_on_failure: bool = True,
            progress: Optional[Dict[str, Any]] = None, cordon_lost: bool = False) -> Dict[str, Any]:
    """What the rescue does when step `name` failed: whether the node is cordoned and the failure
    recorded on it, whether it is rolled back, and the hint.

    `cordon` (T3-19): from the drain on, this run cordoned the node (or may have); before it, the
    node is cordoned only when it records progress of this target (`progress`, upgrade_state's
    `state`; an earlier run left it mid-upgrade). A failure before the drain on a node no run of this
    target touched leaves it as it was: not cordoned by the rescue, no failure recorded, and a
    cordon someone else set stays.

    `cordon_lost` (T3-2): the step failed because the node was found uncordoned before it took the node's
    pods down (upgrade_state's require_cordoned). Then no rollback: its activation would take down, without
    eviction, the pods placed on the node while it was schedulable (the rescue only cordons again)."""
    s = step(name)
    if not isinstance(cordon_lost, bool):
        raise RecordError('cordon_lost: %r is not a boolean' % (cordon_lost,))
    recorded = records_progress(progress)        # checked whatever the step: bad input is refused
    cordon = STEP_NAMES.index(s.name) >= STEP_NAMES.index(FIRST_CHANGE) or recorded
    if cordon_lost:
        return {'phase': s.name, 'rollback': False, 'hint': CORDON_LOST_HINT, 'cordon': True}
    return {'phase': s.name, 'rollback': bool(rollback_on_failure and s.rolls_back), 'hint': s.hint,
            'cordon': cordon}


def steps_through(failed: Optional[str], applicable: Sequence[str]) -> List[str]:
    """The steps of `applicable` (in STEPS order) a node went through: all of them when nothing
    failed, else those before the failed one ([] when the failed step is not among them)."""
    for name in applicable:
        step(name)
    if failed is not None:
        step(failed)
    ordered = [n for n in STEP_NAMES if n in applicable]
    if failed is None:
        return ordered
    return ordered[:ordered.index(failed)] if failed in ordered else []


def evidence_phases(failed: Optional[str], rke2_applied: bool, dra: bool, kernel: bool = False,
                    operands: bool = False) -> List[str]:
    """The `phases` of a node's evidence entry: the steps it went through up to the failed one
    (RKE2 only when its Plan was applied, the postflight only on DRA nodes, the kernel's own steps
    only when the target changed the kernel, the operands' step only where the GPU Operator runs
    them). The failed step ran
    whatever it is (an RKE2 step that failed before its Plan was applied, the VMs): the steps before
    it are listed."""
    skip = set(EVIDENCE_EXCLUDED)
    if not rke2_applied:
        skip.add('rke2')
    if not dra:
        skip.add('postflight')
    if not kernel:
        skip.update(KERNEL_STEPS)
    if not operands:
        skip.update(OPERATOR_STEPS)
    skip.discard(failed)
    went = steps_through(failed, [n for n in STEP_NAMES if n not in skip])
    return [n for n in went if n not in EVIDENCE_EXCLUDED]


def finished(annotations: Dict[str, Any], key: str) -> bool:
    """Whether a Node's annotations say it finished the target `key` (target_key): `upgraded-to` is
    the key and no progress is recorded (a node recording a phase is in a rollout, even a later one)."""
    return (annotations or {}).get(ANN_DONE) == key and ANN_STATE not in (annotations or {})


def snapshot_target(annotations: Dict[str, Any]) -> Optional[str]:
    """The target whose snapshot the digest `gpufleet.io/snapshot-sha256` is: the target of the recorded
    progress, or, once the node finished (`upgraded-to` and no progress), the target it finished."""
    ann = annotations or {}
    if ann.get(ANN_TARGET) is not None:
        return ann[ANN_TARGET]
    return ann.get(ANN_DONE) if ANN_STATE not in ann else None
