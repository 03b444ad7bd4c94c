"""Source-tuple drift inside a combination (issue 39 item 4, review 2026-12-06 H3): kernel ABI, RKE2 patch or
driver patch drift is reported at plan time and either refused, naming the nodes of each source tuple, or split
into one combination per source tuple - never found by the rollout after the canary ran."""
from __future__ import annotations

import random

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _plan as P

H100 = '10de:2330/10de:16c1'
A100 = '10de:20b5/10de:1533'
CURRENT = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '570.172.08',
           'gpu_operator': 'v26.3.3', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}
TARGET = dict(CURRENT, driver='580.126.20', gpu_operator='v26.3.4')


def fleet(n, pci=H100, start=1):
    return [{'name': 'gpu-%02d' % i, 'pci_ids': [pci], 'platform': 'SYS-821GE-TNHR', 'kernel': '6.8.0-134-generic',
             'partition_mode': 'none', 'install_method': 'apt', 'current': dict(CURRENT), 'ready': True,
             'unschedulable': False, 'gpus': 8} for i in range(start, start + n)]


def check_invariants(plan, nodes):
    """Every node of a combination in exactly one batch, canaries first, each combination's canaries its own."""
    flat = [n for b in plan['batches'] for n in b]
    assert len(flat) == len(set(flat))
    assert set(flat) == {x for c in plan['combinations'] for x in c['nodes']}
    assert set(flat[:len(plan['canaries'])]) == set(plan['canaries'])
    for c in plan['combinations']:
        assert set(c['canaries']) <= set(c['nodes'])
    names = [n for c in plan['combinations'] for n in c['nodes']]
    assert len(names) == len(set(names)) and set(names) <= {n['name'] for n in nodes}


DRIFTS = {
    'kernel ABI': ('kernel', '6.8.0-131-generic'),
    'RKE2 revision': ('rke2', 'v1.35.3+rke2r2'),
    'driver patch': ('driver', '570.172.02'),
}


def drifted(n=6, field='kernel', value='6.8.0-131-generic', drifting=(4, 5, 6)):
    """`n` nodes of one combination; the nodes numbered in `drifting` run `value` for `field`."""
    nodes = fleet(n)
    for i in drifting:
        nodes[i - 1]['current'] = dict(CURRENT, **{field: value})
    return nodes


@pytest.mark.parametrize('field, value', list(DRIFTS.values()), ids=list(DRIFTS))
def test_drift_refuses_by_default_naming_the_combination_the_field_and_the_nodes(field, value):
    with pytest.raises(P.PlanRefused) as exc:
        P.build_plan(drifted(field=field, value=value), target=TARGET, max_unavailable=3)
    problems = exc.value.problems
    assert len(problems) == 1
    msg = problems[0]
    assert msg.startswith('source-tuple drift in combination pci_ids=%s|' % H100)
    assert '(differing: %s)' % field in msg
    assert '%s %s on 3 node(s): gpu-04, gpu-05, gpu-06' % (field, value) in msg
    assert '%s %s on 3 node(s): gpu-01, gpu-02, gpu-03' % (field, CURRENT[field]) in msg
    assert 'source_drift=split' in msg
    plan = exc.value.plan
    assert plan['batches'] == []
    assert plan['policy']['source_drift'] == 'refuse'
    [drift] = plan['source_drift']
    assert drift['action'] == 'refuse' and drift['components'] == [field]
    assert sorted(s['tuple'][field] for s in drift['sources']) == sorted([value, CURRENT[field]])
    assert '## Source-tuple drift' in plan['summary'] and '## Refused' in plan['summary']


@pytest.mark.parametrize('field, value', list(DRIFTS.values()), ids=list(DRIFTS))
def test_split_gives_each_source_tuple_its_own_combination_and_canary(field, value):
    nodes = drifted(field=field, value=value)
    plan = P.build_plan(nodes, target=TARGET, max_unavailable=3, source_drift='split')
    combos = plan['combinations']
    assert len(combos) == 2
    # What the rollout's gate needs: one exact source tuple per combination.
    assert [len(c['source_tuples']) for c in combos] == [1, 1]
    by_value = dict((c['source_tuples'][0][field], c) for c in combos)
    assert by_value[value]['nodes'] == ['gpu-04', 'gpu-05', 'gpu-06']
    assert by_value[CURRENT[field]]['nodes'] == ['gpu-01', 'gpu-02', 'gpu-03']
    assert by_value[value]['canaries'] == ['gpu-04'] and by_value[CURRENT[field]]['canaries'] == ['gpu-01']
    assert plan['canaries'] == ['gpu-01', 'gpu-04']
    for v, c in by_value.items():
        assert c['key']['source.%s' % field] == v
        assert c['key']['pci_ids'] == H100  # what the canary and rollout playbooks read
        assert c['id'].endswith('|source.%s=%s' % (field, v))
    assert len(set(c['id'] for c in combos)) == 2
    [drift] = plan['source_drift']
    assert drift['action'] == 'split' and drift['components'] == [field]
    assert [s['nodes'] for s in drift['sources']] == [
        ['gpu-04', 'gpu-05', 'gpu-06'] if s['tuple'][field] == value else ['gpu-01', 'gpu-02', 'gpu-03']
        for s in drift['sources']]
    assert any('split into 2 combinations' in w for w in plan['warnings'])
    assert '## Source-tuple drift' in plan['summary']
    check_invariants(plan, nodes)


