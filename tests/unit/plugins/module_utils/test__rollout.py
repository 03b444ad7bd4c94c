"""The rollout's decisions between module calls: file names, the gates' verdict, a node's evidence entry."""
from __future__ import annotations

import copy
import re

import jinja2
import pytest
from ansible.plugins.filter.core import regex_replace

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _node_record
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _rollout
from ansible_collections.gpufleet.upgrade.plugins.module_utils._upgrade_state import StateError, target_key

BEFORE = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '570.172.08',
          'gpu_operator': 'v26.3.3', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}
TARGET = dict(BEFORE, driver='580.126.20', gpu_operator='v26.3.4')
NOW = '2026-12-01T12:00:00Z'


# ---------------------------------------------------------------------------- pci_slug

@pytest.mark.parametrize('pci_ids,slug', [
    ('10de:2330', '10de2330'),
    ('10de:2330,10de:2331', '10de2330-10de2331'),
    (['10de:2330', '10de:2331'], '10de2330-10de2331'),
    (('10de:2330',), '10de2330'),
    ('10de:20b0/10de:1463', '10de20b0-10de1463'),
    ('10de:2330/10de:16c1,10de:20b5/10de:1533', '10de2330-10de16c1-10de20b5-10de1533'),
    (['10de:2330/10de:16c1', '10de:20b5/10de:1533'], '10de2330-10de16c1-10de20b5-10de1533'),
])
def test_pci_slug(pci_ids, slug):
    assert _rollout.pci_slug(pci_ids) == slug


@pytest.mark.parametrize('pci_ids', ['10de:2330', '10de:2330,10de:2331', '10de:20b0/10de:1463',
                                     '10de:2330/10de:16c1,10de:20b5/10de:1533'])
def test_pci_slug_is_the_old_jinja(pci_ids):
    old = jinja2.Environment(autoescape=False)
    old.filters['regex_replace'] = regex_replace
    rendered = old.from_string("{{ v | regex_replace(':', '') | regex_replace('[/,]', '-') }}").render(v=pci_ids)
    assert _rollout.pci_slug(pci_ids) == rendered


@pytest.mark.parametrize('pci_ids,shown', [
    (None, 'None'), ('', "''"), ('   ', "'   '"), (42, '42'), ({'pci': '10de:2330'}, "{'pci': '10de:2330'}"),
    ([], "''"),
])
def test_pci_slug_rejects_what_is_not_a_pci_id_list(pci_ids, shown):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.pci_slug(pci_ids)
    assert str(err.value) == 'pci_ids: %s is not a PCI id list (e.g. 10de:2330 or 10de:2330,10de:2331)' % shown


# ---------------------------------------------------------------------------- snapshot_file

def old_snapshot_file(directory, node, target):
    """The node_upgrade and rollback roles' Jinja before the filter."""
    env = jinja2.Environment(autoescape=False)
    env.filters['regex_replace'] = regex_replace
    return env.from_string(
        "{{ directory ~ '/' ~ node ~ '--' ~ (target | dictsort | map('join', '=') | join(',')"
        " | regex_replace('[^A-Za-z0-9._-]+', '_')) ~ '.json' }}").render(directory=directory, node=node, target=target)


@pytest.mark.parametrize('target', [
    TARGET,
    BEFORE,
    {'driver': '580.126.20'},
    {'rke2': 'v1.36.1+rke2r1', 'kernel': '6.8.0-135-generic', 'driver': '580.126.20'},
])
def test_snapshot_file_is_the_old_jinja(target):
    assert _rollout.snapshot_file('/var/lib/gpufleet/snapshots', 'gpu-01', target) == \
        old_snapshot_file('/var/lib/gpufleet/snapshots', 'gpu-01', target)


def test_snapshot_file():
    assert _rollout.snapshot_file('snaps', 'gpu-01', {'driver': '580.126.20', 'rke2': 'v1.35.3+rke2r3'}) == \
        'snaps/gpu-01--driver_580.126.20_rke2_v1.35.3_rke2r3.json'
    # one trailing slash or several: the same file
    assert _rollout.snapshot_file('snaps/', 'gpu-01', {'driver': '580'}) == 'snaps/gpu-01--driver_580.json'
    assert _rollout.snapshot_file('snaps//', 'gpu-01', {'driver': '580'}) == 'snaps/gpu-01--driver_580.json'
    # the key order of the target does not matter
    assert _rollout.snapshot_file('s', 'n', {'b': '1', 'a': '2'}) == _rollout.snapshot_file('s', 'n', {'a': '2', 'b': '1'})
    # one file per node and target
    assert _rollout.snapshot_file('s', 'n', TARGET) != _rollout.snapshot_file('s', 'n', BEFORE)
    assert re.fullmatch(r'[A-Za-z0-9._-]+', _rollout.snapshot_file('s', 'gpu-01', TARGET)[2:]) is not None


@pytest.mark.parametrize('directory,path', [
    ('/', '/gpu-01--driver_580.json'),                  # the root: one slash, not '//gpu-01--...'
    ('//', '/gpu-01--driver_580.json'),
    ('/var/lib/snaps', '/var/lib/snaps/gpu-01--driver_580.json'),
    ('/var/lib/snaps/', '/var/lib/snaps/gpu-01--driver_580.json'),
    ('/var/lib/snaps///', '/var/lib/snaps/gpu-01--driver_580.json'),
    ('snaps', 'snaps/gpu-01--driver_580.json'),
])
def test_snapshot_file_joins_the_directory_with_one_slash(directory, path):
    assert _rollout.snapshot_file(directory, 'gpu-01', {'driver': '580'}) == path


@pytest.mark.parametrize('node', ['', None, 7, '../etc', 'a/b', '..', '.'])
def test_snapshot_file_needs_a_node_name(node):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.snapshot_file('s', node, TARGET)
    assert str(err.value) == 'node: %r is not a node name' % (node,)


@pytest.mark.parametrize('directory', [None, '', 3])
def test_snapshot_file_needs_a_directory(directory):
    # None would give 'None/gpu-01--...', a snapshot nobody looks for
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.snapshot_file(directory, 'gpu-01', TARGET)
    assert str(err.value) == 'directory: %r is not the snapshot directory' % (directory,)


@pytest.mark.parametrize('target,message', [
    ({}, 'target: expected a non-empty mapping of tuple components, got {}'),
    (None, 'target: expected a non-empty mapping of tuple components, got None'),
    ({'driver': None}, 'target.driver: expected a version string, got None'),
    ({'driver': 'a,b'}, "target.driver: 'a,b' may not contain \",\" or \"=\""),
])
def test_snapshot_file_rejects_a_bad_target(target, message):
    with pytest.raises(StateError) as err:
        _rollout.snapshot_file('s', 'gpu-01', target)
    assert str(err.value) == message


# ---------------------------------------------------------------------------- gate_results

def passed(**kw):
    r = {'changed': False, 'passed': True, 'msg': 'ok', 'problems': []}
    r.update(kw)
    return r


def test_gate_results_every_gate_passed():
    out = _rollout.gate_results({'gpu': passed(msg='GPU gate: passed'), 'node': passed(msg='node gate: passed'),
                                 'metric': passed(), 'workload': passed()}, 'gpu-01', finished=NOW)
    assert out['passed'] is True
    assert out['msg'] == 'every gate passed on gpu-01'
    assert [e['name'] for e in out['evidence']] == ['gpu', 'node', 'metric', 'workload']
    assert out['evidence'][0] == {'name': 'gpu', 'kind': 'gpu', 'node': 'gpu-01', 'passed': True, 'finished': NOW,
                                  'problems': [], 'result': {'msg': 'GPU gate: passed'}}


def test_gate_results_entries_are_evidence_gates():
    out = _rollout.gate_results({'gpu': passed(), 'node': {'passed': False, 'msg': 'node gate: NotReady',
                                                           'problems': ['Ready is False']},
                                 'metric': {'failed': True, 'msg': 'boom'}}, 'gpu-01', finished=NOW)
    gates = [_evidence.gate_entry(e, i) for i, e in enumerate(out['evidence'])]
    assert [(g['id'], g['category'], g['critical'], g['passed'], g['problems']) for g in gates] == [
        ('gpu@gpu-01#-', 'monitoring', True, True, []),
        ('node@gpu-01#-', 'allocation', True, False, ['Ready is False']),
        ('metric@gpu-01#-', 'monitoring', True, False, ['boom']),
    ]
    assert all(g['finished'] == NOW for g in gates)


