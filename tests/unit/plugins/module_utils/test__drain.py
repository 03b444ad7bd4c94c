"""Unit tests of the drain decisions and loop (plugins/module_utils/_drain.py), over an in-memory
client and a fake clock."""
from __future__ import annotations

import copy
import json
import threading

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain as D
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import (
    K8sError, NotFoundError, TooManyRequestsError)

import k8s_scenario as S


# -- node decisions ---------------------------------------------------------------------------
def test_cordon_records_initial_state_once():
    n = S.node('n')
    patch = D.cordon_patch(n)
    assert patch == {'spec': {'unschedulable': True},
                     'metadata': {'annotations': {D.ANN_INITIAL: 'false', D.ANN_STATE: 'cordoned'}}}
    after = D.apply_merge_patch(n, patch)
    assert D.cordon_patch(after) is None
    assert D.initially_unschedulable(after) is False


def test_cordon_of_admin_cordoned_node_records_true_and_keeps_later_progress():
    n = S.node('n', unschedulable=True)
    assert D.cordon_patch(n) == {'metadata': {'annotations': {D.ANN_INITIAL: 'true', D.ANN_STATE: 'cordoned'}}}
    drained = S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'false', D.ANN_STATE: 'drained'})
    assert D.cordon_patch(drained) is None
    assert D.cordon_patch(drained, 'draining') is None
    uncordoned_by_hand = S.node('n', annotations={D.ANN_INITIAL: 'false', D.ANN_STATE: 'drained'})
    assert D.cordon_patch(uncordoned_by_hand, 'draining') == {
        'spec': {'unschedulable': True}, 'metadata': {'annotations': {D.ANN_STATE: 'draining'}}}


def _set_by(node, manager=D.FIELD_MANAGER, time='2026-12-06T10:00:00Z'):
    """`node` with the managedFields entry the API server writes for a cordon by `manager`."""
    node['metadata']['managedFields'] = [
        {'manager': 'kubelet', 'operation': 'Update', 'subresource': 'status', 'time': '2026-12-06T09:00:00Z',
         'fieldsType': 'FieldsV1', 'fieldsV1': {'f:status': {'f:conditions': {}}}},
        {'manager': manager, 'operation': 'Update', 'time': time, 'fieldsType': 'FieldsV1',
         'fieldsV1': {'f:spec': {'f:unschedulable': {}}}}]
    return node


def test_uncordon_lifts_only_our_cordon():
    ours = _set_by(S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'false', D.ANN_STATE: 'drained'}))
    assert D.uncordon_patch(ours) == ({'spec': {'unschedulable': None},
                                       'metadata': {'annotations': {D.ANN_INITIAL: None, D.ANN_STATE: None}}}, False)
    admin = S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'true', D.ANN_STATE: 'drained'})
    patch, kept = D.uncordon_patch(admin)
    assert kept is True and 'spec' not in patch
    after = D.apply_merge_patch(admin, patch)
    assert after['spec']['unschedulable'] is True
    assert D.uncordon_patch(after) == (None, True)          # idempotent, still kept
    assert D.uncordon_patch(after, uncordon_preexisting=True) == ({'spec': {'unschedulable': None}}, False)


def test_uncordon_of_a_node_cordoned_by_someone_else_without_record_keeps_it():
    assert D.uncordon_patch(S.node('n', unschedulable=True)) == (None, True)
    assert D.uncordon_patch(S.node('n')) == (None, False)


def test_stopped_vms_annotation_merges_and_keeps_first_record():
    first = D.merge_stopped_vms(None, [{'namespace': 'b', 'name': 'x', 'runStrategy': 'Always'}])
    second = D.merge_stopped_vms(first, [{'namespace': 'b', 'name': 'x', 'runStrategy': 'Halted'},
                                         {'namespace': 'a', 'name': 'y', 'running': True}])
    assert json.loads(second) == [{'namespace': 'a', 'name': 'y', 'running': True},
                                  {'namespace': 'b', 'name': 'x', 'runStrategy': 'Always'}]


@pytest.mark.parametrize('vm,patch,record', [
    (S.vm('v'), {'spec': {'runStrategy': 'Halted'}}, {'namespace': 'vms', 'name': 'v', 'runStrategy': 'Always'}),
    (S.vm('v', run_strategy=None), {'spec': {'running': False}}, {'namespace': 'vms', 'name': 'v', 'running': True}),
    (S.vm('v', run_strategy='Halted'), None, {'namespace': 'vms', 'name': 'v', 'runStrategy': 'Halted'}),
])
def test_vm_stop_patch(vm, patch, record):
    assert D.vm_stop_patch(vm) == (patch, record)


# -- pod decisions ----------------------------------------------------------------------------
OPTS = D.DrainOptions()


@pytest.mark.parametrize('pod,opts,expected', [
    (S.pod('m', owner_ref=S.owner('Node', 'n'), annotations={'kubernetes.io/config.mirror': 'x'}), OPTS,
     ('skip', 'mirror pod')),
    (S.pod('ds', owner_ref=S.owner('DaemonSet', 'd')), OPTS, ('skip', 'DaemonSet-managed pod')),
    (S.pod('ds', owner_ref=S.owner('DaemonSet', 'd')), D.DrainOptions(ignore_daemonsets=False),
     ('block', 'DaemonSet-managed pod (set ignore_daemonsets)')),
    (S.pod('rs', owner_ref=S.owner('ReplicaSet', 'r')), OPTS, ('evict', 'managed by ReplicaSet/r')),
    (S.pod('ed', owner_ref=S.owner('ReplicaSet', 'r'), volumes=S.EMPTY_DIR), OPTS,
     ('block', 'uses local storage (emptyDir; set delete_local_data)')),
    (S.pod('ed', owner_ref=S.owner('ReplicaSet', 'r'), volumes=S.EMPTY_DIR), D.DrainOptions(delete_local_data=True),
     ('evict', 'managed by ReplicaSet/r')),
    (S.pod('hp', owner_ref=S.owner('ReplicaSet', 'r'), volumes=S.HOST_PATH), OPTS, ('evict', 'managed by ReplicaSet/r')),
    (S.pod('bare'), OPTS, ('block', 'not managed by a controller (set force)')),
    (S.pod('bare', volumes=S.EMPTY_DIR), OPTS,
     ('block', 'uses local storage (emptyDir; set delete_local_data); not managed by a controller (set force)')),
    (S.pod('bare', volumes=S.EMPTY_DIR), D.DrainOptions(delete_local_data=True),
     ('block', 'not managed by a controller (set force)')),
    (S.pod('bare'), D.DrainOptions(force=True), ('evict', 'managed by no controller (force)')),
    (S.pod('done', phase='Succeeded', volumes=S.EMPTY_DIR), OPTS, ('evict', 'finished pod')),
    (S.launcher_pod('v'), OPTS, ('vmi', 'virt-launcher pod of a VirtualMachineInstance')),
])
def test_classify_pod(pod, opts, expected):
    assert D.classify_pod(pod, opts) == expected


