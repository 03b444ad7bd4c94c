"""upgrade_plan module and filters run through ansible-playbook (ansible-runner)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

H100 = '10de:2330/10de:16c1'
A100 = '10de:20b5/10de:1533'
CURRENT = {'driver': '570.172.08', 'gpu_operator': 'v26.3.3'}
TARGET = {'driver': '580.126.20', 'gpu_operator': 'v26.3.4'}


def nodes_40():
    out = []
    for i in range(1, 41):
        out.append({'name': 'gpu-%02d' % i, 'pci_ids': [H100 if i <= 20 else A100], 'platform': 'SYS-821GE',
                    'kernel': '6.8.0-134-generic', 'partition_mode': 'none', 'install_method': 'apt',
                    'current': CURRENT, 'ready': True, 'unschedulable': False, 'gpus': 8})
    return out


def play(tasks):
    return [{'name': 'plan', 'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}]


def test_module_plans_the_worked_example_and_is_read_only(run_playbook):
    r = run_playbook(play([
        {'name': 'plan', 'gpufleet.upgrade.upgrade_plan': {
            'nodes': '{{ fleet }}', 'target': TARGET, 'canaries_per_combination': 2, 'max_unavailable': '20%'},
         'register': 'plan'},
        {'name': 'plan in check mode', 'gpufleet.upgrade.upgrade_plan': {
            'nodes': '{{ fleet }}', 'target': TARGET, 'canaries_per_combination': 2, 'max_unavailable': '20%'},
         'check_mode': True, 'register': 'plan_check'},
        {'name': 'filter', 'ansible.builtin.set_fact': {
            'filtered': "{{ fleet | gpufleet.upgrade.upgrade_plan(target=target, canaries_per_combination=2, "
                        "max_unavailable='20%') }}",
            'line': "{{ '6.11.0-29-generic' | gpufleet.upgrade.kernel_line }}"}},
    ]), extravars={'fleet': nodes_40(), 'target': TARGET})
    assert r.rc == 0, r.stdout
    res = r.result('plan')
    assert res['changed'] is False
    assert res['canaries'] == ['gpu-01', 'gpu-02', 'gpu-21', 'gpu-22']
    assert res['batch_size'] == 4 and res['max_unavailable'] == 8
    assert res['batches'][0] == ['gpu-01', 'gpu-02', 'gpu-21', 'gpu-22']
    assert res['batches'][1] == ['gpu-03', 'gpu-04', 'gpu-05', 'gpu-06']
    assert len(res['batches']) == 10
    assert res['budget']['steps'][1]['unavailable_during'] == 8
    assert '10% of 40 = 4, rounded down = 4' in res['summary']
    assert [c['count'] for c in res['combinations']] == [20, 20]
    check = r.result('plan in check mode')
    assert check['changed'] is False and check['digest'] == res['digest']
    facts = r.result('filter')['ansible_facts']
    assert facts['filtered']['digest'] == res['digest']
    assert facts['line'] == '6.11'


def test_module_refusal_says_why(run_playbook):
    fleet = nodes_40()
    r = run_playbook(play([
        {'name': 'plan', 'gpufleet.upgrade.upgrade_plan': {
            'nodes': '{{ fleet }}', 'target': TARGET, 'canaries_per_combination': 2, 'max_unavailable': '10%'}},
    ]), extravars={'fleet': fleet})
    assert r.rc != 0
    res = r.result('plan')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'].startswith('upgrade plan refused: cannot proceed at node gpu-03: 4 node(s) already out of '
                                 'service (gpu-01: canary still isolated')
    assert 'raise max_unavailable to at least 5' in res['msg']
    assert res['plan']['canaries'] == ['gpu-01', 'gpu-02', 'gpu-21', 'gpu-22']
    assert 'Traceback' not in r.stdout


def test_module_bad_input_and_single_node(run_playbook):
    solo = nodes_40()[:1]
    bad = nodes_40()[:2]
    bad[1]['gpus'] = 'eight'
    r = run_playbook(play([
        {'name': 'solo', 'gpufleet.upgrade.upgrade_plan': {'nodes': '{{ solo }}', 'target': TARGET},
         'ignore_errors': True},
        {'name': 'solo acknowledged', 'gpufleet.upgrade.upgrade_plan': {
            'nodes': '{{ solo }}', 'target': TARGET, 'single_node_pool_acknowledged': True}},
        {'name': 'bad', 'gpufleet.upgrade.upgrade_plan': {'nodes': '{{ bad }}', 'target': TARGET},
         'ignore_errors': True},
        {'name': 'allowance', 'gpufleet.upgrade.upgrade_plan': {
            'nodes': '{{ fleet }}', 'target': TARGET, 'batch_size': 4, 'max_unavailable': 8,
            'failure_allowance': {'gpus': '87%'}}},
        {'name': 'bad filter', 'ansible.builtin.debug': {
            'msg': "{{ bad | gpufleet.upgrade.upgrade_plan(target=target) }}"}, 'ignore_errors': True},
    ]), extravars={'solo': solo, 'bad': bad, 'target': TARGET, 'fleet': nodes_40()})
    assert r.rc == 0, r.stdout
    assert 'set single_node_pool_acknowledged=true' in r.result('solo')['msg']
    ok = r.result('solo acknowledged')
    assert ok['batches'] == [['gpu-01']]
    assert any('single-node GPU pool acknowledged' in w for w in ok.get('warnings', []))
    fa = r.result('allowance')
    # 87% of 320 GPUs: 279 must stay in service; 2 isolated canaries leave 304, so a batch may take
    # 3 nodes (24 GPUs), not the 4 the batch size allows
    assert fa['budget']['failure_allowance']['gpus']['rule'] == '87% of 320 = 278.4, rounded up = 279'
    assert fa['budget']['failure_allowance']['nodes'] is None
    assert fa['batches'][1] == ['gpu-02', 'gpu-03', 'gpu-04']
    assert fa['budget']['steps'][1]['limited_by'] == 'failure_allowance.gpus'
    assert fa['budget']['steps'][1]['in_service_gpus_during'] == 280
    assert r.result('bad')['msg'] == "nodes[1] (gpu-02).gpus: 'eight' is not a non-negative integer"
    assert "gpufleet.upgrade.upgrade_plan: nodes[1] (gpu-02).gpus: 'eight'" in r.result('bad filter')['msg']


def test_kernel_abi_drift_is_decided_at_plan_time(run_playbook):
    """Issue 39 item 4: two kernel ABIs of one line in one combination - refused by default, naming the nodes of each
    kernel (the task fails with that message, no traceback); split on request, each kernel its own combination and
    canary, the split reported as an Ansible warning; the filter takes the same switch."""
    fleet = nodes_40()[:20]
    for n in fleet[10:]:
        n['kernel'] = '6.8.0-131-generic'
        n['current'] = dict(CURRENT, kernel='6.8.0-131-generic')
    for n in fleet[:10]:
        n['current'] = dict(CURRENT, kernel='6.8.0-134-generic')
    r = run_playbook(play([
        {'name': 'default', 'gpufleet.upgrade.upgrade_plan': {'nodes': '{{ fleet }}', 'target': TARGET},
         'ignore_errors': True},
        {'name': 'split', 'gpufleet.upgrade.upgrade_plan': {
            'nodes': '{{ fleet }}', 'target': TARGET, 'source_drift': 'split'}},
        {'name': 'filter', 'ansible.builtin.set_fact': {
            'filtered': "{{ fleet | gpufleet.upgrade.upgrade_plan(target=target, source_drift='split') }}"}},
    ]), extravars={'fleet': fleet, 'target': TARGET})
    assert r.rc == 0, r.stdout
    refused = r.result('default')
    assert refused['_event'] == 'runner_on_failed'
    assert 'source-tuple drift in combination pci_ids=%s|' % H100 in refused['msg']
    assert ('kernel 6.8.0-131-generic on 10 node(s): gpu-11, gpu-12, gpu-13, gpu-14, gpu-15, gpu-16, gpu-17, gpu-18, '
            '… (+2)') in refused['msg']
    assert refused['plan']['source_drift'][0]['sources'][0]['nodes'] == ['gpu-%02d' % i for i in range(11, 21)]
    split = r.result('split')
    assert [c['count'] for c in split['combinations']] == [10, 10]
    assert split['canaries'] == ['gpu-01', 'gpu-11']
    assert any('split into 2 combinations' in w for w in split['warnings'])
    assert r.result('filter')['ansible_facts']['filtered']['digest'] == split['digest']
    assert 'Traceback' not in r.stdout


def test_platform_from_the_hosts_dmi_where_no_label_names_it(run_playbook):
    """Issue 39 item 9: bare-metal Nodes without a platform or instance-type label were all platform `unknown`, so
    two server platforms made one combination with one canary; the hosts' DMI identity (gpu_info's `dmi`) now
    tells them apart, and a label still wins."""
    def facts(vendor, product):
        return {'pci_ids': [H100], 'driver_version': CURRENT['driver'], 'gpus': [{'mig_mode': {'current': False}}],
                'dmi': {'sys_vendor': vendor, 'product_name': product, 'board_vendor': None, 'board_name': None}}
    hosts = {'gpu-1': facts('Supermicro', 'SYS-821GE-TNHR'), 'gpu-2': facts('Dell Inc.', 'PowerEdge XE9680'),
             'gpu-3': facts('Dell Inc.', 'PowerEdge XE9680')}
    inventory = {'all': {'hosts': dict({h: {'ansible_connection': 'local', 'gpufleet_gpu_facts': v}
                                        for h, v in hosts.items()},
                                       localhost={'ansible_connection': 'local'})}}
    node = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'ready': True, 'unschedulable': False, 'gpus': 8}
    fleet = {'cluster': {'gpu_operator': CURRENT['gpu_operator'], 'dcgm_exporter': None},
             'nodes': [dict(node, name='gpu-1', platform='unknown', labels={}),
                       dict(node, name='gpu-2', platform='unknown', labels={}),
                       dict(node, name='gpu-3', platform='dgx-like', labels={'gpufleet.io/platform': 'dgx-like'})]}
    r = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [{
        'name': 'plan', 'ansible.builtin.set_fact': {
            'plan': "{{ fleet | gpufleet.upgrade.planner_nodes(hostvars, {}, 'apt', hosts=['gpu-1', 'gpu-2', 'gpu-3'])"
                    " | gpufleet.upgrade.upgrade_plan(target=target, max_unavailable=3) }}"}}]}],
        extravars={'fleet': fleet, 'target': TARGET}, inventory=inventory)
    assert r.rc == 0, r.stdout
    plan = r.result('plan')['ansible_facts']['plan']
    assert sorted(c['key']['platform'] for c in plan['combinations']) == [
        'Dell Inc. PowerEdge XE9680', 'Supermicro SYS-821GE-TNHR', 'dgx-like']
    assert sorted(plan['canaries']) == ['gpu-1', 'gpu-2', 'gpu-3']
