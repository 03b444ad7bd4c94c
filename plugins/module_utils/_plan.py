# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the collection: no compatibility promise. Used by the upgrade_plan module and filter.

"""The upgrade planner: matrix, canaries, batches and the availability budget.

The method is seed 000's: group the nodes into *material combinations* (GPU PCI identity,
server platform, kernel line, partition mode, driver install method), pick at least N canaries
per combination, list every combination left without a canary, then cut the rest into batches.
Batch size and availability are two separate limits:

* ``batch_size`` (count or percent of the pool, rounded down, at least 1) caps how many nodes
  one batch upgrades;
* ``max_unavailable`` (count or percent of the pool, rounded down; 0 refuses) caps how many
  nodes are out of service *while* a batch runs, counted from the nodes actually out of service:
  already cordoned, NotReady, and canaries still isolated, plus the batch's in-service nodes;
* ``failure_allowance`` (nodes and/or GPUs that must stay in service) is checked on the same
  step: in-service capacity while the batch runs must stay at or above it.

A batch that would break either availability rule is shrunk; a plan whose next node cannot move
even alone fails with the reason. Everything here is deterministic: the same input gives the
same plan, byte for byte, and the same digest (sha256 of the canonical JSON).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_policy, _metric_gate, _rke2
from ansible_collections.gpufleet.upgrade.plugins.module_utils._duration import parse_seconds
from ansible_collections.gpufleet.upgrade.plugins.module_utils._node_record import CANARY_KEY
from ansible_collections.gpufleet.upgrade.plugins.module_utils._pause import PauseError, check_pauses
from ansible_collections.gpufleet.upgrade.plugins.module_utils._platform import node_platform
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import named_entry, show

__all__ = [
    'DEFAULT_COMBINATION_KEYS', 'DEFAULT_SOURCE_DRIFT', 'KNOWN_COMBINATION_KEYS', 'PlanInputError', 'PlanRefused',
    'SOURCE_DRIFT_POLICIES', 'batch_admission', 'build_plan', 'check_plan', 'kernel_line', 'natural_key', 'out_of_service_reasons', 'resolve_count',
]

DEFAULT_COMBINATION_KEYS = ('pci_ids', 'platform', 'kernel_line', 'partition_mode', 'install_method')
# Keys a combination can be made of. `label:<name>` (a node label) is accepted too.
KNOWN_COMBINATION_KEYS = ('pci_ids', 'platform', 'kernel_line', 'kernel', 'kernel_flavour',
                          'partition_mode', 'install_method')

# What the planner does with a combination whose nodes run different current tuples (source-tuple drift: kernel
# ABI 6.8.0-131 next to -134, RKE2 +rke2r1 next to +rke2r2, driver 570.1 next to 570.2). The canary qualifies
# one exact source tuple and the rollout's gate checks one, so such a combination is never planned as one:
# `refuse` (the default) fails naming the combination and the nodes of each source tuple; `split` makes each
# source tuple its own combination, with its own canary(ies). Refuse is the default because split adds
# canaries (and, with canaries isolated, holds more of the availability budget) that nobody asked for.
SOURCE_DRIFT_POLICIES = ('refuse', 'split')
DEFAULT_SOURCE_DRIFT = 'refuse'

_PERCENT_RE = re.compile(r'^\s*(\d+)\s*%\s*$')
_INT_RE = re.compile(r'^\s*(\d+)\s*$')
_KERNEL_RE = re.compile(r'^(\d+)\.(\d+)(?:\.(\d+))?(.*)$')
_FLAVOUR_RE = re.compile(r'^-\d+(?:\.\d+)*-(?P<flavour>[a-z][a-z0-9-]*)$')
_NATURAL_RE = re.compile(r'(\d+)')
_SUMMARY_NAMES = 8
# The largest count (nodes, GPUs) or percentage number the planner reads: nine digits.
MAX_COUNT = 999999999


class PlanInputError(ValueError):
    """Bad input: the message names the field and the value."""


class PlanRefused(Exception):
    """The plan cannot proceed. ``problems`` says why; ``plan`` holds what was computed."""

    def __init__(self, problems: List[str], plan: Dict[str, Any]) -> None:
        super().__init__('upgrade plan refused: ' + '; '.join(problems))
        self.problems = problems
        self.plan = plan


# --------------------------------------------------------------------------------------------
# Small helpers


def natural_key(name: str) -> Tuple[Any, ...]:
    """Sort key that orders gpu-2 before gpu-10 (digits compared as numbers)."""
    parts = _NATURAL_RE.split(name)
    return tuple((0, int(p), p) if i % 2 else (1, 0, p) for i, p in enumerate(parts))


@functools.lru_cache(maxsize=1024)
def kernel_line(kernel: str) -> str:
    """The kernel line: the release's major.minor, e.g. '6.8' for '6.8.0-134-generic'.

    Ubuntu's ABI number (134) moves with every security update of the same line and the flavour
    is a separate combination key (`kernel_flavour`); the line is what changes the driver's
    kernel interface materially (GA 6.8 versus HWE 6.11, RHEL 5.14).
    """
    m = _KERNEL_RE.match(kernel.strip()) if isinstance(kernel, str) else None
    if not m:
        raise PlanInputError('kernel %r has no major.minor release (expected e.g. 6.8.0-134-generic)' % (kernel,))
    return '%s.%s' % (m.group(1), m.group(2))


def kernel_flavour(kernel: str) -> str:
    """The Ubuntu-style flavour suffix ('generic', 'nvidia', 'generic-64k'); '' when none."""
    m = _KERNEL_RE.match(kernel.strip())
    if not m:
        return ''
    fm = _FLAVOUR_RE.match(m.group(4) or '')
    return fm.group('flavour') if fm else ''


def _digits(digits: str, value: Any, field: str) -> int:
    """The number `digits` (a regex match of digits) stands for; PlanInputError beyond MAX_COUNT (int() of more
    than 4300 digits is a bare ValueError in CPython, and no pool has a billion nodes)."""
    significant = digits.lstrip('0') or '0'
    if len(significant) > len(str(MAX_COUNT)) or int(significant) > MAX_COUNT:
        raise PlanInputError('%s: %s is more than %d' % (field, show(value, 40), MAX_COUNT))
    return int(significant)


def _parse_count(value: Any, field: str, allow_percent: bool = True) -> Tuple[int, bool]:
    """Return (number, is_percent) for an int, 'N' or 'P%' (at most MAX_COUNT)."""
    if isinstance(value, bool) or value is None:
        raise PlanInputError('%s: %r is not a count or a percentage (e.g. 4 or "10%%")' % (field, value))
    if isinstance(value, int):
        if value < 0:
            raise PlanInputError('%s: %s is negative' % (field, show(value, 40)))
        if value > MAX_COUNT:
            raise PlanInputError('%s: %s is more than %d' % (field, show(value, 40), MAX_COUNT))
        return value, False
    if isinstance(value, str):
        m = _PERCENT_RE.match(value)
        if m and allow_percent:
            pct = _digits(m.group(1), value, field)
            if pct > 100:
                raise PlanInputError('%s: %r is over 100%%' % (field, value))
            return pct, True
        m = _INT_RE.match(value)
        if m:
            return _digits(m.group(1), value, field), False
    raise PlanInputError('%s: %s is not a count or a percentage (e.g. 4 or "10%%")' % (field, _shown(value)))


def _shown(value: Any) -> str:
    """`value` as %r shows it (the messages' form), bounded: a string of thousands of digits stays short."""
    if isinstance(value, str):
        return repr(value if len(value) <= 57 else value[:54] + '...')
    return show(value, 60)


def resolve_count(value: Any, base: int, field: str, round_up: bool = False) -> Dict[str, Any]:
    """Resolve a count or percentage of `base`; percentages round down unless `round_up`.

    Returns the arithmetic as a dict: requested, base, resolved, rule.
    """
    number, is_percent = _parse_count(value, field)
    if not is_percent:
        return {'requested': value, 'base': base, 'resolved': number, 'rule': '%d (a count)' % number}
    product = number * base
    resolved = -(-product // 100) if round_up else product // 100
    way = 'rounded up' if round_up else 'rounded down'
    exact = product / 100.0
    return {'requested': value, 'base': base, 'resolved': resolved,
            'rule': '%d%% of %d = %s, %s = %d' % (number, base, ('%g' % exact), way, resolved)}


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(',', ':'), ensure_ascii=True)


def _tuple_key(current: Dict[str, Any]) -> Any:
    """A hashable key for a tuple dict (its canonical JSON when a value is not hashable)."""
    try:
        key = tuple(sorted(current.items()))
        hash(key)
        return key
    except TypeError:
        return _canonical(current)


def digest_of(plan: Dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the plan without its `digest` and `summary`, and without `warnings` and
    `problems` (derived from the rest; the module reports them and the plan file does not keep them), so the
    digest can be recomputed from the plan file."""
    body = dict((k, v) for k, v in plan.items() if k not in ('digest', 'summary', 'warnings', 'problems'))
    return 'sha256:' + hashlib.sha256(_canonical(body).encode('ascii')).hexdigest()


# --------------------------------------------------------------------------------------------
# Input validation


class _Node(object):
    __slots__ = ('name', 'pci_ids', 'platform', 'kernel', 'kernel_line', 'partition_mode',
                 'install_method', 'current', 'ready', 'unschedulable', 'gpus', 'holders',
                 'labels', 'sort_key', 'rke2_server')

    def __init__(self, raw: Any, index: int) -> None:
        where = 'nodes[%d]' % index
        name = named_entry(raw, where, PlanInputError)
        where = 'nodes[%d] (%s)' % (index, name)
        self.name = name
        pci = raw.get('pci_ids')
        if not isinstance(pci, (list, tuple)) or not all(isinstance(p, str) and p for p in pci):
            raise PlanInputError('%s.pci_ids: %r is not a list of PCI id strings' % (where, pci))
        self.pci_ids = tuple(sorted(set(p.strip().lower() for p in pci)))
        for field in ('platform', 'kernel', 'partition_mode', 'install_method'):
            val = raw.get(field)
            if not isinstance(val, str):
                raise PlanInputError('%s.%s: %r is not a string' % (where, field, val))
        self.platform = raw['platform']
        self.kernel = raw['kernel']
        try:
            self.kernel_line = kernel_line(self.kernel)
        except PlanInputError as exc:
            raise PlanInputError('%s.kernel: %s' % (where, exc))
        self.partition_mode = raw['partition_mode']
        self.install_method = raw['install_method']
        cur = raw.get('current')
        if not isinstance(cur, dict):
            raise PlanInputError('%s.current: %r is not a dict (the current tuple)' % (where, cur))
        self.current = dict(cur)
        for field in ('ready', 'unschedulable'):
            if not isinstance(raw.get(field), bool):
                raise PlanInputError('%s.%s: %r is not a boolean' % (where, field, raw.get(field)))
        self.ready = raw['ready']
        self.unschedulable = raw['unschedulable']
        gpus = raw.get('gpus')
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise PlanInputError('%s.gpus: %r is not a non-negative integer' % (where, gpus))
        self.gpus = gpus
        holders = raw.get('holders')
        if holders is not None and (isinstance(holders, bool) or not isinstance(holders, int) or holders < 0):
            raise PlanInputError('%s.holders: %r is not a non-negative integer' % (where, holders))
        self.holders = holders
        labels = raw.get('labels') or {}
        if not isinstance(labels, dict):
            raise PlanInputError('%s.labels: %r is not a dict' % (where, labels))
        self.labels = labels
        self.sort_key = natural_key(name)
        # An RKE2 server (control-plane / etcd member, as its Node's labels say): at most one of them out of service
        # at a time, so etcd keeps its quorum; an agent is the canary where the combination has one.
        self.rke2_server = _rke2.node_role(labels).role == 'server'

    @property
    def out_of_service(self) -> bool:
        return bool(out_of_service_reasons(self.unschedulable, self.ready, self.labels))

    def out_reason(self) -> str:
        return ', '.join(out_of_service_reasons(self.unschedulable, self.ready, self.labels))

    def key_value(self, key: str) -> str:
        if key == 'pci_ids':
            return ','.join(self.pci_ids)
        if key == 'kernel_flavour':
            return kernel_flavour(self.kernel)
        if key.startswith('label:'):
            val = self.labels.get(key[len('label:'):])
            return '' if val is None else str(val)
        return getattr(self, key)


def out_of_service_reasons(unschedulable: bool, ready: bool, labels: Optional[Dict[str, Any]]) -> List[str]:
    """Why a node is out of service (empty: in service), the one definition the planner and the
    rollout's batch admission share: cordoned, NotReady, or a canary still isolated (it carries the
    canary label: the canary playbook's taint keeps production pods off it)."""
    reasons = []
    if unschedulable:
        reasons.append('cordoned')
    if not ready:
        reasons.append('NotReady')
    if CANARY_KEY in (labels or {}):
        reasons.append('canary still isolated')
    return reasons


def _node_names(value: Any, field: str) -> None:
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise PlanInputError('%s: %s is not a list of node names' % (field, _shown(value)))


def _whole(value: Any, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanInputError('%s: %s is not a whole number >= 0' % (field, _shown(value)))


def check_plan(plan: Any) -> Dict[str, Any]:
    """The reviewed plan (as read from the plan file), its fields that the rollout's filters read checked
    for shape: ``digest`` a string, ``target`` a mapping, ``canaries`` a list of node names, ``batches`` a
    list of lists of node names, ``max_unavailable`` and ``budget.failure_allowance.{nodes,gpus}.resolved``
    whole numbers, ``budget`` and ``failure_allowance`` mappings, ``pauses`` batch numbers of the plan's
    batches (check_pauses), ``observation`` what check_observation takes, ``combinations`` a list whose
    combinations each have at most one source tuple. A field the plan leaves out is not checked (the
    function that needs it says so). PlanInputError names the field and the value: a plan the planner
    wrote always passes; an edited one, or one written before the planner decided source-tuple drift, is
    refused before it is read."""
    if not isinstance(plan, dict):
        raise PlanInputError('plan: %s is not a plan (a mapping)' % _shown(plan))
    if plan.get('digest') is not None and not isinstance(plan['digest'], str):
        raise PlanInputError('plan.digest: %s is not a string (sha256:<64 hex>)' % _shown(plan['digest']))
    if plan.get('target') is not None and not isinstance(plan['target'], dict):
        raise PlanInputError('plan.target: %s is not a mapping (the target tuple)' % _shown(plan['target']))
    if plan.get('canaries') is not None:
        _node_names(plan['canaries'], 'plan.canaries')
    if plan.get('batches') is not None:
        if not isinstance(plan['batches'], list):
            raise PlanInputError('plan.batches: %s is not a list of batches' % _shown(plan['batches']))
        for i, batch in enumerate(plan['batches']):
            _node_names(batch, 'plan.batches[%d]' % i)
    if 'max_unavailable' in plan:
        _whole(plan['max_unavailable'], 'plan.max_unavailable')
    budget = plan.get('budget')
    if budget is not None:
        if not isinstance(budget, dict):
            raise PlanInputError('plan.budget: %s is not a mapping' % _shown(budget))
        allowance = budget.get('failure_allowance')
        if allowance is not None:
            if not isinstance(allowance, dict):
                raise PlanInputError('plan.budget.failure_allowance: %s is not a mapping' % _shown(allowance))
            for key in ('nodes', 'gpus'):
                entry = allowance.get(key)
                field = 'plan.budget.failure_allowance.%s' % key
                if entry is not None and not isinstance(entry, dict):
                    raise PlanInputError('%s: %s is not a mapping (with resolved)' % (field, _shown(entry)))
                if entry is not None and entry.get('resolved') is not None:
                    _whole(entry['resolved'], field + '.resolved')
    if plan.get('pauses') is not None:
        batches = plan.get('batches')
        try:
            check_pauses(plan['pauses'], len(batches) if isinstance(batches, list) else None, 'plan.pauses')
        except PauseError as exc:
            raise PlanInputError(str(exc)) from None
    if plan.get('observation') is not None:
        check_observation(plan['observation'], 'plan.observation')
    if plan.get('combinations') is not None:
        _one_source_tuple(plan['combinations'])
    if plan.get('drain') is not None:
        try:
            _drain_policy.parse(plan['drain'], 'plan.drain')
        except _drain_policy.DrainPolicyError as exc:
            raise PlanInputError(str(exc)) from None
    return plan


def _one_source_tuple(combinations: Any) -> None:
    """Every combination runs one source tuple: the planner refuses or splits source-tuple drift (source_drift), so a
    combination with several is a plan written before it did - refused here, before a canary moves, not after."""
    if not isinstance(combinations, list):
        raise PlanInputError('plan.combinations: %s is not a list of combinations' % _shown(combinations))
    for i, combo in enumerate(combinations):
        sources = combo.get('source_tuples') if isinstance(combo, dict) else None
        if isinstance(sources, list) and len(sources) > 1:
            raise PlanInputError(
                'plan.combinations[%d] (%s).source_tuples: %d source tuples (source-tuple drift) - a canary qualifies '
                'one exact tuple and the gate checks one; re-plan with gpufleet.upgrade.plan, whose source_drift '
                '(gpufleet_source_drift) refuses naming the nodes of each tuple or splits them into combinations of '
                'their own' % (i, show(combo.get('id'), 200), len(sources)))


def batch_admission(nodes: Sequence[Dict[str, Any]], batch: Sequence[str], plan: Dict[str, Any]) -> Dict[str, Any]:
    """May the rollout start `batch` now? `nodes` is the pool as fleet_info reads it just before
    (name, unschedulable, ready, labels, gpus); `plan` the reviewed plan (max_unavailable, budget).

    Unavailable during the batch = the nodes out of service now (out_of_service_reasons) + the
    batch's nodes still in service; it must stay within max_unavailable, and the capacity left in
    service within the failure allowance (nodes, GPUs), as the planner computed the batch."""
    mu = plan.get('max_unavailable') if isinstance(plan, dict) else plan
    if not isinstance(plan, dict) or isinstance(mu, bool) or not isinstance(mu, int) or mu < 0:
        raise PlanInputError('plan.max_unavailable: %r is not a whole number >= 0 (is this a reviewed plan?)' % (mu,))
    check_plan(plan)
    if not isinstance(batch, (list, tuple)):
        raise PlanInputError('batch: %r is not a list of node names' % (batch,))
    for i, b in enumerate(batch):
        if not isinstance(b, str) or not b:
            raise PlanInputError('batch[%d]: %r is not a node name' % (i, b))
    out: List[str] = []
    seen: Dict[str, Dict[str, Any]] = {}
    for i, n in enumerate(nodes):
        if not isinstance(n, dict) or not isinstance(n.get('name'), str):
            raise PlanInputError('nodes[%d]: %r is not a node with a name' % (i, n))
        if n.get('labels') is not None and not isinstance(n['labels'], dict):
            raise PlanInputError('nodes[%d] (%s).labels: %s is not a mapping' % (i, n['name'], _shown(n['labels'])))
        if n.get('gpus') is not None:
            _whole(n['gpus'], 'nodes[%d] (%s).gpus' % (i, n['name']))
        if n['name'] in seen:
            continue
        seen[n['name']] = n
        if out_of_service_reasons(bool(n.get('unschedulable')), bool(n.get('ready')), n.get('labels')):
            out.append(n['name'])
    batch_in = [b for b in batch if b not in out]
    unavailable = len(out) + len(batch_in)
    away = set(out) | set(batch_in)
    nodes_in_service = len(seen) - unavailable
    gpus_in_service = sum(int(n.get('gpus') or 0) for name, n in seen.items() if name not in away)
    allowance = (plan.get('budget') or {}).get('failure_allowance') or {}
    fa_nodes = (allowance.get('nodes') or {}).get('resolved')
    fa_gpus = (allowance.get('gpus') or {}).get('resolved')
    admitted = (unavailable <= mu and (fa_gpus is None or gpus_in_service >= fa_gpus)
                and (fa_nodes is None or nodes_in_service >= fa_nodes))
    if admitted:
        msg = 'batch %s: %d node(s) out of service during the batch (max %d)' % (list(batch), unavailable, mu)
    else:
        msg = ('batch %s refused: %d node(s) out of service now (%s) plus %d of this batch = %d > max_unavailable %d, '
               'or capacity in service (%d nodes, %d GPUs) below the failure allowance (nodes %s, GPUs %s)'
               % (list(batch), len(out), ', '.join(out), len(batch_in), unavailable, mu, nodes_in_service,
                  gpus_in_service, fa_nodes, fa_gpus))
    return {'admitted': admitted, 'out': out, 'batch_in': batch_in, 'unavailable': unavailable,
            'max_unavailable': mu, 'nodes_in_service': nodes_in_service, 'gpus_in_service': gpus_in_service,
            'msg': msg}


def _validate_keys(keys: Any) -> Tuple[str, ...]:
    if not isinstance(keys, (list, tuple)) or not keys:
        raise PlanInputError('combination_keys: %r is not a non-empty list' % (keys,))
    out: List[str] = []
    for k in keys:
        if not isinstance(k, str) or not (k in KNOWN_COMBINATION_KEYS or (k.startswith('label:') and len(k) > 6)):
            raise PlanInputError('combination_keys: %r is not one of %s or label:<name>'
                                 % (k, ', '.join(KNOWN_COMBINATION_KEYS)))
        if k not in out:
            out.append(k)
    return tuple(out)


def _needs_upgrade(node: _Node, target: Dict[str, Any]) -> bool:
    if not target:
        return True
    return any(node.current.get(k) != v for k, v in target.items())


# --------------------------------------------------------------------------------------------
# The planner


def check_observation(value: Any, field: str = 'observation') -> Dict[str, Any]:
    """The plan's observation settings (issue 16): {'window': a duration (optional: the run's
    gpufleet_observation_window otherwise), 'queries': metric_gate queries run at the end of every stage's
    window over the nodes upgraded so far (optional): the minimum traffic (count_expr, min_count) and the
    control group (control) go here, 'workloads': {'cases': [names of the shipped suite's or the operator's
    cases], 'repeat': runs of each (1)}: the workload gate re-run at the end of every window on every node
    upgraded so far (optional: Jobs on nodes back in service take GPUs from their tenants, so the plan says
    which, if any)}. Validated as metric_gate validates them; returned as given (workloads normalized)."""
    if value is None or value == {}:
        return {}
    if not isinstance(value, dict):
        raise PlanInputError('%s: %r is not a mapping with window, queries and/or workloads' % (field, value))
    unknown = sorted(k for k in value if k not in ('window', 'queries', 'workloads'))
    if unknown:
        raise PlanInputError('%s: unknown key(s) %s (window, queries, workloads)' % (field, ', '.join(unknown)))
    out: Dict[str, Any] = {}
    seconds = 15 * 60.0
    if value.get('window') is not None:
        try:
            seconds = parse_seconds(value['window'], field + '.window')
        except ValueError as exc:
            raise PlanInputError(str(exc))
        out['window'] = str(value['window'])
    queries = value.get('queries')
    if queries is not None:
        if not isinstance(queries, list) or not queries:
            raise PlanInputError('%s.queries: %r is not a non-empty list of metric_gate queries' % (field, queries))
        window = _metric_gate.Window(0.0, seconds)
        names = []
        for i, raw in enumerate(queries):
            try:
                names.append(_metric_gate.parse_query(raw, i, window, 5).name)
            except _metric_gate.MetricGateError as exc:
                raise PlanInputError('%s.%s' % (field, exc))
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise PlanInputError('%s.queries: duplicate name(s) %s' % (field, ', '.join(dupes)))
        out['queries'] = [dict(q) for q in queries]
    workloads = value.get('workloads')
    if workloads is not None:
        if not isinstance(workloads, dict) or sorted(set(workloads) - {'cases', 'repeat'}):
            raise PlanInputError('%s.workloads: %r is not a mapping with cases (names) and repeat' % (field, workloads))
        names = workloads.get('cases')
        if (not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names)
                or len(set(names)) != len(names)):
            raise PlanInputError('%s.workloads.cases: %r is not a list of distinct workload case names' % (field, names))
        repeat = workloads.get('repeat', 1)
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise PlanInputError('%s.workloads.repeat: %r is not a whole number >= 1' % (field, repeat))
        out['workloads'] = {'cases': list(names), 'repeat': repeat}
    return out


def build_plan(nodes: Sequence[Any], target: Optional[Dict[str, Any]] = None,
               canaries_per_combination: int = 1, batch_size: Any = '10%',
               max_unavailable: Any = '25%', failure_allowance: Optional[Dict[str, Any]] = None,
               combination_keys: Sequence[str] = DEFAULT_COMBINATION_KEYS,
               exclude: Sequence[str] = (), omitted_block: bool = True,
               single_node_pool_acknowledged: bool = False,
               canaries_isolated: bool = True, pause_before: Sequence[int] = (),
               observation: Optional[Dict[str, Any]] = None,
               source_drift: str = DEFAULT_SOURCE_DRIFT,
               drain_policy: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Plan the rollout. Returns the plan dict; raises PlanInputError or PlanRefused.

    ``drain_policy`` (_drain_policy: local data, unmanaged pods, grace period, by namespace and selector) is recorded
    normalized as the plan's ``drain`` (in its digest): what every drain of the canary and the rollout applies.

    ``source_drift`` (SOURCE_DRIFT_POLICIES) says what a combination whose nodes run different current
    tuples becomes: ``refuse`` fails naming its nodes per source tuple, ``split`` plans each source tuple as
    its own combination. The plan lists the drift (``source_drift``) either way."""
    # ---- inputs
    if not isinstance(nodes, (list, tuple)):
        raise PlanInputError('nodes: %r is not a list' % (nodes,))
    try:
        pauses = check_pauses(list(pause_before) if isinstance(pause_before, tuple) else pause_before)
    except PauseError as exc:
        raise PlanInputError(str(exc))
    observed = check_observation(observation)
    if target is not None and not isinstance(target, dict):
        raise PlanInputError('target: %s is not a mapping (the target tuple)' % _shown(target))
    target = dict(target or {})
    if isinstance(canaries_per_combination, bool) or not isinstance(canaries_per_combination, int) \
            or canaries_per_combination < 0:
        raise PlanInputError('canaries_per_combination: %r is not a non-negative integer' % (canaries_per_combination,))
    keys = _validate_keys(combination_keys)
    try:
        drain = _drain_policy.parse(drain_policy, 'drain_policy').as_dict()
    except _drain_policy.DrainPolicyError as exc:
        raise PlanInputError(str(exc))
    if not isinstance(source_drift, str) or source_drift not in SOURCE_DRIFT_POLICIES:
        raise PlanInputError('source_drift: %s is not one of %s' % (_shown(source_drift), ', '.join(SOURCE_DRIFT_POLICIES)))
    if exclude is not None and not isinstance(exclude, (list, tuple)):
        raise PlanInputError('exclude: %s is not a list of node names or globs' % _shown(exclude))
    exclude = list(exclude or ())
    for pat in exclude:
        if not isinstance(pat, str) or not pat:
            raise PlanInputError('exclude: %r is not a node name or glob' % (pat,))
    fa = failure_allowance or {}
    if not isinstance(fa, dict) or set(fa) - {'nodes', 'gpus'}:
        raise PlanInputError('failure_allowance: %r must be a dict with keys nodes and/or gpus' % (failure_allowance,))

    parsed: List[_Node] = []
    seen: Dict[str, int] = {}
    for i, raw in enumerate(nodes):
        n = _Node(raw, i)
        if n.name in seen:
            raise PlanInputError('nodes[%d].name: %r repeats nodes[%d]' % (i, n.name, seen[n.name]))
        seen[n.name] = i
        parsed.append(n)
    parsed.sort(key=lambda n: n.sort_key)

    pool_nodes = len(parsed)
    pool_gpus = sum(n.gpus for n in parsed)
    excluded = [n for n in parsed if any(fnmatch.fnmatchcase(n.name, p) for p in exclude)]
    excluded_names = set(n.name for n in excluded)
    up_to_date = [n for n in parsed if n.name not in excluded_names and not _needs_upgrade(n, target)]
    up_names = set(n.name for n in up_to_date)
    todo = [n for n in parsed if n.name not in excluded_names and n.name not in up_names]

    bs = resolve_count(batch_size, pool_nodes, 'batch_size')
    if bs['resolved'] < 1:
        bs['rule'] += ', raised to the minimum of 1'
        bs['resolved'] = 1
    mu = resolve_count(max_unavailable, pool_nodes, 'max_unavailable')
    fa_nodes = resolve_count(fa['nodes'], pool_nodes, 'failure_allowance.nodes', round_up=True) if 'nodes' in fa else None
    fa_gpus = resolve_count(fa['gpus'], pool_gpus, 'failure_allowance.gpus', round_up=True) if 'gpus' in fa else None

    problems: List[str] = []
    warnings: List[str] = []
    single_node = pool_nodes == 1 and len(todo) == 1
    if single_node:
        only = todo[0]
        if not single_node_pool_acknowledged:
            problems.append(
                'single-node GPU pool: upgrading %s takes all %d GPU(s) of the pool offline for the maintenance '
                'window; set single_node_pool_acknowledged=true to accept that (seed 004, step 2)' % (only.name, only.gpus))
        else:
            # Only a percentage that rounded down to 0 is raised; an explicit 0 (or 0%) still refuses below.
            mu_number, mu_percent = _parse_count(max_unavailable, 'max_unavailable')
            if mu['resolved'] < 1 and mu_percent and mu_number > 0:
                mu['rule'] += '; single-node pool acknowledged: the whole pool (1) may be unavailable'
                mu['resolved'] = 1
            warnings.append('single-node GPU pool acknowledged: %s and its %d GPU(s) are offline for the '
                            'maintenance window' % (only.name, only.gpus))
    if mu['resolved'] == 0 and todo and (single_node_pool_acknowledged or not single_node):
        problems.append('max_unavailable resolves to 0 (%s): no node may leave service, so nothing can be upgraded'
                        % mu['rule'])

    # ---- matrix
    groups: Dict[Tuple[str, ...], List[_Node]] = {}
    for n in todo:
        groups.setdefault(tuple(n.key_value(k) for k in keys), []).append(n)
    combinations: List[Dict[str, Any]] = []
    canaries: List[str] = []
    omitted: List[Dict[str, Any]] = []
    undersampled: List[Dict[str, Any]] = []
    canary_nodes: List[_Node] = []
    drift: List[Dict[str, Any]] = []
    parts: List[Tuple[Tuple[str, ...], Dict[str, Any], str, List[_Node], List[Dict[str, Any]]]] = []
    for values in sorted(groups):
        key = dict(zip(keys, values))
        cid = '|'.join('%s=%s' % (k, v) for k, v in zip(keys, values))
        found = _source_drift(cid, key, groups[values])
        if found is None:
            parts.append((values, key, cid, groups[values], _source_tuples(groups[values])))
            continue
        found['action'] = source_drift
        drift.append(found)
        if source_drift == 'refuse':
            problems.append(_drift_refusal(found))
            parts.append((values, key, cid, groups[values], _source_tuples(groups[values])))
            continue
        ids: List[str] = []
        for number, source in enumerate(found['sources'], 1):
            shown = [(c, _key_text(source['tuple'].get(c))) for c in found['components']]
            part_key = dict(key, **dict(('source.%s' % c, v) for c, v in shown))
            part_id = cid + ''.join('|source.%s=%s' % (c, v) for c, v in shown)
            if part_id in ids:  # values that print alike (a missing field and null): the part's number tells them apart
                part_id += '|source=%d' % number
                part_key['source'] = str(number)
            ids.append(part_id)
            names = set(source['nodes'])
            parts.append((values, part_key, part_id, [n for n in groups[values] if n.name in names], [source['tuple']]))
        warnings.append('combination %s runs %d source tuples (drift in %s): split into %d combinations, each with '
                        'its own canary(ies) (source_drift=split); they share the PCI identity %s, and the canary '
                        'playbook keeps one evidence bundle and one qualification record per PCI identity'
                        % (cid, len(found['sources']), ', '.join(found['components']), len(found['sources']),
                           key.get('pci_ids', '(not a combination key)')))
    for values, key, cid, members, source_tuples in parts:
        eligible = [n for n in members if n.ready]
        eligible.sort(key=lambda n: (n.rke2_server, n.unschedulable, (n.holders or 0) > 0, n.holders or 0, n.sort_key))
        chosen = eligible[:canaries_per_combination]
        chosen_names = sorted((n.name for n in chosen), key=natural_key)
        combo = {
            'id': cid, 'key': key, 'nodes': [n.name for n in members], 'count': len(members),
            'gpus': sum(n.gpus for n in members), 'canaries': chosen_names,
            'source_tuples': source_tuples, 'target': target,
        }
        combinations.append(combo)
        if not chosen:
            reason = ('canaries_per_combination is 0' if canaries_per_combination == 0
                      else 'no Ready node in the combination')
            omitted.append({'id': cid, 'key': key, 'count': len(members), 'nodes': combo['nodes'], 'reason': reason})
        elif len(chosen) < canaries_per_combination:
            undersampled.append({'id': cid, 'key': key, 'count': len(members), 'canaries': len(chosen),
                                 'wanted': canaries_per_combination,
                                 'reason': ('only %d Ready node(s) of %d' % (len(chosen), len(members)))})
        canary_nodes.extend(chosen)
        for n in chosen:
            if n.unschedulable or (n.holders or 0) > 0:
                warnings.append('canary %s of %s was picked although it is %s' % (
                    n.name, cid, ', '.join(x for x in (
                        'already cordoned' if n.unschedulable else '',
                        ('holding %d GPU workload(s)' % n.holders) if (n.holders or 0) > 0 else '') if x)))
    canary_nodes.sort(key=lambda n: n.sort_key)
    canaries = [n.name for n in canary_nodes]
    # RKE2 upgrades the servers before the agents (an agent may not be newer than the control plane; suc_plan refuses
    # it, after the node was drained): agents that move RKE2 wait for every GPU server of the plan to be at the target.
    target_rke2 = target.get('rke2') if isinstance(target, dict) else None
    if target_rke2:
        behind = [n.name for n in todo if n.rke2_server and n.current.get('rke2') != target_rke2]
        moving = [n.name for n in todo if not n.rke2_server and n.current.get('rke2') != target_rke2]
        if behind and moving:
            problems.append('the target moves RKE2 to %s on agents (%s) while GPU nodes that are RKE2 servers (%s) run an '
                            'older RKE2: RKE2 upgrades every server before any agent, and the canaries are agents. '
                            'Upgrade the servers first, in a plan of their own (gpufleet_node_selector or exclude '
                            'selecting them), then plan the agents' % (
                                target_rke2, _names(sorted(moving, key=natural_key)),
                                _names(sorted(behind, key=natural_key))))
    server_canaries = [n.name for n in canary_nodes if n.rke2_server]
    if len(server_canaries) > 1:
        # The canaries are upgraded together: two RKE2 servers down at once can cost etcd its quorum.
        problems.append('canaries %s are RKE2 servers (etcd members; their Nodes carry a control-plane, etcd or master '
                        'label), and the canaries are upgraded together: at most one server may be out of service at a '
                        'time. Their combinations have no agent to take instead; exclude all but one of them (exclude) '
                        'and plan them after this rollout' % ', '.join(server_canaries))
    if omitted:
        msg = 'combination(s) without a canary: %s' % '; '.join(
            '%s (%d node(s): %s)' % (o['id'], o['count'], o['reason']) for o in omitted)
        if omitted_block:
            problems.append(msg + '; set omitted_block=false to accept the omission')
        else:
            warnings.append(msg + ' (accepted: omitted_block=false)')

    # ---- batches and budget
    out_now = [n for n in parsed if n.out_of_service]
    out_set = set(n.name for n in out_now)
    in_service_gpus = pool_gpus - sum(n.gpus for n in out_now)
    min_nodes = fa_nodes['resolved'] if fa_nodes else 0
    min_gpus = fa_gpus['resolved'] if fa_gpus else 0
    if todo and fa_nodes and pool_nodes - len(out_now) < min_nodes:
        problems.append('failure_allowance.nodes: %d node(s) in service now, below the %d that must stay in '
                        'service (%s)' % (pool_nodes - len(out_now), min_nodes, fa_nodes['rule']))
    if todo and fa_gpus and in_service_gpus < min_gpus:
        problems.append('failure_allowance.gpus: %d GPU(s) in service now, below the %d that must stay in '
                        'service (%s)' % (in_service_gpus, min_gpus, fa_gpus['rule']))

    canary_set = set(canaries)
    rest = [n for n in todo if n.name not in canary_set]
    reasons = dict((n.name, n.out_reason()) for n in out_now)
    state = {'out': set(out_set), 'out_gpus': pool_gpus - in_service_gpus}
    batches: List[List[str]] = []
    steps: List[Dict[str, Any]] = []

    def cut(phase: str, queue: List[_Node]) -> None:
        i = 0
        while i < len(queue) and not problems:
            batch: List[_Node] = []
            adds = 0
            add_gpus = 0
            limited_by = 'end of %s nodes' % phase
            while i < len(queue):
                n = queue[i]
                cost = 0 if n.name in state['out'] else 1
                cost_gpus = 0 if n.name in state['out'] else n.gpus
                unavailable = len(state['out']) + adds + cost
                in_nodes = pool_nodes - unavailable
                in_gpus = pool_gpus - state['out_gpus'] - add_gpus - cost_gpus
                why = None
                if len(batch) + 1 > bs['resolved']:
                    why = 'batch_size'
                elif unavailable > mu['resolved']:
                    why = 'max_unavailable'
                elif in_nodes < min_nodes:
                    why = 'failure_allowance.nodes'
                elif in_gpus < min_gpus:
                    why = 'failure_allowance.gpus'
                elif n.rke2_server and any(b.rke2_server for b in batch):
                    why = 'one_rke2_server'   # etcd keeps its quorum: one server per batch
                if why:
                    limited_by = why
                    if not batch:
                        problems.append(_stuck_reason(why, n, state, mu, pool_nodes, pool_gpus, min_nodes,
                                                      min_gpus, fa_nodes, fa_gpus, reasons))
                    break
                batch.append(n)
                adds += cost
                add_gpus += cost_gpus
                i += 1
            if not batch:
                return
            unavailable = len(state['out']) + adds
            isolated = sorted(state['out'] & canary_set, key=natural_key)
            steps.append({
                'batch': len(batches) + 1, 'phase': phase, 'nodes': len(batch),
                'out_of_service_before': len(state['out']),
                'canaries_isolated_before': len(isolated),
                'taken_out_of_service': adds,
                'unavailable_during': unavailable, 'max_unavailable': mu['resolved'],
                'in_service_nodes_during': pool_nodes - unavailable,
                'in_service_gpus_during': pool_gpus - state['out_gpus'] - add_gpus,
                'min_in_service_nodes': min_nodes, 'min_in_service_gpus': min_gpus,
                'limited_by': limited_by,
                'shrunk': limited_by not in ('batch_size',) and not limited_by.startswith('end of'),
            })
            batches.append([n.name for n in batch])
            if phase == 'canary' and canaries_isolated:
                for n in batch:
                    if n.name not in state['out']:
                        state['out'].add(n.name)
                        state['out_gpus'] += n.gpus
                        reasons[n.name] = 'canary still isolated'

    if todo and not problems:
        cut('canary', canary_nodes)
    if todo and not problems:
        cut('rollout', rest)
    if not problems:
        try:
            check_pauses(pauses, len(batches))
        except PauseError as exc:
            problems.append(str(exc))

    budget = {
        'pool_nodes': pool_nodes, 'pool_gpus': pool_gpus,
        'batch_size': bs, 'max_unavailable': mu,
        'failure_allowance': {'nodes': fa_nodes, 'gpus': fa_gpus},
        'out_of_service_now': [{'name': n.name, 'reason': n.out_reason(), 'gpus': n.gpus} for n in out_now],
        'canaries_isolated': canaries_isolated,
        'steps': steps,
    }
    plan: Dict[str, Any] = {
        'target': target,
        'policy': {
            'canaries_per_combination': canaries_per_combination, 'batch_size': batch_size,
            'max_unavailable': max_unavailable, 'failure_allowance': failure_allowance,
            'combination_keys': list(keys), 'exclude': exclude, 'omitted_block': omitted_block,
            'single_node_pool_acknowledged': single_node_pool_acknowledged,
            'canaries_isolated': canaries_isolated, 'pause_before': pauses, 'source_drift': source_drift,
        },
        # What every drain of the canary and the rollout applies (_drain_policy), reviewed with the plan.
        'drain': drain,
        # Batches (numbered from 1, as the summary numbers them) that wait for an approval before they start.
        'pauses': pauses,
        # The observation window's length and queries (minimum traffic, control group) after every stage.
        'observation': observed,
        'combinations': combinations, 'canaries': canaries, 'omitted': omitted,
        'undersampled': undersampled,
        # Combinations (by the combination keys) whose nodes run different current tuples, what was done
        # (split or refused), and the nodes of each source tuple.
        'source_drift': drift,
        'excluded': [n.name for n in excluded], 'up_to_date': [n.name for n in up_to_date],
        'batches': batches if not problems else [],
        'batch_size': bs['resolved'], 'max_unavailable': mu['resolved'],
        'budget': budget, 'warnings': warnings, 'problems': problems,
    }
    plan['digest'] = digest_of(plan)
    plan['summary'] = render_summary(plan)
    if problems:
        raise PlanRefused(problems, plan)
    return plan


def _source_tuples(members: Sequence[_Node]) -> List[Dict[str, Any]]:
    """The distinct current tuples of `members`, in canonical-JSON order."""
    distinct: Dict[Any, Dict[str, Any]] = {}
    for n in members:
        distinct.setdefault(_tuple_key(n.current), n.current)
    return [cur for dummy, cur in sorted((_canonical(cur), cur) for cur in distinct.values())]


def _key_text(value: Any) -> str:
    """A tuple value as a combination key's text: strings as they are, anything else as canonical JSON."""
    return value if isinstance(value, str) else _canonical(value)


def _source_drift(cid: str, key: Dict[str, Any], members: Sequence[_Node]) -> Optional[Dict[str, Any]]:
    """Source-tuple drift inside one combination: None when its nodes all run the same current tuple; else
    {id, key, components (the tuple fields whose values differ, sorted), sources: [{tuple, nodes}] in
    canonical-JSON order of the tuples, nodes in natural order}."""
    by_tuple: Dict[Any, Dict[str, Any]] = {}
    for n in members:
        by_tuple.setdefault(_tuple_key(n.current), {'tuple': n.current, 'nodes': []})['nodes'].append(n.name)
    if len(by_tuple) < 2:
        return None
    sources = sorted(by_tuple.values(), key=lambda e: _canonical(e['tuple']))
    fields = sorted(set(f for s in sources for f in s['tuple']))
    # A field one tuple lacks differs from any value (None included) of another.
    components = [f for f in fields
                  if len(set(_canonical(s['tuple'][f]) if f in s['tuple'] else None for s in sources)) > 1]
    return {'id': cid, 'key': key, 'components': components, 'sources': sources}


def _drift_refusal(found: Dict[str, Any]) -> str:
    """The refusal of a combination with source-tuple drift: the combination, then each source tuple's
    differing values and its nodes."""
    shown = []
    for source in found['sources']:
        values = ', '.join('%s %s' % (c, _key_text(source['tuple'].get(c))) if c in source['tuple']
                           else '%s (none)' % c for c in found['components'])
        shown.append('%s on %d node(s): %s' % (values, len(source['nodes']), _names(source['nodes'])))
    return ('source-tuple drift in combination %s (differing: %s): %s; one canary qualifies one exact source tuple - '
            'plan with source_drift=split (each source tuple its own combination and canary), or bring the nodes '
            'to one tuple or exclude some, and re-plan' % (found['id'], ', '.join(found['components']), '; '.join(shown)))


def _stuck_reason(why: str, n: _Node, state: Dict[str, Any], mu: Dict[str, Any],
                  pool_nodes: int, pool_gpus: int, min_nodes: int, min_gpus: int,
                  fa_nodes: Optional[Dict[str, Any]], fa_gpus: Optional[Dict[str, Any]],
                  reasons: Dict[str, str]) -> str:
    out = sorted(state['out'], key=natural_key)
    shown = ', '.join('%s: %s' % (name, reasons.get(name, 'out')) for name in out[:_SUMMARY_NAMES])
    shown += ', ...' if len(out) > _SUMMARY_NAMES else ''
    if why == 'max_unavailable':
        return ('cannot proceed at node %s: %d node(s) already out of service (%s) + 1 = %d > max_unavailable %d (%s); '
                'raise max_unavailable to at least %d, or return nodes to service'
                % (n.name, len(out), shown, len(out) + 1, mu['resolved'], mu['rule'], len(out) + 1))
    if why == 'failure_allowance.nodes':
        return ('cannot proceed at node %s: taking it out leaves %d node(s) in service, below failure_allowance.nodes '
                '%d (%s)' % (n.name, pool_nodes - len(out) - 1, min_nodes, fa_nodes['rule'] if fa_nodes else ''))
    left = pool_gpus - state['out_gpus'] - n.gpus
    return ('cannot proceed at node %s: taking its %d GPU(s) out leaves %d GPU(s) in service, below '
            'failure_allowance.gpus %d (%s)' % (n.name, n.gpus, left, min_gpus, fa_gpus['rule'] if fa_gpus else ''))


# --------------------------------------------------------------------------------------------
# The human summary


def _names(names: Sequence[str]) -> str:
    if len(names) <= _SUMMARY_NAMES:
        return ', '.join(names)
    return '%s, … (+%d)' % (', '.join(names[:_SUMMARY_NAMES]), len(names) - _SUMMARY_NAMES)


def _md(text: Any) -> str:
    return str(text).replace('|', '\\|')


# ------------------------------------------------------------------------------- the live tuple
# The plan's source tuples are what the nodes ran when it was made; the gate and every batch re-read the nodes
# (issue 39 item 4) and refuse a node that runs anything else now - a kernel moved by unattended-upgrades, an RKE2
# patch applied by hand, a driver changed outside the rollout - before it moves: the canary qualified the path from
# the combination's source tuple, not from what the node runs now.
GFD_DRIVER_LABELS = ('nvidia.com/cuda.driver.major', 'nvidia.com/cuda.driver.minor', 'nvidia.com/cuda.driver.rev')


def node_live_tuple(facts: Dict[str, Any]) -> Dict[str, Optional[str]]:
    """What a Node says it runs now (fleet_info's node facts): the kernel (``nodeInfo.kernelVersion``), RKE2 (the
    kubelet version) and the driver from GPU Feature Discovery's labels (None without them)."""
    labels = facts.get('labels') if isinstance(facts.get('labels'), dict) else {}
    parts = [labels.get(k) for k in GFD_DRIVER_LABELS]
    return {'kernel': facts.get('kernel') or None, 'rke2': facts.get('rke2') or None,
            'driver': '.'.join(str(x) for x in parts) if all(parts) else None}


def live_tuple_problems(plan: Dict[str, Any], nodes: Any, names: Optional[Sequence[str]] = None) -> List[str]:
    """Every node of the plan (of ``names`` when given) whose Node (``nodes``: fleet_info's node facts) runs a
    component that is neither its combination's source nor the target: one problem each, naming the node, the
    component, what runs and what the plan allows. A node absent from ``nodes`` is not judged here (the batch
    admission refuses it). Empty: every node still runs a tuple the plan's qualification covers."""
    if not isinstance(plan, dict):
        raise PlanInputError('plan: %s is not a plan (a mapping)' % show(plan, 80))
    if not isinstance(nodes, list):
        raise PlanInputError('nodes: %s is not a list of node facts' % show(nodes, 80))
    by_name = dict((n.get('name'), n) for n in nodes if isinstance(n, dict))
    wanted = None if names is None else set(names)
    target = plan.get('target') if isinstance(plan.get('target'), dict) else {}
    problems: List[Tuple[Any, str]] = []
    for combo in plan.get('combinations') or []:
        sources = combo.get('source_tuples') or []
        if not sources or not isinstance(sources[0], dict):
            continue
        source = sources[0]
        for name in combo.get('nodes') or []:
            if (wanted is not None and name not in wanted) or name not in by_name:
                continue
            for comp, value in sorted(node_live_tuple(by_name[name]).items()):
                if value is None or comp not in source or value in (source.get(comp), target.get(comp)):
                    continue
                problems.append((natural_key(name), 'node %s runs %s %s now (as its Node says), but the plan has %s from '
                                 'source %s to target %s (combination %s): it changed since the plan, and no canary '
                                 'qualified that tuple; re-plan (plan.yml) and qualify it' % (
                                     name, comp, value, comp, source.get(comp), target.get(comp), combo.get('id'))))
    return [msg for _key, msg in sorted(problems)]


def render_summary(plan: Dict[str, Any]) -> str:
    """Markdown: the matrix, canaries, omissions, and the batch arithmetic step by step."""
    b = plan['budget']
    lines: List[str] = ['# Upgrade plan', '']
    if plan['target']:
        lines.append('Target tuple: ' + ', '.join('%s `%s`' % (k, v) for k, v in sorted(plan['target'].items())))
    lines.append('Pool: %d node(s), %d GPU(s); %d to upgrade in %d combination(s); %d already at target; %d excluded.'
                 % (b['pool_nodes'], b['pool_gpus'], sum(c['count'] for c in plan['combinations']),
                    len(plan['combinations']), len(plan['up_to_date']), len(plan['excluded'])))
    lines.append('Digest: `%s`' % plan['digest'])
    lines += ['', '## Arithmetic', '',
              '- batch size: %s → **%d** node(s) per batch' % (b['batch_size']['rule'], plan['batch_size']),
              '- max unavailable (separate from batch size): %s → **%d** node(s) out of service at most'
              % (b['max_unavailable']['rule'], plan['max_unavailable'])]
    for what in ('nodes', 'gpus'):
        fa = b['failure_allowance'][what]
        if fa:
            lines.append('- failure allowance: %s → at least **%d** %s stay in service'
                         % (fa['rule'], fa['resolved'], 'node(s)' if what == 'nodes' else 'GPU(s)'))
    oos = b['out_of_service_now']
    lines.append('- out of service now: %d%s' % (len(oos), (' (' + ', '.join(
        '%s: %s' % (o['name'], o['reason']) for o in oos[:_SUMMARY_NAMES]) + (', …' if len(oos) > _SUMMARY_NAMES else '') + ')') if oos else ''))
    lines.append('- canaries %s' % ('stay isolated (out of service) until the rollout ends' if b['canaries_isolated']
                                    else 'return to service after the canary phase'))
    obs = plan.get('observation') or {}
    lines.append('- observation window after each stage: %s%s' % (
        '`%s`' % obs['window'] if obs.get('window') else 'the run\'s `gpufleet_observation_window`',
        '; re-gates every node upgraded so far with %s' % ', '.join(
            '`%s` (%s)' % (q.get('name'), 'traffic >= %s' % q['min_count'] if q.get('count_expr') else
                           'against the control group' if q.get('control') else 'against %s' % (
                               'a baseline' if q.get('baseline') else 'a limit'))
            for q in obs['queries']) if obs.get('queries') else '')
        + ('; re-runs the workload case(s) %s x%d on every node upgraded so far' % (
            ', '.join('`%s`' % n for n in obs['workloads']['cases']), obs['workloads']['repeat'])
           if obs.get('workloads') else ''))
    lines += ['', '## Matrix', '', '| combination | nodes | GPUs | canaries | source tuple(s) |', '|---|---|---|---|---|']
    for c in plan['combinations']:
        src = '; '.join(', '.join('%s %s' % (k, v) for k, v in sorted(s.items())) for s in c['source_tuples'])
        lines.append('| %s | %d | %d | %s | %s |' % (_md(c['id']), c['count'], c['gpus'],
                                                     _md(', '.join(c['canaries']) or '—'), _md(src or '—')))
    if plan.get('source_drift'):
        lines += ['', '## Source-tuple drift', '']
        for d in plan['source_drift']:
            action = 'split' if d['action'] == 'split' else 'refused'
            lines.append('- %s (differing: %s; %s):' % (_md(d['id']), ', '.join(d['components']), action))
            for source in d['sources']:
                values = ', '.join('%s %s' % (c, _key_text(source['tuple'].get(c))) for c in d['components'])
                lines.append('  - %s: %d node(s), %s' % (_md(values), len(source['nodes']), _md(_names(source['nodes']))))
    if plan['omitted']:
        lines += ['', '## Omitted combinations (no canary)', '']
        for o in plan['omitted']:
            lines.append('- %s: %d node(s), %s' % (_md(o['id']), o['count'], o['reason']))
    if plan['undersampled']:
        lines += ['', '## Combinations with fewer canaries than asked', '']
        for u in plan['undersampled']:
            lines.append('- %s: %d of %d canaries (%s)' % (_md(u['id']), u['canaries'], u['wanted'], u['reason']))
    lines += ['', '## Batches', '',
              '| # | phase | nodes | out before | taken out | unavailable during (≤ max) | in service during | limited by |',
              '|---|---|---|---|---|---|---|---|']
    for s, names in zip(b['steps'], plan['batches']):
        if s['batch'] in plan.get('pauses', ()):
            lines.append('| ⏸ | pause | waits for an approval before batch %d starts | | | | | |' % s['batch'])
        lines.append('| %d | %s | %d: %s | %d | %d | %d + %d = %d ≤ %d | %d nodes, %d GPUs | %s%s |' % (
            s['batch'], s['phase'], s['nodes'], _md(_names(names)), s['out_of_service_before'],
            s['taken_out_of_service'], s['out_of_service_before'], s['taken_out_of_service'],
            s['unavailable_during'], s['max_unavailable'], s['in_service_nodes_during'],
            s['in_service_gpus_during'], s['limited_by'], ' (shrunk)' if s['shrunk'] else ''))
    if plan['warnings']:
        lines += ['', '## Warnings', ''] + ['- ' + w for w in plan['warnings']]
    if plan['problems']:
        lines += ['', '## Refused', ''] + ['- ' + p for p in plan['problems']]
    lines += ['', 'Stop rule: one failed critical gate stops expansion, whatever the aggregate metrics say.', '']
    return '\n'.join(lines)


def planner_nodes(fleet: Dict[str, Any], gpu_facts: Dict[str, Any], holders: Optional[Dict[str, Any]] = None,
                  install_method: str = 'apt') -> List[Dict[str, Any]]:
    """The planner's input (build_plan's `nodes`): fleet_info's view of each node (kernel, RKE2, readiness,
    cordon, allocatable GPUs, labels) joined with the host's NVML facts (`gpu_facts`: node name ->
    gpu_info's result; PCI identities, driver, MIG) and gpu_holders_info's count (`holders`: by_node).

    A node without NVML facts (no inventory host, or gpu_info not run) gets the PCI identity
    ``unknown`` and no driver: it forms its own combination, which the plan then shows. (A Node label
    cannot carry a PCI id: ':' is not valid in a label value.)

    The platform is `_platform.node_platform`'s: the Node's `gpufleet.io/platform` label, else its instance type,
    else the host's DMI identity (gpu_info's `dmi`), else ``unknown``."""
    if not isinstance(fleet, dict) or not isinstance(fleet.get('nodes'), list):
        raise PlanInputError('fleet: %r is not fleet_info\'s result (no nodes list)' % (fleet,))
    cluster = fleet.get('cluster') or {}
    holders = holders or {}
    out: List[Dict[str, Any]] = []
    for i, n in enumerate(fleet['nodes']):
        if not isinstance(n, dict) or not isinstance(n.get('name'), str):
            raise PlanInputError('fleet.nodes[%d]: %r is not a node with a name' % (i, n))
        facts = gpu_facts.get(n['name']) if hasattr(gpu_facts, 'get') else None
        facts = facts if isinstance(facts, dict) else {}
        mig = any(((g or {}).get('mig_mode') or {}).get('current') for g in facts.get('gpus') or [])
        out.append({
            'name': n['name'], 'pci_ids': list(facts.get('pci_ids') or ['unknown']),
            'platform': node_platform(n.get('labels'), facts.get('dmi')), 'kernel': n.get('kernel'),
            'partition_mode': 'mig' if mig else 'none', 'install_method': install_method,
            'current': {'kernel': n.get('kernel'), 'rke2': n.get('rke2'), 'driver': facts.get('driver_version'),
                        'gpu_operator': cluster.get('gpu_operator'), 'dcgm_exporter': cluster.get('dcgm_exporter')},
            'ready': n.get('ready'), 'unschedulable': n.get('unschedulable'), 'gpus': n.get('gpus'),
            'holders': int(((holders.get(n['name']) or {}).get('total')) or 0), 'labels': n.get('labels') or {},
        })
    return out
