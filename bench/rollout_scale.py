"""Scale of the rollout: controller CPU, wall, API requests and memory per node and per batch, at several
fleet sizes, next to Ansible's own floor for the same number of hosts and tasks (issue 18, items 1-2).

    .venv/bin/python bench/rollout_scale.py [--sizes 40,200,1000] [--dir .lab-bench/scale]
                                            [--change seed|driver] [--batch-size 4|10%] [--forks N] [--reuse]
                                            [--profile] [--no-floor-h]

--batch-size is a count (default 4) or, as the plan's batch_size, a percentage of the pool (the planner's default
is 10%: the batches grow with the pool, so there are as many observation windows at every size); --forks
defaults to the largest batch, at least 8 (the rollout refuses fewer forks than a batch has nodes).

About 16 minutes for --sizes 10,20 and 22 for --sizes 40 on a quiet 2-core machine (2026-12-04; the rollout and
its two floors); 200 nodes in batches of 10 took 101 minutes there without the second floor (2026-12-05;
--no-floor-h skips it, about a third of the wall); 1,000 need a machine with many more cores (about 26 s of CPU
per upgraded node here, all told).
--reuse prints the figures again from what a run left under --dir (each size's n<N>.json, plan, runner
artifacts and audit log).

For each size, the lab's machinery (tests/tools/lab.py) on a fresh real control plane (tests/cluster: etcd,
kube-apiserver, the controllers, the scheduler, KWOK as the kubelets) with a pool of that many GPU nodes and
their workloads (DaemonSets, training ReplicaSets under PDBs); plan.yml, then rollout.yml in the plan's
batches, as the operator ServiceAccount through the fault proxy, forks fixed. The canary playbook is not
run: its result is written as the canary leaves it (approved qualification records, the canaries isolated
and recorded done), so the figures are the rollout's alone.

Real: planning, batching (serial from the plan), the stop switch, the availability budget before each
batch, drains (PDBs, the real eviction API), the Node records, the RKE2 step through the System Upgrade
Controller stand-in's Plans and Jobs (tests/cluster/suc.py), the GPU and node gates, the evidence bundle.
Not real: the host side. HOST STAND-IN (named in the output): the lab's node stand-in, per node an install
root of ~4 MB with real dpkg/apt (tiny Debian packages, tests/tools/debrepo.py), the NVML stand-in library,
a kernel log and the lab's reboot hook (tests/tools/lab_node.py) instead of a reboot; no sleep stands for a
drain, an install or a reboot. Every node-side module run and every emulated reboot goes through
tests/tools/cpu_account.py and is subtracted from the controller's CPU, with the accounting wrapper's own
start-up (measured here) too. The metric gate (Prometheus) is off unless --metrics auto.

The floor: right after the rollout, in the same lab (same inventory, connection, interpreter, accounting,
forks, serial batches), a generated playbook of `ansible.builtin.ping` tasks: per node host as many as the
rollout ran for a node on average (runner events ok/failed; skipped tasks not counted), of which as many
delegated to localhost as the rollout delegated for a node (its Kubernetes modules: a module process on the
controller either way), and on localhost as many as the rollout's localhost plays ran. Our figures are
printed as ratios to it. A second floor, every node ping on the node host ("ratio h", the floor before
2026-12-04), leaves the delegated tasks' module start-up out of the floor; it takes about as long as the
first, and --no-floor-h skips it (its column then reads "-").

API requests: the API server's audit log (tests/cluster, ResponseComplete events) of the operator
ServiceAccount during the rollout. A request is a node's when its URI names exactly one node of the pool
(the Node, its pods by field selector, its SUC Plan, its evictions...); the others inside a batch's time
window are the batch's; the rest (before the first batch, the release play) are the run's. A paginated list
counts once per page in the totals; "lists of the pool" counts logical lists (first pages) of nodes and
pods that name no node.

--profile: also where the controller CPU goes, task by task (bench/callback/task_cpu.py, a callback that puts
ansible-playbook in a cgroup of its own and reads its CPU at each task start; node-side runs subtracted as
above): the totals by kind (Kubernetes modules delegated to the controller, modules on the node host, what runs
inside Ansible, tasks skipped on every host) beside the floor's pings, and the tasks with the most CPU. Needs
root and a cgroup v1 cpuacct (or v2) hierarchy; without them it says so and the rest of the run is unchanged.
Its reads add a little CPU to the figures of that run.

Machine speed: a thread of the bench does one fixed piece of work every 5 s and records its CPU seconds
(bench/speed_probe.py). The rollout and its floor run one after the other; on a shared virtual machine the same
work can take more CPU seconds in one than in the other (a busier host), which moves the ratio. The report
prints the probe's mean during each, and the two CPU targets again with every figure brought to one speed.

Figures of one run on one machine; nothing here asserts a timing (docs/development.md).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
import types
import urllib.parse

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / '.venv' / 'collections'), str(REPO / 'tests')]

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state as us  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import PlanInputError, resolve_count  # noqa: E402
from tools import cpu_account, labenv, records  # noqa: E402
from tools import lab as labmod  # noqa: E402
from tools.lab import Lab, LabError  # noqa: E402
from speed_probe import SpeedProbe, at_speed  # noqa: E402  (bench/, the script's own directory)

OPERATOR = 'system:serviceaccount:%s:%s' % labenv.OPERATOR_SA
CANARY_OWNER = 'gpufleet.upgrade.canary'
# A batch's window starts at the batch play's first pre-task (the plan's pause point, skipped or not); the older
# names are the first pre-tasks of runs before 2026-12-05 (--reuse of an older run).
BATCH_START = ('Batch | A pause point of the plan waits, bounded, for its approval before the batch starts',
               'Batch | The stop switch, read by every node of the batch before it starts', 'Batch | Re-read the cluster')
RELEASE_START = 'Release | Read every node of the plan'
FLOOR_NODE_PLAY = 'Floor | ping on the node hosts, batch by batch'
CALLBACKS = REPO / 'bench' / 'callback'
INTERNAL_ACTIONS = {'set_fact', 'assert', 'fail', 'debug', 'meta', 'include_tasks', 'import_tasks', 'include_role',
                    'validate_argument_spec', 'set_stats', 'add_host', 'pause'}
PROFILE_TOP = 25
HOST_STANDIN = ('the lab\'s node stand-in: per node a ~4 MB install root with real dpkg/apt (tiny packages), the NVML '
                'stand-in, a kernel log, the lab reboot hook (no sleep for drain/install/reboot); its CPU is logged '
                'apart (cpu_account.py) and not counted as the controller\'s')
FAILURE_ALLOWANCE = '20%'     # of the pool's GPUs kept in service
TARGETS = {'cpu_flat': 1.2, 'floor': 1.5, 'pool_lists': 1, 'per_node_growth': 1.1}
# One request per pod on the node: set by the workload on it, not by the fleet's size (in the lab, pods of the nodes
# drained earlier are rescheduled onto the later ones, so a later node holds more): shown, not judged for growth.
PER_POD_KINDS = ('create pods/eviction',)

# HOOK (tests/tools/lab.py): Lab.play runs every playbook under ansible_runner.run(timeout=900), too short for
# the rollout of a few hundred nodes. Until Lab.play takes a timeout, the bench lifts it for its own runs.
PLAY_TIMEOUT = 24 * 3600
_real_runner = labmod.ansible_runner
labmod.ansible_runner = types.SimpleNamespace(
    run=lambda **kw: _real_runner.run(**dict(kw, timeout=PLAY_TIMEOUT)))


def log(msg: str) -> None:
    print('bench: ' + msg, flush=True)


class ScaleLab(Lab):
    """The lab, with the pool's start bounded by its size (labenv.apply_pool's 180 s default is for 40 nodes).
    HOOK (tests/tools/lab.py): a pool timeout argument would make this override unnecessary."""

    def start_cluster(self) -> None:
        t0 = time.monotonic()
        work = self.dir / 'cluster'
        shutil.rmtree(work, ignore_errors=True)
        self._cp, self._proxy, self.cluster = labmod.start_cluster(work, log=labmod.log)
        labenv.apply_pool(self.cluster, self.names, timeout=max(180.0, 1.2 * len(self.names)))
        self.kubeconfig = labenv.operator_kubeconfig(self.cluster, self.dir / 'kubeconfig')
        labmod.log('control plane up with the pool in %.1fs' % (time.monotonic() - t0))
        self.status_sync = labmod.PodStatusSync(self.cluster).__enter__()
        self.cluster.apply([labenv.control_plane_node(labmod.SERVER, self.target['rke2'])], settle=False)
        self.suc = labmod.SucStandIn(self.cluster, delay=labmod.SUC_DELAY, interval=labmod.SUC_INTERVAL).__enter__()


# ---------------------------------------------------------------------------------------------- the canary's result
def canary_as_done(lab: Lab, plan: dict) -> None:
    """What canary.yml + the approval leave: one approved qualification record per combination for the target,
    the canaries isolated (label, taint, owner), recorded done for it, and their kubelets reporting the target's
    kernel and RKE2 (every observation window re-gates them with the nodes upgraded so far)."""
    target = plan['target']
    records.write_approved(lab.dir / 'qualification', plan, target, 'scale', approver='bench-approver')
    key = us.target_key(target)
    reported = {k: v for k, v in (('kernelVersion', target.get('kernel')), ('kubeletVersion', target.get('rke2'))) if v}
    for name in plan['canaries']:
        lab.cluster.patch('v1', 'Node', name, {
            'metadata': {'labels': {us.CANARY_KEY: 'true'},
                         'annotations': {us.ANN_ISOLATED_BY: CANARY_OWNER, us.ANN_DONE: key}},
            'spec': {'taints': [{'key': us.CANARY_KEY, 'value': 'true', 'effect': 'NoSchedule'}]}})
        if reported:
            lab.cluster.api.request('PATCH', '/api/v1/nodes/%s/status' % name, body={'status': {'nodeInfo': reported}},
                                    content_type='application/merge-patch+json')


# ---------------------------------------------------------------------------------------------- measuring
class PeakRss:
    """The ansible-playbook process's peak RSS (VmHWM), sampled from /proc while it runs (its pid from the events)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_event(self, event: dict) -> None:
        if self.pid is None and event.get('pid'):
            self.pid = int(event['pid'])
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        try:
            text = pathlib.Path('/proc/%d/status' % self.pid).read_text()
        except OSError:
            return
        m = re.search(r'^VmHWM:\s+(\d+) kB', text, re.M)
        if m:
            self.peak_kib = max(self.peak_kib, int(m.group(1)))

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._sample()

    def stop(self) -> float:
        self._stop.set()
        if self._thread:
            self._thread.join()
        return self.peak_kib / 1024.0


