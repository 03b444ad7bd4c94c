"""The lab's emulated 40-node GPU pool: Kubernetes objects, per-node install roots and NVML states.

Everything a lab node is lives under `<lab>/nodes/<name>/`:

- `root/` an install root with its own dpkg database (real dpkg/apt; debrepo.py builds the kernel
  and driver packages into a local repository: kernels 6.8.0-134-generic and 6.8.0-135-generic,
  drivers 580.126.20 and 580.130.00 for both module sources, Canonical-shaped prebuilt NVIDIA
  modules for 134 (both drivers) and 135 (580.130.00)). Installed at the source: kernel 134
  (image, modules, modules-extra; the image ships /boot/vmlinuz-<k>) with the `ubuntu-server-prebuilt`
  driver set at 580.126.20 and `linux-modules-nvidia-580-server-6.8.0-134-generic` built for it;
  `boot/grub/grub.cfg` lists the installed kernels, `boot/grub/grubenv` (real grub-editenv)
  saves the 134 entry, `etc/default/grub` has GRUB_DEFAULT=saved. An apt run under the root
  regenerates grub.cfg from /boot/vmlinuz-* afterwards (`etc/apt/apt.conf.d/99lab-update-grub`, a
  DPkg::Post-Invoke: what a kernel's postinst runs update-grub for on Ubuntu);
- `nvml.json` + `nvml.state`: the stand-in libnvidia-ml's state (tests/tools/nvml_stub). The
  driver version in it FOLLOWS THE LOADED MODULE: the lab's activation hook (lab_node.py, the lab
  reboot path of the node_upgrade and rollback roles) boots the node as GRUB would and loads the
  NVIDIA module installed under the root for the booted kernel, as a real host does. Before the
  hook runs, NVML still reports the old driver, exactly like a host between `apt-get install` and
  the reboot;
- `kern.log`: the node's kernel log (gpu_info reads Xid events from it; each boot logs its kernel);
- `proc/`: what the modules read of /proc (running kernel, command line, /proc/driver/nvidia/version).

`<lab>/lab.json` tells the hook where things are and which node gets the injected fault.
"""
from __future__ import annotations

import json
import pathlib
import re
import shutil
import sys
import uuid
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from tools import debrepo, grubsim, nvml_stub  # noqa: E402
from tools.lab_node import installed_driver, module_driver  # noqa: E402  (the hook's own reading of the install root)

KERNEL = debrepo.KERNEL_OLD                 # 6.8.0-134-generic
TARGET_KERNEL = debrepo.KERNEL_TARGET       # 6.8.0-135-generic
RKE2 = 'v1.35.3+rke2r3'
TARGET_RKE2 = 'v1.36.1+rke2r1'              # one Kubernetes minor newer: through the SUC
GPU_OPERATOR = 'v26.3.3'
DCGM_EXPORTER = '4.4.1-4.6.0-ubuntu22.04'
SOURCE_DRIVER = debrepo.OLD       # 580.126.20
TARGET_DRIVER = debrepo.NEW       # 580.130.00
CURRENT = {'kernel': KERNEL, 'rke2': RKE2, 'driver': SOURCE_DRIVER, 'gpu_operator': GPU_OPERATOR,
           'dcgm_exporter': DCGM_EXPORTER}
# The seed's example change (issue 14): kernel, RKE2 and driver move; the GPU Operator part
# follows in its own issue.
TARGET = dict(CURRENT, kernel=TARGET_KERNEL, rke2=TARGET_RKE2, driver=TARGET_DRIVER)
# With the real GPU Operator (Lab(gpu_operator=True), `make lab GPU_OPERATOR=1`): the seed's operator change too.
TARGET_GPU_OPERATOR = 'v26.3.4'
# `lab.py --change driver`: the lab's earlier change, the driver alone (a reload, no reboot).
CHANGES = {'seed': TARGET, 'driver': dict(CURRENT, driver=TARGET_DRIVER),
           # FLEET=production: kernel and driver move; RKE2 stays at the fleet's patch, which brings the
           # node that drifted to an older patch up to it (through the SUC).
           'production': dict(CURRENT, kernel=TARGET_KERNEL, driver=TARGET_DRIVER)}
KERNEL_DRIFT = debrepo.KERNEL_DRIFT          # 6.8.0-133-generic: an older ABI of the same kernel line
RKE2_DRIFT = 'v1.35.2+rke2r1'                 # an older patch of the fleet's RKE2 minor
# The fleet's shape (Lab(fleet=...)): `lab` is every node alike (the one-command lab); `production` is shaped like a
# real fleet: some nodes on another kernel ABI and another RKE2 patch (drift the plan splits), two GPU nodes that are
# RKE2 servers (control-plane and etcd), hosts found by the collection's dynamic inventory. Lab(fleet='production').
FLEETS: dict[str, dict[str, Any]] = {
    'lab': {'kernel': {}, 'rke2': {}, 'servers': ()},
    'production': {'nodes': 8, 'kernel': {'gpu-03': KERNEL_DRIFT}, 'rke2': {'gpu-07': RKE2_DRIFT},
                   'servers': ('gpu-01', 'gpu-05')},
}


