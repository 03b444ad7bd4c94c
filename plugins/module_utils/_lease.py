# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""One run per plan: a coordination.k8s.io/v1 Lease held by the run (plan_lease; issue 37 item 3, T3-3 of the
2026-12-06 review).

- `lease_name(plan_digest)`: ``gpufleet-plan-<first 12 hex digits of the digest>``; the full digest is kept in
  the annotation ``gpufleet.io/plan-digest`` and checked, so two plans whose digests share 12 digits never
  share a Lease silently.
- `check_holder`, `check_duration`, `check_skew`: the inputs, a `LeaseError` naming field and value.
- `judge(lease, holder, now, duration_s, skew_s)`: whether `holder` may take the Lease (none yet, released,
  expired, or already its own) with the body to create or the merge patch to write, or is refused (another
  holder's Lease is fresh: the message names the holder, its renewTime and when it expires).
- `cli_holder`, `holder_ended`: a command-line run's id (controller, ansible-playbook's pid and its start time)
  and whether, on that controller, its process is gone: then its Lease is taken over at once (`judge(ended=...)`).
- `renewal(...)`: the same for a renewal, which never takes a Lease: only our own is renewed.
- `release(lease, holder)`: only our own Lease is released, by clearing ``spec.holderIdentity`` (see below).
- `settle(client, path, decide, ...)`: the reads and writes around a decision, each write under the
  resourceVersion it was computed from; a 409 (a concurrent write, or AlreadyExists on a create race) re-reads
  and decides again, at most `attempts` times.

Times are RFC 3339 micro-times in UTC as Kubernetes writes ``spec.renewTime`` and ``spec.acquireTime``
(MicroTime, ``2026-12-07T06:19:20.123456Z``). A Lease counts as expired only once ``renewTime +
leaseDurationSeconds + skew_s`` has passed on this controller's clock: the holder's clock may run up to `skew_s`
behind ours. A renewTime ahead of our clock is not trusted to be less fresh: the Lease stays refused, and the
message says by how much the clocks disagree.

Release clears ``spec.holderIdentity`` (merge patch, under the resourceVersion) rather than deleting the Lease,
as client-go's leader election does on ReleaseOnCancel: the Lease keeps ``leaseTransitions`` and the last
``acquireTime`` (a record of how often the plan changed hands), and the identity needs no ``delete`` right.
A Lease without a holder is free to the next run at once.

Pure except `settle`, whose client (get_or_none, post, patch) and clock are given.
"""
from __future__ import annotations

import datetime
import re
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _text
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import (
    RETRYABLE_READ_STATUS, ConflictError, K8sError, NotFoundError)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._kube_time import parse_time

API_VERSION = 'coordination.k8s.io/v1'
DEFAULT_NAMESPACE = 'gpufleet-system'
PREFIX = 'gpufleet-plan-'
MANAGED_BY = 'app.kubernetes.io/managed-by'
MANAGER = 'gpufleet.upgrade'
ANN_DIGEST = 'gpufleet.io/plan-digest'
DEFAULT_DURATION = 3600
MAX_DURATION = 7 * 24 * 3600
DEFAULT_SKEW = 5
MAX_SKEW = 300
DEFAULT_ATTEMPTS = 5
_DIGEST = re.compile(r'^sha256:[0-9a-f]{64}$')
# A run id: printable, no space, at most 128 characters (an AWX job id, host-pid-time, a UUID).
_HOLDER = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}$')


class LeaseError(ValueError):
    """Bad input, or a Lease that cannot be judged (the message names the field or the object)."""


class Verdict(NamedTuple):
    """`action`: 'create' (body), 'patch' (merge patch), 'none' (nothing to write) or 'refuse'.
    `outcome`: what it means: 'created', 'taken_over' (expired or released), 'renewed', 'released', 'not_held'
    (release of a Lease that is not ours), 'held' (refused: another holder's Lease is fresh), 'lost' (a
    renewal of a Lease that is no longer ours)."""
    action: str
    outcome: str
    body: Optional[Dict[str, Any]]
    msg: str


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

def check_digest(plan_digest: Any, field: str = 'plan_digest') -> str:
    if not isinstance(plan_digest, str) or not _DIGEST.match(plan_digest):
        raise LeaseError('%s: %s is not a plan digest (sha256: and 64 lowercase hex digits, the plan\'s digest as '
                         'upgrade_plan returns it)' % (field, _text.show(plan_digest)))
    return plan_digest


def lease_name(plan_digest: Any) -> str:
    """``gpufleet-plan-`` and the first 12 hex digits of the plan's digest (a DNS subdomain)."""
    return PREFIX + check_digest(plan_digest)[len('sha256:'):][:12]


