#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: workload_gate
short_description: Gate - run known workloads pinned to a GPU node and compare their results
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - The application-compatibility gate of an upgrade (seed 000, gate 2). Each case is a user-supplied
    Job manifest with known inputs. The gate pins it to the node with a nodeSelector (by default
    C(kubernetes.io/hostname=<node>)) and the canary toleration, and runs it O(repeat) times, one Job
    after another. By default the Jobs also tolerate the cordon (O(tolerate_cordon)).
  - From each run it reads the result from the pod's log. The result is the last non-empty line, a
    regex match (C(result.regex)) or a JSON value (C(result.json_path), read from the last JSON line).
    It is compared with the expected value, within C(tolerance) or C(tolerance_percent) for numbers.
  - The gate fails, and so does the task, on any mismatch. It also fails on any initialisation failure
    (an init container that failed, an image that cannot be pulled, a container that cannot be created,
    a crash loop), on a failed Job, or on a Job that does not finish within O(timeout). It returns each
    run's evidence either way.
  - B(Not strictly read-only.) The gate creates Jobs, labelled C(gpufleet.io/workload-gate=<run id>),
    in O(namespace). It deletes each Job and its pods after the run (O(cleanup)), so the cluster is left
    as it was and the task reports C(changed=false). With O(cleanup=false) the Jobs stay and the task
    reports C(changed=true). In check mode nothing is created and the gate is skipped.
  - Needs create, get, list and delete on Jobs, and get, list, delete and C(pods/log) get on Pods, in O(namespace).
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.k8s_auth_options
attributes:
  check_mode:
    support: partial
    details:
      - In check mode no Job is created; the gate reports what it would run and is skipped (RV(skipped=true)).
  diff_mode:
    support: none
  idempotent:
    description: Running the module twice with the same input gives the same result.
    support: full
    details:
      - Every run creates and then deletes its own Jobs; the cluster ends as it began.
