"""http_get (plugins/module_utils/_http.py) against a real local HTTP server: an answer, an HTTP error
answer returned as its status and body, a redirect returned (not followed) when asked, and a
connection that fails raising."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.error import URLError

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils._http import http_get


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server interface
        seen = self.headers.get('Authorization') or ''
        if self.path == '/ok':
            self._answer(200, ('ok ' + seen).encode())
        elif self.path == '/moved':
            self.send_response(302)
            self.send_header('Location', '/ok')
            self.send_header('Content-Length', '0')
            self.end_headers()
        else:
            self._answer(404, b'{"detail": "Not found."}')

    def _answer(self, status, body):
        self.send_response(status)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = HTTPServer(('127.0.0.1', 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield 'http://127.0.0.1:%d' % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_http_get_returns_the_answer_and_an_error_answer_as_its_status(server):
    assert http_get(server + '/ok', {'Authorization': 'Bearer t'}, 5) == (200, b'ok Bearer t')
    assert http_get(server + '/missing', {}, 5) == (404, b'{"detail": "Not found."}')


def test_http_get_follows_a_redirect_unless_told_not_to(server):
    assert http_get(server + '/moved', {}, 5) == (200, b'ok ')
    status, _body = http_get(server + '/moved', {}, 5, follow_redirects='none')
    assert status == 302


def test_http_get_raises_when_nothing_answers():
    with pytest.raises(URLError):
        http_get('http://127.0.0.1:9/', {}, 2)
