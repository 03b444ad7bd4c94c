#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_gate
short_description: Gate - a GPU node is back in Kubernetes as expected (Ready, allocatable GPUs, device plugin, validator, taints)
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - The node-integration gate of an upgrade (seed 000, gate 1). It is read-only and returns each check's
    evidence and a verdict. A failed gate fails the task.
  - C(ready) - the Node's Ready condition is True.
  - C(allocatable) - the allocatable count of each resource in O(expected_gpus) (C(nvidia.com/gpu) or a MIG
    resource such as C(nvidia.com/mig-1g.10gb)) equals the expected count, and no other GPU resource is advertised.
  - C(device_plugin) - a device plugin pod (O(device_plugin_selector)) runs on the node and is Ready; the
    resources it registered are in the node's capacity.
  - C(validator) - the GPU Operator validator pod (O(validator_selector)) on the node is Ready, when present
    (or when O(validator_required)).
  - C(taints) - the node has no taint besides O(allowed_taints) and the cordon's own
    C(node.kubernetes.io/unschedulable) (the gate runs before the uncordon).
  - With O(timeout), the gate re-reads every O(interval) seconds until it passes or the time is up, and
    returns the last evaluation. The wait is always bounded.
  - With O(nodes) instead of O(node), the gate judges many nodes from one read of the cluster (one list of the Nodes
    and one list of the operand pods, however many nodes), as the rollout's observation windows do when they
    re-gate every node upgraded so far. RV(measured) and RV(artifacts) are then not returned; RV(node_views) returns
    what the same read says of each node. The device plugin and validator pods are listed together when their selectors
    are each one C(key=value) on the same key (as the defaults are), else one list each.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
  - gpufleet.upgrade.k8s_auth_options
options:
  node:
    description: The node's name. Exactly one of O(node) and O(nodes).
    type: str
  expected_gpus:
    description:
      - Expected allocatable count per GPU resource, for example C(nvidia.com/gpu=8) or, with the MIG
        mixed strategy, C(nvidia.com/mig-1g.10gb=56) (a dict of resource name to count).
      - Required with O(node). An empty dict means no count is known (a MIG node, whose layout advertises
        C(nvidia.com/mig-*) resources) - every GPU resource in its capacity must then be allocatable in full, and there
        must be at least one, as for a node of O(nodes) mapped to an empty dict.
    type: dict
  nodes:
    description:
      - Many nodes at once, each name mapped to its expected GPU resources (as O(expected_gpus)).
      - A node mapped to an empty dict or null has no known count - every GPU resource in its capacity must then be
        allocatable in full (the device plugin marked no device unhealthy), and there must be at least one.
    type: dict
  node_selector:
    description:
      - With O(nodes), list only the Nodes this label selector chooses (the pool, for example C(nvidia.com/gpu.present=true))
        rather than every Node of the cluster. A node of O(nodes) it does not choose counts as missing.
    type: str
  finished_for:
    description:
      - With O(nodes), judge only the nodes whose Node records this target (a target key, as
        C(gpufleet.upgrade.target_key) makes it) finished - C(gpufleet.io/upgraded-to) is the key and no upgrade is in
        progress - as read by this same list, as an observation window re-gates every node upgraded so far. The others
        are listed in RV(not_finished) and not judged.
    type: str
  device_plugin_selector:
    description: Label selector (equality-based) of the device plugin pods.
    type: str
    default: app=nvidia-device-plugin-daemonset
  validator_selector:
    description: Label selector of the GPU Operator validator pods. An empty string skips the check.
    type: str
    default: app=nvidia-operator-validator
  validator_required:
    description: Fail when no validator pod runs on the node (by default an absent validator passes, with the evidence saying so).
    type: bool
    default: false
  allowed_taints:
    description:
      - Taints the node may carry, as C(key) or C(key=value), for example the canary taint C(gpufleet.io/canary).
        C(node.kubernetes.io/unschedulable) is always allowed.
    type: list
    elements: str
    default: []
  dcgm_exporter_selector:
    description:
      - Label selector of the DCGM exporter pods; the image tag of the one on the node is reported in RV(measured).
    type: str
    default: app=nvidia-dcgm-exporter
  gpu_operator:
    description:
      - The GPU Operator's workload object whose image tag is reported in RV(measured) (one GET after the gate
        decided). An empty dict skips it.
    type: dict
    default: {api_version: apps/v1, kind: Deployment, namespace: gpu-operator, name: gpu-operator}
  timeout:
    description: Seconds to keep re-evaluating until the gate passes; V(0) evaluates once.
    type: int
    default: 0
  interval:
    description: Seconds between evaluations while O(timeout) lasts.
    type: float
    default: 5
notes:
  - The stop rule is conjunctive - one failed critical gate stops expansion.
  - Reads Nodes and Pods (get, list) and the O(gpu_operator) object (get) only.
seealso:
  - module: gpufleet.upgrade.workload_gate
"""

EXAMPLES = r"""
---
- name: Node integration gate after the driver upgrade
  gpufleet.upgrade.node_gate:
    kubeconfig: ~/.kube/config
    node: gpu-07
    expected_gpus:
      nvidia.com/gpu: 8
    allowed_taints: [gpufleet.io/canary]
    timeout: 600
    interval: 10
  register: node_gate
