"""Issue 39 item 8 (review M9 traps 1 and 3): playbooks/preflight.yml refuses an RKE2 upgrade the System Upgrade
Controller cannot carry out, before anything is drained - its controller not running, a node that would skip a
Kubernetes minor or go down, an inventory role that is not the Node's - reading only (gpufleet.upgrade.suc_info)."""
from __future__ import annotations

import pathlib
import sys

from cluster import fixtures as f
from k8s_support import mutations
from tools.records import TARGET

REPO = pathlib.Path(__file__).resolve().parents[2]
TASK = "RKE2 | The System Upgrade Controller runs, every node's RKE2 hop is allowed and its role is its Node's"
GPU = {'nvidia.com/gpu.present': 'true'}
CP = {'node-role.kubernetes.io/control-plane': 'true'}


def _inventory(**hostvars):
    local = {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable}
    hosts = {n: dict(local, **hostvars.get(n.replace('-', '_'), {})) for n in ('gpu-1', 'gpu-2')}
    return {'all': {'hosts': {'localhost': dict(local)}, 'children': {'gpu_nodes': {'hosts': hosts}}}}


def _preflight(cluster, run_playbook, inventory=None):
    cluster.clear_requests()
    run = run_playbook(REPO / 'playbooks' / 'preflight.yml', inventory=inventory or _inventory(), extravars={
        'gpufleet_kubeconfig': cluster.kubeconfig, 'gpufleet_target': dict(TARGET)})
    return run, run.result(TASK)


def test_preflight_refuses_without_a_running_system_upgrade_controller(cluster, run_playbook):
    cluster.apply([f.namespace('system-upgrade'),
                   f.node('gpu-1', labels=GPU, kubelet_version='v1.35.3+rke2r3'),
                   f.node('gpu-2', labels=GPU, kubelet_version='v1.36.1+rke2r1')])
    run, res = _preflight(cluster, run_playbook)
    assert run.status == 'failed' and res['_event'] == 'runner_on_failed'
    assert res['msg'] == ('refusing an RKE2 upgrade: Deployment system-upgrade/system-upgrade-controller not found: '
                          'the System Upgrade Controller does not run there (namespace, controller)')
    assert res['controller']['crd_established'] is True
    assert [(n['name'], n['action']) for n in res['nodes']] == [('gpu-1', 'upgrade'), ('gpu-2', 'up_to_date')]
    assert mutations(cluster) == []

    # Running (the scheduler placed its pod, KWOK runs it): the check passes.
    cluster.apply([f.deployment('system-upgrade-controller', 'system-upgrade', labels={'app': 'suc'},
                                template_spec={'containers': [{'name': 'c', 'image': 'rancher/system-upgrade-controller'}],
                                               'tolerations': [{'operator': 'Exists'}]})])
    cluster.wait_for(lambda: (cluster.get('apps/v1', 'Deployment', 'system-upgrade-controller', 'system-upgrade')
                              .get('status') or {}).get('readyReplicas'), timeout=60, message='the controller ready')
    run, res = _preflight(cluster, run_playbook)
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['problems'] == [] and res['controller']['ready_replicas'] == 1
    assert mutations(cluster) == []


def test_preflight_refuses_a_minor_skip_and_a_role_the_node_does_not_have(cluster, run_playbook):
    cluster.apply([f.namespace('system-upgrade'),
                   f.node('gpu-1', labels=GPU, kubelet_version='v1.34.2+rke2r1'),
                   f.node('gpu-2', labels=dict(GPU, **CP), kubelet_version='v1.35.3+rke2r3')])
    run, res = _preflight(cluster, run_playbook, _inventory(gpu_2={'gpufleet_rke2_role': 'agent'}))
    assert run.status == 'failed' and res['_event'] == 'runner_on_failed'
    assert ('node gpu-1: v1.34.2+rke2r1 → v1.36.1+rke2r1: RKE2 upgrade cannot skip a Kubernetes minor (skips 1.35; '
            'upgrade one minor at a time)') in res['problems']
    assert ('declared_roles[gpu-2]: node gpu-2 is declared an RKE2 agent, but its Node is an RKE2 server (label '
            "node-role.kubernetes.io/control-plane=true); the Node decides: remove the declaration (or correct the "
            "Node's labels)") in res['problems']
    assert [(n['name'], n['role']) for n in res['nodes']] == [('gpu-1', 'agent'), ('gpu-2', 'server')]
    # Nothing ran on the hosts after it, and nothing was written.
    assert not run.task_results('Host | NVML facts')
    assert mutations(cluster) == []
