#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: dra_recovery_plan
short_description: Read-only stale DRA driver Pod recovery planner
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - After a DRA postflight failure, tells whether an old, unready GPU DRA driver Pod on a node is a
    candidate for manual recovery, and explains why or why not. It never deletes anything.
  - A candidate is printed only when all four conditions hold. C(node_ready) - the Node's C(Ready)
    condition is C(True). C(dra_inventory_empty) - the ResourceSlices published for the node (of
    I(driver) when given) list no device. C(daemonset_degraded) - the driver DaemonSet has
    C(numberReady < desiredNumberScheduled) or C(updatedNumberScheduled < desiredNumberScheduled).
    C(stale_driver_pod) - a Pod on the node owned by the current DaemonSet (an ownerReference whose
    UID is the DaemonSet's UID), without C(deletionTimestamp), has been unready for at least
    I(min_unready_seconds).
  - The objects are given as options, so the caller reads them with M(kubernetes.core.k8s_info)
    (or the collection's API helpers) and this module stays a pure function of its input.
  - A postflight failure alone is never a reason to delete a Pod; the postflight leaves the node
    and the upgrade wave stopped whatever this planner says.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  node:
    description: The Node object (as M(kubernetes.core.k8s_info) returns it).
    type: dict
    required: true
  resource_slices:
    description: ResourceSlice objects (C(resource.k8s.io)); those of other nodes are ignored.
    type: list
    elements: dict
    default: []
  daemonset:
    description: The GPU DRA driver DaemonSet object (its C(metadata.uid) is required).
    type: dict
    required: true
  pods:
    description: The driver's Pod objects (for example all Pods matching the DaemonSet selector); Pods of other nodes are ignored.
    type: list
    elements: dict
    default: []
  driver:
    description: Count only ResourceSlices of this DRA driver name (for example C(gpu.nvidia.com)).
    type: str
  min_unready_seconds:
    description: How long a Pod must have been unready before it is a candidate.
    type: int
    default: 600
    aliases: [min_unready]
  now:
    description: Evaluation time, RFC 3339 (for reproducible reports); defaults to the current time.
    type: str
seealso:
  - module: kubernetes.core.k8s_info
"""

EXAMPLES = r"""
---
- name: Read the objects
  kubernetes.core.k8s_info:
    kind: "{{ item.kind }}"
    api_version: "{{ item.api_version }}"
    name: "{{ item.name | default(omit) }}"
    namespace: "{{ item.namespace | default(omit) }}"
  loop:
    - {kind: Node, api_version: v1, name: gpu-a-07}
    - {kind: ResourceSlice, api_version: resource.k8s.io/v1}
    - {kind: DaemonSet, api_version: apps/v1, name: nvidia-dra-driver-gpu-kubelet-plugin, namespace: nvidia-dra-driver-gpu}
    - {kind: Pod, api_version: v1, namespace: nvidia-dra-driver-gpu}
  register: objs

- name: Plan the recovery (read-only)
  gpufleet.upgrade.dra_recovery_plan:
    node: "{{ objs.results[0].resources[0] }}"
    resource_slices: "{{ objs.results[1].resources }}"
    daemonset: "{{ objs.results[2].resources[0] }}"
    pods: "{{ objs.results[3].resources }}"
    driver: gpu.nvidia.com
  register: recovery

- name: Show the candidate
  ansible.builtin.debug:
    msg: "{{ recovery.summary }}"
"""

RETURN = r"""
node:
  description: Name of the node evaluated.
  returned: success
  type: str
  sample: gpu-a-07
candidate:
  description: True only when every condition is met.
  returned: success
  type: bool
conditions:
  description: Each condition with C(name), C(met) and C(reason), in the order listed above.
  returned: success
  type: list
  elements: dict
  sample:
    - {name: node_ready, met: true, reason: node gpu-a-07 is Ready}
pods:
  description: Evaluation of each given Pod on the node (ownership, readiness, since when, why it qualifies or not).
  returned: success
  type: list
  elements: dict
candidates:
  description: The qualifying Pods (only when C(candidate)), each with a C(manual_step) for the operator.
  returned: success
  type: list
  elements: dict
summary:
  description: One line for the operator.
  returned: success
  type: str
"""

import datetime

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils._dra_recovery import (
    DEFAULT_MIN_UNREADY_SECONDS, RecoveryInputError, plan_recovery)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._kube_time import parse_time


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            node=dict(type='dict', required=True),
            resource_slices=dict(type='list', elements='dict', default=[]),
            daemonset=dict(type='dict', required=True),
            pods=dict(type='list', elements='dict', default=[]),
            driver=dict(type='str'),
            min_unready_seconds=dict(type='int', default=DEFAULT_MIN_UNREADY_SECONDS, aliases=['min_unready']),
            now=dict(type='str'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        now = parse_time(p['now'], 'now') if p['now'] else datetime.datetime.now(datetime.timezone.utc)
        plan = plan_recovery(node=p['node'], resource_slices=p['resource_slices'], daemonset=p['daemonset'],
                             pods=p['pods'], now=now, min_unready_seconds=p['min_unready_seconds'],
                             driver=p['driver'])
    except (RecoveryInputError, ValueError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **plan.as_dict())


if __name__ == '__main__':
    main()
