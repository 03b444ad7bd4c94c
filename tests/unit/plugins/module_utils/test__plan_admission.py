"""One definition of out of service (out_of_service_reasons) for the planner and the rollout's batch
admission (batch_admission), and the planner counting a canary-labelled node as out of service."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _plan
from ansible_collections.gpufleet.upgrade.plugins.module_utils._node_record import CANARY_KEY

H100 = '10de:2330/10de:16c1'
CURRENT = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '570.172.08'}
TARGET = dict(CURRENT, driver='580.126.20')
CANARY = {CANARY_KEY: 'true'}


def pool_node(name, **kw):
    """A node as fleet_info reads it (what batch_admission gets)."""
    n = {'name': name, 'unschedulable': False, 'ready': True, 'labels': {}, 'gpus': 8}
    n.update(kw)
    return n


def pool(n, **kw):
    return [pool_node('gpu-%02d' % i, **kw) for i in range(1, n + 1)]


def reviewed(max_unavailable, nodes=None, gpus=None):
    fa = {}
    if nodes is not None:
        fa['nodes'] = {'requested': nodes, 'resolved': nodes, 'rule': '%d (a count)' % nodes}
    if gpus is not None:
        fa['gpus'] = {'requested': gpus, 'resolved': gpus, 'rule': '%d (a count)' % gpus}
    return {'max_unavailable': max_unavailable,
            'budget': {'failure_allowance': {'nodes': fa.get('nodes'), 'gpus': fa.get('gpus')}}}


# ---------------------------------------------------------------------------- out_of_service_reasons

@pytest.mark.parametrize('unschedulable,ready,labels,reasons', [
    (False, True, {}, []),
    (False, True, None, []),
    (False, True, {'gpufleet.io/other': 'x', 'nvidia.com/gpu.present': 'true'}, []),
    (True, True, {}, ['cordoned']),
    (False, False, {}, ['NotReady']),
    (False, True, CANARY, ['canary still isolated']),
    # the label counts whatever its value
    (False, True, {CANARY_KEY: ''}, ['canary still isolated']),
    (True, False, CANARY, ['cordoned', 'NotReady', 'canary still isolated']),
])
def test_out_of_service_reasons(unschedulable, ready, labels, reasons):
    assert _plan.out_of_service_reasons(unschedulable, ready, labels) == reasons


def test_out_of_service_reasons_is_public():
    assert 'out_of_service_reasons' in _plan.__all__ and 'batch_admission' in _plan.__all__


# ---------------------------------------------------------------------------- batch_admission

def test_admitted_with_nothing_out():
    a = _plan.batch_admission(pool(10), ['gpu-01', 'gpu-02'], reviewed(2))
    assert a == {'admitted': True, 'out': [], 'batch_in': ['gpu-01', 'gpu-02'], 'unavailable': 2,
                 'max_unavailable': 2, 'nodes_in_service': 8, 'gpus_in_service': 64,
                 'msg': "batch ['gpu-01', 'gpu-02']: 2 node(s) out of service during the batch (max 2)"}


@pytest.mark.parametrize('kw', [{'unschedulable': True}, {'ready': False}, {'labels': CANARY},
                                {'unschedulable': True, 'ready': False, 'labels': CANARY}])
def test_an_out_of_service_node_counts(kw):
    nodes = pool(10)
    nodes[9].update(kw)     # gpu-10
    a = _plan.batch_admission(nodes, ['gpu-01', 'gpu-02'], reviewed(2))
    assert (a['admitted'], a['out'], a['batch_in'], a['unavailable']) == (False, ['gpu-10'], ['gpu-01', 'gpu-02'], 3)
    assert a['msg'] == ("batch ['gpu-01', 'gpu-02'] refused: 1 node(s) out of service now (gpu-10) plus 2 of this "
                        "batch = 3 > max_unavailable 2, or capacity in service (7 nodes, 56 GPUs) below the failure "
                        "allowance (nodes None, GPUs None)")
    assert _plan.batch_admission(nodes, ['gpu-01', 'gpu-02'], reviewed(3))['admitted'] is True


def test_batch_nodes_already_out_are_not_counted_twice():
    nodes = pool(10)
    nodes[0]['unschedulable'] = True         # gpu-01: cordoned by a previous run (a rerun)
    nodes[1]['ready'] = False                # gpu-02: NotReady
    nodes[5]['labels'] = dict(CANARY)        # gpu-06: an isolated canary
    a = _plan.batch_admission(nodes, ['gpu-01', 'gpu-02', 'gpu-03'], reviewed(4))
    assert a['out'] == ['gpu-01', 'gpu-02', 'gpu-06']
    assert a['batch_in'] == ['gpu-03']
    assert (a['admitted'], a['unavailable'], a['nodes_in_service'], a['gpus_in_service']) == (True, 4, 6, 48)
    assert a['msg'] == "batch ['gpu-01', 'gpu-02', 'gpu-03']: 4 node(s) out of service during the batch (max 4)"


def test_a_node_listed_twice_is_one_node():
    nodes = pool(4)
    nodes.append(dict(nodes[3]))                       # gpu-04 twice
    nodes.append(pool_node('gpu-01', unschedulable=True))  # gpu-01 twice: the first view counts
    a = _plan.batch_admission(nodes, ['gpu-02'], reviewed(1, gpus=24))
    assert (a['out'], a['unavailable'], a['nodes_in_service'], a['gpus_in_service']) == ([], 1, 3, 24)
    assert a['admitted'] is True


def test_max_unavailable_refuses():
    nodes = pool(6)
    nodes[4]['unschedulable'] = True
    nodes[5]['labels'] = dict(CANARY)
    a = _plan.batch_admission(nodes, ['gpu-01', 'gpu-02'], reviewed(3))
    assert (a['admitted'], a['unavailable'], a['max_unavailable']) == (False, 4, 3)
    assert a['msg'] == ("batch ['gpu-01', 'gpu-02'] refused: 2 node(s) out of service now (gpu-05, gpu-06) plus 2 of "
                        "this batch = 4 > max_unavailable 3, or capacity in service (2 nodes, 16 GPUs) below the "
                        "failure allowance (nodes None, GPUs None)")


def test_failure_allowance_gpus_refuses():
    nodes = pool(6)
    nodes[0]['gpus'] = 4
    # in service during the batch: gpu-03..06, 32 GPUs
    assert _plan.batch_admission(nodes, ['gpu-01', 'gpu-02'], reviewed(6, gpus=32))['admitted'] is True
    a = _plan.batch_admission(nodes, ['gpu-01', 'gpu-02'], reviewed(6, gpus=33))
    assert (a['admitted'], a['unavailable'], a['gpus_in_service']) == (False, 2, 32)
    assert a['msg'] == ("batch ['gpu-01', 'gpu-02'] refused: 0 node(s) out of service now () plus 2 of this batch = "
                        "2 > max_unavailable 6, or capacity in service (4 nodes, 32 GPUs) below the failure allowance "
                        "(nodes None, GPUs 33)")


def test_failure_allowance_nodes_refuses():
    nodes = pool(6)
    nodes[5]['ready'] = False
    # in service during the batch: gpu-03..05
    assert _plan.batch_admission(nodes, ['gpu-01', 'gpu-02'], reviewed(6, nodes=3))['admitted'] is True
    a = _plan.batch_admission(nodes, ['gpu-01', 'gpu-02'], reviewed(6, nodes=4, gpus=8))
    assert (a['admitted'], a['nodes_in_service'], a['gpus_in_service']) == (False, 3, 24)
    assert a['msg'].endswith('capacity in service (3 nodes, 24 GPUs) below the failure allowance (nodes 4, GPUs 8)')


def test_out_of_service_gpus_are_not_in_service():
    nodes = pool(4)
    nodes[3]['labels'] = dict(CANARY)
    a = _plan.batch_admission(nodes, [], reviewed(1, gpus=24))
    assert (a['admitted'], a['out'], a['batch_in'], a['unavailable'], a['gpus_in_service']) == (
        True, ['gpu-04'], [], 1, 24)


def test_missing_gpus_count_as_zero():
    nodes = [pool_node('gpu-01', gpus=None), {'name': 'gpu-02', 'ready': True}]
    a = _plan.batch_admission(nodes, ['gpu-01'], reviewed(1))
    assert (a['admitted'], a['out'], a['gpus_in_service'], a['nodes_in_service']) == (True, [], 0, 1)


def test_absent_ready_is_not_ready():
    a = _plan.batch_admission([{'name': 'gpu-01'}, pool_node('gpu-02')], ['gpu-02'], reviewed(2))
    assert a['out'] == ['gpu-01'] and a['unavailable'] == 2


@pytest.mark.parametrize('plan,shown', [
    ({}, 'None'), ({'max_unavailable': '2'}, "'2'"), ({'max_unavailable': None}, 'None'),
    (None, 'None'), ('plan.json', "'plan.json'"),
])
def test_the_plan_must_be_reviewed(plan, shown):
    with pytest.raises(_plan.PlanInputError) as err:
        _plan.batch_admission(pool(2), ['gpu-01'], plan)
    assert str(err.value) == 'plan.max_unavailable: %s is not a whole number >= 0 (is this a reviewed plan?)' % shown


@pytest.mark.parametrize('bad,shown', [({'gpus': 8}, "{'gpus': 8}"), ('gpu-02', "'gpu-02'"), ({'name': 2}, "{'name': 2}")])
def test_nodes_need_a_name(bad, shown):
    with pytest.raises(_plan.PlanInputError) as err:
        _plan.batch_admission([pool_node('gpu-01'), bad], ['gpu-01'], reviewed(2))
    assert str(err.value) == 'nodes[1]: %s is not a node with a name' % shown


# ---------------------------------------------------------------------------- planner and admission agree

def plan_node(name, **kw):
    n = {'name': name, 'pci_ids': [H100], 'platform': 'SYS-821GE-TNHR', 'kernel': '6.8.0-134-generic',
         'partition_mode': 'none', 'install_method': 'apt', 'current': dict(CURRENT), 'ready': True,
         'unschedulable': False, 'gpus': 8}
    n.update(kw)
    return n


def test_planner_counts_a_canary_labelled_node_as_out_of_service():
    nodes = [plan_node('gpu-%02d' % i) for i in range(1, 9)]
    nodes[4]['labels'] = dict(CANARY)                            # gpu-05: a canary of an earlier run, still isolated
    nodes[6]['labels'] = dict(CANARY)
    nodes[6]['unschedulable'] = True                             # gpu-07: and cordoned
    plan = _plan.build_plan(nodes, target=TARGET, batch_size=2, max_unavailable=4)
    assert plan['budget']['out_of_service_now'] == [
        {'name': 'gpu-05', 'reason': 'canary still isolated', 'gpus': 8},
        {'name': 'gpu-07', 'reason': 'cordoned, canary still isolated', 'gpus': 8}]
    assert plan['budget']['steps'][0]['out_of_service_before'] == 2
    # an out-of-service node costs nothing in its batch
    assert any('gpu-05' in b and len(b) == 2 for b in plan['batches'])


def test_planner_refuses_when_isolated_canaries_fill_the_budget():
    nodes = [plan_node('gpu-%02d' % i) for i in range(1, 7)]
    for n in nodes[3:5]:
        n['labels'] = dict(CANARY)
    with pytest.raises(_plan.PlanRefused) as exc:
        _plan.build_plan(nodes, target=TARGET, max_unavailable=2)
    assert exc.value.problems == [
        'cannot proceed at node gpu-01: 2 node(s) already out of service (gpu-04: canary still isolated, '
        'gpu-05: canary still isolated) + 1 = 3 > max_unavailable 2 (2 (a count)); raise max_unavailable to at '
        'least 3, or return nodes to service']


def test_every_planned_batch_is_admitted_as_the_planner_computed_it():
    """Replay the plan: before each batch the pool is as the rollout leaves it (the planned canaries
    isolated after their batch, other upgraded nodes back in service, pre-existing outages kept)."""
    nodes = [plan_node('gpu-%02d' % i, gpus=8 if i % 3 else 4) for i in range(1, 21)]
    nodes[9]['unschedulable'] = True
    nodes[13]['ready'] = False
    nodes[16]['labels'] = dict(CANARY)
    plan = _plan.build_plan(nodes, target=TARGET, canaries_per_combination=2, batch_size=4, max_unavailable=6,
                            failure_allowance={'gpus': 80, 'nodes': 12})
    view = dict((n['name'], {'name': n['name'], 'unschedulable': n['unschedulable'], 'ready': n['ready'],
                             'labels': dict(n.get('labels') or {}), 'gpus': n['gpus']}) for n in nodes)
    refused = 0
    for i, (batch, step) in enumerate(zip(plan['batches'], plan['budget']['steps'])):
        a = _plan.batch_admission(list(view.values()), batch, plan)
        assert a['admitted'], a['msg']
        assert (a['unavailable'], a['nodes_in_service'], a['gpus_in_service']) == (
            step['unavailable_during'], step['in_service_nodes_during'], step['in_service_gpus_during']), batch
        # a batch the budget shrank, with the next node in service added, is refused
        nxt = view[plan['batches'][i + 1][0]] if i + 1 < len(plan['batches']) else None
        if step['shrunk'] and nxt and not _plan.out_of_service_reasons(nxt['unschedulable'], nxt['ready'], nxt['labels']):
            assert not _plan.batch_admission(list(view.values()), batch + [nxt['name']], plan)['admitted']
            refused += 1
        for name in batch:
            if name in plan['canaries']:
                view[name]['labels'][CANARY_KEY] = 'true'
    assert refused


# ---- planner_nodes: the planner's input from fleet_info, the hosts' NVML facts and the holders

FLEET = {'cluster': {'gpu_operator': 'v25.3.0', 'dcgm_exporter': '4.2.3-4.1.3'},
         'nodes': [{'name': 'gpu-1', 'platform': 'dgx-h100', 'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3',
                    'ready': True, 'unschedulable': False, 'gpus': 8,
                    'labels': {'a': 'b', 'gpufleet.io/platform': 'dgx-h100'}},
                   {'name': 'gpu-2', 'platform': 'dgx-h100', 'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3',
                    'ready': False, 'unschedulable': True, 'gpus': 8, 'labels': {'gpufleet.io/platform': 'dgx-h100'}}]}
FACTS = {'gpu-1': {'pci_ids': ['10de:2330/10de:16c1'], 'driver_version': '580.126.20',
                   'gpus': [{'mig_mode': {'current': False}}, {'mig_mode': {'current': True}}]}}


def test_planner_nodes_joins_the_api_view_the_nvml_facts_and_the_holders():
    nodes = _plan.planner_nodes(FLEET, FACTS, {'gpu-1': {'total': 3}}, 'apt')
    assert nodes[0] == {
        'name': 'gpu-1', 'pci_ids': ['10de:2330/10de:16c1'], 'platform': 'dgx-h100', 'kernel': '6.8.0-134-generic',
        'partition_mode': 'mig', 'install_method': 'apt',
        'current': {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.126.20',
                    'gpu_operator': 'v25.3.0', 'dcgm_exporter': '4.2.3-4.1.3'},
        'ready': True, 'unschedulable': False, 'gpus': 8, 'holders': 3,
        'labels': {'a': 'b', 'gpufleet.io/platform': 'dgx-h100'}}
    # No NVML facts: PCI identity unknown (its own combination), no driver, no MIG, no holders counted.
    assert nodes[1]['pci_ids'] == ['unknown'] and nodes[1]['current']['driver'] is None
    assert nodes[1]['partition_mode'] == 'none' and nodes[1]['holders'] == 0


def test_planner_nodes_feed_the_planner():
    plan = _plan.build_plan(_plan.planner_nodes(FLEET, dict(FACTS, **{'gpu-2': FACTS['gpu-1']}), {}),
                            target={'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.130.00',
                                    'gpu_operator': 'v25.3.0', 'dcgm_exporter': '4.2.3-4.1.3'},
                            max_unavailable=2, single_node_pool_acknowledged=True)
    assert plan['canaries'] == ['gpu-1']


SMC = {'sys_vendor': 'Supermicro', 'product_name': 'SYS-821GE-TNHR', 'board_vendor': 'Supermicro',
       'board_name': 'X13DEG-OAD'}
DELL = {'sys_vendor': 'Dell Inc.', 'product_name': 'PowerEdge XE9680', 'board_vendor': 'Dell Inc.', 'board_name': '0XXXXX'}


def bare_metal_fleet(*names):
    """fleet_info's view of bare-metal Nodes that no platform or instance-type label names."""
    return {'cluster': FLEET['cluster'],
            'nodes': [{'name': n, 'platform': 'unknown', 'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3',
                       'ready': True, 'unschedulable': False, 'gpus': 8, 'labels': {'kubernetes.io/hostname': n}}
                      for n in names]}


