#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: qualification_info
short_description: Validate a GPUUpgradeQualification record on its own
version_added: 0.1.0
description:
  - Loads a C(GPUUpgradeQualification) record with the same strict rules as M(gpufleet.upgrade.upgrade_check)
    (at most 65,536 bytes, one YAML document, no anchors, aliases, custom tags, duplicate or unknown keys,
    exact types) and judges what can be judged without a node, for reviewers and for the CI of record
    repositories.
  - Checked are the id format, C(state=qualified), a non-blank C(approvedBy), a 40-hex C(sourceRevision), the
    record's PCI ids (well-formed, no duplicates, at least one), all three canary results true and a
    non-blank C(evidence).
  - Not checked (they need the live tuple or the clock of the upgrade) are the target tuple, the RKE2 hop,
    and the age of the canary; M(gpufleet.upgrade.upgrade_check) checks them.
  - By default an invalid record fails the task; set O(fail_on_invalid=false) to get RV(valid) and
    RV(problems) back without failing, for example to report on many records.
author:
  - gpufleet.upgrade contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
requirements:
  - PyYAML
options:
  qualification:
    description:
      - Path of the record file.
    type: path
    required: true
    aliases: [path]
  fail_on_invalid:
    description:
      - Fail the task when the record has problems. With V(false) the module always succeeds and reports
        RV(valid) and RV(problems).
    type: bool
    default: true
seealso:
  - module: gpufleet.upgrade.upgrade_check
"""

EXAMPLES = r"""
---
- name: Validate a record before asking for the second operator's approval
  gpufleet.upgrade.qualification_info:
    qualification: qualifications/v100-kernel-canary-1.yaml
  register: record

- name: Report on every record of a repository without failing
  gpufleet.upgrade.qualification_info:
    qualification: "{{ item }}"
    fail_on_invalid: false
  loop: "{{ query('ansible.builtin.fileglob', 'qualifications/*.yaml') }}"
  register: records

- name: List the invalid ones
  ansible.builtin.debug:
    msg: "{{ item.item }}: {{ item.problems | join('; ') }}"
  loop: "{{ records.results | rejectattr('valid') }}"
  loop_control:
    label: "{{ item.item }}"
"""

RETURN = r"""
valid:
  description: Whether the record loaded and has no problems.
  returned: always
  type: bool
  sample: true
problems:
  description: Every problem found; empty when valid.
  returned: always
  type: list
  elements: str
  sample:
    - approvedBy is required
    - canary checks must all pass
record:
  description:
    - The normalised record in the seed 004 schema (C(sourceRevision) and the PCI ids lowercased and trimmed
      where well-formed, C(completedAt) in UTC).
    - Returned whenever the record loads, also when the rules find problems.
  returned: when the record loads
  type: dict
  sample:
    apiVersion: kube-dc.io/v1alpha1
    kind: GPUUpgradeQualification
    id: v100-kernel-canary-1
    state: qualified
    approvedBy: platform-review
    sourceRevision: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    hardware:
      - 10de:1db6/10de:124a
    target:
      kernel: 6.8.0-135-generic
      rke2: v1.36.1+rke2r1
      driver: 580.130.00
      gpuOperator: v26.3.4
      dcgmExporter: 4.4.1-4.6.0-ubuntu22.04
    canary:
      completedAt: "2026-07-14T12:00:00Z"
      allocationPassed: true
      monitoringPassed: true
      rollbackPassed: true
      evidence: change-record-42
msg:
  description: A one-line verdict; when invalid, the problems joined with C(; ).
  returned: always
  type: str
  sample: 'GPU upgrade qualification record "v100-kernel-canary-1" is valid'
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            'qualification': {'type': 'path', 'required': True, 'aliases': ['path']},
            'fail_on_invalid': {'type': 'bool', 'default': True},
        },
        supports_check_mode=True,
    )
    if q.yaml is None:
        message = missing_required_lib('PyYAML')
        module.fail_json(msg=message, exception=q.YAML_IMPORT_ERROR, changed=False, valid=False, problems=[message])

    try:
        record, problems = q.validate_record(q.read_record_file(module.params['qualification']))
    except q.QualificationError as exc:
        record, problems = None, exc.problems

    result = {'changed': False, 'valid': not problems, 'problems': problems}
    if record is not None:
        result['record'] = record.to_dict()
    if problems:
        result['msg'] = 'GPU upgrade qualification record is invalid: ' + '; '.join(problems)
        if module.params['fail_on_invalid']:
            module.fail_json(**result)
    else:
        result['msg'] = 'GPU upgrade qualification record %s is valid' % show(record.id)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
