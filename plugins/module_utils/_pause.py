# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Pause points of a rollout (issue 16): the reviewed plan names the batches that wait for an approval.

The plan's ``pauses`` (from ``upgrade_plan``'s ``pause_before``) lists batch numbers as the plan's summary
numbers them (1 = the first batch). Before such a batch starts, the rollout waits (bounded) for its
approval: the ConfigMap ``<namespace>/gpufleet-approve-<first 12 hex of the plan digest>-batch-<k>``
(default namespace ``gpufleet-approvals``: not the stop switch's ``gpufleet-system``, because RBAC cannot
limit ``create`` by name, and who may stop a rollout must not approve one). The approval is bound to the plan
by its digest: an approval given for another plan (re-planned, edited) is another name and approves
nothing here. Its ``data.by`` (optional) says who approved; the API server's audit log has the
authenticated identity. An operator approves with

    kubectl -n gpufleet-approvals create configmap gpufleet-approve-<digest12>-batch-<k> --from-literal=by=<name>

and may keep the approvals for the record (nothing deletes them). In AWX, an approval node before the
rollout job's relaunch does the same through a job template that creates it.

Pure: `approval_name`, `check_pauses` and `judge`; `wait_for_approval` polls through a client.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ._duration import seconds_of
from ._poll import poll
from ._stop_switch import judge as stop_judge
from ._stop_switch import path as stop_path
from ._text import check_namespace, folded

DEFAULT_NAMESPACE = 'gpufleet-approvals'
PREFIX = 'gpufleet-approve'
_DIGEST = re.compile(r'^sha256:([0-9a-f]{64})$')


class PauseError(ValueError):
    """Bad input (the message names the field and the value)."""


class Verdict(NamedTuple):
    approved: bool
    namespace: str
    name: str
    batch: int
    approved_by: str
    approved_at: str
    msg: str

    def as_dict(self) -> Dict[str, Any]:
        return self._asdict()


