"""gpufleet.upgrade.rollback_decision through ansible-playbook (ansible-runner), with the record read
from a YAML file the way a role would."""
from __future__ import annotations

import datetime

import yaml

PREV = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.126.20'}
CUR = {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'driver': '580.130.00'}
RECORD = {'apiVersion': 'kube-dc.io/v1alpha1', 'kind': 'GPUUpgradeQualification', 'id': 'q-7', 'state': 'qualified',
          'approvedBy': 'platform-review', 'sourceRevision': 'a' * 40, 'hardware': ['10de:2330/10de:16c1'],
          'target': {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'driver': '580.130.00',
                     'gpuOperator': 'v26.3.4', 'dcgmExporter': '4.4.1-4.6.0-ubuntu22.04'},
          'canary': {'completedAt': (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
                                     ).strftime('%Y-%m-%dT%H:%M:%SZ'), 'allocationPassed': True, 'monitoringPassed': True,
                     'rollbackPassed': True, 'evidence': 'change-record-42'}}


def _play(record_path, extra):
    args = {'node': 'gpu-a-07', 'previous': PREV, 'current': CUR, 'qualification': str(record_path),
            'pci_ids': ['10de:2330/10de:16c1']}
    args.update(extra)
    return [{'name': 'rollback', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'decide', 'gpufleet.upgrade.rollback_decision': args, 'register': 'd', 'ignore_errors': True}]}]


def test_proven_rollback_restores_driver_and_kernel_but_never_rke2(run_playbook, tmp_path):
    rec = tmp_path / 'q.yaml'
    rec.write_text(yaml.safe_dump(RECORD))
    res = run_playbook(_play(rec, {'platform_recovery': 'runbook RB-7'})).result('decide')
    assert res['_event'] == 'runner_on_ok' and res['changed'] is False
    assert res['outcome'] == 'partial' and res['allowed'] is True
    assert [s['action'] for s in res['steps']] == ['keep_cordoned', 'restore_driver', 'restore_kernel', 'reboot',
                                                   'run_gates', 'uncordon_if_gates_pass']
    assert res['refusals'] == [{'component': 'rke2', 'pointer': 'runbook RB-7', 'reason':
                                'RKE2 is never downgraded (v1.36.1+rke2r1 → v1.35.3+rke2r3 refused): validate each '
                                'one-minor hop and, if the control plane cannot recover, follow the platform '
                                'recovery procedure'}]
    assert res['changed_components']['driver'] == {'from': '580.130.00', 'to': '580.126.20'}


def test_holder_and_unproven_record_refuse(run_playbook, tmp_path):
    rec = tmp_path / 'q.yaml'
    rec.write_text(yaml.safe_dump(dict(RECORD, canary=dict(RECORD['canary'], rollbackPassed=False))))
    res = run_playbook(_play(rec, {'holders': [{'kind': 'Pod', 'namespace': 'ml', 'name': 'train-0'}],
                                   'was_cordoned_before': True})).result('decide')
    assert res['_event'] == 'runner_on_ok'
    assert res['outcome'] == 'refused' and res['allowed'] is False
    assert [s['action'] for s in res['steps']] == ['keep_cordoned', 'escalate']
    driver = next(r for r in res['refusals'] if r['component'] == 'driver')
    assert 'canary.rollbackPassed = false, not true' in driver['reason']
    assert '1 GPU holder(s) still on node gpu-a-07 (Pod ml/train-0)' in driver['reason']


def test_bad_tuple_fails_naming_it(run_playbook, tmp_path):
    rec = tmp_path / 'q.yaml'
    rec.write_text(yaml.safe_dump(RECORD))
    res = run_playbook(_play(rec, {'current': dict(CUR, cuda='13.0')})).result('decide')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == 'current: unknown component(s) cuda; expected kernel, rke2, driver, gpu_operator, dcgm_exporter'


def test_a_draft_record_without_approver_proves_no_rollback(run_playbook, tmp_path):
    """Issue 12 (7): the record is read with the gate's strict loader and judged by the gate's rules."""
    rec = tmp_path / 'q.yaml'
    rec.write_text(yaml.safe_dump(dict(RECORD, state='draft', approvedBy='')))
    res = run_playbook(_play(rec, {})).result('decide')
    assert res['_event'] == 'runner_on_ok'
    assert res['outcome'] == 'refused' and res['allowed'] is False
    driver = next(r for r in res['refusals'] if r['component'] == 'driver')
    assert ('the upgrade gate refuses the qualification record "q-7": state must be "qualified", got "draft"; '
            'approvedBy is required') in driver['reason']


def test_what_from_yaml_would_accept_is_refused(run_playbook, tmp_path):
    rec = tmp_path / 'q.yaml'
    rec.write_text(yaml.safe_dump(RECORD).replace('rollbackPassed: true', 'rollbackPassed: yes'))
    res = run_playbook(_play(rec, {})).result('decide')
    assert res['outcome'] == 'refused'
    assert 'field "canary.rollbackPassed" must be a boolean (true or false), got the string "yes"' in \
        next(r for r in res['refusals'] if r['component'] == 'driver')['reason']
