"""Benchmark: what one `evidence` call costs as the rollout's bundle grows (issue 18).

The rollout keeps one JSON evidence bundle and calls the `evidence` module a few times per node (its gates,
its node entry); each call reads the bundle, merges the update and writes it back, so its cost grows with
the nodes recorded so far. This prints, for bundles of 40, 200, 1,000 and 10,000 nodes (each node as the
rollout records it: a node entry and its three gates, about 4 KB), side by side in one run:

- the module as Ansible runs it (its file, its arguments in a JSON file; one process per call, wall time),
  recording one more node's gate, and the same with `return_bundle: true` (what every call returned before:
  the whole bundle, carried by Ansible in the task result and in every job event);
- the bytes of each result;
- the same update as the action plugin does it when the task runs on the controller (every evidence task of the
  shipped playbooks): `_evidence_file.update_bundle` inside the process, no module start-up (CPU time);
- the baseline: the same call on an empty bundle (the module's start-up), and the ratio to it.

Not a test: no pass/fail on figures.

    .venv/bin/python bench/evidence_growth.py [--sizes 40,200,1000,10000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / '.venv' / 'collections')]

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence as E  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence_file import (  # noqa: E402
    ARGUMENT_SPEC, update_bundle)
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import module_params  # noqa: E402

MODULE = REPO / 'plugins' / 'modules' / 'evidence.py'
TUPLE = {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'driver': '580.130.00',
         'gpu_operator': 'v26.3.4', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}


def node_updates(name: str, batch: int) -> dict:
    """One node as the rollout records it: its entry and its gates (node, GPU, metric), results included."""
    gpus = [{'index': i, 'uuid': 'GPU-%s-%d' % (name, i), 'xid': [], 'retired_pages': 0, 'remapped_rows': 0,
             'ecc_dbe': 0, 'temperature_c': 41 + i, 'power_w': 70.5} for i in range(8)]
    gates = [
        {'name': 'node', 'kind': 'node', 'node': name, 'batch': batch, 'passed': True,
         'started': '2026-12-03T03:00:00Z', 'finished': '2026-12-03T03:00:05Z',
         'result': {'msg': 'node gate: PASS for %s' % name, 'ready': True, 'allocatable': {'nvidia.com/gpu': 8},
                    'device_plugin': 'nvidia-device-plugin-daemonset-abcde', 'problems': []}},
        {'name': 'gpu', 'kind': 'gpu', 'node': name, 'batch': batch, 'passed': True,
         'started': '2026-12-03T03:00:05Z', 'finished': '2026-12-03T03:00:07Z',
         'result': {'msg': 'gpu gate: PASS (8 GPUs)', 'gpus': gpus, 'problems': []}},
        {'name': 'metrics', 'kind': 'metric', 'node': name, 'batch': batch, 'passed': True,
         'started': '2026-12-03T03:00:07Z', 'finished': '2026-12-03T03:05:07Z',
         'result': {'msg': 'metric gate: PASS', 'presets': ['xid', 'temperature', 'ecc'], 'samples': 5,
                    'problems': []}},
    ]
    node = {'name': name, 'role': 'batch', 'uid': '%032x' % abs(hash(name)), 'machine_id': '%032x' % abs(hash(name + 'm')),
            'batch': batch, 'tuple_before': dict(TUPLE, driver='580.126.20'), 'tuple_after': TUPLE,
            'verdict': 'upgraded', 'phases': ['cordoned', 'drained', 'snapshotted', 'installed', 'activated', 'validated'],
            'started': '2026-12-03T02:50:00Z', 'finished': '2026-12-03T03:05:07Z'}
    return {'nodes': [node], 'gates': gates}


def bundle_of(nodes: int) -> dict:
    bundle = E.new_bundle('scale')
    for i in range(nodes):
        bundle, _changed = E.merge(bundle, node_updates('gpu-%05d' % i, i // 10))
    return bundle


def module_call(path: pathlib.Path, args: dict, tmp: pathlib.Path) -> tuple[float, int]:
    params = tmp / 'args.json'
    params.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': dict(args, path=str(path))}))
    env = dict(os.environ, PYTHONPATH=str(REPO / '.venv' / 'collections'))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(MODULE), str(params)], env=env, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    result = json.loads(out.stdout)
    if result.get('failed'):
        raise SystemExit('evidence failed: %s' % result.get('msg'))
    return wall, len(out.stdout)


def in_worker(path: pathlib.Path, args: dict) -> float:
    """The action plugin's way: its argument check and the same update inside this process (CPU seconds)."""
    t0 = time.process_time()
    update_bundle(module_params(dict(args, path=str(path)), ARGUMENT_SPEC, 'gpufleet.upgrade.evidence'))
    return time.process_time() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument('--sizes', default='40,200,1000,10000')
    parser.add_argument('--repeat', type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(',') if s]
    rows = []
    with tempfile.TemporaryDirectory(prefix='gpufleet-evidence-') as d:
        tmp = pathlib.Path(d)
        warm = tmp / 'warm.json'
        warm.write_text(E.dumps(bundle_of(0)))
        module_call(warm, node_updates('gpu-warm', 0), tmp)       # the interpreter and files cached first
        for size in [0] + sizes:
            text = E.dumps(bundle_of(size))
            path = tmp / ('bundle-%d.json' % size)
            figures = {}
            for label, extra in (('now', {}), ('return_bundle', {'return_bundle': True})):
                walls, nbytes = [], 0
                for r in range(args.repeat):
                    path.write_text(text)
                    update = node_updates('gpu-new-%d' % r, 999)
                    wall, nbytes = module_call(path, dict(update, **extra), tmp)
                    walls.append(wall)
                figures[label] = (statistics.median(walls), nbytes)
            cpus = []
            for r in range(args.repeat):
                path.write_text(text)
                cpus.append(in_worker(path, node_updates('gpu-new-%d' % r, 999)))
            figures['worker'] = statistics.median(cpus)
            rows.append((size, len(text), figures))
    base = rows[0][2]['now'][0]
    print('evidence: one call recording one more node, module process wall (median of %d), as the bundle grows'
          % args.repeat)
    heads = ('nodes', 'bundle KB', 'call ms', 'x empty', 'result KB', 'w/ bundle ms', 'x empty', 'result KB',
             'worker CPU ms')
    print('%7s %10s | %10s %8s %10s | %12s %8s %10s | %13s' % heads)
    print('-' * 104)
    for size, nbytes, fig in rows:
        now, old = fig['now'], fig['return_bundle']
        print('%7d %10.1f | %10.1f %7.2fx %10.1f | %12.1f %7.2fx %10.1f | %13.1f' % (
            size, nbytes / 1024, now[0] * 1000, now[0] / base, now[1] / 1024, old[0] * 1000, old[0] / base,
            old[1] / 1024, fig['worker'] * 1000))
    print('\nbaseline: the same call on an empty bundle (the module start-up) = %.1f ms. "w/ bundle": return_bundle: true, '
          'what every call returned before issue 18 (Ansible then carries it in the task result and each job event, '
          'not counted here; before issue 18 each call also deep-copied the bundle and serialised it twice more). '
          '"worker CPU": the action plugin\'s way, the same update in Ansible\'s worker (no module process), CPU time; '
          'what grows with the bundle is reading and writing it.' % (base * 1000))
    return 0


if __name__ == '__main__':
    sys.exit(main())
