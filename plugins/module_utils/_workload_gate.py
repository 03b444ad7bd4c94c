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
together with its pods.

Pure helpers (build_job, extract, compare, pod_failure) are tested alone. `run_gate` drives them
over the collection's K8sClient.
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

__all__ = ['DEFAULT_TOLERATION', 'WorkloadGateError', 'build_job', 'compare', 'extract', 'normalize_cases',
           'pod_failure', 'run_gate']

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


def build_job(case: Dict[str, Any], node: str, attempt: int, run_id: str, namespace: str,
              node_selector: Dict[str, str], toleration: Dict[str, Any], timeout: int,
              tolerate_cordon: bool = True) -> Dict[str, Any]:
    """The Job to create: the user's manifest, renamed, labelled, pinned and bounded."""
    job = copy.deepcopy(case['manifest'])
    meta = job.setdefault('metadata', {})
    for k in ('name', 'generateName', 'resourceVersion', 'uid', 'creationTimestamp', 'selfLink', 'managedFields'):
        meta.pop(k, None)
    job.pop('status', None)
    meta['name'] = '%s-%s-%d' % (case['name'], run_id, attempt + 1)
    meta['namespace'] = namespace
    # A label value is at most 63 characters and ends alphanumeric (node names may be longer).
    labels = {LABEL_RUN: run_id, LABEL_CASE: case['name'], LABEL_NODE: re.sub(r'[^A-Za-z0-9]+$', '', node[:63])}
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


def _quote(s: str) -> str:
    from urllib.parse import quote
    return quote(s, safe='')


def read_log(k8s: Any, namespace: str, pod: str, container: Optional[str]) -> str:
    """GET .../pods/<pod>/log as text, one request bounded by the client's request timeout."""
    path = '/api/v1/namespaces/%s/pods/%s/log' % (_quote(namespace), _quote(pod))
    return k8s.request('GET', path, {'container': container} if container else None, text=True)


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
    for case in cases:
        runs: List[Dict[str, Any]] = []
        problems: List[str] = []
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
            if not run['ok']:
                problems.append('%s run %d/%d (Job %s): %s' % (case['name'], attempt + 1, repeat, jname,
                                                               run.get('detail') or run['outcome']))
            runs.append(run)
        checks[case['name']] = {'passed': not problems, 'problems': problems,
                                'evidence': {'expected': case['expected'], 'tolerance': case['tolerance'],
                                             'tolerance_percent': case['tolerance_percent'],
                                             'result': case['result'], 'runs': runs}}
    problems = [p for c in checks.values() for p in c['problems']]
    if left:
        problems.append('could not delete Job(s) %s: delete them by hand (label %s=%s)' % (
            ', '.join(left), LABEL_RUN, run_id))
    passed = not problems
    msg = ('workload gate: PASS on %s (%d case(s) x %d run(s))' % (node, len(cases), repeat) if passed
           else 'workload gate: FAIL on %s: %s' % (node, '; '.join(problems)))
    return {'node': node, 'passed': passed, 'msg': msg, 'problems': problems, 'checks': checks,
            'run_id': run_id, 'jobs': {'created': created, 'deleted': deleted, 'left': left if cleanup else created}}


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
        uid = (job.get('metadata') or {}).get('uid')
        pods = [p for p in k8s.list_all(path_for('v1', 'pods', namespace=namespace),
                                        {'labelSelector': '%s=%s' % (LABEL_CASE, case['name'])})
                if any(r.get('uid') == uid for r in ((p.get('metadata') or {}).get('ownerReferences') or []))]
        pods.sort(key=lambda p: (p.get('metadata') or {}).get('creationTimestamp') or '')
        pod = newest[0] = pods[-1] if pods else newest[0]
        if pods:
            out['pod'] = (pod.get('metadata') or {}).get('name')
            out['node'] = (pod.get('spec') or {}).get('nodeName')
            if out['node'] and out['node'] != node:
                out.update(outcome='misplaced', detail='pod %s ran on node %s, not %s' % (out['pod'], out['node'], node))
            else:
                failure = pod_failure(pod)
                if failure:
                    out.update(outcome='init_failure', detail='initialisation failure: ' + failure)
        return job, pod, _job_state(job)

    polled = poll(look, timeout, poll_interval, clock, sleep, done=lambda seen: seen[2] or 'outcome' in out)
    job, pod, state = polled.value
    if 'outcome' in out:
        return out
    if not polled.done:
        sched = ''
        for c in (((pod or {}).get('status') or {}).get('conditions') or []):
            if c.get('type') == 'PodScheduled' and c.get('status') == 'False':
                sched = ' (pod unschedulable: %s)' % (c.get('message') or c.get('reason'))
        out.update(outcome='timeout', detail='timeout: the Job did not finish within %ds%s' % (timeout, sched))
        return out
    log = ''
    if pod is not None:
        try:
            log = log_reader(k8s, namespace, out['pod'], case['result'].get('container'))
        except not_found:
            log = ''
    out['log_tail'] = log[-_LOG_TAIL:]
    if state == 'Failed':
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
