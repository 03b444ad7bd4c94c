"""The workload suite (issue 16, item 1): annotated Job manifests become workload_gate cases; the shipped
suite parses, every case predeclares its expectation, and the gate's own validation accepts them."""
from __future__ import annotations

import copy
import pathlib

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _workload_suite as W
from ansible_collections.gpufleet.upgrade.plugins.module_utils._workload_gate import compare, extract, normalize_cases

SUITE = pathlib.Path(__file__).resolve().parents[4] / 'roles' / 'node_upgrade' / 'files' / 'workloads'


def shipped():
    return [yaml.safe_load(p.read_text()) for p in sorted(SUITE.glob('*.yml'))]


def test_the_shipped_suite_has_the_cases_the_issue_lists_and_the_gate_accepts_them():
    out = W.cases(shipped(), gpus=8)
    assert out['names'] == ['checkpoint-io', 'compute-checksum', 'device-query', 'model-infer', 'nccl-allreduce',
                            'partition-discovery']
    assert out['skipped'] == []
    gate_cases = normalize_cases(out['cases'])        # what workload_gate itself validates
    by = {c['name']: c for c in gate_cases}
    assert by['compute-checksum']['expected'] == 8589934592 and by['compute-checksum']['tolerance'] == 0
    assert by['checkpoint-io']['expected'] == 549755289600
    assert by['device-query']['result'] == {'regex': 'Detected (?P<value>[0-9]+) CUDA Capable device'}
    assert by['model-infer']['result'] == {'json_path': 'p99_ms'} and by['model-infer']['tolerance'] == 25
    # each requests GPUs for real (the scheduler allocates them)
    for c in gate_cases:
        limits = c['manifest']['spec']['template']['spec']['containers'][0]['resources']['limits']
        assert int(limits['nvidia.com/gpu']) == (2 if c['name'] == 'nccl-allreduce' else 1)


def test_the_shipped_expectations_judge_what_a_healthy_gpu_prints():
    """The values are exact where the input is known: what a correct run prints passes, a wrong one fails."""
    by = {c['name']: c for c in W.cases(shipped(), gpus=8)['cases']}
    outputs = {
        'device-query': ('Device 0: "NVIDIA H100 80GB HBM3"\nDetected 1 CUDA Capable device(s)\nResult = PASS', True),
        'compute-checksum': ('{"checksum": 8589934592.0}', True),
        'checkpoint-io': ('{"checksum": 549755289600.0, "same": true}', True),
        'model-infer': ('{"p99_ms": 3.2, "p50_ms": 2.9}', True),
        'partition-discovery': ('GPU 0: NVIDIA H100 (UUID: GPU-1)\n{"devices": 1, "mig": false}', True),
        'nccl-allreduce': ('{"allreduce": 2.0, "world": 2}', True),
    }
    for name, (log, ok) in outputs.items():
        value, error = extract(log, by[name]['result'])
        assert error is None, (name, error)
        assert compare(value, by[name]['expected'], by[name].get('tolerance', 0))[0] is ok, name
    assert not compare(extract('{"checksum": 8589934591.0}', by['compute-checksum']['result'])[0], 8589934592, 0)[0]
    assert not compare(extract('{"p99_ms": 75.0}', by['model-infer']['result'])[0], 25, 25)[0]
    assert not compare(extract('Detected 2 CUDA Capable device(s)', by['device-query']['result'])[0], 1, 0)[0]


def test_min_gpus_and_optional_skips_are_said():
    out = W.cases(shipped(), gpus=1)
    assert out['skipped'] == [{'name': 'nccl-allreduce', 'reason': 'needs 2 GPUs, the node has 1'}]
    out = W.cases(shipped(), gpus=8, skip=['nccl-allreduce'])
    assert out['skipped'] == [{'name': 'nccl-allreduce', 'reason': 'skipped by name (optional)'}]
    assert 'nccl-allreduce' not in out['names'] and len(out['cases']) == 5
    assert W.cases(shipped())['skipped'] == []            # GPUs unknown: nothing skipped for it


def _job(**ann):
    return {'apiVersion': 'batch/v1', 'kind': 'Job', 'metadata': {'name': 'x', 'annotations': ann},
            'spec': {'template': {'spec': {'containers': [{'name': 'm', 'image': 'i'}]}}}}


