"""The kubelet's pod status sync stand-in (tests/cluster/kubelet.py) on the real control plane: a pod
marked not Ready (as the node lifecycle controller marks them) on a Ready node is set Ready again; on a
node whose kubelet is stopped, or with a status a test wrote, it stays as it is."""
from __future__ import annotations

import time

import pytest

from cluster import fixtures as f
from cluster.client import FIXED
from cluster.kubelet import PodStatusSync

pytestmark = pytest.mark.slow


def ready(cluster, name):
    pod = cluster.get('v1', 'Pod', name, 'default') or {}
    status = pod.get('status') or {}
    conds = {c['type']: c['status'] for c in status.get('conditions') or []}
    return status.get('phase') == 'Running' and conds.get('Ready') == 'True' and conds.get('ContainersReady') == 'True'


def mark_not_ready(cluster, name):
    """What MarkPodsNotReady (kube-controller-manager) writes: the Ready condition False."""
    cluster.api.request('PATCH', '/api/v1/namespaces/default/pods/%s/status' % name,
                        body={'status': {'conditions': [{'type': 'Ready', 'status': 'False'}]}},
                        content_type='application/strategic-merge-patch+json')


def test_a_pod_marked_not_ready_on_a_ready_node_is_set_ready_again_and_only_there(cluster):
    cluster.apply([f.gpu_node('kubelet-1'), f.gpu_node('kubelet-2'),
                   f.pod('on-ready', node='kubelet-1', phase=None), f.pod('on-stopped', node='kubelet-2', phase=None),
                   f.pod('fixed', node='kubelet-1', ready=False, annotations={FIXED: 'fixed'})])
    for name in ('on-ready', 'on-stopped'):
        cluster.wait_for(lambda n=name: ready(cluster, n), timeout=30, message='KWOK to run %s' % name)
    cluster.stop_kubelet('kubelet-2')
    for name in ('on-ready', 'on-stopped'):
        mark_not_ready(cluster, name)
    assert not ready(cluster, 'on-ready') and not ready(cluster, 'on-stopped')

    with PodStatusSync(cluster, interval=0.2) as sync:
        cluster.wait_for(lambda: ready(cluster, 'on-ready'), timeout=15, message='the sync to set on-ready Ready')
        time.sleep(1.0)     # several more passes
    assert sync.synced == ['default/on-ready']
    assert not ready(cluster, 'on-stopped')     # its kubelet is gone: nothing puts it right
    assert not ready(cluster, 'fixed')          # the status the test wrote stays
    assert sync.sync() == []
