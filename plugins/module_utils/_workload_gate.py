# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the collection: no compatibility promise. Used by the workload_gate module.

"""Workload gate (seed 000, gate 2): known inputs, pinned to the node, compared with expectations.

Each case is a user-supplied Job manifest. The gate pins it to the node (a nodeSelector plus the
canary toleration) and runs it ``repeat`` times, one Job after another. From each run it reads
the result: a log line, a regex match or a JSON value. It compares that result with the expected
value within a tolerance. The gate fails on any mismatch, any initialisation failure (init
container failed, image pull, container config, crash loop), any failed Job, or any timeout.
Every Job it creates carries the ``gpufleet.io/workload-gate`` label and is deleted afterwards,
together with its pods. Before its first Job, the gate deletes the unfinished Jobs (and their pods)
of an earlier run on the same node (T3-17: a killed controller never ran its cleanup, and their pods
would hold the node's GPUs), and waits, within ``timeout``, until their pods are gone.

Pure helpers (build_job, extract, compare, pod_failure, observe, judge) are tested alone. `run_gate`
drives them over the collection's K8sClient for one node. `run_gate_nodes` runs the same cases on many
nodes at once (the rollout's observation windows): each attempt's Job is created on every node, each
pinned to its node, and all are watched together with one LIST of the run's Jobs and one LIST of its
pods per poll, however many nodes there are.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import poll

__all__ = ['DEFAULT_TOLERATION', 'WorkloadGateError', 'build_job', 'clear_stale', 'compare', 'extract', 'judge',
           'normalize_cases', 'normalize_nodes', 'observe', 'pod_failure', 'run_gate', 'run_gate_nodes', 'stale_jobs']

DEFAULT_TOLERATION = {'key': 'gpufleet.io/canary', 'operator': 'Exists', 'effect': 'NoSchedule'}
# The gate runs before the node is uncordoned: its Jobs tolerate the cordon.
CORDON_TOLERATION = {'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'}
LABEL_RUN = 'gpufleet.io/workload-gate'
LABEL_CASE = 'gpufleet.io/workload-case'
LABEL_NODE = 'gpufleet.io/node'
_NAME_RE = re.compile(r'^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$')
_INIT_WAIT_REASONS = ('CrashLoopBackOff', 'ErrImagePull', 'ImagePullBackOff', 'CreateContainerConfigError',
                      'CreateContainerError', 'InvalidImageName', 'RunContainerError')
_LOG_TAIL = 2000


class WorkloadGateError(ValueError):
    """Bad input: the message names the field and the value."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def normalize_cases(cases: Any) -> List[Dict[str, Any]]:
    """Check the cases; return them with defaults filled in."""
    if not isinstance(cases, list) or not cases:
        raise WorkloadGateError('cases: %r is not a non-empty list' % (cases,))
    out: List[Dict[str, Any]] = []
    names = set()
    for i, case in enumerate(cases):
        where = 'cases[%d]' % i
        if not isinstance(case, dict):
            raise WorkloadGateError('%s: %r is not a dict' % (where, case))
        name = case.get('name')
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise WorkloadGateError('%s.name: %r is not a lowercase DNS label of at most 40 characters' % (where, name))
        if name in names:
            raise WorkloadGateError('%s.name: %r repeats an earlier case' % (where, name))
        names.add(name)
        where = 'cases[%d] (%s)' % (i, name)
        manifest = case.get('manifest')
        if not isinstance(manifest, dict) or manifest.get('kind') != 'Job' or \
                manifest.get('apiVersion') != 'batch/v1':
            raise WorkloadGateError('%s.manifest: not a batch/v1 Job manifest (kind %r, apiVersion %r)' % (
                where, (manifest or {}).get('kind') if isinstance(manifest, dict) else None,
                (manifest or {}).get('apiVersion') if isinstance(manifest, dict) else None))
        tspec = ((manifest.get('spec') or {}).get('template') or {}).get('spec') or {}
        if not tspec.get('containers'):
            raise WorkloadGateError('%s.manifest: spec.template.spec.containers is empty' % where)
        if 'expected' not in case or case['expected'] is None:
            raise WorkloadGateError('%s.expected: missing (the value a correct run produces)' % where)
        tol = case.get('tolerance') or 0
        pct = case.get('tolerance_percent') or 0
        for field, val in (('tolerance', tol), ('tolerance_percent', pct)):
            if not _is_number(val) or val < 0 or math.isnan(val):
                raise WorkloadGateError('%s.%s: %r is not a non-negative number' % (where, field, val))
        if (tol or pct) and not _is_number(case['expected']):
            raise WorkloadGateError('%s.tolerance: a tolerance needs a numeric expected value, got %r'
                                    % (where, case['expected']))
        result = case.get('result') or {}
        if not isinstance(result, dict) or set(result) - {'regex', 'json_path', 'container'} or \
                ('regex' in result and 'json_path' in result):
            raise WorkloadGateError('%s.result: %r must be a dict with regex or json_path (not both) and optional '
                                    'container' % (where, result))
        if result.get('regex') is not None:
            try:
                re.compile(result['regex'])
            except re.error as exc:
                raise WorkloadGateError('%s.result.regex: %r does not compile: %s' % (where, result['regex'], exc))
        out.append({'name': name, 'manifest': manifest, 'expected': case['expected'], 'tolerance': tol,
                    'tolerance_percent': pct, 'result': dict(result)})
    return out


