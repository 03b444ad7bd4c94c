#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: qualification_record
short_description: Write the GPUUpgradeQualification record from a canary evidence bundle
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Reads a canary evidence bundle (M(gpufleet.upgrade.evidence)) and writes the seed-004
    C(GPUUpgradeQualification) record that M(gpufleet.upgrade.upgrade_check) gates on.
  - C(state) is V(qualified) only when, on the canary nodes (C(role=canary) or members of a batch of kind
    V(canary)) and the fleet gates of canary batches, at least one allocation, one monitoring and one rollback
    gate ran and all their critical gates passed, no other critical gate failed, a workload gate ran (a real
    allocation), and a metric gate covered every canary node (the monitoring path, the node's DCGM exporter series
    in Prometheus; the GPU gate reads NVML on the host and does not make C(monitoringPassed) true). Otherwise
    C(state) is V(failed), the reasons are returned and written as comments in the record.
  - C(approvedBy) is always written empty. The approval step belongs to a second operator, who reviews the
    evidence at C(sourceRevision) and fills C(approvedBy) in a reviewed commit of the record (or an AWX
    workflow approval node does); M(gpufleet.upgrade.upgrade_check) blocks until then.
  - C(sourceRevision) is the commit of the evidence repository that contains this exact bundle. Without
    O(source_revision) it is read with C(git) from the bundle's repository, and a bundle with uncommitted
    changes is refused.
  - C(hardware) is the set of the canary nodes' PCI ids; C(canary.completedAt) is the latest finish time of a
    canary gate.
  - Each canary claim points to the evidence that proves it, in comments of the record (the seed schema has no
    field for them) and in RV(claims) - C(completedAt) the gate that finished last, each C(*Passed) the ids of
    the gates of its category.
  - C(canary.rollbackPassed) covers every component the target changes. The canary's rollback restores the
    kernel and the driver on the node; RKE2 (never downgraded), the GPU Operator and the DCGM exporter
    (cluster-side) are declared one-way, with the reason, in the record's comments and RV(claims). A changed
    component that is neither makes C(rollbackPassed) false.
  - C(target) is the tuple measured on the canaries - each canary node's entry with C(measured=true), whose
    C(tuple_after) the canary role records from the node_upgrade role's C(node_upgrade_result.measured) after
    the node's final upgrade (P(gpufleet.upgrade.canary_measured_nodes#filter)). A C(tuple_after) without
    C(measured=true) is the declared target the canary playbook copies in when it opens the bundle, and does
    not count.
  - The module fails, naming the nodes and the components, and writes nothing, when no canary node has a
    measured tuple, when any canary node lacks one, when a measured tuple lacks a component (it could not be
    measured), when the canaries' measured tuples disagree, or when the measured tuple differs from the
    bundle's declared C(tuple.after).
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.mutating
attributes:
  idempotent:
    description: The same bundle and revision give the same record, byte for byte.
options:
  evidence:
    description: The canary evidence bundle (JSON) on the controller.
    type: path
    required: true
  dest:
    description: Where to write the record (YAML).
    type: path
    required: true
  id:
    description: Record id, lowercase letters and digits with C(.) or C(-) inside. Defaults to the bundle id.
    type: str
  source_revision:
    description: The evidence commit (40 hex). Defaults to the last commit of the bundle file, read with git.
    type: str
  evidence_ref:
    description: Value of C(canary.evidence), for example a change record. Defaults to C(<bundle id>@<revision>).
    type: str
requirements:
  - git on the controller, unless O(source_revision) is given.
seealso:
  - module: gpufleet.upgrade.evidence
  - module: gpufleet.upgrade.upgrade_check
"""

EXAMPLES = r"""
---
- name: Write the record for review (commit the bundle first)
  gpufleet.upgrade.qualification_record:
    evidence: evidence/canary-2026-07-14.json
    dest: records/canary-2026-07-14.yaml
    evidence_ref: change-record-42
  delegate_to: localhost
  run_once: true
  register: record

- name: Stop here when the canary did not qualify
  ansible.builtin.assert:
    that: record.qualified
    fail_msg: "canary not qualified: {{ record.reasons | join('; ') }}"
