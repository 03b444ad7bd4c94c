"""gpufleet.upgrade.plan_lease on the real control plane (tests/cluster), as a service account bound as docs/rbac says
(gpufleet-upgrade-plan-lease by a RoleBinding in gpufleet-system only): one run holds a plan's Lease, a second is
refused while it is fresh and takes it over once it expired, a release by a non-holder writes nothing, check mode
writes nothing, two runs starting together end with one holder (issue 37 item 3, T3-3 of the 2026-12-06 review)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

import rbac_check as R
from cluster import rbac
from k8s_support import mutations, play

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _lease as lz

pytestmark = pytest.mark.slow

NS = 'gpufleet-system'
ROLE = 'gpufleet-upgrade-plan-lease'
LEASES = '/apis/coordination.k8s.io/v1/namespaces/%s/leases' % NS


class As:
    """`play()`'s view of a cluster whose modules run with another kubeconfig."""

    def __init__(self, kubeconfig):
        self.kubeconfig = kubeconfig


def plan_digest(seed: str) -> str:
    """A plan digest of its own for each test (the Leases outlive the cluster fixture's reset)."""
    return 'sha256:' + hashlib.sha256(('%s-%s' % (seed, time.time_ns())).encode()).hexdigest()


def lease_task(name: str, digest: str, holder: str, **args) -> dict:
    check_mode = args.pop('check_mode', False)
    task = {'name': name, 'gpufleet.upgrade.plan_lease': dict(plan_digest=digest, holder=holder, **args),
            'register': name.replace(' ', '_'), 'ignore_errors': True, 'diff': True}
    if check_mode:
        task['check_mode'] = True
    return task


@pytest.fixture
def as_role(cluster):
    kubeconfig = rbac.kubeconfig_for(cluster, ROLE)
    made = []
    yield kubeconfig, made
    for digest in made:
        cluster.delete('coordination.k8s.io/v1', 'Lease', lz.lease_name(digest), namespace=NS)


