"""A Kubernetes module run in Ansible's worker (plugin_utils/_in_worker.K8sInWorker: delegated to the controller,
a local connection) answers as its module process does, on the real control plane: the same result, diff, check
mode, failure messages and no_log masking, and the same requests (issue 36: no Python start-up per call)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import k8s_scenario as S
from k8s_support import load, mutations, play

pytestmark = pytest.mark.slow

TARGET = {'driver': '580.130.00'}
# Localhost without a Python for module processes: a task that started one would fail to.
NO_MODULE_PROCESS = {'all': {'hosts': {'localhost': {
    'ansible_connection': 'local', 'ansible_python_interpreter': '/nonexistent/python3'}}}}
MODULE = 'ansible_collections.gpufleet.upgrade.plugins.modules.upgrade_state'


def module_process(cluster, tmp_path, args: dict, check_mode: bool = False, diff: bool = False) -> dict:
    """The module's result from its own process (what a task delegated to another host runs)."""
    path = tmp_path / 'args.json'
    path.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': dict(
        args, kubeconfig=cluster.kubeconfig, _ansible_check_mode=check_mode, _ansible_diff=diff)}))
    env = dict(os.environ, PYTHONPATH=os.environ['ANSIBLE_COLLECTIONS_PATH'])
    cp = subprocess.run([sys.executable, '-m', MODULE, str(path)], capture_output=True, text=True, env=env,
                        timeout=60, check=False)
    return json.loads(cp.stdout)


def in_worker(cluster, run_playbook, args: dict, check_mode: bool = False, diff: bool = False) -> dict:
    task = {'name': 'state', 'gpufleet.upgrade.upgrade_state': args, 'register': 'r', 'ignore_errors': True,
            'check_mode': check_mode, 'diff': diff}
    run = run_playbook(play(cluster, task), inventory=NO_MODULE_PROCESS)
    assert run.rc == 0, run.stdout
    return run.result('state')


def annotations(cluster) -> dict:
    return cluster.get('v1', 'Node', S.NODE)['metadata'].get('annotations') or {}


@pytest.mark.parametrize('args, check_mode', [
    ({'node': S.NODE, 'target': TARGET}, False),
    ({'node': S.NODE, 'target': TARGET, 'phase': 'failed'}, True),
    ({'node': S.NODE, 'target': TARGET, 'phase': 'failed'}, False),
    ({'node': 'gpu-404', 'target': TARGET}, False),
    ({'node': S.NODE, 'target': {'driver': 'a,b'}}, False),
    ({'node': S.NODE, 'target': TARGET, 'wait_ready': -1}, False),
    ({'node': S.NODE, 'target': TARGET, 'nope': 1}, False),
])
def test_the_worker_answers_as_the_module_process(cluster, run_playbook, tmp_path, args, check_mode):
    load(cluster)
    before = annotations(cluster)
    expected = module_process(cluster, tmp_path, args, check_mode=check_mode, diff=True)
    expected_writes = mutations(cluster)
    cluster.patch('v1', 'Node', S.NODE, {'metadata': {'annotations': dict(
        {k: None for k in annotations(cluster)}, **before)}})     # the node as the module process found it
    assert annotations(cluster) == before
    cluster.clear_requests()
    got = in_worker(cluster, run_playbook, args, check_mode=check_mode, diff=True)
    assert mutations(cluster) == expected_writes
    assert (got.get('_event') == 'runner_on_failed') == expected.get('failed', False)
    for key in ('changed', 'state', 'diff'):
        assert got.get(key, False) == expected.get(key, False), key
    # The module process names itself by its file when run bare; the task names the module.
    assert got.get('msg', '').replace('gpufleet.upgrade.upgrade_state', 'basic.py') == expected.get('msg', '')
    if args.get('phase') and not check_mode:
        assert expected_writes and got['changed'] and got['state']['phase'] == 'failed'


def test_a_secret_in_a_message_is_masked_as_in_the_module_process(cluster, run_playbook, tmp_path):
    args = {'node': S.NODE, 'target': TARGET, 'kubeconfig': str(tmp_path / 'no-such-kubeconfig')}
    got = in_worker(cluster, run_playbook, args)
    assert got['_event'] == 'runner_on_failed' and str(tmp_path) not in json.dumps(got)
    assert got['msg'] == "kubeconfig '********' does not exist (node %s)" % S.NODE


def test_elsewhere_the_module_process_runs(cluster, run_playbook):
    """With become the module would run as another user: its own process runs it (here: the absent Python)."""
    task = {'name': 'state', 'gpufleet.upgrade.upgrade_state': {'node': S.NODE, 'target': TARGET},
            'become': True, 'become_method': 'su', 'register': 'r', 'ignore_errors': True}
    run = run_playbook(play(cluster, task), inventory=NO_MODULE_PROCESS)
    res = run.result('state')
    assert res['_event'] == 'runner_on_failed' and 'state' not in res


def test_the_tasks_environment_reaches_the_module_in_the_worker(cluster, run_playbook):
    """A kubeconfig named only by the task's environment (K8S_AUTH_KUBECONFIG), as a module process reads it."""
    load(cluster)
    plays = [{'name': 'env', 'hosts': 'localhost', 'gather_facts': False,
              'environment': {'K8S_AUTH_KUBECONFIG': cluster.kubeconfig},
              'tasks': [{'name': 'state', 'gpufleet.upgrade.upgrade_state': {'node': S.NODE, 'target': TARGET},
                         'register': 'r'}]}]
    run = run_playbook(plays, inventory=NO_MODULE_PROCESS)
    assert run.rc == 0, run.stdout
    assert run.result('state')['state']['name'] == S.NODE
