"""The lab reboot path: what a reboot (or a driver reload) does to an emulated lab node.

    python lab_node.py <lab dir> reboot|reload|operator <node>

Used by the node_upgrade and rollback roles when `*_activation: lab` (never on real hosts):

1. `reboot` boots the node as GRUB would (tests/tools/grubsim.py over the root's real
   boot/grub/grubenv and boot/grub/grub.cfg): a set `next_entry` boots once and is cleared,
   otherwise `saved_entry`; a kernel that does not come up (lab.json `fault_kind: kernel` on the
   fault node: the target kernel) is power-cycled into the next choice. What came up is written
   where the host shows it: `proc/sys/kernel/osrelease`, `proc/cmdline`, a "Linux version" line in
   `kern.log`, and `proc/driver/nvidia/version` for the NVIDIA module that loads with that kernel:
   the one INSTALLED FOR THE BOOTED KERNEL under the root (prebuilt: the driver the package
   `linux-modules-nvidia-580-server-<kernel>` was built for, its Depends
   `nvidia-kernel-common-580-server (>= <driver>)`; a DKMS root: the installed `nvidia-dkms`
   version, which DKMS autoinstall builds for every kernel). No module package for the booted
   kernel: no NVIDIA module loads (no /proc/driver/nvidia, NVML fails with DRIVER_NOT_LOADED).
   `reload` (no reboot) loads the module installed for the running kernel; `operator` (install method
   operator) loads the module of the driver the GPU Operator's driver pod on the node runs (its image tag),
   what a real driver container does once it is up;
2. the NVML stand-in state follows the LOADED module (nvml.json / nvml.state driver_version);
3. the Node's driver labels follow, as GPU Feature Discovery relabels a real node;
4. `reboot` is what a reboot does to the Node on the real control plane (tests/cluster): the
   node's kubelet stops (`stop_kubelet`: Ready False, KWOK no longer plays it), the Node's
   `status.nodeInfo` changes as the kubelet reports it after the boot (a new bootID, the booted
   kernel; the kubeletVersion stays what it was: the System Upgrade Controller stand-in sets it),
   then the kubelet starts again (`start_kubelet`: KWOK sets Ready) and, once the Node is Ready,
   the node's pods are Ready again (the kubelet restarted their containers: the node lifecycle
   controller may have marked them not Ready meanwhile; the hook first waits out two of its passes,
   CONTROLLER_PASSES). No sleep stands for the boot. Nodes
   listed in lab.json `stuck`, and a node whose kernels all fail to come up, stay stopped (NotReady);
   lab.json `misreport` {node: {nodeInfo field: value}} makes a node's kubelet report something
   else than what runs, and its `dcgm_exporter` key the image tag of the node's dcgm-exporter pod
   (tests of measured tuples);
5. on the node named in lab.json `fault`, when the NEW driver came up, a critical Xid 79
   ("GPU has fallen off the bus") is appended to the node's kernel log: the lab's injected fault
   (`fault_kind: xid`, the default; with `fault_kind: temperature` the DCGM stand-in reports a hot
   GPU instead, tests/tools/lab_dcgm.py; with `fault_kind: kernel` the target kernel does not boot);
6. the node's dcgm-exporter restarts with the driver (`dcgm.since`, the time from which the DCGM
   stand-in counts Xids) and, when the lab runs Prometheus (lab.json `prometheus`), the hook waits
   (bounded) until Prometheus has scraped the node as it now is, so a metric gate that follows
   sees the new driver, as it would once a real node's dcgm-exporter pod is back.

Prints one JSON line: {"changed": true, "kernel": ..., "driver": ..., "ready": ..., "fault": ...,
"boots": [[entry, kernel, came up], ...], "mode": ..., "scraped": ...}.
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import grubsim  # noqa: E402

BRANCH = '580'
SCRAPE_TIMEOUT = 15.0   # seconds the hook waits for Prometheus to scrape the node after the change

READY_TIMEOUT = 30.0    # seconds the hook waits for KWOK to set a rebooted node Ready
# Two passes of the node lifecycle controller (--node-monitor-period 1s, tests/cluster/controlplane.py): it marks
# any pod created or updated before it has seen the node Ready again as not Ready, and KWOK, unlike a kubelet,
# never sets such a pod Ready again. The hook lets those passes go by before it sets the node's pods Ready, so
# that neither they nor the pods a rollback creates right after are marked again.
CONTROLLER_PASSES = 2.5
FIX_ROUNDS = 4

# This hook runs on every lab activation, so it stays light: no kubernetes client, no pytest; it
# talks to the API server with the lab's setup identity (lab.json `kubeconfig`, a client
# certificate, straight to the API server: it plays the kubelet and GPU Feature Discovery, not the
# collection, so its requests are not in the fault proxy's log), and only the driver_version line
# of the stand-in's state file changes (tests/tools/nvml_stub/README.md).


def _installed(root: pathlib.Path, package: str) -> tuple[str, str] | None:
    """(version, Depends) of `package` when installed under `root` (dpkg-query), else None."""
    out = subprocess.run(['dpkg-query', '--admindir=%s/var/lib/dpkg' % root, '-W',
                          '-f=${Version}\t${db:Status-Abbrev}\t${Depends}', package],
                         capture_output=True, text=True, check=False)
    parts = out.stdout.split('\t')
    if out.returncode != 0 or len(parts) < 3 or parts[1].strip() not in ('ii', 'hi'):
        return None
    return parts[0], parts[2].strip()


def installed_driver(root: pathlib.Path) -> str | None:
    """The upstream version of the driver installed under `root`: its `nvidia-kernel-common`
    package, part of both module sources' sets (dpkg-query)."""
    got = _installed(root, 'nvidia-kernel-common-%s-server' % BRANCH)
    return got[0].split('-', 1)[0] if got else None


