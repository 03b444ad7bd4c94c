"""Kubernetes objects for the issue-3 scenario (holders and drain), shared by unit and integration tests.

Node `gpu-1` holds: GPU pods (`nvidia.com/gpu` and `nvidia.com/mig-1g.10gb`), a runtimeClass-only
pod, a GPU DaemonSet pod, an emptyDir GPU pod, a bare GPU pod, a KubeVirt VMI with a GPU (and its
virt-launcher pod), a pod using a DRA ResourceClaim (and the claim), a non-GPU pod and a mirror
pod. Node `gpu-2` holds one GPU pod. `cpu-1` advertises no GPU.
"""
from __future__ import annotations

import copy
import uuid
from typing import Any

NODE = 'gpu-1'
OTHER = 'gpu-2'


def node(name: str, gpus: int = 8, unschedulable: bool = False, annotations: dict | None = None,
         extra_resources: dict | None = None) -> dict[str, Any]:
    alloc = {'cpu': '64', 'memory': '512Gi', 'pods': '110'}
    if gpus:
        alloc['nvidia.com/gpu'] = str(gpus)
    alloc.update(extra_resources or {})
    obj: dict[str, Any] = {
        'apiVersion': 'v1', 'kind': 'Node',
        'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}, 'annotations': dict(annotations or {})},
        'spec': {},
        'status': {'allocatable': dict(alloc), 'capacity': dict(alloc),
                   'conditions': [{'type': 'Ready', 'status': 'True'}]},
    }
    if unschedulable:
        obj['spec']['unschedulable'] = True
    return obj


def owner(kind: str, name: str, api_version: str | None = None, uid: str | None = None) -> dict[str, Any]:
    api_version = api_version or {'ReplicaSet': 'apps/v1', 'DaemonSet': 'apps/v1', 'StatefulSet': 'apps/v1',
                                  'Job': 'batch/v1', 'VirtualMachineInstance': 'kubevirt.io/v1',
                                  'Node': 'v1'}.get(kind, 'v1')
    return {'apiVersion': api_version, 'kind': kind, 'name': name, 'uid': uid or str(uuid.uuid4()),
            'controller': True, 'blockOwnerDeletion': True}


