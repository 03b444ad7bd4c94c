"""Controller time of the lab rollout next to the simulated maintenance time it orchestrates.

    .venv/bin/python bench/lab_overhead.py [--nodes 40] [--dir .lab-bench]

Runs the lab without a fault (tests/tools/lab.py --fault none --quiet: its own real control plane,
tests/cluster, with the 40-node pool; the playbooks run as the operator ServiceAccount through the
fault proxy), then reads its timings.json and prints, for the rollout step (rollout.yml, canaries
already done):

- controller wall time: the ansible-playbook run, start to end (the lab's maintenance waits are
  simulated: no sleep stands for a drain, an install or a reboot);
- controller CPU time: user+system of the ansible process tree. In the lab the modules run on the
  controller too (hosts are local), so this is an upper bound of the controller's own CPU; the lab
  also logs apart (tests/tools/cpu_account.py) the CPU of what runs on the GPU nodes in a real fleet
  (the node hosts' modules, the lab's emulated reboots), and the difference is the controller's own
  CPU: playbook, workers, templating and the modules delegated to the controller;
- simulated maintenance time: per batch, the longest node's drain + install + activation + gates
  observation of a real fleet (tests/tools/lab.py SIMULATED), summed over the batches that upgrade;
- the overhead (controller time / simulated time) next to the target of 2 %.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
TARGET_PERCENT = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--nodes', type=int, default=40)
    parser.add_argument('--dir', type=pathlib.Path, default=REPO / '.lab-bench')
    parser.add_argument('--reuse', action='store_true', help='only read an existing timings.json')
    args = parser.parse_args()
    if not args.reuse:
        out = subprocess.run([sys.executable, str(REPO / 'tests' / 'tools' / 'lab.py'), '--dir', str(args.dir),
                              '--nodes', str(args.nodes), '--fault', 'none', '--quiet', '--account-node-cpu'],
                             cwd=REPO, check=False,
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stdout[-4000:] + out.stderr[-2000:])
            print('bench: the lab run failed; no figure')
            return 1
    t = json.loads((args.dir / 'timings.json').read_text())
    steps = {s['step']: s for s in t['steps']}
    per_node = sum(t['simulated_per_node'].values())
    batches = list(t['batches'][1:])          # batch 0: the canaries, upgraded by canary.yml
    simulated = per_node * len(batches)
    roll = steps['rollout']
    print('lab rollout of %d nodes in %d batches (canaries done before)' % (sum(map(len, batches)), len(batches)))
    print('%-44s %10s' % ('', 'seconds'))
    print('%-44s %10.1f' % ('simulated maintenance (%d s per batch)' % per_node, simulated))
    line = '%-44s %10.1f   %5.2f %%   (target <= %.1f %%)'
    print(line % ('controller wall time (rollout.yml)', roll['wall'], 100 * roll['wall'] / simulated, TARGET_PERCENT))
    print(line % ('controller CPU time (ansible tree, upper bound)', roll['cpu'], 100 * roll['cpu'] / simulated,
                  TARGET_PERCENT))
    if 'node_cpu' in roll:
        own = roll['cpu'] - roll['node_cpu']
        print(line % ('controller CPU time (own: tree - node side)', own, 100 * own / simulated, TARGET_PERCENT))
        print('%-44s %10.1f   (modules on the GPU nodes, the lab\'s emulated reboots)'
              % ('  node-side CPU (not the controller\'s)', roll['node_cpu']))
    for name in ('plan', 'canary', 'upgrade_check'):
        if name in steps:
            print('%-44s %10.1f   (cpu %.1f)' % ('  %s.yml wall' % name, steps[name]['wall'], steps[name]['cpu']))
    return 0


if __name__ == '__main__':
    sys.exit(main())
