"""No credential of the Kubernetes auth options reaches a result, a registered variable, an event
or the output, even at -vvv with the invocation injected (issue 12, item 10)."""
from __future__ import annotations

import json

import pytest
import yaml

import k8s_scenario as S
from k8s_support import load

pytestmark = pytest.mark.slow

TOKEN = 'sha256~gpufleet-Inline-Token-9f3c2a71'


def _inline_kubeconfig(emulator) -> dict:
    with open(emulator.kubeconfig, encoding='utf-8') as f:
        config = yaml.safe_load(f)
    for user in config['users']:
        user['user'] = {'token': TOKEN}
    return config


def test_an_inline_kubeconfig_token_appears_nowhere(emulator, run_playbook):
    load(emulator)
    kubeconfig = _inline_kubeconfig(emulator)
    play = [{'name': 'inline kubeconfig', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'read', 'gpufleet.upgrade.upgrade_state': {
            'node': S.NODE, 'target': {'driver': '580.130.00'}, 'kubeconfig': kubeconfig}, 'register': 'progress'},
        {'name': 'show what was registered', 'ansible.builtin.debug': {'var': 'progress'}},
        {'name': 'fail', 'ignore_errors': True, 'gpufleet.upgrade.node_drain': {
            'name': 'gpu-404', 'state': 'cordon', 'kubeconfig': kubeconfig}, 'register': 'failed_drain'},
        {'name': 'show the failure', 'ansible.builtin.debug': {'var': 'failed_drain'}},
    ]}]
    run = run_playbook(play, cmdline='-vvv', envvars={'ANSIBLE_INJECT_INVOCATION': 'true'})
    assert run.rc == 0, run.stdout
    res = run.result('read')
    assert res['state']['name'] == S.NODE           # the inline kubeconfig was used
    assert 'invocation' in res                        # and the invocation was injected
    assert 'failed_drain' in run.stdout
    assert TOKEN not in run.stdout
    assert TOKEN not in json.dumps(run.events)
