"""RKE2 through System Upgrade Controller Plans in rollout.yml, on the lab's pool (a real control
plane, tests/tools/lab.py starts it) with the SUC stand-in of tests/cluster/suc.py (SUC's controller
loop on the real API: each node's upgrade a real Job the scheduler places and KWOK completes): a target one Kubernetes minor newer than the
nodes' RKE2 gives exactly one Plan per node, written one at a time in the plan's order (each only
after the previous node's Plan completed), after the drain and the snapshot and before the driver
install; the kubelets end at the target. A Plan that never completes times out and stops the
rollout with the node cordoned, its driver untouched and no RKE2 rollback.

The approved records are written directly (as test_rollout_resume.py does); the canary playbook
is covered by test_lab.py.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests')]

from cluster.suc import SucStandIn  # noqa: E402
from tools import labenv, records  # noqa: E402
from tools.lab import Lab  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')

TARGET_RKE2 = 'v1.36.1+rke2r1'          # one minor newer than the lab's v1.35.3+rke2r3
# The driver change plus RKE2 (the kernel stays: this test is about RKE2 through the SUC).
TARGET = dict(labenv.CHANGES['driver'], rke2=TARGET_RKE2)
PLANS = '/apis/upgrade.cattle.io/v1/namespaces/system-upgrade/plans'


def approved_records(lab: Lab, plan: dict, target: dict) -> None:
    records.write_approved(lab.dir / 'qualification', plan, target, 'rke2')


def control_plane_node(name: str) -> dict:
    """An RKE2 server that already runs the target (servers first); no GPU node, so not in the plan."""
    return labenv.control_plane_node(name, TARGET_RKE2)


def rke2_lab(tmp_path: pathlib.Path, **lab_vars) -> tuple[Lab, SucStandIn]:
    # suc=False: this test runs its own stand-in (hold, its log), not the lab's.
    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, suc=False, change='driver',
              lab_vars=dict({'gpufleet_target': TARGET, 'node_upgrade_rke2_interval': 0.2}, **lab_vars))
    lab.dir.mkdir()
    try:
        lab.prepare()
        lab.cluster.apply([control_plane_node('cp-1')], settle=False)
        suc = SucStandIn(lab.cluster, delay=0.3).__enter__()
    except BaseException:
        lab.stop()          # no control plane left behind
        raise
    return lab, suc


def task_index(run: dict, host: str, prefix: str) -> int:
    for i, e in enumerate(run['events']):
        if e['host'] == host and (e['task'] or '').startswith(prefix) and e['event'] == 'runner_on_ok':
            return i
    raise AssertionError('no ok event of %r on %s' % (prefix, host))


def test_rollout_upgrades_rke2_one_plan_per_node_in_plan_order(tmp_path):
    lab, suc = rke2_lab(tmp_path)
    try:
        plan = lab.plan()
        assert plan['target'] == TARGET
        approved_records(lab, plan, TARGET)
        nodes_in_order = [n for batch in plan['batches'] for n in batch]
        assert any(len(b) > 1 for b in plan['batches']), plan['batches']  # a batch of several nodes is serialized too
        # The last node already runs the target (upgraded by hand after the plan was made): it gets no Plan.
        at_target = nodes_in_order[-1]
        lab.cluster.patch('v1', 'Node', at_target, {'status': {'nodeInfo': {'kubeletVersion': TARGET_RKE2}}},
                          subresource='status')
        order = nodes_in_order[:-1]
        lab.cluster.clear_requests()

        assert lab.play('rollout', 'rollout.yml') == 'successful', lab.runs['rollout']['failures']

        plans = {p['metadata']['annotations']['gpufleet.io/node']: p
                 for p in lab.cluster.list('upgrade.cattle.io/v1', 'Plan', 'system-upgrade')}
        assert sorted(plans) == sorted(order)                       # exactly one Plan per node
        for node, p in plans.items():
            assert p['metadata']['name'] == 'gpufleet-rke2-agent-' + node
            assert p['spec']['concurrency'] == 1 and p['spec']['exclusive'] is True
            assert p['spec']['cordon'] is False and 'drain' not in p['spec']
            assert p['spec']['version'] == TARGET_RKE2
            assert p['spec']['nodeSelector']['matchExpressions'][0] == {
                'key': 'kubernetes.io/hostname', 'operator': 'In', 'values': [node]}
        # Written one at a time, in the plan's order ...
        created = [r['body']['metadata']['annotations']['gpufleet.io/node'] for r in lab.cluster.requests
                   if r['verb'] == 'POST' and r['path'] == PLANS]
        assert created == order
        # ... each after the previous node's upgrade finished, with the node cordoned (after its drain).
        log = [(e['event'], e['node']) for e in suc.log]
        assert log == [(ev, n) for n in order for ev in ('start', 'finish')]
        assert all(e['unschedulable'] for e in suc.log if e['event'] == 'finish')
        for node in nodes_in_order:
            obj = lab.cluster.get('v1', 'Node', node)
            assert obj['status']['nodeInfo']['kubeletVersion'] == TARGET_RKE2
            assert not obj['spec'].get('unschedulable')
        rows = {r['node']: r for r in lab.node_view()}
        assert all(r['driver'] == labenv.TARGET_DRIVER and r['state'] == 'done' for r in rows.values())
        # After the drain and the snapshot, before the driver install.
        run = lab.runs['rollout']
        for node in order:
            rke2 = task_index(run, node, 'RKE2 | Apply')
            assert task_index(run, node, 'Drain |') < task_index(run, node, 'Snapshot | Capture') < rke2
            assert rke2 < task_index(run, node, 'Install |')

        # The evidence bundle: each node went through its RKE2 phase (not the one already at the target).
        nodes = json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())['nodes']
        assert sorted(nodes) == sorted(nodes_in_order)
        for node in nodes_in_order:
            assert nodes[node]['phases'][:5] == (['drain', 'snapshot', 'rke2', 'install', 'activate'] if node != at_target
                                                 else ['drain', 'snapshot', 'install', 'activate', 'ready'])
            assert nodes[node]['verdict'] == 'upgraded' and nodes[node]['tuple_after'] == TARGET
            assert nodes[node]['tuple_before']['rke2'] == labenv.RKE2
        assert lab.cluster.get('v1', 'Node', at_target)['status']['nodeInfo']['kubeletVersion'] == TARGET_RKE2
    finally:
        suc.__exit__(None, None, None)
        lab.stop()


def test_plan_that_never_completes_times_out_and_stops_with_the_node_cordoned(tmp_path):
    lab, suc = rke2_lab(tmp_path, node_upgrade_rke2_timeout=3)
    try:
        plan = lab.plan()
        approved_records(lab, plan, TARGET)
        first = plan['batches'][0][0]
        suc.hold.add(first)
        assert lab.play('rollout', 'rollout.yml') == 'failed'
        failures = lab.runs['rollout']['failures']
        stop = [x for x in failures if x['host'] == first and x['task'] == 'Failure | Stop here']
        assert stop, failures
        msg = stop[0]['msg']
        assert 'rke2 failed' in msg and 'not complete after 3s (wait_timeout)' in msg
        assert 'RKE2 is not downgraded' in msg and 'platform recovery procedure' in msg
        node = lab.cluster.get('v1', 'Node', first)
        assert node['spec'].get('unschedulable') is True
        assert node['metadata']['annotations']['gpufleet.io/upgrade-state'] == 'failed'
        assert node['status']['nodeInfo']['kubeletVersion'] == labenv.RKE2
        # No RKE2 rollback and no driver change on that node; the rollout stopped before anyone else's Plan.
        rows = {r['node']: r for r in lab.node_view()}
        assert rows[first]['driver'] == labenv.SOURCE_DRIVER
        assert not any((e['task'] or '').startswith('Rollback |') or (e['task'] or '').startswith('Install |')
                       for e in lab.runs['rollout']['events'] if e['host'] == first)
        plans = lab.cluster.list('upgrade.cattle.io/v1', 'Plan', 'system-upgrade')
        assert [p['metadata']['annotations']['gpufleet.io/node'] for p in plans] == [first]
        # The other nodes of the batch (drained with it) get no Plan while the first one is unfinished.
        for other in plan['batches'][0][1:]:
            refused = [x['msg'] for x in failures if x['host'] == other and x['task'] == 'Failure | Stop here']
            assert refused and 'while another RKE2 upgrade is unfinished: Plan system-upgrade/gpufleet-rke2-agent-%s' \
                % first in refused[0], failures
            assert rows[other]['cordoned'] and rows[other]['driver'] == labenv.SOURCE_DRIVER
        later = [n for b in plan['batches'][1:] for n in b]
        assert all(rows[n]['state'] == '-' and not rows[n]['cordoned'] for n in later)
        e = json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())['nodes'][first]
        assert (e['verdict'], e['failed_phase'], e['phases'], e['rolled_back']) == (
            'failed', 'rke2', ['drain', 'snapshot'], False)
        assert e['tuple_after']['rke2'] == labenv.RKE2 and e['tuple_after']['driver'] == labenv.SOURCE_DRIVER
    finally:
        suc.__exit__(None, None, None)
        lab.stop()