def wrapper_cpu_each(runs: int = 20) -> float:
    """CPU of tests/tools/cpu_account.py itself around a command (its Python start-up), which it does not log."""
    log_file = REPO / '.lab-bench' / 'wrapper-probe.log'
    log_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = os.times()
    for _run in range(runs):
        subprocess.run([sys.executable, str(REPO / 'tests' / 'tools' / 'cpu_account.py'), str(log_file), 'true'],
                       check=True)
    t1 = os.times()
    logged = cpu_account.total(str(log_file))
    log_file.unlink(missing_ok=True)
    return max(0.0, ((t1.children_user + t1.children_system) - (t0.children_user + t0.children_system) - logged) / runs)


def log_lines(path: pathlib.Path | None) -> int:
    try:
        return sum(1 for line in open(path, encoding='ascii') if line.strip()) if path else 0
    except FileNotFoundError:
        return 0


def stamp(text: str) -> float:
    """An ISO timestamp (runner events: naive UTC; audit: ...Z) as epoch seconds."""
    text = text.replace('Z', '+00:00')
    d = datetime.datetime.fromisoformat(text)
    if d.tzinfo is None:
        d = d.replace(tzinfo=datetime.timezone.utc)
    return d.timestamp()


def play_measured(lab: Lab, name: str, playbook: str, forks: int, wrapper_each: float,
                  profile: pathlib.Path | None = None, probe: SpeedProbe | None = None) -> dict:
    rss = PeakRss()
    n0 = log_lines(lab.node_cpu_log)
    env = {'ANSIBLE_FORKS': str(forks)}
    if profile:   # --profile: the controller CPU of each task (bench/callback/task_cpu.py)
        env.update({'ANSIBLE_CALLBACK_PLUGINS': str(CALLBACKS), 'ANSIBLE_CALLBACKS_ENABLED': 'task_cpu',
                    'GPUFLEET_TASK_CPU_OUT': str(profile), 'GPUFLEET_TASK_CPU_NODE_LOG': str(lab.node_cpu_log),
                    'GPUFLEET_TASK_CPU_WRAPPER': repr(wrapper_each)})
    started = time.time()
    status = lab.play(name, playbook, envvars=env, hook=rss.on_event)
    ended = time.time()
    peak = rss.stop()
    t = lab.timings[-1]
    wrapped = log_lines(lab.node_cpu_log) - n0
    own = t['cpu'] - t.get('node_cpu', 0.0) - wrapped * wrapper_each
    return {'status': status, 'wall': t['wall'], 'tree_cpu': t['cpu'], 'node_cpu': t.get('node_cpu', 0.0),
            'wrapped_runs': wrapped, 'own_cpu': own, 'rss_mib': peak, 'events': lab.runs[name]['events'],
            'speed': probe.mean(started, ended) if probe else None,
            'failures': lab.runs[name]['failures']}


