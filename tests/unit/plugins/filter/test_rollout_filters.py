"""The rollout filters: thin wrappers over _upgrade_state, _rollout, _plan and _node_record whose
errors are AnsibleFilterError naming the filter."""
from __future__ import annotations

import jinja2
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.filter import rollout as F
from ansible_collections.gpufleet.upgrade.plugins.module_utils._node_record import ANN_DONE, CANARY_KEY, STEP_NAMES

TARGET = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.126.20'}
KEY = 'driver=580.126.20,kernel=6.8.0-134-generic,rke2=v1.35.3+rke2r3'
PLAN = {
    'max_unavailable': 2, 'canaries': ['gpu-01'],
    'budget': {'failure_allowance': {'nodes': None, 'gpus': {'resolved': 8}}},
    'combinations': [{'key': {'pci_ids': '10de:2330/10de:16c1'}, 'nodes': ['gpu-01', 'gpu-02', 'gpu-03'],
                      'source_tuples': [dict(TARGET, driver='570.172.08')]}],
    'batches': [['gpu-01'], ['gpu-02', 'gpu-03']],
}
NAMES = ['target_key', 'pci_slug', 'combination_slug', 'live_tuple_problems', 'snapshot_file', 'batch_admission', 'node_failure', 'gate_results',
         'rollout_node_entry', 'unfinished_nodes', 'rollback_result', 'tuple_gate', 'plan_gate_entries', 'plan_digest',
         'forks_verdict', 'rollback_time', 'activation', 'observation_window', 'observation_verdict',
         'observation_settings', 'observation_hosts', 'observation_share', 'observation_gpu', 'plan_workflow_digest', 'observation_cases',
         'operator_revisions', 'operands_back', 'operand_window_verdict', 'rollback_activation', 'install_method_verdict',
         'plan_nodes', 'plan_serial', 'expected_gpus', 'inventory_hosts', 'node_names', 'node_python']


def fleet():
    return [{'name': n, 'unschedulable': False, 'ready': True, 'labels': {}, 'gpus': 8}
            for n in ('gpu-01', 'gpu-02', 'gpu-03')]


def test_filters():
    filters = F.FilterModule().filters()
    assert sorted(filters) == sorted(NAMES)
    assert all(filters[n] is getattr(F, n) for n in NAMES)


def test_values():
    assert F.target_key(TARGET) == KEY
    assert F.pci_slug('10de:2330/10de:16c1,10de:2331/10de:16c1') == '10de2330-10de16c1-10de2331-10de16c1'
    assert F.pci_slug(['10de:2330']) == '10de2330'
    assert F.snapshot_file('/snap', 'gpu-01', TARGET) == \
        '/snap/gpu-01--driver_580.126.20_kernel_6.8.0-134-generic_rke2_v1.35.3_rke2r3.json'
    assert F.snapshot_file('/', 'gpu-01', TARGET) == \
        '/gpu-01--driver_580.126.20_kernel_6.8.0-134-generic_rke2_v1.35.3_rke2r3.json'
    assert F.node_failure('install') == {'phase': 'install', 'rollback': True, 'hint': '', 'cordon': True}
    assert F.node_failure('kernel_check', True, {'recorded': None, 'stale_target': None})['cordon'] is False
    assert F.node_failure('install', False)['rollback'] is False
    assert F.node_failure('drain', True)['rollback'] is False
    assert F.node_failure('activate', True, None, True)['rollback'] is False    # the cordon was lost (T3-2)
    assert F.node_failure('activate', True, None, False)['rollback'] is True
    gates = F.gate_results({'gpu': {'passed': True, 'msg': 'ok'}, 'node': {'passed': False, 'msg': 'NotReady'}},
                           'gpu-02')
    assert (gates['passed'], gates['msg'], len(gates['evidence'])) == (
        False, 'critical gate failed on gpu-02: NotReady', 2)
    nodes = fleet()
    nodes[0]['labels'] = {CANARY_KEY: 'true'}
    a = F.batch_admission(nodes, ['gpu-02'], PLAN)
    assert (a['admitted'], a['out'], a['unavailable'], a['gpus_in_service']) == (True, ['gpu-01'], 2, 8)
    e = F.rollout_node_entry(PLAN, 'gpu-01', result={'driver_now': '580.126.20'}, failed_phase='gates',
                             message='critical gate failed', dra=True, started='2026-12-01T11:00:00Z')
    assert (e['role'], e['batch'], e['verdict'], e['failed_phase'], e['tuple_after']) == (
        'canary', 0, 'failed', 'gates', TARGET)
    assert e['phases'] == ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify']
    node_gate = {'passed': True, 'measured': {'kernel': TARGET['kernel'], 'rke2': TARGET['rke2']}}
    booted = {'verification': {'running_kernel': TARGET['kernel']}}
    assert F.tuple_gate(TARGET, booted, {'driver_version': '580.126.20'}, node_gate)['passed'] is True
    with pytest.raises(AnsibleFilterError, match=r'^gpufleet.upgrade.tuple_gate: target: \[\] is not a tuple'):
        F.tuple_gate([], booted, {}, node_gate)
    assert F.unfinished_nodes([{'name': 'gpu-01', 'annotations': {ANN_DONE: KEY}}, {'name': 'gpu-02'}],
                              TARGET) == ['gpu-02']
    # canaries first, then the batches, each node once
    assert F.plan_nodes(PLAN) == ['gpu-01', 'gpu-02', 'gpu-03']
    assert F.plan_nodes({'canaries': ['c'], 'batches': [['a', 'c'], ['b']]}) == ['c', 'a', 'b']
    # the batch play's serial: each batch's size, in the plan's order
    assert F.plan_serial(PLAN) == [1, 2]
    assert F.plan_serial({'batches': [['a', 'b', 'c'], ['d'], ['e', 'f']]}) == [3, 1, 2]


