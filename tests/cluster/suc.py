"""A stand-in for Rancher's system-upgrade-controller (SUC) on the test control plane.

SUC's Go module (github.com/rancher/system-upgrade-controller) is refused by the Go module proxy
(403 "This module version is not available"), so it cannot be built like the other components.
This stand-in plays its controller loop through the real API, after SUC's own code
(pkg/upgrade/handle_upgrade.go, handle_batch.go, job/job.go, plan/plan.go):

- a Plan (upgrade.cattle.io/v1) with a `version` selects the Nodes its `nodeSelector` matches
  (and that have kubernetes.io/hostname) whose label `plan.upgrade.cattle.io/<plan>` is neither
  "disabled" nor the Plan's `latestHash`, at most `concurrency` at a time (in name order; SUC
  orders candidates by a hash), and never while another exclusive Plan is applying;
- the upgrade of each selected node is a REAL batch/v1 Job in the Plan's namespace, as SUC builds
  it: named `apply-<plan>-on-<node>-with-<hash>` (shortened as SUC's SafeConcatName does),
  labelled upgrade.cattle.io/{controller,exclusive,node,plan,version} and
  plan.upgrade.cattle.io/<plan>=<hash>, pinned to the node by required node affinity on
  kubernetes.io/hostname, tolerating node.kubernetes.io/unschedulable:NoSchedule (plus the Plan's
  tolerations), with SUC's pod anti-affinity; the scheduler places its pod, the Job controller
  runs it and KWOK plays it (it completes after `delay`; a `fail` node's pod is annotated
  gpufleet.test/exit-code so KWOK fails it; a `hold` node's pod runs for a day). The stand-in does
  not run the upgrade image, cordon or drain; backoffLimit is 0 (SUC's default is 2) so a failure
  is final at once;
- when a node's Job completes: the node's status.nodeInfo.kubeletVersion becomes the Plan's
  version (status subresource: what the upgraded kubelet reports), the node gets the plan label,
  and a cordoned node is uncordoned when the Plan has `cordon` or `drain` (as SUC does); when it
  fails: the Plan's Complete condition turns False with reason JobFailed and SUC's message;
- Plan status as SUC writes it: conditions Validated (PlanIsValid), LatestResolved (Version),
  Complete (SyncJob, Complete, JobFailed), `latestVersion` (`+` as `-`), `latestHash` (SHA-224 of
  the version and service account, as SUC), `applying`.

    with SucStandIn(cluster, delay=0.3, hold={'gpu-2'}, fail=()) as suc:
        ...
        suc.log   # [{'event': 'start' | 'finish' | 'fail', 'plan': 'ns/name', 'node', 'version', 'unschedulable'}]

`hold` and `fail` are mutable sets, read when a node's Job is created. The stand-in talks to the API
server directly (as the setup identity), so its requests are not in `cluster.requests`.
"""
from __future__ import annotations

import copy
import hashlib
import time
from typing import Any

from .background import Background
from .client import ApiError

CONTROLLER = 'system-upgrade-controller'
GROUP = 'upgrade.cattle.io'
PLAN_API = GROUP + '/v1'
LABEL_CONTROLLER = GROUP + '/controller'
LABEL_EXCLUSIVE = GROUP + '/exclusive'
LABEL_NODE = GROUP + '/node'
LABEL_PLAN = GROUP + '/plan'
LABEL_VERSION = GROUP + '/version'
PLAN_LABEL_PREFIX = 'plan.' + GROUP + '/'
HOSTNAME = 'kubernetes.io/hostname'
TTL_SECONDS = 900
HOLD_RUN_TIME = '24h'


def safe_concat_name(*parts: str) -> str:
    """wrangler's name.SafeConcatName: joined with '-', shortened to 63 characters with a hash."""
    full = '-'.join(parts)
    if len(full) < 64:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()
    c = full[56]
    if 'a' <= c <= 'z' or '0' <= c <= '9':
        return full[:57] + '-' + digest[:5]
    return full[:56] + '-' + digest[:6]


def plan_hash(plan: dict[str, Any], latest: str) -> str:
    spec = plan.get('spec') or {}
    return hashlib.sha224((latest + (spec.get('serviceAccountName') or '')).encode()).hexdigest()


def _now() -> str:
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())


def set_condition(conds: list[dict], ctype: str, status: str, reason: str, message: str = '') -> list[dict]:
    now = _now()
    out, found = [], False
    for c in conds:
        if c.get('type') == ctype:
            found = True
            same = c.get('status') == status
            c = dict(c, status=status, reason=reason, message=message, lastUpdateTime=now)
            if not same:
                c['lastTransitionTime'] = now
        out.append(c)
    if not found:
        out.append({'type': ctype, 'status': status, 'reason': reason, 'message': message,
                    'lastUpdateTime': now, 'lastTransitionTime': now})
    return out


