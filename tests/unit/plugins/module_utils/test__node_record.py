"""The phase model: the steps, which failures are rolled back, the evidence phases, finished."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _node_record

ROLLED_BACK = ('install', 'activate', 'operands', 'verify', 'gates', 'kernel_default')
NOT_ROLLED_BACK = ('preflight', 'progress', 'packages', 'kernel_check', 'drain', 'snapshot', 'rke2', 'ready', 'vms', 'postflight',
                   'uncordon')


def test_every_step_is_classified_once():
    assert sorted(ROLLED_BACK + NOT_ROLLED_BACK) == sorted(_node_record.STEP_NAMES)
    assert len(set(_node_record.STEP_NAMES)) == len(_node_record.STEP_NAMES)


def test_keys_are_gpufleet_keys():
    keys = [v for k, v in vars(_node_record).items() if k.startswith('ANN_')] + [_node_record.CANARY_KEY]
    assert len(keys) == len(set(keys)) == 9
    assert all(k.startswith(_node_record.PREFIX) for k in keys)


def test_phase_vocabulary():
    assert _node_record.SETTABLE == _node_record.PHASES + _node_record.TERMINAL + ('done',)
    assert _node_record.ALIASES == {'draining': 'cordoned'}
    # every phase a step records is settable, and each is recorded by one step only
    recorded = [s.records for s in _node_record.STEPS if s.records]
    assert len(recorded) == len(set(recorded))
    assert set(recorded) <= set(_node_record.SETTABLE)


@pytest.mark.parametrize('name', ROLLED_BACK)
def test_a_failure_after_the_packages_changed_is_rolled_back(name):
    assert _node_record.step(name).rolls_back is True
    assert _node_record.failure(name) == {'phase': name, 'rollback': True, 'hint': '', 'cordon': True}
    assert _node_record.failure(name, rollback_on_failure=True)['rollback'] is True


@pytest.mark.parametrize('name', NOT_ROLLED_BACK)
def test_other_failures_are_not_rolled_back(name):
    assert _node_record.step(name).rolls_back is False
    assert _node_record.failure(name)['rollback'] is False
    assert _node_record.failure(name)['phase'] == name


@pytest.mark.parametrize('name', _node_record.STEP_NAMES)
def test_rollback_on_failure_false_never_rolls_back(name):
    assert _node_record.failure(name, rollback_on_failure=False)['rollback'] is False
    assert _node_record.failure(name, False)['rollback'] is False


def test_failure_hints():
    assert _node_record.failure('rke2')['hint'] == 'RKE2 cannot be rolled back: follow the platform recovery procedure'
    assert _node_record.failure('ready')['hint'].startswith('it did not come back Ready within node_upgrade_reboot_timeout')
    assert 'gpufleet.upgrade.rollback' in _node_record.failure('ready')['hint']
    assert _node_record.failure('drain')['hint'] == ''
    assert _node_record.failure('packages')['hint'].startswith('nothing was changed on the node: make the repositories')


# -- T3-19: a failure before the drain leaves a node no run of this target touched as it was ------
BEFORE_DRAIN = ('preflight', 'progress', 'packages', 'kernel_check')
UNTOUCHED = {'recorded': None, 'stale_target': None, 'phase': None, 'done_phases': [], 'unschedulable': False}


@pytest.mark.parametrize('name', BEFORE_DRAIN)
def test_a_failure_before_the_drain_on_an_untouched_node_is_not_cordoned(name):
    assert _node_record.failure(name, True, UNTOUCHED)['cordon'] is False
    # a record of another target (stale) is not this target's progress
    assert _node_record.failure(name, True, dict(UNTOUCHED, recorded='installed', stale_target='driver=1'))[
        'cordon'] is False


@pytest.mark.parametrize('name', [n for n in _node_record.STEP_NAMES if n not in BEFORE_DRAIN])
def test_a_failure_from_the_drain_on_is_cordoned(name):
    assert _node_record.failure(name, True, UNTOUCHED)['cordon'] is True
    assert _node_record.failure(name, False, UNTOUCHED)['cordon'] is True


@pytest.mark.parametrize('recorded', ['cordoned', 'draining', 'drain-failed', 'drained', 'snapshotted', 'installed',
                                      'failed', 'rolled-back'])
@pytest.mark.parametrize('name', BEFORE_DRAIN)
def test_a_failure_before_the_drain_on_a_node_mid_upgrade_is_cordoned(name, recorded):
    """An earlier run of this target changed the node (a cordon lost since included): it stays the rollout's."""
    assert _node_record.failure(name, True, dict(UNTOUCHED, recorded=recorded))['cordon'] is True


