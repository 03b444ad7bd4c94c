"""Benchmark: plan a 10,000-node fleet of 20 combinations.

Prints the planner core's time (target < 1 s) and, beside it, the upgrade_plan module call's own
overhead: the same plan through the module run as Ansible runs it on the controller (a Python
process, argument validation, JSON in and out), minus the core's time.

    .venv/bin/python bench/plan_fleet.py [--nodes 10000] [--combinations 20] [--repeat 5]
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
COLLECTIONS = REPO / '.venv' / 'collections'
sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import build_plan  # noqa: E402

TARGET_SECONDS = 1.0
PCI = ['10de:2330/10de:16c1', '10de:20b5/10de:1533', '10de:26b9/10de:1851', '10de:2335/10de:18be',
       '10de:2324/10de:17a6']
PLATFORMS = ['SYS-821GE-TNHR', 'PowerEdge-XE9680']
KERNELS = ['6.8.0-134-generic', '6.11.0-29-generic']
CURRENT = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '570.172.08',
           'gpu_operator': 'v26.3.3', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}
TARGET = dict(CURRENT, driver='580.126.20', gpu_operator='v26.3.4')


def fleet(count: int, combinations: int) -> list:
    combos = [(p, pl, k) for p in PCI for pl in PLATFORMS for k in KERNELS][:combinations]
    assert len(combos) == combinations, 'at most %d combinations' % (len(PCI) * len(PLATFORMS) * len(KERNELS))
    nodes = []
    for i in range(count):
        pci, platform, kernel = combos[i % combinations]
        nodes.append({'name': 'gpu-%05d' % i, 'pci_ids': [pci], 'platform': platform, 'kernel': kernel,
                      'partition_mode': 'none', 'install_method': 'apt', 'current': CURRENT,
                      'ready': i % 97 != 0, 'unschedulable': i % 89 == 0, 'gpus': 8, 'holders': i % 3})
    return nodes


POLICY = {'target': TARGET, 'canaries_per_combination': 2, 'batch_size': '2%', 'max_unavailable': '5%',
          'failure_allowance': {'gpus': '90%'}, 'omitted_block': True}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--nodes', type=int, default=10000)
    ap.add_argument('--combinations', type=int, default=20)
    ap.add_argument('--repeat', type=int, default=5)
    args = ap.parse_args()
    nodes = fleet(args.nodes, args.combinations)

    times = []
    for dummy in range(args.repeat):
        t0 = time.perf_counter()
        plan = build_plan(nodes, **POLICY)
        times.append(time.perf_counter() - t0)
    core = statistics.median(times)

    module = REPO / 'plugins' / 'modules' / 'upgrade_plan.py'
    env = dict(os.environ, PYTHONPATH=str(COLLECTIONS))
    with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as fh:
        json.dump({'ANSIBLE_MODULE_ARGS': dict(POLICY, nodes=nodes)}, fh)
        args_path = fh.name
    mod_times = []
    try:
        for dummy in range(args.repeat):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, str(module), args_path], env=env, capture_output=True, text=True, check=False)
            mod_times.append(time.perf_counter() - t0)
            result = json.loads(proc.stdout)
            if result.get('failed'):
                raise SystemExit('module failed: %s' % result.get('msg'))
    finally:
        os.unlink(args_path)
    assert result['digest'] == plan['digest']
    mod = statistics.median(mod_times)

    print('upgrade_plan benchmark: %d nodes, %d combinations, %d batches, %d canaries (median of %d runs)'
          % (args.nodes, len(plan['combinations']), len(plan['batches']), len(plan['canaries']), args.repeat))
    print('%-44s %10s   %s' % ('measure', 'seconds', 'baseline'))
    print('%-44s %10.3f   target < %.1f s: %s' % ('planner core (build_plan)', core, TARGET_SECONDS,
                                                  'met' if core < TARGET_SECONDS else 'MISSED'))
    print('%-44s %10.3f   core + overhead' % ('module call (process, args, JSON out)', mod))
    print('%-44s %10.3f   module call - core' % ("module call's own overhead", mod - core))
    return 0


if __name__ == '__main__':
    sys.exit(main())
