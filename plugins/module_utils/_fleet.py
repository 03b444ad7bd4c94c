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

The pool (`pool_query`, `in_pool`, `pool_nodes`), the one decision of every reader of the pool (fleet_info, the
gpu_nodes inventory): an explicit label selector is the pool exactly as the API answers it (the empty selector:
every Node); without one (None), the default pool is every Node `is_gpu_node` says is an NVIDIA GPU node - labelled
by GPU Feature Discovery or Node Feature Discovery, or reporting NVIDIA GPU capacity, or carrying this collection's
progress annotations - so the default works without GPU Feature Discovery.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional

from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_resources import GPU, is_gpu_resource
from ansible_collections.gpufleet.upgrade.plugins.module_utils._platform import node_platform
_TAG_RE = re.compile(r':(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127})$')
# GPU Feature Discovery's (and the GPU Operator's) label of a node with NVIDIA GPUs.
GPU_PRESENT_LABEL = 'nvidia.com/gpu.present'
# Node Feature Discovery's label of a node with an NVIDIA (vendor 10de) PCI device: `pci-10de.present` as the GPU
# Operator configures NFD (vendor only), `pci-0302_10de.present` with NFD's default class_vendor fields (display
# controller classes 03xx only: an NVSwitch is 10de too, but a bridge).
_NFD_NVIDIA_RE = re.compile(r'^feature\.node\.kubernetes\.io/pci-(?:03[0-9a-f]{2}_)?10de\.present$')
# The annotations this collection writes on a Node it upgrades (progress records).
_RECORD_PREFIX = 'gpufleet.io/'


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
        # As the Node says it (labels); the plan adds the host's DMI identity where no label says it.
        'platform': node_platform(labels),
        'gpu_product': labels.get('nvidia.com/gpu.product'),
        **node_identity(node),
    }


def is_gpu_node(node: Dict[str, Any]) -> bool:
    """Whether the default pool holds `node`: its label `nvidia.com/gpu.present=true` (GPU Feature Discovery), an
    NFD label of an NVIDIA PCI device (vendor only, or a display class), NVIDIA GPU capacity or allocatable (`nvidia.com/gpu`,
    `nvidia.com/gpu.shared`, `nvidia.com/mig-*` above 0, as the device plugin advertises them), or a `gpufleet.io/`
    annotation (a node this collection is upgrading or upgraded: its device plugin may be down and its capacity
    gone while its driver is replaced, and it stays in the pool)."""
    meta = node.get('metadata') or {}
    labels = meta.get('labels') or {}
    if str(labels.get(GPU_PRESENT_LABEL) or '').strip().lower() == 'true':
        return True
    if any(_NFD_NVIDIA_RE.match(k) and str(v).strip().lower() == 'true' for k, v in labels.items()):
        return True
    status = node.get('status') or {}
    for resources in (status.get('capacity') or {}, status.get('allocatable') or {}):
        if any(is_gpu_resource(k) and _int(v) > 0 for k, v in resources.items()):
            return True
    return any(str(k).startswith(_RECORD_PREFIX) for k in meta.get('annotations') or {})


def _selector(node_selector: Optional[str]) -> Optional[str]:
    """The explicit label selector ('' is Kubernetes' empty selector, every Node), or None for the default pool;
    FleetError naming the value when it is not a string."""
    if node_selector is None:
        return None
    if not isinstance(node_selector, str):
        raise FleetError('node_selector: %r is not a label selector string' % (node_selector,))
    return node_selector.strip()


def pool_query(node_selector: Optional[str]) -> Dict[str, str]:
    """The query of the Node list that reads the pool: an explicit selector's `labelSelector`; none for the empty
    selector (every Node) and for the default pool (chosen from every Node by `in_pool`)."""
    selector = _selector(node_selector)
    return {'labelSelector': selector} if selector else {}


def in_pool(node: Dict[str, Any], node_selector: Optional[str]) -> bool:
    """Whether a Node the `pool_query` list returned is in the pool: every one for an explicit selector (the API
    chose them), `is_gpu_node` for the default pool (None)."""
    return _selector(node_selector) is not None or is_gpu_node(node)


def pool_nodes(nodes: Iterable[Dict[str, Any]], node_selector: Optional[str],
               named: bool = False) -> List[Dict[str, Any]]:
    """The Nodes of the pool among those the `pool_query` list returned. With `named` (the caller asked for Nodes
    by name), the default pool keeps every one: a Node named is read whatever it reports now."""
    if named and _selector(node_selector) is None:
        return [n for n in nodes if isinstance(n, dict)]
    return [n for n in nodes if isinstance(n, dict) and in_pool(n, node_selector)]


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