def tasks_per_host(events: list[dict], delegated: bool | None = None) -> collections.Counter:
    """Tasks that ran (ok or failed; not skipped) per host, from the runner events; with `delegated` True only
    those delegated to another host (the Kubernetes modules run on the controller for a node), False the others."""
    return collections.Counter(e['host'] for e in events
                               if e['event'] in ('runner_on_ok', 'runner_on_failed', 'runner_on_unreachable')
                               and e['host'] and (delegated is None or e.get('delegated', False) == delegated))


def write_floor(path: pathlib.Path, node_tasks: int, local_tasks: int, serial: list[int], names: list[str],
                delegated_tasks: int = 0) -> None:
    """Ping tasks: `local_tasks` on localhost, then `node_tasks` on each node host in the plan's batches, of which
    `delegated_tasks` delegated to localhost (where the rollout's Kubernetes modules run for the node)."""
    def ping(prefix: str, count: int, start: int = 0, **extra: str) -> list[dict]:
        return [dict({'name': '%s %d' % (prefix, start + i + 1), 'ansible.builtin.ping': None}, **extra)
                for i in range(count)]
    node = ping('Floor | node ping', node_tasks - delegated_tasks)
    node += ping('Floor | node ping', delegated_tasks, start=len(node), delegate_to='localhost')
    plays = [{'name': 'Floor | ping on localhost', 'hosts': 'localhost', 'connection': 'local', 'gather_facts': False,
              'tasks': ping('Floor | localhost ping', local_tasks)},
             {'name': FLOOR_NODE_PLAY, 'hosts': ':'.join(names), 'gather_facts': False, 'strategy': 'linear',
              'serial': serial, 'max_fail_percentage': 0, 'tasks': node}]
    path.write_text(json.dumps(plays, indent=1))     # JSON is YAML


def batch_windows(events: list[dict], starts: tuple[str, ...], end_task: str | None) -> list[tuple[float, float]]:
    """[start, end) of each serial batch: from the start of its first pre-task to the next batch's (or the
    release play's, or the last event)."""
    task_starts = [(stamp(e['created']), e['task']) for e in events
                   if e['event'] == 'playbook_on_task_start' and e.get('created')]
    marks = []
    for s in starts:
        marks = [t for t, task in task_starts if task == s]
        if marks:
            break
    last = max(stamp(e['created']) for e in events if e.get('created'))
    end = next((t for t, task in task_starts if task == end_task), last) if end_task else last
    bounds = marks + [end]
    return [(bounds[i], bounds[i + 1]) for i in range(len(marks))]


NODE_RE = re.compile(r'(?<!\w)(gpu-\d+)(?!\d)')
SERVERS = 'node-role.kubernetes.io/control-plane'


