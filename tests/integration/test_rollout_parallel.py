"""Parallelism that matches the plan (issue 18, item 3) on the lab's pool (10 nodes, a real control plane): a
plan whose largest batch has 6 nodes is refused with 5 forks (Ansible's default) before anything changes, naming the
forks it needs; with enough forks the batch's nodes drain at once: every node's drain starts before the first
one ends (the timestamps overlap), where 5 forks would have run them 5 and then 1.

The canaries are left as the canary playbook leaves them and the records are written directly
(test_rollout_wiring does the same), so the rollout upgrades the other nodes.
"""
from __future__ import annotations

import datetime
import pathlib
import shutil
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests'), str(REPO / 'tests' / 'integration')]

from tools import labenv  # noqa: E402
from tools.lab import Lab  # noqa: E402
from test_rollout_wiring import past_the_canary  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')

DRAIN = 'Drain | Cordon (initial state recorded once) and evict the node\'s pods (PodDisruptionBudgets honoured)'
SWITCH = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'gpufleet-stop', 'namespace': 'gpufleet-system'}}
FORKS = "Rollout | Enough forks for the plan's largest batch (its nodes run at once, not forks at a time)"


def when(event: dict) -> datetime.datetime:
    return datetime.datetime.fromisoformat(event['created'])


def test_a_batch_runs_its_nodes_at_once_and_too_few_forks_are_refused(tmp_path):
    # 10 nodes in two combinations: one canary each, then a batch of 6 (8 out of service, 20 % of the GPUs in
    # service) and the last 2.
    lab = Lab(tmp_path / 'lab', nodes=10, fault='none', stuck=[], quiet=True, change='driver', lab_vars={
        'gpufleet_batch_size': 6, 'gpufleet_max_unavailable': 8, 'gpufleet_failure_allowance': {'gpus': '20%'}})
    lab.dir.mkdir()
    try:
        plan = past_the_canary(lab)
        batch = max(plan['batches'], key=len)
        assert len(batch) == 6 and not set(batch) & set(plan['canaries']), plan['batches']

        # Ansible's default of 5 forks would run the batch 5 and then 1 at a time: refused, nothing changed.
        lab.cluster.clear_requests()
        assert lab.play('five-forks', 'rollout.yml', envvars={'ANSIBLE_FORKS': '5'}) == 'failed'
        failures = lab.runs['five-forks']['failures']
        assert [f['task'] for f in failures] == [FORKS]
        assert failures[0]['msg'].startswith("the plan's largest batch has 6 nodes but this run has 5 forks: ")
        assert 'Run with --forks 6 or more' in failures[0]['msg']
        assert lab.cluster.mutating_requests() == []

        # The last batch (2 nodes) is not needed here: the stop switch, set during the batch's drains, ends
        # the rollout once the batch finished, in its observation window (test_rollout_stop covers the switch).
        def stop_after_this_batch(event: dict) -> None:
            data = event.get('event_data') or {}
            if event.get('event') == 'runner_on_ok' and data.get('host') == batch[0] and data.get('task') == DRAIN:
                lab.cluster.apply([SWITCH], settle=False)

        lab.play('rollout', 'rollout.yml', envvars={'ANSIBLE_FORKS': '6'}, hook=stop_after_this_batch)
        failures = lab.runs['rollout']['failures']
        assert failures and {f['task'] for f in failures} == {'Observe | Stop during the window'}, failures
        events = lab.runs['rollout']['events']
        ok = [e for e in events if e['event'] == 'runner_on_ok' and e['task'] == FORKS]
        assert ok and ok[0]['msg'] == "the plan's largest batch has 6 node(s) and this run has 6 forks: each batch's nodes run at once"
        starts = {e['host']: when(e) for e in events if e['event'] == 'runner_on_start' and e['task'] == DRAIN}
        ends = {e['host']: when(e) for e in events if e['event'] == 'runner_on_ok' and e['task'] == DRAIN}
        assert sorted(starts) == sorted(ends) == sorted(batch)      # the next batch never started
        # Every drain of the batch started before the first one finished: they ran at once.
        assert max(starts.values()) < min(ends.values()), (starts, ends)
        rows = {r['node']: r for r in lab.node_view()}
        assert all(rows[n]['state'] == 'done' and rows[n]['driver'] == labenv.TARGET_DRIVER for n in batch)
    finally:
        lab.stop()