def test_gate_results_the_gpu_gate_after_the_workload_gate_is_a_gpu_gate_that_can_fail_the_node():
    """Issue 16: the Xids a workload caused show in the GPU gate run again after the workload gate."""
    xid = {'passed': False, 'msg': 'GPU gate: FAIL: new Xid 79 on GPU 3', 'problems': ['new Xid 79 on GPU 3']}
    out = _rollout.gate_results({'gpu': passed(), 'node': passed(), 'workload': passed(), 'gpu_after_workload': xid},
                                'gpu-01', finished=NOW)
    assert out['passed'] is False and out['msg'] == 'critical gate failed on gpu-01: GPU gate: FAIL: new Xid 79 on GPU 3'
    entry = _evidence.gate_entry(out['evidence'][-1], 3)
    assert (entry['id'], entry['kind'], entry['category'], entry['problems']) == (
        'gpu_after_workload@gpu-01#-', 'gpu', 'monitoring', ['new Xid 79 on GPU 3'])


@pytest.mark.parametrize('absent', [
    None, {}, {'skipped': True, 'skip_reason': 'Conditional result was False', 'changed': False},
    {'skipped': True, 'passed': None, 'problems': []}, 'not a result', ['x'],
])
def test_gate_results_skipped_or_absent_gates_are_not_counted(absent):
    results = {'gpu': passed(), 'node': passed(), 'metric': absent}
    if absent is not None:
        results['workload'] = absent
    out = _rollout.gate_results(results, 'gpu-01', finished=NOW)
    assert [e['name'] for e in out['evidence']] == ['gpu', 'node']
    assert out['passed'] is True


@pytest.mark.parametrize('results,kind', [
    (None, 'NoneType'), ([{'passed': True}], 'list'), ('gpu', 'str'), (42, 'int'),
])
def test_gate_results_refuses_results_that_are_not_a_mapping(results, kind):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.gate_results(results, 'gpu-01', finished=NOW)
    assert str(err.value) == 'results: expected a mapping of gate name to registered result, got %s' % kind


def test_gate_results_unknown_names_are_not_gates():
    out = _rollout.gate_results({'gpu': passed(), 'dra': {'passed': False, 'msg': 'no'}}, 'gpu-01', finished=NOW)
    assert [e['name'] for e in out['evidence']] == ['gpu'] and out['passed'] is True


@pytest.mark.parametrize('result', [
    {'msg': 'GPU gate: exception'},             # a result without `passed` fails
    {'passed': None, 'msg': 'GPU gate: exception'},
    {'passed': 'true', 'msg': 'GPU gate: exception'},   # only True passes
    {'passed': False, 'msg': 'GPU gate: exception'},
])
def test_gate_results_a_result_without_passed_true_fails(result):
    out = _rollout.gate_results({'gpu': result, 'node': passed()}, 'gpu-01', finished=NOW)
    assert out['passed'] is False
    assert out['msg'] == 'critical gate failed on gpu-01: GPU gate: exception'
    assert out['evidence'][0]['passed'] is False
    assert out['evidence'][0]['problems'] == ['GPU gate: exception']


def test_gate_results_message_names_every_failed_gate():
    out = _rollout.gate_results({'gpu': {'passed': False, 'msg': 'GPU gate: Xid 79 on GPU 3'}, 'node': passed(),
                                 'metric': {'passed': False, 'problems': ['no samples']},
                                 'workload': {'passed': False, 'msg': 'workload gate: nccl bandwidth 12 GB/s'}},
                                'gpu-07', finished=NOW)
    assert out['passed'] is False
    assert out['msg'] == ('critical gate failed on gpu-07: GPU gate: Xid 79 on GPU 3; metric gate: failed; '
                          'workload gate: nccl bandwidth 12 GB/s')
    metric = out['evidence'][2]
    assert metric['problems'] == ['no samples'] and metric['result'] == {'msg': ''}


def test_gate_results_no_gate_ran():
    out = _rollout.gate_results({'gpu': {'skipped': True}}, 'gpu-01', finished=NOW)
    assert out == {'evidence': [], 'passed': False, 'msg': 'no gate ran on gpu-01'}


def test_gate_results_finished_defaults_to_now():
    out = _rollout.gate_results({'gpu': passed()}, 'gpu-01')
    _evidence.parse_rfc3339(out['evidence'][0]['finished'], 'finished')
    assert out['evidence'][0]['finished'].endswith('Z')


# ---------------------------------------------------------------------------- node_entry

def plan():
    return {
        'target': TARGET,
        'canaries': ['a-01', 'gpu-01'],
        'combinations': [
            {'id': 'a100', 'key': {'pci_ids': '10de:20b5/10de:1533'}, 'nodes': ['a-01', 'a-02'],
             'canaries': ['a-01'], 'source_tuples': [dict(BEFORE)]},
            {'id': 'h100', 'key': {'pci_ids': '10de:2330/10de:16c1,10de:2331/10de:16c1'},
             'nodes': ['gpu-01', 'gpu-02', 'gpu-03'], 'canaries': ['gpu-01'],
             'source_tuples': [dict(BEFORE, kernel='6.8.0-120-generic')]},
        ],
        'batches': [['a-01', 'gpu-01'], ['a-02'], ['gpu-02', 'gpu-03']],
    }


def test_node_entry_upgraded_canary():
    result = {'node': 'gpu-01', 'driver_now': '580.126.20', 'rke2_applied': False, 'rolled_back': False}
    kubelet = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3'}
    e = _rollout.node_entry(plan(), 'gpu-01', result=result, kubelet=kubelet, started='2026-12-01T11:50:00Z',
                            finished=NOW)
    assert e == {
        'name': 'gpu-01', 'role': 'canary', 'batch': 0,
        'pci_ids': ['10de:2330/10de:16c1', '10de:2331/10de:16c1'],
        'tuple_before': dict(BEFORE, kernel='6.8.0-120-generic'),
        'tuple_after': dict(BEFORE, kernel='6.8.0-134-generic', driver='580.126.20'),
        'verdict': 'upgraded', 'phases': ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates', 'uncordon'],
        'finished': NOW, 'rolled_back': False, 'started': '2026-12-01T11:50:00Z',
    }
    assert 'failed_phase' not in e and 'message' not in e
    # the entry is one the evidence bundle accepts
    assert _evidence.node_entry(e, 0)['duration_s'] == 600


def test_node_entry_batch_node_index_and_options():
    e = _rollout.node_entry(plan(), 'gpu-03', result={'rke2_applied': True}, dra=True, finished=NOW)
    assert (e['name'], e['role'], e['batch']) == ('gpu-03', 'batch', 2)
    assert e['phases'] == ['drain', 'snapshot', 'rke2', 'install', 'activate', 'ready', 'verify', 'gates', 'postflight',
                           'uncordon']
    assert 'started' not in e
    assert _rollout.node_entry(plan(), 'a-02', finished=NOW)['batch'] == 1