def test_planner_nodes_platform_falls_back_to_the_hosts_dmi_identity():
    """Issue 39 item 9: without a label, two server platforms were both `unknown` - one combination, one canary."""
    facts = {'gpu-1': dict(FACTS['gpu-1'], dmi=SMC), 'gpu-2': dict(FACTS['gpu-1'], dmi=DELL),
             'gpu-3': dict(FACTS['gpu-1'], dmi=dict.fromkeys(SMC))}
    nodes = _plan.planner_nodes(bare_metal_fleet('gpu-1', 'gpu-2', 'gpu-3', 'gpu-4'), facts, {})
    assert [n['platform'] for n in nodes] == ['Supermicro SYS-821GE-TNHR', 'Dell Inc. PowerEdge XE9680',
                                              'unknown', 'unknown']
    plan = _plan.build_plan(nodes[:2], target={'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3',
                                               'driver': '580.130.00', 'gpu_operator': 'v25.3.0',
                                               'dcgm_exporter': '4.2.3-4.1.3'},
                            max_unavailable=2)
    assert [c['key']['platform'] for c in plan['combinations']] == ['Dell Inc. PowerEdge XE9680',
                                                                    'Supermicro SYS-821GE-TNHR']
    assert sorted(plan['canaries']) == ['gpu-1', 'gpu-2']