def module_package(kernel: str) -> str:
    return 'linux-modules-nvidia-%s-server-%s' % (BRANCH, kernel)


def module_driver(root: pathlib.Path, kernel: str | None) -> str | None:
    """The driver version of the NVIDIA kernel module installed for `kernel` under `root`, None when
    none is: Canonical's prebuilt `linux-modules-nvidia-580-server-<kernel>` carries the driver it
    was built for in its Depends (`nvidia-kernel-common-580-server (>= <driver>)`); without it, a
    DKMS root's module is the installed `nvidia-dkms` version (autoinstall builds it for the kernel)."""
    if not kernel:
        return None
    got = _installed(root, module_package(kernel))
    if got:
        m = re.search(r'nvidia-kernel-common-%s-server \(>= ([^)\s]+)\)' % BRANCH, got[1])
        return m.group(1).split('-', 1)[0] if m else None
    dkms = _installed(root, 'nvidia-dkms-%s-server' % BRANCH)
    return dkms[0].split('-', 1)[0] if dkms else None


def _api(kubeconfig: str):  # type: ignore[no-untyped-def]
    import yaml
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from cluster.client import ApiClient
    conf = yaml.safe_load(pathlib.Path(kubeconfig).read_text())
    cluster = conf['clusters'][0]['cluster']
    user = conf['users'][0]['user']
    cert = (user['client-certificate'], user['client-key']) if 'client-certificate' in user else None
    return ApiClient(cluster['server'], cluster['certificate-authority'], cert=cert, token=user.get('token'))


MERGE = 'application/merge-patch+json'
STOPPED = 'gpufleet.test/kubelet'     # tests/cluster: KWOK leaves a Node so annotated alone


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def stop_kubelet(api, name: str) -> None:  # type: ignore[no-untyped-def]
    """As tests/cluster Cluster.stop_kubelet: KWOK stops playing the node, its Ready condition goes False."""
    path = '/api/v1/nodes/' + name
    api.request('PATCH', path, {'metadata': {'annotations': {STOPPED: 'stopped'}}}, content_type=MERGE)
    cur = api.request('GET', path)
    conds = [c for c in (cur.get('status') or {}).get('conditions') or [] if c.get('type') != 'Ready']
    conds.append({'type': 'Ready', 'status': 'False', 'reason': 'KubeletNotReady',
                  'message': 'node is rebooting (lab)', 'lastHeartbeatTime': _now(), 'lastTransitionTime': _now()})
    api.request('PATCH', path + '/status', {'status': {'conditions': conds}},
                content_type='application/strategic-merge-patch+json')