def request_kind(ev: dict, uri: str) -> str:
    """verb, resource and scope of a request with node and object names taken out (comparable across sizes)."""
    ref = ev.get('objectRef') or {}
    resource = ref.get('resource', '?') + ('/' + ref['subresource'] if ref.get('subresource') else '')
    query = urllib.parse.parse_qs(uri.partition('?')[2])
    scope = []
    for key in ('labelSelector', 'fieldSelector'):
        if key in query:
            scope.append('%s=%s' % (key[:5], NODE_RE.sub('<node>', query[key][0])))
    if ev.get('verb') in ('list', 'watch') and not ref.get('namespace'):
        scope.append('cluster-wide')
    return ' '.join([ev.get('verb', '?'), resource] + scope)


def classify_audit(events: list[dict], names: set[str], windows: list[tuple[float, float]]) -> dict:
    """Per node (the URI or the object's name names one node of the pool) / per batch window / run-level
    requests by verb; logical lists of the pool per batch (first pages of lists of Nodes or Pods that name no
    node, the servers' list excepted); every request's kind per batch window, for the growth check."""
    per_node: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    per_batch = [collections.Counter() for _window in windows]
    window_kind = [collections.Counter() for _window in windows]
    pool_lists = [collections.Counter() for _window in windows]
    run_level = collections.Counter()
    for ev in events:
        verb = ev.get('verb', '?')
        uri = urllib.parse.unquote(ev.get('requestURI', ''))
        ref = ev.get('objectRef') or {}
        t = stamp(ev.get('requestReceivedTimestamp') or ev['stageTimestamp'])
        i = next((i for i, (a, b) in enumerate(windows) if a <= t < b), None)
        if i is not None and 'continue=' not in uri:
            window_kind[i][request_kind(ev, uri)] += 1
        found = {m for m in NODE_RE.findall(uri + ' ' + (ref.get('name') or '')) if m in names}
        if len(found) == 1:
            per_node[found.pop()][verb] += 1
            continue
        if i is None:
            run_level[verb] += 1
            continue
        per_batch[i][verb] += 1
        if verb == 'list' and ref.get('resource') in ('nodes', 'pods') and 'continue=' not in uri and SERVERS not in uri:
            pool_lists[i][ref['resource']] += 1
    return {'per_node': per_node, 'per_batch': per_batch, 'window_kind': window_kind, 'pool_lists': pool_lists,
            'run_level': run_level}


def runner_events(pdd: pathlib.Path) -> list[dict]:
    """The events of a Lab.play run from its ansible-runner artifacts, as Lab.play records them."""
    out = []
    for f in pdd.glob('artifacts/*/job_events/*.json'):
        e = json.loads(f.read_text())
        data = e.get('event_data') or {}
        out.append({'event': e.get('event'), 'host': data.get('host'), 'task': data.get('task'),
                    'created': e.get('created'), 'counter': e.get('counter', 0),
                    'delegated': bool((data.get('res') or {}).get('_ansible_delegated_vars'))})
    return sorted(out, key=lambda e: e['counter'])


def audit_of(path: pathlib.Path, user: str, start: float, end: float) -> list[dict]:
    out = []
    with open(path, encoding='utf-8') as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get('stage') != 'ResponseComplete' or (ev.get('user') or {}).get('username') != user:
                continue
            if start <= stamp(ev.get('requestReceivedTimestamp') or ev['stageTimestamp']) <= end:
                out.append(ev)
    return out


def mean_counter(counters: list[collections.Counter], n: int) -> dict[str, float]:
    total: collections.Counter = collections.Counter()
    for c in counters:
        total.update(c)
    return {k: v / max(n, 1) for k, v in sorted(total.items())}


def verbs(d: dict[str, float]) -> str:
    return ' '.join('%s %.1f' % (k, v) for k, v in d.items()) or '-'


# ---------------------------------------------------------------------------------------------- one size
def batch_of(spec: str, size: int) -> int:
    """The nodes per batch the planner makes of --batch-size (a count, or a percentage of the pool as the plan's
    batch_size: rounded down, at least 1) for a pool of `size`."""
    return max(1, resolve_count(spec, size, '--batch-size')['resolved'])


def forks_of(args: argparse.Namespace, size: int) -> int:
    """--forks, else the size's largest batch (at least 8): the rollout refuses fewer forks than a batch has nodes."""
    return args.forks if args.forks else max(8, batch_of(args.batch_size, size))


