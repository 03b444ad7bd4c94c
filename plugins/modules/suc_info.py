#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: suc_info
short_description: Read whether the System Upgrade Controller runs, and each node's RKE2 role and version
version_added: 0.1.0
description:
  - Reads, with read-only requests, what an RKE2 upgrade through the System Upgrade Controller needs before anything
    is drained - the C(plans.upgrade.cattle.io) CustomResourceDefinition (C(Established)), the controller's Deployment
    O(namespace)/O(controller) (at least one ready replica), and the Nodes named in O(nodes).
  - Per node it returns the RKE2 role as its Node's labels say (V(server) with a C(node-role.kubernetes.io/control-plane),
    C(node-role.kubernetes.io/etcd) or C(node-role.kubernetes.io/master) label, else V(agent)) and its current RKE2
    (C(status.nodeInfo.kubeletVersion)).
  - With O(target_rke2), each node's hop to it is judged by the rules of M(gpufleet.upgrade.suc_plan) - an RKE2
    downgrade or a Kubernetes minor skip is a problem - and the controller's state is a problem only when some node
    needs a Plan (its kubelet does not run the target).
  - A role declared for a node in O(declared_roles) that is not its Node's is a problem naming both.
  - RV(problems) lists every problem; with O(fail_on_problems=true) (what the preflight playbook uses) the task fails
    with them.
author:
  - gpufleet.upgrade contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  namespace:
    description: Namespace of the System Upgrade Controller (and of its Plans).
    type: str
    default: system-upgrade
  controller:
    description: Name of the System Upgrade Controller's Deployment in O(namespace).
    type: str
    default: system-upgrade-controller
  nodes:
    description: Names of the Nodes to read. One name is read with one GET, several with one list of the Nodes.
    type: list
    elements: str
    default: []
  target_rke2:
    description: The target RKE2 release (for example C(v1.36.1+rke2r1)). Without it no hop is judged.
    type: str
  declared_roles:
    description:
      - Node name to the RKE2 role an inventory declares for it (V(server) or V(agent); the preflight playbook passes
        C(gpufleet_rke2_role) of the hosts that still set it). Each must be the Node's role.
    type: dict
    default: {}
  fail_on_problems:
    description: Fail, listing RV(problems), when there is any; otherwise return them and let the caller decide.
    type: bool
    default: false
notes:
  - Belongs to the C(gpufleet.upgrade.k8s) action group.
  - Reads the CustomResourceDefinition C(plans.upgrade.cattle.io), the Deployment and the Nodes (the ClusterRole
    C(gpufleet-upgrade-reader) of docs/rbac).
seealso:
  - module: gpufleet.upgrade.suc_plan
"""

EXAMPLES = r"""
- name: Before anything is drained - the System Upgrade Controller runs and every node's RKE2 hop is allowed
  gpufleet.upgrade.suc_info:
    target_rke2: v1.36.1+rke2r1
    nodes: [gpu-a-01, gpu-a-02]
    fail_on_problems: true
  register: suc
"""

RETURN = r"""
controller:
  description: The CustomResourceDefinition and the controller's Deployment as read.
  returned: always
  type: dict
  sample: {crd: plans.upgrade.cattle.io, crd_established: true, namespace: system-upgrade,
           deployment: system-upgrade-controller, replicas: 1, ready_replicas: 1, ready: true}
nodes:
  description:
    - One entry per node of O(nodes) found, with C(name), C(role) (V(server) or V(agent)), C(role_label) (the label
      that makes it a server, null for an agent), C(current_rke2) (its kubeletVersion), C(target_rke2) and C(action)
      (V(upgrade), V(up_to_date), or null without O(target_rke2) or with a kubeletVersion that is no RKE2 version).
  returned: always
  type: list
  elements: dict
  sample:
    - {name: gpu-a-01, role: agent, role_label: null, current_rke2: v1.35.3+rke2r3, target_rke2: v1.36.1+rke2r1,
       action: upgrade}
problems:
  description: Every problem found (empty when none); each names the object or node and the value.
  returned: always
  type: list
  elements: str
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _suc_plan
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule

# The module's own options (the Kubernetes auth options are added); the action plugin runs run() with them
# in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    namespace=dict(type='str', default=_suc_plan.DEFAULT_NAMESPACE),
    controller=dict(type='str', default=_suc_plan.DEFAULT_CONTROLLER),
    nodes=dict(type='list', elements='str', default=[]),
    target_rke2=dict(type='str'),
    declared_roles=dict(type='dict', default={}),
    fail_on_problems=dict(type='bool', default=False),
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    p = module.params
    with module.errors(expected=(_suc_plan.SucPlanError,)):
        if p['target_rke2']:
            _suc_plan.parse_rke2_version(p['target_rke2'], 'target_rke2')
        k8s = module.client
        names = list(dict.fromkeys(p['nodes']))
        if len(names) == 1:
            node = k8s.get_or_none(path_for('v1', 'nodes', names[0]))
            objs = [node] if node else []
        elif names:
            objs = k8s.list_all(path_for('v1', 'nodes'))
        else:
            objs = []
        rows, problems = _suc_plan.preflight_nodes(objs, names, p['target_rke2'], p['declared_roles'])
        crd = k8s.get_or_none(path_for('apiextensions.k8s.io/v1', 'customresourcedefinitions', _suc_plan.PLAN_CRD))
        deployment = k8s.get_or_none(path_for('apps/v1', 'deployments', p['controller'], p['namespace']))
        controller, controller_problems = _suc_plan.controller_state(crd, deployment, p['namespace'], p['controller'])
        # Without a target every node counts as needing the controller; with one, only when some node moves.
        if not p['target_rke2'] or any(r['action'] == 'upgrade' for r in rows):
            problems = controller_problems + problems
    out = dict(changed=False, controller=controller, nodes=rows, problems=problems)
    if problems and p['fail_on_problems']:
        module.fail_json(msg='refusing an RKE2 upgrade: %s' % '; '.join(problems), **out)
    module.exit_json(**out)


def main() -> None:
    run(K8sModule('suc_info', OPTIONS))


if __name__ == '__main__':
    main()
