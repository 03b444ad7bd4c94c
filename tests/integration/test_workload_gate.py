"""workload_gate through ansible-playbook against the real control plane (tests/cluster): Jobs pinned to
the node, placed by the real scheduler, run by the Job controller and KWOK, their pods' logs read through
the API server from KWOK (cluster/logs.py), repeated, compared, cleaned up; as a service account bound to
docs/rbac's workload-gate role in the qualification namespace only."""
from __future__ import annotations

import json
import threading

import pytest

import rbac_check
from cluster import rbac
from cluster.logs import LOGS_ANNOTATION, PodLogWriter

pytestmark = pytest.mark.slow

NODE = 'gpu-1'
NS = 'qualify'
ANN = 'gpufleet.test/'


@pytest.fixture
def emu(cluster):
    cluster.apply([
        # gpu-0 is free and untainted: pinning is what puts the pods on gpu-1
        node('gpu-0', cordoned=False, taints=[]),
        node(NODE, cordoned=True, taints=[{'key': 'gpufleet.io/canary', 'value': 'true', 'effect': 'NoSchedule'}]),
        {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': NS}},
    ])
    # the gate runs as gpufleet-system/workload-gate, bound to its role in the qualification namespace only
    cluster.gate_kubeconfig = rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-workload-gate', namespace=NS)
    mark = cluster.audit_mark()
    with PodLogWriter(cluster):   # the Job pods' logs (their gpufleet.test/logs annotation), served by KWOK
        yield cluster
    # nothing the gate sent was refused by the API server's RBAC authorizer
    assert rbac.refused(cluster.audit_events(since=mark, user=rbac.user('workload-gate'))) == []


def node(name, cordoned, taints):
    t = list(taints)
    if cordoned:
        t.append({'key': 'node.kubernetes.io/unschedulable', 'effect': 'NoSchedule'})
    return {'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}},
            'spec': {'unschedulable': cordoned, 'taints': t},
            'status': {'allocatable': dict(RESOURCES), 'capacity': dict(RESOURCES),
                       'conditions': [{'type': 'Ready', 'status': 'True'}]}}


RESOURCES = {'cpu': '64', 'memory': '512Gi', 'pods': '110', 'nvidia.com/gpu': '8'}


def job(logs='', duration='0.1', outcome='Succeeded', extra_ann=None):
    """A qualification Job whose pod runs `duration` seconds (KWOK), logs `logs` and ends `outcome`."""
    ann = {ANN + 'run-time': duration + 's', LOGS_ANNOTATION: logs}
    if outcome == 'Failed':
        ann[ANN + 'exit-code'] = '1'
    ann.update(extra_ann or {})
    return {'apiVersion': 'batch/v1', 'kind': 'Job', 'metadata': {'name': 'template'},
            'spec': {'template': {'metadata': {'annotations': ann},
                                  'spec': {'containers': [{'name': 'main', 'image': 'registry.local/qual:1',
                                                           'resources': {'limits': {'nvidia.com/gpu': '1'}}}]}}}}


def play(emu, cases, **args):
    """The play of one workload_gate task; an argument given as None is left out (node=None with nodes)."""
    module_args = dict({'kubeconfig': emu.gate_kubeconfig, 'node': NODE, 'namespace': NS, 'cases': cases,
                        'poll_interval': 0.1, 'timeout': 30}, **args)
    task = {'gpufleet.upgrade.workload_gate': {key: value for key, value in module_args.items() if value is not None},
            'name': 'gate', 'ignore_errors': True}
    return [{'name': 'workload gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [task]}]


def leftovers(emu):
    return ([j['metadata']['name'] for j in emu.list('batch/v1', 'Job', namespace=NS)],
            [p['metadata']['name'] for p in emu.list('v1', 'Pod', namespace=NS)])


def cleaned_up(emu):
    """The gate deleted its Jobs and pods; the API server, garbage collector and KWOK finish the deletion
    (the Job controller's tracking finalizer is removed first), so wait for it, bounded."""
    emu.wait_for(lambda: leftovers(emu) == ([], []), timeout=30, message='the Jobs and pods to be gone')
    return True


def test_workload_gate_passes_pinned_repeated_and_cleaned_up(emu, run_playbook):
    cases = [
        {'name': 'device-query', 'manifest': job('Device 0: NVIDIA H100\nResult = PASS\n'), 'expected': 'Result = PASS'},
        {'name': 'matmul', 'manifest': job('warmup\n{"checksum": 1234.5004, "gpus": 1}\n'),
         'result': {'json_path': 'checksum'}, 'expected': 1234.5, 'tolerance': 0.001},
        {'name': 'tput', 'manifest': job('images/s=1985\n'), 'result': {'regex': r'images/s=(\d+)'},
         'expected': 2000, 'tolerance_percent': 1},
    ]
    emu.clear_requests()
    r = run_playbook(play(emu, cases))
    res = r.result('gate')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['passed'] is True and res['changed'] is False
    assert res['msg'] == 'workload gate: PASS on gpu-1 (3 case(s) x 3 run(s))'
    for name in ('device-query', 'matmul', 'tput'):
        runs = res['checks'][name]['evidence']['runs']
        assert [x['attempt'] for x in runs] == [1, 2, 3]
        assert all(x['ok'] and x['node'] == NODE and x['outcome'] == 'match' for x in runs)
    assert res['checks']['matmul']['evidence']['runs'][0]['value'] == 1234.5004
    assert res['checks']['tput']['evidence']['runs'][0]['value'] == '1985'
    assert len(res['jobs']['created']) == 9 and res['jobs']['deleted'] == res['jobs']['created']
    assert res['jobs']['left'] == []
    assert cleaned_up(emu)
    # what was created: pinned by nodeSelector, with the canary and cordon tolerations, labelled
    posts = [q for q in emu.requests if q['verb'] == 'POST']
    assert len(posts) == 9
    body = posts[0]['body'] if isinstance(posts[0]['body'], dict) else json.loads(posts[0]['body'])
    pspec = body['spec']['template']['spec']
    assert pspec['nodeSelector'] == {'kubernetes.io/hostname': NODE}
    assert {'key': 'gpufleet.io/canary', 'operator': 'Exists', 'effect': 'NoSchedule'} in pspec['tolerations']
    assert {'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'} in pspec['tolerations']
    assert body['metadata']['labels']['gpufleet.io/workload-gate'] == res['run_id']
    assert rbac_check.violations('gpufleet-upgrade-workload-gate', emu.requests, namespace=NS) == []


def test_workload_gate_mismatch_and_failed_job(emu, run_playbook):
    cases = [
        {'name': 'matmul', 'manifest': job('{"checksum": 1240.0}'), 'result': {'json_path': 'checksum'},
         'expected': 1234.5, 'tolerance': 0.001},
        {'name': 'nccl', 'manifest': job('NCCL WARN cudaErrorUnsupportedPtxVersion\n', outcome='Failed'),
         'expected': 'ok'},
    ]
    r = run_playbook(play(emu, cases, repeat=2))
    res = r.result('gate')
    assert res['_event'] == 'runner_on_failed' and res['passed'] is False
    p = res['problems']
    assert len(p) == 4
    assert p[0].startswith('matmul run 1/2 (Job matmul-%s-1): result mismatch: 1240.0 vs expected 1234.5: '
                           '|difference| 5.5 > tolerance 0.001' % res['run_id'])
    assert p[2].startswith('nccl run 1/2 (Job nccl-%s-1): the Job failed (BackoffLimitExceeded' % res['run_id'])
    assert p[2].endswith('last log line: NCCL WARN cudaErrorUnsupportedPtxVersion')
    assert cleaned_up(emu)


def test_workload_gate_timeout(emu, run_playbook):
    r = run_playbook(play(emu, [{'name': 'slow', 'manifest': job('done', duration='120'), 'expected': 'done'}],
                          repeat=1, timeout=2))
    res = r.result('gate')
    assert res['_event'] == 'runner_on_failed'
    assert res['problems'] == ['slow run 1/1 (Job slow-%s-1): timeout: the Job did not finish within 2s' % res['run_id']]
    assert cleaned_up(emu)


def test_workload_gate_unschedulable_without_cordon_toleration_times_out(emu, run_playbook):
    # The reason is named only if, within the timeout, the Job controller created the pod, the scheduler marked it
    # unschedulable and a poll of the gate saw that (0.05-0.1 s from the Job's creation to the scheduler's verdict on
    # an idle machine, 2026-12-07): 5 s leaves that chain a wide margin on a loaded machine; the wait itself always
    # lasts the whole timeout (the pod can never be placed).
    r = run_playbook(play(emu, [{'name': 'q', 'manifest': job('ok'), 'expected': 'ok'}], repeat=1, timeout=5,
                          tolerate_cordon=False))
    res = r.result('gate')
    assert res['_event'] == 'runner_on_failed'
    assert 'timeout: the Job did not finish within 5s (pod unschedulable:' in res['problems'][0]


def test_workload_gate_init_failure(emu, run_playbook):
    # KWOK leaves the pod's status to the test (gpufleet.test/status); the pod has the CUDA check as init container
    manifest = job('never', extra_ann={ANN + 'status': 'fixed'})
    manifest['spec']['template']['spec']['initContainers'] = [{'name': 'cuda-check', 'image': 'registry.local/cuda-check:1'}]

    def crash_init():
        # the kubelet's view of a broken CUDA init container: bound to the node, init in CrashLoopBackOff
        pods = emu.wait_for(lambda: [p for p in emu.list('v1', 'Pod', namespace=NS) if p['spec'].get('nodeName')],
                            timeout=60, message='the Job pod bound by the scheduler')
        name = pods[0]['metadata']['name']
        emu.patch('v1', 'Pod', name, {'status': {'phase': 'Pending', 'initContainerStatuses': [
            {'name': 'cuda-check', 'ready': False, 'restartCount': 3,
             'state': {'waiting': {'reason': 'CrashLoopBackOff', 'message': 'back-off 40s restarting failed container'}}}]}},
            namespace=NS, subresource='status')

    t = threading.Thread(target=crash_init)
    t.start()
    try:
        r = run_playbook(play(emu, [{'name': 'q', 'manifest': manifest, 'expected': 'ok'}], repeat=1))
    finally:
        t.join(timeout=70)
    res = r.result('gate')
    assert res['_event'] == 'runner_on_failed'
    run = res['checks']['q']['evidence']['runs'][0]
    assert run['outcome'] == 'init_failure' and run['node'] == NODE
    assert res['problems'][0].endswith('initialisation failure: init container cuda-check of pod %s: CrashLoopBackOff: '
                                       'back-off 40s restarting failed container' % run['pod'])
    assert cleaned_up(emu)


def test_workload_gate_check_mode_and_no_cleanup(emu, run_playbook):
    cases = [{'name': 'q', 'manifest': job('ok'), 'expected': 'ok'}]
    emu.clear_requests()
    r = run_playbook(play(emu, cases), cmdline='--check')
    # the gate reports itself skipped: Ansible shows the task as skipped, nothing was sent
    assert r.result('gate')['_event'] == 'runner_on_skipped'
    assert r.rc == 0
    assert emu.requests == []
    r = run_playbook(play(emu, cases, repeat=1, cleanup=False))
    res = r.result('gate')
    assert res['passed'] is True and res['changed'] is True
    assert leftovers(emu)[0] == res['jobs']['left'] == res['jobs']['created']


def test_workload_gate_clears_the_jobs_a_killed_run_left_before_its_first_job(emu, run_playbook):
    """T3-17: a controller killed mid-gate never ran its cleanup; its Job's pod still runs on the node and holds
    every GPU. The rerun (a new run id) deletes that Job and its pod first, so its own Job gets a GPU; a finished
    Job of the earlier run and a running one on another node are left as they are."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _workload_gate as W
    held = job('never', duration='600')
    held['spec']['template']['spec']['containers'][0]['resources']['limits']['nvidia.com/gpu'] = '8'
    quick = job('ok')
    del quick['spec']['template']['spec']['containers'][0]['resources']
    earlier = W.normalize_cases([{'name': 'q', 'manifest': held, 'expected': 'ok'},
                                 {'name': 'fin', 'manifest': quick, 'expected': 'ok'}])
    emu.apply([W.build_job(earlier[0], name, 0, 'old123', NS, {'kubernetes.io/hostname': name}, W.DEFAULT_TOLERATION,
                           600, name_suffix=suffix) for name, suffix in ((NODE, ''), ('gpu-0', '-0'))]
              + [W.build_job(earlier[1], NODE, 0, 'old123', NS, {'kubernetes.io/hostname': NODE}, W.DEFAULT_TOLERATION,
                             600)])

    def settled():
        running = [p for p in emu.list('v1', 'Pod', namespace=NS) if (p.get('status') or {}).get('phase') == 'Running']
        finished = [j for j in emu.list('batch/v1', 'Job', namespace=NS)
                    if any(c.get('type') == 'Complete' for c in (j.get('status') or {}).get('conditions') or [])]
        return len(running) == 2 and len(finished) == 1
    emu.wait_for(settled, timeout=60, message="the earlier run's pods to run and its short Job to finish")
    r = run_playbook(play(emu, [{'name': 'q', 'manifest': job('ok'), 'expected': 'ok'}], repeat=1, timeout=20))
    res = r.result('gate')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['passed'] is True and res['changed'] is True
    assert res['stale_jobs'] == ['q-old123-1']
    emu.wait_for(lambda: sorted(leftovers(emu)[0]) == ['fin-old123-1', 'q-old123-1-0'], timeout=30,
                 message="only the finished Job and gpu-0's to be left")


def test_workload_gate_bad_case(emu, run_playbook):
    r = run_playbook(play(emu, [{'name': 'q', 'manifest': {'kind': 'Pod', 'apiVersion': 'v1'}, 'expected': 1}]))
    assert r.result('gate')['msg'] == "cases[0] (q).manifest: not a batch/v1 Job manifest (kind 'Pod', apiVersion 'v1')"


# -- several nodes at once (the rollout's observation windows) -----------------------------------------------------

NODES = ['gpu-1', 'gpu-2', 'gpu-3']
CANARY = [{'key': 'gpufleet.io/canary', 'value': 'true', 'effect': 'NoSchedule'}]


def body_of(request):
    return request['body'] if isinstance(request['body'], dict) else json.loads(request['body'])


def test_workload_gate_nodes_run_at_once_on_every_node(emu, run_playbook):
    # gpu-2 and gpu-3 join gpu-1 (cordoned, canary-tainted); gpu-0 stays free: only the pinning places the pods
    emu.apply([node(name, cordoned=True, taints=CANARY) for name in NODES[1:]])
    cases = [
        {'name': 'device-query', 'manifest': job('Device 0: NVIDIA H100\nResult = PASS\n', duration='1'),
         'expected': 'Result = PASS'},
        {'name': 'matmul', 'manifest': job('{"checksum": 1234.5004}\n', duration='1'), 'result': {'json_path': 'checksum'},
         'expected': 1234.5, 'tolerance': 0.001},
    ]
    emu.clear_requests()
    played = run_playbook(play(emu, cases, node=None, nodes=NODES, repeat=2))
    res = played.result('gate')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['passed'] is True and res['changed'] is False and res['failed_nodes'] == [] and res['problems'] == []
    assert res['msg'] == 'workload gate: PASS on 3 node(s) (gpu-1, gpu-2, gpu-3) (2 case(s) x 2 run(s))'
    assert sorted(res['nodes']) == NODES
    for name in NODES:
        one = res['nodes'][name]
        assert one['node'] == name and one['passed'] is True and one['run_id'] == res['run_id']
        assert one['msg'] == 'workload gate: PASS on %s (2 case(s) x 2 run(s))' % name
        for case_name in ('device-query', 'matmul'):
            runs = one['checks'][case_name]['evidence']['runs']
            assert [run['attempt'] for run in runs] == [1, 2]
            # placed by the real scheduler on the node it was pinned to, read and compared
            assert all(run['ok'] and run['node'] == name and run['outcome'] == 'match' for run in runs), runs
        assert len(one['jobs']['created']) == 4 and one['jobs']['deleted'] == one['jobs']['created']
    assert len(res['jobs']['created']) == 12 and res['jobs']['deleted'] == res['jobs']['created']
    assert res['jobs']['left'] == []
    assert cleaned_up(emu)
    # concurrent: each attempt's three Jobs were all created before any of them was deleted (they existed at the
    # same time), and no attempt waited for another node's Job to finish first
    jobs_path = '/apis/batch/v1/namespaces/%s/jobs' % NS
    bodies = [body_of(request) for request in emu.requests if request['verb'] == 'POST']
    writes = []   # the Job writes, in the order sent
    for request in emu.requests:
        if request['verb'] == 'POST':
            writes.append(('POST', body_of(request)['metadata']['name']))
        elif request['verb'] == 'DELETE' and request['path'].startswith(jobs_path + '/'):
            writes.append(('DELETE', request['path'].rsplit('/', 1)[-1]))
    for case_name in ('device-query', 'matmul'):
        for attempt in (1, 2):
            names = {res['nodes'][name]['checks'][case_name]['evidence']['runs'][attempt - 1]['job'] for name in NODES}
            assert len(names) == 3
            last_post = max(writes.index(('POST', jname)) for jname in names)
            first_delete = min(writes.index(('DELETE', jname)) for jname in names)
            assert last_post < first_delete, writes
    # each Job pinned to its own node, all with the run's label
    assert [body['spec']['template']['spec']['nodeSelector'] for body in bodies[:3]] == [
        {'kubernetes.io/hostname': name} for name in NODES]
    assert {body['metadata']['labels']['gpufleet.io/workload-gate'] for body in bodies} == {res['run_id']}
    # the watch: one LIST of the run's Jobs and one LIST of its pods per poll, never a GET per Job
    reads = [request['path'] for request in emu.requests if request['verb'] == 'GET']
    assert not [path for path in reads if path.startswith(jobs_path + '/')]
    job_lists, pod_lists = reads.count(jobs_path), reads.count('/api/v1/namespaces/%s/pods' % NS)
    # one LIST of Jobs first (an earlier run's, none here); then one LIST of pods per attempt's cleanup too
    assert job_lists and pod_lists == (job_lists - 1) + 4
    assert rbac_check.violations('gpufleet-upgrade-workload-gate', emu.requests, namespace=NS) == []


def test_workload_gate_nodes_one_node_fails(emu, run_playbook):
    # gpu-404 does not exist: its Job cannot be placed and times out (bounded); the other nodes pass meanwhile. Their
    # Jobs took 1.1-1.3 s from creation to the verdict on an idle machine (2026-12-07), so the 3 s this test had raced
    # them on a loaded one; 10 s is a margin a machine several times slower still meets (the test lasts the timeout).
    played = run_playbook(play(emu, [{'name': 'q', 'manifest': job('ok'), 'expected': 'ok'}], node=None,
                          nodes=['gpu-0', NODE, 'gpu-404'], repeat=1, timeout=10))
    res = played.result('gate')
    assert res['_event'] == 'runner_on_failed' and res['passed'] is False
    assert res['failed_nodes'] == ['gpu-404']
    assert res['nodes']['gpu-0']['passed'] is True and res['nodes'][NODE]['passed'] is True
    run = res['nodes']['gpu-404']['checks']['q']['evidence']['runs'][0]
    assert run['outcome'] == 'timeout' and run['detail'].startswith('timeout: the Job did not finish within 10s')
    assert res['problems'] == ['gpu-404: q run 1/1 (Job %s): %s' % (run['job'], run['detail'])]
    assert cleaned_up(emu)


def test_workload_gate_nodes_bad_input(emu, run_playbook):
    cases = [{'name': 'q', 'manifest': job('ok'), 'expected': 'ok'}]
    emu.clear_requests()
    played = run_playbook(play(emu, cases, node=None, nodes=['gpu-0', NODE, 'gpu-0']))
    res = played.result('gate')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == "nodes[2]: 'gpu-0' repeats an earlier node"
    played = run_playbook(play(emu, cases, node=None, nodes=[NODE], node_selector={'kubernetes.io/hostname': NODE}))
    assert played.result('gate')['msg'].startswith('node_selector: ')
    assert 'cannot be used with nodes' in played.result('gate')['msg']
    # nothing was sent
    assert emu.requests == []
