"""Issue 17: the approver of an AWX workflow's approval node, read through the AWX API by the real
gpufleet.upgrade.awx_approval_info module (run by ansible-runner, as a job runs it), and approve.yml's choice of
the approver from it. AWX cannot run here: the API is tests/tools/awx_api_standin.py, which serves the two read
paths in AWX's JSON shape from a fixture, requires the bearer token and records every request's method.

The approve.yml runs stop before the evidence repository's clone (the point of the check: a refused approver
changes nothing), or at the clone of a repository that does not exist (the approver chosen, nothing else to see
here); the full approve job, commit included, is tests/integration/test_awx_workflow.py's, with the lab."""
from __future__ import annotations

import json
import pathlib

import pytest

from tools.awx_api_standin import StandIn, approval, approval_node, job_node

REPO = pathlib.Path(__file__).resolve().parents[2]
APPROVE = REPO / 'playbooks' / 'approve.yml'
TOKEN = 'tok-7f3c9a1e5d2b48c6a0e1'
WRONG = 'wrong-9d8c7b6a5f4e3d2c1b0a'
NAME = 'second operator approves the canary'


def flow(wj, *middle):
    """A qualify-and-approve workflow job: plan, canary, then `middle`, then the approve job (running)."""
    return [job_node(wj * 10 + 1, wj, 'plan', 'gpufleet plan', wj * 100 + 1),
            job_node(wj * 10 + 2, wj, 'canary', 'gpufleet canary', wj * 100 + 2),
            *middle, job_node(wj * 10 + 9, wj, 'approve', 'gpufleet approve', wj * 100 + 9, status='running')]


FIXTURE = {
    'token': TOKEN,
    'max_page_size': 2,   # pages of two nodes: the module follows `next`
    'workflow_jobs': {
        '5': flow(5, approval_node(53, 5, 'approval', NAME, 42)),
        '6': flow(6, approval_node(63, 6, 'approval', NAME, 43)),
        '7': flow(7),
        '8': flow(8, approval_node(83, 8, 'canary-approval', 'canary approval', 44),
                  approval_node(84, 8, 'rollout-approval', 'rollout approval', 45)),
    },
    'workflow_approvals': {
        '42': approval(42, 5, NAME, by='bob'),
        '43': approval(43, 6, NAME, status='failed', by='carol'),
        '44': approval(44, 8, 'canary approval', by='dave'),
        '45': approval(45, 8, 'rollout approval', by='erin'),
    },
}


@pytest.fixture
def api():
    with StandIn(FIXTURE) as standin:
        yield standin


def read(run_playbook, args, env=None):
    return run_playbook([{'name': 'read', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'read the approval', 'gpufleet.upgrade.awx_approval_info': args}]}], envvars=env or {})


def everything(run) -> str:
    return run.stdout + json.dumps(run.events, default=str)


def only_gets(api):
    assert api.requests and {r['method'] for r in api.requests} == {'GET'}, api.requests


