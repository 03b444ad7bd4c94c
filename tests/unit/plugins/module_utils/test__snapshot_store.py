"""The pure decisions of snapshot_store: Secret names and labels, store plans, verified fetches, retirement."""
from __future__ import annotations

import base64
import re

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as sn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot_store as ss

TARGET = {'driver': '580.130.00'}
KEY = 'driver=580.130.00'
NS = 'gpufleet-system'
SUBDOMAIN = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')


def document(driver: str = '580.126.20') -> bytes:
    snap = {'packages': {'nvidia-driver-580-server': driver}, 'pins': {}, 'holds': [], 'boot': {},
            'gpu_facts': {'driver_version': driver}}
    return sn.dump_document(sn.make_document(snap)).encode('utf-8')


def digest_of(content: bytes) -> str:
    return ss.document_digest(content, 'test')


def secret(content: bytes, digest: str | None = None, managed: bool = True, name: str | None = None,
           node: str = 'gpu-07', key: str = KEY) -> dict:
    want = ss.desired(node, dict(kv.split('=') for kv in key.split(',')), NS, content, digest or digest_of(content))
    if name:
        want['metadata']['name'] = name
    if not managed:
        del want['metadata']['labels'][ss.MANAGED_BY]
    want['metadata']['resourceVersion'] = '7'
    return want


# -- names ---------------------------------------------------------------------------------

def test_the_name_is_readable_deterministic_and_a_dns_subdomain():
    name = ss.secret_name('gpu-07', TARGET)
    assert re.match(r'^gpufleet-snapshot-gpu-07--driver-580-130-00-[0-9a-f]{10}$', name), name
    assert ss.secret_name('gpu-07', dict(TARGET)) == name
    assert SUBDOMAIN.match(name)


def test_targets_that_slug_alike_get_different_names():
    a = ss.secret_name('gpu-07', {'rke2': 'v1.36.1+rke2r1'})
    b = ss.secret_name('gpu-07', {'rke2': 'v1.36.1-rke2r1'})
    assert a != b and a[:-10] == b[:-10]
    assert ss.secret_name('GPU-07', TARGET) != ss.secret_name('gpu-07', TARGET)


def test_a_long_node_and_target_are_cut_before_the_hash():
    node = 'n' * 250
    target = {'kernel': '6.8.0-135-generic-' + 'x' * 200, 'driver': '580.130.00'}
    name = ss.secret_name(node, target)
    assert len(name) <= 253 and SUBDOMAIN.match(name), (len(name), name)
    assert name != ss.secret_name(node + 'm', target)
    assert name.startswith('gpufleet-snapshot-nnn') and '--' in name


@pytest.mark.parametrize('node, target, msg', [
    ('', TARGET, "node: '' is not a node name"),
    ('a/b', TARGET, "node: 'a/b' is not a node name"),
    ('gpu-07', {}, 'target: expected a non-empty mapping of tuple components, got {}'),
    ('gpu-07', {'driver': 'a,b'}, 'target.driver: \'a,b\' may not contain "," or "="'),
])
def test_bad_node_or_target_names_the_field(node, target, msg):
    with pytest.raises(ss.StoreError) as e:
        ss.secret_name(node, target)
    assert str(e.value) == msg


@pytest.mark.parametrize('value, msg', [
    ('Gpufleet', "namespace: 'Gpufleet' is not a Kubernetes namespace name (a DNS label)"),
    ('a' * 64, "namespace: '%s' is not a Kubernetes namespace name (a DNS label)" % ('a' * 64)),
])
def test_bad_namespace(value, msg):
    with pytest.raises(ss.StoreError) as e:
        ss.check_namespace(value)
    assert str(e.value) == msg


@pytest.mark.parametrize('value', [None, '', 'ab' * 31, 'zz' * 32])
def test_bad_sha256(value):
    with pytest.raises(ss.StoreError) as e:
        ss.check_sha256(value)
    assert str(e.value) == 'sha256: %r is not a SHA-256 digest (64 hex digits)' % (value,)


def test_sha256_is_compared_lowercase():
    assert ss.check_sha256('AB' * 32) == 'ab' * 32


