#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: suc_plan
short_description: Render or apply serialized RKE2 System Upgrade Controller Plans, one per node
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Renders the C(upgrade.cattle.io/v1) C(Plan) objects that upgrade RKE2 on the nodes of a reviewed,
    serialized upgrade plan. With O(state=rendered) (the default) it does not contact the cluster;
    apply the returned objects with M(kubernetes.core.k8s) or with O(state=present).
  - O(state=present) creates each Plan, or updates it when it differs (a merge patch guarded by the
    read resourceVersion), in order. It never deletes a Plan and refuses, before writing anything,
    to change a Plan of the same name that gpufleet.upgrade did not create (label
    C(app.kubernetes.io/managed-by=gpufleet.upgrade)). Apply the Plan of one node at a time and wait
    for its C(Complete) condition before the next, as the rollout does.
  - One Plan per node, in the order given. Each Plan has C(concurrency=1), C(exclusive=true),
    C(cordon=true) (unless O(cordon=false)), a fixed C(version) (the target RKE2 release; channel polling
    is off), and a node selector that matches exactly that node (C(kubernetes.io/hostname In [node])) and its role
    (C(node-role.kubernetes.io/control-plane In [true]) for servers, C(DoesNotExist) for agents).
    There is never a Plan that selects several nodes.
  - Server Plans tolerate C(CriticalAddonsOnly); agent Plans wait for the last server Plan with the
    upgrade image's C(prepare) step, as the RKE2 automated-upgrade documentation describes.
  - Refuses, for every node, an RKE2 downgrade, a change of major version and a Kubernetes minor skip
    (versions compare as (minor, patch, rev) of C(v1.MINOR.PATCH+rke2rREV), the rules of the gate); refuses servers listed
    after agents; refuses agents newer than the control plane when I(control_plane_rke2) is given and
    no server is in the plan. Nodes already at the target get no Plan.
  - With O(wait=true) (and O(state=present)) the Plans are applied one at a time. Each is created or updated,
    then the module waits, at most O(wait_timeout) seconds, until the Plan's C(Complete) condition is True for
    the target version, its node carries the controller's C(plan.upgrade.cattle.io/<plan>) label with the
    Plan's C(latestHash), and the Node's C(status.nodeInfo.kubeletVersion) is the target; only then is the
    next Plan written. No Plan is written while another gpufleet-managed Plan in the namespace is
    unfinished (not C(Complete) for its version), so there is one RKE2 upgrade at a time. A Plan whose node
    finished is labelled C(gpufleet.io/rke2-complete=<version>) and that check lists only the Plans without the
    label (the Plans in flight, not every node upgraded so far); rewriting a Plan's spec removes the label. A
    Plan edited by hand after it finished keeps it (remove the label then). A failed upgrade
    Job (C(Complete=False), reason C(JobFailed)), a Plan that completed without selecting its node, or the
    deadline fail the task; nothing is rolled back (RKE2 is not downgraded). A Plan it may not change (not
    gpufleet-managed) or an API error fails it too; the failure result still lists the Plans written before in
    RV(applied), with C(changed).
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
attributes:
  check_mode:
    support: full
    details:
      - With O(state=present), reads the Plans and reports RV(applied) and the diff without writing (and
        without waiting).
  diff_mode:
    support: full
    details:
      - With O(state=present), shows the C(spec) of each Plan created or updated, before and after.
  idempotent:
    support: full
    description: A second run with the same input reports no change and writes nothing.
