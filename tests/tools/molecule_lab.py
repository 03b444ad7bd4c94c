"""A small lab for the molecule scenarios (extensions/molecule/): control plane + install roots + NVML.

    python molecule_lab.py up DIR [--nodes 2] [--cordon gpu-02 ...]   # prepare.yml
    python molecule_lab.py down DIR                                  # destroy.yml / cleanup.yml

`up` builds what `make lab` builds (tests/tools/labenv.py), for a few nodes, under DIR:
`nodes/<node>/root` (real dpkg database, driver set at 580.126.20), `nodes/<node>/nvml.json|.state`,
`kern.log`, `proc/`, plus `nodes/<node>/env.json` (the environment that makes nvidia-ml-py load the
stand-in libnvidia-ml with that node's state), `snapshots/`, `lab.json` (read by the lab reboot path,
lab_node.py) and `kubeconfig`. It then starts a real Kubernetes control plane (tests/cluster: etcd,
kube-apiserver, the controller manager, the scheduler, KWOK as the kubelets; state under
DIR/cluster) with the lab's pool and workloads (the real DaemonSet and ReplicaSet controllers run
them) in a DETACHED process (`serve`) that outlives the Ansible task, and returns once the pool's
workloads are Ready (bounded, START_TIMEOUT). `kubeconfig` is the identity the roles run as: the
ServiceAccount gpufleet-system/gpufleet-upgrade bound to the collection's ClusterRoles (docs/rbac),
through the control plane's fault proxy; `admin.kubeconfig` is the setup identity (lab_node.py
plays the kubelet with it). `--cordon` cordons nodes before anything runs (a node that was cordoned
before the rollout). The driver repository and the template root are cached in DIR/../cache.

`down` stops that process by the pid it recorded (SIGTERM: it stops the control plane, bounded;
SIGKILL after STOP_TIMEOUT, and then the control plane's process groups it recorded get SIGKILL
too, so nothing is left behind); a no-op when nothing runs. Both print one JSON line (Ansible's
`changed` convention).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from tools import labenv, nvml_stub  # noqa: E402

START_TIMEOUT = 240.0   # the control plane (about 5 s), the pool's workloads Ready, the operator's identity
STOP_TIMEOUT = 30.0     # the serve process stops the control plane in at most 15 s


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid(lab: pathlib.Path) -> int | None:
    try:
        return int((lab / 'cluster.pid').read_text().strip())
    except (OSError, ValueError):
        return None


def _kill_components(lab: pathlib.Path) -> list[str]:
    """SIGKILL the process groups of control plane components still alive (serve was killed)."""
    try:
        pids = json.loads((lab / 'cluster.pids.json').read_text())
    except (OSError, ValueError):
        return []
    killed = []
    for name, pid in pids.items():
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)   # each component leads its own process group
                killed.append(name)
            except OSError:
                pass
    return killed


def down(lab: pathlib.Path) -> dict:
    pid = _pid(lab)
    if pid is None or not _alive(pid):
        left = _kill_components(lab)
        (lab / 'cluster.pid').unlink(missing_ok=True)
        return {'changed': bool(left), 'msg': 'no control plane running for %s%s'
                % (lab, ' (killed what was left of it: %s)' % ', '.join(left) if left else '')}
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    left = _kill_components(lab)
    (lab / 'cluster.pid').unlink(missing_ok=True)
    return {'changed': True, 'msg': 'control plane (serve pid %d) stopped%s'
            % (pid, '; killed %s' % ', '.join(left) if left else '')}


def _link_cache(lab: pathlib.Path) -> None:
    """labenv.make_roots caches under <lab>/cache: share one cache between the scenarios."""
    shared = lab.parent / 'cache'
    shared.mkdir(parents=True, exist_ok=True)
    link = lab / 'cache'
    if not link.is_symlink():
        shutil.rmtree(link, ignore_errors=True)
        link.symlink_to(shared.resolve(), target_is_directory=True)


def up(lab: pathlib.Path, nodes: int, cordon: list[str]) -> dict:
    down(lab)
    names = labenv.node_names(nodes)
    unknown = sorted(set(cordon) - set(names))
    if unknown:
        raise SystemExit('--cordon: %s not among the nodes %s' % (', '.join(unknown), ', '.join(names)))
    lab.mkdir(parents=True, exist_ok=True)
    for sub in ('nodes', 'snapshots', 'cluster'):
        shutil.rmtree(lab / sub, ignore_errors=True)
    for name in ('lab.json', 'kubeconfig', 'admin.kubeconfig', 'cluster.log', 'cluster.ready', 'cluster.pids.json'):
        (lab / name).unlink(missing_ok=True)
    (lab / 'snapshots').mkdir()
    _link_cache(lab)
    lib_dir = nvml_stub.build()
    # The scenarios' tuple changes the driver alone (their inventories), from the DKMS set as before
    # issue 14: the activation is a reload, the module DKMS builds for the running kernel loads.
    labenv.make_roots(lab, names, module_source='dkms')
    labenv.write_node_files(lab, names)
    for name in names:
        d = (lab / 'nodes' / name).resolve()
        (d / 'env.json').write_text(json.dumps(nvml_stub.env(lib_dir, d / 'nvml.state'), indent=1))
    with open(lab / 'cluster.log', 'ab') as log:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, str(pathlib.Path(__file__).resolve()), 'serve', str(lab), '--nodes', str(nodes)]
            + [a for n in cordon for a in ('--cordon', n)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while not (lab / 'cluster.ready').is_file():
        if proc.poll() is not None:
            raise SystemExit('the control plane exited with %s; see %s' % (proc.returncode, lab / 'cluster.log'))
        if time.monotonic() > deadline:
            down(lab)
            if proc.poll() is None:
                proc.kill()
            raise SystemExit('the control plane was not ready within %.0f s; see %s' % (START_TIMEOUT, lab / 'cluster.log'))
        time.sleep(0.1)
    ready = json.loads((lab / 'cluster.ready').read_text())
    return {'changed': True, 'api': ready['api'], 'pid': proc.pid, 'nodes': ready['nodes'], 'dir': str(lab.resolve()),
            'msg': '%d GPU nodes on the control plane %s (driver %s under %s/nodes/*/root); the roles run as %s/%s'
            % (len(ready['nodes']), ready['api'], labenv.SOURCE_DRIVER, lab, *labenv.OPERATOR_SA)}


def serve(lab: pathlib.Path, nodes: int, cordon: list[str]) -> int:
    """The control plane, owned by this process until SIGTERM (started detached by `up`)."""
    from cluster import start_cluster
    from cluster.kubelet import PodStatusSync
    names = labenv.node_names(nodes)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    cp, proxy, cluster = start_cluster(lab / 'cluster', log=lambda m: print('molecule lab: ' + m, flush=True))
    try:
        (lab / 'cluster.pids.json').write_text(json.dumps({k: p.pid for k, p in cp.procs.items()}))
        (lab / 'cluster.pid').write_text('%d\n' % os.getpid())
        labenv.apply_pool(cluster, names)
        for name in cordon:
            cluster.patch('v1', 'Node', name, {'spec': {'unschedulable': True}})
        labenv.operator_kubeconfig(cluster, lab / 'kubeconfig')
        shutil.copyfile(cluster.admin_kubeconfig, lab / 'admin.kubeconfig')
        (lab / 'lab.json').write_text(json.dumps({
            'kubeconfig': str((lab / 'admin.kubeconfig').resolve()), 'api': cp.url,
            'target_driver': labenv.TARGET_DRIVER, 'fault': None, 'stuck': []}, indent=1))
        listed = [n['metadata']['name'] for n in cluster.list('v1', 'Node')]
        (lab / 'cluster.ready').write_text(json.dumps({'api': cp.url, 'nodes': listed}) + '\n')
        print('molecule lab: control plane %s, %d nodes, cordoned: %s' % (cp.url, len(listed), cordon or '-'), flush=True)
        # KWOK does not play the kubelet's pod status sync (tests/cluster/kubelet.py); a rebooted node's pods need it.
        with PodStatusSync(cluster):
            while not stop.wait(0.5):
                if any(p.poll() is not None for p in cp.procs.values()):
                    print('molecule lab: a control plane component exited; stopping', flush=True)
                    break
    finally:
        cluster.stop_informers()
        proxy.stop()
        cp.stop()
        (lab / 'cluster.ready').unlink(missing_ok=True)
    print('molecule lab: control plane stopped', flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('action', choices=['up', 'down', 'serve'])
    parser.add_argument('dir', type=pathlib.Path)
    parser.add_argument('--nodes', type=int, default=2)
    parser.add_argument('--cordon', action='append', default=[], help='a node cordoned before anything runs')
    args = parser.parse_args(argv)
    lab = args.dir.resolve()
    if args.action == 'serve':
        return serve(lab, args.nodes, args.cordon)
    print(json.dumps(up(lab, args.nodes, args.cordon) if args.action == 'up' else down(lab)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
