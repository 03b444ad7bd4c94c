"""The fault campaign (issue 12): every mutating request the rollout of one node makes is answered,
once, with 409, 429, 500, 503 and a time-out, and after every such run the safety invariants hold.

The rollout of one node is the node_upgrade role on lab node gpu-01 as rollout.yml runs it (the
molecule scenario's set-up, extensions/molecule/node_upgrade): an install root with real dpkg at
580.126.20, the NVML stand-in, the lab activation hook (tests/tools/labenv.py, lab_node.py), on the
real control plane of the `cluster` fixture with the lab's pool (tests/tools/labenv.apply_pool: the
GPU Operator's DaemonSets, a training ReplicaSet per GPU model under a PodDisruptionBudget, run by
the real controllers and KWOK), as the operator ServiceAccount through the fault proxy. gpu-01 runs a
training pod behind a PodDisruptionBudget and a GPU inference pod without one; gpu-02 was cordoned
by someone else (unschedulable, none of our annotations) before the rollout.

1. The record run, without faults, lists the modules' mutating requests (the proxy's log: verb and
   path), numbered by (verb, path, occurrence).
2. For a recorded request and a fault kind, the scenario is set up anew and ONE proxy rule hits
   exactly that occurrence (`skip` lets the earlier ones through): the status (409, 429, 500, 503),
   or, for "timeout", a delay of 3 s before the request is served, longer than the modules'
   request_timeout (2 s here, through module_defaults). The run may fail. Then:
   (a) gpu-01 is either in service (validated or done recorded for the target, uncordoned, the
       target driver installed) or cordoned, with its snapshot file intact (the SHA-256 the Node
       records, when it records one);
   (b) no pod was deleted without eviction: the modules sent no pod DELETE, and every pod that
       disappeared had an eviction POST the API server accepted;
   (c) gpu-02 is still cordoned (a cordon we did not set is never lifted), none of our records on it;
   (d) recovery: a rerun without faults puts gpu-01 in service with the target driver.
   The rule must have hit (a rule that matched nothing would make the run vacuous).

The record run makes 11 mutating requests (docs/reliability.md lists them): node_drain's cordon,
the two evictions (an eviction's pod is named by its ReplicaSet's generateName, new in every
set-up), node_drain's `drained` records, upgrade_state's snapshotted, installed, activated and
validated records, the uncordon and the `done` record. By default the test faults every recorded
request once, the five kinds in turn (11 faulted runs, each kind on two requests or more; 5 to 7
minutes on 2 cores); GPUFLEET_FAULT_CAMPAIGN=full faults every request with every kind (55 runs,
about 25 minutes). GPUFLEET_FAULT_CAMPAIGN_REPORT=<file> writes every run's outcome as JSON. The
counts of the last full campaign are in docs/reliability.md.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import sys
import time
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests')]

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as sn  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state as us  # noqa: E402
from tools import labenv, nvml_stub  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                 reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')]

NODE, OTHER = 'gpu-01', 'gpu-02'
NAMES = [NODE, OTHER]
# The driver change (the lab's seed change needs the SUC stand-in and reboots; the campaign is about the
# Kubernetes requests of one node's rollout).
TARGET = labenv.CHANGES['driver']
KEY = us.target_key(TARGET)
REQUEST_TIMEOUT = 2.0
TIMEOUT_DELAY = 3.0
KINDS = {'409': {'status': 409}, '429': {'status': 429}, '500': {'status': 500}, '503': {'status': 503},
         'timeout': {'delay': TIMEOUT_DELAY}}
# The role as rollout.yml runs it, with the lab's reboot path and short simulated waits (as the
# molecule scenario's converge.yml).
ROLE_VARS = {'gpufleet_activation': 'lab', 'gpufleet_ready_interval': 1, 'gpufleet_reboot_timeout': 30,
             'node_upgrade_drain_timeout': 60, 'node_upgrade_drain_retry_interval': 0.2,
             'gpufleet_node_gate_timeout': 10, 'gpufleet_node_gate_interval': 0.5}
EVICTION = re.compile(r'^/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$')


def infer_pod() -> dict:
    """A GPU inference pod on gpu-01 under no PodDisruptionBudget (a ReplicaSet's, so it can be evicted)."""
    app = {'app': 'infer'}
    return {'apiVersion': 'apps/v1', 'kind': 'ReplicaSet', 'metadata': {'name': 'infer', 'namespace': 'ml', 'labels': app},
            'spec': {'replicas': 1, 'selector': {'matchLabels': app}, 'template': {'metadata': {'labels': app}, 'spec': {
                'nodeSelector': {'kubernetes.io/hostname': NODE}, 'terminationGracePeriodSeconds': 0,
                'containers': [{'name': 'infer', 'image': 'registry.example/infer:1',
                                'resources': {'requests': {labenv.GPU: '2'}, 'limits': {labenv.GPU: '2'}}}]}}}}


class Scenario:
    """One lab node's rollout on the `cluster` fixture, set up anew for every run."""

    def __init__(self, cluster: Any, run_playbook: Any, base: pathlib.Path) -> None:
        self.cluster = cluster
        self.run_playbook = run_playbook
        self.lab = base / 'lab'
        self.lab.mkdir(parents=True)
        self.lib_dir = nvml_stub.build()
        self.kubeconfig = ''
        self.pods_before: dict[str, tuple[str, str, str]] = {}
        self.generate_names: dict[tuple[str, str], str] = {}

    def reset(self) -> None:
        c = self.cluster
        c.reset()
        for sub in ('nodes', 'snapshots'):
            shutil.rmtree(self.lab / sub, ignore_errors=True)
        (self.lab / 'snapshots').mkdir()
        labenv.make_roots(self.lab, NAMES)
        labenv.write_node_files(self.lab, NAMES)
        labenv.apply_pool(c, NAMES)
        # The GPU Operator's own pod (a Deployment's) runs on gpu-02 in every set-up, wherever the scheduler
        # first put it: the requests of gpu-01's rollout are the same in every run.
        c.patch('apps/v1', 'Deployment', 'gpu-operator', {'spec': {'template': {'spec': {
            'nodeSelector': {'kubernetes.io/hostname': OTHER}}}}}, namespace='gpu-operator')
        c.apply([infer_pod()], settle=False)
        c.wait_for(lambda: [p['spec'].get('nodeName') for p in c.list('v1', 'Pod', 'gpu-operator', label_selector='app=gpu-operator')
                            if (p.get('status') or {}).get('phase') == 'Running' and not p['metadata'].get('deletionTimestamp')]
                   == [OTHER] and len(c.list('v1', 'Pod', 'gpu-operator', label_selector='app=gpu-operator')) == 1,
                   timeout=90, message='the GPU Operator\'s pod running on ' + OTHER + ' alone')
        c.wait_for(lambda: any((p.get('status') or {}).get('phase') == 'Running'
                               for p in c.list('v1', 'Pod', 'ml', label_selector='app=infer')),
                   timeout=60, message='the inference pod running on ' + NODE)
        # Someone else cordoned gpu-02 before the rollout (after its pods were placed).
        c.patch('v1', 'Node', OTHER, {'spec': {'unschedulable': True}})
        self.kubeconfig = labenv.operator_kubeconfig(c, self.lab / 'kubeconfig')
        (self.lab / 'lab.json').write_text(json.dumps({
            'kubeconfig': c.admin_kubeconfig, 'api': c.cp.url, 'target_driver': labenv.TARGET_DRIVER,
            'fault': None, 'stuck': []}, indent=1))
        on_node = [p for p in c.list('v1', 'Pod') if p['spec'].get('nodeName') == NODE]
        assert {p['metadata']['labels'].get('app') for p in on_node} >= {'train-h100', 'infer'}, on_node
        self.pods_before = {p['metadata']['uid']: (p['metadata']['namespace'], p['metadata']['name'],
                                                   p['spec'].get('nodeName') or '') for p in c.list('v1', 'Pod')}
        self.generate_names = {(p['metadata']['namespace'], p['metadata']['name']): p['metadata'].get('generateName', '')
                               for p in c.list('v1', 'Pod')}
        c.clear_requests()

    def play(self) -> Any:
        extra = {'gpufleet_kubeconfig': self.kubeconfig, 'gpufleet_target': TARGET}
        inventory = labenv.inventory(self.lab, NAMES, self.lib_dir, extra)
        plays = [{'name': 'The rollout of one node', 'hosts': NODE, 'gather_facts': False,
                  'environment': '{{ gpufleet_node_environment }}',
                  'module_defaults': {'group/gpufleet.upgrade.k8s': {
                      'kubeconfig': '{{ gpufleet_kubeconfig }}', 'request_timeout': REQUEST_TIMEOUT}},
                  'roles': [{'role': 'gpufleet.upgrade.node_upgrade', 'vars': ROLE_VARS}]}]
        return self.run_playbook(plays, inventory=inventory, timeout=300)

    # ------------------------------------------------------------------ invariants
    def in_service(self) -> bool:
        node = self.cluster.get('v1', 'Node', NODE)
        ann = node['metadata'].get('annotations') or {}
        recorded = (ann.get(us.ANN_DONE) == KEY and us.ANN_STATE not in ann) or \
            (ann.get(us.ANN_STATE) == 'validated' and ann.get(us.ANN_TARGET) == KEY)
        return bool(recorded and not node['spec'].get('unschedulable')
                    and labenv.installed_driver(self.lab / 'nodes' / NODE / 'root') == labenv.TARGET_DRIVER)

    def violations(self) -> list[str]:
        c = self.cluster
        out = []
        node = c.get('v1', 'Node', NODE)
        ann = node['metadata'].get('annotations') or {}
        # (a) in service, or cordoned with its snapshot intact.
        if not self.in_service():
            if not node['spec'].get('unschedulable'):
                out.append('(a) %s is neither in service nor cordoned: annotations %s, driver %s' % (
                    NODE, {k: v for k, v in ann.items() if k.startswith('gpufleet.io/')},
                    labenv.installed_driver(self.lab / 'nodes' / NODE / 'root')))
            sha = ann.get(us.ANN_SNAPSHOT)
            if sha:
                snaps = list((self.lab / 'snapshots').glob(NODE + '--*.json'))
                if len(snaps) != 1:
                    out.append('(a) %s records snapshot %s; snapshot files: %s' % (NODE, sha, snaps))
                else:
                    try:   # the file's content hashes to its own digest, which is the one the Node records
                        sn.verify_document(json.loads(snaps[0].read_text()), sha)
                    except (ValueError, sn.SnapshotError) as exc:
                        out.append('(a) the snapshot of %s is not intact: %s' % (NODE, exc))
        # (b) no pod deleted without eviction.
        log = c.requests
        deletes = [r['path'] for r in log if r['verb'] == 'DELETE' and '/pods' in r['path']]
        if deletes:
            out.append('(b) pod DELETEs sent: %s' % deletes)
        evicted = {EVICTION.match(r['path']).groups() for r in log
                   if r['verb'] == 'POST' and EVICTION.match(r['path']) and r.get('status') in (200, 201)}
        now = {p['metadata']['uid'] for p in c.list('v1', 'Pod')}
        for uid, (ns, name, where) in self.pods_before.items():
            if uid not in now and (ns, name) not in evicted:
                out.append('(b) pod %s/%s (on %s) disappeared without an accepted eviction' % (ns, name, where))
        # (c) the cordon someone else set stays, and we wrote nothing on that node.
        other = c.get('v1', 'Node', OTHER)
        if other['spec'].get('unschedulable') is not True:
            out.append('(c) %s, cordoned by someone else, was uncordoned' % OTHER)
        ours = [k for k in (other['metadata'].get('annotations') or {}) if k.startswith('gpufleet.io/')]
        if ours:
            out.append('(c) %s carries our annotations %s' % (OTHER, ours))
        return out


def numbered(requests: list[dict], generate_names: dict[tuple[str, str], str]) -> list[dict]:
    """The mutating requests as (verb, path, occurrence) with a class label and the path's pattern.
    An eviction's pod has a generated name (its ReplicaSet's), new in every set-up: its pattern
    names the pod by its generateName, and occurrences count over those pods."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for r in requests:
        pattern = '^' + re.escape(r['path']) + '$'
        m = EVICTION.match(r['path'])
        if r['verb'] == 'POST' and m and generate_names.get(m.groups()):
            ns = m.group(1)
            pattern = '^%s[a-z0-9]{5}/eviction$' % re.escape('/api/v1/namespaces/%s/pods/%s' % (ns, generate_names[m.groups()]))
        key = (r['verb'], pattern)
        occurrence = seen.get(key, 0)
        seen[key] = occurrence + 1
        out.append({'verb': r['verb'], 'path': r['path'], 'pattern': pattern, 'occurrence': occurrence,
                    'class': request_class(r)})
    return out


def request_class(r: dict) -> str:
    body = r.get('body') or {}
    if r['verb'] == 'POST' and EVICTION.match(r['path']):
        return 'POST eviction'
    if r['verb'] == 'PATCH' and r['path'] == '/api/v1/nodes/' + NODE:
        parts = []
        spec = body.get('spec') or {}
        if 'unschedulable' in spec:
            parts.append('cordon' if spec['unschedulable'] else 'uncordon')
        ann = (body.get('metadata') or {}).get('annotations') or {}
        if ann.get(us.ANN_DONE):
            parts.append('state=done')
        elif ann.get(us.ANN_STATE):
            parts.append('state=%s' % ann[us.ANN_STATE])
        parts += sorted(k for k in ann if k not in (us.ANN_STATE, us.ANN_DONE))
        return 'PATCH node ' + ' '.join(parts)
    return '%s %s' % (r['verb'], re.sub(r'/namespaces/[^/]+/', '/namespaces/*/', r['path']))


def test_every_mutating_request_of_one_node_rollout_faulted_once_keeps_the_invariants(cluster, run_playbook, tmp_path):
    full = os.environ.get('GPUFLEET_FAULT_CAMPAIGN') == 'full'
    s = Scenario(cluster, run_playbook, tmp_path)
    t0 = time.monotonic()
    s.reset()
    t_reset = time.monotonic() - t0
    record = s.play()
    t_run = time.monotonic() - t0 - t_reset
    assert record.rc == 0, record.stdout[-3000:]
    assert s.in_service() and s.violations() == []
    recorded = numbered(cluster.mutating_requests(), s.generate_names)
    assert recorded, 'the record run made no mutating request'
    # The checks see a violation: gpu-02's cordon lifted and a pod deleted without eviction (both by
    # the setup identity, straight to the API server, so the request log is the record run's).
    cluster.patch('v1', 'Node', OTHER, {'spec': {'unschedulable': False}})
    pod = next(p for p in cluster.list('v1', 'Pod', 'ml') if p['spec'].get('nodeName') == OTHER)
    cluster.delete('v1', 'Pod', pod['metadata']['name'], 'ml')
    assert s.violations() == ['(b) pod ml/%s (on %s) disappeared without an accepted eviction' % (pod['metadata']['name'], OTHER),
                              '(c) %s, cordoned by someone else, was uncordoned' % OTHER]
    classes = sorted({r['class'] for r in recorded})
    for r in recorded:
        print('  %s %s #%d  [%s]' % (r['verb'], r['pattern'], r['occurrence'], r['class']))
    # The request classes the campaign must cover (the role's contract; a change shows here).
    for needed in ['POST eviction', 'PATCH node cordon', 'PATCH node uncordon'] + [
            'PATCH node state=' + state for state in ('drained', 'snapshotted', 'installed', 'activated', 'validated', 'done')]:
        assert any(c.startswith(needed) for c in classes), (needed, classes)
    kinds = list(KINDS)
    if full:
        runs = [(r, kind) for r in recorded for kind in kinds]
    else:   # every request once, the kinds in turn (each kind on two requests or more), in an order that
        # does not depend on which of the parallel evictions was sent first
        ordered = sorted(recorded, key=lambda r: (r['verb'], r['pattern'], r['occurrence']))
        runs = [(r, kinds[i % len(kinds)]) for i, r in enumerate(ordered)]
    print('fault campaign: record run %.0f s (set-up %.0f s), %d mutating requests in %d classes; faulting %s'
          % (t_run, t_reset, len(recorded), len(classes), 'each with every kind' if full else 'each with one kind, in turn'))

    results = []
    for r, kind in runs:
        effect = KINDS[kind]
        t1 = time.monotonic()
        s.reset()
        fault = cluster.faults.add(method=r['verb'], path=r['pattern'], times=1,
                                   skip=r['occurrence'], **effect)
        run = s.play()
        cluster.faults.clear()
        found = s.violations()
        if fault.hits != 1:
            found.append('the fault did not hit (%d hits; %d let through)' % (fault.hits, fault.passed))
        in_service = s.in_service()
        rerun = None
        if not in_service:
            # (d) recovery: the same rollout again, without faults.
            rerun = s.play()
            if not s.in_service():
                found.append('(d) the rerun without faults did not put %s in service (rc %s): %s'
                             % (NODE, rerun.rc, [t.get('msg') for t in rerun.task_results(event='runner_on_failed')]))
            found += ['(after the rerun) ' + v for v in s.violations()]
        res = {'request': '%s %s #%d' % (r['verb'], r['pattern'], r['occurrence']), 'class': r['class'],
               'kind': kind, 'rc': run.rc, 'outcome': 'in service' if in_service else 'cordoned',
               'rerun': None if rerun is None else rerun.rc, 'violations': found,
               'seconds': round(time.monotonic() - t1, 1)}
        results.append(res)
        print('  %-60s %-7s rc=%s %-10s rerun=%s %5.1fs %s'
              % (res['request'], kind, run.rc, res['outcome'], res['rerun'], res['seconds'], found or ''))
    violations = [res for res in results if res['violations']]
    out = os.environ.get('GPUFLEET_FAULT_CAMPAIGN_REPORT')
    if out:
        pathlib.Path(out).write_text(json.dumps({
            'mode': 'full' if full else 'subset', 'recorded': len(recorded), 'classes': classes,
            'requests_faulted': len({x['request'] for x in results}), 'runs': len(results), 'reruns': sum(1 for x in results if x['rerun'] is not None),
            'violations': len(violations), 'record_run_s': round(t_run, 1), 'wall_s': round(time.monotonic() - t0, 1),
            'results': results}, indent=1))
    print('fault campaign: %d requests faulted, %d faulted runs (%d recovery reruns), %d with invariant violations, %.0f s'
          % (len({x['request'] for x in results}), len(results), sum(1 for x in results if x['rerun'] is not None),
             len(violations), time.monotonic() - t0))
    assert violations == [], json.dumps(violations, indent=1)


def test_a_node_failed_after_its_new_driver_came_up_resumes_with_its_recorded_snapshot(cluster, run_playbook, tmp_path):
    """The campaign's find (issue 12): one refused write of the `validated` record (a 429 when it was found;
    a 429 is retried now, so a 403 here) fails the node after its new driver came up (without a
    qualification record the rollback is refused: it stays on the new driver, cordoned, `failed`). The
    rerun resumes with the snapshot the Node records (the rollback point taken before the change) instead
    of taking a new one, which node_snapshot refused (the kept file was taken on the old driver), so the
    node could not be recovered by a rerun."""
    s = Scenario(cluster, run_playbook, tmp_path)
    s.reset()
    # The Node PATCHes before `validated`: cordon, drained (2), snapshotted, installed, activated.
    fault = cluster.faults.add(method='PATCH', path='^/api/v1/nodes/%s$' % NODE, status=403, times=1, skip=6)
    run = s.play()
    assert run.rc != 0 and fault.hits == 1
    faulted = [r for r in cluster.requests if r.get('fault')]
    assert [r['body']['metadata']['annotations'] for r in faulted] == [{us.ANN_STATE: 'validated'}], faulted
    ann = cluster.get('v1', 'Node', NODE)['metadata']['annotations']
    assert ann[us.ANN_STATE] == 'failed' and cluster.get('v1', 'Node', NODE)['spec']['unschedulable'] is True
    assert labenv.installed_driver(s.lab / 'nodes' / NODE / 'root') == labenv.TARGET_DRIVER
    (snap,) = (s.lab / 'snapshots').glob(NODE + '--*.json')
    before = snap.read_bytes()
    assert json.loads(before)['sha256'] == ann[us.ANN_SNAPSHOT]
    assert s.violations() == []
    rerun = s.play()
    assert rerun.rc == 0, [t.get('msg') for t in rerun.task_results(event='runner_on_failed')]
    assert s.in_service() and s.violations() == []
    assert rerun.result('Snapshot | Capture what a rollback needs')['_event'] == 'runner_on_skipped'
    assert rerun.result('Snapshot | Record the phase')['_event'] == 'runner_on_ok'
    assert snap.read_bytes() == before     # the rollback point is the one taken before the change