def _cond(obj: dict, ctype: str) -> dict:
    for c in ((obj.get('status') or {}).get('conditions') or []):
        if c.get('type') == ctype:
            return c
    return {}


def _selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics (matchLabels and matchExpressions; an empty selector matches all)."""
    selector = selector or {}
    for k, v in (selector.get('matchLabels') or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get('matchExpressions') or []:
        key, op, values = e.get('key'), e.get('operator'), e.get('values') or []
        if op == 'In' and labels.get(key) not in values:
            return False
        if op == 'NotIn' and key in labels and labels[key] in values:
            return False
        if op == 'Exists' and key not in labels:
            return False
        if op == 'DoesNotExist' and key in labels:
            return False
    return True


class SucStandIn(Background):
    label = 'SUC stand-in'

    def __init__(self, cluster: Any, delay: float = 0.3, hold: Any = (), fail: Any = (), interval: float = 0.1) -> None:
        super().__init__(interval)
        self.cluster = cluster
        self.delay = delay
        self.hold: set[str] = set(hold)
        self.fail: set[str] = set(fail)
        self.log: list[dict[str, Any]] = []
        self._started: set[tuple[str, str, str]] = set()   # (plan key, node, hash) with a Job
        self._done: set[str] = set()                        # Job uids whose outcome was handled
        self._sa_seen: set[tuple[str, str]] = set()
        self._finished = 0                                  # Jobs whose node it labelled and uncordoned

    def step(self) -> None:
        try:
            self.reconcile()
        except ApiError as exc:
            if exc.status not in (404, 409):
                self.errors.append(str(exc))
        except OSError as exc:  # the control plane going away at the end of a session
            self.errors.append(str(exc))

    # ------------------------------------------------------------------ one pass
    def reconcile(self) -> None:
        c = self.cluster
        plans = sorted(c.list(PLAN_API, 'Plan'), key=self._key)
        jobs = c.list('batch/v1', 'Job', label_selector='%s=%s' % (LABEL_CONTROLLER, CONTROLLER))
        by_key = {self._key(p): p for p in plans}
        finished = self._finished
        for job in jobs:
            self._handle_job(job, by_key)
        plans = sorted(c.list(PLAN_API, 'Plan'), key=self._key)
        # The Nodes from the watch-fed cache (cluster/informer.py), unless this pass labelled one (a Job finished):
        # then from the API, so the pass sees its own write.
        fresh = self._finished != finished
        nodes = {n['metadata']['name']: n for n in (c.list('v1', 'Node') if fresh else c.informer('v1', 'Node').items())}
        busy_exclusive = {self._key(p) for p in plans
                          if (p.get('spec') or {}).get('exclusive') and (p.get('status') or {}).get('applying')}
        for plan in plans:
            self._reconcile_plan(plan, nodes, busy_exclusive)

    @staticmethod
    def _key(plan: dict) -> str:
        return '%s/%s' % (plan['metadata'].get('namespace', ''), plan['metadata']['name'])

    def _entry(self, event: str, key: str, node: dict | None, node_name: str, version: str | None) -> None:
        self.log.append({'event': event, 'plan': key, 'node': node_name, 'version': version,
                         'unschedulable': bool(((node or {}).get('spec') or {}).get('unschedulable'))})

    def _write_status(self, plan: dict, new: dict[str, Any]) -> None:
        old = plan.get('status') or {}

        def norm(conds: list[dict] | None) -> list[tuple]:
            return [(x.get('type'), x.get('status'), x.get('reason'), x.get('message')) for x in conds or []]
        if (norm(old.get('conditions')) != norm(new.get('conditions'))
                or any(old.get(k) != v for k, v in new.items() if k != 'conditions')):
            plan['status'] = dict(old, **{k: v for k, v in new.items() if v is not None})
            for k, v in new.items():
                if v is None:
                    plan['status'].pop(k, None)
            self.cluster.patch(PLAN_API, 'Plan', plan['metadata']['name'], {'status': new},
                               namespace=plan['metadata']['namespace'], subresource='status')

    def _reconcile_plan(self, plan: dict, nodes: dict[str, dict], busy_exclusive: set[str]) -> None:
        spec, status = plan.get('spec') or {}, plan.get('status') or {}
        if plan['metadata'].get('deletionTimestamp'):
            return
        conds = [dict(x) for x in status.get('conditions') or []]
        key, name = self._key(plan), plan['metadata']['name']
        conds = set_condition(conds, 'Validated', 'True', 'PlanIsValid')
        if not spec.get('version'):
            conds = set_condition(conds, 'LatestResolved', 'False', 'Error', 'plan does not specify version or channel')
            self._write_status(plan, {'conditions': conds})
            return
        latest = spec['version'].replace('+', '-')
        phash = plan_hash(plan, latest)
        conds = set_condition(conds, 'LatestResolved', 'True', 'Version')
        new: dict[str, Any] = {'latestVersion': latest, 'latestHash': phash}
        complete = _cond(plan, 'Complete')
        if complete.get('reason') == 'JobFailed' and status.get('latestHash') == phash:
            self._write_status(plan, dict(new, conditions=conds))
            return
        label = PLAN_LABEL_PREFIX + name
        names = sorted(n for n, node in nodes.items()
                       if HOSTNAME in (node['metadata'].get('labels') or {})
                       and _selector_matches(spec.get('nodeSelector'), node['metadata'].get('labels') or {})
                       and (node['metadata'].get('labels') or {}).get(label) not in ('disabled', phash))
        applying = [n for n in status.get('applying') or [] if n in names]
        others_busy = spec.get('exclusive') and any(k != key for k in busy_exclusive)
        if not applying and not others_busy:
            applying = names[:max(1, int(spec.get('concurrency') or 1))]
        if applying:
            new['applying'] = applying
            if complete.get('status') != 'False' or complete.get('reason') != 'SyncJob':
                conds = set_condition(conds, 'Complete', 'False', 'SyncJob')
            if spec.get('exclusive'):
                busy_exclusive.add(key)
        else:
            new['applying'] = None
            if not names:
                conds = set_condition(conds, 'Complete', 'True', 'Complete')
                busy_exclusive.discard(key)
        self._write_status(plan, dict(new, conditions=conds))
        for node_name in applying:
            if (key, node_name, phash) not in self._started:
                self._started.add((key, node_name, phash))
                self._create_job(plan, nodes[node_name], latest, phash)

    # ------------------------------------------------------------------ Jobs
    def _ensure_service_account(self, namespace: str, name: str) -> None:
        # SUC's install manifest creates its service account; the Job's pod runs as the Plan's.
        if (namespace, name) in self._sa_seen:
            return
        try:
            self.cluster.api.request('POST', '/api/v1/namespaces/%s/serviceaccounts' % namespace,
                                     body={'apiVersion': 'v1', 'kind': 'ServiceAccount', 'metadata': {'name': name}})
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._sa_seen.add((namespace, name))

    def job_for(self, plan: dict, node: dict, latest: str, phash: str) -> dict[str, Any]:
        """The Job SUC's job.New builds for the node (less the upgrade container's host mounts)."""
        spec, meta = plan.get('spec') or {}, plan['metadata']
        node_name = node['metadata']['name']
        hostname = (node['metadata'].get('labels') or {}).get(HOSTNAME, node_name)
        labels = {LABEL_CONTROLLER: CONTROLLER, LABEL_EXCLUSIVE: str(bool(spec.get('exclusive'))).lower(),
                  LABEL_NODE: node_name, LABEL_PLAN: meta['name'], LABEL_VERSION: latest,
                  PLAN_LABEL_PREFIX + meta['name']: phash}
        pod_annotations = {'gpufleet.test/run-time': '%dms' % int(self.delay * 1000)}
        if node_name in self.hold:
            pod_annotations['gpufleet.test/run-time'] = HOLD_RUN_TIME
        if node_name in self.fail:
            pod_annotations['gpufleet.test/exit-code'] = '1'
        upgrade = spec.get('upgrade') or {}
        image = upgrade.get('image') or 'rancher/rke2-upgrade'
        container = {'name': 'upgrade', 'image': '%s:%s' % (image, latest),
                     'env': [{'name': 'SYSTEM_UPGRADE_NODE_NAME', 'value': node_name},
                             {'name': 'SYSTEM_UPGRADE_PLAN_NAME', 'value': meta['name']},
                             {'name': 'SYSTEM_UPGRADE_PLAN_LATEST_VERSION', 'value': latest},
                             {'name': 'SYSTEM_UPGRADE_PLAN_LATEST_HASH', 'value': phash}]}
        for field in ('command', 'args'):
            if upgrade.get(field):
                container[field] = list(upgrade[field])
        anti = [{'labelSelector': {'matchExpressions': [{'key': LABEL_PLAN, 'operator': 'In', 'values': [meta['name']]}]},
                 'topologyKey': HOSTNAME}]
        if spec.get('exclusive'):
            exclusive = [{'key': LABEL_EXCLUSIVE, 'operator': 'In', 'values': ['true']}]
            anti.append({'labelSelector': {'matchExpressions': exclusive}, 'topologyKey': HOSTNAME})
        pod_spec: dict[str, Any] = {
            'restartPolicy': 'Never',
            'affinity': {'nodeAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': {'nodeSelectorTerms': [
                {'matchExpressions': [{'key': HOSTNAME, 'operator': 'In', 'values': [hostname]}]}]}},
                'podAntiAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': anti}},
            'tolerations': [{'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'}]
            + copy.deepcopy(spec.get('tolerations') or []),
            'containers': [container],
        }
        if spec.get('serviceAccountName'):
            pod_spec['serviceAccountName'] = spec['serviceAccountName']
        return {'apiVersion': 'batch/v1', 'kind': 'Job',
                'metadata': {'name': safe_concat_name('apply', meta['name'], 'on', node_name.split('.', 1)[0], 'with', phash),
                             'namespace': meta['namespace'], 'labels': dict(labels),
                             'annotations': {GROUP + '/ttl-seconds-after-finished': str(TTL_SECONDS)}},
                'spec': {'backoffLimit': 0, 'completions': 1, 'parallelism': 1, 'ttlSecondsAfterFinished': TTL_SECONDS,
                         'template': {'metadata': {'labels': dict(labels), 'annotations': pod_annotations},
                                      'spec': pod_spec}}}

    def _create_job(self, plan: dict, node: dict, latest: str, phash: str) -> None:
        spec = plan.get('spec') or {}
        ns = plan['metadata']['namespace']
        if spec.get('serviceAccountName'):
            self._ensure_service_account(ns, spec['serviceAccountName'])
        job = self.job_for(plan, node, latest, phash)
        try:
            self.cluster.api.request('POST', '/apis/batch/v1/namespaces/%s/jobs' % ns, body=job)
        except ApiError as exc:
            if exc.status != 409:  # the Job of this node and hash exists already
                raise
        self._entry('start', self._key(plan), node, node['metadata']['name'], spec.get('version'))

    def _handle_job(self, job: dict, plans: dict[str, dict]) -> None:
        meta = job['metadata']
        labels = meta.get('labels') or {}
        ns, name = meta['namespace'], meta['name']
        key = '%s/%s' % (ns, labels.get(LABEL_PLAN, ''))
        plan = plans.get(key)
        if meta['uid'] in self._done or meta.get('deletionTimestamp'):
            return
        if plan is None or labels.get(LABEL_VERSION) != (plan.get('status') or {}).get('latestVersion'):
            # SUC deletes the Job of a Plan that is gone or now applies another version
            self._done.add(meta['uid'])
            self.cluster.api.request('DELETE', '/apis/batch/v1/namespaces/%s/jobs/%s' % (ns, name),
                                     body={'propagationPolicy': 'Background'}, ok404=True)
            return
        node_name = labels.get(LABEL_NODE, '')
        node = self.cluster.get('v1', 'Node', node_name)
        if node is None:
            return
        spec = plan.get('spec') or {}
        failed, complete = _cond(job, 'Failed'), _cond(job, 'Complete')
        if failed.get('status') == 'True':
            self._done.add(meta['uid'])
            message = 'Job %s/%s failed on Node %s: %s: %s' % (ns, name, node_name, failed.get('reason', ''),
                                                               failed.get('message', ''))
            conds = set_condition([dict(x) for x in (plan.get('status') or {}).get('conditions') or []],
                                  'Complete', 'False', 'JobFailed', message)
            self.cluster.patch(PLAN_API, 'Plan', plan['metadata']['name'], {'status': {'conditions': conds}},
                               namespace=ns, subresource='status')
            plan.setdefault('status', {})['conditions'] = conds
            self._entry('fail', key, node, node_name, spec.get('version'))
            return
        if complete.get('status') != 'True':
            return
        self._done.add(meta['uid'])
        label = PLAN_LABEL_PREFIX + plan['metadata']['name']
        # the upgraded kubelet reports its version; SUC labels the node and uncordons it
        self.cluster.patch('v1', 'Node', node_name, {'status': {'nodeInfo': {'kubeletVersion': spec.get('version')}}},
                           subresource='status')
        patch: dict[str, Any] = {'metadata': {'labels': {label: labels.get(label)}}}
        if (node.get('spec') or {}).get('unschedulable') and (spec.get('cordon') or spec.get('drain') is not None):
            patch['spec'] = {'unschedulable': None}
        self.cluster.patch('v1', 'Node', node_name, patch)
        self._finished += 1
        self._entry('finish', key, node, node_name, spec.get('version'))