def kernel_of(name: str, shape: dict | None = None) -> str:
    """The kernel a node of `shape` runs at the source."""
    return ((shape or {}).get('kernel') or {}).get(name, KERNEL)


def rke2_of(name: str, shape: dict | None = None) -> str:
    return ((shape or {}).get('rke2') or {}).get(name, RKE2)


DRIVER_PRESET = 'ubuntu-server-prebuilt'
MODULE_SOURCE = 'prebuilt'
# The lab's nodes run the prebuilt user space (plugins/module_utils/_packages.py PRESETS
# `ubuntu-server-prebuilt`: its required members; Fabric Manager and NSCQ are optional and not
# installed on these nodes) with Canonical's module package for the running kernel.
PREBUILT_SET = ('nvidia-headless-no-dkms-580-server', 'libnvidia-compute-580-server', 'nvidia-kernel-common-580-server',
                'nvidia-utils-580-server', 'nvidia-compute-utils-580-server')
DKMS_SET = ('nvidia-driver-580-server', 'libnvidia-compute-580-server', 'nvidia-kernel-common-580-server',
            'nvidia-dkms-580-server', 'nvidia-utils-580-server', 'nvidia-compute-utils-580-server')
GRUB_ENTRY = grubsim.entry_id            # grubsim.entry_id(kernel): the kernel's normal menu entry

# Two GPU models, two PCI identities (vendor:device/subvendor:subdevice).
MODELS = [
    {'group': 'gpu_h100', 'product': 'NVIDIA-H100-80GB-HBM3', 'name': 'NVIDIA H100 80GB HBM3',
     'pci': '10de:2330/10de:16c1', 'platform': 'SYS-821GE-TNHR'},
    {'group': 'gpu_a100', 'product': 'NVIDIA-A100-SXM4-80GB', 'name': 'NVIDIA A100-SXM4-80GB',
     'pci': '10de:20b2/10de:1463', 'platform': 'SYS-420GP-TNAR'},
]
GPUS_PER_NODE = 8
DEVICE_PLUGIN = {'app': 'nvidia-device-plugin-daemonset'}
GPU = 'nvidia.com/gpu'


def node_names(count: int) -> list[str]:
    return ['gpu-%02d' % i for i in range(1, count + 1)]


def model_of(index: int, count: int) -> dict:
    """First half H100, second half A100."""
    return MODELS[0] if index < (count + 1) // 2 else MODELS[1]


def nvml_state(model: dict, name: str, driver: str) -> dict:
    gpus = []
    for i in range(GPUS_PER_NODE):
        gpus.append({'name': model['name'], 'uuid': 'GPU-%s-%04d' % (name, i),
                     'bus_id': '00000000:%02X:00.0' % (0x17 + i * 0x10), 'pci': model['pci'],
                     'mig': (0, 0), 'ecc_mode': (1, 1),
                     'ecc': {'corrected_volatile': 0, 'corrected_aggregate': 0,
                             'uncorrected_volatile': 0, 'uncorrected_aggregate': 0},
                     'retired_pages_pending': 0, 'remapped_rows': (0, 0, 0, 0), 'temperature': 38})
    return {'driver_version': driver, 'cuda_version': 13000, 'gpus': gpus}


