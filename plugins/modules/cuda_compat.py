#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cuda_compat
short_description: Gate - declared CUDA applications against a target NVIDIA driver
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Checks each declared application, in this order, for backward compatibility (the driver is at or
    above the driver its CUDA toolkit shipped with), minor-version compatibility within its CUDA major
    family (the driver is at or above the family minimum - V(580.65.06) for 13.x, V(525.60.13) for 12.x,
    V(450.80.02) for 11.x; a limited feature set, to be tested explicitly on the canary), and forward
    compatibility (the C(cuda-compat-<major>-<minor>) package in the image, supported on data-center
    GPUs only).
  - An application that JIT-compiles PTX from a toolkit newer than the driver's CUDA version is flagged
    (C(ptx_newer_than_driver)) and incompatible - the driver's JIT rejects it with C(cudaErrorUnsupportedPtxVersion).
  - A read-only gate - the task fails when any application is incompatible, and returns the evidence either way.
  - Data from NVIDIA's CUDA Toolkit release notes (13.2 Update 2, Tables 2 and 3) and the CUDA
    Compatibility guide, kept in one file of the collection (C(plugins/module_utils/_cuda_data.py)).
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  applications:
    description: The applications that will run on the upgraded nodes.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The application's name.
        type: str
        required: true
      toolkit:
        description: The CUDA toolkit it was built with - V(12.4), V(12.4.1) or V(12.4U1).
        type: str
        required: true
      ptx_jit:
        description: It JIT-compiles PTX at run time (no SASS for the GPU, or JIT by design).
        type: bool
        default: false
      forward_compat:
        description: Its image carries the C(cuda-compat) forward-compatibility package for its toolkit.
        type: bool
        default: false
  driver:
    description: The target NVIDIA driver version, for example V(580.126.20).
    type: str
    required: true
  gpu_class:
    description: The GPUs' class; forward compatibility is supported only on V(datacenter), V(ngc-server-ready-rtx) and V(jetson).
    type: str
    default: other
    choices: [datacenter, ngc-server-ready-rtx, jetson, other]
seealso:
  - plugin: gpufleet.upgrade.cuda_compat
    plugin_type: filter
  - plugin: gpufleet.upgrade.cuda_minimum_driver
    plugin_type: filter
"""

EXAMPLES = r"""
---
- name: Every declared application runs on the target driver
  gpufleet.upgrade.cuda_compat:
    driver: 580.126.20
    gpu_class: datacenter
    applications:
      - {name: triton, toolkit: '12.8'}
      - {name: trainer, toolkit: 13.1.1, ptx_jit: true}
  register: cuda
"""

RETURN = r"""
passed:
  description: No application is incompatible.
  returned: always
  type: bool
  sample: false
driver:
  description: The target driver.
  returned: always
  type: str
  sample: 580.126.20
driver_cuda:
  description: The newest CUDA version the driver supports (null when older than the table).
  returned: always
  type: str
  sample: '13.0'
gpu_class:
  description: The GPU class used for forward compatibility.
  returned: always
  type: str
  sample: datacenter
applications:
  description: One verdict per application, in input order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The application.
      type: str
    toolkit:
      description: Its toolkit, normalised (V(12.4U1)).
      type: str
    status:
      description: V(backward), V(minor_version), V(forward) or V(incompatible).
      type: str
    compatible:
      description: Whether it is expected to run.
      type: bool
    flags:
      description: V(limited_feature_set), V(ptx_newer_than_driver), V(forward_compat_package), V(toolkit_not_in_table), V(family_not_in_table).
      type: list
      elements: str
    reasons:
      description: The arithmetic in words.
      type: list
      elements: str
    minimum_driver:
      description: C(backward) (the driver its toolkit shipped with) and C(minor_version) (its family minimum).
      type: dict
  sample:
    - name: trainer
      toolkit: 13.1U1
      status: incompatible
      compatible: false
      flags: [limited_feature_set, ptx_newer_than_driver]
incompatible:
  description: Names of the incompatible applications.
  returned: always
  type: list
  elements: str
  sample: [trainer]
minor_version:
  description: Names of the applications that rely on minor-version compatibility (test them on the canary).
  returned: always
  type: list
  elements: str
  sample: []
forward:
  description: Names of the applications that rely on the forward-compatibility package.
  returned: always
  type: list
  elements: str
  sample: []
flagged:
  description: Names of the applications whose PTX is newer than the driver's JIT.
  returned: always
  type: list
  elements: str
  sample: [trainer]
source:
  description: Where the data comes from.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils._cuda_compat import CudaCompatError, GPU_CLASSES, check


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            applications=dict(type='list', elements='dict', required=True, options=dict(
                name=dict(type='str', required=True),
                toolkit=dict(type='str', required=True),
                ptx_jit=dict(type='bool', default=False),
                forward_compat=dict(type='bool', default=False),
            )),
            driver=dict(type='str', required=True),
            gpu_class=dict(type='str', default='other', choices=list(GPU_CLASSES)),
        ),
        supports_check_mode=True,
    )
    try:
        result = check(module.params['applications'], module.params['driver'], module.params['gpu_class'])
    except CudaCompatError as exc:
        module.fail_json(msg=str(exc))
    if not result['passed']:
        bad = [a for a in result['applications'] if not a['compatible']]
        module.fail_json(msg='CUDA compatibility gate failed for driver %s: %s' % (
            result['driver'], '; '.join('%s (CUDA %s): %s' % (a['name'], a['toolkit'], ' '.join(a['reasons']))
                                        for a in bad)), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
