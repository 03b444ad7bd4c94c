# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The drain policy (issue 40 item 1): what the drain may do to a pod that ``kubectl drain`` refuses by default.

Real GPU workloads carry local data and bare pods: PyTorch, Triton and vLLM charts mount ``/dev/shm`` as a
memory-backed emptyDir, notebooks and debug sessions run as bare pods. A drain that refuses every one of them stops
the first node of a real fleet; one that deletes them all loses what nobody agreed to lose. The policy says, per pod,
by namespace (glob) and label selector, the first rule that matches winning over the defaults:

- ``local_data``: ``memory`` (the default) deletes a pod whose emptyDir volumes are all memory-backed (``medium:
  Memory``, a tmpfs such as ``/dev/shm``: it never survives a pod's move anyway) and refuses one with a disk-backed
  emptyDir; ``delete`` deletes emptyDir data of any medium (``kubectl drain --delete-emptydir-data``); ``refuse``
  refuses any emptyDir.
- ``unmanaged_pods``: ``refuse`` (the default) refuses a pod no controller manages (it would be gone for ever);
  ``delete`` deletes it (``kubectl drain --force``).
- ``grace_period``: seconds each evicted pod gets to terminate (None: its own ``terminationGracePeriodSeconds``).

A refused pod blocks the drain (the node is not drained, names the pod and the rule that refused it), so the policy is
fixed before anything is lost. The policy is part of the plan (reviewed with it, in its digest) and the drain applies
it; the module's own ``delete_local_data``/``force`` remain for a direct call without a policy.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._holders import controller_of
from ansible_collections.gpufleet.upgrade.plugins.module_utils._node_gate import (
    NodeGateError, label_selector_matches, parse_label_selector)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show

LOCAL_DATA = ('memory', 'delete', 'refuse')
UNMANAGED_PODS = ('refuse', 'delete')
FIELDS = ('local_data', 'unmanaged_pods', 'grace_period')
RULE_KEYS = ('namespaces', 'selector') + FIELDS
TOP_KEYS = FIELDS + ('rules',)
DEFAULTS: Dict[str, Any] = {'local_data': 'memory', 'unmanaged_pods': 'refuse', 'grace_period': None}


class DrainPolicyError(ValueError):
    """Bad policy input: the message names the field and the value."""


class PodPolicy(object):
    """What the policy says for one pod: the three fields and which rule said it (None: the defaults)."""
    __slots__ = ('local_data', 'unmanaged_pods', 'grace_period', 'rule')

    def __init__(self, local_data: str, unmanaged_pods: str, grace_period: Optional[int], rule: Optional[int]) -> None:
        self.local_data = local_data
        self.unmanaged_pods = unmanaged_pods
        self.grace_period = grace_period
        self.rule = rule

    def source(self) -> str:
        return 'drain policy rule %d' % self.rule if self.rule is not None else 'the drain policy\'s defaults'


def _check_field(name: str, value: Any, where: str) -> Any:
    if name == 'local_data':
        if value not in LOCAL_DATA:
            raise DrainPolicyError('%s.local_data: %s is not one of %s' % (where, show(value), ', '.join(LOCAL_DATA)))
    elif name == 'unmanaged_pods':
        if value not in UNMANAGED_PODS:
            raise DrainPolicyError('%s.unmanaged_pods: %s is not one of %s'
                                   % (where, show(value), ', '.join(UNMANAGED_PODS)))
    elif value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise DrainPolicyError('%s.grace_period: %s is not a whole number of seconds >= 0 (or null: the pod\'s own)'
                               % (where, show(value)))
    return value


class DrainPolicy(object):
    def __init__(self, defaults: Dict[str, Any], rules: List[Dict[str, Any]]) -> None:
        self.defaults = defaults
        self.rules = rules
        self._selectors = [parse_label_selector(r['selector'], 'rules[%d].selector' % i) if r.get('selector') else []
                           for i, r in enumerate(rules)]

    def as_dict(self) -> Dict[str, Any]:
        """The normalized policy (what the plan records and its digest covers)."""
        return dict(self.defaults, rules=[dict(r) for r in self.rules])

    def for_pod(self, pod: Dict[str, Any]) -> PodPolicy:
        meta = pod.get('metadata') or {}
        namespace = meta.get('namespace') or ''
        labels = meta.get('labels') or {}
        for i, rule in enumerate(self.rules):
            globs = rule.get('namespaces')
            if globs and not any(fnmatch.fnmatchcase(namespace, g) for g in globs):
                continue
            if self._selectors[i] and not label_selector_matches(labels, self._selectors[i]):
                continue
            values = dict(self.defaults, **dict((k, rule[k]) for k in FIELDS if k in rule))
            return PodPolicy(values['local_data'], values['unmanaged_pods'], values['grace_period'], i)
        return PodPolicy(self.defaults['local_data'], self.defaults['unmanaged_pods'], self.defaults['grace_period'], None)


def parse(value: Any, field: str = 'drain_policy') -> DrainPolicy:
    """The policy from its mapping (None or {}: the defaults); DrainPolicyError names the field and the value."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise DrainPolicyError('%s: %s is not a mapping (local_data, unmanaged_pods, grace_period, rules)'
                               % (field, show(value)))
    unknown = sorted(set(value) - set(TOP_KEYS))
    if unknown:
        raise DrainPolicyError('%s: unknown key(s) %s (known: %s)' % (field, ', '.join(unknown), ', '.join(TOP_KEYS)))
    defaults = dict(DEFAULTS)
    for name in FIELDS:
        if name in value:
            defaults[name] = _check_field(name, value[name], field)
    rules_in = value.get('rules')
    if rules_in is None:
        rules_in = []
    if not isinstance(rules_in, list):
        raise DrainPolicyError('%s.rules: %s is not a list of rules' % (field, show(rules_in)))
    rules: List[Dict[str, Any]] = []
    for i, raw in enumerate(rules_in):
        where = '%s.rules[%d]' % (field, i)
        if not isinstance(raw, dict):
            raise DrainPolicyError('%s: %s is not a mapping' % (where, show(raw)))
        unknown = sorted(set(raw) - set(RULE_KEYS))
        if unknown:
            raise DrainPolicyError('%s: unknown key(s) %s (known: %s)' % (where, ', '.join(unknown), ', '.join(RULE_KEYS)))
        if not any(k in raw for k in FIELDS):
            raise DrainPolicyError('%s: says nothing (set local_data, unmanaged_pods or grace_period)' % where)
        rule: Dict[str, Any] = {}
        globs = raw.get('namespaces')
        if globs is not None:
            if isinstance(globs, str):
                globs = [globs]
            if not isinstance(globs, list) or not globs or not all(isinstance(g, str) and g for g in globs):
                raise DrainPolicyError('%s.namespaces: %s is not a list of namespace names or globs' % (where, show(globs)))
            rule['namespaces'] = list(globs)
        selector = raw.get('selector')
        if selector is not None:
            try:
                parse_label_selector(selector, '%s.selector' % where)
            except NodeGateError as exc:
                raise DrainPolicyError(str(exc))
            rule['selector'] = selector
        for name in FIELDS:
            if name in raw:
                rule[name] = _check_field(name, raw[name], where)
        rules.append(rule)
    return DrainPolicy(defaults, rules)


def _empty_dirs(pod: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(volume name, medium) of each emptyDir volume of the pod ('' for the node's disk)."""
    out = []
    for v in (pod.get('spec') or {}).get('volumes') or []:
        if isinstance(v, dict) and 'emptyDir' in v:
            out.append((str(v.get('name')), str((v.get('emptyDir') or {}).get('medium') or '')))
    return out


def refusal(pod: Dict[str, Any], pp: PodPolicy) -> Optional[str]:
    """Why the policy refuses to drain this pod (None: it may go, its local data deleted as the policy says)."""
    reasons = []
    dirs = _empty_dirs(pod)
    if dirs and pp.local_data != 'delete':
        disk = [name for name, medium in dirs if medium != 'Memory']
        if pp.local_data == 'refuse' or disk:
            shown = disk if pp.local_data == 'memory' else [name for name, _m in dirs]
            reasons.append('emptyDir %s%s would be lost (local_data=%s, %s; delete with local_data: delete in a rule '
                           'for it)' % (', '.join(shown), ' on the node\'s disk' if pp.local_data == 'memory' else '',
                                        pp.local_data, pp.source()))
    if controller_of(pod) is None and pp.unmanaged_pods != 'delete':
        reasons.append('no controller manages it: deleted, it is gone for ever (unmanaged_pods=%s, %s)'
                       % (pp.unmanaged_pods, pp.source()))
    return '; '.join(reasons) or None


def describe(pods: Sequence[Dict[str, Any]], policy: DrainPolicy) -> List[Dict[str, Any]]:
    """Per pod: namespace, name, what the policy does (refuse, or evict with its local data deleted) and why."""
    out = []
    for pod in pods:
        meta = pod.get('metadata') or {}
        pp = policy.for_pod(pod)
        why = refusal(pod, pp)
        out.append({'namespace': meta.get('namespace'), 'name': meta.get('name'),
                    'action': 'refuse' if why else 'evict', 'reason': why or pp.source(), 'rule': pp.rule})
    return out
