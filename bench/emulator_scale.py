"""Benchmark: the Kubernetes API emulator holding a 5,000-node / 100,000-pod fleet.

Starts `python -m emulator --fleet` (generated fleet) in its own process, then pages through
every pod cluster-wide with the kubernetes Python client (limit=500) and with
`kubectl get pods -A -o json --chunk-size=500` (the baseline a fleet tool is compared with),
and runs per-node field-selector queries. Prints the figures side by side. Not a test: no
pass/fail on timings.

    .venv/bin/python bench/emulator_scale.py [--nodes 5000] [--pods-per-node 20]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in pathlib.Path('/proc/%d/status' % pid).read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024.0
    return float('nan')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--nodes', type=int, default=5000)
    parser.add_argument('--pods-per-node', type=int, default=20)
    parser.add_argument('--chunk', type=int, default=500)
    args = parser.parse_args()

    from kubernetes import client, config   # the venv's client

    tmp = pathlib.Path(tempfile.mkdtemp(prefix='emu-bench-'))
    fleet = tmp / 'fleet.yml'
    fleet.write_text('generate: {nodes: %d, pods_per_node: %d}\n' % (args.nodes, args.pods_per_node))
    kubeconfig = tmp / 'kubeconfig'
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO / 'tests'))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, '-m', 'emulator', '--port', str(port), '--kubeconfig', str(kubeconfig),
                             '--fleet', str(fleet)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        for _line_no in range(3):
            line = proc.stdout.readline()
            if not line:
                print('emulator exited early (rc %s)' % proc.wait(), file=sys.stderr)
                return 1
        load_s = time.monotonic() - t0
        emu_rss = rss_mib(proc.pid)
        pods_total = args.nodes * args.pods_per_node

        api = config.new_client_from_config(config_file=str(kubeconfig))
        core = client.CoreV1Api(api)
        t = time.monotonic()
        seen, pages, token = 0, 0, None
        while True:
            resp = core.list_pod_for_all_namespaces(limit=args.chunk, _continue=token, _preload_content=False)
            data = json.loads(resp.data)
            seen += len(data['items'])
            pages += 1
            token = data['metadata'].get('continue')
            if not token:
                break
        py_s = time.monotonic() - t
        assert seen == pods_total, (seen, pods_total)

        t = time.monotonic()
        width = len(str(max(args.nodes - 1, 1)))
        for n in range(0, args.nodes, max(1, args.nodes // 100)):
            core.list_pod_for_all_namespaces(field_selector='spec.nodeName=gpu-%0*d' % (width, n))
        per_node_ms = (time.monotonic() - t) * 1000 / len(range(0, args.nodes, max(1, args.nodes // 100)))

        kubectl = shutil.which('kubectl') or str(REPO / '.venv' / 'bin' / 'kubectl')
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t = time.monotonic()
        out = subprocess.run([kubectl, '--kubeconfig', str(kubeconfig), 'get', 'pods', '-A', '-o', 'json',
                              '--chunk-size=%d' % args.chunk], capture_output=True, check=True)
        kubectl_s = time.monotonic() - t
        kubectl_rss = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) / 1024.0
        kubectl_items = len(json.loads(out.stdout)['items'])
        assert kubectl_items == pods_total, (kubectl_items, pods_total)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)

    print('Kubernetes API emulator, %d nodes / %d pods' % (args.nodes, pods_total))
    print('  start + generate + load fleet : %8.1f s   emulator RSS %7.0f MiB' % (load_s, emu_rss))
    print('  %-30s %10s %10s' % ('all pods, pages of %d' % args.chunk, 'wall s', 'pages/s'))
    print('  %-30s %10.1f %10.1f' % ('python client (this tool)', py_s, pages / py_s))
    print('  %-30s %10.1f %10.1f   (baseline; kubectl peak RSS %.0f MiB)'
          % ('kubectl get pods -A -o json', kubectl_s, pages / kubectl_s, kubectl_rss))
    print('  ratio python/kubectl          : %8.2fx' % (py_s / kubectl_s))
    print('  spec.nodeName field selector  : %8.1f ms per query (indexed)' % per_node_ms)
    return 0


if __name__ == '__main__':
    sys.exit(main())
