# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Used by plugins/filter/rollout.py.
"""The decisions the rollout, canary and rollback playbooks and the node_upgrade role take between
module calls: file names derived from a tuple, the verdict of a node's gates, and a node's entry in
the rollout's evidence bundle. Pure functions; the playbooks call them as filters."""
from __future__ import annotations

import datetime
import hashlib
import math
import re
from typing import Any, Dict, List, Optional, Sequence, Union

from ._duration import parse_seconds
from ._evidence import rfc3339, utcnow
from ._node_record import ANN_DONE, ANN_TARGET, evidence_phases, finished, step
from ._plan import PlanInputError, check_observation, check_plan
from ._upgrade_state import target_key


class RolloutError(ValueError):
    pass


def pci_slug(pci_ids: Union[str, Sequence[str]]) -> str:
    """The file-name form of a combination's PCI ids (``10de:2330,10de:2331`` -> ``10de2330-10de2331``),
    as the canary playbook names qualification records: ``<slug>.yaml``."""
    if isinstance(pci_ids, (list, tuple)):
        pci_ids = ','.join(str(p) for p in pci_ids)
    if not isinstance(pci_ids, str) or not pci_ids.strip():
        raise RolloutError('pci_ids: %r is not a PCI id list (e.g. 10de:2330 or 10de:2330,10de:2331)' % (pci_ids,))
    return re.sub(r'[/,]', '-', pci_ids.replace(':', ''))


def combination_slug(combination: Dict[str, Any]) -> str:
    """The file-name form of a plan combination: its ``pci_slug``, and for a part of a combination the planner split
    by source-tuple drift (``source_drift: split``: a key with ``source.<component>`` values) those values after it
    (``10de2330-10de16c1--kernel-6.8.0-133-generic``, lower case, every character but letters, digits, ``.`` and ``-``
    as ``-``: the record's id carries it), so each part's canary evidence and qualification record is a file of its
    own. An unsplit combination's slug is its ``pci_slug``, as before."""
    key = combination.get('key') if isinstance(combination, dict) else None
    if not isinstance(key, dict) or 'pci_ids' not in key:
        raise RolloutError('combination: %r is not a plan combination (a mapping with key.pci_ids)' % (combination,))
    base = pci_slug(key['pci_ids'])
    parts = sorted((k, v) for k, v in key.items() if k == 'source' or k.startswith('source.'))
    if not parts:
        return base
    text = '-'.join('%s-%s' % (k[len('source.'):] if k.startswith('source.') else k, v) for k, v in parts)
    text = re.sub(r'[^a-z0-9.-]+', '-', text.lower())   # a record id's characters
    if len(text) > 80:
        text = hashlib.sha256(text.encode()).hexdigest()[:16]
    return '%s--%s' % (base, text)


def snapshot_file(directory: str, node: str, target: Dict[str, Any]) -> str:
    """The rollback snapshot of `node` for `target`: one file per node and target, so a later
    rollout's baseline and rollback never come from before an earlier one."""
    if not isinstance(node, str) or not node or '/' in node or node in ('.', '..'):
        raise RolloutError('node: %r is not a node name' % (node,))
    if not isinstance(directory, str) or not directory:
        raise RolloutError('directory: %r is not the snapshot directory' % (directory,))
    slug = re.sub(r'[^A-Za-z0-9._-]+', '_', target_key(target))
    # the directory without its trailing slashes, then one: '/' gives '/<file>', not '//<file>'
    return '%s/%s--%s.json' % (str(directory).rstrip('/'), node, slug)


GATE_NAMES = ('gpu', 'node', 'tuple', 'metric', 'workload', 'gpu_after_workload')
# The evidence kind of a gate whose name is not its kind (the GPU gate again after the workload gate).
GATE_KINDS = {'gpu_after_workload': 'gpu'}
TUPLE_KEYS = ('kernel', 'rke2', 'driver', 'gpu_operator', 'dcgm_exporter')


def _version(value: Any) -> str:
    """A component version compared as released: `v1.36.1+rke2r1` and `1.36.1+rke2r1` are one."""
    return re.sub(r'^v', '', str(value).strip())


