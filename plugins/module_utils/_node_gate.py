# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the collection: no compatibility promise. Used by the node_gate module.

"""Node integration gate (seed 000, gate 1): the node is back in Kubernetes as expected.

Checks, each a named verdict with its evidence; all must pass:

* ``ready``: the Node's Ready condition is True;
* ``allocatable``: allocatable equals the expected count for every expected GPU resource
  (those of ``_gpu_resources``: ``nvidia.com/gpu``, ``nvidia.com/gpu.shared``, MIG resources
  ``nvidia.com/mig-<profile>``), and no other GPU resource is advertised (a MIG strategy or layout change shows up here);
* ``device_plugin``: a device plugin pod runs on the node and is Ready (it registered the
  resources: they are in capacity);
* ``validator``: the GPU Operator validator pod on the node is Ready, when present (or required);
* ``taints``: no taint besides the allowed ones (the cordon's own taint is always allowed: the gate
  runs before the uncordon).

The result has the same shape as the other gates: ``{passed, msg, problems, checks: {name:
{passed, problems, evidence}}}``, plus ``measured``: the cluster side of the node's tuple as the
cluster reports it (``measure``): the kubelet's kernel and version (RKE2), and the DCGM exporter
version of the exporter pod running on the node (its image tag), not a template's.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._fleet import image_version, node_facts
from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_resources import is_gpu_resource
from ansible_collections.gpufleet.upgrade.plugins.module_utils._node_record import finished

__all__ = ['ALWAYS_ALLOWED_TAINTS', 'NodeGateError', 'evaluate', 'expected_from_baseline', 'evaluate_nodes', 'gated_nodes', 'label_selector_matches',
           'measure', 'node_views', 'parse_label_selector', 'pod_list_selectors', 'pod_ready', 'validate_finished_for',
           'validate_nodes']

DEFAULT_DEVICE_PLUGIN_SELECTOR = 'app=nvidia-device-plugin-daemonset'
DEFAULT_VALIDATOR_SELECTOR = 'app=nvidia-operator-validator'
DEFAULT_DCGM_EXPORTER_SELECTOR = 'app=nvidia-dcgm-exporter'
# node.kubernetes.io/unschedulable is the cordon's taint: the gate runs while the node is cordoned.
ALWAYS_ALLOWED_TAINTS = ('node.kubernetes.io/unschedulable',)

_SEL_RE = re.compile(r'^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9._-]*))?\s*$')


class NodeGateError(ValueError):
    """Bad input: the message names the field and the value."""


def parse_label_selector(selector: str, field: str = 'selector') -> List[Tuple[str, str, Optional[str]]]:
    """Equality-based selector 'a=b,c!=d,e,!f' -> [(op, key, value)]; op in =, !=, exists, !exists."""
    out: List[Tuple[str, str, Optional[str]]] = []
    if not isinstance(selector, str) or not selector.strip():
        raise NodeGateError('%s: %r is not a label selector (e.g. app=nvidia-device-plugin-daemonset)' % (field, selector))
    for part in selector.split(','):
        m = _SEL_RE.match(part)
        if not m or (m.group(1) and m.group(3)):
            raise NodeGateError('%s: %r is not an equality-based label selector (k=v, k!=v, k, !k)' % (field, selector))
        neg, key, op, value = m.groups()
        if op:
            out.append(('!=' if op == '!=' else '=', key, value or ''))
        else:
            out.append(('!exists' if neg else 'exists', key, None))
    return out


def label_selector_matches(labels: Dict[str, Any], selector: Sequence[Tuple[str, str, Optional[str]]]) -> bool:
    labels = labels or {}
    for op, key, value in selector:
        if op == '=' and labels.get(key) != value:
            return False
        if op == '!=' and labels.get(key) == value:
            return False
        if op == 'exists' and key not in labels:
            return False
        if op == '!exists' and key in labels:
            return False
    return True


def pod_list_selectors(*selectors: Optional[str]) -> List[str]:
    """The label selectors to list the pods of `selectors` with, in as few lists as the API allows (empty or
    None ones skipped): one list where every selector is the same single equality (k=v) on one key, as the
    device plugin's and the validator's defaults are (app=...): `k in (v1,v2)`; else one list a selector.
    Each pod is then matched against its own selector (label_selector_matches), so a wider list changes
    nothing the gate decides."""
    given: List[str] = []
    for selector in selectors:
        if selector and selector not in given:
            given.append(selector)
    parsed = [parse_label_selector(s) for s in given]
    single = [p[0] for p in parsed if len(p) == 1 and p[0][0] == '=' and p[0][2]]
    if len(given) > 1 and len(single) == len(given) and len({key for _op, key, _value in single}) == 1:
        return ['%s in (%s)' % (single[0][1], ','.join(sorted({str(value) for _op, _key, value in single})))]
    return given


def _condition(obj: Dict[str, Any], kind: str) -> Optional[Dict[str, Any]]:
    for c in ((obj.get('status') or {}).get('conditions') or []):
        if c.get('type') == kind:
            return c
    return None


def pod_ready(pod: Dict[str, Any]) -> bool:
    cond = _condition(pod, 'Ready')
    return (pod.get('status') or {}).get('phase') == 'Running' and bool(cond) and cond.get('status') == 'True'


def _selected(pods: Sequence[Dict[str, Any]], selector: Sequence[Tuple[str, str, Optional[str]]]) -> List[Dict[str, Any]]:
    return [p for p in pods if label_selector_matches((p.get('metadata') or {}).get('labels') or {}, selector)]


def _not_ready(pods: Sequence[Dict[str, Any]], what: str) -> List[str]:
    """One problem per pod that is not Ready, naming `what` it is."""
    return ['%s pod %s/%s is not Ready (phase %s)' % (
        what, (p.get('metadata') or {}).get('namespace'), (p.get('metadata') or {}).get('name'),
        (p.get('status') or {}).get('phase')) for p in pods if not pod_ready(p)]


def _quantity(value: Any) -> Optional[int]:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _pod_evidence(pod: Dict[str, Any]) -> Dict[str, Any]:
    meta = pod.get('metadata') or {}
    status = pod.get('status') or {}
    cond = _condition(pod, 'Ready') or {}
    return {
        'name': meta.get('name'), 'namespace': meta.get('namespace'), 'phase': status.get('phase'),
        'ready': pod_ready(pod), 'ready_reason': cond.get('reason'),
        'restarts': sum(int(c.get('restartCount') or 0) for c in (status.get('containerStatuses') or [])),
        'images': sorted({c.get('image') for c in ((pod.get('spec') or {}).get('containers') or []) if c.get('image')}),
    }


def expected_from_baseline(explicit: Any, baseline: Any) -> Dict[str, int]:
    """What a node's gate expects after its upgrade, decided once: `explicit` (node_upgrade_expected_gpus)
    when given; else, when MIG was enabled on any of the node's GPUs before the change (`baseline`,
    gpu_info's facts from the snapshot), {} - no count: its own layout decides, every GPU resource in its
    capacity must be allocatable in full and there must be one (a MIG layout advertises nvidia.com/mig-*
    resources, not one nvidia.com/gpu per GPU); else one nvidia.com/gpu per GPU NVML saw."""
    if explicit:
        return validate_expected(explicit)
    gpus = (baseline or {}).get('gpus') if isinstance(baseline, dict) else None
    if not isinstance(gpus, list):
        raise NodeGateError('baseline: %r has no list of GPUs (gpu_info facts)' % (baseline,))
    if any(isinstance(g, dict) and ((g.get('mig_mode') or {}).get('current') is True) for g in gpus):
        return {}
    return {'nvidia.com/gpu': len(gpus)}


def validate_expected(expected: Any) -> Dict[str, int]:
    if not isinstance(expected, dict) or not expected:
        raise NodeGateError('expected_gpus: %r is not a non-empty dict of resource name to count '
                            '(e.g. {"nvidia.com/gpu": 8})' % (expected,))
    out: Dict[str, int] = {}
    for res, count in expected.items():
        if not isinstance(res, str) or not is_gpu_resource(res):
            raise NodeGateError('expected_gpus: %r is not a GPU resource (nvidia.com/gpu, nvidia.com/gpu.shared or '
                                'nvidia.com/mig-<profile>)' % (res,))
        n = _quantity(count) if not isinstance(count, bool) else None
        if n is None or n < 0:
            raise NodeGateError('expected_gpus.%s: %r is not a non-negative integer' % (res, count))
        out[res] = n
    return out


def evaluate(node_name: str, node: Optional[Dict[str, Any]], pods: Sequence[Dict[str, Any]],
             expected_gpus: Dict[str, Any], device_plugin_selector: str = DEFAULT_DEVICE_PLUGIN_SELECTOR,
             validator_selector: Optional[str] = DEFAULT_VALIDATOR_SELECTOR, validator_required: bool = False,
             allowed_taints: Sequence[str] = ()) -> Dict[str, Any]:
    """Evaluate the gate over the Node object and the pods bound to it (any namespace).

    `expected_gpus` None: no count is known for the node (an observation window re-gating a node an
    earlier run upgraded); the allocatable check then asks that every GPU resource in the node's
    capacity is allocatable in full (the device plugin has marked no device unhealthy) and that
    there is at least one."""
    expected = validate_expected(expected_gpus) if expected_gpus is not None else None
    dp_sel = parse_label_selector(device_plugin_selector, 'device_plugin_selector')
    val_sel = parse_label_selector(validator_selector, 'validator_selector') if validator_selector else None
    allowed = set(ALWAYS_ALLOWED_TAINTS)
    for t in allowed_taints or ():
        if not isinstance(t, str) or not t:
            raise NodeGateError('allowed_taints: %r is not a taint key or key=value' % (t,))
        allowed.add(t)

    checks: Dict[str, Dict[str, Any]] = {}
    if node is None:
        problems = ['node %s does not exist' % node_name]
        checks['ready'] = {'passed': False, 'problems': problems, 'evidence': {'exists': False}}
        return _result(node_name, checks)

    # ready
    cond = _condition(node, 'Ready') or {}
    ready = cond.get('status') == 'True'
    checks['ready'] = {
        'passed': ready,
        'problems': [] if ready else ['node %s is not Ready (Ready=%s%s)' % (
            node_name, cond.get('status', 'missing'), (', reason %s' % cond['reason']) if cond.get('reason') else '')],
        'evidence': {'status': cond.get('status'), 'reason': cond.get('reason'), 'message': cond.get('message'),
                     'last_transition_time': cond.get('lastTransitionTime'),
                     'unschedulable': bool((node.get('spec') or {}).get('unschedulable'))},
    }

    # allocatable
    status = node.get('status') or {}
    alloc = status.get('allocatable') or {}
    cap = status.get('capacity') or {}
    probs: List[str] = []
    ev: Dict[str, Any] = {}
    if expected is None:
        # No count known: what the device plugin registered (capacity) must all be allocatable.
        expected = {res: _quantity(cap.get(res)) or 0 for res in cap if is_gpu_resource(res)}
        ev['expected_from'] = 'capacity'
        if not any(expected.values()):
            probs.append('no GPU resource in the capacity of node %s: the device plugin registered none' % node_name)
    for res in sorted(expected):
        have = _quantity(alloc.get(res)) if res in alloc else None
        ev[res] = {'expected': expected[res], 'allocatable': have, 'capacity': _quantity(cap.get(res)) if res in cap else None}
        if have is None:
            probs.append('%s: not in allocatable (expected %d): the device plugin has not registered it'
                         % (res, expected[res]))
        elif have != expected[res]:
            probs.append('%s: allocatable %d, expected %d' % (res, have, expected[res]))
    for res in sorted(set(alloc) | set(cap)):
        if res in expected or not is_gpu_resource(res):
            continue
        have = _quantity(alloc.get(res)) or 0
        ev[res] = {'expected': 0, 'allocatable': have, 'capacity': _quantity(cap.get(res))}
        if have:
            probs.append('%s: allocatable %d, not expected (partition layout or MIG strategy changed?)' % (res, have))
    checks['allocatable'] = {'passed': not probs, 'problems': probs, 'evidence': ev}

    on_node = [p for p in pods if (p.get('spec') or {}).get('nodeName') == node_name]

    # device plugin
    dps = _selected(on_node, dp_sel)
    probs = [] if dps else ['no device plugin pod (%s) on node %s' % (device_plugin_selector, node_name)]
    probs += _not_ready(dps, 'device plugin')
    registered = sorted(r for r in expected if r in cap)
    checks['device_plugin'] = {'passed': not probs, 'problems': probs,
                               'evidence': {'selector': device_plugin_selector,
                                            'pods': [_pod_evidence(p) for p in dps],
                                            'registered_resources': registered}}

    # validator
    if val_sel is not None:
        vals = _selected(on_node, val_sel)
        probs = ([] if vals or not validator_required
                 else ['no GPU Operator validator pod (%s) on node %s' % (validator_selector, node_name)])
        probs += _not_ready(vals, 'GPU Operator validator')
        checks['validator'] = {'passed': not probs, 'problems': probs,
                               'evidence': {'selector': validator_selector, 'present': bool(vals),
                                            'required': validator_required,
                                            'pods': [_pod_evidence(p) for p in vals]}}

    # taints
    taints = (node.get('spec') or {}).get('taints') or []
    probs = []
    for t in taints:
        key = t.get('key')
        kv = '%s=%s' % (key, t.get('value')) if t.get('value') is not None else key
        if key in allowed or kv in allowed:
            continue
        probs.append('unexpected taint %s:%s' % (kv, t.get('effect')))
    checks['taints'] = {'passed': not probs, 'problems': probs,
                        'evidence': {'taints': [{'key': t.get('key'), 'value': t.get('value'), 'effect': t.get('effect')}
                                                for t in taints], 'allowed': sorted(allowed)}}
    return _result(node_name, checks)


def measure(node_name: str, node: Optional[Dict[str, Any]], pods: Sequence[Dict[str, Any]],
            dcgm_exporter_selector: str = DEFAULT_DCGM_EXPORTER_SELECTOR,
            gpu_operator: Optional[Dict[str, Any]] = None) -> Dict[str, Optional[str]]:
    """The cluster side of a node's tuple as measured: `kernel` and `rke2` as the node's kubelet
    reports them (status.nodeInfo), `dcgm_exporter` the image tag of the DCGM exporter pod running
    on the node (None when none runs, or several disagree), `gpu_operator` the image tag of the
    operator's workload object `gpu_operator` (None when absent)."""
    sel = parse_label_selector(dcgm_exporter_selector, 'dcgm_exporter_selector')
    info = ((node or {}).get('status') or {}).get('nodeInfo') or {}
    on_node = [p for p in pods if (p.get('spec') or {}).get('nodeName') == node_name
               and not (p.get('metadata') or {}).get('deletionTimestamp')]
    tags = sorted(set(t for t in (image_version(p) for p in _selected(on_node, sel)) if t))
    return {'kernel': info.get('kernelVersion') or None, 'rke2': info.get('kubeletVersion') or None,
            'dcgm_exporter': tags[0] if len(tags) == 1 else None,
            'gpu_operator': image_version(gpu_operator) if gpu_operator else None}


