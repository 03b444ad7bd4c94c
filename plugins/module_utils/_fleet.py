# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""What the orchestration reads about a GPU pool from the Kubernetes API (pure functions).

`node_facts(node)` turns a Node into the planner's input row (kernel and RKE2 as the kubelet
reports them, GPU capacity, readiness, cordon, the gpufleet.io progress annotations);
`image_version(obj)` reads a component's version from the tag of its first container image.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_resources import GPU
_TAG_RE = re.compile(r':(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127})$')


class FleetError(ValueError):
    pass


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def gpu_capacity(node: Dict[str, Any]) -> int:
    """Whole GPUs the node offers: allocatable `nvidia.com/gpu`, else its GPU count label."""
    alloc = (node.get('status') or {}).get('allocatable') or {}
    count = _int(alloc.get(GPU))
    if count:
        return count
    labels = (node.get('metadata') or {}).get('labels') or {}
    return _int(labels.get('nvidia.com/gpu.count'))


def is_ready(node: Dict[str, Any]) -> bool:
    for cond in (node.get('status') or {}).get('conditions') or []:
        if cond.get('type') == 'Ready':
            return cond.get('status') == 'True'
    return False


def node_identity(node: Dict[str, Any]) -> Dict[str, Any]:
    """Who the node is, beyond its name: the Node object's UID (a Node deleted and re-registered under
    the same name gets another) and the machine-id and system UUID its kubelet reports (the host's
    /etc/machine-id and the board's DMI UUID). None where not reported."""
    info = (node.get('status') or {}).get('nodeInfo') or {}
    return {'uid': (node.get('metadata') or {}).get('uid') or None,
            'machine_id': info.get('machineID') or None, 'system_uuid': info.get('systemUUID') or None}


def node_facts(node: Dict[str, Any]) -> Dict[str, Any]:
    meta = node.get('metadata') or {}
    labels = dict(meta.get('labels') or {})
    ann = meta.get('annotations') or {}
    info = (node.get('status') or {}).get('nodeInfo') or {}
    return {
        'name': meta.get('name'),
        'labels': labels,
        'annotations': {k: v for k, v in sorted(ann.items()) if k.startswith('gpufleet.io/')},
        'ready': is_ready(node),
        'unschedulable': bool((node.get('spec') or {}).get('unschedulable')),
        'taints': list((node.get('spec') or {}).get('taints') or []),
        'gpus': gpu_capacity(node),
        'kernel': info.get('kernelVersion'),
        'rke2': info.get('kubeletVersion'),
        'platform': labels.get('gpufleet.io/platform') or labels.get('node.kubernetes.io/instance-type') or 'unknown',
        'gpu_product': labels.get('nvidia.com/gpu.product'),
        **node_identity(node),
    }


def image_version(obj: Optional[Dict[str, Any]], container: Optional[str] = None) -> Optional[str]:
    """The tag of the named (else first) container image of a workload or pod, `v` kept."""
    if not obj:
        return None
    spec = obj.get('spec') or {}
    pod_spec = ((spec.get('template') or {}).get('spec')) or spec
    containers: List[Dict[str, Any]] = list(pod_spec.get('containers') or [])
    if container:
        containers = [c for c in containers if c.get('name') == container]
    if not containers:
        return None
    image = str(containers[0].get('image') or '').split('@', 1)[0]
    m = _TAG_RE.search(image.rsplit('/', 1)[-1])
    return m.group('tag') if m else None


def validate_resource(i: int, spec: Any) -> Dict[str, Any]:
    if not isinstance(spec, dict):
        raise FleetError('resources[%d]: expected a mapping, got %r' % (i, spec))
    for key in ('api_version', 'kind'):
        if not isinstance(spec.get(key), str) or not spec.get(key):
            raise FleetError('resources[%d].%s: required, got %r' % (i, key, spec.get(key)))
    extra = set(spec) - {'api_version', 'kind', 'namespace', 'name', 'label_selector', 'field_selector', 'plural'}
    if extra:
        raise FleetError('resources[%d]: unknown keys %s' % (i, ', '.join(sorted(extra))))
    return spec


def plural_of(kind: str) -> str:
    low = kind.lower()
    if low.endswith('y'):
        return low[:-1] + 'ies'
    if low.endswith(('s', 'x', 'ch', 'sh')):
        return low + 'es'
    return low + 's'