def test_terminating_pod_is_only_waited_for():
    p = S.pod('t', owner_ref=S.owner('ReplicaSet', 'r'))
    p['metadata']['deletionTimestamp'] = '2026-01-01T00:00:00Z'
    assert D.classify_pod(p, OPTS) == ('wait', 'already terminating')


def _scenario_node_objects():
    objs = S.scenario()
    pods = [o for o in objs if o['kind'] == 'Pod' and o['spec']['nodeName'] == S.NODE]
    vmis = [o for o in objs if o['kind'] == 'VirtualMachineInstance']
    vms = {('vms', 'vm-gpu'): [o for o in objs if o['kind'] == 'VirtualMachine'][0]}
    return pods, vmis, vms


def test_plan_blocks_on_local_data_bare_pod_and_vmi_by_default():
    pods, vmis, vms = _scenario_node_objects()
    plan = D.plan_drain(pods, vmis, vms, D.DrainOptions())
    assert sorted((b['kind'], b['name']) for b in plan.blocked) == [
        ('Pod', 'bare-debug'), ('Pod', 'cache-gpu'), ('VirtualMachineInstance', 'vm-gpu')]
    assert sorted(s['name'] for s in plan.skipped) == ['dcgm-exporter-abcde', 'kube-proxy-gpu-1']


def test_plan_with_everything_allowed_and_stop_policy():
    pods, vmis, vms = _scenario_node_objects()
    plan = D.plan_drain(pods, vmis, vms, D.DrainOptions(force=True, delete_local_data=True, vmi_policy='stop'))
    assert plan.blocked == []
    assert sorted(p['metadata']['name'] for p in plan.evict) == [
        'bare-debug', 'cache-gpu', 'dra-pod', 'infer-mig', 'rt-only-0', 'train-gpu', 'web-1']
    assert [(vmi['metadata']['name'], vm['metadata']['name']) for vmi, vm in plan.vm_stops] == [('vm-gpu', 'vm-gpu')]


def test_plan_evict_policy_evicts_the_launcher_pod():
    pods, vmis, vms = _scenario_node_objects()
    plan = D.plan_drain(pods, vmis, vms, D.DrainOptions(force=True, delete_local_data=True, vmi_policy='evict'))
    assert 'virt-launcher-vm-gpu-x7k2p' in [p['metadata']['name'] for p in plan.evict]
    assert [v['metadata']['name'] for v in plan.vmis_to_leave] == ['vm-gpu']


def test_plan_stop_refuses_vmi_without_vm():
    plan = D.plan_drain([], [S.vmi('lonely', vm_owner=False)], {}, D.DrainOptions(vmi_policy='stop'))
    assert [(b['name'], b['reason']) for b in plan.blocked] == [
        ('lonely', 'VirtualMachineInstance without a VirtualMachine cannot be stopped and restarted (vmi_policy=stop)')]


@pytest.mark.parametrize('params,err', [
    ({'timeout': 0}, 'timeout must be > 0, got 0'),
    ({'grace_period': -1}, 'grace_period must be >= 0, got -1'),
    ({'vmi_policy': 'migrate'}, "vmi_policy must be one of refuse, stop, evict, got 'migrate'"),
    ({'wait_for_jobs': {'selector': ' ', 'timeout': 10}}, "wait_for_jobs.selector must be a non-empty label selector, got ' '"),
    ({'wait_for_jobs': {'selector': 'a=b', 'timeout': None}}, 'wait_for_jobs.timeout must be set'),
    ({'parallel': 0}, 'parallel must be > 0, got 0'),
    ({'retry_interval': 0.01}, 'retry_interval must be >= 0.1 seconds, got 0.01'),
])
def test_options_errors_name_field_and_value(params, err):
    with pytest.raises(D.DrainError) as exc:
        D.options_from_params(params)
    assert str(exc.value) == err


# -- the loop over an in-memory client --------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 1000.0
        self.lock = threading.Lock()

    def now(self):
        return self.t

    def sleep(self, s):
        assert s >= 0
        with self.lock:
            self.t += max(s, 0.001)


class FakeClient(D.DrainClient):
    """An in-memory cluster: pods vanish when evicted; `pdb_until[name]` answers 429 until then."""

    def __init__(self, clock, objs, pdb_until=None, errors=None):
        self.clock = clock
        self.nodes = {o['metadata']['name']: o for o in objs if o['kind'] == 'Node'}
        self.pods = {}
        for i, o in enumerate(o for o in objs if o['kind'] == 'Pod'):
            o['metadata'].setdefault('uid', 'uid-%d' % i)
            self.pods[(o['metadata']['namespace'], o['metadata']['name'])] = o
        self.vmis = [o for o in objs if o['kind'] == 'VirtualMachineInstance']
        for i, v in enumerate(self.vmis):
            v['metadata'].setdefault('uid', 'vmi-%d' % i)
        self.vms = {(o['metadata']['namespace'], o['metadata']['name']): o for o in objs if o['kind'] == 'VirtualMachine'}
        self.pdb_until = pdb_until or {}
        self.errors = errors or {}   # name -> list of exceptions raised by evict, in turn
        self.calls = []
        self.lock = threading.Lock()

    def log(self, *call):
        with self.lock:
            self.calls.append(call)

    def get_node(self, name):
        self.log('get_node', name)
        if name not in self.nodes:
            raise NotFoundError('GET node: HTTP 404', status=404)
        return copy.deepcopy(self.nodes[name])

    def update_node(self, name, compute, current=None):
        before = self.get_node(name)
        patch = compute(copy.deepcopy(before))
        if not patch:
            return before, before
        self.log('patch_node', name, json.dumps(patch, sort_keys=True))
        self.nodes[name] = D.apply_merge_patch(before, patch)
        return before, copy.deepcopy(self.nodes[name])

    def list_pods(self, node, label_selector=None):
        self.log('list_pods', node, label_selector)
        out = []
        for p in self.pods.values():
            if p['spec']['nodeName'] != node:
                continue
            if label_selector:
                k, v = label_selector.split('=')
                if p['metadata']['labels'].get(k) != v:
                    continue
            out.append(copy.deepcopy(p))
        return out

    def list_vmis(self, node):
        return [copy.deepcopy(v) for v in self.vmis if v['status']['nodeName'] == node]

    def get_vm(self, namespace, name):
        return copy.deepcopy(self.vms.get((namespace, name)))

    def patch_vm(self, namespace, name, patch):
        self.log('patch_vm', namespace, name, json.dumps(patch, sort_keys=True))
        vm = self.vms[(namespace, name)]
        vm.update(D.apply_merge_patch(vm, patch))
        # the KubeVirt controller: a halted VM's VMI and launcher go away
        self.vmis = [v for v in self.vmis if v['metadata']['name'] != name]
        self.pods = {k: p for k, p in self.pods.items() if D.vmi_owner_of_pod(p) != (namespace, name)}
        return vm

    def evict(self, pod, grace_period):
        name = pod['metadata']['name']
        self.log('evict', name)
        errs = self.errors.get(name)
        if errs:
            raise errs.pop(0)
        if self.clock.now() < self.pdb_until.get(name, 0):
            raise TooManyRequestsError('POST eviction: HTTP 429', status=429, reason='Cannot evict pod as it would '
                                       'violate the pod\'s disruption budget.')
        key = (pod['metadata']['namespace'], name)
        if key not in self.pods:
            raise NotFoundError('404', status=404)
        del self.pods[key]

    def delete_pod(self, pod, grace_period):
        self.log('delete', pod['metadata']['name'])
        self.pods.pop((pod['metadata']['namespace'], pod['metadata']['name']), None)

    def pod_gone(self, pod):
        cur = self.pods.get((pod['metadata']['namespace'], pod['metadata']['name']))
        return cur is None or cur['metadata']['uid'] != pod['metadata']['uid']

    def vmi_gone(self, vmi, node):
        return not any(v['metadata']['name'] == vmi['metadata']['name'] for v in self.vmis)

    def mutations(self):
        return [c for c in self.calls if c[0] in ('patch_node', 'evict', 'delete', 'patch_vm')]