def _node(name: str, model: dict, shape: dict | None = None) -> dict:
    """A GPU node as RKE2's kubelet, NFD and GPU Feature Discovery report it (labels, allocatable, nodeInfo);
    `shape` (FLEETS): its kernel, its RKE2 and whether it is an RKE2 server (RKE2's control-plane and etcd labels)."""
    major, minor, rev = SOURCE_DRIVER.split('.')
    labels = {
        'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64',
        'node-role.kubernetes.io/worker': 'true',
        'nvidia.com/gpu.present': 'true', 'nvidia.com/gpu.product': model['product'],
        'nvidia.com/gpu.count': str(GPUS_PER_NODE), 'nvidia.com/gpu.deploy.driver': 'true',
        'nvidia.com/gpu.deploy.device-plugin': 'true', 'nvidia.com/cuda.driver.major': major,
        'nvidia.com/cuda.driver.minor': minor, 'nvidia.com/cuda.driver.rev': rev,
        'nvidia.com/cuda.runtime.major': '13', 'nvidia.com/cuda.runtime.minor': '0',
        # (no `nvidia.com/gpu.pci-device: 10de:2330`: ':' is not valid in a label value)
        'feature.node.kubernetes.io/pci-10de.present': 'true', 'nvidia.com/mig.strategy': 'single',
        'gpufleet.io/platform': model['platform'], 'gpufleet.io/model': model['group'],
    }
    if name in ((shape or {}).get('servers') or ()):
        del labels['node-role.kubernetes.io/worker']
        labels.update({'node-role.kubernetes.io/control-plane': 'true', 'node-role.kubernetes.io/etcd': 'true'})
    alloc = {'cpu': '128', 'memory': '1056000000Ki', 'pods': '110', 'ephemeral-storage': '900000000Ki',
             GPU: str(GPUS_PER_NODE)}
    index = int(name.rsplit('-', 1)[1])
    return {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'labels': labels}, 'spec': {},
            'status': {
                'capacity': dict(alloc), 'allocatable': dict(alloc),
                'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady',
                                'message': 'kubelet is posting ready status'}],
                'addresses': [{'type': 'InternalIP', 'address': '10.0.%d.%d' % (index // 250, index % 250 + 1)},
                              {'type': 'Hostname', 'address': name}],
                'nodeInfo': node_info(name, kernel_of(name, shape), rke2=rke2_of(name, shape))}}


def node_info(name: str, kernel: str, boot: int = 0, rke2: str = RKE2) -> dict:
    """status.nodeInfo as the node's kubelet reports it; `boot` counts the node's reboots (its bootID)."""
    return {'kernelVersion': kernel, 'kubeletVersion': rke2, 'kubeProxyVersion': rke2,
            'osImage': 'Ubuntu 24.04.3 LTS', 'containerRuntimeVersion': 'containerd://2.1.4-k3s1',
            'operatingSystem': 'linux', 'architecture': 'amd64',
            'machineID': uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
            'systemUUID': str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
            'bootID': str(uuid.uuid5(uuid.NAMESPACE_OID, '%s/%d' % (name, boot)))}


def control_plane_node(name: str, rke2: str) -> dict:
    """An RKE2 server (no GPU, so not in the plan) already at `rke2`: the System Upgrade Controller
    order is servers first, and suc_plan reads the control plane's version before an agent's Plan."""
    alloc = {'cpu': '16', 'memory': '65536000Ki', 'pods': '110'}
    info = dict(node_info(name, KERNEL), kubeletVersion=rke2, kubeProxyVersion=rke2)
    return {'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux',
                                                  'node-role.kubernetes.io/control-plane': 'true'}},
            'spec': {'taints': [{'key': 'CriticalAddonsOnly', 'value': 'true', 'effect': 'NoExecute'}]},
            'status': {'capacity': alloc, 'allocatable': alloc, 'nodeInfo': info,
                       'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady',
                                       'message': 'kubelet is posting ready status'}]}}


SCRATCH_NAMESPACE = 'scratch'
# The lab's drain policy (gpufleet_drain_policy, recorded in the plan): the defaults (memory-backed emptyDir such as the
# training pods' /dev/shm deleted; disk-backed emptyDir and bare pods refused) and one rule for the scratch namespace,
# whose bare pods and their scratch data the platform team lets the drain delete.
LAB_DRAIN_POLICY = {'rules': [{'namespaces': [SCRATCH_NAMESPACE], 'unmanaged_pods': 'delete', 'local_data': 'delete'}]}


def suc_controller_objects() -> list[dict]:
    """The System Upgrade Controller's namespace and Deployment as its manifest installs them (on a control-plane node,
    tolerating CriticalAddonsOnly); tests/cluster/suc.py plays the controller's reconciliation."""
    labels = {'upgrade.cattle.io/controller': 'system-upgrade-controller'}
    return [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'system-upgrade'}},
            _workload('Deployment', 'system-upgrade-controller', 'system-upgrade', labels, {
                'nodeSelector': {'node-role.kubernetes.io/control-plane': 'true'},
                'tolerations': [{'key': 'CriticalAddonsOnly', 'operator': 'Exists'},
                                {'key': 'node-role.kubernetes.io/control-plane', 'operator': 'Exists', 'effect': 'NoSchedule'}],
                'containers': [_container('system-upgrade-controller', 'rancher/system-upgrade-controller:v0.17.0')]},
                replicas=1)]


def _workload(kind: str, name: str, namespace: str, labels: dict, spec: dict, replicas: int | None = None) -> dict:
    obj = {'apiVersion': 'apps/v1', 'kind': kind, 'metadata': {'name': name, 'namespace': namespace, 'labels': labels},
           'spec': {'selector': {'matchLabels': labels},
                    'template': {'metadata': {'labels': labels}, 'spec': spec}}}
    if replicas is not None:
        obj['spec']['replicas'] = replicas
    return obj


