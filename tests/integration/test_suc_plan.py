"""gpufleet.upgrade.suc_plan through ansible-playbook (ansible-runner); state=present on the real control
plane (tests/cluster), as a service account bound as docs/rbac says (gpufleet-upgrade-rke2-plans by a
RoleBinding in system-upgrade, gpufleet-upgrade-reader cluster-wide), with the system-upgrade-controller
stand-in (cluster/suc.py) for wait=true."""
from __future__ import annotations

import pytest

import rbac_check as R
from cluster import rbac
from cluster.suc import SucStandIn
from cluster import fixtures as f

TGT = 'v1.36.1+rke2r1'
CUR = 'v1.35.3+rke2r3'


def _play(task_args, check=False):
    return [{'name': 'suc_plan', 'hosts': 'localhost', 'gather_facts': False, 'check_mode': check, 'tasks': [
        {'name': 'render', 'gpufleet.upgrade.suc_plan': task_args, 'register': 'suc', 'ignore_errors': True},
    ]}]


def test_renders_serialized_plans_for_a_40_node_pool(run_playbook):
    nodes = [{'name': 'cp-1', 'role': 'server'}] + [{'name': 'gpu-%02d' % i, 'role': 'agent'} for i in range(40)]
    for check in (False, True):
        run = run_playbook(_play({'target_rke2': TGT, 'current_rke2': CUR, 'nodes': nodes,
                                  'drain': {'timeout': 900, 'ignore_daemonsets': True}}, check=check))
        assert run.rc == 0, run.stdout
        res = run.result('render')
        assert res['_event'] == 'runner_on_ok' and res['changed'] is False
        plans = res['plans']
        assert len(plans) == 41
        assert [p['metadata']['annotations']['gpufleet.io/node'] for p in plans] == [n['name'] for n in nodes]
        assert {p['spec']['concurrency'] for p in plans} == {1}
        assert all(p['spec']['exclusive'] is True and p['spec']['cordon'] is True for p in plans)
        assert all(p['spec']['drain'] == {'timeout': '900s', 'ignoreDaemonSets': True} for p in plans)
        assert plans[5]['spec']['prepare']['args'] == ['prepare', 'gpufleet-rke2-server-cp-1']
        assert res['nodes'][1] == {'name': 'gpu-00', 'role': 'agent', 'current_rke2': CUR, 'target_rke2': TGT,
                                   'action': 'plan', 'plan_name': 'gpufleet-rke2-agent-gpu-00', 'sequence': 2}


def test_refuses_downgrade_and_minor_skip(run_playbook):
    run = run_playbook(_play({'target_rke2': TGT, 'nodes': [
        {'name': 'gpu-1', 'role': 'agent', 'current_rke2': 'v1.36.2+rke2r1'},
        {'name': 'gpu-2', 'role': 'agent', 'current_rke2': 'v1.34.2+rke2r1'}]}))
    res = run.result('render')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'].startswith("refusing to render RKE2 Plans: node 'gpu-1': v1.36.2+rke2r1 → v1.36.1+rke2r1: "
                                 "RKE2 downgrade is not allowed")
    assert ("node 'gpu-2': v1.34.2+rke2r1 → v1.36.1+rke2r1: RKE2 upgrade cannot skip a Kubernetes minor (skips 1.35;"
            in res['msg'])
    assert len(res['problems']) == 2 and 'plans' not in res


def test_bad_role_is_an_argument_error(run_playbook):
    run = run_playbook(_play({'target_rke2': TGT, 'current_rke2': CUR, 'nodes': [{'name': 'x', 'role': 'worker'}]}))
    res = run.result('render')
    assert res['_event'] == 'runner_on_failed'
    assert 'value of role must be one of: server, agent, got: worker' in res['msg']


SA = 'rke2-plans'


@pytest.fixture
def emu(cluster):
    """The cluster, with the module's identity: rke2-plans in system-upgrade only, the reader cluster-wide."""
    cluster.apply([f.namespace('system-upgrade')])
    rbac.bind(cluster, 'gpufleet-upgrade-reader', sa=SA)
    cluster.module_kubeconfig = rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-rke2-plans', sa=SA,
                                                    namespace='system-upgrade')
    mark = cluster.audit_mark()
    yield cluster
    assert rbac.refused(cluster.audit_events(since=mark, user=rbac.user(SA))) == []