def check_holder(holder: Any, field: str = 'holder') -> str:
    if not isinstance(holder, str) or not _HOLDER.match(holder):
        raise LeaseError('%s: %s is not a run id (1 to 128 letters, digits and ._:@/+=-, starting with a letter or '
                         'a digit)' % (field, _text.show(holder)))
    return holder


# A run from a controller's command line: its id names the controller, the ansible-playbook process and that
# process's start time (clock ticks since boot, /proc/<pid>/stat), so that a pid the kernel reused is not taken
# for the run. On that controller, a holder whose process is gone has provably ended (holder_ended).
_CLI = re.compile(r'^cli:(?P<user>[A-Za-z0-9._-]{1,24})@(?P<host>[A-Za-z0-9.-]{1,60}):(?P<pid>[0-9]{1,10})\.'
                  r'(?P<start>[0-9]{1,20})$')


def cli_holder(user: str, host: str, pid: int, start: int) -> str:
    """The run id of a command-line run: ``cli:<user>@<host>:<pid>.<start>`` (user and host cut to the
    characters a run id allows)."""
    user = re.sub(r'[^A-Za-z0-9._-]', '-', str(user or ''))[:24] or 'user'
    host = re.sub(r'[^A-Za-z0-9.-]', '-', str(host or ''))[:60] or 'host'
    return check_holder('cli:%s@%s:%d.%d' % (user, host, int(pid), int(start)))


def cli_process(holder: Any) -> Optional[Tuple[str, int, int]]:
    """(host, pid, start) of a command-line run's id; None for any other id."""
    match = _CLI.match(holder) if isinstance(holder, str) else None
    return (match.group('host'), int(match.group('pid')), int(match.group('start'))) if match else None


