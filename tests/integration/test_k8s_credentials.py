"""Kubernetes credentials as AWX and kubectl hand them to a job, through a real playbook run against the
real API server: the example inventory does not override an AWX bearer-token credential's K8S_AUTH_*
environment (review H6), and KUBECONFIG with several files is merged as kubectl merges it (M13)."""
from __future__ import annotations

import json
import pathlib
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

# The playbooks pass the kubeconfig to every Kubernetes module this way (module_defaults).
PLAY = [{'name': 'Read the GPU Nodes as a playbook of the collection does', 'hosts': 'localhost',
         'gather_facts': False,
         'module_defaults': {'group/gpufleet.upgrade.k8s': {'kubeconfig': '{{ gpufleet_kubeconfig | default(omit) }}'}},
         'tasks': [{'name': 'Read the fleet', 'gpufleet.upgrade.fleet_info': {'node_selector': ''},
                    'register': 'fleet'},
                   {'name': 'Show the count', 'ansible.builtin.debug': {'msg': 'nodes={{ fleet.nodes | length }}'}}]}]


def _example_inventory(tmp_path: pathlib.Path) -> str:
    """The example inventory's group_vars as a user copies them, with localhost as the only host."""
    inv = tmp_path / 'inventory'
    shutil.copytree(REPO / 'inventories' / 'example' / 'group_vars', inv / 'group_vars')
    (inv / 'hosts.yml').write_text(json.dumps({'all': {'hosts': {'localhost': {
        'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable}}}}))
    return str(inv)


def _nodes(run) -> str:
    return next((e['event_data']['res'].get('msg') for e in run.events if e['event'] == 'runner_on_ok'
                 and e['event_data'].get('task') == 'Show the count'), None)


def test_example_inventory_keeps_an_awx_bearer_token_credential(cluster, run_playbook, tmp_path):
    home = tmp_path / 'home'  # no ~/.kube/config, no KUBECONFIG: an execution environment
    home.mkdir()
    run = run_playbook(PLAY, inventory=_example_inventory(tmp_path), envvars={
        'HOME': str(home), 'K8S_AUTH_HOST': cluster.cp.url, 'K8S_AUTH_API_KEY': cluster.cp.tokens['gpufleet-admin'],
        'K8S_AUTH_SSL_CA_CERT': cluster.cp.ca_path, 'K8S_AUTH_VERIFY_SSL': 'true'})
    assert run.rc == 0, run.stdout[-3000:]
    assert (_nodes(run) or '').startswith('nodes=')
    assert cluster.cp.tokens['gpufleet-admin'] not in run.stdout


def test_kubeconfig_with_several_files_as_kubectl_merges_them(cluster, run_playbook, tmp_path):
    # One file names the cluster and the context, the other the user: neither works alone.
    home = tmp_path / 'home'
    home.mkdir()
    clusters = tmp_path / 'clusters.yaml'
    clusters.write_text(json.dumps({
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'prod',
        'clusters': [{'name': 'prod', 'cluster': {'server': cluster.cp.url, 'certificate-authority': cluster.cp.ca_path}}],
        'contexts': [{'name': 'prod', 'context': {'cluster': 'prod', 'user': 'ops'}}]}))
    (tmp_path / 'creds').mkdir()
    (tmp_path / 'creds' / 'token').write_text(cluster.cp.tokens['gpufleet-admin'])
    users = tmp_path / 'creds' / 'users.yaml'
    users.write_text(json.dumps({'apiVersion': 'v1', 'kind': 'Config',
                                 'users': [{'name': 'ops', 'user': {'tokenFile': 'token'}}]}))
    run = run_playbook(PLAY, inventory=_example_inventory(tmp_path), envvars={
        'HOME': str(home), 'KUBECONFIG': '%s:%s' % (clusters, users)})
    assert run.rc == 0, run.stdout[-3000:]
    assert (_nodes(run) or '').startswith('nodes=')
