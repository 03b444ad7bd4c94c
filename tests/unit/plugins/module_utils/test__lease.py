"""The pure decisions of plan_lease (plugins/module_utils/_lease.py): the Lease's name, the inputs, who may hold it
and when, release, the clock-skew bounds, and `settle`'s reads and writes against a scripted client (409s, create
races, a Lease deleted between read and write, retryable failures, the bound)."""
from __future__ import annotations

import copy
import datetime
import re

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _lease as lz
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import ConflictError, K8sError, NotFoundError

DIGEST = 'sha256:' + '3f9a1c0d2e4b' + 'a' * 52
OTHER_DIGEST = 'sha256:' + '3f9a1c0d2e4b' + 'b' * 52
NS = 'gpufleet-system'
NAME = 'gpufleet-plan-3f9a1c0d2e4b'
T0 = datetime.datetime(2026, 12, 7, 6, 0, 0, tzinfo=datetime.timezone.utc)
SUBDOMAIN = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def lease(holder: str | None = 'run-a', renewed: float = 0, duration: int | None = 60, transitions: int = 0,
          digest: str = DIGEST, managed: bool = True, rv: str = '7', **spec_extra) -> dict:
    spec = {'holderIdentity': holder, 'leaseDurationSeconds': duration, 'acquireTime': lz.format_micro(at(-100)),
            'renewTime': lz.format_micro(at(renewed)), 'leaseTransitions': transitions}
    spec = {k: v for k, v in spec.items() if v is not None}
    spec.update(spec_extra)
    labels = {lz.MANAGED_BY: lz.MANAGER} if managed else {}
    return {'apiVersion': lz.API_VERSION, 'kind': 'Lease',
            'metadata': {'name': NAME, 'namespace': NS, 'resourceVersion': rv, 'labels': labels,
                         'annotations': {lz.ANN_DIGEST: digest}},
            'spec': spec}


# -- names and inputs ------------------------------------------------------------------------
def test_the_name_is_the_first_12_digits_of_the_digest_and_a_dns_subdomain():
    assert lz.lease_name(DIGEST) == NAME
    assert SUBDOMAIN.match(NAME) and len(NAME) <= 253


@pytest.mark.parametrize('value', ['3f9a' * 16, 'sha256:' + 'A' * 64, 'sha256:' + 'a' * 63, 'sha1:' + 'a' * 40,
                                   '', None, 7, ['sha256:' + 'a' * 64]])
def test_a_bad_digest_is_refused_naming_field_and_value(value):
    with pytest.raises(lz.LeaseError, match=r'^plan_digest: .* is not a plan digest \(sha256: and 64 lowercase hex'):
        lz.lease_name(value)


@pytest.mark.parametrize('value', ['run-1', 'awx-job-4711', 'cli:gpu-ctl:1234@2026-12-07T06:00:00Z', 'a' * 128,
                                   '6f1e3c2a-1d4b-4c55-9a0e-1f2e3d4c5b6a', 'x/y+z=w'])
def test_good_holders(value):
    assert lz.check_holder(value) == value


@pytest.mark.parametrize('value, shown', [
    ('', '""'), (' run', '" run"'), ('run 1', '"run 1"'), ('-run', '"-run"'), ('a' * 129, '"' + 'a' * 97 + '..."'),
    ('run\n1', '"run\\n1"'), (None, 'None'), (12, '12'), ('rün', '"rün"')])
def test_a_bad_holder_is_refused_naming_field_and_value(value, shown):
    with pytest.raises(lz.LeaseError) as e:
        lz.check_holder(value)
    assert str(e.value).startswith('holder: %s is not a run id' % shown)


@pytest.mark.parametrize('check, field, good, bad', [
    (lz.check_duration, 'duration', [1, 2, 3600, 604800], [0, -1, 604801, True, 2.5, '60', None]),
    (lz.check_skew, 'clock_skew', [0, 5, 300], [-1, 301, False, 1.0, '5']),
])
def test_seconds_are_bounded_whole_numbers(check, field, good, bad):
    for value in good:
        assert check(value) == value
    for value in bad:
        with pytest.raises(lz.LeaseError, match=r'^%s: .* is not a whole number of seconds from' % field):
            check(value)