options:
  node:
    description: The node the workloads must run on.
    type: str
    required: true
  namespace:
    description: Namespace of the Jobs.
    type: str
    default: default
  cases:
    description: The workload cases.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The case's name, a lowercase DNS label of at most 40 characters (it prefixes the Job names).
        type: str
        required: true
      manifest:
        description:
          - A C(batch/v1) Job manifest. Its name is replaced. The gate merges its nodeSelector and adds the
            toleration, sets C(backoffLimit) to V(0) and C(restartPolicy) to V(Never) unless given, and bounds
            C(activeDeadlineSeconds) by O(timeout).
        type: dict
        required: true
      expected:
        description: The value a correct run produces (a number, a string, or a JSON value).
        type: raw
        required: true
      tolerance:
        description: Absolute tolerance for a numeric O(cases[].expected).
        type: float
        default: 0
      tolerance_percent:
        description: Relative tolerance, in percent of O(cases[].expected); the larger of the two tolerances applies.
        type: float
        default: 0
      result:
        description:
          - Where the result is read. C(regex) takes the last match (the named group C(value), else group 1,
            else the whole match). C(json_path) takes a dotted path into the last JSON line of the log.
            Without either, the result is the last non-empty log line. C(container) names the container whose log is read.
        type: dict
        default: {}
  repeat:
    description: Runs per case.
    type: int
    default: 3
  node_selector:
    description: The nodeSelector that pins the Jobs; by default C(kubernetes.io/hostname) set to O(node).
    type: dict
  toleration:
    description: The toleration added to each Job (the canary taint's); default C(gpufleet.io/canary) C(Exists) C(NoSchedule).
    type: dict
  tolerate_cordon:
    description:
      - Add a toleration of C(node.kubernetes.io/unschedulable) so that the Jobs run on the node while it is
        still cordoned (the gates run before the uncordon).
    type: bool
    default: true
  timeout:
    description: Seconds one run may take, from creation to completion (also its C(activeDeadlineSeconds)).
    type: int
    default: 600
  poll_interval:
    description: Seconds between status reads while a run is going.
    type: float
    default: 2
  cleanup:
    description: Delete each Job and its pods after its run.
    type: bool
    default: true
notes:
  - The stop rule is conjunctive - one failed critical gate stops expansion.
seealso:
  - module: gpufleet.upgrade.node_gate
"""

EXAMPLES = r"""
---
- name: Twelve workload cases, three times each, on the canary
  gpufleet.upgrade.workload_gate:
    kubeconfig: ~/.kube/config
    node: gpu-07
    namespace: gpu-qualification
    repeat: 3
    cases:
      - name: device-query
        manifest: "{{ lookup('ansible.builtin.file', 'jobs/device-query.yml') | from_yaml }}"
        expected: "Result = PASS"
      - name: matmul
        manifest: "{{ lookup('ansible.builtin.file', 'jobs/matmul.yml') | from_yaml }}"
        result: {json_path: checksum}
        expected: 1234.5
        tolerance: 0.001
  register: workload_gate
"""

RETURN = r"""
passed:
  description: Every run of every case matched. V(null) in check mode.
  returned: always
  type: bool
  sample: true
skipped:
  description: Whether the gate was skipped (check mode).
  returned: always
  type: bool
  sample: false
msg:
  description: The verdict in one line.
  returned: always
  type: str
  sample: "workload gate: PASS on gpu-07 (2 case(s) x 3 run(s))"
problems:
  description: One line per failed run (mismatch, initialisation failure, failed Job, timeout).
  returned: always
  type: list
  elements: str
checks:
  description:
    - Each case by name with C(passed), C(problems) and C(evidence) (C(expected), tolerances, C(result), and
      C(runs) - C(attempt), C(job), C(pod), C(node), C(outcome), C(value), C(ok), C(detail), C(seconds), C(log_tail)).
  returned: always
  type: dict
jobs:
  description: Job names C(created), C(deleted), and C(left) behind.
  returned: always
  type: dict
run_id:
  description: The value of the C(gpufleet.io/workload-gate) label on this call's Jobs.
  returned: always
  type: str
node:
  description: The node.
  returned: always
  type: str
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _workload_gate
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule


def main() -> None:
    module = K8sModule('workload_gate', dict(
        node={'type': 'str', 'required': True},
        namespace={'type': 'str', 'default': 'default'},
        cases={'type': 'list', 'elements': 'dict', 'required': True, 'options': {
            'name': {'type': 'str', 'required': True},
            'manifest': {'type': 'dict', 'required': True},
            'expected': {'type': 'raw', 'required': True},
            'tolerance': {'type': 'float', 'default': 0},
            'tolerance_percent': {'type': 'float', 'default': 0},
            'result': {'type': 'dict', 'default': {}},
        }},
        repeat={'type': 'int', 'default': 3},
        node_selector={'type': 'dict'},
        toleration={'type': 'dict'},
        timeout={'type': 'int', 'default': 600},
        poll_interval={'type': 'float', 'default': 2},
        cleanup={'type': 'bool', 'default': True},
        tolerate_cordon={'type': 'bool', 'default': True},
    ))
    p = module.params
    if not p['node'].strip():
        module.fail_json(msg='node: %r is not a node name' % p['node'])
    for field, low in (('repeat', 1), ('timeout', 1)):
        if p[field] < low:
            module.fail_json(msg='%s: %r must be at least %d' % (field, p[field], low))
    if p['poll_interval'] <= 0:
        module.fail_json(msg='poll_interval: %r must be more than 0 seconds' % p['poll_interval'])
    try:
        cases = _workload_gate.normalize_cases(p['cases'])
    except _workload_gate.WorkloadGateError as exc:
        module.fail_json(msg=str(exc))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, passed=None, node=p['node'], problems=[], checks={},
                         jobs={'created': [], 'deleted': [], 'left': []}, run_id='',
                         msg='check mode: would run %d case(s) x %d on %s' % (len(cases), p['repeat'], p['node']))
    with module.errors(passed=False):
        result = _workload_gate.run_gate(
            module.client, p['node'], cases, namespace=p['namespace'], repeat=p['repeat'],
            node_selector=p['node_selector'], toleration=p['toleration'], timeout=p['timeout'],
            poll_interval=p['poll_interval'], cleanup=p['cleanup'], tolerate_cordon=p['tolerate_cordon'])
    result.update(changed=bool(result['jobs']['left']), skipped=False)
    if not result['passed']:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
