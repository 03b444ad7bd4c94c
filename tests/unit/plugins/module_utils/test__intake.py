from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpufleet.upgrade.plugins.module_utils._intake import (
    IntakeError, canonical, check_intake, parse_field_path, resolve)

QUOTA = {'apiVersion': 'v1', 'kind': 'ResourceQuota',
         'metadata': {'name': 'gpu-intake', 'namespace': 'tenant-a', 'uid': 'u-1', 'resourceVersion': '42'},
         'spec': {'hard': {'requests.nvidia.com/gpu': '0', 'pods': '100'}}}
BINDING = {'apiVersion': 'admissionregistration.k8s.io/v1', 'kind': 'ValidatingAdmissionPolicyBinding',
           'metadata': {'name': 'deny-gpu-vmi'},
           'spec': {'policyName': 'deny-gpu-vmi', 'validationActions': ['Deny']}}
NS = {'apiVersion': 'v1', 'kind': 'Namespace',
      'metadata': {'name': 'tenant-b', 'labels': {'gpufleet.io/intake': 'closed'}}}


def qcheck(**kw):
    c = {'api_version': 'v1', 'kind': 'ResourceQuota', 'name': 'gpu-intake', 'namespace': 'tenant-a',
         'field': 'spec.hard["requests.nvidia.com/gpu"]', 'closed_values': ['0']}
    c.update(kw)
    return c


@pytest.mark.parametrize('path,parts', [
    ('spec.hard["requests.nvidia.com/gpu"]', ['spec', 'hard', 'requests.nvidia.com/gpu']),
    ("metadata.labels['gpufleet.io/intake']", ['metadata', 'labels', 'gpufleet.io/intake']),
    ('spec.validationActions[0]', ['spec', 'validationActions', 0]),
    ('a[1][2].b', ['a', 1, 2, 'b']),
    ('spec', ['spec']),
    ('["weird key"].x', ['weird key', 'x']),
])
def test_parse_field_path(path, parts):
    assert parse_field_path(path) == parts


@pytest.mark.parametrize('path,msg', [
    ('', "field: '' is not a field path such as spec.hard[\"requests.nvidia.com/gpu\"]"),
    ('spec..hard', "field: 'spec..hard' has an empty segment at position 5"),
    ('spec.', "field: 'spec.' ends with a dot"),
    ('spec.hard["x', "field: 'spec.hard[\"x' has an unterminated quoted key at position 9"),
    ('spec[x]', "field: 'spec[x]' has a bracket at position 4 that holds neither a quoted key nor a list index"),
    ('spec hard', "field: 'spec hard' needs a dot or a bracket before position 4"),
    ('spec.h@rd', "field: 'spec.h@rd' needs a dot or a bracket before position 6"),
    ('spec.@', "field: 'spec.@' has an unexpected character '@' at position 5"),
    ('spec[0]hard', "field: 'spec[0]hard' needs a dot or a bracket before position 7"),
])
def test_parse_field_path_errors(path, msg):
    with pytest.raises(IntakeError) as exc:
        parse_field_path(path)
    assert str(exc.value) == msg


@given(st.lists(st.one_of(st.text(alphabet='abcXYZ09_-', min_size=1, max_size=6),
                          st.text(alphabet='ab./ -', min_size=1, max_size=6).filter(lambda s: '"]' not in s),
                          st.integers(0, 9)), min_size=1, max_size=5).filter(lambda ps: not isinstance(ps[0], int)))
def test_parse_round_trip(parts):
    text = ''
    for p in parts:
        if isinstance(p, int):
            text += '[%d]' % p
        elif all(c.isalnum() or c in '_-' for c in p):
            text += ('.' if text else '') + p
        else:
            text += '["%s"]' % p
    assert parse_field_path(text) == parts


def test_resolve_reports_where_it_stopped():
    assert resolve(QUOTA, ['spec', 'hard', 'requests.nvidia.com/gpu'])[0] == '0'
    assert resolve(QUOTA, ['spec', 'hard', 'limits.nvidia.com/gpu'])[1] == 'spec.hard["limits.nvidia.com/gpu"]'
    assert resolve(BINDING, ['spec', 'validationActions', 3])[1] == 'spec.validationActions[3]'


