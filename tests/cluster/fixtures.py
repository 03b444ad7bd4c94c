"""Builders for the objects GPU-fleet tests need: plain dicts, ready for `cluster.apply()`.

Every builder sets `metadata.uid` so that owner references can point at an object before it is
applied (`owner_ref(obj)`; `Cluster.apply` maps it to the uid the API server gives); pods default to
Running and Ready with that status kept as written (pass `phase='Pending'`, or `phase=None` to let
KWOK play the pod).
"""
from __future__ import annotations

import uuid
from typing import Any, Iterable, Iterator

GPU = 'nvidia.com/gpu'
DEFAULT_TS = '2026-01-01T00:00:00Z'


def _meta(name: str, namespace: str | None = None, labels: dict | None = None,
          annotations: dict | None = None, owner: dict | list | None = None, uid: str | None = None) -> dict:
    meta: dict[str, Any] = {'name': name, 'uid': uid or str(uuid.uuid4())}
    if namespace is not None:
        meta['namespace'] = namespace
    if labels:
        meta['labels'] = dict(labels)
    if annotations:
        meta['annotations'] = dict(annotations)
    if owner:
        meta['ownerReferences'] = [owner] if isinstance(owner, dict) else list(owner)
    return meta


def owner_ref(obj: dict, controller: bool = True) -> dict:
    """An ownerReference to `obj` (a builder's or the API server's object)."""
    return {'apiVersion': obj['apiVersion'], 'kind': obj['kind'], 'name': obj['metadata']['name'],
            'uid': obj['metadata']['uid'], 'controller': controller, 'blockOwnerDeletion': True}


def namespace(name: str, labels: dict | None = None) -> dict:
    return {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': _meta(name, labels=labels)}


# ---------------------------------------------------------------------- nodes
def node(name: str, labels: dict | None = None, annotations: dict | None = None, unschedulable: bool = False,
         ready: bool = True, taints: list[dict] | None = None, allocatable: dict | None = None,
         capacity: dict | None = None, internal_ip: str | None = None, kernel: str = '6.8.0-134-generic',
         kubelet_version: str = 'v1.34.2+rke2r1', os_image: str = 'Ubuntu 24.04.3 LTS',
         container_runtime: str = 'containerd://2.1.4-k3s1') -> dict:
    base_labels = {'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64',
                   'node-role.kubernetes.io/worker': 'true'}
    base_labels.update(labels or {})
    alloc = {'cpu': '128', 'memory': '1056000000Ki', 'pods': '110', 'ephemeral-storage': '900000000Ki'}
    alloc.update(allocatable or {})
    cap = dict(alloc)
    cap.update(capacity or {})
    spec: dict[str, Any] = {}
    if unschedulable:
        spec['unschedulable'] = True
    taint_list = list(taints or [])
    if unschedulable and not any(t.get('key') == 'node.kubernetes.io/unschedulable' for t in taint_list):
        taint_list.append({'key': 'node.kubernetes.io/unschedulable', 'effect': 'NoSchedule',
                           'timeAdded': DEFAULT_TS})
    if taint_list:
        spec['taints'] = taint_list
    return {
        'apiVersion': 'v1', 'kind': 'Node',
        'metadata': _meta(name, labels=base_labels, annotations=annotations),
        'spec': spec,
        'status': {
            'capacity': cap, 'allocatable': alloc,
            'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False',
                            'reason': 'KubeletReady' if ready else 'KubeletNotReady',
                            'message': 'kubelet is posting ready status' if ready else 'kubelet stopped posting',
                            'lastHeartbeatTime': DEFAULT_TS, 'lastTransitionTime': DEFAULT_TS}],
            'addresses': [{'type': 'InternalIP', 'address': internal_ip or '10.0.%d.%d' % _ip_of(name)},
                          {'type': 'Hostname', 'address': name}],
            'nodeInfo': {'kernelVersion': kernel, 'kubeletVersion': kubelet_version,
                         'kubeProxyVersion': kubelet_version, 'osImage': os_image,
                         'containerRuntimeVersion': container_runtime, 'operatingSystem': 'linux',
                         'architecture': 'amd64', 'machineID': uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                         'systemUUID': str(uuid.uuid5(uuid.NAMESPACE_URL, name)), 'bootID': str(uuid.uuid4())},
        },
    }