def measured_tuple(booted: Optional[Dict[str, Any]], gpu_after: Optional[Dict[str, Any]],
                   node_gate: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The tuple a node runs after activation, as measured: the kernel from the host
    (kernel_boot state=verify: /proc/sys/kernel/osrelease; the kubelet's report when the host was not
    read), the driver from the host (gpu_info after the change: NVML), RKE2, the GPU Operator and the
    DCGM exporter from the cluster (node_gate's `measured`: the kubelet's version, the operator's
    image, the exporter pod on the node). `kubelet_kernel` is what the kubelet reports."""
    cluster = (node_gate or {}).get('measured') or {}
    verification = (booted or {}).get('verification') or {}
    host_kernel = verification.get('running_kernel') if not (booted or {}).get('skipped') else None
    return {
        'kernel': host_kernel or cluster.get('kernel') or None,
        'rke2': cluster.get('rke2') or None,
        'driver': (gpu_after or {}).get('driver_version') or None,
        'gpu_operator': cluster.get('gpu_operator') or None,
        'dcgm_exporter': cluster.get('dcgm_exporter') or None,
        'kubelet_kernel': cluster.get('kernel') or None,
    }


def tuple_gate(target: Dict[str, Any], measured: Dict[str, Any]) -> Dict[str, Any]:
    """Whether the measured tuple (measured_tuple) is the target: every component the target names,
    and the kernel the kubelet reports. A gate result ({passed, msg, problems, measured})."""
    if not isinstance(target, dict) or not target:
        raise RolloutError('target: %r is not a tuple' % (target,))
    if not isinstance(measured, dict):
        raise RolloutError('measured: %r is not a measured tuple' % (measured,))
    problems: List[str] = []
    for key in TUPLE_KEYS:
        want = target.get(key)
        if want in (None, ''):
            continue
        have = measured.get(key)
        if have in (None, ''):
            problems.append('%s: could not be measured (target %s)' % (key, want))
        elif _version(have) != _version(want):
            problems.append('%s: measured %s, target %s' % (key, have, want))
    kubelet = measured.get('kubelet_kernel')
    if target.get('kernel') and kubelet and kubelet != measured.get('kernel'):
        problems.append('kernel: the kubelet reports %s, the host runs %s' % (kubelet, measured.get('kernel')))
    after = dict((k, measured.get(k)) for k in TUPLE_KEYS)
    if problems:
        msg = 'tuple gate: FAIL: %s' % '; '.join(problems)
    else:
        msg = 'tuple gate: the node runs the target (%s)' % ', '.join(
            '%s %s' % (k, after[k]) for k in TUPLE_KEYS if target.get(k))
    return {'passed': not problems, 'problems': problems, 'measured': after, 'msg': msg}


def _problems(value: Any, default: List[str]) -> List[str]:
    """A gate result's `problems` as a list of strings: one string is one problem (not its characters)."""
    if not value:
        return list(default)
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [str(p) for p in value]
    raise RolloutError('problems: %r is not a list of strings' % (value,))


def gate_results(results: Dict[str, Any], node: str, finished: Optional[str] = None) -> Dict[str, Any]:
    """The verdict of a node's gates from their registered results (name -> result; a skipped or
    absent gate is not counted): the evidence bundle's gate entries, whether every gate that ran
    passed, and the failure message naming each failed gate."""
    if not isinstance(results, dict):
        raise RolloutError('results: expected a mapping of gate name to registered result, got %s'
                           % type(results).__name__)
    finished = finished or rfc3339(utcnow())
    entries: List[Dict[str, Any]] = []
    failed: List[str] = []
    for name in GATE_NAMES:
        r = results.get(name)
        if not isinstance(r, dict) or r.get('skipped') or not r:
            continue
        ok = r.get('passed') is True
        msg = str(r.get('msg') or '')
        entries.append({'name': name, 'kind': GATE_KINDS.get(name, name), 'node': node, 'passed': ok, 'finished': finished,
                        'problems': _problems(r.get('problems'), [] if ok else [msg or 'failed']),
                        'result': {'msg': msg}})
        if not ok:
            failed.append(msg or '%s gate: failed' % name)
    return {'evidence': entries, 'passed': not failed and bool(entries),
            'msg': 'critical gate failed on %s: %s' % (node, '; '.join(failed)) if failed else
            ('no gate ran on %s' % node if not entries else 'every gate passed on %s' % node)}


def judge_tuple(target: Dict[str, Any], booted: Optional[Dict[str, Any]], gpu_after: Optional[Dict[str, Any]],
                node_gate: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The tuple gate over the registered results (the filter tuple_gate): skipped, with what was
    measured, when the node gate did not run (an earlier gate failed: the cluster side was not read)."""
    measured = measured_tuple(booted, gpu_after, node_gate)
    if not node_gate or node_gate.get('skipped') or 'measured' not in node_gate:
        return {'skipped': True, 'measured': dict((k, measured.get(k)) for k in TUPLE_KEYS),
                'msg': 'tuple gate: not judged (the node gate did not run)'}
    return tuple_gate(target, measured)


def node_entry(plan: Dict[str, Any], host: str, result: Optional[Dict[str, Any]] = None,
               kubelet: Optional[Dict[str, Any]] = None, failed_phase: Optional[str] = None,
               message: str = '', started: Optional[str] = None, dra: bool = False,
               finished: Optional[str] = None) -> Dict[str, Any]:
    """A node's entry in the rollout's evidence bundle.

    `result` is node_upgrade's public result (node_upgrade_result; absent when the role failed before
    its upgrade block), `kubelet` what the node's kubelet reports now (kernel, rke2, and the node's
    identity: uid, machine_id, system_uuid, copied into the entry), `failed_phase`
    the step that failed (None: upgraded). The tuple after is the one before with what was measured
    (result `measured`, node_upgrade's tuple gate) or read at the end: kernel and RKE2 from the
    kubelet, the driver from the host (or the rollback's result, which comes first for a rolled-back node)."""
    result = result or {}
    kubelet = kubelet or {}
    if failed_phase is not None:
        step(failed_phase)
    combos = [c for c in plan.get('combinations') or [] if host in (c.get('nodes') or [])]
    if not combos:
        raise RolloutError('host %r is in no combination of the plan' % (host,))
    combo = combos[0]
    batches = plan.get('batches') or []
    batch = next((i for i, b in enumerate(batches) if host in b), None)
    if batch is None:
        raise RolloutError('host %r is in no batch of the plan' % (host,))
    name = result.get('node') or host
    before = dict(combo['source_tuples'][0])
    after = dict(before)
    # An upgraded node: the tuple its tuple gate measured after activation. A rolled-back one: what it
    # runs now (the rollback's driver, the kubelet's kernel and RKE2), then what was measured.
    measured = result.get('measured') or {}
    read = {'kernel': kubelet.get('kernel'), 'rke2': kubelet.get('rke2'), 'driver': result.get('driver_now')}
    first, then = (read, measured) if result.get('rolled_back') else (measured, read)
    for key in TUPLE_KEYS:
        value = first.get(key) or then.get(key)
        if value:
            after[key] = value
    entry: Dict[str, Any] = {
        'name': name, 'role': 'canary' if name in (plan.get('canaries') or []) else 'batch', 'batch': batch,
        'pci_ids': combo['key']['pci_ids'].split(','), 'tuple_before': before, 'tuple_after': after,
        'verdict': 'failed' if failed_phase else 'upgraded',
        'phases': evidence_phases(failed_phase, bool(result.get('rke2_applied')), dra, bool(result.get('kernel_changed')),
                                  bool(result.get('operands_moved'))),
        'finished': finished or rfc3339(utcnow()), 'rolled_back': bool(result.get('rolled_back')),
    }
    # The machine, not only the name (Node UID, machine-id, system UUID), as the kubelet read reports it.
    for key in ('uid', 'machine_id', 'system_uuid'):
        if kubelet.get(key):
            entry[key] = kubelet[key]
    # What the node installed (packages with the repository's SHA-256) and runs (images with their digests).
    if result.get('artifacts'):
        entry['artifacts'] = list(result['artifacts'])
    if started:
        entry['started'] = started
    if failed_phase:
        entry['failed_phase'] = failed_phase
        entry['message'] = message or ''
    return entry


def unfinished_nodes(nodes: Sequence[Dict[str, Any]], target: Dict[str, Any]) -> List[str]:
    """The names of the nodes (fleet_info's node views) that did not finish `target`."""
    key = target_key(target)
    return [n['name'] for n in nodes if not finished(n.get('annotations') or {}, key)]


def rollback_result(node: str, decision: Dict[str, Any], restored: bool, gpu_after: Dict[str, Any],
                    gates: Dict[str, Any], driver_before_upgrade: str) -> Dict[str, Any]:
    """The rollback role's public result (rollback_result): what rollback_decision allowed, whether the
    snapshot was restored, the driver the node runs now, and the verdict of the GPU and node gates
    (`gates`: name -> registered result; both must have passed) and, when the rollback restored the
    kernel, `kernel`: kernel_boot state=verify of the snapshot's kernel with the previous driver."""
    ran = [gates.get(name) or {} for name in ('gpu', 'node')]
    passed = all(r.get('passed') is True for r in ran)
    problems: List[str] = []
    for r in ran:
        problems.extend(r.get('problems') or [])
    kernel = gates.get('kernel') or {}
    if kernel and not kernel.get('skipped'):
        verification = kernel.get('verification') or {}
        if verification.get('ok') is not True:
            passed = False
            problems.extend(verification.get('problems') or [kernel.get('msg') or 'the restored kernel was not verified'])
    driver_now = (gpu_after or {}).get('driver_version') or ''
    outcome = (decision or {}).get('outcome', '')
    return {
        'node': node, 'outcome': outcome, 'restored': bool(restored), 'driver_now': driver_now,
        'driver_before_upgrade': driver_before_upgrade, 'gates_passed': passed, 'gate_problems': problems,
        'refusals': list((decision or {}).get('refusals') or []),
        'summary': '%s; driver %s (before the upgrade %s); gates %s' % (
            outcome, driver_now, driver_before_upgrade, 'passed' if passed else 'FAILED'),
    }


ACTIVATIONS = ('auto', 'reboot', 'reload', 'lab')


def _check_install_method(value: Any, field: str = 'install_method') -> None:
    if not isinstance(value, str) or not value:
        raise RolloutError('%s: %r is not a name' % (field, value))


def activation(mode: Any, kernel_change: Any, booted: Any = False, install_method: Any = 'apt') -> str:
    """How node_upgrade brings the new driver up: V(reboot), V(reload) (unload; the new modules load on
    first use), V(none), or V(operator): the GPU Operator's driver container is the driver
    (`install_method: operator`); nothing on the host activates it, the node's operands step brings its
    driver pod to the new revision with the other operands (docs/gpu-operator.md). A kernel change with
    that install method is refused: the driver container builds its module for the kernel that runs, and
    node_upgrade has no step that boots a new kernel without a host driver for it.

    `mode` is node_upgrade_activation; `kernel_change` whether the target changes the node's kernel;
    `booted` whether the trial boot's kernel_boot found the target kernel running already (a run killed
    after the one-shot boot, resumed). Then nothing is activated again: the target kernel came up with
    the target driver's modules, the trial's `next_entry` is spent, and a reboot would boot GRUB's saved
    default, the previous kernel. The verify step that follows checks what runs."""
    if mode not in ACTIVATIONS:
        raise RolloutError('activation: %r is not one of %s' % (mode, ', '.join(ACTIVATIONS)))
    for name, value in (('kernel_change', kernel_change), ('booted', booted)):
        if not isinstance(value, bool):
            raise RolloutError('%s: %r is not a boolean' % (name, value))
    _check_install_method(install_method)
    if install_method == 'operator':
        if kernel_change:
            raise RolloutError("install_method: 'operator' with a kernel change is not built (the operator's driver "
                               "container builds its module for the running kernel; change the kernel in its own "
                               "target first); nothing was changed")
        return 'operator'
    if booted:
        return 'none'
    if mode == 'reboot' or (kernel_change and mode in ('auto', 'lab')):
        return 'reboot'
    return 'reload'


def rollback_activation(mode: Any, decision: Any, kernel_back: Any = False) -> str:
    """How a rollback brings the restored driver up (node_upgrade's activation): V(reboot) when `mode`
    (rollback_activation) is reboot, when the rollback `decision` (rollback_decision's result) has a
    reboot step, or when `kernel_back` (the node runs another kernel than the snapshot's: the restore made
    the snapshot's kernel GRUB's default again and removed the newer kernel's module packages, so a reload
    would keep the other kernel); else V(reload)."""
    if mode not in ACTIVATIONS:
        raise RolloutError('rollback_activation: %r is not one of %s' % (mode, ', '.join(ACTIVATIONS)))
    steps = decision.get('steps') if isinstance(decision, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise RolloutError('decision: %r has no list of steps' % (decision,))
    if not isinstance(kernel_back, bool):
        raise RolloutError('kernel_back: %r is not a boolean' % (kernel_back,))
    if mode == 'reboot' or kernel_back or any(s.get('action') == 'reboot' for s in steps):
        return 'reboot'
    return 'reload'


def _not_started(annotations: Dict[str, Any], key: str) -> bool:
    """Whether a Node's annotations show no work on the target `key`: no progress recorded for it, not finished."""
    return annotations.get(ANN_TARGET) != key and annotations.get(ANN_DONE) != key


def operand_window_verdict(gpu_operator: Any, nodes: Any, pending: Any, target: Dict[str, Any]) -> Dict[str, Any]:
    """Pure: whether an operand of a node whose window has not come moved to its DaemonSet's current revision
    (T3-6: the operand DaemonSets are OnDelete at the new template from the cluster step to the restore, so an
    operand pod deleted outside its node's window - by on-call, an eviction - comes back at the new revision).

    `gpu_operator` is gpu_operator_info's `gpu_operator`; `nodes` fleet_info's node views (name, annotations);
    `pending` the plan's nodes from this batch on. The nodes compared are those of `pending` that show no work on
    `target` (no progress recorded for it, not finished). For each operand DaemonSet, when some of those nodes'
    pods run an older revision and others the current one, the current ones moved outside their windows (all
    those nodes ran one revision before the cluster step). All at the current revision is a template the change
    did not touch, and one node alone has nothing to compare with: neither is reported (a limit, documented).

    Returns {ok, moved: [{node, operand, pod, revision, others}], msg}."""
    if not isinstance(gpu_operator, dict) or not isinstance(gpu_operator.get('nodes'), dict):
        raise RolloutError('gpu_operator: %r is not gpu_operator_info\'s gpu_operator (a dict with nodes)'
                           % (type(gpu_operator).__name__,))
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get('name'), str) for n in nodes):
        raise RolloutError('nodes: not a list of fleet_info node views (each a dict with a name)')
    if not isinstance(pending, list) or not all(isinstance(n, str) for n in pending):
        raise RolloutError('pending: %r is not a list of node names' % (pending,))
    key = target_key(target)
    views = {n['name']: n for n in nodes}
    waiting = [name for name in pending if name in views
               and _not_started(views[name].get('annotations') or {}, key)]
    by_operand: Dict[str, List[Dict[str, Any]]] = {}
    for name in waiting:
        for pod in gpu_operator['nodes'].get(name) or []:
            if isinstance(pod, dict) and not pod.get('back') and pod.get('revision') and pod.get('operand'):
                by_operand.setdefault(str(pod['operand']), []).append(dict(pod, node=name))
    moved: List[Dict[str, Any]] = []
    for operand in sorted(by_operand):
        pods = by_operand[operand]
        older = sorted(set(str(p['revision']) for p in pods if not p.get('current')))
        if not older:
            continue
        moved.extend({'node': p['node'], 'operand': operand, 'pod': p.get('pod'), 'revision': p['revision'],
                      'others': older} for p in pods if p.get('current'))
    moved.sort(key=lambda m: (m['node'], m['operand']))
    if not moved:
        return {'ok': True, 'moved': [], 'msg': 'operands: no node waiting for its window (%d compared) runs an '
                'operand at the new revision' % len(waiting)}
    lines = ['%s: %s pod %s at revision %s, the others not yet upgraded at %s' % (
        m['node'], m['operand'], m['pod'], m['revision'], ', '.join(m['others'])) for m in moved]
    return {'ok': False, 'moved': moved, 'msg': (
        'operands moved outside their window on %d node(s) not yet upgraded (an operand pod deleted or evicted '
        'while its DaemonSet is OnDelete at the new template): %s. The rollout stops before this batch: take '
        'those nodes back (gpu_operator_update state=back; docs/gpu-operator.md) or re-plan'
        % (len(sorted(set(m['node'] for m in moved))), '; '.join(lines)))}


def operands_back(managed: Any, restore: Any, install_method: Any = 'apt') -> bool:
    """Whether a node's rollback takes its GPU Operator operands back to the revisions of the operator's
    snapshot (gpu_operator_update state=back).

    `managed` is gpufleet_gpu_operator_managed; `restore` the rollback's registered restore result
    (skipped when the rollback had nothing to restore, changed when it changed the host). The operands go
    back with the host: when the restore changed it, or, with `install_method: operator`, whenever the
    restore ran, since then the driver is one of the operands and the restore changes no host package."""
    if not isinstance(managed, bool):
        raise RolloutError('gpu_operator_managed: %r is not a boolean' % (managed,))
    if not isinstance(restore, dict):
        raise RolloutError('restore: %r is not a task result' % (restore,))
    _check_install_method(install_method)
    if not managed or restore.get('skipped'):
        return False
    return bool(restore.get('changed')) or install_method == 'operator'


def install_method_verdict(plan: Any, install_method: Any) -> Dict[str, Any]:
    """Whether the plan's combinations were planned with this run's install method ({'ok', 'msg'}).

    The planner keys each combination by `install_method` (gpufleet_install_method when it ran); the
    canary proved, and upgrade_check passed, that method. A run whose gpufleet_install_method is another
    one would pin and install host packages on nodes whose driver the GPU Operator runs, or the
    reverse. A combination key without `install_method` (combination_keys that leave it out) is not
    judged."""
    _check_install_method(install_method, 'gpufleet_install_method')
    if not isinstance(plan, dict):
        raise RolloutError('plan: a %s is not a plan' % type(plan).__name__)
    combos = plan.get('combinations')
    if not isinstance(combos, list):
        raise RolloutError('plan.combinations: %r is not a list' % (combos,))
    for i, c in enumerate(combos):
        if not isinstance(c, dict):
            raise RolloutError('plan.combinations[%d]: %r is not a combination (a mapping with a key; re-plan)' % (i, c))
        if c.get('key') is not None and not isinstance(c['key'], dict):
            raise RolloutError('plan.combinations[%d].key: %r is not a mapping (re-plan)' % (i, c['key']))
    planned = sorted({str((c.get('key') or {}).get('install_method')) for c in combos
                      if 'install_method' in (c.get('key') or {})})
    other = [m for m in planned if m != install_method]
    if other:
        return {'ok': False, 'msg': 'the plan was made with install method %s, this run has gpufleet_install_method '
                                    '%s: re-plan (and re-qualify) with the same install method' % (
                                        ', '.join(other), install_method)}
    return {'ok': True, 'msg': 'install method %s, as planned' % install_method}


def forks_verdict(batches: Any, forks: Any) -> Dict[str, Any]:
    """Whether this run's `forks` let each of the plan's `batches` run its nodes at once.

    Ansible runs a task on at most `forks` hosts at a time: with fewer forks than a batch has
    nodes, the batch's drains, installs and reboots run `forks` at a time, one after the other,
    and the batch takes several maintenance windows instead of one. {'ok', 'largest', 'forks',
    'msg'}; nothing is refused for a plan without batches (the caller checks that)."""
    if isinstance(forks, bool) or not isinstance(forks, int) or forks < 1:
        raise RolloutError('forks: %r is not a positive whole number' % (forks,))
    if not isinstance(batches, list) or not all(isinstance(b, list) for b in batches):
        raise RolloutError('batches: expected the plan\'s list of node-name lists, got %s' % type(batches).__name__)
    largest = max([len(b) for b in batches] or [0])
    if forks >= largest:
        return {'ok': True, 'largest': largest, 'forks': forks,
                'msg': 'the plan\'s largest batch has %d node(s) and this run has %d forks: each batch\'s nodes run at '
                       'once' % (largest, forks)}
    return {'ok': False, 'largest': largest, 'forks': forks,
            'msg': 'the plan\'s largest batch has %d nodes but this run has %d forks: Ansible would run each task on %d '
                   'of them at a time, so a batch would take several maintenance windows instead of one. Run with '
                   '--forks %d or more (ANSIBLE_FORKS, or the AWX job template\'s forks), or re-plan with smaller '
                   'batches; nothing was changed' % (largest, forks, forks, largest)}


def rollback_time(node: str, start: Any, end: Any, window: Any = '') -> Dict[str, Any]:
    """The canary's timed rollback against the maintenance window a node may be out of service.

    `start` and `end`: the rollback exercise's start and end (epoch seconds). `window`: a
    duration (for example V(45m), V(1h30m)); empty when none is declared. {'seconds', 'window_s',
    'judged', 'passed', 'msg'}: with a window the rollback passes only when it took no longer (a node
    that cannot be put back inside its window is not a proven way back); without one it is recorded,
    not judged."""
    try:
        t0, t1 = float(start), float(end)
    except (TypeError, ValueError):
        raise RolloutError('start/end: %r, %r are not times in seconds' % (start, end))
    if t1 < t0:
        raise RolloutError('end: %r is before start %r' % (end, start))
    seconds = round(t1 - t0, 1)
    if window in (None, ''):
        return {'seconds': seconds, 'window_s': None, 'judged': False, 'passed': True,
                'msg': 'the rollback of %s took %.1f s (no maintenance window declared to compare it with)'
                       % (node, seconds)}
    try:
        window_s = parse_seconds(window, 'maintenance_window')
    except ValueError as exc:
        raise RolloutError(str(exc))
    passed = seconds <= window_s
    return {'seconds': seconds, 'window_s': window_s, 'judged': True, 'passed': passed,
            'msg': 'the rollback of %s took %.1f s, %s the maintenance window of %s (%.0f s)'
                   % (node, seconds, 'within' if passed else 'LONGER THAN', window, window_s)}


def plan_nodes(plan: Dict[str, Any]) -> List[str]:
    """Every node a reviewed plan names, once each: its canaries, then its batches in order."""
    if not isinstance(plan, dict) or not isinstance(plan.get('batches') or [], list) \
            or not all(isinstance(b, list) for b in plan.get('batches') or []):
        raise RolloutError('plan: %r has no list of batches (each a list of node names)' % (plan,))
    try:
        check_plan(plan)
    except PlanInputError as exc:
        raise RolloutError(str(exc)) from None
    return _plan_nodes(plan)


def plan_serial(plan: Dict[str, Any]) -> List[int]:
    """The batch play's `serial`: the size of each of the reviewed plan's batches, in order (each at least 1)."""
    batches = plan.get('batches') if isinstance(plan, dict) else None
    if not isinstance(batches, list) or not batches \
            or not all(isinstance(b, list) and b and all(isinstance(n, str) and n for n in b) for b in batches):
        raise RolloutError('plan: %r has no batches (each a non-empty list of node names)' % (plan,))
    return [len(b) for b in batches]


def _plan_nodes(plan: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    for name in list(plan.get('canaries') or []) + [n for b in plan.get('batches') or [] for n in b]:
        if name not in out:
            out.append(name)
    return out


def observation_window(window: Any, started: Any, now: Any) -> Dict[str, Any]:
    """The observation window of a stage (issue 16), anchored at the stage's end: when the last node of
    the batch (or the canary pool) finished its activation and gates. `window`: a duration (for
    example V(30m)); `started`, `now`: epoch seconds. {'start', 'end' (RFC 3339), 'seconds', 'wait'
    (seconds still to wait, 0 when it has passed)}."""
    try:
        seconds = parse_seconds(window, 'gpufleet_observation_window')
    except ValueError as exc:
        raise RolloutError(str(exc))
    try:
        t0, t1 = float(started), float(now)
    except (TypeError, ValueError):
        raise RolloutError('started/now: %r, %r are not times in seconds' % (started, now))

    def at(ts: float) -> str:
        return rfc3339(datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc))
    return {'start': at(t0), 'end': at(t0 + seconds), 'started': t0, 'seconds': seconds,
            'wait': max(0, int(math.ceil(t0 + seconds - t1)))}


def observation_settings(plan: Any, default_window: Any, metric_gate: Any = None) -> Dict[str, Any]:
    """What a stage's observation window runs (issue 16): the plan's ``observation`` (its window and its
    metric_gate queries: minimum traffic, control group) over the run's ``default_window``
    (gpufleet_observation_window) and metric gate settings (node_upgrade_metric_gate: its url and presets).
    {'window' (a duration), 'seconds', 'queries' (the plan's), 'gate_queries' (the metric gate's own queries
    and the plan's: what the window's metric gate runs with the presets), 'metric' (whether the window runs
    the metric gate), 'source' (plan or run)}. RolloutError when the plan declares queries and no Prometheus url is set
    (checked before anything moves: at the end of a window it would fail every upgraded node)."""
    if not isinstance(plan, dict):
        raise RolloutError('plan: %r is not a plan' % (plan,))
    obs = plan.get('observation') or {}
    if not isinstance(obs, dict):
        raise RolloutError('plan.observation: %r is not a mapping (re-plan)' % (obs,))
    try:
        # As the planner checked it (queries, workloads); a plan edited since is refused naming the field.
        checked = check_observation(obs, 'plan.observation')
    except PlanInputError as exc:
        raise RolloutError(str(exc)) from None
    metric_gate = metric_gate or {}
    if not isinstance(metric_gate, dict):
        raise RolloutError('node_upgrade_metric_gate: %r is not a mapping of metric_gate options' % (metric_gate,))
    own = metric_gate.get('queries') or []
    if not isinstance(own, list):
        raise RolloutError('node_upgrade_metric_gate.queries: %r is not a list of metric_gate queries' % (own,))
    window = obs.get('window') or default_window
    field = 'plan.observation.window' if obs.get('window') else 'gpufleet_observation_window'
    try:
        seconds = parse_seconds(window, field)
    except ValueError as exc:
        raise RolloutError(str(exc))
    queries = list(checked.get('queries') or [])
    if queries and not metric_gate.get('url'):
        raise RolloutError('the plan declares observation queries (%s) but node_upgrade_metric_gate has no url: set '
                           'node_upgrade_metric_gate.url to the Prometheus that holds them'
                           % ', '.join(str(q.get('name')) for q in queries if isinstance(q, dict)))
    # The window's metric gate runs the node gate's own queries (node_upgrade_metric_gate.queries) and the plan's.
    own = list(own)
    names = [q.get('name') for q in own + queries if isinstance(q, dict)]
    dupes = sorted({str(n) for n in names if names.count(n) > 1})
    if dupes:
        raise RolloutError('observation queries: %s named both in node_upgrade_metric_gate.queries and in the plan\'s '
                           'observation.queries: rename one' % ', '.join(dupes))
    workloads = checked.get('workloads')
    return {'window': str(window), 'seconds': seconds, 'queries': queries, 'gate_queries': own + queries,
            'metric': bool(metric_gate) or bool(queries), 'source': 'plan' if obs.get('window') else 'run',
            'workloads': dict(workloads) if workloads else None}


def observation_cases(cases: Any, workloads: Any) -> List[Dict[str, Any]]:
    """The workload_gate cases a window runs: those of `cases` (the suite's and the run's, workload_gate
    cases) named in the plan's observation.workloads (`workloads`: observation_settings' workloads, or None:
    none). RolloutError names a case the plan names and no suite holds, before anything moves."""
    if not workloads:
        return []
    if not isinstance(cases, list) or not all(isinstance(c, dict) and c.get('name') for c in cases):
        raise RolloutError('cases: %r is not a list of workload_gate cases' % (cases,))
    by_name = {c['name']: c for c in cases}
    missing = [n for n in workloads.get('cases') or [] if n not in by_name]
    if missing:
        raise RolloutError('plan.observation.workloads.cases: %s is no workload case (the suite and '
                           'node_upgrade_workload_cases hold: %s)' % (', '.join(missing), ', '.join(sorted(by_name))))
    return [by_name[n] for n in workloads['cases']]


def _short_of_traffic(query: Dict[str, Any]) -> bool:
    count = query.get('count') or {}
    return bool(count) and (count.get('value') is None or
                            (count.get('min') is not None and count['value'] < count['min']))


def observation_hosts(results: Dict[str, Any], upgraded: Sequence[str],
                      expected: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Which inventory hosts the observation window re-gates on the host (the GPU gate against the node's
    snapshot): those whose node_upgrade result in this run (`results`: host -> node_upgrade_result or None)
    upgraded a node of `upgraded` (the window's nodes) and names its snapshot file. A node upgraded in an
    earlier run has no baseline loaded here: it is listed in `not_regated` with the reason, and the cluster
    read and the metric gate re-gate it. {'hosts': [host], 'nodes': {host: node}, 'not_regated': {node: reason},
    'node_gate': {node: expected GPU resources or None}}: what the window's node gate expects of every node of
    `upgraded`: `expected` (gpufleet_expected_gpus) when set, else what the node's own gate in this run expected
    (the result's expected_gpus), else None (no count known: every GPU resource in its capacity allocatable)."""
    if not isinstance(results, dict):
        raise RolloutError('results: %r is not a mapping of host to node_upgrade_result' % (results,))
    if not isinstance(upgraded, (list, tuple)):
        raise RolloutError('upgraded: %r is not a list of node names' % (upgraded,))
    hosts: List[str] = []
    nodes: Dict[str, str] = {}
    for host in sorted(results):
        result = results[host]
        if not isinstance(result, dict) or result.get('outcome') != 'upgraded' or not result.get('snapshot'):
            continue
        node = result.get('node') or host
        if node in upgraded and node not in nodes.values():
            hosts.append(host)
            nodes[host] = node
    if expected is not None and not isinstance(expected, dict):
        raise RolloutError('expected: %r is not a mapping of GPU resource to count (gpufleet_expected_gpus)' % (expected,))
    own = {result.get('node') or host: result.get('expected_gpus') for host, result in results.items()
           if isinstance(result, dict) and result.get('outcome') == 'upgraded'}
    covered = set(nodes.values())
    not_regated = {name: 'not upgraded by this run (no GPU baseline loaded here): re-gated by the cluster read, '
                         'the node gate and the metric gate only' for name in upgraded if name not in covered}
    node_gate = {name: (dict(expected) if expected else (dict(own[name]) if isinstance(own.get(name), dict) and own[name] else None))
                 for name in upgraded}
    return {'hosts': hosts, 'nodes': nodes, 'not_regated': not_regated, 'node_gate': node_gate}


def observation_share(hosts: Sequence[str], workers: Sequence[str], worker: str) -> List[str]:
    """The share of the window's GPU re-gate that `worker` runs: the hosts to re-gate (`hosts`, observation_hosts'
    `hosts`) dealt in turn over the play's active hosts (`workers`, ansible_play_batch), so that every worker of
    the batch re-gates its share at the same time, each in its own fork, instead of one worker visiting every
    node after another. Every host is in exactly one share; the shares differ in size by one at most."""
    for what, value in (('hosts', hosts), ('workers', workers)):
        if not isinstance(value, (list, tuple)) or not all(isinstance(h, str) and h for h in value):
            raise RolloutError('%s: %r is not a list of inventory host names' % (what, value))
    if len(set(workers)) != len(workers):
        raise RolloutError('workers: %r names a host twice' % (list(workers),))
    if worker not in workers:
        raise RolloutError('worker: %r is not one of the play\'s active hosts %r' % (worker, list(workers)))
    return list(hosts[list(workers).index(worker)::len(workers)])


def observation_gpu(registered: Sequence[Any], regate: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The window's GPU gate results by node, gathered from what each worker registered for its share
    (`registered`: each worker's loop result, from observation_share's shares) and `regate` (observation_hosts'
    selection: `hosts`, `nodes`: host -> node). A host that was to be re-gated and has no result (its worker's
    share did not run) gets a result that did not pass: a node nobody re-gated fails the window, it never passes
    unseen. A result for a host that is not to be re-gated, or two results for one host, is an error."""
    if not isinstance(regate, dict) or not isinstance(regate.get('hosts'), list) or not isinstance(regate.get('nodes'), dict):
        raise RolloutError('regate: %r is not observation_hosts\' selection (hosts, nodes)' % (regate,))
    if not isinstance(registered, (list, tuple)):
        raise RolloutError('registered: %r is not a list of the workers\' loop results' % (registered,))
    by_host: Dict[str, Dict[str, Any]] = {}
    for entry in registered:
        if entry is None:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get('results', []), list):
            raise RolloutError('registered: %r is not a loop result (results)' % (entry,))
        for result in entry.get('results', []):
            host = result.get('item') if isinstance(result, dict) else None
            if host not in regate['nodes']:
                raise RolloutError('registered: a GPU gate result for %r, which is not a host to re-gate %r'
                                   % (host, regate['hosts']))
            if host in by_host:
                raise RolloutError('registered: two GPU gate results for host %r' % (host,))
            by_host[host] = result
    missing = {'passed': False, 'msg': 'the GPU gate did not run on it in this window (its share of the re-gate '
                                       'was not run)'}
    return {regate['nodes'][host]: dict(by_host.get(host, missing)) for host in regate['hosts']}


def observation_verdict(nodes: Sequence[Dict[str, Any]], plan: Dict[str, Any], window: Dict[str, Any],
                        metric: Optional[Dict[str, Any]] = None,
                        host: Optional[Dict[str, Any]] = None,
                        node_gate: Optional[Dict[str, Any]] = None,
                        workload: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The verdict at the end of an observation window (issue 16) over every node of the plan upgraded
    so far (recorded done for the plan's target), from one read of the cluster (`nodes`: fleet_info's
    node views) and, when configured, one metric gate over the window on all of them (`metric`: its
    result, with `failed_nodes`). A node fails when it is not Ready, when the kubelet reports another
    kernel or RKE2 than the target's (it changed underneath), or when the metric gate failed it (a
    health series over the limit, or its DCGM series missing: its monitoring is lost).

    `host` (node -> the GPU gate's result on that node at the window's end, against its snapshot): a node
    whose GPU gate did not pass fails (a new Xid, ECC or row-remap growth, another driver, a GPU off the bus).

    `node_gate`: the node gate's multi-node result over the upgraded nodes (its `nodes`: node -> result); a
    node it failed fails (allocatable GPUs, device plugin, validator, taints). `workload`: the workload gate's
    multi-node result (its `nodes`: node -> result); a node whose cases failed fails.

    A window whose only failed metric queries had too little traffic (count_expr under min_count, or no
    value) is inconclusive: not passed, but no node is failed by it (``inconclusive`` names the queries).

    {'nodes', 'window', 'failed': {node: [reasons]}, 'problems' (one line a failed node), 'passed', 'msg',
    'metric' (the gate's message or None), 'inconclusive' (query names)}."""
    if not isinstance(plan, dict) or not isinstance(plan.get('target'), dict) or not plan['target']:
        raise RolloutError('plan: has no target tuple')
    if not isinstance(nodes, (list, tuple)) or not all(isinstance(n, dict) for n in nodes):
        raise RolloutError('nodes: %r is not a list of fleet_info node views' % (nodes,))
    if not isinstance(window, dict):
        raise RolloutError('window: %r is not an observation window' % (window,))
    if metric is not None and not isinstance(metric, dict):
        raise RolloutError('metric: %r is not a metric gate result' % (metric,))
    if host is not None and (not isinstance(host, dict) or not all(isinstance(r, dict) for r in host.values())):
        raise RolloutError('host: %r is not a mapping of node to GPU gate result' % (host,))
    for field, given in (('node_gate', node_gate), ('workload', workload)):
        if given is not None and (not isinstance(given, dict) or not isinstance(given.get('nodes') or {}, dict)):
            raise RolloutError('%s: %r is not a multi-node gate result (with nodes)' % (field, given))
    host = host or {}
    per_node = {'node gate': (node_gate or {}).get('nodes') or {}, 'workload gate': (workload or {}).get('nodes') or {}}
    # A gate that failed without judging a node (the read failed): not a pass for that node.
    unjudged = {what: given.get('msg') or 'failed' for what, given in (('node gate', node_gate), ('workload gate', workload))
                if given is not None and given.get('passed') is not True}
    target = plan['target']
    key = target_key(target)
    in_plan = _plan_nodes(plan)
    by_name = {n.get('name'): n for n in nodes}
    upgraded = [name for name in in_plan if name in by_name and finished(by_name[name].get('annotations') or {}, key)]
    failed: Dict[str, List[str]] = {}
    for name in upgraded:
        node = by_name[name]
        reasons: List[str] = []
        if not node.get('ready'):
            reasons.append('not Ready')
        for comp in ('kernel', 'rke2'):
            want, have = target.get(comp), node.get(comp)
            if want and have and _version(have) != _version(want):
                reasons.append('the kubelet reports %s %s, the target is %s' % (comp, have, want))
        gate = host.get(name)
        if gate is not None and gate.get('passed') is not True:
            reasons.append('GPU gate: %s' % (gate.get('msg') or 'failed'))
        for what, results in per_node.items():
            gate = results.get(name)
            if isinstance(gate, dict) and gate.get('passed') is not True:
                reasons.append('%s: %s' % (what, '; '.join(gate.get('problems') or []) or gate.get('msg') or 'failed'))
            elif gate is None and what in unjudged:
                reasons.append('%s: %s' % (what, unjudged[what]))
        if reasons:
            failed[name] = reasons
    metric_msg = None
    inconclusive: List[str] = []
    if metric:
        metric_msg = metric.get('msg')
        failing = [q for q in (metric.get('queries') or []) if isinstance(q, dict) and q.get('critical', True)
                   and not q.get('passed', True)]
        if not metric.get('passed', False) and failing and all(_short_of_traffic(q) for q in failing):
            # Too little traffic in the window (count_expr under min_count): it proves nothing either way.
            # The rollout stops, and no node is blamed for it.
            inconclusive = [str(q.get('name')) for q in failing]
        else:
            listed = list(metric.get('failed_nodes') or [])
            if not metric.get('passed', False) and not listed:
                listed = list(upgraded)      # a failure not tied to a node (Prometheus unreachable): all of them
            for name in listed:
                if name in upgraded:
                    failed.setdefault(name, []).append('metric gate: %s' % (metric_msg or 'failed'))
    where = 'observation window %s..%s (%s s)' % (window.get('start'), window.get('end'), window.get('seconds'))
    if inconclusive and not failed:
        msg = ('%s: inconclusive, too little traffic in the window (%s): it proves nothing about the %d upgraded '
               'node(s), so the rollout stops before the next stage; no node is cordoned. Rerun when the traffic '
               'is back (the next stage\'s window re-gates every upgraded node), or re-plan with another minimum'
               % (where, metric_msg, len(upgraded)))
    elif failed:
        msg = ('%s: %d of %d upgraded node(s) failed their re-gating: %s. They are cordoned and the rollout stops; '
               'roll them back with gpufleet.upgrade.rollback' % (
                   where, len(failed), len(upgraded), '; '.join('%s: %s' % (n, ', '.join(r)) for n, r in sorted(failed.items()))))
    else:
        regated = len([n for n in upgraded if n in host])
        busy = [n for n in upgraded if (per_node['workload gate'].get(n) or {}).get('busy')]
        gated = {what: len([n for n in upgraded if n in results and not (results[n] or {}).get('busy')])
                 for what, results in per_node.items()}
        msg = '%s: all %d upgraded node(s) passed their re-gating (%s)' % (
            where, len(upgraded), 'node state and kubelet versions' + (', metric gate' if metric else '')
            + (', GPU gate on %d' % regated if regated else '')
            + ''.join(', %s on %d' % (what, count) for what, count in gated.items() if count)
            + (', workload cases not run on %d (no free GPU)' % len(busy) if busy else ''))
    problems = ['%s: %s' % (n, ', '.join(r)) for n, r in sorted(failed.items())]
    if inconclusive:
        problems.append('inconclusive: too little traffic (%s)' % ', '.join(inconclusive))
    return {'nodes': upgraded, 'window': dict(window), 'failed': failed, 'problems': problems,
            'passed': not failed and not inconclusive, 'msg': msg, 'metric': metric_msg, 'inconclusive': inconclusive,
            'host_regated': sorted(n for n in upgraded if n in host),
            'node_gated': sorted(n for n in upgraded if n in per_node['node gate']),
            'workload_gated': sorted(n for n in upgraded if n in per_node['workload gate']
                                     and not (per_node['workload gate'][n] or {}).get('busy')),
            # Nodes where a workload case was not run because their tenants held every GPU (workload_gate busy=skip).
            'workload_busy': sorted(n for n in upgraded if (per_node['workload gate'].get(n) or {}).get('busy'))}
