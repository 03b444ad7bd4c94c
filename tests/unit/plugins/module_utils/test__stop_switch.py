"""The stop switch's verdict: a ConfigMap at the switch's name stops the rollout, whatever it holds, unless it
names another rollout; bad names are refused with the field and the value."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _stop_switch
from ansible_collections.gpufleet.upgrade.plugins.module_utils._stop_switch import StopSwitchError, edits, judge, looks_like

NS, NAME = 'gpufleet-system', 'gpufleet-stop'


def configmap(data=None, created='2026-12-02T07:00:00Z'):
    obj = {'apiVersion': 'v1', 'kind': 'ConfigMap',
           'metadata': {'name': NAME, 'namespace': NS, 'creationTimestamp': created}}
    if data is not None:
        obj['data'] = data
    return obj


def test_no_configmap_is_not_stopped():
    v = judge(None, NS, NAME, 'gpu-rollout')
    assert (v.stopped, v.exists) == (False, False)
    assert v.msg == 'the stop switch (ConfigMap gpufleet-system/gpufleet-stop) is not set'


def test_a_configmap_stops_with_its_reason_who_and_when():
    v = judge(configmap({'reason': 'Xid storm\n in rack 12', 'by': 'alice'}), NS, NAME, 'gpu-rollout')
    assert (v.stopped, v.exists, v.reason, v.set_by, v.set_at) == (
        True, True, 'Xid storm in rack 12', 'alice', '2026-12-02T07:00:00Z')
    assert v.msg == ('rollout stopped by the stop switch (ConfigMap gpufleet-system/gpufleet-stop, reason: Xid storm '
                     'in rack 12, set by alice, at 2026-12-02T07:00:00Z): no further node or batch starts; delete the '
                     'ConfigMap to let a rerun resume')


@pytest.mark.parametrize('data', [None, {}, {'stop': 'false'}, {'reason': 3}, {'rollout': ''}])
def test_any_configmap_at_that_name_stops_the_rollout(data):
    """Fails safe: an empty switch, an unexpected value or a 'false' still stops."""
    v = judge(configmap(data), NS, NAME, 'gpu-rollout')
    assert v.stopped is True
    assert 'reason:' not in v.msg and 'set by' not in v.msg


def test_a_switch_for_another_rollout_does_not_stop_this_one():
    v = judge(configmap({'rollout': 'pool-b', 'reason': 'b only'}), NS, NAME, 'gpu-rollout')
    assert (v.stopped, v.exists, v.rollout) == (False, True, 'pool-b')
    assert v.msg == 'the stop switch (ConfigMap gpufleet-system/gpufleet-stop) is set for rollout pool-b only, not for gpu-rollout'
    assert judge(configmap({'rollout': 'pool-b'}), NS, NAME, 'pool-b').stopped is True
    # a rollout without an id is not pool-b
    assert judge(configmap({'rollout': 'pool-b'}), NS, NAME, '').stopped is False


@pytest.mark.parametrize('scope', ['gpu-rolout', 'gpu-rollotu', 'GPU-Rollout', 'gpu_rollout', 'gpu rollout ',
                                   'gpu-rollout-', 'gpu-rolloutt', 'gpx-rollout'])
def test_a_mistyped_rollout_stops_this_one_too(scope):
    # T3-21 of the 2026-12-06 review: a switch typed in a hurry with a typo in data.rollout stopped nothing.
    v = judge(configmap({'rollout': scope, 'reason': 'Xid storm'}), NS, NAME, 'gpu-rollout')
    assert (v.stopped, v.exists, v.rollout) == (True, True, scope.strip())
    assert "taken for a typo of it" in v.msg and 'reason: Xid storm' in v.msg


@pytest.mark.parametrize('scope, reader', [('pool-b', 'gpu-rollout'), ('gpu-rollout-canary', 'gpu-rollout'),
                                           ('train-2026w49', 'infer-2026w49'), ('x', 'gpu-rollout')])
def test_a_switch_for_a_clearly_other_rollout_does_not_stop_this_one(scope, reader):
    assert judge(configmap({'rollout': scope}), NS, NAME, reader).stopped is False


def test_edits_counts_swaps_and_stops_at_the_limit():
    assert edits('gpu-rollout', 'gpu-rollout') == 0
    assert edits('gpu-rollout', 'gpu-rolluot') == 1          # o and u swapped: one edit
    assert edits('ab', 'ba') == 1
    assert edits('rollout', 'rolout') == 1
    assert edits('abcdef', 'uvwxyz') == 3                    # the limit + 1, not 6
    assert edits('a' * 200, 'b' * 200) == 3
    assert looks_like('anything', '') is False               # a reader without an id has nothing to mistype


def test_long_text_is_cut():
    v = judge(configmap({'reason': 'x' * 500}), NS, NAME)
    assert len(v.reason) == 200 and v.reason.endswith('...')


def test_missing_creation_time():
    obj = configmap({'reason': 'r'})
    del obj['metadata']['creationTimestamp']
    v = judge(obj, NS, NAME)
    assert v.set_at == '' and ', at ' not in v.msg


@pytest.mark.parametrize('namespace,name,field', [
    ('Gpufleet', NAME, "namespace: 'Gpufleet'"),
    ('a.b', NAME, "namespace: 'a.b'"),
    ('', NAME, "namespace: ''"),
    (None, NAME, 'namespace: None'),
    ('x' * 64, NAME, 'namespace:'),
    (NS, 'Stop', "name: 'Stop'"),
    (NS, 'stop/../x', "name: 'stop/../x'"),
    (NS, '', "name: ''"),
    (NS, 7, 'name: 7'),
])
def test_bad_names_are_refused_naming_the_field(namespace, name, field):
    with pytest.raises(StopSwitchError) as err:
        _stop_switch.path(namespace, name)
    assert str(err.value).startswith(field)
    with pytest.raises(StopSwitchError):
        judge(None, namespace, name)


def test_path_and_dotted_names():
    assert _stop_switch.path(NS, 'stop.pool-b') == '/api/v1/namespaces/gpufleet-system/configmaps/stop.pool-b'


def test_bad_rollout_id_and_object():
    with pytest.raises(StopSwitchError, match='rollout_id: 5'):
        judge(None, NS, NAME, 5)
    with pytest.raises(StopSwitchError, match='the API returned list'):
        judge([], NS, NAME)


class FakeClock:
    """A clock and a sleep that advance together: the wait is ordered by the test, not by wall time."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_watch_ends_at_the_read_that_sees_the_switch():
    clock = FakeClock()
    reads = []

    def get(where):
        reads.append(where)
        return configmap({'reason': 'rack 12'}) if clock.now >= 25 else None
    verdict, waited = _stop_switch.watch(get, NS, NAME, 'gpu-rollout', wait=900, interval=10,
                                         clock=clock.clock, sleep=clock.sleep)
    assert verdict.stopped and verdict.reason == 'rack 12'
    assert waited == 30 and clock.sleeps == [10, 10, 10]      # set at 25 s: seen at the read at 30 s
    assert reads == ['/api/v1/namespaces/gpufleet-system/configmaps/gpufleet-stop'] * 4