@pytest.mark.parametrize('manifests,kwargs,message', [
    ('x', {}, "manifests: 'x' is not a list of Job manifests"),
    ([], {}, 'manifests: the suite is empty (no *.yml Job manifest in its directory)'),
    ([{'kind': 'Pod', 'apiVersion': 'v1'}], {}, 'manifests[0]: not a batch/v1 Job manifest'),
    ([_job()], {}, 'manifests[0] (x): annotation gpufleet.io/expected is missing'),
    ([_job(**{'gpufleet.io/expected': '1', 'gpufleet.io/tolerence': '1'})], {},
     'manifests[0] (x): unknown annotation(s) gpufleet.io/tolerence'),
    ([_job(**{'gpufleet.io/expected': '1', 'gpufleet.io/tolerance': 'lots'})], {},
     "manifests[0] (x): annotation gpufleet.io/tolerance: 'lots' is not a number"),
    ([_job(**{'gpufleet.io/expected': '1', 'gpufleet.io/result-regex': '('})], {},
     "manifests[0] (x): annotation gpufleet.io/result-regex: '(' does not compile"),
    ([_job(**{'gpufleet.io/expected': '1', 'gpufleet.io/result-regex': 'a', 'gpufleet.io/result-json-path': 'b'})], {},
     'not both'),
    ([_job(**{'gpufleet.io/expected': '1', 'gpufleet.io/min-gpus': 'two'})], {},
     "annotation gpufleet.io/min-gpus: 'two' is not a whole number >= 1"),
    ([_job(**{'gpufleet.io/expected': '1', 'gpufleet.io/optional': 'yes'})], {},
     "annotation gpufleet.io/optional: 'yes' is not \"true\" or \"false\""),
    ([_job(**{'gpufleet.io/expected': 1})], {}, 'annotation gpufleet.io/expected: 1 is not a string'),
    ([_job(**{'gpufleet.io/expected': '1', 'gpufleet.io/case': 'Bad_Name'})], {}, "the case name 'Bad_Name'"),
    ([_job(**{'gpufleet.io/expected': '1'})] * 2, {}, 'manifests: case name(s) x repeat'),
    ([_job(**{'gpufleet.io/expected': '1'})], {'skip': ['y']}, 'skip: y is no case of the suite (cases: x)'),
    ([_job(**{'gpufleet.io/expected': '1'})], {'skip': ['x']}, 'skip: x is not optional'),
    ([_job(**{'gpufleet.io/expected': '1'})], {'gpus': -1}, 'gpus: -1 is not a whole number of GPUs'),
])
def test_bad_suites_name_the_case_and_the_annotation(manifests, kwargs, message):
    with pytest.raises(W.SuiteError) as err:
        W.cases(copy.deepcopy(manifests), **kwargs)
    assert message in str(err.value)


def test_expected_is_json_else_the_text():
    second = dict(_job(), metadata={'name': 'y', 'annotations': {'gpufleet.io/expected': '"2"'}})
    out = W.cases([_job(**{'gpufleet.io/expected': 'PASS'}), second])
    assert [c['expected'] for c in out['cases']] == ['PASS', '2']


# -- an air-gapped site's registry (issue 39 item 7) ------------------------------------------------
MIRROR = {'nvcr.io/': 'registry.example:5000/nvcr/', 'nvcr.io/nvidia/k8s/': 'registry.example:5000/k8s/',
          'docker.io/rancher/': 'registry.example:5000/rancher/'}


@pytest.mark.parametrize('image,want', [
    ('nvcr.io/nvidia/pytorch:25.01-py3', 'registry.example:5000/nvcr/nvidia/pytorch:25.01-py3'),
    ('nvcr.io/nvidia/k8s/cuda-sample:devicequery', 'registry.example:5000/k8s/cuda-sample:devicequery'),  # longest
    ('rancher/rke2-upgrade', 'registry.example:5000/rancher/rke2-upgrade'),          # docker.io spelled out
    ('quay.io/other/image:1', 'quay.io/other/image:1'),                             # no rule: as written
    ('busybox', 'busybox'),
])
def test_mirrored(image, want):
    assert W.mirrored(image, MIRROR) == want
    assert W.mirrored(image, {}) == image and W.mirrored(image, None) == image


def test_mirrored_library_images_and_bad_input():
    assert W.mirrored('busybox:1.36', {'docker.io/library/': 'm.local/lib/'}) == 'm.local/lib/busybox:1.36'
    with pytest.raises(W.SuiteError, match="image_mirror: 'nvcr.io/': '' is not a non-empty prefix"):
        W.mirrored('nvcr.io/x', {'nvcr.io/': ''})
    with pytest.raises(W.SuiteError, match='image_mirror: .* is not a mapping'):
        W.mirrored('nvcr.io/x', ['nvcr.io/'])
    with pytest.raises(W.SuiteError, match='image: None is not an image reference'):
        W.mirrored(None, MIRROR)


def test_every_image_of_the_shipped_suite_comes_from_the_mirror():
    manifests = shipped()
    out = W.cases(manifests, 8, image_mirror=MIRROR)
    images = [c['image'] for case in out['cases'] for c in case['manifest']['spec']['template']['spec']['containers']]
    assert images and all(i.startswith('registry.example:5000/') for i in images), images
    # the manifests given are not changed in place
    assert all(c['image'].startswith('nvcr.io/') for m in manifests for c in m['spec']['template']['spec']['containers'])
