"""Unit tests of the Kubernetes module base (plugins/module_utils/_k8s_module.py): the merged
argument spec, the merge-patch prediction, the diff, the error mapping, and a module run end to end
against a scripted API server on loopback without the kubernetes library."""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _k8s, _k8s_module
from ansible_collections.gpufleet.upgrade.plugins.module_utils._drain import DrainError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import (
    AUTH_ARG_SPEC, ConflictError, K8sError, NotFoundError)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import (
    K8sModule, apply_merge_patch, diff, failure, k8s_argument_spec, update_or_predict)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._suc_plan import SucPlanError
from tools.module_exit import ModuleExit, capture_module_exits


# -- the argument spec ---------------------------------------------------------------------
def test_the_auth_options_are_merged_with_their_secrets_marked():
    spec = k8s_argument_spec({'node': {'type': 'str', 'required': True}})
    assert set(spec) == set(AUTH_ARG_SPEC) | {'node'}
    # The whole kubeconfig (a path, or inline with tokens and keys) is a secret, as are the token and password.
    assert spec['kubeconfig'] == {'type': 'raw', 'no_log': True}
    assert spec['api_key']['no_log'] is True and spec['password']['no_log'] is True
    assert spec['client_key']['no_log'] is False      # a path, not a key
    spec['kubeconfig']['no_log'] = False               # a copy: the shared spec is untouched
    assert AUTH_ARG_SPEC['kubeconfig']['no_log'] is True


def test_a_module_option_may_not_replace_an_auth_option():
    with pytest.raises(ValueError, match='module options host, kubeconfig clash with the Kubernetes auth options'):
        k8s_argument_spec({'kubeconfig': {'type': 'path'}, 'host': {'type': 'str'}, 'node': {'type': 'str'}})


# -- the merge patch (RFC 7386) -------------------------------------------------------------
@pytest.mark.parametrize('obj,patch,after', [
    ({'a': 1}, None, {'a': 1}),                                               # nothing to change
    ({'a': 1}, {}, {'a': 1}),
    ({'a': 1, 'b': 2}, {'a': None}, {'b': 2}),                                # null removes
    ({'a': 1}, {'z': None}, {'a': 1}),                                        # removing what is not there
    ({'m': {'x': 1, 'y': 2}}, {'m': {'y': None, 'z': 3}}, {'m': {'x': 1, 'z': 3}}),
    ({'spec': {'taints': [1, 2]}}, {'spec': {'taints': [3]}}, {'spec': {'taints': [3]}}),   # a list is replaced whole
    ({'m': 'scalar'}, {'m': {'k': 'v', 'gone': None}}, {'m': {'k': 'v'}}),   # a mapping over a scalar
    ({}, {'metadata': {'labels': {'k': 'v', 'x': None}}}, {'metadata': {'labels': {'k': 'v'}}}),
    ({'a': 1}, ['not', 'a', 'mapping'], ['not', 'a', 'mapping']),             # RFC 7386: replaces the target
])
def test_apply_merge_patch(obj, patch, after):
    before = json.loads(json.dumps(obj))
    assert apply_merge_patch(obj, patch) == after
    assert obj == before                                                      # the input is not changed


def test_apply_merge_patch_shares_nothing_with_its_inputs():
    node = {'metadata': {'labels': {'a': '1'}}}
    patch = {'spec': {'taints': [{'key': 'k'}]}}
    after = apply_merge_patch(node, patch)
    after['metadata']['labels']['b'] = '2'
    after['spec']['taints'][0]['key'] = 'changed'
    assert node == {'metadata': {'labels': {'a': '1'}}} and patch == {'spec': {'taints': [{'key': 'k'}]}}


def test_diff_names_both_sides():
    assert diff({'a': 1}, {'a': 2}, 'node/gpu-1') == {'before': {'a': 1}, 'after': {'a': 2},
                                                      'before_header': 'node/gpu-1', 'after_header': 'node/gpu-1'}
    assert diff({}, {'x': 1}) == {'before': {}, 'after': {'x': 1}}


