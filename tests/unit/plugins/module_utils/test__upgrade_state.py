"""The Node progress record that makes a rollout resumable."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain as D
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state as S
from ansible_collections.gpufleet.upgrade.plugins.module_utils._merge_patch import apply_merge_patch

KEY = 'driver=580.130.00,kernel=6.8.0-134-generic'
TARGET = {'kernel': '6.8.0-134-generic', 'driver': '580.130.00'}


def node(ann=None, unschedulable=False, ready=True):
    return {'metadata': {'name': 'gpu-07', 'annotations': dict(ann or {})},
            'spec': {'unschedulable': True} if unschedulable else {},
            'status': {'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False'}]}}


def test_target_key_is_sorted_and_validated():
    assert S.target_key(TARGET) == KEY
    with pytest.raises(S.StateError, match=r"target.driver: 'a,b' may not contain"):
        S.target_key({'driver': 'a,b'})
    with pytest.raises(S.StateError, match='non-empty mapping'):
        S.target_key({})


def test_fresh_node_has_no_phase_and_reports_its_own_cordon():
    v = S.view(node(unschedulable=True, ready=False), KEY)
    assert v['phase'] is None and v['done_phases'] == [] and not v['completed']
    assert v['was_cordoned'] is True and v['ready'] is False


def test_phases_done_follow_the_order_and_draining_counts_as_cordoned():
    v = S.view(node({S.ANN_STATE: 'installed', S.ANN_TARGET: KEY, S.ANN_INITIAL: 'false'}, True), KEY)
    assert v['done_phases'] == ['cordoned', 'drained', 'snapshotted', 'installed']
    assert v['was_cordoned'] is False
    v = S.view(node({S.ANN_STATE: 'draining', S.ANN_TARGET: KEY, S.ANN_INITIAL: 'false'}, True), KEY)
    assert v['done_phases'] == ['cordoned']


def test_view_reports_what_the_kubelet_runs():
    n = node()
    n['status']['nodeInfo'] = {'kernelVersion': '6.8.0-134-generic', 'kubeletVersion': 'v1.35.3+rke2r3'}
    v = S.view(n, KEY)
    assert (v['kernel'], v['rke2']) == ('6.8.0-134-generic', 'v1.35.3+rke2r3')
    assert S.view(node(), KEY)['rke2'] is None


def test_view_says_whether_halted_vms_are_recorded():
    assert S.ANN_STOPPED_VMS == D.ANN_STOPPED_VMS
    assert S.view(node(), KEY)['vms_to_start'] is False
    assert S.view(node({S.ANN_STOPPED_VMS: '[]'}), KEY)['vms_to_start'] is False
    vm = '[{"name":"vm-1","namespace":"ml","runStrategy":"Always"}]'
    assert S.view(node({S.ANN_STOPPED_VMS: vm}), KEY)['vms_to_start'] is True
    # A malformed record still counts: node_drain start_vms runs and names the problem.
    assert S.view(node({S.ANN_STOPPED_VMS: 'junk'}), KEY)['vms_to_start'] is True


def test_phases_of_another_target_do_not_count():
    v = S.view(node({S.ANN_STATE: 'validated', S.ANN_TARGET: 'driver=1'}), KEY)
    assert v['done_phases'] == [] and v['stale_target'] == 'driver=1'


def test_set_patch_records_phase_and_target_and_is_idempotent():
    patch = S.set_patch(node(), 'snapshotted', KEY)
    assert patch == {'metadata': {'annotations': {S.ANN_STATE: 'snapshotted', S.ANN_TARGET: KEY}}}
    after = apply_merge_patch(node(), patch)
    assert S.set_patch(after, 'snapshotted', KEY) is None


def test_done_replaces_progress_with_the_finished_target():
    n = node({S.ANN_STATE: 'validated', S.ANN_TARGET: KEY})
    after = apply_merge_patch(n, S.set_patch(n, 'done', KEY))
    assert after['metadata']['annotations'] == {S.ANN_DONE: KEY}
    assert S.view(after, KEY)['completed'] is True
    assert S.view(after, 'driver=9')['completed'] is False


def test_unknown_phase_is_refused_by_name():
    with pytest.raises(S.StateError, match=r"phase: 'rebooting' is not one of"):
        S.set_patch(node(), 'rebooting', KEY)


def test_isolation_adds_label_and_taint_once_and_removes_only_its_own():
    n = node()
    n['spec']['taints'] = [{'key': 'other', 'effect': 'NoExecute'}]
    patch = S.isolation_patch(n, True)
    assert patch == {'metadata': {'labels': {S.CANARY_KEY: 'true'}},
                     'spec': {'taints': [{'key': 'other', 'effect': 'NoExecute'},
                                         {'key': S.CANARY_KEY, 'value': 'true', 'effect': 'NoSchedule'}]}}
    n['metadata']['labels'] = {S.CANARY_KEY: 'true'}
    n['spec']['taints'] = patch['spec']['taints']
    assert S.isolation_patch(n, True) is None
    assert S.isolation_patch(n, False) == {'metadata': {'labels': {S.CANARY_KEY: None}},
                                           'spec': {'taints': [{'key': 'other', 'effect': 'NoExecute'}]}}


def test_isolation_owner_is_recorded_and_only_the_owner_releases():
    owner = 'gpufleet.upgrade.canary'
    n = node()
    patch = S.isolation_patch(n, True, owner=owner)
    assert patch['metadata'] == {'labels': {S.CANARY_KEY: 'true'}, 'annotations': {S.ANN_ISOLATED_BY: owner}}
    n['metadata']['labels'] = {S.CANARY_KEY: 'true'}
    n['metadata']['annotations'] = {S.ANN_ISOLATED_BY: owner}
    n['spec']['taints'] = patch['spec']['taints']
    assert S.isolation_patch(n, False, owner='someone-else') is None
    assert S.isolation_patch(n, False, owner=owner) == {
        'metadata': {'labels': {S.CANARY_KEY: None}, 'annotations': {S.ANN_ISOLATED_BY: None}},
        'spec': {'taints': None}}
    # A label someone else set is not claimed, so the owner never releases it.
    other = node()
    other['metadata']['labels'] = {S.CANARY_KEY: 'true'}
    assert 'annotations' not in (S.isolation_patch(other, True, owner=owner) or {}).get('metadata', {})
    assert S.isolation_patch(other, False, owner=owner) is None


@pytest.mark.parametrize('cordoned_before', [False, True])
def test_validated_survives_the_uncordon_so_a_rerun_resumes_after_the_gates(cordoned_before):
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain as D
    n = node({S.ANN_STATE: 'validated', S.ANN_TARGET: KEY,
              S.ANN_INITIAL: 'true' if cordoned_before else 'false'}, unschedulable=True)
    if not cordoned_before:
        _owned(n, D.FIELD_MANAGER, value=True)     # our cordon, as managedFields record it
    patch, kept = D.uncordon_patch(n)
    after = D.apply_merge_patch(n, patch)
    assert kept is cordoned_before
    v = S.view(after, KEY)
    # killed between the uncordon and `done`: every phase is done, the node is not completed yet
    assert v['phase'] == 'validated' and v['done_phases'] == list(S.PHASES) and not v['completed']
    assert v['was_cordoned'] is cordoned_before and v['unschedulable'] is cordoned_before
    # the rerun's uncordon changes nothing (an earlier cordon stays), then `done` clears the record
    assert D.uncordon_patch(after) == (None, cordoned_before)
    done = apply_merge_patch(after, S.set_patch(after, 'done', KEY))
    assert done['metadata']['annotations'] == {S.ANN_DONE: KEY}
    assert S.view(done, KEY)['completed'] is True


# -- issue 12 (2): recorded progress from `drained` on counts only while the node is cordoned ----
@pytest.mark.parametrize('phase', ['drained', 'snapshotted', 'installed', 'activated', 'validated'])
def test_progress_from_drained_on_does_not_count_on_a_node_uncordoned_since(phase):
    uncordoned = node({S.ANN_STATE: phase, S.ANN_TARGET: KEY, S.ANN_INITIAL: 'false'}, unschedulable=False)
    v = S.view(uncordoned, KEY)
    assert v['phase'] is None and v['done_phases'] == []
    assert v['cordon_lost'] is True
    cordoned = S.view(node({S.ANN_STATE: phase, S.ANN_TARGET: KEY, S.ANN_INITIAL: 'false'}, True), KEY)
    assert cordoned['phase'] == phase and cordoned['cordon_lost'] is False


def test_validated_after_our_own_uncordon_still_counts():
    """Our uncordon keeps `validated` and removes initial-unschedulable: the node is in service
    because this collection returned it, and a rerun resumes after the gates (no second drain)."""
    v = S.view(node({S.ANN_STATE: 'validated', S.ANN_TARGET: KEY}, unschedulable=False), KEY)
    assert v['done_phases'][-1] == 'validated' and v['cordon_lost'] is False


def test_a_record_without_a_target_is_stale():
    v = S.view(node({S.ANN_STATE: 'installed', S.ANN_INITIAL: 'false'}, True), KEY)
    assert v['phase'] is None and v['done_phases'] == [] and v['stale_target'] == ''


# -- issue 12 (5): the snapshot's digest is recorded on the Node with `snapshotted` --------------
def test_snapshotted_records_the_snapshot_digest_for_its_target():
    patch = S.set_patch(node(), 'snapshotted', KEY, snapshot_sha256='ab' * 32)
    assert patch == {'metadata': {'annotations': {S.ANN_STATE: 'snapshotted', S.ANN_TARGET: KEY,
                                                  S.ANN_SNAPSHOT: 'ab' * 32}}}
    after = apply_merge_patch(node(unschedulable=True), patch)
    assert S.view(after, KEY)['snapshot_sha256'] == 'ab' * 32
    assert S.view(after, 'driver=other')['snapshot_sha256'] is None      # another target's
    assert S.set_patch(after, 'installed', KEY) == {'metadata': {'annotations': {S.ANN_STATE: 'installed'}}}
    # a new target forgets the old digest (done keeps it: test_done_keeps_the_snapshot_digest)
    assert S.set_patch(after, 'cordoned', 'driver=other')['metadata']['annotations'][S.ANN_SNAPSHOT] is None
    with pytest.raises(S.StateError, match='snapshot_sha256'):
        S.set_patch(node(), 'snapshotted', KEY, snapshot_sha256='nothex')
    with pytest.raises(S.StateError, match='snapshot_sha256: only with phase snapshotted'):
        S.set_patch(node(), 'installed', KEY, snapshot_sha256='ab' * 32)


def test_done_keeps_the_snapshot_digest():
    """T3-1: a rollback after `done` needs the digest to check the snapshot it fetches against: `done` keeps it
    for the finished target; progress for another target (or the drain's record of one) drops it."""
    recorded = apply_merge_patch(node(unschedulable=True), S.set_patch(node(), 'snapshotted', KEY, 'ab' * 32))
    patch = S.set_patch(recorded, 'done', KEY)
    assert patch == {'metadata': {'annotations': {S.ANN_DONE: KEY, S.ANN_STATE: None, S.ANN_TARGET: None}}}
    done = apply_merge_patch(recorded, patch)
    v = S.view(done, KEY)
    assert v['completed'] is True and v['snapshot_sha256'] == 'ab' * 32
    assert S.view(done, 'driver=other')['snapshot_sha256'] is None
    assert S.set_patch(done, 'done', KEY) is None                                  # a second `done`: nothing to write
    # a rollback of the finished node records `rolled-back` for the same target: the digest stays its own
    back = apply_merge_patch(done, S.set_patch(done, 'rolled-back', KEY))
    assert back['metadata']['annotations'][S.ANN_SNAPSHOT] == 'ab' * 32 and S.view(back, KEY)['snapshot_sha256'] == 'ab' * 32
    # another target's progress, or its drain record, drops it
    assert S.set_patch(done, 'cordoned', 'driver=other')['metadata']['annotations'][S.ANN_SNAPSHOT] is None
    drained = D.with_target(done, D.state_patch(done, 'drained'), 'driver=other')
    assert drained['metadata']['annotations'][S.ANN_SNAPSHOT] is None
    assert S.ANN_SNAPSHOT not in (D.with_target(done, D.state_patch(done, 'drained'), KEY) or {}).get(
        'metadata', {}).get('annotations', {})
    # `done` for a target whose snapshot the Node does not record: another target's digest goes
    other = apply_merge_patch(node(unschedulable=True), S.set_patch(node(), 'snapshotted', 'driver=other', 'cd' * 32))
    assert S.set_patch(other, 'done', KEY)['metadata']['annotations'][S.ANN_SNAPSHOT] is None
    # a stray digest with no progress and no finished target belongs to no target
    assert S.view(node({S.ANN_SNAPSHOT: 'ab' * 32}), KEY)['snapshot_sha256'] is None


def test_view_names_the_machine():
    n = node()
    n['metadata']['uid'] = 'u-7'
    n['status']['nodeInfo'] = {'machineID': 'm' * 32, 'systemUUID': 's-7', 'kernelVersion': '6.8.0-134-generic'}
    v = S.view(n, KEY)
    assert (v['uid'], v['machine_id'], v['system_uuid'], v['kernel']) == ('u-7', 'm' * 32, 's-7', '6.8.0-134-generic')
    assert (S.view(node(), KEY)['uid'], S.view(node(), KEY)['machine_id']) == (None, None)


# -- issue 37 (2), T3-2: nothing is activated on a node that is no longer cordoned ---------------
def _owned(n, manager, time='2026-12-06T10:04:11Z', value=False):
    n['spec']['unschedulable'] = value
    n['metadata']['managedFields'] = [
        {'manager': 'kubelet', 'operation': 'Update', 'subresource': 'status', 'time': '2026-12-06T10:00:00Z',
         'fieldsType': 'FieldsV1', 'fieldsV1': {'f:status': {'f:conditions': {}}}},
        {'manager': manager, 'operation': 'Update', 'time': time, 'fieldsType': 'FieldsV1',
         'fieldsV1': {'f:spec': {'f:unschedulable': {}}}}]
    return n


def test_a_cordoned_node_passes_the_cordon_check():
    n = _owned(node({S.ANN_STATE: 'installed', S.ANN_TARGET: KEY}), 'gpufleet.upgrade', value=True)
    assert S.cordon_lost_message(n) is None and S.uncordoned_by(n) == []


def test_the_cordon_check_names_who_uncordoned_the_node_when_the_api_tells():
    n = _owned(node({S.ANN_STATE: 'installed', S.ANN_TARGET: KEY}), 'remediation-operator')
    assert S.uncordoned_by(n) == [{'manager': 'remediation-operator', 'operation': 'Update',
                                   'time': '2026-12-06T10:04:11Z'}]
    assert S.cordon_lost_message(n) == (
        'node gpu-07 is no longer cordoned (spec.unschedulable was set to false by remediation-operator (Update, '
        '2026-12-06T10:04:11Z)): the scheduler may have placed pods on it since the drain, and they would go down '
        'without eviction; nothing is activated on a schedulable node')


def test_the_cordon_check_says_when_the_api_does_not_tell():
    n = node({S.ANN_STATE: 'installed', S.ANN_TARGET: KEY})         # an uncordon drops the field and its owner
    assert S.uncordoned_by(n) == []
    assert S.cordon_lost_message(n).startswith(
        "node gpu-07 is no longer cordoned (the API keeps no record of who uncordoned it: the API server's audit "
        "log does): the scheduler may have placed pods on it since the drain")
