from __future__ import annotations

import datetime

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils._rollback_policy import (
    DEFAULT_PLATFORM_RECOVERY, RollbackPolicyError)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._rollback_policy import decide_rollback as _decide

PREV = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.126.20',
        'gpu_operator': 'v26.3.3', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}
CUR = {'kernel': '6.8.0-135-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.130.00',
       'gpu_operator': 'v26.3.3', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}


NOW = datetime.datetime(2026, 7, 15, 12, 0, 0, tzinfo=datetime.timezone.utc)
PCI = ['10de:1db6/10de:124a']


def record_dict(rollback_passed=True, **target):
    t = {'kernel': '6.8.0-135-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.130.00',
         'gpuOperator': 'v26.3.3', 'dcgmExporter': '4.4.1-4.6.0-ubuntu22.04'}
    t.update(target)
    return {'apiVersion': 'kube-dc.io/v1alpha1', 'kind': 'GPUUpgradeQualification', 'id': 'q-1',
            'state': 'qualified', 'approvedBy': 'platform-review', 'sourceRevision': 'a' * 40,
            'hardware': list(PCI), 'target': t,
            'canary': {'completedAt': '2026-07-14T12:00:00Z', 'allocationPassed': True, 'monitoringPassed': True,
                       'rollbackPassed': rollback_passed, 'evidence': 'change-42'}}


def record(rollback_passed=True, **target):
    """The record's text, as the role reads it from its file (not validated: tests break it)."""
    return yaml.safe_dump(record_dict(rollback_passed, **target), sort_keys=False)


def decide_rollback(*args, **kwargs):
    kwargs.setdefault('now', NOW)
    kwargs.setdefault('pci_ids', list(PCI))
    return _decide(*args, **kwargs)


def actions(d):
    return [s.action for s in d.steps]


def test_proven_rollback_without_holders_restores_driver_and_kernel_in_order():
    d = decide_rollback('gpu-1', PREV, CUR, record(), holders=[])
    assert d.outcome == 'rollback' and d.allowed and d.refusals == []
    assert actions(d) == ['keep_cordoned', 'restore_driver', 'restore_kernel', 'reboot', 'run_gates',
                          'uncordon_if_gates_pass']
    drv = d.steps[1].as_dict()
    assert drv == {'action': 'restore_driver', 'component': 'driver', 'from': '580.130.00', 'to': '580.126.20',
                   'reason': 'reinstall and pin the driver packages of the snapshot'}
    assert d.changed == {'kernel': {'from': '6.8.0-135-generic', 'to': '6.8.0-134-generic'},
                         'driver': {'from': '580.130.00', 'to': '580.126.20'}}


def test_driver_only_reloads_instead_of_reboot():
    cur = dict(PREV, driver='580.130.00')
    d = decide_rollback('gpu-1', PREV, cur, record(kernel=PREV['kernel']))
    assert actions(d) == ['keep_cordoned', 'restore_driver', 'reload_driver', 'run_gates', 'uncordon_if_gates_pass']


def test_node_cordoned_before_rollout_is_never_uncordoned():
    d = decide_rollback('gpu-1', PREV, CUR, record(), was_cordoned_before=True)
    assert actions(d)[-1] == 'leave_cordoned' and 'uncordon_if_gates_pass' not in actions(d)


@pytest.mark.parametrize('rec,needle', [
    (None, 'no qualification record given: the rollback is not proven'),
    (record(rollback_passed=False), 'canary.rollbackPassed = false, not true'),
    (record(rollback_passed='true'), 'field "canary.rollbackPassed" must be a boolean (true or false), got the '
     'string "true"'),
    (record(driver='580.129.00'), "qualifies driver '580.129.00', but the node runs '580.130.00'"),
])
def test_unproven_rollback_refuses_driver_and_kernel(rec, needle):
    d = decide_rollback('gpu-1', PREV, CUR, rec)
    assert d.outcome == 'refused' and not d.allowed
    assert actions(d) == ['keep_cordoned', 'escalate']
    assert [r.component for r in d.refusals] == ['driver', 'kernel']
    assert all(needle in r.reason for r in d.refusals), [r.reason for r in d.refusals]


def test_holders_block_driver_and_kernel():
    holders = [{'kind': 'Pod', 'namespace': 'ml', 'name': 'train-0'},
               {'kind': 'VirtualMachineInstance', 'namespace': 'vms', 'name': 'vm-1'}]
    d = decide_rollback('gpu-1', PREV, CUR, record(), holders=holders)
    assert d.outcome == 'refused'
    assert d.refusals[0].reason == ('driver rollback 580.130.00 → 580.126.20 refused: 2 GPU holder(s) still on node '
                                    'gpu-1 (Pod ml/train-0, VirtualMachineInstance vms/vm-1): stop them first; '
                                    'nothing changes under a holder')


def test_rke2_never_downgraded_points_to_platform_recovery():
    cur = dict(CUR, rke2='v1.36.1+rke2r1')
    d = decide_rollback('gpu-1', PREV, cur, record(rke2='v1.36.1+rke2r1'))
    assert d.outcome == 'partial' and d.allowed
    rke2 = [r for r in d.refusals if r.component == 'rke2']
    assert len(rke2) == 1 and rke2[0].pointer == DEFAULT_PLATFORM_RECOVERY
    assert rke2[0].reason.startswith('RKE2 is never downgraded (v1.36.1+rke2r1 → v1.35.3+rke2r3 refused)')
    assert not any(s.component == 'rke2' for s in d.steps)


