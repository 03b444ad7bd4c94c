"""A small fault-injecting HTTPS proxy in front of the real API server.

The modules under test reach the API server through it (the `Cluster.kubeconfig` points here), so
a test can answer chosen requests with an error or slow them down, which the real server does not
do on demand: 409, 429, 500/503, time-outs, dropped connections. Every request it forwards or
answers is logged in order (`requests`), the way the tests read what a module sent.

    proxy.faults.add(method='PATCH', path=r'^/api/v1/nodes/gpu-1$', status=503, times=1)
    proxy.faults.add(method='GET', path=r'/pods$', delay=3, times=1)      # slow, then served
    proxy.faults.add(method='POST', path=r'/eviction$', drop=True)       # connection closed, no answer
    proxy.faults.add(method='PATCH', path=r'^/api/v1/nodes/gpu-1$', status=409, times=1, skip=2)  # the 3rd only

Rules match by method, a regular expression searched in the path, optional query values, and
count (`times`, after letting the first `skip` matching requests through); the first live rule that
matches applies. Authentication passes through (bearer
tokens; a client certificate cannot cross a TLS-terminating proxy).
"""
from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import re
import socket
import socketserver
import ssl
import threading
import time
import urllib.parse
from typing import Any, Pattern

HOP_BY_HOP = {'connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailers',
              'transfer-encoding', 'upgrade', 'content-length', 'host'}
REASONS = {409: 'Conflict', 429: 'TooManyRequests', 500: 'InternalError', 503: 'ServiceUnavailable',
           504: 'Timeout', 403: 'Forbidden', 404: 'NotFound', 400: 'BadRequest', 410: 'Expired'}


@dataclasses.dataclass
class Fault:
    method: str | None          # HTTP verb, None for any
    path: Pattern[str]          # searched in the request path
    status: int | None          # error status to answer; None: serve normally (after `delay`)
    delay: float                # seconds to wait before answering (or before dropping)
    times: int | None           # how many matching requests to affect; None: all of them
    query: dict[str, str] | None = None   # query parameters that must be present with these values
    message: str | None = None
    drop: bool = False          # close the connection without an answer
    retry_after: int | None = None
    skip: int = 0               # matching requests let through (served normally) before the rule applies
    hits: int = 0
    passed: int = 0             # matching requests let through so far (at most `skip`)

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