def test_watch_without_the_switch_lasts_the_wait_and_never_longer():
    clock = FakeClock()
    verdict, waited = _stop_switch.watch(lambda where: None, NS, NAME, 'gpu-rollout', wait=25, interval=10,
                                         clock=clock.clock, sleep=clock.sleep)
    assert not verdict.stopped and waited == 25 and clock.sleeps == [10, 10, 5]


def test_watch_goes_on_past_another_rollouts_switch():
    clock = FakeClock()
    verdict, waited = _stop_switch.watch(lambda where: configmap({'rollout': 'pool-b-week-52'}), NS, NAME,
                                         'gpu-rollout', wait=20, interval=10, clock=clock.clock, sleep=clock.sleep)
    assert (verdict.stopped, verdict.exists, waited) == (False, True, 20)


def test_watch_of_zero_reads_once():
    clock = FakeClock()
    verdict, waited = _stop_switch.watch(lambda where: None, NS, NAME, '', wait=0, interval=10,
                                         clock=clock.clock, sleep=clock.sleep)
    assert not verdict.stopped and waited == 0 and clock.sleeps == []


@pytest.mark.parametrize('field,value,message', [
    ('wait', -1, "wait: -1 is not a number of seconds >= 0"),
    ('wait', 'soon', "wait: 'soon' is not a number of seconds >= 0"),
    ('interval', 0, 'interval: 0 is not a number of seconds > 0'),
    ('interval', True, 'interval: True is not a number of seconds > 0'),
    ('interval', 31, 'interval: 31 is more than 30 seconds: a switch set during the wait must end it within 30 s'),
])
def test_watch_refuses_bad_waits_before_any_read(field, value, message):
    reads = []
    kwargs = {'wait': 10, 'interval': 10, field: value}
    with pytest.raises(StopSwitchError) as err:
        _stop_switch.watch(reads.append, NS, NAME, '', **kwargs)
    assert str(err.value) == message and reads == []