def test_labels_node_only_when_a_label_value_and_the_target_slug():
    assert ss.labels('gpu-07', KEY) == {ss.MANAGED_BY: 'gpufleet.upgrade', ss.LABEL_NODE: 'gpu-07',
                                        ss.LABEL_TARGET: 'driver_580.130.00'}
    long_node = 'n' * 64
    assert ss.LABEL_NODE not in ss.labels(long_node, KEY)
    long_key = ','.join('k%d=%s' % (i, 'v' * 10) for i in range(8))
    value = ss.labels('gpu-07', long_key)[ss.LABEL_TARGET]
    assert len(value) <= 63 and re.match(r'^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$', value)
    assert ss.selector('gpu-07') == 'app.kubernetes.io/managed-by=gpufleet.upgrade,gpufleet.io/node=gpu-07'
    assert ss.selector(long_node) == 'app.kubernetes.io/managed-by=gpufleet.upgrade'


# -- store ---------------------------------------------------------------------------------

def test_the_digest_is_node_snapshots_not_the_files():
    content = document()
    doc = sn.verify_document(content.decode())
    assert digest_of(content) == sn.digest(doc) == sn.make_document(doc)['sha256']


def test_desired_secret():
    content = document()
    want = ss.desired('gpu-07', TARGET, NS, content, digest_of(content))
    assert want['type'] == 'Opaque' and want['metadata']['namespace'] == NS
    assert want['metadata']['annotations'] == {ss.ANN_SHA: digest_of(content), ss.ANN_NODE: 'gpu-07',
                                               ss.ANN_TARGET: KEY, ss.ANN_SIZE: str(len(content))}
    assert base64.b64decode(want['data'][ss.DATA_KEY]) == content


def test_a_snapshot_too_large_for_a_secret_is_refused():
    with pytest.raises(ss.StoreError, match=r'the snapshot is 1000001 bytes, more than a Secret holds'):
        ss.desired('gpu-07', TARGET, NS, b'x' * 1000001, 'ab' * 32)


@pytest.mark.parametrize('content, msg', [
    (b'not json', 'path: /s.json: the snapshot is not valid JSON'),
    (b'\xff\xfe', 'path: /s.json is not UTF-8 text: not a node_snapshot document'),
    (document().replace(b'580.126.20', b'580.126.21', 1), 'path: /s.json: snapshot digest mismatch'),
])
def test_only_a_valid_document_is_stored(content, msg):
    with pytest.raises(ss.StoreError) as e:
        ss.document_digest(content, 'path: /s.json')
    assert str(e.value).startswith(msg), str(e.value)


def test_plan_create_unchanged_replace():
    content = document()
    want = ss.desired('gpu-07', TARGET, NS, content, digest_of(content))
    assert ss.plan_store(None, want) == ss.Plan('create', None)
    assert ss.plan_store(secret(content), want) == ss.Plan('unchanged', None)
    other = document('580.95.05')
    plan = ss.plan_store(secret(other), want)
    assert plan.action == 'replace'
    assert plan.patch == {'metadata': {'annotations': {ss.ANN_SHA: digest_of(content), ss.ANN_SIZE: str(len(content))}},
                          'data': {ss.DATA_KEY: want['data'][ss.DATA_KEY]}}


def test_plan_replaces_tampered_data_and_removes_foreign_keys():
    content = document()
    want = ss.desired('gpu-07', TARGET, NS, content, digest_of(content))
    tampered = secret(content)
    tampered['data'] = {ss.DATA_KEY: base64.b64encode(b'{}').decode(), 'extra': 'eA=='}
    assert ss.plan_store(tampered, want).patch == {'data': {'extra': None, ss.DATA_KEY: want['data'][ss.DATA_KEY]}}


def test_a_secret_gpufleet_did_not_create_is_refused():
    content = document()
    want = ss.desired('gpu-07', TARGET, NS, content, digest_of(content))
    with pytest.raises(ss.StoreError) as e:
        ss.plan_store(secret(content, managed=False), want)
    assert str(e.value) == ('Secret %s/%s exists and is not managed by gpufleet.upgrade (label '
                            'app.kubernetes.io/managed-by); refusing to change it' % (NS, want['metadata']['name']))


def test_summary_never_holds_the_content():
    content = document()
    s = ss.summary(secret(content))
    assert 'data' not in s and s['data_keys'] == [ss.DATA_KEY]
    assert content.decode() not in repr(s) and secret(content)['data'][ss.DATA_KEY] not in repr(s)
    assert ss.summary(None) is None


