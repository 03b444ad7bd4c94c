"""A real Prometheus (Debian package) on loopback scraping a stdlib exporter the test controls.

    from tools import prometheus as prom_tools
    prometheus_server = prom_tools.prometheus_server   # the session-scoped fixture

    def test_x(prometheus_server):
        prometheus_server.exporter.set('DCGM_FI_DEV_XID_ERRORS', {'Hostname': 'gpu-1', 'gpu': '0'}, 0)
        prometheus_server.wait_for_points('DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-1"}', since, 3)
        prometheus_server.url   # http://127.0.0.1:PORT

Prometheus scrapes every second. Start-up is bounded (`START_TIMEOUT`); teardown sends SIGTERM
and kills after a bounded wait; and the server gets SIGKILL when the process that started it dies
(the control plane's `_die_with_parent`), so a killed test run or lab leaves none behind.
"""
from __future__ import annotations

import http.server
import json
import pathlib
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator

import pytest

from cluster.controlplane import _die_with_parent
from tools.debian import ensure_binary

START_TIMEOUT = 60.0      # seconds until /-/ready and the first scrape of the exporter
SCRAPE_INTERVAL = '1s'


def urllib_opener(url: str, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    """The metric gate core's opener for tests (the module uses ansible's open_url)."""
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() or b''


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _escape(value: str) -> str:
    return value.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


class MetricsEndpoint:
    """A loopback HTTP server answering GET /metrics with `self.render()` (Prometheus text format)."""

    def __init__(self, thread_name: str) -> None:
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path.split('?')[0] != '/metrics':
                    self.send_error(404)
                    return
                body = endpoint.render().encode()
                self.send_response(200)
                self.send_header('Content-Type', 'text/plain; version=0.0.4')
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass    # Prometheus gave up on the scrape (it stops with the lab): nothing to answer

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.port = self._server.server_address[1]
        self.target = '127.0.0.1:%d' % self.port
        self._thread = threading.Thread(target=self._server.serve_forever, name=thread_name, daemon=True)

    def render(self) -> str:
        raise NotImplementedError

    def start(self) -> 'MetricsEndpoint':
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class Exporter(MetricsEndpoint):
    """Serves /metrics in the Prometheus text format from values the test sets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._growth: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.scrapes = 0
        super().__init__('test-exporter')

    def set(self, name: str, labels: dict[str, str], value: float) -> None:
        with self._lock:
            self._series[(name, tuple(sorted(labels.items())))] = float(value)

    def inc(self, name: str, labels: dict[str, str], delta: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._series[key] = self._series.get(key, 0.0) + delta

    def grow(self, name: str, labels: dict[str, str], per_scrape: float) -> None:
        """A counter that grows by `per_scrape` at every scrape (0 keeps it flat: no traffic)."""
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._series.setdefault(key, 0.0)
            self._growth[key] = float(per_scrape)

    def remove(self, name: str, labels: dict[str, str]) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._series.pop(key, None)
            self._growth.pop(key, None)

    def render(self) -> str:
        with self._lock:
            self.scrapes += 1
            for key, delta in self._growth.items():
                self._series[key] = self._series.get(key, 0.0) + delta
            lines = []
            for (name, labels), value in sorted(self._series.items()):
                lbl = ','.join('%s="%s"' % (k, _escape(v)) for k, v in labels)
                lines.append('%s{%s} %r' % (name, lbl, value) if lbl else '%s %r' % (name, value))
            return '\n'.join(lines) + '\n'


class PrometheusServer:
    """`exporter` is anything with a `port` on 127.0.0.1 serving /metrics (the lab passes its DCGM stand-in)."""

    def __init__(self, binary: str, workdir: pathlib.Path, exporter: Any, job: str = 'test-exporter',
                 start_timeout: float = START_TIMEOUT) -> None:
        self.binary = binary
        self.workdir = workdir
        self.exporter = exporter
        self.job = job
        self.start_timeout = start_timeout
        self.port = free_port()
        self.url = 'http://127.0.0.1:%d' % self.port
        self.log_path = workdir / 'prometheus.log'
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process and return at once (`wait_ready` waits for it, bounded)."""
        cfg = self.workdir / 'prometheus.yml'
        cfg.write_text(
            'global:\n  scrape_interval: %s\n  evaluation_interval: %s\n'
            'scrape_configs:\n  - job_name: %s\n    static_configs:\n'
            '      - targets: ["127.0.0.1:%d"]\n' % (SCRAPE_INTERVAL, SCRAPE_INTERVAL, self.job, self.exporter.port))
        log = open(self.log_path, 'wb')
        self.proc = subprocess.Popen(
            [self.binary, '--config.file=%s' % cfg, '--storage.tsdb.path=%s' % (self.workdir / 'data'),
             '--web.listen-address=127.0.0.1:%d' % self.port, '--log.level=warn'],
            # Killed with the process that started it (the lab, a test worker), as the control plane is: a
            # killed run leaves no Prometheus behind.
            stdout=log, stderr=subprocess.STDOUT, cwd=str(self.workdir), preexec_fn=_die_with_parent)
        log.close()
        self._launched = time.monotonic()

    def wait_ready(self) -> None:
        """Until /-/ready and a first successful scrape of the exporter, at most `start_timeout` after launch."""
        assert self.proc is not None
        timeout = self.start_timeout
        deadline = self._launched + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError('prometheus exited with %s during start-up:\n%s' % (self.proc.returncode, self.log_tail()))
            try:
                with urllib.request.urlopen(self.url + '/-/ready', timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError('prometheus not ready after %ss:\n%s' % (timeout, self.log_tail()))
            time.sleep(0.1)
        # First successful scrape (the discovery sync takes about 5 s).
        while True:
            res = self.query('up{job="%s"} == 1' % self.job)
            if res:
                return
            if time.monotonic() > deadline:
                raise RuntimeError('prometheus did not scrape the exporter within %ss:\n%s' % (timeout, self.log_tail()))
            time.sleep(0.2)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors='replace')[-2000:]
        except OSError:
            return ''

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def _api(self, path: str, params: dict[str, Any]) -> Any:
        url = '%s%s?%s' % (self.url, path, urllib.parse.urlencode(params))
        with urllib.request.urlopen(url, timeout=10) as r:
            doc = json.loads(r.read().decode())
        assert doc['status'] == 'success', doc
        return doc['data']['result']

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {'query': expr}
        if at is not None:
            params['time'] = '%.3f' % at
        return self._api('/api/v1/query', params)

    def points(self, expr: str, start: float, end: float | None = None, step: float = 1.0) -> int:
        """Number of points of the first series of `expr` in [start, end] at `step`."""
        end = time.time() if end is None else end
        if end <= start:
            return 0
        res = self._api('/api/v1/query_range', {'query': expr, 'start': '%.3f' % start, 'end': '%.3f' % end,
                                                'step': '%g' % step})
        return min((len(s['values']) for s in res), default=0)

    def wait_for_points(self, expr: str, start: float, count: int, timeout: float = 60.0) -> float:
        """Wait (bounded) until `expr` has `count` points since `start`; returns the time it was seen."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.time()
            if self.points(expr, start, now) >= count:
                return now
            if time.monotonic() > deadline:
                raise AssertionError('%s did not reach %d points in %ss' % (expr, count, timeout))
            time.sleep(0.25)


@pytest.fixture(scope='session')
def prometheus_server() -> Iterator[PrometheusServer]:
    binary, reason = ensure_binary('prometheus', 'prometheus')
    if binary is None:
        pytest.skip('LOUD SKIP: no real Prometheus for the metric gate tests: ' + reason)
    exporter = Exporter().start()
    with tempfile.TemporaryDirectory(prefix='gpufleet-prom-') as tmp:
        server = PrometheusServer(binary, pathlib.Path(tmp), exporter)
        try:
            server.start()
            yield server
        finally:
            server.stop()
            exporter.stop()