def _simple(extra=()):
    objs = [S.node('n1'), S.node('n2'),
            S.pod('a', node_name='n1', owner_ref=S.owner('ReplicaSet', 'r')),
            S.pod('b', node_name='n1', owner_ref=S.owner('ReplicaSet', 'r')),
            S.pod('ds', node_name='n1', owner_ref=S.owner('DaemonSet', 'd')),
            S.pod('elsewhere', node_name='n2', owner_ref=S.owner('ReplicaSet', 'r'))]
    return objs + list(extra)


def _drainer(client, clock, check_mode=False, **kw):
    kw.setdefault('retry_interval', 5.0)
    return D.Drainer(client, D.DrainOptions(**kw), check_mode=check_mode, clock=clock.now, sleep=clock.sleep)


def test_drain_evicts_skips_daemonsets_and_records_state():
    clock = Clock()
    c = FakeClient(clock, _simple())
    res = _drainer(c, clock).drain('n1')
    assert not res['failed'], res['msg']
    assert sorted(e['name'] for e in res['evicted']) == ['a', 'b']
    assert [s['name'] for s in res['skipped']] == ['ds']
    assert res['changed'] is True and res['initially_unschedulable'] is False
    assert c.nodes['n1']['spec']['unschedulable'] is True
    assert c.nodes['n1']['metadata']['annotations'] == {D.ANN_INITIAL: 'false', D.ANN_STATE: 'drained'}
    assert ('default', 'elsewhere') not in c.pods and ('ml', 'elsewhere') in c.pods
    assert res['diff'] == {'before': {'unschedulable': False, 'annotations': {}},
                           'after': {'unschedulable': True,
                                     'annotations': {D.ANN_INITIAL: 'false', D.ANN_STATE: 'drained'}}}
    again = _drainer(c, clock).drain('n1')
    assert again['changed'] is False and again['evicted'] == [] and not again['failed']


def test_drain_retries_429_until_the_budget_allows():
    clock = Clock()
    c = FakeClient(clock, _simple(), pdb_until={'a': 1012.0})
    res = _drainer(c, clock).drain('n1')
    assert not res['failed'], res['msg']
    assert sorted(e['name'] for e in res['evicted']) == ['a', 'b']
    tries = [call for call in c.calls if call == ('evict', 'a')]
    assert len(tries) == 4          # t=1000, 1005, 1010 refused; 1015 accepted
    assert clock.now() < 1000 + 300


def test_drain_fails_at_the_deadline_node_stays_cordoned():
    clock = Clock()
    c = FakeClient(clock, _simple(), pdb_until={'a': 10 ** 9})
    res = _drainer(c, clock, timeout=30).drain('n1')
    assert res['failed'] is True
    assert [(r['name'], r['reason'].split(':')[0]) for r in res['remaining']] == [
        ('a', 'eviction refused by a PodDisruptionBudget (429)')]
    assert [e['name'] for e in res['evicted']] == ['b']
    assert 'did not complete within the timeout of 30s' in res['msg']
    assert c.nodes['n1']['spec']['unschedulable'] is True
    assert c.nodes['n1']['metadata']['annotations'][D.ANN_STATE] == 'drain-failed'
    assert 1030 <= clock.now() <= 1036


def test_blocked_drain_evicts_nothing_and_lists_blockers():
    clock = Clock()
    objs = S.scenario()
    c = FakeClient(clock, objs)
    res = _drainer(c, clock).drain(S.NODE)
    assert res['failed'] is True
    assert [m for m in c.mutations() if m[0] != 'patch_node'] == []
    assert sorted(b['name'] for b in res['blocked']) == ['bare-debug', 'cache-gpu', 'vm-gpu']
    assert res['msg'].startswith('drain of node gpu-1 blocked before any eviction (the node stays cordoned): ')
    assert 'Pod ml/bare-debug: not managed by a controller (set force)' in res['msg']
    assert c.nodes[S.NODE]['spec']['unschedulable'] is True


def test_stop_policy_records_vms_before_halting_them():
    clock = Clock()
    c = FakeClient(clock, S.scenario())
    res = _drainer(c, clock, force=True, delete_local_data=True, vmi_policy='stop').drain(S.NODE)
    assert not res['failed'], res['msg']
    assert res['stopped_vms'] == [{'namespace': 'vms', 'name': 'vm-gpu', 'runStrategy': 'Always'}]
    muts = c.mutations()
    record_at = next(i for i, m in enumerate(muts) if m[0] == 'patch_node' and D.ANN_STOPPED_VMS in m[2])
    halt_at = next(i for i, m in enumerate(muts) if m[0] == 'patch_vm')
    assert record_at < halt_at
    assert json.loads(c.nodes[S.NODE]['metadata']['annotations'][D.ANN_STOPPED_VMS]) == res['stopped_vms']
    assert c.vms[('vms', 'vm-gpu')]['spec']['runStrategy'] == 'Halted'
    assert ('ml', 'other-gpu') in c.pods


