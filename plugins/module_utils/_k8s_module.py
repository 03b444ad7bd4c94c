# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""What every Kubernetes module of the collection shares.

- `K8sModule(name, argument_spec, ...)`: an `AnsibleModule` with the auth options of
  `gpufleet.upgrade.k8s_auth_options` merged in (their `no_log` marks kept: the whole
  `kubeconfig`, `api_key`, `password`) and check mode supported; `client` (a `K8sClient` built on
  first use), `update()` (write, or predict in check mode), `diff()` and `errors()` (expected errors
  become `fail_json` with a message that names the field or the object; only the unexpected keep a
  traceback).
- `k8s_argument_spec(options)`: the merged argument spec.
- check-mode prediction: `apply_merge_patch` (`_merge_patch`) over the current object, what a `PATCH`
  will leave.
- `diff(before, after, header)` and `failure(exc, ...)`: the diff dict and the message of an
  expected error, pure.

No library gate: an ordinary kubeconfig (token, token file, client certificates, basic auth) needs
only urllib3 and PyYAML (`_k8s`); the kubernetes library is imported, and a clear error raised
when it is missing, only for exec and auth-provider plugins and the in-cluster service account.
"""

from __future__ import annotations

import contextlib
import copy
import traceback
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import (
    K8sClient, K8sError, NotFoundError, auth_argument_spec)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._merge_patch import apply_merge_patch
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import url_userinfo

Obj = Dict[str, Any]
Compute = Callable[[Obj], Optional[Obj]]


def k8s_argument_spec(options: Mapping[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """The auth options (a deep copy) and the module's own `options`.

    A module option may not reuse an auth option's name: it would silently drop that option's
    `no_log` and its documentation (ValueError, a programming error)."""
    spec = auth_argument_spec()
    clash = sorted(set(spec) & set(options))
    if clash:
        raise ValueError('module options %s clash with the Kubernetes auth options' % ', '.join(clash))
    spec.update(copy.deepcopy(dict(options)))
    return spec


def diff(before: Any, after: Any, header: Optional[str] = None) -> Dict[str, Any]:
    """Ansible's diff dict; `header` (for example V(node/gpu-01)) names both sides."""
    out: Dict[str, Any] = {'before': before, 'after': after}
    if header:
        out['before_header'] = out['after_header'] = header
    return out


def failure(exc: BaseException, expected: Sequence[type] = (), context: str = '',
            prefixes: Optional[Mapping[type, str]] = None,
            not_found: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(message, extra result) for an expected error, None for an unexpected one (a bug).

    Expected: a `K8sError` (whose messages name the request) and the `expected` types (the module's
    domain errors, whose messages name the field and the value). A `NotFoundError` for a path in
    `not_found` gets that message as it is (for example V(node: 'gpu-404' does not exist)). Any
    other gets the first matching `prefixes` entry before it and V( (context)) after it. An error
    with a `problems` list adds it to the result."""
    if isinstance(exc, NotFoundError) and not_found and exc.path in not_found:
        return not_found[exc.path], {}
    if not isinstance(exc, (K8sError,) + tuple(expected)):
        return None
    prefix = next((p for kind, p in (prefixes or {}).items() if isinstance(exc, kind)), '')
    msg = '%s%s%s' % (prefix, exc, ' (%s)' % context if context else '')
    extra: Dict[str, Any] = {}
    problems = getattr(exc, 'problems', None)
    if isinstance(problems, list):
        extra['problems'] = list(problems)
    return msg, extra


def update_or_predict(client: K8sClient, path: str, compute: Compute, check_mode: bool) -> Tuple[Obj, Obj]:
    """(before, after) of `client.update(path, compute)`; in check mode nothing is written and the
    after is `compute`'s merge patch applied to a fresh read."""
    if not check_mode:
        return client.update(path, compute)
    before = client.get(path)
    return before, apply_merge_patch(before, compute(copy.deepcopy(before)))


class K8sModule(AnsibleModule):
    """An AnsibleModule for a Kubernetes module of the collection.

    `name` names the module in the message of an unexpected error; `argument_spec` holds the
    module's own options (the auth options are added); `count_requests` adds RV(api_requests) (the
    requests made so far) to the result of an expected error. Other keywords go to AnsibleModule;
    `supports_check_mode` defaults to true."""

    def __init__(self, name: str, argument_spec: Mapping[str, Dict[str, Any]], count_requests: bool = False,
                 **kwargs: Any) -> None:
        kwargs.setdefault('supports_check_mode', True)
        super().__init__(argument_spec=k8s_argument_spec(argument_spec), **kwargs)
        self.mask_url_credentials()
        self.module_name = name
        self.count_requests = count_requests
        self._client: Optional[K8sClient] = None

    def mask_url_credentials(self) -> None:
        """A credential in a URL option (refused for proxy, unused for host) is masked as a no_log value is, so
        that the invocation in the task result does not carry it (2026-12-06 review T3-10)."""
        for option in ('proxy', 'host'):
            secret = url_userinfo(self.params.get(option))
            if secret:
                self.no_log_values.add(secret)

    @property
    def client(self) -> K8sClient:
        """The Kubernetes client of the auth options, built on first use (K8sError when they do not
        describe a usable connection: use it inside `errors()`)."""
        if self._client is None:
            self._client = K8sClient.from_params(self.params)
        return self._client

    @property
    def api_requests(self) -> int:
        """The API requests made so far (0 before the client exists)."""
        return self._client.requests_made if self._client is not None else 0

    def update(self, path: str, compute: Compute) -> Tuple[Obj, Obj]:
        """(before, after) of a merge-patch update; predicted, without a write, in check mode."""
        return update_or_predict(self.client, path, compute, self.check_mode)

    def diff(self, before: Any, after: Any, header: Optional[str] = None) -> Dict[str, Any]:
        """{'diff': ...} in diff mode, else {} (to update a result with)."""
        return {'diff': diff(before, after, header)} if self._diff else {}

    def fail_from(self, exc: BaseException, expected: Sequence[type] = (), context: str = '',
                  prefixes: Optional[Mapping[type, str]] = None, not_found: Optional[Mapping[str, str]] = None,
                  **result: Any) -> None:
        """fail_json for `exc`: the message of `failure()` and `result` for an expected error, a
        message naming the module and the traceback (shown with -vvv) for any other."""
        known = failure(exc, expected, context, prefixes, not_found)
        if known is None:
            self.fail_json(msg='%s failed: %s' % (self.module_name, exc), exception=traceback.format_exc())
            return
        msg, extra = known
        if self.count_requests:
            extra['api_requests'] = self.api_requests
        extra.update(result)
        self.fail_json(msg=msg, **extra)

    @contextlib.contextmanager
    def errors(self, expected: Sequence[type] = (), context: str = '', prefixes: Optional[Mapping[type, str]] = None,
               not_found: Optional[Mapping[str, str]] = None, **result: Any) -> Iterator[None]:
        """Within the block an error fails the module as `fail_from()` says (`result`: more keys
        for an expected error's result). `fail_json` and `exit_json` called in the block pass."""
        try:
            yield
        except Exception as exc:  # the unexpected (a bug) keep their traceback for -vvv
            self.fail_from(exc, expected, context, prefixes, not_found, **result)