def pod(name: str, namespace: str = 'ml', node_name: str = NODE, owner_ref: dict | None = None,
        resources: dict | None = None, runtime_class: str | None = None, volumes: list | None = None,
        labels: dict | None = None, annotations: dict | None = None, claims: list | None = None,
        phase: str = 'Running', uid: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {'name': 'main', 'image': 'registry.local/app:1'}
    if resources:
        container['resources'] = {'limits': dict(resources), 'requests': dict(resources)}
    spec: dict[str, Any] = {'nodeName': node_name, 'containers': [container]}
    if runtime_class:
        spec['runtimeClassName'] = runtime_class
    if volumes:
        spec['volumes'] = volumes
    if claims:
        spec['resourceClaims'] = [{'name': c, 'resourceClaimName': c} for c in claims]
    meta: dict[str, Any] = {'name': name, 'namespace': namespace, 'labels': dict(labels or {'app': name}),
                            'annotations': dict(annotations or {})}
    if uid:
        meta['uid'] = uid
    if owner_ref:
        meta['ownerReferences'] = [owner_ref]
    status: dict[str, Any] = {'phase': phase}
    if phase == 'Running':
        status['conditions'] = [{'type': 'Ready', 'status': 'True'}]
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': meta, 'spec': spec, 'status': status}


EMPTY_DIR = [{'name': 'scratch', 'emptyDir': {}}]
HOST_PATH = [{'name': 'dev', 'hostPath': {'path': '/dev'}}]


def vmi(name: str, namespace: str = 'vms', node_name: str = NODE, gpu: str | None = 'nvidia.com/GH100_H100',
        host_device: str | None = None, vm_owner: bool = True) -> dict[str, Any]:
    devices: dict[str, Any] = {}
    if gpu:
        devices['gpus'] = [{'name': 'gpu1', 'deviceName': gpu}]
    if host_device:
        devices['hostDevices'] = [{'name': 'hd1', 'deviceName': host_device}]
    meta: dict[str, Any] = {'name': name, 'namespace': namespace, 'labels': {'kubevirt.io/nodeName': node_name}}
    if vm_owner:
        meta['ownerReferences'] = [owner('VirtualMachine', name, 'kubevirt.io/v1')]
    return {'apiVersion': 'kubevirt.io/v1', 'kind': 'VirtualMachineInstance', 'metadata': meta,
            'spec': {'domain': {'devices': devices}},
            'status': {'phase': 'Running', 'nodeName': node_name}}


def vm(name: str, namespace: str = 'vms', run_strategy: str | None = 'Always') -> dict[str, Any]:
    spec: dict[str, Any] = {'template': {'spec': {'domain': {'devices': {}}}}}
    if run_strategy:
        spec['runStrategy'] = run_strategy
    else:
        spec['running'] = True
    return {'apiVersion': 'kubevirt.io/v1', 'kind': 'VirtualMachine',
            'metadata': {'name': name, 'namespace': namespace}, 'spec': spec}


def launcher_pod(vmi_name: str, namespace: str = 'vms', node_name: str = NODE,
                 resource: str | None = 'nvidia.com/GH100_H100') -> dict[str, Any]:
    p = pod('virt-launcher-%s-x7k2p' % vmi_name, namespace, node_name,
            owner_ref=owner('VirtualMachineInstance', vmi_name),
            resources={resource: '1'} if resource else None, volumes=[{'name': 'private', 'emptyDir': {}}],
            labels={'kubevirt.io': 'virt-launcher', 'vm.kubevirt.io/name': vmi_name})
    return p


def claim(name: str, namespace: str = 'ml', node_name: str = NODE, driver: str = 'gpu.nvidia.com',
          device: str = 'gpu-0', reserved_for: list | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {'allocation': {
        'devices': {'results': [{'request': 'gpu', 'driver': driver, 'pool': node_name, 'device': device}]},
        'nodeSelector': {'nodeSelectorTerms': [{'matchFields': [
            {'key': 'metadata.name', 'operator': 'In', 'values': [node_name]}]}]},
    }}
    if reserved_for:
        status['reservedFor'] = [{'resource': 'pods', 'name': n} for n in reserved_for]
    return {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceClaim',
            'metadata': {'name': name, 'namespace': namespace},
            'spec': {'devices': {'requests': [{'name': 'gpu', 'exactly': {'deviceClassName': 'gpu.nvidia.com'}}]}},
            'status': status}


def namespaces(*names: str) -> list[dict[str, Any]]:
    return [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': n}} for n in names]


def scenario() -> list[dict[str, Any]]:
    """Every object of the issue-3 scenario, in an order a server accepts."""
    objs: list[dict[str, Any]] = namespaces('ml', 'vms', 'gpu-operator', 'kube-system', 'web')
    objs += [node(NODE), node(OTHER), node('cpu-1', gpus=0)]
    objs += [
        pod('train-gpu', owner_ref=owner('ReplicaSet', 'train-7d9f'), resources={'nvidia.com/gpu': '2'}),
        pod('infer-mig', owner_ref=owner('ReplicaSet', 'infer-5c4b'), resources={'nvidia.com/mig-1g.10gb': '1'}),
        pod('rt-only-0', owner_ref=owner('StatefulSet', 'rt-only'), runtime_class='nvidia'),
        pod('dcgm-exporter-abcde', 'gpu-operator', owner_ref=owner('DaemonSet', 'dcgm-exporter'),
            runtime_class='nvidia', volumes=HOST_PATH),
        pod('cache-gpu', owner_ref=owner('ReplicaSet', 'cache-6f8d'), resources={'nvidia.com/gpu': '1'},
            volumes=EMPTY_DIR),
        pod('bare-debug', resources={'nvidia.com/gpu': '1'}),
        pod('dra-pod', owner_ref=owner('Job', 'dra-job'), claims=['dra-claim']),
        pod('web-1', 'web', owner_ref=owner('ReplicaSet', 'web-59d8')),
        pod('kube-proxy-gpu-1', 'kube-system', owner_ref=owner('Node', NODE),
            annotations={'kubernetes.io/config.mirror': 'abc123'}),
        pod('other-gpu', node_name=OTHER, owner_ref=owner('ReplicaSet', 'other-4a2c'),
            resources={'nvidia.com/gpu': '1'}),
        pod('web-2', 'web', node_name=OTHER, owner_ref=owner('ReplicaSet', 'web-59d8')),
    ]
    objs += [vm('vm-gpu'), vmi('vm-gpu'), launcher_pod('vm-gpu')]
    objs += [claim('dra-claim', reserved_for=['dra-pod'])]
    return copy.deepcopy(objs)


# (kind, namespace, name, node, reason, owner, flags) expected from the scenario with the defaults.
EXPECTED_HOLDERS = [
    ('Pod', 'gpu-operator', 'dcgm-exporter-abcde', NODE, 'runtimeClass nvidia', 'DaemonSet/dcgm-exporter',
     {'local_data': True, 'daemonset': True, 'unmanaged': False}),
    ('Pod', 'ml', 'bare-debug', NODE, 'resource nvidia.com/gpu', 'none',
     {'local_data': False, 'daemonset': False, 'unmanaged': True}),
    ('Pod', 'ml', 'cache-gpu', NODE, 'resource nvidia.com/gpu', 'ReplicaSet/cache-6f8d',
     {'local_data': True, 'daemonset': False, 'unmanaged': False}),
    ('Pod', 'ml', 'dra-pod', NODE, 'DRA claim dra-claim', 'Job/dra-job',
     {'local_data': False, 'daemonset': False, 'unmanaged': False}),
    ('Pod', 'ml', 'infer-mig', NODE, 'resource nvidia.com/mig-1g.10gb', 'ReplicaSet/infer-5c4b',
     {'local_data': False, 'daemonset': False, 'unmanaged': False}),
    ('Pod', 'ml', 'rt-only-0', NODE, 'runtimeClass nvidia', 'StatefulSet/rt-only',
     {'local_data': False, 'daemonset': False, 'unmanaged': False}),
    ('Pod', 'ml', 'train-gpu', NODE, 'resource nvidia.com/gpu', 'ReplicaSet/train-7d9f',
     {'local_data': False, 'daemonset': False, 'unmanaged': False}),
    ('VirtualMachineInstance', 'vms', 'vm-gpu', NODE, 'VMI gpu nvidia.com/GH100_H100', 'VirtualMachine/vm-gpu',
     {'local_data': True, 'daemonset': False, 'unmanaged': False}),
    ('ResourceClaim', 'ml', 'dra-claim', NODE, 'DRA devices gpu.nvidia.com gpu-0', 'none',
     {'local_data': False, 'daemonset': False, 'unmanaged': True}),
    ('Pod', 'ml', 'other-gpu', OTHER, 'resource nvidia.com/gpu', 'ReplicaSet/other-4a2c',
     {'local_data': False, 'daemonset': False, 'unmanaged': False}),
]


def holder_key(h: dict[str, Any]) -> tuple:
    return (h['kind'], h['namespace'], h['name'], h['node'], h['reason'], h['owner'],
            {k: h[k] for k in ('local_data', 'daemonset', 'unmanaged')})