def run_size(size: int, args: argparse.Namespace, wrapper_each: float, probe: SpeedProbe | None = None) -> dict:
    d = (args.dir / ('n%d' % size)).resolve()
    d.mkdir(parents=True, exist_ok=True)
    batch, forks = batch_of(args.batch_size, size), forks_of(args, size)
    lab = ScaleLab(d, size, fault='none', stuck=[], quiet=True, metrics=args.metrics, account_node_cpu=True,
                   change=args.change, lab_vars={
                       # a count, or a percentage the planner resolves on the pool (batch: what it makes of it)
                       'gpufleet_batch_size': args.batch_size if args.batch_size.endswith('%') else batch,
                       # the isolated canaries (up to 4) and one batch out at once, as the lab's 4 + 4 = 8
                       'gpufleet_max_unavailable': max(8, batch + 4),
                       # The lab's own allowance (75 % of the GPUs in service from 20 nodes) turns the
                       # 20-node plan into batches of 1; the bench keeps batches of --batch-size at every size.
                       'gpufleet_failure_allowance': {'gpus': FAILURE_ALLOWANCE}})
    phases: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        lab.prepare()
        phases['prepare'] = time.monotonic() - t0
        t1 = time.monotonic()
        plan = lab.plan()
        phases['plan.yml'] = time.monotonic() - t1
        canary_as_done(lab, plan)
        roll = play_measured(lab, 'rollout', 'rollout.yml', forks, wrapper_each,
                             profile=d / 'task-cpu-rollout.json' if args.profile else None, probe=probe)
        phases['rollout.yml'] = roll['wall']
        if roll['status'] != 'successful':
            raise LabError('rollout.yml %s: %s' % (roll['status'], roll['failures'][:3]))
        rows = lab.node_view()
        undone = [r['node'] for r in rows if r['state'] != 'done' or r['cordoned']]
        if undone:
            raise LabError('nodes not upgraded and in service after the rollout: %s' % undone[:10])
        # The floor, right after, same lab and accounting.
        counts = tasks_per_host(roll['events'])
        node_counts = [counts.get(n, 0) for n in lab.names]
        node_tasks = round(sum(node_counts) / len(node_counts))
        delegated = tasks_per_host(roll['events'], delegated=True)
        delegated_tasks = round(sum(delegated.get(n, 0) for n in lab.names) / len(lab.names))
        local_tasks = counts.get('localhost', 0)
        order = [n for b in plan['batches'] for n in b]
        serial = [len(b) for b in plan['batches']]
        # Two floors: the pings where the rollout's tasks ran (a node's Kubernetes tasks delegated to the
        # controller, the rest on the node host: the one the targets use), and all of them on the node hosts
        # (where a ping's own module process is node-side, so not counted: the figure before 2026-12-04).
        floors = {}
        second = () if args.no_floor_h else (('floor_on_hosts', 0),)
        for name, delegate in (('floor', delegated_tasks),) + second:
            floor_file = d / (name + '.yml')
            write_floor(floor_file, node_tasks, local_tasks, serial, order, delegated_tasks=delegate)
            floors[name] = play_measured(lab, name, str(floor_file), forks, wrapper_each,
                                         profile=d / ('task-cpu-%s.json' % name) if args.profile else None,
                                         probe=probe)
            phases[name] = floors[name]['wall']
            if floors[name]['status'] != 'successful':
                raise LabError('the floor playbook %s: %s' % (floors[name]['status'], floors[name]['failures'][:3]))
    finally:
        lab.stop()
    phases['total'] = time.monotonic() - t0
    base = {'size': size, 'batch_size': batch, 'forks': forks, 'phases': phases, 'roll': {k: v for k, v in roll.items() if k not in ('events', 'failures')},
            'floor_node_tasks': node_tasks, 'floor_delegated_tasks': delegated_tasks, 'floor_local_tasks': local_tasks,
            'wrapper_each': wrapper_each}
    for name, floor in floors.items():
        base[name] = {k: v for k, v in floor.items() if k not in ('events', 'failures')}
    (args.dir / ('n%d.json' % size)).write_text(json.dumps(base, indent=1))
    return base


def analyse(base: dict, d: pathlib.Path) -> dict:
    """The figures of one size from what its run left on disk: the plan, the runner events of the rollout and
    the floor, the API server's audit log (the operator's requests during the rollout)."""
    size = base['size']
    names = labenv.node_names(size)
    plan = json.loads((d / 'plan.json').read_text())
    roll_events = runner_events(d / 'runner' / 'rollout')
    floor_events = runner_events(d / 'runner' / 'floor')
    times = [stamp(e['created']) for e in roll_events if e.get('created')]
    audit = audit_of(d / 'cluster' / 'audit.log', OPERATOR, min(times), max(times) + 2)
    counts = tasks_per_host(roll_events)
    upgraded = [n for n in names if n not in plan['canaries']]
    windows = batch_windows(roll_events, BATCH_START, RELEASE_START)
    canary_batches = [i for i, b in enumerate(plan['batches']) if set(b) <= set(plan['canaries'])]
    upgrading = [i for i in range(len(windows)) if i not in canary_batches]
    cls = classify_audit(audit, set(names), windows)
    floor_windows = batch_windows(floor_events, ('Floor | node ping 1',), None)
    batch_walls = [windows[i][1] - windows[i][0] for i in upgrading]
    floor_walls = [floor_windows[i][1] - floor_windows[i][0] for i in upgrading if i < len(floor_windows)]
    node_req = mean_counter([cls['per_node'][n] for n in upgraded], len(upgraded))
    batch_req = mean_counter([cls['per_batch'][i] for i in upgrading], len(upgrading))
    in_windows = mean_counter([cls['window_kind'][i] for i in upgrading], len(upgraded))
    lists = {r: max((cls['pool_lists'][i][r] for i in upgrading), default=0) for r in ('nodes', 'pods')}
    bundle = d / 'evidence' / 'rollout.json'
    return dict(base, **{
        'upgraded': len(upgraded), 'batches': len(upgrading), 'canary_batches': len(canary_batches),
        'tasks_per_node': sum(counts.get(n, 0) for n in upgraded) / len(upgraded),
        'tasks_total': sum(counts.values()),
        'floor_tasks_total': base['floor_node_tasks'] * len(names) + base['floor_local_tasks'],
        'batch_wall': sum(batch_walls) / max(len(batch_walls), 1), 'batch_wall_max': max(batch_walls, default=0),
        'floor_batch_wall': sum(floor_walls) / max(len(floor_walls), 1),
        'node_req': node_req, 'node_req_total': sum(node_req.values()),
        'batch_req': batch_req, 'batch_req_total': sum(batch_req.values()),
        'window_per_node': in_windows, 'window_per_node_total': sum(in_windows.values()),
        'run_req': dict(cls['run_level']), 'pool_lists_max': lists, 'requests': len(audit),
        'bundle_bytes': bundle.stat().st_size if bundle.is_file() else 0,
        'simulated_batch': sum(labmod.SIMULATED.values()),
    })


