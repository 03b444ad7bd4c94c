# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Cordon, drain and uncordon a node with kubectl-drain semantics, GPU VMs and job waits.

Decision functions are pure (`cordon_patch`, `uncordon_patch`, `classify_pod`, `plan_drain`,
`vm_stop_patch`); `Drainer` runs them over a small client interface (`DrainClient`, with a
Kubernetes implementation `KubeDrainClient`) and an injectable clock, so the loop is unit-tested
without a server.

Semantics (kubectl drain, not kubernetes.core k8s_drain):
- the node is cordoned first; its initial `spec.unschedulable` is kept in the annotation
  `gpufleet.io/initial-unschedulable` (written once) and progress in `gpufleet.io/upgrade-state`
  (cordoned, draining, drained, drain-failed);
- every pod is classified before anything is evicted; if any pod blocks (emptyDir without
  delete_local_data, no controller without force, a DaemonSet pod without ignore_daemonsets, a VMI
  under vmi_policy=refuse or a VMI without VirtualMachine under stop) the drain fails and evicts
  nothing; mirror and DaemonSet pods are skipped; finished pods are evicted without checks;
- wait_for_jobs: matching pods must finish before its timeout, else the drain fails and evicts
  nothing;
- evictions run in parallel with a bound; 429 (a PodDisruptionBudget) and transient errors are
  retried every `retry_interval` seconds until the deadline, each eviction carrying the pod's UID
  as precondition; a 409 (the precondition failed, or the API server's own PodDisruptionBudget
  status update conflicted) or a 404 (the pod is gone, or a misrouting proxy answered) re-reads the
  pod: the same UID still there is retried, not counted as gone; deletion is awaited by UID (a new
  pod with the same name is not the old one); no request of the rounds waits past `timeout`
  (K8sClient.bounded);
- on failure the node stays cordoned and the result lists what remains and why;
- uncordon lifts only a cordon this collection made (initial-unschedulable "false", refreshed
  whenever we cordon a schedulable node, and spec.unschedulable owned by our own field manager in
  the Node's managedFields: the API server's record of who set it, written with the cordon itself;
  someone who uncordoned and cordoned again since owns it), unless uncordon_preexisting (`force` is
  only for unmanaged pods). No owner recorded is not ours, unless this Drainer made the cordon;
- start_vms (after the node passed its gates) restores each VirtualMachine recorded in
  `gpufleet.io/stopped-vms` to its exact previous runStrategy/running, then clears the record; it
  refuses on a node that records a failure (a VM is never started on a failed node).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._poll import poll
from ._drain_policy import DrainPolicy, DrainPolicyError, parse as parse_policy, refusal as policy_refusal
from ._holders import controller_of, has_empty_dir, is_daemonset_pod, is_mirror_pod, vmi_node, vmi_owner_of_pod
from ._k8s import ConflictError, K8sClient, K8sError, NotFoundError, TooManyRequestsError, path_for
from ._managed_fields import FIELD_MANAGER, owned_only_by, owners
from ._merge_patch import apply_merge_patch
# ANN_CORDON_TAINT: the record of our cordon's taint that earlier versions wrote; only removed now
# (ownership is read from managedFields, written by the cordon itself).
from ._node_record import (
    ANN_CORDON_TAINT, ANN_INITIAL, ANN_SNAPSHOT, ANN_STATE, ANN_STOPPED_VMS, ANN_TARGET, snapshot_target,
)

VMI_POLICIES = ('refuse', 'stop', 'evict')
STATES = ('cordon', 'drain', 'uncordon', 'start_vms')
# Progress recorded by the roles that uncordon keeps: `validated` (every gate passed) stays until
# upgrade_state records the node done, so a controller killed between the uncordon and that record
# resumes after the gates instead of upgrading (and draining) the node again.
KEPT_ON_UNCORDON = ('validated',)
# A node recording one of these is not healthy: its stopped VMs are not started.
NO_VM_START = ('failed', 'rolled-back', 'drain-failed')
FINISHED = ('Succeeded', 'Failed')

KUBEVIRT = 'kubevirt.io/v1'
VMI_NODE_LABEL = 'kubevirt.io/nodeName'     # KubeVirt's label of a VMI's node
LAUNCHER_SELECTOR = 'kubevirt.io=virt-launcher'


class DrainError(Exception):
    """Bad options or an unrecoverable situation (message names the field and the value)."""


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class WaitForJobs:
    selector: str
    timeout: float


@dataclasses.dataclass(frozen=True)
class DrainOptions:
    timeout: float = 300
    grace_period: Optional[int] = None
    pod_selector: Optional[str] = None
    ignore_daemonsets: bool = True
    delete_local_data: bool = False
    force: bool = False
    disable_eviction: bool = False
    wait_for_jobs: Optional[WaitForJobs] = None
    vmi_policy: str = 'refuse'
    parallel: int = 10
    retry_interval: float = 2.5
    poll_interval: float = 1.0
    record_target: Optional[str] = None
    # The plan's drain policy (_drain_policy): where given, it decides local data, unmanaged pods and the grace
    # period per pod, instead of delete_local_data, force and grace_period.
    policy: Optional[DrainPolicy] = None

    def grace_for(self, pod: Dict[str, Any]) -> Optional[int]:
        """The grace period an eviction of `pod` asks for: the policy's for it where it says one, else grace_period."""
        if self.policy is not None:
            grace = self.policy.for_pod(pod).grace_period
            if grace is not None:
                return grace
        return self.grace_period