def node_label(node: str) -> str:
    """The value of the node label on the gate's Jobs: a label value is at most 63 characters and ends
    alphanumeric (node names may be longer)."""
    return re.sub(r'[^A-Za-z0-9]+$', '', node[:63])


def build_job(case: Dict[str, Any], node: str, attempt: int, run_id: str, namespace: str,
              node_selector: Dict[str, str], toleration: Dict[str, Any], timeout: int,
              tolerate_cordon: bool = True, name_suffix: str = '') -> Dict[str, Any]:
    """The Job to create: the user's manifest, renamed, labelled, pinned and bounded. `name_suffix` ends the
    name (the multi-node gate tells apart the Jobs of one attempt on several nodes with it)."""
    job = copy.deepcopy(case['manifest'])
    meta = job.setdefault('metadata', {})
    for k in ('name', 'generateName', 'resourceVersion', 'uid', 'creationTimestamp', 'selfLink', 'managedFields'):
        meta.pop(k, None)
    job.pop('status', None)
    meta['name'] = '%s-%s-%d%s' % (case['name'], run_id, attempt + 1, name_suffix)
    meta['namespace'] = namespace
    labels = {LABEL_RUN: run_id, LABEL_CASE: case['name'], LABEL_NODE: node_label(node)}
    meta['labels'] = dict(meta.get('labels') or {}, **labels)
    spec = job.setdefault('spec', {})
    spec.setdefault('backoffLimit', 0)
    spec['activeDeadlineSeconds'] = min(int(spec.get('activeDeadlineSeconds') or timeout), timeout)
    spec.setdefault('ttlSecondsAfterFinished', 3600)  # a safety net should the cleanup not run
    tmpl = spec.setdefault('template', {})
    tmeta = tmpl.setdefault('metadata', {})
    tmeta['labels'] = dict(tmeta.get('labels') or {}, **labels)
    pspec = tmpl.setdefault('spec', {})
    pspec.pop('nodeName', None)
    pspec['nodeSelector'] = dict(pspec.get('nodeSelector') or {}, **node_selector)
    tols = list(pspec.get('tolerations') or [])
    for tol in (toleration, CORDON_TOLERATION if tolerate_cordon else None):
        if tol and tol not in tols:
            tols.append(dict(tol))
    pspec['tolerations'] = tols
    pspec.setdefault('restartPolicy', 'Never')
    return job


def _walk(doc: Any, path: str) -> Any:
    cur = doc
    for part in [p for p in path.split('.') if p != ''] if path else []:
        if isinstance(cur, list) and re.match(r'^-?\d+$', part):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise KeyError(part)
    return cur


def extract(log: str, result: Dict[str, Any]) -> Tuple[Any, Optional[str]]:
    """(value, error) from a run's log: regex match, JSON path, or the last non-empty line."""
    lines = [ln.strip() for ln in (log or '').splitlines() if ln.strip()]
    if result.get('regex') is not None:
        matches = list(re.finditer(result['regex'], log or '', re.MULTILINE))
        if not matches:
            return None, 'no log line matches %r' % result['regex']
        m = matches[-1]
        if 'value' in m.re.groupindex:
            return m.group('value'), None
        return (m.group(1) if m.re.groups else m.group(0)), None
    if result.get('json_path') is not None:
        for line in reversed(lines):
            if not line.startswith(('{', '[')):
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            try:
                return _walk(doc, result['json_path']), None
            except (KeyError, IndexError):
                return None, 'the JSON result has no %r' % result['json_path']
        return None, 'no JSON line in the log'
    if not lines:
        return None, 'the log is empty'
    return lines[-1], None


def compare(value: Any, expected: Any, tolerance: float = 0, tolerance_percent: float = 0) -> Tuple[bool, str]:
    """(ok, detail). Numbers within max(tolerance, |expected| x tolerance_percent / 100); else equality."""
    if _is_number(expected):
        try:
            got = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            got = None
        if got is None or math.isnan(got):
            return False, 'result %r is not a number (expected %s)' % (value, expected)
        allowed = max(float(tolerance), abs(float(expected)) * float(tolerance_percent) / 100.0)
        diff = abs(got - float(expected))
        ok = diff <= allowed
        return ok, '%s vs expected %s: |difference| %g %s tolerance %g' % (
            value, expected, diff, '<=' if ok else '>', allowed)
    if isinstance(expected, str):
        got_s = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        ok = got_s.strip() == expected.strip()
        return ok, '%r %s expected %r' % (got_s, '==' if ok else '!=', expected)
    ok = value == expected
    return ok, '%r %s expected %r' % (value, '==' if ok else '!=', expected)