def start_kubelet(api, name: str) -> None:  # type: ignore[no-untyped-def]
    """As tests/cluster Cluster.start_kubelet: KWOK plays the node's kubelet again (and sets it Ready)."""
    api.request('PATCH', '/api/v1/nodes/' + name, {'metadata': {'annotations': {STOPPED: None}}}, content_type=MERGE)


def pods_ready_again(api, name: str) -> int:  # type: ignore[no-untyped-def]
    """The node's Running pods that are not Ready set Ready (their containers restarted); how many."""
    fixed_pods = 0
    pods = api.request('GET', '/api/v1/pods', query={'fieldSelector': 'spec.nodeName=' + name})['items']
    for pod in pods:
        meta, status = pod['metadata'], pod.get('status') or {}
        conds = status.get('conditions') or []
        if meta.get('deletionTimestamp') or status.get('phase') != 'Running' or \
                all(c['status'] == 'True' for c in conds if c['type'] in ('Ready', 'ContainersReady')):
            continue
        now = _now()
        fixed = [dict(c, status='True', lastTransitionTime=now) if c['type'] in ('Ready', 'ContainersReady') else c
                 for c in conds if c['type']]
        containers = [dict(c, ready=True, restartCount=c.get('restartCount', 0) + 1, state={'running': {'startedAt': now}})
                      for c in status.get('containerStatuses') or []]
        api.request('PATCH', '/api/v1/namespaces/%s/pods/%s/status' % (meta['namespace'], meta['name']),
                    {'status': {'conditions': fixed, 'containerStatuses': containers}},
                    content_type='application/strategic-merge-patch+json', ok404=True)
        fixed_pods += 1
    return fixed_pods


def boot(api, name: str, node_dir: pathlib.Path, misreport: dict | None = None) -> bool:  # type: ignore[no-untyped-def]
    """After the kubelet stopped: the boot's nodeInfo (the running kernel; the rest as the kubelet
    reported it, so the kubeletVersion the SUC stand-in set stays; `misreport` overrides fields),
    the kubelet back, the node's pods Ready again."""
    path = '/api/v1/nodes/' + name
    info = dict((api.request('GET', path).get('status') or {}).get('nodeInfo') or {})
    kernel = (node_dir / 'proc' / 'sys' / 'kernel' / 'osrelease').read_text().strip()
    info.update(kernelVersion=kernel, bootID=str(uuid.uuid4()))
    info.update(misreport or {})
    api.request('PATCH', path + '/status', {'status': {'nodeInfo': info}}, content_type=MERGE)
    start_kubelet(api, name)
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        conds = {c['type']: c['status'] for c in api.request('GET', path)['status'].get('conditions') or []}
        if conds.get('Ready') == 'True':
            break
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    # Until a round finds none to set Ready again (bounded): a controller late under load may mark some again.
    for _round in range(FIX_ROUNDS):
        time.sleep(CONTROLLER_PASSES)
        if not pods_ready_again(api, name):
            break
    return True


DCGM_MISREPORT = 'dcgm_exporter'    # lab.json misreport key: the node's dcgm-exporter pod's image tag


def misreport_dcgm_exporter(api, name: str, tag: str) -> None:  # type: ignore[no-untyped-def]
    """The node's dcgm-exporter pod runs another image tag than its DaemonSet's (what a node gate
    measuring the exporter on the node must see)."""
    pods = api.request('GET', '/api/v1/namespaces/gpu-operator/pods',
                       query={'fieldSelector': 'spec.nodeName=' + name, 'labelSelector': 'app=nvidia-dcgm-exporter'})['items']
    for pod in pods:
        containers = [{'name': c['name'], 'image': c['image'].rsplit(':', 1)[0] + ':' + tag}
                      for c in pod['spec']['containers']]
        api.request('PATCH', '/api/v1/namespaces/gpu-operator/pods/' + pod['metadata']['name'],
                    {'spec': {'containers': containers}}, content_type='application/strategic-merge-patch+json', ok404=True)


