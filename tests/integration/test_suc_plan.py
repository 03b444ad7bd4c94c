"""gpufleet.upgrade.suc_plan through ansible-playbook (ansible-runner)."""
from __future__ import annotations

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
