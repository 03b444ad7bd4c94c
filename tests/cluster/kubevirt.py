"""A stand-in for KubeVirt's VirtualMachine controller on the test control plane (test support).

KubeVirt's controllers are not available as Go modules (its operator is published as images), so
the control plane serves KubeVirt's CRDs (crds/kubevirt.yaml) and this thread plays the one part
of virt-controller the collection depends on, through the real API (as the setup identity, so the
fault proxy's request log shows only what the modules under test sent):

- a VirtualMachine whose run strategy is Halted (`spec.runStrategy: Halted`, or `spec.running:
  false` without a runStrategy) loses its VirtualMachineInstance: the VMI is deleted with
  foreground propagation, so the real garbage collector removes its virt-launcher pod (owned by
  the VMI, blockOwnerDeletion) first and the VMI goes only once its launcher is gone, in the order
  KubeVirt shuts a VM down;
- with `start_vms=True`, a VirtualMachine whose run strategy is Always or RerunOnFailure (or
  `spec.running: true`) and has no VMI gets one from `spec.template`, owned by the VM, with status
  Running on a node, and a virt-launcher pod owned by the VMI bound to that node (labels
  `kubevirt.io=virt-launcher`, `vm.kubevirt.io/name`; the VMI's GPU and host devices as its resource
  limits, as KubeVirt's device plugins have them); KWOK then plays the pod Running.

The node is chosen as a scheduler would filter: Ready, not cordoned, taints with effect NoSchedule
or NoExecute tolerated by the template, its nodeSelector and required node affinity matched;
among those, nodes advertising every device resource the VMI needs are preferred, then the first by
name. No such node: the VM waits (checked again each round), as a real VM stays Pending.

    with KubeVirtStandIn(cluster, start_vms=True) as kv:
        ...                   # drain (VMs halted), upgrade, start_vms (VMs running again)
    kv.halted, kv.started     # 'namespace/name' of each VM stopped or started, in order
"""
from __future__ import annotations

import secrets
import string
from typing import Any

from .background import Background
from .client import ApiError, Cluster

KUBEVIRT = 'kubevirt.io/v1'
LAUNCHER_IMAGE = 'quay.io/kubevirt/virt-launcher:v1.5.0'
STARTING = ('Always', 'RerunOnFailure')


def run_strategy(vm: dict[str, Any]) -> str | None:
    """The VM's effective run strategy: spec.runStrategy, else spec.running as Always/Halted."""
    spec = vm.get('spec') or {}
    if spec.get('runStrategy'):
        return str(spec['runStrategy'])
    if 'running' in spec:
        return 'Always' if spec['running'] else 'Halted'
    return None


def _ready(node: dict[str, Any]) -> bool:
    conds = {c.get('type'): c.get('status') for c in (node.get('status') or {}).get('conditions') or []}
    return conds.get('Ready') == 'True'


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    if taint.get('effect') not in ('NoSchedule', 'NoExecute'):
        return True
    for tol in tolerations:
        if tol.get('effect') and tol['effect'] != taint.get('effect'):
            continue
        if tol.get('operator') == 'Exists':
            if not tol.get('key') or tol['key'] == taint.get('key'):
                return True
        elif tol.get('key') == taint.get('key') and (tol.get('value') or '') == (taint.get('value') or ''):
            return True
    return False


def _expression_holds(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    op, key, values = expr.get('operator'), expr.get('key'), expr.get('values') or []
    if op == 'In':
        return labels.get(key) in values
    if op == 'NotIn':
        return labels.get(key) not in values
    if op == 'Exists':
        return key in labels
    if op == 'DoesNotExist':
        return key not in labels
    if op in ('Gt', 'Lt') and key in labels:
        try:
            have, want = int(labels[key]), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > want if op == 'Gt' else have < want
    return False


def node_allows(node: dict[str, Any], pod_spec: dict[str, Any]) -> bool:
    """Whether a pod (or VMI) spec may run on the node: Ready, schedulable, selector, affinity, taints."""
    if not _ready(node) or (node.get('spec') or {}).get('unschedulable'):
        return False
    labels = (node.get('metadata') or {}).get('labels') or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get('nodeSelector') or {}).items()):
        return False
    required = (((pod_spec.get('affinity') or {}).get('nodeAffinity') or {})
                .get('requiredDuringSchedulingIgnoredDuringExecution') or {})
    terms = required.get('nodeSelectorTerms') or []
    if terms and not any(all(_expression_holds(e, labels) for e in t.get('matchExpressions') or [])
                         for t in terms):
        return False
    tolerations = pod_spec.get('tolerations') or []
    return all(_tolerated(t, tolerations) for t in (node.get('spec') or {}).get('taints') or [])


def device_resources(vmi_spec: dict[str, Any]) -> dict[str, str]:
    """The resource limits KubeVirt's device plugins give a launcher pod for the VMI's devices."""
    devices = ((vmi_spec.get('domain') or {}).get('devices') or {})
    out: dict[str, int] = {}
    for dev in (devices.get('gpus') or []) + (devices.get('hostDevices') or []):
        if dev.get('deviceName'):
            out[dev['deviceName']] = out.get(dev['deviceName'], 0) + 1
    return {k: str(v) for k, v in out.items()}


