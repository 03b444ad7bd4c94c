"""Unit tests of the Kubernetes client layer (plugins/module_utils/_k8s.py) against a tiny
scripted HTTP server on loopback (one function under test: the retry policy and errors)."""
from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _k8s as K


class Scripted:
    """Answers from a script: {(method, path): [(status, body, delay), ...]} consumed in turn;
    the last answer repeats."""

    def __init__(self):
        self.script = {}
        self.log = []
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(('127.0.0.1', 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = 'http://127.0.0.1:%d' % self.httpd.server_address[1]

    def _handler(self):
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _do(self):
                length = int(self.headers.get('Content-Length') or 0)
                body = self.rfile.read(length) if length else b''
                path = self.path.split('?')[0]
                outer.log.append((self.command, self.path, body.decode(), self.headers))
                answers = outer.script.get((self.command, path)) or [(404, {'message': 'not found'}, 0)]
                status, data, delay = answers.pop(0) if len(answers) > 1 else answers[0]
                if delay:
                    time.sleep(delay)
                raw = json.dumps(data).encode()
                try:
                    self.send_response(status)
                    self.send_header('Content-Type', 'application/json')
                    self.send_header('Content-Length', str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PATCH = do_DELETE = _do
        return H

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Scripted()
    yield s
    s.close()


def client(server, **kw):
    api = K.get_api_client({'host': server.url, 'api_key': 'sekret', 'request_timeout': kw.pop('timeout', 2)})
    kw.setdefault('sleep', lambda s: None)
    return K.K8sClient(api, request_timeout=kw.pop('request_timeout', 2), **kw)


NODE = {'kind': 'Node', 'metadata': {'name': 'n', 'resourceVersion': '7'}, 'spec': {}}


def test_get_sends_bearer_token_and_decodes(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    assert client(server).get('/api/v1/nodes/n') == NODE
    assert server.log[0][3].get('Authorization') == 'Bearer sekret'


@pytest.mark.parametrize('status', [429, 500, 503])
def test_get_is_retried_on_5xx(server, status):
    server.script[('GET', '/api/v1/nodes/n')] = [(status, {'message': 'boom'}, 0), (status, {}, 0), (200, NODE, 0)]
    c = client(server)
    assert c.get('/api/v1/nodes/n') == NODE
    assert len(server.log) == 3 and c.retries_made == 2


def test_get_gives_up_after_bounded_attempts(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(503, {'message': 'etcd leader changed'}, 0)]
    with pytest.raises(K.K8sError) as exc:
        client(server, get_attempts=3).get('/api/v1/nodes/n')
    assert str(exc.value) == 'GET /api/v1/nodes/n: HTTP 503 etcd leader changed (gave up after 3 attempts)'
    assert len(server.log) == 3


def test_slow_answer_beyond_the_timeout_is_retried_then_fails_clearly(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 1.5)]
    with pytest.raises(K.K8sError) as exc:
        client(server, request_timeout=0.3, get_attempts=2).get('/api/v1/nodes/n')
    assert str(exc.value) == ('GET /api/v1/nodes/n: no answer within the request timeout of 0.3s '
                              '(gave up after 2 attempts)')


def test_slow_then_fast_succeeds(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 1.0), (200, NODE, 0)]
    assert client(server, request_timeout=0.3).get('/api/v1/nodes/n') == NODE


def test_404_is_not_retried(server):
    with pytest.raises(K.NotFoundError):
        client(server).get('/api/v1/nodes/missing')
    assert len(server.log) == 1


@pytest.mark.parametrize('status', [429, 500])
def test_writes_are_never_retried_blindly(server, status):
    # an eviction's 429 is a PodDisruptionBudget's answer: the drain decides, the client does not retry
    server.script[('POST', '/api/v1/namespaces/a/pods/p/eviction')] = [(status, {'message': 'internal'}, 0)]
    with pytest.raises(K.K8sError) as exc:
        client(server).post('/api/v1/namespaces/a/pods/p/eviction', {'kind': 'Eviction'})
    assert exc.value.status == status
    assert len(server.log) == 1


def test_update_reapplies_on_conflict_from_a_fresh_read(server):
    fresh = dict(NODE, metadata={'name': 'n', 'resourceVersion': '8'})
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0), (200, fresh, 0)]
    server.script[('PATCH', '/api/v1/nodes/n')] = [(409, {'message': 'the object has been modified'}, 0),
                                                   (200, dict(fresh, spec={'unschedulable': True}), 0)]
    c = client(server)
    before, after = c.update('/api/v1/nodes/n', lambda n: {'spec': {'unschedulable': True}})
    assert before['metadata']['resourceVersion'] == '8' and after['spec'] == {'unschedulable': True}
    patches = [json.loads(entry[2]) for entry in server.log if entry[0] == 'PATCH']
    assert [p['metadata']['resourceVersion'] for p in patches] == ['7', '8']
    assert [entry[3].get('Content-Type') for entry in server.log if entry[0] == 'PATCH'] == ['application/merge-patch+json'] * 2