# -- check mode's prediction ---------------------------------------------------------------
class FakeClient:
    def __init__(self, obj):
        self.obj = obj
        self.calls = []

    def get(self, path):
        self.calls.append(('GET', path))
        return json.loads(json.dumps(self.obj))

    def update(self, path, compute):
        self.calls.append(('UPDATE', path))
        before = self.get(path)
        self.obj = apply_merge_patch(before, compute(before))
        return before, self.obj


def _label(node):
    return None if (node['metadata'].get('labels') or {}).get('k') == 'v' else {'metadata': {'labels': {'k': 'v'}}}


def test_check_mode_predicts_the_after_and_writes_nothing():
    client = FakeClient({'metadata': {'name': 'n'}})
    before, after = update_or_predict(client, '/api/v1/nodes/n', _label, check_mode=True)
    assert before == {'metadata': {'name': 'n'}} and after == {'metadata': {'name': 'n', 'labels': {'k': 'v'}}}
    assert client.calls == [('GET', '/api/v1/nodes/n')] and client.obj == {'metadata': {'name': 'n'}}
    before, after = update_or_predict(client, '/api/v1/nodes/n', _label, check_mode=False)
    assert client.calls[1] == ('UPDATE', '/api/v1/nodes/n') and client.obj == after
    # The prediction of a node that needs nothing is the node itself.
    assert update_or_predict(client, '/api/v1/nodes/n', _label, check_mode=True) == (after, after)


def test_compute_gets_a_copy_in_check_mode():
    client = FakeClient({'metadata': {'name': 'n'}})

    def meddle(node):
        node['metadata']['name'] = 'changed'
        return None
    before, after = update_or_predict(client, '/api/v1/nodes/n', meddle, check_mode=True)
    assert before['metadata']['name'] == 'n' and after['metadata']['name'] == 'n'


# -- errors ---------------------------------------------------------------------------------
NODE = '/api/v1/nodes/gpu-1'


@pytest.mark.parametrize('exc,kwargs,expected', [
    (K8sError('GET /api/v1/nodes: HTTP 403 forbidden', status=403), {}, ('GET /api/v1/nodes: HTTP 403 forbidden', {})),
    (K8sError('PATCH x: HTTP 422 bad'), {'context': 'node gpu-1'}, ('PATCH x: HTTP 422 bad (node gpu-1)', {})),
    (ConflictError('the object kept changing'), {'context': 'node gpu-1, state drain'},
     ('the object kept changing (node gpu-1, state drain)', {})),
    # A missing node named by the module; another missing object keeps the request's message.
    (NotFoundError('GET %s: HTTP 404' % NODE, status=404, path=NODE), {'context': 'node gpu-1', 'not_found': {
        NODE: "node: 'gpu-1' does not exist"}}, ("node: 'gpu-1' does not exist", {})),
    (NotFoundError('GET /api/v1/pods: HTTP 404', status=404, path='/api/v1/pods'),
     {'context': 'node gpu-1', 'not_found': {NODE: 'node: gone'}}, ('GET /api/v1/pods: HTTP 404 (node gpu-1)', {})),
    # The module's domain errors, with the field and value in their message.
    (DrainError('timeout: -1 must be positive'), {'expected': (DrainError,)}, ('timeout: -1 must be positive', {})),
    (SucPlanError(['a: bad', 'b: worse']), {'expected': (SucPlanError,), 'prefixes': {
        SucPlanError: 'refusing to apply RKE2 Plans: ', K8sError: 'applying RKE2 Plans failed: '}},
     ('refusing to apply RKE2 Plans: a: bad; b: worse', {'problems': ['a: bad', 'b: worse']})),
    (K8sError('POST p: HTTP 500'), {'prefixes': {SucPlanError: 'refusing: ', K8sError: 'applying failed: '}},
     ('applying failed: POST p: HTTP 500', {})),
])
def test_expected_errors_become_messages(exc, kwargs, expected):
    assert failure(exc, **kwargs) == expected


