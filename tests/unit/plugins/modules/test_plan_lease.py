"""plan_lease's run(): inputs refused before any request, the result, check and diff mode, a refusal failing the
task, a release by a non-holder changing nothing (a scripted client; tests/integration/test_plan_lease.py runs it
on the real control plane)."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _lease as lz
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError, NotFoundError
from ansible_collections.gpufleet.upgrade.plugins.modules import plan_lease
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import WorkerExit, WorkerK8sModule

DIGEST = 'sha256:' + 'c' * 64
NAME = 'gpufleet-plan-cccccccccccc'
PATH = '/apis/coordination.k8s.io/v1/namespaces/gpufleet-system/leases/' + NAME


class Client:
    def __init__(self, obj=None):
        self.obj = copy.deepcopy(obj)
        self.writes = []

    @staticmethod
    def sleep(_seconds):
        return None

    def get_or_none(self, path):
        assert path == PATH
        return copy.deepcopy(self.obj)

    def post(self, path, body):
        self.writes.append(('POST', path))
        self.obj = dict(copy.deepcopy(body), metadata=dict(body['metadata'], resourceVersion='1'))
        return copy.deepcopy(self.obj)

    def patch(self, path, body):
        self.writes.append(('PATCH', path, body['metadata']['resourceVersion']))
        self.obj = lz.predicted(self.obj, lz.Verdict('patch', '', body, ''))
        self.obj['metadata']['resourceVersion'] = str(int(self.obj['metadata']['resourceVersion']) + 1)
        return copy.deepcopy(self.obj)


def held_by(holder, renew='2000-01-01T00:00:00.000000Z'):
    return {'apiVersion': lz.API_VERSION, 'kind': 'Lease',
            'metadata': {'name': NAME, 'namespace': 'gpufleet-system', 'resourceVersion': '5',
                         'labels': {lz.MANAGED_BY: lz.MANAGER}, 'annotations': {lz.ANN_DIGEST: DIGEST}},
            'spec': {'holderIdentity': holder, 'leaseDurationSeconds': 60, 'renewTime': renew,
                     'acquireTime': renew, 'leaseTransitions': 1}}


def run(args, client, check_mode=False, diff=False):
    with pytest.raises(WorkerExit) as done:
        module = WorkerK8sModule('plan_lease', plan_lease.OPTIONS,
                                 dict({'plan_digest': DIGEST, 'holder': 'run-a'}, **args), check_mode=check_mode, diff=diff)
        module._client = client     # pylint: disable=protected-access
        plan_lease.run(module)
    return done.value.result


@pytest.mark.parametrize('args, msg', [
    ({'plan_digest': 'abc'}, "plan_digest: \"abc\" is not a plan digest"),
    ({'holder': 'two words'}, 'holder: "two words" is not a run id'),
    ({'namespace': 'Bad_NS'}, "namespace: 'Bad_NS' is not a Kubernetes namespace name"),
    ({'duration': 0}, 'duration: 0 is not a whole number of seconds from 1 to 604800'),
    ({'clock_skew': 301}, 'clock_skew: 301 is not a whole number of seconds from 0 to 300'),
    ({'state': 'held'}, 'value of state must be one of: acquired, renewed, released, got: held'),
])
def test_bad_input_fails_naming_field_and_value_before_any_request(args, msg):
    client = Client()
    result = run(args, client)
    assert result['failed'] and result['msg'].startswith(msg), result['msg']
    assert 'exception' not in result and client.writes == []


def test_acquire_creates_then_renews_with_the_diff():
    client = Client()
    result = run({'duration': 120}, client, diff=True)
    assert (result['changed'], result['outcome'], result['attempts']) == (True, 'created', 1)
    assert result['lease']['holder'] == 'run-a' and result['lease']['duration'] == 120
    assert result['diff']['before'] is None and result['diff']['after']['holder'] == 'run-a'
    assert result['diff']['before_header'] == 'lease/gpufleet-system/' + NAME
    assert client.writes == [('POST', '/apis/coordination.k8s.io/v1/namespaces/gpufleet-system/leases')]
    again = run({'state': 'renewed'}, client)
    assert (again['changed'], again['outcome']) == (True, 'renewed') and client.writes[-1] == ('PATCH', PATH, '1')


def test_check_mode_predicts_and_writes_nothing():
    client = Client(held_by('run-old'))
    result = run({}, client, check_mode=True, diff=True)
    assert (result['changed'], result['outcome']) == (True, 'taken_over')
    assert result['lease']['holder'] == 'run-a' and result['lease']['transitions'] == 2
    assert result['diff']['before']['holder'] == 'run-old'
    assert client.writes == [] and client.obj == held_by('run-old')


def test_another_runs_fresh_lease_fails_the_task_naming_it_in_check_mode_too():
    fresh = held_by('run-b', renew=lz.format_micro(plan_lease._now()))     # pylint: disable=protected-access
    for check_mode in (False, True):
        client = Client(fresh)
        result = run({}, client, check_mode=check_mode)
        assert result['failed'] and result['outcome'] == 'held' and not result['changed']
        assert result['msg'].startswith('Lease gpufleet-system/%s is held by "run-b" (renewTime ' % NAME)
        assert result['lease']['holder'] == 'run-b' and client.writes == []


def test_a_lost_lease_fails_the_renewal():
    result = run({'state': 'renewed'}, Client(held_by('run-b')))
    assert result['failed'] and result['outcome'] == 'lost' and 'this run lost the plan' in result['msg']


def test_release_by_a_non_holder_changes_nothing_and_by_the_holder_clears_it():
    client = Client(held_by('run-b'))
    result = run({'state': 'released'}, client)
    assert (result.get('failed'), result['changed'], result['outcome']) == (None, False, 'not_held')
    assert client.writes == [] and client.obj == held_by('run-b')
    mine = Client(held_by('run-a'))
    result = run({'state': 'released'}, mine)
    assert (result['changed'], result['outcome']) == (True, 'released') and result['lease']['holder'] is None
    assert 'holderIdentity' not in mine.obj['spec'] and mine.obj['spec']['leaseTransitions'] == 1
    assert run({'state': 'released'}, mine)['changed'] is False


def test_a_foreign_lease_of_that_name_fails_without_a_write():
    foreign = held_by('run-a')
    foreign['metadata']['labels'] = {}
    client = Client(foreign)
    result = run({}, client)
    assert result['failed'] and 'was not made by gpufleet.upgrade' in result['msg'] and 'exception' not in result
    assert client.writes == []


def test_a_missing_namespace_or_a_forbidden_write_fails_with_a_message_not_a_traceback():
    class NoNamespace(Client):
        def post(self, path, body):
            raise NotFoundError('POST %s: HTTP 404 namespaces "gpufleet-system" not found' % path, status=404,
                                method='POST', path=path)
    result = run({}, NoNamespace())
    assert result['failed'] and 'exception' not in result
    assert result['msg'] == ("namespace: 'gpufleet-system' does not exist (docs/rbac/gpufleet-system-namespace.yml "
                             "creates gpufleet-system)")

    class Forbidden(Client):
        def patch(self, path, body):
            raise K8sError('PATCH %s: HTTP 403 forbidden' % path, status=403, method='PATCH', path=path)
    result = run({}, Forbidden(held_by('run-a')))
    assert result['failed'] and 'exception' not in result and result['msg'] == 'PATCH %s: HTTP 403 forbidden' % PATH


def test_a_fresh_lease_of_an_ended_run_of_this_controller_is_taken_over(monkeypatch):
    """The module reads the holder's process on this machine: gone (or a reused pid), the Lease is taken at once;
    running, or a run of another controller, it is refused."""
    import socket
    monkeypatch.setattr(socket, 'gethostname', lambda: 'jump-1')
    old = 'cli:ops@jump-1:100.5000'
    fresh = held_by(old, renew=lz.format_micro(plan_lease._now()))     # pylint: disable=protected-access
    for running, outcome in (({100: 5000}, 'held'), ({100: 7000}, 'taken_over'), ({}, 'taken_over')):
        monkeypatch.setattr(plan_lease, 'process_start', running.get)
        client = Client(fresh)
        result = run({'holder': 'cli:ops@jump-1:200.6000'}, client)
        assert result['outcome'] == outcome, (running, result)
        assert bool(client.writes) is (outcome == 'taken_over')
    monkeypatch.setattr(plan_lease, 'process_start', {}.get)
    result = run({}, Client(held_by('cli:ops@jump-9:100.5000', renew=lz.format_micro(plan_lease._now()))))  # pylint: disable=protected-access
    assert result['outcome'] == 'held'      # a run of another controller is never known to have ended


def test_process_start_reads_this_process_and_none_for_no_process():
    import os
    assert isinstance(plan_lease.process_start(os.getpid()), int)
    assert plan_lease.process_start(2 ** 22 + 1) is None


def test_the_action_plugin_sets_the_run_id_of_awx_or_of_ansible_playbook(monkeypatch):
    import os
    import socket
    from ansible_collections.gpufleet.upgrade.plugins.action import plan_lease as action
    assert action.default_holder({'awx_job_template_id': 12}) == 'awx:template-12'
    monkeypatch.setattr(socket, 'gethostname', lambda: 'jump-1')
    holder = action.default_holder({})
    host, pid, start = lz.cli_process(holder)
    assert (host, pid) == ('jump-1', os.getppid()) and start == plan_lease.process_start(os.getppid())
