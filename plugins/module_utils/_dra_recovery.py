# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside gpufleet.upgrade.
"""Bounded stale-driver recovery planner (seed 004, rollback boundary; read-only).

After a DRA postflight failure an old driver Pod may sit unready on a node while the DRA inventory
of that node is empty. Deleting a Pod merely because the postflight failed is never right, so this
planner names a candidate Pod only when every condition holds:

1. ``node_ready``: the Node's ``Ready`` condition is ``True``;
2. ``dra_inventory_empty``: the ResourceSlices published for the node (optionally of one DRA
   driver) list no device;
3. ``daemonset_degraded``: the driver DaemonSet has ``numberReady < desiredNumberScheduled`` or
   ``updatedNumberScheduled < desiredNumberScheduled``;
4. ``stale_driver_pod``: a Pod on the node, owned by the *current* DaemonSet (an ownerReference of
   kind DaemonSet whose UID is the DaemonSet's UID), not being deleted (no ``deletionTimestamp``),
   has been unready for at least ``min_unready_seconds`` (default 600 s).

It explains for each condition why it is or is not met. It never deletes anything.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.upgrade.plugins.module_utils._kube_time import format_time, parse_time

DEFAULT_MIN_UNREADY_SECONDS = 600


class RecoveryInputError(ValueError):
    """An input object is malformed; the message names the field and the value."""


@dataclass
class Condition:
    name: str
    met: bool
    reason: str

    def as_dict(self) -> Dict[str, Any]:
        return {'name': self.name, 'met': self.met, 'reason': self.reason}


@dataclass
class PodEvaluation:
    namespace: Optional[str]
    name: Optional[str]
    uid: Optional[str]
    owned_by_current_daemonset: bool
    ready: bool
    terminating: bool
    unready_since: Optional[str]
    unready_seconds: Optional[int]
    qualifies: bool
    reason: str

    def as_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RecoveryPlan:
    node: str
    candidate: bool
    conditions: List[Condition]
    pods: List[PodEvaluation]
    candidates: List[Dict[str, Any]] = field(default_factory=list)
    summary: str = ''

    def as_dict(self) -> Dict[str, Any]:
        return {'node': self.node, 'candidate': self.candidate,
                'conditions': [c.as_dict() for c in self.conditions],
                'pods': [p.as_dict() for p in self.pods], 'candidates': list(self.candidates),
                'summary': self.summary}


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _require_mapping(obj: Any, what: str, kind: Optional[str] = None) -> Dict[str, Any]:
    if not isinstance(obj, dict):
        raise RecoveryInputError('%s: %r is not a Kubernetes object (a mapping)' % (what, obj))
    if kind and obj.get('kind') not in (None, kind):
        raise RecoveryInputError('%s: kind %r is not %s' % (what, obj.get('kind'), kind))
    return obj


def _ready_condition(obj: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    for cond in _get(obj, 'status', 'conditions') or []:
        if isinstance(cond, dict) and cond.get('type') == 'Ready':
            return cond
    return None


def _int_status(ds: Dict[str, Any], key: str) -> int:
    # Kubernetes omits some zero counters (omitempty): a missing counter is 0.
    value = _get(ds, 'status', key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecoveryInputError('daemonset.status.%s: %r is not an integer' % (key, value))
    return value


def _node_ready(node: Dict[str, Any], node_name: str) -> Condition:
    cond = _ready_condition(node)
    if cond is None:
        return Condition('node_ready', False, 'node %s reports no Ready condition' % node_name)
    status = cond.get('status')
    if status == 'True':
        return Condition('node_ready', True, 'node %s is Ready' % node_name)
    return Condition('node_ready', False, 'node %s Ready condition is %s (reason %s): a recovery plan needs a '
                     'Ready node' % (node_name, status, cond.get('reason') or 'none given'))


def _inventory(slices: List[Any], node_name: str, driver: Optional[str]) -> Condition:
    mine = []
    for i, rs in enumerate(slices):
        _require_mapping(rs, 'resource_slices[%d]' % i, 'ResourceSlice')
        if _get(rs, 'spec', 'nodeName') != node_name:
            continue
        if driver and _get(rs, 'spec', 'driver') != driver:
            continue
        devices = _get(rs, 'spec', 'devices') or []
        if not isinstance(devices, list):
            raise RecoveryInputError('resource_slices[%d].spec.devices: %r is not a list' % (i, devices))
        mine.append((_get(rs, 'metadata', 'name'), len(devices)))
    scope = 'of driver %s ' % driver if driver else ''
    total = sum(n for _name, n in mine)
    if total == 0:
        if mine:
            return Condition('dra_inventory_empty', True, 'the %d ResourceSlice(s) %sfor node %s list no device (%s)'
                             % (len(mine), scope, node_name, ', '.join(str(n) for n, _c in mine)))
        return Condition('dra_inventory_empty', True, 'no ResourceSlice %spublishes devices for node %s'
                         % (scope, node_name))
    return Condition('dra_inventory_empty', False, 'node %s still publishes %d device(s) %sin %s: the DRA driver '
                     'is serving' % (node_name, total, scope, ', '.join('%s (%d)' % m for m in mine)))


def _daemonset(ds: Dict[str, Any]) -> Condition:
    ref = '%s/%s' % (_get(ds, 'metadata', 'namespace'), _get(ds, 'metadata', 'name'))
    if not isinstance(ds.get('status'), dict):
        return Condition('daemonset_degraded', False, 'DaemonSet %s has no status: its readiness is unknown' % ref)
    desired = _int_status(ds, 'desiredNumberScheduled')
    ready = _int_status(ds, 'numberReady')
    updated = _int_status(ds, 'updatedNumberScheduled')
    counts = 'desired %d, ready %d, updated %d' % (desired, ready, updated)
    stale = ''
    gen, observed = _get(ds, 'metadata', 'generation'), _get(ds, 'status', 'observedGeneration')
    if isinstance(gen, int) and isinstance(observed, int) and observed < gen:
        stale = ' (status observed generation %d < generation %d: the counts may be stale)' % (observed, gen)
    if ready < desired or updated < desired:
        why = []
        if ready < desired:
            why.append('numberReady %d < desiredNumberScheduled %d' % (ready, desired))
        if updated < desired:
            why.append('updatedNumberScheduled %d < desiredNumberScheduled %d' % (updated, desired))
        return Condition('daemonset_degraded', True, 'DaemonSet %s is degraded: %s%s' % (ref, '; '.join(why), stale))
    return Condition('daemonset_degraded', False, 'DaemonSet %s is not degraded (%s)%s' % (ref, counts, stale))


def _evaluate_pod(i: int, pod: Dict[str, Any], ds_uid: str, ds_ref: str, now: datetime.datetime,
                  min_unready: int) -> PodEvaluation:
    meta = pod.get('metadata') or {}
    ns, name, uid = meta.get('namespace'), meta.get('name'), meta.get('uid')
    owners = meta.get('ownerReferences') or []
    ds_owners = [o for o in owners if isinstance(o, dict) and o.get('kind') == 'DaemonSet']
    owned = any(o.get('uid') == ds_uid for o in ds_owners)
    cond = _ready_condition(pod)
    ready = cond is not None and cond.get('status') == 'True'
    terminating = meta.get('deletionTimestamp') is not None
    since: Optional[datetime.datetime] = None
    if not ready:
        stamp = (cond or {}).get('lastTransitionTime') or meta.get('creationTimestamp')
        if stamp is not None:
            try:
                since = parse_time(stamp, 'pods[%d] Ready lastTransitionTime' % i)
            except ValueError as exc:
                raise RecoveryInputError(str(exc))
    unready_seconds = int((now - since).total_seconds()) if since is not None else None
    if not owned:
        if ds_owners:
            reason = ('owned by DaemonSet %s uid %s, not the current DaemonSet %s (uid %s)'
                      % (ds_owners[0].get('name'), ds_owners[0].get('uid'), ds_ref, ds_uid))
        else:
            reason = 'not owned by a DaemonSet'
    elif terminating:
        reason = 'already being deleted (deletionTimestamp %s)' % meta.get('deletionTimestamp')
    elif ready:
        reason = 'Ready'
    elif since is None:
        reason = 'unready, but since when is unknown (no Ready lastTransitionTime nor creationTimestamp)'
    elif unready_seconds is not None and unready_seconds < min_unready:
        reason = 'unready for %ds only, less than %ds' % (unready_seconds, min_unready)
    else:
        reason = 'unready for %ds (since %s), at least %ds' % (unready_seconds, format_time(since), min_unready)
    qualifies = owned and not terminating and not ready and unready_seconds is not None \
        and unready_seconds >= min_unready
    return PodEvaluation(ns, name, uid, owned, ready, terminating,
                         format_time(since) if since is not None else None, unready_seconds, qualifies, reason)


def plan_recovery(node: Any, resource_slices: Any, daemonset: Any, pods: Any,
                  now: datetime.datetime, min_unready_seconds: int = DEFAULT_MIN_UNREADY_SECONDS,
                  driver: Optional[str] = None) -> RecoveryPlan:
    """Evaluate the four conditions; never deletes. Raises RecoveryInputError on malformed input."""
    node = _require_mapping(node, 'node', 'Node')
    node_name = _get(node, 'metadata', 'name')
    if not isinstance(node_name, str) or not node_name:
        raise RecoveryInputError('node.metadata.name: %r is not a node name' % (node_name,))
    if not isinstance(resource_slices, list):
        raise RecoveryInputError('resource_slices: %r is not a list of ResourceSlice objects' % (resource_slices,))
    daemonset = _require_mapping(daemonset, 'daemonset', 'DaemonSet')
    ds_uid = _get(daemonset, 'metadata', 'uid')
    if not isinstance(ds_uid, str) or not ds_uid:
        raise RecoveryInputError('daemonset.metadata.uid: %r is missing: Pods are matched to the current '
                                 'DaemonSet by UID' % (ds_uid,))
    if not isinstance(pods, list):
        raise RecoveryInputError('pods: %r is not a list of Pod objects' % (pods,))
    if isinstance(min_unready_seconds, bool) or not isinstance(min_unready_seconds, int) or min_unready_seconds <= 0:
        raise RecoveryInputError('min_unready_seconds: %r must be a positive number of seconds' % (min_unready_seconds,))
    if not isinstance(now, datetime.datetime) or now.tzinfo is None:
        raise RecoveryInputError('now: %r must be an aware datetime' % (now,))
    now = now.astimezone(datetime.timezone.utc)
    ds_ref = '%s/%s' % (_get(daemonset, 'metadata', 'namespace'), _get(daemonset, 'metadata', 'name'))

    conditions = [_node_ready(node, node_name), _inventory(resource_slices, node_name, driver), _daemonset(daemonset)]

    evaluations: List[PodEvaluation] = []
    for i, pod in enumerate(pods):
        pod = _require_mapping(pod, 'pods[%d]' % i, 'Pod')
        if _get(pod, 'spec', 'nodeName') != node_name:
            continue
        evaluations.append(_evaluate_pod(i, pod, ds_uid, ds_ref, now, min_unready_seconds))
    qualifying = [e for e in evaluations if e.qualifies]
    if qualifying:
        conditions.append(Condition('stale_driver_pod', True, '%s: %s' % (
            ', '.join('%s/%s' % (e.namespace, e.name) for e in qualifying), qualifying[0].reason)))
    elif evaluations:
        conditions.append(Condition('stale_driver_pod', False, 'no Pod on node %s qualifies: %s' % (
            node_name, '; '.join('%s/%s %s' % (e.namespace, e.name, e.reason) for e in evaluations))))
    else:
        conditions.append(Condition('stale_driver_pod', False, 'no Pod of the given ones runs on node %s' % node_name))

    candidate = all(c.met for c in conditions)
    candidates: List[Dict[str, Any]] = []
    if candidate:
        for e in qualifying:
            candidates.append({
                'namespace': e.namespace, 'name': e.name, 'uid': e.uid, 'unready_since': e.unready_since,
                'unready_seconds': e.unready_seconds,
                'manual_step': ('after review, an operator may delete Pod %s/%s (uid %s) so that DaemonSet %s '
                                'recreates it, e.g. kubectl -n %s delete pod %s; this planner never deletes'
                                % (e.namespace, e.name, e.uid, ds_ref, e.namespace, e.name)),
            })
        summary = 'node %s: %d stale driver Pod candidate(s): %s' % (
            node_name, len(candidates), ', '.join('%s/%s' % (c['namespace'], c['name']) for c in candidates))
    else:
        summary = 'node %s: no candidate; not met: %s' % (
            node_name, ', '.join(c.name for c in conditions if not c.met))
    return RecoveryPlan(node=node_name, candidate=candidate, conditions=conditions, pods=evaluations,
                        candidates=candidates, summary=summary)