def _container(name: str, image: str, gpus: int = 0) -> dict:
    c: dict[str, Any] = {'name': name, 'image': image}
    if gpus:
        c['resources'] = {'requests': {GPU: str(gpus)}, 'limits': {GPU: str(gpus)}}
    return c


# What Node Feature Discovery labels on a node and the GPU Operator reads to render its driver DaemonSet (the
# image's OS tag, the kernel the driver container builds for).
NFD_HOST = {'feature.node.kubernetes.io/kernel-version.full': KERNEL,
            'feature.node.kubernetes.io/system-os_release.ID': 'ubuntu',
            'feature.node.kubernetes.io/system-os_release.VERSION_ID': '22.04'}


# The lab's node pool as an NVIDIADriver (Lab(driver_pools=True)): its driver at the source version.
DRIVER_POOL = 'lab-gpu-pool'


def operator_objects(driver: bool = False, pools: bool = False) -> list[dict]:
    """With NVIDIA's real GPU Operator (Lab(gpu_operator=True)): its Deployment at the source version, the RKE2
    HelmChart the operator is installed from (values: host drivers, RollingUpdate, the source DCGM exporter) and
    the ClusterPolicy that chart renders; the operator (tests/cluster/gpuoperator.py) creates the operand
    DaemonSets from it. `pools`: the driver rendered per node pool from one NVIDIADriver (DRIVER_POOL,
    driver.useNvidiaDriverCRD) instead of driver.version."""
    from cluster import fixtures
    from cluster.gpuoperator import deployment
    # driver: the operator's driver container is the driver (install method operator), at the source driver.
    values = fixtures.operator_values(dcgm_exporter=DCGM_EXPORTER, driver_enabled=driver, driver_version=SOURCE_DRIVER)
    policy = fixtures.operator_cluster_policy(version=GPU_OPERATOR, dcgm_exporter=DCGM_EXPORTER, driver_enabled=driver,
                                              driver_version=SOURCE_DRIVER)
    extra = []
    if pools:
        values['driver']['useNvidiaDriverCRD'] = policy['spec']['driver']['useNvidiaDriverCRD'] = True
        extra.append({'apiVersion': 'nvidia.com/v1alpha1', 'kind': 'NVIDIADriver', 'metadata': {'name': DRIVER_POOL},
                      'spec': {'driverType': 'gpu', 'repository': 'nvcr.io/nvidia', 'image': 'driver',
                               'version': SOURCE_DRIVER, 'manager': values['driver']['manager']}})
    return [deployment(GPU_OPERATOR), fixtures.helm_chart(version=GPU_OPERATOR, values=values), policy] + extra


