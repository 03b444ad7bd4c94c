"""The plan the gate passed with: gate entries carry the plan file's SHA-256, and the rollout refuses a plan
file whose digest differs from any recorded PASS."""
from __future__ import annotations

import hashlib

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _plan_digest
from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan_digest import PlanDigestError, gate_entries, verdict

SHA = hashlib.sha256(b'{"batches": [["gpu-01"]]}').hexdigest()
OTHER = hashlib.sha256(b'{"batches": [["gpu-02"]]}').hexdigest()
NOW = '2026-12-02T07:00:00Z'


def result(cid='c1', failed=False, skipped=False):
    res = {'item': {'id': cid, 'key': {'pci_ids': '10de:2330/10de:16c1'}}, 'msg': 'PASS: %s' % cid,
           'qualification': {'id': 'q-' + cid, 'approved_by': 'bob'}, 'changed': False}
    if failed:
        res['failed'] = True
    if skipped:
        res['skipped'] = True
    return res


def test_gate_entries_record_each_pass_with_the_plan_digest():
    entries = gate_entries([result('c1'), result('c2')], SHA, '/srv/plan.json', NOW)
    assert [e['id'] for e in entries] == ['upgrade_check@c1', 'upgrade_check@c2']
    e = entries[0]
    assert e['kind'] == 'upgrade_check' and e['passed'] is True and e['critical'] is True
    assert e['inputs'] == {'plan_sha256': SHA, 'plan_file': '/srv/plan.json', 'combination': 'c1'}
    assert e['result'] == {'msg': 'PASS: c1', 'qualification': {'id': 'q-c1', 'approved_by': 'bob'}}
    assert e['started'] == e['finished'] == NOW
    assert 'started' not in gate_entries([result()], SHA, 'p')[0]


def test_gate_entries_skip_what_did_not_pass():
    assert [e['id'] for e in gate_entries([result('c1', failed=True), result('c2', skipped=True), result('c3')],
                                          SHA, 'p')] == ['upgrade_check@c3']


@pytest.mark.parametrize('args,field', [
    (([result()], 'abc', 'p'), "plan_sha256: 'abc'"),
    (([result()], SHA.upper(), 'p'), 'plan_sha256:'),
    (({'item': 1}, SHA, 'p'), 'results:'),
    (([{'msg': 'x'}], SHA, 'p'), 'results[0]:'),
    (([{'item': {'id': ''}}], SHA, 'p'), "results[0].item.id: ''"),
])
def test_gate_entries_bad_input(args, field):
    with pytest.raises(PlanDigestError) as err:
        gate_entries(*args)
    assert str(err.value).startswith(field)


def bundle(*entries):
    return {'id': 'gpu-rollout', 'gates': list(entries)}


def test_no_bundle_or_no_record_leaves_the_rollouts_own_gate():
    for b in (None, {}, bundle(), bundle({'id': 'node@gpu-01', 'kind': 'node', 'passed': True, 'inputs': {}})):
        v = verdict(b, SHA, 'plan.json')
        assert v['ok'] is True and v['recorded'] == []
        assert v['msg'].startswith('no upgrade_check PASS recorded with a plan digest')


def test_the_same_plan_passes():
    entries = gate_entries([result('c1'), result('c2')], SHA, 'plan.json', NOW)
    v = verdict(bundle(*entries), SHA, 'plan.json')
    assert v['ok'] is True and [r['id'] for r in v['recorded']] == ['upgrade_check@c1', 'upgrade_check@c2']
    assert v['msg'] == ('the plan file plan.json (sha256 %s) is the plan upgrade_check passed with '
                        '(upgrade_check@c1, upgrade_check@c2)' % SHA)


def test_a_changed_plan_is_refused_naming_both_digests():
    entries = gate_entries([result('c1')], SHA, 'plan.json', NOW)
    v = verdict(bundle(*entries), OTHER, 'plan.json')
    assert v['ok'] is False
    assert v['msg'].startswith('the plan file plan.json (sha256 %s) is not the plan upgrade_check passed with: '
                               'upgrade_check@c1 passed with sha256 %s at %s.' % (OTHER, SHA, NOW))
    assert 'nothing was changed' in v['msg']


