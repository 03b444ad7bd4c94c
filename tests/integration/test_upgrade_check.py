"""The gate through real ansible-playbook runs (ansible-runner): playbooks/upgrade_check.yml,
qualification_info, the filters, and the interim lab."""
from __future__ import annotations

import datetime
import json
import pathlib
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q
from tools.records import CURRENT, PCI_IDS, TARGET, seed_dict, with_canary

REPO = pathlib.Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / 'playbooks' / 'upgrade_check.yml'
GATE = 'Run the GPU upgrade gate'
REPORT = 'Report the PASS'
REMINDER = 'A PASS permits only the reviewed serialized canary/upgrade plan.'


@pytest.fixture
def fresh_record(tmp_path):
    """The seed record with the canary completed one hour ago."""
    completed = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) - datetime.timedelta(hours=1)
    path = tmp_path / 'gpu-upgrade-qualification.yaml'
    path.write_text(q.dump_record(with_canary(seed_dict(), completedAt=completed)))
    return path, q.format_timestamp(completed)


def gate_vars(record, **overrides):
    extravars = {'gpufleet_qualification_file': str(record), 'gpufleet_pci_ids': list(PCI_IDS),
                 'gpufleet_current': dict(CURRENT), 'gpufleet_target': dict(TARGET)}
    extravars.update(overrides)
    return extravars


def test_playbook_pass_reports_the_qualification(run_playbook, fresh_record):
    record, completed = fresh_record
    run = run_playbook(PLAYBOOK, extravars=gate_vars(record))
    assert (run.rc, run.status) == (0, 'successful')
    gate = run.result(GATE)
    assert gate['_event'] == 'runner_on_ok'
    assert gate['passed'] is True and gate['changed'] is False and gate['problems'] == []
    assert gate['qualification'] == {'id': 'v100-kernel-canary-1', 'approved_by': 'platform-review',
                                     'source_revision': 'a' * 40, 'completed_at': completed}
    assert gate['msg'].startswith('GPU upgrade gate: PASS') and gate['msg'].endswith(REMINDER)
    assert run.result(REPORT)['msg'] == [
        gate['msg'],
        'qualification id:    v100-kernel-canary-1',
        'approved by:         platform-review',
        'source revision:     ' + 'a' * 40,
        'canary completed at: ' + completed,
    ]
    assert 'qualification id:    v100-kernel-canary-1' in run.stdout


def test_playbook_block_fails_the_play_with_every_problem(run_playbook, fresh_record):
    record, _completed = fresh_record
    run = run_playbook(PLAYBOOK, extravars=gate_vars(
        record, gpufleet_pci_ids='10de:1db6/10de:124a,10DE:2330/10DE:16C1',
        gpufleet_target=dict(TARGET, rke2='v1.37.0+rke2r1'), gpufleet_max_canary_age='30m'))
    assert run.rc != 0 and run.status == 'failed'
    gate = run.result(GATE)
    problems = [
        'hardware tuple mismatch',
        'rke2 target "v1.37.0+rke2r1" is not the qualified value "v1.36.1+rke2r1"',
        'RKE2 upgrade cannot skip a Kubernetes minor',
        'canary evidence is older than 30m',
    ]
    assert gate['_event'] == 'runner_on_failed'
    assert gate['passed'] is False and gate['changed'] is False
    assert gate['problems'] == problems
    assert gate['msg'] == 'GPU upgrade blocked: ' + '; '.join(problems)
    assert 'qualification' not in gate
    assert not run.task_results(REPORT)
    assert 'GPU upgrade blocked: hardware tuple mismatch' in run.stdout


def test_playbook_check_mode_gives_the_same_verdict(run_playbook, fresh_record):
    record, _completed = fresh_record
    run = run_playbook(PLAYBOOK, extravars=gate_vars(record), cmdline='--check')
    assert run.status == 'successful'
    assert run.result(GATE)['passed'] is True and run.result(GATE)['changed'] is False
    run = run_playbook(PLAYBOOK, extravars=gate_vars(record, gpufleet_current=dict(TARGET)), cmdline='--check')
    assert run.status == 'failed'
    assert run.result(GATE)['problems'] == ['at least one component must change']


def test_playbook_refuses_missing_inputs_and_unknown_keys(run_playbook, fresh_record, tmp_path):
    record, _completed = fresh_record
    run = run_playbook(PLAYBOOK, extravars={'gpufleet_qualification_file': str(record)})
    assert run.status == 'failed'
    assert 'Set every gate input as an extra var' in run.result('Check that every gate input is given')['msg']
    assert not run.task_results(GATE)

    run = run_playbook(PLAYBOOK, extravars=gate_vars(record, gpufleet_current=dict(CURRENT, cuda='13.0')))
    assert run.status == 'failed'
    assert 'current.cuda' in run.result(GATE)['msg']

    run = run_playbook(PLAYBOOK, extravars=gate_vars(tmp_path / 'missing.yaml'))
    assert run.status == 'failed'
    assert run.result(GATE)['problems'] == [
        'cannot read the qualification record "%s": No such file or directory' % (tmp_path / 'missing.yaml')]


def test_long_max_age_warns(run_playbook, fresh_record):
    record, _completed = fresh_record
    run = run_playbook(PLAYBOOK, extravars=gate_vars(record, gpufleet_max_canary_age='60d'))
    assert run.status == 'successful'
    assert any('max_canary_age 60d is longer than the default 720h' in w for w in run.result(GATE).get('warnings', []))


