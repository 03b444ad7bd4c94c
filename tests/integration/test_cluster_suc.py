"""The system-upgrade-controller stand-in (tests/cluster/suc.py) on the real control plane: Plans
select nodes, one at a time, through real Jobs that the scheduler pins to the node and KWOK runs;
the node's kubeletVersion and plan label follow, and the Plan's status has SUC's shape."""
from __future__ import annotations

import pytest

from cluster.suc import LABEL_NODE, LABEL_PLAN, SucStandIn, safe_concat_name
from emulator import fixtures as f

pytestmark = pytest.mark.slow

V = 'v1.36.1+rke2r1'
OLD = 'v1.35.3+rke2r3'
NS = 'system-upgrade'


def plan(name, node, version=V, cordon=False, exclusive=True):
    p = f.plan(name, version=version)
    p['spec'].update(cordon=cordon, exclusive=exclusive, serviceAccountName='system-upgrade',
                     nodeSelector={'matchExpressions': [{'key': 'kubernetes.io/hostname', 'operator': 'In',
                                                         'values': [node]}]})
    p.pop('status')
    return p


def get_plan(cluster, name):
    return cluster.get('upgrade.cattle.io/v1', 'Plan', name, NS)


def cond(p, ctype):
    return next((c for c in (p.get('status') or {}).get('conditions') or [] if c['type'] == ctype), {})


def complete(cluster, name, status='True'):
    p = get_plan(cluster, name)
    return p if cond(p, 'Complete').get('status') == status else None


def test_plan_upgrades_its_node_through_a_pinned_job_then_completes(cluster):
    cluster.apply([f.namespace(NS), f.node('gpu-1', kubelet_version=OLD),
                   f.node('gpu-2', kubelet_version=OLD, unschedulable=True), f.node('gpu-3', kubelet_version=OLD)])
    with SucStandIn(cluster, delay=0.2) as suc:
        cluster.apply([plan('p1', 'gpu-1'), plan('p2', 'gpu-2', cordon=True)], settle=False)
        cluster.wait_for(lambda: complete(cluster, 'p1') and complete(cluster, 'p2'), timeout=60,
                         message='both Plans Complete')
    p1 = get_plan(cluster, 'p1')
    assert p1['status']['latestVersion'] == 'v1.36.1-rke2r1'
    assert cond(p1, 'Complete')['reason'] == 'Complete'
    assert cond(p1, 'Validated')['status'] == 'True' and cond(p1, 'LatestResolved')['reason'] == 'Version'
    assert 'applying' not in p1['status']
    n1 = cluster.get('v1', 'Node', 'gpu-1')
    assert n1['status']['nodeInfo']['kubeletVersion'] == V
    assert n1['metadata']['labels']['plan.upgrade.cattle.io/p1'] == p1['status']['latestHash']
    assert cluster.get('v1', 'Node', 'gpu-3')['status']['nodeInfo']['kubeletVersion'] == OLD  # not selected
    # cordon: true -> SUC uncordons the node when its Job completes (why the rollout's Plans do not cordon);
    # the node lifecycle controller then lifts the unschedulable taint.
    assert not cluster.get('v1', 'Node', 'gpu-2')['spec'].get('unschedulable')
    # Exclusive Plans never run side by side.
    assert [(e['event'], e['node']) for e in suc.log] == [('start', 'gpu-1'), ('finish', 'gpu-1'),
                                                          ('start', 'gpu-2'), ('finish', 'gpu-2')]
    assert [e['unschedulable'] for e in suc.log] == [False, False, True, True]
    # The upgrade ran as a real Job per node, in the Plan's namespace, named and labelled as SUC does,
    # whose pod the scheduler put on that node (cordoned gpu-2 included: the Job tolerates the cordon).
    jobs = {j['metadata']['labels'][LABEL_NODE]: j for j in cluster.list('batch/v1', 'Job', namespace=NS)}
    assert sorted(jobs) == ['gpu-1', 'gpu-2']
    assert jobs['gpu-1']['metadata']['name'] == safe_concat_name('apply', 'p1', 'on', 'gpu-1', 'with',
                                                                 p1['status']['latestHash'])
    assert jobs['gpu-1']['metadata']['labels'][LABEL_PLAN] == 'p1'
    for node, job in jobs.items():
        assert any(c['type'] == 'Complete' and c['status'] == 'True' for c in job['status']['conditions'])
        pods = cluster.list('v1', 'Pod', namespace=NS, label_selector='job-name=%s' % job['metadata']['name'])
        assert [(p['spec']['nodeName'], p['status']['phase']) for p in pods] == [(node, 'Succeeded')]
        assert {'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists',
                'effect': 'NoSchedule'} in pods[0]['spec']['tolerations']


def test_held_node_keeps_the_plan_applying_and_failed_job_is_reported(cluster):
    cluster.apply([f.namespace(NS), f.node('gpu-1', kubelet_version=OLD), f.node('gpu-2', kubelet_version=OLD)])
    with SucStandIn(cluster, delay=0.05, hold={'gpu-1'}, fail={'gpu-2'}) as suc:
        cluster.apply([plan('p1', 'gpu-1', exclusive=False), plan('p2', 'gpu-2', exclusive=False)], settle=False)
        cluster.wait_for(lambda: cond(get_plan(cluster, 'p2'), 'Complete').get('reason') == 'JobFailed', timeout=60,
                         message='p2 JobFailed')
        # gpu-1's Job pod is running on gpu-1 and does not finish
        cluster.wait_for(lambda: [p for p in cluster.list('v1', 'Pod', namespace=NS, label_selector=LABEL_NODE + '=gpu-1')
                                  if p['status'].get('phase') == 'Running'], timeout=30, message="gpu-1's Job pod Running")
        cluster.settle(horizon=1)
        p1 = get_plan(cluster, 'p1')
        assert p1['status']['applying'] == ['gpu-1'] and cond(p1, 'Complete')['status'] == 'False'
        assert cond(p1, 'Complete')['reason'] == 'SyncJob'
    assert cluster.get('v1', 'Node', 'gpu-1')['status']['nodeInfo']['kubeletVersion'] == OLD
    p2 = get_plan(cluster, 'p2')
    msg = cond(p2, 'Complete')['message']
    assert cond(p2, 'Complete')['status'] == 'False'
    assert msg.startswith('Job system-upgrade/apply-p2-on-gpu-2-with-') and 'failed on Node gpu-2: BackoffLimitExceeded' in msg
    assert cluster.get('v1', 'Node', 'gpu-2')['status']['nodeInfo']['kubeletVersion'] == OLD
    assert 'plan.upgrade.cattle.io/p2' not in cluster.get('v1', 'Node', 'gpu-2')['metadata']['labels']
    assert sorted((e['event'], e['node']) for e in suc.log) == [('fail', 'gpu-2'), ('start', 'gpu-1'), ('start', 'gpu-2')]


def test_plan_selecting_no_node_completes_at_once(cluster):
    cluster.apply([f.namespace(NS), f.node('gpu-1')])
    with SucStandIn(cluster) as suc:
        cluster.apply([plan('p1', 'no-such-node')], settle=False)
        cluster.wait_for(lambda: complete(cluster, 'p1'), timeout=30, message='p1 Complete')
    assert suc.log == [] and cluster.list('batch/v1', 'Job', namespace=NS) == []