def test_one_run_holds_the_plan_another_is_refused_until_it_expired(cluster, run_playbook, as_role):
    kubeconfig, made = as_role
    digest = plan_digest('two-runs')
    made.append(digest)
    name = lz.lease_name(digest)
    path = '%s/%s' % (LEASES, name)
    tasks = [
        lease_task('a predicts', digest, 'run-a', duration=30, check_mode=True),
        lease_task('a acquires', digest, 'run-a', duration=30),
        lease_task('b is refused', digest, 'run-b', duration=30),
        lease_task('b is refused in check mode', digest, 'run-b', check_mode=True),
        lease_task('b may not release it', digest, 'run-b', state='released'),
        # a short lease from here: b takes over once it expired (b's acquire retried, bounded, until it holds it)
        lease_task('a renews for 2 s', digest, 'run-a', state='renewed', duration=2, clock_skew=0),
        dict(lease_task('b takes over', digest, 'run-b', duration=30, clock_skew=0),
             until='b_takes_over is succeeded', retries=30, delay=1),
        lease_task('a lost it', digest, 'run-a', state='renewed', duration=30),
        lease_task('a may not release it', digest, 'run-a', state='released'),
        lease_task('b releases it', digest, 'run-b', state='released'),
        lease_task('b releases it again', digest, 'run-b', state='released'),
    ]
    cluster.clear_requests()
    mark = cluster.audit_mark()
    run = run_playbook(play(As(kubeconfig), *tasks))
    assert run.rc == 0, run.stdout

    def result(task):
        res = run.result(task)
        return res['_event'] == 'runner_on_failed', res.get('changed'), res.get('outcome'), res

    failed, changed, outcome, res = result('a predicts')
    assert (failed, changed, outcome) == (False, True, 'created') and res['lease']['holder'] == 'run-a'
    assert res['diff']['before'] is None
    failed, changed, outcome, res = result('a acquires')
    assert (failed, changed, outcome) == (False, True, 'created') and res['lease']['transitions'] == 0
    for task in ('b is refused', 'b is refused in check mode'):
        failed, changed, outcome, res = result(task)
        assert (failed, changed, outcome) == (True, False, 'held'), res
        assert res['msg'].startswith('Lease %s/%s is held by "run-a" (renewTime %s' % (NS, name, res['lease']['renew_time']))
        assert 'it expires at %s' % res['lease']['expires'] in res['msg']
    failed, changed, outcome, res = result('b may not release it')
    assert (failed, changed, outcome) == (False, False, 'not_held') and res['lease']['holder'] == 'run-a'
    failed, changed, outcome, res = result('a renews for 2 s')
    assert (failed, changed, outcome) == (False, True, 'renewed') and res['lease']['duration'] == 2
    failed, changed, outcome, res = result('b takes over')
    assert (failed, changed, outcome) == (False, True, 'taken_over'), res
    assert res['lease']['holder'] == 'run-b' and res['lease']['transitions'] == 1
    assert res['diff']['before']['holder'] == 'run-a'
    failed, changed, outcome, res = result('a lost it')
    assert (failed, outcome) == (True, 'lost') and 'this run lost the plan' in res['msg']
    failed, changed, outcome, res = result('a may not release it')
    assert (failed, changed, outcome) == (False, False, 'not_held') and res['lease']['holder'] == 'run-b'
    failed, changed, outcome, res = result('b releases it')
    assert (failed, changed, outcome) == (False, True, 'released') and res['lease']['holder'] is None
    failed, changed, outcome, res = result('b releases it again')
    assert (failed, changed, outcome) == (False, False, 'not_held')

    # the object itself: kept, no holder, one transition, our label and the full digest
    lease = cluster.get('coordination.k8s.io/v1', 'Lease', name, namespace=NS)
    assert 'holderIdentity' not in lease['spec'] and lease['spec']['leaseTransitions'] == 1
    assert lease['metadata']['labels'] == {'app.kubernetes.io/managed-by': 'gpufleet.upgrade'}
    assert lease['metadata']['annotations'] == {'gpufleet.io/plan-digest': digest}
    # writes: a's create and renewal, b's takeover and release; nothing from check mode, a refusal or a non-holder
    assert mutations(cluster) == [('POST', LEASES), ('PATCH', path), ('PATCH', path), ('PATCH', path)]
    # all inside the Role, none refused by the authorizer
    assert R.violations(ROLE, list(cluster.requests)) == []
    events = cluster.audit_events(since=mark, user=rbac.user(rbac.SERVICE_ACCOUNTS[ROLE]))
    assert events and rbac.refused(events) == []


def module_process(kubeconfig: str, args: dict, tmp_path, tag: str) -> subprocess.Popen:
    """plan_lease as its own process (what a task delegated to another host runs)."""
    path = tmp_path / ('args-%s.json' % tag)
    path.write_text(json.dumps({'ANSIBLE_MODULE_ARGS': dict(args, kubeconfig=kubeconfig)}))
    env = dict(os.environ, PYTHONPATH=os.environ['ANSIBLE_COLLECTIONS_PATH'])
    return subprocess.Popen([sys.executable, '-m', 'ansible_collections.gpufleet.upgrade.plugins.modules.plan_lease',
                             str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_two_runs_starting_together_end_with_one_holder(cluster, tmp_path, as_role):
    kubeconfig, made = as_role
    digest = plan_digest('together')
    made.append(digest)
    procs = {holder: module_process(kubeconfig, {'plan_digest': digest, 'holder': holder, 'duration': 60}, tmp_path,
                                    holder)
             for holder in ('run-a', 'run-b')}
    results = {}
    for holder, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        results[holder] = json.loads(out or '{}') or {'stderr': err}
    outcomes = sorted(r.get('outcome') for r in results.values())
    assert outcomes == ['created', 'held'], results
    winner = next(h for h, r in results.items() if r['outcome'] == 'created')
    loser = next(h for h, r in results.items() if r['outcome'] == 'held')
    assert results[loser]['failed'] and ('held by "%s"' % winner) in results[loser]['msg']
    lease = cluster.get('coordination.k8s.io/v1', 'Lease', lz.lease_name(digest), namespace=NS)
    assert lease['spec']['holderIdentity'] == winner and lease['spec']['leaseTransitions'] == 0