def test_bad_namespace_and_now_are_refused():
    with pytest.raises(lz.LeaseError, match=r"^namespace: 'Gpu_Fleet' is not a Kubernetes namespace name"):
        lz.check_namespace('Gpu_Fleet')
    with pytest.raises(lz.LeaseError, match=r'^now: .* is not an aware datetime'):
        lz.judge(None, DIGEST, 'run-a', datetime.datetime(2026, 12, 7), 60)
    with pytest.raises(lz.LeaseError, match=r'^now: '):
        lz.judge(None, DIGEST, 'run-a', '2026-12-07T06:00:00Z', 60)


def test_micro_times_are_written_as_kubernetes_writes_them():
    assert lz.format_micro(T0) == '2026-12-07T06:00:00.000000Z'
    cet = datetime.timezone(datetime.timedelta(hours=1))
    assert lz.format_micro(datetime.datetime(2026, 12, 7, 7, 0, 0, 5, tzinfo=cet)) == '2026-12-07T06:00:00.000005Z'


# -- judge ------------------------------------------------------------------------------------
def test_no_lease_creates_it_held_by_us():
    v = lz.judge(None, DIGEST, 'run-a', T0, 90)
    assert (v.action, v.outcome) == ('create', 'created')
    assert v.body == {
        'apiVersion': 'coordination.k8s.io/v1', 'kind': 'Lease',
        'metadata': {'name': NAME, 'namespace': NS, 'labels': {'app.kubernetes.io/managed-by': 'gpufleet.upgrade'},
                     'annotations': {'gpufleet.io/plan-digest': DIGEST}},
        'spec': {'holderIdentity': 'run-a', 'leaseDurationSeconds': 90, 'acquireTime': '2026-12-07T06:00:00.000000Z',
                 'renewTime': '2026-12-07T06:00:00.000000Z', 'leaseTransitions': 0}}
    assert v.msg == 'Lease gpufleet-system/%s created, held by "run-a"' % NAME
    assert lz.judge(None, DIGEST, 'run-a', T0, 90, namespace='ops').body['metadata']['namespace'] == 'ops'


@pytest.mark.parametrize('renewed', [0, -1000, 30])
def test_our_own_lease_is_renewed_fresh_or_expired_and_keeps_its_acquire_time(renewed):
    v = lz.judge(lease('run-a', renewed=renewed, transitions=3), DIGEST, 'run-a', at(10), 120)
    assert (v.action, v.outcome) == ('patch', 'renewed')
    assert v.body == {'spec': {'holderIdentity': 'run-a', 'leaseDurationSeconds': 120,
                               'renewTime': '2026-12-07T06:00:10.000000Z'}}


def test_another_holders_fresh_lease_is_refused_naming_holder_renew_time_and_expiry():
    v = lz.judge(lease('run-b', renewed=0, duration=60), DIGEST, 'run-a', at(30), 60)
    assert (v.action, v.outcome, v.body) == ('refuse', 'held', None)
    assert v.msg == ('Lease gpufleet-system/%s is held by "run-b" (renewTime 2026-12-07T06:00:00.000000Z, 60s lease): '
                     'it expires at 2026-12-07T06:01:00.000000Z (2026-12-07T06:01:05.000000Z allowing 5s of clock skew); '
                     'another run of this plan is going on, or ended without releasing it' % NAME)


def test_an_expired_lease_is_taken_over_with_one_more_transition():
    v = lz.judge(lease('run-b', renewed=0, duration=60, transitions=4), DIGEST, 'run-a', at(66), 90)
    assert (v.action, v.outcome) == ('patch', 'taken_over')
    stamp = '2026-12-07T06:01:06.000000Z'
    assert v.body == {'spec': {'holderIdentity': 'run-a', 'leaseDurationSeconds': 90, 'renewTime': stamp,
                               'acquireTime': stamp, 'leaseTransitions': 5}}
    assert v.msg == ('Lease gpufleet-system/%s taken over by "run-a": "run-b"\'s lease expired at '
                     '2026-12-07T06:01:00.000000Z' % NAME)


