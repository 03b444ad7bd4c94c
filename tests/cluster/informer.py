"""A watch-fed cache of one kind, as client-go's informers keep one: what the stand-ins read every pass.

The stand-ins (pod log writer, kubelet pod status sync, SUC) used to LIST their kinds every 0.25 to 1 s: in a lab
that was about ten full lists a second (the JSON encoded by the API server, decoded here), for the whole run of every
lab test. An `Informer` lists the kind once, then watches it from that list's resourceVersion: the API server sends
each change once, and a pass reads the cache. A watch that ends (the server's timeout, a dropped connection)
resumes from the last resourceVersion seen; a 410 Gone (that version compacted away) lists again.

    pods = cluster.informer('v1', 'Pod')       # started on first use, synced (its first list read) on return
    running = [p for p in pods.items() if p['status'].get('phase') == 'Running']

The cache is a few milliseconds behind the server, as a controller's is: a stand-in that writes must not assume
its next pass sees its own write (`PodStatusSync._written`, `PodLogWriter._done`, the SUC stand-in's `fresh`). Its objects are shared: read them,
never change them.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.parse
from typing import Any

import urllib3

SYNC_TIMEOUT = 30.0
WATCH_SECONDS = 60          # the server ends each watch after this; the informer resumes it
RETRY_PAUSE = 0.5           # after an error (the control plane stopping, a dropped connection)


class Informer:
    """The objects of one kind (every namespace) kept current by a watch; `items()`, `get(namespace, name)`."""

    def __init__(self, cluster: Any, api_version: str, kind: str) -> None:
        self.kind = kind
        self.resource = cluster.resource(api_version, kind)
        self.api = cluster.api
        self._items: dict[tuple[str, str], dict[str, Any]] = {}
        self._rv = ''
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self.errors = 0
        self.lists = 0              # full lists made: the first, then one after each 410 Gone
        self._thread = threading.Thread(target=self._run, name='informer-' + kind.lower(), daemon=True)

    def start(self, timeout: float = SYNC_TIMEOUT) -> 'Informer':
        self._thread.start()
        if not self._synced.wait(timeout):
            self.stop()
            raise AssertionError('informer %s: no list within %.0f s' % (self.kind, timeout))
        return self

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()     # unblocks a read waiting on the stream
            except Exception:  # noqa: BLE001 - already closed
                pass
        self._thread.join(timeout=10)

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._items.values())

    def get(self, namespace: str | None, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._items.get((namespace or '', name))

    # ------------------------------------------------------------------ the watch
    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj.get('metadata') or {}
        return meta.get('namespace') or '', meta.get('name') or ''

    def _list(self) -> None:
        out = self.api.request('GET', self.resource.path())
        items = {}
        for item in out.get('items') or []:
            item.setdefault('apiVersion', self.resource.group_version)
            item.setdefault('kind', self.kind)
            items[self._key(item)] = item
        with self._lock:
            self._items = items
            self._rv = out['metadata']['resourceVersion']
            self.lists += 1
        self._synced.set()

    def _watch(self) -> bool:
        """One watch from the last resourceVersion; False when the cache must be listed again (410 Gone)."""
        query = {'watch': '1', 'resourceVersion': self._rv, 'allowWatchBookmarks': 'true',
                 'timeoutSeconds': str(WATCH_SECONDS)}
        headers = {'Accept': 'application/json', 'User-Agent': 'gpufleet-test-informer'}
        if self.api.token:
            headers['Authorization'] = 'Bearer ' + self.api.token
        response = self.api.pool.request(
            'GET', self.api.url + self.resource.path() + '?' + urllib.parse.urlencode(query), headers=headers,
            preload_content=False, retries=False, timeout=urllib3.Timeout(connect=10, read=WATCH_SECONDS + 30))
        self._response = response
        try:
            if response.status != 200:
                return response.status != 410
            buffer = b''
            for chunk in response.stream(65536, decode_content=False):
                if self._stop.is_set():
                    return True
                buffer += chunk
                *lines, buffer = buffer.split(b'\n')
                for line in lines:
                    if line.strip() and not self._apply(json.loads(line)):
                        return False
            return True
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, event: dict[str, Any]) -> bool:
        kind, obj = event.get('type'), event.get('object') or {}
        if kind == 'ERROR':
            return obj.get('code') != 410
        rv = (obj.get('metadata') or {}).get('resourceVersion')
        with self._lock:
            if kind in ('ADDED', 'MODIFIED'):
                obj.setdefault('apiVersion', self.resource.group_version)
                obj.setdefault('kind', self.kind)
                self._items[self._key(obj)] = obj
            elif kind == 'DELETED':
                self._items.pop(self._key(obj), None)
            if rv:
                self._rv = rv
        return True

    def _run(self) -> None:
        listed = False
        while not self._stop.is_set():
            try:
                if not listed:
                    self._list()
                    listed = True
                listed = self._watch()
            except Exception:  # noqa: BLE001 - a stand-in's cache outlives a dropped connection; counted
                if self._stop.is_set():
                    return
                self.errors += 1
                listed = listed and self._rv != ''
                time.sleep(RETRY_PAUSE)
