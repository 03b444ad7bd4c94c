"""PodDisruptionBudget arithmetic and the eviction decision, as the disruption controller and the
eviction REST handler of kube-apiserver compute them.

- expected pods: for each distinct controller of the matching pods whose object is in the store
  and has `spec.replicas`, that number; every other matching (non-terminal) pod counts one;
- minAvailable int N: desired healthy N; percent P: ceil(P * expected / 100);
- maxUnavailable int N: desired healthy = expected - N; percent P: expected - ceil(P * expected / 100);
- current healthy: matching pods that are Ready, Running and not being deleted;
- disruptions allowed = max(0, current healthy - desired healthy).

An eviction is refused with 429 when the pod's budget allows no disruption, except that a pod
that is not Ready may go while the budget is met (unhealthyPodEvictionPolicy IfHealthyBudget,
the default) or always (AlwaysAllow). Pods that are Pending, Succeeded, Failed or already being
deleted are evicted regardless of budgets, as the API server does.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from .selectors import label_selector_from_dict


def scaled_value(value: Any, total: int, round_up: bool = True) -> int:
    """intstr.GetScaledValueFromIntOrPercent."""
    if isinstance(value, bool):
        raise ValueError('invalid int-or-string %r' % value)
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.endswith('%'):
        pct = int(text[:-1])
        raw = pct * total / 100.0
        return int(math.ceil(raw)) if round_up else int(math.floor(raw))
    return int(text)


def pod_ready(pod: dict) -> bool:
    status = pod.get('status') or {}
    if status.get('phase') != 'Running':
        return False
    for cond in status.get('conditions') or []:
        if cond.get('type') == 'Ready':
            return cond.get('status') == 'True'
    return False


def _controller(pod: dict) -> dict | None:
    for ref in pod.get('metadata', {}).get('ownerReferences') or []:
        if ref.get('controller'):
            return ref
    return None


def matching_pods(pdb: dict, pods: Iterable[dict]) -> list[dict]:
    pred = label_selector_from_dict(pdb.get('spec', {}).get('selector'))
    if pred is None:
        return []
    ns = pdb['metadata'].get('namespace')
    return [p for p in pods if p['metadata'].get('namespace') == ns
            and pred(p['metadata'].get('labels') or {})]


def budget(pdb: dict, pods: list[dict], controller_replicas: dict[str, int] | None = None) -> dict:
    """The status the disruption controller would write for this PDB over these matching pods."""
    spec = pdb.get('spec') or {}
    live = [p for p in pods if (p.get('status') or {}).get('phase') not in ('Succeeded', 'Failed')]
    expected = 0
    seen: set[str] = set()
    replicas = controller_replicas or {}
    for pod in live:
        ref = _controller(pod)
        if ref is not None and ref.get('uid') in replicas:
            if ref['uid'] not in seen:
                seen.add(ref['uid'])
                expected += replicas[ref['uid']]
        elif not pod['metadata'].get('deletionTimestamp'):
            expected += 1
    healthy = sum(1 for p in live if pod_ready(p) and not p['metadata'].get('deletionTimestamp'))
    if spec.get('maxUnavailable') is not None:
        desired = max(0, expected - scaled_value(spec['maxUnavailable'], expected, True))
    elif spec.get('minAvailable') is not None:
        desired = scaled_value(spec['minAvailable'], expected, True)
    else:
        desired = 0  # policy/v1 has no default: neither field set means no pod is required
    return {
        'currentHealthy': healthy,
        'desiredHealthy': desired,
        'expectedPods': expected,
        'disruptionsAllowed': max(0, healthy - desired),
        'observedGeneration': pdb['metadata'].get('generation', 1),
        'conditions': [{
            'type': 'DisruptionAllowed',
            'status': 'True' if healthy - desired > 0 else 'False',
            'reason': 'SufficientPods' if healthy - desired > 0 else 'InsufficientPods',
            'message': '', 'observedGeneration': pdb['metadata'].get('generation', 1),
            'lastTransitionTime': pdb['metadata'].get('creationTimestamp'),
        }],
    }


def eviction_decision(pod: dict, pdbs: list[dict], pods_in_ns: list[dict],
                      controller_replicas: dict[str, int] | None = None) -> tuple[int, str, str | None]:
    """(HTTP status, message, PDB name) for an eviction of `pod`: 201 allows it."""
    phase = (pod.get('status') or {}).get('phase')
    if phase in ('Pending', 'Succeeded', 'Failed') or pod['metadata'].get('deletionTimestamp'):
        return 201, '', None
    labels = pod['metadata'].get('labels') or {}
    matched = []
    for pdb in pdbs:
        pred = label_selector_from_dict(pdb.get('spec', {}).get('selector'))
        if pred is not None and pred(labels):
            matched.append(pdb)
    if not matched:
        return 201, '', None
    if len(matched) > 1:
        return 500, ('This pod has more than one PodDisruptionBudget, which the eviction subresource does not '
                     'support.'), matched[0]['metadata']['name']
    pdb = matched[0]
    name = pdb['metadata']['name']
    status = budget(pdb, matching_pods(pdb, pods_in_ns), controller_replicas)
    policy = (pdb.get('spec') or {}).get('unhealthyPodEvictionPolicy') or 'IfHealthyBudget'
    if not pod_ready(pod):
        if policy == 'AlwaysAllow' or status['currentHealthy'] >= status['desiredHealthy']:
            return 201, '', name
    if status['disruptionsAllowed'] > 0:
        return 201, '', name
    return 429, ('Cannot evict pod as it would violate the pod\'s disruption budget.'
                 ' The disruption budget %s needs %d healthy pods and has %d currently'
                 % (name, status['desiredHealthy'], status['currentHealthy'])), name