@pytest.mark.parametrize('spec', [{'holderIdentity': None}, {'holderIdentity': ''}])
def test_a_released_lease_is_taken_at_once_whatever_its_times(spec):
    held = lease('run-b', renewed=0, duration=3600, transitions=1)
    held['spec'].update(spec)
    if spec['holderIdentity'] is None:
        del held['spec']['holderIdentity']
    v = lz.judge(held, DIGEST, 'run-a', at(1), 60)
    assert (v.action, v.outcome) == ('patch', 'taken_over')
    assert v.body['spec']['leaseTransitions'] == 2 and v.body['spec']['holderIdentity'] == 'run-a'
    assert v.msg == 'Lease gpufleet-system/%s taken by "run-a": no run held it' % NAME


# -- clock skew ---------------------------------------------------------------------------------
@pytest.mark.parametrize('skew, now, outcome', [
    (0, 59.999, 'held'), (0, 60, 'taken_over'),           # exactly at renewTime + duration: expired
    (5, 64.999, 'held'), (5, 65, 'taken_over'),           # the holder's clock may be 5 s behind ours
    (300, 359, 'held'), (300, 360, 'taken_over'),
])
def test_a_lease_expires_only_after_its_duration_and_the_allowed_skew(skew, now, outcome):
    assert lz.judge(lease('run-b', renewed=0, duration=60), DIGEST, 'run-a', at(now), 60, skew_s=skew).outcome == outcome


def test_a_renew_time_ahead_of_our_clock_is_refused_saying_the_clocks_disagree():
    # the holder's clock runs 10 minutes ahead: its fresh lease looks like it was renewed in the future
    v = lz.judge(lease('run-b', renewed=600, duration=60), DIGEST, 'run-a', T0, 60, skew_s=5)
    assert v.outcome == 'held'
    assert v.msg.endswith("its renewTime is 600s ahead of this controller's clock (2026-12-07T06:00:00.000000Z): "
                          'the clocks disagree by more than the allowed skew')
    # within the allowed skew: no such remark
    assert 'ahead' not in lz.judge(lease('run-b', renewed=5, duration=60), DIGEST, 'run-a', T0, 60, skew_s=5).msg


def test_the_holders_duration_not_ours_decides_when_its_lease_expires():
    held = lease('run-b', renewed=0, duration=600)
    assert lz.judge(held, DIGEST, 'run-a', at(100), 2, skew_s=0).outcome == 'held'
    assert lz.judge(held, DIGEST, 'run-a', at(600), 2, skew_s=0).outcome == 'taken_over'


def test_without_a_renew_time_the_acquire_time_counts():
    held = lease('run-b', duration=60)
    del held['spec']['renewTime']           # acquireTime at -100 s
    assert lz.judge(held, DIGEST, 'run-a', at(-50), 60, skew_s=0).outcome == 'held'
    assert lz.judge(held, DIGEST, 'run-a', at(-40), 60, skew_s=0).outcome == 'taken_over'


@pytest.mark.parametrize('change, match', [
    ({'leaseDurationSeconds': None}, r'has no spec.renewTime, spec.acquireTime or spec.leaseDurationSeconds'),
    ({'renewTime': None, 'acquireTime': None}, r'has no spec.renewTime'),
    ({'renewTime': 'yesterday'}, r"spec.renewTime: 'yesterday' is not an RFC 3339 time"),
    ({'renewTime': '2026-12-07T06:00:00'}, r'has no UTC offset'),
    ({'leaseDurationSeconds': 'long'}, r'spec.leaseDurationSeconds: "long" is not a number of seconds'),
    ({'leaseDurationSeconds': -1}, r'spec.leaseDurationSeconds: -1 is not a number of seconds'),
])
def test_another_holders_lease_that_cannot_be_judged_fails_naming_the_field(change, match):
    held = lease('run-b')
    for key, value in change.items():
        if value is None:
            held['spec'].pop(key, None)
        else:
            held['spec'][key] = value
    with pytest.raises(lz.LeaseError, match=r'^Lease gpufleet-system/%s .*%s' % (NAME, match)):
        lz.judge(held, DIGEST, 'run-a', at(1), 60)


