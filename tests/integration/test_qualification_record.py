"""qualification_record through ansible-runner, with the revision read from a real git repository."""
from __future__ import annotations

import json
import pathlib
import subprocess
from typing import Any

import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence as ev

AFTER = {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'driver': '580.130.00',
         'gpu_operator': 'v26.3.4', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}


def git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run(['git', '-c', 'user.name=t', '-c', 'user.email=t@example.invalid', '-C', str(repo), *args],
                          check=True, capture_output=True, text=True).stdout.strip()


# The canary's entry as the canary role records it after the final upgrade (canary_measured_nodes).
MEASURED = {'name': 'gpu-1', 'tuple_after': AFTER, 'measured': True, 'verdict': 'upgraded'}


def write_bundle(path: pathlib.Path, rollback_passed: bool) -> None:
    b, _changed = ev.merge(ev.new_bundle('a100-canary-7'), {
        'tuple_after': AFTER,
        'nodes': [{'name': 'gpu-1', 'role': 'canary', 'pci_ids': ['10de:20b0/10de:1450']}, MEASURED],
        'gates': [{'name': n, 'kind': k, 'node': 'gpu-1', 'passed': ok, 'finished': '2026-07-14T12:%02d:00Z' % m}
                  for n, k, ok, m in (('node', 'node', True, 1), ('workload', 'workload', True, 1),
                                      ('metrics', 'metric', True, 2), ('rollback', 'rollback', rollback_passed, 3))]})
    path.write_text(ev.dumps(b))


def test_record_from_committed_evidence(tmp_path: pathlib.Path, run_playbook: Any) -> None:
    repo = tmp_path / 'evidence-repo'
    repo.mkdir()
    git(repo, 'init', '-q')
    bundle = repo / 'canary.json'
    write_bundle(bundle, rollback_passed=True)
    git(repo, 'add', 'canary.json')
    git(repo, 'commit', '-qm', 'canary evidence')
    head = git(repo, 'rev-parse', 'HEAD')
    dest = tmp_path / 'record.yaml'
    task = {'gpufleet.upgrade.qualification_record': {'evidence': str(bundle), 'dest': str(dest),
                                                      'evidence_ref': 'change-record-42'}}
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        dict(task, name='check', check_mode=True), dict(task, name='write'), dict(task, name='again')]}])
    assert run.rc == 0, run.stdout
    assert run.result('check')['changed'] is True
    res = run.result('write')
    assert res['changed'] is True and res['qualified'] is True and res['reasons'] == []
    assert run.result('again')['changed'] is False
    record = yaml.safe_load(dest.read_text())
    assert record['sourceRevision'] == head
    assert record['state'] == 'qualified' and record['approvedBy'] == ''
    assert record['hardware'] == ['10de:20b0/10de:1450']
    assert record['target']['gpuOperator'] == 'v26.3.4'
    assert record['canary'] == {'completedAt': '2026-07-14T12:03:00Z', 'allocationPassed': True,
                                'monitoringPassed': True, 'rollbackPassed': True, 'evidence': 'change-record-42'}

    # A bundle changed after the commit is refused; a failed rollback gives state failed.
    write_bundle(bundle, rollback_passed=False)
    dirty = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        dict(task, name='dirty', ignore_errors=True)]}])
    assert dirty.result('dirty')['msg'] == (
        'qualification_record: %s has uncommitted changes: commit the evidence first, so that sourceRevision '
        'names a commit containing exactly this bundle' % bundle)
    git(repo, 'commit', '-qam', 'rollback failed')
    failed = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [dict(task, name='failed')]}])
    res = failed.result('failed')
    assert res['qualified'] is False and res['reasons'] == ['rollback gate(s) failed: rollback@gpu-1#-']
    assert yaml.safe_load(dest.read_text())['state'] == 'failed'
    assert yaml.safe_load(dest.read_text())['sourceRevision'] == git(repo, 'rev-parse', 'HEAD') != head