def options_from_params(params: Dict[str, Any]) -> DrainOptions:
    """Validate the module parameters; DrainError names the field and the value."""
    def positive(name: str, value: Any, allow_zero: bool = False) -> float:
        if value is None:
            raise DrainError('%s must be set' % name)
        if value < 0 or (value == 0 and not allow_zero):
            raise DrainError('%s must be %s, got %r' % (name, '>= 0' if allow_zero else '> 0', value))
        return value

    timeout = positive('timeout', params.get('timeout', 300))
    grace = params.get('grace_period')
    if grace is not None:
        positive('grace_period', grace, allow_zero=True)
    policy = params.get('vmi_policy') or 'refuse'
    if policy not in VMI_POLICIES:
        raise DrainError('vmi_policy must be one of %s, got %r' % (', '.join(VMI_POLICIES), policy))
    wfj = params.get('wait_for_jobs')
    wait = None
    if wfj:
        selector = (wfj.get('selector') or '').strip()
        if not selector:
            raise DrainError('wait_for_jobs.selector must be a non-empty label selector, got %r' % wfj.get('selector'))
        wait = WaitForJobs(selector, positive('wait_for_jobs.timeout', wfj.get('timeout')))
    parallel = int(positive('parallel', params.get('parallel', 10)))
    retry = positive('retry_interval', params.get('retry_interval', 2.5))
    if retry < 0.1:
        raise DrainError('retry_interval must be >= 0.1 seconds, got %r' % retry)
    drain_policy = None
    if params.get('policy') is not None:
        try:
            drain_policy = parse_policy(params['policy'], 'policy')
        except DrainPolicyError as exc:
            raise DrainError(str(exc))
    record_target = params.get('record_target')
    if record_target is not None and '=' not in str(record_target):
        raise DrainError('record_target must be a target key (key=value,...) as upgrade_state reports it, got %r'
                         % (record_target,))
    return DrainOptions(timeout=float(timeout), grace_period=grace, pod_selector=params.get('pod_selector') or None,
                        ignore_daemonsets=params.get('ignore_daemonsets', True),
                        delete_local_data=params.get('delete_local_data', False), force=params.get('force', False),
                        disable_eviction=params.get('disable_eviction', False), wait_for_jobs=wait,
                        vmi_policy=policy, parallel=parallel, retry_interval=float(retry),
                        poll_interval=min(1.0, float(retry)), record_target=record_target or None,
                        policy=drain_policy)


# ---------------------------------------------------------------------------------------------
# Node decisions (pure)
# ---------------------------------------------------------------------------------------------
def _annotations(node: Dict[str, Any]) -> Dict[str, str]:
    return dict((node.get('metadata') or {}).get('annotations') or {})


def is_unschedulable(node: Dict[str, Any]) -> bool:
    return bool((node.get('spec') or {}).get('unschedulable'))


def node_view(node: Dict[str, Any]) -> Dict[str, Any]:
    """What the module shows of a Node in diff mode."""
    ann = _annotations(node)
    return {'unschedulable': is_unschedulable(node),
            'annotations': {k: ann[k] for k in sorted(ann) if k.startswith('gpufleet.io/')}}


def initially_unschedulable(node: Dict[str, Any]) -> bool:
    value = _annotations(node).get(ANN_INITIAL)
    if value is None:
        return is_unschedulable(node)
    return value == 'true'


UNSCHEDULABLE = ('spec', 'unschedulable')


def cordon_owners(node: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Who set the node's spec.unschedulable, from its managedFields ({manager, operation, time};
    [] when the API records no owner)."""
    return owners(node, UNSCHEDULABLE)


def cordon_patch(node: Dict[str, Any], state: str = 'cordoned') -> Optional[Dict[str, Any]]:
    """Merge patch that cordons the node and records its initial state, or None if nothing to do.

    Cordoning a schedulable node always records initial-unschedulable "false" (and drops the taint
    record of earlier versions): a record left by an earlier run belongs to a cordon someone has
    lifted since. On a node that is already cordoned the annotation is written only when absent
    (a rerun keeps the first value). `state` is written with a cordon, or when the node records no
    progress yet; a node that is already cordoned by this collection keeps the progress it records.
    """
    ann = _annotations(node)
    patch_ann: Dict[str, Any] = {}
    if not is_unschedulable(node):
        if ann.get(ANN_INITIAL) != 'false':
            patch_ann[ANN_INITIAL] = 'false'
        if ANN_CORDON_TAINT in ann:
            patch_ann[ANN_CORDON_TAINT] = None
    elif ANN_INITIAL not in ann:
        patch_ann[ANN_INITIAL] = 'true'
    cordoning = bool(patch_ann) or not is_unschedulable(node)
    current = ann.get(ANN_STATE)
    if current is None or (cordoning and current != state):
        patch_ann[ANN_STATE] = state
    patch: Dict[str, Any] = {}
    if not is_unschedulable(node):
        patch['spec'] = {'unschedulable': True}
    if patch_ann:
        patch['metadata'] = {'annotations': patch_ann}
    return patch or None


DRAIN_STATES = ('cordoned', 'draining', 'drained')


def with_target(node: Dict[str, Any], patch: Optional[Dict[str, Any]], target: Optional[str]) -> Optional[Dict[str, Any]]:
    """`patch`, plus `gpufleet.io/upgrade-target: target` when the progress it leaves is the drain's
    own (cordoned, draining, drained) and the node names another target or none: the drain's record
    then belongs to the rollout that made it, and a rerun trusts it (upgrade_state treats a record
    without a target as stale). Another target's snapshot digest goes with the old target."""
    if not target:
        return patch
    ann = _annotations(node)
    new_ann = ((patch or {}).get('metadata') or {}).get('annotations') or {}
    state = new_ann.get(ANN_STATE, ann.get(ANN_STATE))
    if state not in DRAIN_STATES or ann.get(ANN_TARGET) == target:
        return patch
    out = dict(patch or {})
    meta = dict(out.get('metadata') or {})
    extra = dict(meta.get('annotations') or {})
    extra[ANN_TARGET] = target
    if ann.get(ANN_SNAPSHOT) is not None and snapshot_target(ann) != target:
        extra[ANN_SNAPSHOT] = None
    meta['annotations'] = extra
    out['metadata'] = meta
    return out