def test_our_own_lease_with_unreadable_times_is_renewed_and_repaired():
    held = lease('run-a', renewTime='garbage')
    v = lz.judge(held, DIGEST, 'run-a', at(1), 60)
    assert v.outcome == 'renewed' and v.body['spec']['renewTime'] == '2026-12-07T06:00:01.000000Z'


def test_a_lease_we_did_not_make_or_of_another_plan_is_not_touched():
    with pytest.raises(lz.LeaseError, match=r'^Lease gpufleet-system/%s was not made by gpufleet.upgrade' % NAME):
        lz.judge(lease('run-b', managed=False), DIGEST, 'run-a', at(1000), 60)
    with pytest.raises(lz.LeaseError, match=r'belongs to plan "%s", not %s .*share the first 12 digits'
                                            % (OTHER_DIGEST, DIGEST)):
        lz.judge(lease('run-a', digest=OTHER_DIGEST), DIGEST, 'run-a', at(1), 60)
    with pytest.raises(lz.LeaseError, match=r'was not made by'):
        lz.release(lease('run-a', managed=False), DIGEST, 'run-a')


def test_judge_checks_its_inputs():
    with pytest.raises(lz.LeaseError, match=r'^holder: '):
        lz.judge(None, DIGEST, 'run a', T0, 60)
    with pytest.raises(lz.LeaseError, match=r'^duration_s: 0 is not'):
        lz.judge(None, DIGEST, 'run-a', T0, 0)
    with pytest.raises(lz.LeaseError, match=r'^skew_s: 301 is not'):
        lz.judge(None, DIGEST, 'run-a', T0, 60, skew_s=301)
    with pytest.raises(lz.LeaseError, match=r'^plan_digest: '):
        lz.judge(None, 'abc', 'run-a', T0, 60)


# -- renewal -------------------------------------------------------------------------------------
def test_a_renewal_renews_only_our_own_lease():
    assert lz.renewal(lease('run-a', renewed=-1000), DIGEST, 'run-a', T0, 60).outcome == 'renewed'
    gone = lz.renewal(None, DIGEST, 'run-a', T0, 60)
    assert (gone.action, gone.outcome) == ('refuse', 'lost')
    assert gone.msg.startswith('Lease gpufleet-system/%s does not exist: "run-a" no longer holds the plan' % NAME)
    taken = lz.renewal(lease('run-b'), DIGEST, 'run-a', T0, 60)
    assert (taken.action, taken.outcome) == ('refuse', 'lost')
    assert taken.msg.startswith('Lease gpufleet-system/%s is held by "run-b", not by "run-a": this run lost the plan'
                                % NAME)
    # an expired lease of another holder, or a released one, is not taken by a renewal either
    assert lz.renewal(lease('run-b', renewed=-1000), DIGEST, 'run-a', T0, 60).outcome == 'lost'
    assert 'held by no one' in lz.renewal(lease(''), DIGEST, 'run-a', T0, 60).msg
    # another holder's Lease is lost to us whatever its times say (even unreadable ones)
    assert lz.renewal(lease('run-b', renewTime='garbage'), DIGEST, 'run-a', T0, 60).outcome == 'lost'
    with pytest.raises(lz.LeaseError, match=r'^holder: '):
        lz.renewal(None, DIGEST, 'run a', T0, 60)
    with pytest.raises(lz.LeaseError, match=r'^duration_s: '):
        lz.renewal(None, DIGEST, 'run-a', T0, 0)
    with pytest.raises(lz.LeaseError, match=r'was not made by'):
        lz.renewal(lease('run-b', managed=False), DIGEST, 'run-a', T0, 60)


# -- release --------------------------------------------------------------------------------------
def test_release_clears_only_our_own_holder():
    v = lz.release(lease('run-a'), DIGEST, 'run-a')
    assert (v.action, v.outcome, v.body) == ('patch', 'released', {'spec': {'holderIdentity': None}})
    assert v.msg == 'Lease gpufleet-system/%s released by "run-a"' % NAME
    other = lz.release(lease('run-b'), DIGEST, 'run-a')
    assert (other.action, other.outcome, other.body) == ('none', 'not_held', None)
    assert other.msg == 'Lease gpufleet-system/%s is held by "run-b", not by "run-a": left as it is' % NAME
    assert lz.release(lease(''), DIGEST, 'run-a').msg.endswith('is held by no one, not by "run-a": left as it is')
    assert lz.release(None, DIGEST, 'run-a') == ('none', 'not_held', None,
                                                 'Lease %s does not exist: nothing to release' % NAME)


