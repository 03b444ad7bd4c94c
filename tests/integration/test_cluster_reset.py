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
