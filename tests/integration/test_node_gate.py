"""node_gate through ansible-playbook against the real control plane (tests/cluster), as a service account
bound to the reader role of docs/rbac (node_gate is read-only: the audit log shows get/list only)."""
from __future__ import annotations

import threading

import pytest

import rbac_check
from cluster import rbac

pytestmark = pytest.mark.slow

NODE = 'gpu-1'
DP_LABELS = {'app': 'nvidia-device-plugin-daemonset'}
VAL_LABELS = {'app': 'nvidia-operator-validator'}


READER = rbac.user('reader')


@pytest.fixture
def emu(cluster):
    # every test runs node_gate as gpufleet-system/reader, bound to gpufleet-upgrade-reader only
    cluster.gate_kubeconfig = rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-reader')
    return cluster


def node(name=NODE, ready=True, alloc=None, taints=None, unschedulable=True):
    alloc = {'cpu': '64', 'memory': '512Gi', 'pods': '110', 'nvidia.com/gpu': '8'} if alloc is None else alloc
    taint_list = [{'key': 'node.kubernetes.io/unschedulable', 'effect': 'NoSchedule'}] if unschedulable else []
    taint_list += taints or []
    return {'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}},
            'spec': {'unschedulable': unschedulable, 'taints': taint_list},
            'status': {'allocatable': dict(alloc), 'capacity': dict(alloc),
                       'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False',
                                       'reason': 'KubeletReady' if ready else 'KubeletNotReady'}]}}


def pod(name, labels, node_name=NODE, ready=True, ns='gpu-operator'):
    cond = [{'type': t, 'status': 'True' if ready or t == 'PodScheduled' else 'False'}
            for t in ('Initialized', 'Ready', 'ContainersReady', 'PodScheduled')]
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': name, 'namespace': ns, 'labels': labels},
            # tolerate every taint (the real taint manager evicts a pod from a NoExecute-tainted node otherwise)
            'spec': {'nodeName': node_name, 'tolerations': [{'operator': 'Exists'}],
                     'containers': [{'name': 'main', 'image': 'nvcr.io/nvidia/k8s-device-plugin:v0.18.0'}]},
            'status': {'phase': 'Running', 'conditions': cond,
                       'containerStatuses': [{'name': 'main', 'ready': ready, 'restartCount': 0,
                                              'image': 'nvcr.io/nvidia/k8s-device-plugin:v0.18.0',
                                              'state': {'running': {'startedAt': '2026-01-01T00:00:00Z'}}}]}}


def healthy(emu, **node_kw):
    emu.apply([node(**node_kw), node('gpu-2'),
               pod('nvidia-device-plugin-daemonset-a1', DP_LABELS),
               pod('nvidia-device-plugin-daemonset-b2', DP_LABELS, node_name='gpu-2', ready=False),
               pod('nvidia-operator-validator-a1', VAL_LABELS)])
    settled(emu, *([NODE] if node_kw.get('ready', True) else []), 'gpu-2')


NOT_READY_TAINT = 'node.kubernetes.io/not-ready'


def settled(emu, *names):
    """Wait (bounded) until the node lifecycle controller has lifted the not-ready taint the API server's admission
    (TaintNodesByCondition) puts on every Node created, from the named Ready nodes. The gate reports that taint
    as unexpected: its first read must not race the controller."""
    def lifted():
        return all(not any(t['key'] == NOT_READY_TAINT for t in emu.get('v1', 'Node', name)['spec'].get('taints') or [])
                   for name in names)
    emu.wait_for(lifted, timeout=30, interval=0.1, message='the not-ready taint of %s lifted' % ', '.join(names))