def test_no_drift_reports_none_and_records_the_policy():
    plan = P.build_plan(fleet(6), target=TARGET, max_unavailable=3)
    assert plan['source_drift'] == [] and plan['policy']['source_drift'] == 'refuse'
    assert '## Source-tuple drift' not in plan['summary']
    assert len(plan['combinations']) == 1


def test_split_drift_in_two_fields_and_three_tuples_is_deterministic():
    nodes = fleet(9)
    for i in (3, 4, 5):
        nodes[i]['current'] = dict(CURRENT, kernel='6.8.0-131-generic')
    for i in (6, 7, 8):
        nodes[i]['current'] = dict(CURRENT, rke2='v1.35.3+rke2r2')
    plan = P.build_plan(nodes, target=TARGET, max_unavailable=4, source_drift='split')
    assert len(plan['combinations']) == 3
    [drift] = plan['source_drift']
    assert drift['components'] == ['kernel', 'rke2']
    assert all(len(c['source_tuples']) == 1 for c in plan['combinations'])
    assert sorted(plan['canaries']) == ['gpu-01', 'gpu-04', 'gpu-07']
    shuffled = list(nodes)
    random.Random(39).shuffle(shuffled)
    again = P.build_plan(shuffled, target=TARGET, max_unavailable=4, source_drift='split')
    assert again['digest'] == plan['digest'] and again['combinations'] == plan['combinations']
    check_invariants(plan, nodes)


def test_split_part_without_a_ready_node_is_an_omitted_combination():
    nodes = drifted(drifting=(6,))
    nodes[5]['ready'] = False
    with pytest.raises(P.PlanRefused) as exc:
        P.build_plan(nodes, target=TARGET, max_unavailable=3, source_drift='split')
    [omitted] = exc.value.plan['omitted']
    assert omitted['nodes'] == ['gpu-06'] and omitted['id'].endswith('|source.kernel=6.8.0-131-generic')
    assert 'combination(s) without a canary' in exc.value.problems[0]
    plan = P.build_plan(nodes, target=TARGET, max_unavailable=3, source_drift='split', omitted_block=False)
    assert len(plan['combinations']) == 2


def test_drift_is_only_inside_a_combination():
    """Different platforms with different tuples are two combinations anyway: no drift."""
    nodes = fleet(2) + fleet(2, pci=A100, start=3)
    for n in nodes[2:]:
        n['current'] = dict(CURRENT, driver='570.172.02')
    plan = P.build_plan(nodes, target=TARGET, max_unavailable=3)
    assert plan['source_drift'] == [] and len(plan['combinations']) == 2


def test_up_to_date_and_excluded_nodes_do_not_drift():
    nodes = drifted(drifting=(6,))
    plan = P.build_plan(nodes, target=TARGET, max_unavailable=3, exclude=['gpu-06'])
    assert plan['source_drift'] == []
    nodes[5]['current'] = dict(TARGET)
    plan = P.build_plan(nodes, target=TARGET, max_unavailable=3)
    assert plan['source_drift'] == [] and plan['up_to_date'] == ['gpu-06']


def test_a_missing_field_and_null_are_told_apart():
    nodes = fleet(3)
    nodes[1]['current'] = dict(CURRENT, driver=None)
    del nodes[2]['current']['driver']
    plan = P.build_plan(nodes, target=TARGET, max_unavailable=3, source_drift='split')
    assert len(plan['combinations']) == 3
    assert len(set(c['id'] for c in plan['combinations'])) == 3
    assert plan['source_drift'][0]['components'] == ['driver']


@pytest.mark.parametrize('value, shown', [('Split', "'Split'"), ('', "''"), (None, 'None'), (['split'], "['split']")])
def test_bad_source_drift_names_the_field_and_the_value(value, shown):
    with pytest.raises(P.PlanInputError) as exc:
        P.build_plan(fleet(4), target=TARGET, source_drift=value)
    assert str(exc.value) == 'source_drift: %s is not one of refuse, split' % shown


