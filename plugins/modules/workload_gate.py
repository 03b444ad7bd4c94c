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
    reports C(changed=true). In check mode nothing is created or deleted and the gate is skipped.
  - B(Jobs of an earlier run.) Before its first Job the gate deletes, in O(namespace), the unfinished Jobs
    of an earlier gate run on the same node (labelled C(gpufleet.io/workload-gate) with another run id and
    C(gpufleet.io/node) with the node; a controller killed mid-gate never ran its cleanup, and their pods would
    hold the node's GPUs), together with their pods, and waits at most O(timeout) until those pods are gone. They
    are listed in RV(stale_jobs) and the task reports C(changed=true). Finished Jobs hold no GPU and are left
    to their C(ttlSecondsAfterFinished). When they cannot be cleared, the node fails the gate naming them (with
    O(node), no case is run).
  - Needs create, get, list and delete on Jobs, and get, list, delete and C(pods/log) get on Pods, in O(namespace).
  - B(Several nodes at once.) With O(nodes) instead of O(node) the gate runs the same cases on every node listed
    (the rollout's observation windows re-run it on every node upgraded so far). Each attempt of a case creates
    one Job per node at the same time, each pinned to its own node by C(kubernetes.io/hostname), and watches them
    all together with one list of the run's Jobs and one list of its pods per poll, however many nodes there are.
    Each attempt waits at most O(timeout). The result has each node's verdict in RV(nodes) and the failed
    ones in RV(failed_nodes); the task fails when any node fails.
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
    description:
      - The node the workloads must run on.
      - Exactly one of O(node) and O(nodes) is required.
    type: str
  nodes:
    description:
      - The nodes the workloads must run on, all at once (see the description). Distinct, non-blank node names;
        the list may not be empty.
      - Exactly one of O(node) and O(nodes) is required. O(node_selector) cannot be used with it.
    type: list
    elements: str
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
    description:
      - The nodeSelector that pins the Jobs; by default C(kubernetes.io/hostname) set to O(node).
      - Not with O(nodes) - each Job is then pinned to its own node.
    type: dict
  toleration:
    description: The toleration added to each Job (the canary taint's); default C(gpufleet.io/canary) C(Exists) C(NoSchedule).
    type: dict
  busy:
    description:
      - With O(nodes), what a run does whose pod waits because every GPU of its node is allocated (the scheduler's
        C(Insufficient nvidia.com/...)), as on nodes back in service that an observation window re-gates.
      - V(fail) - it waits out O(timeout) and fails the node. V(skip) - it is not made and fails nothing; the node's
        result lists the case under C(busy) and RV(busy_nodes) names the node (its tenants' work is using its GPUs).
    type: str
    choices: [fail, skip]
    default: fail
  tolerate_cordon:
    description:
      - Add a toleration of C(node.kubernetes.io/unschedulable) so that the Jobs run on the node while it is
        still cordoned (the gates run before the uncordon).
    type: bool
    default: true
  timeout:
    description:
      - Seconds one run may take, from creation to completion (also its C(activeDeadlineSeconds)).
      - With O(nodes), the seconds one attempt of a case may take on all the nodes together.
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

- name: An observation window - the same cases on every node upgraded so far, all at once
  gpufleet.upgrade.workload_gate:
    kubeconfig: ~/.kube/config
    nodes: "{{ upgraded_nodes }}"
    namespace: gpu-qualification
    repeat: 1
    timeout: 900
    cases:
      - name: device-query
        manifest: "{{ lookup('ansible.builtin.file', 'jobs/device-query.yml') | from_yaml }}"
        expected: "Result = PASS"
  register: observation_gate

- name: The nodes that failed the gate
  ansible.builtin.debug:
    msg: "{{ observation_gate.failed_nodes }}"
  when: observation_gate is failed
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
  description:
    - One line per failed run (mismatch, initialisation failure, failed Job, timeout).
    - With O(nodes), each line starts with the node's name.
  returned: always
  type: list
  elements: str
checks:
  description:
    - Each case by name with C(passed), C(problems) and C(evidence) (C(expected), tolerances, C(result), and
      C(runs) - C(attempt), C(job), C(pod), C(node), C(outcome), C(value), C(ok), C(detail), C(seconds), C(log_tail)).
  returned: when O(node) is given
  type: dict
jobs:
  description: Job names C(created), C(deleted), and C(left) behind (with O(nodes), those of all the nodes).
  returned: always
  type: dict
stale_jobs:
  description:
    - The unfinished Jobs of an earlier gate run on the node (with O(nodes), on any of them) that this call
      deleted before its first Job.
  returned: always
  type: list
  elements: str
  sample: [device-query-9b07e2-2]
run_id:
  description: The value of the C(gpufleet.io/workload-gate) label on this call's Jobs.
  returned: always
  type: str
node:
  description: The node.
  returned: when O(node) is given
  type: str
nodes:
  description:
    - Each node of O(nodes) by name with its own verdict, the same as the result for one O(node) - C(node),
      C(passed), C(msg), C(problems), C(checks), C(jobs), C(stale_jobs) and C(run_id).
    - Empty in check mode.
  returned: when O(nodes) is given
  type: dict
  sample:
    gpu-07:
      node: gpu-07
      passed: true
      msg: "workload gate: PASS on gpu-07 (1 case(s) x 1 run(s))"
      problems: []
      checks: {}
      jobs: {created: [device-query-3f9a1c-1-1], deleted: [device-query-3f9a1c-1-1], left: []}
      stale_jobs: []
      run_id: 3f9a1c
failed_nodes:
  description: The nodes of O(nodes) that failed the gate, in the order given.
  returned: when O(nodes) is given
  type: list
  elements: str
  sample: [gpu-08]
busy_nodes:
  description: With O(busy=skip), the nodes of O(nodes) where a run was not made for lack of a free GPU.
  returned: when O(nodes) is given
  type: list
  elements: str
  sample: []
"""

from typing import Any, Dict, List

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _workload_gate
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule


# The module's own options (the Kubernetes auth options are added) and AnsibleModule's checks; the action
# plugin runs run() with them in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    node={'type': 'str'},
    nodes={'type': 'list', 'elements': 'str'},
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
    busy={'type': 'str', 'choices': ['fail', 'skip'], 'default': 'fail'},
)
CHECKS = dict(
    mutually_exclusive=[('node', 'nodes')],
    required_one_of=[('node', 'nodes')],
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    params = module.params
    nodes = None
    if params['nodes'] is not None:
        try:
            nodes = _workload_gate.normalize_nodes(params['nodes'])
        except _workload_gate.WorkloadGateError as exc:
            module.fail_json(msg=str(exc))
        if params['node_selector'] is not None:
            module.fail_json(msg='node_selector: %r cannot be used with nodes: each Job is pinned to its own node by '
                                 'kubernetes.io/hostname' % (params['node_selector'],))
    elif not params['node'].strip():
        module.fail_json(msg='node: %r is not a node name' % params['node'])
    for field, low in (('repeat', 1), ('timeout', 1)):
        if params[field] < low:
            module.fail_json(msg='%s: %r must be at least %d' % (field, params[field], low))
    if params['poll_interval'] <= 0:
        module.fail_json(msg='poll_interval: %r must be more than 0 seconds' % params['poll_interval'])
    try:
        cases = _workload_gate.normalize_cases(params['cases'])
    except _workload_gate.WorkloadGateError as exc:
        module.fail_json(msg=str(exc))
    if nodes is not None:
        run_nodes(module, nodes, cases)
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, passed=None, node=params['node'], problems=[], checks={},
                         jobs={'created': [], 'deleted': [], 'left': []}, stale_jobs=[], run_id='',
                         msg='check mode: would run %d case(s) x %d on %s' % (len(cases), params['repeat'], params['node']))
    with module.errors(passed=False):
        result = _workload_gate.run_gate(
            module.client, params['node'], cases, namespace=params['namespace'], repeat=params['repeat'],
            node_selector=params['node_selector'], toleration=params['toleration'], timeout=params['timeout'],
            poll_interval=params['poll_interval'], cleanup=params['cleanup'], tolerate_cordon=params['tolerate_cordon'])
    result.update(changed=bool(result['jobs']['left'] or result['stale_jobs']), skipped=False)
    if not result['passed']:
        module.fail_json(**result)
    module.exit_json(**result)


def main() -> None:
    run(K8sModule('workload_gate', OPTIONS, **CHECKS))


def run_nodes(module: K8sModule, nodes: List[str], cases: List[Dict[str, Any]]) -> None:
    """The multi-node gate: exit_json, or fail_json when a node fails."""
    params = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, passed=None, nodes={}, failed_nodes=[], busy_nodes=[], problems=[],
                         jobs={'created': [], 'deleted': [], 'left': []}, stale_jobs=[], run_id='',
                         msg='check mode: would run %d case(s) x %d on %d node(s) (%s)' % (
                             len(cases), params['repeat'], len(nodes), ', '.join(nodes)))
    with module.errors(passed=False):
        result = _workload_gate.run_gate_nodes(
            module.client, nodes, cases, namespace=params['namespace'], repeat=params['repeat'], toleration=params['toleration'],
            timeout=params['timeout'], poll_interval=params['poll_interval'], cleanup=params['cleanup'],
            tolerate_cordon=params['tolerate_cordon'], busy=params['busy'])
    result.update(changed=bool(result['jobs']['left'] or result['stale_jobs']), skipped=False)
    if not result['passed']:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