def _write(path: pathlib.Path, text: str) -> None:
    """Atomically: the DCGM stand-in reads these files at every scrape."""
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(text)
    os.replace(tmp, path)


def wait_scraped(prometheus: str, name: str, driver: str | None, since: float) -> float | None:
    """Seconds until Prometheus holds a sample of the node taken after `since`; None past the bound."""
    query = 'timestamp(dcgm_lab_driver_info{Hostname="%s",DCGM_FI_DRIVER_VERSION="%s"})' % (name, driver or '')
    url = prometheus.rstrip('/') + '/api/v1/query?' + urllib.parse.urlencode({'query': query})
    deadline = time.monotonic() + SCRAPE_TIMEOUT
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                result = json.loads(resp.read().decode())['data']['result']
            if result and float(result[0]['value'][1]) >= since:
                return round(time.time() - since, 2)
        except (OSError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.2)
    return None


def _stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S+00:00')


def running_kernel(node_dir: pathlib.Path) -> str | None:
    try:
        return (node_dir / 'proc' / 'sys' / 'kernel' / 'osrelease').read_text().strip() or None
    except OSError:
        return None


def load_module(node_dir: pathlib.Path, kernel: str | None) -> str | None:
    """What loading the NVIDIA module installed for `kernel` does to the node's files: the
    driver's /proc/driver/nvidia/version (removed when there is none), the NVML stand-in's driver
    (nvml.json, and nvml.state's driver_version line; no module: NVML fails DRIVER_NOT_LOADED).
    Returns the loaded driver version or None."""
    return load_driver(node_dir, module_driver(node_dir / 'root', kernel))


def load_driver(node_dir: pathlib.Path, driver: str | None) -> str | None:
    """The node's files once the NVIDIA module of `driver` is loaded (None: no module)."""
    nv = node_dir / 'proc' / 'driver' / 'nvidia' / 'version'
    if driver:
        nv.parent.mkdir(parents=True, exist_ok=True)
        _write(nv, grubsim.nvidia_version_text(driver))
    elif nv.exists():
        nv.unlink()
    state = json.loads((node_dir / 'nvml.json').read_text())
    state['driver_version'] = driver
    _write(node_dir / 'nvml.json', json.dumps(state, indent=1))
    text = (node_dir / 'nvml.state').read_text()
    text = re.sub(r'(?m)^(driver_version|init_error) .*\n?', '', text)
    text = re.sub(r'(?m)^(# .*\n)', r'\1%s\n' % ('driver_version %s' % driver if driver else 'init_error DRIVER_NOT_LOADED'),
                  text, count=1)
    _write(node_dir / 'nvml.state', text)
    return driver


def boot_host(node_dir: pathlib.Path, fails: set[str]) -> dict:
    """The host side of a reboot: GRUB picks the kernel (grubsim, the root's grubenv and grub.cfg;
    kernels in `fails` do not come up), proc/ and kern.log show what came up, the NVIDIA module
    installed for it loads. {'kernel': None} when nothing came up."""
    root = node_dir / 'root'
    res = grubsim.boot(root / 'boot/grub/grubenv', root / 'boot/grub/grub.cfg', fails=fails,
                       proc=node_dir / 'proc', driver=lambda k: module_driver(root, k))
    with open(node_dir / 'kern.log', 'a', encoding='utf-8') as log:
        for entry, kernel, up in res.boots:
            if up:
                log.write('%s %s kernel: Linux version %s (lab node booted, GRUB entry %s)\n'
                          % (_stamp(), node_dir.name, kernel, entry))
    if res.kernel:
        driver = load_module(node_dir, res.kernel)
    else:      # nothing runs: no kernel, no module (the node is down; its kubelet stays stopped)
        driver = None
        for rel in ('sys/kernel/osrelease', 'driver/nvidia/version'):
            (node_dir / 'proc' / rel).unlink(missing_ok=True)
    return {'kernel': res.kernel, 'driver': driver, 'boots': [list(b) for b in res.boots]}