def test_a_plan_written_before_with_several_source_tuples_is_refused_before_it_is_read():
    """check_plan (the digest check that canary, approve, upgrade_check and rollout run before anything moves):
    a combination with several source tuples - a plan written before the planner decided drift - is refused
    there, naming the combination and the way out, not by the rollout after the canary."""
    split = P.build_plan(drifted(), target=TARGET, max_unavailable=3, source_drift='split')
    assert P.check_plan(split) is split
    old = dict(split, combinations=[dict(split['combinations'][0], id='c1',
                                         source_tuples=[dict(CURRENT), dict(CURRENT, kernel='6.8.0-131-generic')])])
    with pytest.raises(P.PlanInputError) as exc:
        P.check_plan(old)
    msg = str(exc.value)
    assert msg.startswith('plan.combinations[0] ("c1").source_tuples: 2 source tuples (source-tuple drift)')
    assert 'gpufleet_source_drift' in msg
    with pytest.raises(P.PlanInputError) as exc:
        P.check_plan(dict(split, combinations={'c1': {}}))
    assert str(exc.value) == "plan.combinations: {'c1': {}} is not a list of combinations"


def test_split_parts_have_distinct_record_names_and_an_unsplit_combination_keeps_its_pci_slug():
    """Issue 39 item 4: each part of a split combination has its own canary, so its own evidence and qualification
    record (`combination_slug`); with the PCI slug alone the parts' files overwrote each other. An unsplit
    combination's record keeps its old name (`<pci>.yaml`)."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _rollout as R

    nodes = drifted(field='kernel', value='6.8.0-131-generic') + fleet(3, pci=A100, start=7)
    plan = P.build_plan(nodes, target=TARGET, max_unavailable=4, source_drift='split')
    slugs = [R.combination_slug(c) for c in plan['combinations']]
    assert len(slugs) == len(set(slugs)) == 3, slugs
    assert R.pci_slug(A100) in slugs
    split = sorted(s for s in slugs if s.startswith(R.pci_slug(H100)))
    assert split == ['10de2330-10de16c1--kernel-6.8.0-131-generic', '10de2330-10de16c1--kernel-6.8.0-134-generic'], split
    rke2 = R.combination_slug({'key': {'pci_ids': H100, 'source.rke2': 'v1.35.2+rke2r1'}})
    assert rke2 == '10de2330-10de16c1--rke2-v1.35.2-rke2r1', rke2     # what a record id may hold
    with pytest.raises(R.RolloutError, match='not a plan combination'):
        R.combination_slug({'id': 'x'})


def test_live_tuple_problems_name_a_node_that_changed_since_the_plan():
    """Issue 39 item 4: the gate and each batch re-read the Nodes; a node that runs a component neither its source
    nor the target (a kernel moved by unattended-upgrades) is named; a node at the target (done, or resumed halfway)
    and a driver GFD does not report are not problems."""
    plan = P.build_plan(fleet(4) + fleet(2, pci=A100, start=5), target=TARGET, max_unavailable=3)

    def facts(name, kernel='6.8.0-134-generic', rke2=CURRENT['rke2'], driver=None):
        labels = {}
        if driver:
            labels = dict(zip(P.GFD_DRIVER_LABELS, driver.split('.')))
        return {'name': name, 'kernel': kernel, 'rke2': rke2, 'labels': labels}
    nodes = [facts('gpu-%02d' % i) for i in range(1, 7)]
    assert P.live_tuple_problems(plan, nodes) == []
    nodes[1] = facts('gpu-02', driver=TARGET['driver'])          # at the target: allowed
    nodes[2] = facts('gpu-03', kernel='6.8.0-140-generic')      # moved outside the rollout
    nodes[5] = facts('gpu-06', driver='570.172.02')
    problems = P.live_tuple_problems(plan, nodes)
    assert len(problems) == 2, problems
    assert problems[0].startswith('node gpu-03 runs kernel 6.8.0-140-generic now (as its Node says), but the plan has '
                                  'kernel from source 6.8.0-134-generic to target 6.8.0-134-generic'), problems
    assert problems[1].startswith('node gpu-06 runs driver 570.172.02 now'), problems
    assert P.live_tuple_problems(plan, nodes, ['gpu-01', 'gpu-02']) == []     # a batch judges its own nodes
    assert P.live_tuple_problems(plan, nodes[:2]) == []                        # absent nodes: the admission's
    with pytest.raises(P.PlanInputError, match='nodes: .* is not a list'):
        P.live_tuple_problems(plan, {'gpu-01': {}})