def test_rke2_only_is_refused_with_custom_pointer():
    cur = dict(PREV, rke2='v1.36.1+rke2r1')
    d = decide_rollback('gpu-1', PREV, cur, record(), platform_recovery='runbook RB-7')
    assert d.outcome == 'refused' and d.refusals[0].as_dict()['pointer'] == 'runbook RB-7'


def test_cluster_operands_not_rolled_back_per_node():
    cur = dict(PREV, gpu_operator='v26.3.4')
    d = decide_rollback('gpu-1', PREV, cur, record())
    assert d.outcome == 'refused' and d.refusals[0].component == 'gpu_operator'
    assert 'cluster-wide operand' in d.refusals[0].reason


def test_nothing_changed():
    d = decide_rollback('gpu-1', PREV, dict(PREV), record())
    assert d.outcome == 'nothing_to_roll_back' and actions(d) == ['keep_cordoned'] and not d.allowed


def test_one_sided_versions_are_refused():
    prev = dict(PREV, driver=None)
    d = decide_rollback('gpu-1', prev, dict(PREV), record())
    assert d.refusals[0].component == 'driver' and 'known only on one side' in d.refusals[0].reason


@pytest.mark.parametrize('kw,msg', [
    (dict(node=''), "node: '' is not a node name"),
    (dict(previous=[]), 'previous: [] is not a mapping'),
    (dict(current=dict(CUR, cuda='13.0')), 'current: unknown component(s) cuda'),
    (dict(current=dict(CUR, driver=580)), 'current.driver: 580 is not a version string'),
    (dict(holders='none'), "holders: 'none' is not a list"),
])
def test_bad_input(kw, msg):
    args = dict(node='gpu-1', previous=PREV, current=CUR, qualification=record())
    args.update(kw)
    with pytest.raises(RollbackPolicyError) as exc:
        decide_rollback(**args)
    assert str(exc.value).startswith(msg)


def test_as_dict_shape():
    d = decide_rollback('gpu-1', PREV, CUR, record()).as_dict()
    assert set(d) == {'node', 'outcome', 'allowed', 'steps', 'refusals', 'changed'}
    assert d['steps'][0] == {'action': 'keep_cordoned', 'component': None, 'from': None, 'to': None,
                             'reason': 'the node stays cordoned until every gate passes'}


# -- issue 12 (7): the rollback refuses any record the upgrade gate refuses ----------------------
@pytest.mark.parametrize('edit,needle', [
    (lambda d: d.update(state='draft'), 'state must be "qualified", got "draft"'),
    (lambda d: d.update(approvedBy=''), 'approvedBy is required'),
    (lambda d: d.update(sourceRevision='main'), 'sourceRevision must be 40 hexadecimal characters'),
    (lambda d: d['canary'].update(monitoringPassed=False), 'canary checks must all pass'),
    (lambda d: d['canary'].update(evidence=' '), 'canary evidence is required'),
    (lambda d: d.update(hardware=['10de:2330/10de:16c1']), 'hardware tuple mismatch'),
    (lambda d: d['canary'].update(completedAt='2026-05-01T00:00:00Z'), 'canary evidence is older than 720h'),
    (lambda d: d['canary'].update(completedAt='2027-01-01T00:00:00Z'), 'canary completion time is in the future'),
])
def test_a_record_the_gate_refuses_proves_no_rollback(edit, needle):
    data = record_dict()
    edit(data)
    d = decide_rollback('gpu-1', PREV, CUR, yaml.safe_dump(data))
    assert d.outcome == 'refused' and not d.allowed
    assert [r.component for r in d.refusals] == ['driver', 'kernel']
    assert all(needle in r.reason and 'the upgrade gate refuses the qualification record "q-1"' in r.reason
               for r in d.refusals), [r.reason for r in d.refusals]


@pytest.mark.parametrize('text,needle', [
    (record().replace('rollbackPassed: true', 'rollbackPassed: yes'),
     'field "canary.rollbackPassed" must be a boolean (true or false), got the string "yes"'),
    (record() + 'state: qualified\n', 'duplicate field "state"'),
])
def test_what_a_lax_yaml_reader_would_accept_is_refused(text, needle):
    d = decide_rollback('gpu-1', PREV, CUR, text)
    assert d.outcome == 'refused'
    assert all('the qualification record does not load (the upgrade gate refuses it)' in r.reason and needle in r.reason
               for r in d.refusals), [r.reason for r in d.refusals]


def test_a_mapping_is_not_accepted_and_pci_ids_are_needed():
    d = decide_rollback('gpu-1', PREV, CUR, record_dict())
    assert d.outcome == 'refused' and 'qualification: a dict is not accepted' in d.refusals[0].reason
    d = decide_rollback('gpu-1', PREV, CUR, record(), pci_ids=None)
    assert d.outcome == 'refused' and "the node's PCI ids were not given" in d.refusals[0].reason
