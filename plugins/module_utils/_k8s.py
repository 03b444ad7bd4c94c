# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Kubernetes access for the collection's modules.

- `AUTH_ARG_SPEC`: the kubernetes.core auth option names (deep-copy before use), documented by
  the `gpufleet.upgrade.k8s_auth_options` doc fragment.
- `get_api_client(params)`: a configured `kubernetes.client.ApiClient` (kubeconfig, context,
  explicit host/token/certificates, impersonation, proxy).
- `K8sClient`: raw JSON requests over that client's configuration with an explicit timeout and a
  bounded retry policy: reads (GET) are retried on 500/502/503/504, connection errors and
  timeouts; writes are never retried blindly. `update()` applies a patch computed from a fresh
  read with the object's resourceVersion as precondition, and on 409 re-reads and re-computes.
- `K8sError` (and `NotFoundError`, `ConflictError`, `TooManyRequestsError`) with messages that
  name the request.

The raw client avoids the generated models (pods are read as plain dicts, so a 100,000-pod list
is parsed page by page) and any discovery round-trips.
"""

from __future__ import annotations

import copy
import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote, urlencode

try:
    import kubernetes  # noqa: F401  (pylint: disable=unused-import)
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised by ansible-test import sanity
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = exc

try:
    import urllib3
    from urllib3._collections import HTTPHeaderDict  # 1.26 and 2.x; 2.x sends one line per added value
    HAS_URLLIB3 = True
except ImportError:  # pragma: no cover
    HAS_URLLIB3 = False

DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_PAGE_SIZE = 500

AUTH_ARG_SPEC: Dict[str, Dict[str, Any]] = {
    'kubeconfig': {'type': 'raw'},
    'context': {'type': 'str'},
    'host': {'type': 'str'},
    'api_key': {'type': 'str', 'no_log': True},
    'username': {'type': 'str'},
    'password': {'type': 'str', 'no_log': True},
    'validate_certs': {'type': 'bool', 'aliases': ['verify_ssl']},
    'ca_cert': {'type': 'path', 'aliases': ['ssl_ca_cert']},
    'client_cert': {'type': 'path', 'aliases': ['cert_file']},
    'client_key': {'type': 'path', 'aliases': ['key_file'], 'no_log': False},
    'proxy': {'type': 'str'},
    'impersonate_user': {'type': 'str'},
    'impersonate_groups': {'type': 'list', 'elements': 'str'},
    'request_timeout': {'type': 'float', 'default': DEFAULT_REQUEST_TIMEOUT},
}

# Environment fallbacks with kubernetes.core's names.
_ENV = {
    'kubeconfig': 'K8S_AUTH_KUBECONFIG',
    'context': 'K8S_AUTH_CONTEXT',
    'host': 'K8S_AUTH_HOST',
    'api_key': 'K8S_AUTH_API_KEY',
    'username': 'K8S_AUTH_USERNAME',
    'password': 'K8S_AUTH_PASSWORD',
    'ca_cert': 'K8S_AUTH_SSL_CA_CERT',
    'client_cert': 'K8S_AUTH_CERT_FILE',
    'client_key': 'K8S_AUTH_KEY_FILE',
    'proxy': 'K8S_AUTH_PROXY',
}

RETRYABLE_STATUS = (500, 502, 503, 504)


def auth_argument_spec() -> Dict[str, Dict[str, Any]]:
    """A deep copy of AUTH_ARG_SPEC, safe to extend."""
    return copy.deepcopy(AUTH_ARG_SPEC)


class K8sError(Exception):
    """A Kubernetes request failed; `str()` is a message fit for a user."""

    def __init__(self, msg: str, status: Optional[int] = None, method: Optional[str] = None,
                 path: Optional[str] = None, reason: Optional[str] = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.status = status
        self.method = method
        self.path = path
        self.reason = reason


class NotFoundError(K8sError):
    """404."""


class ConflictError(K8sError):
    """409: the object changed since it was read."""


class TooManyRequestsError(K8sError):
    """429: for an eviction, a PodDisruptionBudget does not allow it now."""


def _error_for(status: int) -> type:
    return {404: NotFoundError, 409: ConflictError, 429: TooManyRequestsError}.get(status, K8sError)


def _param(params: Dict[str, Any], name: str) -> Any:
    value = params.get(name)
    if value is None and name in _ENV:
        value = os.environ.get(_ENV[name]) or None
    return value


_TRUE = ('1', 'true', 'yes', 'on', 'y', 't')
_FALSE = ('0', 'false', 'no', 'off', 'n', 'f')


def _env_bool(name: str) -> bool:
    """A boolean environment variable (kubernetes.core's K8S_AUTH_VERIFY_SSL); anything else is an error."""
    value = os.environ.get(name, '').strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise K8sError('%s=%r is not a boolean (use true or false)' % (name, os.environ.get(name)))


def get_api_client(params: Dict[str, Any]) -> Any:
    """Build a `kubernetes.client.ApiClient` from the auth options.

    Order as kubernetes.core: an explicit `kubeconfig` (path or dict) or, without `host`, the
    default kubeconfig (KUBECONFIG or ~/.kube/config), else the in-cluster service account;
    explicit options override what the kubeconfig says. Raises K8sError with a clear message.
    """
    if not HAS_KUBERNETES:
        raise K8sError('the kubernetes Python library is required: %s' % KUBERNETES_IMPORT_ERROR)
    cfg = k8s_client.Configuration()
    kubeconfig = _param(params, 'kubeconfig')
    context = _param(params, 'context')
    host = _param(params, 'host')
    try:
        if isinstance(kubeconfig, dict):
            k8s_config.load_kube_config_from_dict(kubeconfig, context=context, client_configuration=cfg,
                                                  persist_config=False)
        elif kubeconfig:
            path = os.path.expanduser(str(kubeconfig))
            if not os.path.exists(path):
                raise K8sError('kubeconfig %r does not exist' % str(kubeconfig))
            k8s_config.load_kube_config(config_file=path, context=context, client_configuration=cfg,
                                        persist_config=False)
        elif not host:
            default = os.path.expanduser(os.environ.get('KUBECONFIG', '~/.kube/config').split(os.pathsep)[0])
            if os.path.exists(default):
                k8s_config.load_kube_config(config_file=default, context=context, client_configuration=cfg,
                                            persist_config=False)
            else:
                try:
                    k8s_config.load_incluster_config(client_configuration=cfg)
                except k8s_config.ConfigException as exc:
                    raise K8sError('no kubeconfig found (%s) and not running in a cluster: set kubeconfig or host'
                                   % default) from exc
    except K8sError:
        raise
    except Exception as exc:  # ConfigException, yaml errors, bad context name
        raise K8sError('cannot load the Kubernetes configuration (kubeconfig=%r, context=%r): %s'
                       % (kubeconfig if not isinstance(kubeconfig, dict) else '<dict>', context, exc)) from exc

    if host:
        cfg.host = str(host).rstrip('/')
    api_key = _param(params, 'api_key')
    if api_key:
        cfg.api_key = {'authorization': 'Bearer ' + api_key}
        cfg.api_key_prefix = {}
    username = _param(params, 'username')
    password = _param(params, 'password')
    if username and password:
        cfg.username = username
        cfg.password = password
        if not api_key and HAS_URLLIB3:
            cfg.api_key = {'authorization': urllib3.util.make_headers(
                basic_auth='%s:%s' % (username, password))['authorization']}
    verify = params.get('validate_certs')
    if verify is None and os.environ.get('K8S_AUTH_VERIFY_SSL'):
        verify = _env_bool('K8S_AUTH_VERIFY_SSL')
    if verify is not None:
        cfg.verify_ssl = bool(verify)
    for opt, attr in (('ca_cert', 'ssl_ca_cert'), ('client_cert', 'cert_file'), ('client_key', 'key_file')):
        value = _param(params, opt)
        if value:
            if not os.path.exists(str(value)):
                raise K8sError('%s %r does not exist' % (opt, value))
            setattr(cfg, attr, str(value))
    proxy = _param(params, 'proxy')
    if proxy:
        cfg.proxy = proxy
    # All retries are ours (K8sClient): urllib3 must not resend a write on its own.
    cfg.retries = False
    if not cfg.host:
        raise K8sError('no Kubernetes API host: set host or a kubeconfig with a server')
    api = k8s_client.ApiClient(configuration=cfg)
    if params.get('impersonate_user'):
        api.set_default_header('Impersonate-User', params['impersonate_user'])
    # The API server reads one group per Impersonate-Group header line and does not split on
    # commas: K8sClient sends one line per group (kept here, outside default_headers' dict).
    api.gpufleet_impersonate_groups = [str(g) for g in params.get('impersonate_groups') or []]
    return api


def _status_message(body: bytes) -> str:
    try:
        data = json.loads(body.decode('utf-8', 'replace'))
    except ValueError:
        return body.decode('utf-8', 'replace').strip()[:300]
    if isinstance(data, dict):
        return str(data.get('message') or data.get('reason') or '')[:300]
    return ''


class K8sClient:
    """Raw JSON access with a request timeout and a bounded, safe retry policy."""

    def __init__(self, api_client: Any, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 get_attempts: int = 4, backoff: float = 0.5, update_attempts: int = 5,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if request_timeout is None or request_timeout <= 0:
            raise K8sError('request_timeout must be a positive number of seconds, got %r' % (request_timeout,))
        self.api_client = api_client
        self.cfg = api_client.configuration
        self.pool = api_client.rest_client.pool_manager
        self.request_timeout = float(request_timeout)
        self.get_attempts = max(1, get_attempts)
        self.backoff = backoff
        self.update_attempts = max(1, update_attempts)
        self.sleep = sleep
        self.requests_made = 0
        self.retries_made = 0

    @classmethod
    def from_params(cls, params: Dict[str, Any], **kwargs: Any) -> 'K8sClient':
        return cls(get_api_client(params), request_timeout=params.get('request_timeout') or DEFAULT_REQUEST_TIMEOUT,
                   **kwargs)

    # -- one request ------------------------------------------------------------------------
    def _headers(self, content_type: Optional[str]) -> Any:
        headers = HTTPHeaderDict({'Accept': 'application/json'})
        headers.update({k: v for k, v in self.api_client.default_headers.items() if k != 'User-Agent'})
        headers['User-Agent'] = 'gpufleet.upgrade'
        for auth in self.cfg.auth_settings().values():
            if auth.get('in') == 'header' and auth.get('value'):
                headers[auth['key']] = auth['value']
        if content_type:
            headers['Content-Type'] = content_type
        for group in getattr(self.api_client, 'gpufleet_impersonate_groups', None) or []:
            headers.add('Impersonate-Group', group)
        return headers

    def request(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Any = None,
                content_type: Optional[str] = None) -> Any:
        """One request, no retry. Returns the decoded JSON body (or None); raises K8sError."""
        url = self.cfg.host.rstrip('/') + path
        if query:
            url += '?' + urlencode([(k, v) for k, v in query.items() if v is not None])
        data = None
        if body is not None:
            data = json.dumps(body).encode('utf-8')
            content_type = content_type or 'application/json'
        desc = '%s %s' % (method, path)
        self.requests_made += 1
        try:
            resp = self.pool.request(method, url, body=data, headers=self._headers(content_type),
                                     timeout=urllib3.Timeout(total=self.request_timeout), retries=False,
                                     preload_content=True)
        except urllib3.exceptions.NewConnectionError as exc:
            raise K8sError('%s: cannot reach the Kubernetes API at %s: %s' % (desc, self.cfg.host, exc),
                           status=None, method=method, path=path, reason='connection') from exc
        except urllib3.exceptions.TimeoutError as exc:
            msg = '%s: no answer within the request timeout of %gs' % (desc, self.request_timeout)
            if method != 'GET':
                msg += ('; the change may or may not have been applied (a write is not re-sent blindly): rerun the '
                        'task, it resumes from what is on the server')
            raise K8sError(msg, status=None, method=method, path=path, reason='timeout') from exc
        except urllib3.exceptions.HTTPError as exc:
            raise K8sError('%s: cannot reach the Kubernetes API at %s: %s' % (desc, self.cfg.host, exc),
                           status=None, method=method, path=path, reason='connection') from exc
        if resp.status >= 400:
            msg = _status_message(resp.data)
            raise _error_for(resp.status)('%s: HTTP %d%s' % (desc, resp.status, (' ' + msg) if msg else ''),
                                          status=resp.status, method=method, path=path, reason=msg)
        if not resp.data:
            return None
        try:
            return json.loads(resp.data)
        except ValueError as exc:
            raise K8sError('%s: the answer is not JSON' % desc, status=resp.status, method=method,
                           path=path) from exc

    # -- reads: retried ---------------------------------------------------------------------
    def get(self, path: str, query: Optional[Dict[str, Any]] = None) -> Any:
        """GET with bounded retries on 5xx, timeouts and connection errors (safe: reads)."""
        last: Optional[K8sError] = None
        for attempt in range(self.get_attempts):
            if attempt:
                self.retries_made += 1
                self.sleep(min(self.backoff * (2 ** (attempt - 1)), 5.0))
            try:
                return self.request('GET', path, query)
            except K8sError as exc:
                if exc.status in RETRYABLE_STATUS or exc.status is None:
                    last = exc
                    continue
                raise
        if last is None:  # pragma: no cover - the loop runs at least once
            raise K8sError('GET %s: no attempt made' % path)
        raise K8sError('%s (gave up after %d attempts)' % (last.msg, self.get_attempts), status=last.status,
                       method='GET', path=path, reason=last.reason)

    def get_or_none(self, path: str, query: Optional[Dict[str, Any]] = None) -> Any:
        try:
            return self.get(path, query)
        except NotFoundError:
            return None

    def list_pages(self, path: str, query: Optional[Dict[str, Any]] = None,
                   limit: int = DEFAULT_PAGE_SIZE) -> Iterator[List[Dict[str, Any]]]:
        """Yield the items of a list page by page (`limit`/`continue`)."""
        q = dict(query or {})
        q['limit'] = limit
        cont: Optional[str] = None
        pages = 0
        while True:
            if cont:
                q['continue'] = cont
            page = self.get(path, q) or {}
            pages += 1
            yield page.get('items') or []
            cont = (page.get('metadata') or {}).get('continue')
            if not cont:
                return
            if pages > 1000000:  # pragma: no cover - a server that never ends its list
                raise K8sError('GET %s: the list did not end after %d pages' % (path, pages))

    def list_all(self, path: str, query: Optional[Dict[str, Any]] = None,
                 limit: int = DEFAULT_PAGE_SIZE) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        for items in self.list_pages(path, query, limit):
            out.extend(items)
        return out

    def list_optional(self, path: str, query: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
        """List a resource whose API may not be installed (KubeVirt, DRA): [] on 404."""
        try:
            return self.list_all(path, query)
        except NotFoundError:
            return []

    # -- writes: never retried blindly ------------------------------------------------------
    def patch(self, path: str, body: Dict[str, Any], patch_type: str = 'merge') -> Any:
        ctype = {'merge': 'application/merge-patch+json', 'strategic': 'application/strategic-merge-patch+json',
                 'json': 'application/json-patch+json'}[patch_type]
        return self.request('PATCH', path, body=body, content_type=ctype)

    def post(self, path: str, body: Dict[str, Any]) -> Any:
        return self.request('POST', path, body=body)

    def delete(self, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        return self.request('DELETE', path, body=body)

    def update(self, path: str, compute: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]],
               current: Optional[Dict[str, Any]] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Read, compute a merge patch from what was read, apply it with the read resourceVersion.

        `compute(obj)` returns the patch, or None when nothing needs to change. On 409 the object
        is re-read and the patch re-computed (at most `update_attempts` times): safe, because the
        patch is derived from the fresh state and guarded by its resourceVersion. Any other write
        error is raised at once. `current`, a recent read of the object, saves the first GET (a
        stale one only costs a 409 and a re-read). Returns (object before, object after).
        """
        last: Optional[ConflictError] = None
        for attempt in range(self.update_attempts):
            if attempt:
                self.retries_made += 1
                self.sleep(min(self.backoff * attempt, 2.0))
            obj = current if (current is not None and not attempt) else self.get(path)
            patch = compute(copy.deepcopy(obj))
            if not patch:
                return obj, obj
            patch = copy.deepcopy(patch)
            patch.setdefault('metadata', {})['resourceVersion'] = (obj.get('metadata') or {}).get('resourceVersion')
            try:
                after = self.patch(path, patch)
            except ConflictError as exc:
                last = exc
                continue
            return obj, after
        if last is None:  # pragma: no cover
            raise K8sError('PATCH %s: no attempt made' % path)
        raise ConflictError('%s: the object kept changing (409 Conflict on %d attempts); nothing was changed by '
                            'this call, rerun the task' % (last.msg, self.update_attempts),
                            status=409, method='PATCH', path=path)


def path_for(api_version: str, plural: str, name: Optional[str] = None, namespace: Optional[str] = None,
             subresource: Optional[str] = None) -> str:
    """REST path of a resource: path_for('v1', 'pods', 'p', 'ns', 'eviction')."""
    base = '/api/v1' if api_version == 'v1' else '/apis/' + api_version
    if namespace:
        base += '/namespaces/' + quote(namespace, safe='')
    base += '/' + plural
    if name:
        base += '/' + quote(name, safe='')
    if subresource:
        base += '/' + subresource
    return base
