#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: intake_check
short_description: Assert that GPU intake is closed as the operator declares it
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Read-only gate for step 1 of the GPU upgrade sequence - GPU billing and tenant Pod/VM creation
    stay closed during the upgrade. What "closed" means differs per platform, so the operator
    declares it - a list of checks, each naming one Kubernetes object, one field and the values of
    that field that mean closed (for example a ResourceQuota whose C(spec.hard["requests.nvidia.com/gpu"])
    is C(0), or an admission policy binding whose C(spec.validationActions) is C([Deny])).
  - Fails when any check is open, when its object is missing, or when its field is missing (a quota
    without the GPU key does not limit GPUs). Returns per-check evidence either way.
  - The objects are given as options (read them with M(kubernetes.core.k8s_info) or the collection's
    API helpers), so this module is a pure function of its input.
  - Scalar values compare as canonical strings (C(0) equals C("0"); booleans are C(true)/C(false));
    lists and mappings compare by equality. List every spelling that means closed.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  checks:
    description: The declared closure checks. At least one.
    type: list
    elements: dict
    required: true
    suboptions:
      api_version:
        description: API version of the object, for example C(v1).
        type: str
        required: true
      kind:
        description: Kind of the object, for example C(ResourceQuota).
        type: str
        required: true
      name:
        description: Name of the object.
        type: str
        required: true
      namespace:
        description: Namespace of the object; omit for cluster-scoped objects.
        type: str
      field:
        description:
          - Dotted field path; bracket keys that contain dots or slashes and list indexes,
            for example C(spec.hard["requests.nvidia.com/gpu"]) or C(spec.validationActions[0]).
        type: str
        required: true
      closed_values:
        description: The values of I(field) that mean intake is closed.
        type: list
        elements: raw
        required: true
      description:
        description: Free text echoed in the evidence.
        type: str
  objects:
    description: The Kubernetes objects to evaluate the checks over (any others are ignored).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
---
- name: Read the intake objects
  kubernetes.core.k8s_info:
    api_version: v1
    kind: ResourceQuota
    namespace: tenant-a
    name: gpu-intake
  register: quota

- name: GPU intake must be closed
  gpufleet.upgrade.intake_check:
    checks:
      - api_version: v1
        kind: ResourceQuota
        namespace: tenant-a
        name: gpu-intake
        field: spec.hard["requests.nvidia.com/gpu"]
        closed_values: ["0"]
    objects: "{{ quota.resources }}"
  register: intake
"""

RETURN = r"""
closed:
  description: True when every check is closed.
  returned: always
  type: bool
summary:
  description: One line for the operator.
  returned: always
  type: str
  sample: "GPU intake closed: 1/1 check(s) closed"
checks:
  description:
    - Evidence per check - C(index), C(api_version), C(kind), C(namespace), C(name), C(field), C(closed_values),
      C(status) (C(closed), C(open), C(missing_object), C(missing_field)), C(closed), C(value), C(reason),
      C(uid), C(resource_version), C(description).
  returned: when the checks are well-formed
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils._intake import IntakeError, check_intake


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            checks=dict(type='list', elements='dict', required=True, options=dict(
                api_version=dict(type='str', required=True),
                kind=dict(type='str', required=True),
                name=dict(type='str', required=True),
                namespace=dict(type='str'),
                field=dict(type='str', required=True),
                closed_values=dict(type='list', elements='raw', required=True),
                description=dict(type='str'),
            )),
            objects=dict(type='list', elements='dict', required=True),
        ),
        supports_check_mode=True,
    )
    try:
        result = check_intake(module.params['checks'], module.params['objects'])
    except IntakeError as exc:
        module.fail_json(msg=str(exc), closed=False, summary=str(exc))
    checks = [c.as_dict() for c in result.checks]
    if not result.closed:
        module.fail_json(msg=result.summary, closed=False, summary=result.summary, checks=checks)
    module.exit_json(changed=False, closed=True, summary=result.summary, checks=checks)


if __name__ == '__main__':
    main()