"""

RETURN = r"""
qualified:
  description: Whether the record's state is C(qualified).
  returned: success
  type: bool
reasons:
  description: Why the state is not C(qualified) (empty when it is).
  returned: success
  type: list
  elements: str
record:
  description: The record in the seed schema.
  returned: success
  type: dict
claims:
  description:
    - Each canary claim (C(completedAt), C(allocationPassed), C(monitoringPassed), C(rollbackPassed)) with the ids
      of the bundle's gates that prove it, and C(rollback_scope) - the components the target changes
      (C(changed)), those the canary's rollback restores (C(restored)), those declared one-way with the reason
      (C(one_way)), and those that are neither (C(uncovered)).
  returned: success
  type: dict
  sample:
    completedAt: [rollback-time@gpu-01#0]
    allocationPassed: [node@gpu-01#0]
    monitoringPassed: [gpu@gpu-01#0]
    rollbackPassed: [rollback-gpu@gpu-01#-, rollback-time@gpu-01#0]
    rollback_scope:
      changed: [kernel, rke2, driver]
      restored: [kernel, driver]
      one_way: {rke2: RKE2 is never downgraded; a failed RKE2 upgrade follows the platform recovery procedure}
      uncovered: []
content:
  description: The YAML written.
  returned: success
  type: str
dest:
  description: The record file.
  returned: success
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text

from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence import EvidenceError, loads
from ansible_collections.gpufleet.upgrade.plugins.module_utils._fsio import read_text, write_text
from ansible_collections.gpufleet.upgrade.plugins.module_utils._qualification_record import (
    RecordError, build_record, claim_comments, claim_evidence, dump_yaml)


def _git_revision(module, path):
    git = module.get_bin_path('git')
    if not git:
        module.fail_json(msg='qualification_record: git is not installed; give source_revision')
    directory, name = os.path.split(os.path.abspath(path))
    rc, out, err = module.run_command([git, '-C', directory, 'status', '--porcelain', '--', name])
    if rc != 0:
        module.fail_json(msg='qualification_record: %s is not in a git repository (%s); commit the evidence or '
                             'give source_revision' % (path, err.strip()))
    if out.strip():
        module.fail_json(msg='qualification_record: %s has uncommitted changes: commit the evidence first, so that '
                             'sourceRevision names a commit containing exactly this bundle' % path)
    rc, out, err = module.run_command([git, '-C', directory, 'log', '-1', '--format=%H', '--', name])
    if rc != 0 or not out.strip():
        module.fail_json(msg='qualification_record: %s is not committed: commit the evidence first' % path)
    return out.strip()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            evidence=dict(type='path', required=True),
            dest=dict(type='path', required=True),
            id=dict(type='str'),
            source_revision=dict(type='str'),
            evidence_ref=dict(type='str'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        with open(p['evidence'], 'rb') as handle:
            text = to_text(handle.read(), errors='surrogate_or_strict')
    except (IOError, OSError) as exc:
        module.fail_json(msg='qualification_record: cannot read evidence %s: %s' % (p['evidence'], exc))
    revision = p['source_revision'] or _git_revision(module, p['evidence'])
    try:
        bundle = loads(text, p['evidence'])
        record, reasons = build_record(bundle, revision, p['id'], p['evidence_ref'])
        claims = claim_evidence(bundle)
    except (EvidenceError, RecordError) as exc:
        module.fail_json(msg='qualification_record: %s' % exc)
    content = dump_yaml(record, reasons, claim_comments(claims, bundle['id']))
    old = read_text(p['dest'], 'surrogateescape')
    changed = old != content
    if changed and not module.check_mode:
        directory = os.path.dirname(os.path.abspath(p['dest']))
        if not os.path.isdir(directory):
            module.fail_json(msg='qualification_record: directory %s of dest does not exist' % directory)
        write_text(p['dest'], content, makedirs=False, prefix='.record-')
    result = dict(changed=changed, qualified=record['state'] == 'qualified', reasons=reasons, record=record,
                  claims=claims, content=content, dest=p['dest'])
    if module._diff:
        result['diff'] = dict(before=old or '', after=content, before_header=p['dest'], after_header=p['dest'])
    module.exit_json(**result)


if __name__ == '__main__':
    main()
