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
    C(cordon=true), a fixed C(version) (the target RKE2 release; channel polling is off), and a node
    selector that matches exactly that node (C(kubernetes.io/hostname In [node])) and its role
    (C(node-role.kubernetes.io/control-plane In [true]) for servers, C(DoesNotExist) for agents).
    There is never a Plan that selects several nodes.
  - Server Plans tolerate C(CriticalAddonsOnly); agent Plans wait for the last server Plan with the
    upgrade image's C(prepare) step, as the RKE2 automated-upgrade documentation describes.
  - Refuses, for every node, an RKE2 downgrade, a change of major version and a Kubernetes minor skip
    (versions compare as (minor, patch, rev) of C(v1.MINOR.PATCH+rke2rREV), the rules of the gate); refuses servers listed
    after agents; refuses agents newer than the control plane when I(control_plane_rke2) is given and
    no server is in the plan. Nodes already at the target get no Plan.
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
attributes:
  check_mode:
    support: full
    details:
      - With O(state=present), reads the Plans and reports RV(applied) and the diff without writing.
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
        description: RKE2 role of the node.
        type: str
        required: true
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
seealso:
  - module: kubernetes.core.k8s
notes:
  - Apply Plan N+1 only after Plan N reports C(Complete) and its node passed its gates.
  - The Kubernetes auth options are used only with O(state=present).
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

- name: Or let the module apply the Plan of the next node of the rollout
  gpufleet.upgrade.suc_plan:
    state: present
    kubeconfig: ~/.kube/config
    target_rke2: v1.36.1+rke2r1
    current_rke2: v1.35.3+rke2r3
    control_plane_rke2: v1.36.1+rke2r1
    server_plan: gpufleet-rke2-server-cp-3
    nodes:
      - {name: gpu-a-02, role: agent}
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
problems:
  description: Every reason the Plans were refused.
  returned: failure
  type: list
  elements: str
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import (
    HAS_KUBERNETES, KUBERNETES_IMPORT_ERROR, K8sClient, K8sError, auth_argument_spec)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._suc_plan import (
    DEFAULT_IMAGE, DEFAULT_NAME_PREFIX, DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT, SucPlanError, apply_plans,
    render_plans)


def main() -> None:
    argument_spec = auth_argument_spec()
    argument_spec.update(
        state=dict(type='str', choices=['rendered', 'present'], default='rendered'),
        nodes=dict(type='list', elements='dict', required=True, options=dict(
            name=dict(type='str', required=True),
            role=dict(type='str', required=True, choices=['server', 'agent']),
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
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    try:
        result = render_plans(
            nodes=p['nodes'], target_rke2=p['target_rke2'], current_rke2=p['current_rke2'],
            control_plane_rke2=p['control_plane_rke2'], namespace=p['namespace'],
            service_account=p['service_account'], image=p['image'], name_prefix=p['name_prefix'],
            drain=p['drain'], server_plan=p['server_plan'])
    except SucPlanError as exc:
        module.fail_json(msg='refusing to render RKE2 Plans: %s' % '; '.join(exc.problems),
                         problems=exc.problems)
    out = dict(changed=False, plans=result.plans, nodes=[n.as_dict() for n in result.nodes], notes=result.notes)
    if p['state'] == 'present':
        if not HAS_KUBERNETES:
            module.fail_json(msg=missing_required_lib('kubernetes'), exception=str(KUBERNETES_IMPORT_ERROR))
        try:
            applied = apply_plans(K8sClient.from_params(p), result.plans, check_mode=module.check_mode)
        except SucPlanError as exc:
            module.fail_json(msg='refusing to apply RKE2 Plans: %s' % '; '.join(exc.problems),
                             problems=exc.problems, **out)
        except K8sError as exc:
            module.fail_json(msg='applying RKE2 Plans failed: %s' % exc, **out)
        except Exception as exc:  # pragma: no cover - a bug: keep the traceback for -vvv
            module.fail_json(msg='suc_plan failed: %s' % exc, exception=traceback.format_exc())
        out.update(changed=applied.changed, applied=applied.applied)
        if module._diff:
            out['diff'] = {'before': applied.before, 'after': applied.after}
    module.exit_json(**out)


if __name__ == '__main__':
    main()
