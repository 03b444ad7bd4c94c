#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: upgrade_check
short_description: Read-only gate before a GPU node upgrade that refuses any tuple but the qualified one
version_added: 0.1.0
description:
  - Compares the live GPU node tuple (PCI ids, kernel, RKE2, NVIDIA driver, GPU Operator, DCGM exporter)
    with a reviewed C(GPUUpgradeQualification) record, and passes only when the target tuple is exactly the
    one a canary qualified, the hardware is exactly the qualified hardware, the canary evidence is complete,
    approved and fresh, and the RKE2 hop neither downgrades nor skips a Kubernetes minor.
  - Run it immediately before a System Upgrade Controller plan is created or changed. It never labels,
    cordons, drains, restarts, patches or applies anything, and never reports C(changed).
  - Every problem is collected; a block fails the task with C(GPU upgrade blocked:) followed by the problems
    joined with C(; ), and still returns RV(passed=false) and RV(problems).
  - A PASS permits only the reviewed serialized canary/upgrade plan. It is not blanket authorization for
    parallel node upgrades.
  - The record is read on the host the module runs on; run it on the controller (delegate it to C(localhost)
    in a play that targets GPU nodes).
  - See C(docs/upgrade_check.md) in the collection for the record schema and every rule.
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
      - Path of the C(GPUUpgradeQualification) record file (YAML, at most 65,536 bytes, one document,
        no anchors, aliases, custom tags, duplicate or unknown keys).
    type: path
    required: true
  pci_ids:
    description:
      - The PCI hardware ids collected from the node by accelerator discovery, each
        C(vendor:device/subvendor:subdevice) in hex (for example C(10de:1db6/10de:124a)).
      - An item may hold several comma-separated ids. Ids are trimmed and lowercased; malformed or duplicate
        ids block, and the set must equal the record's C(hardware) exactly.
    type: list
    elements: str
    required: true
  current:
    description:
      - The tuple the node runs now, collected from the host and the Kubernetes API.
    type: dict
    required: true
    suboptions: &tuple
      kernel:
        description: Kernel release, for example C(6.8.0-134-generic).
        type: str
        required: true
      rke2:
        description: RKE2 version C(v1.MINOR.PATCH+rke2rREV); the leading C(v) is optional, pre-releases are refused.
        type: str
        required: true
      driver:
        description: NVIDIA driver version, for example C(580.126.20).
        type: str
        required: true
      gpu_operator:
        description: NVIDIA GPU Operator version, for example C(v26.3.3).
        type: str
        required: true
      dcgm_exporter:
        description: DCGM exporter version, for example C(4.4.1-4.6.0-ubuntu22.04).
        type: str
        required: true
  target:
    description:
      - The tuple the upgrade would install. Every value must equal the record's C(target) byte for byte.
    type: dict
    required: true
    suboptions: *tuple
  max_canary_age:
    description:
      - How old the canary evidence may be, as a whole number with unit C(s), C(m), C(h) or C(d)
        (C(720h), C(30d), C(90m)). Evidence exactly this old passes; zero or negative blocks.
      - Never raise it to extend stale evidence for convenience; rerun the canary when the tuple or the
        environment has changed. A value above C(720h) adds a warning.
    type: str
    default: 720h
notes:
  - The canary completion time may be at most 5 minutes in the future (clock skew).
  - Kernel, driver, GPU Operator and DCGM exporter are not ordered; any qualified value passes, downgrades
    included. RKE2 may only stay, take a patch or revision, or move one Kubernetes minor up.
seealso:
  - module: gpufleet.upgrade.qualification_info
  - plugin: gpufleet.upgrade.rke2_version
    plugin_type: filter
  - plugin: gpufleet.upgrade.pci_id
    plugin_type: filter