def test_node_failure_coerces_the_switch():
    # a role variable from the command line may be the string "false": the filter is handed a bool
    assert F.node_failure('gates', 0)['rollback'] is False
    assert F.node_failure('gates', 1)['rollback'] is True


def test_plan_digest_round_trip():
    entries = F.plan_gate_entries([{'item': {'id': 'c1'}, 'msg': 'PASS'}], 'a' * 64, 'plan.json')
    assert F.plan_digest({'gates': entries}, 'a' * 64, 'plan.json')['ok'] is True
    assert F.plan_digest({'gates': entries}, 'b' * 64, 'plan.json')['ok'] is False


def test_in_a_template():
    env = jinja2.Environment(autoescape=False)
    env.filters.update(F.FilterModule().filters())
    assert env.from_string("{{ ids | pci_slug }}").render(ids='10de:2330,10de:2331') == '10de2330-10de2331'
    assert env.from_string("{{ (step | node_failure(false)).rollback }}").render(step='activate') == 'False'
    assert env.from_string("{{ (plan | rollout_node_entry('gpu-02', dra=false, failed_phase=none)).verdict }}").render(
        plan=PLAN) == 'upgraded'


@pytest.mark.parametrize('name,args,kwargs,message', [
    ('target_key', ({},), {}, 'target: expected a non-empty mapping of tuple components, got {}'),
    ('target_key', ({'driver': 'a=b'},), {}, 'target.driver: \'a=b\' may not contain "," or "="'),
    ('pci_slug', ('',), {}, "pci_ids: '' is not a PCI id list (e.g. 10de:2330 or 10de:2330,10de:2331)"),
    ('pci_slug', (None,), {}, 'pci_ids: None is not a PCI id list (e.g. 10de:2330 or 10de:2330,10de:2331)'),
    ('snapshot_file', ('/snap', '', TARGET), {}, "node: '' is not a node name"),
    ('snapshot_file', ('/snap', 'gpu-01', {}), {}, 'target: expected a non-empty mapping of tuple components, got {}'),
    ('batch_admission', (fleet(), ['gpu-01'], {}), {},
     'plan.max_unavailable: None is not a whole number >= 0 (is this a reviewed plan?)'),
    ('batch_admission', ([{'gpus': 8}], ['gpu-01'], PLAN), {}, "nodes[0]: {'gpus': 8} is not a node with a name"),
    ('batch_admission', (fleet(), 'gpu-01', PLAN), {}, "batch: 'gpu-01' is not a list of node names"),
    ('batch_admission', (fleet(), ['gpu-01'], dict(PLAN, max_unavailable=True)), {},
     'plan.max_unavailable: True is not a whole number >= 0 (is this a reviewed plan?)'),
    ('gate_results', (['gpu'], 'gpu-01'), {}, 'results: expected a mapping of gate name to registered result, got list'),
    ('gate_results', (None, 'gpu-01'), {},
     'results: expected a mapping of gate name to registered result, got NoneType'),
    ('node_failure', ('holders',), {}, "step: 'holders' is not one of " + ', '.join(STEP_NAMES)),
    ('node_failure', ('Install | Step',), {}, "step: 'Install | Step' is not one of " + ', '.join(STEP_NAMES)),
    ('node_failure', ('progress', True, 'none'), {},
     "progress: expected the state upgrade_state returns (a mapping), got 'none'"),
    ('rollout_node_entry', (PLAN, 'gpu-99'), {}, "host 'gpu-99' is in no combination of the plan"),
    ('rollout_node_entry', (PLAN, 'gpu-02'), {'failed_phase': 'unknown'},
     "step: 'unknown' is not one of " + ', '.join(STEP_NAMES)),
    ('unfinished_nodes', ([{'name': 'gpu-01'}], None), {},
     'target: expected a non-empty mapping of tuple components, got None'),
    ('forks_verdict', ([['gpu-01']], True), {}, 'forks: True is not a positive whole number'),
    ('plan_nodes', ({'batches': 'gpu-01'},), {}, "plan: {'batches': 'gpu-01'} has no list of batches (each a list of node names)"),
    ('plan_nodes', ([],), {}, 'plan: [] has no list of batches (each a list of node names)'),
    ('plan_serial', ({'batches': []},), {}, "plan: {'batches': []} has no batches (each a non-empty list of node names)"),
    ('plan_serial', ({'batches': [['a'], []]},), {},
     "plan: {'batches': [['a'], []]} has no batches (each a non-empty list of node names)"),
    ('plan_serial', ({'batches': [['a', 3]]},), {},
     "plan: {'batches': [['a', 3]]} has no batches (each a non-empty list of node names)"),
    ('plan_serial', (None,), {}, 'plan: None has no batches (each a non-empty list of node names)'),
    ('rollback_time', ('gpu-01', 10, 5), {}, 'end: 5 is before start 10'),
    ('forks_verdict', ('gpu-01', 5), {}, "batches: expected the plan's list of node-name lists, got str"),
    ('plan_digest', ({}, 'abc', 'plan.json'), {}, "plan_sha256: 'abc' is not a SHA-256 (64 lowercase hex digits)"),
    ('plan_gate_entries', ([{'msg': 'x'}], 'a' * 64, 'plan.json'), {},
     'results[0]: not a loop result with the combination as its item'),
])
def test_errors_name_the_filter(name, args, kwargs, message):
    with pytest.raises(AnsibleFilterError) as err:
        getattr(F, name)(*args, **kwargs)
    assert err.value.message == 'gpufleet.upgrade.%s: %s' % (name, message)