def pod_failure(pod: Dict[str, Any]) -> Optional[str]:
    """An initialisation failure seen on a pod, or None."""
    status = pod.get('status') or {}
    name = (pod.get('metadata') or {}).get('name')
    for cs in status.get('initContainerStatuses') or []:
        state = cs.get('state') or {}
        term = state.get('terminated') or {}
        if term and int(term.get('exitCode') or 0) != 0:
            return 'init container %s of pod %s exited %s (%s)' % (cs.get('name'), name, term.get('exitCode'),
                                                                   term.get('reason') or 'Error')
        wait = state.get('waiting') or {}
        if wait.get('reason') in _INIT_WAIT_REASONS:
            detail = (': ' + wait['message']) if wait.get('message') else ''
            return 'init container %s of pod %s: %s%s' % (cs.get('name'), name, wait['reason'], detail)
    for cs in status.get('containerStatuses') or []:
        wait = (cs.get('state') or {}).get('waiting') or {}
        if wait.get('reason') in _INIT_WAIT_REASONS:
            return 'container %s of pod %s did not start: %s%s' % (cs.get('name'), name, wait['reason'],
                                                                   (': ' + wait['message']) if wait.get('message') else '')
    return None


def _job_state(job: Dict[str, Any]) -> Optional[str]:
    for c in ((job.get('status') or {}).get('conditions') or []):
        if c.get('status') == 'True' and c.get('type') in ('Complete', 'Failed'):
            return c['type']
    return None


def _job_reason(job: Dict[str, Any]) -> str:
    for c in ((job.get('status') or {}).get('conditions') or []):
        if c.get('status') == 'True' and c.get('type') == 'Failed':
            return '%s%s' % (c.get('reason') or 'Failed', (': ' + c['message']) if c.get('message') else '')
    return 'Failed'


def _deadline_exceeded(job: Dict[str, Any]) -> bool:
    """Pure: the Job failed because its activeDeadlineSeconds passed (reason DeadlineExceeded)."""
    return any(c.get('status') == 'True' and c.get('type') == 'Failed' and c.get('reason') == 'DeadlineExceeded'
               for c in ((job.get('status') or {}).get('conditions') or []))


def _quote(s: str) -> str:
    from urllib.parse import quote
    return quote(s, safe='')


def read_log(k8s: Any, namespace: str, pod: str, container: Optional[str]) -> str:
    """GET .../pods/<pod>/log as text, one request bounded by the client's request timeout."""
    path = '/api/v1/namespaces/%s/pods/%s/log' % (_quote(namespace), _quote(pod))
    return k8s.request('GET', path, {'container': container} if container else None, text=True)


# -- the Jobs of an earlier run (T3-17) -------------------------------------------------------------

def stale_jobs(jobs: List[Dict[str, Any]], nodes: List[str], run_id: str) -> Dict[str, List[Dict[str, Any]]]:
    """Pure: the gate's Jobs among `jobs` that an earlier run left unfinished on one of `nodes` (another
    run id; no Complete or Failed condition), by node. A finished Job holds no GPU and is left to its
    ttlSecondsAfterFinished (or kept, as O(cleanup=false) asked); Jobs of other nodes are not this gate's."""
    by_label = {node_label(node): node for node in nodes}
    out: Dict[str, List[Dict[str, Any]]] = {node: [] for node in nodes}
    for job in jobs:
        labels = (job.get('metadata') or {}).get('labels') or {}
        node = by_label.get(labels.get(LABEL_NODE))
        if node is None or labels.get(LABEL_RUN) in (None, run_id) or _job_state(job):
            continue
        out[node].append(job)
    return out


