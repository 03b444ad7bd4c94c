"""The lab's emulated 40-node GPU pool: Kubernetes objects, per-node install roots and NVML states.

Everything a lab node is lives under `<lab>/nodes/<name>/`:

- `root/` an install root with its own dpkg database (real dpkg/apt; debrepo.py builds the driver
  packages 580.126.20 and 580.130.00 into a local repository); the driver set is installed at the
  source version;
- `nvml.json` + `nvml.state`: the stand-in libnvidia-ml's state (tests/tools/nvml_stub). The
  driver version in it FOLLOWS THE INSTALL ROOT: the lab's activation hook (lab_node.py, the lab
  reboot path of the node_upgrade and rollback roles) rewrites it from `dpkg-query` under the root,
  as loading the newly installed kernel module does on a real host. Before the hook runs, NVML
  still reports the old driver, exactly like a host between `apt-get install` and the reload;
- `kern.log`: the node's kernel log (gpu_info reads Xid events from it);
- `proc/`: what node_snapshot reads of /proc (running kernel, command line).

`<lab>/lab.json` tells the hook where things are and which node gets the injected fault.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys
import uuid
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from tools import debrepo, nvml_stub  # noqa: E402
from tools.lab_node import installed_driver  # noqa: E402  (the hook's own reading of the install root)

KERNEL = '6.8.0-134-generic'
RKE2 = 'v1.35.3+rke2r3'
GPU_OPERATOR = 'v26.3.3'
DCGM_EXPORTER = '4.4.1-4.6.0-ubuntu22.04'
SOURCE_DRIVER = debrepo.OLD       # 580.126.20
TARGET_DRIVER = debrepo.NEW       # 580.130.00
CURRENT = {'kernel': KERNEL, 'rke2': RKE2, 'driver': SOURCE_DRIVER, 'gpu_operator': GPU_OPERATOR,
           'dcgm_exporter': DCGM_EXPORTER}
TARGET = dict(CURRENT, driver=TARGET_DRIVER)

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


def _node(name: str, model: dict) -> dict:
    """A GPU node as RKE2's kubelet, NFD and GPU Feature Discovery report it (labels, allocatable, nodeInfo)."""
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
                'nodeInfo': node_info(name, KERNEL)}}


def node_info(name: str, kernel: str, boot: int = 0) -> dict:
    """status.nodeInfo as the node's kubelet reports it; `boot` counts the node's reboots (its bootID)."""
    return {'kernelVersion': kernel, 'kubeletVersion': RKE2, 'kubeProxyVersion': RKE2,
            'osImage': 'Ubuntu 24.04.3 LTS', 'containerRuntimeVersion': 'containerd://2.1.4-k3s1',
            'operatingSystem': 'linux', 'architecture': 'amd64',
            'machineID': uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
            'systemUUID': str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
            'bootID': str(uuid.uuid5(uuid.NAMESPACE_OID, '%s/%d' % (name, boot)))}


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