def test_operand_window_verdict_filter():
    state = {'nodes': {'gpu-2': [{'operand': 'dp', 'pod': 'dp-a', 'revision': 'old', 'current': False}],
                       'gpu-3': [{'operand': 'dp', 'pod': 'dp-b', 'revision': 'new', 'current': True}]}}
    nodes = [{'name': 'gpu-2', 'annotations': {}}, {'name': 'gpu-3', 'annotations': {}}]
    v = F.operand_window_verdict(state, nodes, ['gpu-2', 'gpu-3'], TARGET)
    assert v['ok'] is False and [m['node'] for m in v['moved']] == ['gpu-3']
    with pytest.raises(AnsibleFilterError, match=r'^gpufleet.upgrade.operand_window_verdict: pending: '):
        F.operand_window_verdict(state, nodes, 'gpu-2', TARGET)


def test_operands_back_filter():
    assert F.operands_back(True, {'changed': True}) is True
    assert F.operands_back(True, {'changed': False}, 'operator') is True
    with pytest.raises(AnsibleFilterError, match="^gpufleet.upgrade.operands_back: gpu_operator_managed: 'true' is not"):
        F.operands_back('true', {'changed': True})


def test_rollback_activation_filter():
    assert F.rollback_activation('auto', {'steps': [{'action': 'reboot'}]}) == 'reboot'
    assert F.rollback_activation('lab', {'steps': []}, False) == 'reload'
    with pytest.raises(AnsibleFilterError, match="^gpufleet.upgrade.rollback_activation: decision: None has no list"):
        F.rollback_activation('auto', None)


