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
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from cluster import fixtures as f  # noqa: E402
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


def kubernetes_objects(names: list[str]) -> list[dict]:
    objs: list[dict] = [f.namespace('gpu-operator'), f.namespace('ml')]
    op = f._workload('apps/v1', 'Deployment', 'gpu-operator', 'gpu-operator', None, 1,
                     {'containers': [f.container('gpu-operator', 'nvcr.io/nvidia/gpu-operator:' + GPU_OPERATOR)]})
    dcgm = f.daemonset('nvidia-dcgm-exporter', 'gpu-operator', template_spec={'containers': [
        f.container('dcgm-exporter', 'nvcr.io/nvidia/k8s/dcgm-exporter:' + DCGM_EXPORTER)]})
    plugin = f.daemonset('nvidia-device-plugin-daemonset', 'gpu-operator', labels=dict(DEVICE_PLUGIN))
    objs += [op, dcgm, plugin]
    trains = {}
    for m in MODELS:
        short = m['group'].split('_')[1]
        rs = f.replicaset('train-' + short, 'ml', replicas=len(names) // 2, labels={'app': 'train-' + short})
        trains[m['group']] = rs
        objs.append(rs)
        # Training tolerates a few nodes out at once: the rollout's batches of 4 fit.
        objs.append(f.pdb('train-' + short, {'app': 'train-' + short}, 'ml', max_unavailable=4))
    for i, name in enumerate(names):
        m = model_of(i, len(names))
        node = f.gpu_node(name, gpus=GPUS_PER_NODE, product=m['product'], pci=m['pci'].split('/', maxsplit=1)[0],
                          driver=SOURCE_DRIVER, labels={'gpufleet.io/platform': m['platform'],
                                                        'gpufleet.io/model': m['group']},
                          kernel=KERNEL, kubelet_version=RKE2)
        objs.append(node)
        objs.append(f.daemonset_pod(plugin, name, suffix=name))
        objs.append(f.replicaset_pod(trains[m['group']], name, suffix=name,
                                     containers=[f.container('train', 'registry.example/train:1',
                                                             requests={'nvidia.com/gpu': '8'})]))
    return objs


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
