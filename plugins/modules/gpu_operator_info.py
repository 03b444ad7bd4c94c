#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_operator_info
short_description: Read the NVIDIA GPU Operator's deployment, its operands and each node's operand pods
version_added: 0.1.0
description:
  - Reads, with GET requests only, what the GPU Operator runs - the snapshot of the "operator values" a
    rollback must preserve and what the rollout's per-node operand step works from (docs/gpu-operator.md).
  - The RKE2 C(HelmChart) (C(helm.cattle.io/v1)) of the operator when there is one - chart, version, values
    (C(spec.valuesContent)); the C(ClusterPolicy) (C(nvidia.com/v1)) - state, error, update strategy, driver
    auto-upgrade, DCGM exporter version, what an earlier M(gpufleet.upgrade.gpu_operator_update) recorded to
    restore; the operator's version (the image tag of its C(gpu-operator) Deployment).
  - The operand DaemonSets (owned by the ClusterPolicy) with their update strategy, template image, current
    C(ControllerRevision) hash and counts; per node, every operand pod with its revision, image, readiness and
    whether it runs its DaemonSet's current revision.
  - The C(NVIDIADriver) objects (C(nvidia.com/v1alpha1)) of operator-managed drivers per node pool, when the API
    serves them (RV(drivers)).
author:
  - gpufleet.upgrade contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.gpu_operator
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
requirements:
  - PyYAML
options:
  nodes:
    description: Report only these nodes in RV(gpu_operator.nodes) (default every node with an operand pod).
    type: list
    elements: str
seealso:
  - module: gpufleet.upgrade.gpu_operator_update
"""

EXAMPLES = r"""
---
- name: Snapshot the GPU Operator's deployment before the change
  gpufleet.upgrade.gpu_operator_info:
    kubeconfig: ~/.kube/config
  register: operator_before

- name: Show one node's operands
  gpufleet.upgrade.gpu_operator_info:
    nodes: [gpu-a-01]
  register: operands
"""

RETURN = r"""
gpu_operator:
  description: The operator's deployment.
  returned: success
  type: dict
  contains:
    version:
      description: The operator's version (its Deployment's image tag), null without the Deployment.
      type: str
    chart:
      description: The HelmChart (name, namespace, chart, version, repo, failed, message), null without one.
      type: dict
    cluster_policy:
      description:
        - name, state, error, update_strategy, driver_enabled, auto_upgrade, dcgm_exporter_version, and
          restore (what a change recorded to put back, or null).
        - driver_crd - whether the driver is rendered per node pool from C(NVIDIADriver) objects
          (C(driver.useNvidiaDriverCRD)).
      type: dict
    operands:
      description: One entry per operand DaemonSet (name, component, deploy_label, update_strategy, image, revision,
        generation, observed_generation, desired, ready, unavailable, and nvidia_driver - the NVIDIADriver that
        renders a per-pool driver DaemonSet, whose component is C(driver); null for the others).
      type: list
      elements: dict
    nodes:
      description: Node name to its operand pods (operand, pod, revision, image, phase, ready, current).
      type: dict
  sample:
    version: v26.3.3
    chart: {name: gpu-operator, namespace: kube-system, chart: gpu-operator, version: v26.3.3, failed: false}
    cluster_policy: {name: cluster-policy, state: ready, update_strategy: RollingUpdate, auto_upgrade: true,
                     dcgm_exporter_version: 4.3.1-4.4.0-ubuntu22.04, restore: null}
    operands:
      - {name: nvidia-dcgm-exporter, component: dcgmExporter, update_strategy: RollingUpdate, revision: 6d54b6979,
         image: "nvcr.io/nvidia/k8s/dcgm-exporter:4.3.1-4.4.0-ubuntu22.04", desired: 2, ready: 2}
    nodes:
      gpu-a-01:
        - {operand: nvidia-dcgm-exporter, pod: nvidia-dcgm-exporter-6zshx, revision: 6d54b6979, ready: true,
           current: true, image: "nvcr.io/nvidia/k8s/dcgm-exporter:4.3.1-4.4.0-ubuntu22.04"}
drivers:
  description:
    - The operator-managed drivers per node pool (C(NVIDIADriver) objects, with C(driver.nvidiaDriverCRD.enabled)), by name;
      empty where the CRD is not served or no pool has one.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The NVIDIADriver's name.
      type: str
    driver_type:
      description: C(gpu), C(vgpu) or C(vgpu-host-manager).
      type: str
    version:
      description: The driver version (or branch, for precompiled drivers).
      type: str
    image:
      description: The driver image (repository/image:version).
      type: str
    node_selector:
      description: The nodes of the pool.
      type: dict
    use_precompiled:
      description: Precompiled modules.
      type: bool
    use_open_kernel_modules:
      description: The open kernel modules.
      type: bool
    tolerations:
      description: Its tolerations (what the way back of a cluster step sets again, with the version).
      type: list
      elements: dict
    state:
      description: The operator's state of it (C(ready), C(notReady), C(ignored)), null before its first reconcile.
      type: str
  sample:
    - {name: a100-pool, driver_type: gpu, version: 580.130.00, image: "nvcr.io/nvidia/driver:580.130.00",
       node_selector: {gpufleet.io/model: a100}, use_precompiled: false, use_open_kernel_modules: false,
       tolerations: [], state: ready}
chart_values:
  description: The values a change works on (the HelmChart's values, or the ClusterPolicy's spec) - keep them
    to restore the operator after a failed canary.
  returned: success
  type: dict
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_operator import (
    OPERATOR_ARG_SPEC, GpuOperatorError, drivers_of, read_drivers, read_objects, state_of, values_of)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule


def main() -> None:
    module = K8sModule('gpu_operator_info', dict(OPERATOR_ARG_SPEC, nodes=dict(type='list', elements='str')))
    p = module.params
    with module.errors(expected=(GpuOperatorError,), prefixes={GpuOperatorError: 'gpu_operator_info: '}):
        objs = read_objects(module.client, p['namespace'], p['cluster_policy'],
                            (p['helm_chart_namespace'], p['helm_chart_name']), p['manage'])
        state = state_of(objs)
        # read_objects lists the NVIDIADrivers only where the ClusterPolicy renders the driver from them.
        drivers = drivers_of(objs['drivers'] if state['cluster_policy'] and state['cluster_policy']['driver_crd']
                             else read_drivers(module.client))
        values = values_of(objs['helm_chart'], objs['cluster_policy']) if (
            objs['helm_chart'] is not None or objs['cluster_policy'] is not None) else {}
    if p['nodes'] is not None:
        state['nodes'] = {n: state['nodes'].get(n, []) for n in p['nodes']}
    module.exit_json(changed=False, gpu_operator=state, chart_values=values, drivers=drivers)


if __name__ == '__main__':
    main()
