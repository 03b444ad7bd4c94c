"""A Kubernetes module run in Ansible's worker (plugin_utils/_in_worker.K8sInWorker: delegated to the controller,
a local connection) answers as its module process does, on the real control plane: the same result, diff, check
mode, failure messages and no_log masking, and the same requests (issue 36: no Python start-up per call).
node_isolation stands for them all (one class runs every such module)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import k8s_scenario as S
from k8s_support import load, mutations, play

pytestmark = pytest.mark.slow

# Localhost without a Python for module processes: a task that started one would fail to.
NO_MODULE_PROCESS = {'all': {'hosts': {'localhost': {
    'ansible_connection': 'local', 'ansible_python_interpreter': '/nonexistent/python3'}}}}
MODULE = 'ansible_collections.gpufleet.upgrade.plugins.modules.node_isolation'


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
    task = {'name': 'state', 'gpufleet.upgrade.node_isolation': args, 'register': 'r', 'ignore_errors': True,
            'check_mode': check_mode, 'diff': diff}
    run = run_playbook(play(cluster, task), inventory=NO_MODULE_PROCESS)
    assert run.rc == 0, run.stdout
    return run.result('state')


def isolation(cluster) -> tuple[dict, list]:
    node = cluster.get('v1', 'Node', S.NODE)
    return dict(node['metadata'].get('labels') or {}), list(node['spec'].get('taints') or [])


@pytest.mark.parametrize('args, check_mode', [
    ({'node': S.NODE}, True),
    ({'node': S.NODE}, False),
    ({'node': S.NODE, 'state': 'absent'}, False),
    ({'node': S.NODE, 'owner': 'run-7'}, False),
    ({'node': 'gpu-404'}, False),
    ({'node': ' '}, False),
    ({'node': S.NODE, 'state': 'gone'}, False),
    ({'node': S.NODE, 'nope': 1}, False),
])
def test_the_worker_answers_as_the_module_process(cluster, run_playbook, tmp_path, args, check_mode):
    load(cluster)
    labels, taints = isolation(cluster)
    expected = module_process(cluster, tmp_path, args, check_mode=check_mode, diff=True)
    expected_writes = mutations(cluster)
    cluster.patch('v1', 'Node', S.NODE, {'metadata': {'labels': dict({k: None for k in isolation(cluster)[0]}, **labels)},
                                         'spec': {'taints': taints}})     # the node as the module process found it
    assert isolation(cluster) == (labels, taints)
    cluster.clear_requests()
    got = in_worker(cluster, run_playbook, args, check_mode=check_mode, diff=True)
    assert mutations(cluster) == expected_writes
    assert (got.get('_event') == 'runner_on_failed') == expected.get('failed', False)
    for key in set(expected) - {'failed', 'msg', 'invocation'}:
        assert got.get(key) == expected[key], key
    # The module process names itself by its file when run bare; the task names the module.
    assert got.get('msg', '').replace('gpufleet.upgrade.node_isolation', 'basic.py') == expected.get('msg', '')
    if args.get('state', 'present') == 'present' and args['node'] == S.NODE and not check_mode and 'nope' not in args:
        assert expected_writes and got['changed'] and got['labels']


def test_a_secret_in_a_message_is_masked_as_in_the_module_process(cluster, run_playbook, tmp_path):
    args = {'node': S.NODE, 'kubeconfig': str(tmp_path / 'no-such-kubeconfig')}
    got = in_worker(cluster, run_playbook, args)
    assert got['_event'] == 'runner_on_failed' and str(tmp_path) not in json.dumps(got)
    assert got['msg'].startswith("kubeconfig '********' does not exist"), got['msg']


def test_elsewhere_the_module_process_runs(cluster, run_playbook):
    """With become the module would run as another user: its own process runs it (here: the absent Python)."""
    task = {'name': 'state', 'gpufleet.upgrade.node_isolation': {'node': S.NODE},
            'become': True, 'become_method': 'su', 'register': 'r', 'ignore_errors': True}
    run = run_playbook(play(cluster, task), inventory=NO_MODULE_PROCESS)
    res = run.result('state')
    assert res['_event'] == 'runner_on_failed' and 'labels' not in res


def test_the_tasks_environment_reaches_the_module_in_the_worker(cluster, run_playbook):
    """A kubeconfig named only by the task's environment (K8S_AUTH_KUBECONFIG), as a module process reads it."""
    load(cluster)
    plays = [{'name': 'env', 'hosts': 'localhost', 'gather_facts': False,
              'environment': {'K8S_AUTH_KUBECONFIG': cluster.kubeconfig},
              'tasks': [{'name': 'state', 'gpufleet.upgrade.node_isolation': {'node': S.NODE},
                         'register': 'r'}]}]
    run = run_playbook(plays, inventory=NO_MODULE_PROCESS)
    assert run.rc == 0, run.stdout
    assert run.result('state')['changed'] and run.result('state')['labels']
