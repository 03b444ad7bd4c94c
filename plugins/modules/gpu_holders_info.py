#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_holders_info
short_description: List the pods, VMs and DRA claims that hold GPUs on Kubernetes nodes
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Lists every holder of GPUs on the selected nodes, before a driver's kernel module is replaced.
  - A B(Pod) holds GPUs when it is not finished and a container requests or limits a GPU resource (O(gpu_resources)),
    its C(runtimeClassName) is a GPU runtime class (O(runtime_classes)), or it uses a ResourceClaim allocated by a GPU
    DRA driver (O(dra_drivers)). DaemonSet pods (device plugin, DCGM exporter) are holders too, flagged C(daemonset).
  - A KubeVirt B(VirtualMachineInstance) holds GPUs when C(spec.domain.devices.gpus) or C(hostDevices) is not empty;
    its virt-launcher pod is reported under the VMI, never as a Pod.
  - A B(ResourceClaim) holds GPUs when a GPU DRA driver allocated it a device on a node.
  - Without O(nodes) (fleet mode), pods are listed once cluster-wide, page by page; with O(nodes), per node with a
    field selector. VMIs, ResourceClaims and ResourceSlices are read where their APIs are installed.
  - Read-only; issues only GET requests.
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  nodes:
    description:
      - Names of the nodes to inspect.
      - Without it, every node that advertises a GPU resource (O(gpu_resources) in its allocatable or capacity), every
        node with a ResourceSlice of a GPU DRA driver, and every node where a holder is found.
    type: list
    elements: str
  gpu_resources:
    description:
      - Extended resource names that are GPUs. An entry ending in V(*) is a prefix.
    type: list
    elements: str
    default: [nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*]
  runtime_classes:
    description:
      - RuntimeClass names that give a pod the GPUs even without a resource request.
    type: list
    elements: str
    default: [nvidia]
  dra_drivers:
    description:
      - Dynamic Resource Allocation driver names whose devices are GPUs. An entry ending in V(*) is a prefix.
    type: list
    elements: str
    default: [gpu.nvidia.com]
  page_size:
    description:
      - Items per page when listing (the C(limit) of each list request).
    type: int
    default: 500
seealso:
  - module: gpufleet.upgrade.node_drain
"""

EXAMPLES = r"""
---
- name: Every GPU holder in the fleet
  gpufleet.upgrade.gpu_holders_info:
    kubeconfig: ~/.kube/config
  register: holders

- name: Holders on one node, before its drain
  gpufleet.upgrade.gpu_holders_info:
    nodes: [gpu-node-17]
  register: node_holders

- name: Stop if a GPU VM runs there
  ansible.builtin.assert:
    that: node_holders.holders | selectattr('kind', 'equalto', 'VirtualMachineInstance') | list | length == 0

- name: AMD and NVIDIA resources, a CDI runtime class
  gpufleet.upgrade.gpu_holders_info:
    gpu_resources: [nvidia.com/gpu, nvidia.com/mig-*, amd.com/gpu]
    runtime_classes: [nvidia, nvidia-cdi]
"""

RETURN = r"""
holders:
  description: One entry per holder, sorted by node, kind, namespace and name.
  returned: always
  type: list
  elements: dict
  contains:
    kind:
      description: V(Pod), V(VirtualMachineInstance) or V(ResourceClaim).
      type: str
    namespace:
      description: Namespace.
      type: str
    name:
      description: Name.
      type: str
    uid:
      description: UID.
      type: str
    node:
      description: Node whose GPUs it holds.
      type: str
    reason:
      description: Why it holds GPUs (resource, runtimeClass, DRA claim, GPU device of the VMI), reasons joined by C(; ).
      type: str
      sample: resource nvidia.com/mig-1g.10gb
    reasons:
      description: The reasons as a list.
      type: list
      elements: str
    owner:
      description: Controller as C(Kind/name) (Job, DaemonSet, ReplicaSet, StatefulSet, VirtualMachine...), or V(none).
      type: str
      sample: ReplicaSet/train-7d9f
    phase:
      description: Pod or VMI phase; for a claim V(Reserved), V(Allocated) or V(Pending).
      type: str
    local_data:
      description: Uses emptyDir or hostPath volumes (for a VMI, its launcher pod).
      type: bool
    daemonset:
      description: Managed by a DaemonSet.
      type: bool
    unmanaged:
      description: Has no controller.
      type: bool
    launcher_pod:
      description: For a VMI whose virt-launcher pod was seen, that pod's name.
      type: str
      returned: when seen
