"""The test side of the real control plane: `Cluster` sets up and inspects objects for a test.

Setup and inspection go straight to the API server as `gpufleet-test-setup` (a system:masters
client certificate); the modules under test get `Cluster.kubeconfig`, a bearer token through the
fault proxy, so `requests` lists exactly what they sent and `faults` can break it.

    cluster.apply([fixtures.gpu_node('gpu-1'), fixtures.gpu_pod('train', 'gpu-1')])
    cluster.get('v1', 'Pod', 'train', 'default')     # -> dict | None
    cluster.list('v1', 'Pod', namespace=None, label_selector=None, field_selector=None)
    cluster.patch('v1', 'Node', 'gpu-1', {'spec': {'unschedulable': True}})  # merge patch
    cluster.delete('v1', 'Pod', 'train', 'default', grace_seconds=0)
    cluster.requests / clear_requests() / mutating_requests()   # what the modules sent (proxy log)
    cluster.faults.add(method='PATCH', path=r'/nodes/gpu-1$', status=409, times=2)
    cluster.audit_events(user='system:serviceaccount:gpufleet-system:reader')   # the API server's audit log
    cluster.stop_kubelet('gpu-1') / start_kubelet('gpu-1')   # KWOK stops or resumes playing its kubelet
    cluster.set_logs('default', 'train', 'step 1\n')   # the pod's log, served by KWOK (cluster/logs.py)

`apply` is create-or-replace with status: the status given is written through the status
subresource and kept (KWOK leaves a pod annotated gpufleet.test/status=fixed alone; a node whose
Ready condition is not True is marked gpufleet.test/kubelet=stopped). Owner references are made
real: an owner that exists is referenced by its uid; a missing one is created as a held owner (a
workload controller object kept in deletion by a finalizer, so its controller neither adds nor
removes pods and the garbage collector keeps its dependents).
"""
from __future__ import annotations

import copy
import json
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable

import urllib3

READ_VERBS = ('GET', 'HEAD')
HOLD = 'gpufleet.test/hold'
FIXED = 'gpufleet.test/status'
STOPPED = 'gpufleet.test/kubelet'
SYSTEM_NAMESPACES = ('kube-system', 'kube-public', 'kube-node-lease', 'default')
WORKLOAD_OWNERS = {'ReplicaSet', 'StatefulSet', 'DaemonSet', 'Job', 'Deployment', 'ReplicationController',
                   'CronJob'}


class ApiError(Exception):
    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status = status
        self.body = body
        msg = body.get('message') if isinstance(body, dict) else body
        super().__init__('%s %s -> %d: %s' % (method, path, status, msg))


class ApiClient:
    """Small JSON client over urllib3 (client certificate or bearer token)."""

    def __init__(self, url: str, ca_path: str, cert: tuple[str, str] | None = None, token: str | None = None,
                 timeout: float = 30.0) -> None:
        self.url = url.rstrip('/')
        self.token = token
        self.timeout = timeout
        kw: dict[str, Any] = {'ca_certs': ca_path, 'cert_reqs': 'CERT_REQUIRED', 'maxsize': 8}
        if cert:
            kw['cert_file'], kw['key_file'] = cert
        self.pool = urllib3.PoolManager(**kw)

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = 'application/json', ok404: bool = False, raw: bool = False) -> Any:
        url = self.url + path
        if query:
            url += '?' + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        headers = {'Accept': 'application/json', 'User-Agent': 'gpufleet-test-setup'}
        if self.token:
            headers['Authorization'] = 'Bearer ' + self.token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers['Content-Type'] = content_type
        # 429 outside an eviction: the API server did not take the request (its storage for a CRD
        # just (re)created is initializing, or priority and fairness shed it); like client-go, wait the
        # Retry-After it names and send it again, for at most 30 s. An eviction's 429 is a PDB's answer.
        deadline = time.monotonic() + 30
        while True:
            resp = self.pool.request(method, url, body=data, headers=headers, timeout=self.timeout, retries=False)
            if resp.status != 429 or path.endswith('/eviction') or time.monotonic() >= deadline:
                break
            try:
                pause = float(resp.headers.get('Retry-After') or 1)
            except ValueError:
                pause = 1.0
            time.sleep(min(max(pause, 0.2), 5.0))
        text = resp.data
        if raw and resp.status < 300:
            return text.decode()
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text.decode(errors='replace')
        if resp.status == 404 and ok404:
            return None
        if resp.status >= 300:
            raise ApiError(resp.status, parsed, method, path)
        return parsed


