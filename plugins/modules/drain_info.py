#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: drain_info
short_description: The drain dry run of GPU nodes under the plan's drain policy, in one read of the cluster
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Says, for every node of O(nodes), what M(gpufleet.upgrade.node_drain) would do now under the drain policy
    O(policy) - the pods it would refuse (and why, naming the rule), evict (those whose emptyDir data goes with them
    listed apart), wait for (already terminating) and the VMs that would leave - so a policy that refuses something is
    fixed before the first canary, not at node 37.
  - Reads the cluster's pods once (paged, cluster-wide) and KubeVirt's VirtualMachineInstances once where KubeVirt is
    installed, whatever the number of nodes. Read-only; issues only GET requests.
  - The preflight playbook runs it on every node of the plan and refuses while a pod would be refused.
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  nodes:
    description: The nodes to judge (the plan's).
    type: list
    elements: str
    required: true
  policy:
    description:
      - The drain policy, as the plan records it (its C(drain)) - see O(gpufleet.upgrade.node_drain#module:policy).
        Empty - the policy's defaults.
    type: dict
    default: {}
  vmi_policy:
    description: What the drain does with a KubeVirt VM on the node (O(gpufleet.upgrade.node_drain#module:vmi_policy)).
    type: str
    choices: [refuse, stop, evict]
    default: refuse
  page_size:
    description: Items per page when listing (the C(limit) of each list request).
    type: int
    default: 500
seealso:
  - module: gpufleet.upgrade.node_drain
  - module: gpufleet.upgrade.gpu_holders_info
"""

EXAMPLES = r"""
---
- name: What the drains of the plan's nodes would do now, under its drain policy
  gpufleet.upgrade.drain_info:
    nodes: "{{ plan.batches | flatten }}"
    policy: "{{ plan.drain }}"
  register: dry_run

- name: Refuse while a pod would be refused
  ansible.builtin.assert:
    that: dry_run.refused | length == 0
    fail_msg: "{{ dry_run.refused | map(attribute='message') | join('; ') }}"
"""

RETURN = r"""
nodes:
  description: Per node of O(nodes), in their order, what its drain would do now.
  returned: success
  type: list
  elements: dict
  contains:
    node:
      description: The node.
      type: str
    refuse:
      description: The pods and VMIs it would refuse, each with C(kind), C(namespace), C(name), C(uid) and C(reason).
      type: list
      elements: dict
    evict:
      description: The pods it would evict (C(namespace/name)).
      type: list
      elements: str
    local_data_deleted:
      description: Those of RV(nodes[].evict) whose emptyDir data is deleted with them.
      type: list
      elements: str
    wait:
      description: Pods already terminating it would wait for.
      type: list
      elements: str
    vms_leaving:
      description: VMIs that would leave the node (vmi_policy stop or evict).
      type: list
      elements: str
    left:
      description: How many pods it leaves in place (DaemonSet and mirror pods).
      type: int
refused:
  description: Every refusal of every node, each with C(node), C(namespace), C(name), C(kind), C(reason) and C(message).
  returned: success
  type: list
  elements: dict
  sample:
    - node: gpu-07
      namespace: research
      name: notebook-ana
      kind: Pod
      reason: "no controller manages it: deleted, it is gone for ever (unmanaged_pods=refuse, the drain policy's defaults)"
      message: "gpu-07: Pod research/notebook-ana: no controller manages it: deleted, it is gone for ever (...)"
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_policy
from ansible_collections.gpufleet.upgrade.plugins.module_utils._drain import KUBEVIRT, dry_run
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule

OPTIONS = dict(
    nodes={'type': 'list', 'elements': 'str', 'required': True},
    policy={'type': 'dict', 'default': {}},
    vmi_policy={'type': 'str', 'choices': ['refuse', 'stop', 'evict'], 'default': 'refuse'},
    page_size={'type': 'int', 'default': 500},
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    p = module.params
    with module.errors(expected=(_drain_policy.DrainPolicyError,), prefixes={_drain_policy.DrainPolicyError: ''}):
        policy = _drain_policy.parse(p['policy'], 'policy')
        if p['page_size'] < 1:
            module.fail_json(msg='page_size: %r is not a positive number of items' % p['page_size'])
        k8s = module.client
        pods = k8s.list_all(path_for('v1', 'pods'), limit=p['page_size'])
        vmis = k8s.list_optional(path_for(KUBEVIRT, 'virtualmachineinstances'))
        nodes = dry_run(p['nodes'], pods, vmis, policy, p['vmi_policy'])
    refused = []
    for n in nodes:
        for r in n['refuse']:
            message = '%s: %s %s/%s: %s' % (n['node'], r.get('kind'), r.get('namespace'), r.get('name'), r.get('reason'))
            refused.append(dict(r, node=n['node'], message=message))
    module.exit_json(changed=False, nodes=nodes, refused=refused)


def main() -> None:
    run(K8sModule('drain_info', OPTIONS))


if __name__ == '__main__':
    main()
