"""Pod logs on the test control plane, served for real: `GET pods/<name>/log` goes to the API
server, which proxies it to the node's kubelet, KWOK's HTTPS server at the node's ExternalIP
127.0.0.1 (controlplane.KUBELET_ADDRESS). KWOK reads each container's log from the file a Logs
object (kwok.x-k8s.io/v1alpha1, one per pod, same name and namespace) names, in the CRI log format
a container runtime writes.

    set_logs(cluster, 'qualify', 'pod-1', 'Result = PASS\\n')      # also Cluster.set_logs(...)
    with PodLogWriter(cluster):   # pods annotated gpufleet.test/logs=<text> get those logs
        ...

A Job's pod annotated `gpufleet.test/logs` stays Running (kwok/*.yaml) until PodLogWriter
has written its logs, seen KWOK serve them through the API server, and removed the annotation: a
reader that waits for the Job to finish always finds the logs.
"""
from __future__ import annotations

import datetime
import pathlib
import time
from typing import Any

from .background import Background
from .client import ApiError

LOGS_ANNOTATION = 'gpufleet.test/logs'
LOGS_API = 'kwok.x-k8s.io/v1alpha1'


def kubelet_endpoint(status: dict[str, Any], cp: Any) -> dict[str, Any]:
    """A node status with the kubelet's address and port as KWOK reports them (ExternalIP 127.0.0.1,
    daemonEndpoints.kubeletEndpoint.Port = KWOK's server), so the API server reaches KWOK only."""
    from .controlplane import KUBELET_ADDRESS, KUBELET_ADDRESS_TYPE
    out = dict(status)
    addresses = [a for a in out.get('addresses') or [] if a.get('type') != KUBELET_ADDRESS_TYPE]
    out['addresses'] = addresses + [{'type': KUBELET_ADDRESS_TYPE, 'address': KUBELET_ADDRESS}]
    out['daemonEndpoints'] = {'kubeletEndpoint': {'Port': cp.kwok_port}}
    return out


def cri_lines(text: str, stream: str = 'stdout') -> str:
    """`text` as a container runtime logs it: one `<RFC 3339 time> <stream> F <line>` per line."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.%fZ')
    return ''.join('%s %s F %s\n' % (now, stream, line) for line in text.splitlines())


def set_logs(cluster: Any, namespace: str, pod: str, text: str, container: str | None = None,
             wait: bool = True, timeout: float = 15) -> None:
    """Give the pod's container (every container when None) `text` as its log. With `wait`, and the
    pod bound to a node, return once the API server answers GET pods/<pod>/log with it."""
    directory = pathlib.Path(cluster.cp.dir) / 'pod-logs' / namespace / pod
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ('%s.log' % (container or '_all'))
    path.write_text(cri_lines(text))
    current = cluster.get(LOGS_API, 'Logs', pod, namespace)
    entries = [e for e in ((current or {}).get('spec') or {}).get('logs') or []
               if (e.get('containers') or None) != ([container] if container else None)]
    entry: dict[str, Any] = {'logsFile': str(path)}
    if container:
        entry['containers'] = [container]
    # a container's own entry first: KWOK takes the first entry naming it, else the first general one
    entries = ([entry] + entries) if container else (entries + [entry])
    cluster.apply({'apiVersion': LOGS_API, 'kind': 'Logs', 'metadata': {'name': pod, 'namespace': namespace},
                   'spec': {'logs': entries}}, settle=False)
    if not wait:
        return
    obj = cluster.get('v1', 'Pod', pod, namespace)
    if not obj or not (obj.get('spec') or {}).get('nodeName'):
        return
    want = ''.join(line + '\n' for line in text.splitlines())
    query = {'container': container} if container else None
    path_ = '/api/v1/namespaces/%s/pods/%s/log' % (namespace, pod)

    def served() -> bool:
        try:
            return cluster.api.request('GET', path_, query=query, raw=True) == want
        except ApiError:
            return False

    cluster.wait_for(served, timeout=timeout, interval=0.05,
                     message='KWOK to serve the logs of pod %s/%s' % (namespace, pod))


class PodLogWriter(Background):
    """Plays the container runtime's log writer: every Running pod annotated gpufleet.test/logs
    gets that text as its log (set_logs, waiting until it is served), then loses the annotation so
    KWOK lets it finish. `written` lists 'namespace/pod' in order."""

    label = 'pod log writer'

    def __init__(self, cluster: Any, interval: float = 0.05) -> None:
        super().__init__(interval)
        self.cluster = cluster
        self.written: list[str] = []
        self._done: set[str] = set()    # uids whose logs it wrote (the cache may show the annotation a moment longer)

    def step(self) -> None:
        try:
            pods = self.cluster.informer('v1', 'Pod').items()    # the watch-fed cache (cluster/informer.py)
        except (ApiError, OSError, AssertionError) as exc:
            self.errors.append('listing pods: %s' % exc)
            time.sleep(0.5)
            return
        for pod in pods:
            meta = pod['metadata']
            text = (meta.get('annotations') or {}).get(LOGS_ANNOTATION)
            if text is None or not (pod.get('spec') or {}).get('nodeName') or meta.get('deletionTimestamp') \
                    or (pod.get('status') or {}).get('phase') != 'Running' or meta.get('uid') in self._done:
                continue
            key = '%s/%s' % (meta['namespace'], meta['name'])
            try:
                set_logs(self.cluster, meta['namespace'], meta['name'], text)
                self.cluster.patch('v1', 'Pod', meta['name'], {'metadata': {'annotations': {LOGS_ANNOTATION: None}}},
                                   namespace=meta['namespace'])
            except (ApiError, AssertionError, OSError) as exc:
                if self.cluster.get('v1', 'Pod', meta['name'], meta['namespace']) is not None:
                    self.errors.append('%s: %s' % (key, exc))
                continue
            self._done.add(meta.get('uid'))
            self.written.append(key)
