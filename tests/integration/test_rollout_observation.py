"""Issue 16, observation windows, on the lab's pool (8 nodes, a real control plane, the lab's real
Prometheus scraping the DCGM stand-in): after each batch, rollout.yml holds the batch's observation window
(the lab's is 8 s) and at its end re-gates every node upgraded so far, not only the batch's. A node of the
first batch gets a new Xid 79 during the second batch's window, after it passed its own gates and returned
to service: that window fails it, it is cordoned and recorded failed, the rollout stops before the next
batch (whose nodes are untouched), the canaries stay isolated, and both windows are in the evidence
bundle (the first passed, the second failed naming the node). In the same window another node of the first
batch gets a taint no one allowed: the window's node gate (one read of the Nodes and operand pods, on every
node upgraded so far) fails it too. Each window's GPU re-gate runs on the node, every host of the batch its
share at the same time (the two workers' runs overlap), not one node after another. Set up as
test_rollout_stop's lab.
"""
from __future__ import annotations

import datetime
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests'), str(REPO / 'tests' / 'integration')]

from tools import labenv  # noqa: E402
from tools.lab import Lab  # noqa: E402
import test_rollout_stop  # noqa: E402
from test_rollout_stop import started  # noqa: E402
from test_rollout_wiring import past_the_canary  # noqa: E402

pytestmark = test_rollout_stop.pytestmark     # the lab's skip condition
WAIT = "Observe | Wait for the window to end, watching the stop switch (bounded by the window's length)"
VERDICT = 'Observe | Every upgraded node passed the window'
WORKLOADS = "Observe | Workload gate on every node upgraded so far (the plan's cases)"
REGATE = 'Observe | GPU gate on every node upgraded in this run, read on the node (each batch host its share)'


def new_xid(lab: Lab, node: str) -> None:
    """What the lab's nodes log for an Xid (tests/tools/lab_node.py): the DCGM stand-in reports it at the next scrape."""
    d = lab.dir / 'nodes' / node
    bus = json.loads((d / 'nvml.json').read_text())['gpus'][2]['bus_id'][4:14].lower()
    when = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S+00:00')
    with open(d / 'kern.log', 'a', encoding='utf-8') as log:
        log.write('%s %s kernel: NVRM: Xid (PCI:%s): 79, pid=0, name=lab, GPU has fallen off the bus.\n' % (when, node, bus))


