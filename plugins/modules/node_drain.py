#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_drain
short_description: Cordon, drain or uncordon a GPU node (kubectl drain semantics, GPU VM aware)
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - V(cordon) marks the node unschedulable and records its initial C(spec.unschedulable) in the annotation
    C(gpufleet.io/initial-unschedulable) (written once), progress in C(gpufleet.io/upgrade-state).
  - V(drain) cordons, then classifies every pod and VirtualMachineInstance on the node B(before) evicting anything.
    If any blocks (emptyDir without O(delete_local_data), no controller without O(force), a DaemonSet pod without
    O(ignore_daemonsets), a VMI under O(vmi_policy=refuse), a VMI without VirtualMachine under O(vmi_policy=stop)),
    the task fails, nothing is evicted, and the node stays cordoned. Mirror and DaemonSet pods are skipped.
  - Pods are evicted in parallel (at most O(parallel) requests at a time), each eviction carrying the pod's UID as
    precondition. An eviction refused by a PodDisruptionBudget (HTTP 429) or by a transient API error is retried every
    O(retry_interval) seconds until O(timeout); the deletion is awaited by UID. An eviction answered HTTP 409 or
    HTTP 404 counts as done only when a read of the pod by name finds it gone or replaced (another UID); the same pod
    still there is evicted again. At the deadline the task B(fails), the node stays cordoned, and RV(remaining) says
    what is left and why.
  - V(uncordon) lifts the cordon only when this collection made it, unless O(uncordon_preexisting=true). Ours
    means C(gpufleet.io/initial-unschedulable) is V(false) (written whenever this collection cordons a schedulable
    node, so a record left by an earlier run never stands for a cordon made since) and the Node's
    C(metadata.managedFields) say that the collection's field manager C(gpufleet.upgrade) (sent with every write of
    this module) alone set C(spec.unschedulable). A cordon someone lifted and set again since is theirs and is
    kept; so is one whose owner the API does not record. The initial-state and progress annotations are removed, except the progress V(validated) that the
    P(gpufleet.upgrade.node_upgrade#role) role records when every gate passed (M(gpufleet.upgrade.upgrade_state)
    clears it when it records the node done, so a controller killed in between resumes after the gates). The record
    of stopped VMs stays.
  - V(start_vms) starts again the GPU VMs that V(drain) halted under O(vmi_policy=stop), once the node passed its
    gates. Each VirtualMachine recorded in C(gpufleet.io/stopped-vms) gets back its exact previous C(spec.runStrategy)
    (removed when it had none) or C(spec.running), then the record is cleared. A VM whose run state someone changed
    since the drain, or that no longer exists, is left as it is and reported in RV(left_vms). A VM whose start fails
    keeps its record and the task fails. Refused, changing nothing, when the node records C(failed),
    C(rolled-back) or C(drain-failed) in C(gpufleet.io/upgrade-state), so a VM is never started on a failed node.
  - Semantics follow C(kubectl drain), not C(kubernetes.core.k8s_drain) (which fails on the first 429 and whose
    timeout only warns).
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports what would be cordoned and evicted (RV(evicted) lists the pods that would be evicted), and writes nothing.
  diff_mode:
    support: full
    details:
      - Shows the Node's C(unschedulable) and C(gpufleet.io/*) annotations before and after; for V(start_vms), also
        the run state (C(runStrategy), C(running)) of each recorded VirtualMachine.
  idempotent:
    support: full
    description: A second run with the same input reports no change.
