#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: metric_gate
short_description: Gate an upgrade on Prometheus metrics over an observation window
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Read-only. Evaluates each declared PromQL query as a range query over the observation window
    through the Prometheus HTTP API, reduces every series (mean, max, min or last of its valid points),
    and compares it with exactly one written reference, a pre-upgrade O(queries[].baseline) from the same query and
    collection path, O(queries[].control) nodes still on the previous tuple over the same window, or an
    absolute O(queries[].limit).
  - A query with no series fails (lost telemetry must not look quiet). A series with fewer than
    O(queries[].min_samples) valid points fails, and so does a window with less traffic than
    O(queries[].min_count), so a quiet canary does not pass for lack of traffic.
  - The stop rule is conjunctive. One failed critical query fails the task, even when the other queries,
    such as aggregate throughput, look normal. Failed non-critical queries are returned as warnings.
  - Returns the evidence of every query (expressions, windows, series, sample counts, values, bounds) for
    the evidence bundle (M(gpufleet.upgrade.evidence)).
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  url:
    description:
      - Base URL of the Prometheus server, for example V(http://prometheus.monitoring:9090).
      - A URL with credentials in it (C(https://user:secret@prometheus)) is refused, since a module's options are in
        the task result's invocation; give them as O(url_username) and O(url_password), or a token as O(bearer_token).
      - A redirect to the same scheme, host and port is followed (up to 5); one to another origin (another host or
        port, or https to http) is not, and fails the query naming that origin, so that the token or password never
        leaves this origin.
    type: str
    required: true
  bearer_token:
    description: Bearer token sent as the C(Authorization) header.
    type: str
  url_username:
    description: Username for basic authentication to Prometheus (with O(url_password)).
    type: str
  url_password:
    description: Password for basic authentication to Prometheus (with O(url_username)); never logged.
    type: str
  validate_certs:
    description: Verify the server's TLS certificate.
    type: bool
    default: true
  ca_path:
    description: A CA bundle file to verify the server's certificate with.
    type: path
  timeout:
    description: Seconds each HTTP request may take (1 to 300). Also passed to Prometheus as the query timeout.
    type: int
    default: 10
  window:
    description:
      - Length of the observation window ending at O(window_end), a duration such as V(24h), V(90m), V(1h30m).
      - Mutually exclusive with O(window_start); one of them is required.
    type: str
  window_start:
    description: Start of the observation window, RFC 3339 with an offset or unix seconds.
    type: str
  window_end:
    description: End of the observation window, RFC 3339 with an offset or unix seconds. Defaults to now.
    type: str
  step:
    description:
      - Resolution of the range queries, a duration. Samples are counted at this resolution.
      - Defaults to the window length divided by 250, at least V(1s).
    type: str
  min_samples:
    description: Default O(queries[].min_samples) for queries that do not set it, and for the presets.
    type: int
    default: 10
  queries:
    description: The declared queries. Each needs exactly one of O(queries[].baseline), O(queries[].control)
      or O(queries[].limit).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Unique name, used in messages and evidence.
        type: str
        required: true
      expr:
        description:
          - PromQL expression evaluated over the observation window, for example the canary's error ratio.
          - In every expression of a query, C($window) is replaced with the window length in seconds (C(86400s)).
        type: str
        required: true
      baseline:
        description: Compare with the same query over an earlier window.
        type: dict
        suboptions:
          offset:
            description: The baseline window is the observation window shifted this far back, for example V(7d).
              Must be at least the window length.
            type: str
          start:
            description: Explicit baseline window start (with O(queries[].baseline.end)), RFC 3339 or unix seconds.
            type: str
          end:
            description: Explicit baseline window end; must not be after the observation window starts.
            type: str
          expr:
            description: Baseline expression when it differs from O(queries[].expr) (for example a renamed
              recording rule). Defaults to O(queries[].expr), the same query and collection path.
            type: str
      control:
        description: Compare with control nodes still on the previous tuple, over the same window.
          Both expressions must return a single series (aggregate with C(sum) or C(avg)).
        type: dict
        suboptions:
          expr:
            description: PromQL expression over the control nodes.
            type: str
            required: true
      limit:
        description: Compare with this written absolute value.
        type: float
      tolerance:
        description:
          - Allowed deviation from the reference in the regressing direction, the larger of O(queries[].tolerance.abs)
            and O(queries[].tolerance.rel) times the absolute reference. Both default to 0.
        type: dict
        suboptions:
          abs:
            description: Absolute tolerance.
            type: float
          rel:
            description: Relative tolerance (V(0.05) is 5 percent of the reference).
            type: float
      direction:
        description: Which deviation is a regression. V(any) bounds both sides.
        type: str
        choices: [higher_is_worse, lower_is_worse, any]
        default: higher_is_worse
      reduce:
        description: How the points of a series in a window become one value.
        type: str
        choices: [mean, max, min, last]
        default: mean
      min_samples:
        description: Minimum valid (finite) points per series in each window. Defaults to O(min_samples).
        type: int
      count_expr:
        description: Instant PromQL expression evaluated at the window end giving the traffic in the window (for
          example C(sum(increase(requests_total{node="gpu-1"}[$window])))). Needs O(queries[].min_count).
        type: str
      min_count:
        description: Minimum value of O(queries[].count_expr) (transactions, steps or job completions).
        type: float
      critical:
        description: A failed critical query fails the gate; a non-critical one is only reported.
        type: bool
        default: true
  presets:
    description:
      - DCGM presets over dcgm-exporter series of O(node), each a critical query against a limit with reducer V(max).
      - With O(nodes), one query per preset selects the series of all these nodes, and each node must have at least
        one series in the observation window; a node without one fails the query (its monitoring is lost).
      - V(xid) C(DCGM_FI_DEV_XID_ERRORS) must stay 0 (the last Xid seen since the exporter started).
      - V(ecc) C(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) must stay 0 (uncorrectable ECC errors since the driver loaded;
        this counter is off in dcgm-exporter's default counters, enable it).
      - V(row_remap) C(DCGM_FI_DEV_ROW_REMAP_FAILURE) must stay 0.
      - V(temperature) C(DCGM_FI_DEV_GPU_TEMP) must stay at or below O(temperature_max).
    type: list
    elements: str
    choices: [xid, ecc, row_remap, temperature]
    default: []
  node:
    description:
      - The node the presets select, the value of O(node_label) on its DCGM series.
      - Mutually exclusive with O(nodes).
    type: str
  nodes:
    description:
      - The nodes the presets select, each the value of O(node_label) on its DCGM series, for example every node
        upgraded so far, re-gated in one call during an observation window.
      - Each must be a Kubernetes node name (a DNS-1123 subdomain, lowercase alphanumerics, C(-) and C(.)). Each
        preset is one query with the selector C({<node_label>=~"<node1>|<node2>|..."}), its C(.) escaped so that
        it matches exactly these names.
      - Every node must have at least one series of each preset in the observation window; a node without one
        fails the gate, since its monitoring is lost.
      - The evidence of each query then has C(by_node), the problems of each node (a problem about a series goes
        to the node named by its O(node_label) label, any other problem to every node), and the result has
        RV(failed_nodes).
      - Mutually exclusive with O(node).
    type: list
    elements: str
  node_label:
    description: Label that names the host on the DCGM series (dcgm-exporter sets C(Hostname)).
    type: str
    default: Hostname
  temperature_max:
    description: Highest GPU temperature in Celsius the V(temperature) preset accepts.
    type: float
    default: 85
notes:
  - Times are compared in UTC. Samples are evaluation points of the range query at O(step) resolution that have
    a finite value; Prometheus marks a series stale when its target disappears, so lost telemetry lowers the count.
seealso:
  - module: gpufleet.upgrade.gpu_gate
  - module: gpufleet.upgrade.evidence
"""

EXAMPLES = r"""
---
- name: Canary error ratio within 10 % of last week's, with enough traffic, and DCGM health clean
  gpufleet.upgrade.metric_gate:
    url: http://prometheus.monitoring:9090
    window: 24h
    queries:
      - name: error_ratio
        expr: sum(rate(http_errors_total{node="gpu-7"}[5m])) / sum(rate(http_requests_total{node="gpu-7"}[5m]))
        baseline:
          offset: 7d
        tolerance:
          rel: 0.10
          abs: 0.0005
        count_expr: sum(increase(http_requests_total{node="gpu-7"}[$window]))
        min_count: 10000
      - name: tokens_per_second
        expr: sum(rate(tokens_total{node="gpu-7"}[5m]))
        control:
          expr: sum(rate(tokens_total{node="gpu-8"}[5m]))
        direction: lower_is_worse
        tolerance:
          rel: 0.05
    presets: [xid, ecc, row_remap, temperature]
    node: gpu-7
  delegate_to: localhost
  register: metrics

- name: Re-gate the DCGM health of every node upgraded so far, one query per preset
  gpufleet.upgrade.metric_gate:
    url: http://prometheus.monitoring:9090
    window: 2h
    presets: [xid, ecc, row_remap, temperature]
    nodes: [gpu-7, gpu-8.example.com, gpu-9]
  delegate_to: localhost
  register: fleet_metrics
  failed_when: false

- name: Show the nodes that failed it
  ansible.builtin.debug:
    var: fleet_metrics.failed_nodes
"""

RETURN = r"""
passed:
  description: Whether every critical query passed.
  returned: always
  type: bool
msg:
  description: Verdict line; on failure the problems of the critical queries.
  returned: always
  type: str
problems:
  description: Problems of the critical queries.
  returned: always
  type: list
  elements: str
noncritical_problems:
  description: Problems of the non-critical queries (also shown as warnings).
  returned: always
  type: list
  elements: str
failed_critical:
  description: Names of the failed critical queries.
  returned: always
  type: list
  elements: str
failed_noncritical:
  description: Names of the failed non-critical queries.
  returned: always
  type: list
  elements: str
failed_nodes:
  description:
    - The nodes of O(nodes) with a problem in a critical query, in the order of O(nodes); empty when the gate passed.
    - A problem about a series counts against the node its O(node_label) label names; any other problem
      (no answer from Prometheus, no series at all, a series of no listed node) against every node.
  returned: when O(nodes) is given and the input is valid
  type: list
  elements: str
  sample: [gpu-8]
window:
  description: The observation window (start, end, seconds, step).
  returned: when the input is valid
  type: dict
queries:
  description:
    - Evidence per query, with keys name, preset, critical, compare, direction, reduce, min_samples, tolerance,
      observed (expr, window, series with labels, value, samples and invalid_points, value), reference (kind,
      expr, window, series, value; or kind limit and value), count (expr, min, value, at), allowed, warnings,
      problems and passed; with O(nodes), also by_node (the problems of each node).
  returned: when the input is valid
  type: list
  elements: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils._http import http_get
from ansible_collections.gpufleet.upgrade.plugins.module_utils._metric_gate import (
    MetricGateError, PrometheusClient, parse_nodes, parse_query, preset_queries, resolve_step, resolve_window, run_gate)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import url_userinfo


def _opener(module):
    def fetch(url, headers, timeout):
        # Never a redirect to another origin: the token and the password stay with the url's origin.
        return http_get(url, headers, timeout, validate_certs=module.params['validate_certs'],
                        ca_path=module.params['ca_path'], follow_redirects='same_origin',
                        url_username=module.params['url_username'], url_password=module.params['url_password'])
    return fetch


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type='str', required=True),
            bearer_token=dict(type='str', no_log=True),
            url_username=dict(type='str'),
            url_password=dict(type='str', no_log=True),
            validate_certs=dict(type='bool', default=True),
            ca_path=dict(type='path'),
            timeout=dict(type='int', default=10),
            window=dict(type='str'),
            window_start=dict(type='str'),
            window_end=dict(type='str'),
            step=dict(type='str'),
            min_samples=dict(type='int', default=10),
            queries=dict(type='list', elements='dict', default=[], options=dict(
                name=dict(type='str', required=True),
                expr=dict(type='str', required=True),
                baseline=dict(type='dict', options=dict(
                    offset=dict(type='str'), start=dict(type='str'), end=dict(type='str'), expr=dict(type='str'))),
                control=dict(type='dict', options=dict(expr=dict(type='str', required=True))),
                limit=dict(type='float'),
                tolerance=dict(type='dict', options=dict(abs=dict(type='float'), rel=dict(type='float'))),
                direction=dict(type='str', default='higher_is_worse',
                               choices=['higher_is_worse', 'lower_is_worse', 'any']),
                reduce=dict(type='str', default='mean', choices=['mean', 'max', 'min', 'last']),
                min_samples=dict(type='int'),
                count_expr=dict(type='str'),
                min_count=dict(type='float'),
                critical=dict(type='bool', default=True),
            )),
            presets=dict(type='list', elements='str', default=[], choices=['xid', 'ecc', 'row_remap', 'temperature']),
            node=dict(type='str'),
            nodes=dict(type='list', elements='str'),
            node_label=dict(type='str', default='Hostname'),
            temperature_max=dict(type='float', default=85),
        ),
        mutually_exclusive=[('window', 'window_start'), ('node', 'nodes'), ('bearer_token', 'url_username')],
        required_together=[('url_username', 'url_password')],
        required_one_of=[('window', 'window_start')],
        supports_check_mode=True,
    )
    p = module.params
    secret = url_userinfo(p['url'])
    if secret:      # refused below; masked so that the invocation in the result does not carry it
        module.no_log_values.add(secret)
    result = dict(changed=False, passed=False, problems=[], noncritical_problems=[], failed_critical=[], failed_noncritical=[])
    try:
        window = resolve_window(p['window'], p['window_start'], p['window_end'], time.time())
        step = resolve_step(p['step'], window)
        if p['min_samples'] < 1:
            raise MetricGateError('min_samples: %r must be at least 1' % p['min_samples'])
        specs = [parse_query(q, i, window, p['min_samples']) for i, q in enumerate(p['queries'])]
        nodes = parse_nodes(p['nodes']) if p['nodes'] is not None else None
        specs += preset_queries(p['presets'], p['node'], p['node_label'], p['temperature_max'], p['min_samples'], nodes=nodes)
        headers = {}
        if p['bearer_token']:
            headers['Authorization'] = 'Bearer %s' % p['bearer_token']
        client = PrometheusClient(p['url'], _opener(module), timeout=p['timeout'], headers=headers)
        verdict = run_gate(client, specs, window, step, nodes=nodes, node_label=p['node_label'])
    except MetricGateError as exc:
        result['msg'] = 'metric gate: invalid input: %s' % exc
        module.fail_json(**result)
    result.update(verdict)
    result['noncritical_problems'] = result.pop('warnings')
    for w in result['noncritical_problems']:
        module.warn(w)
    if not verdict['passed']:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