def test_evict_policy_fails_when_the_vmi_stays():
    clock = Clock()
    c = FakeClient(clock, S.scenario())
    res = _drainer(c, clock, force=True, delete_local_data=True, vmi_policy='evict', timeout=20).drain(S.NODE)
    assert res['failed'] is True
    assert [(r['kind'], r['name'], r['reason']) for r in res['remaining']] == [
        ('VirtualMachineInstance', 'vm-gpu', 'VMI still on the node')]
    assert ('vms', 'virt-launcher-vm-gpu-x7k2p') not in c.pods


def test_wait_for_jobs_times_out_and_evicts_nothing():
    clock = Clock()
    job = S.pod('ckpt', node_name='n1', owner_ref=S.owner('Job', 'ckpt'), labels={'role': 'checkpoint'})
    c = FakeClient(clock, _simple([job]))
    res = _drainer(c, clock, wait_for_jobs=D.WaitForJobs('role=checkpoint', 60)).drain('n1')
    assert res['failed'] is True
    assert res['msg'].startswith("wait_for_jobs: 1 pod(s) matching 'role=checkpoint' on node n1 did not finish "
                                 'within 60s; nothing was evicted')
    assert [m for m in c.mutations() if m[0] == 'evict'] == []
    assert {r['name'] for r in res['remaining']} == {'a', 'b', 'ckpt'}


def test_wait_for_jobs_proceeds_once_the_jobs_finish():
    clock = Clock()
    job = S.pod('ckpt', node_name='n1', owner_ref=S.owner('Job', 'ckpt'), labels={'role': 'checkpoint'})
    c = FakeClient(clock, _simple([job]))
    orig = c.list_pods

    def list_pods(node, sel=None):
        if clock.now() > 1020 and ('ml', 'ckpt') in c.pods:
            c.pods[('ml', 'ckpt')]['status']['phase'] = 'Succeeded'
        return orig(node, sel)
    c.list_pods = list_pods
    res = _drainer(c, clock, wait_for_jobs=D.WaitForJobs('role=checkpoint', 60)).drain('n1')
    assert not res['failed'], res['msg']
    assert sorted(e['name'] for e in res['evicted']) == ['a', 'b', 'ckpt']


def test_transient_errors_are_retried_other_errors_fail_the_pod():
    clock = Clock()
    c = FakeClient(clock, _simple(), errors={
        'a': [K8sError('POST eviction: HTTP 503', status=503), K8sError('timeout', status=None)],
        'b': [K8sError('POST eviction: HTTP 403 forbidden', status=403)]})
    res = _drainer(c, clock, timeout=60).drain('n1')
    assert [e['name'] for e in res['evicted']] == ['a']
    assert [(r['name'], r['reason']) for r in res['remaining']] == [('b', 'POST eviction: HTTP 403 forbidden')]
    assert res['failed'] is True


def test_recreated_pod_with_same_name_is_not_the_old_one():
    clock = Clock()
    c = FakeClient(clock, _simple())
    orig = c.evict

    def evict(pod, grace):
        orig(pod, grace)
        if pod['metadata']['name'] == 'a':   # a controller recreates it at once, new UID
            new = S.pod('a', node_name='n1', owner_ref=S.owner('ReplicaSet', 'r'), uid='new-uid')
            c.pods[('ml', 'a')] = new
    c.evict = evict
    res = _drainer(c, clock).drain('n1')
    assert not res['failed'] and sorted(e['name'] for e in res['evicted']) == ['a', 'b']


def test_check_mode_changes_nothing_and_predicts():
    clock = Clock()
    c = FakeClient(clock, _simple())
    before = copy.deepcopy(c.nodes)
    res = _drainer(c, clock, check_mode=True).drain('n1')
    assert c.mutations() == [] and c.nodes == before
    assert res['changed'] is True and sorted(e['name'] for e in res['evicted']) == ['a', 'b']
    assert res['diff']['after'] == {'unschedulable': True,
                                    'annotations': {D.ANN_INITIAL: 'false', D.ANN_STATE: 'drained'}}


def test_disable_eviction_deletes():
    clock = Clock()
    c = FakeClient(clock, _simple())
    res = _drainer(c, clock, disable_eviction=True).drain('n1')
    assert sorted(m[1] for m in c.mutations() if m[0] == 'delete') == ['a', 'b']
    assert not res['failed']


def test_parallel_bound_is_respected():
    clock = Clock()
    objs = [S.node('n1')] + [S.pod('p%02d' % i, node_name='n1', owner_ref=S.owner('ReplicaSet', 'r'))
                             for i in range(30)]
    c = FakeClient(clock, objs)
    active = {'now': 0, 'max': 0}
    lock = threading.Lock()
    orig = c.evict

    def evict(pod, grace):
        with lock:
            active['now'] += 1
            active['max'] = max(active['max'], active['now'])
        import time
        time.sleep(0.01)
        try:
            orig(pod, grace)
        finally:
            with lock:
                active['now'] -= 1
    c.evict = evict
    res = _drainer(c, clock, parallel=4).drain('n1')
    assert len(res['evicted']) == 30
    assert 1 < active['max'] <= 4


def test_option_defaults():
    o = D.options_from_params({})
    assert (o.timeout, o.retry_interval, o.poll_interval, o.parallel, o.vmi_policy, o.ignore_daemonsets,
            o.delete_local_data, o.force, o.disable_eviction, o.wait_for_jobs) == (
        300.0, 2.5, 1.0, 10, 'refuse', True, False, False, False, None)


# -- uncordon keeps `validated`; GPU VMs started again -------------------------------------------
def test_uncordon_keeps_validated_until_upgrade_state_records_done():
    n = _set_by(S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'false', D.ANN_STATE: 'validated'}))
    patch, kept = D.uncordon_patch(n)
    assert (patch, kept) == ({'spec': {'unschedulable': None}, 'metadata': {'annotations': {D.ANN_INITIAL: None}}},
                             False)
    after = D.apply_merge_patch(n, patch)
    assert after['metadata']['annotations'] == {D.ANN_STATE: 'validated'}
    assert D.uncordon_patch(after) == (None, False)
    # the roles' other phases and node_drain's own are removed as before
    for state in ('drained', 'rolled-back', 'failed'):
        n = _set_by(S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'false', D.ANN_STATE: state}))
        assert D.uncordon_patch(n)[0]['metadata'] == {'annotations': {D.ANN_INITIAL: None, D.ANN_STATE: None}}


def _vm_spec(**spec):
    return {'metadata': {'namespace': 'vms', 'name': 'v'}, 'spec': spec}