options:
  state:
    description:
      - V(rendered) only returns the Plans (no cluster access); V(present) also creates or updates them.
    type: str
    choices: [rendered, present]
    default: rendered
  nodes:
    description:
      - The serialized plan, in order. Servers must come before agents.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Node name (the value of its C(kubernetes.io/hostname) label).
        type: str
        required: true
      role:
        description:
          - RKE2 role of the node. With O(read_cluster=true) the role is read from the Node (V(server) when it carries
            C(node-role.kubernetes.io/control-plane), C(node-role.kubernetes.io/etcd) or C(node-role.kubernetes.io/master),
            else V(agent)) and a role given here must agree with it, or nothing is rendered (the refusal names both).
          - Required without O(read_cluster).
        type: str
        choices: [server, agent]
      current_rke2:
        description: RKE2 version the node runs now; defaults to I(current_rke2).
        type: str
  target_rke2:
    description: Target RKE2 release, for example C(v1.36.1+rke2r1).
    type: str
    required: true
  current_rke2:
    description:
      - RKE2 version of every node that has no C(current_rke2) of its own. Every node needs a current
        version, so that a downgrade or a minor skip can be ruled out.
    type: str
  control_plane_rke2:
    description:
      - RKE2 version of the control plane. Checked only when no server is in I(nodes)
        (agents may not be newer than the control plane).
    type: str
  namespace:
    description: Namespace of the System Upgrade Controller.
    type: str
    default: system-upgrade
  service_account:
    description: Service account of the upgrade Jobs.
    type: str
    default: system-upgrade
  image:
    description: Upgrade image, without tag (the controller tags it with the Plan version).
    type: str
    default: rancher/rke2-upgrade
  name_prefix:
    description: Prefix of the Plan names (C(<prefix>-<role>-<node>), shortened with a digest past 63 characters).
    type: str
    default: gpufleet-rke2
  server_plan:
    description:
      - Server Plan that agent Plans wait for in their C(prepare) step when no server is in I(nodes).
        When servers are in I(nodes), agents wait for the last of their Plans.
    type: str
  drain:
    description:
      - Drain options for the Plans (C(spec.drain)). Without them the Plans only cordon.
      - The gpufleet rollout drains with its own M(gpufleet.upgrade.node_drain) before RKE2 changes;
        set this only when the Plans are used on their own.
    type: dict
    suboptions:
      timeout:
        description: Drain timeout in seconds.
        type: int
      grace_period:
        description: Pod termination grace period in seconds.
        type: int
      delete_emptydir_data:
        description: Delete pods with emptyDir volumes.
        type: bool
      ignore_daemonsets:
        description: Ignore DaemonSet pods.
        type: bool
      force:
        description: Delete pods that no controller manages.
        type: bool
      disable_eviction:
        description: Delete instead of evict (bypasses PodDisruptionBudgets).
        type: bool
      skip_wait_for_delete_timeout:
        description: Skip pods whose deletion started more than this many seconds ago.
        type: int
  cordon:
    description:
      - The Plans' C(spec.cordon). The System Upgrade Controller marks a node schedulable again when its
        upgrade Job completes if the Plan cordons or drains it.
      - Set V(false) when the caller cordoned and drained the node itself and keeps it cordoned until its own
        gates pass (the gpufleet rollout does).
    type: bool
    default: true
  tolerations:
    description:
      - Pod tolerations added to every Plan (its upgrade Job's pod), for taints the nodes carry besides the cordon, for
        example a canary's C(gpufleet.io/canary) isolation taint (the node_upgrade role passes one C(Exists)
        toleration per allowed taint). Server Plans keep their C(CriticalAddonsOnly) toleration.
    type: list
    elements: dict
  tolerate_taints:
    description:
      - Taints to tolerate, as C(key) or C(key=value) (any effect), added to O(tolerations); the form of
        M(gpufleet.upgrade.node_gate)'s O(gpufleet.upgrade.node_gate#module:allowed_taints).
    type: list
    elements: str
  wait:
    description:
      - With O(state=present), apply the Plans one at a time and wait for each to complete on its node (see
        the description) before writing the next.
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait for each Plan. Bounded; at the deadline the task fails.
    type: int
    default: 1800
  wait_interval:
    description: Seconds between reads of the Plan and the Node while waiting.
    type: float
    default: 10
  read_cluster:
    description:
      - Read from the API what the cluster runs before rendering, with read-only requests. Each node's RKE2 role (from
        its labels, see O(nodes[].role); a server's Plan selects it by the label that makes it one), its current RKE2
        (its C(kubeletVersion)) where O(nodes[].current_rke2) is not given, and the control plane's version
        (nodes labelled C(node-role.kubernetes.io/control-plane=true)) where O(control_plane_rke2) is not given.
      - Refuses, writing nothing, when a node does not exist, a given O(nodes[].role) is not its Node's, or the control
        plane nodes run different versions while an agent is among O(nodes) (finish the control plane upgrade before upgrading
        agents; servers alone may go on, one at a time).
    type: bool
    default: false
seealso:
  - module: kubernetes.core.k8s
