"""Pause points (issue 16): the plan's batches that wait for an approval, the approval's name bound to the
plan's digest, its verdict, and the bounded wait."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _pause as P
from ansible_collections.gpufleet.upgrade.plugins.module_utils._pause import PauseError

DIGEST = 'sha256:' + '0123456789abcdef' * 4
NAME = 'gpufleet-approve-0123456789ab-batch-3'
PATH = '/api/v1/namespaces/gpufleet-approvals/configmaps/' + NAME


def test_check_pauses_sorts_and_names_what_is_wrong():
    assert P.check_pauses([5, 2], batches=5) == [2, 5]
    assert P.check_pauses(None) == [] and P.check_pauses([]) == []
    for value, msg in (
            ('3', "pause_before: '3' is not a list of batch numbers"),
            ([0], 'pause_before[0]: 0 is not a batch number'),
            ([2, True], 'pause_before[1]: True is not a batch number'),
            ([2, '2'], "pause_before[1]: '2' is not a batch number"),
            ([2, 2], 'pause_before[1]: batch 2 is listed twice')):
        with pytest.raises(PauseError, match=r'^' + msg.replace('[', r'\[').replace(']', r'\]')):
            P.check_pauses(value)
    with pytest.raises(PauseError, match=r'^pause_before\[1\]: batch 7 does not exist: the plan has 5 batch\(es\)$'):
        P.check_pauses([2, 7], batches=5)


def test_the_approval_name_is_bound_to_the_plan_digest_and_batch():
    assert P.approval_name(DIGEST, 3) == NAME
    assert P.approval_name('sha256:' + 'f' * 64, 3) != NAME
    assert len(P.approval_name(DIGEST, 10 ** 6)) <= 253
    for bad in ('0123', 'sha256:XYZ', None, 'sha256:' + '0' * 63):
        with pytest.raises(PauseError, match='^plan_digest: '):
            P.approval_name(bad, 3)
    with pytest.raises(PauseError, match='^batch: 0 is not a batch number'):
        P.approval_name(DIGEST, 0)


def test_judge_absent_and_present():
    waiting = P.judge(None, 'gpufleet-approvals', NAME, 3)
    assert not waiting.approved and waiting.approved_by == ''
    assert waiting.msg == ('batch 3 waits for its approval: create the ConfigMap gpufleet-approvals/%s (kubectl -n '
                           'gpufleet-approvals create configmap %s --from-literal=by=<who>)' % (NAME, NAME))
    cm = {'metadata': {'name': NAME, 'creationTimestamp': '2026-12-03T07:00:00Z'}, 'data': {'by': ' alice\n '}}
    ok = P.judge(cm, 'gpufleet-approvals', NAME, 3)
    assert ok.approved and ok.approved_by == 'alice' and ok.approved_at == '2026-12-03T07:00:00Z'
    assert ok.msg == 'batch 3 approved (ConfigMap gpufleet-approvals/%s, by alice, at 2026-12-03T07:00:00Z)' % NAME
    # who is optional: the ConfigMap's existence approves
    assert P.judge({'metadata': {}}, 'gpufleet-approvals', NAME, 3).approved
    with pytest.raises(PauseError, match='not an object'):
        P.judge(['x'], 'gpufleet-approvals', NAME, 3)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_wait_reads_until_approved_within_the_deadline():
    clock, reads = Clock(), []

    def get(path):
        reads.append((clock.now, path))
        return {'metadata': {}, 'data': {'by': 'bob'}} if clock.now >= 25 else None

    verdict, waited = P.wait_for_approval(get, 'gpufleet-approvals', DIGEST, 3, '1m', 10, clock=clock,
                                          sleep=clock.sleep)
    assert verdict.approved and verdict.approved_by == 'bob' and waited == 30
    assert reads == [(0, PATH), (10, PATH), (20, PATH), (30, PATH)]


def test_wait_ends_at_the_deadline_saying_the_batch_did_not_start():
    clock, reads = Clock(), []

    def get(path):
        reads.append(clock.now)
        return None

    verdict, waited = P.wait_for_approval(get, 'gpufleet-approvals', DIGEST, 3, 25, 10, clock=clock, sleep=clock.sleep)
    assert not verdict.approved and waited == 25 and reads == [0, 10, 20, 25]
    assert verdict.msg.endswith('; not approved within 25s (the pause timeout): the batch did not start, rerun the '
                                'rollout once it is approved')
    # 0: one read, no wait
    reads.clear()
    verdict, waited = P.wait_for_approval(get, 'gpufleet-approvals', DIGEST, 3, 0, 10, clock=clock, sleep=clock.sleep)
    assert not verdict.approved and waited == 0 and len(reads) == 1 and 'not approved within' not in verdict.msg


def test_wait_refuses_bad_input_before_any_read():
    def get(path):
        raise AssertionError('read despite bad input')

    for kwargs, msg in (({'timeout': 'soon'}, "wait_timeout: 'soon' is not a number of seconds >= 0 or a duration"),
                        ({'timeout': -1}, 'wait_timeout: -1 is not a number'),
                        ({'timeout': True}, 'wait_timeout: True is not a number'),
                        ({'interval': 0}, 'wait_interval: 0 is not a number of seconds > 0'),
                        ({'namespace': 'Bad_NS'}, "namespace: 'Bad_NS' is not a Kubernetes namespace name")):
        args = dict({'namespace': 'gpufleet-approvals', 'timeout': 10, 'interval': 1}, **kwargs)
        with pytest.raises(PauseError, match='^' + msg):
            P.wait_for_approval(get, args['namespace'], DIGEST, 3, args['timeout'], args['interval'])
    assert P.timeout_seconds('1h30m') == 5400 and P.timeout_seconds('90') == 90 and P.timeout_seconds(2.5) == 2.5


def test_approvals_in_the_stop_switchs_namespace_are_refused_before_any_read():
    # T3-20 of the 2026-12-06 review: the Role that may set the stop switch creates ConfigMaps in its namespace;
    # approvals read there could be created by whoever may stop a rollout.
    def get(path):
        raise AssertionError('read despite the refused namespace')

    with pytest.raises(PauseError, match=r"^namespace: 'gpufleet-system' is the stop switch's namespace \(stop_namespace\)"):
        P.wait_for_approval(get, 'gpufleet-system', DIGEST, 3, 10, 1, stop_namespace='gpufleet-system')
    with pytest.raises(PauseError, match=r"^stop_namespace: 'Bad_NS' is not a Kubernetes namespace name"):
        P.wait_for_approval(get, 'gpufleet-approvals', DIGEST, 3, 10, 1, stop_namespace='Bad_NS')
    # apart, or no stop switch read: the approval is read
    seen = []
    verdict, _waited = P.wait_for_approval(seen.append, 'gpufleet-approvals', DIGEST, 3, 0, 1,
                                           stop_namespace='gpufleet-system')
    assert verdict.approved is False and seen == ['/api/v1/namespaces/gpufleet-approvals/configmaps/'
                                                  + P.approval_name(DIGEST, 3)]
    P.check_apart('gpufleet-system', '')


SWITCH_PATH = '/api/v1/namespaces/gpufleet-system/configmaps/gpufleet-stop'


def test_a_stop_switch_set_during_the_wait_ends_it_not_approved():
    """Issue 40 item 5: with stop_name, each round reads the approval, then the stop switch; set at 25 s, the wait
    ends at the next round (30 s), not approved, with the switch's message; the verdict of the switch is passed on."""
    clock, reads, stopped = Clock(), [], []

    def get(path):
        reads.append((clock.now, path))
        if path == SWITCH_PATH and clock.now >= 25:
            return {'metadata': {'creationTimestamp': '2026-12-07T23:00:00Z'}, 'data': {'reason': 'rack 12', 'by': 'carol'}}
        return None

    verdict, waited = P.wait_for_approval(get, 'gpufleet-approvals', DIGEST, 3, '1h', 10, clock=clock, sleep=clock.sleep,
                                          stop_namespace='gpufleet-system', stop_name='gpufleet-stop',
                                          rollout_id='gpu-rollout', stopped=stopped)
    assert not verdict.approved and waited == 30
    assert reads == [(t, p) for t in (0, 10, 20, 30) for p in (PATH, SWITCH_PATH)]
    assert verdict.msg.startswith('rollout stopped by the stop switch (ConfigMap gpufleet-system/gpufleet-stop, reason: '
                                  'rack 12, set by carol') and verdict.msg.endswith(
        '(set while batch 3 waited for its approval: the batch did not start)'), verdict.msg
    assert len(stopped) == 1 and stopped[0].set_by == 'carol'


def test_an_approval_wins_over_a_switch_for_another_rollout():
    clock, stopped = Clock(), []

    def get(path):
        if path == SWITCH_PATH:
            return {'metadata': {}, 'data': {'rollout': 'pool-b-week-52'}}
        return {'metadata': {}, 'data': {'by': 'bob'}} if clock.now >= 10 else None

    verdict, waited = P.wait_for_approval(get, 'gpufleet-approvals', DIGEST, 3, '1m', 10, clock=clock, sleep=clock.sleep,
                                          stop_namespace='gpufleet-system', stop_name='gpufleet-stop',
                                          rollout_id='gpu-rollout', stopped=stopped)
    assert verdict.approved and waited == 10 and stopped == []


def test_a_stop_name_without_its_namespace_is_refused_before_any_read():
    reads = []
    with pytest.raises(PauseError, match=r"stop_name: 'gpufleet-stop' needs stop_namespace"):
        P.wait_for_approval(reads.append, 'gpufleet-approvals', DIGEST, 3, 0, 10, stop_namespace='',
                            stop_name='gpufleet-stop')
    assert reads == []