"""

RETURN = r"""
passed:
  description: Every check passed.
  returned: always
  type: bool
  sample: true
msg:
  description: The verdict in one line.
  returned: always
  type: str
  sample: "node gate: PASS for gpu-07 (allocatable, device_plugin, ready, taints, validator)"
problems:
  description: Every failed check's problems.
  returned: always
  type: list
  elements: str
  sample: ["nvidia.com/gpu: allocatable 7, expected 8"]
checks:
  description: Each check by name (C(ready), C(allocatable), C(device_plugin), C(validator), C(taints)) with C(passed), C(problems) and C(evidence).
  returned: always
  type: dict
node:
  description: The node.
  returned: always
  type: str
measured:
  description:
    - The cluster side of the node's tuple as the cluster reports it when the gate decided - C(kernel) and C(rke2)
      from the kubelet (C(status.nodeInfo)), C(dcgm_exporter) the image tag of the DCGM exporter pod on the node,
      C(gpu_operator) the image tag of O(gpu_operator). A value that cannot be read is V(null).
  returned: always
  type: dict
  sample: {kernel: 6.8.0-135-generic, rke2: v1.36.1+rke2r1, dcgm_exporter: 4.4.1-4.6.0-ubuntu22.04, gpu_operator: v26.3.3}
artifacts:
  description:
    - The images of the node's tuple as evidence artifacts - the DCGM exporter pod's on the node and the GPU Operator's
      (O(gpu_operator)), each C(kind=image), C(name) (the reference), C(version) (its tag) and C(digest) (sha256) when
      the kubelet reports the pulled image's digest (C(imageID)) or the reference pins one; without C(digest) otherwise.
  returned: always
  type: list
  elements: dict
  sample: [{kind: image, name: "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04", version: 4.4.1-4.6.0-ubuntu22.04}]
nodes:
  description: With O(nodes), each node's own result (C(node), C(passed), C(msg), C(problems), C(checks)).
  returned: when O(nodes) is given
  type: dict
node_views:
  description:
    - With O(nodes), each of them that the read found, as gpufleet.upgrade.fleet_info returns a node (C(name), C(ready),
      C(kernel), C(rke2), C(annotations) (the C(gpufleet.io/) ones), C(labels), C(taints), C(gpus), ...), from the same
      read the gate judged.
  returned: when O(nodes) is given
  type: list
  elements: dict
not_finished:
  description: With O(finished_for), the nodes of O(nodes) not judged (not recorded finished for it, or not found).
  returned: when O(finished_for) is given
  type: list
  elements: str
  sample: [gpu-09]
failed_nodes:
  description: With O(nodes), the nodes that failed the gate.
  returned: when O(nodes) is given
  type: list
  elements: str
  sample: [gpu-07]
attempts:
  description: Evaluations made.
  returned: always
  type: int
  sample: 1
elapsed:
  description: Seconds spent.
  returned: always
  type: float
"""

import time

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _node_gate
from ansible_collections.gpufleet.upgrade.plugins.module_utils._fleet import plural_of
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sClient, path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule
from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import poll


def read_and_evaluate(k8s: K8sClient, params: dict) -> dict:
    node = k8s.get_or_none(path_for('v1', 'nodes', params['node']))
    pods = []
    if node is not None:
        pods = k8s.list_all(path_for('v1', 'pods'), {'fieldSelector': 'spec.nodeName=%s' % params['node']})
    result = _node_gate.evaluate(params['node'], node, pods, params['expected_gpus'],
                                 device_plugin_selector=params['device_plugin_selector'],
                                 validator_selector=params['validator_selector'] or None,
                                 validator_required=params['validator_required'],
                                 allowed_taints=params['allowed_taints'])
    result['_observed'] = (node, pods)
    return result


def read_and_evaluate_nodes(k8s: K8sClient, params: dict, nodes: dict) -> dict:
    """The multi-node form: one list of the Nodes (those of node_selector), one list of the operand pods
    (one a selector where the selectors cannot share one: _node_gate.pod_list_selectors)."""
    query = {'labelSelector': params['node_selector']} if params['node_selector'] else None
    objects = {(n.get('metadata') or {}).get('name'): n for n in k8s.list_all(path_for('v1', 'nodes'), query)}
    pods = []
    for selector in _node_gate.pod_list_selectors(params['device_plugin_selector'], params['validator_selector']):
        pods.extend(k8s.list_all(path_for('v1', 'pods'), {'labelSelector': selector}))
    gated, not_finished = _node_gate.gated_nodes(nodes, objects, params['finished_for'])
    result = _node_gate.evaluate_nodes(gated, objects, pods,
                                       device_plugin_selector=params['device_plugin_selector'],
                                       validator_selector=params['validator_selector'] or None,
                                       validator_required=params['validator_required'],
                                       allowed_taints=params['allowed_taints'])
    result['node_views'] = _node_gate.node_views(list(nodes), objects)
    if params['finished_for'] is not None:
        result['not_finished'] = not_finished
    return result


def operator_object(k8s: K8sClient, ref: dict):
    """The GPU Operator's workload object (None when `ref` is empty or the object does not exist)."""
    if not ref:
        return None
    group_version = ref.get('api_version') or 'apps/v1'
    plural = plural_of(ref.get('kind') or 'Deployment')
    return k8s.get_or_none(path_for(group_version, plural, ref.get('name') or '', namespace=ref.get('namespace')))


