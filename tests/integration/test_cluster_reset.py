"""The isolation between tests (tests/cluster/client.py `Cluster.reset`) on the real control plane: what one
test leaves behind must not break the next one that runs on the same control plane (under pytest-xdist, any
test of the same worker, in any order)."""
from __future__ import annotations

from cluster import fixtures as f


def _classes(cluster):
    return [rc['metadata']['name'] for rc in cluster.list('node.k8s.io/v1', 'RuntimeClass')]


def test_a_runtime_class_an_owner_took_is_made_again_after_the_reset(cluster):
    # The GPU Operator adopts the `nvidia` RuntimeClass (its ClusterPolicy becomes the owner), and the reset
    # removes the ClusterPolicy, so the garbage collector removes the class some time later. The client had
    # made that class for an earlier pod and remembered it: the next pod naming it was refused by the
    # RuntimeClass admission ("RuntimeClass \"nvidia\" not found"), and so was every later test of the worker.
    # A DeviceClass stands for the ClusterPolicy here: cluster-scoped, removed by the reset, no operator needed.
    cluster.apply([f.node('n1'), f.pod('holder', node='n1', runtime_class='nvidia')])
    owner = cluster.apply(f.device_class('owner.gpufleet.test'))[0]
    cluster.api.request('PATCH', '/apis/node.k8s.io/v1/runtimeclasses/nvidia',
                        body={'metadata': {'ownerReferences': [{
                            'apiVersion': 'resource.k8s.io/v1', 'kind': 'DeviceClass',
                            'name': owner['metadata']['name'], 'uid': owner['metadata']['uid']}]}},
                        content_type='application/merge-patch+json')

    cluster.reset()
    cluster.wait_for(lambda: 'nvidia' not in _classes(cluster), timeout=30,
                     message='the orphaned RuntimeClass to be gone')

    pod = cluster.apply([f.node('n1'), f.pod('holder', node='n1', runtime_class='nvidia')])[-1]
    assert pod['spec']['runtimeClassName'] == 'nvidia'
    assert _classes(cluster) == ['nvidia']


def test_the_reset_leaves_no_runtime_class(cluster):
    cluster.apply([f.node('n1'), f.pod('a', node='n1', runtime_class='nvidia-cdi')])
    assert _classes(cluster) == ['nvidia-cdi']
    cluster.reset()
    assert _classes(cluster) == []


def test_a_port_taken_before_its_component_binds_it_starts_the_control_plane_on_new_ports(tmp_path, monkeypatch):
    # free_port() finds a port free, and under load another process bound it before kube-scheduler did
    # ("bind: address already in use"): the whole test failed. Here the first port handed out (etcd's client
    # port) is held by a listening socket; the start must go again on new ports and come up.
    import socket

    from cluster import controlplane as cpmod

    taken = socket.socket()
    taken.bind(('127.0.0.1', 0))
    taken.listen(1)
    held = taken.getsockname()[1]
    handed = []
    real = cpmod.free_port

    def racing_free_port():
        port = held if not handed else real()
        handed.append(port)
        return port

    monkeypatch.setattr(cpmod, 'free_port', racing_free_port)
    said = []
    try:
        with cpmod.ControlPlane(tmp_path / 'cp', log=said.append) as cp:
            assert cp.etcd_port != held
            assert cp._get('/readyz', cp.tokens['gpufleet-admin'])[0] == 200
    finally:
        taken.close()
    assert handed[0] == held and handed.count(held) == 1
    assert any('again on new ports (attempt 2 of' in line for line in said), said