def process_start(pid: int) -> Optional[int]:
    """The start time of process `pid` on this machine (clock ticks since boot, /proc/<pid>/stat field 22), None
    when there is no such process (or no /proc). The one read of the machine in this file."""
    try:
        with open('/proc/%d/stat' % pid) as stat:
            return int(stat.read().rsplit(')', 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def holder_ended(holder: Any, host: str, started: Callable[[int], Optional[int]]) -> bool:
    """Whether `holder` is a command-line run on this controller (`host`) whose process is gone: `started(pid)`,
    the start time of the process `pid` now (None: there is none), is not the one its id names. Any other holder
    (another controller, an AWX job, a name given by hand) is never known to have ended."""
    parsed = cli_process(holder)
    if parsed is None or parsed[0] != host or parsed[2] == 0:     # start 0: the run's controller could not tell
        return False
    return started(parsed[1]) != parsed[2]


def _seconds(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LeaseError('%s: %s is not a whole number of seconds from %d to %d' % (field, _text.show(value), low, high))
    return value


def check_duration(value: Any, field: str = 'duration') -> int:
    """The Lease's duration: 1 s to a week (longer than the longest time between two renewals)."""
    return _seconds(value, field, 1, MAX_DURATION)


def check_skew(value: Any, field: str = 'clock_skew') -> int:
    return _seconds(value, field, 0, MAX_SKEW)


def check_namespace(namespace: Any) -> str:
    return _text.check_namespace(namespace, LeaseError)


def check_now(now: Any) -> datetime.datetime:
    if not isinstance(now, datetime.datetime) or now.tzinfo is None:
        raise LeaseError('now: %s is not an aware datetime' % _text.show(now))
    return now.astimezone(datetime.timezone.utc)


# --------------------------------------------------------------------------------------------
# Times
# --------------------------------------------------------------------------------------------

def format_micro(moment: datetime.datetime) -> str:
    """RFC 3339 in UTC with microseconds and a ``Z``: a Kubernetes MicroTime."""
    utc = moment.astimezone(datetime.timezone.utc)
    fields = (utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond)
    return '%04d-%02d-%02dT%02d:%02d:%02d.%06dZ' % fields


def _spec(lease: Dict[str, Any]) -> Dict[str, Any]:
    spec = lease.get('spec')
    return spec if isinstance(spec, dict) else {}


def _where(lease: Dict[str, Any]) -> str:
    meta = lease.get('metadata') or {}
    return 'Lease %s/%s' % (meta.get('namespace', '?'), meta.get('name', '?'))


def _moment(lease: Dict[str, Any], key: str) -> Optional[datetime.datetime]:
    value = _spec(lease).get(key)
    if value in (None, ''):
        return None
    try:
        return parse_time(value, '%s spec.%s' % (_where(lease), key))
    except ValueError as e:
        raise LeaseError(str(e))


def _duration_of(lease: Dict[str, Any]) -> Optional[int]:
    value = _spec(lease).get('leaseDurationSeconds')
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LeaseError('%s spec.leaseDurationSeconds: %s is not a number of seconds' % (_where(lease), _text.show(value)))
    return value


def _transitions(lease: Dict[str, Any]) -> int:
    value = _spec(lease).get('leaseTransitions')
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def holder_of(lease: Optional[Dict[str, Any]]) -> str:
    """The Lease's holder ('' for none, or no Lease)."""
    if not lease:
        return ''
    holder = _spec(lease).get('holderIdentity')
    return holder if isinstance(holder, str) else ''


def expiry(lease: Dict[str, Any]) -> Optional[datetime.datetime]:
    """When the Lease expires on its holder's clock (renewTime, or acquireTime, plus its duration); None when it
    says neither."""
    last = _moment(lease, 'renewTime') or _moment(lease, 'acquireTime')
    duration = _duration_of(lease)
    if last is None or duration is None:
        return None
    return last + datetime.timedelta(seconds=duration)


def summary(lease: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What a result or a diff shows of a Lease (None for none)."""
    if not lease:
        return None
    spec = _spec(lease)
    meta = lease.get('metadata') or {}
    try:
        ends = expiry(lease)
    except LeaseError:
        ends = None
    return {'name': meta.get('name'), 'namespace': meta.get('namespace'), 'holder': holder_of(lease) or None,
            'acquire_time': spec.get('acquireTime'), 'renew_time': spec.get('renewTime'),
            'duration': spec.get('leaseDurationSeconds'), 'transitions': _transitions(lease),
            'expires': format_micro(ends) if ends and holder_of(lease) else None,
            'plan_digest': (meta.get('annotations') or {}).get(ANN_DIGEST)}


# --------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------

def desired(namespace: str, plan_digest: str, holder: str, now: datetime.datetime, duration_s: int) -> Dict[str, Any]:
    """The Lease to create for `holder`."""
    stamp = format_micro(check_now(now))
    return {'apiVersion': API_VERSION, 'kind': 'Lease',
            'metadata': {'name': lease_name(plan_digest), 'namespace': check_namespace(namespace),
                         'labels': {MANAGED_BY: MANAGER}, 'annotations': {ANN_DIGEST: plan_digest}},
            'spec': {'holderIdentity': check_holder(holder), 'leaseDurationSeconds': check_duration(duration_s),
                     'acquireTime': stamp, 'renewTime': stamp, 'leaseTransitions': 0}}


def _check_ours(lease: Dict[str, Any], plan_digest: str) -> None:
    """A Lease of this name that the collection did not make, or made for another plan, is refused."""
    meta = lease.get('metadata') or {}
    if (meta.get('labels') or {}).get(MANAGED_BY) != MANAGER:
        raise LeaseError('%s was not made by %s (label %s=%s missing): another tool uses this name; not touched'
                         % (_where(lease), MANAGER, MANAGED_BY, MANAGER))
    recorded = (meta.get('annotations') or {}).get(ANN_DIGEST)
    if recorded != plan_digest:
        raise LeaseError('%s belongs to plan %s, not %s (annotation %s): two plans share the first 12 digits of '
                         'their digest; not touched' % (_where(lease), _text.show(recorded), plan_digest, ANN_DIGEST))


def _take(lease: Dict[str, Any], holder: str, stamp: str, duration_s: int) -> Dict[str, Any]:
    """The merge patch that gives the Lease to `holder` (a new holder: acquireTime now, one more transition)."""
    spec: Dict[str, Any] = {'holderIdentity': holder, 'leaseDurationSeconds': duration_s, 'renewTime': stamp}
    if holder_of(lease) != holder:
        spec.update(acquireTime=stamp, leaseTransitions=_transitions(lease) + 1)
    return {'spec': spec}


def _fresh_message(lease: Dict[str, Any], now: datetime.datetime, skew_s: int) -> Optional[str]:
    """Why another holder's Lease is still fresh at `now`, None when it has expired (past its expiry and the
    allowed skew). A Lease whose times cannot be read is fresh (LeaseError: the message names the field)."""
    ends = expiry(lease)
    if ends is None:
        raise LeaseError('%s is held by %s but has no spec.renewTime, spec.acquireTime or spec.leaseDurationSeconds: '
                         'it cannot be judged; delete it once no run holds it' % (_where(lease), _text.show(holder_of(lease))))
    if now >= ends + datetime.timedelta(seconds=skew_s):
        return None
    renewed = _moment(lease, 'renewTime') or _moment(lease, 'acquireTime')
    msg = ('%s is held by %s (renewTime %s, %ss lease): it expires at %s (%s allowing %ds of clock skew); another '
           'run of this plan is going on, or ended without releasing it'
           % (_where(lease), _text.show(holder_of(lease)), _spec(lease).get('renewTime') or _spec(lease).get('acquireTime'),
              _spec(lease).get('leaseDurationSeconds'), format_micro(ends),
              format_micro(ends + datetime.timedelta(seconds=skew_s)), skew_s))
    if renewed is not None and renewed > now + datetime.timedelta(seconds=skew_s):
        msg += ('; its renewTime is %ds ahead of this controller\'s clock (%s): the clocks disagree by more than the '
                'allowed skew' % (int((renewed - now).total_seconds()), format_micro(now)))
    return msg


def judge(lease: Optional[Dict[str, Any]], plan_digest: str, holder: str, now: datetime.datetime, duration_s: int,
          skew_s: int = DEFAULT_SKEW, namespace: str = DEFAULT_NAMESPACE, ended: bool = False) -> Verdict:
    """Whether `holder` may hold the plan's Lease `lease` (None: there is none) at `now`.

    No Lease: create it. Ours (same holderIdentity, fresh or not: no one took it): renew it. No holder (released),
    or another holder's expired more than `skew_s` ago, or one this controller knows has `ended` (holder_ended: a
    command-line run of this controller whose process is gone): take it over (acquireTime now, leaseTransitions
    + 1). Another holder's fresh Lease: refuse, naming the holder, its renewTime and when it expires."""
    check_digest(plan_digest)
    check_holder(holder)
    check_duration(duration_s, 'duration_s')
    check_skew(skew_s, 'skew_s')
    now = check_now(now)
    if lease is None:
        return Verdict('create', 'created', desired(namespace, plan_digest, holder, now, duration_s),
                       '%s created, held by %s' % (_where_of(namespace, plan_digest), _text.show(holder)))
    _check_ours(lease, plan_digest)
    stamp = format_micro(now)
    current = holder_of(lease)
    if current == holder:
        return Verdict('patch', 'renewed', _take(lease, holder, stamp, duration_s),
                       '%s renewed by its holder %s' % (_where(lease), _text.show(holder)))
    if current:
        why = _fresh_message(lease, now, skew_s)
        if why is not None and not ended:
            return Verdict('refuse', 'held', None, why)
        if why is not None:
            msg = ('%s taken over by %s: its holder %s was a run on this controller whose process has ended (its '
                   'lease would have expired at %s)'
                   % (_where(lease), _text.show(holder), _text.show(current), format_micro(expiry(lease) or now)))
        else:
            msg = '%s taken over by %s: %s\'s lease expired at %s' % (
                _where(lease), _text.show(holder), _text.show(current), format_micro(expiry(lease) or now))
    else:
        msg = '%s taken by %s: no run held it' % (_where(lease), _text.show(holder))
    return Verdict('patch', 'taken_over', _take(lease, holder, stamp, duration_s), msg)


def _where_of(namespace: str, plan_digest: str) -> str:
    return 'Lease %s/%s' % (namespace, lease_name(plan_digest))


def renewal(lease: Optional[Dict[str, Any]], plan_digest: str, holder: str, now: datetime.datetime,
            duration_s: int, skew_s: int = DEFAULT_SKEW, namespace: str = DEFAULT_NAMESPACE) -> Verdict:
    """A renewal: only a Lease `holder` still holds is renewed (even past its expiry: no one took it). A Lease
    that is gone, released or held by another is 'lost' (whatever its times say): the run must stop, another may
    be working the plan."""
    check_digest(plan_digest)
    check_holder(holder)
    check_duration(duration_s, 'duration_s')
    check_skew(skew_s, 'skew_s')
    check_now(now)
    if lease is None:
        return Verdict('refuse', 'lost', None, '%s does not exist: %s no longer holds the plan (it was deleted); '
                       'stop, another run may hold the plan now' % (_where_of(namespace, plan_digest), _text.show(holder)))
    _check_ours(lease, plan_digest)
    current = holder_of(lease)
    if current == holder:
        return judge(lease, plan_digest, holder, now, duration_s, skew_s, namespace)
    return Verdict('refuse', 'lost', None, '%s is %s, not by %s: this run lost the plan; stop, another run may be '
                   'working its nodes' % (_where(lease), 'held by %s' % _text.show(current) if current else 'held by no one',
                                          _text.show(holder)))


def release(lease: Optional[Dict[str, Any]], plan_digest: str, holder: str) -> Verdict:
    """Release `holder`'s Lease (clear spec.holderIdentity); any other Lease, or none, is left as it is."""
    check_digest(plan_digest)
    check_holder(holder)
    if lease is None:
        return Verdict('none', 'not_held', None, 'Lease %s does not exist: nothing to release' % lease_name(plan_digest))
    _check_ours(lease, plan_digest)
    current = holder_of(lease)
    if current != holder:
        return Verdict('none', 'not_held', None, '%s is %s, not by %s: left as it is' % (
            _where(lease), 'held by %s' % _text.show(current) if current else 'held by no one', _text.show(holder)))
    return Verdict('patch', 'released', {'spec': {'holderIdentity': None}},
                   '%s released by %s' % (_where(lease), _text.show(holder)))


# --------------------------------------------------------------------------------------------
# Reads and writes
# --------------------------------------------------------------------------------------------

Decide = Callable[[Optional[Dict[str, Any]]], Verdict]


class Settled(NamedTuple):
    verdict: Verdict
    before: Optional[Dict[str, Any]]
    after: Optional[Dict[str, Any]]
    attempts: int


def predicted(lease: Optional[Dict[str, Any]], verdict: Verdict) -> Optional[Dict[str, Any]]:
    """The Lease after `verdict` is written (what check mode reports)."""
    if verdict.action == 'create':
        return verdict.body
    if verdict.action != 'patch' or lease is None:
        return lease
    out = dict(lease, spec=dict(_spec(lease)))
    for key, value in (verdict.body or {}).get('spec', {}).items():
        if value is None:
            out['spec'].pop(key, None)
        else:
            out['spec'][key] = value
    return out


def settle(client: Any, path: str, collection: str, decide: Decide, check_mode: bool = False,
           attempts: int = DEFAULT_ATTEMPTS, sleep: Optional[Callable[[float], None]] = None,
           backoff: float = 0.2) -> Settled:
    """Read the Lease at `path`, `decide`, write what the verdict says (a create POSTs to `collection`; a patch
    carries the read resourceVersion). A 409 (the Lease changed, or a concurrent create won) or a retryable
    failure of the write (429, 5xx, timeout: it may have been applied, the fresh read tells) re-reads and decides
    again, at most `attempts` times, as does a 404 on a patch (deleted since the read); then ConflictError (or the last K8sError). A refusal or nothing to write
    returns at once; in check mode nothing is written."""
    last: Optional[K8sError] = None
    for attempt in range(max(1, attempts)):
        if attempt and sleep is not None:
            sleep(min(backoff * attempt, 2.0))
        lease = client.get_or_none(path)
        verdict = decide(lease)
        if verdict.action in ('refuse', 'none') or check_mode:
            return Settled(verdict, lease, predicted(lease, verdict), attempt + 1)
        try:
            if verdict.action == 'create':
                after = client.post(collection, verdict.body)
            else:
                body = dict(verdict.body or {})
                body['metadata'] = {'resourceVersion': (lease or {}).get('metadata', {}).get('resourceVersion')}
                after = client.patch(path, body)
        except ConflictError as exc:
            last = exc
            continue
        except NotFoundError as exc:
            if verdict.action != 'patch':      # a create's 404: the namespace does not exist
                raise
            last = exc                          # deleted since the read: decide again on its absence
            continue
        except K8sError as exc:
            if exc.reason != 'deadline' and (exc.status in RETRYABLE_READ_STATUS or exc.status is None):
                last = exc
                continue
            raise
        return Settled(verdict, lease, after, attempt + 1)
    if last is None or isinstance(last, (ConflictError, NotFoundError)):
        raise ConflictError('%s: the Lease kept changing (409 Conflict on %d attempts, each decided from a fresh '
                            'read); rerun the task' % (path, max(1, attempts)), status=409, path=path)
    raise K8sError('%s (gave up after %d attempts, each decided from a fresh read)' % (last.msg, max(1, attempts)),
                   status=last.status, method=last.method, path=path, reason=last.reason)