@pytest.mark.parametrize('name', BEFORE_DRAIN)
def test_progress_not_given_cordons_as_before(name):
    assert _node_record.failure(name)['cordon'] is True


@pytest.mark.parametrize('progress, message', [
    ('installed', "progress: expected the state upgrade_state returns (a mapping), got 'installed'"),
    ([], 'progress: expected the state upgrade_state returns (a mapping), got []'),
    ({'recorded': 3}, 'progress.recorded: expected a phase name or none, got 3'),
])
def test_a_malformed_progress_is_refused_naming_the_value(progress, message):
    with pytest.raises(_node_record.RecordError) as err:
        _node_record.failure('kernel_check', True, progress)
    assert str(err.value) == message


def test_step_records():
    assert dict((s.name, s.records) for s in _node_record.STEPS) == {
        'preflight': None, 'progress': None, 'packages': None, 'drain': 'drained', 'snapshot': 'snapshotted', 'rke2': None,
        'install': 'installed', 'activate': None, 'ready': 'activated', 'gates': 'validated', 'vms': None,
        'postflight': None, 'uncordon': 'done', 'kernel_check': None, 'verify': None, 'kernel_default': None, 'operands': None}


@pytest.mark.parametrize('name', ['holders', 'Install', '', None, 'gates '])
def test_unknown_step_is_rejected_naming_the_value(name):
    message = '%r is not one of %s' % (name, ', '.join(_node_record.STEP_NAMES))
    with pytest.raises(_node_record.RecordError) as err:
        _node_record.step(name)
    assert str(err.value) == 'step: ' + message
    with pytest.raises(_node_record.RecordError) as err:
        _node_record.failure(name)
    assert str(err.value) == 'step: ' + message


def test_record_error_is_a_value_error():
    assert issubclass(_node_record.RecordError, ValueError)


def test_steps_through():
    assert _node_record.steps_through(None, ['gates', 'drain', 'install']) == ['drain', 'install', 'gates']
    assert _node_record.steps_through('install', ['gates', 'drain', 'install']) == ['drain']
    assert _node_record.steps_through('drain', ['drain', 'install']) == []
    # a failed step outside the applicable ones: nothing is claimed
    assert _node_record.steps_through('rke2', ['drain', 'install']) == []
    assert _node_record.steps_through(None, []) == []
    with pytest.raises(_node_record.RecordError, match="step: 'holders' is not one of"):
        _node_record.steps_through(None, ['drain', 'holders'])
    with pytest.raises(_node_record.RecordError, match="step: 'holders' is not one of"):
        _node_record.steps_through('holders', ['drain', 'install'])


UPGRADED = ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates', 'uncordon']


def test_evidence_phases_upgraded():
    assert _node_record.evidence_phases(None, rke2_applied=False, dra=False) == UPGRADED
    assert _node_record.evidence_phases(None, rke2_applied=True, dra=False) == [
        'drain', 'snapshot', 'rke2', 'install', 'activate', 'ready', 'verify', 'gates', 'uncordon']
    assert _node_record.evidence_phases(None, rke2_applied=False, dra=True) == [
        'drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates', 'postflight', 'uncordon']
    assert _node_record.evidence_phases(None, rke2_applied=True, dra=True) == [
        'drain', 'snapshot', 'rke2', 'install', 'activate', 'ready', 'verify', 'gates', 'postflight', 'uncordon']


def test_evidence_phases_with_a_kernel_change():
    assert _node_record.evidence_phases(None, rke2_applied=True, dra=False, kernel=True) == [
        'kernel_check', 'drain', 'snapshot', 'rke2', 'install', 'activate', 'ready', 'verify', 'gates',
        'kernel_default', 'uncordon']
    # the trial boot came up on another kernel: detected at verify
    assert _node_record.evidence_phases('verify', rke2_applied=False, dra=False, kernel=True) == [
        'kernel_check', 'drain', 'snapshot', 'install', 'activate', 'ready']
    # the kernel preflight refused before anything moved
    assert _node_record.evidence_phases('kernel_check', rke2_applied=False, dra=False, kernel=True) == []
    # a failed kernel step is listed up to it even if not marked as a kernel change
    assert _node_record.evidence_phases('kernel_default', rke2_applied=False, dra=False) == [
        'drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates']


def test_evidence_phases_with_the_gpu_operators_operands():
    assert _node_record.evidence_phases(None, rke2_applied=False, dra=False, operands=True) == [
        'drain', 'snapshot', 'install', 'activate', 'ready', 'operands', 'verify', 'gates', 'uncordon']
    # the node's new operands did not come up: listed up to the step before
    assert _node_record.evidence_phases('operands', rke2_applied=False, dra=False, operands=True) == [
        'drain', 'snapshot', 'install', 'activate', 'ready']
    # a failed operands step is listed up to it even where the result did not say the operator runs them
    assert _node_record.evidence_phases('operands', rke2_applied=False, dra=False) == [
        'drain', 'snapshot', 'install', 'activate', 'ready']


