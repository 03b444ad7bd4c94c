"""http_get (plugins/module_utils/_http.py) against a real local HTTP server: an answer, an HTTP error
answer returned as its status and body, a redirect returned (not followed) when asked, and a
connection that fails raising."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.error import URLError

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils._http import RedirectRefused, http_get


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


# -- 2026-12-06 review T3-9: no redirect carries the request's headers to another origin --------------
class _Recorder(BaseHTTPRequestHandler):
    """The other origin: records the Authorization header of every request it gets."""
    seen: list = []

    def do_GET(self):  # noqa: N802 - the http.server interface
        _Recorder.seen.append(self.headers.get('Authorization'))
        body = b'elsewhere'
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _redirector(location):
    class _Redirect(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server interface
            if self.path.startswith('/here'):
                body = ('here ' + (self.headers.get('Authorization') or '')).encode()
                self.send_response(200)
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(302)
            self.send_header('Location', location(self))
            self.send_header('Content-Length', '0')
            self.end_headers()

        def log_message(self, *args):
            pass
    return _Redirect


@pytest.fixture
def serve():
    servers = []

    def start(handler):
        srv = HTTPServer(('127.0.0.1', 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv.server_address[1]
    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_a_redirect_to_another_origin_is_refused_and_gets_no_header(serve):
    _Recorder.seen = []
    other = serve(_Recorder)
    prom = serve(_redirector(lambda h: 'http://user:pw@localhost:%d/api?token=x' % other))
    with pytest.raises(RedirectRefused) as exc:
        http_get('http://127.0.0.1:%d/api/v1/query' % prom, {'Authorization': 'Bearer s3cr3t'}, 5)
    assert _Recorder.seen == []             # nothing reached the other origin, the token least of all
    assert isinstance(exc.value, URLError)  # callers that handle an unreachable server handle it
    assert exc.value.status == 302 and exc.value.redirect_target == 'http://localhost:%d' % other
    assert str(exc.value.reason) == ('answered HTTP 302 with a redirect to http://localhost:%d, another origin than '
                                     'http://127.0.0.1:%d: not followed, so that no credential goes there'
                                     % (other, prom))


@pytest.mark.parametrize('location', [
    lambda h, other: 'http://127.0.0.1:%d/x' % other,          # another port
    lambda h, other: 'https://127.0.0.1:%d/x' % h.server.server_address[1],   # another scheme
])
def test_another_port_or_scheme_is_another_origin(serve, location):
    other = serve(_Recorder)
    port = serve(_redirector(lambda h: location(h, other)))
    with pytest.raises(RedirectRefused):
        http_get('http://127.0.0.1:%d/' % port, {'Authorization': 'Bearer s3cr3t'}, 5)


def test_a_redirect_to_the_same_origin_is_followed_with_the_headers(serve):
    port = serve(_redirector(lambda h: '/here/api'))
    assert http_get('http://127.0.0.1:%d/api' % port, {'Authorization': 'Bearer t'}, 5) == (200, b'here Bearer t')
    port = serve(_redirector(lambda h: 'http://127.0.0.1:%d/here' % h.server.server_address[1]))
    assert http_get('http://127.0.0.1:%d/api' % port, {'Authorization': 'Bearer t'}, 5) == (200, b'here Bearer t')


def test_a_redirect_loop_on_the_same_origin_ends(serve):
    port = serve(_redirector(lambda h: '/again'))
    with pytest.raises(RedirectRefused, match='the 6th in a row: not followed'):
        http_get('http://127.0.0.1:%d/' % port, {}, 5)


def test_basic_authentication_goes_to_the_url_only(serve):
    port = serve(_redirector(lambda h: '/here'))
    status, body = http_get('http://127.0.0.1:%d/here' % port, {}, 5, url_username='scrape', url_password='pw')
    assert (status, body) == (200, b'here Basic c2NyYXBlOnB3')


def test_follow_redirects_takes_only_same_origin_or_none():
    with pytest.raises(ValueError, match="follow_redirects: 'urllib2' is neither"):
        http_get('http://127.0.0.1:9/', {}, 2, follow_redirects='urllib2')