# ---------------------------------------------------------------------------------------------- report
def speed_adjusted(results: list[dict]) -> dict | None:
    """The two CPU targets with every figure brought to one machine speed (bench/speed_probe.py): ours at the speed
    of its own floor, and each size's CPU per node at the speed of the first size's rollout. None when a run has
    no probe (before 2026-12-06, or --reuse of one)."""
    speeds = [(r['roll'].get('speed'), r['floor'].get('speed')) for r in results]
    if not all(roll and floor for roll, floor in speeds):
        return None
    reference = speeds[0][0]
    per_node = [at_speed(r['roll']['own_cpu'], roll, reference) / r['upgraded'] for r, (roll, _f) in zip(results, speeds)]
    ratios = [at_speed(r['roll']['own_cpu'], roll, floor) / max(r['floor']['own_cpu'], 1e-9)
              for r, (roll, floor) in zip(results, speeds)]
    return {'flat': per_node[-1] / per_node[0], 'floor_worst': max(ratios), 'ratios': ratios, 'per_node': per_node}


def report_speed(results: list[dict], adjusted: dict | None) -> None:
    """What the speed probe saw: the machine's speed during each rollout and floor, and the figures at one speed
    (`adjusted`: speed_adjusted's)."""
    if not adjusted:
        print('machine speed: no probe in this run (runs before 2026-12-06)')
        print()
        return
    print('machine speed (bench/speed_probe.py: CPU ms of one fixed piece of work, every 5 s; more = a slower machine) '
          'and the figures at one speed:')
    for r, ratio, per_node in zip(results, adjusted['ratios'], adjusted['per_node']):
        roll, floor = r['roll']['speed'], r['floor']['speed']
        print('%6d nodes: probe %.1f ms during the rollout, %.1f during the floor (%+.0f %%); ratio to the floor at its '
              'speed %.2fx (as measured %.2fx); CPU/node at the first rollout\'s speed %.2f s'
              % (r['size'], 1000 * roll, 1000 * floor, 100 * (floor / roll - 1), ratio,
                 r['roll']['own_cpu'] / max(r['floor']['own_cpu'], 1e-9), per_node))
    print()