notes:
  - Apply Plan N+1 only after Plan N reports C(Complete) and its node passed its gates.
  - The Kubernetes auth options are used only with O(state=present) or O(read_cluster=true).
  - Waiting reads the Node (C(get nodes), cluster-scoped), so bind the collection's reader role cluster-wide
    as well (docs/rbac).
"""

EXAMPLES = r"""
---
- name: Render the RKE2 Plans for the serialized plan
  gpufleet.upgrade.suc_plan:
    target_rke2: v1.36.1+rke2r1
    current_rke2: v1.35.3+rke2r3
    nodes:
      - {name: cp-1, role: server}
      - {name: gpu-a-01, role: agent}
  register: suc

- name: Apply the first Plan (then wait for it to complete before the next)
  kubernetes.core.k8s:
    state: present
    definition: "{{ suc.plans[0] }}"

- name: Or let the module apply the Plan of the next node of the rollout and wait for it
  gpufleet.upgrade.suc_plan:
    state: present
    wait: true
    wait_timeout: 1800
    cordon: false
    kubeconfig: ~/.kube/config
    target_rke2: v1.36.1+rke2r1
    # the node's role and RKE2, and the control plane's RKE2, as the Nodes say
    read_cluster: true
    server_plan: gpufleet-rke2-server-cp-3
    nodes:
      - {name: gpu-a-02}
"""

RETURN = r"""
plans:
  description: The Plan objects, in the order to apply them.
  returned: success
  type: list
  elements: dict
  sample:
    - apiVersion: upgrade.cattle.io/v1
      kind: Plan
      metadata: {name: gpufleet-rke2-agent-gpu-a-01, namespace: system-upgrade}
      spec:
        concurrency: 1
        exclusive: true
        cordon: true
        version: v1.36.1+rke2r1
nodes:
  description: One entry per input node with its action (C(plan) or C(up_to_date)) and Plan name.
  returned: success
  type: list
  elements: dict
  sample:
    - {name: gpu-a-01, role: agent, current_rke2: v1.35.3+rke2r3, target_rke2: v1.36.1+rke2r1,
       action: plan, plan_name: gpufleet-rke2-agent-gpu-a-01, sequence: 1}
notes:
  description: Things the operator must know (for example an agent Plan without a prepare step).
  returned: success
  type: list
  elements: str
applied:
  description: With O(state=present), each Plan with C(name), C(namespace), C(node) and C(action) (C(created), C(updated), C(unchanged)).
  returned: when I(state=present)
  type: list
  elements: dict
  sample:
    - {name: gpufleet-rke2-agent-gpu-a-01, namespace: system-upgrade, node: gpu-a-01, action: created}
waited:
  description:
    - With O(wait=true), one entry per Plan waited for, with C(name), C(node), C(done), C(seconds),
      C(kubelet_version) (the Node's, as last read) and C(summary) (the Plan's status as last read).
  returned: when I(wait=true) and not in check mode
  type: list
  elements: dict
  sample:
    - {name: gpufleet-rke2-agent-gpu-a-01, node: gpu-a-01, done: true, seconds: 312.5,
       kubelet_version: v1.36.1+rke2r1,
       summary: "Plan gpufleet-rke2-agent-gpu-a-01: Complete=True (Complete), latestVersion v1.36.1-rke2r1, ..."}
problems:
  description: Every reason the Plans were refused.
  returned: failure
  type: list
  elements: str
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule
from ansible_collections.gpufleet.upgrade.plugins.module_utils._suc_plan import (
    DEFAULT_IMAGE, DEFAULT_NAME_PREFIX, DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT, SucPlanError, apply_one_at_a_time,
    apply_plans, assign_roles, read_nodes, render_plans, taint_tolerations)