# The module's own options (the Kubernetes auth options are added) and AnsibleModule's checks; the action
# plugin runs run() with them in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    node={'type': 'str'},
    expected_gpus={'type': 'dict'},
    nodes={'type': 'dict'},
    node_selector={'type': 'str'},
    finished_for={'type': 'str'},
    device_plugin_selector={'type': 'str', 'default': _node_gate.DEFAULT_DEVICE_PLUGIN_SELECTOR},
    validator_selector={'type': 'str', 'default': _node_gate.DEFAULT_VALIDATOR_SELECTOR},
    validator_required={'type': 'bool', 'default': False},
    allowed_taints={'type': 'list', 'elements': 'str', 'default': []},
    timeout={'type': 'int', 'default': 0},
    interval={'type': 'float', 'default': 5},
    dcgm_exporter_selector={'type': 'str', 'default': _node_gate.DEFAULT_DCGM_EXPORTER_SELECTOR},
    gpu_operator={'type': 'dict', 'default': {'api_version': 'apps/v1', 'kind': 'Deployment',
                                              'namespace': 'gpu-operator', 'name': 'gpu-operator'}},
)
CHECKS = dict(
    mutually_exclusive=[('node', 'nodes'), ('expected_gpus', 'nodes')],
    required_one_of=[('node', 'nodes')],
    required_by={'node': ('expected_gpus',), 'node_selector': ('nodes',), 'finished_for': ('nodes',)},
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    params = module.params
    if params['node'] is not None and not params['node'].strip():
        module.fail_json(msg='node: %r is not a node name' % params['node'])
    if params['timeout'] < 0:
        module.fail_json(msg='timeout: %r must be 0 or more seconds' % params['timeout'])
    if params['interval'] <= 0:
        module.fail_json(msg='interval: %r must be more than 0 seconds' % params['interval'])
    nodes = {}
    try:
        # Bad options fail before any request.
        if params['nodes'] is not None:
            nodes = _node_gate.validate_nodes(params['nodes'])
            _node_gate.validate_finished_for(params['finished_for'])
        elif params['expected_gpus'] == {}:
            params['expected_gpus'] = None  # no count known: the node's capacity decides (as in the nodes form)
        else:
            _node_gate.validate_expected(params['expected_gpus'])
        _node_gate.parse_label_selector(params['device_plugin_selector'], 'device_plugin_selector')
        if params['validator_selector']:
            _node_gate.parse_label_selector(params['validator_selector'], 'validator_selector')
        _node_gate.parse_label_selector(params['dcgm_exporter_selector'], 'dcgm_exporter_selector')
        ref = params['gpu_operator']
        if ref and not all(isinstance(ref.get(k), str) and ref.get(k) for k in ('name', 'namespace')):
            raise _node_gate.NodeGateError('gpu_operator: %r needs a name and a namespace (or {} to skip it)' % (ref,))
    except _node_gate.NodeGateError as exc:
        module.fail_json(msg=str(exc))
    start = time.monotonic()
    if params['nodes'] is not None:
        with module.errors(expected=(_node_gate.NodeGateError,), passed=False):
            polled = poll(lambda: read_and_evaluate_nodes(module.client, params, nodes), params['timeout'], params['interval'],
                          done=lambda evaluated: evaluated['passed'])
        result = dict(polled.value, attempts=polled.attempts, elapsed=round(time.monotonic() - start, 3), changed=False)
        if not result['passed']:
            if params['timeout']:
                result['msg'] += ' (still failing after %d evaluation(s) in %ss)' % (polled.attempts, params['timeout'])
            module.fail_json(**result)
        module.exit_json(**result)
    with module.errors(expected=(_node_gate.NodeGateError,), passed=False):
        polled = poll(lambda: read_and_evaluate(module.client, params), params['timeout'], params['interval'],
                      done=lambda evaluated: evaluated['passed'])
        result, attempts = polled.value, polled.attempts
        node, pods = result.pop('_observed')
        operator = operator_object(module.client, params['gpu_operator'])
        result['measured'] = _node_gate.measure(params['node'], node, pods, params['dcgm_exporter_selector'], operator)
        result['artifacts'] = _node_gate.image_artifacts(params['node'], pods, params['dcgm_exporter_selector'], operator)
    result.update(attempts=attempts, elapsed=round(time.monotonic() - start, 3), changed=False)
    if not result['passed']:
        if params['timeout']:
            result['msg'] += ' (still failing after %d evaluation(s) in %ss)' % (attempts, params['timeout'])
        module.fail_json(**result)
    module.exit_json(**result)


def main() -> None:
    run(K8sModule('node_gate', OPTIONS, **CHECKS))


if __name__ == '__main__':
    main()