def clear_stale(k8s: Any, namespace: str, nodes: List[str], run_id: str, timeout: float,
                poll_interval: float, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> Dict[str, Dict[str, Any]]:
    """Delete the unfinished Jobs an earlier run of the gate left on `nodes` (stale_jobs) and their pods, then
    wait, at most `timeout` seconds, until those pods are gone. By node: {deleted: [Job names], problem: str
    or None}; a problem (a request refused, pods still there at the deadline) names the Jobs to delete by hand."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError, NotFoundError, path_for
    out: Dict[str, Dict[str, Any]] = {node: {'deleted': [], 'problem': None} for node in nodes}
    jobs_path = path_for('batch/v1', 'jobs', namespace=namespace)
    pods_path = path_for('v1', 'pods', namespace=namespace)
    selector = {'labelSelector': LABEL_RUN}
    try:
        stale = stale_jobs(k8s.list_all(jobs_path, selector), nodes, run_id)
    except K8sError as exc:
        for node in nodes:
            out[node]['problem'] = 'could not list the Jobs of earlier workload gate runs: %s' % exc
        return out
    owner: Dict[str, str] = {}      # a stale Job's uid -> its node
    for node, jobs in stale.items():
        for job in jobs:
            meta = job.get('metadata') or {}
            try:
                k8s.delete(path_for('batch/v1', 'jobs', meta.get('name'), namespace),
                           {'apiVersion': 'v1', 'kind': 'DeleteOptions', 'propagationPolicy': 'Background',
                            'preconditions': {'uid': meta.get('uid')}})
            except NotFoundError:
                pass
            except K8sError as exc:
                out[node]['problem'] = 'could not delete Job %s of an earlier run: %s' % (meta.get('name'), exc)
                continue
            out[node]['deleted'].append(meta.get('name'))
            owner[meta.get('uid')] = node
    if not owner:
        return out

    def remaining() -> Dict[str, List[str]]:
        """Delete the pods the stale Jobs own (force: gracePeriodSeconds 0) and name those still listed."""
        left: Dict[str, List[str]] = {}
        for pod in k8s.list_all(pods_path, selector):
            meta = pod.get('metadata') or {}
            node = next((owner[ref.get('uid')] for ref in meta.get('ownerReferences') or [] if ref.get('uid') in owner),
                        None)
            if node is None:
                continue
            left.setdefault(node, []).append(meta.get('name'))
            if not meta.get('deletionTimestamp'):
                try:
                    k8s.delete(path_for('v1', 'pods', meta.get('name'), namespace),
                               {'apiVersion': 'v1', 'kind': 'DeleteOptions', 'gracePeriodSeconds': 0})
                except NotFoundError:
                    pass
        return left

    try:
        polled = poll(remaining, timeout, poll_interval, clock, sleep, done=lambda left: not left)
        left = polled.value
    except K8sError as exc:
        left = {node: ['(unknown: %s)' % exc] for node in set(owner.values())}
    for node, pods in left.items():
        out[node]['problem'] = out[node]['problem'] or (
            'the pods %s of Job(s) %s of an earlier run were still there after %gs: delete them by hand (label %s)'
            % (', '.join(pods), ', '.join(out[node]['deleted']), timeout, LABEL_RUN))
    return out


def run_gate(k8s: Any, node: str, cases: List[Dict[str, Any]], namespace: str = 'default', repeat: int = 3,
             node_selector: Optional[Dict[str, str]] = None, toleration: Optional[Dict[str, Any]] = None,
             timeout: int = 600, poll_interval: float = 2.0, cleanup: bool = True, tolerate_cordon: bool = True,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
             log_reader: Callable[..., str] = read_log) -> Dict[str, Any]:
    """Run every case `repeat` times on the node; return {passed, msg, problems, checks, jobs}."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError, NotFoundError, path_for
    if node_selector is None:
        node_selector = {'kubernetes.io/hostname': node}
    if toleration is None:
        toleration = dict(DEFAULT_TOLERATION)
    run_id = uuid.uuid4().hex[:6]
    checks: Dict[str, Dict[str, Any]] = {}
    created: List[str] = []
    deleted: List[str] = []
    left: List[str] = []
    stale = clear_stale(k8s, namespace, [node], run_id, timeout, poll_interval, clock, sleep)[node]
    if stale['problem']:
        # The earlier run's pods would hold the node's GPUs: no case is run.
        return _node_result(node, len(cases), repeat, checks, run_id, (created, deleted, left), cleanup, stale)
    for case in cases:
        runs: List[Dict[str, Any]] = []
        for attempt in range(repeat):
            job = build_job(case, node, attempt, run_id, namespace, node_selector, toleration, timeout,
                            tolerate_cordon)
            jname = job['metadata']['name']
            run: Dict[str, Any] = {'attempt': attempt + 1, 'job': jname, 'pod': None, 'node': None, 'outcome': None,
                                   'value': None, 'expected': case['expected'], 'ok': False}
            start = clock()
            try:
                k8s.post(path_for('batch/v1', 'jobs', namespace=namespace), job)
                created.append(jname)
                run.update(_watch(k8s, namespace, jname, node, case, timeout, poll_interval, clock, sleep,
                                  log_reader, NotFoundError))
            except K8sError as exc:
                run.update(outcome='error', detail=str(exc))
            finally:
                run['seconds'] = round(clock() - start, 3)
                if cleanup and jname in created:
                    try:
                        _delete_job(k8s, namespace, jname, NotFoundError, path_for)
                        deleted.append(jname)
                    except K8sError as exc:
                        left.append(jname)
                        run.setdefault('cleanup_error', str(exc))
            runs.append(run)
        checks[case['name']] = _check(case, runs, repeat)
    return _node_result(node, len(cases), repeat, checks, run_id, (created, deleted, left), cleanup, stale)


def _check(case: Dict[str, Any], runs: List[Dict[str, Any]], repeat: int) -> Dict[str, Any]:
    """A case's entry of `checks`: passed, one problem line per failed run, and the evidence."""
    problems = ['%s run %d/%d (Job %s): %s' % (case['name'], run['attempt'], repeat, run['job'],
                                               run.get('detail') or run['outcome'])
                for run in runs if not run['ok']]
    return {'passed': not problems, 'problems': problems,
            'not_run': len([run for run in runs if run.get('outcome') == 'busy']),
            'evidence': {'expected': case['expected'], 'tolerance': case['tolerance'],
                         'tolerance_percent': case['tolerance_percent'], 'result': case['result'], 'runs': runs}}


def _node_result(node: str, case_count: int, repeat: int, checks: Dict[str, Dict[str, Any]], run_id: str,
                 jobs: Tuple[List[str], List[str], List[str]], cleanup: bool,
                 stale: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One node's verdict: {node, passed, msg, problems, checks, run_id, jobs, stale_jobs}; `jobs` is (created,
    deleted, left); `stale` what clear_stale did on the node."""
    created, deleted, left = jobs
    stale = stale or {'deleted': [], 'problem': None}
    problems = ([stale['problem']] if stale['problem'] else []) + [
        line for check in checks.values() for line in check['problems']]
    if left:
        problems.append('could not delete Job(s) %s: delete them by hand (label %s=%s)' % (
            ', '.join(left), LABEL_RUN, run_id))
    passed = not problems
    busy = sorted(name for name, check in checks.items() if check.get('not_run'))
    msg = ('workload gate: PASS on %s (%d case(s) x %d run(s))' % (node, case_count, repeat) if passed
           else 'workload gate: FAIL on %s: %s' % (node, '; '.join(problems)))
    if passed and busy:
        msg += '; not run for lack of a free GPU (its tenants hold them): %s' % ', '.join(busy)
    return {'node': node, 'passed': passed, 'msg': msg, 'problems': problems, 'checks': checks, 'busy': busy,
            'run_id': run_id, 'jobs': {'created': created, 'deleted': deleted, 'left': left if cleanup else created},
            'stale_jobs': list(stale['deleted'])}


_NO_FREE_GPU_RE = re.compile(r'\b\d+ Insufficient (nvidia\.com/[A-Za-z0-9._-]+)')


def no_free_gpu(pod: Optional[Dict[str, Any]]) -> Optional[str]:
    """Pure: the scheduler's message when the pod, pinned to its node, waits because every GPU of that node is
    allocated (PodScheduled False, Unschedulable, "Insufficient nvidia.com/..."); None otherwise. The pod's
    node selector matches its node only, so the scheduler's "Insufficient" count is that node's."""
    for cond in (((pod or {}).get('status') or {}).get('conditions') or []):
        if (cond.get('type') == 'PodScheduled' and cond.get('status') == 'False' and cond.get('reason') == 'Unschedulable'
                and _NO_FREE_GPU_RE.search(str(cond.get('message') or ''))):
            return str(cond.get('message'))
    return None


def observe(job: Dict[str, Any], pods: List[Dict[str, Any]], node: str,
            busy_skip: bool = False) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """Pure: (the Job's newest pod among `pods`, or None; what it shows). What it shows: the pod's name and node
    and, for a pod on another node or failing to start, an outcome (V(misplaced), V(init_failure)) and a detail.
    With `busy_skip`, a pod that waits because every GPU of its node is allocated (no_free_gpu) shows the outcome
    V(busy): the run is not made, and that is no failure of the node (its tenants hold its GPUs)."""
    uid = (job.get('metadata') or {}).get('uid')
    owned = [candidate for candidate in pods
             if any(ref.get('uid') == uid for ref in ((candidate.get('metadata') or {}).get('ownerReferences') or []))]
    if not owned:
        return None, {}
    owned.sort(key=lambda candidate: (candidate.get('metadata') or {}).get('creationTimestamp') or '')
    pod = owned[-1]
    seen: Dict[str, Any] = {'pod': (pod.get('metadata') or {}).get('name'), 'node': (pod.get('spec') or {}).get('nodeName')}
    if seen['node'] and seen['node'] != node:
        seen.update(outcome='misplaced', detail='pod %s ran on node %s, not %s' % (seen['pod'], seen['node'], node))
    else:
        failure = pod_failure(pod)
        busy = no_free_gpu(pod) if busy_skip and not seen['node'] else None
        if failure:
            seen.update(outcome='init_failure', detail='initialisation failure: ' + failure)
        elif busy:
            seen.update(outcome='busy', ok=True, detail='not run: no free GPU on the node (%s)' % busy)
    return pod, seen


def judge(job: Dict[str, Any], pod: Optional[Dict[str, Any]], finished: bool, log: str, case: Dict[str, Any],
          timeout: int) -> Dict[str, Any]:
    """Pure: the verdict on a run whose wait ended without a misplaced pod or an initialisation failure.

    Not `finished`, or failed by the Job controller for its C(activeDeadlineSeconds) (which is `timeout`, or
    shorter; the controller may see it pass before our own wait does): a timeout, naming why the pod is
    unschedulable, if it is. Finished otherwise: the Job's failure, or the result read from `log` and compared with
    the case's expected value."""
    out: Dict[str, Any] = {}
    if not finished or _deadline_exceeded(job):
        sched = ''
        for cond in (((pod or {}).get('status') or {}).get('conditions') or []):
            if cond.get('type') == 'PodScheduled' and cond.get('status') == 'False':
                sched = ' (pod unschedulable: %s)' % (cond.get('message') or cond.get('reason'))
        out.update(outcome='timeout', detail='timeout: the Job did not finish within %ds%s' % (timeout, sched))
        return out
    out['log_tail'] = log[-_LOG_TAIL:]
    if _job_state(job) == 'Failed':
        out.update(outcome='failed', detail='the Job failed (%s)%s' % (
            _job_reason(job), ('; last log line: %s' % log.strip().splitlines()[-1]) if log.strip() else ''))
        return out
    value, err = extract(log, case['result'])
    out['value'] = value
    if err:
        out.update(outcome='no_result', detail='no result: ' + err)
        return out
    ok, detail = compare(value, case['expected'], case['tolerance'], case['tolerance_percent'])
    out.update(outcome='match' if ok else 'mismatch', ok=ok, detail=('' if ok else 'result mismatch: ') + detail)
    return out


def _read_log_or_empty(k8s: Any, namespace: str, pod: Optional[str], case: Dict[str, Any],
                       log_reader: Callable[..., str], not_found: type) -> str:
    if pod is None:
        return ''
    try:
        return log_reader(k8s, namespace, pod, case['result'].get('container'))
    except not_found:
        return ''


def _watch(k8s: Any, namespace: str, jname: str, node: str, case: Dict[str, Any], timeout: int,
           poll_interval: float, clock: Callable[[], float], sleep: Callable[[float], None],
           log_reader: Callable[..., str], not_found: type) -> Dict[str, Any]:
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import path_for
    job_path = path_for('batch/v1', 'jobs', jname, namespace)
    out: Dict[str, Any] = {}
    newest: List[Optional[Dict[str, Any]]] = [None]

    def look() -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], Optional[str]]:
        """One look: (the Job, the newest pod seen so far or None, the Job's final state or None);
        a pod on another node or failing to start sets out's outcome, which ends the wait."""
        job = k8s.get(job_path)
        pods = k8s.list_all(path_for('v1', 'pods', namespace=namespace),
                            {'labelSelector': '%s=%s' % (LABEL_CASE, case['name'])})
        pod, seen = observe(job, pods, node)
        if pod is not None:
            newest[0] = pod
        out.update(seen)
        return job, newest[0], _job_state(job)

    polled = poll(look, timeout, poll_interval, clock, sleep, done=lambda seen: seen[2] or 'outcome' in out)
    job, pod = polled.value[0], polled.value[1]
    if 'outcome' in out:
        return out
    log = _read_log_or_empty(k8s, namespace, out.get('pod'), case, log_reader, not_found) if polled.done else ''
    out.update(judge(job, pod, polled.done, log, case, timeout))
    return out