def test_planner_nodes_a_platform_label_wins_over_dmi():
    fleet = bare_metal_fleet('gpu-1', 'gpu-2')
    fleet['nodes'][0]['labels'].update({'gpufleet.io/platform': 'dgx-h100', 'node.kubernetes.io/instance-type': 'x'})
    fleet['nodes'][1]['labels']['node.kubernetes.io/instance-type'] = 'p5.48xlarge'
    nodes = _plan.planner_nodes(fleet, {n: dict(FACTS['gpu-1'], dmi=SMC) for n in ('gpu-1', 'gpu-2')}, {})
    assert [n['platform'] for n in nodes] == ['dgx-h100', 'p5.48xlarge']


@pytest.mark.parametrize('fleet', [None, {}, {'nodes': 'gpu-1'}, {'nodes': [{'platform': 'x'}]}])
def test_planner_nodes_refuses_what_is_not_fleet_info_output(fleet):
    with pytest.raises(_plan.PlanInputError, match='fleet'):
        _plan.planner_nodes(fleet, {}, {})


@pytest.mark.parametrize('batch,message', [
    ('gpu-01', "batch: 'gpu-01' is not a list of node names"),     # not read per character
    (None, 'batch: None is not a list of node names'),
    ({'gpu-01': True}, "batch: {'gpu-01': True} is not a list of node names"),
    (['gpu-01', 7], 'batch[1]: 7 is not a node name'),
    (['gpu-01', ''], "batch[1]: '' is not a node name"),
    ([None], 'batch[0]: None is not a node name'),
])
def test_batch_must_be_a_list_of_node_names(batch, message):
    with pytest.raises(_plan.PlanInputError) as err:
        _plan.batch_admission(pool(4), batch, reviewed(2))
    assert str(err.value) == message