def state_patch(node: Dict[str, Any], state: str, stopped_vms: Optional[List[Dict[str, Any]]] = None
                ) -> Optional[Dict[str, Any]]:
    ann = _annotations(node)
    patch_ann: Dict[str, Any] = {}
    if ann.get(ANN_STATE) != state:
        patch_ann[ANN_STATE] = state
    if stopped_vms is not None:
        merged = merge_stopped_vms(ann.get(ANN_STOPPED_VMS), stopped_vms)
        if merged != ann.get(ANN_STOPPED_VMS):
            patch_ann[ANN_STOPPED_VMS] = merged
    return {'metadata': {'annotations': patch_ann}} if patch_ann else None


def is_our_cordon(node: Dict[str, Any], made_here: bool = False) -> bool:
    """This collection made the node's cordon: initial-unschedulable "false" and spec.unschedulable
    owned by our field manager alone (someone who uncordoned and cordoned again since owns it). A
    node whose managedFields name no owner of spec.unschedulable is not ours, unless `made_here`
    (the caller made this cordon itself)."""
    if _annotations(node).get(ANN_INITIAL) != 'false':
        return False
    if not cordon_owners(node):
        return made_here
    return owned_only_by(node, UNSCHEDULABLE, FIELD_MANAGER)


def uncordon_patch(node: Dict[str, Any], uncordon_preexisting: bool = False,
                   made_here: bool = False) -> Tuple[Optional[Dict[str, Any]], bool]:
    """(merge patch or None, cordon kept).

    The cordon is lifted only when this collection made it (is_our_cordon, `made_here` passed on) or
    with uncordon_preexisting. Our initial-state and progress annotations are removed either way, except
    the progress `validated` (KEPT_ON_UNCORDON: upgrade_state clears it when it records the node
    done); the record of stopped VMs stays for start_vms.
    """
    ann = _annotations(node)
    ours = is_our_cordon(node, made_here)
    lift = is_unschedulable(node) and (ours or uncordon_preexisting)
    kept = is_unschedulable(node) and not lift
    patch: Dict[str, Any] = {}
    if lift:
        patch['spec'] = {'unschedulable': None}
    remove = {k: None for k in (ANN_INITIAL, ANN_STATE, ANN_CORDON_TAINT) if k in ann
              and not (k == ANN_STATE and ann[k] in KEPT_ON_UNCORDON)}
    if remove:
        patch['metadata'] = {'annotations': remove}
    return (patch or None), kept


def merge_stopped_vms(existing: Optional[str], new: List[Dict[str, Any]]) -> str:
    """The stopped-VMs annotation: a JSON list of {namespace, name, runStrategy|running} sorted by
    namespace/name; entries already recorded keep their first (pre-stop) value."""
    try:
        current = json.loads(existing) if existing else []
        if not isinstance(current, list):
            current = []
    except ValueError:
        current = []
    seen = {(e.get('namespace'), e.get('name')) for e in current if isinstance(e, dict)}
    merged = [e for e in current if isinstance(e, dict)]
    for e in new:
        if (e['namespace'], e['name']) not in seen:
            merged.append(e)
            seen.add((e['namespace'], e['name']))
    merged.sort(key=lambda e: (str(e.get('namespace')), str(e.get('name'))))
    return json.dumps(merged, sort_keys=True, separators=(',', ':'))


def vm_stop_patch(vm: Dict[str, Any]) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """(merge patch halting the VirtualMachine or None if already halted, record of its run state)."""
    spec = vm.get('spec') or {}
    meta = vm.get('metadata') or {}
    record: Dict[str, Any] = {'namespace': meta.get('namespace'), 'name': meta.get('name')}
    if 'running' in spec and 'runStrategy' not in spec:
        record['running'] = spec.get('running')
        return ({'spec': {'running': False}} if spec.get('running') else None), record
    record['runStrategy'] = spec.get('runStrategy')
    if spec.get('runStrategy') == 'Halted':
        return None, record
    return {'spec': {'runStrategy': 'Halted'}}, record


def parse_stopped_vms(text: Optional[str]) -> List[Dict[str, Any]]:
    """The records of the stopped-VMs annotation ([] when absent); DrainError when malformed."""
    if not text:
        return []
    try:
        records = json.loads(text)
    except ValueError as exc:
        raise DrainError('annotation %s: not JSON (%s): %r' % (ANN_STOPPED_VMS, exc, text))
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and r.get('namespace') and r.get('name') and ('running' in r or 'runStrategy' in r)
            for r in records):
        raise DrainError('annotation %s: expected a list of {namespace, name, runStrategy|running}, got %r'
                         % (ANN_STOPPED_VMS, text))
    return records


def vm_run_state(vm: Dict[str, Any]) -> Dict[str, Any]:
    """The run fields of a VirtualMachine's spec (what stop and start change), for diffs."""
    spec = vm.get('spec') or {}
    return {k: spec[k] for k in ('runStrategy', 'running') if k in spec}


def vm_start_patch(vm: Dict[str, Any], record: Dict[str, Any]) -> Tuple[Optional[Dict[str, Any]], str]:
    """(merge patch restoring the recorded run state or None, outcome).

    outcome: 'start' (the VM is as the drain left it, halted: the patch restores the exact previous
    runStrategy, or running, removing the field when there was none), 'unchanged' (already in its
    recorded state), 'left' (someone changed its run state since the drain: left as it is).
    """
    spec = vm.get('spec') or {}
    if 'running' in record:
        if 'runStrategy' in spec:
            return None, 'left'
        if spec.get('running') == record['running']:
            return None, 'unchanged'
        if spec.get('running') is False:
            return {'spec': {'running': record['running']}}, 'start'
        return None, 'left'
    want = record.get('runStrategy')
    current = spec.get('runStrategy')
    if current == want and not (want is None and 'running' in spec):
        return None, 'unchanged'
    if current == 'Halted':
        return {'spec': {'runStrategy': want}}, 'start'
    return None, 'left'