@pytest.mark.parametrize('original', [{'runStrategy': 'Always'}, {'runStrategy': 'RerunOnFailure'},
                                      {'runStrategy': 'Manual'}, {'running': True}, {}])
def test_vm_start_restores_the_exact_previous_run_state(original):
    vm = _vm_spec(**original)
    stop, record = D.vm_stop_patch(vm)
    halted = D.apply_merge_patch(vm, stop)
    patch, outcome = D.vm_start_patch(halted, record)
    assert outcome == 'start'
    assert D.vm_run_state(D.apply_merge_patch(halted, patch)) == original
    # once restored: nothing to do
    assert D.vm_start_patch(D.apply_merge_patch(halted, patch), record) == (None, 'unchanged')


def test_vm_start_of_a_vm_halted_before_the_drain_is_a_no_op():
    for spec in ({'runStrategy': 'Halted'}, {'running': False}):
        vm = _vm_spec(**spec)
        stop, record = D.vm_stop_patch(vm)
        assert stop is None
        assert D.vm_start_patch(vm, record) == (None, 'unchanged')


def test_vm_start_leaves_a_vm_whose_run_state_changed_since_the_drain():
    assert D.vm_start_patch(_vm_spec(runStrategy='Manual'), {'runStrategy': 'Always'}) == (None, 'left')
    assert D.vm_start_patch(_vm_spec(runStrategy='Always'), {'running': True}) == (None, 'left')
    assert D.vm_start_patch(_vm_spec(running=True), {'runStrategy': None}) == (None, 'left')


def test_parse_stopped_vms_names_the_annotation_on_bad_input():
    assert D.parse_stopped_vms(None) == []
    with pytest.raises(D.DrainError, match='annotation gpufleet.io/stopped-vms: not JSON'):
        D.parse_stopped_vms('{oops')
    with pytest.raises(D.DrainError, match=r'expected a list of \{namespace, name, runStrategy\|running\}'):
        D.parse_stopped_vms('[{"name": "x"}]')


def _stopped_cluster(state='validated'):
    vm_a, vm_b, vm_c = S.vm('a'), S.vm('b', run_strategy=None), S.vm('c')
    records = []
    for vm in (vm_a, vm_b, vm_c):
        patch, rec = D.vm_stop_patch(vm)
        vm.update(D.apply_merge_patch(vm, patch))
        records.append(rec)
    vm_c['spec']['runStrategy'] = 'Manual'     # someone took charge of c since the drain
    ann = {D.ANN_STOPPED_VMS: D.merge_stopped_vms(None, records + [{'namespace': 'vms', 'name': 'gone',
                                                                    'runStrategy': 'Always'}])}
    if state:
        ann[D.ANN_STATE] = state
    return [S.node('n1', annotations=ann), vm_a, vm_b, vm_c]


def test_start_vms_restores_records_and_clears_the_annotation():
    clock = Clock()
    c = FakeClient(clock, _stopped_cluster())
    res = _drainer(c, clock).start_vms('n1')
    assert not res['failed'] and res['changed'] is True
    assert [r['name'] for r in res['started_vms']] == ['a', 'b']
    assert [(r['name'], r['reason']) for r in res['left_vms']] == [
        ('c', 'its run state changed since the drain halted it (now {"runStrategy": "Manual"}): left as it is'),
        ('gone', 'the VirtualMachine no longer exists')]
    assert c.vms[('vms', 'a')]['spec']['runStrategy'] == 'Always'
    assert c.vms[('vms', 'b')]['spec'] == {'template': c.vms[('vms', 'b')]['spec']['template'], 'running': True}
    assert c.vms[('vms', 'c')]['spec']['runStrategy'] == 'Manual'
    assert D.ANN_STOPPED_VMS not in c.nodes['n1']['metadata']['annotations']
    assert res['before']['vms'] == {'vms/a': {'runStrategy': 'Halted'}, 'vms/b': {'running': False},
                                    'vms/c': {'runStrategy': 'Manual'}}
    assert res['after']['vms'] == {'vms/a': {'runStrategy': 'Always'}, 'vms/b': {'running': True},
                                   'vms/c': {'runStrategy': 'Manual'}}
    # idempotent: nothing recorded any more
    c.calls.clear()
    again = _drainer(c, clock).start_vms('n1')
    assert again['changed'] is False and again['started_vms'] == [] and c.mutations() == []


def test_start_vms_check_mode_writes_nothing():
    clock = Clock()
    c = FakeClient(clock, _stopped_cluster())
    res = _drainer(c, clock, check_mode=True).start_vms('n1')
    assert res['changed'] is True and [r['name'] for r in res['started_vms']] == ['a', 'b']
    assert c.mutations() == []
    assert D.ANN_STOPPED_VMS not in res['after']['node']['annotations']
    assert D.ANN_STOPPED_VMS in c.nodes['n1']['metadata']['annotations']


@pytest.mark.parametrize('state', ['failed', 'rolled-back', 'drain-failed'])
def test_start_vms_refuses_on_a_failed_node(state):
    clock = Clock()
    c = FakeClient(clock, _stopped_cluster(state))
    with pytest.raises(D.DrainError, match='records gpufleet.io/upgrade-state=%s: its 4 stopped VM\\(s\\) '
                       r'\(vms/a, vms/b, vms/c, vms/gone\) are not started on a failed node' % state):
        _drainer(c, clock).start_vms('n1')
    assert c.mutations() == []


def test_start_vms_keeps_the_record_of_a_vm_whose_start_failed():
    clock = Clock()
    c = FakeClient(clock, _stopped_cluster())
    real = c.patch_vm

    def patch_vm(namespace, name, patch):
        if name == 'b':
            raise K8sError('PATCH virtualmachines/b: HTTP 403 forbidden', status=403)
        return real(namespace, name, patch)

    c.patch_vm = patch_vm
    res = _drainer(c, clock).start_vms('n1')
    assert res['failed'] is True
    assert res['msg'] == ('starting 1 VirtualMachine(s) of node n1 failed; their record stays in '
                          'gpufleet.io/stopped-vms: vms/b: PATCH virtualmachines/b: HTTP 403 forbidden')
    assert json.loads(c.nodes['n1']['metadata']['annotations'][D.ANN_STOPPED_VMS]) == [
        {'namespace': 'vms', 'name': 'b', 'running': True}]
    assert c.vms[('vms', 'a')]['spec']['runStrategy'] == 'Always'


# -- issue 12: a 409 from the eviction subresource is not "pod gone" ----------------------------
PDB_CONFLICT = ('Operation cannot be fulfilled on poddisruptionbudgets.policy "web": the object has been modified; '
                'please apply your changes to the latest version and try again')