def test_a_node_of_an_earlier_batch_that_fails_a_later_window_is_cordoned_and_stops_the_rollout(tmp_path):
    lab = Lab(tmp_path / 'lab', nodes=8, fault='none', stuck=[], quiet=True, change='driver',
              lab_vars={'gpufleet_batch_size': 2})
    lab.dir.mkdir()
    try:
        plan = past_the_canary(lab)
        batches = [b for b in plan['batches'] if not set(b) & set(plan['canaries'])]
        assert len(batches) >= 3, plan['batches']
        early, second, later = batches[0][0], batches[1], [n for b in batches[2:] for n in b]
        tainted = batches[0][1]
        windows: list[str] = []
        # The GPU re-gate of each window: which worker re-gated which node, and when each worker's share ran.
        regated: list[list[tuple[str, str]]] = []
        shares: list[dict[str, tuple[str, str]]] = []

        def xid_in_the_second_window(event: dict) -> None:
            data = event.get('event_data') or {}
            if data.get('task') == REGATE:
                if event.get('event') == 'playbook_on_task_start':
                    regated.append([])
                    shares.append({})
                elif event.get('event') == 'runner_item_on_ok':
                    regated[-1].append((data.get('host'), (data.get('res') or {}).get('item')))
                elif event.get('event') == 'runner_on_ok':
                    shares[-1][data.get('host')] = (data.get('start'), data.get('end'))
            if event.get('event') == 'runner_on_start' and data.get('task') == WAIT:
                windows.append(data.get('host'))
                if len(windows) == 2:
                    new_xid(lab, early)
                    taints = ((lab.cluster.get('v1', 'Node', tainted) or {}).get('spec') or {}).get('taints') or []
                    lab.cluster.patch('v1', 'Node', tainted, {'spec': {'taints': taints + [
                        {'key': 'nvidia.com/gpu-unhealthy', 'value': 'true', 'effect': 'NoSchedule'}]}})

        assert lab.play('rollout', 'rollout.yml', hook=xid_in_the_second_window) == 'failed'
        run = lab.runs['rollout']
        assert len(windows) == 2, (windows, run["failures"])
        failures = run['failures']
        assert [f['task'] for f in failures] == [VERDICT], failures
        msg = failures[0]['msg']
        # Every gate re-run on it: the GPU gate on the node (NVML and its kernel log against its snapshot) and the
        # metric gate (its DCGM series in Prometheus) both see the new Xid.
        assert ': 2 of %d upgraded node(s) failed their re-gating: ' % (len(plan['canaries']) + 4) in msg, msg
        assert '%s: GPU gate: ' % early in msg and ', metric gate: ' in msg and 'Xid' in msg, msg
        # The node gate re-run on every upgraded node: the taint no one allowed fails the other node.
        assert '%s: node gate: unexpected taint nvidia.com/gpu-unhealthy=true:NoSchedule' % tainted in msg, msg
        rows = {r['node']: r for r in lab.node_view()}
        # The node that failed the window: cordoned, recorded failed (a rerun does not skip it as done).
        assert rows[early]['cordoned'] is True and rows[early]['state'] == 'failed', rows[early]
        assert rows[tainted]['cordoned'] is True and rows[tainted]['state'] == 'failed', rows[tainted]
        # The second batch passed its own gates and the window (only the earlier node failed it): done, in service.
        for n in second:
            assert rows[n]['state'] == 'done' and not rows[n]['cordoned'] and rows[n]['driver'] == labenv.TARGET_DRIVER
        # Nothing after it started; the canaries stay isolated (the fleet's window did not pass).
        for n in later:
            assert started(run, n) == [] and rows[n]['state'] == '-' and rows[n]['driver'] == labenv.SOURCE_DRIVER
        assert all(rows[c]['canary'] for c in plan['canaries'])
        # Both windows in the evidence bundle, each a gate of its batch with its start and end.
        bundle = json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())
        observed = sorted((g for g in bundle['gates'] if g['kind'] == 'observation'), key=lambda g: g['batch'])
        index = [plan['batches'].index(batches[0]), plan['batches'].index(second)]
        assert [(g['batch'], g['passed'], g['category']) for g in observed] == [
            (index[0], True, 'monitoring'), (index[1], False, 'monitoring')], observed
        assert sorted(observed[1]['result']['failed']) == sorted([early, tainted]), observed[1]['result']['failed']
        # The node gate judged every node upgraded so far, the canaries (upgraded by the canary stage) too.
        assert observed[0]['result']['node_gated'] == sorted(plan['canaries'] + batches[0]), observed[0]['result']
        assert observed[1]['result']['node_gated'] == sorted(plan['canaries'] + batches[0] + second), observed[1]['result']
        assert observed[1]['result']['nodes'] == plan['canaries'] + batches[0] + second
        # The host GPU gate ran on every node this run upgraded; the canaries were upgraded before it (by the
        # canary stage), so the window says why they were re-gated by the cluster read and the metric gate only.
        assert observed[0]['result']['host_regated'] == sorted(batches[0]), observed[0]['result']
        assert observed[1]['result']['host_regated'] == sorted(batches[0] + second), observed[1]['result']
        assert sorted(observed[1]['result']['host_not_regated']) == sorted(plan['canaries']), observed[1]['result']
        assert all(g['started'] and g['finished'] and g['duration_s'] >= 8 for g in observed), observed
        # The re-gate ran in parallel: each host of the batch (2 here) re-gated its share of the nodes so far, every
        # node exactly once, and in the second window (4 nodes) the two workers' runs overlapped in time.
        assert len(regated) == 2 and len(shares) == 2, (regated, shares)
        for window, nodes, batch in zip(regated, (batches[0], batches[0] + second), (batches[0], second)):
            assert sorted(pair[1] for pair in window) == sorted(nodes), window
            assert {pair[0] for pair in window} == set(batch), window
        assert sorted(shares[1]) == sorted(second), shares
        (start_a, end_a), (start_b, end_b) = shares[1].values()
        assert start_a < end_b and start_b < end_a, shares[1]
    finally:
        lab.stop()


