"""The module arguments an action plugin checks in Ansible's worker: encoded as for a module, then validated."""
from __future__ import annotations

import datetime

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import ArgumentError, module_params

SPEC = {'path': {'type': 'path', 'required': True}, 'count': {'type': 'int', 'default': 3},
        'items': {'type': 'list', 'elements': 'dict', 'default': []},
        'mode': {'type': 'str', 'choices': ['a', 'b'], 'default': 'a'}}


def test_defaults_coercion_and_the_module_encoding():
    when = datetime.datetime(2026, 12, 5, 7, 0, 0)
    p = module_params({'path': '~/b.json', 'count': '7', 'items': [{'at': when}]}, SPEC, 'ns.coll.mod')
    assert p['count'] == 7 and p['mode'] == 'a' and not p['path'].startswith('~')
    assert p['items'] == [{'at': '2026-12-05T07:00:00'}]       # what a module process would have read


@pytest.mark.parametrize('args, message', [
    ({'path': 'x', 'nope': 1}, 'Unsupported parameters for (ns.coll.mod) module: nope. Supported parameters include: '),
    ({}, 'missing required arguments: path'),
    ({'path': 'x', 'mode': 'c'}, 'value of mode must be one of: a, b, got: c'),
    ({'path': 'x', 'count': 'many'}, "argument 'count' is of type "),
])
def test_errors_read_as_the_modules(args, message):
    with pytest.raises(ArgumentError) as exc:
        module_params(args, SPEC, 'ns.coll.mod')
    assert str(exc.value).startswith(message), str(exc.value)


def _worker(args, **kw):
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import WorkerK8sModule
    return WorkerK8sModule('demo', {'node': {'type': 'str', 'required': True},
                                    'mode': {'type': 'str', 'choices': ['a', 'b']},
                                    'other': {'type': 'str'}}, args, **kw)


def _exit(call):
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import WorkerExit
    with pytest.raises(WorkerExit) as done:
        call()
    return done.value.result


def test_a_k8s_module_in_the_worker_has_the_auth_options_and_the_modules_checks():
    module = _worker({'node': 'gpu-1', 'request_timeout': '3'}, check_mode=True, diff=True)
    assert module.params['node'] == 'gpu-1' and module.params['request_timeout'] == 3.0
    assert module.check_mode and module.diff(1, 2) == {'diff': {'before': 1, 'after': 2}}
    assert _exit(lambda: _worker({'node': 'gpu-1', 'nope': 1}))['msg'].startswith(
        'Unsupported parameters for (gpufleet.upgrade.demo) module: nope.')
    assert _exit(lambda: _worker({}))['msg'] == 'missing required arguments: node'
    assert _exit(lambda: _worker({'node': 'x', 'mode': 'a', 'other': 'y'},
                                 mutually_exclusive=[['mode', 'other']]))['msg'].startswith(
        'parameters are mutually exclusive: mode|other')
    assert _exit(lambda: _worker({'node': 'x'}, check_mode=True, supports_check_mode=False))['skipped'] is True


def test_exit_and_fail_mask_the_no_log_values_and_carry_the_warnings():
    module = _worker({'node': 'gpu-1', 'api_key': 's3cret-token'})
    module.warn('careful')
    result = _exit(lambda: module.fail_json(msg='token s3cret-token refused', exception='Traceback ...'))
    assert result == {'failed': True, 'msg': 'token ******** refused', 'warnings': ['careful']}
    assert _exit(lambda: module.exit_json(changed=True, echo='s3cret-token')) == {
        'changed': True, 'echo': 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER', 'warnings': ['careful']}   # as AnsibleModule


def test_errors_lets_the_exit_pass_as_it_lets_a_module_processs_sys_exit():
    module = _worker({'node': 'gpu-1'})

    def body():
        with module.errors():
            module.exit_json(changed=False)
    assert _exit(body) == {'changed': False}


def test_the_invocation_when_asked_for_carries_the_arguments_masked():
    module = _worker({'node': 'gpu-1', 'api_key': 's3cret-token'}, invocation=True)
    result = _exit(lambda: module.exit_json(changed=False))
    assert result['invocation']['module_args']['node'] == 'gpu-1'
    assert 's3cret-token' not in repr(result) and result['invocation']['module_args']['api_key'] == 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'
    assert 'invocation' not in _exit(lambda: _worker({'node': 'gpu-1'}).exit_json())


def test_a_credential_in_a_url_option_is_masked_as_in_the_module_process():
    module = _worker({'node': 'gpu-1', 'host': 'https://ops:Pr0xy@api:6443'}, invocation=True)
    result = _exit(lambda: module.fail_json(msg='no'))
    assert 'Pr0xy' not in repr(result) and result['invocation']['module_args']['host'].startswith('https://')
