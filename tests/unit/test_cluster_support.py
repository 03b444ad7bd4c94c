"""Unit tests of the test control plane's pure parts (tests/cluster): the fault proxy's rules, the
build cache key and the PKI. The processes themselves are exercised by every integration test."""
from __future__ import annotations

import pathlib

import pytest
from cryptography import x509

from cluster import build
from cluster.faultproxy import Faults, status_body
from cluster.pki import Pki


def test_fault_rules_match_in_order_by_method_path_query_and_count():
    faults = Faults()
    first = faults.add(method='patch', path=r'/nodes/gpu-1$', status=409, times=2)
    anyverb = faults.add(path=r'/pods$', query={'fieldSelector': 'spec.nodeName=gpu-1'}, status=500)
    assert faults.match('GET', '/api/v1/nodes/gpu-1', {}) is None          # method differs
    assert faults.match('PATCH', '/api/v1/nodes/gpu-10', {}) is None       # path is searched with its anchor
    assert faults.match('PATCH', '/api/v1/nodes/gpu-1', {}) is first
    assert faults.match('PATCH', '/api/v1/nodes/gpu-1', {}) is first
    assert faults.match('PATCH', '/api/v1/nodes/gpu-1', {}) is None        # times=2 used up
    assert first.hits == 2 and first.exhausted
    assert faults.match('GET', '/api/v1/pods', {'fieldSelector': 'spec.nodeName=gpu-2'}) is None
    assert faults.match('GET', '/api/v1/pods', {'fieldSelector': 'spec.nodeName=gpu-1'}) is anyverb
    assert not anyverb.exhausted                                            # times=None: every request
    faults.clear()
    assert list(faults) == []


def test_a_fault_with_skip_lets_the_first_matching_requests_through():
    faults = Faults()
    third = faults.add(method='PATCH', path=r'^/api/v1/nodes/gpu-1$', status=503, times=1, skip=2)
    later = faults.add(method='PATCH', path=r'/nodes/', status=409)
    assert faults.match('GET', '/api/v1/nodes/gpu-1', {}) is None         # not matching: not counted
    assert faults.match('PATCH', '/api/v1/nodes/gpu-1', {}) is None       # 1st: let through, served
    assert faults.match('PATCH', '/api/v1/nodes/gpu-1', {}) is None       # 2nd: let through (not to `later`)
    assert (third.passed, third.hits) == (2, 0) and not third.exhausted
    assert faults.match('PATCH', '/api/v1/nodes/gpu-1', {}) is third      # 3rd: faulted
    assert third.exhausted
    assert faults.match('PATCH', '/api/v1/nodes/gpu-1', {}) is later      # 4th: the next rule
    with pytest.raises(ValueError, match='skip='):
        faults.add(path='/x', status=500, skip=-1)


def test_a_fault_needs_an_effect():
    with pytest.raises(ValueError, match='status=, delay= or drop='):
        Faults().add(method='GET', path='/x')
    assert Faults().add(path='/x', drop=True).drop


def test_injected_status_is_a_kubernetes_status():
    import json
    body = json.loads(status_body(429, 'slow down'))
    assert body == {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                    'message': 'slow down', 'reason': 'TooManyRequests', 'code': 429}


def test_build_cache_key_follows_the_pinned_modules(tmp_path, monkeypatch):
    go = tmp_path / 'go'
    go.mkdir()
    (go / 'go.mod').write_text('module x\n')
    (go / 'go.sum').write_text('a v1 h1:x\n')
    monkeypatch.setattr(build, 'GO_DIR', go)
    monkeypatch.setenv('GPUFLEET_CACHE', str(tmp_path / 'cache'))
    first = build.bin_dir()
    assert first.parent.parent == tmp_path / 'cache' and first.name == 'bin'
    assert build.bin_dir() == first                                         # stable
    (go / 'go.sum').write_text('a v2 h1:y\n')
    assert build.bin_dir() != first                                         # a version bump builds anew
    assert not build.built(first)


def test_the_repository_pins_every_component():
    text = (pathlib.Path(build.__file__).parent / 'go' / 'go.mod').read_text()
    for module in ('k8s.io/kubernetes v1.36', 'go.etcd.io/etcd/server/v3 v3.6', 'sigs.k8s.io/kwok v0.8'):
        assert module in text
    assert (pathlib.Path(build.__file__).parent / 'go' / 'go.sum').stat().st_size > 10000


def test_pki_issues_a_loopback_server_certificate_and_client_identities(tmp_path):
    pki = Pki(tmp_path)
    crt, key = pki.issue('apiserver', 'kube-apiserver', server=True, client=False)
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert '127.0.0.1' in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    assert cert.issuer == pki.ca_cert.subject
    ccrt = pki.issue('admin', 'someone', ('system:masters',))[0]
    subject = x509.load_pem_x509_certificate(ccrt.read_bytes()).subject
    assert subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)[0].value == 'system:masters'
    assert oct(key.stat().st_mode & 0o777) == '0o600'