def _ip_of(name: str) -> tuple[int, int]:
    h = sum(ord(c) * (i + 1) for i, c in enumerate(name))
    return (h // 250) % 250, h % 250 + 1


def gpu_node(name: str, gpus: int = 8, product: str = 'NVIDIA-H100-80GB-HBM3', pci: str = '10de:2330',
             driver: str = '580.126.20', cuda: str = '13.0', mig: dict[str, int] | None = None,
             labels: dict | None = None, **kwargs: Any) -> dict:
    """A node with NVIDIA GPUs as GPU Operator/NFD label it: `nvidia.com/gpu` allocatable (or the
    `nvidia.com/mig-<profile>` resources given in `mig`), product/count/driver labels, the
    `feature.node.kubernetes.io/pci-10de.present` NFD label. `pci` is vendor:device (not a label: a label
    value cannot hold ':', the API server answers 422)."""
    d_major, d_minor, d_rev = (driver.split('.') + ['0', '0'])[:3]
    c_major, c_minor = (cuda.split('.') + ['0'])[:2]
    gpu_labels = {
        'nvidia.com/gpu.present': 'true', 'nvidia.com/gpu.product': product, 'nvidia.com/gpu.count': str(gpus),
        'nvidia.com/gpu.deploy.driver': 'true', 'nvidia.com/gpu.deploy.device-plugin': 'true',
        'nvidia.com/cuda.driver.major': d_major, 'nvidia.com/cuda.driver.minor': d_minor,
        'nvidia.com/cuda.driver.rev': d_rev, 'nvidia.com/cuda.runtime.major': c_major,
        'nvidia.com/cuda.runtime.minor': c_minor,
        'feature.node.kubernetes.io/pci-%s.present' % pci.split(':')[0]: 'true',
        'nvidia.com/mig.strategy': 'mixed' if mig else 'single',
    }
    gpu_labels.update(labels or {})
    alloc = dict(kwargs.pop('allocatable', None) or {})
    if mig:
        alloc.update({k if k.startswith('nvidia.com/') else 'nvidia.com/mig-' + k: str(v) for k, v in mig.items()})
        if gpus and GPU not in alloc:
            alloc[GPU] = '0'
    else:
        alloc.setdefault(GPU, str(gpus))
    return node(name, labels=gpu_labels, allocatable=alloc, **kwargs)


# ---------------------------------------------------------------------- pods
def container(name: str = 'main', image: str = 'registry.example/app:1', requests: dict | None = None,
              limits: dict | None = None, command: list[str] | None = None, volume_mounts: list | None = None) -> dict:
    c: dict[str, Any] = {'name': name, 'image': image}
    if requests or limits:
        c['resources'] = {}
        if requests:
            c['resources']['requests'] = dict(requests)
        if limits:
            c['resources']['limits'] = dict(limits)
    if command:
        c['command'] = list(command)
    if volume_mounts:
        c['volumeMounts'] = list(volume_mounts)
    return c


def running_status(containers: Iterable[dict], ready: bool = True, node_ip: str = '10.0.0.1') -> dict:
    conds = [{'type': t, 'status': 'True' if (ready or t in ('Initialized', 'PodScheduled')) else 'False',
              'lastProbeTime': None, 'lastTransitionTime': DEFAULT_TS}
             for t in ('PodReadyToStartContainers', 'Initialized', 'Ready', 'ContainersReady', 'PodScheduled')]
    return {'phase': 'Running', 'conditions': conds, 'hostIP': node_ip, 'podIP': '10.42.0.10',
            'startTime': DEFAULT_TS, 'qosClass': 'BestEffort',
            'containerStatuses': [{'name': c['name'], 'image': c.get('image', ''), 'imageID': '', 'ready': ready,
                                   'started': True, 'restartCount': 0,
                                   'containerID': 'containerd://' + uuid.uuid4().hex,
                                   'state': {'running': {'startedAt': DEFAULT_TS}}} for c in containers]}


def pod(name: str, node: str | None = None, namespace: str = 'default', labels: dict | None = None,
        annotations: dict | None = None, owner: dict | list | None = None, phase: str | None = 'Running',
        ready: bool = True, containers: list[dict] | None = None, runtime_class: str | None = None,
        volumes: list[dict] | None = None, tolerations: list[dict] | None = None,
        node_selector: dict | None = None, resource_claims: list[dict] | None = None,
        priority_class: str | None = None, termination_grace: int | None = None, uid: str | None = None) -> dict:
    """A pod; `phase='Running'` with `ready` gives the status a kubelet would report,
    `phase='Pending'` or others a bare status, `phase=None` no status (the simulator runs it)."""
    conts = containers or [container()]
    spec: dict[str, Any] = {'containers': conts, 'restartPolicy': 'Always'}
    if node:
        spec['nodeName'] = node
    if runtime_class:
        spec['runtimeClassName'] = runtime_class
    if volumes:
        spec['volumes'] = list(volumes)
    if tolerations:
        spec['tolerations'] = list(tolerations)
    if node_selector:
        spec['nodeSelector'] = dict(node_selector)
    if resource_claims:
        spec['resourceClaims'] = list(resource_claims)
    if priority_class:
        spec['priorityClassName'] = priority_class
    if termination_grace is not None:
        spec['terminationGracePeriodSeconds'] = termination_grace
    obj: dict[str, Any] = {'apiVersion': 'v1', 'kind': 'Pod',
                           'metadata': _meta(name, namespace, labels, annotations, owner, uid), 'spec': spec}
    if phase == 'Running':
        obj['status'] = running_status(conts, ready)
    elif phase is not None:
        obj['status'] = {'phase': phase}
        if phase in ('Succeeded', 'Failed'):
            code = 0 if phase == 'Succeeded' else 1
            obj['status']['containerStatuses'] = [{
                'name': c['name'], 'image': c.get('image', ''), 'imageID': '', 'ready': False, 'started': False,
                'restartCount': 0, 'state': {'terminated': {'exitCode': code,
                                                            'reason': 'Completed' if code == 0 else 'Error'}}}
                for c in conts]
    return obj


def gpu_pod(name: str, node: str | None = None, gpus: int = 1, resource: str = GPU, **kwargs: Any) -> dict:
    """A pod whose container requests `gpus` of `resource` (`nvidia.com/gpu` or
    `nvidia.com/mig-1g.10gb`...) in limits and requests, as the device plugin needs."""
    res = {resource: str(gpus)}
    kwargs.setdefault('containers', [container('cuda', 'nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04',
                                               requests=res, limits=res)])
    return pod(name, node, **kwargs)


def emptydir_volume(name: str = 'scratch') -> dict:
    return {'name': name, 'emptyDir': {}}


def hostpath_volume(name: str = 'host', path: str = '/var/lib/data') -> dict:
    return {'name': name, 'hostPath': {'path': path, 'type': 'Directory'}}


def mirror_pod(name: str, node: str, namespace: str = 'kube-system', **kwargs: Any) -> dict:
    """A static pod's mirror (kubelet annotation `kubernetes.io/config.mirror`)."""
    ann = dict(kwargs.pop('annotations', None) or {})
    ann['kubernetes.io/config.mirror'] = uuid.uuid4().hex
    ann['kubernetes.io/config.source'] = 'file'
    node_uid = str(uuid.uuid5(uuid.NAMESPACE_DNS, node))
    nd = {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': node, 'uid': node_uid}}
    return pod(name, node, namespace, annotations=ann, owner=owner_ref(nd), **kwargs)


# ---------------------------------------------------------------------- controllers
def _workload(api_version: str, kind: str, name: str, namespace: str, labels: dict | None, replicas: int | None,
              template_spec: dict | None, annotations: dict | None = None) -> dict:
    sel = dict(labels or {'app': name})
    spec: dict[str, Any] = {'selector': {'matchLabels': sel},
                            'template': {'metadata': {'labels': sel}, 'spec': template_spec or {
                                'containers': [container()]}}}
    if replicas is not None:
        spec['replicas'] = replicas
    return {'apiVersion': api_version, 'kind': kind, 'metadata': _meta(name, namespace, sel, annotations),
            'spec': spec, 'status': {}}


def daemonset(name: str, namespace: str = 'kube-system', labels: dict | None = None,
              template_spec: dict | None = None, **kw: Any) -> dict:
    return _workload('apps/v1', 'DaemonSet', name, namespace, labels, None, template_spec, **kw)


def replicaset(name: str, namespace: str = 'default', replicas: int = 1, labels: dict | None = None,
               template_spec: dict | None = None, **kw: Any) -> dict:
    return _workload('apps/v1', 'ReplicaSet', name, namespace, labels, replicas, template_spec, **kw)


def deployment(name: str, namespace: str = 'default', replicas: int = 1, labels: dict | None = None,
               template_spec: dict | None = None, **kw: Any) -> dict:
    return _workload('apps/v1', 'Deployment', name, namespace, labels, replicas, template_spec, **kw)


def statefulset(name: str, namespace: str = 'default', replicas: int = 1, labels: dict | None = None,
                template_spec: dict | None = None, **kw: Any) -> dict:
    return _workload('apps/v1', 'StatefulSet', name, namespace, labels, replicas, template_spec, **kw)


def daemonset_pod(ds: dict, node: str, suffix: str | None = None, **kwargs: Any) -> dict:
    """A pod of DaemonSet `ds` on `node` (owner reference, labels, tolerations as the controller sets)."""
    labels = dict((ds['spec']['selector'] or {}).get('matchLabels') or {})
    labels.update(kwargs.pop('labels', None) or {})
    tol = [{'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'},
           {'key': 'node.kubernetes.io/not-ready', 'operator': 'Exists', 'effect': 'NoExecute'}]
    return pod('%s-%s' % (ds['metadata']['name'], suffix or uuid.uuid4().hex[:5]), node,
               ds['metadata']['namespace'], labels=labels, owner=owner_ref(ds), tolerations=tol, **kwargs)


def replicaset_pod(rs: dict, node: str | None, suffix: str | None = None, **kwargs: Any) -> dict:
    labels = dict((rs['spec']['selector'] or {}).get('matchLabels') or {})
    labels.update(kwargs.pop('labels', None) or {})
    name = kwargs.pop('name', None) or '%s-%s' % (rs['metadata']['name'], suffix or uuid.uuid4().hex[:5])
    return pod(name, node, rs['metadata']['namespace'], labels=labels, owner=owner_ref(rs), **kwargs)


def pdb(name: str, selector: dict, namespace: str = 'default', min_available: int | str | None = None,
        max_unavailable: int | str | None = None, unhealthy_pod_eviction_policy: str | None = None) -> dict:
    """A policy/v1 PodDisruptionBudget; `selector` is matchLabels (or a full LabelSelector when it has
    matchLabels/matchExpressions keys)."""
    sel = selector if ('matchLabels' in selector or 'matchExpressions' in selector) else {'matchLabels': selector}
    spec: dict[str, Any] = {'selector': sel}
    if min_available is not None:
        spec['minAvailable'] = min_available
    if max_unavailable is not None:
        spec['maxUnavailable'] = max_unavailable
    if unhealthy_pod_eviction_policy:
        spec['unhealthyPodEvictionPolicy'] = unhealthy_pod_eviction_policy
    return {'apiVersion': 'policy/v1', 'kind': 'PodDisruptionBudget', 'metadata': _meta(name, namespace),
            'spec': spec}


def job(name: str, namespace: str = 'default', node_selector: dict | None = None, node: str | None = None,
        image: str = 'registry.example/gpu-burn:1', command: list[str] | None = None, completions: int = 1,
        parallelism: int = 1, backoff_limit: int = 0, tolerations: list[dict] | None = None,
        labels: dict | None = None, annotations: dict | None = None, gpus: int = 0) -> dict:
    """A batch/v1 Job (the real Job controller runs its pods and KWOK completes them; template
    annotations gpufleet.test/exit-code, gpufleet.test/run-time, gpufleet.test/logs set how)."""
    res = {GPU: str(gpus)} if gpus else None
    tspec: dict[str, Any] = {'restartPolicy': 'Never',
                             'containers': [container('main', image, requests=res, limits=res, command=command)]}
    if node_selector:
        tspec['nodeSelector'] = dict(node_selector)
    if node:
        tspec['nodeName'] = node
    if tolerations:
        tspec['tolerations'] = list(tolerations)
    tmeta: dict[str, Any] = {}
    if labels:
        tmeta['labels'] = dict(labels)
    if annotations:
        tmeta['annotations'] = dict(annotations)
    return {'apiVersion': 'batch/v1', 'kind': 'Job', 'metadata': _meta(name, namespace, labels),
            'spec': {'completions': completions, 'parallelism': parallelism, 'backoffLimit': backoff_limit,
                     'template': {'metadata': tmeta, 'spec': tspec}}}


# ---------------------------------------------------------------------- KubeVirt
def virtual_machine(name: str, namespace: str = 'default', running: bool | None = True,
                    run_strategy: str | None = None, gpus: list[dict] | None = None,
                    host_devices: list[dict] | None = None, evacuation: str | None = None) -> dict:
    spec: dict[str, Any] = {'template': {'spec': {'domain': {'devices': {}}}}}
    if run_strategy is not None:
        spec['runStrategy'] = run_strategy
    elif running is not None:
        spec['running'] = running
    devices = spec['template']['spec']['domain']['devices']
    if gpus:
        devices['gpus'] = gpus
    if host_devices:
        devices['hostDevices'] = host_devices
    if evacuation:
        spec['template']['spec']['evictionStrategy'] = evacuation
    return {'apiVersion': 'kubevirt.io/v1', 'kind': 'VirtualMachine', 'metadata': _meta(name, namespace),
            'spec': spec, 'status': {'ready': bool(running), 'printableStatus': 'Running' if running else 'Stopped'}}


def vmi(name: str, node: str, namespace: str = 'default', gpus: int | list[dict] = 1,
        device_name: str = 'nvidia.com/GH100_H100_SXM5_80GB', host_devices: list[dict] | None = None,
        vm: dict | None = None, eviction_strategy: str | None = None, phase: str = 'Running',
        migratable: bool = False) -> dict:
    """A VirtualMachineInstance on `node` with `gpus` passthrough GPUs (a count or the list of
    `spec.domain.devices.gpus` entries); owned by `vm` when given."""
    if isinstance(gpus, list):
        gpu_list = gpus
    else:
        gpu_list = [{'name': 'gpu%d' % i, 'deviceName': device_name} for i in range(gpus)]
    devices: dict[str, Any] = {}
    if gpu_list:
        devices['gpus'] = gpu_list
    if host_devices:
        devices['hostDevices'] = host_devices
    spec: dict[str, Any] = {'domain': {'devices': devices}}
    if eviction_strategy:
        spec['evictionStrategy'] = eviction_strategy
    labels = {'kubevirt.io/nodeName': node}
    if vm is not None:
        labels['vm.kubevirt.io/name'] = vm['metadata']['name']
    return {'apiVersion': 'kubevirt.io/v1', 'kind': 'VirtualMachineInstance',
            'metadata': _meta(name, namespace, labels, owner=owner_ref(vm) if vm else None),
            'spec': spec,
            'status': {'phase': phase, 'nodeName': node,
                       'conditions': [{'type': 'Ready', 'status': 'True'},
                                      {'type': 'LiveMigratable', 'status': 'True' if migratable else 'False',
                                       'reason': None if migratable else 'HostDeviceNotLiveMigratable'}]}}


def virt_launcher_pod(vmi_obj: dict, **kwargs: Any) -> dict:
    """The virt-launcher pod of a VMI (owned by it, label kubevirt.io/created-by=<vmi uid>)."""
    node = vmi_obj['status']['nodeName']
    labels = {'kubevirt.io': 'virt-launcher', 'kubevirt.io/created-by': vmi_obj['metadata']['uid'],
              'vm.kubevirt.io/name': vmi_obj['metadata']['name']}
    labels.update(kwargs.pop('labels', None) or {})
    n = len((vmi_obj['spec']['domain']['devices'].get('gpus') or []))
    dev = (vmi_obj['spec']['domain']['devices'].get('gpus') or [{}])[0].get('deviceName', GPU)
    res = {dev: str(n)} if n else None
    conts = [container('compute', 'quay.io/kubevirt/virt-launcher:v1.6.0', requests=res, limits=res)]
    return pod('virt-launcher-%s-%s' % (vmi_obj['metadata']['name'], uuid.uuid4().hex[:5]), node,
               vmi_obj['metadata']['namespace'], labels=labels, owner=owner_ref(vmi_obj), containers=conts, **kwargs)


# ---------------------------------------------------------------------- DRA and cluster objects
def device_class(name: str = 'gpu.nvidia.com', driver: str = 'gpu.nvidia.com') -> dict:
    return {'apiVersion': 'resource.k8s.io/v1', 'kind': 'DeviceClass', 'metadata': _meta(name),
            'spec': {'selectors': [{'cel': {'expression': "device.driver == '%s'" % driver}}]}}


def resource_slice(node: str, driver: str = 'gpu.nvidia.com', devices: int | list[str] = 8,
                   name: str | None = None) -> dict:
    names = devices if isinstance(devices, list) else ['gpu-%d' % i for i in range(devices)]
    return {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice',
            'metadata': _meta(name or '%s-%s' % (node, driver.replace('.', '-'))),
            'spec': {'driver': driver, 'nodeName': node, 'pool': {'name': node, 'generation': 1,
                                                                  'resourceSliceCount': 1},
                     'devices': [{'name': d, 'attributes': {}} for d in names]}}


def resource_claim(name: str, namespace: str = 'default', node: str | None = None, driver: str = 'gpu.nvidia.com',
                   devices: list[str] | None = None, reserved_for: list[dict] | None = None,
                   device_class_name: str = 'gpu.nvidia.com') -> dict:
    """A ResourceClaim; with `node` it is allocated there (devices from `driver`), reserved for the
    pods in `reserved_for` (`[pod_dict, ...]` or reference dicts)."""
    obj: dict[str, Any] = {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceClaim',
                           'metadata': _meta(name, namespace),
                           'spec': {'devices': {'requests': [{'name': 'gpu', 'exactly': {
                               'deviceClassName': device_class_name}}]}},
                           'status': {}}
    if node:
        obj['status']['allocation'] = {
            'devices': {'results': [{'request': 'gpu', 'driver': driver, 'pool': node, 'device': d}
                                    for d in (devices or ['gpu-0'])]},
            'nodeSelector': {'nodeSelectorTerms': [{'matchFields': [
                {'key': 'metadata.name', 'operator': 'In', 'values': [node]}]}]}}
    refs = []
    for r in reserved_for or []:
        if 'metadata' in r:
            refs.append({'resource': 'pods', 'name': r['metadata']['name'], 'uid': r['metadata']['uid']})
        else:
            refs.append(r)
    if refs:
        obj['status']['reservedFor'] = refs
    return obj


def runtime_class(name: str = 'nvidia', handler: str = 'nvidia') -> dict:
    return {'apiVersion': 'node.k8s.io/v1', 'kind': 'RuntimeClass', 'metadata': _meta(name), 'handler': handler}


def cluster_policy(name: str = 'cluster-policy', driver_version: str = '580.126.20',
                   driver_enabled: bool = True, state: str = 'ready') -> dict:
    return {'apiVersion': 'nvidia.com/v1', 'kind': 'ClusterPolicy', 'metadata': _meta(name),
            'spec': {'driver': {'enabled': driver_enabled, 'version': driver_version,
                                'upgradePolicy': {'autoUpgrade': False}},
                     'devicePlugin': {'enabled': True}, 'dcgmExporter': {'enabled': True}},
            'status': {'state': state}}


# The GPU Operator's chart values (deployments/gpu-operator/values.yaml, the parts its templates put
# into the ClusterPolicy), at the versions the seed's record names; the chart version is the operator's.
OPERATOR_VERSION = 'v26.3.3'
DCGM_EXPORTER_VERSION = '4.3.1-4.4.0-ubuntu22.04'


def operator_values(dcgm_exporter: str = DCGM_EXPORTER_VERSION, update_strategy: str = 'RollingUpdate',
                    auto_upgrade: bool = True, driver_enabled: bool = False, driver_version: str = '580.126.20',
                    device_plugin: str = 'v0.17.4', toolkit: str = 'v1.17.8-ubuntu20.04') -> dict:
    """Values of the GPU Operator chart: host drivers by default (`driver.enabled: false`), the
    chart's defaults for the update strategy (RollingUpdate) and driver upgrade policy (autoUpgrade)."""
    def image(repository: str, name: str, version: str, enabled: bool = True) -> dict:
        return {'enabled': enabled, 'repository': repository, 'image': name, 'version': version,
                'imagePullPolicy': 'IfNotPresent'}

    return {
        'operator': {'repository': 'nvcr.io/nvidia', 'image': 'gpu-operator', 'defaultRuntime': 'containerd',
                     'runtimeClass': 'nvidia',
                     'initContainer': {'repository': 'nvcr.io/nvidia', 'image': 'cuda', 'version': '13.0.1-base-ubi9'}},
        'daemonsets': {'updateStrategy': update_strategy, 'rollingUpdate': {'maxUnavailable': '1'},
                       'priorityClassName': 'system-node-critical'},
        'validator': {'repository': 'nvcr.io/nvidia/cloud-native', 'image': 'gpu-operator-validator',
                      'plugin': {'env': [{'name': 'WITH_WORKLOAD', 'value': 'false'}]}},
        'mig': {'strategy': 'single'}, 'psp': {'enabled': False}, 'cdi': {}, 'sandboxWorkloads': {'enabled': False},
        'driver': dict(image('nvcr.io/nvidia', 'driver', driver_version, driver_enabled), upgradePolicy={
            'autoUpgrade': auto_upgrade, 'maxParallelUpgrades': 1, 'maxUnavailable': '25%',
            'drain': {'enable': False, 'force': False, 'deleteEmptyDir': False, 'timeoutSeconds': 300},
            'podDeletion': {'force': False, 'deleteEmptyDir': False, 'timeoutSeconds': 300},
            'waitForCompletion': {'timeoutSeconds': 0}},
            manager={'repository': 'nvcr.io/nvidia/cloud-native', 'image': 'k8s-driver-manager', 'version': 'v0.8.1'}),
        'toolkit': image('nvcr.io/nvidia/k8s', 'container-toolkit', toolkit),
        'devicePlugin': image('nvcr.io/nvidia', 'k8s-device-plugin', device_plugin),
        'dcgm': image('nvcr.io/nvidia/cloud-native', 'dcgm', '4.3.1-1-ubuntu22.04'),
        'dcgmExporter': image('nvcr.io/nvidia/k8s', 'dcgm-exporter', dcgm_exporter),
        'gfd': image('nvcr.io/nvidia', 'k8s-device-plugin', device_plugin),
        'migManager': image('nvcr.io/nvidia/cloud-native', 'k8s-mig-manager', 'v0.12.3-ubuntu20.04'),
        'nodeStatusExporter': {'enabled': False}, 'gds': {'enabled': False}, 'vgpuManager': {'enabled': False},
        'vgpuDeviceManager': {'enabled': False}, 'vfioManager': {'enabled': False},
        'sandboxDevicePlugin': {'enabled': False}, 'kataManager': {'enabled': False}, 'ccManager': {'enabled': False},
    }


def operator_cluster_policy(name: str = 'cluster-policy', version: str = OPERATOR_VERSION, **values: Any) -> dict:
    """The ClusterPolicy the chart renders from `operator_values(**values)` (no status: the operator writes it)."""
    vals = operator_values(**values)
    vals['validator']['version'] = version
    return {'apiVersion': 'nvidia.com/v1', 'kind': 'ClusterPolicy', 'metadata': {'name': name}, 'spec': vals}


def helm_chart(version: str = OPERATOR_VERSION, values: dict | None = None, name: str = 'gpu-operator',
               namespace: str = 'kube-system') -> dict:
    """RKE2's HelmChart of the GPU Operator (helm.cattle.io/v1)."""
    import yaml
    return {'apiVersion': 'helm.cattle.io/v1', 'kind': 'HelmChart', 'metadata': _meta(name, namespace),
            'spec': {'chart': 'gpu-operator', 'repo': 'https://helm.ngc.nvidia.com/nvidia', 'version': version,
                     'targetNamespace': 'gpu-operator', 'createNamespace': True,
                     'valuesContent': yaml.safe_dump(values if values is not None else operator_values(),
                                                     sort_keys=False)}}


def plan(name: str, namespace: str = 'system-upgrade', version: str = 'v1.34.2+rke2r1',
         node_selector: dict | None = None, concurrency: int = 1) -> dict:
    return {'apiVersion': 'upgrade.cattle.io/v1', 'kind': 'Plan', 'metadata': _meta(name, namespace),
            'spec': {'concurrency': concurrency, 'version': version, 'cordon': True,
                     'nodeSelector': {'matchLabels': node_selector or {}},
                     'upgrade': {'image': 'rancher/rke2-upgrade'}},
            'status': {}}


def configmap(name: str, data: dict, namespace: str = 'default') -> dict:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': _meta(name, namespace), 'data': dict(data)}


def resource_quota(name: str, hard: dict, namespace: str = 'default', used: dict | None = None) -> dict:
    return {'apiVersion': 'v1', 'kind': 'ResourceQuota', 'metadata': _meta(name, namespace),
            'spec': {'hard': dict(hard)}, 'status': {'hard': dict(hard), 'used': dict(used or {})}}


def event(name: str, involved: dict, reason: str, message: str, type_: str = 'Normal',
          namespace: str | None = None) -> dict:
    ns = namespace or involved['metadata'].get('namespace') or 'default'
    return {'apiVersion': 'v1', 'kind': 'Event', 'metadata': _meta(name, ns),
            'involvedObject': {'apiVersion': involved['apiVersion'], 'kind': involved['kind'],
                               'name': involved['metadata']['name'], 'uid': involved['metadata']['uid'],
                               'namespace': involved['metadata'].get('namespace')},
            'reason': reason, 'message': message, 'type': type_, 'count': 1,
            'firstTimestamp': DEFAULT_TS, 'lastTimestamp': DEFAULT_TS}


# ---------------------------------------------------------------------- fleets
def fleet(nodes: int, pods_per_node: int = 0, gpus: int = 8, prefix: str = 'gpu-', gpu_pod_every: int = 4,
          namespaces: int = 10) -> Iterator[dict]:
    """A synthetic fleet: `nodes` GPU nodes, `pods_per_node` pods on each (every `gpu_pod_every`-th a
    one-GPU pod, the rest CPU pods owned by a ReplicaSet), spread over `namespaces` namespaces."""
    for i in range(namespaces):
        yield namespace('team-%d' % i)
    rs = [replicaset('app-%d' % i, 'team-%d' % i, replicas=nodes * pods_per_node) for i in range(namespaces)]
    yield from rs
    width = len(str(max(nodes - 1, 1)))
    for n in range(nodes):
        nname = '%s%0*d' % (prefix, width, n)
        yield gpu_node(nname, gpus=gpus, labels={'topology.kubernetes.io/zone': 'rack-%d' % (n // 32)})
        for p in range(pods_per_node):
            ns = (n * pods_per_node + p) % namespaces
            pname = '%s-p%d' % (nname, p)
            if gpu_pod_every and p % gpu_pod_every == 0:
                yield gpu_pod(pname, nname, namespace='team-%d' % ns, labels={'app': 'train'})
            else:
                yield pod(pname, nname, 'team-%d' % ns, labels={'app': 'app-%d' % ns}, owner=owner_ref(rs[ns]))