def test_a_batch_tuple_is_a_list():
    assert _plan.batch_admission(pool(4), ('gpu-01',), reviewed(1))['admitted'] is True


@pytest.mark.parametrize('max_unavailable', [True, False, '2', 2.0, None, -1])
def test_max_unavailable_must_be_an_integer_not_a_boolean(max_unavailable):
    with pytest.raises(_plan.PlanInputError) as err:
        _plan.batch_admission(pool(4), ['gpu-01'], reviewed(max_unavailable))
    assert str(err.value) == 'plan.max_unavailable: %r is not a whole number >= 0 (is this a reviewed plan?)' % (max_unavailable,)


# ---------------------------------------------------------------------------- a malformed plan (review 2026-12-06 T3-16)
# The fuzz campaign's crashes: batch_admission raised AttributeError/TypeError/ValueError on a plan (or
# a pool) whose fields had another shape; each is now PlanInputError naming the field and the value.
def _planned():
    nodes = [dict(n, pci_ids=[H100], platform='SYS-821GE-TNHR', kernel=CURRENT['kernel'], partition_mode='none',
                  install_method='apt', current=CURRENT) for n in pool(10)]
    return _plan.build_plan(nodes, target=TARGET, batch_size='20%', max_unavailable='20%',
                            failure_allowance={'gpus': 8})


