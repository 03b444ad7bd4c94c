"""The emulator's System Upgrade Controller stand-in (simulator.suc_controller): Plans select
nodes, one at a time, set the node's kubeletVersion and turn Complete, with SUC's status shape."""
from __future__ import annotations

from emulator import fixtures as f

V = 'v1.36.1+rke2r1'


def plan(name, node, version=V, cordon=False, exclusive=True):
    p = f.plan(name, version=version)
    p['spec'].update(cordon=cordon, exclusive=exclusive, serviceAccountName='system-upgrade',
                     nodeSelector={'matchExpressions': [{'key': 'kubernetes.io/hostname', 'operator': 'In',
                                                         'values': [node]}]})
    return p


def cond(p, ctype):
    return next(c for c in p['status']['conditions'] if c['type'] == ctype)


def test_plan_upgrades_its_node_then_completes(emulator):
    emu = emulator
    emu.simulator.suc_controller = True
    emu.simulator.suc_delay = 0.1
    emu.apply([f.namespace('system-upgrade'), f.node('gpu-1', kubelet_version='v1.35.3+rke2r3'),
               f.node('gpu-2', kubelet_version='v1.35.3+rke2r3', unschedulable=True)])
    emu.apply([plan('p1', 'gpu-1'), plan('p2', 'gpu-2', cordon=True)])
    emu.wait_for(lambda: all((emu.get('upgrade.cattle.io/v1', 'Plan', n, 'system-upgrade').get('status') or {})
                             .get('conditions') and cond(emu.get('upgrade.cattle.io/v1', 'Plan', n, 'system-upgrade'),
                                                         'Complete')['status'] == 'True' for n in ('p1', 'p2')), 10)
    p1 = emu.get('upgrade.cattle.io/v1', 'Plan', 'p1', 'system-upgrade')
    assert p1['status']['latestVersion'] == 'v1.36.1-rke2r1'
    assert cond(p1, 'Complete')['reason'] == 'Complete'
    assert cond(p1, 'Validated')['status'] == 'True' and cond(p1, 'LatestResolved')['reason'] == 'Version'
    assert 'applying' not in p1['status']
    n1 = emu.get('v1', 'Node', 'gpu-1')
    assert n1['status']['nodeInfo']['kubeletVersion'] == V
    assert n1['metadata']['labels']['plan.upgrade.cattle.io/p1'] == p1['status']['latestHash']
    # cordon: true -> SUC uncordons the node when its Job completes (why the rollout's Plans do not cordon).
    assert not emu.get('v1', 'Node', 'gpu-2')['spec'].get('unschedulable')
    # Exclusive Plans never run side by side.
    log = [(e['event'], e['node']) for e in emu.simulator.suc_log]
    assert log == [('start', 'gpu-1'), ('finish', 'gpu-1'), ('start', 'gpu-2'), ('finish', 'gpu-2')]


def test_held_node_keeps_the_plan_applying_and_failed_job_is_reported(emulator):
    emu = emulator
    emu.simulator.suc_controller = True
    emu.simulator.suc_delay = 0.05
    emu.simulator.suc_hold = {'gpu-1'}
    emu.simulator.suc_fail = {'gpu-2'}
    emu.apply([f.namespace('system-upgrade'), f.node('gpu-1', kubelet_version='v1.35.3+rke2r3'),
               f.node('gpu-2', kubelet_version='v1.35.3+rke2r3')])
    emu.apply([plan('p1', 'gpu-1', exclusive=False), plan('p2', 'gpu-2', exclusive=False)])
    emu.settle(horizon=1)
    p1 = emu.get('upgrade.cattle.io/v1', 'Plan', 'p1', 'system-upgrade')
    assert p1['status']['applying'] == ['gpu-1'] and cond(p1, 'Complete')['status'] == 'False'
    assert emu.get('v1', 'Node', 'gpu-1')['status']['nodeInfo']['kubeletVersion'] == 'v1.35.3+rke2r3'
    p2 = emu.get('upgrade.cattle.io/v1', 'Plan', 'p2', 'system-upgrade')
    assert cond(p2, 'Complete')['reason'] == 'JobFailed' and 'failed on Node gpu-2' in cond(p2, 'Complete')['message']
    assert emu.get('v1', 'Node', 'gpu-2')['status']['nodeInfo']['kubeletVersion'] == 'v1.35.3+rke2r3'


def test_plan_selecting_no_node_completes_at_once(emulator):
    emu = emulator
    emu.simulator.suc_controller = True
    emu.apply([f.namespace('system-upgrade'), f.node('gpu-1')])
    emu.apply([plan('p1', 'no-such-node')])
    emu.settle()
    p1 = emu.get('upgrade.cattle.io/v1', 'Plan', 'p1', 'system-upgrade')
    assert cond(p1, 'Complete')['status'] == 'True' and emu.simulator.suc_log == []