by_node:
  description: Holder counts per node and kind (every inspected node, zeros included).
  returned: always
  type: dict
  sample: {"gpu-1": {"Pod": 7, "VirtualMachineInstance": 1, "ResourceClaim": 1, "total": 9}}
nodes:
  description: The nodes inspected.
  returned: always
  type: list
  elements: str
api_requests:
  description: Number of API requests made (including retries).
  returned: always
  type: int
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _holders
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sClient, K8sError, NotFoundError, path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule


def collect(k8s: K8sClient, params: dict) -> dict:
    """Read what is needed (GETs only) and classify it."""
    gpu_resources = params['gpu_resources']
    dra_drivers = params['dra_drivers']
    limit = params['page_size']
    not_finished = 'status.phase!=Succeeded,status.phase!=Failed'
    claims = k8s.list_optional(path_for('resource.k8s.io/v1', 'resourceclaims'))
    vmis = k8s.list_optional(path_for('kubevirt.io/v1', 'virtualmachineinstances'))
    classifier = _holders.Classifier(vmis, claims, gpu_resources, params['runtime_classes'], dra_drivers)
    if params.get('nodes'):
        nodes = list(dict.fromkeys(params['nodes']))
        for name in nodes:
            try:
                k8s.get(path_for('v1', 'nodes', name))
            except NotFoundError:
                raise K8sError('nodes: node %r does not exist' % name)
        for name in nodes:
            for page in k8s.list_pages(path_for('v1', 'pods'),
                                       {'fieldSelector': 'spec.nodeName=%s,%s' % (name, not_finished)}, limit):
                classifier.add_pods(page)
        holders = classifier.holders(nodes)
    else:
        nodes = []
        for page in k8s.list_pages(path_for('v1', 'nodes'), None, limit):
            nodes.extend((n.get('metadata') or {}).get('name') for n in page
                         if _holders.node_advertises_gpu(n, gpu_resources))
        nodes.extend(_holders.slice_nodes(k8s.list_optional(path_for('resource.k8s.io/v1', 'resourceslices')),
                                          dra_drivers))
        # One cluster-wide list, classified page by page: only the holders stay in memory.
        for page in k8s.list_pages(path_for('v1', 'pods'), {'fieldSelector': not_finished}, limit):
            classifier.add_pods(page)
        holders = classifier.holders()
        nodes = sorted(set(nodes) | {h['node'] for h in holders if h['node']})
    return {'holders': holders, 'by_node': _holders.by_node(holders, nodes), 'nodes': nodes}


# The module's own options (the Kubernetes auth options are added) and AnsibleModule's checks; the action
# plugin runs run() with them in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    nodes={'type': 'list', 'elements': 'str'},
    gpu_resources={'type': 'list', 'elements': 'str', 'default': list(_holders.DEFAULT_GPU_RESOURCES)},
    runtime_classes={'type': 'list', 'elements': 'str', 'default': list(_holders.DEFAULT_RUNTIME_CLASSES)},
    dra_drivers={'type': 'list', 'elements': 'str', 'default': list(_holders.DEFAULT_DRA_DRIVERS)},
    page_size={'type': 'int', 'default': 500},
)
CHECKS = dict(
    count_requests=True,
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    params = module.params
    try:
        _holders.validate_options(params['gpu_resources'], params['runtime_classes'], params['dra_drivers'])
        if params['page_size'] < 1:
            raise _holders.HolderOptionError('page_size must be >= 1, got %r' % params['page_size'])
        for n in params.get('nodes') or []:
            if not n or not n.strip():
                raise _holders.HolderOptionError('nodes: %r is not a node name' % n)
    except _holders.HolderOptionError as exc:
        module.fail_json(msg=str(exc))
    with module.errors():
        result = collect(module.client, params)
    module.exit_json(changed=False, api_requests=module.api_requests, **result)


def main() -> None:
    run(K8sModule('gpu_holders_info', OPTIONS, **CHECKS))


if __name__ == '__main__':
    main()
