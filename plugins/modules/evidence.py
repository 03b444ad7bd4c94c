#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: evidence
short_description: Add to the upgrade evidence bundle and render its HTML report
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Keeps one JSON evidence bundle per rollout on the controller (run it with C(delegate_to) set to V(localhost)).
    Gates and actions add to it node identities (Node UID, machine-id, system UUID, PCI ids), the tuple before
    and after, artifact digests (driver package SHA-256, images named in the tuple), each gate's inputs and
    result, timings, batches, and the combinations left out.
  - Every entry has a key (nodes by name, artifacts by kind and name, batches by index, gates and actions by
    their C(id), omitted combinations by key); adding an entry with an existing key replaces it, so re-running
    a task does not duplicate evidence.
  - Optionally writes a self-contained HTML report (inline CSS and SVG, no external assets) with a timeline of
    batches and gates drawn as a picture, and tables of gates, nodes, artifacts and omitted combinations.
  - Writes are atomic and serialised with a lock file next to the bundle, so parallel hosts delegating to the
    controller do not lose each other's entries.
  - An action plugin of the same name does the update inside Ansible's worker when the task runs on the controller
    itself (a local connection without become, as with C(delegate_to) set to V(localhost)), with the same options,
    checks and results and without starting a module process; anywhere else it runs this module.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.mutating
attributes:
  idempotent:
    description: Adding the same entries again changes nothing.
options:
  path:
    description: The bundle file (JSON) on the controller. Created when missing (then O(id) is required).
    type: path
    required: true
  id:
    description: Bundle id when the bundle is created; lowercase letters and digits with C(.) or C(-) inside.
      Must match an existing bundle's id.
    type: str
  tuple_before:
    description: The fleet's tuple before the upgrade (keys kernel, rke2, driver, gpu_operator, dcgm_exporter).
    type: dict
  tuple_after:
    description: The target tuple (same keys as O(tuple_before)).
    type: dict
  nodes:
    description:
      - Node identities, merged field by field into the node of the same C(name). Keys C(name) (required),
        C(role) (canary, control, batch, other), C(uid) (the Kubernetes Node UID), C(machine_id), C(system_uuid),
        C(pci_ids) (list), C(batch) (index), C(tuple_before), C(tuple_after), C(labels).
      - C(measured) (bool) - V(true) says that this entry's C(tuple_after) is the tuple measured on the node
        after activation, not the declared target (the canary role records it from the node_upgrade role's
        C(node_upgrade_result.measured) through P(gpufleet.upgrade.canary_measured_nodes#filter)). It
        needs C(tuple_after), which then lists only the components that could be measured and may be empty.
        The flag belongs to the value written with it - an entry that writes another C(tuple_after) without
        C(measured=true) (a declared copy, as the canary playbook writes when it opens the bundle), or
        C(measured=false), removes it; the same value written again keeps it.
        M(gpufleet.upgrade.qualification_record) takes its target from the measured entries only.
      - A rollout's outcome for the node - C(verdict) (upgraded, failed, skipped), C(phases) (the phases it went
        through, in order), C(failed_phase), C(started) and C(finished) (RFC 3339; C(duration_s) is computed),
        C(rolled_back) (bool), C(message).
    type: list
    elements: dict
    default: []
  artifacts:
    description:
      - Artifacts with their digests. Keys C(kind) (for example V(driver-package) or V(image)) and C(name)
        (required), C(version), C(sha256) (64 hex), C(digest) (V(sha256:...), for images), C(path) (a file on
        the controller whose SHA-256 is computed when C(sha256) is not given).
    type: list
    elements: dict
    default: []
  batches:
    description: Batches of the rollout. Keys C(index) (required), C(kind) (V(canary) or V(batch)), C(nodes),
      C(started), C(finished) (RFC 3339).
    type: list
    elements: dict
    default: []
  gates:
    description:
      - Gate results. Keys C(name) and C(passed) (required), C(id) (default C(name@node#batch)), C(kind)
        (node, gpu, workload, metric, rollback, cuda, upgrade_check, ...), C(category) (allocation, monitoring,
        rollback, compatibility, health, other; derived from C(kind) when not given), C(node), C(batch),
        C(critical) (default true), C(started), C(finished), C(inputs), C(result) (for example a gate module's
        registered result), C(problems) (default C(result.problems)).
    type: list
    elements: dict
    default: []
  actions:
    description: Actions with timings. Keys C(name) (required), C(id), C(node), C(batch), C(ok) (default true),
      C(started), C(finished), C(result).
    type: list
    elements: dict
    default: []
  omitted:
    description: Combinations without a canary. Keys C(key) (required, a string or dict), C(nodes) (a count or
      the list of names), C(reason), C(blocks) (whether it blocks promotion, default true).
    type: list
    elements: dict
    default: []
  report:
    description: Write the HTML report to this path after the update.
    type: path
  lock_timeout:
    description: Seconds to wait for the bundle's lock file.
    type: int
    default: 30
  return_bundle:
    description:
      - Return the whole bundle after the update as RV(bundle). Off by default - a rollout calls this module a few
        times per node, and a bundle of a 1,000-node pool is megabytes that Ansible would carry in every task result
        and job event; RV(summary) says what it holds.
    type: bool
    default: false
seealso:
  - module: gpufleet.upgrade.metric_gate
  - module: gpufleet.upgrade.gpu_gate
  - module: gpufleet.upgrade.qualification_record
"""

EXAMPLES = r"""
---
- name: Start the canary bundle
  gpufleet.upgrade.evidence:
    path: evidence/canary-2026-07-14.json
    id: canary-2026-07-14
    tuple_before: "{{ current_tuple }}"
    tuple_after: "{{ target_tuple }}"
    artifacts:
      - kind: driver-package
        name: nvidia-driver-580-server
        version: 580.130.00-0ubuntu1
        path: repo/nvidia-driver-580-server_580.130.00-0ubuntu1_amd64.deb
      - kind: image
        name: nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04
        digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  delegate_to: localhost
  run_once: true

- name: Record the metric gate of this node
  gpufleet.upgrade.evidence:
    path: evidence/canary-2026-07-14.json
    nodes:
      - name: "{{ inventory_hostname }}"
        role: canary
        uid: "{{ node_uid }}"
        machine_id: "{{ ansible_machine_id }}"
        system_uuid: "{{ ansible_product_uuid }}"
        pci_ids: "{{ gpu.pci_ids }}"
    gates:
      - name: metrics
        kind: metric
        node: "{{ inventory_hostname }}"
        batch: 0
        passed: "{{ metrics.passed }}"
        started: "{{ gate_started }}"
        finished: "{{ now(utc=true).isoformat() }}Z"
        result: "{{ metrics }}"
    report: evidence/canary-2026-07-14.html
  delegate_to: localhost
"""

RETURN = r"""
path:
  description: The bundle file.
  returned: always
  type: str
report:
  description: The HTML report written, when O(report) was given.
  returned: when O(report) is given
  type: str
summary:
  description: Counts and verdict of the bundle after the update (gates, gates_passed, failed_critical,
    failed_noncritical, omitted, omitted_blocking, nodes, batches, artifacts_without_digest,
    tuple_artifacts_without_digest (target components with no digested artifact), stop).
  returned: success
  type: dict
bundle:
  description: The whole bundle after the update.
  returned: success, with O(return_bundle)
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence import EvidenceError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence_file import ARGUMENT_SPEC, update_bundle


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = update_bundle(module.params, check_mode=module.check_mode, diff=module._diff)
    except EvidenceError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