TRAFFIC = {'name': 'traffic', 'expr': 'sum(DCGM_FI_DEV_GPU_TEMP)', 'limit': 1e9,
           # the samples in the window stand for the requests served: far fewer than the minimum declared
           'count_expr': 'sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[$window]))', 'min_count': 1e9}


def test_the_plans_observation_queries_run_in_the_window_and_too_little_traffic_stops_without_blame(tmp_path):
    """The plan declares the window's length, a minimum traffic and a workload case (plan.yml's gpufleet_observation,
    kept in the plan file): the first batch's window re-runs the device query on every node upgraded so far and runs
    the query with the node presets, finds far too little traffic, and the window is inconclusive: the rollout stops
    before the next batch, and no node is cordoned or recorded failed for it (the first batch's nodes are done and in
    service)."""
    # workload_suite: the lab's stand-in outputs of the shipped cases (the canaries here are left as canary.yml
    # leaves them, so no canary runs the suite; only the window's device query does).
    lab = Lab(tmp_path / 'lab', nodes=8, fault='none', stuck=[], quiet=True, change='driver', workload_suite=True,
              lab_vars={'gpufleet_batch_size': 2, 'gpufleet_observation': {
                  'window': '6s', 'queries': [TRAFFIC], 'workloads': {'cases': ['device-query']}}})
    lab.dir.mkdir()
    try:
        plan = past_the_canary(lab)
        assert plan['observation'] == {'window': '6s', 'queries': [TRAFFIC], 'workloads': {'cases': ['device-query'], 'repeat': 1}}
        batches = [b for b in plan['batches'] if not set(b) & set(plan['canaries'])]
        first, later = batches[0], [n for b in batches[1:] for n in b]
        workload_results: list[dict] = []

        def workload_gate(event: dict) -> None:
            data = event.get('event_data') or {}
            if event.get('event') == 'runner_on_ok' and data.get('task') == WORKLOADS:
                workload_results.append(data.get('res') or {})

        assert lab.play('rollout', 'rollout.yml', hook=workload_gate) == 'failed'
        run = lab.runs['rollout']
        assert [f['task'] for f in run['failures']] == [VERDICT], run['failures']
        msg = run['failures'][0]['msg']
        assert 'inconclusive, too little traffic in the window' in msg and 'no node is cordoned' in msg, msg
        assert 'transaction(s) in the window, at least 1e+09 required' in msg, msg
        rows = {r['node']: r for r in lab.node_view()}
        for n in first:
            assert rows[n]['state'] == 'done' and not rows[n]['cordoned'], rows[n]
        for n in later:
            assert started(run, n) == [] and rows[n]['state'] == '-' and not rows[n]['cordoned'], rows[n]
        bundle = json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())
        window = [g for g in bundle['gates'] if g['kind'] == 'observation']
        assert len(window) == 1 and window[0]['passed'] is False, window
        assert window[0]['result']['inconclusive'] == ['traffic'] and window[0]['result']['failed'] == {}
        # The plan's workload case ran on every node upgraded so far (the canaries too), each node's Job at once,
        # and passed; so did the node gate.
        upgraded = sorted(plan['canaries'] + first)
        assert window[0]['result']['workload_gated'] == upgraded and window[0]['result']['node_gated'] == upgraded, window
        assert len(workload_results) == 1, workload_results
        assert sorted(workload_results[0]['nodes']) == upgraded and workload_results[0]['passed'] is True, workload_results
        assert window[0]['duration_s'] >= 6, window
    finally:
        lab.stop()