"""

EXAMPLES = r"""
---
- name: Gate the upgrade of the V100 pool on its qualification record
  gpufleet.upgrade.upgrade_check:
    qualification: /srv/gpu-qualifications/v100-kernel-canary-1.yaml
    pci_ids:
      - 10de:1db6/10de:124a
    current:
      kernel: 6.8.0-134-generic
      rke2: v1.35.3+rke2r3
      driver: 580.126.20
      gpu_operator: v26.3.3
      dcgm_exporter: 4.4.1-4.6.0-ubuntu22.04
    target:
      kernel: 6.8.0-135-generic
      rke2: v1.36.1+rke2r1
      driver: 580.130.00
      gpu_operator: v26.3.4
      dcgm_exporter: 4.4.1-4.6.0-ubuntu22.04
  delegate_to: localhost
  register: gate

- name: Show what the PASS permits
  ansible.builtin.debug:
    msg: "{{ gate.msg }}"
"""

RETURN = r"""
passed:
  description: Whether the gate passed.
  returned: always
  type: bool
  sample: true
problems:
  description: Every problem found, in rule order; empty on PASS.
  returned: always
  type: list
  elements: str
  sample:
    - hardware tuple mismatch
    - driver target "580.130.01" is not the qualified value "580.130.00"
qualification:
  description: The record that passed.
  returned: when passed
  type: dict
  contains:
    id:
      description: The record's id.
      type: str
      returned: when passed
      sample: v100-kernel-canary-1
    approved_by:
      description: The second operator who approved the evidence.
      type: str
      returned: when passed
      sample: platform-review
    source_revision:
      description: The evidence revision (40 hex characters, lowercased).
      type: str
      returned: when passed
      sample: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    completed_at:
      description: When the canary completed, RFC 3339 in UTC.
      type: str
      returned: when passed
      sample: "2026-07-14T12:00:00Z"
msg:
  description:
    - "On PASS, begins with C(GPU upgrade gate: PASS) and ends with the reminder that a PASS permits only the
      reviewed serialized canary/upgrade plan."
    - "On a block, C(GPU upgrade blocked: ) followed by the problems joined with C(; )."
  returned: always
  type: str
  sample: >-
    GPU upgrade gate: PASS: qualification "v100-kernel-canary-1" approved by "platform-review", source revision
    aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, canary completed 2026-07-14T12:00:00Z. A PASS permits only the
    reviewed serialized canary/upgrade plan.
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _duration
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification

_TUPLE_OPTIONS = {name: {'type': 'str', 'required': True} for name in _qualification.MODULE_COMPONENTS}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            'qualification': {'type': 'path', 'required': True},
            'pci_ids': {'type': 'list', 'elements': 'str', 'required': True},
            'current': {'type': 'dict', 'required': True, 'options': dict(_TUPLE_OPTIONS)},
            'target': {'type': 'dict', 'required': True, 'options': dict(_TUPLE_OPTIONS)},
            'max_canary_age': {'type': 'str', 'default': _qualification.DEFAULT_MAX_CANARY_AGE},
        },
        supports_check_mode=True,
    )
    if _qualification.yaml is None:
        message = missing_required_lib('PyYAML')
        module.fail_json(msg=message, exception=_qualification.YAML_IMPORT_ERROR, changed=False, passed=False,
                         problems=[message])

    p = module.params
    try:
        seconds = _duration.parse(p['max_canary_age'], 'max_canary_age')
    except ValueError:
        pass  # the gate reports it as a problem
    else:
        if seconds > _duration.parse(_qualification.DEFAULT_MAX_CANARY_AGE):
            module.warn('max_canary_age %s is longer than the default %s: never extend stale evidence for convenience; '
                        'rerun the canary when the tuple or the environment has changed.'
                        % (p['max_canary_age'], _qualification.DEFAULT_MAX_CANARY_AGE))
    try:
        record_text = _qualification.read_record_file(p['qualification'])
    except _qualification.QualificationError as exc:
        result = _qualification.GateResult(False, exc.problems)
    else:
        result = _qualification.check_gate(record_text, p['pci_ids'], p['current'], p['target'], p['max_canary_age'])

    if result.passed:
        module.exit_json(changed=False, passed=True, problems=[], qualification=result.qualification, msg=result.msg)
    module.fail_json(msg=result.msg, changed=False, passed=False, problems=result.problems)


if __name__ == '__main__':
    main()