def test_release_checks_its_inputs():
    with pytest.raises(lz.LeaseError, match=r'^holder: '):
        lz.release(None, DIGEST, '')
    with pytest.raises(lz.LeaseError, match=r'^plan_digest: '):
        lz.release(None, 'sha256:x', 'run-a')


# -- summary and prediction ----------------------------------------------------------------------
def test_summary_shows_the_holder_times_and_expiry():
    assert lz.summary(None) is None
    assert lz.summary(lease('run-b', renewed=0, duration=60, transitions=2)) == {
        'name': NAME, 'namespace': NS, 'holder': 'run-b', 'acquire_time': '2026-12-07T05:58:20.000000Z',
        'renew_time': '2026-12-07T06:00:00.000000Z', 'duration': 60, 'transitions': 2,
        'expires': '2026-12-07T06:01:00.000000Z', 'plan_digest': DIGEST}
    released = lz.summary(lease(''))
    assert released['holder'] is None and released['expires'] is None
    assert lz.summary(lease('run-b', renewTime='bad'))['expires'] is None


def test_predicted_applies_the_verdict_without_a_write():
    held = lease('run-a')
    after = lz.predicted(held, lz.release(held, DIGEST, 'run-a'))
    assert 'holderIdentity' not in after['spec'] and held['spec']['holderIdentity'] == 'run-a'
    create = lz.judge(None, DIGEST, 'run-a', T0, 60)
    assert lz.predicted(None, create) == create.body
    refused = lz.judge(lease('run-b'), DIGEST, 'run-a', at(1), 60)
    assert lz.predicted(lease('run-b'), refused) == lease('run-b')


# -- settle: reads and writes ---------------------------------------------------------------------
PATH = '/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s' % (NS, NAME)
COLLECTION = '/apis/coordination.k8s.io/v1/namespaces/%s/leases' % NS


class FakeClient:
    """A Lease store with resourceVersions; `faults` (a list) answers the next writes with errors first, and
    `meddle(store)` runs before each write (another run's write between our read and ours)."""

    def __init__(self, obj=None, faults=None, meddle=None):
        self.obj = copy.deepcopy(obj)
        self.rv = int(obj['metadata']['resourceVersion']) if obj else 0
        self.faults = list(faults or [])
        self.meddle = meddle
        self.calls = []

    def get_or_none(self, path):
        self.calls.append(('GET', path))
        return copy.deepcopy(self.obj)

    def _write(self):
        if self.meddle:
            self.meddle(self)
        if self.faults:
            raise self.faults.pop(0)

    def bump(self):
        self.rv += 1
        self.obj['metadata']['resourceVersion'] = str(self.rv)

    def post(self, path, body):
        self.calls.append(('POST', path))
        self._write()
        if self.obj is not None:
            raise ConflictError('POST %s: HTTP 409 AlreadyExists' % path, status=409)
        self.obj = copy.deepcopy(body)
        self.rv += 1
        self.obj['metadata']['resourceVersion'] = str(self.rv)
        return copy.deepcopy(self.obj)

    def patch(self, path, body):
        self.calls.append(('PATCH', path, body['metadata']['resourceVersion']))
        self._write()
        if self.obj is None:
            raise NotFoundError('PATCH %s: HTTP 404' % path, status=404, path=path)
        if body['metadata']['resourceVersion'] != self.obj['metadata']['resourceVersion']:
            raise ConflictError('PATCH %s: HTTP 409 the object has been modified' % path, status=409)
        self.obj = lz.predicted(self.obj, lz.Verdict('patch', '', body, ''))
        self.bump()
        return copy.deepcopy(self.obj)


def acquire(holder='run-a', now=T0, duration=60):
    return lambda obj: lz.judge(obj, DIGEST, holder, now, duration)


