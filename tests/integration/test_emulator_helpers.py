"""The emulator's pure helpers: selectors, patches, PDB arithmetic, ages, protobuf."""
from __future__ import annotations

import datetime

import pytest

from emulator import patching, policy, protobuf, selectors, tables


@pytest.mark.parametrize('text, labels, expected', [
    ('a=b', {'a': 'b'}, True),
    ('a==b', {'a': 'c'}, False),
    ('a!=b', {}, True),
    ('a in (x, y)', {'a': 'y'}, True),
    ('a notin (x,y)', {'a': 'y'}, False),
    ('a notin (x,y)', {}, True),
    ('a,!b', {'a': '1'}, True),
    ('a,!b', {'a': '1', 'b': '2'}, False),
    ('nvidia.com/gpu.present=true,node-role.kubernetes.io/worker', {'nvidia.com/gpu.present': 'true',
                                                                    'node-role.kubernetes.io/worker': ''}, True),
    ('', {'x': 'y'}, True),
])
def test_label_selectors(text, labels, expected):
    assert selectors.parse_label_selector(text)(labels) is expected


@pytest.mark.parametrize('bad', ['a in x', 'a=b=c', '!a in (x)', '(a)'])
def test_bad_label_selectors(bad):
    with pytest.raises(selectors.SelectorError):
        selectors.parse_label_selector(bad)


def test_structured_selectors():
    sel = selectors.label_selector_from_dict({'matchLabels': {'app': 'x'}, 'matchExpressions': [
        {'key': 'tier', 'operator': 'In', 'values': ['gpu']}, {'key': 'skip', 'operator': 'DoesNotExist'}]})
    assert sel({'app': 'x', 'tier': 'gpu'}) and not sel({'app': 'x', 'tier': 'cpu'})
    assert not sel({'app': 'x', 'tier': 'gpu', 'skip': ''})
    assert selectors.label_selector_from_dict({})({'anything': 'at all'})
    assert selectors.label_selector_from_dict(None) is None
    with pytest.raises(selectors.SelectorError):
        selectors.label_selector_from_dict({'matchExpressions': [{'key': 'a', 'operator': 'Near'}]})


def test_field_selectors():
    pod = {'metadata': {'name': 'p'}, 'spec': {'nodeName': 'n1', 'hostNetwork': True}, 'status': {'phase': 'Running'}}
    check = selectors.field_predicate(selectors.parse_field_selector(
        'spec.nodeName=n1,status.phase!=Succeeded,spec.hostNetwork==true'))
    assert check(pod)
    assert not selectors.field_predicate(selectors.parse_field_selector('spec.schedulerName=x'))(pod)
    assert selectors.field_predicate(selectors.parse_field_selector('spec.schedulerName='))(pod)
    with pytest.raises(selectors.SelectorError):
        selectors.parse_field_selector('spec.nodeName')


@pytest.mark.parametrize('value, total, expected', [
    (2, 10, 2), ('2', 10, 2), ('50%', 3, 2), ('34%', 3, 2), ('33%', 3, 1), ('0%', 5, 0), ('100%', 7, 7),
    ('10%', 1, 1),
])
def test_int_or_percent_rounds_up(value, total, expected):
    assert policy.scaled_value(value, total) == expected


def _pod(name, ready=True, phase='Running', deleting=False, owner=None):
    meta = {'name': name, 'namespace': 'ns', 'labels': {'app': 'x'}}
    if deleting:
        meta['deletionTimestamp'] = '2026-01-01T00:00:00Z'
    if owner:
        meta['ownerReferences'] = [{'uid': owner, 'controller': True, 'kind': 'ReplicaSet'}]
    return {'metadata': meta, 'status': {'phase': phase, 'conditions': [
        {'type': 'Ready', 'status': 'True' if ready else 'False'}]}}


def test_budget_counts_controllers_and_terminating_pods():
    spec = {'selector': {'matchLabels': {'app': 'x'}}, 'maxUnavailable': 1}
    pdb = {'metadata': {'name': 'b', 'namespace': 'ns'}, 'spec': spec}
    pods = [_pod('a', owner='rs'), _pod('b', owner='rs', deleting=True), _pod('c', owner='rs', ready=False)]
    status = policy.budget(pdb, pods, {'rs': 3})
    assert (status['expectedPods'], status['currentHealthy'], status['desiredHealthy'],
            status['disruptionsAllowed']) == (3, 1, 2, 0)
    code, message, name = policy.eviction_decision(pods[0], [pdb], pods, {'rs': 3})
    assert (code, name) == (429, 'b') and 'needs 2 healthy pods and has 1 currently' in message
    assert policy.eviction_decision(_pod('d', phase='Pending'), [pdb], pods)[0] == 201


def test_merge_and_strategic_patches():
    node = {'spec': {'taints': [{'key': 'a', 'effect': 'NoSchedule'}], 'podCIDR': 'x'}, 'metadata': {
        'finalizers': ['f1'], 'labels': {'keep': '1', 'drop': '2'}}}
    merged = patching.merge_patch(node, {'spec': {'taints': [{'key': 'b'}]}, 'metadata': {'labels': {'drop': None}}})
    assert merged['spec']['taints'] == [{'key': 'b'}] and merged['metadata']['labels'] == {'keep': '1'}
    smp = patching.strategic_merge_patch(node, {'spec': {'taints': [{'key': 'b', 'effect': 'NoExecute'},
                                                                    {'key': 'a', '$patch': 'delete'}]},
                                                'metadata': {'finalizers': ['f2']}})
    assert smp['spec']['taints'] == [{'key': 'b', 'effect': 'NoExecute'}]
    assert smp['metadata']['finalizers'] == ['f1', 'f2']
    assert node['spec']['taints'] == [{'key': 'a', 'effect': 'NoSchedule'}]   # input untouched
    with pytest.raises(ValueError):
        patching.apply_patch(node, {}, 'text/plain')


def test_human_age():
    now = datetime.datetime(2026, 1, 10, 12, 0, 0, tzinfo=datetime.timezone.utc)
    ages = {'2026-01-10T11:59:55Z': '5s', '2026-01-10T11:55:00Z': '5m', '2026-01-10T11:54:30Z': '5m30s',
            '2026-01-10T10:00:00Z': '120m', '2026-01-10T07:30:00Z': '4h30m', '2026-01-09T00:00:00Z': '36h',
            '2026-01-07T00:00:00Z': '3d12h', '2025-12-01T12:00:00Z': '40d', 'garbage': '<unknown>'}
    assert {ts: tables.human_age(ts, now) for ts in ages} == ages


def test_protobuf_envelope_errors():
    with pytest.raises(protobuf.ProtobufError):
        protobuf.decode(b'{"json": true}')
    # a v1 Pod in the envelope: TypeMeta{apiVersion=v1, kind=Pod}, raw empty
    body = protobuf.MAGIC + b'\n\x09\n\x02v1\x12\x03Pod'
    with pytest.raises(protobuf.ProtobufError, match='kubectl create -f'):
        protobuf.decode(body)
