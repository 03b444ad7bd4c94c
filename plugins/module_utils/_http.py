# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on the controller.
"""One HTTP GET for the modules that read an HTTP API other than Kubernetes' (Prometheus for
metric_gate, AWX for awx_approval_info), through Ansible's ``open_url`` (its TLS options).

``http_get`` returns ``(status, body)``, an HTTP error answer included (its status and body, not an
exception), so each caller decides what a status means. A timeout or a connection that fails raises
as ``open_url`` raises it (``socket.timeout``/``TimeoutError``, ``URLError``, ``OSError``).

Redirects never carry the request's headers (its ``Authorization``) to another origin: by default
(``follow_redirects='same_origin'``) a redirect to the same scheme, host and port is followed, up to
`MAX_REDIRECTS` times, and one to any other origin (another host or port, https to http) raises
`RedirectRefused`, which names that origin without its userinfo, path or query; with
``follow_redirects='none'`` a redirect is returned as its 3xx status. (open_url's own ``urllib2``
mode copies every header to whatever host a redirect names.)
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple
from urllib.error import HTTPError, URLError
from urllib.parse import urljoin, urlsplit

from ansible.module_utils.urls import open_url

__all__ = ['MAX_REDIRECTS', 'RedirectRefused', 'http_get', 'origin']

MAX_REDIRECTS = 5
_DEFAULT_PORTS = {'http': 80, 'https': 443}


class RedirectRefused(URLError):
    """A redirect that was not followed (a URLError, so that callers which handle an unreachable server
    handle it). `reason` names the status and the origin it pointed to, never its userinfo, path or
    query; `redirect_target` is that origin."""

    def __init__(self, status: int, target: str, why: str) -> None:
        super().__init__('answered HTTP %d with a redirect to %s, %s' % (status, target, why))
        self.status = status
        self.redirect_target = target


def _origin_key(url: str) -> Tuple[str, str, Optional[int]]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:      # a port that is not a number
        port = -1
    return scheme, (parts.hostname or '').lower(), port if port is not None else _DEFAULT_PORTS.get(scheme)


def origin(url: str) -> str:
    """`url`'s origin, ``scheme://host[:port]``, without its userinfo, path, query or fragment."""
    parts = urlsplit(url)
    return '%s://%s' % (parts.scheme.lower(), parts.netloc.rpartition('@')[2].lower())


def http_get(url: str, headers: Dict[str, str], timeout: float, validate_certs: bool = True,
             ca_path: Optional[str] = None, follow_redirects: str = 'same_origin',
             url_username: Optional[str] = None, url_password: Optional[str] = None) -> Tuple[int, bytes]:
    """GET `url`: (status, body). `follow_redirects`: ``same_origin`` (follow a redirect to the same
    origin; `RedirectRefused` for one to another origin, or after `MAX_REDIRECTS`) or ``none`` (a
    redirect is its 3xx status). `url_username` and `url_password`: basic authentication, sent only
    to `url`'s origin."""
    if follow_redirects not in ('same_origin', 'none'):
        raise ValueError('follow_redirects: %r is neither same_origin nor none' % (follow_redirects,))
    start = _origin_key(url)
    status = 0
    for _hop in range(MAX_REDIRECTS + 1):
        try:
            resp = open_url(url, method='GET', headers=headers, timeout=timeout, validate_certs=validate_certs,
                            ca_path=ca_path, follow_redirects='none', url_username=url_username,
                            url_password=url_password, force_basic_auth=bool(url_username))
            return resp.getcode(), resp.read()
        except HTTPError as exc:
            status = exc.code
            location = exc.headers.get('Location') if exc.headers is not None else None
            if not 300 <= status < 400 or not location or follow_redirects == 'none':
                return status, exc.read() or b''
            target = urljoin(url, location.strip())
            if _origin_key(target) != start:
                raise RedirectRefused(status, origin(target), 'another origin than %s: not followed, so that no '
                                      'credential goes there' % origin(url))
            url = target
    raise RedirectRefused(status, origin(url), 'the %dth in a row: not followed' % (MAX_REDIRECTS + 1))
