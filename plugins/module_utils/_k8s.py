# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Kubernetes access for the collection's modules.

- `AUTH_ARG_SPEC`: the kubernetes.core auth option names (deep-copy before use), documented by
  the `gpufleet.upgrade.k8s_auth_options` doc fragment.
- `get_api_client(params)`: an `ApiConnection` (host, urllib3 pool with the TLS settings, auth and
  impersonation headers) from the kubeconfig, context, explicit host/token/certificates and proxy.
  Ordinary kubeconfigs are read here; exec and auth-provider plugins and the in-cluster service
  account by the kubernetes library, imported only then.
- `K8sClient`: raw JSON requests over that client's configuration with an explicit timeout and a
  bounded retry policy: reads (GET) are retried on 500/502/503/504, connection errors and
  timeouts; writes are never retried blindly. `update()` applies a patch computed from a fresh
  read with the object's resourceVersion as precondition, and on 409, 5xx or a timeout re-reads
  and re-computes (idempotent by construction), within `update_attempts`.
- `K8sError` (and `NotFoundError`, `ConflictError`, `TooManyRequestsError`) with messages that
  name the request.

The raw client avoids the generated models (pods are read as plain dicts, so a 100,000-pod list
is parsed page by page) and any discovery round-trips.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import importlib.util
import ipaddress
import json
import os
import shutil
import ssl
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote, urlencode, urlsplit

from ._text import redact_urls

# The kubernetes library is imported only for what its loaders alone can read (exec and
# auth-provider plugins, the in-cluster service account): importing it costs about 0.3 s of CPU, and
# every Kubernetes task of a rollout is a new Python process (bench/lab_overhead.py).
try:
    HAS_KUBERNETES = importlib.util.find_spec('kubernetes') is not None
except (ImportError, ValueError):  # pragma: no cover
    HAS_KUBERNETES = False

try:
    import urllib3
    from urllib3._collections import HTTPHeaderDict  # 1.26 and 2.x; 2.x sends one line per added value
    HAS_URLLIB3 = True
except ImportError:  # pragma: no cover
    HAS_URLLIB3 = False

DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_PAGE_SIZE = 500