class Resource:
    __slots__ = ('group_version', 'kind', 'plural', 'namespaced', 'subresources')

    def __init__(self, group_version: str, kind: str, plural: str, namespaced: bool) -> None:
        self.group_version, self.kind, self.plural, self.namespaced = group_version, kind, plural, namespaced
        self.subresources: set[str] = set()

    def base(self) -> str:
        return '/api/v1' if self.group_version == 'v1' else '/apis/' + self.group_version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        p = self.base()
        if self.namespaced and namespace is not None:
            p += '/namespaces/' + namespace
        p += '/' + self.plural
        if name is not None:
            p += '/' + name
        if sub:
            p += '/' + sub
        return p


class Cluster:
    def __init__(self, cp: Any, proxy: Any) -> None:
        self.cp = cp
        self.proxy = proxy
        self.api = ApiClient(cp.url, cp.ca_path, cert=(str(cp.pki.dir / 'admin.crt'), str(cp.pki.dir / 'admin.key')))
        self._resources: dict[tuple[str, str], Resource] = {}
        self._uid_map: dict[str, str] = {}
        self._ns_seen: set[Any] = set()
        self._classes_made: set[str] = set()   # RuntimeClasses made for pods since the last reset
        self._informers: dict[tuple[str, str], Any] = {}
        self._lock = threading.RLock()
        self.kubeconfig = str(cp.write_kubeconfig(cp.dir / 'gpufleet-admin.kubeconfig',
                                                  {'token': cp.tokens['gpufleet-admin']}, server=proxy.url))
        self.direct_kubeconfig = str(cp.write_kubeconfig(cp.dir / 'gpufleet-admin-direct.kubeconfig',
                                                         {'token': cp.tokens['gpufleet-admin']}))
        self.admin_kubeconfig = cp.admin_kubeconfig
        self.url = proxy.url
        self.faults = proxy.faults
        self.git_version = None

    # ------------------------------------------------------------------ discovery
    def _discover(self) -> None:
        found: dict[tuple[str, str], Resource] = {}
        gvs = ['v1'] + [v['groupVersion'] for g in self.api.request('GET', '/apis')['groups']
                        for v in g['versions']]
        for gv in gvs:
            try:
                doc = self.api.request('GET', '/api/v1' if gv == 'v1' else '/apis/' + gv)
            except ApiError:
                continue
            for r in doc['resources']:
                name = r['name']
                if '/' in name:
                    base, sub = name.split('/', 1)
                    for res in found.values():
                        if res.group_version == gv and res.plural == base:
                            res.subresources.add(sub)
                    continue
                found[(gv, r['kind'])] = Resource(gv, r['kind'], name, r['namespaced'])
        with self._lock:
            self._resources = found

    def resource(self, api_version: str, kind: str) -> Resource:
        key = (api_version, kind)
        if key not in self._resources:
            self._discover()
        if key not in self._resources:
            raise KeyError('the API server serves no %s %s' % (api_version, kind))
        return self._resources[key]

    def register_crd(self, crd: dict[str, Any], timeout: float = 30) -> None:
        """Create a CustomResourceDefinition and wait until it is served."""
        self.api.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', body=crd)
        name = crd['metadata']['name']

        def served() -> bool:
            obj = self.api.request('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/' + name)
            conds = {c['type']: c['status'] for c in (obj.get('status') or {}).get('conditions') or []}
            return conds.get('Established') == 'True'

        self.wait_for(served, timeout=timeout, message='CRD %s established' % name)
        self._discover()

    # ------------------------------------------------------------------ reads
    def informer(self, api_version: str, kind: str) -> Any:
        """The watch-fed cache of every `kind` (cluster/informer.py), started and synced on first use and kept
        until `stop_informers()`: what a stand-in reads each pass instead of listing."""
        from .informer import Informer
        with self._lock:
            key = (api_version, kind)
            if key not in self._informers:
                self._informers[key] = Informer(self, api_version, kind).start()
            return self._informers[key]

    def stop_informers(self) -> None:
        with self._lock:
            informers, self._informers = list(self._informers.values()), {}
        for informer in informers:
            informer.stop()

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        res = self.resource(api_version, kind)
        ns = (namespace or 'default') if res.namespaced else None
        return self.api.request('GET', res.path(ns, name), ok404=True)

    def list(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        res = self.resource(api_version, kind)
        out = self.api.request('GET', res.path(namespace if res.namespaced else None),
                               query={'labelSelector': label_selector, 'fieldSelector': field_selector})
        items = out.get('items') or []
        for item in items:
            item.setdefault('apiVersion', api_version)
            item.setdefault('kind', kind)
        return items

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10, interval: float = 0.05,
                 message: str = 'condition') -> Any:
        """Poll predicate() until it returns something truthy; AssertionError after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError('timed out after %ss waiting for %s' % (timeout, message))
            time.sleep(interval)

    def settle(self, horizon: float = 0.0, timeout: float = 30) -> None:
        """Wait until KWOK has played every pod that is bound and not held (Pending ones go Running)."""
        def done() -> bool:
            for pod in self.list('v1', 'Pod'):
                meta, spec, status = pod['metadata'], pod['spec'], pod.get('status') or {}
                if FIXED in (meta.get('annotations') or {}) or not spec.get('nodeName'):
                    continue
                if meta.get('deletionTimestamp') and not meta.get('finalizers'):
                    return False
                if status.get('phase', 'Pending') == 'Pending':
                    node = self.get('v1', 'Node', spec['nodeName'])
                    if node and STOPPED not in (node['metadata'].get('annotations') or {}):
                        return False
            return True

        if horizon:
            time.sleep(horizon)
        self.wait_for(done, timeout=timeout, interval=0.1, message='KWOK to play the pods')

    # ------------------------------------------------------------------ writes
    def _ensure_namespace(self, ns: str) -> None:
        if ns in self._ns_seen:
            return
        try:
            self.api.request('POST', '/api/v1/namespaces', body={'apiVersion': 'v1', 'kind': 'Namespace',
                                                                 'metadata': {'name': ns}})
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._ns_seen.add(ns)

    def _ensure_runtime_class(self, name: str) -> None:
        # The GPU Operator creates the `nvidia` RuntimeClass; the RuntimeClass admission refuses a pod
        # naming one that does not exist, so a pod's class is created (handler = name) when missing.
        if name in self._classes_made:
            return
        try:
            self.api.request('POST', '/apis/node.k8s.io/v1/runtimeclasses',
                             body={'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass',
                                   'metadata': {'name': name}, 'handler': name})
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._classes_made.add(name)

    def _owner_uid(self, ref: dict[str, Any], namespace: str | None, dependents: list[dict]) -> str:
        if ref.get('uid') in self._uid_map:
            return self._uid_map[ref['uid']]
        res = self.resource(ref['apiVersion'], ref['kind'])
        ns = namespace if res.namespaced else None
        existing = self.api.request('GET', res.path(ns, ref['name']), ok404=True)
        if existing is None:
            existing = self._held_owner(res, ref, ns, dependents)
        uid = existing['metadata']['uid']
        if ref.get('uid'):
            self._uid_map[ref['uid']] = uid
        return uid

    def _held_owner(self, res: Resource, ref: dict[str, Any], ns: str | None, dependents: list[dict]) -> dict:
        """Create a stand-in for a missing owner that is not a workload controller (a VirtualMachine,
        a Node, ...): real, so the garbage collector keeps its dependents."""
        name = ref['name']
        meta: dict[str, Any] = {'name': name, 'labels': {'gpufleet.test/held-owner': 'true'}}
        if ns:
            meta['namespace'] = ns
        obj: dict[str, Any] = {'apiVersion': ref['apiVersion'], 'kind': ref['kind'], 'metadata': meta}
        if ref['kind'] == 'Node':
            obj.update(self._node_stub(name))
        else:
            obj['spec'] = {}
        return self.api.request('POST', res.path(ns), body=obj)

    @staticmethod
    def _held_workload(ref: dict[str, Any], ns: str | None, replicas: int) -> tuple[dict, dict]:
        """A workload controller object with nothing to run (its body, and the scale to set later)."""
        name = ref['name']
        meta: dict[str, Any] = {'name': name, 'labels': {'gpufleet.test/held-owner': 'true'}, 'finalizers': [HOLD]}
        if ns:
            meta['namespace'] = ns
        obj: dict[str, Any] = {'apiVersion': ref['apiVersion'], 'kind': ref['kind'], 'metadata': meta}
        selector = {'matchLabels': {'gpufleet.test/owner': name}}
        template = {'metadata': {'labels': {'gpufleet.test/owner': name}},
                    'spec': {'containers': [{'name': 'main', 'image': 'registry.local/held-owner:1'}],
                             'nodeSelector': {'gpufleet.test/held-owner': 'none'}}}
        scale: dict[str, Any] = {}
        kind = ref['kind']
        if kind in ('ReplicaSet', 'ReplicationController', 'Deployment'):
            obj['spec'] = {'replicas': 0, 'selector': selector, 'template': template}
            if kind == 'ReplicationController':
                obj['spec']['selector'] = {'gpufleet.test/owner': name}
            scale = {'replicas': replicas}
        elif kind == 'StatefulSet':
            obj['spec'] = {'replicas': 0, 'selector': selector, 'template': template, 'serviceName': name}
            scale = {'replicas': replicas}
        elif kind == 'DaemonSet':
            obj['spec'] = {'selector': selector, 'template': template, 'updateStrategy': {'type': 'OnDelete'}}
        elif kind == 'Job':
            template['spec']['restartPolicy'] = 'Never'
            obj['spec'] = {'selector': selector, 'manualSelector': True, 'template': template,
                           'parallelism': 0, 'completions': replicas}
        elif kind == 'CronJob':
            template['spec']['restartPolicy'] = 'Never'
            obj['spec'] = {'schedule': '0 0 1 1 *', 'suspend': True, 'jobTemplate': {'spec': {'template': template}}}
        return obj, scale

    def _prepare_held_owners(self, items: list[dict]) -> None:
        """Missing workload owners of `items` become held owners, all at once: created with nothing to
        run, seen once by their controller, then kept in deletion by our finalizer (a controller does
        not manage an object being deleted, so it neither creates nor removes pods), then given their
        pods' count as scale (a PodDisruptionBudget's percentages read it)."""
        applied = {(o.get('kind'), (o.get('metadata') or {}).get('namespace') or 'default',
                    (o.get('metadata') or {}).get('name')) for o in items}
        wanted: dict[tuple[str, str | None, str], tuple[dict, int]] = {}
        for obj in items:
            meta = obj.get('metadata') or {}
            for ref in meta.get('ownerReferences') or []:
                if ref.get('kind') not in WORKLOAD_OWNERS or ref.get('uid') in self._uid_map:
                    continue
                res = self.resource(ref['apiVersion'], ref['kind'])
                ns = (meta.get('namespace') or 'default') if res.namespaced else None
                key = (ref['kind'], ns, ref['name'])
                if (ref['kind'], ns or 'default', ref['name']) in applied:
                    continue
                prev = wanted.get(key)
                wanted[key] = (ref, (prev[1] if prev else 0) + 1)
        held: list[tuple[Resource, str | None, dict, dict]] = []
        for (kind, ns, name), (ref, count) in wanted.items():
            res = self.resource(ref['apiVersion'], kind)
            existing = self.api.request('GET', res.path(ns, name), ok404=True)
            if existing is not None:
                self._uid_map[ref['uid']] = existing['metadata']['uid']
                continue
            if ns:
                self._ensure_namespace(ns)
            body, scale = self._held_workload(ref, ns, count)
            created = self.api.request('POST', res.path(ns), body=body)
            held.append((res, ns, created, scale))
            if ref.get('uid'):
                self._uid_map[ref['uid']] = created['metadata']['uid']
        if not held:
            return

        def synced() -> bool:
            for res, ns, created, _scale in held:
                cur = self.api.request('GET', res.path(ns, created['metadata']['name']))
                st = cur.get('status') or {}
                if res.kind in ('Job',):
                    if not st.get('startTime'):
                        return False
                elif res.kind != 'CronJob' and st.get('observedGeneration', 0) < 1:
                    return False
            return True

        self.wait_for(synced, timeout=30, interval=0.05, message='held owners seen by their controllers')
        for res, ns, created, _scale in held:
            self.api.request('DELETE', res.path(ns, created['metadata']['name']),
                             body={'propagationPolicy': 'Background'})
        time.sleep(0.3)  # the controllers' caches see the deletion before any dependent appears
        for res, ns, created, scale in held:
            if scale:
                self.api.request('PATCH', res.path(ns, created['metadata']['name']), body={'spec': scale},
                                 content_type='application/merge-patch+json')

    @staticmethod
    def _node_stub(name: str) -> dict:
        return {'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}}, 'spec': {}}

    def apply(self, objs: dict | Iterable[dict], settle: bool = True) -> list[dict]:
        """Create or replace objects as given (status included); see the module docstring."""
        items: list[dict] = []
        for obj in ([objs] if isinstance(objs, dict) else list(objs)):
            if obj.get('kind', '').endswith('List') and 'items' in obj:
                items.extend(obj['items'])
            else:
                items.append(obj)
        owned: dict[tuple[str, str], list[dict]] = {}
        for obj in items:
            for ref in obj.get('metadata', {}).get('ownerReferences') or []:
                owned.setdefault((ref.get('kind', ''), ref.get('name', '')), []).append(obj)
        self._prepare_held_owners(items)
        out = [self._apply_one(copy.deepcopy(obj), owned) for obj in items]
        if settle:
            self.settle()
        return out

    def _apply_one(self, obj: dict, owned: dict[tuple[str, str], list[dict]]) -> dict:
        res = self.resource(obj.get('apiVersion', ''), obj.get('kind', ''))
        meta = obj.setdefault('metadata', {})
        ns = (meta.get('namespace') or 'default') if res.namespaced else None
        if ns:
            meta['namespace'] = ns
            self._ensure_namespace(ns)
        fixture_uid = meta.pop('uid', None)
        for field in ('resourceVersion', 'creationTimestamp', 'generation', 'managedFields', 'deletionTimestamp',
                      'deletionGracePeriodSeconds', 'selfLink'):
            meta.pop(field, None)
        refs = meta.get('ownerReferences') or []
        for ref in refs:
            dependents = owned.get((ref.get('kind', ''), ref.get('name', '')), [])
            ref['uid'] = self._owner_uid(ref, ns, dependents)
            if ref.get('kind') in WORKLOAD_OWNERS:
                meta.setdefault('labels', {})['gpufleet.test/owner'] = ref['name']
        if res.kind == 'Pod' and (obj.get('spec') or {}).get('runtimeClassName'):
            self._ensure_runtime_class(obj['spec']['runtimeClassName'])
        status = obj.get('status') or None
        if res.kind == 'Node' and status:
            from .logs import kubelet_endpoint
            status = kubelet_endpoint(status, self.cp)  # the API server reaches KWOK at 127.0.0.1 only
        if 'status' in res.subresources:
            obj.pop('status', None)  # written through the subresource after the create
        annotations = meta.setdefault('annotations', {})
        if res.kind == 'Pod' and status:
            annotations[FIXED] = 'fixed'
        if res.kind == 'Node':
            # KWOK leaves the node alone until its status is written (else it would initialize
            # allocatable and conditions first); a node that is not Ready stays that way.
            annotations[STOPPED] = 'stopped'
        if not annotations:
            meta.pop('annotations')
        created = self._create_or_replace(res, ns, obj)
        if fixture_uid:
            self._uid_map[fixture_uid] = created['metadata']['uid']
        if res.kind == 'ResourceClaim' and status:
            for entry in status.get('reservedFor') or []:
                # the API server wants each consumer's uid; a fixture names the pod only
                if not entry.get('uid') and entry.get('resource') == 'pods':
                    pod = self.get('v1', 'Pod', entry['name'], ns)
                    entry['uid'] = pod['metadata']['uid'] if pod else '00000000-0000-0000-0000-000000000000'
        if status and 'status' in res.subresources:
            created = self.api.request('PATCH', res.path(ns, meta['name'], 'status'), body={'status': status},
                                       content_type='application/merge-patch+json')
        if res.kind == 'Node':
            conds = {c.get('type'): c.get('status') for c in (status or {}).get('conditions') or []}
            if conds.get('Ready', 'True') == 'True':
                created = self.start_kubelet(meta['name'])
        return created

    def _create_or_replace(self, res: Resource, ns: str | None, obj: dict) -> dict:
        name = obj['metadata'].get('name')
        try:
            return self.api.request('POST', res.path(ns), body=obj)
        except ApiError as exc:
            if exc.status != 409 or not name:
                raise
        if res.kind == 'Pod':  # a pod's spec is immutable: replace it by delete + create
            self._force_delete(res, ns, name)
            return self.api.request('POST', res.path(ns), body=obj)
        current = self.api.request('GET', res.path(ns, name))
        obj['metadata']['resourceVersion'] = current['metadata']['resourceVersion']
        return self.api.request('PUT', res.path(ns, name), body=obj)

    def _force_delete(self, res: Resource, ns: str | None, name: str, timeout: float = 30) -> None:
        cur = self.api.request('GET', res.path(ns, name), ok404=True)
        if cur is None:
            return
        if cur['metadata'].get('finalizers'):
            self.api.request('PATCH', res.path(ns, name), body={'metadata': {'finalizers': None}},
                             content_type='application/merge-patch+json', ok404=True)
        self.api.request('DELETE', res.path(ns, name), body={'gracePeriodSeconds': 0}, ok404=True)
        self.wait_for(lambda: self.api.request('GET', res.path(ns, name), ok404=True) is None, timeout=timeout,
                      message='%s %s/%s to go' % (res.kind, ns, name))

    def patch(self, api_version: str, kind: str, name: str, patch: dict, namespace: str | None = None,
              subresource: str | None = None) -> dict:
        """JSON merge patch as a client would send it (status only with subresource='status')."""
        res = self.resource(api_version, kind)
        ns = (namespace or 'default') if res.namespaced else None
        return self.api.request('PATCH', res.path(ns, name, subresource), body=patch,
                                content_type='application/merge-patch+json')

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               grace_seconds: float | None = 0, wait: bool = True) -> dict | None:
        """Delete like a client does (grace 0 by default; with `wait`, until it is gone or held by a finalizer)."""
        res = self.resource(api_version, kind)
        ns = (namespace or 'default') if res.namespaced else None
        body: dict[str, Any] = {}
        if grace_seconds is not None:
            body['gracePeriodSeconds'] = int(grace_seconds)
        try:
            out = self.api.request('DELETE', res.path(ns, name), body=body or None)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        if wait and not grace_seconds:
            def gone_or_held() -> bool:
                cur = self.api.request('GET', res.path(ns, name), ok404=True)
                return cur is None or bool(cur['metadata'].get('finalizers'))
            self.wait_for(gone_or_held, timeout=30, message='%s %s to go' % (kind, name))
        return out

    # ------------------------------------------------------------------ kubelets (KWOK)
    def set_logs(self, namespace: str, pod: str, text: str, container: str | None = None, wait: bool = True) -> None:
        """The pod's container log (every container's when None), served by KWOK through the API
        server's GET pods/<pod>/log; see cluster/logs.py."""
        from .logs import set_logs
        set_logs(self, namespace, pod, text, container=container, wait=wait)

    def stop_kubelet(self, node: str, reason: str = 'KubeletNotReady') -> dict:
        """The node's kubelet stops: KWOK no longer plays it and its Ready condition goes False."""
        self.patch('v1', 'Node', node, {'metadata': {'annotations': {STOPPED: 'stopped'}}})
        now = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
        cur = self.get('v1', 'Node', node) or {}
        conds = [c for c in (cur.get('status') or {}).get('conditions') or [] if c.get('type') != 'Ready']
        conds.append({'type': 'Ready', 'status': 'False', 'reason': reason, 'message': 'kubelet stopped posting',
                      'lastHeartbeatTime': now, 'lastTransitionTime': now})
        return self.api.request('PATCH', '/api/v1/nodes/%s/status' % node, body={'status': {'conditions': conds}},
                                content_type='application/strategic-merge-patch+json')

    def start_kubelet(self, node: str) -> dict:
        """KWOK plays the node's kubelet again (and sets it Ready if it is not)."""
        return self.patch('v1', 'Node', node, {'metadata': {'annotations': {STOPPED: None}}})

    # ------------------------------------------------------------------ request log (proxy) and audit log
    @property
    def requests(self) -> list[dict[str, Any]]:
        """What the modules under test sent, in order: {'verb', 'path', 'query', 'body', 'status'[, 'fault']}."""
        return self.proxy.requests

    def clear_requests(self) -> None:
        self.proxy.clear_requests()

    def mutating_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r['verb'] not in READ_VERBS]

    def audit_mark(self) -> int:
        """A position in the API server's audit log; `audit_events(since=mark)` reads from it."""
        try:
            return self.cp.audit_log.stat().st_size
        except FileNotFoundError:
            return 0

    def audit_events(self, since: int = 0, user: str | None = None, settle: float = 1.0) -> list[dict[str, Any]]:
        """The audit log's events (ResponseComplete stage) after `since`, optionally of one user. The log
        is written when each response completes: `settle` waits for a marker request to appear."""
        marker = 'gpufleet-audit-marker-%d' % time.monotonic_ns()
        tok = self.cp.tokens['gpufleet-nobody']
        try:  # forbidden for this user, and logged all the same
            ApiClient(self.cp.url, self.cp.ca_path, token=tok).request('GET', '/api/v1/namespaces/%s' % marker)
        except ApiError:
            pass
        deadline = time.monotonic() + max(settle, 5.0)
        while True:
            events = self._read_audit(since)
            if any(marker in e.get('requestURI', '') for e in events) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        out = [e for e in events if 'gpufleet-audit-marker-' not in e.get('requestURI', '')]
        if user is not None:
            out = [e for e in out if (e.get('user') or {}).get('username') == user]
        return out

    def _read_audit(self, since: int) -> list[dict[str, Any]]:
        with open(self.cp.audit_log, 'rb') as f:
            f.seek(since)
            data = f.read()
        events = []
        for line in data.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get('stage') == 'ResponseComplete':
                events.append(ev)
        return events

    # ------------------------------------------------------------------ service accounts and RBAC
    def apply_yaml_docs(self, docs: Iterable[dict]) -> None:
        for doc in docs:
            if doc:
                self.apply(doc, settle=False)

    def sa_kubeconfig(self, namespace: str, name: str, path: str | None = None, through_proxy: bool = True,
                      seconds: int = 7200) -> str:
        """A kubeconfig with a token of service account namespace/name (created if missing), through
        the fault proxy unless `through_proxy` is false."""
        self._ensure_namespace(namespace)
        try:
            self.api.request('POST', '/api/v1/namespaces/%s/serviceaccounts' % namespace,
                             body={'apiVersion': 'v1', 'kind': 'ServiceAccount', 'metadata': {'name': name}})
        except ApiError as exc:
            if exc.status != 409:
                raise
        tr = self.api.request('POST', '/api/v1/namespaces/%s/serviceaccounts/%s/token' % (namespace, name),
                              body={'apiVersion': 'authentication.k8s.io/v1', 'kind': 'TokenRequest',
                                    'spec': {'expirationSeconds': seconds}})
        target = path or str(self.cp.dir / ('sa-%s-%s.kubeconfig' % (namespace, name)))
        import pathlib
        return str(self.cp.write_kubeconfig(pathlib.Path(target), {'token': tr['status']['token']},
                                            server=self.proxy.url if through_proxy else None))

    # ------------------------------------------------------------------ isolation between tests
    CLEAN_NAMESPACED = [
        ('apps/v1', 'Deployment'), ('apps/v1', 'DaemonSet'), ('apps/v1', 'StatefulSet'), ('apps/v1', 'ReplicaSet'),
        ('batch/v1', 'CronJob'), ('batch/v1', 'Job'), ('v1', 'ReplicationController'),
        ('kubevirt.io/v1', 'VirtualMachine'), ('kubevirt.io/v1', 'VirtualMachineInstanceMigration'),
        ('kubevirt.io/v1', 'VirtualMachineInstance'), ('policy/v1', 'PodDisruptionBudget'),
        ('resource.k8s.io/v1', 'ResourceClaim'), ('resource.k8s.io/v1', 'ResourceClaimTemplate'),
        ('upgrade.cattle.io/v1', 'Plan'), ('v1', 'ConfigMap'), ('v1', 'Secret'), ('v1', 'Service'),
        ('v1', 'PersistentVolumeClaim'), ('v1', 'Pod'),
        ('rbac.authorization.k8s.io/v1', 'RoleBinding'), ('rbac.authorization.k8s.io/v1', 'Role'),
        ('kwok.x-k8s.io/v1alpha1', 'Logs'), ('helm.cattle.io/v1', 'HelmChart'),
    ]
    # Kinds removed from the system namespaces too (a test's, never the control plane's own).
    CLEAN_EVERYWHERE = {'Pod', 'HelmChart'}
    CLEAN_CLUSTER = [('v1', 'Node'), ('resource.k8s.io/v1', 'ResourceSlice'), ('resource.k8s.io/v1', 'DeviceClass'),
                     ('nvidia.com/v1', 'ClusterPolicy'), ('nvidia.com/v1alpha1', 'NVIDIADriver')]
    KEEP = {('v1', 'ConfigMap', 'kube-root-ca.crt'), ('v1', 'Service', 'kubernetes')}

    def reset(self, timeout: float = 60) -> None:
        """Remove what tests made: every object of the kinds above outside the system namespaces
        and every pod (finalizers first), every node, the proxy's rules and log. Namespaces stay (deleting one
        takes the namespace controller seconds); their objects go."""
        self.faults.clear()
        namespaces = [n['metadata']['name'] for n in self.list('v1', 'Namespace')]
        test_ns = [n for n in namespaces if n not in SYSTEM_NAMESPACES or n == 'default']
        for api_version, kind in self.CLEAN_NAMESPACED:
            try:
                res = self.resource(api_version, kind)
            except KeyError:
                continue
            for obj in self.list(api_version, kind):
                meta = obj['metadata']
                ns = meta.get('namespace')
                # Pods go from every namespace: this control plane runs none of its own (no kubelet,
                # static pods or add-ons), so a pod in kube-system (a fixture's mirror pod) is a test's.
                if (ns not in test_ns and kind not in self.CLEAN_EVERYWHERE) or (api_version, kind, meta['name']) in self.KEEP:
                    continue
                if kind == 'Secret' and obj.get('type') == 'kubernetes.io/service-account-token':
                    continue
                if meta.get('finalizers'):
                    self.api.request('PATCH', res.path(ns, meta['name']), body={'metadata': {'finalizers': None}},
                                     content_type='application/merge-patch+json', ok404=True)
                self.api.request('DELETE', res.path(ns, meta['name']),
                                 body={'gracePeriodSeconds': 0, 'propagationPolicy': 'Background'}, ok404=True)
        for api_version, kind in self.CLEAN_CLUSTER:
            try:
                res = self.resource(api_version, kind)
            except KeyError:
                continue
            for obj in self.list(api_version, kind):
                if obj['metadata'].get('finalizers'):
                    self.api.request('PATCH', res.path(None, obj['metadata']['name']),
                                     body={'metadata': {'finalizers': None}},
                                     content_type='application/merge-patch+json', ok404=True)
                self.api.request('DELETE', res.path(None, obj['metadata']['name']), ok404=True)

        def clean() -> bool:
            pods = self.list('v1', 'Pod')
            for p in pods:  # a controller's pod created during the sweep, or one that kept a finalizer
                res = self.resource('v1', 'Pod')
                if p['metadata'].get('finalizers'):
                    self.api.request('PATCH', res.path(p['metadata']['namespace'], p['metadata']['name']),
                                     body={'metadata': {'finalizers': None}},
                                     content_type='application/merge-patch+json', ok404=True)
                self.api.request('DELETE', res.path(p['metadata']['namespace'], p['metadata']['name']),
                                 body={'gracePeriodSeconds': 0}, ok404=True)
            # Every RuntimeClass, after the GPU Operator's objects went: the operator owns the `nvidia` class it
            # adopts (its ClusterPolicy is the owner), so the garbage collector would remove it some time later,
            # under a client that remembers making it; the next test finds none and `_ensure_runtime_class`
            # makes it again (this control plane has no RuntimeClass of its own).
            classes = self.list('node.k8s.io/v1', 'RuntimeClass')
            for rc in classes:
                self.api.request('DELETE', self.resource('node.k8s.io/v1', 'RuntimeClass').path(
                    None, rc['metadata']['name']), ok404=True)
            return not pods and not classes and not self.list('v1', 'Node')

        self.wait_for(clean, timeout=timeout, interval=0.2, message='the cluster to be clean between tests')
        self._uid_map.clear()
        self._classes_made.clear()
        self.proxy.clear_requests()
