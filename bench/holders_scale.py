"""Benchmark: gpu_holders_info against `kubectl get pods -A -o json` on a real API server holding a
large fleet (default 5,000 nodes / 100,000 pods).

Starts the test control plane (tests/cluster: etcd, kube-apiserver, the controllers, KWOK as the
kubelets) in a temporary directory, creates the fleet straight to the API server with many
concurrent POSTs (cluster.direct_kubeconfig's token): GPU nodes (8 `nvidia.com/gpu` each) and per
node `--pods-per-node` pods bound to it (nodeName set, as the scheduler binds; 8 of them hold one GPU
each, the rest none; annotated gpufleet.test/status=fixed so KWOK does not write 100,000 statuses:
the pods stay Pending, as the API server stores them). Then, each in its own process, measured with
wait4 (wall time and peak RSS of that process alone):

- `gpu_holders_info` (fleet mode: nodes and pods listed cluster-wide in pages of 500), run as Ansible
  runs a module (the module file, its arguments in a JSON file);
- `kubectl get pods -A -o json --chunk-size=500` (the baseline a fleet tool is compared with).

Prints the figures side by side with the targets (time <= 1.5x kubectl's, peak memory <= 2x).
Not a test: no pass/fail on figures.

    .venv/bin/python bench/holders_scale.py [--nodes 5000] [--pods-per-node 20] [--workers 32]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / 'tests')]

from cluster import start_cluster  # noqa: E402
from cluster.client import ApiClient, ApiError  # noqa: E402

TARGET_TIME, TARGET_MEMORY = 1.5, 2.0
GPUS_PER_NODE = 8
MODULE = REPO / 'plugins' / 'modules' / 'gpu_holders_info.py'


def node(name: str) -> dict:
    return {'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name, 'nvidia.com/gpu.present': 'true'},
                         # KWOK leaves the node's status as written (no initialisation round per node)
                         'annotations': {'gpufleet.test/kubelet': 'stopped'}},
            'spec': {}}


def node_status(name: str) -> dict:
    alloc = {'cpu': '128', 'memory': '1056000000Ki', 'pods': '110', 'nvidia.com/gpu': str(GPUS_PER_NODE)}
    now = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
    return {'status': {'capacity': alloc, 'allocatable': alloc,
                       'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady', 'message': 'bench',
                                       'lastHeartbeatTime': now, 'lastTransitionTime': now}],
                       'addresses': [{'type': 'Hostname', 'address': name}]}}


def pod(name: str, node_name: str, gpu: bool) -> dict:
    c: dict = {'name': 'main', 'image': 'registry.example/train:1'}
    if gpu:
        c['resources'] = {'requests': {'nvidia.com/gpu': '1'}, 'limits': {'nvidia.com/gpu': '1'}}
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': name, 'namespace': 'fleet', 'labels': {'app': 'train', 'node': node_name},
                         'annotations': {'gpufleet.test/status': 'fixed'}},
            'spec': {'nodeName': node_name, 'containers': [c], 'terminationGracePeriodSeconds': 0}}


def create_fleet(api_for, nodes: int, pods_per_node: int, workers: int) -> float:
    """POST everything concurrently (one client per worker thread); returns seconds."""
    local = threading.local()

    def api() -> ApiClient:
        if not hasattr(local, 'api'):
            local.api = api_for()
        return local.api

    def post(path: str, body: dict, status_path: str | None = None, status: dict | None = None) -> None:
        for attempt in range(5):
            try:
                api().request('POST', path, body=body)
                break
            except ApiError as exc:
                if exc.status == 409:
                    break
                if exc.status != 429 and exc.status < 500 or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        if status_path:
            api().request('PATCH', status_path, body=status, content_type='application/merge-patch+json')

    t0 = time.monotonic()
    api().request('POST', '/api/v1/namespaces', body={'apiVersion': 'v1', 'kind': 'Namespace',
                                                      'metadata': {'name': 'fleet'}})
    width = len(str(nodes))
    names = ['gpu-%0*d' % (width, i) for i in range(nodes)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda n: post('/api/v1/nodes', node(n), '/api/v1/nodes/%s/status' % n, node_status(n)), names))
        print('bench: %d nodes created in %.1f s' % (nodes, time.monotonic() - t0), flush=True)
        jobs = [(n, '%s-%02d' % (n, j), j < GPUS_PER_NODE) for n in names for j in range(pods_per_node)]
        done = 0
        for _created in pool.map(lambda a: post('/api/v1/namespaces/fleet/pods', pod(a[1], a[0], a[2])), jobs,
                                 chunksize=64):
            done += 1
            if done % 20000 == 0:
                print('bench: %d pods created (%.0f s)' % (done, time.monotonic() - t0), flush=True)
    return time.monotonic() - t0


def measured(argv: list[str], env: dict | None = None) -> tuple[float, float, bytes]:
    """Run argv; its wall seconds, its own peak RSS (MiB, from wait4) and its stdout."""
    out = tempfile.TemporaryFile()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, env=env)  # pylint: disable=consider-using-with
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read() if proc.stderr else b''
    out.seek(0)
    data = out.read()
    if proc.returncode != 0:
        raise RuntimeError('%s failed (%d): %s %s' % (argv[0], proc.returncode, err[-2000:], data[-2000:]))
    return wall, usage.ru_maxrss / 1024.0, data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--nodes', type=int, default=5000)
    parser.add_argument('--pods-per-node', type=int, default=20)
    parser.add_argument('--workers', type=int, default=32, help='concurrent POSTs while creating the fleet')
    parser.add_argument('--chunk', type=int, default=500)
    parser.add_argument('--keep', action='store_true', help='keep the temporary directory')
    args = parser.parse_args()
    pods_total = args.nodes * args.pods_per_node
    tmp = pathlib.Path(tempfile.mkdtemp(prefix='holders-bench-'))
    cp = proxy = None
    try:
        cp, proxy, cluster = start_cluster(tmp / 'cluster', log=lambda m: print('bench: ' + m, flush=True))
        token = cp.tokens['gpufleet-admin']
        create_s = create_fleet(lambda: ApiClient(cp.url, cp.ca_path, token=token, timeout=60), args.nodes,
                                args.pods_per_node, args.workers)
        print('bench: fleet of %d nodes / %d pods created in %.1f s' % (args.nodes, pods_total, create_s), flush=True)

        params = tmp / 'args.json'
        params.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': {'kubeconfig': cluster.direct_kubeconfig,
                                                              'page_size': args.chunk}}))
        env = dict(os.environ, PYTHONPATH=str(REPO / '.venv' / 'collections'))
        mod_s, mod_mib, data = measured([sys.executable, str(MODULE), str(params)], env=env)
        result = json.loads(data)
        holders = len(result['holders'])
        assert holders == args.nodes * min(GPUS_PER_NODE, args.pods_per_node), (holders, result.get('msg'))

        kubectl = shutil.which('kubectl') or str(REPO / '.venv' / 'bin' / 'kubectl')
        kc_s, kc_mib, data = measured([kubectl, '--kubeconfig', cluster.direct_kubeconfig, 'get', 'pods', '-A',
                                       '-o', 'json', '--chunk-size=%d' % args.chunk])
        items = len(json.loads(data)['items'])
        assert items == pods_total, (items, pods_total)
    finally:
        if proxy is not None:
            proxy.stop()
        if cp is not None:
            cp.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    print()
    print('GPU holders of %d nodes / %d pods on a real kube-apiserver (tests/cluster), pages of %d'
          % (args.nodes, pods_total, args.chunk))
    print('  %-34s %10s %14s' % ('', 'wall s', 'peak RSS MiB'))
    print('  %-34s %10.1f %14.1f   (%d holders)' % ('gpu_holders_info (fleet mode)', mod_s, mod_mib, holders))
    print('  %-34s %10.1f %14.1f   (%d pods)' % ('kubectl get pods -A -o json', kc_s, kc_mib, items))
    print('  %-34s %9.2fx %13.2fx   (targets <= %.1fx time, <= %.1fx memory)'
          % ('ratio gpu_holders_info / kubectl', mod_s / kc_s, mod_mib / kc_mib, TARGET_TIME, TARGET_MEMORY))
    return 0


if __name__ == '__main__':
    sys.exit(main())