def test_update_gives_up_on_a_persistent_conflict(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    server.script[('PATCH', '/api/v1/nodes/n')] = [(409, {'message': 'conflict'}, 0)]
    with pytest.raises(K.ConflictError) as exc:
        client(server, update_attempts=3).update('/api/v1/nodes/n', lambda n: {'spec': {'unschedulable': True}})
    assert 'kept changing (409 Conflict on 3 attempts); nothing was changed by this call' in str(exc.value)


def test_update_without_change_writes_nothing(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    before, after = client(server).update('/api/v1/nodes/n', lambda n: None)
    assert before is after and [entry[0] for entry in server.log] == ['GET']


def test_list_pages_follows_continue(server):
    server.script[('GET', '/api/v1/pods')] = [
        (200, {'items': [{'n': 1}], 'metadata': {'continue': 'tok'}}, 0),
        (200, {'items': [{'n': 2}], 'metadata': {}}, 0)]
    assert client(server).list_all('/api/v1/pods', {'fieldSelector': 'spec.nodeName=x'}, limit=1) == [{'n': 1}, {'n': 2}]
    assert [entry[1] for entry in server.log] == [
        '/api/v1/pods?fieldSelector=spec.nodeName%3Dx&limit=1',
        '/api/v1/pods?fieldSelector=spec.nodeName%3Dx&limit=1&continue=tok']


def test_unreachable_server_is_a_clear_error():
    api = K.get_api_client({'host': 'http://127.0.0.1:9'})
    with pytest.raises(K.K8sError) as exc:
        K.K8sClient(api, get_attempts=1).get('/api/v1/nodes')
    assert str(exc.value).startswith('GET /api/v1/nodes: cannot reach the Kubernetes API at http://127.0.0.1:9')


def test_missing_kubeconfig_is_named(tmp_path):
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'kubeconfig': str(tmp_path / 'nope')})
    assert str(exc.value) == "kubeconfig '%s' does not exist" % (tmp_path / 'nope')


def test_kubeconfig_context_and_impersonation(tmp_path):
    cfg = {'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'a',
           'clusters': [{'name': 'a', 'cluster': {'server': 'http://127.0.0.1:1'}},
                        {'name': 'b', 'cluster': {'server': 'http://127.0.0.1:2'}}],
           'users': [{'name': 'u', 'user': {'token': 't0k'}}],
           'contexts': [{'name': 'a', 'context': {'cluster': 'a', 'user': 'u'}},
                        {'name': 'b', 'context': {'cluster': 'b', 'user': 'u'}}]}
    path = tmp_path / 'kubeconfig'
    path.write_text(json.dumps(cfg))
    api = K.get_api_client({'kubeconfig': str(path), 'context': 'b', 'impersonate_user': 'bob',
                            'impersonate_groups': ['g1', 'g2']})
    assert api.host == 'http://127.0.0.1:2' and api.loader == 'kubeconfig'
    assert api.headers['Impersonate-User'] == 'bob'
    assert 'Impersonate-Group' not in api.headers
    assert api.impersonate_groups == ['g1', 'g2']
    assert K.K8sClient(api)._headers(None)['authorization'] == 'Bearer t0k'
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'kubeconfig': str(path), 'context': 'zzz'})
    assert "cannot load the Kubernetes configuration (kubeconfig='%s', context='zzz')" % path in str(exc.value)


def test_impersonated_groups_go_one_per_header_line(server):
    # The API server does not split Impersonate-Group on commas: 'g1,g2' would be one group.
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    api = K.get_api_client({'host': server.url, 'impersonate_user': 'bob', 'impersonate_groups': ['g1', 'g2']})
    K.K8sClient(api, sleep=lambda s: None).request('GET', '/api/v1/nodes/n')
    headers = server.log[-1][3]
    assert headers.get_all('Impersonate-Group') == ['g1', 'g2']
    assert headers.get_all('Impersonate-User') == ['bob']


@pytest.mark.parametrize('value,verify', [('false', False), ('True', True), ('0', False)])
def test_verify_ssl_from_the_environment(monkeypatch, value, verify):
    monkeypatch.setenv('K8S_AUTH_VERIFY_SSL', value)
    assert K.get_api_client({'host': 'https://127.0.0.1:6443'}).verify_ssl is verify
    # The option wins over the environment.
    assert K.get_api_client({'host': 'https://127.0.0.1:6443', 'validate_certs': not verify}).verify_ssl \
        is (not verify)


