"""A small lab for the molecule scenarios (extensions/molecule/): emulator + install roots + NVML.

    python molecule_lab.py up DIR [--nodes 2] [--cordon gpu-02 ...]   # prepare.yml
    python molecule_lab.py down DIR                                  # destroy.yml / cleanup.yml

`up` builds what `make lab` builds (tests/tools/labenv.py), for a few nodes, under DIR:
`nodes/<node>/root` (real dpkg database, driver set at 580.126.20), `nodes/<node>/nvml.json|.state`,
`kern.log`, `proc/`, plus `nodes/<node>/env.json` (the environment that makes nvidia-ml-py load the
stand-in libnvidia-ml with that node's state), `snapshots/`, `lab.json` (read by the lab reboot path,
lab_node.py) and `kubeconfig`. It then starts the Kubernetes API emulator (pod-lifecycle simulator
on, evicted ReplicaSet pods come back) in a DETACHED process (`serve`) that outlives the Ansible
task, and returns once the API answers. `--cordon` cordons nodes before anything runs (a node that was
cordoned before the rollout). The driver repository and the template root are cached in DIR/../cache.

`down` stops that process (SIGTERM, then SIGKILL after 10 s) by the pid it recorded; it is a no-op
when nothing runs. Both print one JSON line (Ansible's `changed` convention).
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
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from emulator import Emulator  # noqa: E402
from tools import labenv, nvml_stub  # noqa: E402

START_TIMEOUT = 60.0


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
        return int((lab / 'emulator.pid').read_text().strip())
    except (OSError, ValueError):
        return None


def down(lab: pathlib.Path) -> dict:
    pid = _pid(lab)
    if pid is None or not _alive(pid):
        (lab / 'emulator.pid').unlink(missing_ok=True)
        return {'changed': False, 'msg': 'no emulator running for %s' % lab}
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    (lab / 'emulator.pid').unlink(missing_ok=True)
    return {'changed': True, 'msg': 'emulator (pid %d) stopped' % pid}


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
    for sub in ('nodes', 'snapshots'):
        shutil.rmtree(lab / sub, ignore_errors=True)
    for name in ('lab.json', 'kubeconfig', 'emulator.log', 'emulator.ready'):
        (lab / name).unlink(missing_ok=True)
    (lab / 'snapshots').mkdir()
    _link_cache(lab)
    lib_dir = nvml_stub.build()
    labenv.make_roots(lab, names)
    labenv.write_node_files(lab, names)
    for name in names:
        d = (lab / 'nodes' / name).resolve()
        (d / 'env.json').write_text(json.dumps(nvml_stub.env(lib_dir, d / 'nvml.state'), indent=1))
    with open(lab / 'emulator.log', 'ab') as log:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, str(pathlib.Path(__file__).resolve()), 'serve', str(lab), '--nodes', str(nodes)]
            + [a for n in cordon for a in ('--cordon', n)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while not (lab / 'emulator.ready').is_file():
        if proc.poll() is not None:
            raise SystemExit('the emulator exited with %s; see %s' % (proc.returncode, lab / 'emulator.log'))
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit('the emulator did not start within %.0f s; see %s' % (START_TIMEOUT, lab / 'emulator.log'))
        time.sleep(0.1)
    conf = json.loads((lab / 'lab.json').read_text())
    with urllib.request.urlopen(conf['api'] + '/api/v1/nodes', timeout=10) as resp:
        count = len(json.loads(resp.read())['items'])
    return {'changed': True, 'api': conf['api'], 'pid': proc.pid, 'nodes': count, 'dir': str(lab.resolve()),
            'msg': '%d GPU nodes on %s (driver %s under %s/nodes/*/root)' % (count, conf['api'], labenv.SOURCE_DRIVER, lab)}


def serve(lab: pathlib.Path, nodes: int, cordon: list[str]) -> int:
    """The emulator in this process until SIGTERM (started detached by `up`)."""
    names = labenv.node_names(nodes)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    emu = Emulator(port=0, kubeconfig_path=lab / 'kubeconfig', log_requests=False).start()
    try:
        emu.simulator.recreate_owned_pods = True
        emu.apply(labenv.kubernetes_objects(names))
        for name in cordon:
            emu.patch('v1', 'Node', name, {'spec': {'unschedulable': True}})
        (lab / 'lab.json').write_text(json.dumps({
            'kubeconfig': str((lab / 'kubeconfig').resolve()), 'api': emu.url,
            'target_driver': labenv.TARGET_DRIVER, 'fault': None, 'stuck': []}, indent=1))
        (lab / 'emulator.pid').write_text('%d\n' % os.getpid())
        (lab / 'emulator.ready').write_text(emu.url + '\n')
        print('molecule lab: emulator on %s, %d nodes, cordoned: %s' % (emu.url, len(names), cordon or '-'), flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        emu.stop()
        (lab / 'emulator.ready').unlink(missing_ok=True)
    print('molecule lab: emulator stopped', flush=True)
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
