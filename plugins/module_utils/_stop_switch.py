# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""The rollout's stop switch: a ConfigMap an operator creates to stop a rollout before its next node.

The switch is the ConfigMap ``<namespace>/<name>`` (default ``gpufleet-system/gpufleet-stop``). While
it exists the rollout starts no node and no batch (the rollout and canary playbooks read it before
each batch and before each node); a node already in progress finishes its upgrade, or fails and
stays cordoned, so nothing is left half-done. Deleting the ConfigMap lets a rerun resume.

Its ``data`` may say why and who (both optional, shown in the refusal):

- ``reason``: why the rollout is stopped;
- ``by``: who set it (the API server's audit log has the authenticated identity);
- ``rollout``: the id of the one rollout it stops (``gpufleet_rollout_id``); absent or empty, it
  stops every rollout that reads this switch. A ``rollout`` that is not the reader's id but close to it
  (the same letters and digits in another case or punctuation, or at most two edits apart: a typo made
  in a hurry) stops the reader too: a mistyped switch fails safe, not open (T3-21 of the 2026-12-06
  review). Only an id that is clearly another rollout's lets the reader go on.

Pure: `judge` decides from the object read (None when the API answered 404).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import poll
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import DNS_SUBDOMAIN, check_namespace, folded

# A wait that watches the switch (an observation window) reads it at least this often: a switch set during the
# wait ends it within this many seconds.
MAX_INTERVAL = 30.0
DEFAULT_NAMESPACE = 'gpufleet-system'
DEFAULT_NAME = 'gpufleet-stop'
# A switch's rollout at most this many edits (insertions, deletions, substitutions, swaps of two adjacent
# characters) from the reader's id is taken for a typo of it.
TYPO_EDITS = 2


class StopSwitchError(ValueError):
    """Bad input (the message names the field and the value)."""


class Verdict(NamedTuple):
    stopped: bool
    exists: bool
    namespace: str
    name: str
    reason: str
    set_by: str
    set_at: str
    rollout: str
    msg: str

    def as_dict(self) -> Dict[str, Any]:
        return self._asdict()


def check_names(namespace: Any, name: Any) -> None:
    """StopSwitchError unless `namespace` is a DNS label and `name` a DNS subdomain."""
    check_namespace(namespace, StopSwitchError)
    if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        raise StopSwitchError('name: %r is not a ConfigMap name (a DNS subdomain)' % (name,))


def path(namespace: str, name: str) -> str:
    """The ConfigMap's API path (names checked first)."""
    check_names(namespace, name)
    return '/api/v1/namespaces/%s/configmaps/%s' % (namespace, name)


def judge(configmap: Optional[Dict[str, Any]], namespace: str = DEFAULT_NAMESPACE, name: str = DEFAULT_NAME,
          rollout_id: str = '') -> Verdict:
    """Whether the switch stops the rollout `rollout_id` (empty: a rollout without an id).

    None (no such ConfigMap): not stopped. A ConfigMap whose ``data.rollout`` names another rollout:
    not stopped (it is that rollout's switch). Any other ConfigMap at that name stops it, whatever
    else its data says: the switch fails safe."""
    check_names(namespace, name)
    if not isinstance(rollout_id, str):
        raise StopSwitchError('rollout_id: %r is not a string' % (rollout_id,))
    where = 'ConfigMap %s/%s' % (namespace, name)
    if configmap is None:
        return Verdict(False, False, namespace, name, '', '', '', '', 'the stop switch (%s) is not set' % where)
    if not isinstance(configmap, dict):
        raise StopSwitchError('%s: the API returned %s, not an object' % (where, type(configmap).__name__))
    data = configmap.get('data') if isinstance(configmap.get('data'), dict) else {}
    meta = configmap.get('metadata') if isinstance(configmap.get('metadata'), dict) else {}
    reason, by, scope = folded(data, 'reason'), folded(data, 'by'), folded(data, 'rollout')
    set_at = meta.get('creationTimestamp') if isinstance(meta.get('creationTimestamp'), str) else ''
    typo = ''
    if scope and scope != rollout_id:
        if not looks_like(scope, rollout_id):
            return Verdict(False, True, namespace, name, reason, by, set_at, scope,
                           'the stop switch (%s) is set for rollout %s only, not for %s'
                           % (where, scope, rollout_id or 'this rollout (no id)'))
        typo = ('; its data.rollout %r is not this rollout\'s id %r but close to it, taken for a typo of it '
                '(a switch for another rollout names an id clearly its own)' % (scope, rollout_id))
    msg = ('rollout stopped by the stop switch (%s%s%s%s)%s: no further node or batch starts; '
           'delete the ConfigMap to let a rerun resume'
           % (where, ', reason: %s' % reason if reason else '', ', set by %s' % by if by else '',
              ', at %s' % set_at if set_at else '', typo))
    return Verdict(True, True, namespace, name, reason, by, set_at, scope, msg)


def _seconds(value: Any, field: str, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0 or \
            (positive and value == 0):
        raise StopSwitchError('%s: %r is not a number of seconds %s' % (field, value, '> 0' if positive else '>= 0'))
    return float(value)


def watch(get: Callable[[str], Optional[Dict[str, Any]]], namespace: str = DEFAULT_NAMESPACE, name: str = DEFAULT_NAME,
          rollout_id: str = '', wait: Any = 0, interval: Any = 10, clock: Any = None,
          sleep: Any = None) -> Tuple[Verdict, float]:
    """Read the switch every `interval` seconds (at most MAX_INTERVAL) until it stops the rollout `rollout_id` or
    `wait` seconds passed (0: read once). `get(path)` returns the ConfigMap or None (404). Returns (the last
    verdict, seconds waited): a wait that the switch did not end lasts `wait` seconds, never longer (what an
    observation window waits for)."""
    wait = _seconds(wait, 'wait', positive=False)
    given, interval = interval, _seconds(interval, 'interval', positive=True)
    if interval > MAX_INTERVAL:
        raise StopSwitchError('interval: %r is more than %g seconds: a switch set during the wait must end it within '
                              '%g s' % (given, MAX_INTERVAL, MAX_INTERVAL))
    where = path(namespace, name)
    kwargs: Dict[str, Any] = {}
    if clock is not None:
        kwargs['clock'] = clock
    if sleep is not None:
        kwargs['sleep'] = sleep
    polled = poll(lambda: judge(get(where), namespace, name, rollout_id), wait, interval,
                  done=lambda verdict: verdict.stopped, **kwargs)
    return polled.value, polled.elapsed


def _letters(text: str) -> str:
    return ''.join(c for c in text.casefold() if c.isalnum())


def edits(a: str, b: str, limit: int = TYPO_EDITS) -> int:
    """The optimal-string-alignment distance between `a` and `b` (insertions, deletions, substitutions and
    swaps of two adjacent characters), or `limit` + 1 when it is more than `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return min(prev[-1], limit + 1)


def looks_like(scope: str, rollout_id: str) -> bool:
    """Whether a switch's rollout `scope` is likely a typo of the reader's `rollout_id`: the same letters and
    digits (case and punctuation aside), or at most TYPO_EDITS edits apart (a reader without an id has
    nothing to mistype)."""
    if not rollout_id:
        return False
    if _letters(scope) == _letters(rollout_id):
        return True
    return edits(scope.casefold(), rollout_id.casefold()) <= TYPO_EDITS