def test_uncommitted_evidence_is_refused(tmp_path: pathlib.Path, run_playbook: Any) -> None:
    bundle = tmp_path / 'canary.json'
    write_bundle(bundle, rollback_passed=True)
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'no repo',
         'gpufleet.upgrade.qualification_record': {'evidence': str(bundle), 'dest': str(tmp_path / 'r.yaml')},
         'ignore_errors': True},
        {'name': 'explicit revision', 'gpufleet.upgrade.qualification_record': {
            'evidence': str(bundle), 'dest': str(tmp_path / 'r.yaml'), 'source_revision': 'f' * 40}}]}])
    assert run.result('no repo')['msg'].startswith('qualification_record: %s is not in a git repository' % bundle)
    assert not (tmp_path / 'r.yaml').exists() or run.result('explicit revision')['changed']
    assert json.loads(json.dumps(run.result('explicit revision')['record']))['sourceRevision'] == 'f' * 40


def test_record_round_trips_through_the_upgrade_check_module(tmp_path: pathlib.Path, run_playbook: Any) -> None:
    """qualification_record writes; upgrade_check blocks before the second operator approves, passes after."""
    import datetime
    bundle = tmp_path / 'canary.json'
    b, _changed = ev.merge(ev.new_bundle('a100-canary-7'), {
        'tuple_after': AFTER,
        'nodes': [{'name': 'gpu-1', 'role': 'canary', 'pci_ids': ['10de:20b0/10de:1450']}, MEASURED],
        'gates': [{'name': n, 'kind': k, 'node': 'gpu-1', 'passed': True,
                   'finished': ev.rfc3339(datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1))}
                  for n, k in (('node', 'node'), ('workload', 'workload'), ('metrics', 'metric'),
                               ('rollback', 'rollback'))]})
    bundle.write_text(ev.dumps(b))
    dest = tmp_path / 'record.yaml'
    current = dict(AFTER, kernel='6.8.0-134-generic', rke2='v1.35.3+rke2r3', driver='580.126.20',
                   gpu_operator='v26.3.3')
    check = {'qualification': str(dest), 'pci_ids': ['10de:20b0/10de:1450'], 'current': current, 'target': AFTER}
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'record', 'gpufleet.upgrade.qualification_record': {
            'evidence': str(bundle), 'dest': str(dest), 'source_revision': 'c' * 40, 'evidence_ref': 'cr-42'}},
        {'name': 'before approval', 'gpufleet.upgrade.upgrade_check': check, 'ignore_errors': True}]}])
    before = run.result('before approval')
    assert before['_event'] == 'runner_on_failed'
    assert before['passed'] is False and before['problems'] == ['approvedBy is required']
    dest.write_text(dest.read_text().replace('approvedBy: ""', 'approvedBy: "second-operator"'))
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'after approval', 'gpufleet.upgrade.upgrade_check': check}]}])
    after = run.result('after approval')
    assert after['_event'] == 'runner_on_ok', after.get('msg')
    assert after['passed'] is True and after['msg'].startswith('GPU upgrade gate: PASS')
    assert after['qualification']['approved_by'] == 'second-operator'
    assert after['qualification']['source_revision'] == 'c' * 40


def test_record_is_refused_when_the_measured_tuple_is_not_the_target(tmp_path: pathlib.Path, run_playbook: Any) -> None:
    """The declared copy alone, or a measurement that differs from the declared target: the module fails
    naming the node and the component, and leaves dest as it was (check mode too)."""
    bundle = tmp_path / 'canary.json'
    dest = tmp_path / 'record.yaml'
    dest.write_text('# the previous record\n')
    task = {'gpufleet.upgrade.qualification_record': {'evidence': str(bundle), 'dest': str(dest),
                                                      'source_revision': 'c' * 40}, 'ignore_errors': True}
    write_bundle(bundle, rollback_passed=True)
    b = ev.loads(bundle.read_text())
    b['nodes']['gpu-1'].pop('measured')  # as canary.yml opens it: tuple_after is the declared target
    bundle.write_text(ev.dumps(b))
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        dict(task, name='declared only'), dict(task, name='declared only, check', check_mode=True)]}])
    for name in ('declared only', 'declared only, check'):
        res = run.result(name)
        assert res['_event'] == 'runner_on_failed'
        assert res['msg'].startswith('qualification_record: no canary node has a measured tuple (canary node(s) gpu-1): '
                                     'the canary role records node_upgrade_result.measured'), res['msg']
    b, _changed = ev.merge(b, {'nodes': [dict(MEASURED, tuple_after=dict(AFTER, driver='580.126.20'))]})
    bundle.write_text(ev.dumps(b))
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [dict(task, name='differs')]}])
    assert run.result('differs')['msg'] == (
        'qualification_record: the tuple measured on the canary node(s) gpu-1 differs from the declared target '
        '(tuple.after): driver measured 580.126.20, declared 580.130.00')
    assert dest.read_text() == '# the previous record\n'