def kubernetes_objects(names: list[str]) -> list[dict]:
    """The pool and its workloads, run by the control plane's real controllers: the GPU Operator's
    Deployment, the device plugin's and the DCGM exporter's DaemonSets (one pod per GPU node, made by
    the DaemonSet controller), and per GPU model a training ReplicaSet with one pod per node of the
    model (4 of the node's 8 GPUs each, spread over the nodes by the scheduler, so an evicted pod finds
    room on another node of its model, as on a fleet with headroom) under a PodDisruptionBudget."""
    gpu_nodes = {'nvidia.com/gpu.present': 'true'}
    objs: list[dict] = [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': ns}}
                        for ns in ('gpu-operator', 'ml')]
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
        objs.append(_workload('ReplicaSet', 'train-' + short, 'ml', app, {
            'nodeSelector': {'gpufleet.io/model': m['group']}, 'topologySpreadConstraints': spread,
            'terminationGracePeriodSeconds': 0,
            'containers': [_container('train', 'registry.example/train:1', gpus=GPUS_PER_NODE // 2)]},
            replicas=count))
        # Training tolerates a few nodes out at once: the rollout's batches of 4 fit.
        objs.append({'apiVersion': 'policy/v1', 'kind': 'PodDisruptionBudget',
                     'metadata': {'name': 'train-' + short, 'namespace': 'ml'},
                     'spec': {'selector': {'matchLabels': app}, 'maxUnavailable': 4}})
    return [_node(name, model_of(i, len(names))) for i, name in enumerate(names)] + objs


def apply_pool(cluster: Any, names: list[str], timeout: float = 180) -> None:
    """The pool on the control plane: the nodes first, until each is Ready and free of taints (the
    node lifecycle controller lifts its not-ready taint), then the workloads, until they run
    (wait_workloads). In that order the scheduler spreads the training pods one per node, as on a
    fleet whose nodes were up before its jobs; created together, the pods would pile on the first
    node that came up."""
    objs = kubernetes_objects(names)
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
    wait_workloads(cluster, timeout=timeout)


def wait_workloads(cluster: Any, timeout: float = 180) -> None:
    """Bounded: every DaemonSet, ReplicaSet and Deployment of the lab has its pods Running and
    Ready (the controllers created them, the scheduler placed them, KWOK ran them), and every
    PodDisruptionBudget has been computed by the disruption controller."""
    def ready() -> bool:
        for ds in cluster.list('apps/v1', 'DaemonSet', 'gpu-operator'):
            st = ds.get('status') or {}
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
RBAC_DIR = HERE.parents[1] / 'docs' / 'rbac'


def operator_kubeconfig(cluster: Any, path: pathlib.Path) -> str:
    """The identity the lab's playbooks run as: the ServiceAccount gpufleet-system/gpufleet-upgrade
    bound to the collection's ClusterRoles (docs/rbac) as docs/rbac/bindings-example.yml and the
    roles' own comments say (reader and operator cluster-wide, the SUC Plans role in the controller's
    namespace), never cluster-admin. A token kubeconfig through the fault proxy, written to `path`."""
    import yaml
    ns, sa = OPERATOR_SA
    roles = {}
    for name in ('reader', 'operator', 'rke2-plans'):
        doc = yaml.safe_load((RBAC_DIR / ('gpufleet-upgrade-%s.yml' % name)).read_text())
        roles[name] = doc
    subject = [{'kind': 'ServiceAccount', 'name': sa, 'namespace': ns}]
    ref = {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole'}
    objs: list[dict] = list(roles.values()) + [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': n}}
                                               for n in (ns, 'system-upgrade')]
    for name in ('reader', 'operator'):
        objs.append({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding',
                     'metadata': {'name': 'gpufleet-upgrade-' + name},
                     'roleRef': dict(ref, name='gpufleet-upgrade-' + name), 'subjects': subject})
    objs.append({'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'RoleBinding',
                 'metadata': {'name': 'gpufleet-upgrade-rke2-plans', 'namespace': 'system-upgrade'},
                 'roleRef': dict(ref, name='gpufleet-upgrade-rke2-plans'), 'subjects': subject})
    cluster.apply(objs, settle=False)
    return cluster.sa_kubeconfig(ns, sa, path=str(path), seconds=24 * 3600)


def make_roots(lab: pathlib.Path, names: list[str]) -> pathlib.Path:
    """One install root per node, at the source driver; built once and copied (cheap on 2 cores)."""
    cache = lab / 'cache'
    cache.mkdir(parents=True, exist_ok=True)
    # The driver sets and the running kernel's image package (the snapshot restore brings back the
    # default-boot kernel, which must be installed under the root).
    repo = debrepo.cached_repo(cache, debrepo.driver_specs() + debrepo.kernel_specs((KERNEL,)))
    template = cache / ('root-template-' + repo.name)
    status = template / 'var/lib/dpkg/status'
    if not status.is_file() or 'linux-image-' + KERNEL not in status.read_text():
        shutil.rmtree(template, ignore_errors=True)
        root = debrepo.AptRoot.create(template, repo)
        root.apt_get('install', '-y', *['%s=%s' % (s.name, s.version) for s in
                                        debrepo.driver_specs((SOURCE_DRIVER,)) + debrepo.kernel_specs((KERNEL,))])
    for name in names:
        dest = lab / 'nodes' / name / 'root'
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(template, dest, symlinks=True)
        (dest.parent / 'root.apt.conf').write_text(debrepo.apt_config_text(dest.resolve()))
    return repo


def write_node_files(lab: pathlib.Path, names: list[str]) -> None:
    for i, name in enumerate(names):
        d = lab / 'nodes' / name
        (d / 'proc' / 'sys' / 'kernel').mkdir(parents=True, exist_ok=True)
        (d / 'proc' / 'sys' / 'kernel' / 'osrelease').write_text(KERNEL + '\n')
        (d / 'proc' / 'cmdline').write_text('BOOT_IMAGE=/boot/vmlinuz-%s root=/dev/sda1 ro\n' % KERNEL)
        (d / 'kern.log').write_text('%s %s kernel: Linux version %s (lab node booted)\n' % (
            '2026-01-01T00:00:00+00:00', name, KERNEL))
        state = nvml_state(model_of(i, len(names)), name, installed_driver(d / 'root') or SOURCE_DRIVER)
        (d / 'nvml.json').write_text(json.dumps(state, indent=1))
        nvml_stub.write_state(d / 'nvml.state', state)


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
        'gpufleet_snapshot_dir': str((lab / 'snapshots').resolve()),
        'gpufleet_current': CURRENT,
        'gpufleet_target': TARGET,
    }
    all_vars.update(extra)
    return {'all': {
        'vars': all_vars,
        'hosts': {'localhost': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable}},
        'children': {'gpu_nodes': {'children': {g: {'hosts': h} for g, h in hosts.items()}}},
    }}