def stopped_vms_patch(node: Dict[str, Any], remaining: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Merge patch leaving only `remaining` in the stopped-VMs record (removed when empty)."""
    ann = _annotations(node)
    want = json.dumps(sorted(remaining, key=lambda e: (str(e.get('namespace')), str(e.get('name')))),
                      sort_keys=True, separators=(',', ':')) if remaining else None
    if ann.get(ANN_STOPPED_VMS) == want:
        return None
    return {'metadata': {'annotations': {ANN_STOPPED_VMS: want}}}


# ---------------------------------------------------------------------------------------------
# Pod decisions (pure)
# ---------------------------------------------------------------------------------------------
def ref(obj: Dict[str, Any], kind: str = 'Pod') -> Dict[str, Any]:
    meta = obj.get('metadata') or {}
    return {'kind': kind, 'namespace': meta.get('namespace'), 'name': meta.get('name'), 'uid': meta.get('uid')}


def classify_pod(pod: Dict[str, Any], opts: DrainOptions) -> Tuple[str, str]:
    """(action, reason): action is 'skip', 'evict', 'block', 'vmi' (decided by vmi_policy) or
    'wait' (already terminating: only wait for it to go)."""
    if is_mirror_pod(pod):
        return 'skip', 'mirror pod'
    if is_daemonset_pod(pod):
        if opts.ignore_daemonsets:
            return 'skip', 'DaemonSet-managed pod'
        return 'block', 'DaemonSet-managed pod (set ignore_daemonsets)'
    if (pod.get('metadata') or {}).get('deletionTimestamp'):
        return 'wait', 'already terminating'
    if (pod.get('status') or {}).get('phase') in FINISHED:
        return 'evict', 'finished pod'
    if vmi_owner_of_pod(pod) is not None:
        return 'vmi', 'virt-launcher pod of a VirtualMachineInstance'
    if opts.policy is not None:
        why = policy_refusal(pod, opts.policy.for_pod(pod))
        if why:
            return 'block', why
        owner = controller_of(pod)
        return 'evict', 'managed by %s/%s' % (owner['kind'], owner['name']) if owner else 'no controller (drain policy)'
    problems = []
    if has_empty_dir(pod) and not opts.delete_local_data:
        problems.append('uses local storage (emptyDir; set delete_local_data)')
    if controller_of(pod) is None and not opts.force:
        problems.append('not managed by a controller (set force)')
    if problems:
        return 'block', '; '.join(problems)
    return 'evict', 'managed by %s' % ('%s/%s' % (controller_of(pod)['kind'], controller_of(pod)['name'])
                                       if controller_of(pod) else 'no controller (force)')


class DrainPlan:
    def __init__(self) -> None:
        self.evict: List[Dict[str, Any]] = []      # pods to evict
        self.wait: List[Dict[str, Any]] = []       # pods already terminating
        self.skipped: List[Dict[str, Any]] = []    # {kind, namespace, name, uid, reason}
        self.blocked: List[Dict[str, Any]] = []
        self.vm_stops: List[Tuple[Dict[str, Any], Dict[str, Any]]] = []  # (vmi, vm) for policy stop
        self.vmis_to_leave: List[Dict[str, Any]] = []  # VMIs that must leave the node (stop/evict)

    def would_change(self) -> bool:
        return bool(self.evict or self.wait or self.vm_stops or self.vmis_to_leave)


def plan_drain(pods: Sequence[Dict[str, Any]], vmis: Sequence[Dict[str, Any]],
               vms: Dict[Tuple[str, str], Optional[Dict[str, Any]]], opts: DrainOptions) -> DrainPlan:
    """Classify every pod and VMI on the node. `vms` maps (namespace, name) of each VMI's
    VirtualMachine (from its controller ownerReference) to the VM object, None if absent."""
    plan = DrainPlan()
    vmi_keys = set()
    for vmi in vmis:
        meta = vmi.get('metadata') or {}
        key = (meta.get('namespace'), meta.get('name'))
        vmi_keys.add(key)
        entry = ref(vmi, 'VirtualMachineInstance')
        if opts.vmi_policy == 'refuse':
            entry['reason'] = ('VirtualMachineInstance on the node (vmi_policy=refuse: GPU passthrough VMs cannot '
                               'live-migrate; use vmi_policy=stop or evict)')
            plan.blocked.append(entry)
        elif opts.vmi_policy == 'stop':
            owner = controller_of(vmi)
            vm = vms.get((meta.get('namespace'), owner.get('name'))) if owner and owner.get('kind') == 'VirtualMachine' else None
            if vm is None:
                entry['reason'] = 'VirtualMachineInstance without a VirtualMachine cannot be stopped and restarted (vmi_policy=stop)'
                plan.blocked.append(entry)
            else:
                plan.vm_stops.append((vmi, vm))
                plan.vmis_to_leave.append(vmi)
        else:
            plan.vmis_to_leave.append(vmi)
    for pod in pods:
        action, reason = classify_pod(pod, opts)
        entry = ref(pod)
        entry['reason'] = reason
        if action == 'skip':
            plan.skipped.append(entry)
        elif action == 'block':
            plan.blocked.append(entry)
        elif action == 'wait':
            plan.wait.append(pod)
        elif action == 'vmi':
            key = vmi_owner_of_pod(pod)
            if key in vmi_keys:
                if opts.vmi_policy == 'evict':
                    plan.evict.append(pod)
                # refuse: the VMI is blocked; stop: the launcher goes with its VMI.
            else:
                # a launcher whose VMI is gone: an ordinary controlled pod
                plan.evict.append(pod)
        else:
            plan.evict.append(pod)
    return plan


def _qualified(obj: Dict[str, Any]) -> str:
    meta = obj.get('metadata') or {}
    return '%s/%s' % (meta.get('namespace'), meta.get('name'))


def dry_run(nodes: Sequence[str], pods: Sequence[Dict[str, Any]], vmis: Sequence[Dict[str, Any]],
            policy: DrainPolicy, vmi_policy: str = 'refuse') -> List[Dict[str, Any]]:
    """What the drain of each of ``nodes`` would do now, from one read of the cluster's pods and VMIs (issue 40 item 2):
    per node, the pods it would refuse (with why), evict with their local data deleted, wait for (already terminating)
    and evict, and the DaemonSet and mirror pods it leaves. The drain's own classification (_drain.plan_drain) with the
    policy; a VMI is refused under ``vmi_policy`` refuse and listed as leaving otherwise."""
    opts = DrainOptions(policy=policy, vmi_policy=vmi_policy)
    by_node: Dict[str, List[Dict[str, Any]]] = dict((n, []) for n in nodes)
    for pod in pods:
        node = (pod.get('spec') or {}).get('nodeName')
        if node in by_node:
            by_node[node].append(pod)
    vmis_by_node: Dict[str, List[Dict[str, Any]]] = dict((n, []) for n in nodes)
    for vmi in vmis:
        node = vmi_node(vmi)
        if node in vmis_by_node:
            vmis_by_node[node].append(vmi)
    out = []
    for node in nodes:
        # stop: a VMI's VirtualMachine is not read here; the drain itself refuses one without a VirtualMachine.
        vms = dict(((((v.get('metadata') or {}).get('namespace')), ((controller_of(v) or {}).get('name'))), v)
                   for v in vmis_by_node[node])
        plan = plan_drain(by_node[node], vmis_by_node[node], vms, opts)
        name = _qualified
        out.append({'node': node,
                    'refuse': [dict(b) for b in plan.blocked],
                    'evict': sorted(name(p) for p in plan.evict),
                    'local_data_deleted': sorted(name(p) for p in plan.evict if has_empty_dir(p)),
                    'wait': sorted(name(p) for p in plan.wait),
                    'vms_leaving': sorted(name(v) for v in plan.vmis_to_leave),
                    'left': len(plan.skipped)})
    return out


# ---------------------------------------------------------------------------------------------
# Client interface
# ---------------------------------------------------------------------------------------------
class DrainClient:
    """What the drain needs from Kubernetes. Errors are _k8s errors (NotFoundError, ...)."""

    def get_node(self, name: str) -> Dict[str, Any]:
        raise NotImplementedError

    def update_node(self, name: str, compute: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]],
                    current: Optional[Dict[str, Any]] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Apply compute(node) as a patch guarded by the node's resourceVersion; `current` (a
        recent read) saves the first GET, a conflict re-reads. Returns (before, after)."""
        raise NotImplementedError

    def list_pods(self, node: str, label_selector: Optional[str] = None) -> List[Dict[str, Any]]:
        raise NotImplementedError

    def list_vmis(self, node: str) -> List[Dict[str, Any]]:
        raise NotImplementedError

    def get_vm(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        raise NotImplementedError

    def patch_vm(self, namespace: str, name: str, patch: Dict[str, Any]) -> Dict[str, Any]:
        raise NotImplementedError

    def evict(self, pod: Dict[str, Any], grace_period: Optional[int]) -> None:
        raise NotImplementedError

    def delete_pod(self, pod: Dict[str, Any], grace_period: Optional[int]) -> None:
        raise NotImplementedError

    def pod_gone(self, pod: Dict[str, Any]) -> bool:
        raise NotImplementedError

    def pod_uids(self, node: str, label_selector: Optional[str] = None) -> set:
        """UIDs of the pods on the node now (one list: how deletions are awaited)."""
        return {(p.get('metadata') or {}).get('uid') for p in self.list_pods(node, label_selector)}

    def vmi_gone(self, vmi: Dict[str, Any], node: str) -> bool:
        raise NotImplementedError

    def bounded(self, deadline: float) -> Any:
        """A context in which no request waits past `deadline` (the Drainer's clock)."""
        return contextlib.nullcontext()


def _delete_options(pod: Dict[str, Any], grace_period: Optional[int]) -> Dict[str, Any]:
    opts: Dict[str, Any] = {'apiVersion': 'v1', 'kind': 'DeleteOptions',
                            'preconditions': {'uid': (pod.get('metadata') or {}).get('uid')}}
    if grace_period is not None:
        opts['gracePeriodSeconds'] = int(grace_period)
    return opts


class KubeDrainClient(DrainClient):
    """DrainClient over the Kubernetes API (K8sClient)."""

    def __init__(self, k8s: K8sClient) -> None:
        self.k8s = k8s

    def get_node(self, name: str) -> Dict[str, Any]:
        return self.k8s.get(path_for('v1', 'nodes', name))

    def update_node(self, name, compute, current=None):
        # Our own field manager: managedFields then say that the collection set spec.unschedulable.
        return self.k8s.update(path_for('v1', 'nodes', name), compute, current, field_manager=FIELD_MANAGER)

    def list_pods(self, node, label_selector=None):
        query: Dict[str, Any] = {'fieldSelector': 'spec.nodeName=%s' % node}
        if label_selector:
            query['labelSelector'] = label_selector
        return self.k8s.list_all(path_for('v1', 'pods'), query)

    def list_vmis(self, node):
        """The VMIs on `node`, in requests that do not grow with the fleet: those KubeVirt labels
        kubevirt.io/nodeName=<node> and, where KubeVirt is installed, the VMI of any virt-launcher pod
        on the node that the first list misses (its label not set yet), read by name."""
        found: Dict[Any, Dict[str, Any]] = {}
        try:
            labelled = self.k8s.list_all(path_for(KUBEVIRT, 'virtualmachineinstances'),
                                         {'labelSelector': '%s=%s' % (VMI_NODE_LABEL, node)})
        except NotFoundError:
            return []   # KubeVirt is not installed: no VMI, no launcher pod to follow
        for vmi in labelled:
            if vmi_node(vmi) == node:
                found[((vmi.get('metadata') or {}).get('namespace'), (vmi.get('metadata') or {}).get('name'))] = vmi
        for pod in self.list_pods(node, LAUNCHER_SELECTOR):
            key = vmi_owner_of_pod(pod)
            if key is None or key in found:
                continue
            vmi = self.k8s.get_or_none(path_for(KUBEVIRT, 'virtualmachineinstances', key[1], key[0]))
            if vmi and vmi_node(vmi) == node:
                found[key] = vmi
        return list(found.values())

    def get_vm(self, namespace, name):
        return self.k8s.get_or_none(path_for(KUBEVIRT, 'virtualmachines', name, namespace))

    def patch_vm(self, namespace, name, patch):
        return self.k8s.patch(path_for(KUBEVIRT, 'virtualmachines', name, namespace), patch)

    def evict(self, pod, grace_period):
        meta = pod['metadata']
        body = {'apiVersion': 'policy/v1', 'kind': 'Eviction',
                'metadata': {'name': meta['name'], 'namespace': meta.get('namespace')},
                'deleteOptions': _delete_options(pod, grace_period)}
        self.k8s.post(path_for('v1', 'pods', meta['name'], meta.get('namespace'), 'eviction'), body)

    def delete_pod(self, pod, grace_period):
        meta = pod['metadata']
        self.k8s.delete(path_for('v1', 'pods', meta['name'], meta.get('namespace')),
                        _delete_options(pod, grace_period))

    def pod_gone(self, pod):
        meta = pod['metadata']
        current = self.k8s.get_or_none(path_for('v1', 'pods', meta['name'], meta.get('namespace')))
        return current is None or (current.get('metadata') or {}).get('uid') != meta.get('uid')

    def bounded(self, deadline):
        return self.k8s.bounded(deadline)

    def vmi_gone(self, vmi, node):
        meta = vmi['metadata']
        current = self.k8s.get_or_none(path_for(KUBEVIRT, 'virtualmachineinstances', meta['name'],
                                                meta.get('namespace')))
        return (current is None or (current.get('metadata') or {}).get('uid') != meta.get('uid')
                or vmi_node(current) != node)


# ---------------------------------------------------------------------------------------------
# The drain loop
# ---------------------------------------------------------------------------------------------
class _Item:
    def __init__(self, obj: Dict[str, Any], kind: str, stage: str) -> None:
        self.obj = obj
        self.kind = kind          # 'Pod' | 'VirtualMachineInstance'
        self.stage = stage        # 'evict' | 'wait' | 'done' | 'failed'
        self.next_at = 0.0
        self.attempts = 0
        self.polls = 0
        self.last_reason = ''


class Drainer:
    def __init__(self, client: DrainClient, opts: DrainOptions, check_mode: bool = False,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.client = client
        self.opts = opts
        self.check_mode = check_mode
        self.clock = clock
        self.sleep = sleep

    # -- node state --------------------------------------------------------------------------
    def _update_node(self, name: str, compute: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]],
                     node: Optional[Dict[str, Any]] = None) -> Tuple[Dict[str, Any], Dict[str, Any], bool]:
        """(before, after, changed). `node` (default: the node as this run last wrote or predicted
        it) saves a read. In check mode nothing is written: the after is predicted."""
        if node is None:
            node = getattr(self, '_last_node', None)
        if self.check_mode:
            current = node if node is not None else self.client.get_node(name)
            after = apply_merge_patch(current, compute(current))
        else:
            current, after = self.client.update_node(name, compute, node)
        self._last_node = after
        return current, after, node_view(current) != node_view(after)

    def cordon(self, name: str, state: str = 'cordoned') -> Dict[str, Any]:
        self._last_node = None
        self._cordoned_here = False
        target = self.opts.record_target
        before, after, changed = self._update_node(name, lambda n: with_target(n, cordon_patch(n, state), target))
        # This Drainer made the cordon (what is_our_cordon accepts when the API names no owner).
        self._cordoned_here = not is_unschedulable(before) and is_unschedulable(after)
        return {'changed': changed, 'before': node_view(before), 'after': node_view(after),
                'initially_unschedulable': initially_unschedulable(before), 'cordoned': not is_unschedulable(before)}

    def uncordon(self, name: str, uncordon_preexisting: bool = False) -> Dict[str, Any]:
        kept = {'value': False}
        made_here = getattr(self, '_cordoned_here', False)

        def compute(node: Dict[str, Any]) -> Optional[Dict[str, Any]]:
            patch, kept['value'] = uncordon_patch(node, uncordon_preexisting, made_here)
            return patch

        self._last_node = None
        self._cordoned_here = False
        before, after, changed = self._update_node(name, compute)
        return {'changed': changed, 'before': node_view(before), 'after': node_view(after),
                'initially_unschedulable': initially_unschedulable(before), 'kept_cordon': kept['value']}

    # -- GPU VMs back ------------------------------------------------------------------------
    def start_vms(self, name: str) -> Dict[str, Any]:
        """Start again the VirtualMachines recorded as stopped by the drain; clear their record.

        Refused (DrainError, nothing changed) when the node records a failure. A VM whose start
        failed keeps its record (the result is failed); a VM deleted since, or whose run state
        someone changed since, is reported and its record dropped.
        """
        self._last_node = None
        node = self.client.get_node(name)
        ann = _annotations(node)
        records = parse_stopped_vms(ann.get(ANN_STOPPED_VMS))
        state = ann.get(ANN_STATE)
        if records and state in NO_VM_START:
            raise DrainError('node %s records %s=%s: its %d stopped VM(s) (%s) are not started on a failed node; '
                             'recover the node, then start them' % (
                                 name, ANN_STATE, state, len(records),
                                 ', '.join('%s/%s' % (r['namespace'], r['name']) for r in records)))
        res: Dict[str, Any] = {'started_vms': [], 'unchanged_vms': [], 'left_vms': [], 'failed': False, 'msg': ''}
        vms_before: Dict[str, Any] = {}
        vms_after: Dict[str, Any] = {}
        remaining: List[Dict[str, Any]] = []
        errors: List[str] = []
        for rec in records:
            key = '%s/%s' % (rec['namespace'], rec['name'])
            vm = self.client.get_vm(rec['namespace'], rec['name'])
            if vm is None:
                res['left_vms'].append(dict(rec, reason='the VirtualMachine no longer exists'))
                continue
            vms_before[key] = vm_run_state(vm)
            patch, outcome = vm_start_patch(vm, rec)
            vms_after[key] = vm_run_state(apply_merge_patch(vm, patch))
            if outcome == 'unchanged':
                res['unchanged_vms'].append(rec)
            elif outcome == 'left':
                res['left_vms'].append(dict(rec, reason='its run state changed since the drain halted it (now %s): '
                                            'left as it is' % json.dumps(vm_run_state(vm), sort_keys=True)))
            else:
                try:
                    if not self.check_mode:
                        self.client.patch_vm(rec['namespace'], rec['name'], patch)
                    res['started_vms'].append(rec)
                except K8sError as exc:
                    vms_after[key] = vms_before[key]
                    remaining.append(rec)
                    errors.append('%s: %s' % (key, exc))
        before, after, node_changed = self._update_node(name, lambda n: stopped_vms_patch(n, remaining), node)
        res['changed'] = bool(res['started_vms']) or node_changed
        res['before'] = {'node': node_view(before), 'vms': vms_before}
        res['after'] = {'node': node_view(after), 'vms': vms_after}
        if errors:
            res['failed'] = True
            res['msg'] = ('starting %d VirtualMachine(s) of node %s failed; their record stays in %s: %s'
                          % (len(errors), name, ANN_STOPPED_VMS, '; '.join(errors)))
        return res

    # -- drain -------------------------------------------------------------------------------
    def drain(self, name: str) -> Dict[str, Any]:
        """Returns a result dict; `failed` True with `msg` when the drain did not complete."""
        opts = self.opts
        res: Dict[str, Any] = {'evicted': [], 'remaining': [], 'blocked': [], 'skipped': [], 'stopped_vms': [],
                               'failed': False, 'msg': ''}
        cordon = self.cordon(name, 'draining')
        res.update(initially_unschedulable=cordon['initially_unschedulable'], cordoned=cordon['cordoned'])

        pods = self.client.list_pods(name, opts.pod_selector)
        vmis = self.client.list_vmis(name)
        vms: Dict[Tuple[str, str], Optional[Dict[str, Any]]] = {}
        if opts.vmi_policy == 'stop':
            for vmi in vmis:
                owner = controller_of(vmi)
                if owner and owner.get('kind') == 'VirtualMachine':
                    key = ((vmi.get('metadata') or {}).get('namespace'), owner.get('name'))
                    vms[key] = self.client.get_vm(key[0], key[1])
        plan = plan_drain(pods, vmis, vms, opts)
        res['skipped'] = plan.skipped
        res['blocked'] = plan.blocked
        pending = [ref(p) for p in plan.evict + plan.wait] + [ref(v, 'VirtualMachineInstance') for v in plan.vmis_to_leave]

        def finish(state: str, changed: bool) -> Dict[str, Any]:
            after, ch = self._update_node(
                name, lambda n: with_target(n, state_patch(n, state), self.opts.record_target))[1:]
            res['changed'] = bool(cordon['changed'] or changed or ch)
            res['diff'] = {'before': cordon['before'], 'after': node_view(after)}
            res['state'] = state
            return res

        if plan.blocked:
            res['remaining'] = [dict(p, reason='not evicted: the drain is blocked') for p in pending]
            res['failed'] = True
            res['msg'] = 'drain of node %s blocked before any eviction (the node stays cordoned): %s' % (
                name, '; '.join('%s %s/%s: %s' % (b['kind'], b['namespace'], b['name'], b['reason'])
                                for b in plan.blocked))
            return finish('drain-failed', False)

        if self.check_mode:
            res['evicted'] = [ref(p) for p in plan.evict]
            res['stopped_vms'] = [vm_stop_patch(pair[1])[1] for pair in plan.vm_stops]
            return finish('drained', plan.would_change())

        if not plan.would_change():
            return finish('drained', False)

        if not self._wait_for_jobs(name, res):
            res['remaining'] = [dict(p, reason='not evicted: wait_for_jobs timed out') for p in pending]
            return finish('drain-failed', True)

        # Record the VMs before halting them, so a crash cannot lose which ones to restart.
        records = [vm_stop_patch(pair[1])[1] for pair in plan.vm_stops]
        if records:
            self._update_node(name, lambda n: with_target(n, state_patch(n, 'draining', records),
                                                          self.opts.record_target))
        items: List[_Item] = []
        for vmi, vm in plan.vm_stops:
            patch, record = vm_stop_patch(vm)
            meta = vm.get('metadata') or {}
            try:
                if patch:
                    self.client.patch_vm(meta.get('namespace'), meta.get('name'), patch)
                res['stopped_vms'].append(record)
            except K8sError as exc:
                it = _Item(vmi, 'VirtualMachineInstance', 'failed')
                it.last_reason = 'stopping VirtualMachine %s/%s failed: %s' % (meta.get('namespace'), meta.get('name'), exc)
                items.append(it)
        failed_vmis = {id(i.obj) for i in items}
        items += [_Item(p, 'Pod', 'evict') for p in plan.evict]
        items += [_Item(p, 'Pod', 'wait') for p in plan.wait]
        items += [_Item(v, 'VirtualMachineInstance', 'wait') for v in plan.vmis_to_leave if id(v) not in failed_vmis]
        self._run(name, items)

        for it in items:
            entry = ref(it.obj, it.kind)
            if it.stage == 'done':
                if it.kind == 'Pod' and it.attempts:
                    res['evicted'].append(entry)
                elif it.kind == 'VirtualMachineInstance' and opts.vmi_policy == 'evict':
                    res['evicted'].append(entry)
            else:
                entry['reason'] = it.last_reason or 'still on the node at the deadline'
                res['remaining'].append(entry)
        if res['remaining']:
            res['failed'] = True
            res['msg'] = ('drain of node %s did not complete within the timeout of %gs; the node stays cordoned; '
                          'remaining: %s' % (name, opts.timeout, '; '.join(
                              '%s %s/%s: %s' % (r['kind'], r['namespace'], r['name'], r['reason'])
                              for r in res['remaining'])))
            return finish('drain-failed', True)
        return finish('drained', True)

    def _wait_for_jobs(self, name: str, res: Dict[str, Any]) -> bool:
        wfj = self.opts.wait_for_jobs
        if wfj is None:
            return True
        polled = poll(lambda: [p for p in self.client.list_pods(name, wfj.selector)
                               if (p.get('status') or {}).get('phase') not in FINISHED],
                      wfj.timeout, self.opts.retry_interval, self.clock, self.sleep, done=lambda running: not running)
        if polled.done:
            return True
        running = polled.value
        res['failed'] = True
        res['waiting_for_jobs'] = [ref(p) for p in running]
        res['msg'] = ('wait_for_jobs: %d pod(s) matching %r on node %s did not finish within %gs; nothing was '
                      'evicted, the node stays cordoned: %s' % (
                          len(running), wfj.selector, name, wfj.timeout,
                          ', '.join('%s/%s' % (r['namespace'], r['name']) for r in res['waiting_for_jobs'])))
        return False

    def _attempt(self, it: _Item) -> Tuple[str, str]:
        """One step for one item (an eviction, or a VMI awaited): ('done'|'wait'|'retry'|'failed', reason)."""
        node_name = self._node
        try:
            if it.stage == 'evict':
                it.attempts += 1
                if self.opts.disable_eviction:
                    self.client.delete_pod(it.obj, self.opts.grace_for(it.obj))
                else:
                    self.client.evict(it.obj, self.opts.grace_for(it.obj))
                return 'wait', ''
            # Pods awaited for their deletion are checked together in _round, never here.
            return ('done', '') if self.client.vmi_gone(it.obj, node_name) else ('wait', 'VMI still on the node')
        except NotFoundError as exc:
            # Usually the pod is already gone; but a misrouting proxy or an API aggregation error
            # answers 404 too. Only a read by UID tells which.
            return self._confirm_gone(it, '%s answered 404 Not Found (%s) while the pod is still there'
                                      % (self._verb(), exc.reason or exc.msg))
        except ConflictError as exc:
            # Either the UID precondition failed (the pod we classified is gone, a new one took its
            # name) or the API server's own update of the PodDisruptionBudget's status conflicted
            # (the pod is still running). Only a read by UID tells which.
            return self._confirm_gone(it, '%s answered 409 Conflict (%s) while the pod is still there'
                                      % (self._verb(), exc.reason or exc.msg))
        except TooManyRequestsError as exc:
            return 'retry', 'eviction refused by a PodDisruptionBudget (429): %s' % (exc.reason or exc.msg)
        except K8sError as exc:
            if exc.reason == 'deadline':
                return 'retry', it.last_reason
            if exc.status is None or exc.status >= 500:
                return 'retry', 'transient API error: %s' % exc.msg
            return 'failed', str(exc)

    def _verb(self) -> str:
        return 'deletion' if self.opts.disable_eviction else 'eviction'

    def _confirm_gone(self, it: _Item, reason: str) -> Tuple[str, str]:
        """After an eviction answered 404 or 409: 'done' only if a read of the pod by name finds it
        gone or replaced (another UID); the same pod still there is retried with `reason`."""
        try:
            gone = self.client.pod_gone(it.obj)
        except K8sError as read:
            return 'retry', '%s; re-reading the pod failed: %s' % (reason, read.msg)
        return ('done', '') if gone else ('retry', reason)

    def _run(self, name: str, items: List[_Item]) -> None:
        """Rounds until every item is done or failed, or the deadline: evictions (and VMI checks)
        run in parallel on the pool; pods awaited for deletion are checked together with one list
        of the node's pods per round (by UID), not one GET each."""
        self._node = name
        opts = self.opts
        deadline = self.clock() + opts.timeout
        with ThreadPoolExecutor(max_workers=max(1, opts.parallel)) as pool, self.client.bounded(deadline):
            # Until nothing is active or the deadline; each pause lasts until the next item is due.
            poll(lambda: self._round(name, items, pool), opts.timeout,
                 lambda: min(it.next_at for it in items if it.stage in ('evict', 'wait')) - self.clock(),
                 self.clock, self.sleep, done=lambda active: not active)

    def _round(self, name: str, items: List[_Item], pool: ThreadPoolExecutor) -> List[_Item]:
        """One round of `_run` over the items that are due; returns the items still active."""
        opts = self.opts
        now = self.clock()
        due = [it for it in items if it.stage in ('evict', 'wait') and it.next_at <= now]
        pod_waits = [it for it in due if it.stage == 'wait' and it.kind == 'Pod']
        others = [it for it in due if not (it.stage == 'wait' and it.kind == 'Pod')]
        outcomes: List[Tuple[_Item, Tuple[str, str]]] = list(zip(others, pool.map(self._attempt, others)))
        if pod_waits:
            try:
                present = self.client.pod_uids(name, opts.pod_selector)
                outcomes += [(it, ('wait', 'evicted, still terminating')
                              if (it.obj.get('metadata') or {}).get('uid') in present else ('done', ''))
                             for it in pod_waits]
            except K8sError as exc:
                outcomes += [(it, ('wait', it.last_reason if exc.reason == 'deadline'
                                   else 'cannot check the deletion: %s' % exc.msg)) for it in pod_waits]
        now = self.clock()
        for it, (outcome, reason) in outcomes:
            if outcome == 'done':
                it.stage = 'done'
            elif outcome == 'failed':
                it.stage = 'failed'
                it.last_reason = reason
            elif outcome == 'retry':
                it.last_reason = reason
                it.next_at = now + opts.retry_interval
            elif it.stage == 'evict':   # accepted: check for the deletion at once, then every poll
                it.stage = 'wait'
                it.next_at = now
                it.last_reason = 'evicted, still terminating'
            else:   # still there: check again soon, backing off to poll_interval
                it.last_reason = reason or it.last_reason
                it.polls += 1
                it.next_at = now + min(opts.poll_interval, 0.1 * (2 ** it.polls))
        return [it for it in items if it.stage in ('evict', 'wait')]