def test_the_canary_roles_record_step_feeds_the_record(tmp_path: pathlib.Path, run_playbook: Any) -> None:
    """The canary role's evidence task (canary_measured_nodes over node_upgrade_result) on a bundle opened as
    canary.yml opens it: no result records nothing and the record is refused; a measurement with a component
    that could not be measured (null) is refused naming it; the full measurement gives the record its target."""
    bundle = tmp_path / 'canary.json'
    dest = tmp_path / 'record.yaml'
    gates = [{'name': n, 'kind': k, 'node': 'gpu-1', 'passed': True, 'finished': '2026-07-14T12:0%d:00Z' % m}
             for n, k, m in (('node', 'node', 1), ('workload', 'workload', 1), ('metrics', 'metric', 2),
                             ('rollback', 'rollback', 3))]
    opened = {'path': str(bundle), 'id': 'a100-canary-7', 'tuple_after': AFTER, 'gates': gates,
              'nodes': [{'name': 'gpu-1', 'role': 'canary', 'batch': 0, 'pci_ids': ['10de:20b0/10de:1450'],
                         'tuple_after': AFTER}]}
    record_step = {'gpufleet.upgrade.evidence': {
        'path': str(bundle),
        'nodes': "{{ 'gpu-1' | gpufleet.upgrade.canary_measured_nodes(node_upgrade_result | default(none)) }}"}}
    record = {'gpufleet.upgrade.qualification_record': {'evidence': str(bundle), 'dest': str(dest),
                                                        'source_revision': 'c' * 40}, 'ignore_errors': True}
    partial = {'node': 'gpu-1', 'outcome': 'upgraded', 'measured': dict(AFTER, gpu_operator=None)}
    full = {'node': 'gpu-1', 'outcome': 'upgraded', 'measured': AFTER}
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'open', 'gpufleet.upgrade.evidence': opened},
        dict(record_step, name='no result'), dict(record, name='refused: no measurement'),
        dict(record_step, name='partial', vars={'node_upgrade_result': partial}),
        dict(record, name='refused: partial'),
        dict(record_step, name='full', vars={'node_upgrade_result': full}),
        dict(record, name='written')]}])
    assert run.rc == 0, run.stdout
    assert run.result('no result')['changed'] is False
    assert run.result('refused: no measurement')['msg'].startswith(
        'qualification_record: no canary node has a measured tuple (canary node(s) gpu-1)')
    assert run.result('partial')['changed'] is True
    assert run.result('refused: partial')['msg'] == (
        'qualification_record: the measured tuple is incomplete (not measured on the node): gpu-1 lacks gpu_operator')
    res = run.result('written')
    assert res['_event'] == 'runner_on_ok' and res['qualified'] is True, res.get('msg')
    assert yaml.safe_load(dest.read_text())['target'] == {
        'kernel': AFTER['kernel'], 'rke2': AFTER['rke2'], 'driver': AFTER['driver'],
        'gpuOperator': AFTER['gpu_operator'], 'dcgmExporter': AFTER['dcgm_exporter']}
    node = json.loads(bundle.read_text())['nodes']['gpu-1']
    assert node['measured'] is True and node['verdict'] == 'upgraded' and node['tuple_after'] == AFTER
