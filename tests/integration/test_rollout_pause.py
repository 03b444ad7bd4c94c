"""Issue 16, pause points, on the lab's pool (8 nodes, a real control plane, the rollout as the operator
ServiceAccount): the plan names batch 3 as a pause point (gpufleet_pause_before). The rollout runs batch 2,
then waits at batch 3 for its approval (a ConfigMap bound to the plan's digest, read with the approvals-reader
role) for gpufleet_pause_timeout (3 s here) and stops: batch 3 and later untouched, nothing half-done, the
canaries still isolated. Once approved (as the lab approves itself, as an operator bound to the approve role
would), a rerun goes past the pause and finishes the plan, and the approval is in the evidence bundle.
"""
from __future__ import annotations

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
PAUSE = 'Batch | A pause point of the plan waits, bounded, for its approval before the batch starts'


def test_a_pause_point_stops_the_rollout_until_approved_then_a_rerun_goes_on(tmp_path):
    lab = Lab(tmp_path / 'lab', nodes=8, fault='none', stuck=[], quiet=True, change='driver', metrics='off',
              lab_vars={'gpufleet_batch_size': 2, 'gpufleet_pause_timeout': '3s', 'gpufleet_pause_interval': 1,
                        'gpufleet_observation_window': '1s'},
              pause_before=[3])
    lab.dir.mkdir()
    try:
        plan = past_the_canary(lab)
        assert plan['pauses'] == [3] and len(plan['batches']) >= 4, plan['batches']
        assert not set(plan['batches'][1]) & set(plan['canaries']), plan['batches']
        before, paused = plan['batches'][1], plan['batches'][2]
        later = [n for b in plan['batches'][2:] for n in b]

        assert lab.play('rollout', 'rollout.yml') == 'failed'
        run = lab.runs['rollout']
        failures = run['failures']
        assert {f['task'] for f in failures} == {PAUSE}, failures
        msg = failures[0]['msg']
        assert msg.startswith('batch 3 waits for its approval: create the ConfigMap gpufleet-approvals/gpufleet-approve-'
                              '%s-batch-3' % plan['digest'][7:19]), msg
        assert 'not approved within 3s (the pause timeout): the batch did not start' in msg, msg
        rows = {r['node']: r for r in lab.node_view()}
        for n in before:
            assert rows[n]['state'] == 'done' and not rows[n]['cordoned'] and rows[n]['driver'] == labenv.TARGET_DRIVER
        for n in later:            # nothing of the paused batch or after it started
            assert started(run, n) == [] and rows[n]['state'] == '-' and not rows[n]['cordoned'], rows[n]
            assert rows[n]['driver'] == labenv.SOURCE_DRIVER
        assert all(rows[c]['canary'] for c in plan['canaries'])
        assert set(paused) <= set(later)

        # Issue 40 item 5: the stop switch set while a batch waits for its approval ends the wait at its next read
        # (not at the pause timeout, 10 minutes here), the batch not started.
        switch = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'gpufleet-stop', 'namespace': 'gpufleet-system'},
                  'data': {'reason': 'capacity alert in zone b', 'by': 'oncall-dana'}}

        def set_switch_while_waiting(event: dict) -> None:
            data = event.get('event_data') or {}
            # the task starts in every batch (skipped but at the pause point): batch 3's, run once for its first host
            if event.get('event') == 'runner_on_start' and data.get('task') == PAUSE and data.get('host') == paused[0]:
                lab.cluster.apply([switch], settle=False)

        assert lab.play('rollout-stopped', 'rollout.yml', {'gpufleet_pause_timeout': '10m'},
                        hook=set_switch_while_waiting) == 'failed'
        failures = lab.runs['rollout-stopped']['failures']
        assert {f['task'] for f in failures} == {PAUSE}, failures
        assert failures[0]['msg'].startswith('rollout stopped by the stop switch (ConfigMap gpufleet-system/gpufleet-stop, '
                                             'reason: capacity alert in zone b, set by oncall-dana'), failures
        assert failures[0]['msg'].endswith('(set while batch 3 waited for its approval: the batch did not start)')
        assert all(started(lab.runs['rollout-stopped'], n) == [] for n in later)
        lab.cluster.delete('v1', 'ConfigMap', 'gpufleet-stop', 'gpufleet-system')

        # Approved, the rerun goes past the pause at once and finishes the plan.
        assert lab.approve_pauses(plan) == ['gpufleet-approve-%s-batch-3' % plan['digest'][7:19]]
        assert lab.play('rollout-approved', 'rollout.yml') == 'successful', lab.runs['rollout-approved']['failures']
        rows = {r['node']: r for r in lab.node_view()}
        for n in later:
            assert rows[n]['state'] == 'done' and rows[n]['driver'] == labenv.TARGET_DRIVER, rows[n]
        pause = [e for e in lab.runs['rollout-approved']['events'] if e['task'] == PAUSE and e['event'] == 'runner_on_ok']
        assert len(pause) == 1, pause
        bundle = json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())
        approvals = [a for a in bundle['actions'] if a['name'] == 'pause-approval']
        assert [(a['batch'], a['result']['approved_by'], a['result']['batch']) for a in approvals] == [
            (2, 'lab-approver', 3)], approvals
    finally:
        lab.stop()