@pytest.mark.parametrize('edit,message', [
    (lambda p: p.update(budget='NaN'), "plan.budget: 'NaN' is not a mapping"),
    (lambda p: p['budget'].update(failure_allowance=[]), 'plan.budget.failure_allowance: [] is not a mapping'),
    (lambda p: p['budget']['failure_allowance'].update(gpus='x'),
     "plan.budget.failure_allowance.gpus: 'x' is not a mapping (with resolved)"),
    (lambda p: p['budget']['failure_allowance']['gpus'].update(resolved='8'),
     "plan.budget.failure_allowance.gpus.resolved: '8' is not a whole number >= 0"),
    (lambda p: p.update(canaries=1.5), 'plan.canaries: 1.5 is not a list of node names'),
    (lambda p: p['batches'].append([None]), 'plan.batches[10]: [None] is not a list of node names'),
    (lambda p: p.update(digest=2 ** 70), 'plan.digest: 1180591620717411303424 is not a string (sha256:<64 hex>)'),
    # The rollout reads pauses and observation too (a Jinja test, observation_settings): found by test_fuzz_parsers.py.
    (lambda p: p.update(pauses='2'), "plan.pauses: '2' is not a list of batch numbers"),
    (lambda p: p.update(pauses=[11]), 'plan.pauses[0]: batch 11 does not exist: the plan has 10 batch(es)'),
    (lambda p: p.update(observation={'queries': 7}), 'plan.observation.queries: 7 is not a non-empty list of metric_gate queries'),
    (lambda p: p.update(observation={'workloads': {'cases': ['x'], 'repeat': [1]}}),
     'plan.observation.workloads.repeat: [1] is not a whole number >= 1'),
])
def test_a_malformed_plan_is_refused_naming_the_field(edit, message):
    plan = _planned()
    assert _plan.batch_admission(pool(10), plan['batches'][1], plan)['admitted'] is True
    edit(plan)
    with pytest.raises(_plan.PlanInputError) as exc:
        _plan.batch_admission(pool(10), plan['batches'][1], plan)
    assert str(exc.value) == message


@pytest.mark.parametrize('node,message', [
    (dict(labels=1), 'nodes[0] (gpu-01).labels: 1 is not a mapping'),
    (dict(labels='x'), "nodes[0] (gpu-01).labels: 'x' is not a mapping"),
    (dict(gpus='1e3'), "nodes[0] (gpu-01).gpus: '1e3' is not a whole number >= 0"),
    (dict(gpus=[8]), 'nodes[0] (gpu-01).gpus: [8] is not a whole number >= 0'),
])
def test_a_malformed_pool_node_is_refused_naming_the_field(node, message):
    nodes = pool(10)
    nodes[0].update(node)
    with pytest.raises(_plan.PlanInputError) as exc:
        _plan.batch_admission(nodes, ['gpu-02'], reviewed(2, gpus=8))
    assert str(exc.value) == message


def test_a_planned_plan_passes_check_plan():
    plan = _planned()
    assert _plan.check_plan(plan) is plan