def test_the_approver_is_read_through_the_credential_environment(api, run_playbook):
    # what AWX's "Red Hat Ansible Automation Platform" credential injects into the job
    env = {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': TOKEN, 'CONTROLLER_VERIFY_SSL': 'False'}
    run = read(run_playbook, {'workflow_job_id': 5}, env)
    assert run.rc == 0, run.stdout
    res = run.result('read the approval')
    assert res['_event'] == 'runner_on_ok' and res['changed'] is False
    assert (res['found'], res['approved_by'], res['status'], res['approval_id'], res['approval_name'],
            res['node_identifier'], res['approved_at']) == (
        True, 'bob', 'successful', 42, NAME, 'approval', '2026-12-03T07:00:00.123456Z')
    # four nodes in pages of two (the approval node on the second), then the approval: GET only, with the token
    assert [r['path'] for r in api.requests] == res['requests'] == [
        '/api/v2/workflow_jobs/5/workflow_nodes/?page_size=200',
        '/api/v2/workflow_jobs/5/workflow_nodes/?page=2&page_size=2',
        '/api/v2/workflow_approvals/42/']
    only_gets(api)
    assert all(r['authorized'] for r in api.requests)
    assert TOKEN not in everything(run)


def test_the_options_and_a_named_approval_node(api, run_playbook):
    args = {'url': api.url + '/', 'token': TOKEN, 'workflow_job_id': 8, 'approval_name': 'rollout-approval',
            'timeout': 5}
    run = read(run_playbook, args)
    assert run.rc == 0, run.stdout
    res = run.result('read the approval')
    assert (res['approved_by'], res['approval_id'], res['approval_name']) == ('erin', 45, 'rollout approval')
    assert TOKEN not in everything(run)
    # two approval nodes and none named: refused, naming both
    run = read(run_playbook, dict(args, approval_name=None))
    res = run.result('read the approval')
    assert res['_event'] == 'runner_on_failed'
    assert 'workflow job 8 has 2 approval nodes: "canary approval"' in res['msg'] and 'set approval_name' in res['msg']
    only_gets(api)


def test_a_wrong_token_fails_naming_the_url_never_the_token(api, run_playbook):
    run = read(run_playbook, {'workflow_job_id': 5},
               {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': WRONG})
    assert run.rc != 0
    res = run.result('read the approval')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == ('awx_approval_info: GET %s/api/v2/workflow_jobs/5/workflow_nodes/?page_size=200 answered '
                          'HTTP 401: the token was refused (expired, revoked or wrong) ("Authentication credentials '
                          'were not provided.")' % api.url), res['msg']
    assert 'Traceback' not in everything(run)
    assert WRONG not in everything(run) and TOKEN not in everything(run)
    assert [r['authorized'] for r in api.requests] == [False]
    only_gets(api)


def test_a_denied_approval_and_a_workflow_without_one(api, run_playbook):
    env = {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': TOKEN}
    run = read(run_playbook, {'workflow_job_id': 6}, env)
    res = run.result('read the approval')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == ('awx_approval_info: workflow approval 43 "%s" was denied by "carol"; the approver must '
                          'approve it in AWX' % NAME)
    run = read(run_playbook, {'workflow_job_id': 7}, env)
    assert run.result('read the approval')['msg'] == 'awx_approval_info: workflow job 7 has no approval node'
    run = read(run_playbook, {'workflow_job_id': 7, 'fail_when_missing': False}, env)
    res = run.result('read the approval')
    assert res['_event'] == 'runner_on_ok' and res['found'] is False and res['approved_by'] == ''
    run = read(run_playbook, {'workflow_job_id': 99}, env)
    assert 'workflow_nodes/?page_size=200 answered HTTP 404' in run.result('read the approval')['msg']
    only_gets(api)
    assert TOKEN not in everything(run)


def test_bad_input_fails_before_any_request(api, run_playbook):
    run = read(run_playbook, {'workflow_job_id': 5}, {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': ''})
    assert run.result('read the approval')['msg'].startswith('awx_approval_info: token: none given')
    run = read(run_playbook, {'workflow_job_id': 5, 'url': 'ftp://x', 'token': TOKEN})
    assert run.result('read the approval')['msg'] == 'awx_approval_info: url: "ftp://x" is not an http(s) URL'
    run = read(run_playbook, {'workflow_job_id': 5, 'url': api.url, 'token': TOKEN, 'timeout': 0})
    assert 'timeout: 0.0 must be more than 0' in run.result('read the approval')['msg']
    assert api.requests == []


# approve.yml: its inputs, as the approve-and-roll-out (or an approval-node) workflow's job gets them; the evidence
# repository does not exist, so any run that goes past the approver's choice stops at the clone.
def approve(run_playbook, tmp_path, env=None, **extra):
    extravars = {'gpufleet_evidence_repo': str(tmp_path / 'no-such-evidence.git'),
                 'gpufleet_plan_file': 'plans/gpu-upgrade-plan.json', 'gpufleet_qualification_dir': 'qualification',
                 'awx_user_name': 'alice', 'awx_user_email': 'alice@example.com'}
    extravars.update(extra)
    return run_playbook(str(APPROVE), extravars=extravars, envvars=env or {})


def cloned(run) -> bool:
    """Whether the evidence repository's clone was attempted (the first task that changes anything)."""
    return any(ev.get('event') in ('runner_on_ok', 'runner_on_failed')
               and (ev.get('event_data') or {}).get('task', '').startswith('Evidence | Clone it') for ev in run.events)


READ = "Approve | Who approved the workflow's approval node, read from AWX (in a workflow, with the controller credential)"
ASKED = 'Approve | The approver asked for is the one who approved in AWX'


def test_approve_refuses_an_approver_other_than_the_awx_approval_before_any_change(api, run_playbook, tmp_path):
    env = {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': TOKEN}
    run = approve(run_playbook, tmp_path, env, awx_workflow_job_id=5, gpufleet_approver='carol')
    assert run.rc != 0
    assert run.result(READ)['approved_by'] == 'bob'
    res = run.result(ASKED)
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == ('approval refused, nothing was changed: workflow approval 42 "%s" approved by "bob" (AWX '
                          'workflow job 5), but gpufleet_approver is "carol"; the approver is who approved in AWX' % NAME)
    assert not cloned(run)
    assert TOKEN not in everything(run)
    only_gets(api)


def test_approve_refuses_a_denied_approval_before_any_change(api, run_playbook, tmp_path):
    run = approve(run_playbook, tmp_path, {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': TOKEN},
                  awx_workflow_job_id=6)
    res = run.result(READ)
    assert res['_event'] == 'runner_on_failed' and 'was denied by "carol"' in res['msg']
    assert not cloned(run)
    only_gets(api)


def test_approve_takes_the_awx_approver_over_the_launcher(api, run_playbook, tmp_path):
    # alice launched the workflow (awx_user_name); bob approved its approval node; the same name asked is fine
    run = approve(run_playbook, tmp_path, {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': TOKEN},
                  awx_workflow_job_id='5', gpufleet_approver='bob')
    assert run.result(READ)['approved_by'] == 'bob'
    assert run.result(ASKED)['_event'] == 'runner_on_ok'
    # it went on to the clone (of a repository that does not exist here)
    assert cloned(run) and run.rc != 0
    plays = [ev for ev in run.events if ev.get('event') == 'playbook_on_play_start']
    assert len(plays) == 1   # the second play (the records, the commit) never started


def test_approve_outside_awx_or_without_the_credential_keeps_the_launcher(api, run_playbook, tmp_path):
    # an AWX job without the controller credential, and a workflow without an approval node: no API read, or one
    # that finds none; the approver stays the one given (the launcher in the approve-and-roll-out workflow)
    run = approve(run_playbook, tmp_path, awx_workflow_job_id=5)
    assert run.result(READ)['_event'] == 'runner_on_skipped' and api.requests == []
    assert run.result(ASKED)['_event'] == 'runner_on_skipped'
    run = approve(run_playbook, tmp_path, {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': TOKEN},
                  awx_workflow_job_id=7, gpufleet_approver='carol')
    res = run.result(READ)
    assert res['_event'] == 'runner_on_ok' and res['found'] is False
    assert run.result(ASKED)['_event'] == 'runner_on_skipped' and cloned(run)
    # outside AWX: nothing read
    before = len(api.requests)
    run = approve(run_playbook, tmp_path, {'CONTROLLER_HOST': api.url, 'CONTROLLER_OAUTH_TOKEN': TOKEN})
    assert run.result(READ)['_event'] == 'runner_on_skipped' and len(api.requests) == before
    only_gets(api)