options:
  name:
    description: Name of the node.
    type: str
    required: true
  state:
    description: What to do.
    type: str
    choices: [cordon, drain, uncordon, start_vms]
    default: drain
  timeout:
    description:
      - Seconds the whole drain may take (evictions, retries on 429 and 409 and the wait for deletion), after
        O(wait_for_jobs). No request of these rounds waits past it (each request's timeout is cut to the time left).
    type: float
    default: 300
  grace_period:
    description:
      - Termination grace period in seconds given to evicted pods (V(0) is honoured). Without it, each pod's own.
    type: int
  pod_selector:
    description:
      - Label selector; only matching pods are drained (as C(kubectl drain --pod-selector)).
    type: str
  ignore_daemonsets:
    description:
      - Skip DaemonSet pods. With V(false), a DaemonSet pod blocks the drain.
    type: bool
    default: true
  delete_local_data:
    description:
      - Evict pods with emptyDir volumes (their data is lost). Without it such a pod blocks the drain.
    type: bool
    default: false
  force:
    description:
      - For V(drain), evict pods that no controller manages (they are not recreated), as C(kubectl drain --force).
        Without it such a pod blocks.
      - It has no effect on V(uncordon) (see O(uncordon_preexisting)).
    type: bool
    default: false
  policy:
    description:
      - The drain policy, as the plan records it (C(gpufleet_drain_policy)); where given, it decides per pod what
        O(delete_local_data), O(force) and O(grace_period) decide without it. The first rule whose C(namespaces) (names
        or globs) and C(selector) (equality-based label selector) match a pod wins over the defaults.
      - C(local_data) - V(memory) (the default) evicts a pod whose emptyDir volumes are all memory-backed (C(medium
        Memory), a tmpfs such as C(/dev/shm)) and refuses one with an emptyDir on the node's disk; V(delete) evicts any
        (its emptyDir data is lost); V(refuse) refuses any emptyDir.
      - C(unmanaged_pods) - V(refuse) (the default) refuses a pod no controller manages; V(delete) evicts it (it is not
        recreated).
      - C(grace_period) - seconds an evicted pod gets to terminate (null, the default - its own).
      - A refused pod blocks the drain like any other, named in RV(blocked) with the rule that refused it.
    type: dict
  uncordon_preexisting:
    description:
      - For V(uncordon), lift a cordon that this collection did not make (one that was there before it cordoned
        the node, or that someone set again since). Without it such a cordon is kept and RV(kept_cordon) is true.
    type: bool
    default: false
  record_target:
    description:
      - The target key (C(key=value,...), as R(gpufleet.upgrade.upgrade_state,ansible_collections.gpufleet.upgrade.upgrade_state_module)
        reports it in C(state.target)) the drain's progress records belong to; V(drain) writes it as
        C(gpufleet.io/upgrade-target) with C(draining)/C(drained), so a rerun of the same rollout trusts that
        progress (a record without a target is stale).
      - Without it the drain's records name no target.
    type: str
  disable_eviction:
    description:
      - Delete pods instead of using the eviction API, bypassing PodDisruptionBudgets.
      - Needs the opt-in ClusterRole C(gpufleet-upgrade-pod-delete) (C(docs/rbac/)) besides C(gpufleet-upgrade-operator),
        which cannot delete pods.
    type: bool
    default: false
  wait_for_jobs:
    description:
      - Wait for the pods on the node that match O(wait_for_jobs.selector) to finish (Succeeded or Failed) before
        evicting anything. At the deadline the drain B(fails) and evicts nothing; a checkpointing job is never killed
        by a timer.
    type: dict
    suboptions:
      selector:
        description: Label selector of the pods to wait for.
        type: str
        required: true
      timeout:
        description: Seconds to wait.
        type: float
        default: 3600
  vmi_policy:
    description:
      - What to do with KubeVirt VirtualMachineInstances on the node. GPU passthrough VMs cannot live-migrate.
      - V(refuse) fails the drain listing them, before any eviction.
      - V(stop) halts each through its VirtualMachine (C(spec.runStrategy=Halted), or C(spec.running=false) where the VM
        uses C(running)), after recording the VMs and their previous run state as JSON in the Node annotation
        C(gpufleet.io/stopped-vms), so that the orchestration starts them again once the node passes its gates. A VMI
        without a VirtualMachine is refused. The drain then waits for the VMIs to leave the node.
      - V(evict) evicts the virt-launcher pods through the eviction API (for VMs whose owners approved an evacuation)
        and fails at the deadline if a VMI is still on the node.
    type: str
    choices: [refuse, stop, evict]
    default: refuse
  parallel:
    description: Most eviction or status requests in flight at once.
    type: int
    default: 10
  retry_interval:
    description:
      - Seconds between two tries of an eviction refused with 429 or a transient error, and between checks of
        O(wait_for_jobs).
      - The default, 2.5, makes as many requests per blocked pod as C(kubectl drain) (a GET and an eviction every 5 s)
        and notices a relaxed PodDisruptionBudget twice as soon.
    type: float
    default: 2.5
seealso:
  - module: gpufleet.upgrade.gpu_holders_info
"""

EXAMPLES = r"""
---
- name: Drain a GPU node, GPU VMs refused (the default)
  gpufleet.upgrade.node_drain:
    name: gpu-node-17
    state: drain
    delete_local_data: true
    timeout: 900

- name: Drain by the plan's policy (memory-backed /dev/shm deleted, bare pods of the scratch namespaces deleted)
  gpufleet.upgrade.node_drain:
    name: gpu-node-17
    state: drain
    policy:
      local_data: memory
      unmanaged_pods: refuse
      rules:
        - namespaces: [scratch-*]
          unmanaged_pods: delete
          local_data: delete
        - namespaces: [inference]
          selector: app=vllm
          grace_period: 60

- name: Let checkpointing jobs finish, then drain; halt GPU VMs through their VirtualMachine
  gpufleet.upgrade.node_drain:
    name: gpu-node-17
    state: drain
    wait_for_jobs:
      selector: gpufleet.io/checkpoint=true
      timeout: 7200
    vmi_policy: stop
  register: drained

- name: Uncordon after the gates pass (an administrator's earlier cordon stays)
  gpufleet.upgrade.node_drain:
    name: gpu-node-17
    state: uncordon

- name: Start again the GPU VMs the drain halted (their previous runStrategy), once the node passed its gates
  gpufleet.upgrade.node_drain:
    name: gpu-node-17
    state: start_vms

- name: Auth once for every Kubernetes module of the collection
  module_defaults:
    group/gpufleet.upgrade.k8s:
      kubeconfig: /etc/rancher/rke2/rke2.yaml
  block:
    - name: Cordon only
      gpufleet.upgrade.node_drain:
        name: gpu-node-18
        state: cordon
"""

RETURN = r"""
evicted:
  description: Pods evicted (in check mode, that would be evicted); with O(vmi_policy=evict), also the VMIs that left.
  returned: always
  type: list
  elements: dict
  sample: [{"kind": "Pod", "namespace": "ml", "name": "train-0", "uid": "..."}]
remaining:
  description: What is still on the node after a failed drain, each with C(reason).
  returned: always
  type: list
  elements: dict
  sample: [{"kind": "Pod", "namespace": "ml", "name": "train-0", "uid": "...",
            "reason": "eviction refused by a PodDisruptionBudget (429): ..."}]
blocked:
  description: Pods and VMIs that blocked the drain before any eviction, each with C(reason).
  returned: always
  type: list
  elements: dict
skipped_pods:
  description:
    - Pods left in place (DaemonSet, mirror), each with C(reason).
    - Named C(skipped_pods) because Ansible reserves the result key C(skipped) (a task whose result has a non-empty
      C(skipped) is reported as skipped).
  returned: always
  type: list
  elements: dict
stopped_vms:
  description: VirtualMachines halted by O(vmi_policy=stop), with their previous C(runStrategy) or C(running).
  returned: always
  type: list
  elements: dict
started_vms:
  description: For V(start_vms), the VirtualMachines given back their recorded C(runStrategy) or C(running).
  returned: when state is start_vms
  type: list
  elements: dict
  sample: [{"namespace": "vms", "name": "vm-gpu", "runStrategy": "Always"}]
unchanged_vms:
  description: For V(start_vms), recorded VirtualMachines already in their recorded run state.
  returned: when state is start_vms
  type: list
  elements: dict
left_vms:
  description:
    - For V(start_vms), recorded VirtualMachines left as they are, each with C(reason) (deleted since the drain, or
      their run state changed since the drain halted them). Their record is dropped.
  returned: when state is start_vms
  type: list
  elements: dict
initially_unschedulable:
  description: Whether the node was unschedulable before this collection cordoned it.
  returned: when state is cordon, drain or uncordon
  type: bool
kept_cordon:
  description: For V(uncordon), whether a cordon was left in place because this collection did not make it.
  returned: when state is uncordon
  type: bool
waiting_for_jobs:
  description: Pods of O(wait_for_jobs) still running at its deadline.
  returned: when wait_for_jobs timed out
  type: list
  elements: dict
upgrade_state:
  description: The progress recorded on the node (C(gpufleet.io/upgrade-state)), or null when none is (after uncordon, unless V(validated)).
  returned: always
  type: str
api_requests:
  description: Number of API requests made (including retries).
  returned: always
  type: int
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule


def outcome(module: K8sModule) -> dict:
    """The result of the drain state the params ask for."""
    params = module.params
    name = params['name']
    opts = _drain.options_from_params(params)
    drainer = _drain.Drainer(_drain.KubeDrainClient(module.client), opts, check_mode=module.check_mode)
    base = {'evicted': [], 'remaining': [], 'blocked': [], 'skipped_pods': [], 'stopped_vms': []}
    if params['state'] == 'start_vms':
        r = drainer.start_vms(name)
        for k in ('started_vms', 'unchanged_vms', 'left_vms', 'failed', 'msg'):
            base[k] = r[k]
        base.update(changed=r['changed'],
                    upgrade_state=r['after']['node']['annotations'].get(_drain.ANN_STATE))
        base.update(module.diff(r['before'], r['after'], 'node/%s' % name))
        return base
    if params['state'] == 'cordon':
        r = drainer.cordon(name)
    elif params['state'] == 'uncordon':
        r = drainer.uncordon(name, uncordon_preexisting=params['uncordon_preexisting'])
        base['kept_cordon'] = r['kept_cordon']
    else:
        r = drainer.drain(name)
        for k in ('evicted', 'remaining', 'blocked', 'stopped_vms', 'waiting_for_jobs', 'failed', 'msg'):
            if k in r:
                base[k] = r[k]
        base['skipped_pods'] = r['skipped']
        r['before'], r['after'] = r['diff']['before'], r['diff']['after']
    base.update(changed=r['changed'], initially_unschedulable=r['initially_unschedulable'],
                upgrade_state=r['after']['annotations'].get(_drain.ANN_STATE))
    base.update(module.diff(r['before'], r['after'], 'node/%s' % name))
    return base


# The module's own options (the Kubernetes auth options are added) and AnsibleModule's checks; the action
# plugin runs run() with them in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    name={'type': 'str', 'required': True},
    state={'type': 'str', 'choices': list(_drain.STATES), 'default': 'drain'},
    timeout={'type': 'float', 'default': 300},
    grace_period={'type': 'int'},
    pod_selector={'type': 'str'},
    ignore_daemonsets={'type': 'bool', 'default': True},
    delete_local_data={'type': 'bool', 'default': False},
    policy={'type': 'dict'},
    force={'type': 'bool', 'default': False},
    uncordon_preexisting={'type': 'bool', 'default': False},
    record_target={'type': 'str'},
    disable_eviction={'type': 'bool', 'default': False},
    wait_for_jobs={'type': 'dict', 'options': {
        'selector': {'type': 'str', 'required': True},
        'timeout': {'type': 'float', 'default': 3600},
    }},
    vmi_policy={'type': 'str', 'choices': list(_drain.VMI_POLICIES), 'default': 'refuse'},
    parallel={'type': 'int', 'default': 10},
    retry_interval={'type': 'float', 'default': 2.5},
)
CHECKS = dict(
    count_requests=True,
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    name, state = module.params['name'], module.params['state']
    if not name.strip():
        module.fail_json(msg='name: %r is not a node name' % name)
    try:
        _drain.options_from_params(module.params)
    except _drain.DrainError as exc:
        module.fail_json(msg=str(exc))
    context = 'node %s, state %s' % (name, state)
    with module.errors(expected=(_drain.DrainError,), context=context,
                       not_found={path_for('v1', 'nodes', name): 'name: node %r does not exist (%s)' % (name, context)}):
        result = outcome(module)
    result['api_requests'] = module.api_requests
    if result.pop('failed', False):
        module.fail_json(**result)
    result.pop('msg', None)
    module.exit_json(**result)


def main() -> None:
    run(K8sModule('node_drain', OPTIONS, **CHECKS))


if __name__ == '__main__':
    main()