def test_verify_ssl_from_the_environment_must_be_a_boolean(monkeypatch):
    monkeypatch.setenv('K8S_AUTH_VERIFY_SSL', 'maybe')
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'host': 'https://127.0.0.1:6443'})
    assert str(exc.value) == "K8S_AUTH_VERIFY_SSL='maybe' is not a boolean (use true or false)"


def test_request_timeout_must_be_positive(server):
    with pytest.raises(K.K8sError) as exc:
        K.K8sClient(K.get_api_client({'host': server.url}), request_timeout=0)
    assert str(exc.value) == 'request_timeout must be a positive number of seconds, got 0'


def test_auth_spec_is_copied():
    spec = K.auth_argument_spec()
    spec['kubeconfig']['type'] = 'str'
    assert K.AUTH_ARG_SPEC['kubeconfig']['type'] == 'raw'
    assert K.AUTH_ARG_SPEC['api_key']['no_log'] is True and K.AUTH_ARG_SPEC['password']['no_log'] is True


def test_path_for():
    assert K.path_for('v1', 'pods', 'p', 'ns', 'eviction') == '/api/v1/namespaces/ns/pods/p/eviction'
    assert K.path_for('kubevirt.io/v1', 'virtualmachineinstances') == '/apis/kubevirt.io/v1/virtualmachineinstances'


# -- kubeconfig reading without the kubernetes library, over real TLS ---------------------------