def report(results: list[dict], args: argparse.Namespace, wrapper_each: float) -> None:
    print()
    # A run's own sizes: from its n<N>.json with --reuse (runs before 2026-12-06 did not record them: "?").
    made = ', '.join('%d nodes: batches of %s, %s forks' % (r['size'], r.get('batch_size', '?'), r.get('forks', '?'))
                     for r in results)
    print('rollout scale (%s change, --batch-size %s (%s), failure allowance %s of the GPUs, metric gate %s) on the '
          'real control plane; %s'
          % (args.change, args.batch_size, made, FAILURE_ALLOWANCE, 'on' if args.metrics == 'auto' else 'off',
             datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')))
    print('HOST STAND-IN: ' + HOST_STANDIN)
    print('controller CPU = ansible tree CPU - node-side modules and reboot hook (logged) - %.3f s per wrapped run '
          '(the accounting wrapper\'s start-up)' % wrapper_each)
    print('floor = ansible.builtin.ping, same hosts, same tasks per host, same forks/serial/connection, same lab, '
          'right after; each node\'s pings where its tasks ran (its Kubernetes tasks delegated to the controller, '
          'the rest on the node host); floor h = all of them on the node hosts (a ping\'s own process then node-side, '
          'not counted)')
    print()
    head = ('%6s %6s %5s | %9s %8s %8s | %9s %8s %8s | %9s %8s | %7s %7s %7s %7s | %7s %7s'
            % ('nodes', 'upgr', 'batch', 'ctl CPU s', 'CPU/node', 'standin', 'floor CPU', 'ratio', 'ratio h',
               'wall/bat', 'floor/b', 'wall x', 'tasks/n', 'floor n', 'deleg n', 'RSS MiB', 'flr RSS'))
    print(head)
    print('-' * len(head))
    for r in results:
        ro, fl = r['roll'], r['floor']
        on_hosts = (r.get('floor_on_hosts') or {}).get('own_cpu')
        print('%6d %6d %5d | %9.1f %8.2f %8.2f | %9.1f %7.2fx %8s | %8.1fs %7.1fs | %6.2fx %7.1f %7d %7s | %7.0f %7.0f'
              % (r['size'], r['upgraded'], r['batches'], ro['own_cpu'], ro['own_cpu'] / r['upgraded'],
                 ro['node_cpu'] / r['upgraded'], fl['own_cpu'], ro['own_cpu'] / max(fl['own_cpu'], 1e-9),
                 '%.2fx' % (ro['own_cpu'] / max(on_hosts, 1e-9)) if on_hosts else '-',
                 r['batch_wall'], r['floor_batch_wall'], r['batch_wall'] / max(r['floor_batch_wall'], 1e-9),
                 r['tasks_per_node'], r['floor_node_tasks'], r.get('floor_delegated_tasks', '-'), ro['rss_mib'],
                 fl['rss_mib']))
    print('  ctl CPU s: the rollout\'s controller CPU; CPU/node: per upgraded node; standin: node-side stand-in CPU '
          'per node (not counted);')
    print('  floor CPU, ratio: the ping floor\'s controller CPU and ours / it (ratio h: / floor h); wall/bat: mean '
          'wall of an upgrading batch beyond its')
    print('  simulated work (the lab sleeps none of it, so all of it; it includes the stand-in\'s own time), floor/b: '
          'the floor\'s, wall x: ratio;')
    print('  tasks/n: tasks run per upgraded node (ok+failed), floor n: pings per node host, deleg n: of them '
          'delegated to the controller; RSS: ansible-playbook\'s peak (VmHWM)')
    print()
    adjusted = speed_adjusted(results)
    report_speed(results, adjusted)
    print('API requests of the operator ServiceAccount (audit log), mean per upgraded node and per upgrading batch:')
    for r in results:
        print('%6d nodes: naming the node %5.1f per node (%s); all requests of the batches per node %.1f'
              % (r['size'], r['node_req_total'], verbs(r['node_req']), r['window_per_node_total']))
        print('%6s        not naming a node %4.1f per batch (%s); pool lists per batch (max) nodes %d pods %d; '
              'run-level %s; all %d'
              % ('', r['batch_req_total'], verbs(r['batch_req']), r['pool_lists_max']['nodes'],
                 r['pool_lists_max']['pods'], verbs({k: float(v) for k, v in sorted(r['run_req'].items())}),
                 r['requests']))
    print()
    print('every request of the upgrading batches\' windows by kind (names taken out), per upgraded node '
          '(a kind whose count per node grows with the fleet is flagged):')
    kinds = sorted({k for r in results for k in r['window_per_node']})
    print('  %-100s %s' % ('', ' '.join('%8d' % r['size'] for r in results)))
    for k in kinds:
        row = [r['window_per_node'].get(k, 0) for r in results]
        flag = '' if row[-1] <= TARGETS['per_node_growth'] * row[0] + 0.05 else \
            '  (one per pod on the node: the workload\'s)' if k in PER_POD_KINDS else '  GROWS'
        print('  %-100s %s%s' % (k[:100], ' '.join('%8.2f' % v for v in row), flag))
    print()
    for r in results:
        sim = r['simulated_batch']
        print('%6d nodes: simulated maintenance %d s per batch (lab SIMULATED); controller wall per batch %.1f s = '
              '%.2f %% of it, controller CPU per batch %.1f s = %.2f %% (machine-dependent)'
              % (r['size'], sim, r['batch_wall'], 100 * r['batch_wall'] / sim,
                 r['roll']['own_cpu'] / max(r['batches'], 1), 100 * r['roll']['own_cpu'] / max(r['batches'], 1) / sim))
    print()
    small, big = results[0], results[-1]
    flat = (big['roll']['own_cpu'] / big['upgraded']) / (small['roll']['own_cpu'] / small['upgraded'])
    floor_worst = max(r['roll']['own_cpu'] / max(r['floor']['own_cpu'], 1e-9) for r in results)
    lists_by = {kind: max(r['pool_lists_max'][kind] for r in results) for kind in ('nodes', 'pods')}
    lists = max(lists_by.values())

    def judged(d: dict) -> float:
        return sum(v for k, v in d.items() if k not in PER_POD_KINDS)
    growth = judged(big['window_per_node']) / max(judged(small['window_per_node']), 1e-9)
    grown = [k for k in big['window_per_node'] if k not in PER_POD_KINDS
             and big['window_per_node'][k] > TARGETS['per_node_growth'] * small['window_per_node'].get(k, 0) + 0.05]

    def verdict(ok: bool) -> str:
        return 'met' if ok else 'NOT MET'
    print('targets (issue 18 item 2), %d vs %d nodes:' % (big['size'], small['size']))
    print('  controller CPU per node flat: %.2fx (<= %.1fx)  %s'
          % (flat, TARGETS['cpu_flat'], verdict(flat <= TARGETS['cpu_flat'])))
    print('  controller CPU <= %.1fx the ping floor at every size: worst %.2fx  %s'
          % (TARGETS['floor'], floor_worst, verdict(floor_worst <= TARGETS['floor'])))
    print('  per batch at most one list of the pool\'s nodes and one of its pods beyond per-node requests: max %d '
          '(nodes %d, pods %d)  %s' % (lists, lists_by['nodes'], lists_by['pods'], verdict(lists <= TARGETS['pool_lists'])))
    print('  no per-node request count grows with the fleet: requests of the batches per node, evictions aside, '
          '%.1f -> %.1f (%.2fx, <= %.1fx)%s  %s'
          % (judged(small['window_per_node']), judged(big['window_per_node']), growth, TARGETS['per_node_growth'],
             '; grew: ' + ', '.join(grown) if grown else '', verdict(growth <= TARGETS['per_node_growth'] and not grown)))
    if adjusted:
        print('  at one machine speed (the probe above): controller CPU per node flat %.2fx  %s; worst ratio to the '
              'floor %.2fx  %s' % (adjusted['flat'], verdict(adjusted['flat'] <= TARGETS['cpu_flat']),
                                   adjusted['floor_worst'], verdict(adjusted['floor_worst'] <= TARGETS['floor'])))
    if len(results) > 1 and big['size'] < 200:
        print('  (sizes below 200 only show the method; the issue\'s figures need --sizes 40,200,1000)')
    print()
    print('time per size: ' + '; '.join('%d nodes: %s' % (r['size'], ', '.join('%s %.0fs' % kv for kv in r['phases'].items()))
                                        for r in results))


def profile_kind(task: dict) -> str:
    """What a profiled task is, for the totals: skipped on every host, an action that runs in Ansible itself
    (set_fact, assert...), or a module, delegated to the controller or on the node host."""
    st = task['status']
    if not st.get('ok') and not st.get('failed') and st.get('skipped'):
        return 'skipped everywhere'
    if task['action'].startswith('ansible.builtin.') and task['action'].split('.')[-1] in INTERNAL_ACTIONS:
        return 'in Ansible (set_fact, assert, include...)'
    return 'module delegated to the controller' if task.get('delegated') else 'module on the node host'


def report_profile(size: int, d: pathlib.Path) -> None:
    """--profile: where the rollout's controller CPU goes, task by task, beside the floor's pings."""
    roll_file, floor_file = d / 'task-cpu-rollout.json', d / 'task-cpu-floor.json'
    if not roll_file.is_file():
        return
    roll = json.loads(roll_file.read_text())
    floor = json.loads(floor_file.read_text()) if floor_file.is_file() else {'tasks': []}
    print()
    if 'error' in roll:
        print('%d nodes: no task profile (%s)' % (size, roll['error']))
        return
    print('%d nodes, the controller CPU of each task (--profile: a cgroup around ansible-playbook, node-side runs '
          'subtracted; "main": Ansible\'s main process; per run: per host that ran or skipped it):' % size)
    pings = collections.defaultdict(lambda: [0.0, 0])
    for t in floor.get('tasks', []):
        kind = ('on localhost' if t['task'].startswith('Floor | localhost ping') else
                'node host, delegated to the controller' if t['task'].startswith('Floor | node ping') and t['delegated']
                else 'on the node host' if t['task'].startswith('Floor | node ping') else None)
        if kind:
            pings[kind][0] += t['cpu']
            pings[kind][1] += t['status'].get('ok', 0)
    tasks = roll['tasks']
    totals = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for t in tasks:
        runs = sum(t['status'].values())
        k = totals[profile_kind(t)]
        k[0] += t['cpu']
        k[1] += t['main']
        k[2] += runs
    print('  %-50s %9s %8s %6s %9s' % ('kind', 'CPU s', 'main s', 'runs', 'per run'))
    for kind, (cpu, main_cpu, runs) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print('  %-50s %9.1f %8.1f %6d %9.3f' % (kind, cpu, main_cpu, runs, cpu / max(runs, 1)))
    for kind, (cpu, runs) in sorted(pings.items()):
        print('  %-50s %9.1f %8s %6d %9.3f' % ('floor ping ' + kind, cpu, '', runs, cpu / max(runs, 1)))
    print('  the %d tasks with the most CPU:' % PROFILE_TOP)
    print('  %9s %8s %4s %4s %8s  %-32s %s' % ('CPU s', 'main s', 'ran', 'skip', 'per run', 'action', 'task'))
    for t in sorted(tasks, key=lambda t: -t['cpu'])[:PROFILE_TOP]:
        st = t['status']
        ran = st.get('ok', 0) + st.get('failed', 0)
        print('  %9.2f %8.2f %4d %4d %8.3f  %-32s %s' % (t['cpu'], t['main'], ran, st.get('skipped', 0),
                                                         t['cpu'] / max(ran + st.get('skipped', 0), 1),
                                                         t['action'][-32:], t['task'][:90]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--sizes', default='40,200,1000', help='fleet sizes, comma-separated')
    parser.add_argument('--dir', type=pathlib.Path, default=REPO / '.lab-bench' / 'scale')
    parser.add_argument('--change', choices=sorted(labenv.CHANGES), default='seed',
                        help='seed: kernel, RKE2 (through the SUC stand-in) and driver; driver: the driver alone')
    parser.add_argument('--batch-size', default='4',
                        help='nodes per batch: a count, or a percentage of the pool as the plan\'s batch_size (its '
                             'default is 10%%: batches grow with the pool, the observation windows stay as many)')
    parser.add_argument('--forks', type=int, default=0,
                        help='Ansible forks (default: the largest batch, at least 8)')
    parser.add_argument('--reuse', action='store_true',
                        help='no run: the figures again from what an earlier run left under --dir')
    parser.add_argument('--profile', action='store_true',
                        help='also the controller CPU of each task of the rollout and of the floor (a cgroup around '
                             'ansible-playbook: root and cgroup cpuacct; its reads add a little CPU of their own)')
    parser.add_argument('--no-floor-h', action='store_true',
                        help='skip the second floor (every ping on the node hosts: "ratio h", the figure before '
                             '2026-12-04); it takes about as long as the first, which the targets use')
    parser.add_argument('--metrics', choices=('auto', 'off'), default='off',
                        help='auto: the metric gate with Prometheus when installed (its scrapes load the machine)')
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(','))
    try:
        for size in sizes:
            if forks_of(args, size) < batch_of(args.batch_size, size):
                parser.error('--forks %d is fewer than the %d nodes of a batch at %d nodes (the rollout refuses it)'
                             % (args.forks, batch_of(args.batch_size, size), size))
    except PlanInputError as exc:
        parser.error(str(exc))
    wrapper_each = None if args.reuse else wrapper_cpu_each()
    probe = None if args.reuse else SpeedProbe().start()
    results = []
    for size in sizes:
        d = (args.dir / ('n%d' % size)).resolve()
        if args.reuse:
            base = json.loads((args.dir / ('n%d.json' % size)).read_text())
            wrapper_each = base.get('wrapper_each', wrapper_each)
        else:
            log('== %d nodes' % size)
            try:
                base = run_size(size, args, wrapper_each, probe)
            except LabError as exc:
                log('%d nodes FAILED: %s' % (size, exc))
                return 1
            log('%d nodes done in %.0fs' % (size, base['phases']['total']))
        results.append(analyse(base, d))
    if probe:   # a daemon thread: a size that failed above leaves it to the interpreter's exit
        probe.stop()
    report(results, args, wrapper_each if wrapper_each is not None else wrapper_cpu_each())
    for size in sizes:
        report_profile(size, (args.dir / ('n%d' % size)).resolve())
    return 0


if __name__ == '__main__':
    sys.exit(main())
