"""Workload gate helpers: case checks, the pinned Job, result extraction and comparison, init failures."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _workload_gate as W

JOB = {'apiVersion': 'batch/v1', 'kind': 'Job',
       'metadata': {'name': 'ignored', 'labels': {'team': 'ml'}, 'resourceVersion': '7'},
       'spec': {'template': {'metadata': {'labels': {'app': 'matmul'}},
                             'spec': {'containers': [{'name': 'main', 'image': 'registry.local/matmul:1'}],
                                      'nodeSelector': {'nvidia.com/gpu.present': 'true'},
                                      'tolerations': [{'key': 'nvidia.com/gpu', 'operator': 'Exists'}]}}}}


def case(**kw):
    c = {'name': 'matmul', 'manifest': copy.deepcopy(JOB), 'expected': 42.0}
    c.update(kw)
    return W.normalize_cases([c])[0]


def test_build_job_pins_labels_and_bounds():
    job = W.build_job(case(), 'gpu-07', 1, 'abc123', 'gate', {'kubernetes.io/hostname': 'gpu-07'},
                      W.DEFAULT_TOLERATION, 300)
    meta = job['metadata']
    assert meta['name'] == 'matmul-abc123-2' and meta['namespace'] == 'gate' and 'resourceVersion' not in meta
    assert meta['labels'] == {'team': 'ml', 'gpufleet.io/workload-gate': 'abc123',
                              'gpufleet.io/workload-case': 'matmul', 'gpufleet.io/node': 'gpu-07'}
    spec = job['spec']
    assert (spec['backoffLimit'], spec['activeDeadlineSeconds'], spec['ttlSecondsAfterFinished']) == (0, 300, 3600)
    pspec = spec['template']['spec']
    assert pspec['nodeSelector'] == {'nvidia.com/gpu.present': 'true', 'kubernetes.io/hostname': 'gpu-07'}
    assert pspec['tolerations'] == [{'key': 'nvidia.com/gpu', 'operator': 'Exists'}, W.DEFAULT_TOLERATION,
                                    W.CORDON_TOLERATION]
    assert pspec['restartPolicy'] == 'Never'
    assert spec['template']['metadata']['labels']['gpufleet.io/workload-case'] == 'matmul'
    # the user's manifest is untouched
    assert JOB['metadata']['name'] == 'ignored' and 'nodeSelector' in JOB['spec']['template']['spec']
    assert 'kubernetes.io/hostname' not in JOB['spec']['template']['spec']['nodeSelector']


def test_build_job_node_label_is_a_valid_label_value():
    node = 'gpu-' + 'x' * 58 + '.rack-1.example.com'
    job = W.build_job(case(), node, 0, 'r', 'ns', {}, W.DEFAULT_TOLERATION, 300)
    value = job['metadata']['labels']['gpufleet.io/node']
    assert value == node[:62] and len(value) <= 63 and value[-1].isalnum()


def test_build_job_keeps_a_shorter_deadline():
    c = case()
    c['manifest']['spec']['activeDeadlineSeconds'] = 60
    job = W.build_job(c, 'gpu-07', 0, 'r', 'ns', {}, W.DEFAULT_TOLERATION, 300, tolerate_cordon=False)
    assert job['spec']['activeDeadlineSeconds'] == 60
    assert job['spec']['template']['spec']['tolerations'][-1] == W.DEFAULT_TOLERATION
    assert W.CORDON_TOLERATION not in job['spec']['template']['spec']['tolerations']


@pytest.mark.parametrize('log, result, value', [
    ('start\nloss 0.25\nsum=42.000\n', {}, 'sum=42.000'),
    ('sum=41\nsum=42.5\n', {'regex': r'sum=(\S+)'}, '42.5'),
    ('x tput=900 y\n', {'regex': r'tput=(?P<value>\d+)'}, '900'),
    ('PASSED\n', {'regex': r'PASSED'}, 'PASSED'),
    ('noise\n{"metrics": {"loss": 0.125, "top": [1, 2]}}\n', {'json_path': 'metrics.loss'}, 0.125),
    ('{"metrics": {"top": [1, 2]}}', {'json_path': 'metrics.top.1'}, 2),
    ('{"a": 1}\n{"a": 2}\nnot json {\n', {'json_path': 'a'}, 2),
])
def test_extract(log, result, value):
    assert W.extract(log, result) == (value, None)


@pytest.mark.parametrize('log, result, error', [
    ('', {}, 'the log is empty'),
    ('sum=\n', {'regex': r'tput=(\d+)'}, "no log line matches 'tput=(\\\\d+)'"),
    ('plain\n', {'json_path': 'a'}, 'no JSON line in the log'),
    ('{"a": 1}', {'json_path': 'b'}, "the JSON result has no 'b'"),
])
def test_extract_errors(log, result, error):
    assert W.extract(log, result) == (None, error)


def test_compare():
    assert W.compare('42.0004', 42, tolerance=0.001)[0] is True
    ok, detail = W.compare('42.1', 42, tolerance=0.001)
    assert ok is False and detail == '42.1 vs expected 42: |difference| 0.1 > tolerance 0.001'
    assert W.compare(99.0, 100, tolerance_percent=1)[0] is True
    assert W.compare(98.9, 100, tolerance_percent=1)[0] is False
    assert W.compare('nan', 1)[0] is False
    assert W.compare('abc', 1) == (False, "result 'abc' is not a number (expected 1)")
    assert W.compare('PASSED ', 'PASSED')[0] is True
    assert W.compare({'b': 1, 'a': 2}, '{"a": 2, "b": 1}')[0] is True
    assert W.compare([1, 2], [1, 2])[0] is True and W.compare([1, 2], [2, 1])[0] is False


def test_pod_failure():
    assert W.pod_failure({'status': {'phase': 'Running'}}) is None
    pod = {'metadata': {'name': 'p'}, 'status': {'initContainerStatuses': [
        {'name': 'cuda-init', 'state': {'terminated': {'exitCode': 3, 'reason': 'Error'}}}]}}
    assert W.pod_failure(pod) == 'init container cuda-init of pod p exited 3 (Error)'
    pod = {'metadata': {'name': 'p'}, 'status': {'initContainerStatuses': [
        {'name': 'cuda-init', 'state': {'waiting': {'reason': 'CrashLoopBackOff', 'message': 'back-off 10s'}}}]}}
    assert W.pod_failure(pod) == 'init container cuda-init of pod p: CrashLoopBackOff: back-off 10s'
    pod = {'metadata': {'name': 'p'}, 'status': {'containerStatuses': [
        {'name': 'main', 'state': {'waiting': {'reason': 'ImagePullBackOff'}}}]}}
    assert W.pod_failure(pod) == 'container main of pod p did not start: ImagePullBackOff'
    pod = {'metadata': {'name': 'p'}, 'status': {'containerStatuses': [
        {'name': 'main', 'state': {'waiting': {'reason': 'ContainerCreating'}}}]}}
    assert W.pod_failure(pod) is None


@pytest.mark.parametrize('cases, message', [
    ([], 'cases: [] is not a non-empty list'),
    ([{'name': 'Bad_Name', 'manifest': JOB, 'expected': 1}], "cases[0].name: 'Bad_Name' is not a lowercase DNS label"),
    ([{'name': 'a', 'manifest': dict(JOB, kind='Pod'), 'expected': 1}],
     "cases[0] (a).manifest: not a batch/v1 Job manifest (kind 'Pod', apiVersion 'batch/v1')"),
    ([{'name': 'a', 'manifest': JOB}], 'cases[0] (a).expected: missing'),
    ([{'name': 'a', 'manifest': JOB, 'expected': 'x', 'tolerance': 1}],
     "cases[0] (a).tolerance: a tolerance needs a numeric expected value, got 'x'"),
    ([{'name': 'a', 'manifest': JOB, 'expected': 1, 'tolerance': -1}],
     'cases[0] (a).tolerance: -1 is not a non-negative number'),
    ([{'name': 'a', 'manifest': JOB, 'expected': 1, 'result': {'regex': '('}}], "cases[0] (a).result.regex: '(' does not compile"),
    ([{'name': 'a', 'manifest': JOB, 'expected': 1, 'result': {'regex': 'x', 'json_path': 'y'}}],
     'must be a dict with regex or json_path (not both)'),
    ([{'name': 'a', 'manifest': JOB, 'expected': 1}, {'name': 'a', 'manifest': JOB, 'expected': 1}],
     "cases[1].name: 'a' repeats an earlier case"),
])
def test_bad_cases(cases, message):
    with pytest.raises(W.WorkloadGateError) as exc:
        W.normalize_cases(cases)
    assert message in str(exc.value)