def _delete_job(k8s: Any, namespace: str, jname: str, not_found: type, path_for: Callable[..., str]) -> None:
    """Delete the Job and its pods (Background propagation; the pods too, in case no GC runs)."""
    try:
        job = k8s.get(path_for('batch/v1', 'jobs', jname, namespace))
    except not_found:
        return
    uid = (job.get('metadata') or {}).get('uid')
    try:
        k8s.delete(path_for('batch/v1', 'jobs', jname, namespace),
                   {'apiVersion': 'v1', 'kind': 'DeleteOptions', 'propagationPolicy': 'Background'})
    except not_found:
        pass
    case = ((job.get('metadata') or {}).get('labels') or {}).get(LABEL_CASE, '')
    for p in k8s.list_all(path_for('v1', 'pods', namespace=namespace), {'labelSelector': '%s=%s' % (LABEL_CASE, case)}):
        if any(r.get('uid') == uid for r in ((p.get('metadata') or {}).get('ownerReferences') or [])):
            try:
                k8s.delete(path_for('v1', 'pods', p['metadata']['name'], namespace),
                           {'apiVersion': 'v1', 'kind': 'DeleteOptions', 'gracePeriodSeconds': 0})
            except not_found:
                pass


# -- the multi-node gate ---------------------------------------------------------------------------

