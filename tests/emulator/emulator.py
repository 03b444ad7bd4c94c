"""`Emulator`: the Kubernetes API emulator in a background thread, with a test-side API."""
from __future__ import annotations

import asyncio
import os
import pathlib
import tempfile
import threading
import time
from typing import Any, Callable, Iterable

import kmock
import yaml

from .faults import Faults
from .resources import Registry, ResourceType
from .server import Api, EmulatorHandler
from .simulator import Simulator
from .store import Store, clone

DEFAULT_VERSION = 'v1.34.2+rke2r1'
READ_VERBS = ('GET', 'HEAD')


class Emulator:
    """A Kubernetes API server on 127.0.0.1 for tests and the lab.

        with Emulator() as emu:
            emu.apply(fixtures.gpu_node('gpu-1'))
            subprocess.run(['kubectl', '--kubeconfig', emu.kubeconfig, 'get', 'nodes'])
    """

    def __init__(self, port: int = 0, kubeconfig_path: str | os.PathLike[str] | None = None,
                 host: str = '127.0.0.1', version: str = DEFAULT_VERSION, simulate: bool = True,
                 watch_timeout: float = 300.0, log_requests: bool = True) -> None:
        self.host = host
        self._requested_port = port
        self.port: int | None = None
        self.kubeconfig_path = str(kubeconfig_path) if kubeconfig_path else None
        self.git_version = version
        self.watch_timeout = watch_timeout
        self.log_requests = log_requests
        self.store = Store(Registry())
        self.faults = Faults()
        self.simulator = Simulator(self)
        self.simulator.enabled = simulate
        self._api = Api(self, self.store)
        self._requests: list[dict[str, Any]] = []
        self._req_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._handler: EmulatorHandler | None = None
        self._server: kmock.Server | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self.store.on_graceful_delete = self._graceful_delete

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> Emulator:
        if self._thread is not None:
            raise RuntimeError('the emulator is already running')
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._astart())
            except BaseException as exc:  # report to the starting thread
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._astop())
            loop.close()

        self._thread = threading.Thread(target=run, name='k8s-emulator', daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            self._thread.join(5)
            self._thread = None
            where = '%s:%s' % (self.host, self._requested_port)
            raise RuntimeError('the emulator did not start on %s: %s' % (where, errors[0])) from errors[0]
        self._write_kubeconfig()
        return self

    async def _astart(self) -> None:
        self._handler = EmulatorHandler(emulator=self)
        await self._handler.__aenter__()
        self._server = kmock.Server(self._handler, host=self.host, port=self._requested_port or None)
        await self._server.__aenter__()
        self.port = self._server.port
        assert self._loop is not None
        self.simulator.start(self._loop)

    async def _astop(self) -> None:
        self._api.close_watches()
        await asyncio.sleep(0)
        await self.simulator.stop()
        if self._server is not None:
            await self._server.__aexit__(None, None, None)
        if self._handler is not None:
            await self._handler.__aexit__(None, None, None)

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._thread = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def _write_kubeconfig(self) -> None:
        if self.kubeconfig_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix='k8s-emulator-')
            self.kubeconfig_path = os.path.join(self._tmpdir.name, 'kubeconfig')
        path = pathlib.Path(self.kubeconfig_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.kubeconfig_dict(), sort_keys=False))

    def kubeconfig_dict(self, context: str = 'emulator') -> dict[str, Any]:
        return {
            'apiVersion': 'v1', 'kind': 'Config', 'preferences': {},
            'clusters': [{'name': context, 'cluster': {'server': self.url}}],
            'users': [{'name': context, 'user': {'token': 'emulator-token'}}],
            'contexts': [{'name': context, 'context': {'cluster': context, 'user': context, 'namespace': 'default'}}],
            'current-context': context,
        }

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError('the emulator is not running')
        return 'http://%s:%d' % (self.host, self.port)

    @property
    def kubeconfig(self) -> str:
        if self.kubeconfig_path is None:
            raise RuntimeError('the emulator is not running')
        return self.kubeconfig_path

    @property
    def kmock(self) -> EmulatorHandler:
        """The kmock handler: `emu.kmock['get /foo'] << {...}` overrides the emulated API."""
        assert self._handler is not None
        return self._handler

    def version_info(self) -> dict[str, str]:
        core = self.git_version.lstrip('v').split('+')[0].split('.')
        return {'major': core[0], 'minor': core[1], 'gitVersion': self.git_version,
                'gitCommit': '0' * 40, 'gitTreeState': 'clean', 'buildDate': '2026-01-01T00:00:00Z',
                'goVersion': 'go1.24.9', 'compiler': 'gc', 'platform': 'linux/amd64'}

    # ------------------------------------------------------------------ loop helpers
    def _call(self, coro_fn: Callable[[], Any], timeout: float = 30) -> Any:
        """Run a coroutine on the emulator's loop from the test thread."""
        assert self._loop is not None
        if threading.current_thread() is self._thread:
            raise RuntimeError('not from the emulator thread')
        return asyncio.run_coroutine_threadsafe(coro_fn(), self._loop).result(timeout)

    def settle(self, horizon: float = 0.0, timeout: float = 30) -> None:
        """Wait until the simulator has nothing to do now (or within `horizon` seconds)."""
        if self._loop is not None and self._thread is not None:
            self._call(lambda: self.simulator.settle(horizon), timeout)

    def _graceful_delete(self, rt: ResourceType, obj: dict, grace: float) -> None:
        cap = self.simulator.max_grace_seconds
        delay = grace if cap is None else min(grace, cap)
        meta = obj['metadata']
        args = (rt, meta.get('namespace'), meta['name'], meta['uid'])
        loop = self._loop
        if loop is None:
            self.store.finish_termination(*args)
            return
        loop.call_soon_threadsafe(lambda: self.simulator.later(delay, self.store.finish_termination, *args))

    # ------------------------------------------------------------------ objects (test side)
    def register(self, rt: ResourceType) -> None:
        """Serve one more resource type (a CRD): it appears in discovery at once."""
        self.store.registry.add(rt)

    def _rt(self, api_version: str, kind: str) -> ResourceType:
        return self.store.registry.by_kind(api_version, kind)

    def apply(self, objs: dict | Iterable[dict], settle: bool = True) -> list[dict]:
        """Create or replace objects as given (status included); fills uid, resourceVersion,
        creationTimestamp, creates missing namespaces, then lets the simulator settle (pods bound to
        a node are Running when this returns unless their status says otherwise)."""
        items = [objs] if isinstance(objs, dict) else list(objs)
        out = []
        for obj in items:
            if obj.get('kind', '').endswith('List') and 'items' in obj:
                out.extend(self.apply(obj['items'], settle=False))
                continue
            rt = self._rt(obj.get('apiVersion', ''), obj.get('kind', ''))
            out.append(clone(self.store.put(rt, obj)))
        if settle:
            self.settle()
        return out

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        rt = self._rt(api_version, kind)
        obj = self.store.get(rt, namespace or ('default' if rt.namespaced else None), name)
        return None if obj is None else clone(self._api.present(rt, obj))

    def list(self, api_version: str, kind: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        rt = self._rt(api_version, kind)
        items, dummy = self.store.list(rt, namespace, label_selector, field_selector)
        return [clone(self._api.present(rt, o)) for o in items]

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               grace_seconds: float | None = 0) -> dict | None:
        """Delete like the API does (owners' dependents go too); grace 0 by default: gone at once."""
        rt = self._rt(api_version, kind)
        ns = namespace or ('default' if rt.namespaced else None)
        if self.store.get(rt, ns, name) is None:
            return None
        obj = clone(self.store.delete(rt, ns, name, grace_seconds))
        self.settle()
        return obj

    def patch(self, api_version: str, kind: str, name: str, patch: dict, namespace: str | None = None,
              subresource: str | None = None) -> dict:
        """JSON merge patch as a client would send it (status only with subresource='status')."""
        rt = self._rt(api_version, kind)
        ns = namespace or ('default' if rt.namespaced else None)
        obj = clone(self.store.patch(rt, ns, name, patch, 'application/merge-patch+json', subresource))
        self.settle()
        return obj

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10, interval: float = 0.02,
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

    # ------------------------------------------------------------------ request log
    def _log_request(self, entry: dict[str, Any]) -> None:
        if self.log_requests:
            with self._req_lock:
                self._requests.append(entry)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request received, in order: {'verb', 'path', 'query', 'body', 'status'[, 'fault']}."""
        with self._req_lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._req_lock:
            self._requests.clear()

    def mutating_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r['verb'] not in READ_VERBS]