def _batch(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PauseError('%s: %r is not a batch number (a whole number from 1, as the plan numbers its batches)'
                         % (field, value))
    return value


def check_pauses(value: Any, batches: Optional[int] = None, field: str = 'pause_before') -> List[int]:
    """The sorted batch numbers of ``value`` (a list of whole numbers >= 1, no repeats); with ``batches``
    (how many the plan has), each must name one of them. PauseError naming the field and the value."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise PauseError('%s: %r is not a list of batch numbers' % (field, value))
    out: List[int] = []
    for i, item in enumerate(value):
        number = _batch(item, '%s[%d]' % (field, i))
        if number in out:
            raise PauseError('%s[%d]: batch %d is listed twice' % (field, i, number))
        if batches is not None and number > batches:
            raise PauseError('%s[%d]: batch %d does not exist: the plan has %d batch(es)' % (field, i, number, batches))
        out.append(number)
    return sorted(out)


def approval_name(plan_digest: Any, batch: Any) -> str:
    """The approval ConfigMap's name for batch ``batch`` of the plan whose digest is ``plan_digest``."""
    match = _DIGEST.match(plan_digest) if isinstance(plan_digest, str) else None
    if not match:
        raise PauseError('plan_digest: %r is not a plan digest (sha256:<64 hex>, the plan file\'s "digest")'
                         % (plan_digest,))
    return '%s-%s-batch-%d' % (PREFIX, match.group(1)[:12], _batch(batch, 'batch'))


def path(namespace: str, name: str) -> str:
    return '/api/v1/namespaces/%s/configmaps/%s' % (check_namespace(namespace, PauseError), name)


def judge(configmap: Optional[Dict[str, Any]], namespace: str, name: str, batch: int) -> Verdict:
    """Whether batch ``batch`` is approved: the approval ConfigMap exists (None: the API answered 404)."""
    where = '%s/%s' % (namespace, name)
    if configmap is None:
        return Verdict(False, namespace, name, batch, '', '',
                       'batch %d waits for its approval: create the ConfigMap %s (kubectl -n %s create configmap '
                       '%s --from-literal=by=<who>)' % (batch, where, namespace, name))
    if not isinstance(configmap, dict):
        raise PauseError('ConfigMap %s: the API returned %s, not an object' % (where, type(configmap).__name__))
    data = configmap.get('data') if isinstance(configmap.get('data'), dict) else {}
    meta = configmap.get('metadata') if isinstance(configmap.get('metadata'), dict) else {}
    by = folded(data, 'by')
    at = meta.get('creationTimestamp') if isinstance(meta.get('creationTimestamp'), str) else ''
    return Verdict(True, namespace, name, batch, by, at,
                   'batch %d approved (ConfigMap %s%s%s)' % (batch, where, ', by %s' % by if by else '',
                                                             ', at %s' % at if at else ''))


def timeout_seconds(value: Any, field: str = 'wait_timeout') -> float:
    """Seconds of ``value``: a number >= 0, or a duration (V(90s), V(1h), V(1h30m)); PauseError naming the field."""
    if isinstance(value, str):
        try:
            number: Any = float(value)
        except ValueError:
            number = seconds_of(value.strip())
    else:
        number = value
    if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0 or math.isnan(number):
        raise PauseError('%s: %r is not a number of seconds >= 0 or a duration (e.g. 30m, 4h)' % (field, value))
    return float(number)


def check_apart(namespace: Any, stop_namespace: Any) -> None:
    """PauseError when the approvals' namespace is the stop switch's: whoever may create the stop switch there
    (the Role gpufleet-upgrade-stop creates ConfigMaps) could then approve a batch (T3-20 of the 2026-12-06
    review). An empty `stop_namespace` checks nothing (no stop switch is read)."""
    check_namespace(namespace, PauseError)
    if stop_namespace in (None, ''):
        return
    if check_namespace(stop_namespace, PauseError, 'stop_namespace') == namespace:
        raise PauseError('namespace: %r is the stop switch\'s namespace (stop_namespace): whoever may set the stop '
                         'switch could approve a batch there; keep the approvals in a namespace of their own '
                         '(default %s)' % (namespace, DEFAULT_NAMESPACE))


def wait_for_approval(get: Callable[[str], Optional[Dict[str, Any]]], namespace: str, plan_digest: str, batch: int,
                      timeout: Any, interval: Any, clock: Any = None, sleep: Any = None,
                      stop_namespace: Any = None, stop_name: str = '', rollout_id: str = '',
                      stopped: Optional[List[Any]] = None) -> Tuple[Verdict, float]:
    """Read the approval until it exists or ``timeout`` (seconds, or a duration) passed (0: read once).
    ``get(path)`` returns the object or None (404). Returns (verdict, seconds waited); bounded by ``timeout``.
    An approvals namespace that is the stop switch's (``stop_namespace``) is refused before any read.

    With ``stop_name`` (and ``stop_namespace``), each round reads the stop switch too (after the approval): a switch
    that stops ``rollout_id`` ends the wait, not approved, its verdict (_stop_switch.Verdict) appended to
    ``stopped`` and its message the verdict's."""
    check_apart(namespace, stop_namespace)
    switch_path = ''
    if stop_name:
        if stop_namespace in (None, ''):
            raise PauseError('stop_name: %r needs stop_namespace (the stop switch\'s namespace)' % (stop_name,))
        switch_path = stop_path(stop_namespace, stop_name)
    name = approval_name(plan_digest, batch)
    where = path(namespace, name)
    timeout = timeout_seconds(timeout)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise PauseError('wait_interval: %r is not a number of seconds > 0' % (interval,))
    kwargs: Dict[str, Any] = {}
    if clock is not None:
        kwargs['clock'] = clock
    if sleep is not None:
        kwargs['sleep'] = sleep
    seen: List[Any] = []

    def look() -> Verdict:
        verdict = judge(get(where), namespace, name, batch)
        if switch_path and not verdict.approved:
            switch = stop_judge(get(switch_path), stop_namespace, stop_name, rollout_id)
            if switch.stopped:
                seen.append(switch)
                return verdict._replace(msg='%s (set while batch %d waited for its approval: the batch did not '
                                            'start)' % (switch.msg, batch))
        return verdict
    polled = poll(look, timeout, interval, done=lambda verdict: verdict.approved or bool(seen), **kwargs)
    verdict = polled.value
    if seen:
        if stopped is not None:
            stopped.append(seen[-1])
        return verdict, polled.elapsed
    if not verdict.approved and timeout > 0:
        verdict = verdict._replace(msg='%s; not approved within %gs (the pause timeout): the batch did not start, '
                                       'rerun the rollout once it is approved' % (verdict.msg, timeout))
    return verdict, polled.elapsed
