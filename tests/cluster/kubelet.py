"""The kubelet's periodic pod status sync, which KWOK does not play.

When a node goes NotReady the node lifecycle controller (kube-controller-manager) marks its pods not
Ready; it judges a pod by the node health it recorded at its last pass, so a pod created or updated
on a node that has just come back can be marked too, until its next pass. A real kubelet owns its
pods' status and puts it right at its next sync (the status manager reconciles every ~10 s); KWOK's
stages only move a pod out of Pending, so such a pod would stay Running and not Ready for ever, a
state no real cluster keeps. `PodStatusSync` plays that sync for the lab (tests/tools/lab.py): every
`interval` it sets Ready again the Running pods that are not Ready on nodes that are Ready and
played by KWOK (not annotated gpufleet.test/kubelet, as `Cluster.stop_kubelet` does), unless the
pod keeps the status a test wrote (gpufleet.test/status) or is being deleted. Each pass reads the cluster's
watch-fed caches of Nodes and Pods (cluster/informer.py), not a list. Pods on a NotReady or
stopped node stay as the controller left them, as they would with the node's kubelet gone.

    with PodStatusSync(cluster):
        ...
"""
from __future__ import annotations

import time
from typing import Any

from .background import Background
from .client import FIXED, STOPPED, ApiError

SYNCED = ('Ready', 'ContainersReady')


def _ready(obj: dict[str, Any]) -> bool:
    return any(c.get('type') == 'Ready' and c.get('status') == 'True'
               for c in (obj.get('status') or {}).get('conditions') or [])


def needs_sync(pod: dict[str, Any], played_ready_nodes: set[str]) -> bool:
    """Whether the kubelet would put this pod's status right: Running, not Ready, on a Ready node it
    plays, neither being deleted nor keeping a status a test wrote."""
    meta, status = pod.get('metadata') or {}, pod.get('status') or {}
    return (status.get('phase') == 'Running' and not meta.get('deletionTimestamp')
            and FIXED not in (meta.get('annotations') or {})
            and (pod.get('spec') or {}).get('nodeName') in played_ready_nodes
            and not all(c.get('status') == 'True' for c in status.get('conditions') or [] if c.get('type') in SYNCED))


def synced_status(pod: dict[str, Any], now: str) -> dict[str, Any]:
    """The status patch the kubelet's sync writes: Ready and ContainersReady True, its containers ready."""
    status = pod.get('status') or {}
    conds = [dict(c, status='True', lastTransitionTime=now) if c.get('type') in SYNCED and c.get('status') != 'True'
             else c for c in status.get('conditions') or [] if c.get('type')]
    containers = [dict(c, ready=True) for c in status.get('containerStatuses') or []]
    return {'status': {'conditions': conds, 'containerStatuses': containers}}


class PodStatusSync(Background):
    """A background thread playing every KWOK kubelet's pod status sync. `synced` lists the
    'namespace/pod' it put right, in order; `errors` what went wrong (raised on a clean exit)."""

    label = 'kubelet pod status sync'

    def __init__(self, cluster: Any, interval: float = 1.0) -> None:
        super().__init__(interval)
        self.cluster = cluster
        self.synced: list[str] = []
        # (uid, resourceVersion) of each pod state it set Ready: the watch-fed cache it reads may show that state
        # for a moment after the write, which must not be written (and counted) again
        self._written: set[tuple[str, str]] = set()

    def step(self) -> None:
        try:
            self.sync()
        except (ApiError, OSError):     # a transient API error (or the control plane stopping): next pass
            pass

    def sync(self) -> list[str]:
        """One pass; the pods it put right."""
        nodes = {n['metadata']['name'] for n in self.cluster.informer('v1', 'Node').items()
                 if _ready(n) and STOPPED not in (n['metadata'].get('annotations') or {})}
        done = []
        for pod in self.cluster.informer('v1', 'Pod').items():
            meta = pod['metadata']
            if not needs_sync(pod, nodes) or (meta.get('uid'), meta.get('resourceVersion')) in self._written:
                continue
            now = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
            try:
                self.cluster.api.request(
                    'PATCH', '/api/v1/namespaces/%s/pods/%s/status' % (meta['namespace'], meta['name']),
                    body=synced_status(pod, now), content_type='application/strategic-merge-patch+json')
            except ApiError as exc:
                if exc.status != 404:
                    self.errors.append('%s/%s: %s' % (meta['namespace'], meta['name'], exc))
                continue
            self._written.add((meta.get('uid'), meta.get('resourceVersion')))
            done.append('%s/%s' % (meta['namespace'], meta['name']))
        self.synced += done
        return done
