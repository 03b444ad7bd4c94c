"""Workload gate helpers: case checks, the pinned Job, result extraction and comparison, init failures."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _workload_gate as W

JOB = {'apiVersion': 'batch/v1', 'kind': 'Job',
       'metadata': {'name': 'ignored', 'labels': {'team': 'ml'}, 'resourceVersion': '7'},
       'spec': {'template': {'metadata': {'labels': {'app': 'matmul'}},
                             'spec': {'containers': [{'name': 'main', 'image': 'registry.local/matmul:1'}],
                                      'nodeSelector': {'nvidia.com/gpu.present': 'true'},
                                      'tolerations': [{'key': 'nvidia.com/gpu', 'operator': 'Exists'}]}}}}


def case(**kw):
    c = {'name': 'matmul', 'manifest': copy.deepcopy(JOB), 'expected': 42.0}
    c.update(kw)
    return W.normalize_cases([c])[0]


def test_build_job_pins_labels_and_bounds():
    job = W.build_job(case(), 'gpu-07', 1, 'abc123', 'gate', {'kubernetes.io/hostname': 'gpu-07'},
                      W.DEFAULT_TOLERATION, 300)
    meta = job['metadata']
    assert meta['name'] == 'matmul-abc123-2' and meta['namespace'] == 'gate' and 'resourceVersion' not in meta
    assert meta['labels'] == {'team': 'ml', 'gpufleet.io/workload-gate': 'abc123',
                              'gpufleet.io/workload-case': 'matmul', 'gpufleet.io/node': 'gpu-07'}
    spec = job['spec']
    assert (spec['backoffLimit'], spec['activeDeadlineSeconds'], spec['ttlSecondsAfterFinished']) == (0, 300, 3600)
    pspec = spec['template']['spec']
    assert pspec['nodeSelector'] == {'nvidia.com/gpu.present': 'true', 'kubernetes.io/hostname': 'gpu-07'}
    assert pspec['tolerations'] == [{'key': 'nvidia.com/gpu', 'operator': 'Exists'}, W.DEFAULT_TOLERATION,
                                    W.CORDON_TOLERATION]
    assert pspec['restartPolicy'] == 'Never'
    assert spec['template']['metadata']['labels']['gpufleet.io/workload-case'] == 'matmul'
    # the user's manifest is untouched
    assert JOB['metadata']['name'] == 'ignored' and 'nodeSelector' in JOB['spec']['template']['spec']
    assert 'kubernetes.io/hostname' not in JOB['spec']['template']['spec']['nodeSelector']


def test_build_job_node_label_is_a_valid_label_value():
    node = 'gpu-' + 'x' * 58 + '.rack-1.example.com'
    job = W.build_job(case(), node, 0, 'r', 'ns', {}, W.DEFAULT_TOLERATION, 300)
    value = job['metadata']['labels']['gpufleet.io/node']
    assert value == node[:62] and len(value) <= 63 and value[-1].isalnum()


def test_build_job_keeps_a_shorter_deadline():
    c = case()
    c['manifest']['spec']['activeDeadlineSeconds'] = 60
    job = W.build_job(c, 'gpu-07', 0, 'r', 'ns', {}, W.DEFAULT_TOLERATION, 300, tolerate_cordon=False)
    assert job['spec']['activeDeadlineSeconds'] == 60
    assert job['spec']['template']['spec']['tolerations'][-1] == W.DEFAULT_TOLERATION
    assert W.CORDON_TOLERATION not in job['spec']['template']['spec']['tolerations']


@pytest.mark.parametrize('log, result, value', [
    ('start\nloss 0.25\nsum=42.000\n', {}, 'sum=42.000'),
    ('sum=41\nsum=42.5\n', {'regex': r'sum=(\S+)'}, '42.5'),
    ('x tput=900 y\n', {'regex': r'tput=(?P<value>\d+)'}, '900'),
    ('PASSED\n', {'regex': r'PASSED'}, 'PASSED'),
    ('noise\n{"metrics": {"loss": 0.125, "top": [1, 2]}}\n', {'json_path': 'metrics.loss'}, 0.125),
    ('{"metrics": {"top": [1, 2]}}', {'json_path': 'metrics.top.1'}, 2),
    ('{"a": 1}\n{"a": 2}\nnot json {\n', {'json_path': 'a'}, 2),
])
def test_extract(log, result, value):
    assert W.extract(log, result) == (value, None)


@pytest.mark.parametrize('log, result, error', [
    ('', {}, 'the log is empty'),
    ('sum=\n', {'regex': r'tput=(\d+)'}, "no log line matches 'tput=(\\\\d+)'"),
    ('plain\n', {'json_path': 'a'}, 'no JSON line in the log'),
    ('{"a": 1}', {'json_path': 'b'}, "the JSON result has no 'b'"),
])
def test_extract_errors(log, result, error):
    assert W.extract(log, result) == (None, error)


def test_compare():
    assert W.compare('42.0004', 42, tolerance=0.001)[0] is True
    ok, detail = W.compare('42.1', 42, tolerance=0.001)
    assert ok is False and detail == '42.1 vs expected 42: |difference| 0.1 > tolerance 0.001'
    assert W.compare(99.0, 100, tolerance_percent=1)[0] is True
    assert W.compare(98.9, 100, tolerance_percent=1)[0] is False
    assert W.compare('nan', 1)[0] is False
    assert W.compare('abc', 1) == (False, "result 'abc' is not a number (expected 1)")
    assert W.compare('PASSED ', 'PASSED')[0] is True
    assert W.compare({'b': 1, 'a': 2}, '{"a": 2, "b": 1}')[0] is True
    assert W.compare([1, 2], [1, 2])[0] is True and W.compare([1, 2], [2, 1])[0] is False


def test_pod_failure():
    assert W.pod_failure({'status': {'phase': 'Running'}}) is None
    pod = {'metadata': {'name': 'p'}, 'status': {'initContainerStatuses': [
        {'name': 'cuda-init', 'state': {'terminated': {'exitCode': 3, 'reason': 'Error'}}}]}}
    assert W.pod_failure(pod) == 'init container cuda-init of pod p exited 3 (Error)'
    pod = {'metadata': {'name': 'p'}, 'status': {'initContainerStatuses': [
        {'name': 'cuda-init', 'state': {'waiting': {'reason': 'CrashLoopBackOff', 'message': 'back-off 10s'}}}]}}
    assert W.pod_failure(pod) == 'init container cuda-init of pod p: CrashLoopBackOff: back-off 10s'
    pod = {'metadata': {'name': 'p'}, 'status': {'containerStatuses': [
        {'name': 'main', 'state': {'waiting': {'reason': 'ImagePullBackOff'}}}]}}
    assert W.pod_failure(pod) == 'container main of pod p did not start: ImagePullBackOff'
    pod = {'metadata': {'name': 'p'}, 'status': {'containerStatuses': [
        {'name': 'main', 'state': {'waiting': {'reason': 'ContainerCreating'}}}]}}
    assert W.pod_failure(pod) is None


UNSCHEDULABLE_POD = {'metadata': {'name': 'p'}, 'status': {'phase': 'Pending', 'conditions': [
    {'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable',
     'message': '0/1 nodes are available: 1 node(s) were unschedulable'}]}}


@pytest.mark.parametrize('reason, outcome, detail', [
    # the Job controller saw its activeDeadlineSeconds (our timeout) pass before our own wait did: the same timeout
    ('DeadlineExceeded', 'timeout', 'timeout: the Job did not finish within 2s (pod unschedulable: 0/1 nodes are '
                                    'available: 1 node(s) were unschedulable)'),
    ('BackoffLimitExceeded', 'failed', 'the Job failed (BackoffLimitExceeded)'),
])
def test_judge_a_job_failed_for_its_deadline_is_a_timeout_naming_why(reason, outcome, detail):
    job = {'status': {'conditions': [{'type': 'Failed', 'status': 'True', 'reason': reason}]}}
    out = W.judge(job, UNSCHEDULABLE_POD, True, '', case(), 2)
    assert (out['outcome'], out['detail']) == (outcome, detail)
    # the wait's own timeout reads the same as the controller's
    if reason == 'DeadlineExceeded':
        assert W.judge({'status': {}}, UNSCHEDULABLE_POD, False, '', case(), 2) == out


@pytest.mark.parametrize('cases, message', [
    ([], 'cases: [] is not a non-empty list'),
    ([{'name': 'Bad_Name', 'manifest': JOB, 'expected': 1}], "cases[0].name: 'Bad_Name' is not a lowercase DNS label"),
    ([{'name': 'a', 'manifest': dict(JOB, kind='Pod'), 'expected': 1}],
     "cases[0] (a).manifest: not a batch/v1 Job manifest (kind 'Pod', apiVersion 'batch/v1')"),
    ([{'name': 'a', 'manifest': JOB}], 'cases[0] (a).expected: missing'),
    ([{'name': 'a', 'manifest': JOB, 'expected': 'x', 'tolerance': 1}],
     "cases[0] (a).tolerance: a tolerance needs a numeric expected value, got 'x'"),
    ([{'name': 'a', 'manifest': JOB, 'expected': 1, 'tolerance': -1}],
     'cases[0] (a).tolerance: -1 is not a non-negative number'),
    ([{'name': 'a', 'manifest': JOB, 'expected': 1, 'result': {'regex': '('}}], "cases[0] (a).result.regex: '(' does not compile"),
    ([{'name': 'a', 'manifest': JOB, 'expected': 1, 'result': {'regex': 'x', 'json_path': 'y'}}],
     'must be a dict with regex or json_path (not both)'),
    ([{'name': 'a', 'manifest': JOB, 'expected': 1}, {'name': 'a', 'manifest': JOB, 'expected': 1}],
     "cases[1].name: 'a' repeats an earlier case"),
])
def test_bad_cases(cases, message):
    with pytest.raises(W.WorkloadGateError) as exc:
        W.normalize_cases(cases)
    assert message in str(exc.value)


# -- run_gate_nodes (the multi-node gate) over a small fake of the K8sClient ---------------------------------------

class FakeK8s:
    """The few K8sClient calls the gate makes, over dicts of Jobs and pods. On creation a Job gets a pod bound to
    its nodeSelector's node (or `misplace`'s); the Job finishes after `looks` LISTs of Jobs, with the node's log and
    outcome ('Complete', 'Failed', or None: never, its pod unschedulable). Every request is recorded."""

    def __init__(self, logs, looks=1, outcome=None, misplace=None, fail_delete=()):
        self.logs = logs
        self.looks = looks
        self.outcome = outcome or {}
        self.misplace = misplace or {}
        self.fail_delete = tuple(fail_delete)   # the name endings of the Jobs whose DELETE fails
        self.jobs = {}
        self.pods = {}
        self.requests = []
        self.uids = 0

    def _uid(self):
        self.uids += 1
        return 'uid-%d' % self.uids

    @staticmethod
    def _selected(obj, query):
        terms = [term for term in (query or {}).get('labelSelector', '').split(',') if term]
        labels = obj['metadata'].get('labels') or {}
        # key=value, or a bare key: the label exists
        return all(labels.get(term.split('=', 1)[0]) == term.split('=', 1)[1] if '=' in term
                   else term in labels for term in terms)

    def post(self, path, body):
        from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError
        self.requests.append(('POST', path))
        job = copy.deepcopy(body)
        name = job['metadata']['name']
        if name in self.jobs:
            raise K8sError('POST %s: HTTP 409 AlreadyExists' % path, status=409)
        job['metadata']['uid'] = self._uid()
        job['looks'] = 0
        self.jobs[name] = job
        node = job['spec']['template']['spec']['nodeSelector']['kubernetes.io/hostname']
        pod = {'metadata': {'name': name + '-pod', 'labels': dict(job['spec']['template']['metadata']['labels']),
                            'creationTimestamp': '2025-01-01T00:00:00Z',
                            'ownerReferences': [{'kind': 'Job', 'uid': job['metadata']['uid']}]},
               'spec': {'nodeName': self.misplace.get(node, node)}, 'status': {'phase': 'Running'}, 'node': node}
        if self.outcome.get(node, 'Complete') in (None, 'busy'):
            pod['spec']['nodeName'] = None
            why = ('1 Insufficient nvidia.com/gpu' if self.outcome.get(node) == 'busy' else '1 node(s) had untolerated taint')
            pod['status'] = {'phase': 'Pending', 'conditions': [
                {'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable',
                 'message': '0/3 nodes are available: %s' % why}]}
        self.pods[pod['metadata']['name']] = pod
        return job

    def _looked_at(self, job):
        """A read of the Job: after `looks` of them it has finished (or never, for a node whose outcome is None)."""
        job['looks'] += 1
        node = job['spec']['template']['spec']['nodeSelector']['kubernetes.io/hostname']
        state = self.outcome.get(node, 'Complete')
        if state and state != 'busy' and job['looks'] >= self.looks:
            job['status'] = {'conditions': [{'type': state, 'status': 'True',
                                             'reason': 'BackoffLimitExceeded' if state == 'Failed' else None}]}
        return copy.deepcopy(job)

    def list_all(self, path, query=None):
        self.requests.append(('LIST', path))
        if path.endswith('/jobs'):
            return [self._looked_at(job) for job in self.jobs.values() if self._selected(job, query)]
        return [copy.deepcopy(pod) for pod in self.pods.values() if self._selected(pod, query)]

    def get(self, path, query=None):
        from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import NotFoundError
        self.requests.append(('GET', path))
        name = path.rsplit('/', 1)[-1]
        if '/jobs/' in path and name in self.jobs:
            return self._looked_at(self.jobs[name])
        raise NotFoundError('GET %s: HTTP 404' % path, status=404)

    def delete(self, path, body=None):
        from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError, NotFoundError
        self.requests.append(('DELETE', path))
        name = path.rsplit('/', 1)[-1]
        if name.endswith(self.fail_delete):
            raise K8sError('DELETE %s: HTTP 500 etcd unavailable' % path, status=500)
        store = self.jobs if '/jobs/' in path else self.pods
        if name not in store:
            raise NotFoundError('DELETE %s: HTTP 404' % path, status=404)
        del store[name]

    def read_log(self, k8s, namespace, pod, container):
        assert k8s is self and namespace == 'gate' and container is None
        self.requests.append(('LOG', pod))
        return self.logs[self.pods[pod]['node']]

    def count(self, verb, what=''):
        return sum(1 for verb_seen, path in self.requests if verb_seen == verb and what in path)


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.slept = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def gate_nodes(fake, nodes, cases, **kw):
    clock = FakeClock()
    kw = dict(dict(namespace='gate', repeat=2, timeout=30, poll_interval=2, clock=clock.clock, sleep=clock.sleep,
                   log_reader=fake.read_log), **kw)
    return W.run_gate_nodes(fake, nodes, cases, **kw), clock


NODES = ['gpu-1', 'gpu-2', 'gpu-3']


def test_run_gate_nodes_all_pass_pinned_and_cleaned_up():
    fake = FakeK8s({node: 'warmup\nsum=42.0\n' for node in NODES}, looks=2)
    res, clock = gate_nodes(fake, NODES, [case(result={'regex': r'sum=(\S+)'}), case(name='second', expected='sum=42.0')])
    assert res['passed'] is True and res['failed_nodes'] == [] and res['problems'] == []
    assert res['msg'] == 'workload gate: PASS on 3 node(s) (gpu-1, gpu-2, gpu-3) (2 case(s) x 2 run(s))'
    assert sorted(res) == ['busy_nodes', 'failed_nodes', 'jobs', 'msg', 'nodes', 'passed', 'problems', 'run_id',
                           'stale_jobs']
    assert list(res['nodes']) == NODES
    for node in NODES:
        one = res['nodes'][node]
        assert sorted(one) == ['busy', 'checks', 'jobs', 'msg', 'node', 'passed', 'problems', 'run_id', 'stale_jobs']
        assert one['passed'] is True and one['node'] == node and one['run_id'] == res['run_id']
        assert one['msg'] == 'workload gate: PASS on %s (2 case(s) x 2 run(s))' % node
        runs = one['checks']['matmul']['evidence']['runs']
        assert [run['attempt'] for run in runs] == [1, 2]
        assert all(run['ok'] and run['outcome'] == 'match' and run['node'] == node and run['value'] == '42.0'
                   for run in runs)
        assert len(one['jobs']['created']) == 4 and one['jobs']['deleted'] == one['jobs']['created']
        assert one['jobs']['left'] == []
    # one Job per node, case and attempt, with distinct names; all deleted, with their pods
    assert len(res['jobs']['created']) == len(set(res['jobs']['created'])) == 12
    assert res['jobs']['deleted'] == res['jobs']['created'] and res['jobs']['left'] == []
    assert fake.jobs == {} and fake.pods == {}
    # the Jobs of one attempt were all created before the first look (they run at the same time), after the
    # one LIST of an earlier run's Jobs
    assert fake.requests[0] == ('LIST', '/apis/batch/v1/namespaces/gate/jobs')
    first_list = fake.requests.index(('LIST', '/apis/batch/v1/namespaces/gate/jobs'), 1)
    assert [verb for verb, path in fake.requests[1:first_list]] == ['POST'] * 3
    assert clock.now <= 2 * 2 * 30


def test_run_gate_nodes_pins_each_job_to_its_node():
    fake = FakeK8s({node: '42' for node in NODES})
    posted = []
    post = fake.post

    def spy(path, body):
        posted.append(body)
        return post(path, body)

    fake.post = spy
    res = gate_nodes(fake, NODES, [case()], repeat=1)[0]
    assert res['passed'] is True
    assert [body['spec']['template']['spec']['nodeSelector']['kubernetes.io/hostname'] for body in posted] == NODES
    assert [body['metadata']['labels']['gpufleet.io/node'] for body in posted] == NODES
    assert {body['metadata']['labels']['gpufleet.io/workload-gate'] for body in posted} == {res['run_id']}
    assert W.CORDON_TOLERATION in posted[0]['spec']['template']['spec']['tolerations']


def test_run_gate_nodes_one_mismatch_fails_only_that_node():
    logs = {node: '42.0' for node in NODES}
    logs['gpu-2'] = '41.0'
    fake = FakeK8s(logs)
    res = gate_nodes(fake, NODES, [case(tolerance=0.5)])[0]
    assert res['passed'] is False and res['failed_nodes'] == ['gpu-2']
    assert res['nodes']['gpu-1']['passed'] is True and res['nodes']['gpu-3']['passed'] is True
    bad = res['nodes']['gpu-2']
    assert bad['passed'] is False and len(bad['problems']) == 2
    job = bad['checks']['matmul']['evidence']['runs'][0]['job']
    assert bad['problems'][0] == ('matmul run 1/2 (Job %s): result mismatch: 41.0 vs expected 42.0: |difference| 1 > '
                                  'tolerance 0.5' % job)
    assert res['problems'] == ['gpu-2: ' + line for line in bad['problems']]
    assert res['msg'].startswith('workload gate: FAIL on 1 of 3 node(s) (gpu-2): gpu-2: matmul run 1/2')
    assert fake.jobs == {} and fake.pods == {}


def test_run_gate_nodes_a_failed_job_and_a_misplaced_pod():
    fake = FakeK8s({'gpu-1': 'CUDA error\n', 'gpu-2': '42', 'gpu-3': '42'}, outcome={'gpu-1': 'Failed'},
                   misplace={'gpu-3': 'gpu-9'})
    res = gate_nodes(fake, NODES, [case()], repeat=1)[0]
    assert res['failed_nodes'] == ['gpu-1', 'gpu-3']
    failed = res['nodes']['gpu-1']['checks']['matmul']['evidence']['runs'][0]
    assert failed['outcome'] == 'failed' and failed['detail'] == ('the Job failed (BackoffLimitExceeded); '
                                                                  'last log line: CUDA error')
    misplaced = res['nodes']['gpu-3']['checks']['matmul']['evidence']['runs'][0]
    assert misplaced['outcome'] == 'misplaced' and misplaced['node'] == 'gpu-9'
    assert misplaced['detail'] == 'pod %s ran on node gpu-9, not gpu-3' % misplaced['pod']
    assert res['nodes']['gpu-2']['checks']['matmul']['evidence']['runs'][0]['outcome'] == 'match'
    assert fake.jobs == {} and fake.pods == {}


def test_run_gate_nodes_a_timeout_on_one_node_is_bounded():
    fake = FakeK8s({node: '42' for node in NODES}, outcome={'gpu-3': None})
    res, clock = gate_nodes(fake, NODES, [case()], repeat=2, timeout=30, poll_interval=2)
    assert res['failed_nodes'] == ['gpu-3']
    runs = res['nodes']['gpu-3']['checks']['matmul']['evidence']['runs']
    assert [run['outcome'] for run in runs] == ['timeout', 'timeout']
    assert runs[0]['detail'] == ('timeout: the Job did not finish within 30s (pod unschedulable: 0/3 nodes are '
                                 'available: 1 node(s) had untolerated taint)')
    assert all(run['seconds'] == 30 for run in runs)
    # the other nodes finished at the first look, and were not held back
    assert all(run['ok'] and run['seconds'] == 0 for node in ('gpu-1', 'gpu-2')
               for run in res['nodes'][node]['checks']['matmul']['evidence']['runs'])
    # every wait bounded by the timeout: 2 attempts, at most 30 s each, no sleep past the deadline
    assert clock.now == 60 and sum(clock.slept) == 60 and max(clock.slept) <= 2
    assert fake.jobs == {} and fake.pods == {}


def test_no_free_gpu_reads_the_schedulers_reason():
    pending = {'status': {'conditions': [{'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable',
                                          'message': '0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) '
                                                     "didn't match Pod's node affinity/selector."}]}}
    assert W.no_free_gpu(pending).startswith('0/5 nodes are available: 1 Insufficient nvidia.com/gpu')
    assert W.no_free_gpu(None) is None
    other = copy.deepcopy(pending)
    other['status']['conditions'][0]['message'] = '0/5 nodes are available: 1 Insufficient cpu'
    assert W.no_free_gpu(other) is None
    job = {'metadata': {'uid': 'u1'}}
    pod = dict(pending, metadata={'name': 'p', 'ownerReferences': [{'uid': 'u1'}]}, spec={})
    assert W.observe(job, [pod], 'gpu-1') == (pod, {'pod': 'p', 'node': None})
    assert W.observe(job, [pod], 'gpu-1', busy_skip=True)[1]['outcome'] == 'busy'


def test_run_gate_nodes_busy_skip_runs_nothing_on_a_node_whose_gpus_are_all_taken():
    """A node in service whose tenants hold every GPU: with busy=skip its case is not run and fails nothing
    (named under busy, and at once: no wait for the timeout); with the default busy=fail it waits and fails."""
    fake = FakeK8s({node: '42' for node in NODES}, outcome={'gpu-2': 'busy'})
    res, clock = gate_nodes(fake, NODES, [case()], repeat=1, timeout=30, busy='skip')
    assert res['passed'] is True and res['failed_nodes'] == [] and res['busy_nodes'] == ['gpu-2']
    assert res['nodes']['gpu-2']['busy'] == ['matmul'] and res['nodes']['gpu-1']['busy'] == []
    assert res['msg'].endswith('; not run on gpu-2 for lack of a free GPU')
    run = res['nodes']['gpu-2']['checks']['matmul']['evidence']['runs'][0]
    assert run['outcome'] == 'busy' and run['detail'].startswith('not run: no free GPU on the node')
    assert clock.now == 0 and fake.jobs == {} and fake.pods == {}
    fake = FakeK8s({node: '42' for node in NODES}, outcome={'gpu-2': 'busy'})
    res, clock = gate_nodes(fake, NODES, [case()], repeat=1, timeout=30)
    assert res['failed_nodes'] == ['gpu-2'] and clock.now == 30
    with pytest.raises(W.WorkloadGateError, match="busy: 'maybe' is not fail or skip"):
        gate_nodes(FakeK8s({}), NODES, [case()], busy='maybe')


def requests_of_the_watch(node_count):
    nodes = ['gpu-%d' % number for number in range(node_count)]
    fake = FakeK8s({node: '42' for node in nodes}, looks=4)
    res = gate_nodes(fake, nodes, [case()], repeat=1)[0]
    assert res['passed'] is True and len(res['nodes']) == node_count
    return {'job lists': fake.count('LIST', '/jobs'), 'pod lists': fake.count('LIST', '/pods'),
            'job gets': fake.count('GET', '/jobs/'), 'posts': fake.count('POST'), 'logs': fake.count('LOG')}


def test_run_gate_nodes_requests_per_poll_do_not_grow_with_the_nodes():
    two, ten = requests_of_the_watch(2), requests_of_the_watch(10)
    # one LIST of Jobs for an earlier run's (none here), 4 looks of one LIST of Jobs and one LIST of pods each,
    # then one LIST of pods for the cleanup
    assert two['job lists'] == ten['job lists'] == 1 + 4
    assert two['pod lists'] == ten['pod lists'] == 4 + 1
    assert two['job gets'] == ten['job gets'] == 0
    # what does grow with the nodes: one Job, one log read per node
    assert (two['posts'], ten['posts'], two['logs'], ten['logs']) == (2, 10, 2, 10)


def test_run_gate_nodes_cleanup_records_what_is_left():
    fake = FakeK8s({node: '42' for node in NODES}, fail_delete=['-1-2'])   # attempt 1 on the second node
    res = gate_nodes(fake, NODES, [case()], repeat=1)[0]
    left = 'matmul-%s-1-2' % res['run_id']
    assert res['jobs']['left'] == [left] and left not in res['jobs']['deleted'] and len(res['jobs']['deleted']) == 2
    assert res['failed_nodes'] == ['gpu-2']
    assert res['nodes']['gpu-2']['problems'] == ['could not delete Job(s) %s: delete them by hand (label '
                                                 'gpufleet.io/workload-gate=%s)' % (left, res['run_id'])]
    run = res['nodes']['gpu-2']['checks']['matmul']['evidence']['runs'][0]
    assert run['ok'] is True and 'HTTP 500' in run['cleanup_error']
    assert list(fake.jobs) == [left] and list(fake.pods) == [left + '-pod']


def test_run_gate_nodes_without_cleanup_leaves_every_job():
    fake = FakeK8s({node: '42' for node in NODES})
    res = gate_nodes(fake, NODES, [case()], repeat=1, cleanup=False)[0]
    assert res['passed'] is True and res['jobs']['deleted'] == []
    assert res['jobs']['left'] == res['jobs']['created'] == sorted(fake.jobs)
    assert fake.count('DELETE') == 0


def test_run_gate_nodes_matches_run_gate_on_one_node():
    fake = FakeK8s({'gpu-1': 'sum=41.5'})
    clock = FakeClock()
    single = W.run_gate(fake, 'gpu-1', [case(result={'regex': r'sum=(\S+)'}, tolerance=1)], namespace='gate',
                        repeat=1, clock=clock.clock, sleep=clock.sleep, log_reader=fake.read_log)
    many = gate_nodes(fake, ['gpu-1'], [case(result={'regex': r'sum=(\S+)'}, tolerance=1)], repeat=1)[0]
    one = many['nodes']['gpu-1']
    assert sorted(one) == sorted(single) and one['passed'] is single['passed'] is True
    assert one['msg'] == single['msg'] == 'workload gate: PASS on gpu-1 (1 case(s) x 1 run(s))'

    def shape(result):
        run = dict(result['checks']['matmul']['evidence']['runs'][0], job=None, pod=None, seconds=None)
        return run, len(result['jobs']['created']), len(result['jobs']['deleted'])

    assert shape(one) == shape(single)
    assert fake.jobs == {} and fake.pods == {}


@pytest.mark.parametrize('nodes, message', [
    ([], 'nodes: [] is not a non-empty list of node names'),
    ('gpu-1', "nodes: 'gpu-1' is not a non-empty list of node names"),
    (['gpu-1', ' '], "nodes[1]: ' ' is not a node name"),
    (['gpu-1', 'gpu-2', 'gpu-1'], "nodes[2]: 'gpu-1' repeats an earlier node"),
])
def test_bad_nodes(nodes, message):
    fake = FakeK8s({})
    with pytest.raises(W.WorkloadGateError) as exc:
        gate_nodes(fake, nodes, [case()])
    assert str(exc.value) == message and fake.requests == []


# -- T3-17: the unfinished Jobs of an earlier (killed) run are cleared before the gate's first Job ----
def stale(fake, name, node, run_id='0ld0ld', finished=False):
    """A Job (and its running pod) an earlier gate run left on `node`, as the API server holds it."""
    job = W.build_job(case(), node, 0, run_id, 'gate', {'kubernetes.io/hostname': node}, W.DEFAULT_TOLERATION, 600)
    job['metadata']['name'] = name
    job['metadata']['uid'] = fake._uid()
    job['looks'] = -10 ** 6     # the fake's reads never finish it
    if finished:
        job['status'] = {'conditions': [{'type': 'Complete', 'status': 'True'}]}
    fake.jobs[name] = job
    fake.pods[name + '-pod'] = {
        'metadata': {'name': name + '-pod', 'labels': dict(job['spec']['template']['metadata']['labels']),
                     'ownerReferences': [{'kind': 'Job', 'uid': job['metadata']['uid']}]},
        'spec': {'nodeName': node}, 'status': {'phase': 'Succeeded' if finished else 'Running'}, 'node': node}
    return job


def test_stale_jobs_are_the_unfinished_ones_of_another_run_on_the_nodes():
    fake = FakeK8s({})
    mine = stale(fake, 'matmul-0ld0ld-1', 'gpu-1')
    done = stale(fake, 'matmul-0ld0ld-2', 'gpu-1', finished=True)
    other_node = stale(fake, 'matmul-0ld0ld-3', 'gpu-9')
    this_run = stale(fake, 'matmul-abcdef-1', 'gpu-1', run_id='abcdef')
    found = W.stale_jobs([mine, done, other_node, this_run], ['gpu-1', 'gpu-2'], 'abcdef')
    assert {node: [j['metadata']['name'] for j in jobs] for node, jobs in found.items()} == {
        'gpu-1': ['matmul-0ld0ld-1'], 'gpu-2': []}


def test_run_gate_deletes_an_earlier_runs_unfinished_job_and_its_pod_first():
    fake = FakeK8s({'gpu-1': '42'})
    stale(fake, 'matmul-0ld0ld-1', 'gpu-1')
    stale(fake, 'matmul-0ld0ld-2', 'gpu-1', finished=True)
    stale(fake, 'matmul-0ld0ld-3', 'gpu-9')
    clock = FakeClock()
    res = W.run_gate(fake, 'gpu-1', [case()], namespace='gate', repeat=1, timeout=30, poll_interval=2,
                     clock=clock.clock, sleep=clock.sleep, log_reader=fake.read_log)
    assert res['passed'] is True, res['msg']
    assert res['stale_jobs'] == ['matmul-0ld0ld-1']
    first_post = fake.requests.index(('POST', '/apis/batch/v1/namespaces/gate/jobs'))
    assert ('DELETE', '/apis/batch/v1/namespaces/gate/jobs/matmul-0ld0ld-1') in fake.requests[:first_post]
    assert ('DELETE', '/api/v1/namespaces/gate/pods/matmul-0ld0ld-1-pod') in fake.requests[:first_post]
    # a finished Job and another node's are left as they are
    assert sorted(fake.jobs) == ['matmul-0ld0ld-2', 'matmul-0ld0ld-3']


def test_run_gate_fails_naming_an_earlier_runs_job_it_cannot_delete_and_runs_nothing():
    fake = FakeK8s({'gpu-1': '42'}, fail_delete=('0ld0ld-1',))
    stale(fake, 'matmul-0ld0ld-1', 'gpu-1')
    clock = FakeClock()
    res = W.run_gate(fake, 'gpu-1', [case()], namespace='gate', repeat=1, timeout=30, poll_interval=2,
                     clock=clock.clock, sleep=clock.sleep, log_reader=fake.read_log)
    assert res['passed'] is False
    assert res['problems'] == [
        'could not delete Job matmul-0ld0ld-1 of an earlier run: DELETE /apis/batch/v1/namespaces/gate/jobs/'
        'matmul-0ld0ld-1: HTTP 500 etcd unavailable']
    assert fake.count('POST') == 0 and res['checks'] == {}


def test_run_gate_nodes_clears_the_earlier_runs_jobs_of_every_node_with_one_list():
    fake = FakeK8s({node: '42' for node in NODES})
    stale(fake, 'matmul-0ld0ld-1', 'gpu-1')
    stale(fake, 'matmul-0ld0ld-2', 'gpu-3')
    res = gate_nodes(fake, NODES, [case()], repeat=1)[0]
    assert res['passed'] is True, res['msg']
    assert res['stale_jobs'] == ['matmul-0ld0ld-1', 'matmul-0ld0ld-2']
    assert res['nodes']['gpu-3']['stale_jobs'] == ['matmul-0ld0ld-2'] and res['nodes']['gpu-2']['stale_jobs'] == []
    assert fake.jobs == {} and fake.pods == {}