def test_an_operands_failure_rolls_the_node_back():
    assert _node_record.failure('operands') == {'phase': 'operands', 'rollback': True, 'hint': '', 'cordon': True}
    assert _node_record.failure('operands', rollback_on_failure=False)['rollback'] is False


def test_kernel_failures_roll_back_but_its_preflight_does_not():
    assert _node_record.failure('verify')['rollback'] is True
    assert _node_record.failure('kernel_default')['rollback'] is True
    refused = _node_record.failure('kernel_check')
    assert refused['rollback'] is False and 'nothing was changed' in refused['hint']


@pytest.mark.parametrize('failed,rke2,dra,phases', [
    ('preflight', False, False, []),
    ('progress', True, True, []),
    ('drain', False, False, []),
    ('snapshot', False, False, ['drain']),
    ('rke2', True, False, ['drain', 'snapshot']),
    # the RKE2 step failed before its Plan was applied: the node still went through drain and snapshot
    ('rke2', False, False, ['drain', 'snapshot']),
    ('install', True, False, ['drain', 'snapshot', 'rke2']),
    ('install', False, False, ['drain', 'snapshot']),
    ('activate', False, False, ['drain', 'snapshot', 'install']),
    ('ready', False, False, ['drain', 'snapshot', 'install', 'activate']),
    ('gates', False, True, ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify']),
    # vms is bookkeeping and not listed, but a node that failed there went through the gates
    ('vms', False, False, ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates']),
    ('vms', False, True, ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates']),
    # a failed postflight on a node not marked DRA still lists what it went through
    ('postflight', False, False, ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates']),
    ('postflight', False, True, ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates']),
    ('uncordon', False, False, ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates']),
    ('uncordon', True, True, ['drain', 'snapshot', 'rke2', 'install', 'activate', 'ready', 'verify', 'gates', 'postflight']),
])
def test_evidence_phases_failed(failed, rke2, dra, phases):
    assert _node_record.evidence_phases(failed, rke2_applied=rke2, dra=dra) == phases


def test_evidence_phases_never_list_bookkeeping_steps():
    for failed in (None,) + _node_record.STEP_NAMES:
        phases = _node_record.evidence_phases(failed, True, True)
        assert not set(phases) & set(_node_record.EVIDENCE_EXCLUDED)


def test_evidence_phases_unknown_failed_step():
    with pytest.raises(_node_record.RecordError, match="step: 'holders' is not one of"):
        _node_record.evidence_phases('holders', False, False)


KEY = 'driver=580.126.20,kernel=6.8.0-134-generic'


@pytest.mark.parametrize('annotations,expected', [
    ({_node_record.ANN_DONE: KEY}, True),
    ({_node_record.ANN_DONE: KEY, 'other': 'x'}, True),
    # a node recording a phase is in a rollout, even a later one
    ({_node_record.ANN_DONE: KEY, _node_record.ANN_STATE: 'cordoned'}, False),
    ({_node_record.ANN_DONE: KEY, _node_record.ANN_STATE: 'failed'}, False),
    ({_node_record.ANN_DONE: 'driver=570.172.08,kernel=6.8.0-134-generic'}, False),
    ({_node_record.ANN_STATE: 'validated'}, False),
    ({}, False),
    (None, False),
])
def test_finished(annotations, expected):
    assert _node_record.finished(annotations, KEY) is expected


@pytest.mark.parametrize('name', ('activate', 'operands'))
def test_a_lost_cordon_is_never_rolled_back(name):
    """Issue 37 (2), T3-2: found uncordoned before the activation (or the operand move), the node is not rolled
    back: the rollback's reboot or reload would take down the pods placed on it meanwhile, without eviction."""
    assert _node_record.failure(name)['rollback'] is True
    lost = _node_record.failure(name, True, cordon_lost=True)
    # cordoned again by the rescue (the step is past the drain: this run cordoned the node)
    assert lost == {'phase': name, 'rollback': False, 'hint': _node_record.CORDON_LOST_HINT, 'cordon': True}
    assert 'drain it, then run gpufleet.upgrade.rollback' in lost['hint']
    assert _node_record.failure(name, True, cordon_lost=False)['rollback'] is True
    with pytest.raises(_node_record.RecordError, match=r"cordon_lost: 'yes' is not a boolean"):
        _node_record.failure(name, True, cordon_lost='yes')
