#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: suc_plan
short_description: Render serialized RKE2 System Upgrade Controller Plans, one per node
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Renders the C(upgrade.cattle.io/v1) C(Plan) objects that upgrade RKE2 on the nodes of a reviewed,
    serialized upgrade plan. It does not contact the cluster and never changes anything. Apply the
    returned objects with M(kubernetes.core.k8s), one at a time, waiting for each Plan to complete.
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
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
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
  - Render-only. Applying is up to the caller; apply Plan N+1 only after Plan N reports C(Complete)
    and the node passed its gates.
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
problems:
  description: Every reason the Plans were refused.
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils._suc_plan import (
    DEFAULT_IMAGE, DEFAULT_NAME_PREFIX, DEFAULT_NAMESPACE, DEFAULT_SERVICE_ACCOUNT, SucPlanError, render_plans)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
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
        ),
        supports_check_mode=True,
    )
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
    module.exit_json(changed=False, plans=result.plans, nodes=[n.as_dict() for n in result.nodes],
                     notes=result.notes)


if __name__ == '__main__':
    main()