AUTH_ARG_SPEC: Dict[str, Dict[str, Any]] = {
    # Secret: an inline kubeconfig holds tokens, passwords and keys (a path is masked the same way).
    'kubeconfig': {'type': 'raw', 'no_log': True},
    'context': {'type': 'str'},
    'host': {'type': 'str'},
    'api_key': {'type': 'str', 'no_log': True},
    'username': {'type': 'str'},
    'password': {'type': 'str', 'no_log': True},
    'validate_certs': {'type': 'bool', 'aliases': ['verify_ssl']},
    'ca_cert': {'type': 'path', 'aliases': ['ssl_ca_cert']},
    'client_cert': {'type': 'path', 'aliases': ['cert_file']},
    'client_key': {'type': 'path', 'aliases': ['key_file'], 'no_log': False},
    # Without userinfo (refused: the options are in the task result's invocation); the proxy's credentials go in
    # proxy_headers.proxy_basic_auth, which is no_log (kubernetes.core's name).
    'proxy': {'type': 'str'},
    'proxy_headers': {'type': 'dict', 'options': {'proxy_basic_auth': {'type': 'str', 'no_log': True}}},
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
# 429 outside an eviction: the API server shed the request unprocessed (priority and fairness, or
# the storage of a CRD just (re)created still initializing). Safe to retry for a read and for a
# patch guarded by its resourceVersion; an eviction's 429 (a PodDisruptionBudget) is not this.
RETRYABLE_READ_STATUS = RETRYABLE_STATUS + (429,)


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


@dataclasses.dataclass
class ApiConnection:
    """Where and how to reach the API server: what K8sClient needs, and nothing generated.

    `host` (scheme://host:port), `pool` (a urllib3 PoolManager or ProxyManager with the TLS
    settings), `headers` (Authorization, Impersonate-User), `impersonate_groups` (one header line
    each), `verify_ssl`, and `loader` (how the configuration was read: V(kubeconfig), V(options) or
    V(kubernetes) for the client library's loaders).
    """

    host: str
    pool: Any
    headers: Dict[str, str] = dataclasses.field(repr=False)  # Authorization: never in a repr
    impersonate_groups: List[str]
    verify_ssl: bool
    loader: str


@dataclasses.dataclass
class _Settings:
    """What a kubeconfig (or the kubernetes library's loader) and the options say, before the pool exists."""

    host: Optional[str] = None
    verify_ssl: bool = True
    ca_file: Optional[str] = None
    ca_data: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    cert_data: Optional[bytes] = None
    key_data: Optional[bytes] = dataclasses.field(default=None, repr=False)
    tls_server_name: Optional[str] = None
    proxy: Optional[str] = None
    proxy_basic_auth: Optional[str] = dataclasses.field(default=None, repr=False)  # user:password
    authorization: Optional[str] = dataclasses.field(default=None, repr=False)


# What the built-in kubeconfig reader understands. A user entry with anything else (an exec or
# auth-provider plugin, ...) is read by the kubernetes library's own loader instead.
_SIMPLE_USER_KEYS = frozenset(('token', 'tokenFile', 'client-certificate', 'client-certificate-data', 'client-key',
                               'client-key-data', 'username', 'password'))
_CLUSTER_KEYS = frozenset(('server', 'certificate-authority', 'certificate-authority-data',
                           'insecure-skip-tls-verify', 'tls-server-name', 'proxy-url', 'extensions',
                           'disable-compression'))


def _named(entries: Any, name: str, what: str) -> Dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get('name') == name:
            return entry.get(what) or {}
    raise ValueError('no %s named %r' % (what, name))


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError('%s is not base64: %s' % (what, exc)) from exc


def _read_kubeconfig(config: Dict[str, Any], context: Optional[str], base: str) -> Optional[_Settings]:
    """The settings of a kubeconfig's context, or None when the kubernetes library must read it."""
    if not isinstance(config, dict):
        raise ValueError('not a kubeconfig mapping')
    name = context or config.get('current-context')
    if not name:
        raise ValueError('no context given and no current-context')
    ctx = _named(config.get('contexts'), name, 'context')
    cluster = _named(config.get('clusters'), ctx.get('cluster'), 'cluster')
    user = _named(config.get('users'), ctx['user'], 'user') if ctx.get('user') else {}
    # Only a YAML boolean turns verification off (kubectl refuses anything else): the string "false" is
    # truthy, and the kubernetes library's loader would take it as true too.
    skip = cluster.get('insecure-skip-tls-verify')
    if skip is not None and not isinstance(skip, bool):
        raise ValueError('cluster %r: insecure-skip-tls-verify: %r is not a boolean (write true or false, unquoted)'
                         % (ctx.get('cluster'), skip))
    if set(user) - _SIMPLE_USER_KEYS or set(cluster) - _CLUSTER_KEYS:
        return None

    def path(value: str) -> str:
        return os.path.normpath(os.path.join(base, os.path.expanduser(str(value))))

    s = _Settings()
    s.host = cluster.get('server')
    if not s.host:
        raise ValueError('cluster %r has no server' % ctx.get('cluster'))
    if skip is True:
        s.verify_ssl = False
    if cluster.get('certificate-authority-data'):
        s.ca_data = _b64(cluster['certificate-authority-data'], 'certificate-authority-data').decode('ascii')
    elif cluster.get('certificate-authority'):
        s.ca_file = path(cluster['certificate-authority'])
    s.tls_server_name = cluster.get('tls-server-name')
    s.proxy = cluster.get('proxy-url')
    if user.get('client-certificate-data'):
        s.cert_data = _b64(user['client-certificate-data'], 'client-certificate-data')
    elif user.get('client-certificate'):
        s.cert_file = path(user['client-certificate'])
    if user.get('client-key-data'):
        s.key_data = _b64(user['client-key-data'], 'client-key-data')
    elif user.get('client-key'):
        s.key_file = path(user['client-key'])
    if user.get('token'):
        s.authorization = 'Bearer %s' % user['token']
    elif user.get('tokenFile'):
        with open(path(user['tokenFile']), encoding='utf-8') as f:
            s.authorization = 'Bearer %s' % f.read().strip()
    elif user.get('username') and user.get('password'):
        s.authorization = _basic(user['username'], user['password'])
    return s


def _basic(username: str, password: str) -> str:
    return 'Basic ' + base64.b64encode(('%s:%s' % (username, password)).encode('utf-8')).decode('ascii')


def _load_yaml(path: str) -> Any:
    # Only when a kubeconfig file is read.
    import yaml  # pylint: disable=import-outside-toplevel
    loader = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)
    with open(path, encoding='utf-8') as f:
        return yaml.load(f, Loader=loader)  # nosec - a safe loader


