#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: upgrade_plan
short_description: Plan a GPU-node upgrade - matrix, canaries, batches and the availability budget
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Groups the nodes into material combinations (GPU PCI identity, server platform, kernel line,
    partition/MIG mode, driver install method by default) and writes the upgrade matrix, each
    combination with its nodes and its source tuple(s) and the target tuple.
  - Picks at least O(canaries_per_combination) Ready canaries per combination, preferring nodes with
    no GPU holders and not already cordoned. A combination without a canary is listed as omitted and,
    with O(omitted_block=true), the plan refuses.
  - Cuts the nodes into batches, canaries first, each batch at most O(batch_size) nodes.
  - Checks every batch against the availability budget, computed separately from the batch size -
    nodes out of service now (cordoned, NotReady, canaries still isolated) plus the batch's in-service
    nodes must stay at or below O(max_unavailable), and the capacity in service must stay at or above
    O(failure_allowance). A batch that would break it is shrunk; a plan that cannot proceed fails
    with the reason.
  - Percentages are of the pool (every node given, including excluded and up-to-date ones) and round
    down, as Kubernetes does for C(maxUnavailable); the batch size is at least 1 and a
    O(max_unavailable) that resolves to 0 refuses. Failure-allowance percentages round up (a floor
    to keep must not shrink).
  - Read-only and deterministic; the same input gives the same plan and the same RV(digest).
  - See C(docs/planning.md) in the collection for the arithmetic and the stop rule.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  nodes:
    description:
      - The pool's nodes. Each is a dict with C(name) (str), C(pci_ids) (list of
        C(vendor:device/subvendor:subdevice) strings), C(platform) (str), C(kernel) (str, the running
        kernel release), C(partition_mode) (str, for example C(none) or a MIG profile),
        C(install_method) (str), C(current) (dict, the current tuple), C(ready) (bool),
        C(unschedulable) (bool), C(gpus) (int, GPU capacity) and optionally C(holders) (int, GPU
        workloads on the node) and C(labels) (dict, for C(label:<name>) combination keys).
    type: list
    elements: dict
    required: true
  target:
    description:
      - The target tuple (for example C(kernel), C(rke2), C(driver), C(gpu_operator), C(dcgm_exporter)).
      - A node whose C(current) tuple already has every value of O(target) is up to date and not batched.
        An empty target plans every node.
    type: dict
    default: {}
  canaries_per_combination:
    description: Canaries wanted per combination. A combination with fewer Ready nodes is reported in RV(undersampled).
    type: int
    default: 1
  batch_size:
    description: Most nodes one batch upgrades, a count (V(4)) or a percentage of the pool (V(10%)), rounded down, at least 1.
    type: raw
    default: 10%
  max_unavailable:
    description:
      - Most nodes out of service while a batch runs, a count or a percentage of the pool (rounded down).
      - Counted from the nodes actually out of service (cordoned, NotReady, canaries still isolated) plus
        the batch's nodes that are still in service. A value that resolves to 0 refuses.
    type: raw
    default: 25%
  failure_allowance:
    description: Capacity that must stay in service while any batch runs (the workload's failure allowance).
    type: dict
    suboptions:
      nodes:
        description: Nodes that must stay in service, a count or a percentage of the pool (rounded up).
        type: raw
      gpus:
        description: GPUs that must stay in service, a count or a percentage of the pool's GPUs (rounded up).
        type: raw
  combination_keys:
    description:
      - Which facts make a combination material. C(kernel_line) is the kernel release's major.minor
        (V(6.8) for V(6.8.0-134-generic)); C(kernel) is the exact release; C(kernel_flavour) is the
        Ubuntu flavour suffix (V(generic), V(nvidia)); C(label:<name>) is a node label.
    type: list
    elements: str
    default: [pci_ids, platform, kernel_line, partition_mode, install_method]
  exclude:
    description: Node names or shell-style globs left out of the rollout. They still count in the pool and its budget.
    type: list
    elements: str
    default: []
  omitted_block:
    description: Refuse the plan when a combination has no canary. V(false) accepts the omission, lists it and warns.
    type: bool
    default: true
  drain_policy:
    description:
      - What every drain of the canary and the rollout may do to pods C(kubectl drain) refuses by default, recorded
        normalized in the plan (its C(drain), covered by its digest) and applied by M(gpufleet.upgrade.node_drain)
        (its O(gpufleet.upgrade.node_drain#module:policy)).
      - C(local_data) (V(memory), the default - memory-backed emptyDir such as C(/dev/shm) deleted, disk-backed refused;
        V(delete); V(refuse)), C(unmanaged_pods) (V(refuse), the default; V(delete)), C(grace_period) (seconds; null - each
        pod's own) and C(rules), each with C(namespaces) (names or globs) and/or C(selector) (equality-based) and any of
        the three, the first matching rule winning over the defaults. An unknown key or value fails, naming it.
    type: dict
  source_drift:
    description:
      - What a combination becomes whose nodes run different current tuples (source-tuple drift, for example
        kernel V(6.8.0-131-generic) next to V(6.8.0-134-generic), RKE2 V(v1.35.1+rke2r1) next to V(v1.35.1+rke2r2),
        or two driver patches). A canary qualifies one exact source tuple and the rollout's gate checks one, so
        such a combination is never planned as one.
      - V(refuse) fails the plan, naming the combination, the differing fields and the nodes of each source tuple.
      - V(split) makes each source tuple its own combination with its own canary(ies). Its C(key) gains
        C(source.<field>) entries for the differing fields and its C(id) the same C(|source.<field>=<value>) parts.
        Each part counts as a combination for O(canaries_per_combination) and O(omitted_block).
      - Either way the drift is listed in RV(source_drift) and in the summary.
      - V(refuse) is the default - a split adds canaries (and, with O(canaries_isolated), holds more of the
        availability budget) that nobody asked for; and the canary and rollout playbooks name a qualification
        record by PCI identity, so parts of one GPU model share a record path (see C(docs/planning.md)).
    type: str
    choices: [refuse, split]
    default: refuse
  single_node_pool_acknowledged:
    description:
      - A pool of a single node plans only with this set, acknowledging that its GPU capacity goes
        offline for the maintenance window.
      - With it, a percentage O(max_unavailable) that rounds down to 0 becomes 1 (the whole pool); an
        explicit V(0) (or V(0%)) still refuses.
    type: bool
    default: false
  canaries_isolated:
    description:
      - Canaries stay isolated (labelled, tainted, out of service for production) until the rollout
        ends, and count against O(max_unavailable) for every later batch. V(false) returns them to
        service after the canary phase.
    type: bool
    default: true
  pause_before:
    description:
      - Pause points - the batches (numbered from 1, as the plan's summary numbers them) that do not start before
        someone approves them. The rollout waits, bounded, for each one's approval ConfigMap (see
        M(gpufleet.upgrade.pause_approval_info)); the approval is bound to this plan's digest.
      - A number that is not a batch of the plan refuses the plan.
    type: list
    elements: int
    default: []
  observation:
    description:
      - The observation window after each stage (the canaries, each batch), declared in the plan so that it is
        reviewed with it. Keys C(window) (a duration; without it the run's C(gpufleet_observation_window)) and
        C(queries) - M(gpufleet.upgrade.metric_gate) queries run at the end of every window over the nodes
        upgraded so far, with the node presets. Declare the minimum traffic there (C(count_expr) and
        C(min_count) - transactions, steps or job completions in the window; C($window) is the window) and the
        control group on the previous driver (C(control)).
      - Key C(workloads) - C(cases) (workload case names, of the shipped suite or C(node_upgrade_workload_cases)) and
        C(repeat) (default 1) - the workload cases re-run at the end of every window on every node upgraded so far.
        Without it no window schedules a Job on the nodes in service.
      - Validated as M(gpufleet.upgrade.metric_gate) validates its queries; a bad one refuses the plan.
    type: dict
seealso:
  - plugin: gpufleet.upgrade.upgrade_plan
    plugin_type: filter
notes:
  - The stop rule is conjunctive - one failed critical gate stops expansion even if aggregate
    throughput looks normal. The plan lists batches; the rollout stops at the first failed gate.
"""

EXAMPLES = r"""
---
- name: Plan the driver upgrade of the H100/A100 pool
  gpufleet.upgrade.upgrade_plan:
    nodes: "{{ gpu_nodes }}"
    target:
      driver: 580.126.20
      gpu_operator: v26.3.4
    canaries_per_combination: 2
    batch_size: 10%
    max_unavailable: 20%
    failure_allowance:
      gpus: 60%
  register: plan

- name: Show the arithmetic
  ansible.builtin.debug:
    msg: "{{ plan.summary }}"

- name: Plan a one-node pool, accepting that its GPUs go offline
  gpufleet.upgrade.upgrade_plan:
    nodes: "{{ [lab_node] }}"
    target: {driver: 580.126.20}
    single_node_pool_acknowledged: true
"""

RETURN = r"""
combinations:
  description: The upgrade matrix, one entry per material combination, in a stable order.
  returned: success
  type: list
  elements: dict
  contains:
    id:
      description: The combination as C(key=value|...).
      type: str
    key:
      description: The combination's values by key.
      type: dict
    nodes:
      description: Its nodes to upgrade, in natural name order.
      type: list
      elements: str
    count:
      description: Number of nodes.
      type: int
    gpus:
      description: GPU capacity of its nodes.
      type: int
    canaries:
      description: Its canaries.
      type: list
      elements: str
    source_tuples:
      description: The distinct current tuples of its nodes.
      type: list
      elements: dict
    target:
      description: The target tuple.
      type: dict
  sample:
    - id: pci_ids=10de:2330/10de:16c1|platform=SYS-821GE|kernel_line=6.8|partition_mode=none|install_method=apt
      key: {pci_ids: 10de:2330/10de:16c1, platform: SYS-821GE, kernel_line: '6.8', partition_mode: none, install_method: apt}
      nodes: [gpu-01, gpu-02]
      count: 2
      gpus: 16
      canaries: [gpu-01]
      source_tuples: [{driver: 570.172.08}]
      target: {driver: 580.126.20}
source_drift:
  description:
    - The combinations (by O(combination_keys)) whose nodes run different current tuples, each with C(id), C(key),
      C(components) (the tuple fields whose values differ), C(sources) (each source tuple with its C(nodes)) and
      C(action) (V(refuse) or V(split), O(source_drift)). Empty without drift.
  returned: success
  type: list
  elements: dict
  sample:
    - id: pci_ids=10de:2330/10de:16c1|platform=SYS-821GE|kernel_line=6.8|partition_mode=none|install_method=apt
      key: {pci_ids: 10de:2330/10de:16c1, platform: SYS-821GE, kernel_line: '6.8', partition_mode: none, install_method: apt}
      components: [kernel]
      sources:
        - {tuple: {kernel: 6.8.0-131-generic, driver: 570.172.08}, nodes: [gpu-03]}
        - {tuple: {kernel: 6.8.0-134-generic, driver: 570.172.08}, nodes: [gpu-01, gpu-02]}
      action: split
canaries:
  description: Canary node names, in natural order; they make up the first batch(es).
  returned: success
  type: list
  elements: str
  sample: [gpu-01, gpu-21]
omitted:
  description: Combinations without a canary, with their node count and the reason.
  returned: success
  type: list
  elements: dict
  sample: []
undersampled:
  description: Combinations with fewer canaries than asked for (fewer Ready nodes).
  returned: success
  type: list
  elements: dict
  sample: []
excluded:
  description: Nodes left out by O(exclude).
  returned: success
  type: list
  elements: str
  sample: []
up_to_date:
  description: Nodes already on the target tuple.
  returned: success
  type: list
  elements: str
  sample: []
batches:
  description: Ordered batches of node names; every node to upgrade appears exactly once, canaries first.
  returned: success
  type: list
  elements: list
  sample: [[gpu-01, gpu-21], [gpu-02, gpu-03, gpu-04, gpu-05]]
pauses:
  description: The pause points, O(pause_before) sorted - batch numbers (from 1) that wait for an approval.
  returned: success
  type: list
  elements: int
  sample: [3]
observation:
  description: The observation settings, O(observation) as validated (V({}) when not given).
  returned: success
  type: dict
  sample: {window: 2h, queries: [{name: inference-traffic, expr: 'sum(rate(requests_total[5m]))', limit: 1e9,
           direction: any, count_expr: 'sum(increase(requests_total[$window]))', min_count: 10000}]}
batch_size:
  description: The resolved batch size.
  returned: success
  type: int
  sample: 4
max_unavailable:
  description: The resolved maximum of nodes out of service.
  returned: success
  type: int
  sample: 8
budget:
  description:
    - The arithmetic - pool size, each limit with its rule (V(10% of 40 = 4, rounded down = 4)), the
      nodes out of service now and why, and one step per batch (out of service before, taken out,
      unavailable during, in-service nodes and GPUs during, the limit that closed the batch, shrunk).
  returned: success
  type: dict
  sample:
    pool_nodes: 40
    pool_gpus: 320
    batch_size: {requested: 10%, base: 40, resolved: 4, rule: 10% of 40 = 4, rounded down = 4}
    steps:
      - {batch: 2, phase: rollout, nodes: 4, out_of_service_before: 4, taken_out_of_service: 4,
         unavailable_during: 8, max_unavailable: 8, limited_by: batch_size, shrunk: false}
digest:
  description: C(sha256:) of the canonical JSON of the plan (without digest, summary, warnings and problems - it can be recomputed from the plan file).
  returned: success
  type: str
  sample: sha256:f36ad566e2c4b1b84d5777117085579aed5b4b3739407152945e8ca3ae655b95
summary:
  description: Markdown summary showing the matrix and the arithmetic of every batch.
  returned: success
  type: str
target:
  description: The target tuple.
  returned: success
  type: dict
policy:
  description: The policy as given.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import (
    DEFAULT_COMBINATION_KEYS, DEFAULT_SOURCE_DRIFT, SOURCE_DRIFT_POLICIES, PlanInputError, PlanRefused, build_plan,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            nodes=dict(type='list', elements='dict', required=True),
            target=dict(type='dict', default={}),
            canaries_per_combination=dict(type='int', default=1),
            batch_size=dict(type='raw', default='10%'),
            max_unavailable=dict(type='raw', default='25%'),
            failure_allowance=dict(type='dict', options=dict(nodes=dict(type='raw'), gpus=dict(type='raw'))),
            combination_keys=dict(type='list', elements='str', default=list(DEFAULT_COMBINATION_KEYS), no_log=False),
            exclude=dict(type='list', elements='str', default=[]),
            omitted_block=dict(type='bool', default=True),
            single_node_pool_acknowledged=dict(type='bool', default=False),
            canaries_isolated=dict(type='bool', default=True),
            pause_before=dict(type='list', elements='int', default=[]),
            observation=dict(type='dict'),
            source_drift=dict(type='str', default=DEFAULT_SOURCE_DRIFT, choices=list(SOURCE_DRIFT_POLICIES)),
            drain_policy=dict(type='dict'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    fa = dict((k, v) for k, v in (p['failure_allowance'] or {}).items() if v is not None) or None
    try:
        plan = build_plan(
            p['nodes'], target=p['target'], canaries_per_combination=p['canaries_per_combination'],
            batch_size=p['batch_size'], max_unavailable=p['max_unavailable'], failure_allowance=fa,
            combination_keys=p['combination_keys'], exclude=p['exclude'], omitted_block=p['omitted_block'],
            single_node_pool_acknowledged=p['single_node_pool_acknowledged'],
            canaries_isolated=p['canaries_isolated'], pause_before=p['pause_before'],
            observation=p['observation'], source_drift=p['source_drift'], drain_policy=p['drain_policy'])
    except PlanInputError as exc:
        module.fail_json(msg=str(exc))
    except PlanRefused as exc:
        module.fail_json(msg=str(exc), problems=exc.problems, plan=exc.plan)
    # What the plan accepted but an operator should know (a cordoned canary, an accepted omission)
    # reaches the user as Ansible warnings.
    for warning in plan.pop('warnings'):
        module.warn(warning)
    plan.pop('problems', None)
    module.exit_json(changed=False, **plan)


if __name__ == '__main__':
    main()