def _present_play(emu, args, check=False, diff=False):
    return [{'name': 'suc_plan present', 'hosts': 'localhost', 'gather_facts': False, 'check_mode': check,
             'diff': diff,
             'module_defaults': {'group/gpufleet.upgrade.k8s': {'kubeconfig': emu.module_kubeconfig,
                                                                'request_timeout': 5}},
             'tasks': [{'name': 'apply', 'gpufleet.upgrade.suc_plan': dict(args, state='present'),
                        'register': 'suc', 'ignore_errors': True}]}]


def test_present_creates_then_idempotent_check_mode_then_update(emu, run_playbook):
    args = {'target_rke2': TGT, 'current_rke2': CUR,
            'nodes': [{'name': 'cp-1', 'role': 'server'}, {'name': 'gpu-a-01', 'role': 'agent'}]}

    res = run_playbook(_present_play(emu, args)).result('apply')
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True, res.get('msg')
    assert [(a['node'], a['action']) for a in res['applied']] == [('cp-1', 'created'), ('gpu-a-01', 'created')]
    stored = {p['metadata']['name']: p for p in emu.list('upgrade.cattle.io/v1', 'Plan', 'system-upgrade')}
    assert {n: p['spec'] for n, p in stored.items()} == {p['metadata']['name']: p['spec'] for p in res['plans']}

    emu.clear_requests()
    res = run_playbook(_present_play(emu, args)).result('apply')
    assert res['changed'] is False and {a['action'] for a in res['applied']} == {'unchanged'}
    assert emu.mutating_requests() == []

    with_drain = dict(args, drain={'force': True, 'timeout': 600})
    res = run_playbook(_present_play(emu, with_drain, check=True, diff=True)).result('apply')
    assert res['changed'] is True and {a['action'] for a in res['applied']} == {'updated'}
    assert res['diff']['after']['system-upgrade/gpufleet-rke2-agent-gpu-a-01']['spec']['drain'] == {
        'force': True, 'timeout': '600s'}
    assert 'drain' not in res['diff']['before']['system-upgrade/gpufleet-rke2-agent-gpu-a-01']['spec']
    assert emu.mutating_requests() == []  # check mode wrote nothing

    res = run_playbook(_present_play(emu, with_drain)).result('apply')
    assert res['changed'] is True
    got = emu.get('upgrade.cattle.io/v1', 'Plan', 'gpufleet-rke2-agent-gpu-a-01', 'system-upgrade')
    assert got['spec']['drain'] == {'force': True, 'timeout': '600s'}
    assert [r['verb'] for r in emu.mutating_requests()] == ['PATCH', 'PATCH']


def test_present_stays_inside_its_rbac_role(emu, run_playbook):
    role = R.module_roles()['suc_plan']
    seen = []
    for drain in (None, {'force': True}):  # create, then update
        emu.clear_requests()
        args = {'target_rke2': TGT, 'current_rke2': CUR, 'drain': drain,
                'nodes': [{'name': 'cp-1', 'role': 'server'}, {'name': 'gpu-a-01', 'role': 'agent'}]}
        assert run_playbook(_present_play(emu, args)).result('apply')['_event'] == 'runner_on_ok'
        seen += list(emu.requests)
        assert R.violations(role, emu.requests) == []
    verbs = {(a['verb'], a['resource']) for a in (R.attributes(r['verb'], r['path'], r['query']) for r in seen)}
    assert verbs == {('get', 'plans'), ('create', 'plans'), ('patch', 'plans')}


def test_present_refuses_a_plan_it_did_not_create(emu, run_playbook):
    foreign = f.plan('gpufleet-rke2-agent-gpu-a-01', version='v1.34.2+rke2r1')
    emu.apply([foreign])
    emu.clear_requests()
    args = {'target_rke2': TGT, 'current_rke2': CUR, 'control_plane_rke2': TGT,
            'nodes': [{'name': 'gpu-a-00', 'role': 'agent'}, {'name': 'gpu-a-01', 'role': 'agent'}]}
    res = run_playbook(_present_play(emu, args)).result('apply')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == ('refusing to apply RKE2 Plans: Plan system-upgrade/gpufleet-rke2-agent-gpu-a-01 exists and '
                          'is not managed by gpufleet.upgrade (label app.kubernetes.io/managed-by); refusing to '
                          'change it')
    assert emu.mutating_requests() == []  # not even the other node's Plan was created
    assert emu.get('upgrade.cattle.io/v1', 'Plan', 'gpufleet-rke2-agent-gpu-a-01',
                   'system-upgrade')['spec']['version'] == 'v1.34.2+rke2r1'