def test_eviction_409_while_the_same_pod_is_there_is_retried():
    """The API server answers 409 when its own PodDisruptionBudget status update conflicts: the pod
    is still running, so the drain re-reads it by UID and evicts again."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import ConflictError
    clock = Clock()
    c = FakeClient(clock, _simple(), errors={'a': [ConflictError('POST eviction: HTTP 409 ' + PDB_CONFLICT,
                                                                 status=409, reason=PDB_CONFLICT)] * 2})
    res = _drainer(c, clock).drain('n1')
    assert not res['failed'], res['msg']
    assert res['state'] == 'drained'
    assert ('ml', 'a') not in c.pods
    assert [call for call in c.calls if call == ('evict', 'a')] == [('evict', 'a')] * 3
    assert sorted(e['name'] for e in res['evicted']) == ['a', 'b']


def test_eviction_409_persisting_to_the_deadline_fails_the_drain():
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import ConflictError
    clock = Clock()
    c = FakeClient(clock, _simple(), errors={'a': [ConflictError('POST eviction: HTTP 409', status=409,
                                                                 reason=PDB_CONFLICT)] * 1000})
    res = _drainer(c, clock, timeout=30).drain('n1')
    assert res['failed'] is True and res['state'] == 'drain-failed'
    assert [(r['name'], r['reason']) for r in res['remaining']] == [
        ('a', 'eviction answered 409 Conflict (%s) while the pod is still there'
         % PDB_CONFLICT)]
    assert any(p['metadata']['name'] == 'a' for p in c.pods.values())


def test_eviction_409_for_a_replaced_pod_counts_as_gone():
    """The UID precondition failed: a new pod took the name; the one we classified is gone."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import ConflictError
    clock = Clock()
    c = FakeClient(clock, _simple())
    key = [k for k in c.pods if k[1] == 'a'][0]

    def replaced(pod, grace):
        c.pods[key] = dict(c.pods[key], metadata=dict(c.pods[key]['metadata'], uid='new-uid'))
        raise ConflictError('POST eviction: HTTP 409 Precondition failed: UID in precondition', status=409)
    c.errors = {}
    orig = c.evict
    c.evict = lambda pod, grace: replaced(pod, grace) if pod['metadata']['name'] == 'a' else orig(pod, grace)
    res = _drainer(c, clock).drain('n1')
    assert not res['failed'], res['msg']
    assert c.pods[key]['metadata']['uid'] == 'new-uid'


# -- T3-24: a 404 from the eviction subresource is confirmed by a read of the pod --------------
MISROUTED = 'the server could not find the requested resource'


def test_eviction_404_while_the_same_pod_is_there_is_retried():
    """A misrouting proxy or an API aggregation error answers 404 with the pod still running: the
    drain reads the pod by name, finds the same UID and evicts again."""
    clock = Clock()
    c = FakeClient(clock, _simple(), errors={'a': [NotFoundError('POST eviction: HTTP 404', status=404,
                                                                 reason=MISROUTED)] * 2})
    res = _drainer(c, clock).drain('n1')
    assert not res['failed'], res['msg']
    assert res['state'] == 'drained'
    assert ('ml', 'a') not in c.pods
    assert [call for call in c.calls if call == ('evict', 'a')] == [('evict', 'a')] * 3


def test_eviction_404_persisting_to_the_deadline_fails_the_drain():
    clock = Clock()
    c = FakeClient(clock, _simple(), errors={'a': [NotFoundError('POST eviction: HTTP 404', status=404,
                                                                 reason=MISROUTED)] * 1000})
    res = _drainer(c, clock, timeout=30).drain('n1')
    assert res['failed'] is True and res['state'] == 'drain-failed'
    assert [(r['name'], r['reason']) for r in res['remaining']] == [
        ('a', 'eviction answered 404 Not Found (%s) while the pod is still there' % MISROUTED)]
    assert any(p['metadata']['name'] == 'a' for p in c.pods.values())


def test_deletion_404_under_disable_eviction_is_confirmed_too():
    clock = Clock()
    c = FakeClient(clock, _simple())

    def misrouted(pod, grace):
        c.log('delete', pod['metadata']['name'])
        raise NotFoundError('DELETE pod: HTTP 404', status=404)
    c.delete_pod = misrouted
    res = _drainer(c, clock, timeout=10, disable_eviction=True).drain('n1')
    assert res['failed'] is True and res['state'] == 'drain-failed'
    assert sorted((r['name'], r['reason']) for r in res['remaining']) == [
        ('a', 'deletion answered 404 Not Found (DELETE pod: HTTP 404) while the pod is still there'),
        ('b', 'deletion answered 404 Not Found (DELETE pod: HTTP 404) while the pod is still there')]


# -- issue 12: every wait of a drain round stays inside the drain's timeout --------------------
class SlowPool:
    """A urllib3 pool stand-in on a fake clock: every request takes its whole timeout and times out."""

    def __init__(self, clock, answers=None):
        self.clock = clock
        self.timeouts = []
        self.answers = answers or {}

    def request(self, method, url, body=None, headers=None, timeout=None, retries=None, preload_content=True):
        import urllib3
        path = url.split('://', 1)[1].split('/', 1)[1].split('?')[0]
        for (m, suffix), answer in self.answers.items():
            if m == method and ('/' + path).endswith(suffix):
                got = answer()
                if got is not None:
                    return got
        self.timeouts.append(timeout.total)
        self.clock.t += timeout.total
        raise urllib3.exceptions.ReadTimeoutError(None, url, 'read timed out')