def _from_library(kubeconfig: Any, path: Optional[str], context: Optional[str]) -> _Settings:
    """The kubernetes library's loaders: exec and auth-provider plugins, in-cluster service accounts."""
    if not HAS_KUBERNETES:
        raise K8sError('the kubernetes Python library is required to read this configuration (an exec or '
                       'auth-provider plugin, or the in-cluster service account)')
    # pylint: disable-next=import-outside-toplevel
    from kubernetes import client as k8s_client, config as k8s_config
    cfg = k8s_client.Configuration()
    if isinstance(kubeconfig, dict):
        k8s_config.load_kube_config_from_dict(kubeconfig, context=context, client_configuration=cfg,
                                              persist_config=False)
    elif path:
        k8s_config.load_kube_config(config_file=path, context=context, client_configuration=cfg,
                                    persist_config=False)
    else:
        k8s_config.load_incluster_config(client_configuration=cfg)
    s = _Settings()
    s.host = cfg.host
    s.verify_ssl = bool(cfg.verify_ssl)
    s.ca_file, s.cert_file, s.key_file = cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file
    s.ca_data = getattr(cfg, 'ca_cert_data', None)
    s.tls_server_name = getattr(cfg, 'tls_server_name', None)
    s.proxy = cfg.proxy
    for auth in cfg.auth_settings().values():
        if auth.get('in') == 'header' and auth.get('key', '').lower() == 'authorization' and auth.get('value'):
            s.authorization = auth['value']
    return s


def kubeconfig_paths(kubeconfig: Any = None) -> List[str]:
    """The kubeconfig files to read, in order: the explicit option's (a path, or several joined by
    os.pathsep as in KUBECONFIG), else KUBECONFIG's entries (empty ones skipped), else ~/.kube/config."""
    value = str(kubeconfig) if kubeconfig else os.environ.get('KUBECONFIG', '')
    paths = [os.path.expanduser(p) for p in value.split(os.pathsep) if p.strip()]
    return paths or [os.path.expanduser('~/.kube/config')]


# Fields that name a file, resolved against the directory of the kubeconfig that set them (kubectl).
_FILE_FIELDS = {'cluster': ('certificate-authority',), 'user': ('client-certificate', 'client-key', 'tokenFile')}


def _resolve_files(entry: Dict[str, Any], inner: str, base: str) -> None:
    body = entry.get(inner)
    if not isinstance(body, dict):
        return
    for field in _FILE_FIELDS.get(inner, ()):
        value = body.get(field)
        if isinstance(value, str) and value:
            body[field] = os.path.normpath(os.path.join(base, os.path.expanduser(value)))
    plugin = body.get('exec')
    if inner == 'user' and isinstance(plugin, dict):
        command = plugin.get('command')
        # kubectl: a command with a path separator is relative to its kubeconfig; a bare name is looked up in PATH.
        if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
            plugin['command'] = os.path.normpath(os.path.join(base, command))


def merge_kubeconfigs(paths: List[str]) -> Dict[str, Any]:
    """Several kubeconfig files merged as kubectl merges KUBECONFIG's: the first file to name a
    cluster, user or context wins it, the first current-context wins, and each file's relative file
    references are resolved against its own directory. Raises ValueError naming the file."""
    merged: Dict[str, Any] = {'apiVersion': 'v1', 'kind': 'Config', 'clusters': [], 'users': [], 'contexts': []}
    for path in paths:
        config = _load_yaml(path)
        if config is None:  # an empty file adds nothing
            continue
        if not isinstance(config, dict):
            raise ValueError('%s: not a kubeconfig mapping' % path)
        base = os.path.dirname(os.path.abspath(path))
        if not merged.get('current-context') and config.get('current-context'):
            merged['current-context'] = config['current-context']
        for section, inner in (('clusters', 'cluster'), ('users', 'user'), ('contexts', 'context')):
            entries = config.get(section) or []
            if not isinstance(entries, list):
                raise ValueError('%s: %s is not a list' % (path, section))
            taken = {e['name'] for e in merged[section]}
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get('name'), str) or not entry['name']:
                    raise ValueError('%s: an entry of %s has no name' % (path, section))
                if entry['name'] in taken:
                    continue
                entry = copy.deepcopy(entry)
                _resolve_files(entry, inner, base)
                merged[section].append(entry)
                taken.add(entry['name'])
    return merged


