#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_gate
short_description: Gate an upgraded GPU node on its NVML health against the pre-upgrade snapshot
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Read-only. Judges the facts that M(gpufleet.upgrade.gpu_info) returns on the node after the upgrade
    against the same facts taken before it (the snapshot). Every check must pass; one failure fails the task.
  - V(driver) the loaded driver version equals O(target_driver), byte for byte.
  - V(pci_identity) the set of PCI ids, and the GPU at each bus id, are unchanged from the baseline (a GPU
    that fell off the bus is caught even when identical GPUs keep the id set unchanged).
  - V(xid) no Xid event that is not in the baseline at or above O(xid_severity_threshold); codes with no
    catalog entry (severity C(unknown)) count as C(high).
  - Without O(facts) the module reads them itself on the node it runs on, as M(gpufleet.upgrade.gpu_info) does
    (without the package list) - one task instead of two, used by the rollout's observation window to re-gate
    every node upgraded so far.
  - With O(facts) given, nothing is read on the node - an action plugin of the same name judges them on the
    controller, inside Ansible's worker, with the same options, checks and result, and sends no module to the node.
  - V(ecc) the uncorrected ECC count did not grow on any GPU (aggregate counts persist across driver reloads;
    a lower volatile count is a counter reset). A GPU with ECC enabled but no readable count fails.
  - V(row_remap) no row-remapping failure, no remap pending and no retired page pending.
  - V(temperature) every GPU strictly below O(temperature_max); an unreadable temperature fails.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  facts:
    description:
      - The C(gpu_info) facts of the node now (the dict that M(gpufleet.upgrade.gpu_info) returns).
      - Omitted, the module reads them on the node it runs on (NVML through O(backend), Xids from O(kernel_log)).
    type: dict
  backend:
    description: How to read the GPUs when O(facts) is omitted (as M(gpufleet.upgrade.gpu_info)'s option).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  kernel_log:
    description:
      - Where to read Xid events when O(facts) is omitted (as M(gpufleet.upgrade.gpu_info)'s option) - V(journal),
        V(dmesg), V(none) or an absolute file path.
    type: str
    default: journal
  xid_since:
    description: Which Xid events to read when O(facts) is omitted (as M(gpufleet.upgrade.gpu_info)'s option).
    type: str
    default: boot
  baseline:
    description: The C(gpu_info) facts taken before the upgrade (the snapshot).
    type: dict
    required: true
  target_driver:
    description: The driver version of the target tuple, for example V(580.130.00).
    type: str
    required: true
  xid_severity_threshold:
    description: Lowest severity of a new Xid event that fails the gate.
    type: str
    choices: [low, medium, high, critical]
    default: medium
  temperature_max:
    description: Every GPU must be below this temperature (Celsius).
    type: float
    default: 85
  skip:
    description: Checks not to run (recorded as skipped in the result), for example V(ecc) on GPUs without ECC.
    type: list
    elements: str
    choices: [driver, pci_identity, xid, ecc, row_remap, temperature]
    default: []
seealso:
  - module: gpufleet.upgrade.gpu_info
  - module: gpufleet.upgrade.metric_gate
  - module: gpufleet.upgrade.evidence
"""

EXAMPLES = r"""
---
- name: Read the GPUs after the upgrade
  gpufleet.upgrade.gpu_info:
  register: gpu_now

- name: Judge them against the snapshot taken before the upgrade
  gpufleet.upgrade.gpu_gate:
    facts: "{{ gpu_now }}"
    baseline: "{{ snapshot.gpu }}"
    target_driver: "{{ target_tuple.driver }}"
    xid_severity_threshold: medium
    temperature_max: 85
  register: gpu_gate
"""

RETURN = r"""
passed:
  description: Whether every check passed.
  returned: always
  type: bool
msg:
  description: Verdict line; on failure every problem.
  returned: always
  type: str
problems:
  description: Every problem found.
  returned: always
  type: list
  elements: str
facts:
  description: The facts the module read on the node (only when O(facts) was omitted).
  returned: when the module read the facts itself
  type: dict
checks:
  description: Per check (driver, pci_identity, xid, ecc, row_remap, temperature) its C(passed), C(skipped),
    C(problems) and C(evidence) (for example the new Xid events, the ECC deltas per GPU, the temperatures).
  returned: when the input is valid
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost, _nvml, _xid
from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_gate import ARGUMENT_SPEC, judge


def read_facts(module):
    """The node's facts as gpu_info reads them (no package list); a clear failure when they cannot be read."""
    kernel_log = module.params['kernel_log']
    if kernel_log in ('none', ''):
        kernel_log = None
    elif kernel_log not in ('journal', 'dmesg') and not kernel_log.startswith('/'):
        module.fail_json(msg='GPU gate: kernel_log=%r: expected journal, dmesg, none or an absolute file path' % kernel_log,
                         passed=False, problems=['kernel_log=%r is not valid' % kernel_log])
    try:
        return _nvml.collect_facts(backend=module.params['backend'], runner=_gpuhost.ModuleRunner(module),
                                   kernel_log=kernel_log, xid_since=module.params['xid_since'], packages=False, require_driver=True)
    except (_nvml.MissingBackend, _nvml.BackendError, _gpuhost.HostError, _xid.SinceError) as exc:
        msg = 'GPU gate: cannot read the GPUs on this node: %s' % exc
        module.fail_json(msg=msg, passed=False, problems=[msg])
    return None


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    facts = p['facts'] if p['facts'] is not None else read_facts(module)
    result = judge(facts, p)
    if result.get('failed'):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