def kubernetes_objects(names: list[str], operator: bool = False, operator_driver: bool = False,
                       driver_pools: bool = False, shape: dict | None = None) -> list[dict]:
    """The pool and its workloads, run by the control plane's real controllers: the GPU Operator's
    Deployment, the device plugin's and the DCGM exporter's DaemonSets (one pod per GPU node, made by
    the DaemonSet controller), and per GPU model a training ReplicaSet with one pod per node of the
    model (4 of the node's 8 GPUs each, spread over the nodes by the scheduler, so an evicted pod finds
    room on another node of its model, as on a fleet with headroom) under a PodDisruptionBudget."""
    gpu_nodes = {'nvidia.com/gpu.present': 'true'}
    objs: list[dict] = [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': ns}}
                        for ns in ('gpu-operator', 'ml')]
    if operator:
        objs += operator_objects(driver=operator_driver, pools=driver_pools)
    else:
        objs.append(_workload('Deployment', 'gpu-operator', 'gpu-operator', {'app': 'gpu-operator'},
                              {'containers': [_container('gpu-operator', 'nvcr.io/nvidia/gpu-operator:' + GPU_OPERATOR)]},
                              replicas=1))
        objs.append(_workload('DaemonSet', 'nvidia-dcgm-exporter', 'gpu-operator', {'app': 'nvidia-dcgm-exporter'},
                              {'nodeSelector': gpu_nodes, 'containers': [
                                  _container('dcgm-exporter', 'nvcr.io/nvidia/k8s/dcgm-exporter:' + DCGM_EXPORTER)]}))
        objs.append(_workload('DaemonSet', 'nvidia-device-plugin-daemonset', 'gpu-operator', dict(DEVICE_PLUGIN),
                              {'nodeSelector': gpu_nodes, 'containers': [
                                  _container('nvidia-device-plugin', 'nvcr.io/nvidia/k8s-device-plugin:v0.18.1')]}))
    for m in MODELS:
        short = m['group'].split('_')[1]
        app = {'app': 'train-' + short}
        count = sum(1 for i in range(len(names)) if model_of(i, len(names)) is m)
        spread = [{'maxSkew': 1, 'topologyKey': 'kubernetes.io/hostname', 'whenUnsatisfiable': 'ScheduleAnyway',
                   'labelSelector': {'matchLabels': app}}]
        # As PyTorch training charts run: /dev/shm a memory-backed emptyDir (kubectl drain refuses it; the drain
        # policy's default deletes it, a tmpfs that never survives a pod's move).
        train = _container('train', 'registry.example/train:1', gpus=GPUS_PER_NODE // 2)
        train['volumeMounts'] = [{'name': 'dshm', 'mountPath': '/dev/shm'}]
        objs.append(_workload('ReplicaSet', 'train-' + short, 'ml', app, {
            'nodeSelector': {'gpufleet.io/model': m['group']}, 'topologySpreadConstraints': spread,
            'terminationGracePeriodSeconds': 0, 'volumes': [{'name': 'dshm', 'emptyDir': {'medium': 'Memory'}}],
            'containers': [train]},
            replicas=count))
        # Training tolerates a few nodes out at once: the rollout's batches of 4 fit.
        objs.append({'apiVersion': 'policy/v1', 'kind': 'PodDisruptionBudget',
                     'metadata': {'name': 'train-' + short, 'namespace': 'ml'},
                     'spec': {'selector': {'matchLabels': app}, 'maxUnavailable': 4}})
    # A bare pod (a notebook someone started by hand on the last node, one GPU, scratch space on the node's disk): the
    # drain policy refuses it by default; the lab's plan has a rule that deletes it (LAB_DRAIN_POLICY).
    objs += [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': SCRATCH_NAMESPACE}},
             {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'notebook', 'namespace': SCRATCH_NAMESPACE,
                                                              'labels': {'app': 'notebook'}},
              'spec': {'nodeName': names[-1], 'terminationGracePeriodSeconds': 0,
                       'volumes': [{'name': 'scratch', 'emptyDir': {}}],
                       'containers': [dict(_container('notebook', 'registry.example/notebook:1', gpus=1),
                                           volumeMounts=[{'name': 'scratch', 'mountPath': '/scratch'}])]}}]
    nodes = [_node(name, model_of(i, len(names)), shape) for i, name in enumerate(names)]
    if operator:   # the operator labels its nodes' nvidia.com/gpu.deploy.* itself
        for node in nodes:
            node['metadata']['labels'] = {k: v for k, v in node['metadata']['labels'].items()
                                          if not k.startswith('nvidia.com/gpu.deploy.')}
            node['metadata']['labels'].update(NFD_HOST)
    return nodes + objs


def apply_pool(cluster: Any, names: list[str], timeout: float = 180, operator: Any = None,
               operator_driver: bool = False, driver_pools: bool = False, shape: dict | None = None) -> None:
    """The pool on the control plane: the nodes first, until each is Ready and free of taints (the
    node lifecycle controller lifts its not-ready taint), then the workloads, until they run
    (wait_workloads). In that order the scheduler spreads the training pods one per node, as on a
    fleet whose nodes were up before its jobs; created together, the pods would pile on the first
    node that came up."""
    objs = kubernetes_objects(names, operator=operator is not None, operator_driver=operator_driver,
                              driver_pools=driver_pools, shape=shape)
    nodes = [o for o in objs if o['kind'] == 'Node']
    cluster.apply(nodes, settle=False)

    def schedulable() -> bool:
        for node in cluster.list('v1', 'Node'):
            conds = {c['type']: c['status'] for c in (node.get('status') or {}).get('conditions') or []}
            if conds.get('Ready') != 'True' or (node.get('spec') or {}).get('taints'):
                return False
        return True

    cluster.wait_for(schedulable, timeout=timeout, interval=0.2, message='the lab\'s nodes Ready and untainted')
    cluster.apply([o for o in objs if o['kind'] != 'Node'], settle=False)
    if operator is not None:
        # The operator reconciles the ClusterPolicy into its operand DaemonSets: ready once every one is.
        operator.wait_ready(timeout=timeout)
    wait_workloads(cluster, timeout=timeout, operands=operator is not None)