# -- fetch ---------------------------------------------------------------------------------

def _fetch(obj, expected):
    return ss.stored_content(obj, 'gpu-07', KEY, NS, 'snap', expected)


def test_fetch_returns_the_verified_content():
    content = document()
    assert _fetch(secret(content), digest_of(content)) == content


def test_fetch_missing_secret():
    with pytest.raises(ss.FetchError) as e:
        _fetch(None, 'ab' * 32)
    assert str(e.value).startswith('no snapshot of node gpu-07 for target driver=580.130.00 could be fetched from '
                                   'Secret gpufleet-system/snap: the Secret does not exist (the Node records sha256 '
                                   + 'ab' * 32)


def test_fetch_another_snapshot_names_both_digests():
    content, other = document(), document('580.95.05')
    with pytest.raises(ss.FetchError) as e:
        _fetch(secret(other), digest_of(content))
    assert str(e.value) == ('no snapshot of node gpu-07 for target driver=580.130.00 could be fetched from Secret '
                            'gpufleet-system/snap: digest mismatch: expected sha256 %s (recorded on the Node), the '
                            'stored snapshot is %s' % (digest_of(content), digest_of(other)))


def test_fetch_refuses_an_annotation_that_disagrees_with_the_content():
    content = document()
    obj = secret(content)
    obj['metadata']['annotations'][ss.ANN_SHA] = 'cd' * 32
    with pytest.raises(ss.FetchError, match="the Secret's annotation gpufleet.io/snapshot-sha256 says sha256 cdcd"):
        _fetch(obj, digest_of(content))


def test_fetch_refuses_tampered_content():
    content = document()
    obj = secret(content)
    obj['data'][ss.DATA_KEY] = base64.b64encode(content.replace(b'580.126.20', b'580.126.21', 1)).decode()
    with pytest.raises(ss.FetchError) as e:
        _fetch(obj, digest_of(content))
    assert 'its content: snapshot digest mismatch' in str(e.value) and digest_of(content) in str(e.value)


@pytest.mark.parametrize('mutate, msg', [
    (lambda o: o['metadata']['labels'].pop(ss.MANAGED_BY), 'the Secret is not managed by gpufleet.upgrade'),
    (lambda o: o.pop('data'), 'the Secret has no snapshot.json'),
    (lambda o: o['data'].update({ss.DATA_KEY: '***'}), 'its snapshot.json is not base64'),
])
def test_fetch_refuses_a_broken_secret(mutate, msg):
    content = document()
    obj = secret(content)
    mutate(obj)
    with pytest.raises(ss.FetchError, match=re.escape(msg)):
        _fetch(obj, digest_of(content))


def test_fetch_without_a_recorded_digest_trusts_no_secret():
    """T3-1: a Secret that only vouches for itself (content matching its own annotation, as anyone who may
    write Secrets in the namespace can make one) restores nothing."""
    content = document()
    assert _fetch(secret(content), digest_of(content)) == content
    for expected in (None, ''):
        with pytest.raises(ss.FetchError, match='the Node records no snapshot digest for this target, and a Secret '
                                                'cannot vouch for itself'):
            _fetch(secret(content), expected)
        with pytest.raises(ss.FetchError, match='a Secret cannot vouch for itself'):
            _fetch(None, expected)


def test_local_digest():
    content = document()
    assert ss.local_digest(content) == digest_of(content)
    assert ss.local_digest(None) is None
    assert ss.local_digest(b'{}') is None


# -- retirement ----------------------------------------------------------------------------

def test_retired_are_the_nodes_other_targets_only():
    content = document()
    keep = secret(content)
    old = secret(content, name='gpufleet-snapshot-gpu-07--driver-580-95-05-0000000000', key='driver=580.95.05')
    other_node = secret(content, name='gpufleet-snapshot-gpu-08--driver-580-95-05-1111111111', node='gpu-08',
                        key='driver=580.95.05')
    foreign = secret(content, name='gpufleet-snapshot-gpu-07--x-2222222222', key='driver=1', managed=False)
    name = keep['metadata']['name']
    assert ss.retired([keep, old, other_node, foreign], 'gpu-07', KEY, name) == [old['metadata']['name']]