def get_api_client(params: Dict[str, Any]) -> ApiConnection:
    """The connection the auth options describe.

    Order as kubernetes.core: an explicit `kubeconfig` (path or dict) or, without `host`, the
    default kubeconfig (KUBECONFIG's files, merged as kubectl merges them, or ~/.kube/config),
    else the in-cluster service account;
    explicit options override what the kubeconfig says. A kubeconfig with a token, a token file,
    client certificates or basic auth is read here; one with an exec or auth-provider plugin, and
    the in-cluster configuration, by the kubernetes library. Raises K8sError with a clear message.
    """
    if not HAS_URLLIB3:
        raise K8sError('the urllib3 Python library is required (a dependency of the kubernetes library)')
    kubeconfig = _param(params, 'kubeconfig')
    context = _param(params, 'context')
    host = _param(params, 'host')
    s: Optional[_Settings] = None
    loader = 'options'
    try:
        if isinstance(kubeconfig, dict):
            s, loader = _read_kubeconfig(kubeconfig, context, ''), 'kubeconfig'
            if s is None:
                s, loader = _from_library(kubeconfig, None, context), 'kubernetes'
        elif kubeconfig or not host:
            paths = kubeconfig_paths(kubeconfig)
            if kubeconfig:
                missing = [p for p in paths if not os.path.exists(p)]
                if missing:
                    raise K8sError('kubeconfig %r does not exist' % (str(kubeconfig) if len(paths) == 1 else missing[0]))
            # KUBECONFIG as kubectl reads it: files that do not exist are skipped, the rest merged.
            present = [p for p in paths if os.path.exists(p)]
            if len(present) == 1:
                path = present[0]
                s, loader = _read_kubeconfig(_load_yaml(path), context, os.path.dirname(os.path.abspath(path))), \
                    'kubeconfig'
                if s is None:
                    s, loader = _from_library(None, path, context), 'kubernetes'
            elif present:
                merged = merge_kubeconfigs(present)
                s, loader = _read_kubeconfig(merged, context, ''), 'kubeconfig'
                if s is None:
                    s, loader = _from_library(merged, None, context), 'kubernetes'
            else:
                try:
                    s, loader = _from_library(None, None, context), 'kubernetes'
                except K8sError:
                    raise
                except Exception as exc:  # ConfigException: not in a cluster
                    raise K8sError('no kubeconfig found (%s) and not running in a cluster: set kubeconfig or host'
                                   % os.pathsep.join(paths)) from exc
    except K8sError:
        raise
    except Exception as exc:  # yaml errors, bad context name, unreadable files, the library's ConfigException
        raise K8sError('cannot load the Kubernetes configuration (kubeconfig=%r, context=%r): %s'
                       % (kubeconfig if not isinstance(kubeconfig, dict) else '<dict>', context,
                          redact_urls(exc))) from exc
    if s is None:
        s = _Settings()
    _apply_options(s, params, host)
    if not s.host:
        raise K8sError('no Kubernetes API host: set host or a kubeconfig with a server')
    s.proxy = _effective_proxy(str(s.host), s.proxy)
    headers = {}
    if s.authorization:
        headers['Authorization'] = s.authorization
    if params.get('impersonate_user'):
        headers['Impersonate-User'] = params['impersonate_user']
    # The API server reads one group per Impersonate-Group header line and does not split on
    # commas: K8sClient sends one line per group.
    groups = [str(g) for g in params.get('impersonate_groups') or []]
    return ApiConnection(str(s.host).rstrip('/'), _pool(s), headers, groups, s.verify_ssl, loader)


