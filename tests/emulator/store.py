"""The emulator's object store: indexed, thread-safe, with API server write semantics.

Why not kmock's own store: kmock 0.8 keeps every version of every object and answers each
request by scanning all objects, with no selectors, resourceVersion, pagination or status
subresource. This store keeps one dict per object (never mutated once stored: each write stores
a new dict), keys sorted lazily for `limit`/`continue`, an index per resource for the hot field
selectors (`spec.nodeName` of pods), an owner index for garbage collection, a cached JSON
encoding per object for fast lists, and a bounded event history for watches that resume from a
resourceVersion.
"""
from __future__ import annotations

import base64
import bisect
import collections
import datetime
import json
import random
import string
import threading
import uuid
from typing import Any, Callable, Iterable

from . import patching, selectors
from .resources import Registry, ResourceType

Key = tuple  # (namespace or '', name)

SYSTEM_NAMESPACES = ('default', 'kube-system', 'kube-public', 'kube-node-lease')


class ApiError(Exception):
    """An error answered as a Kubernetes `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        return {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                'message': self.message, 'reason': self.reason, 'details': self.details, 'code': self.code}


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, 'NotFound', '%s "%s" not found' % (_gr(rt), name),
                    {'name': name, 'group': rt.group, 'kind': rt.plural})


def conflict(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, 'Conflict', 'Operation cannot be fulfilled on %s "%s": the object has been modified; '
                    'please apply your changes to the latest version and try again' % (_gr(rt), name),
                    {'name': name, 'group': rt.group, 'kind': rt.plural})


def _gr(rt: ResourceType) -> str:
    return '%s.%s' % (rt.plural, rt.group) if rt.group else rt.plural


def now_rfc3339(offset: float = 0) -> str:
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset)
    return t.strftime('%Y-%m-%dT%H:%M:%SZ')


def clone(obj: Any) -> Any:
    """A deep copy that is also a JSON-compatibility check (faster than copy.deepcopy)."""
    return json.loads(json.dumps(obj))


def _random_suffix(n: int = 5) -> str:
    return ''.join(random.choice(string.ascii_lowercase + string.digits) for dummy in range(n))


class Bucket:
    """The objects of one resource type."""

    def __init__(self, rt: ResourceType) -> None:
        self.rt = rt
        self.objects: dict[Key, dict] = {}
        self.encoded: dict[Key, bytes] = {}
        self._sorted: list[Key] | None = None
        self.indexes: dict[str, dict[str, set[Key]]] = {f: collections.defaultdict(set) for f in rt.index_fields}

    def sorted_keys(self) -> list[Key]:
        if self._sorted is None:
            self._sorted = sorted(self.objects)
        return self._sorted

    def put(self, key: Key, obj: dict) -> None:
        old = self.objects.get(key)
        if old is None:
            self._sorted = None
        for path, index in self.indexes.items():
            if old is not None:
                index[selectors.field_value(old, path)].discard(key)
            index[selectors.field_value(obj, path)].add(key)
        self.objects[key] = obj
        self.encoded.pop(key, None)

    def remove(self, key: Key) -> dict | None:
        old = self.objects.pop(key, None)
        if old is not None:
            self._sorted = None
            self.encoded.pop(key, None)
            for path, index in self.indexes.items():
                index[selectors.field_value(old, path)].discard(key)
        return old

    def encode(self, key: Key) -> bytes:
        data = self.encoded.get(key)
        if data is None:
            data = self.encoded[key] = json.dumps(self.objects[key], separators=(',', ':')).encode()
        return data


Listener = Callable[[ResourceType, str, dict], None]


class Store:
    """All objects, keyed by resource type and (namespace, name)."""

    HISTORY = 50000

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        self.lock = threading.RLock()
        self.buckets: dict[ResourceType, Bucket] = {}
        self.rv = 1
        self.history: collections.deque = collections.deque(maxlen=self.HISTORY)
        self.listeners: list[Listener] = []
        self.owners: dict[str, set[tuple[ResourceType, Key]]] = collections.defaultdict(set)
        # Called with (rt, obj, grace_seconds) when an object starts a graceful deletion.
        self.on_graceful_delete: Callable[[ResourceType, dict, float], None] | None = None
        self.clock = now_rfc3339
        ns_rt = self.registry.by_kind('v1', 'Namespace')
        for ns in SYSTEM_NAMESPACES:
            self.put(ns_rt, {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': ns}})

    # ---------------------------------------------------------------- plumbing
    def bucket(self, rt: ResourceType) -> Bucket:
        b = self.buckets.get(rt)
        if b is None:
            b = self.buckets[rt] = Bucket(rt)
        return b

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        return ((namespace or '') if rt.namespaced else '', name)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, rt: ResourceType, etype: str, obj: dict) -> None:
        rv = int(obj.get('metadata', {}).get('resourceVersion') or self.rv)
        self.history.append((rv, rt, etype, obj))
        for listener in list(self.listeners):
            listener(rt, etype, obj)

    def _index_owners(self, rt: ResourceType, key: Key, old: dict | None, new: dict | None) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            for ref in obj.get('metadata', {}).get('ownerReferences') or []:
                uid = ref.get('uid')
                if uid:
                    if add:
                        self.owners[uid].add((rt, key))
                    else:
                        self.owners[uid].discard((rt, key))

    def _store(self, rt: ResourceType, key: Key, obj: dict, etype: str) -> dict:
        b = self.bucket(rt)
        old = b.objects.get(key)
        self._index_owners(rt, key, old, obj)
        b.put(key, obj)
        self._emit(rt, etype, obj)
        return obj

    def _remove(self, rt: ResourceType, key: Key, propagate: bool = True) -> dict | None:
        b = self.bucket(rt)
        old = b.remove(key)
        if old is None:
            return None
        self._index_owners(rt, key, old, None)
        gone = clone(old)
        gone['metadata']['resourceVersion'] = self._next_rv()
        self._emit(rt, 'DELETED', gone)
        uid = old.get('metadata', {}).get('uid')
        if propagate and uid and uid in self.owners:
            for dep_rt, dep_key in sorted(self.owners.pop(uid), key=lambda x: (x[0].plural, x[1])):
                dep = self.bucket(dep_rt).objects.get(dep_key)
                if dep is not None:
                    self._delete(dep_rt, dep_key, dep, None, None)
        if rt.kind == 'Namespace' and rt.group == '':
            ns = key[1]
            for other_rt, other in list(self.buckets.items()):
                if other_rt.namespaced:
                    for k in [k for k in other.objects if k[0] == ns]:
                        self._remove(other_rt, k)
        return gone

    # ---------------------------------------------------------------- defaults
    def _fill_metadata(self, rt: ResourceType, obj: dict, namespace: str | None) -> None:
        obj['apiVersion'] = rt.api_version
        obj['kind'] = rt.kind
        meta = obj.setdefault('metadata', {})
        if not meta.get('name'):
            if meta.get('generateName'):
                meta['name'] = meta['generateName'] + _random_suffix()
            else:
                raise ApiError(422, 'Invalid', '%s "" is invalid: metadata.name: Required value: name or '
                               'generateName is required' % rt.kind)
        if rt.namespaced:
            meta['namespace'] = namespace or meta.get('namespace') or 'default'
        else:
            meta.pop('namespace', None)
        meta.setdefault('uid', str(uuid.uuid4()))
        meta.setdefault('creationTimestamp', self.clock())
        if rt.kind not in ('Pod', 'Namespace', 'Node', 'ConfigMap', 'Secret', 'Event', 'ServiceAccount'):
            meta.setdefault('generation', 1)
        meta['resourceVersion'] = self._next_rv()
        self._defaults(rt, obj)

    def _defaults(self, rt: ResourceType, obj: dict) -> None:
        if rt.group == '' and rt.kind == 'Pod':
            spec = obj.setdefault('spec', {})
            spec.setdefault('restartPolicy', 'Always')
            spec.setdefault('terminationGracePeriodSeconds', 30)
            spec.setdefault('schedulerName', 'default-scheduler')
            spec.setdefault('dnsPolicy', 'ClusterFirst')
            spec.setdefault('containers', [])
            status = obj.setdefault('status', {})
            status.setdefault('phase', 'Pending')
            status.setdefault('qosClass', 'BestEffort')
        elif rt.group == '' and rt.kind == 'Namespace':
            obj.setdefault('spec', {})
            obj.setdefault('status', {'phase': 'Active'})
            obj['metadata'].setdefault('labels', {})['kubernetes.io/metadata.name'] = obj['metadata']['name']
        elif rt.group == 'batch' and rt.kind == 'Job':
            spec = obj.setdefault('spec', {})
            spec.setdefault('completions', 1)
            spec.setdefault('parallelism', 1)
            spec.setdefault('backoffLimit', 6)
            uid = obj['metadata']['uid']
            name = obj['metadata']['name']
            job_labels = {'batch.kubernetes.io/controller-uid': uid, 'batch.kubernetes.io/job-name': name,
                          'controller-uid': uid, 'job-name': name}
            spec.setdefault('selector', {'matchLabels': {'batch.kubernetes.io/controller-uid': uid}})
            tmpl = spec.setdefault('template', {})
            tmpl.setdefault('metadata', {}).setdefault('labels', {}).update(job_labels)
            tmpl.setdefault('spec', {}).setdefault('restartPolicy', 'Never')

    # ---------------------------------------------------------------- reads
    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict | None:
        with self.lock:
            return self.bucket(rt).objects.get(self._key(rt, namespace, name))

    def list(self, rt: ResourceType, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None, limit: int = 0, continue_token: str | None = None,
             encoded: bool = False) -> tuple[list[Any], dict]:
        """Matching objects (or their cached JSON bytes) in key order, and the list metadata."""
        try:
            label_pred = selectors.parse_label_selector(label_selector)
            terms = selectors.parse_field_selector(field_selector)
        except selectors.SelectorError as exc:
            raise ApiError(400, 'BadRequest', str(exc)) from None
        start_after: Key | None = None
        if continue_token:
            try:
                start_after = tuple(json.loads(base64.urlsafe_b64decode(continue_token.encode()))['k'])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, 'BadRequest', 'invalid continue token %r' % continue_token) from None
        with self.lock:
            b = self.bucket(rt)
            rest_terms = []
            candidates: list[Key] | None = None
            for path, op, value in terms:
                if op == '=' and path == 'metadata.namespace' and rt.namespaced:
                    if namespace not in (None, value):
                        candidates = []
                    namespace = value
                elif op == '=' and path == 'metadata.name':
                    cand = [k for k in ([(namespace or '', value)] if namespace or not rt.namespaced else
                                        [k for k in b.sorted_keys() if k[1] == value]) if k in b.objects]
                    candidates = cand if candidates is None else [k for k in candidates if k in set(cand)]
                elif op == '=' and path in b.indexes:
                    cand = b.indexes[path].get(value, set())
                    candidates = sorted(cand) if candidates is None else [k for k in candidates if k in cand]
                else:
                    rest_terms.append((path, op, value))
            if candidates is None:
                candidates = b.sorted_keys()
                if namespace and rt.namespaced:
                    lo = bisect.bisect_left(candidates, (namespace,))
                    hi = bisect.bisect_left(candidates, (namespace + '\x00',))
                    candidates = candidates[lo:hi]
            elif namespace and rt.namespaced:
                candidates = [k for k in candidates if k[0] == namespace]
            pos = bisect.bisect_right(candidates, start_after) if start_after is not None else 0
            field_pred = selectors.field_predicate(rest_terms)
            filtering = bool(label_selector and label_selector.strip()) or bool(rest_terms)
            out: list[Any] = []
            last: Key | None = None
            more = False
            n = len(candidates)
            i = pos
            while i < n:
                key = candidates[i]
                i += 1
                obj = b.objects[key]
                if filtering and not (label_pred(obj.get('metadata', {}).get('labels') or {}) and field_pred(obj)):
                    continue
                if limit and len(out) >= limit:
                    more = True
                    break
                out.append(b.encode(key) if encoded else obj)
                last = key
            meta: dict[str, Any] = {'resourceVersion': str(self.rv)}
            if more and last is not None:
                meta['continue'] = base64.urlsafe_b64encode(
                    json.dumps({'k': list(last), 'rv': self.rv}).encode()).decode()
                if not filtering:
                    meta['remainingItemCount'] = n - i + 1
            return out, meta

    # ---------------------------------------------------------------- writes
    def create(self, rt: ResourceType, obj: dict, namespace: str | None = None, *, keep_status: bool = False,
               dry_run: bool = False) -> dict:
        """POST semantics: 409 if it exists, server-filled metadata, status reset (unless keep_status)."""
        obj = clone(obj)
        meta = obj.setdefault('metadata', {})
        for field in ('uid', 'resourceVersion', 'creationTimestamp', 'deletionTimestamp', 'generation'):
            if not keep_status:
                meta.pop(field, None)
        if rt.status and not keep_status:
            obj.pop('status', None)
        with self.lock:
            if rt.namespaced:
                ns = namespace or meta.get('namespace') or 'default'
                if meta.get('namespace') and namespace and meta['namespace'] != namespace:
                    raise ApiError(400, 'BadRequest', 'the namespace of the provided object does not match the '
                                   'namespace sent on the request')
                if self.get(self.registry.by_kind('v1', 'Namespace'), None, ns) is None:
                    if keep_status:
                        self.put(self.registry.by_kind('v1', 'Namespace'),
                                 {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': ns}})
                    else:
                        raise ApiError(404, 'NotFound', 'namespaces "%s" not found' % ns,
                                       {'name': ns, 'kind': 'namespaces'})
                namespace = ns
            if not meta.get('name') and meta.get('generateName'):
                for dummy in range(20):
                    meta['name'] = meta['generateName'] + _random_suffix()
                    if self.get(rt, namespace, meta['name']) is None:
                        break
            key = self._key(rt, namespace, meta.get('name') or '')
            if meta.get('name') and key in self.bucket(rt).objects:
                raise ApiError(409, 'AlreadyExists', '%s "%s" already exists' % (_gr(rt), meta['name']),
                               {'name': meta['name'], 'group': rt.group, 'kind': rt.plural})
            rv_before = self.rv
            self._fill_metadata(rt, obj, namespace)
            if dry_run:
                self.rv = rv_before
                return obj
            key = self._key(rt, namespace, meta['name'])
            return self._store(rt, key, obj, 'ADDED')

    def put(self, rt: ResourceType, obj: dict) -> dict:
        """Create-or-replace from test code: keeps status and given metadata, fills the rest."""
        obj = clone(obj)
        meta = obj.setdefault('metadata', {})
        if rt.namespaced:
            meta['namespace'] = meta.get('namespace') or 'default'
        with self.lock:
            existing = self.get(rt, meta.get('namespace'), meta.get('name', ''))
            if existing is None:
                return self.create(rt, obj, meta.get('namespace'), keep_status=True)
            emeta = existing['metadata']
            meta.setdefault('uid', emeta['uid'])
            meta.setdefault('creationTimestamp', emeta['creationTimestamp'])
            if rt.namespaced:
                meta['namespace'] = emeta['namespace']
            obj['apiVersion'], obj['kind'] = rt.api_version, rt.kind
            if 'generation' in emeta:
                meta.setdefault('generation', emeta['generation'] + 1)
            meta['resourceVersion'] = self._next_rv()
            self._defaults(rt, obj)
            return self._store(rt, self._key(rt, emeta.get('namespace'), emeta['name']), obj, 'MODIFIED')

    def _commit_update(self, rt: ResourceType, key: Key, old: dict, new: dict, subresource: str | None,
                       check_rv: bool = True) -> dict:
        """Shared tail of PUT and PATCH: subresource split, optimistic concurrency, no-op detection."""
        name = key[1]
        new_rv = (new.get('metadata') or {}).get('resourceVersion')
        if check_rv and new_rv and str(new_rv) != old['metadata']['resourceVersion']:
            raise conflict(rt, name)
        if subresource == 'status':
            merged = clone(old)
            if 'status' in new:
                merged['status'] = new['status']
            else:
                merged.pop('status', None)
            new = merged
        else:
            if not isinstance(new.get('metadata'), dict):
                raise ApiError(422, 'Invalid', 'metadata is required')
            if rt.status:
                if 'status' in old:
                    new['status'] = clone(old['status'])
                else:
                    new.pop('status', None)
            meta = new['metadata']
            ometa = old['metadata']
            if meta.get('name', name) != name:
                raise ApiError(400, 'BadRequest', 'the name of the object (%s) does not match the name on the URL '
                               '(%s)' % (meta.get('name'), name))
            for field in ('uid', 'creationTimestamp', 'name', 'namespace', 'deletionTimestamp',
                          'deletionGracePeriodSeconds', 'generation'):
                if field in ometa:
                    meta[field] = ometa[field]
                else:
                    meta.pop(field, None)
        new['apiVersion'], new['kind'] = rt.api_version, rt.kind
        new['metadata']['resourceVersion'] = old['metadata']['resourceVersion']
        if new == old:
            return old
        if subresource != 'status' and 'generation' in old['metadata']:
            if {k: v for k, v in new.items() if k not in ('metadata', 'status')} != \
                    {k: v for k, v in old.items() if k not in ('metadata', 'status')}:
                new['metadata']['generation'] = old['metadata']['generation'] + 1
        new['metadata']['resourceVersion'] = self._next_rv()
        self._store(rt, key, new, 'MODIFIED')
        # An object being deleted goes once its last finalizer is removed.
        if new['metadata'].get('deletionTimestamp') and not new['metadata'].get('finalizers') \
                and not (rt.group == '' and rt.kind == 'Pod' and new.get('spec', {}).get('nodeName')
                         and new.get('status', {}).get('phase') not in ('Succeeded', 'Failed')
                         and self.on_graceful_delete is not None):
            self._remove(rt, key)
        return new

    def replace(self, rt: ResourceType, namespace: str | None, name: str, obj: dict,
                subresource: str | None = None) -> dict:
        """PUT semantics."""
        obj = clone(obj)
        with self.lock:
            key = self._key(rt, namespace, name)
            old = self.bucket(rt).objects.get(key)
            if old is None:
                raise not_found(rt, name)
            return self._commit_update(rt, key, old, obj, subresource)

    def patch(self, rt: ResourceType, namespace: str | None, name: str, body: Any, content_type: str,
              subresource: str | None = None) -> dict:
        """PATCH semantics; a body carrying a stale metadata.resourceVersion answers 409."""
        with self.lock:
            key = self._key(rt, namespace, name)
            old = self.bucket(rt).objects.get(key)
            if old is None:
                raise not_found(rt, name)
            base = clone(old)
            try:
                new = patching.apply_patch(base, body, content_type)
            except ValueError as exc:
                raise ApiError(415 if 'unsupported' in str(exc) else 422,
                               'UnsupportedMediaType' if 'unsupported' in str(exc) else 'Invalid', str(exc)) from None
            except Exception as exc:  # jsonpatch errors: failed test op, missing path
                raise ApiError(422, 'Invalid', 'the server rejected our request due to an error in our '
                               'request: %s' % exc) from None
            if not isinstance(new, dict):
                raise ApiError(422, 'Invalid', 'the patch must leave an object')
            return self._commit_update(rt, key, old, new, subresource)

    def delete(self, rt: ResourceType, namespace: str | None, name: str, grace_seconds: float | None = None,
               preconditions: dict | None = None, propagation: str | None = None) -> dict:
        """DELETE semantics: finalizers and pod grace periods make it two-phase."""
        with self.lock:
            key = self._key(rt, namespace, name)
            obj = self.bucket(rt).objects.get(key)
            if obj is None:
                raise not_found(rt, name)
            pre = preconditions or {}
            if pre.get('uid') and pre['uid'] != obj['metadata']['uid']:
                raise ApiError(409, 'Conflict', 'Precondition failed: UID in precondition: %s, UID in object meta: %s'
                               % (pre['uid'], obj['metadata']['uid']))
            if pre.get('resourceVersion') and pre['resourceVersion'] != obj['metadata']['resourceVersion']:
                raise conflict(rt, name)
            return self._delete(rt, key, obj, grace_seconds, propagation)

    def _delete(self, rt: ResourceType, key: Key, obj: dict, grace_seconds: float | None,
                propagation: str | None) -> dict:
        meta = obj['metadata']
        is_pod = rt.group == '' and rt.kind == 'Pod'
        if is_pod:
            spec, status = obj.get('spec', {}), obj.get('status', {})
            if grace_seconds is None:
                grace_seconds = spec.get('terminationGracePeriodSeconds', 30)
            if not spec.get('nodeName') or status.get('phase') in ('Succeeded', 'Failed'):
                grace_seconds = 0
            if self.on_graceful_delete is None:
                grace_seconds = 0
        else:
            grace_seconds = 0
        graceful = is_pod and grace_seconds and grace_seconds > 0
        if meta.get('finalizers') or graceful:
            if meta.get('deletionTimestamp') and not graceful:
                return obj
            new = clone(obj)
            nmeta = new['metadata']
            if graceful:
                current = nmeta.get('deletionGracePeriodSeconds')
                if current is not None and current <= grace_seconds:
                    return obj
                nmeta['deletionGracePeriodSeconds'] = int(grace_seconds)
                nmeta['deletionTimestamp'] = self.clock(grace_seconds)
            else:
                nmeta.setdefault('deletionTimestamp', self.clock())
                nmeta.setdefault('deletionGracePeriodSeconds', 0)
            nmeta['resourceVersion'] = self._next_rv()
            self._store(rt, key, new, 'MODIFIED')
            if graceful and self.on_graceful_delete is not None:
                self.on_graceful_delete(rt, new, float(grace_seconds))
            return new
        gone = self._remove(rt, key, propagate=propagation != 'Orphan')
        assert gone is not None
        return gone

    def finish_termination(self, rt: ResourceType, namespace: str | None, name: str, uid: str) -> None:
        """The kubelet's part of a graceful pod deletion: remove the pod once it stopped."""
        with self.lock:
            key = self._key(rt, namespace, name)
            obj = self.bucket(rt).objects.get(key)
            if obj is None or obj['metadata']['uid'] != uid or not obj['metadata'].get('deletionTimestamp'):
                return
            if obj['metadata'].get('finalizers'):
                return
            self._remove(rt, key)

    def all_objects(self, rt: ResourceType) -> Iterable[dict]:
        with self.lock:
            return list(self.bucket(rt).objects.values())