def _gpu_nodes(f, *names, version=CUR):
    return [f.node(n, kubelet_version=version) for n in names]


def test_wait_applies_one_plan_at_a_time_until_the_kubelet_runs_the_target(emu, run_playbook):
    emu.apply(_gpu_nodes(f, 'gpu-a-01', 'gpu-a-02'))
    emu.clear_requests()
    args = {'target_rke2': TGT, 'current_rke2': CUR, 'control_plane_rke2': TGT, 'wait': True, 'wait_timeout': 60,
            'wait_interval': 0.1, 'cordon': False,
            'nodes': [{'name': 'gpu-a-02', 'role': 'agent'}, {'name': 'gpu-a-01', 'role': 'agent'}]}
    with SucStandIn(emu, delay=0.2) as suc:
        res = run_playbook(_present_play(emu, args)).result('apply')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert [(w['node'], w['done'], w['kubelet_version']) for w in res['waited']] == [
        ('gpu-a-02', True, TGT), ('gpu-a-01', True, TGT)]
    # The second Plan was written only after the first node finished.
    assert [(e['event'], e['node']) for e in suc.log] == [
        ('start', 'gpu-a-02'), ('finish', 'gpu-a-02'), ('start', 'gpu-a-01'), ('finish', 'gpu-a-01')]
    posts = [i for i, r in enumerate(emu.requests) if r['verb'] == 'POST']
    reads_between = [r['path'] for r in emu.requests[posts[0]:posts[1]] if r['path'].endswith('/nodes/gpu-a-02')]
    assert len(posts) == 2 and reads_between
    # Each finished Plan is marked, and the check before the next Plan lists only the unmarked ones (issue 18).
    for name in ('gpu-a-01', 'gpu-a-02'):
        plan = emu.get('upgrade.cattle.io/v1', 'Plan', 'gpufleet-rke2-agent-' + name, 'system-upgrade')
        assert plan['metadata']['labels']['gpufleet.io/rke2-complete'] == 'v1.36.1-rke2r1'
    lists = [r for r in emu.requests if r['verb'] == 'GET' and r['path'].endswith('/namespaces/system-upgrade/plans')]
    assert len(lists) == 1 and 'gpufleet.io/rke2-complete' in str(lists[0]['query'])
    assert [r['verb'] for r in emu.requests if r['verb'] not in ('GET', 'POST')] == ['PATCH', 'PATCH']
    # Another run with the same Plans writes nothing, and its check lists no Plan: both are finished.
    emu.clear_requests()
    with SucStandIn(emu, delay=0.2):
        again = run_playbook(_present_play(emu, args)).result('apply')
    assert again['_event'] == 'runner_on_ok' and again['changed'] is False, again.get('msg')
    assert emu.mutating_requests() == []
    # Reads the Plans and the Node besides its own Plan role: the reader role covers the Node.
    assert R.violations('gpufleet-upgrade-rke2-plans', [r for r in emu.requests if '/plans' in r['path']]) == []
    assert R.violations('gpufleet-upgrade-reader', [r for r in emu.requests if '/plans' not in r['path']]) == []


def test_wait_refuses_downgrade_and_minor_skip_before_writing_any_plan(emu, run_playbook):
    emu.apply(_gpu_nodes(f, 'gpu-a-01', 'gpu-a-02'))
    emu.clear_requests()
    args = {'target_rke2': TGT, 'control_plane_rke2': TGT, 'wait': True, 'wait_timeout': 5, 'cordon': False,
            'nodes': [{'name': 'gpu-a-01', 'role': 'agent', 'current_rke2': 'v1.34.2+rke2r1'},
                      {'name': 'gpu-a-02', 'role': 'agent', 'current_rke2': 'v1.37.0+rke2r1'}]}
    with SucStandIn(emu) as suc:
        res = run_playbook(_present_play(emu, args)).result('apply')
    assert suc.log == []
    assert res['_event'] == 'runner_on_failed'
    assert res['problems'] == [
        "node 'gpu-a-01': v1.34.2+rke2r1 → v1.36.1+rke2r1: RKE2 upgrade cannot skip a Kubernetes minor "
        "(skips 1.35; upgrade one minor at a time)",
        "node 'gpu-a-02': v1.37.0+rke2r1 → v1.36.1+rke2r1: RKE2 downgrade is not allowed "
        "(restore through the platform recovery procedure instead)"]
    assert emu.requests == []  # refused before any request, let alone a Plan