def _apply_options(s: _Settings, params: Dict[str, Any], host: Optional[str]) -> None:
    """Explicit options (and their K8S_AUTH_* environment variables) over what the kubeconfig says."""
    if host:
        s.host = str(host)
    api_key = _param(params, 'api_key')
    username = _param(params, 'username')
    password = _param(params, 'password')
    if api_key:
        s.authorization = 'Bearer ' + api_key
    elif username and password:
        s.authorization = _basic(username, password)
    verify = params.get('validate_certs')
    if verify is None and os.environ.get('K8S_AUTH_VERIFY_SSL'):
        verify = _env_bool('K8S_AUTH_VERIFY_SSL')
    if verify is not None:
        if not isinstance(verify, bool):     # the module's bool type converts; anything else is a bug or a typo
            raise K8sError('validate_certs: %r is not a boolean' % (verify,))
        s.verify_ssl = verify
    for opt in ('ca_cert', 'client_cert', 'client_key'):
        value = _param(params, opt)
        if value:
            if not os.path.exists(str(value)):
                raise K8sError('%s %r does not exist' % (opt, value))
            if opt == 'ca_cert':
                s.ca_file, s.ca_data = str(value), None
            elif opt == 'client_cert':
                s.cert_file, s.cert_data = str(value), None
            else:
                s.key_file, s.key_data = str(value), None
    if params.get('proxy') and _has_userinfo(str(params['proxy'])):
        raise K8sError('proxy: %r has credentials in it; give them as proxy_headers.proxy_basic_auth (user:password), '
                       'which is never logged' % redact_urls(params['proxy']))
    proxy = _param(params, 'proxy')
    if proxy:
        s.proxy = proxy
    auth = (params.get('proxy_headers') or {}).get('proxy_basic_auth')
    if auth:
        if ':' not in str(auth):
            raise K8sError('proxy_headers.proxy_basic_auth: give it as user:password')
        s.proxy_basic_auth = str(auth)


def _has_userinfo(url: str) -> bool:
    """Whether `url` has a userinfo (user, or user:password) before its host."""
    return redact_urls(url) != url


def _env(name: str) -> Optional[str]:
    """A proxy variable as urllib reads it: the lower-case name first, then the upper-case one."""
    return os.environ.get(name) or os.environ.get(name.upper()) or None


def _effective_proxy(host: str, proxy: Optional[str]) -> Optional[str]:
    """The proxy for `host`, as kubectl and the kubernetes library choose it: the configured one
    (option, K8S_AUTH_PROXY, the kubeconfig's proxy-url), else https_proxy/http_proxy by the host's
    scheme, else all_proxy; none when no_proxy matches the host."""
    if not proxy:
        proxy = _env(urlsplit(host).scheme + '_proxy') or _env('all_proxy')
    if proxy and _bypasses(host, _env('no_proxy') or ''):
        return None
    return proxy


def _bypasses(host: str, no_proxy: str) -> bool:
    """no_proxy matches `host`: `*`, an IP address or network (CIDR), a domain and its subdomains
    (a leading dot is optional), or host:port."""
    url = urlsplit(host)
    name = (url.hostname or '').lower()
    if not name:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    netloc = url.netloc.lower().rsplit('@', 1)[-1]
    for entry in (e.strip().lower() for e in no_proxy.split(',')):
        if not entry:
            continue
        if entry == '*':
            return True
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
        entry = entry.lstrip('.')
        if entry in (name, netloc) or name.endswith('.' + entry) or netloc.endswith('.' + entry):
            return True
    return False


