"""No credential of a URL option (the Kubernetes modules' proxy, metric_gate's url) reaches a registered
result with the invocation injected (2026-12-06 review T3-10): a URL with userinfo is refused and its
userinfo masked; the credentials go in no_log options (proxy_headers.proxy_basic_auth, url_password).
No cluster and no Prometheus: every task fails fast against closed loopback ports."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

PROXY_PW = 'Pr0xyPassw0rd'
PROM_PW = 'Pr0mPassw0rd'


def test_url_credentials_appear_in_no_result(run_playbook):
    tasks = [
        ('proxy with userinfo', 'gpufleet.upgrade.stop_switch_info',
         {'host': 'https://127.0.0.1:1', 'proxy': 'http://ops:%s@127.0.0.1:9' % PROXY_PW, 'request_timeout': 2}),
        ('proxy_basic_auth', 'gpufleet.upgrade.stop_switch_info',
         {'host': 'https://127.0.0.1:1', 'proxy': 'http://127.0.0.1:9', 'request_timeout': 2,
          'proxy_headers': {'proxy_basic_auth': 'ops:%s' % PROXY_PW}}),
        ('url with userinfo', 'gpufleet.upgrade.metric_gate',
         {'url': 'http://prom:%s@127.0.0.1:9' % PROM_PW, 'window': '5m', 'presets': ['xid'], 'node': 'gpu-7'}),
        ('url_password', 'gpufleet.upgrade.metric_gate',
         {'url': 'http://127.0.0.1:9', 'url_username': 'prom', 'url_password': PROM_PW, 'window': '5m',
          'presets': ['xid'], 'node': 'gpu-7', 'timeout': 2}),
    ]
    play = [{'name': 'url credentials', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': name, module: args, 'register': 'r%d' % i, 'ignore_errors': True}
        for i, (name, module, args) in enumerate(tasks)] + [
        {'name': 'show what was registered', 'ansible.builtin.debug': {'msg': '{{ [r0, r1, r2, r3] | to_json }}'}}]}]
    run = run_playbook(play, cmdline='-v', envvars={'ANSIBLE_INJECT_INVOCATION': 'true'})
    assert run.rc == 0, run.stdout
    results = [run.result(name) for name, _m, _a in tasks]
    assert all('invocation' in r for r in results)                  # the invocation was injected
    assert results[0]['msg'] == ("proxy: 'http://127.0.0.1:9' has credentials in it; give them as "
                                 "proxy_headers.proxy_basic_auth (user:password), which is never logged "
                                 "(reading the stop switch)")
    assert results[0]['invocation']['module_args']['proxy'] == 'http://********@127.0.0.1:9'
    assert results[2]['msg'].startswith("metric gate: invalid input: url: 'http://127.0.0.1:9' has credentials")
    assert results[2]['invocation']['module_args']['url'] == 'http://********@127.0.0.1:9'
    assert 'cannot reach' in results[1]['msg'] and 'cannot reach' in results[3]['msg']
    registered = json.dumps(results) + json.dumps([e.get('event_data', {}).get('res') for e in run.events])
    for secret in (PROXY_PW, PROM_PW):
        assert secret not in registered
