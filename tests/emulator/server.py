"""HTTP side of the emulator: a kmock handler subclass that answers the Kubernetes REST API.

kmock 0.8 provides the aiohttp server (`kmock.Server`), the request model (`kmock.Request`), the
reaction DSL (tests may still add `emu.kmock['get /foo'] << {...}`, tried before the emulated API)
and the Status rendering of `kmock.KubernetesError`. Everything kmock 0.8 gets wrong for a real
client or kubectl (see README.md) is answered here instead: discovery, the object endpoints,
selectors, pagination, status subresource, optimistic concurrency, watches, eviction, pod logs.
"""
from __future__ import annotations

import asyncio
import json
import sys
import traceback
from typing import TYPE_CHECKING, Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering

from . import policy, protobuf, selectors, tables
from .resources import ResourceType
from .store import ApiError, Store, not_found

if TYPE_CHECKING:
    from .emulator import Emulator

JSON = 'application/json'


def _json_response(payload: Any, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(body=json.dumps(payload, separators=(',', ':')).encode(), status=status,
                                content_type=JSON)


def _error_response(exc: ApiError) -> aiohttp.web.Response:
    return _json_response(exc.status(), exc.code)


class Route:
    """A parsed API path."""

    __slots__ = ('kind', 'rt', 'namespace', 'name', 'subresource', 'group', 'version', 'watch')

    def __init__(self, kind: str, rt: ResourceType | None = None, namespace: str | None = None,
                 name: str | None = None, subresource: str | None = None, group: str = '',
                 version: str = '', watch: bool = False) -> None:
        self.kind, self.rt, self.namespace, self.name = kind, rt, namespace, name
        self.subresource, self.group, self.version, self.watch = subresource, group, version, watch


@attrs.define(kw_only=True)
class EmulatorHandler(kmock.KubernetesScaffold):
    """kmock's Kubernetes scaffold with the emulated API served by `Emulator`'s store."""

    emulator: Any = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        # Deliberately not the scaffold's fallbacks: discovery and objects are answered by _serve().
        pass

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        emu: Emulator = self.emulator
        body = await raw_request.read()
        entry: dict[str, Any] = {'verb': raw_request.method, 'path': raw_request.path,
                                 'query': dict(raw_request.query)}
        data: Any = None
        if body:
            try:
                data = json.loads(body)
            except ValueError:
                data = None
        entry['body'] = data
        emu._log_request(entry)
        try:
            response = await self._faulted(raw_request, entry)
            if response is None and self._payloads:
                response = await self._user_reaction(raw_request, body, data)
            if response is None:
                response = await emu._api.serve(raw_request, body, data)
        except ApiError as exc:
            response = _error_response(exc)
        except kmock.KubernetesError as exc:
            response = await self._render_error(exc)
        except Exception as exc:  # a bug in the emulator: answer 500 and say so on stderr
            traceback.print_exc(file=sys.stderr)
            response = _error_response(ApiError(500, 'InternalError', 'emulator error: %r' % exc))
        entry['status'] = response.status
        return response

    async def _faulted(self, raw_request: aiohttp.web.BaseRequest, entry: dict) -> aiohttp.web.StreamResponse | None:
        fault = self.emulator.faults.match(entry['verb'], entry['path'], entry['query'])
        if fault is None:
            return None
        entry['fault'] = True
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.status:
            reason = {409: 'Conflict', 429: 'TooManyRequests', 500: 'InternalError', 503: 'ServiceUnavailable',
                      504: 'Timeout', 404: 'NotFound', 403: 'Forbidden'}.get(fault.status, 'Unknown')
            msg = fault.message or 'injected fault: %s %s answered %d' % (entry['verb'], entry['path'], fault.status)
            return _error_response(ApiError(fault.status, reason, msg))
        return None

    async def _user_reaction(self, raw_request: aiohttp.web.BaseRequest, body: bytes, data: Any
                             ) -> aiohttp.web.StreamResponse | None:
        request = rendering.Request(
            id=len(self._requests), raw_request=raw_request, url=raw_request.url, method=raw_request.method,
            params=dict(raw_request.query), headers=dict(raw_request.headers), body=body,
            text=body.decode('utf-8', 'replace'), data=data)
        # kmock's views match requests they have seen (by identity): record it on the root first.
        self._requests.append(request)
        try:
            return await kmock.RawHandler._handle(self, request)
        except NotImplementedError:
            return None


class Api:
    """The Kubernetes REST semantics over a Store."""

    def __init__(self, emulator: Emulator, store: Store) -> None:
        self.emu = emulator
        self.store = store
        self.registry = store.registry
        self.watches: set[asyncio.Queue] = set()

    # ------------------------------------------------------------------ routing
    def route(self, path: str) -> Route | None:
        parts = [p for p in path.split('/') if p]
        if not parts:
            return Route('root')
        if parts[0] == 'api':
            if len(parts) == 1:
                return Route('api')
            group, version, rest = '', parts[1], parts[2:]
        elif parts[0] == 'apis':
            if len(parts) == 1:
                return Route('apis')
            if len(parts) == 2:
                return Route('group', group=parts[1])
            group, version, rest = parts[1], parts[2], parts[3:]
        elif parts == ['version']:
            return Route('version')
        elif parts[:2] == ['openapi', 'v3']:
            return Route('openapi', name='/'.join(parts[2:]))
        elif parts[0] in ('healthz', 'readyz', 'livez'):
            return Route('health')
        else:
            return None
        if not rest:
            return Route('resources', group=group, version=version)
        watch = False
        if rest[0] == 'watch':
            watch, rest = True, rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == 'namespaces':
            rt = self.registry.by_plural(group, version, rest[2])
            if rt is not None and rt.namespaced:
                namespace, rest = rest[1], rest[2:]
        rt = self.registry.by_plural(group, version, rest[0])
        if rt is None:
            return Route('unknown', group=group, version=version)
        name = rest[1] if len(rest) > 1 else None
        sub = '/'.join(rest[2:]) or None
        return Route('object' if name else 'collection', rt, namespace, name, sub, group, version, watch)

    async def serve(self, raw: aiohttp.web.BaseRequest, body: bytes, data: Any) -> aiohttp.web.StreamResponse:
        route = self.route(raw.path)
        method = raw.method.upper()
        if 'protobuf' in raw.headers.get('Content-Type', '') and body:
            try:
                data = protobuf.decode(body)
            except protobuf.ProtobufError as exc:
                raise ApiError(415, 'UnsupportedMediaType', str(exc)) from None
        if route is None:
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        if route.kind in ('root', 'api', 'apis', 'group', 'resources', 'version', 'health', 'openapi'):
            if method not in ('GET', 'HEAD'):
                raise ApiError(405, 'MethodNotAllowed', 'method %s not allowed on %s' % (method, raw.path))
            return self.discovery(route, raw)
        if route.kind == 'unknown':
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        q = raw.query
        rt = route.rt
        assert rt is not None
        if route.kind == 'collection':
            if method == 'GET':
                if route.watch or q.get('watch') in ('true', '1'):
                    return await self.watch(raw, rt, route.namespace, None)
                return self.list(rt, route.namespace, q, raw.headers.get('Accept', ''))
            if method == 'POST':
                return self.create(rt, route.namespace, data, q)
            if method == 'DELETE':
                return self.delete_collection(rt, route.namespace, q, data)
            raise ApiError(405, 'MethodNotAllowed', 'method %s not allowed on a collection' % method)
        name = route.name
        assert name is not None
        sub = route.subresource
        if sub not in (None, 'status', 'eviction', 'log'):
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource (%s %s %s)'
                           % (rt.plural, name, sub))
        if sub == 'status' and not rt.status:
            raise ApiError(404, 'NotFound', '%s has no status subresource' % rt.plural)
        if sub == 'eviction':
            if method != 'POST' or rt.kind != 'Pod':
                raise ApiError(405, 'MethodNotAllowed', 'only POST creates an eviction')
            return self.evict(rt, route.namespace, name, data)
        if sub == 'log':
            if method != 'GET' or rt.kind != 'Pod':
                raise ApiError(405, 'MethodNotAllowed', 'only GET reads logs')
            return self.logs(rt, route.namespace, name, q)
        if method == 'GET':
            if route.watch or q.get('watch') in ('true', '1'):
                return await self.watch(raw, rt, route.namespace, name)
            obj = self.store.get(rt, route.namespace, name)
            if obj is None:
                raise not_found(rt, name)
            if tables.wants_table(raw.headers.get('Accept', '')):
                return _json_response(tables.table(rt, [self.present(rt, obj)],
                                                   {'resourceVersion': obj['metadata']['resourceVersion']}))
            return _json_response(self.present(rt, obj))
        if method == 'PUT':
            if not isinstance(data, dict):
                raise ApiError(400, 'BadRequest', 'the body of a PUT must be a JSON object')
            return _json_response(self.present(rt, self.store.replace(rt, route.namespace, name, data, sub)))
        if method == 'PATCH':
            ctype = raw.headers.get('Content-Type', '')
            if ctype.startswith('application/apply-patch') and self.store.get(rt, route.namespace, name) is None:
                obj = data if isinstance(data, dict) else self._yaml(body)
                obj.setdefault('metadata', {})['name'] = name
                return _json_response(self.present(rt, self.store.create(rt, obj, route.namespace)), 201)
            if data is None and ctype.startswith('application/apply-patch'):
                data = self._yaml(body)
            if q.get('dryRun'):
                obj = self.store.get(rt, route.namespace, name)
                if obj is None:
                    raise not_found(rt, name)
                return _json_response(self.present(rt, obj))
            return _json_response(self.present(rt, self.store.patch(rt, route.namespace, name, data, ctype, sub)))
        if method == 'DELETE':
            opts = data if isinstance(data, dict) else {}
            grace = opts.get('gracePeriodSeconds', q.get('gracePeriodSeconds'))
            if q.get('dryRun') or opts.get('dryRun'):
                obj = self.store.get(rt, route.namespace, name)
                if obj is None:
                    raise not_found(rt, name)
                return _json_response(obj)
            obj = self.store.delete(rt, route.namespace, name, None if grace is None else float(grace),
                                    opts.get('preconditions'), opts.get('propagationPolicy') or q.get('propagationPolicy'))
            return _json_response(obj)
        raise ApiError(405, 'MethodNotAllowed', 'method %s not allowed' % method)

    @staticmethod
    def _yaml(body: bytes) -> dict:
        import yaml
        data = yaml.safe_load(body.decode())
        if not isinstance(data, dict):
            raise ApiError(400, 'BadRequest', 'the body must be an object')
        return data

    # ------------------------------------------------------------------ discovery
    def discovery(self, route: Route, raw: aiohttp.web.BaseRequest) -> aiohttp.web.Response:
        if route.kind == 'health':
            return aiohttp.web.Response(text='ok')
        if route.kind == 'version':
            return _json_response(self.emu.version_info())
        if route.kind == 'openapi':
            return _json_response(self.openapi(route.name or ''))
        if route.kind == 'api':
            return _json_response({'kind': 'APIVersions', 'versions': ['v1'], 'serverAddressByClientCIDRs': [
                {'clientCIDR': '0.0.0.0/0', 'serverAddress': '%s:%s' % (self.emu.host, self.emu.port)}]})
        groups = self.registry.group_versions()
        if route.kind == 'root':
            paths = {'/api', '/api/v1', '/apis', '/version', '/healthz', '/livez', '/readyz'}
            for group, versions in groups.items():
                paths.add('/apis/%s' % group)
                paths.update('/apis/%s/%s' % (group, v) for v in versions)
            return _json_response({'paths': sorted(paths)})

        def group_doc(group: str, versions: list[str]) -> dict:
            vs = [{'groupVersion': '%s/%s' % (group, v), 'version': v} for v in versions]
            return {'name': group, 'versions': vs, 'preferredVersion': vs[0]}
        if route.kind == 'apis':
            return _json_response({'kind': 'APIGroupList', 'apiVersion': 'v1',
                                   'groups': [group_doc(g, vs) for g, vs in sorted(groups.items())]})
        if route.kind == 'group':
            if route.group not in groups:
                raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
            doc = group_doc(route.group, groups[route.group])
            doc.update({'kind': 'APIGroup', 'apiVersion': 'v1'})
            return _json_response(doc)
        # resources of a group/version
        rts = [rt for rt in self.registry.all() if rt.group == route.group and rt.version == route.version]
        if not rts:
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        gv = '%s/%s' % (route.group, route.version) if route.group else route.version
        resources = [entry for rt in sorted(rts, key=lambda r: r.plural) for entry in rt.discovery()]
        return _json_response({'kind': 'APIResourceList', 'apiVersion': 'v1', 'groupVersion': gv,
                               'resources': resources})

    def openapi(self, gv_path: str) -> dict:
        """Just enough OpenAPI v3 for kubectl to see that the server validates fields itself
        (`fieldValidation` on PATCH), so `kubectl create -f` skips client-side schema validation."""
        gvs = {}
        for rt in self.registry.all():
            gvs.setdefault('api/%s' % rt.version if not rt.group else 'apis/%s/%s' % (rt.group, rt.version),
                           []).append(rt)
        if not gv_path:
            return {'paths': {p: {'serverRelativeURL': '/openapi/v3/%s?hash=%d' % (p, self.store.rv)}
                              for p in sorted(gvs)}}
        if gv_path not in gvs:
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        paths = {}
        for rt in gvs[gv_path]:
            params = [{'name': 'fieldValidation', 'in': 'query', 'schema': {'type': 'string', 'uniqueItems': True}}]
            gvk = {'group': rt.group, 'version': rt.version, 'kind': rt.kind}
            url = rt.base_path('{namespace}' if rt.namespaced else None) + '/{name}'
            paths[url] = {'patch': {'x-kubernetes-group-version-kind': gvk, 'x-kubernetes-action': 'patch',
                                    'parameters': params, 'responses': {'200': {'description': 'OK'}}},
                          'put': {'x-kubernetes-group-version-kind': gvk, 'x-kubernetes-action': 'put',
                                  'parameters': params, 'responses': {'200': {'description': 'OK'}}}}
        return {'openapi': '3.0.0', 'info': {'title': 'Kubernetes', 'version': self.emu.git_version},
                'paths': paths, 'components': {'schemas': {}}}

    # ------------------------------------------------------------------ reads
    def present(self, rt: ResourceType, obj: dict) -> dict:
        """What a GET shows: PDBs carry the status the disruption controller would compute."""
        if rt.kind == 'PodDisruptionBudget' and rt.group == 'policy':
            obj = dict(obj)
            obj['status'] = self.pdb_status(obj)
        return obj

    def list(self, rt: ResourceType, namespace: str | None, q: Any, accept: str = '') -> aiohttp.web.Response:
        try:
            limit = int(q.get('limit') or 0)
        except ValueError:
            raise ApiError(400, 'BadRequest', 'limit must be an integer') from None
        if tables.wants_table(accept):
            items, meta = self.store.list(rt, namespace, q.get('labelSelector'), q.get('fieldSelector'), limit,
                                          q.get('continue'))
            return _json_response(tables.table(rt, [self.present(rt, o) for o in items], meta))
        special = rt.kind == 'PodDisruptionBudget'
        items, meta = self.store.list(rt, namespace, q.get('labelSelector'), q.get('fieldSelector'), limit,
                                      q.get('continue'), encoded=not special)
        if special:
            items = [json.dumps(self.present(rt, o), separators=(',', ':')).encode() for o in items]
        head = json.dumps({'kind': rt.list_kind, 'apiVersion': rt.api_version, 'metadata': meta},
                          separators=(',', ':')).encode()
        payload = head[:-1] + b',"items":[' + b','.join(items) + b']}'
        return aiohttp.web.Response(body=payload, content_type=JSON)

    def pdb_status(self, pdb: dict) -> dict:
        pod_rt = self.registry.by_kind('v1', 'Pod')
        ns = pdb['metadata'].get('namespace')
        pods, dummy = self.store.list(pod_rt, ns)
        return policy.budget(pdb, policy.matching_pods(pdb, pods), self.controller_replicas(ns))

    def controller_replicas(self, namespace: str | None) -> dict[str, int]:
        out: dict[str, int] = {}
        for api_version, kind in (('apps/v1', 'ReplicaSet'), ('apps/v1', 'StatefulSet'), ('apps/v1', 'Deployment'),
                                  ('v1', 'ReplicationController')):
            try:
                rt = self.registry.by_kind(api_version, kind)
            except KeyError:
                continue
            for obj in self.store.list(rt, namespace)[0]:
                replicas = (obj.get('spec') or {}).get('replicas')
                if isinstance(replicas, int):
                    out[obj['metadata']['uid']] = replicas
        return out

    def logs(self, rt: ResourceType, namespace: str | None, name: str, q: Any) -> aiohttp.web.Response:
        pod = self.store.get(rt, namespace, name)
        if pod is None:
            raise not_found(rt, name)
        text = self.emu.simulator.logs_for(pod, q.get('container'))
        tail = q.get('tailLines')
        if tail:
            lines = text.splitlines(keepends=True)
            text = ''.join(lines[-int(tail):]) if int(tail) > 0 else ''
        return aiohttp.web.Response(text=text, content_type='text/plain')

    # ------------------------------------------------------------------ writes
    def create(self, rt: ResourceType, namespace: str | None, data: Any, q: Any) -> aiohttp.web.Response:
        if not isinstance(data, dict):
            raise ApiError(400, 'BadRequest', 'the body of a POST must be a JSON object')
        kind, api_version = data.get('kind'), data.get('apiVersion')
        if (kind and kind != rt.kind) or (api_version and api_version != rt.api_version):
            raise ApiError(400, 'BadRequest', 'the API version in the data (%s) does not match the expected API '
                           'version (%s) or kind %s != %s' % (api_version, rt.api_version, kind, rt.kind))
        obj = self.store.create(rt, data, namespace, dry_run=bool(q.get('dryRun')))
        return _json_response(self.present(rt, obj), 201)

    def delete_collection(self, rt: ResourceType, namespace: str | None, q: Any, data: Any) -> aiohttp.web.Response:
        items, meta = self.store.list(rt, namespace, q.get('labelSelector'), q.get('fieldSelector'))
        opts = data if isinstance(data, dict) else {}
        grace = opts.get('gracePeriodSeconds', q.get('gracePeriodSeconds'))
        out = []
        for obj in items:
            try:
                out.append(self.store.delete(rt, obj['metadata'].get('namespace'), obj['metadata']['name'],
                                             None if grace is None else float(grace)))
            except ApiError:
                pass
        return _json_response({'kind': rt.list_kind, 'apiVersion': rt.api_version, 'metadata': meta, 'items': out})

    def evict(self, rt: ResourceType, namespace: str | None, name: str, data: Any) -> aiohttp.web.Response:
        body = data if isinstance(data, dict) else {}
        opts = body.get('deleteOptions') or {}
        with self.store.lock:
            pod = self.store.get(rt, namespace, name)
            if pod is None:
                raise not_found(rt, name)
            pdb_rt = self.registry.by_kind('policy/v1', 'PodDisruptionBudget')
            pdbs, dummy = self.store.list(pdb_rt, namespace)
            pods, dummy = self.store.list(rt, namespace) if pdbs else ([], {})
            code, message, pdb_name = policy.eviction_decision(pod, pdbs, pods, self.controller_replicas(namespace)
                                                               if pdbs else {})
            if code == 429:
                first, dummy, rest = message.partition('. ')
                raise ApiError(429, 'TooManyRequests', first + '.', {'causes': [
                    {'reason': 'DisruptionBudget', 'message': rest}]})
            if code != 201:
                raise ApiError(code, 'InternalError', message)
            grace = opts.get('gracePeriodSeconds')
            self.store.delete(rt, namespace, name, None if grace is None else float(grace), opts.get('preconditions'))
        return _json_response({'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Success',
                               'code': 201}, 201)

    # ------------------------------------------------------------------ watch
    async def watch(self, raw: aiohttp.web.BaseRequest, rt: ResourceType, namespace: str | None,
                    name: str | None) -> aiohttp.web.StreamResponse:
        q = raw.query
        try:
            label_pred = selectors.parse_label_selector(q.get('labelSelector'))
            terms = selectors.parse_field_selector(q.get('fieldSelector'))
        except selectors.SelectorError as exc:
            raise ApiError(400, 'BadRequest', str(exc)) from None
        field_pred = selectors.field_predicate(terms)

        def matches(obj: dict) -> bool:
            meta = obj.get('metadata', {})
            if namespace and rt.namespaced and meta.get('namespace') != namespace:
                return False
            if name and meta.get('name') != name:
                return False
            return label_pred(meta.get('labels') or {}) and field_pred(obj)

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def listener(ev_rt: ResourceType, etype: str, obj: dict) -> None:
            if ev_rt is rt and matches(obj):
                loop.call_soon_threadsafe(queue.put_nowait, (etype, obj))

        rv_text = q.get('resourceVersion') or ''
        with self.store.lock:
            initial: list[tuple[str, dict]] = []
            if rv_text in ('', '0') or q.get('sendInitialEvents') == 'true':
                items, dummy = self.store.list(rt, namespace)
                initial = [('ADDED', o) for o in items if matches(o)]
                if q.get('sendInitialEvents') == 'true' and q.get('allowWatchBookmarks') == 'true':
                    # WatchList (kubectl wait, informers): a bookmark marks the end of the initial state.
                    initial.append(('BOOKMARK', {'kind': rt.kind, 'apiVersion': rt.api_version, 'metadata': {
                        'resourceVersion': str(self.store.rv),
                        'annotations': {'k8s.io/initial-events-end': 'true'}}}))
            else:
                try:
                    since = int(rv_text)
                except ValueError:
                    raise ApiError(400, 'BadRequest', 'invalid resourceVersion %r' % rv_text) from None
                hist = self.store.history
                if hist and len(hist) == hist.maxlen and hist[0][0] > since + 1:
                    initial = [('ERROR', {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                                          'message': 'too old resource version: %d' % since, 'reason': 'Expired',
                                          'code': 410})]
                else:
                    initial = [(etype, obj) for rv, ev_rt, etype, obj in hist
                               if rv > since and ev_rt is rt and matches(obj)]
            self.store.listeners.append(listener)
        self.watches.add(queue)
        resp = aiohttp.web.StreamResponse(status=200, headers={'Content-Type': JSON, 'Transfer-Encoding': 'chunked'})
        try:
            await resp.prepare(raw)
            timeout = float(q.get('timeoutSeconds') or self.emu.watch_timeout)
            deadline = loop.time() + timeout

            as_table = tables.wants_table(raw.headers.get('Accept', ''))

            async def send(etype: str, obj: dict) -> None:
                shown = obj if etype in ('ERROR', 'BOOKMARK') else self.present(rt, obj)
                if as_table and etype not in ('ERROR', 'BOOKMARK'):
                    shown = tables.table(rt, [shown], {'resourceVersion': shown['metadata'].get('resourceVersion')})
                await resp.write(json.dumps({'type': etype, 'object': shown}, separators=(',', ':')).encode() + b'\n')
            for etype, obj in initial:
                await send(etype, obj)
            if initial and initial[-1][0] == 'ERROR':
                return resp
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
                if item is None:
                    break
                await send(*item)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.watches.discard(queue)
            with self.store.lock:
                if listener in self.store.listeners:
                    self.store.listeners.remove(listener)
        return resp

    def close_watches(self) -> None:
        for queue in list(self.watches):
            queue.put_nowait(None)