def gate(emu, **args):
    task = {'gpufleet.upgrade.node_gate': dict({'kubeconfig': emu.gate_kubeconfig, 'node': NODE,
                                                'expected_gpus': {'nvidia.com/gpu': 8},
                                                'allowed_taints': ['gpufleet.io/canary']}, **args),
            'name': 'gate', 'ignore_errors': True}
    return [{'name': 'node gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}]


def test_node_gate_passes_read_only_and_within_the_reader_role(emu, run_playbook):
    healthy(emu, taints=[{'key': 'gpufleet.io/canary', 'value': 'true', 'effect': 'NoSchedule'}])
    emu.clear_requests()
    mark = emu.audit_mark()
    r = run_playbook(gate(emu))
    res = r.result('gate')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['passed'] is True and res['changed'] is False and res['attempts'] == 1
    assert res['msg'] == 'node gate: PASS for gpu-1 (allocatable, device_plugin, ready, taints, validator)'
    assert res['checks']['allocatable']['evidence']['nvidia.com/gpu'] == {'expected': 8, 'allocatable': 8, 'capacity': 8}
    assert [p['name'] for p in res['checks']['device_plugin']['evidence']['pods']] == ['nvidia-device-plugin-daemonset-a1']
    assert emu.mutating_requests() == []
    assert rbac_check.violations('gpufleet-upgrade-reader', emu.requests) == []
    # what the API server saw from the reader: reads only, none refused
    events = emu.audit_events(since=mark, user=READER)
    assert events and rbac.non_reads(events) == [] and rbac.refused(events) == []


def test_node_gate_fails_with_the_reasons(emu, run_playbook):
    healthy(emu, alloc={'cpu': '64', 'nvidia.com/gpu': '7', 'nvidia.com/mig-1g.10gb': '7'},
            taints=[{'key': 'nvidia.com/gpu-broken', 'effect': 'NoExecute'}])
    emu.patch('v1', 'Pod', 'nvidia-operator-validator-a1', {'status': {'phase': 'Pending', 'conditions': [
        {'type': 'Ready', 'status': 'False'}]}}, namespace='gpu-operator', subresource='status')
    r = run_playbook(gate(emu))
    res = r.result('gate')
    assert res['_event'] == 'runner_on_failed' and res['passed'] is False
    assert res['problems'] == [
        'nvidia.com/gpu: allocatable 7, expected 8',
        'nvidia.com/mig-1g.10gb: allocatable 7, not expected (partition layout or MIG strategy changed?)',
        'GPU Operator validator pod gpu-operator/nvidia-operator-validator-a1 is not Ready (phase Pending)',
        'unexpected taint nvidia.com/gpu-broken:NoExecute']
    assert res['msg'].startswith('node gate: FAIL for gpu-1: nvidia.com/gpu: allocatable 7, expected 8; ')


def test_node_gate_mig_and_missing_plugin_and_missing_node(emu, run_playbook):
    emu.apply([node(alloc={'cpu': '64', 'nvidia.com/mig-1g.10gb': '56'})])
    settled(emu, NODE)
    r = run_playbook(gate(emu, expected_gpus={'nvidia.com/mig-1g.10gb': 56}))
    res = r.result('gate')
    assert res['checks']['allocatable']['passed'] is True
    assert res['problems'] == ['no device plugin pod (app=nvidia-device-plugin-daemonset) on node gpu-1']
    # No count given (what node_upgrade passes for a node with MIG enabled, filter expected_gpus): its own
    # layout, every GPU resource of its capacity allocatable, decides; a count of nvidia.com/gpu would fail it.
    r = run_playbook(gate(emu, expected_gpus={}))
    assert r.result('gate')['checks']['allocatable']['passed'] is True, r.result('gate')['checks']
    r = run_playbook(gate(emu, node='gpu-9'))
    assert r.result('gate')['problems'] == ['node gpu-9 does not exist']


def test_node_gate_waits_until_the_node_is_ready(emu, run_playbook):
    healthy(emu, ready=False)

    def recover():
        # once the gate has read the node NotReady, the kubelet comes back
        # answered, not only sent: the gate has seen NotReady before the kubelet returns, however slow the server
        emu.wait_for(lambda: any(q['verb'] == 'GET' and q['path'] == '/api/v1/nodes/gpu-1' and q.get('status') == 200
                                 for q in emu.requests),
                     timeout=60, message='the gate reading the node')
        emu.start_kubelet(NODE)

    t = threading.Thread(target=recover)
    t.start()
    try:
        r = run_playbook(gate(emu, timeout=60, interval=0.2))
    finally:
        t.join(timeout=70)
    res = r.result('gate')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['attempts'] >= 2 and res['checks']['ready']['evidence']['status'] == 'True'
    assert rbac.refused(emu.audit_events(user=READER)) == []


def test_node_gate_times_out_bounded(emu, run_playbook):
    healthy(emu, ready=False)
    r = run_playbook(gate(emu, timeout=1, interval=0.3))
    res = r.result('gate')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'].startswith('node gate: FAIL for gpu-1: node gpu-1 is not Ready (Ready=False, reason KubeletNotReady)')
    assert 'still failing after' in res['msg'] and res['attempts'] >= 1


def test_node_gate_bad_input(emu, run_playbook):
    r = run_playbook(gate(emu, expected_gpus={'cpu': 8}))
    assert "expected_gpus: 'cpu' is not a GPU resource" in r.result('gate')['msg']
    assert emu.requests == []


def test_node_gate_on_many_nodes_reads_the_cluster_once_per_kind(emu, run_playbook):
    # gpu-1 healthy; gpu-2's device plugin is not Ready; gpu-3 has no known count and lost a GPU (allocatable < capacity)
    healthy(emu, unschedulable=False)
    lost = node('gpu-3', unschedulable=False)
    lost['status']['allocatable']['nvidia.com/gpu'] = '7'
    emu.apply([lost, pod('nvidia-device-plugin-daemonset-c3', DP_LABELS, node_name='gpu-3')])
    settled(emu, 'gpu-3')
    emu.clear_requests()
    mark = emu.audit_mark()
    task = {'gpufleet.upgrade.node_gate': {'kubeconfig': emu.gate_kubeconfig, 'nodes': {
        'gpu-1': {'nvidia.com/gpu': 8}, 'gpu-2': {'nvidia.com/gpu': 8}, 'gpu-3': {}}}, 'name': 'gate', 'ignore_errors': True}
    r = run_playbook([{'name': 'node gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}])
    res = r.result('gate')
    assert res['_event'] == 'runner_on_failed' and res['passed'] is False
    assert res['failed_nodes'] == ['gpu-2', 'gpu-3']
    assert res['nodes']['gpu-1']['passed'] is True
    assert res['problems'] == [
        'gpu-2: device plugin pod gpu-operator/nvidia-device-plugin-daemonset-b2 is not Ready (phase Running)',
        'gpu-3: nvidia.com/gpu: allocatable 7, expected 8']
    assert res['nodes']['gpu-3']['checks']['allocatable']['evidence']['expected_from'] == 'capacity'
    # one list of the Nodes and one of the operand pods (the two default selectors share the key app), whatever
    # the node count; nothing else
    reads = sorted((q['verb'], q['path'], str(q['query'])) for q in emu.requests)
    assert [r[:2] for r in reads] == [('GET', '/api/v1/nodes'), ('GET', '/api/v1/pods')], reads
    assert 'app in (nvidia-device-plugin-daemonset,nvidia-operator-validator)' in reads[1][2], reads
    # the same read's view of each node, as fleet_info gives it (gpus: the allocatable whole GPUs)
    assert [(v['name'], v['ready'], v['gpus']) for v in res['node_views']] == [
        ('gpu-1', True, 8), ('gpu-2', True, 8), ('gpu-3', True, 7)]
    events = emu.audit_events(since=mark, user=READER)
    assert events and rbac.non_reads(events) == [] and rbac.refused(events) == []
    # bad input fails before any request
    emu.clear_requests()
    task['gpufleet.upgrade.node_gate']['nodes'] = {'gpu-1': {'cpu': 1}}
    res = run_playbook([{'name': 'node gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}]).result('gate')
    assert "nodes.gpu-1.expected_gpus: 'cpu' is not a GPU resource" in res['msg'] and emu.requests == []


def test_node_gate_on_the_pools_nodes_recorded_finished(emu, run_playbook):
    # An observation window: the pool's Nodes only (node_selector), and of the nodes named only those the same read
    # records finished for the target (finished_for): gpu-1 is; gpu-2 (device plugin not Ready) finished another
    # target and is not judged; cpu-9 is not in the pool, so not read even if named.
    healthy(emu, unschedulable=False)
    emu.apply([node('cpu-9', unschedulable=False)])
    settled(emu, 'cpu-9')
    for name, key in (('gpu-1', 'target-b'), ('gpu-2', 'target-a'), ('cpu-9', 'target-b')):
        emu.patch('v1', 'Node', name, {'metadata': {'labels': {'pool': 'gpu' if name != 'cpu-9' else 'cpu'},
                                                    'annotations': {'gpufleet.io/upgraded-to': key}}})
    emu.clear_requests()
    mark = emu.audit_mark()
    task = {'gpufleet.upgrade.node_gate': {
        'kubeconfig': emu.gate_kubeconfig, 'nodes': {'gpu-1': {'nvidia.com/gpu': 8}, 'gpu-2': None, 'cpu-9': None},
        'node_selector': 'pool=gpu', 'finished_for': 'target-b', 'validator_selector': 'component=validator'},
        'name': 'gate', 'ignore_errors': True}
    res = run_playbook([{'name': 'node gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}]).result('gate')
    assert res['_event'] == 'runner_on_ok' and res['passed'] is True, res['msg']
    assert list(res['nodes']) == ['gpu-1'] and res['not_finished'] == ['cpu-9', 'gpu-2']
    assert [(v['name'], v['annotations']) for v in res['node_views']] == [
        ('gpu-1', {'gpufleet.io/upgraded-to': 'target-b'}), ('gpu-2', {'gpufleet.io/upgraded-to': 'target-a'})]
    # the Nodes listed with the pool's selector; selectors on two keys: one list of pods each
    reads = [(q['path'], str(q['query'])) for q in emu.requests]
    assert [path for path, _query in reads] == ['/api/v1/nodes', '/api/v1/pods', '/api/v1/pods'], reads
    assert 'pool=gpu' in reads[0][1] and 'component=validator' in reads[2][1], reads
    events = emu.audit_events(since=mark, user=READER)
    assert events and rbac.non_reads(events) == [] and rbac.refused(events) == []
    # the read decides: once gpu-2 records target-b finished too, it is judged (and fails: its device plugin)
    emu.patch('v1', 'Node', 'gpu-2', {'metadata': {'annotations': {'gpufleet.io/upgraded-to': 'target-b'}}})
    res = run_playbook([{'name': 'node gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}]).result('gate')
    assert res['passed'] is False and res['failed_nodes'] == ['gpu-2'] and res['not_finished'] == ['cpu-9']
    # bad input fails before any request
    emu.clear_requests()
    single = {'node_selector': 'pool=gpu', 'nodes': None, 'node': 'gpu-1', 'expected_gpus': {'nvidia.com/gpu': 8}}
    for bad, message in (({'finished_for': ' '}, "finished_for: ' ' is not a target key"), (single, 'node_selector')):
        args = {k: v for k, v in dict(task['gpufleet.upgrade.node_gate'], **bad).items() if v is not None}
        bad_task = dict(task, **{'gpufleet.upgrade.node_gate': args})
        res = run_playbook([{'name': 'node gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [bad_task]}]).result('gate')
        assert res['_event'] == 'runner_on_failed' and message in res['msg'], res['msg']
    assert emu.requests == []