def test_canonical():
    assert canonical(0) == canonical('0') == canonical(0.0) == '0'
    assert canonical(True) == 'true' and canonical(False) == 'false'
    assert canonical(['Deny']) == ['Deny'] and canonical(None) == 'null'


def test_all_closed_with_evidence():
    res = check_intake([qcheck(), {'api_version': 'admissionregistration.k8s.io/v1',
                                   'kind': 'ValidatingAdmissionPolicyBinding', 'name': 'deny-gpu-vmi',
                                   'field': 'spec.validationActions', 'closed_values': [['Deny']]},
                        {'api_version': 'v1', 'kind': 'Namespace', 'name': 'tenant-b',
                         'field': "metadata.labels['gpufleet.io/intake']", 'closed_values': ['closed'],
                         'description': 'tenant-b onboarding gate'}],
                       [NS, BINDING, QUOTA])
    assert res.closed is True
    assert res.summary == 'GPU intake closed: 3/3 check(s) closed'
    first = res.checks[0].as_dict()
    assert first['status'] == 'closed' and first['closed'] is True and first['value'] == '0'
    assert first['uid'] == 'u-1' and first['resource_version'] == '42' and first['namespace'] == 'tenant-a'
    assert first['reason'] == 'v1 ResourceQuota tenant-a/gpu-intake spec.hard["requests.nvidia.com/gpu"] = \'0\' is a closed value'
    assert res.checks[2].description == 'tenant-b onboarding gate'


def test_numeric_closed_value_matches_string_quantity():
    assert check_intake([qcheck(closed_values=[0])], [QUOTA]).closed is True


def test_open_value_fails():
    quota = {**QUOTA, 'spec': {'hard': {'requests.nvidia.com/gpu': '8'}}}
    res = check_intake([qcheck()], [quota])
    assert res.closed is False and res.checks[0].status == 'open' and res.checks[0].value == '8'
    assert res.summary == ("GPU intake NOT closed: 1/1 check(s) open or missing: v1 ResourceQuota tenant-a/gpu-intake "
                           "spec.hard[\"requests.nvidia.com/gpu\"] = '8' is not one of the closed values ['0']")


def test_missing_object_and_field_are_not_closed():
    res = check_intake([qcheck(), qcheck(field='spec.hard["limits.nvidia.com/gpu"]'),
                        qcheck(namespace='tenant-z')], [QUOTA])
    assert [c.status for c in res.checks] == ['closed', 'missing_field', 'missing_object']
    assert res.closed is False
    assert res.checks[1].reason == ('v1 ResourceQuota tenant-a/gpu-intake has no spec.hard["limits.nvidia.com/gpu"] '
                                    '(stopped at spec.hard["limits.nvidia.com/gpu"]): not closed')
    assert res.checks[2].reason == 'v1 ResourceQuota tenant-z/gpu-intake not found: intake is not proven closed'


def test_match_requires_api_version_kind_and_namespace():
    other_ns = {**QUOTA, 'metadata': {**QUOTA['metadata'], 'namespace': 'tenant-x'}}
    assert check_intake([qcheck()], [other_ns]).checks[0].status == 'missing_object'
    assert check_intake([qcheck(api_version='v2')], [QUOTA]).checks[0].status == 'missing_object'
    # cluster-scoped check does not match a namespaced object of the same name
    assert check_intake([qcheck(namespace=None)], [QUOTA]).checks[0].status == 'missing_object'


@pytest.mark.parametrize('checks,objects,msg', [
    ([], [], 'checks: [] must be a non-empty list'),
    ([qcheck(closed_values=[])], [], 'checks[0].closed_values: [] must be a non-empty list'),
    ([qcheck(kind=None)], [], 'checks[0].kind is required'),
    ([qcheck(field='spec..x')], [], "checks[0].field: 'spec..x' has an empty segment"),
    ([qcheck()], {'a': 1}, "objects: {'a': 1} is not a list"),
    ([qcheck()], ['x'], "objects[0]: 'x' is not a Kubernetes object"),
    (['x'], [], "checks[0]: 'x' is not a mapping"),
])
def test_bad_input(checks, objects, msg):
    with pytest.raises(IntakeError) as exc:
        check_intake(checks, objects)
    assert str(exc.value).startswith(msg)
