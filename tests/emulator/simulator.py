"""Pod-lifecycle simulator in the spirit of KWOK: what kube-scheduler, the kubelets, the Job
controller and (optionally) the ReplicaSet/StatefulSet controllers would do, quickly and
deterministically.

- scheduling: a Pending pod without `spec.nodeName` is bound to the first node (by name) that
  matches its nodeSelector, is not cordoned (unless tolerated), whose NoSchedule/NoExecute taints
  it tolerates and whose Ready condition is not False; with no such node it stays Pending with
  `PodScheduled=False, reason Unschedulable` and is retried whenever a node changes;
- kubelet: a Pending pod bound to an existing node becomes Running, Ready, with containerStatuses
  after `start_delay`; a pod annotated `emulator.gpufleet.io/duration: "<seconds>"` (Job pods: see
  `job()`) then finishes Succeeded or Failed; a graceful deletion removes the pod after
  min(grace period, `max_grace_seconds`);
- Job controller (batch/v1): creates `parallelism` pods from the template until `completions`
  succeeded (status Complete) or more than `backoffLimit` failed (status Failed);
- KubeVirt (opt-in: `vm_controller = True`): a VirtualMachine with `spec.running: false` or `runStrategy: Halted` has its
  VirtualMachineInstance (and, through owner references, its virt-launcher pod) deleted; with
  `running: true` or `runStrategy: Always|RerunOnFailure` a missing VMI is created from the
  template on a fitting node, with a virt-launcher pod; VM `status.printableStatus`, `ready` and
  `created` follow (`Manual` / `Once` are left alone);
- DaemonSet controller (opt-in: `daemonset_controller = True`): one pod per fitting node (the
  controller's default tolerations included, so cordoned nodes keep theirs), re-created when
  deleted, removed from nodes that stop fitting; status desired/current/ready numbers;
- optional: a pod deleted while its ReplicaSet/StatefulSet owner exists comes back with the same
  name and a new UID (`recreate_owned_pods = True`), so tests can prove wait-by-UID;
- System Upgrade Controller stand-in (opt-in: `suc_controller = True`): a Plan
  (upgrade.cattle.io/v1) with a `version` selects the Nodes its nodeSelector matches whose label
  `plan.upgrade.cattle.io/<plan>` is not the Plan's `latestHash`, at most `concurrency` at a time
  (and no two exclusive Plans at once), lists them in `status.applying`; after `suc_delay` seconds
  the node's `status.nodeInfo.kubeletVersion` becomes the Plan's version, the node gets the label,
  and (as SUC does for Plans with `cordon` or `drain`) a cordoned node is uncordoned; with nothing
  left to select the Plan's `Complete` condition turns True. Nodes in `suc_hold` never finish
  (the Plan stays applying); nodes in `suc_fail` end with `Complete=False, reason JobFailed`.
  No Jobs are created. Status as SUC writes it: conditions Validated / LatestResolved / Complete,
  `latestVersion` (`+` munged to `-`), `latestHash`, `applying`.

Pods annotated `emulator.gpufleet.io/managed: "false"`, and pods on nodes with that annotation,
are left alone; `enabled = False` stops the simulator altogether.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import string
import uuid
from typing import TYPE_CHECKING, Any

from .resources import ResourceType
from .selectors import label_selector_from_dict
from .store import ApiError, clone, now_rfc3339

if TYPE_CHECKING:
    from .emulator import Emulator

ANN = 'emulator.gpufleet.io/'
ANN_MANAGED = ANN + 'managed'
ANN_DURATION = ANN + 'duration'
ANN_OUTCOME = ANN + 'outcome'
ANN_LOGS = ANN + 'logs'
ANN_EXIT = ANN + 'exit-code'
MERGE = 'application/merge-patch+json'


@dataclasses.dataclass
class JobBehaviour:
    duration: float = 0.2
    outcomes: list[str] = dataclasses.field(default_factory=lambda: ['Succeeded'])  # per attempt; last repeats
    logs: str = ''
    exit_code: int | None = None   # default 0 for Succeeded, 1 for Failed

    def outcome(self, attempt: int) -> str:
        return self.outcomes[min(attempt, len(self.outcomes) - 1)]


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    for tol in tolerations or []:
        if tol.get('effect') and tol['effect'] != taint.get('effect'):
            continue
        op = tol.get('operator', 'Equal')
        if not tol.get('key') and op == 'Exists':
            return True
        if tol.get('key') == taint.get('key') and (op == 'Exists' or tol.get('value', '') == taint.get('value', '')):
            return True
    return False


def node_fits(node: dict, pod: dict) -> bool:
    spec = pod.get('spec') or {}
    labels = node['metadata'].get('labels') or {}
    for k, v in (spec.get('nodeSelector') or {}).items():
        if labels.get(k) != v:
            return False
    nspec = node.get('spec') or {}
    tolerations = spec.get('tolerations') or []
    taints = list(nspec.get('taints') or [])
    if nspec.get('unschedulable'):
        taints.append({'key': 'node.kubernetes.io/unschedulable', 'effect': 'NoSchedule'})
    for cond in (node.get('status') or {}).get('conditions') or []:
        if cond.get('type') == 'Ready' and cond.get('status') == 'False':
            taints.append({'key': 'node.kubernetes.io/not-ready', 'effect': 'NoSchedule'})
    for taint in taints:
        if taint.get('effect') in ('NoSchedule', 'NoExecute') and not tolerates(tolerations, taint):
            return False
    return True


def _suffix(n: int = 5) -> str:
    return ''.join(random.choice(string.ascii_lowercase + string.digits) for dummy in range(n))


class Simulator:
    """Configure on `emu.simulator`; all changes go through the store like a controller's writes."""

    def __init__(self, emulator: Emulator) -> None:
        self.emu = emulator
        self.store = emulator.store
        self.enabled = True
        self.schedule = True
        self.start_delay = 0.0
        self.max_grace_seconds: float | None = 0.2
        self.recreate_owned_pods = False
        self.vm_controller = False
        self.daemonset_controller = False
        self.recreate_delay = 0.0
        self.default_job = JobBehaviour()
        self.logs: dict[tuple[str, str], str] = {}
        self._jobs: dict[tuple[str, str], JobBehaviour] = {}
        self._job_seen: dict[str, dict[str, set[str]]] = {}   # job uid -> succeeded/failed pod uids
        self._attempts: dict[str, int] = {}                   # job uid -> pods created
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timers: dict[int, float] = {}
        self._busy = False
        self._task: asyncio.Task | None = None
        reg = self.store.registry
        self.pod_rt = reg.by_kind('v1', 'Pod')
        self.node_rt = reg.by_kind('v1', 'Node')
        self.job_rt = reg.by_kind('batch/v1', 'Job')
        self.vm_rt = reg.by_kind('kubevirt.io/v1', 'VirtualMachine')
        self.ds_rt = reg.by_kind('apps/v1', 'DaemonSet')
        self.vmi_rt = reg.by_kind('kubevirt.io/v1', 'VirtualMachineInstance')
        self.plan_rt = reg.by_kind('upgrade.cattle.io/v1', 'Plan')
        self.suc_controller = False
        self.suc_delay = 0.3
        self.suc_hold: set[str] = set()
        self.suc_fail: set[str] = set()
        self.suc_log: list[dict] = []  # {'plan', 'node', 'version', 'event': start|finish|fail[, 'unschedulable']}
        self._suc_running: set[tuple[str, str, str]] = set()   # (namespace/plan, node, hash) with a pending finish
        self.owner_kinds = {'ReplicaSet', 'StatefulSet', 'ReplicationController'}

    # ------------------------------------------------------------------ public configuration
    def job(self, name: str, namespace: str = 'default', duration: float = 0.2, outcome: str | list[str] = 'Succeeded',
            logs: str = '', exit_code: int | None = None) -> JobBehaviour:
        """How the pods of Job `name` behave: run `duration` seconds, then end with `outcome`
        ('Succeeded' / 'Failed', or a list, one per attempt, the last repeating) and `logs`."""
        outcomes = [outcome] if isinstance(outcome, str) else list(outcome)
        for o in outcomes:
            if o not in ('Succeeded', 'Failed'):
                raise ValueError('outcome must be Succeeded or Failed, not %r' % o)
        beh = JobBehaviour(float(duration), outcomes, logs, exit_code)
        self._jobs[(namespace, name)] = beh
        return beh

    def set_logs(self, namespace: str, pod: str, text: str) -> None:
        self.logs[(namespace, pod)] = text

    def logs_for(self, pod: dict, container: str | None = None) -> str:
        meta = pod['metadata']
        key = (meta.get('namespace', ''), meta['name'])
        if key in self.logs:
            return self.logs[key]
        ann = meta.get('annotations') or {}
        if ANN_LOGS in ann:
            return ann[ANN_LOGS]
        job = self._owner(pod, 'Job')
        if job is not None:
            beh = self._jobs.get((meta.get('namespace', ''), job['name']))
            if beh is not None:
                return beh.logs
        return ''

    # ------------------------------------------------------------------ plumbing
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue = asyncio.Queue()
        self._task = loop.create_task(self._worker())
        self.store.listeners.append(self._listener)

    async def stop(self) -> None:
        if self._listener in self.store.listeners:
            self.store.listeners.remove(self._listener)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    def _listener(self, rt: ResourceType, etype: str, obj: dict) -> None:
        watched = (self.pod_rt, self.node_rt, self.job_rt, self.vm_rt, self.vmi_rt, self.ds_rt, self.plan_rt)
        if self._loop is None or not self.enabled or rt not in watched:
            return
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (rt, etype, obj))  # type: ignore[union-attr]

    def later(self, delay: float, fn: Any, *args: Any) -> None:
        """Run fn(*args) on the worker after delay seconds (timers count for settle())."""
        assert self._loop is not None
        token = id(object()) ^ random.getrandbits(48)
        self._timers[token] = self._loop.time() + delay

        def fire() -> None:
            self._timers.pop(token, None)
            self._queue.put_nowait(('call', fn, args))  # type: ignore[union-attr]
        self._loop.call_later(max(0.0, delay), fire)

    async def settle(self, horizon: float = 0.0) -> None:
        """Wait until nothing is queued and no timer is due within `horizon` seconds."""
        assert self._loop is not None
        while True:
            now = self._loop.time()
            if (self._queue.empty() and not self._busy  # type: ignore[union-attr]
                    and not any(t <= now + horizon for t in self._timers.values())):
                await asyncio.sleep(0)
                if self._queue.empty() and not self._busy:  # type: ignore[union-attr]
                    return
            await asyncio.sleep(0.002)

    async def _worker(self) -> None:
        assert self._queue is not None
        while True:
            item = await self._queue.get()
            self._busy = True
            try:
                if item[0] == 'call':
                    item[1](*item[2])
                elif self.enabled:
                    self._on_event(*item)
            except ApiError:
                pass  # the object changed under us (deleted, conflict): the next event retries
            except Exception:  # keep simulating; a bug shows on stderr
                import traceback
                traceback.print_exc()
            finally:
                self._busy = False

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _owner(obj: dict, kind: str | None = None) -> dict | None:
        for ref in obj['metadata'].get('ownerReferences') or []:
            if ref.get('controller') and (kind is None or ref.get('kind') == kind):
                return ref
        return None

    def _managed(self, pod: dict) -> bool:
        ann = pod['metadata'].get('annotations') or {}
        return self.enabled and ann.get(ANN_MANAGED, 'true') != 'false'

    def _current(self, rt: ResourceType, obj: dict) -> dict | None:
        cur = self.store.get(rt, obj['metadata'].get('namespace'), obj['metadata']['name'])
        if cur is None or cur['metadata']['uid'] != obj['metadata']['uid']:
            return None
        return cur

    def _patch_status(self, rt: ResourceType, obj: dict, status: dict) -> dict:
        return self.store.patch(rt, obj['metadata'].get('namespace'), obj['metadata']['name'],
                                {'status': status}, MERGE, 'status')

    # ------------------------------------------------------------------ events
    def _on_event(self, rt: ResourceType, etype: str, obj: dict) -> None:
        if rt is self.plan_rt:
            if etype != 'DELETED' and self.suc_controller:
                self._reconcile_plans()
            return
        if rt is self.node_rt:
            if etype != 'DELETED':
                self._retry_unscheduled()
            if self.suc_controller:
                self._reconcile_plans()
            if self.daemonset_controller:
                for ds in self.store.list(self.ds_rt)[0]:
                    self._reconcile_ds(ds)
            return
        if rt is self.ds_rt:
            if etype != 'DELETED' and self.daemonset_controller:
                self._reconcile_ds(obj)
            return
        if rt is self.job_rt:
            if etype != 'DELETED':
                self._reconcile_job(obj)
            return
        if rt in (self.vm_rt, self.vmi_rt) and not self.vm_controller:
            return
        if rt is self.vm_rt:
            if etype != 'DELETED':
                self._reconcile_vm(obj)
            return
        if rt is self.vmi_rt:
            ref = self._owner(obj, 'VirtualMachine')
            if ref is not None:
                vm = self.store.get(self.vm_rt, obj['metadata'].get('namespace'), ref.get('name', ''))
                if vm is not None and vm['metadata']['uid'] == ref.get('uid'):
                    self._vm_status(vm)
            return
        # pods
        if etype == 'DELETED':
            self._on_pod_deleted(obj)
        ds_ref = self._owner(obj, 'DaemonSet')
        if ds_ref is not None and self.daemonset_controller:
            ds = self.store.get(self.ds_rt, obj['metadata'].get('namespace'), ds_ref.get('name', ''))
            if ds is not None and ds['metadata']['uid'] == ds_ref.get('uid'):
                self._reconcile_ds(ds)
        if etype == 'DELETED':
            return
        job = self._owner(obj, 'Job')
        if not self._managed(obj):
            if job is not None:
                self._reconcile_job_ref(obj, job)
            return
        meta, spec, status = obj['metadata'], obj.get('spec') or {}, obj.get('status') or {}
        phase = status.get('phase', 'Pending')
        if meta.get('deletionTimestamp'):
            pass
        elif phase == 'Pending' and not spec.get('nodeName'):
            if self.schedule and spec.get('schedulerName', 'default-scheduler') == 'default-scheduler':
                self._schedule(obj)
        elif phase == 'Pending':
            node = self.store.get(self.node_rt, None, spec['nodeName'])
            if node is not None and (node['metadata'].get('annotations') or {}).get(ANN_MANAGED) != 'false':
                if self.start_delay:
                    self.later(self.start_delay, self._start_pod, obj)
                else:
                    self._start_pod(obj)
        if job is not None:
            self._reconcile_job_ref(obj, job)

    def _schedule(self, pod: dict) -> None:
        nodes, dummy = self.store.list(self.node_rt)
        for node in nodes:
            if node_fits(node, pod):
                self.store.patch(self.pod_rt, pod['metadata']['namespace'], pod['metadata']['name'],
                                 {'spec': {'nodeName': node['metadata']['name']},
                                  'metadata': {'resourceVersion': pod['metadata']['resourceVersion']}}, MERGE)
                return
        conds = (pod.get('status') or {}).get('conditions') or []
        if not any(c.get('type') == 'PodScheduled' and c.get('status') == 'False' for c in conds):
            self._patch_status(self.pod_rt, pod, {'conditions': [{
                'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable',
                'message': '0/%d nodes are available: no node matches the pod\'s node selector, taints '
                           'and cordons.' % len(nodes), 'lastTransitionTime': now_rfc3339()}]})

    def _retry_unscheduled(self) -> None:
        if not self.schedule:
            return
        pending, dummy = self.store.list(self.pod_rt, field_selector='spec.nodeName=,status.phase=Pending')
        for pod in pending:
            if self._managed(pod) and not pod['metadata'].get('deletionTimestamp'):
                self._schedule(pod)

    def _start_pod(self, pod: dict) -> None:
        cur = self._current(self.pod_rt, pod)
        if cur is None or cur['metadata'].get('deletionTimestamp') or \
                (cur.get('status') or {}).get('phase', 'Pending') != 'Pending':
            return
        now = now_rfc3339()
        node = self.store.get(self.node_rt, None, cur['spec'].get('nodeName', ''))
        host_ip = '10.0.0.1'
        for addr in ((node or {}).get('status') or {}).get('addresses') or []:
            if addr.get('type') == 'InternalIP':
                host_ip = addr.get('address', host_ip)
        conds = [{'type': t, 'status': 'True', 'lastProbeTime': None, 'lastTransitionTime': now}
                 for t in ('PodReadyToStartContainers', 'Initialized', 'Ready', 'ContainersReady', 'PodScheduled')]
        statuses = [{'name': c.get('name', 'main'), 'image': c.get('image', ''), 'imageID': '',
                     'containerID': 'containerd://' + uuid.uuid4().hex, 'ready': True, 'started': True,
                     'restartCount': 0, 'state': {'running': {'startedAt': now}}}
                    for c in cur['spec'].get('containers') or []]
        running = self._patch_status(self.pod_rt, cur, {
            'phase': 'Running', 'conditions': conds, 'containerStatuses': statuses, 'startTime': now,
            'hostIP': host_ip, 'hostIPs': [{'ip': host_ip}],
            'podIP': '10.42.%d.%d' % (random.randint(0, 255), random.randint(1, 254))})
        duration, outcome, exit_code = self._run_plan(running)
        if duration is not None:
            self.later(duration, self._finish_pod, running, outcome, exit_code)

    def _run_plan(self, pod: dict) -> tuple[float | None, str, int | None]:
        ann = pod['metadata'].get('annotations') or {}
        job = self._owner(pod, 'Job')
        beh = None
        if job is not None:
            beh = self._jobs.get((pod['metadata']['namespace'], job['name']))
        if ANN_DURATION in ann:
            exit_code = int(ann[ANN_EXIT]) if ANN_EXIT in ann else None
            return float(ann[ANN_DURATION]), ann.get(ANN_OUTCOME, 'Succeeded'), exit_code
        if job is not None:
            beh = beh or self.default_job
            attempt = int(ann.get(ANN + 'attempt', '0'))
            return beh.duration, beh.outcome(attempt), beh.exit_code
        return None, 'Succeeded', None

    def _finish_pod(self, pod: dict, outcome: str, exit_code: int | None) -> None:
        cur = self._current(self.pod_rt, pod)
        if cur is None or (cur.get('status') or {}).get('phase') != 'Running':
            return
        now = now_rfc3339()
        code = exit_code if exit_code is not None else (0 if outcome == 'Succeeded' else 1)
        statuses = []
        for cs in (cur.get('status') or {}).get('containerStatuses') or []:
            cs = clone(cs)
            started = (cs.get('state') or {}).get('running', {}).get('startedAt', now)
            cs.update({'ready': False, 'started': False, 'state': {'terminated': {
                'exitCode': code, 'reason': 'Completed' if code == 0 else 'Error', 'startedAt': started,
                'finishedAt': now, 'containerID': cs.get('containerID', '')}}})
            statuses.append(cs)
        conds = [{'type': t, 'status': 'True' if t in ('Initialized', 'PodScheduled') else 'False',
                  'reason': None if t in ('Initialized', 'PodScheduled') else 'PodCompleted',
                  'lastProbeTime': None, 'lastTransitionTime': now}
                 for t in ('PodReadyToStartContainers', 'Initialized', 'Ready', 'ContainersReady', 'PodScheduled')]
        self._patch_status(self.pod_rt, cur, {'phase': outcome, 'conditions': conds, 'containerStatuses': statuses})

    def _on_pod_deleted(self, pod: dict) -> None:
        job = self._owner(pod, 'Job')
        if job is not None:
            self._reconcile_job_ref(pod, job, deleted=pod)
            return
        owner = self._owner(pod)
        if not self.recreate_owned_pods or owner is None or owner.get('kind') not in self.owner_kinds:
            return
        if self.recreate_delay:
            self.later(self.recreate_delay, self._recreate, pod, owner)
        else:
            self._recreate(pod, owner)

    def _recreate(self, pod: dict, owner: dict) -> None:
        ns = pod['metadata']['namespace']
        if not self._owner_exists(ns, owner):
            return
        if self.store.get(self.pod_rt, ns, pod['metadata']['name']) is not None:
            return
        new = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {
            k: v for k, v in pod['metadata'].items()
            if k in ('name', 'namespace', 'labels', 'annotations', 'ownerReferences')},
            'spec': clone(pod.get('spec') or {})}
        new['spec'].pop('nodeName', None)  # the scheduler places it again (a cordoned node is skipped)
        self.store.create(self.pod_rt, new, ns)

    def _owner_exists(self, ns: str, ref: dict) -> bool:
        for rt in self.store.registry.all():
            if rt.kind == ref.get('kind') and rt.api_version == ref.get('apiVersion'):
                obj = self.store.get(rt, ns, ref.get('name', ''))
                return obj is not None and obj['metadata']['uid'] == ref.get('uid')
        return False

    # ------------------------------------------------------------------ Job controller
    def _reconcile_job_ref(self, pod: dict, ref: dict, deleted: dict | None = None) -> None:
        job = self.store.get(self.job_rt, pod['metadata']['namespace'], ref.get('name', ''))
        if job is not None and job['metadata']['uid'] == ref.get('uid'):
            self._reconcile_job(job, deleted)

    def _reconcile_job(self, job: dict, deleted: dict | None = None) -> None:
        job = self._current(self.job_rt, job)
        if job is None:
            return
        uid = job['metadata']['uid']
        ns = job['metadata']['namespace']
        spec = job.get('spec') or {}
        status = job.get('status') or {}
        seen = self._job_seen.setdefault(uid, {'succeeded': set(), 'failed': set()})
        pods = [self.store.get(self.pod_rt, key[0], key[1]) for rt, key in
                list(self.store.owners.get(uid, ())) if rt is self.pod_rt]
        pods = [p for p in pods if p is not None]
        active = 0
        ready = 0
        for pod in pods:
            phase = (pod.get('status') or {}).get('phase', 'Pending')
            puid = pod['metadata']['uid']
            if phase == 'Succeeded':
                seen['succeeded'].add(puid)
            elif phase == 'Failed':
                seen['failed'].add(puid)
            elif not pod['metadata'].get('deletionTimestamp'):
                active += 1
                if phase == 'Running':
                    ready += 1
        if deleted is not None:
            dphase = (deleted.get('status') or {}).get('phase')
            if dphase not in ('Succeeded', 'Failed') and deleted['metadata']['uid'] not in seen['succeeded']:
                seen['failed'].add(deleted['metadata']['uid'])
        done = {c.get('type') for c in status.get('conditions') or [] if c.get('status') == 'True'}
        completions = int(spec.get('completions') or 1)
        parallelism = int(spec.get('parallelism') if spec.get('parallelism') is not None else 1)
        backoff = int(spec.get('backoffLimit') if spec.get('backoffLimit') is not None else 6)
        n_ok, n_failed = len(seen['succeeded']), len(seen['failed'])
        now = now_rfc3339()
        new_status: dict[str, Any] = {'active': active, 'succeeded': n_ok, 'failed': n_failed, 'ready': ready}
        new_status['startTime'] = status.get('startTime') or now
        if not ({'Complete', 'Failed'} & done):
            conditions = list(status.get('conditions') or [])
            if n_ok >= completions:
                conditions += [{'type': 'SuccessCriteriaMet', 'status': 'True', 'reason': 'CompletionsReached',
                                'message': 'Reached expected number of succeeded pods', 'lastProbeTime': now,
                                'lastTransitionTime': now},
                               {'type': 'Complete', 'status': 'True', 'reason': 'CompletionsReached',
                                'message': 'Reached expected number of succeeded pods', 'lastProbeTime': now,
                                'lastTransitionTime': now}]
                new_status['completionTime'] = now
                new_status['conditions'] = conditions
            elif n_failed > backoff:
                conditions += [{'type': 'FailureTarget', 'status': 'True', 'reason': 'BackoffLimitExceeded',
                                'message': 'Job has reached the specified backoff limit', 'lastProbeTime': now,
                                'lastTransitionTime': now},
                               {'type': 'Failed', 'status': 'True', 'reason': 'BackoffLimitExceeded',
                                'message': 'Job has reached the specified backoff limit', 'lastProbeTime': now,
                                'lastTransitionTime': now}]
                new_status['conditions'] = conditions
                for pod in pods:
                    if (pod.get('status') or {}).get('phase') not in ('Succeeded', 'Failed'):
                        try:
                            self.store.delete(self.pod_rt, ns, pod['metadata']['name'])
                        except ApiError:
                            pass
            elif not spec.get('suspend'):
                want = min(parallelism, completions - n_ok) - active
                for dummy in range(max(0, want)):
                    self._create_job_pod(job)
                    new_status['active'] += 1
        if any(status.get(k) != v for k, v in new_status.items()):
            self._patch_status(self.job_rt, job, new_status)

    def _create_job_pod(self, job: dict) -> None:
        uid = job['metadata']['uid']
        attempt = self._attempts.get(uid, 0)
        self._attempts[uid] = attempt + 1
        tmpl = clone((job.get('spec') or {}).get('template') or {})
        meta = tmpl.get('metadata') or {}
        ann = dict(meta.get('annotations') or {})
        ann[ANN + 'attempt'] = str(attempt)
        ann['batch.kubernetes.io/job-completion-index'] = str(attempt) if \
            job['spec'].get('completionMode') == 'Indexed' else ann.get('batch.kubernetes.io/job-completion-index', '')
        if not ann['batch.kubernetes.io/job-completion-index']:
            del ann['batch.kubernetes.io/job-completion-index']
        owner = {'apiVersion': 'batch/v1', 'kind': 'Job', 'name': job['metadata']['name'], 'uid': uid,
                 'controller': True, 'blockOwnerDeletion': True}
        pod_meta = {'name': '%s-%s' % (job['metadata']['name'], _suffix()), 'namespace': job['metadata']['namespace'],
                    'labels': dict(meta.get('labels') or {}), 'annotations': ann, 'ownerReferences': [owner]}
        pod = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': pod_meta, 'spec': tmpl.get('spec') or {}}
        self.store.create(self.pod_rt, pod, job['metadata']['namespace'])

    # ------------------------------------------------------------------ KubeVirt VM controller
    @staticmethod
    def vm_wants_running(vm: dict) -> bool | None:
        """True / False from spec.runStrategy or spec.running; None for Manual/Once (left alone)."""
        spec = vm.get('spec') or {}
        strategy = spec.get('runStrategy')
        if strategy is not None:
            return {'Always': True, 'RerunOnFailure': True, 'Halted': False}.get(strategy)
        if 'running' in spec:
            return bool(spec['running'])
        return None

    def _reconcile_vm(self, vm: dict) -> None:
        vm = self._current(self.vm_rt, vm)
        if vm is None:
            return
        want = self.vm_wants_running(vm)
        ns, name = vm['metadata']['namespace'], vm['metadata']['name']
        vmi = self.store.get(self.vmi_rt, ns, name)
        if want is False and vmi is not None and not vmi['metadata'].get('deletionTimestamp'):
            self.store.delete(self.vmi_rt, ns, name)
        elif want is True and vmi is None:
            self._start_vmi(vm)
        self._vm_status(vm)

    def _start_vmi(self, vm: dict) -> None:
        from . import fixtures
        tmpl = clone((vm.get('spec') or {}).get('template') or {})
        tspec = tmpl.get('spec') or {}
        probe = {'metadata': {}, 'spec': {'nodeSelector': tspec.get('nodeSelector') or {},
                                          'tolerations': tspec.get('tolerations') or []}}
        nodes, dummy = self.store.list(self.node_rt)
        node = next((n for n in nodes if node_fits(n, probe)), None)
        ns, name = vm['metadata']['namespace'], vm['metadata']['name']
        labels = dict((tmpl.get('metadata') or {}).get('labels') or {})
        labels['vm.kubevirt.io/name'] = name
        status: dict[str, Any] = {'phase': 'Pending' if node is None else 'Running'}
        if node is not None:
            labels['kubevirt.io/nodeName'] = node['metadata']['name']
            status.update({'nodeName': node['metadata']['name'], 'conditions': [
                {'type': 'Ready', 'status': 'True'},
                {'type': 'LiveMigratable', 'status': 'False', 'reason': 'HostDeviceNotLiveMigratable'}]})
        vmi = {'apiVersion': 'kubevirt.io/v1', 'kind': 'VirtualMachineInstance',
               'metadata': {'name': name, 'namespace': ns, 'labels': labels,
                            'ownerReferences': [{'apiVersion': 'kubevirt.io/v1', 'kind': 'VirtualMachine',
                                                 'name': name, 'uid': vm['metadata']['uid'], 'controller': True,
                                                 'blockOwnerDeletion': True}]},
               'spec': tspec, 'status': status}
        made = self.store.create(self.vmi_rt, vmi, ns, keep_status=True)
        if node is not None:
            made = clone(made)
            made['spec'].setdefault('domain', {}).setdefault('devices', {})
            launcher = fixtures.virt_launcher_pod(made, phase=None)
            launcher['metadata'].pop('uid', None)
            self.store.create(self.pod_rt, launcher, ns)

    def _vm_status(self, vm: dict) -> None:
        vm = self._current(self.vm_rt, vm)
        if vm is None:
            return
        vmi = self.store.get(self.vmi_rt, vm['metadata']['namespace'], vm['metadata']['name'])
        want = self.vm_wants_running(vm)
        if vmi is None:
            printable = 'Stopped' if want is not True else 'Starting'
        elif vmi['metadata'].get('deletionTimestamp'):
            printable = 'Stopping'
        else:
            printable = {'Running': 'Running', 'Pending': 'Starting', 'Scheduling': 'Starting'}.get(
                (vmi.get('status') or {}).get('phase', ''), 'Starting')
        new = {'printableStatus': printable, 'created': vmi is not None,
               'ready': printable == 'Running'}
        old = vm.get('status') or {}
        if any(old.get(k) != v for k, v in new.items()):
            self._patch_status(self.vm_rt, vm, new)

    # ------------------------------------------------------------------ DaemonSet controller
    DS_TOLERATIONS = [
        {'key': 'node.kubernetes.io/not-ready', 'operator': 'Exists', 'effect': 'NoExecute'},
        {'key': 'node.kubernetes.io/unreachable', 'operator': 'Exists', 'effect': 'NoExecute'},
        {'key': 'node.kubernetes.io/disk-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
        {'key': 'node.kubernetes.io/memory-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
        {'key': 'node.kubernetes.io/pid-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
        {'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'},
    ]

    def _reconcile_ds(self, ds: dict) -> None:
        ds = self._current(self.ds_rt, ds)
        if ds is None or ds['metadata'].get('deletionTimestamp'):
            return
        ns, uid = ds['metadata']['namespace'], ds['metadata']['uid']
        tmpl = clone((ds.get('spec') or {}).get('template') or {})
        tspec = tmpl.get('spec') or {}
        tolerations = list(tspec.get('tolerations') or [])
        tolerations += [t for t in self.DS_TOLERATIONS if t not in tolerations]
        tspec['tolerations'] = tolerations
        probe = {'metadata': {}, 'spec': tspec}
        nodes = [n for n in self.store.list(self.node_rt)[0] if node_fits(n, probe)]
        wanted = {n['metadata']['name'] for n in nodes}
        pods = [self.store.get(self.pod_rt, key[0], key[1]) for rt, key in list(self.store.owners.get(uid, ()))
                if rt is self.pod_rt]
        pods = [p for p in pods if p is not None and not p['metadata'].get('deletionTimestamp')]
        have: dict[str, dict] = {}
        for pod in pods:
            node = (pod.get('spec') or {}).get('nodeName', '')
            if node not in wanted or node in have:
                self.store.delete(self.pod_rt, ns, pod['metadata']['name'])
            else:
                have[node] = pod
        for node in sorted(wanted - set(have)):
            meta = tmpl.get('metadata') or {}
            owner = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'name': ds['metadata']['name'], 'uid': uid,
                     'controller': True, 'blockOwnerDeletion': True}
            pod_meta = {'name': '%s-%s' % (ds['metadata']['name'], _suffix()), 'namespace': ns,
                        'labels': dict(meta.get('labels') or {}), 'annotations': dict(meta.get('annotations') or {}),
                        'ownerReferences': [owner]}
            pod = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': pod_meta, 'spec': dict(clone(tspec), nodeName=node)}
            have[node] = self.store.create(self.pod_rt, pod, ns)
        ready = sum(1 for p in have.values() if (p.get('status') or {}).get('phase') == 'Running')
        status = {'desiredNumberScheduled': len(wanted), 'currentNumberScheduled': len(have),
                  'numberReady': ready, 'numberAvailable': ready, 'updatedNumberScheduled': len(have),
                  'numberMisscheduled': 0, 'observedGeneration': ds['metadata'].get('generation', 1)}
        old = ds.get('status') or {}
        if any(old.get(k) != v for k, v in status.items()):
            self._patch_status(self.ds_rt, ds, status)

    # ------------------------------------------------------------------ System Upgrade Controller stand-in
    @staticmethod
    def _cond(status: dict, ctype: str) -> dict:
        for c in status.get('conditions') or []:
            if c.get('type') == ctype:
                return c
        return {}

    @staticmethod
    def _set_cond(conds: list[dict], ctype: str, status: str, reason: str, message: str = '') -> list[dict]:
        now = now_rfc3339()
        out = []
        found = False
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

    def _plan_hash(self, plan: dict, latest: str) -> str:
        spec = plan.get('spec') or {}
        return hashlib.sha224((latest + (spec.get('serviceAccountName') or '')).encode()).hexdigest()

    def _reconcile_plans(self) -> None:
        plans = sorted(self.store.list(self.plan_rt)[0],
                       key=lambda p: (p['metadata'].get('namespace', ''), p['metadata']['name']))
        busy_exclusive = {self._plan_key(p) for p in plans
                          if (p.get('spec') or {}).get('exclusive') and (p.get('status') or {}).get('applying')}
        for plan in plans:
            self._reconcile_plan(plan, busy_exclusive)

    @staticmethod
    def _plan_key(plan: dict) -> str:
        return '%s/%s' % (plan['metadata'].get('namespace', ''), plan['metadata']['name'])

    def _reconcile_plan(self, plan: dict, busy_exclusive: set[str]) -> None:
        spec, status = plan.get('spec') or {}, dict(plan.get('status') or {})
        if plan['metadata'].get('deletionTimestamp'):
            return
        conds = [dict(c) for c in status.get('conditions') or []]
        key, name = self._plan_key(plan), plan['metadata']['name']
        new: dict[str, Any] = {}
        if not spec.get('version'):
            conds = self._set_cond(conds, 'LatestResolved', 'False', 'Error', 'plan does not specify version or channel')
            self._write_plan_status(plan, status, dict(conditions=conds))
            return
        latest = spec['version'].replace('+', '-')
        phash = self._plan_hash(plan, latest)
        conds = self._set_cond(conds, 'Validated', 'True', 'PlanIsValid')
        conds = self._set_cond(conds, 'LatestResolved', 'True', 'Version')
        new.update(latestVersion=latest, latestHash=phash)
        complete = self._cond({'conditions': conds}, 'Complete')
        if complete.get('reason') == 'JobFailed' and status.get('latestHash') == phash:
            self._write_plan_status(plan, status, dict(new, conditions=conds))
            return
        match = label_selector_from_dict(spec.get('nodeSelector') or {})
        label = 'plan.upgrade.cattle.io/' + name
        nodes = [n for n in self.store.list(self.node_rt)[0]
                 if match is not None and match(n['metadata'].get('labels') or {})
                 and (n['metadata'].get('labels') or {}).get(label) not in ('disabled', phash)]
        names = sorted(n['metadata']['name'] for n in nodes)
        applying = [n for n in status.get('applying') or [] if n in names]
        others_busy = spec.get('exclusive') and any(k != key for k in busy_exclusive)
        if not applying and not others_busy:
            applying = names[:max(1, int(spec.get('concurrency') or 1))]
        if applying:
            new['applying'] = applying
            if complete.get('status') != 'False' or complete.get('reason') != 'SyncJob':
                conds = self._set_cond(conds, 'Complete', 'False', 'SyncJob')
            if spec.get('exclusive'):
                busy_exclusive.add(key)
            for node in applying:
                token = (key, node, phash)
                if token not in self._suc_running:
                    self._suc_running.add(token)
                    self.suc_log.append({'plan': key, 'node': node, 'version': spec['version'], 'event': 'start'})
                    if node not in self.suc_hold:
                        self.later(self.suc_delay, self._suc_finish, key, node, phash)
        elif names:  # waiting for another exclusive Plan
            new['applying'] = None
        else:
            new['applying'] = None
            conds = self._set_cond(conds, 'Complete', 'True', 'Complete')
            busy_exclusive.discard(key)
        self._write_plan_status(plan, status, dict(new, conditions=conds))

    def _write_plan_status(self, plan: dict, old: dict, new: dict) -> None:
        def norm(conds: list[dict]) -> list[tuple]:
            return [(c.get('type'), c.get('status'), c.get('reason'), c.get('message')) for c in conds or []]
        changed = (norm(old.get('conditions')) != norm(new.get('conditions'))
                   or any(old.get(k) != v for k, v in new.items() if k != 'conditions'))
        if changed:
            self._patch_status(self.plan_rt, plan, new)

    def _suc_finish(self, key: str, node_name: str, phash: str) -> None:
        self._suc_running.discard((key, node_name, phash))
        ns, name = key.split('/', 1)
        plan = self.store.get(self.plan_rt, ns, name)
        node = self.store.get(self.node_rt, None, node_name)
        if plan is None or node is None or (plan.get('status') or {}).get('latestHash') != phash:
            return
        spec = plan.get('spec') or {}
        if node_name in self.suc_fail:
            self.suc_log.append({'plan': key, 'node': node_name, 'version': spec.get('version'), 'event': 'fail'})
            status = plan.get('status') or {}
            conds = self._set_cond([dict(c) for c in status.get('conditions') or []], 'Complete', 'False', 'JobFailed',
                                   'Job %s/apply-%s-on-%s failed on Node %s: BackoffLimitExceeded: Job has reached '
                                   'the specified backoff limit' % (ns, name, node_name, node_name))
            self._patch_status(self.plan_rt, plan, {'conditions': conds})
            return
        self.store.patch(self.node_rt, None, node_name,
                         {'status': {'nodeInfo': {'kubeletVersion': spec['version']}}}, MERGE, 'status')
        patch: dict[str, Any] = {'metadata': {'labels': {'plan.upgrade.cattle.io/' + name: phash}}}
        if (node.get('spec') or {}).get('unschedulable') and (spec.get('cordon') or spec.get('drain') is not None):
            patch['spec'] = {'unschedulable': None}  # SUC marks the node schedulable when its Job completes
        self.store.patch(self.node_rt, None, node_name, patch, MERGE)
        self.suc_log.append({'plan': key, 'node': node_name, 'version': spec['version'], 'event': 'finish',
                             'unschedulable': bool((node.get('spec') or {}).get('unschedulable'))})
        self._reconcile_plans()