def _openssl(*args, cwd):
    subprocess.run(['openssl', *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope='module')
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 (SAN) and a client certificate (CN=gpufleet-admin)."""
    if not shutil.which('openssl'):
        pytest.skip('openssl is not installed')
    d = tmp_path_factory.mktemp('pki')
    _openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2',
             '-subj', '/CN=test-ca', cwd=d)
    (d / 'san.cnf').write_text('subjectAltName=IP:127.0.0.1\n')
    for name, cn in (('server', 'kube-apiserver'), ('client', 'gpufleet-admin')):
        _openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', name + '.key', '-out', name + '.csr',
                 '-subj', '/CN=' + cn, cwd=d)
        extra = ['-extfile', 'san.cnf'] if name == 'server' else []
        _openssl('x509', '-req', '-in', name + '.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial',
                 '-out', name + '.crt', '-days', '2', *extra, cwd=d)
    return d


@pytest.fixture
def tls_server(pki):
    """The scripted server behind TLS that requires a client certificate signed by the CA."""
    s = Scripted()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(pki / 'server.crt'), str(pki / 'server.key'))
    ctx.load_verify_locations(str(pki / 'ca.crt'))
    ctx.verify_mode = ssl.CERT_REQUIRED
    s.httpd.socket = ctx.wrap_socket(s.httpd.socket, server_side=True)
    s.url = s.url.replace('http://', 'https://')
    yield s
    s.close()


def _b64(path):
    return base64.b64encode(path.read_bytes()).decode()


def _kubeconfig(server, cluster, user):
    return {'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'c',
            'clusters': [{'name': 'k', 'cluster': dict({'server': server}, **cluster)}],
            'users': [{'name': 'u', 'user': user}],
            'contexts': [{'name': 'c', 'context': {'cluster': 'k', 'user': 'u'}}]}


def test_kubeconfig_with_certificate_data_over_tls(tls_server, pki, tmp_path, monkeypatch):
    # Client certificate and key as data: read into the SSL context, never left on disk.
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    tls_server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    config = _kubeconfig(tls_server.url, {'certificate-authority-data': _b64(pki / 'ca.crt')},
                         {'client-certificate-data': _b64(pki / 'client.crt'),
                          'client-key-data': _b64(pki / 'client.key'), 'token': 'sekret'})
    api = K.get_api_client({'kubeconfig': config})
    assert api.loader == 'kubeconfig' and api.verify_ssl is True
    assert K.K8sClient(api, sleep=lambda s: None).get('/api/v1/nodes/n') == NODE
    assert tls_server.log[-1][3]['Authorization'] == 'Bearer sekret'
    assert list(tmp_path.iterdir()) == []


def test_kubeconfig_with_certificate_files_relative_to_it(tls_server, pki, tmp_path):
    tls_server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    for name in ('ca.crt', 'client.crt', 'client.key'):
        shutil.copy(pki / name, tmp_path / name)
    (tmp_path / 'token').write_text('from-a-file\n')
    config = _kubeconfig(tls_server.url, {'certificate-authority': 'ca.crt'},
                         {'client-certificate': 'client.crt', 'client-key': 'client.key', 'tokenFile': 'token'})
    path = tmp_path / 'kubeconfig'
    path.write_text(json.dumps(config))
    api = K.get_api_client({'kubeconfig': str(path)})
    assert K.K8sClient(api, sleep=lambda s: None).get('/api/v1/nodes/n') == NODE
    assert tls_server.log[-1][3]['Authorization'] == 'Bearer from-a-file'


@pytest.mark.filterwarnings('ignore::urllib3.exceptions.InsecureRequestWarning')
def test_server_certificate_is_verified(tls_server, pki):
    # Without the CA the server's certificate is refused; insecure-skip-tls-verify accepts it.
    user = {'client-certificate-data': _b64(pki / 'client.crt'), 'client-key-data': _b64(pki / 'client.key')}
    api = K.get_api_client({'kubeconfig': _kubeconfig(tls_server.url, {}, user)})
    with pytest.raises(K.K8sError) as exc:
        K.K8sClient(api, get_attempts=1).get('/api/v1/nodes/n')
    assert 'CERTIFICATE_VERIFY_FAILED' in str(exc.value)
    tls_server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    api = K.get_api_client({'kubeconfig': _kubeconfig(tls_server.url, {'insecure-skip-tls-verify': True}, user)})
    assert api.verify_ssl is False
    assert K.K8sClient(api, get_attempts=1).get('/api/v1/nodes/n') == NODE


def test_bad_certificate_data_is_named():
    config = _kubeconfig('https://127.0.0.1:6443', {'certificate-authority-data': 'not base64!'}, {})
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'kubeconfig': config})
    assert "kubeconfig='<dict>'" in str(exc.value) and 'certificate-authority-data is not base64' in str(exc.value)
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'kubeconfig': _kubeconfig('https://127.0.0.1:6443', {}, {
            'client-certificate-data': base64.b64encode(b'junk').decode(), 'client-key-data': 'a2V5'})})
    assert str(exc.value).startswith('cannot load the client certificate and key:')


def test_exec_plugin_is_read_by_the_kubernetes_library(server):
    # An exec credential plugin: only the kubernetes library runs those.
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    credential = json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',
                             'status': {'token': 'from-exec'}})
    config = _kubeconfig(server.url, {}, {'exec': {'apiVersion': 'client.authentication.k8s.io/v1',
                                                   'command': sys.executable,
                                                   'args': ['-c', 'print(%r)' % credential],
                                                   'interactiveMode': 'Never'}})
    api = K.get_api_client({'kubeconfig': config})
    assert api.loader == 'kubernetes'
    K.K8sClient(api, sleep=lambda s: None).get('/api/v1/nodes/n')
    assert server.log[-1][3]['Authorization'] == 'Bearer from-exec'


def test_an_ordinary_kubeconfig_does_not_import_the_kubernetes_library(tmp_path):
    # Importing kubernetes costs ~0.3 s of CPU in each Kubernetes task's process (bench/lab_overhead.py).
    path = tmp_path / 'kubeconfig'
    path.write_text(json.dumps(_kubeconfig('http://127.0.0.1:9', {}, {'token': 't'})))
    code = ('import sys\n'
            'from ansible_collections.gpufleet.upgrade.plugins.module_utils import _k8s as K\n'
            'api = K.get_api_client({"kubeconfig": %r})\n'
            'print(api.loader, any(m == "kubernetes" or m.startswith("kubernetes.") for m in sys.modules))\n' % str(path))
    out = subprocess.run([sys.executable, '-c', code], check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert out.stdout.split() == ['kubeconfig', 'False']


def test_credentials_stay_out_of_the_connection_repr():
    api = K.get_api_client({'host': 'https://127.0.0.1:6443', 'api_key': 'sekret-token'})
    assert api.headers['Authorization'] == 'Bearer sekret-token'
    assert 'sekret' not in repr(api)


def test_text_answers_for_pod_logs(server):
    server.script[('GET', '/api/v1/namespaces/ml/pods/p/log')] = [(200, 'not json at all', 0)]
    got = client(server).request('GET', '/api/v1/namespaces/ml/pods/p/log', {'container': 'c'}, text=True)
    assert got == '"not json at all"'          # the body as it came, undecoded
    assert server.log[-1][1] == '/api/v1/namespaces/ml/pods/p/log?container=c'
    assert server.log[-1][3]['Accept'] == 'text/plain, */*'


@pytest.fixture
def no_proxy_env(monkeypatch):
    for name in ('http_proxy', 'https_proxy', 'all_proxy', 'no_proxy'):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_proxy_from_the_environment_is_used_for_the_api(server, no_proxy_env):
    # As kubectl and the kubernetes library: http(s)_proxy by the API's scheme; the request goes to the
    # proxy with the API's absolute URL.
    no_proxy_env.setenv('HTTP_PROXY', server.url)
    api = K.get_api_client({'host': 'http://10.255.255.1:6443', 'api_key': 't'})
    with pytest.raises(K.NotFoundError):
        K.K8sClient(api, get_attempts=1).get('/api/v1/nodes/n')
    assert server.log[-1][1] == 'http://10.255.255.1:6443/api/v1/nodes/n'


@pytest.mark.parametrize('host,no_proxy,proxied', [
    ('https://api.example.com:6443', '', True),
    ('https://api.example.com:6443', 'example.com', False),
    ('https://api.example.com:6443', '.example.com', False),
    ('https://api.example.com:6443', 'api.example.com:6443', False),
    ('https://api.example.com:6443', 'other.com,ample.com', True),
    ('https://10.0.3.7:6443', '10.0.0.0/16', False),
    ('https://10.1.3.7:6443', '10.0.0.0/16', True),
    ('https://[fd00::7]:6443', 'fd00::/8', False),
    ('https://api.example.com:6443', '*', False),
])
def test_no_proxy_rules(no_proxy_env, host, no_proxy, proxied):
    no_proxy_env.setenv('https_proxy', 'http://proxy.example.com:3128')
    no_proxy_env.setenv('NO_PROXY', no_proxy)
    pool = K.get_api_client({'host': host}).pool
    assert (getattr(pool, 'proxy', None) is not None) is proxied


def test_an_explicit_proxy_wins_over_the_environment(no_proxy_env):
    no_proxy_env.setenv('HTTPS_PROXY', 'http://env-proxy:3128')
    pool = K.get_api_client({'host': 'https://api:6443', 'proxy': 'http://explicit:8080'}).pool
    assert pool.proxy.host == 'explicit'
    no_proxy_env.setenv('NO_PROXY', 'api')
    assert getattr(K.get_api_client({'host': 'https://api:6443', 'proxy': 'http://explicit:8080'}).pool,
                   'proxy', None) is None


# -- issue 12 (6): an idempotent write (a patch computed from a fresh read, guarded by its
# resourceVersion) is retried on 5xx within a bound ----------------------------------------------
@pytest.mark.parametrize('status', [429, 500, 503])
def test_update_is_retried_on_5xx_from_a_fresh_read(server, status):
    done = dict(NODE, metadata={'name': 'n', 'resourceVersion': '8', 'annotations': {'gpufleet.io/upgraded-to': 'x'}})
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    server.script[('PATCH', '/api/v1/nodes/n')] = [(status, {'message': 'etcdserver: leader changed'}, 0),
                                                   (200, done, 0)]
    c = client(server)
    before, after = c.update('/api/v1/nodes/n',
                             lambda n: {'metadata': {'annotations': {'gpufleet.io/upgraded-to': 'x'}}})
    assert after == done and before == NODE
    assert [e[0] for e in server.log] == ['GET', 'PATCH', 'GET', 'PATCH']


def test_update_after_an_ambiguous_5xx_that_applied_reports_the_first_read_as_before(server):
    applied = dict(NODE, metadata={'name': 'n', 'resourceVersion': '8', 'annotations': {'a': 'b'}})
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0), (200, applied, 0)]
    server.script[('PATCH', '/api/v1/nodes/n')] = [(503, {'message': 'timeout'}, 0)]

    def compute(n):
        return None if (n['metadata'].get('annotations') or {}).get('a') == 'b' else {
            'metadata': {'annotations': {'a': 'b'}}}
    before, after = client(server).update('/api/v1/nodes/n', compute)
    assert before == NODE and after == applied
    assert [e[0] for e in server.log] == ['GET', 'PATCH', 'GET']


def test_update_gives_up_on_a_persistent_5xx(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    server.script[('PATCH', '/api/v1/nodes/n')] = [(503, {'message': 'unavailable'}, 0)]
    with pytest.raises(K.K8sError) as exc:
        client(server, update_attempts=3).update('/api/v1/nodes/n', lambda n: {'spec': {'unschedulable': True}})
    assert str(exc.value) == ('PATCH /api/v1/nodes/n: HTTP 503 unavailable (gave up after 3 attempts, each computed '
                              'from a fresh read)')
    assert [e[0] for e in server.log].count('PATCH') == 3


# -- issue 12 (11): no URL's userinfo (proxy or API credentials) in any message ------------------
def test_a_proxy_that_cannot_be_used_is_named_without_its_credentials(no_proxy_env):
    no_proxy_env.setenv('K8S_AUTH_PROXY', 'ftp://alice:s3cr3t@proxy.test:3128')   # not an option: not in the invocation
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'host': 'https://api.test:6443', 'api_key': 't'})
    assert 's3cr3t' not in str(exc.value) and 'alice' not in str(exc.value)
    assert "proxy 'ftp://proxy.test:3128' cannot be used" in str(exc.value)


def test_an_unreachable_api_behind_a_proxy_is_named_without_credentials(no_proxy_env):
    no_proxy_env.setenv('K8S_AUTH_PROXY', 'http://alice:s3cr3t@127.0.0.1:9')
    api = K.get_api_client({'host': 'http://bob:hunter2@127.0.0.1:9', 'api_key': 't'})
    c = K.K8sClient(api, request_timeout=1, get_attempts=1, sleep=lambda s: None)
    with pytest.raises(K.K8sError) as exc:
        c.get('/api/v1/nodes/n')
    text = str(exc.value)
    assert 's3cr3t' not in text and 'hunter2' not in text and 'alice' not in text and 'bob' not in text, text


@pytest.mark.parametrize('url,clean', [
    ('https://user:pass@proxy:3128', 'https://proxy:3128'),
    ('http://user@proxy', 'http://proxy'),
    ('socks5h://u:p%40ss@10.0.0.1:1080/x', 'socks5h://10.0.0.1:1080/x'),
    ('https://api.test:6443', 'https://api.test:6443'),
    ('proxy 1: https://a:b@h/ and http://c:d@i:1', 'proxy 1: https://h/ and http://i:1'),
])
def test_redact_urls(url, clean):
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import redact_urls
    assert redact_urls(url) == clean


# -- 2026-12-06 review T3-11: only a YAML boolean turns TLS verification off ------------------------------
@pytest.mark.parametrize('value', ['false', 'no', '0', 'true', 'ture', 0, 1, 'False'])
def test_insecure_skip_tls_verify_must_be_a_boolean(tls_server, pki, value):
    user = {'client-certificate-data': _b64(pki / 'client.crt'), 'client-key-data': _b64(pki / 'client.key')}
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'kubeconfig': _kubeconfig(tls_server.url, {'insecure-skip-tls-verify': value}, user)})
    assert str(exc.value) == ("cannot load the Kubernetes configuration (kubeconfig='<dict>', context=None): cluster "
                              "'k': insecure-skip-tls-verify: %r is not a boolean (write true or false, unquoted)"
                              % (value,))
    for accepted in (False, None):  # false written unquoted, or left empty: verified
        assert K.get_api_client({'kubeconfig': _kubeconfig(tls_server.url, {'insecure-skip-tls-verify': accepted},
                                                           user)}).verify_ssl is True


def test_a_plugin_kubeconfig_is_checked_before_the_library_reads_it(tls_server):
    # An exec user goes to the kubernetes library, whose loader takes any truthy value as "skip".
    user = {'exec': {'apiVersion': 'client.authentication.k8s.io/v1', 'command': 'true'}}
    with pytest.raises(K.K8sError, match="insecure-skip-tls-verify: 'no' is not a boolean"):
        K.get_api_client({'kubeconfig': _kubeconfig(tls_server.url, {'insecure-skip-tls-verify': 'no'}, user)})


@pytest.mark.parametrize('value', ['no', 'false', 0])
def test_validate_certs_must_be_a_boolean(value):
    with pytest.raises(K.K8sError, match=r"^validate_certs: .* is not a boolean$"):
        K.get_api_client({'host': 'https://127.0.0.1:6443', 'validate_certs': value})


# -- 2026-12-06 review T3-10: the proxy option carries no credentials; they go in a no_log option ---------
@pytest.mark.parametrize('proxy', ['http://ops:Pr0xyPassw0rd@127.0.0.1:3128', 'socks5h://ops:Pr0xyPassw0rd@p:1080',
                                   'http://Pr0xyPassw0rd@p:3128'])
def test_a_proxy_option_with_credentials_is_refused(no_proxy_env, proxy):
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'host': 'https://api.test:6443', 'api_key': 't', 'proxy': proxy})
    assert 'Pr0xyPassw0rd' not in str(exc.value)
    assert str(exc.value) == ('proxy: %r has credentials in it; give them as proxy_headers.proxy_basic_auth '
                              '(user:password), which is never logged' % proxy.replace('ops:', '').replace(
                                  'Pr0xyPassw0rd@', ''))


def test_proxy_basic_auth_reaches_the_proxy(server, no_proxy_env):
    api = K.get_api_client({'host': 'http://10.255.255.1:6443', 'api_key': 't', 'proxy': server.url,
                            'proxy_headers': {'proxy_basic_auth': 'ops:Pr0xyPassw0rd'}})
    assert 'Pr0xyPassw0rd' not in repr(api)
    with pytest.raises(K.NotFoundError):
        K.K8sClient(api, get_attempts=1).get('/api/v1/nodes/n')
    assert server.log[-1][1] == 'http://10.255.255.1:6443/api/v1/nodes/n'
    assert server.log[-1][3]['Proxy-Authorization'] == 'Basic b3BzOlByMHh5UGFzc3cwcmQ='
    with pytest.raises(K.K8sError, match=r'^proxy_headers.proxy_basic_auth: give it as user:password$'):
        K.get_api_client({'host': 'http://10.255.255.1:6443', 'proxy': server.url,
                          'proxy_headers': {'proxy_basic_auth': 'Pr0xyPassw0rd'}})


def test_proxy_headers_is_a_no_log_option():
    assert K.AUTH_ARG_SPEC['proxy_headers']['options']['proxy_basic_auth']['no_log'] is True


# -- KUBECONFIG with several files, as kubectl merges them ---------------------------------------
def _write_config(path, cfg):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg))
    return str(path)


def test_kubeconfig_with_several_files_is_merged_as_kubectl_does(server, tmp_path, monkeypatch):
    # The first file sets current-context and wins the cluster "prod"; the second holds the user, with
    # a token file relative to the second file's own directory.
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    first = _write_config(tmp_path / 'a' / 'config', {
        'current-context': 'prod',
        'clusters': [{'name': 'prod', 'cluster': {'server': server.url}}],
        'contexts': [{'name': 'prod', 'context': {'cluster': 'prod', 'user': 'ops'}}]})
    (tmp_path / 'b').mkdir()
    (tmp_path / 'b' / 'token').write_text('from-second-file\n')
    second = _write_config(tmp_path / 'b' / 'config', {
        'current-context': 'other',
        'clusters': [{'name': 'prod', 'cluster': {'server': 'http://127.0.0.1:1'}}],
        'users': [{'name': 'ops', 'user': {'tokenFile': 'token'}}]})
    monkeypatch.setenv('KUBECONFIG', os.pathsep.join([first, str(tmp_path / 'missing'), '', second]))
    api = K.get_api_client({})
    assert api.host == server.url and api.loader == 'kubeconfig'
    K.K8sClient(api, sleep=lambda s: None).get('/api/v1/nodes/n')
    assert server.log[-1][3]['Authorization'] == 'Bearer from-second-file'


def test_merge_keeps_the_first_entry_of_a_name_and_resolves_files_per_file(tmp_path):
    first = _write_config(tmp_path / 'one' / 'config', {
        'users': [{'name': 'u', 'user': {'client-certificate': 'c.crt', 'client-key': '/abs/k.key',
                                         'exec': {'command': './bin/cred'}}}]})
    second = _write_config(tmp_path / 'two' / 'config', {
        'current-context': 'c',
        'clusters': [{'name': 'k', 'cluster': {'server': 'https://x', 'certificate-authority': 'ca.crt'}}],
        'users': [{'name': 'u', 'user': {'token': 'loses'}}, {'name': 'w', 'user': {'exec': {'command': 'aws'}}}]})
    merged = K.merge_kubeconfigs([first, second])
    assert merged['current-context'] == 'c'
    users = {u['name']: u['user'] for u in merged['users']}
    assert users['u'] == {'client-certificate': str(tmp_path / 'one' / 'c.crt'), 'client-key': '/abs/k.key',
                          'exec': {'command': str(tmp_path / 'one' / 'bin' / 'cred')}}
    assert users['w'] == {'exec': {'command': 'aws'}}  # a bare command is looked up in PATH
    assert merged['clusters'][0]['cluster']['certificate-authority'] == str(tmp_path / 'two' / 'ca.crt')


def test_a_bad_file_among_several_is_named(tmp_path, monkeypatch):
    good = _write_config(tmp_path / 'good', {'clusters': [{'name': 'k', 'cluster': {'server': 'http://x'}}]})
    bad = _write_config(tmp_path / 'bad', {'clusters': [{'cluster': {'server': 'http://y'}}]})
    monkeypatch.setenv('KUBECONFIG', os.pathsep.join([good, bad]))
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({})
    assert '%s: an entry of clusters has no name' % bad in str(exc.value)


def test_an_explicit_list_of_kubeconfigs_must_all_exist(tmp_path):
    good = _write_config(tmp_path / 'good', {})
    with pytest.raises(K.K8sError) as exc:
        K.get_api_client({'kubeconfig': os.pathsep.join([good, str(tmp_path / 'gone')])})
    assert str(exc.value) == "kubeconfig '%s' does not exist" % (tmp_path / 'gone')


def test_kubeconfig_paths_defaults(monkeypatch):
    monkeypatch.delenv('KUBECONFIG', raising=False)
    assert K.kubeconfig_paths() == [os.path.expanduser('~/.kube/config')]
    monkeypatch.setenv('KUBECONFIG', '')
    assert K.kubeconfig_paths() == [os.path.expanduser('~/.kube/config')]
    monkeypatch.setenv('KUBECONFIG', os.pathsep.join(['/a', '', '~/b']))
    assert K.kubeconfig_paths() == ['/a', os.path.expanduser('~/b')]


# -- a 401 during a long wait: the credentials are read again, once ------------------------------
def test_a_401_reads_a_rotated_token_file_again_and_resends_once(server, tmp_path):
    token = tmp_path / 'token'
    token.write_text('old')
    config = _write_config(tmp_path / 'config', {
        'current-context': 'c', 'clusters': [{'name': 'k', 'cluster': {'server': server.url}}],
        'users': [{'name': 'u', 'user': {'tokenFile': str(token)}}],
        'contexts': [{'name': 'c', 'context': {'cluster': 'k', 'user': 'u'}}]})
    server.script[('PATCH', '/api/v1/nodes/n')] = [(401, {'message': 'Unauthorized'}, 0), (200, NODE, 0)]
    k8s = K.K8sClient.from_params({'kubeconfig': config}, sleep=lambda s: None)
    token.write_text('new')  # rotated while the module waited
    assert k8s.patch('/api/v1/nodes/n', {'spec': {}}) == NODE
    assert [entry[3]['Authorization'] for entry in server.log] == ['Bearer old', 'Bearer new']
    assert k8s.reloads_made == 1


def test_a_second_401_is_the_error(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(401, {'message': 'Unauthorized'}, 0)]
    k8s = K.K8sClient.from_params({'host': server.url, 'api_key': 'expired'}, sleep=lambda s: None)
    with pytest.raises(K.K8sError) as exc:
        k8s.get('/api/v1/nodes/n')
    assert exc.value.status == 401 and 'HTTP 401' in str(exc.value)
    assert len(server.log) == 2 and k8s.reloads_made == 1


def test_a_client_built_from_a_connection_does_not_reload(server):
    server.script[('GET', '/api/v1/nodes/n')] = [(401, {'message': 'Unauthorized'}, 0), (200, NODE, 0)]
    with pytest.raises(K.K8sError):
        client(server).get('/api/v1/nodes/n')
    assert len(server.log) == 1


# -- the kubernetes library's paths: in-cluster service account, OIDC auth-provider ---------------
@pytest.fixture
def tls_token_server(pki):
    """The scripted server behind TLS (server certificate from the CA; no client certificate asked)."""
    s = Scripted()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(pki / 'server.crt'), str(pki / 'server.key'))
    s.httpd.socket = ctx.wrap_socket(s.httpd.socket, server_side=True)
    s.url = s.url.replace('http://', 'https://')
    yield s
    s.close()


def test_in_cluster_service_account_with_a_rotated_token(tls_token_server, pki, tmp_path, monkeypatch):
    # A pod (an AWX execution environment) with no kubeconfig: the service account's token and CA.
    incluster = pytest.importorskip('kubernetes.config.incluster_config')
    token = tmp_path / 'token'
    token.write_text('sa-token-1')
    monkeypatch.setattr(incluster, 'SERVICE_TOKEN_FILENAME', str(token))
    monkeypatch.setattr(incluster, 'SERVICE_CERT_FILENAME', str(pki / 'ca.crt'))
    monkeypatch.setenv('KUBERNETES_SERVICE_HOST', '127.0.0.1')
    monkeypatch.setenv('KUBERNETES_SERVICE_PORT', tls_token_server.url.rsplit(':', 1)[1])
    monkeypatch.setenv('KUBECONFIG', str(tmp_path / 'no-such-kubeconfig'))
    tls_token_server.script[('GET', '/api/v1/nodes/n')] = [
        (200, NODE, 0), (401, {'message': 'Unauthorized'}, 0), (200, NODE, 0)]
    k8s = K.K8sClient.from_params({}, sleep=lambda s: None)
    assert k8s.api.loader == 'kubernetes' and k8s.api.verify_ssl
    assert k8s.get('/api/v1/nodes/n') == NODE
    token.write_text('sa-token-2')  # the kubelet rotates the projected token
    assert k8s.get('/api/v1/nodes/n') == NODE
    # The library writes the scheme as "bearer"; the API server takes either case.
    assert [e[3]['Authorization'].lower() for e in tls_token_server.log] == ['bearer sa-token-1', 'bearer sa-token-1',
                                                                             'bearer sa-token-2']


def _jwt(claims):
    def part(value):
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip('=')
    return '%s.%s.%s' % (part({'alg': 'RS256', 'typ': 'JWT'}), part(claims), part('signature'))


def test_oidc_auth_provider_id_token_is_sent(server):
    pytest.importorskip('kubernetes')
    server.script[('GET', '/api/v1/nodes/n')] = [(200, NODE, 0)]
    id_token = _jwt({'iss': 'https://idp.example', 'sub': 'ops', 'exp': int(time.time()) + 3600})
    config = _kubeconfig(server.url, {}, {'auth-provider': {'name': 'oidc', 'config': {
        'client-id': 'kubernetes', 'idp-issuer-url': 'https://idp.example', 'id-token': id_token}}})
    api = K.get_api_client({'kubeconfig': config})
    assert api.loader == 'kubernetes'
    K.K8sClient(api, sleep=lambda s: None).get('/api/v1/nodes/n')
    assert server.log[-1][3]['Authorization'] == 'Bearer ' + id_token