def test_one_differing_record_is_enough_to_refuse():
    a = gate_entries([result('c1')], SHA, 'plan.json')
    b = gate_entries([result('c2')], OTHER, 'plan.json')
    assert verdict(bundle(*(a + b)), SHA, 'plan.json')['ok'] is False
    assert verdict(bundle(*(a + b)), OTHER, 'plan.json')['ok'] is False


def test_failed_gates_and_records_without_a_digest_do_not_count():
    failed = dict(gate_entries([result('c1')], OTHER, 'p')[0], passed=False)
    old = {'id': 'upgrade_check@c0', 'kind': 'upgrade_check', 'passed': True, 'inputs': {}}
    assert verdict(bundle(failed, old), SHA, 'p')['ok'] is True


@pytest.mark.parametrize('b,field', [
    ([], 'bundle:'),
    ({'gates': {}}, 'bundle.gates:'),
])
def test_verdict_bad_input(b, field):
    with pytest.raises(PlanDigestError) as err:
        verdict(b, SHA, 'p')
    assert str(err.value).startswith(field)
    with pytest.raises(PlanDigestError, match='plan_sha256'):
        _plan_digest.verdict({}, 'x', 'p')


def test_workflow_verdict_refuses_an_edited_plan_or_another_plan_than_the_workflows():
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import digest_of
    plan = {'target': {'driver': '580.130.00'}, 'batches': [['gpu-01'], ['gpu-02']], 'summary': 'ignored'}
    plan['digest'] = digest_of(plan)
    pd = _plan_digest
    ok = pd.workflow_verdict(plan, plan['digest'])
    assert ok['ok'] is True and ok['digest'] == plan['digest'] and 'the workflow passed on' in ok['msg']
    assert pd.workflow_verdict(plan)['ok'] is True
    edited = dict(plan, batches=[['gpu-02'], ['gpu-01']])
    bad = pd.workflow_verdict(edited)
    assert bad['ok'] is False and 'it was edited after it was planned' in bad['msg']
    other = pd.workflow_verdict(plan, 'sha256:' + 'a' * 64)
    assert other['ok'] is False and 'not the plan the workflow passed on (gpufleet_plan_digest sha256:' in other['msg']
    with pytest.raises(pd.PlanDigestError, match="gpufleet_plan_digest: 'abc' is not sha256:<64 hex>"):
        pd.workflow_verdict(plan, 'abc')
    with pytest.raises(pd.PlanDigestError, match='plan: '):
        pd.workflow_verdict(['x'])


# Review 2026-12-06 T3-16: a plan with no digest went through when the workflow passed none, and then
# any edit reached the filters (batch_admission, plan_nodes crashed on a malformed one).
def test_workflow_verdict_refuses_a_plan_without_a_digest():
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import digest_of
    plan = {'target': {'driver': '580.130.00'}, 'batches': [['gpu-01'], ['gpu-02']], 'max_unavailable': 1}
    for carried in (None, ''):
        edited = dict(plan) if carried is None else dict(plan, digest=carried)
        for expected in ('', None):
            v = _plan_digest.workflow_verdict(edited, expected)
            assert v['ok'] is False and v['digest'] == digest_of(plan)
            assert 'it carries no digest (upgrade_plan writes one into every plan' in v['msg']
    assert _plan_digest.workflow_verdict(dict(plan, digest=digest_of(plan)))['ok'] is True


@pytest.mark.parametrize('edit,problem', [
    ({'budget': 'NaN'}, "plan.budget: 'NaN' is not a mapping"),
    ({'canaries': 1.5}, 'plan.canaries: 1.5 is not a list of node names'),
    ({'batches': [['gpu-01'], 7]}, 'plan.batches[1]: 7 is not a list of node names'),
    ({'max_unavailable': '2'}, "plan.max_unavailable: '2' is not a whole number >= 0"),
])
def test_workflow_verdict_refuses_a_malformed_plan_even_with_its_own_digest(edit, problem):
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import digest_of
    plan = dict({'target': {'driver': '580.130.00'}, 'batches': [['gpu-01'], ['gpu-02']], 'max_unavailable': 1}, **edit)
    plan['digest'] = digest_of(plan)
    v = _plan_digest.workflow_verdict(plan, plan['digest'])
    assert v['ok'] is False
    assert v['msg'] == ('the plan refused: its content is not a plan the planner writes: %s; nothing was changed. '
                        'Re-plan and review it again' % problem)