@pytest.mark.parametrize('exc', [KeyError('metadata'), TypeError('x'), DrainError('not expected here')])
def test_other_errors_are_unexpected(exc):
    assert failure(exc) is None


@pytest.fixture
def exits(monkeypatch):
    capture_module_exits(monkeypatch)


def _module(args=None, **kw):
    with patch_module_args(dict({'node': 'gpu-1', 'host': 'http://127.0.0.1:9'}, **(args or {}))):
        return K8sModule('node_test', {'node': {'type': 'str', 'required': True}}, **kw)


def _fails(module, exc, **kw):
    with pytest.raises(ModuleExit) as out:
        with module.errors(**kw):
            raise exc
    return out.value.result


def test_errors_fail_the_module_with_the_message_and_the_result(exits):
    result = _fails(_module(), K8sError('GET n: HTTP 500'), context='node gpu-1', passed=False)
    assert result == {'msg': 'GET n: HTTP 500 (node gpu-1)', 'passed': False, 'failed': True}
    # With count_requests, the requests made so far (none: the client was never built).
    result = _fails(_module(count_requests=True), K8sError('x'))
    assert result == {'msg': 'x', 'api_requests': 0, 'failed': True}


def test_an_unexpected_error_keeps_its_traceback(exits, monkeypatch):
    # ansible_builder (imported by an integration test collected in the same run) sets sys.tracebacklimit = 0.
    monkeypatch.delattr(sys, 'tracebacklimit', raising=False)
    result = _fails(_module(), KeyError('metadata'), passed=False)
    assert result['msg'] == "node_test failed: 'metadata'"
    assert 'Traceback' in result['exception'] and "KeyError: 'metadata'" in result['exception']
    assert 'passed' not in result
    assert 'exception' not in _fails(_module(), K8sError('expected'))


def test_exit_and_fail_inside_the_block_pass(exits):
    module = _module()
    with pytest.raises(ModuleExit) as out:
        with module.errors():
            module.fail_json(msg='names: no such node')
    assert out.value.result == {'msg': 'names: no such node', 'failed': True}


def test_the_diff_only_in_diff_mode(exits):
    assert _module().diff({'a': 1}, {'a': 2}, 'node/gpu-1') == {}
    assert _module({'_ansible_diff': True}).diff({'a': 1}, {'a': 2}) == {'diff': {'before': {'a': 1}, 'after': {'a': 2}}}


def test_a_bad_connection_is_an_expected_error(exits):
    module = _module({'host': None, 'kubeconfig': '/nonexistent/kubeconfig'})
    with pytest.raises(ModuleExit) as out:
        with module.errors(context='node gpu-1'):
            module.client.get(NODE)
    assert out.value.result == {'msg': "kubeconfig '/nonexistent/kubeconfig' does not exist (node gpu-1)",
                                'failed': True}


# -- a module end to end, without the kubernetes library ------------------------------------
class Api:
    """A scripted API server on loopback: {path: (status, body)}; PATCH bodies are recorded."""

    def __init__(self, answers):
        self.answers = answers
        self.log = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _do(self):
                length = int(self.headers.get('Content-Length') or 0)
                outer.log.append((self.command, self.path, self.rfile.read(length).decode() if length else ''))
                status, body = outer.answers.get(self.path.split('?')[0], (404, {'message': 'not found'}))
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
            do_GET = do_PATCH = _do

        self.httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = 'http://127.0.0.1:%d' % self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def without_kubernetes(monkeypatch):
    """`import kubernetes` fails, as on a host without the library."""
    monkeypatch.setattr(_k8s, 'HAS_KUBERNETES', False)
    for name in [m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, 'kubernetes', None)