class Faults:
    """The proxy's rules (`add`, `clear`, iteration)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, method: str | None = None, path: str = '', status: int | None = None, delay: float = 0.0,
            times: int | None = None, query: dict[str, str] | None = None, message: str | None = None,
            drop: bool = False, retry_after: int | None = None, skip: int = 0) -> Fault:
        if status is None and not delay and not drop:
            raise ValueError('a fault needs status=, delay= or drop=')
        if skip < 0:
            raise ValueError('skip= counts requests let through: 0 or more')
        fault = Fault(method.upper() if method else None, re.compile(path), status, float(delay), times, query,
                      message, drop, retry_after, int(skip))
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def __iter__(self):  # type: ignore[no-untyped-def]
        with self._lock:
            return iter(list(self._faults))

    def match(self, method: str, path: str, query: dict[str, Any]) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.exhausted:
                    continue
                if fault.method and fault.method != method.upper():
                    continue
                if not fault.path.search(path):
                    continue
                if fault.query and any(query.get(k) != v for k, v in fault.query.items()):
                    continue
                if fault.passed < fault.skip:
                    fault.passed += 1     # let through; a later rule does not see it either
                    return None
                fault.hits += 1
                return fault
        return None


def status_body(code: int, message: str) -> bytes:
    reason = REASONS.get(code, 'InternalError')
    return json.dumps({'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                       'message': message, 'reason': reason, 'code': code}).encode()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    proxy: 'FaultProxy'
    tls: ssl.SSLContext

    def get_request(self):  # type: ignore[no-untyped-def]
        # TLS per connection, handshaken in the connection's own thread (not in the accept loop).
        sock, addr = self.socket.accept()
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _serve(self) -> None:
        proxy = self.server.proxy
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        body = self._request_body()
        data: Any = None
        if body:
            try:
                data = json.loads(body)
            except ValueError:
                data = None
        entry: dict[str, Any] = {'verb': self.command, 'path': url.path, 'query': query, 'body': data,
                                 'user_agent': self.headers.get('User-Agent', ''), 'time': time.time()}
        proxy._log(entry)
        fault = proxy.faults.match(self.command, url.path, query)
        if fault is not None:
            entry['fault'] = True
            if fault.delay:
                time.sleep(fault.delay)
            if fault.drop:
                entry['status'] = 0
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if fault.status is not None:
                entry['status'] = fault.status
                payload = status_body(fault.status, fault.message or 'injected fault: %d' % fault.status)
                self.send_response(fault.status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(payload)))
                if fault.retry_after is not None or fault.status == 429:
                    self.send_header('Retry-After', str(fault.retry_after if fault.retry_after is not None else 1))
                self.end_headers()
                self.wfile.write(payload)
                return
        self._forward(proxy, body, entry)

    def _request_body(self) -> bytes:
        """The request's whole body: by Content-Length, or decoded from chunks (none is left on the connection)."""
        if 'chunked' in (self.headers.get('Transfer-Encoding') or '').lower():
            parts = []
            while True:
                size = int(self.rfile.readline(65537).split(b';', 1)[0].strip() or b'0', 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b'\r\n', b'\n', b''):   # trailers
                        pass
                    return b''.join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)                                            # the chunk's CRLF
        length = int(self.headers.get('Content-Length') or 0)
        return self.rfile.read(length) if length else b''

    def _forward(self, proxy: 'FaultProxy', body: bytes, entry: dict[str, Any]) -> None:
        conn = http.client.HTTPSConnection('127.0.0.1', proxy.upstream_port, context=proxy.upstream_ssl,
                                           timeout=proxy.upstream_timeout)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers['Host'] = '127.0.0.1:%d' % proxy.upstream_port
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
        except OSError as exc:
            conn.close()
            entry['status'] = 502
            payload = status_body(503, 'fault proxy: upstream error: %s' % exc)
            self.send_response(503)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        entry['status'] = resp.status
        try:
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            length = resp.getheader('Content-Length')
            if self.command == 'HEAD' or resp.status in (204, 304) or 100 <= resp.status < 200:
                # No body may follow (RFC 9112 6.3): neither chunks nor a terminator, or the client reads
                # them as the start of its next response on this connection (`malformed HTTP response "0"`
                # after kubectl's discovery cache got a 304). HEAD keeps the length of the body it describes.
                resp.read()
                if self.command == 'HEAD' and length is not None:
                    self.send_header('Content-Length', length)
                self.end_headers()
                return
            if length is not None and resp.getheader('Transfer-Encoding') is None:
                payload = resp.read()
                self.send_header('Content-Length', str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            # A stream (a watch, a followed log) or a chunked answer: relay it chunk by chunk.
            self.send_header('Transfer-Encoding', 'chunked')
            self.end_headers()
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                self.wfile.write(b'%x\r\n%s\r\n' % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b'0\r\n\r\n')
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, socket.timeout, OSError):
            self.close_connection = True
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve


class FaultProxy:
    """HTTPS on 127.0.0.1 (certificate from the control plane's CA) forwarding to `upstream_port`."""

    def __init__(self, upstream_port: int, ca_path: str, cert: tuple[str, str], port: int = 0,
                 upstream_timeout: float = 330.0) -> None:
        self.upstream_port = upstream_port
        self.upstream_timeout = upstream_timeout
        self.upstream_ssl = ssl.create_default_context(cafile=ca_path)
        self.faults = Faults()
        self._requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.log_requests = True
        self._server = _Server(('127.0.0.1', port), _Handler)
        self._server.proxy = self
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*cert)
        self._server.tls = ctx
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={'poll_interval': 0.2},
                                        name='fault-proxy', daemon=True)

    @property
    def url(self) -> str:
        return 'https://127.0.0.1:%d' % self.port

    def start(self) -> 'FaultProxy':
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _log(self, entry: dict[str, Any]) -> None:
        if self.log_requests:
            with self._lock:
                self._requests.append(entry)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()