def test_install_method_verdict_filter():
    assert F.install_method_verdict(PLAN, 'apt')['ok'] is True
    with pytest.raises(AnsibleFilterError, match="^gpufleet.upgrade.install_method_verdict: gpufleet_install_method: None"):
        F.install_method_verdict(PLAN, None)


def test_observation_filters_name_the_bad_input():
    with pytest.raises(AnsibleFilterError, match="observation_window: gpufleet_observation_window: 'soon' is not a duration"):
        F.observation_window('soon', 0, 0)
    with pytest.raises(AnsibleFilterError, match='observation_verdict: plan: has no target tuple'):
        F.observation_verdict([], {}, {})


def test_observation_share_and_gpu_through_the_filters():
    regate = {'hosts': ['h1', 'h2'], 'nodes': {'h1': 'n1', 'h2': 'n2'}}
    assert F.observation_share(regate['hosts'], ['w1', 'w2'], 'w2') == ['h2']
    gpu = F.observation_gpu([{'results': [{'item': 'h2', 'passed': True}]}], regate)
    assert gpu['n2'] == {'item': 'h2', 'passed': True} and gpu['n1']['passed'] is False
    with pytest.raises(AnsibleFilterError, match="observation_share: worker: 'w3' is not one of"):
        F.observation_share(['h1'], ['w1'], 'w3')
    with pytest.raises(AnsibleFilterError, match='observation_gpu: registered: '):
        F.observation_gpu({}, regate)


def test_observation_hosts_reads_each_hosts_result_from_hostvars():
    hostvars = {'h1': {'node_upgrade_result': {'node': 'n1', 'outcome': 'upgraded', 'snapshot': '/s/n1.json'}},
                'h2': {'other': 1}, 'h3': {'node_upgrade_result': {'node': 'n3', 'outcome': 'upgraded', 'snapshot': 's'}}}
    sel = F.observation_hosts(hostvars, ['n1', 'n2', 'n3'], ['h1', 'h2', 'h4'])
    assert sel['hosts'] == ['h1'] and sorted(sel['not_regated']) == ['n2', 'n3']
    with pytest.raises(AnsibleFilterError, match='observation_hosts: upgraded: '):
        F.observation_hosts({}, 'n1')


def test_node_python_names_each_refused_node_with_the_interpreter_its_hostvars_set():
    """Issue 39 item 1: the looped setup of tasks/node_python.yml; a node whose setup could not run is named with its
    ansible_python_interpreter."""
    ok = {'item': 'h1', 'ansible_facts': {'ansible_python': {'version_info': [3, 12, 1, 'final', 0], 'executable': '/p3'}}}
    old = {'item': 'h2', 'ansible_facts': {'ansible_python': {'version_info': [3, 8, 18, 'final', 0], 'executable': '/p38'}}}
    broken = {'item': 'h3', 'failed': True, 'module_stderr': 'SyntaxError: invalid syntax\n'}
    hostvars = {'h1': {}, 'h2': {'ansible_python_interpreter': '/usr/bin/python3'}, 'h3': {'ansible_python_interpreter': '/usr/bin/python'}}
    assert F.node_python({'results': [ok]}, hostvars) == []
    out = F.node_python({'results': [ok, old, broken]}, hostvars)
    assert len(out) == 2
    assert out[0].startswith('h2: Python 3.8.18 (/p38) is older than the Python 3.9 ')
    assert out[1].startswith('h3: Ansible could not run a Python module with /usr/bin/python (SyntaxError: invalid syntax)')
    assert 'ansible_python_interpreter' in out[1]
    assert F.node_python({'results': [broken]})[0].startswith('h3: Ansible could not run a Python module with the interpreter')
    # setup's result on one host (tasks/node_python.yml: not looped, the host given)
    single = {k: v for k, v in old.items() if k != 'item'}
    assert F.node_python(single, hostvars, 'h2') == out[:1]
    assert F.node_python({k: v for k, v in ok.items() if k != 'item'}, hostvars, 'h1') == []
    with pytest.raises(AnsibleFilterError, match='^gpufleet.upgrade.node_python: setup results: .* are not a list'):
        F.node_python('h1', hostvars)