def wait_workloads(cluster: Any, timeout: float = 180, operands: bool = False) -> None:
    """Bounded: every DaemonSet, ReplicaSet and Deployment of the lab has its pods Running and
    Ready (the controllers created them, the scheduler placed them, KWOK ran them), and every
    PodDisruptionBudget has been computed by the disruption controller."""
    def ready() -> bool:
        for ds in cluster.list('apps/v1', 'DaemonSet', 'gpu-operator'):
            st = ds.get('status') or {}
            # The real operator's operands that no node needs (the MIG manager without MIG) schedule none.
            if operands and st.get('observedGeneration') == ds['metadata'].get('generation') and \
                    st.get('desiredNumberScheduled') == 0:
                continue
            if not st.get('desiredNumberScheduled') or st.get('numberReady') != st['desiredNumberScheduled']:
                return False
        for kind in ('ReplicaSet', 'Deployment'):
            for obj in cluster.list('apps/v1', kind, 'ml') + cluster.list('apps/v1', kind, 'gpu-operator'):
                if (obj.get('status') or {}).get('readyReplicas', 0) != obj['spec']['replicas']:
                    return False
        for pdb in cluster.list('policy/v1', 'PodDisruptionBudget', 'ml'):
            st = pdb.get('status') or {}
            if st.get('observedGeneration') != pdb['metadata']['generation'] or \
                    st.get('currentHealthy') != st.get('expectedPods'):
                return False
        return True

    cluster.wait_for(ready, timeout=timeout, interval=0.25,
                     message='the lab\'s workloads Running and Ready (DaemonSets, ReplicaSets, PDBs)')


OPERATOR_SA = ('gpufleet-system', 'gpufleet-upgrade')
APPROVALS_NAMESPACE = 'gpufleet-approvals'
# Where the workload gate's Jobs run in the lab (the workload-gate role is bound there only).
WORKLOAD_NAMESPACE = 'gpufleet-qualify'
RBAC_DIR = HERE.parents[1] / 'docs' / 'rbac'


def operator_kubeconfig(cluster: Any, path: pathlib.Path, gpu_operator: bool = False) -> str:
    """The identity the lab's playbooks run as: the ServiceAccount gpufleet-system/gpufleet-upgrade
    bound to the collection's roles (docs/rbac) as docs/rbac/bindings-example.yml and the roles' own
    comments say (the ClusterRoles reader and operator, and gpu-operator's, cluster-wide; each Role by a
    RoleBinding in its namespace: the SUC Plans role in the controller's namespace, the snapshots role in
    gpufleet-system, the plan-lease role there too, the approvals reader in gpufleet-approvals, the workload gate's in the lab's
    qualification namespace, gpu-operator's for the operand pods and the HelmChart in gpu-operator and
    kube-system), never cluster-admin. A token kubeconfig through the fault proxy, written to `path`."""
    import yaml
    ns, sa = OPERATOR_SA
    names = ['reader', 'operator', 'rke2-plans', 'snapshots', 'approvals-reader', 'workload-gate', 'plan-lease']
    if gpu_operator:
        names += ['gpu-operator', 'gpu-operator-operands', 'gpu-operator-helmchart']
    # where a Role is bound when not in its file's namespace (the lab's qualification namespace)
    moved = {'gpufleet-upgrade-workload-gate': WORKLOAD_NAMESPACE}
    roles = []
    for name in names:
        for doc in yaml.safe_load_all((RBAC_DIR / ('gpufleet-upgrade-%s.yml' % name)).read_text()):
            if doc and doc.get('kind') in ('ClusterRole', 'Role'):
                if doc['kind'] == 'Role' and doc['metadata']['name'] in moved:
                    doc = dict(doc, metadata=dict(doc['metadata'], namespace=moved[doc['metadata']['name']]))
                roles.append(doc)
    subject = [{'kind': 'ServiceAccount', 'name': sa, 'namespace': ns}]
    objs: list[dict] = [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': n}}
                        for n in (ns, 'system-upgrade', APPROVALS_NAMESPACE, WORKLOAD_NAMESPACE)] + roles
    for role in roles:
        ref = {'apiGroup': 'rbac.authorization.k8s.io', 'kind': role['kind'], 'name': role['metadata']['name']}
        meta = {'name': role['metadata']['name']}
        if role['kind'] == 'Role':   # a RoleBinding in the Role's namespace: its rights end there
            meta['namespace'] = role['metadata']['namespace']
        objs.append({'apiVersion': 'rbac.authorization.k8s.io/v1',
                     'kind': 'RoleBinding' if role['kind'] == 'Role' else 'ClusterRoleBinding',
                     'metadata': meta, 'roleRef': ref, 'subjects': subject})
    cluster.apply(objs, settle=False)
    return cluster.sa_kubeconfig(ns, sa, path=str(path), seconds=24 * 3600)


TEMPLATE_VERSION = 3      # bump when what a template root holds changes