def test_a_drain_round_stays_inside_its_timeout_when_the_api_stops_answering():
    """After the eviction the pod list stops answering: each check of the deletion would wait four
    30 s request timeouts; the rounds end at the drain's deadline all the same."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _k8s as K

    class Answer:
        def __init__(self, status, body):
            self.status, self.data = status, json.dumps(body).encode()

    clock = Clock()
    node = S.node('n1')
    node['metadata']['resourceVersion'] = '1'
    pod = S.pod('a', node_name='n1', owner_ref=S.owner('ReplicaSet', 'r'))
    pod['metadata']['uid'] = 'u-a'
    lists = {'n': 0}

    def list_pods():
        lists['n'] += 1
        return Answer(200, {'items': [pod], 'metadata': {}}) if lists['n'] == 1 else None  # then: no answer

    pool = SlowPool(clock, {('GET', '/nodes/n1'): lambda: Answer(200, node),
                            ('PATCH', '/nodes/n1'): lambda: Answer(200, D.apply_merge_patch(node, D.cordon_patch(node))),
                            ('GET', '/pods'): list_pods,
                            ('GET', '/virtualmachineinstances'): lambda: Answer(404, {}),
                            ('POST', '/eviction'): lambda: Answer(201, {})})
    api = K.ApiConnection('https://api.test', pool, {}, [], True, 'options')
    k8s = K.K8sClient(api, request_timeout=30, sleep=clock.sleep, clock=clock.now)
    start = clock.now()
    res = D.Drainer(D.KubeDrainClient(k8s), D.DrainOptions(timeout=20, retry_interval=1), clock=clock.now,
                    sleep=clock.sleep).drain('n1')
    assert res['failed'] is True and res['state'] == 'drain-failed'
    assert [r['name'] for r in res['remaining']] == ['a']
    assert pool.timeouts and all(t <= 20 for t in pool.timeouts)
    assert clock.now() - start <= 20.01   # today: 20 s + up to four 30 s timeouts and their backoff


def test_requests_and_get_retries_are_capped_by_the_client_deadline():
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _k8s as K
    clock = Clock()
    pool = SlowPool(clock)
    api = K.ApiConnection('https://api.test', pool, {}, [], True, 'options')
    k8s = K.K8sClient(api, request_timeout=30, sleep=clock.sleep, clock=clock.now)
    with k8s.bounded(clock.now() + 45):
        with pytest.raises(K.K8sError) as exc:
            k8s.get('/api/v1/nodes/n1')
    assert clock.now() - 1000 <= 45
    assert pool.timeouts[0] == 30 and sum(pool.timeouts) <= 45
    assert 'deadline' in str(exc.value)
    # outside the bound: the ordinary request timeout again
    pool.timeouts.clear()
    with pytest.raises(K.K8sError):
        k8s.get('/api/v1/nodes/n1')
    assert pool.timeouts == [30, 30, 30, 30]


# -- issue 12 (3), issue 37 (4), T3-4: a cordon is ours only when the API says we set it ----------
TAINT = 'node.kubernetes.io/unschedulable'


def test_cordoning_a_schedulable_node_refreshes_a_stale_initial_record():
    stale = S.node('n', annotations={D.ANN_INITIAL: 'true', D.ANN_CORDON_TAINT: '2026-01-01T00:00:00Z'})
    assert D.cordon_patch(stale) == {'spec': {'unschedulable': True}, 'metadata': {'annotations': {
        D.ANN_INITIAL: 'false', D.ANN_CORDON_TAINT: None, D.ANN_STATE: 'cordoned'}}}


def test_uncordon_lifts_only_a_cordon_our_field_manager_set():
    ours = _set_by(S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'false'}))
    patch, kept = D.uncordon_patch(ours)
    assert kept is False and patch['spec'] == {'unschedulable': None}
    # uncordoned and cordoned again by someone else since: kubectl cordon owns spec.unschedulable now
    theirs = _set_by(S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'false'}), 'kubectl-cordon')
    patch, kept = D.uncordon_patch(theirs)
    assert kept is True and 'spec' not in (patch or {})
    assert D.uncordon_patch(theirs, uncordon_preexisting=True)[0]['spec'] == {'unschedulable': None}
    # a taint record of an earlier version says nothing either way: the owner decides (and the record goes)
    legacy = _set_by(S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'false',
                                                                  D.ANN_CORDON_TAINT: '2026-07-14T12:00:01Z'}))
    assert D.uncordon_patch(legacy) == ({'spec': {'unschedulable': None}, 'metadata': {'annotations': {
        D.ANN_INITIAL: None, D.ANN_CORDON_TAINT: None}}}, False)


def test_no_recorded_owner_is_not_ours_unless_made_here():
    """T3-4: "no record" used to mean "ours"; now only the caller that made the cordon may say so."""
    bare = S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'false', D.ANN_STATE: 'drained'})
    assert D.is_our_cordon(bare) is False
    patch, kept = D.uncordon_patch(bare)
    assert kept is True and 'spec' not in patch
    assert D.is_our_cordon(bare, made_here=True) is True
    assert D.uncordon_patch(bare, made_here=True)[0]['spec'] == {'unschedulable': None}
    # co-owned (a server-side apply of the same value by someone else): not ours alone
    both = _set_by(json.loads(json.dumps(bare)))
    both['metadata']['managedFields'].append({'manager': 'ops-apply', 'operation': 'Apply', 'fieldsType': 'FieldsV1',
                                              'fieldsV1': {'f:spec': {'f:unschedulable': {}}}})
    assert D.is_our_cordon(both) is False
    # ownership of another field, or of status, is not ownership of the cordon
    other = _set_by(json.loads(json.dumps(bare)))
    other['metadata']['managedFields'][1]['fieldsV1'] = {'f:spec': {'f:taints': {}}}
    assert D.is_our_cordon(other) is False


class ManagingClient(FakeClient):
    """FakeClient plus what the API server and the node lifecycle controller do on a real cluster: the
    manager of each write of spec.unschedulable is recorded in managedFields (the Drainer's writes are
    node_drain's, FIELD_MANAGER; `operator` is kubectl), and the unschedulable taint follows the cordon
    `lag` API calls later (asynchronously, from its informer)."""

    def __init__(self, *a, lag=0, **kw):
        super().__init__(*a, **kw)
        self.lag = lag
        self.pending = None
        self.stamp = 0

    def _own(self, name, manager):
        n = self.nodes[name]
        fields = [e for e in n['metadata'].get('managedFields') or []
                  if 'f:unschedulable' not in (e.get('fieldsV1') or {}).get('f:spec', {})]
        if n['spec'].get('unschedulable') is not None:
            fields.append({'manager': manager, 'operation': 'Update', 'fieldsType': 'FieldsV1',
                           'fieldsV1': {'f:spec': {'f:unschedulable': {}}}})
        n['metadata']['managedFields'] = fields
        self.pending = self.lag if n['spec'].get('unschedulable') else None
        if not n['spec'].get('unschedulable'):
            n['spec']['taints'] = [t for t in n['spec'].get('taints') or [] if t['key'] != TAINT]
        self._tick()

    def _tick(self):
        if self.pending is not None:
            if self.pending <= 0:
                for n in self.nodes.values():
                    if n['spec'].get('unschedulable') and not any(t['key'] == TAINT for t in n['spec'].get('taints') or []):
                        self.stamp += 1
                        n['spec'].setdefault('taints', []).append(
                            {'key': TAINT, 'effect': 'NoSchedule', 'timeAdded': '2026-12-06T10:00:%02dZ' % self.stamp})
                self.pending = None
            else:
                self.pending -= 1

    def operator(self, name, unschedulable):   # kubectl cordon / uncordon
        self.nodes[name]['spec']['unschedulable'] = True if unschedulable else None
        self._own(name, 'kubectl-cordon')

    def get_node(self, name):
        self._tick()
        return super().get_node(name)

    def list_pods(self, node, label_selector=None):
        self._tick()
        return super().list_pods(node, label_selector)

    def update_node(self, name, compute, current=None):
        before, after = super().update_node(name, compute, current)
        if (before['spec'].get('unschedulable') or None) != (after['spec'].get('unschedulable') or None):
            self._own(name, D.FIELD_MANAGER)
        return before, copy.deepcopy(self.nodes[name])


def _daemonset_only():
    return [S.node('n1'), S.pod('ds', node_name='n1', owner_ref=S.owner('DaemonSet', 'd'))]


@pytest.mark.parametrize('objs', [lambda: [S.node('n1')], _daemonset_only], ids=['idle', 'daemonset-only'])
@pytest.mark.parametrize('lag', [0, 3, 100])
def test_a_stale_initial_record_does_not_lift_an_operators_later_cordon(objs, lag):
    """Run 1 drains a node with nothing to evict (the node lifecycle controller taints it before, just
    after or long after the drain's last write: T3-4's race) and fails later (the rescue records failed);
    an operator uncordons, later cordons by hand for a hardware ticket; run 2's uncordon keeps that
    cordon, whatever the timing (before issue 37 (4), only when the taint came first: lag 0)."""
    clock = Clock()
    c = ManagingClient(clock, objs(), lag=lag)
    res = _drainer(c, clock).drain('n1')                         # run 1: drained at once, nothing to evict
    assert not res['failed'] and res['evicted'] == [] and c.nodes['n1']['spec']['unschedulable'] is True
    assert D.ANN_CORDON_TAINT not in c.nodes['n1']['metadata']['annotations']
    c.nodes['n1']['metadata']['annotations'][D.ANN_STATE] = 'failed'
    c.operator('n1', False)                                      # the operator uncordons ...
    c.operator('n1', True)                                       # ... and later cordons for a ticket
    r = _drainer(c, clock).uncordon('n1')                        # run 2
    assert r['kept_cordon'] is True
    assert c.nodes['n1']['spec']['unschedulable'] is True


@pytest.mark.parametrize('objs', [lambda: [S.node('n1')], _daemonset_only, _simple], ids=['idle', 'daemonset-only', 'pods'])
def test_our_cordon_is_lifted_after_a_successful_drain(objs):
    clock = Clock()
    c = ManagingClient(clock, objs(), lag=3)
    assert not _drainer(c, clock).drain('n1')['failed']
    r = _drainer(c, clock).uncordon('n1')
    assert r['kept_cordon'] is False and not c.nodes['n1']['spec'].get('unschedulable')


def test_the_same_drainer_lifts_its_own_cordon_where_the_api_records_no_owner():
    clock = Clock()
    c = FakeClient(clock, _simple())                             # keeps no managedFields
    d = _drainer(c, clock)
    d.cordon('n1')
    assert d.uncordon('n1')['kept_cordon'] is False and not c.nodes['n1']['spec'].get('unschedulable')
    d.cordon('n1')
    assert _drainer(c, clock).uncordon('n1')['kept_cordon'] is True   # another run: no proof, kept


def test_node_writes_name_the_collections_field_manager():
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _k8s as K

    class Answer:
        def __init__(self, status, body):
            self.status, self.data = status, json.dumps(body).encode()

    class Pool:
        urls = []

        def request(self, method, url, **kw):
            self.urls.append((method, url))
            return Answer(200, S.node('n1'))

    pool = Pool()
    k8s = K.K8sClient(K.ApiConnection('https://api.test', pool, {}, [], True, 'options'))
    D.KubeDrainClient(k8s).update_node('n1', D.cordon_patch)
    assert pool.urls == [('GET', 'https://api.test/api/v1/nodes/n1'),
                         ('PATCH', 'https://api.test/api/v1/nodes/n1?fieldManager=gpufleet.upgrade')]


# -- issue 12 (13): `force` is for unmanaged pods; lifting a pre-existing cordon has its own option --
def test_force_no_longer_lifts_a_cordon_that_was_there_before():
    admin = S.node('n', unschedulable=True, annotations={D.ANN_INITIAL: 'true'})
    clock = Clock()
    c = FakeClient(clock, [admin])
    r = D.Drainer(c, D.DrainOptions(force=True), clock=clock.now, sleep=clock.sleep).uncordon('n')
    assert r['kept_cordon'] is True and c.nodes['n']['spec']['unschedulable'] is True
    r = D.Drainer(c, D.DrainOptions(), clock=clock.now, sleep=clock.sleep).uncordon('n', uncordon_preexisting=True)
    assert r['kept_cordon'] is False and not c.nodes['n']['spec'].get('unschedulable')


def test_with_target_ties_the_drains_own_records_to_the_rollout():
    key = 'driver=580.130.00,kernel=6.8.0-134-generic'
    node = {'metadata': {'name': 'n', 'annotations': {}}, 'spec': {}}
    patch = D.with_target(node, D.cordon_patch(node, 'draining'), key)
    assert patch['metadata']['annotations'][D.ANN_TARGET] == key
    assert patch['metadata']['annotations'][D.ANN_STATE] == 'draining'
    # a record of this target already: nothing more to write
    done = {'metadata': {'annotations': {D.ANN_STATE: 'drained', D.ANN_TARGET: key}}, 'spec': {'unschedulable': True}}
    assert D.with_target(done, D.state_patch(done, 'drained'), key) is None
    # another target's record: ours replaces it, and its snapshot digest goes with it
    other = {'metadata': {'annotations': {D.ANN_STATE: 'draining', D.ANN_TARGET: 'driver=1',
                                          'gpufleet.io/snapshot-sha256': 'a' * 64}}, 'spec': {'unschedulable': True}}
    patch = D.with_target(other, D.state_patch(other, 'drained'), key)
    assert patch['metadata']['annotations'] == {D.ANN_STATE: 'drained', D.ANN_TARGET: key,
                                                'gpufleet.io/snapshot-sha256': None}
    # progress that is not the drain's (another rollout's `validated` on a node cordoned by hand) is
    # never relabelled as ours
    stale = {'metadata': {'annotations': {D.ANN_STATE: 'validated', D.ANN_TARGET: 'driver=1',
                                          D.ANN_INITIAL: 'true'}}, 'spec': {'unschedulable': True}}
    assert D.with_target(stale, D.cordon_patch(stale, 'draining'), key) == D.cordon_patch(stale, 'draining')
    assert D.with_target(node, None, None) is None


def test_record_target_must_be_a_target_key():
    with pytest.raises(D.DrainError, match="record_target must be a target key"):
        D.options_from_params({'record_target': 'nonsense'})
    assert D.options_from_params({'record_target': 'driver=1'}).record_target == 'driver=1'
