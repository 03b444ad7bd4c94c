#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: rollback_decision
short_description: Decide what the rollback of one GPU node may do
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Read-only. Applies the rollback boundary to one node and returns the ordered steps the rollback
    may run and the refusals, each with a reason. It changes nothing; the C(rollback) role runs the
    steps.
  - Driver and kernel are rolled back only when the qualification record proves that rollback and no
    GPU holder is left on the node. The record is read from its file with the strict loader of
    M(gpufleet.upgrade.upgrade_check), and every rule of that gate that judges a record must pass
    (state C(qualified), an approver, a source revision, every canary check passed with evidence, its
    hardware the node's O(pci_ids), the canary neither in the future nor older than O(max_canary_age));
    its C(target) must be what the node runs now. A record the gate refuses proves no rollback.
  - RKE2 is never downgraded; the refusal points to the platform recovery procedure. GPU Operator
    and DCGM exporter are cluster-wide operands and are not rolled back per node.
  - The node stays cordoned throughout and is uncordoned only after every gate passes, and never
    when it was cordoned before the rollout.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  node:
    description: Node name.
    type: str
    required: true
  previous:
    description:
      - The tuple to roll back to (from the node's snapshot), with keys C(kernel), C(rke2), C(driver),
        C(gpu_operator), C(dcgm_exporter); unknown components may be omitted.
    type: dict
    required: true
  current:
    description: The tuple the node runs now, same keys.
    type: dict
    required: true
  qualification:
    description:
      - Path of the C(GPUUpgradeQualification) record file (seed 004 schema), read where the task runs with the
        strict loader of M(gpufleet.upgrade.upgrade_check). Without it, driver and kernel rollbacks are refused.
      - A mapping is not accepted (a lax YAML reader such as C(from_yaml) turns what the gate refuses, for example
        C(yes) or a duplicate key, into valid-looking values).
    type: path
  pci_ids:
    description:
      - The node's GPU PCI identities (C(vendor:device/subvendor:subdevice)), for example the C(pci_ids) of
        M(gpufleet.upgrade.gpu_info) in the node's snapshot. The record's C(hardware) must be the same set;
        without them driver and kernel rollbacks are refused.
    type: list
    elements: str
  max_canary_age:
    description:
      - The oldest canary completion the record may have, as for M(gpufleet.upgrade.upgrade_check).
    type: str
    default: 720h
  holders:
    description: GPU holders still on the node (Pods, VMIs, processes), for example from M(gpufleet.upgrade.gpu_holders_info).
    type: list
    elements: raw
    default: []
  was_cordoned_before:
    description: The node was unschedulable before the rollout began (then it is never uncordoned).
    type: bool
    default: false
  platform_recovery:
    description: Where the RKE2 refusal points (the platform's recovery procedure or runbook).
    type: str
"""

EXAMPLES = r"""
---
- name: Decide the rollback of the failed node
  gpufleet.upgrade.rollback_decision:
    node: gpu-a-07
    previous: {kernel: 6.8.0-134-generic, driver: 580.126.20, rke2: v1.35.3+rke2r3}
    current: {kernel: 6.8.0-135-generic, driver: 580.130.00, rke2: v1.35.3+rke2r3}
    qualification: qualification/gpu-upgrade-qualification.yaml
    pci_ids: ["10de:2330/10de:16c1"]
    holders: "{{ holders.holders | default([]) }}"
    platform_recovery: runbook RB-7 (etcd restore)
  register: decision

- name: Stop here when nothing may be rolled back
  ansible.builtin.fail:
    msg: "{{ decision.refusals | map(attribute='reason') | join('; ') }}"
  when: not decision.allowed and decision.outcome == 'refused'
"""

RETURN = r"""
node:
  description: The node.
  returned: success
  type: str
outcome:
  description: C(rollback) (every change may be undone), C(partial), C(refused) or C(nothing_to_roll_back).
  returned: success
  type: str
  sample: rollback
allowed:
  description: True when at least one restore step may run (C(rollback) or C(partial)).
  returned: success
  type: bool
steps:
  description:
    - Ordered steps, each with C(action), C(component), C(from), C(to), C(reason). Actions are
      C(keep_cordoned), C(restore_driver), C(restore_kernel), C(reboot), C(reload_driver), C(run_gates),
      C(uncordon_if_gates_pass), C(leave_cordoned), C(escalate).
  returned: success
  type: list
  elements: dict
refusals:
  description: What may not be rolled back, each with C(component), C(reason) and C(pointer) (for RKE2).
  returned: success
  type: list
  elements: dict
changed_components:
  description: The components whose version differs, each with C(from) (now) and C(to) (the snapshot).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification
from ansible_collections.gpufleet.upgrade.plugins.module_utils._rollback_policy import (
    DEFAULT_PLATFORM_RECOVERY, RollbackPolicyError, decide_rollback)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            node=dict(type='str', required=True),
            previous=dict(type='dict', required=True),
            current=dict(type='dict', required=True),
            qualification=dict(type='path'),
            pci_ids=dict(type='list', elements='str'),
            max_canary_age=dict(type='str', default=_qualification.DEFAULT_MAX_CANARY_AGE),
            holders=dict(type='list', elements='raw', default=[]),
            was_cordoned_before=dict(type='bool', default=False),
            platform_recovery=dict(type='str'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    record = None
    if p['qualification']:
        try:
            record = _qualification.read_record_file(p['qualification'])
        except _qualification.QualificationError as exc:
            module.fail_json(msg='qualification: %s' % '; '.join(exc.problems))
    try:
        decision = decide_rollback(node=p['node'], previous=p['previous'], current=p['current'],
                                   qualification=record, holders=p['holders'], pci_ids=p['pci_ids'],
                                   max_canary_age=p['max_canary_age'],
                                   was_cordoned_before=p['was_cordoned_before'],
                                   platform_recovery=p['platform_recovery'] or DEFAULT_PLATFORM_RECOVERY)
    except RollbackPolicyError as exc:
        module.fail_json(msg=str(exc))
    result = decision.as_dict()
    # `changed` is reserved by Ansible for "this task changed something": never for a decision.
    result['changed_components'] = result.pop('changed')
    result['changed'] = False
    module.exit_json(**result)


if __name__ == '__main__':
    main()