def _lab_packages(module_source: str, kernel_release: str = KERNEL) -> list[str]:
    """`name=version` of what a lab node has installed at the source (running `kernel_release`)."""
    v134 = debrepo.kernel_version(kernel_release)
    kernel = ['%s=%s' % (n % kernel_release, v134)
              for n in ('linux-image-%s', 'linux-modules-%s', 'linux-modules-extra-%s')]
    if module_source == 'prebuilt':
        builds = debrepo.PREBUILT_MODULES + ((debrepo.KERNEL_DRIFT, SOURCE_DRIVER, 1),)
        n = next(n for k, d, n in builds if k == kernel_release and d == SOURCE_DRIVER)
        return (kernel + ['%s=%s' % (p, debrepo.deb_version(SOURCE_DRIVER)) for p in PREBUILT_SET]
                + ['linux-modules-nvidia-580-server-%s=%s+%d' % (kernel_release, v134, n)])
    # The DKMS roots (the molecule scenarios) carry Fabric Manager and NSCQ too, as an HGX node does.
    return (kernel + ['linux-headers-%s=%s' % (kernel_release, v134)]
            + ['%s=%s' % (p, debrepo.deb_version(SOURCE_DRIVER)) for p in DKMS_SET]
            + ['%s=%s' % (p, debrepo.deb_version(SOURCE_DRIVER, debrepo.FM_REVISION))
               for p in ('nvidia-fabricmanager-580', 'libnvidia-nscq-580')])


def update_grub_hook(root: pathlib.Path) -> None:
    """The root's apt runs grubsim's update-grub for the root after every dpkg run (DPkg::Post-Invoke
    in the ROOT's apt.conf.d: the collection's apt under an install root reads it, as its
    APT_CONFIG sets Dir to the root), so installing or removing a kernel lists it in grub.cfg as
    update-grub from the kernel's postinst does on Ubuntu."""
    (root / 'etc/apt/apt.conf.d/99lab-update-grub').write_text(debrepo.update_grub_hook_text(
        [sys.executable, str(HERE / 'grubsim.py'), 'update-grub', str(root.resolve())]))


def make_roots(lab: pathlib.Path, names: list[str], module_source: str = MODULE_SOURCE,
               shape: dict | None = None) -> pathlib.Path:
    """One install root per node at the source tuple (kernel 6.8.0-134-generic, driver 580.126.20
    from `module_source`: `prebuilt`, the lab's, or `dkms`), with /boot, GRUB's environment block
    (real grub-editenv; saved_entry = the 134 entry), grub.cfg and GRUB_DEFAULT=saved; built once
    and copied (cheap on 2 cores); a node of `shape` that runs another kernel (FLEETS) gets a template of that
    kernel. Returns the repository."""
    grubsim.editenv()         # the lab's reboots use the real grub-editenv: fail early and clearly
    cache = lab / 'cache'
    cache.mkdir(parents=True, exist_ok=True)
    repo = debrepo.cached_repo(cache, debrepo.lab_repo_specs())
    templates = {k: _template_root(cache, repo, module_source, k) for k in sorted({kernel_of(n, shape) for n in names})}
    for name in names:
        dest = lab / 'nodes' / name / 'root'
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(templates[kernel_of(name, shape)], dest, symlinks=True)
        update_grub_hook(dest)
        (dest.parent / 'root.apt.conf').write_text(debrepo.apt_config_text(dest.resolve()))
    return repo


def _template_root(cache: pathlib.Path, repo: pathlib.Path, module_source: str, kernel: str) -> pathlib.Path:
    """The install root every node running `kernel` starts as (built once per repository, kernel and module source)."""
    suffix = '' if kernel == KERNEL else '-' + kernel
    template = cache / ('root-template-v%d-%s-%s%s' % (TEMPLATE_VERSION, module_source, repo.name, suffix))
    marker = template.parent / (template.name + '.done')
    if marker.is_file():
        return template
    shutil.rmtree(template, ignore_errors=True)
    root = debrepo.AptRoot.create(template, repo)
    update_grub_hook(template)
    (template / 'etc/default/grub').write_text(
        'GRUB_DEFAULT=saved\nGRUB_TIMEOUT_STYLE=hidden\nGRUB_TIMEOUT=0\nGRUB_DISTRIBUTOR=Ubuntu\n'
        'GRUB_CMDLINE_LINUX_DEFAULT=""\n')
    root.apt_get('install', '-y', *_lab_packages(module_source, kernel))
    # As on a node where the meta package pulled the kernel: its packages are automatic.
    root.apt_mark('auto', *[n for n in root.installed() if n.startswith('linux-')])
    if module_source == 'dkms':      # what DKMS autoinstall leaves (no maintainer scripts here)
        mod = template / 'var/lib/dkms/nvidia' / SOURCE_DRIVER / kernel / 'x86_64/module'
        mod.mkdir(parents=True)
        (mod / 'nvidia.ko.zst').write_bytes(b'\0')
    listed = grubsim.boot_kernels(template)
    if listed != [kernel] or 'vmlinuz-' + kernel not in (template / 'boot/grub/grub.cfg').read_text():
        raise RuntimeError('the template root\'s update-grub hook did not list %s in %s (boot/: %s)'
                           % (kernel, template / 'boot/grub/grub.cfg', listed))
    grubsim.create_grubenv(template / 'boot/grub/grubenv', saved_entry=GRUB_ENTRY(kernel))
    marker.write_text('ok\n')
    return template