def normalize_nodes(nodes: Any) -> List[str]:
    """Check the node names of the multi-node gate: a non-empty list of distinct, non-blank names."""
    if not isinstance(nodes, list) or not nodes:
        raise WorkloadGateError('nodes: %r is not a non-empty list of node names' % (nodes,))
    seen = set()
    for index, name in enumerate(nodes):
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise WorkloadGateError('nodes[%d]: %r is not a node name' % (index, name))
        if name in seen:
            raise WorkloadGateError('nodes[%d]: %r repeats an earlier node' % (index, name))
        seen.add(name)
    return list(nodes)


def run_gate_nodes(k8s: Any, nodes: List[str], cases: List[Dict[str, Any]], namespace: str = 'default',
                   repeat: int = 3, toleration: Optional[Dict[str, Any]] = None, timeout: int = 600,
                   poll_interval: float = 2.0, cleanup: bool = True, tolerate_cordon: bool = True,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                   log_reader: Callable[..., str] = read_log, busy: str = 'fail') -> Dict[str, Any]:
    """Run every case `repeat` times on every node at once: each attempt's Job is created on all the nodes
    (each pinned by C(kubernetes.io/hostname)), then all are watched together, one LIST of the run's Jobs and
    one LIST of its pods per poll whatever the number of nodes, for at most `timeout` seconds, and deleted.

    Returns {passed, msg, problems, nodes: {node: what run_gate returns for it}, failed_nodes, run_id,
    jobs: {created, deleted, left}}.

    `busy`: V(fail) (a run that cannot be scheduled waits out `timeout` and fails) or V(skip) (a run whose pod
    waits because every GPU of its node is allocated is not made and fails nothing: the node's result lists
    the case under `busy`; nodes in service, as an observation window re-gates them)."""
    if busy not in ('fail', 'skip'):
        raise WorkloadGateError('busy: %r is not fail or skip' % (busy,))
    gate = _NodesGate(k8s, normalize_nodes(nodes), namespace, repeat,
                      dict(DEFAULT_TOLERATION) if toleration is None else toleration,
                      timeout, poll_interval, cleanup, tolerate_cordon, clock, sleep, log_reader)
    gate.busy_skip = busy == 'skip'
    return gate.run(cases)