class KubeVirtStandIn(Background):
    """Plays KubeVirt's VM controller in a thread while the context is open (see the module docstring).
    `errors` keeps the API errors of races with a test's own writes (the next round sees the new state)."""

    label = 'kubevirt stand-in'
    raise_errors = False
    join_timeout = 10.0

    def __init__(self, cluster: Cluster, interval: float = 0.2, start_vms: bool = False) -> None:
        super().__init__(interval)
        self.cluster = cluster
        self.start_vms = start_vms
        self.halted: list[str] = []
        self.started: list[str] = []
        self._vmi = cluster.resource(KUBEVIRT, 'VirtualMachineInstance')
        self._pod = cluster.resource('v1', 'Pod')

    def step(self) -> None:
        try:
            self.reconcile()
        except ApiError as exc:   # a race with a test's own writes: the next round sees the new state
            self.errors.append(str(exc))

    # ------------------------------------------------------------------ one round
    def reconcile(self) -> None:
        """One pass over every VirtualMachine (also callable directly, without the thread)."""
        vmis = {(v['metadata']['namespace'], v['metadata']['name']): v
                for v in self.cluster.list(KUBEVIRT, 'VirtualMachineInstance')}
        for vm in self.cluster.list(KUBEVIRT, 'VirtualMachine'):
            meta = vm['metadata']
            key = (meta['namespace'], meta['name'])
            if meta.get('deletionTimestamp'):
                continue
            strategy = run_strategy(vm)
            vmi = vmis.get(key)
            if strategy == 'Halted':
                if vmi is not None and not vmi['metadata'].get('deletionTimestamp'):
                    self._stop_vmi(vmi)
                    self.halted.append('%s/%s' % key)
            elif strategy in STARTING and self.start_vms and vmi is None:
                if self._start(vm):
                    self.started.append('%s/%s' % key)

    def _stop_vmi(self, vmi: dict[str, Any]) -> None:
        meta = vmi['metadata']
        self.cluster.api.request('DELETE', self._vmi.path(meta['namespace'], meta['name']), ok404=True,
                                 body={'propagationPolicy': 'Foreground',
                                       'preconditions': {'uid': meta['uid']}})

    def _choose_node(self, spec: dict[str, Any]) -> str | None:
        nodes = sorted((n for n in self.cluster.list('v1', 'Node') if node_allows(n, spec)),
                       key=lambda n: n['metadata']['name'])
        wanted = device_resources(spec)
        with_devices = [n for n in nodes if all(k in ((n.get('status') or {}).get('allocatable') or {})
                                                for k in wanted)]
        chosen = with_devices or nodes
        return chosen[0]['metadata']['name'] if chosen else None

    def _start(self, vm: dict[str, Any]) -> bool:
        meta = vm['metadata']
        ns, name = meta['namespace'], meta['name']
        template = (vm.get('spec') or {}).get('template') or {}
        spec = dict(template.get('spec') or {})
        node = self._choose_node(spec)
        if node is None:
            return False
        tmeta = template.get('metadata') or {}
        labels = dict(tmeta.get('labels') or {})
        labels['kubevirt.io/nodeName'] = node
        vmi_meta: dict[str, Any] = {
            'name': name, 'namespace': ns, 'labels': labels,
            'ownerReferences': [{'apiVersion': KUBEVIRT, 'kind': 'VirtualMachine', 'name': name, 'uid': meta['uid'],
                                 'controller': True, 'blockOwnerDeletion': True}]}
        if tmeta.get('annotations'):
            vmi_meta['annotations'] = dict(tmeta['annotations'])
        vmi = self.cluster.api.request('POST', self._vmi.path(ns), body={
            'apiVersion': KUBEVIRT, 'kind': 'VirtualMachineInstance', 'metadata': vmi_meta, 'spec': spec,
            'status': {'phase': 'Running', 'nodeName': node}})
        suffix = ''.join(secrets.choice(string.ascii_lowercase + string.digits) for dummy in range(5))
        limits = device_resources(spec)
        container: dict[str, Any] = {'name': 'compute', 'image': LAUNCHER_IMAGE}
        if limits:
            container['resources'] = {'limits': dict(limits), 'requests': dict(limits)}
        pod_meta = {'name': 'virt-launcher-%s-%s' % (name, suffix), 'namespace': ns,
                    'labels': {'kubevirt.io': 'virt-launcher', 'vm.kubevirt.io/name': name,
                               'kubevirt.io/created-by': vmi['metadata']['uid']},
                    'ownerReferences': [{'apiVersion': KUBEVIRT, 'kind': 'VirtualMachineInstance', 'name': name,
                                         'uid': vmi['metadata']['uid'], 'controller': True,
                                         'blockOwnerDeletion': True}]}
        pod = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': pod_meta,
               'spec': {'nodeName': node, 'containers': [container], 'tolerations': spec.get('tolerations') or [],
                        'volumes': [{'name': 'private', 'emptyDir': {}}]}}
        if not pod['spec']['tolerations']:
            del pod['spec']['tolerations']
        self.cluster.api.request('POST', self._pod.path(ns), body=pod)
        return True