_IMAGE_DIGEST = re.compile(r'sha256:[0-9a-f]{64}$')


def _digest(ref: Any) -> Optional[str]:
    """The sha256:<hex> an image reference or a container status' imageID ends with (None when it has none)."""
    m = _IMAGE_DIGEST.search(str(ref or '').lower())
    return m.group(0) if m else None


def image_artifacts(node_name: str, pods: Sequence[Dict[str, Any]],
                    dcgm_exporter_selector: str = DEFAULT_DCGM_EXPORTER_SELECTOR,
                    gpu_operator: Optional[Dict[str, Any]] = None) -> List[Dict[str, str]]:
    """The images the node's tuple runs as evidence artifacts: the DCGM exporter pod's on the node, with the
    digest the kubelet reports it pulled (containerStatuses imageID) or the one the reference pins; the GPU
    Operator's (its workload object: the digest only when the reference pins one). No digest: no `digest` key
    (the evidence lists the artifact as undigested rather than guessing)."""
    sel = parse_label_selector(dcgm_exporter_selector, 'dcgm_exporter_selector')
    on_node = [p for p in pods if (p.get('spec') or {}).get('nodeName') == node_name
               and not (p.get('metadata') or {}).get('deletionTimestamp')]
    found: Dict[str, Dict[str, str]] = {}
    for pod in _selected(on_node, sel):
        statuses = {c.get('name'): c for c in (pod.get('status') or {}).get('containerStatuses') or []}
        for c in (pod.get('spec') or {}).get('containers') or []:
            if not c.get('image'):
                continue
            entry = {'kind': 'image', 'name': str(c['image']), 'version': image_version({'spec': {'containers': [c]}}) or ''}
            digest = _digest((statuses.get(c.get('name')) or {}).get('imageID')) or _digest(c['image'])
            if digest:
                entry['digest'] = digest
            found.setdefault(entry['name'], entry)
    if gpu_operator:
        spec = gpu_operator.get('spec') or {}
        containers = (((spec.get('template') or {}).get('spec')) or spec).get('containers') or []
        if containers and containers[0].get('image'):
            image = str(containers[0]['image'])
            entry = {'kind': 'image', 'name': image, 'version': image_version(gpu_operator) or ''}
            if _digest(image):
                entry['digest'] = _digest(image) or ''
            found.setdefault(image, entry)
    return [dict((k, v) for k, v in e.items() if v) for _name, e in sorted(found.items())]