# Every driver pod of the operator carries this label: the ClusterPolicy's driver DaemonSet's and an NVIDIADriver's.
DRIVER_POD_SELECTOR = 'app.kubernetes.io/component=nvidia-driver'


def container_driver(api, name: str) -> str | None:  # type: ignore[no-untyped-def]
    """The driver version the GPU Operator's driver pod on node `name` runs (its image tag without the OS the
    operator appends: `580.126.20-ubuntu22.04` -> 580.126.20), None when no such pod runs there. What a real
    driver container does once it is up: the module of its version is loaded on the host."""
    pods = api.request('GET', '/api/v1/namespaces/gpu-operator/pods',
                       query={'labelSelector': DRIVER_POD_SELECTOR, 'fieldSelector': 'spec.nodeName=' + name})['items']
    running = [p for p in pods if (p.get('status') or {}).get('phase') == 'Running'
               and not p['metadata'].get('deletionTimestamp')]
    if len(running) != 1:
        return None
    tag = running[0]['spec']['containers'][0]['image'].rsplit(':', 1)[-1]
    return tag.split('-', 1)[0]


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ('reboot', 'reload', 'operator'):
        print(json.dumps({'failed': True, 'msg': 'usage: lab_node.py <lab dir> reboot|reload|operator <node>'}))
        return 2
    lab, mode, name = pathlib.Path(argv[0]), argv[1], argv[2]
    conf = json.loads((lab / 'lab.json').read_text())
    node_dir = lab / 'nodes' / name
    fault_node = conf.get('fault') == name
    kind = conf.get('fault_kind', 'xid')
    boots: list = []
    api = _api(conf['kubeconfig'])
    stuck = name in conf.get('stuck', [])
    if mode == 'reboot':
        stop_kubelet(api, name)
        fails = {conf['target_kernel']} if fault_node and kind == 'kernel' and conf.get('target_kernel') else set()
        host = boot_host(node_dir, fails)
        kernel, driver, boots = host['kernel'], host['driver'], host['boots']
    elif mode == 'operator':    # the operator's driver container: the module of its pod's version
        kernel = running_kernel(node_dir)
        driver = load_driver(node_dir, container_driver(api, name))
    else:
        kernel = running_kernel(node_dir)
        driver = load_module(node_dir, kernel)
        if stuck:
            stop_kubelet(api, name)
    if driver:
        major, minor, rev = driver.split('.')
        api.request('PATCH', '/api/v1/nodes/' + name, {'metadata': {'labels': {
            'nvidia.com/cuda.driver.major': major, 'nvidia.com/cuda.driver.minor': minor,
            'nvidia.com/cuda.driver.rev': rev}}}, content_type=MERGE)
    ready = not stuck and kernel is not None
    misreport = dict((conf.get('misreport') or {}).get(name) or {})
    dcgm_tag = misreport.pop(DCGM_MISREPORT, None)
    if mode == 'reboot' and ready:
        ready = boot(api, name, node_dir, misreport)
    if ready and dcgm_tag:
        misreport_dcgm_exporter(api, name, dcgm_tag)
    if kind == 'kernel':
        fault = fault_node and any(not boot_try[2] for boot_try in boots)
    else:
        fault = fault_node and driver == conf['target_driver']
    when = _stamp()
    _write(node_dir / 'dcgm.since', when + '\n')
    if fault and kind == 'xid':
        state = json.loads((node_dir / 'nvml.json').read_text())
        bus = state['gpus'][3]['bus_id'][4:14].lower()
        with open(node_dir / 'kern.log', 'a', encoding='utf-8') as log:
            log.write('%s %s kernel: NVRM: Xid (PCI:%s): 79, pid=0, name=lab, GPU has fallen off the bus.\n'
                      % (when, name, bus))
    scraped = wait_scraped(conf['prometheus'], name, driver, time.time()) if conf.get('prometheus') and ready else None
    print(json.dumps({'changed': True, 'kernel': kernel, 'driver': driver, 'ready': ready, 'fault': fault,
                      'boots': boots, 'mode': mode, 'scraped': scraped}))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