def test_settle_creates_and_patches_under_the_read_resource_version():
    client = FakeClient()
    done = lz.settle(client, PATH, COLLECTION, acquire())
    assert done.verdict.outcome == 'created' and done.before is None and done.attempts == 1
    assert client.obj['spec']['holderIdentity'] == 'run-a'
    done = lz.settle(client, PATH, COLLECTION, acquire(now=at(5)))
    assert done.verdict.outcome == 'renewed' and client.calls[-1] == ('PATCH', PATH, '1')
    assert client.obj['spec']['renewTime'] == '2026-12-07T06:00:05.000000Z'


def test_settle_in_check_mode_writes_nothing():
    client = FakeClient(lease('run-b', renewed=-1000))
    done = lz.settle(client, PATH, COLLECTION, acquire(), check_mode=True)
    assert done.verdict.outcome == 'taken_over' and done.after['spec']['holderIdentity'] == 'run-a'
    assert [c[0] for c in client.calls] == ['GET'] and client.obj == lease('run-b', renewed=-1000)
    assert lz.settle(FakeClient(), PATH, COLLECTION, acquire(), check_mode=True).after['spec']['holderIdentity'] == 'run-a'


def test_a_create_race_lost_re_reads_and_is_refused_by_the_winners_fresh_lease():
    def winner(store):
        if store.obj is None:
            store.obj = lease('run-b', renewed=0, rv='3')
    client = FakeClient(meddle=winner)
    done = lz.settle(client, PATH, COLLECTION, acquire(now=at(1)), sleep=lambda s: None)
    assert (done.verdict.outcome, done.attempts) == ('held', 2)
    assert [c[0] for c in client.calls] == ['GET', 'POST', 'GET']
    assert client.obj['spec']['holderIdentity'] == 'run-b'


def test_a_takeover_race_lost_re_reads_and_is_refused():
    def other_takes_it(store):
        if store.obj['spec']['holderIdentity'] == 'run-old':
            store.obj['spec'].update(holderIdentity='run-b', renewTime=lz.format_micro(at(100)))
            store.bump()
    client = FakeClient(lease('run-old', renewed=0, duration=60), meddle=other_takes_it)
    done = lz.settle(client, PATH, COLLECTION, acquire(now=at(100)), sleep=lambda s: None)
    assert (done.verdict.outcome, done.attempts) == ('held', 2)
    assert client.calls[1] == ('PATCH', PATH, '7') and client.obj['spec']['holderIdentity'] == 'run-b'


def test_a_release_after_a_renewal_by_ourselves_elsewhere_re_reads_and_releases():
    bumped = []

    def renew_once(store):
        if not bumped:
            bumped.append(1)
            store.bump()
    client = FakeClient(lease('run-a'), meddle=renew_once)
    done = lz.settle(client, PATH, COLLECTION, lambda obj: lz.release(obj, DIGEST, 'run-a'), sleep=lambda s: None)
    assert (done.verdict.outcome, done.attempts) == ('released', 2)
    assert 'holderIdentity' not in client.obj['spec'] and client.obj['spec']['leaseTransitions'] == 0


def test_a_lease_deleted_between_read_and_patch_is_decided_again():
    def delete(store):
        store.obj = None
        store.meddle = None
    client = FakeClient(lease('run-a'), meddle=delete)
    done = lz.settle(client, PATH, COLLECTION, acquire(now=at(1)), sleep=lambda s: None)
    assert (done.verdict.outcome, done.attempts) == ('created', 2)
    lost = FakeClient(lease('run-a'), meddle=delete)
    renew = lz.settle(lost, PATH, COLLECTION, lambda obj: lz.renewal(obj, DIGEST, 'run-a', at(1), 60))
    assert renew.verdict.outcome == 'lost'


def test_a_create_into_a_missing_namespace_is_not_retried():
    client = FakeClient(faults=[NotFoundError('POST %s: HTTP 404 namespaces "x" not found' % COLLECTION, status=404,
                                              path=COLLECTION)])
    with pytest.raises(NotFoundError):
        lz.settle(client, PATH, COLLECTION, acquire())
    assert [c[0] for c in client.calls] == ['GET', 'POST']