def write_node_files(lab: pathlib.Path, names: list[str], shape: dict | None = None) -> None:
    """What a node booted on its saved GRUB entry (kernel 134) shows: proc/ (osrelease, cmdline,
    driver/nvidia/version of the module installed for the kernel), a kernel log with the boot's
    "Linux version" line, the NVML stand-in's state with that driver."""
    for i, name in enumerate(names):
        d = lab / 'nodes' / name
        kernel = kernel_of(name, shape)
        (d / 'proc' / 'sys' / 'kernel').mkdir(parents=True, exist_ok=True)
        (d / 'proc' / 'sys' / 'kernel' / 'osrelease').write_text(kernel + '\n')
        (d / 'proc' / 'cmdline').write_text('BOOT_IMAGE=/boot/vmlinuz-%s root=UUID=%s ro\n' % (kernel, grubsim.UUID))
        driver = module_driver(d / 'root', kernel)
        nv = d / 'proc' / 'driver' / 'nvidia' / 'version'
        nv.parent.mkdir(parents=True, exist_ok=True)
        nv.write_text(grubsim.nvidia_version_text(driver or SOURCE_DRIVER))
        (d / 'kern.log').write_text('%s %s kernel: Linux version %s (lab node booted)\n' % (
            '2026-01-01T00:00:00+00:00', name, kernel))
        state = nvml_state(model_of(i, len(names)), name, driver or SOURCE_DRIVER)
        (d / 'nvml.json').write_text(json.dumps(state, indent=1))
        nvml_stub.write_state(d / 'nvml.state', state)


def measured(lab: pathlib.Path, name: str) -> dict[str, Any]:
    """What a lab node shows now on the host side: the running kernel (proc osrelease), the loaded
    NVIDIA driver (proc/driver/nvidia/version), NVML's driver, the installed driver."""
    d = lab / 'nodes' / name
    osrelease = d / 'proc' / 'sys' / 'kernel' / 'osrelease'
    nv = d / 'proc' / 'driver' / 'nvidia' / 'version'
    m = re.search(r'NVRM version:.*?\s(\d{3}\.\d+\.\d+)\s', nv.read_text()) if nv.is_file() else None
    return {'kernel': osrelease.read_text().strip() if osrelease.is_file() else None,
            'loaded': m.group(1) if m else None,
            'nvml': json.loads((d / 'nvml.json').read_text()).get('driver_version'),
            'installed': installed_driver(d / 'root')}


def inventory(lab: pathlib.Path, names: list[str], lib_dir: pathlib.Path, extra: dict[str, Any]) -> dict:
    hosts: dict[str, dict] = {m['group']: {} for m in MODELS}
    for i, name in enumerate(names):
        d = (lab / 'nodes' / name).resolve()
        hosts[model_of(i, len(names))['group']][name] = {
            'gpufleet_installroot': str(d / 'root'),
            'gpufleet_proc_path': str(d / 'proc'),
            'gpufleet_kernel_log': str(d / 'kern.log'),
            'gpufleet_node_environment': nvml_stub.env(lib_dir, d / 'nvml.state'),
        }
    all_vars = {
        'ansible_connection': 'local',
        'ansible_python_interpreter': sys.executable,
        'gpufleet_kubeconfig': str((lab / 'kubeconfig').resolve()),
        'gpufleet_lab_hook': [sys.executable, str(HERE / 'lab_node.py'), str(lab.resolve())],
        # kernel_boot's trial asks grub-probe where each root's environment block is: grubsim answers from the
        # root's boot/grub (grubsim.set_disk; a plain ext4 partition unless a test puts it on md RAID or LVM).
        'gpufleet_grub_probe': str(grubsim.probe_tool(lab.resolve() / 'bin')),
        'gpufleet_snapshot_dir': str((lab / 'snapshots').resolve()),
        'gpufleet_current': CURRENT,
        'gpufleet_target': TARGET,
        # The lab's nodes: the prebuilt module source (issue 14), RKE2 agents.
        'gpufleet_driver_preset': DRIVER_PRESET,
        'gpufleet_kernel_module_source': MODULE_SOURCE,
        'gpufleet_rke2_role': 'agent',
    }
    all_vars.update(extra)
    return {'all': {
        'vars': all_vars,
        'hosts': {'localhost': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable}},
        'children': {'gpu_nodes': {'children': {g: {'hosts': h} for g, h in hosts.items()}}},
    }}