def _pool(s: _Settings) -> Any:
    """A urllib3 pool manager with the TLS settings (client certificate data never stays on disk)."""
    kw: Dict[str, Any] = {'cert_reqs': ssl.CERT_REQUIRED if s.verify_ssl else ssl.CERT_NONE, 'retries': False,
                          # Kept connections per host, as the kubernetes library sizes them (node_drain
                          # evicts from up to `parallel` threads at once).
                          'maxsize': max(10, (os.cpu_count() or 1) * 5)}
    if s.ca_file:
        kw['ca_certs'] = s.ca_file
    if s.ca_data:
        kw['ca_cert_data'] = s.ca_data
    if s.tls_server_name:
        kw['server_hostname'] = s.tls_server_name
    if s.cert_data or s.key_data:
        kw['ssl_context'] = _context_with_client_cert(s)
    elif s.cert_file:
        kw['cert_file'] = s.cert_file
        kw['key_file'] = s.key_file
    if s.proxy:
        try:
            if s.proxy.startswith('socks'):
                from urllib3.contrib.socks import SOCKSProxyManager  # pylint: disable=import-outside-toplevel
                if s.proxy_basic_auth:
                    kw['username'], kw['password'] = s.proxy_basic_auth.split(':', 1)
                return SOCKSProxyManager(s.proxy, **kw)
            if s.proxy_basic_auth:
                kw['proxy_headers'] = urllib3.make_headers(proxy_basic_auth=s.proxy_basic_auth)
            return urllib3.ProxyManager(s.proxy, **kw)
        except (ImportError, ValueError) as exc:
            raise K8sError('proxy %r cannot be used: %s' % (redact_urls(s.proxy), redact_urls(exc))) from exc
    return urllib3.PoolManager(**kw)