def _run_upgrade_state(api, **args):
    from ansible_collections.gpufleet.upgrade.plugins.modules import upgrade_state
    with patch_module_args(dict({'host': api.url, 'api_key': 'sekret-token', 'target': {'driver': '580.130.00'}},
                                **args)):
        with pytest.raises(ModuleExit) as out:
            upgrade_state.main()
    return out.value.result


def test_a_module_runs_without_the_kubernetes_library(exits, without_kubernetes):
    node = {'metadata': {'name': 'gpu-1', 'resourceVersion': '7', 'annotations': {}},
            'status': {'conditions': [{'type': 'Ready', 'status': 'True'}]}}
    api = Api({'/api/v1/nodes/gpu-1': (200, node)})
    try:
        # Check and diff mode: the recorded phase is predicted, nothing is written.
        result = _run_upgrade_state(api, node='gpu-1', phase='installed', _ansible_check_mode=True,
                                    _ansible_diff=True)
        assert result['failed'] is False and result['changed'] is True
        assert result['state']['recorded'] == 'installed' and result['state']['name'] == 'gpu-1'
        assert result['diff'] == {'before': {}, 'after': {'gpufleet.io/upgrade-state': 'installed',
                                                          'gpufleet.io/upgrade-target': 'driver=580.130.00'},
                                  'before_header': 'node/gpu-1', 'after_header': 'node/gpu-1'}
        assert [m for m, _p, _b in api.log] == ['GET']
        # A node that does not exist: the module's message, no traceback, no secret.
        result = _run_upgrade_state(api, node='gpu-404')
        assert result == {'msg': "node: 'gpu-404' does not exist", 'failed': True}
        # Only an exec (or auth-provider) plugin needs the library: a clear message then.
        exec_user = {'exec': {'apiVersion': 'client.authentication.k8s.io/v1', 'command': 'get-token'}}
        kubeconfig = {'current-context': 'c', 'contexts': [{'name': 'c', 'context': {'cluster': 'k', 'user': 'u'}}],
                      'clusters': [{'name': 'k', 'cluster': {'server': api.url}}],
                      'users': [{'name': 'u', 'user': exec_user}]}
        result = _run_upgrade_state(api, node='gpu-1', host=None, api_key=None, kubeconfig=kubeconfig)
        assert result == {'msg': 'the kubernetes Python library is required to read this configuration (an exec or '
                                 'auth-provider plugin, or the in-cluster service account) (node gpu-1)',
                          'failed': True}
    finally:
        api.close()
    assert 'kubernetes' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]
    assert _k8s_module.__name__ in sys.modules


def _run_node_isolation(api, **args):
    from ansible_collections.gpufleet.upgrade.plugins.modules import node_isolation
    with patch_module_args(dict({'host': api.url, 'api_key': 'sekret-token'}, **args)):
        with pytest.raises(ModuleExit) as out:
            node_isolation.main()
    return out.value.result


@pytest.mark.parametrize('check_mode', [True, False])
def test_check_mode_reports_changed_as_the_real_run(exits, check_mode):
    # Released by hand but for the owner annotation: the patch drops the annotation, the labels and taints
    # stay as they are, so neither run reports a change.
    node = {'metadata': {'name': 'gpu-1', 'resourceVersion': '7', 'labels': {'pool': 'a'},
                         'annotations': {'gpufleet.io/isolated-by': 'gpufleet.upgrade.canary'}},
            'spec': {'taints': [{'key': 'other', 'value': 'x', 'effect': 'NoSchedule'}]}}
    api = Api({'/api/v1/nodes/gpu-1': (200, node)})   # the PATCH answer, too: the view is the same
    try:
        result = _run_node_isolation(api, node='gpu-1', state='absent', owner='gpufleet.upgrade.canary',
                                     _ansible_check_mode=check_mode)
    finally:
        api.close()
    assert result['failed'] is False and result['changed'] is False and result['released'] is True
    assert [m for m, _p, _b in api.log] == (['GET'] if check_mode else ['GET', 'PATCH'])
