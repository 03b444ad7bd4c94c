"""No credential of the Kubernetes auth options reaches a result, a registered variable, an event
or the output, even at -vvv with the invocation injected (issue 12, item 10)."""
from __future__ import annotations

import json

import pytest
import yaml

import k8s_scenario as S
from cluster import rbac
from k8s_support import load

pytestmark = pytest.mark.slow


def _inline_kubeconfig(cluster) -> tuple[dict, str]:
    """A real credential the API server accepts: a service account's token (bound to the reader role),
    inline in the kubeconfig dict."""
    with open(rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-reader'), encoding='utf-8') as f:
        config = yaml.safe_load(f)
    return config, config['users'][0]['user']['token']


def test_an_inline_kubeconfig_token_appears_nowhere(cluster, run_playbook):
    load(cluster)
    kubeconfig, token = _inline_kubeconfig(cluster)
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
    assert len(token) > 100
    assert token not in run.stdout
    assert token not in json.dumps(run.events)
    for part in token.split('.'):                     # nor any part of the JWT
        assert part not in run.stdout