def test_a_retryable_write_failure_re_reads_and_sees_the_write_applied():
    applied = []

    def apply_then_fail(store):     # the write lands, the answer is lost (a 503 after the fact)
        if not applied:
            applied.append(1)
            store.obj['spec'].update(renewTime=lz.format_micro(at(1)))
            store.bump()
            raise K8sError('PATCH: HTTP 503', status=503)
    client = FakeClient(lease('run-a'), meddle=apply_then_fail)
    done = lz.settle(client, PATH, COLLECTION, acquire(now=at(1)), sleep=lambda s: None)
    assert (done.verdict.outcome, done.attempts) == ('renewed', 2)


def test_a_forbidden_write_is_raised_at_once():
    client = FakeClient(lease('run-a'), faults=[K8sError('PATCH: HTTP 403 forbidden', status=403)])
    with pytest.raises(K8sError, match='403'):
        lz.settle(client, PATH, COLLECTION, acquire())
    assert len(client.calls) == 2


def test_conflicts_are_bounded():
    def always(store):
        store.bump()
    sleeps = []
    client = FakeClient(lease('run-a'), meddle=always)
    with pytest.raises(ConflictError, match=r'the Lease kept changing \(409 Conflict on 3 attempts'):
        lz.settle(client, PATH, COLLECTION, acquire(), attempts=3, sleep=sleeps.append)
    assert len(sleeps) == 2 and all(s <= 2.0 for s in sleeps)
    client = FakeClient(lease('run-a'), faults=[K8sError('PATCH: timeout', status=None, reason='timeout')] * 2)
    with pytest.raises(K8sError, match=r'timeout \(gave up after 2 attempts'):
        lz.settle(client, PATH, COLLECTION, acquire(), attempts=2)


# -- a command-line run of this controller whose process has ended ----------------------------------------------
def test_a_command_line_run_id_names_controller_process_and_start_and_reads_back():
    holder = lz.cli_holder('ops team', 'jump-1.example.org', 48213, 91827364)
    assert holder == 'cli:ops-team@jump-1.example.org:48213.91827364'
    assert lz.cli_process(holder) == ('jump-1.example.org', 48213, 91827364)
    assert lz.cli_process('awx:template-12') is None and lz.cli_process(None) is None
    long = lz.cli_holder('u' * 80, 'h' * 200, 4194304, 10 ** 19)
    assert lz.check_holder(long) == long and lz.cli_process(long) == ('h' * 60, 4194304, 10 ** 19)


@pytest.mark.parametrize('holder, host, running, ended', [
    ('cli:ops@jump-1:100.5000', 'jump-1', {}, True),                     # no process 100 any more
    ('cli:ops@jump-1:100.5000', 'jump-1', {100: 7000}, True),            # pid 100 reused by a later process
    ('cli:ops@jump-1:100.5000', 'jump-1', {100: 5000}, False),           # the run still runs
    ('cli:ops@jump-1:100.5000', 'jump-2', {}, False),                    # another controller: cannot know
    ('cli:ops@jump-1:100.0', 'jump-1', {}, False),                       # its controller could not read the start
    ('awx:template-12', 'jump-1', {}, False),
    ('run-b', 'jump-1', {}, False),
])
def test_only_a_command_line_run_of_this_controller_whose_process_is_gone_has_ended(holder, host, running, ended):
    assert lz.holder_ended(holder, host, running.get) is ended


def test_a_fresh_lease_whose_holder_ended_is_taken_over_at_once_and_says_why():
    old = 'cli:ops@jump-1:100.5000'
    fresh = lease(old, renewed=0, duration=3600, transitions=2)
    assert lz.judge(fresh, DIGEST, 'cli:ops@jump-1:200.6000', at(30), 3600).outcome == 'held'
    v = lz.judge(fresh, DIGEST, 'cli:ops@jump-1:200.6000', at(30), 3600, ended=True)
    assert (v.action, v.outcome) == ('patch', 'taken_over')
    assert v.body['spec']['holderIdentity'] == 'cli:ops@jump-1:200.6000' and v.body['spec']['leaseTransitions'] == 3
    assert v.msg == ('Lease gpufleet-system/%s taken over by "cli:ops@jump-1:200.6000": its holder '
                     '"cli:ops@jump-1:100.5000" was a run on this controller whose process has ended (its lease would '
                     'have expired at 2026-12-07T07:00:00.000000Z)' % NAME)