# The module's own options (the Kubernetes auth options are added); the action plugin runs run() with them
# in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    state=dict(type='str', choices=['rendered', 'present'], default='rendered'),
    nodes=dict(type='list', elements='dict', required=True, options=dict(
        name=dict(type='str', required=True),
        role=dict(type='str', choices=['server', 'agent']),
        current_rke2=dict(type='str'),
    )),
    target_rke2=dict(type='str', required=True),
    current_rke2=dict(type='str'),
    control_plane_rke2=dict(type='str'),
    namespace=dict(type='str', default=DEFAULT_NAMESPACE),
    service_account=dict(type='str', default=DEFAULT_SERVICE_ACCOUNT),
    image=dict(type='str', default=DEFAULT_IMAGE),
    name_prefix=dict(type='str', default=DEFAULT_NAME_PREFIX),
    server_plan=dict(type='str'),
    drain=dict(type='dict', options=dict(
        timeout=dict(type='int'),
        grace_period=dict(type='int'),
        delete_emptydir_data=dict(type='bool'),
        ignore_daemonsets=dict(type='bool'),
        force=dict(type='bool'),
        disable_eviction=dict(type='bool'),
        skip_wait_for_delete_timeout=dict(type='int'),
    )),
    cordon=dict(type='bool', default=True),
    tolerations=dict(type='list', elements='dict'),
    tolerate_taints=dict(type='list', elements='str'),
    wait=dict(type='bool', default=False),
    wait_timeout=dict(type='int', default=1800),
    wait_interval=dict(type='float', default=10.0),
    read_cluster=dict(type='bool', default=False),
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    p = module.params
    control_plane_rke2 = p['control_plane_rke2']
    if p['read_cluster']:
        with module.errors(expected=(SucPlanError,), prefixes={SucPlanError: 'refusing to render RKE2 Plans: '}):
            currents, roles, running = read_nodes(module.client, [n['name'] for n in p['nodes']])
            p['nodes'] = assign_roles(p['nodes'], roles)
        for node in p['nodes']:
            if node.get('current_rke2') is None and currents.get(node['name']):
                node['current_rke2'] = currents[node['name']]
        control_plane_rke2 = control_plane_rke2 or running
    with module.errors(expected=(SucPlanError,), prefixes={SucPlanError: 'refusing to render RKE2 Plans: '}):
        result = render_plans(
            nodes=p['nodes'], target_rke2=p['target_rke2'], current_rke2=p['current_rke2'],
            control_plane_rke2=control_plane_rke2, namespace=p['namespace'],
            service_account=p['service_account'], image=p['image'], name_prefix=p['name_prefix'],
            drain=p['drain'], server_plan=p['server_plan'], cordon=p['cordon'],
            tolerations=list(p['tolerations'] or []) + taint_tolerations(p['tolerate_taints']))
    out = dict(changed=False, plans=result.plans, nodes=[n.as_dict() for n in result.nodes], notes=result.notes)
    if p['state'] == 'present':
        waiting = p['wait'] and not module.check_mode
        if p['wait'] and (p['wait_timeout'] <= 0 or p['wait_interval'] <= 0):
            module.fail_json(msg='wait_timeout (%r) and wait_interval (%r) must be positive'
                             % (p['wait_timeout'], p['wait_interval']))
        prefixes = {SucPlanError: 'refusing to apply RKE2 Plans: ', K8sError: 'applying RKE2 Plans failed: '}
        with module.errors(expected=(SucPlanError,), prefixes=prefixes, **out):
            if waiting and result.plans:
                # One Plan at a time: write it, wait for its node, then the next.
                sequence = apply_one_at_a_time(module.client, result.plans, p['namespace'], p['target_rke2'],
                                               p['wait_timeout'], p['wait_interval'])
                for warning in sequence.warnings:
                    module.warn(warning)
                if sequence.refused:
                    module.fail_json(msg=sequence.msg, problems=sequence.problems, **out)
                applied = sequence.applied
                if sequence.error is not None:
                    # the error's message, as without wait, with the Plans written before it
                    partial = dict(out)
                    partial.update(changed=applied.changed, applied=applied.applied, waited=sequence.waited)
                    module.fail_from(sequence.error, (SucPlanError,), prefixes=prefixes, **partial)
                if sequence.msg:
                    out.update(changed=applied.changed, applied=applied.applied, waited=sequence.waited)
                    module.fail_json(msg=sequence.msg, **out)
                out['waited'] = sequence.waited
            else:  # not waiting, or nothing to write (every node already runs the target)
                applied = apply_plans(module.client, result.plans, check_mode=module.check_mode)
                if waiting:
                    out['waited'] = []
        out.update(changed=applied.changed, applied=applied.applied, **module.diff(applied.before, applied.after))
    module.exit_json(**out)


def main() -> None:
    run(K8sModule('suc_plan', OPTIONS))


if __name__ == '__main__':
    main()