def test_qualification_info_and_filters(run_playbook, fresh_record, tmp_path):
    record, completed = fresh_record
    bad = tmp_path / 'bad.yaml'
    bad.write_text(q.dump_record(with_canary(seed_dict(approvedBy='', hardware=['10de:1db6/10de:124a', 'x']),
                                             rollbackPassed=False)))
    play = [{
        'name': 'qualification_info and filters', 'hosts': 'localhost', 'gather_facts': False,
        'tasks': [
            {'name': 'valid', 'gpufleet.upgrade.qualification_info': {'qualification': str(record)}},
            {'name': 'invalid, reported', 'gpufleet.upgrade.qualification_info': {'path': str(bad), 'fail_on_invalid': False}},
            {'name': 'invalid, failing', 'gpufleet.upgrade.qualification_info': {'path': str(bad)}, 'ignore_errors': True},
            {'name': 'filters', 'ansible.builtin.debug': {'msg': {
                'rke2': "{{ 'v1.36.1+rke2r1' | gpufleet.upgrade.rke2_version }}",
                'rke2_no_v': "{{ '1.35.3+rke2r3' | gpufleet.upgrade.rke2_version }}",
                'pci': "{{ [' 10DE:1DB6/10DE:124A', '10de:2330/10de:16c1'] | map('gpufleet.upgrade.pci_id') | list }}"}}},
            {'name': 'rke2 filter error', 'ansible.builtin.debug': {'msg': "{{ 'v1.36.1-rc1+rke2r1' | gpufleet.upgrade.rke2_version }}"},
             'ignore_errors': True},
            {'name': 'pci filter error', 'ansible.builtin.debug': {'msg': "{{ '10de:1db6' | gpufleet.upgrade.pci_id }}"},
             'ignore_errors': True},
        ],
    }]
    run = run_playbook(play)
    valid = run.result('valid')
    assert valid['valid'] is True and valid['problems'] == [] and valid['changed'] is False
    assert valid['record']['id'] == 'v100-kernel-canary-1'
    assert valid['record']['canary']['completedAt'] == completed
    assert valid['msg'] == 'GPU upgrade qualification record "v100-kernel-canary-1" is valid'
    problems = ['approvedBy is required',
                'record PCI id "x" is malformed: expected vendor:device/subvendor:subdevice in hex, e.g. 10de:1db6/10de:124a',
                'canary checks must all pass']
    reported = run.result('invalid, reported')
    assert reported['_event'] == 'runner_on_ok'
    assert reported['valid'] is False and reported['problems'] == problems
    failing = run.result('invalid, failing')
    assert failing['_event'] == 'runner_on_failed'
    assert failing['msg'] == 'GPU upgrade qualification record is invalid: ' + '; '.join(problems)
    assert run.result('filters')['msg'] == {
        'rke2': {'minor': 36, 'patch': 1, 'rev': 1, 'kubernetes': 'v1.36.1'},
        'rke2_no_v': {'minor': 35, 'patch': 3, 'rev': 3, 'kubernetes': 'v1.35.3'},
        'pci': ['10de:1db6/10de:124a', '10de:2330/10de:16c1'],
    }
    assert ('gpufleet.upgrade.rke2_version: "v1.36.1-rc1+rke2r1" is not a valid RKE2 version: '
            'pre-release versions are not allowed') in run.result('rke2 filter error')['msg']
    assert 'gpufleet.upgrade.pci_id: PCI id "10de:1db6" is malformed' in run.result('pci filter error')['msg']


def test_make_lab_script_passes_and_blocks(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / 'tests' / 'tools' / 'gate_demo.py'), '--dir', str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, check=False, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert '== pass tuple: PASS (as expected)' in out.stdout
    assert '== block tuple: BLOCKED (as expected)' in out.stdout
    assert 'lab: OK: the qualified tuple passed and the other one was blocked' in out.stdout
    record, problems = q.validate_record((tmp_path / 'gpu-upgrade-qualification.yaml').read_bytes())
    assert problems == [] and record.id == 'v100-kernel-canary-1'
    assert json.loads((tmp_path / 'block-vars.json').read_text())['gpufleet_target']['driver'] == '580.130.01'


def test_an_integer_over_the_digit_limit_is_a_verdict_not_a_traceback(run_playbook, fresh_record):
    """Issue 12 (8): PyYAML's int constructor raises ValueError under CPython's digit limit."""
    record, _completed = fresh_record
    record.write_text(record.read_text().replace('id: v100-kernel-canary-1', 'id: ' + '7' * 5000))
    problem = 'field "id" must be a string, got a number of more than 300 digits (quote it)'
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'gate', 'ignore_errors': True, 'gpufleet.upgrade.upgrade_check': {
            'qualification': str(record), 'pci_ids': list(PCI_IDS), 'current': dict(CURRENT),
            'target': dict(TARGET)}},
        {'name': 'info', 'ignore_errors': True, 'gpufleet.upgrade.qualification_info': {
            'qualification': str(record)}}]}])
    gate = run.result('gate')
    assert gate['_event'] == 'runner_on_failed' and gate['passed'] is False
    assert gate['problems'] == [problem] and gate['msg'] == 'GPU upgrade blocked: ' + problem
    assert 'Traceback' not in run.stdout and 'ValueError' not in run.stdout
    info = run.result('info')
    assert info['valid'] is False and info['problems'] == [problem]