def _context_with_client_cert(s: _Settings) -> Any:
    """An SSL context holding the client certificate and key; the data is written to a private
    temporary directory only for as long as OpenSSL takes to read it."""
    if not (s.cert_data or s.cert_file) or not (s.key_data or s.key_file):
        raise K8sError('a client certificate needs both the certificate and its key')
    ctx = urllib3.util.ssl_.create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED if s.verify_ssl else ssl.CERT_NONE)
    if s.verify_ssl and not (s.ca_file or s.ca_data):
        ctx.load_default_certs()
    tmp = tempfile.mkdtemp(prefix='gpufleet-k8s-')
    try:
        def place(data: Optional[bytes], path: Optional[str], name: str) -> Optional[str]:
            if data is None:
                return path
            target = os.path.join(tmp, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, 'wb') as f:
                f.write(data)
            return target
        certfile = place(s.cert_data, s.cert_file, 'cert.pem')
        keyfile = place(s.key_data, s.key_file, 'key.pem')
        try:
            ctx.load_cert_chain(certfile, keyfile)
        except (ssl.SSLError, OSError) as exc:
            raise K8sError('cannot load the client certificate and key: %s' % exc) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ctx


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

    def __init__(self, api: ApiConnection, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 get_attempts: int = 4, backoff: float = 0.5, update_attempts: int = 5,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        if request_timeout is None or request_timeout <= 0:
            raise K8sError('request_timeout must be a positive number of seconds, got %r' % (request_timeout,))
        self.api = api
        self.pool = api.pool
        self.request_timeout = float(request_timeout)
        self.get_attempts = max(1, get_attempts)
        self.backoff = backoff
        self.update_attempts = max(1, update_attempts)
        self.sleep = sleep
        self.clock = clock
        # A `clock()` value no request or retry may pass (None: none): see bounded().
        self.deadline: Optional[float] = None
        self.requests_made = 0
        self.retries_made = 0
        # How to read the credentials again after a 401 (None: not done): exec, OIDC and token-file
        # tokens rotate during a long wait. See request().
        self.reload: Optional[Callable[[], ApiConnection]] = None
        self.reloads_made = 0

    @classmethod
    def from_params(cls, params: Dict[str, Any], **kwargs: Any) -> 'K8sClient':
        client = cls(get_api_client(params), request_timeout=params.get('request_timeout') or DEFAULT_REQUEST_TIMEOUT,
                     **kwargs)
        client.reload = lambda: get_api_client(params)
        return client

    @contextlib.contextmanager
    def bounded(self, deadline: Optional[float]) -> Iterator[None]:
        """Within the block no request waits past `deadline` (a `clock()` value): each request's
        timeout is cut to the time left, a retry that would start after it is not made, and a
        request once it has passed is not sent (K8sError, reason V(deadline))."""
        previous = self.deadline
        self.deadline = deadline if previous is None or deadline is None else min(previous, deadline)
        try:
            yield
        finally:
            self.deadline = previous

    def _timeout(self, desc: str, method: str, path: str) -> float:
        if self.deadline is None:
            return self.request_timeout
        left = self.deadline - self.clock()
        if left <= 0:
            raise K8sError('%s: not sent, the deadline has passed' % desc, status=None, method=method, path=path,
                           reason='deadline')
        return min(self.request_timeout, left)

    # -- one request ------------------------------------------------------------------------
    def _headers(self, content_type: Optional[str]) -> Any:
        headers = HTTPHeaderDict({'Accept': 'application/json', 'User-Agent': 'gpufleet.upgrade'})
        headers.update(self.api.headers)
        if content_type:
            headers['Content-Type'] = content_type
        for group in self.api.impersonate_groups:
            headers.add('Impersonate-Group', group)
        return headers

    def request(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Any = None,
                content_type: Optional[str] = None, text: bool = False) -> Any:
        """One request, no retry. Returns the decoded JSON body (or None), or with `text` the body as
        text (a pod's log); raises K8sError.

        Answered 401 (the token expired: exec, OIDC and token-file credentials rotate while a long
        wait runs), the credentials are read again from the same options and the request is sent
        once more; a second 401 is the error. A write answered 401 was not applied (authentication
        comes first), so sending it again is safe."""
        try:
            return self._send(method, path, query, body, content_type, text)
        except K8sError as exc:
            if exc.status != 401 or self.reload is None:
                raise
            try:
                api = self.reload()
            except K8sError as again:
                raise K8sError('%s; reading the credentials again failed: %s' % (exc.msg, again.msg), status=401,
                               method=method, path=path, reason=exc.reason) from again
            self.api, self.pool = api, api.pool
            self.reloads_made += 1
            return self._send(method, path, query, body, content_type, text)

    def _send(self, method: str, path: str, query: Optional[Dict[str, Any]], body: Any,
              content_type: Optional[str], text: bool) -> Any:
        url = self.api.host + path
        if query:
            url += '?' + urlencode([(k, v) for k, v in query.items() if v is not None])
        data = None
        if body is not None:
            data = json.dumps(body).encode('utf-8')
            content_type = content_type or 'application/json'
        desc = '%s %s' % (method, path)
        timeout = self._timeout(desc, method, path)
        self.requests_made += 1
        headers = self._headers(content_type)
        if text:
            headers['Accept'] = 'text/plain, */*'
        try:
            resp = self.pool.request(method, url, body=data, headers=headers,
                                     timeout=urllib3.Timeout(total=timeout), retries=False,
                                     preload_content=True)
        except urllib3.exceptions.NewConnectionError as exc:
            raise K8sError('%s: cannot reach the Kubernetes API at %s: %s'
                           % (desc, redact_urls(self.api.host), redact_urls(exc)),
                           status=None, method=method, path=path, reason='connection') from exc
        except urllib3.exceptions.TimeoutError as exc:
            msg = '%s: no answer within the request timeout of %gs' % (desc, timeout)
            if timeout < self.request_timeout:
                msg += ' (the time left before the deadline)'
            if method != 'GET':
                msg += ('; the change may or may not have been applied (a write is not re-sent blindly): rerun the '
                        'task, it resumes from what is on the server')
            raise K8sError(msg, status=None, method=method, path=path, reason='timeout') from exc
        except urllib3.exceptions.HTTPError as exc:
            raise K8sError('%s: cannot reach the Kubernetes API at %s: %s'
                           % (desc, redact_urls(self.api.host), redact_urls(exc)),
                           status=None, method=method, path=path, reason='connection') from exc
        if resp.status >= 400:
            msg = _status_message(resp.data)
            raise _error_for(resp.status)('%s: HTTP %d%s' % (desc, resp.status, (' ' + msg) if msg else ''),
                                          status=resp.status, method=method, path=path, reason=msg)
        if text:
            return resp.data.decode('utf-8', 'replace')
        if not resp.data:
            return None
        try:
            return json.loads(resp.data)
        except ValueError as exc:
            raise K8sError('%s: the answer is not JSON' % desc, status=resp.status, method=method,
                           path=path) from exc

    # -- reads: retried ---------------------------------------------------------------------
    def get(self, path: str, query: Optional[Dict[str, Any]] = None) -> Any:
        """GET with bounded retries on 429, 5xx, timeouts and connection errors (safe: reads)."""
        last: Optional[K8sError] = None
        attempts = 0
        for attempt in range(self.get_attempts):
            if attempt:
                pause = min(self.backoff * (2 ** (attempt - 1)), 5.0)
                if self.deadline is not None and self.clock() + pause >= self.deadline:
                    break
                self.retries_made += 1
                self.sleep(pause)
            try:
                attempts += 1
                return self.request('GET', path, query)
            except K8sError as exc:
                if exc.reason == 'deadline':
                    if last is None:
                        raise
                    break
                if exc.status in RETRYABLE_READ_STATUS or exc.status is None:
                    last = exc
                    continue
                raise
        if last is None:  # pragma: no cover - the loop runs at least once
            raise K8sError('GET %s: no attempt made' % path)
        why = ('gave up after %d attempts' % attempts if attempts == self.get_attempts
               else 'gave up after %d attempt(s): the deadline left no time for another' % attempts)
        raise K8sError('%s (%s)' % (last.msg, why), status=last.status, method='GET', path=path, reason=last.reason)

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
    def patch(self, path: str, body: Dict[str, Any], patch_type: str = 'merge',
              field_manager: Optional[str] = None) -> Any:
        """`field_manager`: the manager the API server records for the fields this patch sets
        (metadata.managedFields); without it, a name it derives from the User-Agent."""
        ctype = {'merge': 'application/merge-patch+json', 'strategic': 'application/strategic-merge-patch+json',
                 'json': 'application/json-patch+json'}[patch_type]
        query = {'fieldManager': field_manager} if field_manager else None
        return self.request('PATCH', path, query=query, body=body, content_type=ctype)

    def post(self, path: str, body: Dict[str, Any]) -> Any:
        return self.request('POST', path, body=body)

    def delete(self, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        return self.request('DELETE', path, body=body)

    def update(self, path: str, compute: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]],
               current: Optional[Dict[str, Any]] = None,
               field_manager: Optional[str] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Read, compute a merge patch from what was read, apply it with the read resourceVersion
        (as `field_manager`, see patch()).

        `compute(obj)` returns the patch, or None when nothing needs to change. On 409 the object
        is re-read and the patch re-computed (at most `update_attempts` times): safe, because the
        patch is derived from the fresh state and guarded by its resourceVersion. The same holds for
        429/500/502/503/504, a timeout or a lost connection (the write may or may not have been
        applied: the fresh read tells). Any other write error is raised at once. `current`, a recent read of the object, saves the first GET (a
        stale one only costs a 409 and a re-read). Returns (object before, object after).
        """
        last: Optional[K8sError] = None
        first: Optional[Dict[str, Any]] = None
        ambiguous = False   # a failed attempt may have been applied (5xx, timeout)
        for attempt in range(self.update_attempts):
            if attempt:
                self.retries_made += 1
                self.sleep(min(self.backoff * attempt, 2.0))
            obj = current if (current is not None and not attempt) else self.get(path)
            if first is None:
                first = obj
            patch = compute(copy.deepcopy(obj))
            if not patch:
                return (first if ambiguous else obj), obj
            patch = copy.deepcopy(patch)
            patch.setdefault('metadata', {})['resourceVersion'] = (obj.get('metadata') or {}).get('resourceVersion')
            try:
                after = self.patch(path, patch, field_manager=field_manager)
            except ConflictError as exc:
                last = exc
                continue
            except K8sError as exc:
                # Safe to send again: the patch is re-computed from a fresh read and guarded by its
                # resourceVersion, so one that was applied after all is seen and not repeated.
                if exc.reason != 'deadline' and (exc.status in RETRYABLE_READ_STATUS or exc.status is None):
                    last = exc
                    ambiguous = True
                    continue
                raise
            return (first if ambiguous else obj), after
        if last is None:  # pragma: no cover
            raise K8sError('PATCH %s: no attempt made' % path)
        if not isinstance(last, ConflictError):
            raise K8sError('%s (gave up after %d attempts, each computed from a fresh read)'
                           % (last.msg, self.update_attempts), status=last.status, method='PATCH', path=path,
                           reason=last.reason)
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
