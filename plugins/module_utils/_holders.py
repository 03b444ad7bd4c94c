# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Which pods, VirtualMachineInstances and ResourceClaims hold GPUs (pure functions over dicts).

A **Pod** holds GPUs when it is not finished (phase not Succeeded/Failed), is bound to a node, and
- a container or init container requests or limits a GPU resource (by default those of
  `_gpu_resources`: `nvidia.com/gpu`, `nvidia.com/gpu.shared`, or a name starting with
  `nvidia.com/mig-`; an entry ending in `*` is a prefix), or
- its `runtimeClassName` is a GPU runtime class (`nvidia` by default), or
- it uses a ResourceClaim allocated by a GPU DRA driver (`gpu.nvidia.com` by default).
A **VirtualMachineInstance** holds GPUs when `spec.domain.devices.gpus` or `hostDevices` is not
empty; its virt-launcher pod is reported under the VMI (reasons merged), never as a Pod.
A **ResourceClaim** holds GPUs when a GPU DRA driver allocated it a device on a node.

Each holder: kind, namespace, name, uid, node, reason (reasons joined by '; '), reasons, owner
('Kind/name' of the controller, or 'none'), phase, local_data (emptyDir or hostPath),
daemonset, unmanaged (no controller).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_resources import GPU_RESOURCES

DEFAULT_GPU_RESOURCES = list(GPU_RESOURCES)
DEFAULT_RUNTIME_CLASSES = ['nvidia']
DEFAULT_DRA_DRIVERS = ['gpu.nvidia.com']
FINISHED_PHASES = ('Succeeded', 'Failed')
KINDS = ('Pod', 'VirtualMachineInstance', 'ResourceClaim')
MIRROR_ANNOTATION = 'kubernetes.io/config.mirror'


class HolderOptionError(ValueError):
    """A classification option is malformed (names the option and the value)."""


def validate_options(gpu_resources: Sequence[str], runtime_classes: Sequence[str],
                     dra_drivers: Sequence[str]) -> None:
    for opt, values in (('gpu_resources', gpu_resources), ('runtime_classes', runtime_classes),
                        ('dra_drivers', dra_drivers)):
        for v in values:
            if not isinstance(v, str) or not v.strip() or v.strip() == '*':
                raise HolderOptionError('%s: %r is not a valid name (expected a non-empty name, optionally '
                                        'ending in * for a prefix)' % (opt, v))
            if '*' in v[:-1]:
                raise HolderOptionError('%s: %r: * is allowed only at the end (a prefix)' % (opt, v))


def resource_matches(name: str, patterns: Sequence[str]) -> bool:
    for p in patterns:
        if p.endswith('*'):
            if name.startswith(p[:-1]):
                return True
        elif name == p:
            return True
    return False


def _meta(obj: Dict[str, Any]) -> Dict[str, Any]:
    return obj.get('metadata') or {}