def test_node_entry_tuple_after_from_kubelet_and_driver_now():
    before = dict(BEFORE, kernel='6.8.0-120-generic')
    # nothing read: the tuple before
    assert _rollout.node_entry(plan(), 'gpu-02', finished=NOW)['tuple_after'] == before
    # empty values read do not erase what was before
    e = _rollout.node_entry(plan(), 'gpu-02', result={'driver_now': ''}, kubelet={'kernel': '', 'rke2': None},
                            finished=NOW)
    assert e['tuple_after'] == before
    e = _rollout.node_entry(plan(), 'gpu-02', result={'driver_now': '580.126.20'},
                            kubelet={'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'os': 'ignored'},
                            finished=NOW)
    assert e['tuple_after'] == dict(before, kernel='6.8.0-135-generic', rke2='v1.36.1+rke2r1', driver='580.126.20')
    # the plan is not changed
    assert e['tuple_before'] == before


def test_node_entry_records_the_artifacts_the_node_installed_and_runs():
    """Issue 16 (5): each node's evidence entry carries its artifacts with their digests (the evidence accepts them)."""
    arts = [{'kind': 'package', 'name': 'nvidia-driver-580-server', 'version': '580.130.00-0ubuntu1', 'sha256': 'a' * 64},
            {'kind': 'image', 'name': 'nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1', 'digest': 'sha256:' + 'b' * 64}]
    e = _rollout.node_entry(plan(), 'gpu-02', result={'artifacts': arts}, finished=NOW)
    assert e['artifacts'] == arts and _evidence.node_entry(e, 0)['artifacts'] == arts
    assert 'artifacts' not in _rollout.node_entry(plan(), 'gpu-02', result={'artifacts': []}, finished=NOW)
    with pytest.raises(_evidence.EvidenceError, match=re.escape("nodes[0].artifacts[0].sha256: 'x' is not 64 hex")):
        _evidence.node_entry(dict(e, artifacts=[dict(arts[0], sha256='x')]), 0)
    with pytest.raises(_evidence.EvidenceError, match=re.escape('nodes[0].artifacts[0]: unknown field(s) path')):
        _evidence.node_entry(dict(e, artifacts=[dict(arts[0], path='/etc/passwd')]), 0)


def test_node_entry_the_result_names_the_node():
    e = _rollout.node_entry(plan(), 'gpu-02', result={'node': 'gpu-02.k8s'}, finished=NOW)
    assert e['name'] == 'gpu-02.k8s' and e['batch'] == 2


def test_node_entry_failed():
    result = {'node': 'gpu-02', 'driver_now': '570.172.08', 'rolled_back': True, 'rke2_applied': False}
    e = _rollout.node_entry(plan(), 'gpu-02', result=result, failed_phase='gates', message='critical gate failed',
                            finished=NOW)
    assert (e['verdict'], e['failed_phase'], e['message'], e['rolled_back']) == (
        'failed', 'gates', 'critical gate failed', True)
    assert e['phases'] == ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify']
    assert e['tuple_after']['driver'] == '570.172.08'
    _evidence.node_entry(e, 0)
    # a failure without a message still records one (empty)
    e = _rollout.node_entry(plan(), 'gpu-02', failed_phase='preflight', finished=NOW)
    assert (e['verdict'], e['failed_phase'], e['message'], e['phases'], e['rolled_back']) == (
        'failed', 'preflight', '', [], False)


def test_node_entry_message_only_when_failed():
    e = _rollout.node_entry(plan(), 'gpu-02', message='ignored', finished=NOW)
    assert e['verdict'] == 'upgraded' and 'message' not in e and 'failed_phase' not in e


def test_node_entry_finished_defaults_to_now():
    _evidence.parse_rfc3339(_rollout.node_entry(plan(), 'gpu-02')['finished'], 'finished')


def test_node_entry_unknown_failed_step():
    with pytest.raises(_node_record.RecordError, match="step: 'holders' is not one of preflight, progress, packages, kernel_check, drain"):
        _rollout.node_entry(plan(), 'gpu-02', failed_phase='holders')


def test_node_entry_unknown_host():
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.node_entry(plan(), 'gpu-99')
    assert str(err.value) == "host 'gpu-99' is in no combination of the plan"
    p = plan()
    p['batches'] = [b for b in p['batches'] if 'a-02' not in b]
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.node_entry(p, 'a-02')
    assert str(err.value) == "host 'a-02' is in no batch of the plan"


def test_node_entry_does_not_change_the_plan():
    p = plan()
    kept = copy.deepcopy(p)
    _rollout.node_entry(p, 'gpu-01', result={'driver_now': '580.126.20'}, kubelet={'kernel': 'k'}, finished=NOW)
    assert p == kept


# ---------------------------------------------------------------------------- unfinished_nodes

KEY = 'dcgm_exporter=4.4.1-4.6.0-ubuntu22.04,driver=580.126.20,gpu_operator=v26.3.4,kernel=6.8.0-134-generic,' \
      'rke2=v1.35.3+rke2r3'


def test_unfinished_nodes():
    nodes = [
        {'name': 'gpu-01', 'annotations': {_node_record.ANN_DONE: KEY}},
        {'name': 'gpu-02', 'annotations': {_node_record.ANN_DONE: KEY, _node_record.ANN_STATE: 'failed', _node_record.ANN_TARGET: KEY}},
        {'name': 'gpu-03', 'annotations': {}},
        {'name': 'gpu-04'},
        {'name': 'gpu-05', 'annotations': None},
        {'name': 'gpu-06', 'annotations': {_node_record.ANN_DONE: KEY.replace('580.126.20', '570.172.08')}},
        {'name': 'gpu-07', 'annotations': {_node_record.ANN_DONE: KEY, 'other': 'x'}},
    ]
    assert _rollout.unfinished_nodes(nodes, TARGET) == ['gpu-02', 'gpu-03', 'gpu-04', 'gpu-05', 'gpu-06']
    assert _rollout.unfinished_nodes([], TARGET) == []


def test_unfinished_nodes_key_is_target_key():
    assert target_key(TARGET) == KEY
    with pytest.raises(StateError):
        _rollout.unfinished_nodes([{'name': 'gpu-01'}], {})


# ---- rollback_result: the rollback role's public result

DECISION = {'outcome': 'restore driver 580.126.20', 'refusals': ['kernel: not proven'], 'steps': []}


def test_rollback_result_passes_only_when_the_gpu_and_the_node_gate_both_passed():
    ok = {'passed': True, 'problems': []}
    res = _rollout.rollback_result('gpu-04', DECISION, True, {'driver_version': '580.126.20'},
                                   {'gpu': ok, 'node': ok}, '580.126.20')
    assert res == {'node': 'gpu-04', 'outcome': 'restore driver 580.126.20', 'restored': True,
                   'driver_now': '580.126.20', 'driver_before_upgrade': '580.126.20', 'gates_passed': True,
                   'gate_problems': [], 'refusals': ['kernel: not proven'],
                   'summary': 'restore driver 580.126.20; driver 580.126.20 (before the upgrade 580.126.20); gates passed'}


@pytest.mark.parametrize('gpu, node', [
    ({'passed': False, 'problems': ['xid: new Xid 79']}, {'passed': True}),
    ({'passed': True}, {'passed': False, 'problems': ['not Ready']}),
    ({'passed': True}, {'skipped': True}),          # a gate that did not run did not pass
    ({'failed': True, 'msg': 'boom'}, {'passed': True}),
])
def test_rollback_result_fails_when_either_gate_did_not_pass(gpu, node):
    res = _rollout.rollback_result('gpu-04', DECISION, True, {'driver_version': '580.130.00'},
                                   {'gpu': gpu, 'node': node}, '580.126.20')
    assert res['gates_passed'] is False and res['summary'].endswith('; gates FAILED')
    assert res['gate_problems'] == (gpu.get('problems') or []) + (node.get('problems') or [])


def test_rollback_result_without_a_restore_says_so():
    res = _rollout.rollback_result('gpu-04', {'outcome': 'nothing to roll back'}, False, {}, {}, '580.126.20')
    assert res['restored'] is False and res['driver_now'] == '' and res['refusals'] == [] and not res['gates_passed']


# ------------------------------------------------------------------ the measured tuple

TUPLE = {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'driver': '580.130.00', 'gpu_operator': 'v26.3.3',
         'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}


def node_gate_measured(**over):
    m = {'kernel': TUPLE['kernel'], 'rke2': TUPLE['rke2'], 'gpu_operator': TUPLE['gpu_operator'],
         'dcgm_exporter': TUPLE['dcgm_exporter']}
    m.update(over)
    return {'passed': True, 'measured': m}


BOOTED = {'verification': {'running_kernel': TUPLE['kernel'], 'ok': True}}
GPU_AFTER = {'driver_version': TUPLE['driver'], 'kernel': 'the controller runs this one'}


def test_measured_tuple_takes_each_component_from_where_it_is_measured():
    m = _rollout.measured_tuple(BOOTED, GPU_AFTER, node_gate_measured(kernel='6.8.0-134-generic'))
    # the kernel from the host's /proc (kernel_boot verify), the kubelet's report apart
    assert m == dict(TUPLE, kubelet_kernel='6.8.0-134-generic')
    # the host not read: the kubelet's kernel
    assert _rollout.measured_tuple({'skipped': True}, GPU_AFTER, node_gate_measured())['kernel'] == TUPLE['kernel']
    assert _rollout.measured_tuple(None, None, None) == dict((k, None) for k in _rollout.TUPLE_KEYS + ('kubelet_kernel',))


def test_tuple_gate_passes_when_every_target_component_is_measured_at_it():
    g = _rollout.tuple_gate(TUPLE, _rollout.measured_tuple(BOOTED, GPU_AFTER, node_gate_measured()))
    assert (g['passed'], g['problems'], g['measured']) == (True, [], TUPLE)
    assert g['msg'].startswith('tuple gate: the node runs the target (kernel 6.8.0-135-generic, rke2 v1.36.1+rke2r1')
    # a leading v is not significant; components the target does not name are not judged
    m = _rollout.measured_tuple(BOOTED, GPU_AFTER, node_gate_measured(rke2='1.36.1+rke2r1', gpu_operator=None))
    assert _rollout.tuple_gate({k: TUPLE[k] for k in ('kernel', 'rke2', 'driver')}, m)['passed'] is True


@pytest.mark.parametrize('booted,gpu_after,over,problem', [
    ({'verification': {'running_kernel': '6.8.0-134-generic'}}, GPU_AFTER, {'kernel': '6.8.0-134-generic'},
     'kernel: measured 6.8.0-134-generic, target 6.8.0-135-generic'),
    (BOOTED, GPU_AFTER, {'kernel': '6.8.0-134-generic'},
     'kernel: the kubelet reports 6.8.0-134-generic, the host runs 6.8.0-135-generic'),
    (BOOTED, {'driver_version': '580.126.20'}, {}, 'driver: measured 580.126.20, target 580.130.00'),
    (BOOTED, {}, {}, 'driver: could not be measured (target 580.130.00)'),
    (BOOTED, GPU_AFTER, {'rke2': 'v1.35.3+rke2r3'}, 'rke2: measured v1.35.3+rke2r3, target v1.36.1+rke2r1'),
    (BOOTED, GPU_AFTER, {'dcgm_exporter': None}, 'dcgm_exporter: could not be measured (target 4.4.1-4.6.0-ubuntu22.04)'),
    (BOOTED, GPU_AFTER, {'gpu_operator': 'v25.10.1'}, 'gpu_operator: measured v25.10.1, target v26.3.3'),
])
def test_tuple_gate_fails_on_what_differs_or_was_not_measured(booted, gpu_after, over, problem):
    g = _rollout.tuple_gate(TUPLE, _rollout.measured_tuple(booted, gpu_after, node_gate_measured(**over)))
    assert g['passed'] is False
    assert g['problems'] == [problem]
    assert g['msg'] == 'tuple gate: FAIL: ' + problem


@pytest.mark.parametrize('target,measured,message', [
    ({}, {}, 'target: {} is not a tuple'),
    ('580', {}, "target: '580' is not a tuple"),
    (TUPLE, None, 'measured: None is not a measured tuple'),
])
def test_tuple_gate_rejects_bad_input(target, measured, message):
    with pytest.raises(_rollout.RolloutError, match='^%s$' % re.escape(message)):
        _rollout.tuple_gate(target, measured)


def test_judge_tuple_is_skipped_without_the_node_gate_and_keeps_what_was_measured():
    j = _rollout.judge_tuple(TUPLE, BOOTED, GPU_AFTER, {'skipped': True})
    assert j['skipped'] is True and j['measured']['driver'] == TUPLE['driver']
    # a skipped tuple gate is not counted by gate_results
    v = _rollout.gate_results({'gpu': {'passed': False, 'msg': 'GPU gate: FAIL'}, 'tuple': j}, 'gpu-01', finished=NOW)
    assert [e['name'] for e in v['evidence']] == ['gpu']
    judged = _rollout.judge_tuple(TUPLE, BOOTED, GPU_AFTER, node_gate_measured(rke2='v1.35.3+rke2r3'))
    v = _rollout.gate_results({'gpu': {'passed': True}, 'node': {'passed': True}, 'tuple': judged}, 'gpu-01',
                              finished=NOW)
    assert v['passed'] is False and 'tuple gate: FAIL: rke2: measured v1.35.3+rke2r3' in v['msg']
    assert [e['name'] for e in v['evidence']] == ['gpu', 'node', 'tuple']


def test_node_entry_tuple_after_is_what_was_measured():
    measured = dict(TUPLE, dcgm_exporter='9.9.9')
    e = _rollout.node_entry(plan(), 'gpu-02', result={'measured': measured, 'driver_now': '580.130.00',
                                                      'kernel_changed': True},
                            kubelet={'kernel': 'not-this', 'rke2': 'v0'}, finished=NOW)
    assert e['tuple_after'] == measured
    assert e['phases'][0] == 'kernel_check' and 'kernel_default' in e['phases']
    # a rolled-back node: what it runs now comes first (the rollback's driver, the kubelet's kernel)
    e = _rollout.node_entry(plan(), 'gpu-02', result={'measured': measured, 'driver_now': '580.126.20',
                                                      'rolled_back': True},
                            kubelet={'kernel': '6.8.0-134-generic'}, failed_phase='gates', finished=NOW)
    assert (e['tuple_after']['driver'], e['tuple_after']['kernel'], e['tuple_after']['dcgm_exporter']) == (
        '580.126.20', '6.8.0-134-generic', '9.9.9')


def test_rollback_result_checks_the_restored_kernel():
    gates = {'gpu': {'passed': True}, 'node': {'passed': True}}
    ok = _rollout.rollback_result('gpu-01', {'outcome': 'rolled back'}, True, {'driver_version': '580.126.20'},
                                  dict(gates, kernel={'verification': {'ok': True, 'problems': []}}), '580.126.20')
    assert ok['gates_passed'] is True
    bad = _rollout.rollback_result('gpu-01', {'outcome': 'rolled back'}, True, {'driver_version': '580.126.20'},
                                   dict(gates, kernel={'verification': {'ok': False, 'problems': [
                                       'the running kernel is 6.8.0-135-generic, expected 6.8.0-134-generic']}}),
                                   '580.126.20')
    assert bad['gates_passed'] is False
    assert bad['gate_problems'] == ['the running kernel is 6.8.0-135-generic, expected 6.8.0-134-generic']
    skipped = _rollout.rollback_result('gpu-01', {}, True, {}, dict(gates, kernel={'skipped': True}), '580.126.20')
    assert skipped['gates_passed'] is True


# ---------------------------------------------------------------------------- forks_verdict

def test_forks_enough_for_the_largest_batch():
    v = _rollout.forks_verdict([['gpu-01'], ['gpu-02', 'gpu-03', 'gpu-04']], 3)
    assert (v['ok'], v['largest'], v['forks']) == (True, 3, 3)
    assert v['msg'] == "the plan's largest batch has 3 node(s) and this run has 3 forks: each batch's nodes run at once"


def test_too_few_forks_are_refused_naming_what_is_needed():
    v = _rollout.forks_verdict([['gpu-%02d' % i for i in range(6)], ['gpu-99']], 5)
    assert (v['ok'], v['largest'], v['forks']) == (False, 6, 5)
    assert v['msg'].startswith("the plan's largest batch has 6 nodes but this run has 5 forks: Ansible would run each "
                               'task on 5 of them at a time')
    assert 'Run with --forks 6 or more' in v['msg'] and v['msg'].endswith('nothing was changed')


def test_forks_without_batches():
    assert _rollout.forks_verdict([], 1)['ok'] is True


@pytest.mark.parametrize('batches,forks,message', [
    ([['a']], 0, 'forks: 0 is not a positive whole number'),
    ([['a']], '8', "forks: '8' is not a positive whole number"),
    ([['a']], False, 'forks: False is not a positive whole number'),
    ({'a': 1}, 5, "batches: expected the plan's list of node-name lists, got dict"),
    ([['a'], 'b'], 5, "batches: expected the plan's list of node-name lists, got list"),
])
def test_forks_verdict_bad_input(batches, forks, message):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.forks_verdict(batches, forks)
    assert str(err.value) == message


def test_node_entry_carries_the_nodes_identity():
    ident = {'uid': '4f7c9a3e-0b1d-4c55-9d1e-2a6b8f0c1d2e', 'machine_id': 'a' * 32,
             'system_uuid': '9b2f6c1e-3d4a-5b6c-7d8e-9f0a1b2c3d4e'}
    e = _rollout.node_entry(plan(), 'gpu-01', kubelet=dict(ident, kernel='6.8.0-134-generic'), finished=NOW)
    assert {k: e[k] for k in ident} == ident
    assert _evidence.node_entry(e, 0)['machine_id'] == 'a' * 32
    # not reported: not in the entry (never an empty claim)
    e = _rollout.node_entry(plan(), 'gpu-01', kubelet={'uid': None, 'machine_id': ''}, finished=NOW)
    assert not {'uid', 'machine_id', 'system_uuid'} & set(e)


# ---------------------------------------------------------------------------- rollback_time

def test_rollback_time_without_a_window_is_recorded_not_judged():
    v = _rollout.rollback_time('gpu-01', 1000.0, 1042.26)
    assert v == {'seconds': 42.3, 'window_s': None, 'judged': False, 'passed': True,
                 'msg': 'the rollback of gpu-01 took 42.3 s (no maintenance window declared to compare it with)'}


def test_rollback_time_within_and_beyond_the_window():
    v = _rollout.rollback_time('gpu-01', '1000', '1600', '45m')
    assert (v['seconds'], v['window_s'], v['judged'], v['passed']) == (600.0, 2700.0, True, True)
    assert v['msg'] == 'the rollback of gpu-01 took 600.0 s, within the maintenance window of 45m (2700 s)'
    v = _rollout.rollback_time('gpu-01', 0, 3000, '45m')
    assert v['passed'] is False and 'LONGER THAN the maintenance window of 45m' in v['msg']
    assert _rollout.rollback_time('gpu-01', 0, 2700, '45m')['passed'] is True     # the bound itself is inside


@pytest.mark.parametrize('start,end,window,message', [
    ('x', 1, '', "start/end: 'x', 1 are not times in seconds"),
    (None, 1, '', 'start/end: None, 1 are not times in seconds'),
    (10, 5, '', 'end: 5 is before start 10'),
    (0, 5, 'soon', "maintenance_window: 'soon' is not a duration"),
    (0, 5, '0s', "maintenance_window: '0s' must be greater than zero"),
])
def test_rollback_time_bad_input(start, end, window, message):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.rollback_time('gpu-01', start, end, window)
    assert str(err.value).startswith(message)


def test_gate_results_a_string_of_problems_is_one_problem():
    out = _rollout.gate_results({'gpu': passed(passed=False, msg='GPU gate: FAIL', problems='xid: new Xid 79')}, 'gpu-01')
    assert out['passed'] is False
    assert [e['problems'] for e in out['evidence']] == [['xid: new Xid 79']]


def test_gate_results_problems_of_another_type_are_refused():
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.gate_results({'gpu': passed(passed=False, problems={'xid': 79})}, 'gpu-01')
    assert str(err.value) == "problems: {'xid': 79} is not a list of strings"


# ---------------------------------------------------------------------------- activation
@pytest.mark.parametrize('mode,kernel_change,booted,expected', [
    ('auto', True, False, 'reboot'),
    ('lab', True, False, 'reboot'),
    ('auto', False, False, 'reload'),
    ('lab', False, False, 'reload'),
    ('reboot', False, False, 'reboot'),
    ('reload', True, False, 'reload'),
    # a resumed run after the one-shot trial boot: the target kernel runs; a reboot would boot the previous one
    ('auto', True, True, 'none'),
    ('reboot', True, True, 'none'),
    ('lab', True, True, 'none'),
])
def test_activation(mode, kernel_change, booted, expected):
    assert _rollout.activation(mode, kernel_change, booted) == expected


@pytest.mark.parametrize('mode', ['auto', 'reboot', 'reload', 'lab'])
def test_activation_with_the_operators_driver_is_the_operator_whatever_the_mode(mode):
    # the driver container is the driver: nothing on the host reboots or unloads for it, even on a resumed run
    assert _rollout.activation(mode, False, False, 'operator') == 'operator'
    assert _rollout.activation(mode, False, True, 'operator') == 'operator'
    assert _rollout.activation(mode, False, False, 'apt') == _rollout.activation(mode, False, False)


@pytest.mark.parametrize('args,message', [
    (('sometimes', True), "activation: 'sometimes' is not one of auto, reboot, reload, lab"),
    (('auto', 'yes'), "kernel_change: 'yes' is not a boolean"),
    (('auto', True, None), 'booted: None is not a boolean'),
    (('auto', False, False, ''), "install_method: '' is not a name"),
    (('auto', True, False, 'operator'), "install_method: 'operator' with a kernel change is not built (the operator's "
     "driver container builds its module for the running kernel; change the kernel in its own target first); "
     "nothing was changed"),
])
def test_activation_bad_input(args, message):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.activation(*args)
    assert str(err.value) == message


@pytest.mark.parametrize('mode,steps,kernel_back,expected', [
    ('auto', [{'action': 'restore_driver'}], False, 'reload'),
    ('lab', [{'action': 'restore_driver'}], False, 'reload'),
    ('reboot', [], False, 'reboot'),                                       # the operator asked for reboots
    ('auto', [{'action': 'restore_driver'}, {'action': 'reboot'}], False, 'reboot'),  # the decision's reboot step
    ('reload', [{'action': 'restore_driver'}], True, 'reboot'),           # another kernel runs: a reload keeps it
])
def test_rollback_activation(mode, steps, kernel_back, expected):
    assert _rollout.rollback_activation(mode, {'steps': steps}, kernel_back) == expected


@pytest.mark.parametrize('args,message', [
    (('often', {'steps': []}), "rollback_activation: 'often' is not one of auto, reboot, reload, lab"),
    (('auto', {'steps': 'reboot'}), "decision: {'steps': 'reboot'} has no list of steps"),
    (('auto', {'steps': []}, 'yes'), "kernel_back: 'yes' is not a boolean"),
])
def test_rollback_activation_bad_input(args, message):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.rollback_activation(*args)
    assert str(err.value) == message


def _methods_plan(*methods):
    return {'combinations': [{'key': {'pci_ids': 'p%d' % i, 'install_method': m}} for i, m in enumerate(methods)]}


def test_install_method_verdict():
    assert _rollout.install_method_verdict(_methods_plan('apt', 'apt'), 'apt') == {
        'ok': True, 'msg': 'install method apt, as planned'}
    v = _rollout.install_method_verdict(_methods_plan('apt', 'operator'), 'operator')
    assert v == {'ok': False, 'msg': 'the plan was made with install method apt, this run has gpufleet_install_method '
                                     'operator: re-plan (and re-qualify) with the same install method'}
    assert _rollout.install_method_verdict(_methods_plan('apt'), 'operator')['ok'] is False
    # combination keys without install_method are not judged
    assert _rollout.install_method_verdict({'combinations': [{'key': {'pci_ids': 'p'}}]}, 'operator')['ok'] is True


@pytest.mark.parametrize('args,message', [
    (({'combinations': []}, ''), "gpufleet_install_method: '' is not a name"),
    (([], 'apt'), 'plan: a list is not a plan'),
    (({'combinations': None}, 'apt'), 'plan.combinations: None is not a list'),
    # Found by test_fuzz_parsers.py (TypeError before): a combination whose key is not a mapping.
    (({'combinations': [{'key': 2.5}]}, 'apt'), 'plan.combinations[0].key: 2.5 is not a mapping (re-plan)'),
    (({'combinations': [{'key': {'install_method': 'apt'}}, 'x']}, 'apt'),
     "plan.combinations[1]: 'x' is not a combination (a mapping with a key; re-plan)"),
])
def test_install_method_verdict_bad_input(args, message):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.install_method_verdict(*args)
    assert str(err.value) == message


@pytest.mark.parametrize('managed,restore,method,expected', [
    (True, {'changed': True}, 'apt', True),                       # the host went back: its operands too
    (True, {'changed': False}, 'apt', False),                     # nothing on the host changed: the operands stay
    (True, {'changed': False}, 'operator', True),                 # the driver container is the driver to restore
    (True, {'changed': False, 'skipped': True}, 'operator', False),  # nothing to restore at all
    (True, {'skipped': True}, 'apt', False),
    (False, {'changed': True}, 'apt', False),                     # the operator does not manage the operands
    (False, {'changed': True}, 'operator', False),
])
def test_operands_back(managed, restore, method, expected):
    assert _rollout.operands_back(managed, restore, method) is expected


@pytest.mark.parametrize('args,message', [
    (('yes', {}), "gpu_operator_managed: 'yes' is not a boolean"),
    ((True, None), 'restore: None is not a task result'),
    ((True, {}, ''), "install_method: '' is not a name"),
])
def test_operands_back_bad_input(args, message):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.operands_back(*args)
    assert str(err.value) == message


# ---------------------------------------------------------------------------- operands outside their window (T3-6)

def _operand_pod(operand, revision, current, back=False):
    return {'operand': operand, 'pod': '%s-%s' % (operand, revision), 'revision': revision, 'current': current,
            'back': back}


def _operator_state(pods_by_node):
    return {'nodes': pods_by_node, 'operands': []}


def _view(name, **annotations):
    return {'name': name, 'annotations': annotations}


def test_operand_window_verdict_names_a_waiting_node_whose_operand_moved_to_the_new_revision():
    dp, drv = 'nvidia-device-plugin-daemonset', 'nvidia-driver-daemonset'
    state = _operator_state({
        'gpu-1': [_operand_pod(dp, 'new', True), _operand_pod(drv, 'new', True)],      # upgraded in its window
        'gpu-2': [_operand_pod(dp, 'old', False), _operand_pod(drv, 'old', False)],
        'gpu-3': [_operand_pod(dp, 'old', False), _operand_pod(drv, 'new', True)],      # on-call deleted its driver pod
        'gpu-4': [_operand_pod(dp, 'old', False), _operand_pod(drv, 'old', False)],
    })
    key = target_key(TARGET)
    nodes = [_view('gpu-1', **{_node_record.ANN_DONE: key}), _view('gpu-2'), _view('gpu-3'), _view('gpu-4')]
    v = _rollout.operand_window_verdict(state, nodes, ['gpu-1', 'gpu-2', 'gpu-3', 'gpu-4'], TARGET)
    assert v['ok'] is False
    assert v['moved'] == [{'node': 'gpu-3', 'operand': drv, 'pod': drv + '-new', 'revision': 'new', 'others': ['old']}]
    assert v['msg'].startswith('operands moved outside their window on 1 node(s) not yet upgraded')
    assert 'gpu-3: nvidia-driver-daemonset pod nvidia-driver-daemonset-new at revision new, the others not yet ' \
           'upgraded at old' in v['msg']


@pytest.mark.parametrize('case, pods, annotations, ok', [
    # every waiting node at the current revision: a template the change did not touch
    ('untouched template', {'gpu-2': [_operand_pod('dp', 'r1', True)], 'gpu-3': [_operand_pod('dp', 'r1', True)]},
     {}, True),
    # the node that moved is in its window already (a resumed run): its progress names the target
    ('in its window', {'gpu-2': [_operand_pod('dp', 'old', False)], 'gpu-3': [_operand_pod('dp', 'new', True)]},
     {'gpu-3': {_node_record.ANN_TARGET: 'KEY'}}, True),
    # a rollback's own pod (state back) is not the DaemonSet's
    ('taken back', {'gpu-2': [_operand_pod('dp', 'old', False)], 'gpu-3': [_operand_pod('dp', 'old', False, True)]},
     {}, True),
    # a node not in `pending` (an earlier batch) is not compared
    ('earlier batch', {'gpu-1': [_operand_pod('dp', 'new', True)], 'gpu-2': [_operand_pod('dp', 'old', False)]},
     {}, True),
    # a pod being recreated (no revision yet) says nothing
    ('no revision', {'gpu-2': [_operand_pod('dp', 'old', False)], 'gpu-3': [_operand_pod('dp', None, False)]},
     {}, True),
    ('moved', {'gpu-2': [_operand_pod('dp', 'old', False)], 'gpu-3': [_operand_pod('dp', 'new', True)]}, {}, False),
])
def test_operand_window_verdict_reports_only_a_move_outside_a_window(case, pods, annotations, ok):
    key = target_key(TARGET)
    nodes = [_view(name, **{k: (key if v == 'KEY' else v) for k, v in annotations.get(name, {}).items()})
             for name in ('gpu-1', 'gpu-2', 'gpu-3')]
    v = _rollout.operand_window_verdict(_operator_state(pods), nodes, ['gpu-2', 'gpu-3'], TARGET)
    assert v['ok'] is ok, case
    assert bool(v['moved']) is not ok


@pytest.mark.parametrize('args, message', [
    ((None, [], [], TARGET), "gpu_operator: 'NoneType' is not gpu_operator_info's gpu_operator (a dict with nodes)"),
    (({'nodes': {}}, [{'annotations': {}}], [], TARGET),
     'nodes: not a list of fleet_info node views (each a dict with a name)'),
    (({'nodes': {}}, [], 'gpu-1', TARGET), "pending: 'gpu-1' is not a list of node names"),
])
def test_operand_window_verdict_bad_input(args, message):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.operand_window_verdict(*args)
    assert str(err.value) == message


# ---------------------------------------------------------------------------- observation windows (issue 16)

def test_observation_window_is_anchored_at_the_stage_end_and_says_what_is_left_to_wait():
    w = _rollout.observation_window('15m', 1798761600, 1798761700.5)
    assert (w['start'], w['end'], w['seconds'], w['wait']) == ('2027-01-01T00:00:00Z', '2027-01-01T00:15:00Z', 900.0, 800)
    assert _rollout.observation_window('10s', 0, 10)['wait'] == 0 and _rollout.observation_window('10s', 0, 99)['wait'] == 0


@pytest.mark.parametrize('window,message', [
    ('soon', "gpufleet_observation_window: 'soon' is not a duration"),
    ('0s', "gpufleet_observation_window: '0s' must be greater than zero"),
])
def test_observation_window_refuses_what_is_not_a_duration(window, message):
    with pytest.raises(_rollout.RolloutError, match=re.escape(message)):
        _rollout.observation_window(window, 0, 0)


def _observed(name, done=True, ready=True, **kw):
    ann = {_node_record.ANN_DONE: target_key(TARGET)} if done else {}
    return dict({'name': name, 'ready': ready, 'kernel': TARGET['kernel'], 'rke2': TARGET['rke2'], 'annotations': ann}, **kw)


OBS_PLAN = {'target': TARGET, 'canaries': ['c1'], 'batches': [['c1'], ['n1', 'n2'], ['n3']]}
WINDOW = _rollout.observation_window('8s', 1798761600, 1798761600)


def test_observation_verdict_regates_every_node_upgraded_so_far_not_only_the_batch():
    nodes = [_observed('n2'), _observed('c1'), _observed('n1'), _observed('n3', done=False), _observed('other')]
    v = _rollout.observation_verdict(nodes, OBS_PLAN, WINDOW)
    assert v['nodes'] == ['c1', 'n1', 'n2'] and v['passed'] is True and v['failed'] == {}
    assert v['msg'] == ('observation window 2027-01-01T00:00:00Z..2027-01-01T00:00:08Z (8.0 s): all 3 upgraded node(s) '
                        'passed their re-gating (node state and kubelet versions)')


def test_observation_verdict_fails_a_node_that_is_not_ready_changed_underneath_or_lost_its_monitoring():
    nodes = [_observed('c1', ready=False), _observed('n1', kernel='6.8.0-140-generic'), _observed('n2')]
    metric = {'passed': False, 'failed_nodes': ['n2'], 'msg': 'metric gate: FAIL: dcgm_xid: no series of node n2'}
    v = _rollout.observation_verdict(nodes, OBS_PLAN, WINDOW, metric)
    assert v['passed'] is False and v['metric'] == metric['msg']
    assert v['failed'] == {'c1': ['not Ready'],
                           'n1': ['the kubelet reports kernel 6.8.0-140-generic, the target is %s' % TARGET['kernel']],
                           'n2': ['metric gate: ' + metric['msg']]}
    assert v['problems'] == ['c1: not Ready', 'n1: ' + v['failed']['n1'][0], 'n2: metric gate: ' + metric['msg']]
    assert v['msg'].startswith('observation window 2027-01-01T00:00:00Z..2027-01-01T00:00:08Z (8.0 s): 3 of 3 upgraded '
                               'node(s) failed their re-gating: c1: not Ready; n1: ')
    assert v['msg'].endswith('They are cordoned and the rollout stops; roll them back with gpufleet.upgrade.rollback')


def test_observation_verdict_a_metric_failure_that_names_no_node_fails_them_all():
    v = _rollout.observation_verdict([_observed('n1'), _observed('n2')], OBS_PLAN, WINDOW,
                                     {'passed': False, 'failed_nodes': [], 'msg': 'Prometheus: connection refused'})
    assert sorted(v['failed']) == ['n1', 'n2']
    ok = _rollout.observation_verdict([_observed('n1')], OBS_PLAN, WINDOW, {'passed': True, 'failed_nodes': [], 'msg': 'ok'})
    assert ok['passed'] is True and ok['msg'].endswith('(node state and kubelet versions, metric gate)')


def test_observation_verdict_fails_a_node_whose_gpu_gate_failed_on_the_host():
    """Issue 16 (2): every gate re-run in the window, the host's GPU gate too (NVML against the snapshot)."""
    host = {'n1': {'passed': True, 'msg': 'GPU gate: PASS'},
            'n2': {'passed': False, 'msg': 'GPU gate: FAIL: new Xid 79 on GPU 3'}}
    v = _rollout.observation_verdict([_observed('c1'), _observed('n1'), _observed('n2')], OBS_PLAN, WINDOW, None, host)
    assert v['failed'] == {'n2': ['GPU gate: GPU gate: FAIL: new Xid 79 on GPU 3']} and v['passed'] is False
    assert v['host_regated'] == ['n1', 'n2']
    ok = _rollout.observation_verdict([_observed('c1'), _observed('n1')], OBS_PLAN, WINDOW, None, {'n1': host['n1']})
    assert ok['passed'] is True and ok['msg'].endswith('(node state and kubelet versions, GPU gate on 1)')
    # A gate result without a verdict (the read failed) is not a pass.
    bad = _rollout.observation_verdict([_observed('n1')], OBS_PLAN, WINDOW, None, {'n1': {'msg': 'unreachable'}})
    assert bad['failed'] == {'n1': ['GPU gate: unreachable']}
    with pytest.raises(_rollout.RolloutError, match=re.escape("host: ['n1'] is not a mapping of node to GPU gate result")):
        _rollout.observation_verdict([], OBS_PLAN, WINDOW, None, ['n1'])


def test_observation_verdict_fails_a_node_the_node_gate_or_the_workload_gate_failed():
    """Issue 16 (2): the node gate and the plan's workload cases re-run on every node upgraded so far."""
    node_gate = {'passed': False, 'nodes': {'c1': {'passed': True}, 'n1': {'passed': True},
                                            'n2': {'passed': False, 'problems': ['nvidia.com/gpu: allocatable 7, expected 8']}}}
    workload = {'passed': False, 'nodes': {'c1': {'passed': False, 'problems': ['device-query run 1/1: result mismatch']},
                                           'n1': {'passed': True}, 'n2': {'passed': True}}}
    nodes = [_observed('c1'), _observed('n1'), _observed('n2')]
    v = _rollout.observation_verdict(nodes, OBS_PLAN, WINDOW, None, None, node_gate, workload)
    assert v['failed'] == {'c1': ['workload gate: device-query run 1/1: result mismatch'],
                           'n2': ['node gate: nvidia.com/gpu: allocatable 7, expected 8']}
    assert v['node_gated'] == ['c1', 'n1', 'n2'] and v['workload_gated'] == ['c1', 'n1', 'n2']
    passed = {'passed': True, 'nodes': {n: {'passed': True} for n in ('c1', 'n1', 'n2')}}
    ok = _rollout.observation_verdict(nodes, OBS_PLAN, WINDOW, None, None, passed, passed)
    assert ok['passed'] is True and ok['msg'].endswith('(node state and kubelet versions, node gate on 3, workload gate on 3)')
    # A node whose tenants hold every GPU: its case was not run (busy), which fails nothing and is not counted as run.
    busy = {'passed': True, 'nodes': dict(passed['nodes'], n1={'passed': True, 'busy': ['device-query']})}
    some = _rollout.observation_verdict(nodes, OBS_PLAN, WINDOW, None, None, passed, busy)
    assert some['passed'] is True and some['workload_gated'] == ['c1', 'n2'] and some['workload_busy'] == ['n1']
    assert some['msg'].endswith('(node state and kubelet versions, node gate on 3, workload gate on 2, '
                                'workload cases not run on 1 (no free GPU))')
    # A node the node gate never judged (the gate's read failed before it): the gate's failure is not a pass for it.
    broken = _rollout.observation_verdict(nodes, OBS_PLAN, WINDOW, None, None, {'passed': False, 'msg': 'API: 503'})
    assert broken['failed'] == {n: ['node gate: API: 503'] for n in ('c1', 'n1', 'n2')}
    with pytest.raises(_rollout.RolloutError, match=re.escape("node_gate: 'failed' is not a multi-node gate result")):
        _rollout.observation_verdict(nodes, OBS_PLAN, WINDOW, None, None, 'failed')


def test_observation_cases_are_the_plans_names_in_its_order():
    suite = [{'name': 'device-query'}, {'name': 'compute-checksum'}, {'name': 'own'}]
    assert _rollout.observation_cases(suite, None) == []
    assert _rollout.observation_cases(suite, {'cases': ['own', 'device-query'], 'repeat': 1}) == [suite[2], suite[0]]
    with pytest.raises(_rollout.RolloutError, match=re.escape('plan.observation.workloads.cases: nope is no workload case '
                                                              '(the suite and node_upgrade_workload_cases hold: '
                                                              'compute-checksum, device-query, own)')):
        _rollout.observation_cases(suite, {'cases': ['nope']})


def test_observation_hosts_are_the_hosts_this_run_upgraded_with_a_snapshot():
    results = {'h1': {'node': 'n1', 'outcome': 'upgraded', 'snapshot': 'snapshots/n1.json'},
               'h2': {'node': 'n2', 'outcome': 'failed', 'snapshot': 'snapshots/n2.json'},
               'c1': {'outcome': 'upgraded', 'snapshot': 'snapshots/c1.json'},
               'h3': None, 'h4': {'node': 'n4', 'outcome': 'upgraded', 'snapshot': 's'}}
    sel = _rollout.observation_hosts(results, ['c1', 'n1', 'n3'])
    assert sel['hosts'] == ['c1', 'h1'] and sel['nodes'] == {'c1': 'c1', 'h1': 'n1'}
    assert list(sel['not_regated']) == ['n3'] and sel['not_regated']['n3'].startswith('not upgraded by this run')
    # the node gate: each node held to what its own gate expected, else (an earlier run's) to its capacity
    results['h1']['expected_gpus'] = {'nvidia.com/gpu': 8}
    sel = _rollout.observation_hosts(results, ['c1', 'n1', 'n3'])
    assert sel['node_gate'] == {'c1': None, 'n1': {'nvidia.com/gpu': 8}, 'n3': None}
    fixed = _rollout.observation_hosts(results, ['c1', 'n3'], {'nvidia.com/mig-1g.10gb': 56})
    assert fixed['node_gate'] == {'c1': {'nvidia.com/mig-1g.10gb': 56}, 'n3': {'nvidia.com/mig-1g.10gb': 56}}
    with pytest.raises(_rollout.RolloutError, match='expected: '):
        _rollout.observation_hosts(results, [], ['nvidia.com/gpu'])
    with pytest.raises(_rollout.RolloutError, match='results: '):
        _rollout.observation_hosts(['h1'], [])
    with pytest.raises(_rollout.RolloutError, match='upgraded: '):
        _rollout.observation_hosts({}, 'n1')


def test_observation_share_deals_every_host_to_exactly_one_worker():
    hosts = ['h%02d' % i for i in range(7)]
    workers = ['w1', 'w2', 'w3']
    shares = [_rollout.observation_share(hosts, workers, w) for w in workers]
    assert shares == [['h00', 'h03', 'h06'], ['h01', 'h04'], ['h02', 'h05']]
    assert sorted(h for share in shares for h in share) == hosts
    # one worker (a batch of one): every host, in order
    assert _rollout.observation_share(hosts, ['localhost'], 'localhost') == hosts
    # more workers than hosts: some shares are empty
    assert [_rollout.observation_share(['h1'], workers, w) for w in workers] == [['h1'], [], []]
    assert _rollout.observation_share([], workers, 'w2') == []


@pytest.mark.parametrize('hosts,workers,worker,message', [
    ('h1', ['w1'], 'w1', "hosts: 'h1' is not a list of inventory host names"),
    (['h1'], [], 'w1', "worker: 'w1' is not one of the play's active hosts []"),
    (['h1'], ['w1', ''], 'w1', "workers: ['w1', ''] is not a list of inventory host names"),
    (['h1'], ['w1', 'w1'], 'w1', "workers: ['w1', 'w1'] names a host twice"),
    (['h1'], ['w1'], 'w2', "worker: 'w2' is not one of the play's active hosts ['w1']"),
])
def test_observation_share_refuses_bad_input(hosts, workers, worker, message):
    with pytest.raises(_rollout.RolloutError, match=re.escape(message)):
        _rollout.observation_share(hosts, workers, worker)


def test_observation_gpu_gathers_the_shares_and_fails_a_node_nobody_regated():
    regate = {'hosts': ['h1', 'h2', 'h3'], 'nodes': {'h1': 'n1', 'h2': 'n2', 'h3': 'n3'}}
    registered = [{'results': [{'item': 'h1', 'passed': True, 'msg': 'ok'}, {'item': 'h3', 'passed': False, 'msg': 'Xid 79'}]},
                  {'results': [], 'skipped': True}, None]
    gpu = _rollout.observation_gpu(registered, regate)
    assert sorted(gpu) == ['n1', 'n2', 'n3']
    assert gpu['n1']['passed'] is True and gpu['n3'] == {'item': 'h3', 'passed': False, 'msg': 'Xid 79'}
    assert gpu['n2']['passed'] is False and 'did not run on it' in gpu['n2']['msg']
    # the verdict fails the node nobody re-gated beside the one whose gate failed
    regate_plan = {'hosts': ['h1', 'h2'], 'nodes': {'h1': 'n1', 'h2': 'n2'}}
    v = _rollout.observation_verdict([_observed('n1'), _observed('n2')], OBS_PLAN, WINDOW, None,
                                     _rollout.observation_gpu([{'results': [registered[0]['results'][0]]}], regate_plan))
    assert v['passed'] is False and sorted(v['failed']) == ['n2'] and 'did not run on it' in v['failed']['n2'][0]
    # an unreachable node's result (ignore_unreachable) has no passed: it does not pass either
    gpu = _rollout.observation_gpu([{'results': [{'item': 'h1', 'unreachable': True, 'msg': 'ssh: timeout'}]}],
                                   {'hosts': ['h1'], 'nodes': {'h1': 'n1'}})
    assert gpu == {'n1': {'item': 'h1', 'unreachable': True, 'msg': 'ssh: timeout'}}
    assert _rollout.observation_gpu([], {'hosts': [], 'nodes': {}}) == {}


@pytest.mark.parametrize('registered,regate,message', [
    ([], {'hosts': ['h1']}, "regate: {'hosts': ['h1']} is not observation_hosts' selection (hosts, nodes)"),
    ({'results': []}, {'hosts': [], 'nodes': {}}, "registered: {'results': []} is not a list of the workers' loop results"),
    (['x'], {'hosts': [], 'nodes': {}}, "registered: 'x' is not a loop result (results)"),
    ([{'results': [{'item': 'h9'}]}], {'hosts': ['h1'], 'nodes': {'h1': 'n1'}},
     "registered: a GPU gate result for 'h9', which is not a host to re-gate ['h1']"),
    ([{'results': [{'item': 'h1'}]}, {'results': [{'item': 'h1'}]}], {'hosts': ['h1'], 'nodes': {'h1': 'n1'}},
     "registered: two GPU gate results for host 'h1'"),
])
def test_observation_gpu_refuses_bad_input(registered, regate, message):
    with pytest.raises(_rollout.RolloutError, match=re.escape(message)):
        _rollout.observation_gpu(registered, regate)


@pytest.mark.parametrize('nodes,plan,window,metric,message', [
    ([], {'batches': []}, WINDOW, None, 'plan: has no target tuple'),
    (['n1'], OBS_PLAN, WINDOW, None, "nodes: ['n1'] is not a list of fleet_info node views"),
    ([], OBS_PLAN, '8s', None, "window: '8s' is not an observation window"),
    ([], OBS_PLAN, WINDOW, 'failed', "metric: 'failed' is not a metric gate result"),
])
def test_observation_verdict_names_the_bad_input(nodes, plan, window, metric, message):
    with pytest.raises(_rollout.RolloutError, match=re.escape(message)):
        _rollout.observation_verdict(nodes, plan, window, metric)


TRAFFIC = {'name': 'traffic', 'expr': 'sum(rate(requests_total[5m]))', 'limit': 1e12, 'direction': 'any',
           'count_expr': 'sum(increase(requests_total[$window]))', 'min_count': 1000}


def test_observation_settings_take_the_plan_window_and_queries_over_the_runs():
    run = _rollout.observation_settings(OBS_PLAN, '15m', {})
    assert run == {'window': '15m', 'seconds': 900.0, 'queries': [], 'gate_queries': [], 'metric': False, 'source': 'run',
                   'workloads': None}
    assert _rollout.observation_settings(OBS_PLAN, '15m', {'url': 'http://prom:9090', 'presets': ['xid']})['metric']
    plan = dict(OBS_PLAN, observation={'window': '2h', 'queries': [TRAFFIC]})
    own = {'name': 'errors', 'expr': 'sum(rate(errors_total[5m]))', 'limit': 0}
    got = _rollout.observation_settings(plan, '15m', {'url': 'http://prom:9090', 'queries': [own]})
    assert got == {'window': '2h', 'seconds': 7200.0, 'queries': [TRAFFIC], 'gate_queries': [own, TRAFFIC],
                   'metric': True, 'source': 'plan', 'workloads': None}
    cases = _rollout.observation_settings(dict(OBS_PLAN, observation={'workloads': {'cases': ['device-query']}}), '15m', {})
    assert cases['workloads'] == {'cases': ['device-query'], 'repeat': 1}


@pytest.mark.parametrize('plan,window,gate,message', [
    (dict(OBS_PLAN, observation={'queries': [TRAFFIC]}), '15m', {},
     'the plan declares observation queries (traffic) but node_upgrade_metric_gate has no url'),
    (dict(OBS_PLAN, observation={'queries': [TRAFFIC]}), '15m', {'presets': ['xid']}, 'has no url'),
    (OBS_PLAN, 'soon', {}, "gpufleet_observation_window: 'soon' is not a duration"),
    (dict(OBS_PLAN, observation={'window': '0s'}), '15m', {}, "plan.observation.window: '0s' must be greater than zero"),
    (dict(OBS_PLAN, observation=['2h']), '15m', {}, "plan.observation: ['2h'] is not a mapping"),
    (OBS_PLAN, '15m', 'http://prom', "node_upgrade_metric_gate: 'http://prom' is not a mapping"),
    (dict(OBS_PLAN, observation={'queries': [TRAFFIC]}), '15m', {'url': 'u', 'queries': [TRAFFIC]},
     "observation queries: traffic named both in node_upgrade_metric_gate.queries and in the plan's"),
    # Found by test_fuzz_parsers.py (TypeError or ValueError in the filter before).
    (dict(OBS_PLAN, observation={'queries': 7}), '15m', {'url': 'u'},
     'plan.observation.queries: 7 is not a non-empty list of metric_gate queries'),
    (dict(OBS_PLAN, observation={'workloads': {'cases': ['device-query'], 'repeat': 'x'}}), '15m', {},
     "plan.observation.workloads.repeat: 'x' is not a whole number >= 1"),
    (OBS_PLAN, '15m', {'url': 'u', 'queries': 3}, 'node_upgrade_metric_gate.queries: 3 is not a list of metric_gate queries'),
])
def test_observation_settings_refuse_what_would_fail_at_the_end_of_a_window(plan, window, gate, message):
    with pytest.raises(_rollout.RolloutError, match=re.escape(message)):
        _rollout.observation_settings(plan, window, gate)


def _traffic_result(value, passed=False, critical=True, name='traffic'):
    return {'name': name, 'passed': passed, 'critical': critical,
            'count': {'expr': 'sum(increase(requests_total[900s]))', 'min': 1000.0, 'value': value}}


def test_observation_verdict_too_little_traffic_is_inconclusive_and_blames_no_node():
    metric = {'passed': False, 'failed_nodes': ['n1', 'n2'], 'queries': [_traffic_result(12.0), _traffic_result(
        None, name='steps')], 'msg': 'metric gate: FAIL: traffic: count 12 < min_count 1000 (the window proves nothing)'}
    v = _rollout.observation_verdict([_observed('n1'), _observed('n2')], OBS_PLAN, WINDOW, metric)
    assert v['passed'] is False and v['failed'] == {} and v['inconclusive'] == ['traffic', 'steps']
    assert v['problems'] == ['inconclusive: too little traffic (traffic, steps)']
    assert 'inconclusive, too little traffic in the window (metric gate: FAIL: traffic: count 12' in v['msg']
    assert 'the rollout stops before the next stage; no node is cordoned' in v['msg']
    # A node that is not Ready still fails, traffic or not.
    v = _rollout.observation_verdict([_observed('n1', ready=False), _observed('n2')], OBS_PLAN, WINDOW, metric)
    assert v['failed'] == {'n1': ['not Ready']} and v['passed'] is False and 'They are cordoned' in v['msg']


def test_observation_verdict_a_failed_comparison_with_enough_traffic_is_not_inconclusive():
    # One query short of traffic, another (a preset, the control group) failed on its own: nodes are failed.
    metric = {'passed': False, 'failed_nodes': ['n2'], 'msg': 'metric gate: FAIL: dcgm_xid: n2',
              'queries': [_traffic_result(12.0), {'name': 'dcgm_xid', 'passed': False, 'critical': True}]}
    v = _rollout.observation_verdict([_observed('n1'), _observed('n2')], OBS_PLAN, WINDOW, metric)
    assert v['inconclusive'] == [] and sorted(v['failed']) == ['n2']
    # Enough traffic: the count is not the failure; a non-critical traffic shortfall is only reported.
    metric = {'passed': False, 'failed_nodes': ['n1', 'n2'], 'msg': 'metric gate: FAIL: control',
              'queries': [_traffic_result(5000.0), _traffic_result(3.0, critical=False, name='batch-jobs')]}
    v = _rollout.observation_verdict([_observed('n1'), _observed('n2')], OBS_PLAN, WINDOW, metric)
    assert v['inconclusive'] == [] and sorted(v['failed']) == ['n1', 'n2']


# Review 2026-12-06 T3-16: plan_nodes raised TypeError on a plan whose canaries were not a list.
@pytest.mark.parametrize('plan,message', [
    ({'canaries': 1.5, 'batches': [['gpu-01']]}, 'plan.canaries: 1.5 is not a list of node names'),
    ({'canaries': ['gpu-01', 3], 'batches': [['gpu-01']]}, "plan.canaries: ['gpu-01', 3] is not a list of node names"),
    ({'batches': [['gpu-01', {'a': None}]]}, "plan.batches[0]: ['gpu-01', {'a': None}] is not a list of node names"),
])
def test_plan_nodes_refuses_a_malformed_plan_naming_the_field(plan, message):
    with pytest.raises(_rollout.RolloutError) as err:
        _rollout.plan_nodes(plan)
    assert str(err.value) == message