def test_wait_fails_on_a_failed_job_and_refuses_the_next_plan_while_one_is_unfinished(emu, run_playbook):
    emu.apply(_gpu_nodes(f, 'gpu-a-01', 'gpu-a-02'))
    args = {'target_rke2': TGT, 'current_rke2': CUR, 'control_plane_rke2': TGT, 'wait': True, 'wait_timeout': 60,
            'wait_interval': 0.1, 'cordon': False, 'nodes': [{'name': 'gpu-a-01', 'role': 'agent'}]}
    with SucStandIn(emu, delay=0.1, fail={'gpu-a-01'}) as suc:
        res = run_playbook(_present_play(emu, args)).result('apply')
        assert res['_event'] == 'runner_on_failed'
        # SUC's message names the node's real upgrade Job (apply-<plan>-on-<node>-with-<hash>, shortened)
        job = emu.list('batch/v1', 'Job', namespace='system-upgrade')
        assert len(job) == 1 and job[0]['metadata']['name'].startswith('apply-gpufleet-rke2-agent-gpu-a-01-on-gpu-a-01-with-')
        assert res['msg'].startswith('RKE2 Plan gpufleet-rke2-agent-gpu-a-01 for node gpu-a-01: the upgrade Job failed: '
                                     'Job system-upgrade/%s failed on Node gpu-a-01: BackoffLimitExceeded'
                                     % job[0]['metadata']['name'])
        assert 'RKE2 is not downgraded' in res['msg'] and res['waited'][0]['done'] is False
        emu.clear_requests()
        res = run_playbook(_present_play(emu, dict(args, nodes=[{'name': 'gpu-a-02', 'role': 'agent'}]))).result('apply')
    assert [(e['event'], e['node']) for e in suc.log] == [('start', 'gpu-a-01'), ('fail', 'gpu-a-01')]
    assert res['_event'] == 'runner_on_failed'
    assert ('refusing to write the RKE2 Plan of gpu-a-02 while another RKE2 upgrade is unfinished: Plan '
            'system-upgrade/gpufleet-rke2-agent-gpu-a-01 (node gpu-a-01) is not complete (Complete=False, JobFailed)'
            in res['msg'])
    assert emu.mutating_requests() == []


def test_a_gpu_node_labelled_control_plane_gets_a_server_plan_without_any_per_host_variable(emu, run_playbook):
    """Issue 39 item 8 (review M9 trap 2): the role is the Node's. A GPU node that is an RKE2 server gets a server
    Plan that selects it, and the stand-in upgrades it: no timeout with the node cordoned. A role given that is not
    the Node's is refused before any write, naming both."""
    labels = {'node-role.kubernetes.io/control-plane': 'true', 'nvidia.com/gpu.present': 'true'}
    emu.apply([f.node('gpu-s-01', kubelet_version=CUR, labels=labels)])
    emu.clear_requests()
    args = {'target_rke2': TGT, 'read_cluster': True, 'wait': True, 'wait_timeout': 60, 'wait_interval': 0.1,
            'cordon': False, 'nodes': [{'name': 'gpu-s-01', 'role': 'agent'}]}
    res = run_playbook(_present_play(emu, args)).result('apply')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == ("refusing to render RKE2 Plans: nodes[0].role: node gpu-s-01 is declared an RKE2 agent, but "
                          "its Node is an RKE2 server (label node-role.kubernetes.io/control-plane=true); the Node "
                          "decides: remove the declaration (or correct the Node's labels)")
    assert emu.mutating_requests() == []

    args['nodes'] = [{'name': 'gpu-s-01'}]
    with SucStandIn(emu, delay=0.1) as suc:
        res = run_playbook(_present_play(emu, args)).result('apply')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert [(n['name'], n['role'], n['plan_name']) for n in res['nodes']] == [
        ('gpu-s-01', 'server', 'gpufleet-rke2-server-gpu-s-01')]
    assert res['plans'][0]['spec']['nodeSelector']['matchExpressions'][1] == {
        'key': 'node-role.kubernetes.io/control-plane', 'operator': 'In', 'values': ['true']}
    assert [(e['event'], e['node']) for e in suc.log] == [('start', 'gpu-s-01'), ('finish', 'gpu-s-01')]
    assert [(w['node'], w['done'], w['kubelet_version']) for w in res['waited']] == [('gpu-s-01', True, TGT)]