class _NodesGate:
    """The state of one multi-node gate run (see run_gate_nodes)."""

    def __init__(self, k8s: Any, nodes: List[str], namespace: str, repeat: int, toleration: Dict[str, Any],
                 timeout: int, poll_interval: float, cleanup: bool, tolerate_cordon: bool,
                 clock: Callable[[], float], sleep: Callable[[float], None], log_reader: Callable[..., str]) -> None:
        from ansible_collections.gpufleet.upgrade.plugins.module_utils import _k8s
        self.k8s = k8s
        self.nodes = nodes
        self.namespace = namespace
        self.repeat = repeat
        self.toleration = toleration
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.cleanup = cleanup
        self.tolerate_cordon = tolerate_cordon
        self.clock = clock
        self.sleep = sleep
        self.log_reader = log_reader
        self.k8s_error: type = _k8s.K8sError
        self.not_found: type = _k8s.NotFoundError
        self.path_for = _k8s.path_for
        self.jobs_path = _k8s.path_for('batch/v1', 'jobs', namespace=namespace)
        self.pods_path = _k8s.path_for('v1', 'pods', namespace=namespace)
        self.run_id = uuid.uuid4().hex[:6]
        # every Job name by node: created, deleted, left; and all of them in creation order
        self.created: Dict[str, List[str]] = {node: [] for node in nodes}
        self.deleted: Dict[str, List[str]] = {node: [] for node in nodes}
        self.left: Dict[str, List[str]] = {node: [] for node in nodes}
        self.all_jobs: Tuple[List[str], List[str], List[str]] = ([], [], [])
        self.busy_skip = False

    def run(self, cases: List[Dict[str, Any]]) -> Dict[str, Any]:
        checks: Dict[str, Dict[str, Dict[str, Any]]] = {node: {} for node in self.nodes}
        stale = clear_stale(self.k8s, self.namespace, self.nodes, self.run_id, self.timeout, self.poll_interval,
                            self.clock, self.sleep)
        for case in cases:
            runs: Dict[str, List[Dict[str, Any]]] = {node: [] for node in self.nodes}
            for attempt in range(self.repeat):
                for node, run in self._attempt(case, attempt).items():
                    runs[node].append(run)
            for node in self.nodes:
                checks[node][case['name']] = _check(case, runs[node], self.repeat)
        results = {node: _node_result(node, len(cases), self.repeat, checks[node], self.run_id,
                                      (self.created[node], self.deleted[node], self.left[node]), self.cleanup,
                                      stale[node])
                   for node in self.nodes}
        failed = [node for node in self.nodes if not results[node]['passed']]
        problems = ['%s: %s' % (node, line) for node in self.nodes for line in results[node]['problems']]
        busy = [node for node in self.nodes if results[node]['busy']]
        if not problems:
            msg = 'workload gate: PASS on %d node(s) (%s) (%d case(s) x %d run(s))' % (
                len(self.nodes), ', '.join(self.nodes), len(cases), self.repeat)
            if busy:
                msg += '; not run on %s for lack of a free GPU' % ', '.join(busy)
        else:
            msg = 'workload gate: FAIL on %d of %d node(s) (%s): %s' % (
                len(failed), len(self.nodes), ', '.join(failed), '; '.join(problems))
        created, deleted, left = self.all_jobs
        return {'passed': not problems, 'msg': msg, 'problems': problems, 'nodes': results, 'failed_nodes': failed,
                'busy_nodes': busy,
                'run_id': self.run_id, 'jobs': {'created': created, 'deleted': deleted,
                                                'left': left if self.cleanup else created},
                'stale_jobs': [name for node in self.nodes for name in stale[node]['deleted']]}

    def _attempt(self, case: Dict[str, Any], attempt: int) -> Dict[str, Dict[str, Any]]:
        """One attempt of a case on every node: create, watch together, judge, clean up. The run of each node."""
        selector = {'labelSelector': '%s=%s,%s=%s' % (LABEL_RUN, self.run_id, LABEL_CASE, case['name'])}
        start = self.clock()
        runs: Dict[str, Dict[str, Any]] = {}
        names: Dict[str, str] = {}   # the node's Job, once created
        for index, node in enumerate(self.nodes):
            job = build_job(case, node, attempt, self.run_id, self.namespace, {'kubernetes.io/hostname': node},
                            self.toleration, self.timeout, self.tolerate_cordon, name_suffix='-%d' % (index + 1))
            jname = job['metadata']['name']
            runs[node] = {'attempt': attempt + 1, 'job': jname, 'pod': None, 'node': None, 'outcome': None,
                          'value': None, 'expected': case['expected'], 'ok': False}
            try:
                self.k8s.post(self.jobs_path, job)
            except self.k8s_error as exc:
                runs[node].update(outcome='error', detail=str(exc), seconds=round(self.clock() - start, 3))
                continue
            names[node] = jname
            self.created[node].append(jname)
            self.all_jobs[0].append(jname)
        seen: Dict[str, Dict[str, Any]] = {node: {'job': None, 'pod': None, 'settled': False} for node in names}
        if names:
            self._watch(selector, start, runs, names, seen)
            self._judge(case, start, runs, names, seen)
            if self.cleanup:
                self._cleanup(selector, runs, names, seen)
        return runs

    def _watch(self, selector: Dict[str, str], start: float, runs: Dict[str, Dict[str, Any]], names: Dict[str, str],
               seen: Dict[str, Dict[str, Any]]) -> None:
        """Wait, at most `timeout` seconds, until every node's Job has finished, or shows a misplaced pod or an
        initialisation failure: one LIST of Jobs and one LIST of pods per look, for all the nodes."""

        def settle(node: str, now: float) -> None:
            seen[node]['settled'] = True
            runs[node]['seconds'] = round(now - start, 3)

        def look() -> bool:
            jobs = {(listed.get('metadata') or {}).get('name'): listed
                    for listed in self.k8s.list_all(self.jobs_path, selector)}
            pods = self.k8s.list_all(self.pods_path, selector)
            now = self.clock()
            for node, jname in names.items():
                if seen[node]['settled']:
                    continue
                job = jobs.get(jname)
                if job is None:
                    runs[node].update(outcome='error', detail='the Job %s is gone: it was deleted before it finished'
                                      % jname)
                    settle(node, now)
                    continue
                seen[node]['job'] = job
                pod, shown = observe(job, pods, node, self.busy_skip)
                if pod is not None:
                    seen[node]['pod'] = pod
                runs[node].update(shown)
                if 'outcome' in shown or _job_state(job):
                    settle(node, now)
            return all(seen[node]['settled'] for node in names)

        try:
            poll(look, self.timeout, self.poll_interval, self.clock, self.sleep)
        except self.k8s_error as exc:
            for node in names:
                if not seen[node]['settled']:
                    runs[node].update(outcome='error', detail=str(exc))
                    settle(node, self.clock())

    def _judge(self, case: Dict[str, Any], start: float, runs: Dict[str, Dict[str, Any]], names: Dict[str, str],
               seen: Dict[str, Dict[str, Any]]) -> None:
        """The verdict of every run the wait did not already decide: its log read (one request per finished pod),
        then judge()."""
        for node in names:
            run = runs[node]
            if run['outcome'] is not None:
                continue
            finished = seen[node]['settled']
            try:
                log = _read_log_or_empty(self.k8s, self.namespace, run['pod'], case, self.log_reader,
                                         self.not_found) if finished else ''
            except self.k8s_error as exc:
                run.update(outcome='error', detail=str(exc))
                continue
            run.update(judge(seen[node]['job'] or {}, seen[node]['pod'], finished, log, case, self.timeout))
            if not finished:
                run['seconds'] = round(self.clock() - start, 3)

    def _cleanup(self, selector: Dict[str, str], runs: Dict[str, Dict[str, Any]], names: Dict[str, str],
                 seen: Dict[str, Dict[str, Any]]) -> None:
        """Delete the attempt's Jobs (Background propagation) and their pods (one LIST of the run's pods)."""
        uids: Dict[str, str] = {}     # node -> the uid of its deleted Job
        for node, jname in names.items():
            path = self.path_for('batch/v1', 'jobs', jname, self.namespace)
            try:
                uid = ((seen[node]['job'] or {}).get('metadata') or {}).get('uid')
                if uid is None:
                    uid = (self.k8s.get(path).get('metadata') or {}).get('uid')
                self.k8s.delete(path, {'apiVersion': 'v1', 'kind': 'DeleteOptions', 'propagationPolicy': 'Background'})
            except self.not_found:
                pass
            except self.k8s_error as exc:
                runs[node].setdefault('cleanup_error', str(exc))
                continue
            if uid:
                uids[node] = uid
        if uids:
            try:
                pods = self.k8s.list_all(self.pods_path, selector)
            except self.k8s_error as exc:
                pods = []
                for node in uids:
                    runs[node].setdefault('cleanup_error', str(exc))
            for pod in pods:
                meta = pod.get('metadata') or {}
                owners = {ref.get('uid') for ref in meta.get('ownerReferences') or []}
                owner = next((node for node, uid in uids.items() if uid in owners), None)
                if owner is None or 'cleanup_error' in runs[owner]:
                    continue
                try:
                    self.k8s.delete(self.path_for('v1', 'pods', meta['name'], self.namespace),
                                    {'apiVersion': 'v1', 'kind': 'DeleteOptions', 'gracePeriodSeconds': 0})
                except self.not_found:
                    pass
                except self.k8s_error as exc:
                    runs[owner].setdefault('cleanup_error', str(exc))
        for node, jname in names.items():
            done = 'cleanup_error' not in runs[node]
            (self.deleted if done else self.left)[node].append(jname)
            self.all_jobs[1 if done else 2].append(jname)
