#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_info
short_description: Read a GPU pool's nodes, cluster component versions and named objects from the Kubernetes API
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Lists the Nodes of the pool and returns, per node, what the planner and the rollout need - readiness, cordon,
    GPU capacity, kernel and RKE2 version as the kubelet reports them, labels, taints and the C(gpufleet.io/*)
    progress annotations.
  - Reads the GPU Operator and DCGM exporter versions from their workloads' image tags (RV(cluster)).
  - Reads any other objects named in O(resources) (for example the objects that prove GPU intake is closed, for
    M(gpufleet.upgrade.intake_check), or the DRA objects for M(gpufleet.upgrade.dra_recovery_plan)).
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  node_selector:
    description:
      - Label selector of the pool's Nodes, used exactly as given. An empty string lists every Node.
      - Not set (the default), the pool is the NVIDIA GPU Nodes, which needs no GPU Feature Discovery - every Node
        labelled C(nvidia.com/gpu.present=true) (GPU Feature Discovery) or C(feature.node.kubernetes.io/pci-10de.present=true)
        (Node Feature Discovery as the GPU Operator configures it), or whose capacity or allocatable reports an NVIDIA
        GPU resource (C(nvidia.com/gpu), C(nvidia.com/gpu.shared), C(nvidia.com/mig-*)), or that carries a
        C(gpufleet.io/) annotation (a node this collection is upgrading, whose device plugin may be down). Every Node is
        listed and these are kept.
      - Not set and with O(names), the named Nodes are read whatever they report.
    type: str
  names:
    description:
      - Only these Nodes (after O(node_selector)). Empty means all.
      - With one name, only that Node is read (a field selector), not every Node of the cluster.
    type: list
    elements: str
    default: []
  gpu_operator:
    description: Where the GPU Operator version is read (its image tag); an empty dict (V({})) skips it.
    type: dict
    default: {api_version: apps/v1, kind: Deployment, namespace: gpu-operator, name: gpu-operator}
  dcgm_exporter:
    description: Where the DCGM exporter version is read (its image tag); an empty dict (V({})) skips it.
    type: dict
    default: {api_version: apps/v1, kind: DaemonSet, namespace: gpu-operator, name: nvidia-dcgm-exporter}
  resources:
    description:
      - Other objects to read, each with C(api_version), C(kind) and optionally C(namespace), C(name),
        C(label_selector), C(field_selector) and C(plural) (when the kind's plural is irregular).
      - RV(resources) returns one list of objects per entry, in the same order.
    type: list
    elements: dict
    default: []
notes:
  - Belongs to the C(gpufleet.upgrade.k8s) action group.
"""

EXAMPLES = r"""
- name: Read the GPU pool (the NVIDIA GPU Nodes, with or without GPU Feature Discovery)
  gpufleet.upgrade.fleet_info:
  register: pool

- name: Read the pool of a label of one's own, with an intake object
  gpufleet.upgrade.fleet_info:
    node_selector: gpufleet.io/pool=h100
    resources:
      - {api_version: v1, kind: ResourceQuota, namespace: tenants, name: gpu-intake}
  register: fleet
"""

RETURN = r"""
nodes:
  description: One entry per Node, in name order.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: "Node name."
      type: str
    ready:
      description: "Ready condition is True."
      type: bool
    unschedulable:
      description: "Cordoned."
      type: bool
    gpus:
      description: "Allocatable whole GPUs (or the GPU count label)."
      type: int
    kernel:
      description: "Kernel release the kubelet reports."
      type: str
    rke2:
      description: "Kubelet version (the RKE2 version on RKE2)."
      type: str
    uid:
      description: The Node object's UID (a node re-registered under the same name gets another).
      type: str
    machine_id:
      description: The machine-id its kubelet reports (C(status.nodeInfo.machineID)); null when not reported.
      type: str
    system_uuid:
      description: The system UUID its kubelet reports (C(status.nodeInfo.systemUUID)); null when not reported.
      type: str
    platform:
      description: >-
        Label C(gpufleet.io/platform), else label C(node.kubernetes.io/instance-type), else V(unknown) (a Node does not
        say its DMI identity; the plan adds it from the host, see M(gpufleet.upgrade.gpu_info) RV(gpufleet.upgrade.gpu_info#module:dmi)).
      type: str
    gpu_product:
      description: "Label C(nvidia.com/gpu.product)."
      type: str
    labels:
      description: "Labels."
      type: dict
    taints:
      description: "Taints."
      type: list
      elements: dict
    annotations:
      description: "The C(gpufleet.io/*) annotations."
      type: dict
cluster:
  description: Versions read from the cluster, V(null) when not found.
  returned: success
  type: dict
  sample: {gpu_operator: v25.10.1, dcgm_exporter: 4.4.1-4.6.0}
resources:
  description: The objects of each O(resources) entry, one list per entry.
  returned: success
  type: list
  elements: list
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fleet
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule


def _read(k8s, spec):
    plural = spec.get('plural') or _fleet.plural_of(spec['kind'])
    if spec.get('name'):
        obj = k8s.get_or_none(path_for(spec['api_version'], plural, spec['name'], spec.get('namespace')))
        return [obj] if obj else []
    query = {}
    if spec.get('label_selector'):
        query['labelSelector'] = spec['label_selector']
    if spec.get('field_selector'):
        query['fieldSelector'] = spec['field_selector']
    return k8s.list_optional(path_for(spec['api_version'], plural, None, spec.get('namespace')), query)


# The module's own options (the Kubernetes auth options are added); the action plugin runs run() with them
# in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    node_selector={'type': 'str'},
    names={'type': 'list', 'elements': 'str', 'default': []},
    gpu_operator={'type': 'dict', 'default': {'api_version': 'apps/v1', 'kind': 'Deployment',
                                              'namespace': 'gpu-operator', 'name': 'gpu-operator'}},
    dcgm_exporter={'type': 'dict', 'default': {'api_version': 'apps/v1', 'kind': 'DaemonSet',
                                               'namespace': 'gpu-operator', 'name': 'nvidia-dcgm-exporter'}},
    resources={'type': 'list', 'elements': 'dict', 'default': []},
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    p = module.params
    with module.errors(expected=(_fleet.FleetError,)):
        specs = [_fleet.validate_resource(i, r) for i, r in enumerate(p['resources'])]
        for field in ('gpu_operator', 'dcgm_exporter'):
            if p[field]:  # {} skips it (a null cannot be told from the default)
                _fleet.validate_resource(0, p[field])
        k8s = module.client
        query = _fleet.pool_query(p['node_selector'])
        if len(set(p['names'])) == 1:
            # One node (the rollout's failure path reads the failed node's kubelet): read that node only, not
            # every Node of the cluster (issue 18: no read inside a node's phases grows with the fleet).
            query['fieldSelector'] = 'metadata.name=%s' % p['names'][0]
        listed = _fleet.pool_nodes(k8s.list_all(path_for('v1', 'nodes'), query), p['node_selector'], bool(p['names']))
        nodes = [_fleet.node_facts(n) for n in listed]
        if p['names']:
            wanted = set(p['names'])
            missing = sorted(wanted - {n['name'] for n in nodes})
            if missing:
                module.fail_json(msg='names: no such node in the pool: %s' % ', '.join(missing))
            nodes = [n for n in nodes if n['name'] in wanted]
        nodes.sort(key=lambda n: n['name'])
        cluster = {}
        for field in ('gpu_operator', 'dcgm_exporter'):
            objs = _read(k8s, p[field]) if p[field] else []
            cluster[field] = _fleet.image_version(objs[0]) if objs else None
        resources = [_read(k8s, s) for s in specs]
    module.exit_json(changed=False, nodes=nodes, cluster=cluster, resources=resources)


def main() -> None:
    run(K8sModule('fleet_info', OPTIONS))


if __name__ == '__main__':
    main()