def controller_of(obj: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The ownerReference with controller: true (None when there is none)."""
    for ref in _meta(obj).get('ownerReferences') or []:
        if ref.get('controller'):
            return ref
    return None


def owner_string(obj: Dict[str, Any]) -> str:
    ref = controller_of(obj)
    if not ref:
        return 'none'
    return '%s/%s' % (ref.get('kind'), ref.get('name'))


def is_mirror_pod(pod: Dict[str, Any]) -> bool:
    return MIRROR_ANNOTATION in (_meta(pod).get('annotations') or {})


def is_daemonset_pod(pod: Dict[str, Any]) -> bool:
    ref = controller_of(pod)
    return bool(ref and ref.get('kind') == 'DaemonSet')


def has_local_data(pod: Dict[str, Any]) -> bool:
    """emptyDir or hostPath volumes (holder flag)."""
    return any('emptyDir' in v or 'hostPath' in v for v in (pod.get('spec') or {}).get('volumes') or [])


def has_empty_dir(pod: Dict[str, Any]) -> bool:
    """emptyDir volumes: data lost on eviction (what kubectl drain blocks on)."""
    return any('emptyDir' in v for v in (pod.get('spec') or {}).get('volumes') or [])


def vmi_owner_of_pod(pod: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """(namespace, name) of the VMI whose virt-launcher this pod is, else None.

    KubeVirt sets a controller ownerReference of kind VirtualMachineInstance on the launcher pod
    and labels it `kubevirt.io=virt-launcher`, `vm.kubevirt.io/name=<vmi>`.
    """
    meta = _meta(pod)
    ns = meta.get('namespace') or 'default'
    for ref in meta.get('ownerReferences') or []:
        if ref.get('kind') == 'VirtualMachineInstance':
            return ns, ref.get('name')
    labels = meta.get('labels') or {}
    if labels.get('kubevirt.io') == 'virt-launcher' and labels.get('vm.kubevirt.io/name'):
        return ns, labels['vm.kubevirt.io/name']
    return None


def pod_gpu_resources(pod: Dict[str, Any], gpu_resources: Sequence[str]) -> List[str]:
    found: List[str] = []
    spec = pod.get('spec') or {}
    for c in list(spec.get('initContainers') or []) + list(spec.get('containers') or []):
        res = c.get('resources') or {}
        for section in ('limits', 'requests'):
            for name, qty in (res.get(section) or {}).items():
                if resource_matches(name, gpu_resources) and str(qty) not in ('0', '') and name not in found:
                    found.append(name)
    return found


def claim_drivers(claim: Dict[str, Any]) -> List[Dict[str, Any]]:
    alloc = (claim.get('status') or {}).get('allocation') or {}
    return list((alloc.get('devices') or {}).get('results') or [])


def claim_node(claim: Dict[str, Any], pods_by_uid: Optional[Dict[str, Dict[str, Any]]] = None) -> Optional[str]:
    """The node a claim's devices are on: the allocation's node selector (metadata.name), else the
    node of a pod it is reserved for."""
    alloc = (claim.get('status') or {}).get('allocation') or {}
    for term in ((alloc.get('nodeSelector') or {}).get('nodeSelectorTerms') or []):
        for expr in term.get('matchFields') or []:
            if expr.get('key') == 'metadata.name' and expr.get('operator') == 'In' and expr.get('values'):
                return expr['values'][0]
    for ref in (claim.get('status') or {}).get('reservedFor') or []:
        pod = (pods_by_uid or {}).get(ref.get('uid'))
        if pod and (pod.get('spec') or {}).get('nodeName'):
            return pod['spec']['nodeName']
    return None


def gpu_claim_reason(claim: Dict[str, Any], dra_drivers: Sequence[str]) -> Optional[str]:
    devices = ['%s %s' % (r.get('driver'), r.get('device') or r.get('request'))
               for r in claim_drivers(claim) if resource_matches(str(r.get('driver')), dra_drivers)]
    if not devices:
        return None
    return 'DRA devices ' + ', '.join(devices)


def pod_claim_names(pod: Dict[str, Any]) -> List[str]:
    """Names of the ResourceClaims a pod uses (direct, or generated from a template)."""
    names: List[str] = []
    generated = {s.get('name'): s.get('resourceClaimName')
                 for s in (pod.get('status') or {}).get('resourceClaimStatuses') or []}
    for rc in (pod.get('spec') or {}).get('resourceClaims') or []:
        name = rc.get('resourceClaimName') or generated.get(rc.get('name'))
        if name and name not in names:
            names.append(name)
    return names


def vmi_gpu_reasons(vmi: Dict[str, Any]) -> List[str]:
    devices = (((vmi.get('spec') or {}).get('domain') or {}).get('devices') or {})
    reasons = ['VMI gpu %s' % (g.get('deviceName') or g.get('name')) for g in devices.get('gpus') or []]
    reasons += ['VMI hostDevice %s' % (h.get('deviceName') or h.get('name')) for h in devices.get('hostDevices') or []]
    return reasons


def vmi_node(vmi: Dict[str, Any]) -> Optional[str]:
    return (vmi.get('status') or {}).get('nodeName') or (_meta(vmi).get('labels') or {}).get('kubevirt.io/nodeName')


def pod_gpu_reasons(pod: Dict[str, Any], gpu_resources: Sequence[str], runtime_classes: Sequence[str],
                    gpu_claims: Dict[Tuple[str, str], str]) -> List[str]:
    """Why a pod holds GPUs ([] when it does not). gpu_claims: (namespace, claim) -> reason."""
    reasons = ['resource %s' % r for r in pod_gpu_resources(pod, gpu_resources)]
    rc = (pod.get('spec') or {}).get('runtimeClassName')
    if rc and rc in runtime_classes:
        reasons.append('runtimeClass %s' % rc)
    ns = _meta(pod).get('namespace') or 'default'
    for name in pod_claim_names(pod):
        if (ns, name) in gpu_claims:
            reasons.append('DRA claim %s' % name)
    return reasons


def _entry(kind: str, obj: Dict[str, Any], node: Optional[str], reasons: List[str], phase: Optional[str],
           local_data: bool = False, daemonset: bool = False) -> Dict[str, Any]:
    meta = _meta(obj)
    owner = owner_string(obj)
    return {
        'kind': kind,
        'namespace': meta.get('namespace'),
        'name': meta.get('name'),
        'uid': meta.get('uid'),
        'node': node,
        'reason': '; '.join(reasons),
        'reasons': list(reasons),
        'owner': owner,
        'phase': phase,
        'local_data': local_data,
        'daemonset': daemonset,
        'unmanaged': owner == 'none',
    }


def claim_phase(claim: Dict[str, Any]) -> str:
    status = claim.get('status') or {}
    if status.get('reservedFor'):
        return 'Reserved'
    return 'Allocated' if status.get('allocation') else 'Pending'


class Classifier:
    """Streaming classification: give it the (small) VMI and claim lists, then pods page by page;
    only holders are kept, so a cluster-wide pod list never sits in memory whole."""

    def __init__(self, vmis: Iterable[Dict[str, Any]] = (), claims: Iterable[Dict[str, Any]] = (),
                 gpu_resources: Sequence[str] = tuple(DEFAULT_GPU_RESOURCES),
                 runtime_classes: Sequence[str] = tuple(DEFAULT_RUNTIME_CLASSES),
                 dra_drivers: Sequence[str] = tuple(DEFAULT_DRA_DRIVERS)) -> None:
        self.gpu_resources = tuple(gpu_resources)
        self.runtime_classes = tuple(runtime_classes)
        self.dra_drivers = tuple(dra_drivers)
        self.gpu_claims: Dict[Tuple[str, str], str] = {}
        self.claims: List[Dict[str, Any]] = []
        self.reserved_uids: Dict[str, Optional[str]] = {}   # pod uid -> node, for claims without a node selector
        for claim in claims:
            reason = gpu_claim_reason(claim, self.dra_drivers)
            if not reason:
                continue
            meta = _meta(claim)
            self.gpu_claims[(meta.get('namespace') or 'default', meta.get('name'))] = reason
            self.claims.append(claim)
            for r in (claim.get('status') or {}).get('reservedFor') or []:
                if r.get('uid'):
                    self.reserved_uids[r['uid']] = None
        self.vmi_entries: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self.vmi_objs: Dict[Tuple[str, str], Dict[str, Any]] = {}
        for vmi in vmis:
            meta = _meta(vmi)
            key = (meta.get('namespace') or 'default', meta.get('name'))
            self.vmi_objs[key] = vmi
            reasons = vmi_gpu_reasons(vmi)
            if reasons:
                self.vmi_entries[key] = _entry('VirtualMachineInstance', vmi, vmi_node(vmi), reasons,
                                               (vmi.get('status') or {}).get('phase'))
        self.pod_holders: List[Dict[str, Any]] = []

    def add_pods(self, pods: Iterable[Dict[str, Any]]) -> None:
        for pod in pods:
            uid = _meta(pod).get('uid')
            node = (pod.get('spec') or {}).get('nodeName')
            if uid in self.reserved_uids:
                self.reserved_uids[uid] = node
            phase = (pod.get('status') or {}).get('phase')
            if phase in FINISHED_PHASES or not node:
                continue
            reasons = pod_gpu_reasons(pod, self.gpu_resources, self.runtime_classes, self.gpu_claims)
            vmi_key = vmi_owner_of_pod(pod)
            if vmi_key is not None:
                self._add_launcher(pod, vmi_key, node, reasons)
                continue
            if reasons:
                self.pod_holders.append(_entry('Pod', pod, node, reasons, phase, local_data=has_local_data(pod),
                                               daemonset=is_daemonset_pod(pod)))

    def _add_launcher(self, pod: Dict[str, Any], vmi_key: Tuple[str, str], node: str, reasons: List[str]) -> None:
        entry = self.vmi_entries.get(vmi_key)
        if entry is None and reasons:
            vmi = self.vmi_objs.get(vmi_key) or {'metadata': {'namespace': vmi_key[0], 'name': vmi_key[1]}}
            entry = self.vmi_entries[vmi_key] = _entry('VirtualMachineInstance', vmi, vmi_node(vmi) or node, [],
                                                       (vmi.get('status') or {}).get('phase'))
        if entry is None:
            return
        for r in reasons:
            r = 'launcher pod %s' % r
            if r not in entry['reasons']:
                entry['reasons'].append(r)
        entry['reason'] = '; '.join(entry['reasons'])
        entry['node'] = entry['node'] or node
        entry['launcher_pod'] = _meta(pod).get('name')
        entry['local_data'] = entry['local_data'] or has_local_data(pod)

    def holders(self, nodes: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
        """All holders, sorted by (node, kind, namespace, name); `nodes` keeps only those nodes."""
        out = list(self.pod_holders) + list(self.vmi_entries.values())
        for claim in self.claims:
            node = claim_node(claim)
            if node is None:
                for r in (claim.get('status') or {}).get('reservedFor') or []:
                    node = node or self.reserved_uids.get(r.get('uid'))
            meta = _meta(claim)
            out.append(_entry('ResourceClaim', claim, node,
                              [self.gpu_claims[(meta.get('namespace') or 'default', meta.get('name'))]],
                              claim_phase(claim)))
        if nodes is not None:
            node_set = set(nodes)
            out = [h for h in out if h['node'] in node_set]
        out.sort(key=lambda h: (h['node'] or '', KINDS.index(h['kind']), h['namespace'] or '', h['name'] or ''))
        return out


def classify(pods: Iterable[Dict[str, Any]], vmis: Iterable[Dict[str, Any]] = (),
             claims: Iterable[Dict[str, Any]] = (), gpu_resources: Sequence[str] = tuple(DEFAULT_GPU_RESOURCES),
             runtime_classes: Sequence[str] = tuple(DEFAULT_RUNTIME_CLASSES),
             dra_drivers: Sequence[str] = tuple(DEFAULT_DRA_DRIVERS),
             nodes: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    """All GPU holders among the objects, sorted by (node, kind, namespace, name).

    `nodes` limits the result to holders on those nodes (None: every node).
    """
    c = Classifier(vmis, claims, gpu_resources, runtime_classes, dra_drivers)
    c.add_pods(pods)
    return c.holders(nodes)


def by_node(holders: Iterable[Dict[str, Any]], nodes: Iterable[str] = ()) -> Dict[str, Dict[str, int]]:
    """{node: {'Pod': n, 'VirtualMachineInstance': n, 'ResourceClaim': n, 'total': n}}; every node of
    `nodes` appears, with zeros when nothing holds its GPUs."""
    out: Dict[str, Dict[str, int]] = {}

    def slot(node: str) -> Dict[str, int]:
        if node not in out:
            out[node] = dict.fromkeys(KINDS, 0)
            out[node]['total'] = 0
        return out[node]

    for n in nodes:
        slot(n)
    for h in holders:
        s = slot(h['node'] or '')
        s[h['kind']] += 1
        s['total'] += 1
    return dict(sorted(out.items()))


def node_advertises_gpu(node: Dict[str, Any], gpu_resources: Sequence[str]) -> bool:
    status = node.get('status') or {}
    for section in ('allocatable', 'capacity'):
        for name, qty in (status.get(section) or {}).items():
            if resource_matches(name, gpu_resources) and str(qty) not in ('0', ''):
                return True
    return False


def slice_nodes(slices: Iterable[Dict[str, Any]], dra_drivers: Sequence[str]) -> List[str]:
    """Nodes that publish devices of a GPU DRA driver (ResourceSlice spec.driver / spec.nodeName)."""
    out = []
    for s in slices:
        spec = s.get('spec') or {}
        if resource_matches(str(spec.get('driver')), dra_drivers) and spec.get('nodeName'):
            out.append(spec['nodeName'])
    return sorted(set(out))