def validate_nodes(nodes: Any) -> Dict[str, Optional[Dict[str, int]]]:
    """The multi-node form's `nodes`: node name -> expected GPU resources (as `expected_gpus`), or
    None / {} where no count is known (the capacity rule of `evaluate`)."""
    if not isinstance(nodes, dict) or not nodes:
        raise NodeGateError('nodes: %r is not a non-empty dict of node name to expected GPU resources' % (nodes,))
    out: Dict[str, Optional[Dict[str, int]]] = {}
    for name, expected in nodes.items():
        if not isinstance(name, str) or not name.strip():
            raise NodeGateError('nodes: %r is not a node name' % (name,))
        if expected is None or expected == {}:
            out[name] = None
            continue
        try:
            out[name] = validate_expected(expected)
        except NodeGateError as exc:
            raise NodeGateError('nodes.%s.%s' % (name, str(exc)))
    return out


def evaluate_nodes(nodes: Dict[str, Optional[Dict[str, int]]], objects: Dict[str, Dict[str, Any]],
                   pods: Sequence[Dict[str, Any]], **options: Any) -> Dict[str, Any]:
    """The gate on many nodes from one read of the cluster (an observation window re-gating every node
    upgraded so far): `objects` the Node objects by name (a missing one fails its node), `pods` the
    pods the selectors chose on any node. `options` as `evaluate`'s. {'passed', 'msg', 'problems' (each
    prefixed with its node), 'nodes': {name: evaluate's result}, 'failed_nodes'}."""
    results = {name: evaluate(name, objects.get(name), pods, expected, **options) for name, expected in sorted(nodes.items())}
    failed = [name for name, result in results.items() if not result['passed']]
    problems = ['%s: %s' % (name, problem) for name in failed for problem in results[name]['problems']]
    msg = ('node gate: PASS for %d node(s)' % len(results) if not failed
           else 'node gate: FAIL for %d of %d node(s): %s' % (len(failed), len(results), '; '.join(problems)))
    return {'passed': not failed, 'msg': msg, 'problems': problems, 'nodes': results, 'failed_nodes': failed}


def validate_finished_for(finished_for: Any) -> Optional[str]:
    """The finished_for option: None (judge every node) or a target key."""
    if finished_for is not None and (not isinstance(finished_for, str) or not finished_for.strip()):
        raise NodeGateError('finished_for: %r is not a target key' % (finished_for,))
    return finished_for


def gated_nodes(nodes: Dict[str, Optional[Dict[str, int]]], objects: Dict[str, Dict[str, Any]],
                finished_for: Optional[str] = None) -> Tuple[Dict[str, Optional[Dict[str, int]]], List[str]]:
    """Which of `nodes` the multi-node gate judges, from the same read: all of them, or with `finished_for`
    (a target key) only those whose Node records that target finished (_node_record.finished), as an
    observation window re-gates every node upgraded so far. (gated, not_finished: the others, sorted;
    a node not read is among them)."""
    if validate_finished_for(finished_for) is None:
        return dict(nodes), []
    gated = {name: expected for name, expected in nodes.items()
             if name in objects and finished(((objects[name].get('metadata') or {}).get('annotations') or {}), finished_for)}
    return gated, sorted(name for name in nodes if name not in gated)


def node_views(nodes: Sequence[str], objects: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The fleet_info view (_fleet.node_facts) of each of `nodes` that was read, by name: what an observation
    window judges besides the gate (Ready, the kubelet's kernel and version, the upgrade record)."""
    return [node_facts(objects[name]) for name in sorted(nodes) if name in objects]


def _result(node_name: str, checks: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    problems = [p for c in checks.values() for p in c['problems']]
    passed = not problems
    msg = ('node gate: PASS for %s (%s)' % (node_name, ', '.join(sorted(checks))) if passed
           else 'node gate: FAIL for %s: %s' % (node_name, '; '.join(problems)))
    return {'node': node_name, 'passed': passed, 'msg': msg, 'problems': problems, 'checks': checks}
