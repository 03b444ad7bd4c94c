"""Issue 17: the AWX workflow as AWX runs it. Each job template runs through ansible-runner in its own
fresh private data directory, from its own fresh checkout of the collection (the tracked and
unignored files of this working tree, copied: what a project sync gives), with an inventory and
extra vars as AWX passes them (a survey's values, `awx_user_name`/`awx_user_email`, and the
artifacts the earlier jobs passed on with set_stats). The only state the jobs share is a bare Git
repository on this machine (the evidence remote) and the lab's real control plane and nodes.

plan -> preflight (read-only, its checks run on the lab's nodes and cluster: the pool, the holders, GPU intake
closed as the inventory declares it, the declared applications' CUDA compatibility, each node's NVML facts and
the target driver's availability in its package root; it writes nothing and passes nothing on) -> canary ->
approve (refused for the canary's own operator; then the approve-and-roll-out workflow, launched by a third
operator, whose AWX approval node a second operator approved: the approve job reads that approver from the AWX
API, a stand-in of it here, and records them) -> upgrade_check -> rollout;
then the evidence repository holds every artifact, each written by the job's operator, the records approved in
a commit of their own, and no job wrote a file the next one read outside it. A preflight that fails (GPU intake
open) ends the qualify workflow as playbooks/vars/awx.yml defines it: the canary is never launched. A relaunch
of a rollout killed after a node's `installed` phase runs in a fresh directory: it resumes from the cluster (the
snapshot Secret) and the repository, and its push goes on top of what the killed run committed.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests'), str(REPO / 'tests' / 'integration')]

from tools import labenv  # noqa: E402
from tools.lab import Lab  # noqa: E402
import test_rollout_stop  # noqa: E402
from test_lab import PROMETHEUS  # noqa: E402
from test_rollout_resume import kill_after  # noqa: E402
from tools.awx_api_standin import StandIn, approval, approval_node, job_node  # noqa: E402

pytestmark = [test_rollout_stop.pytestmark,
              pytest.mark.skipif(not PROMETHEUS, reason='LOUD SKIP: the canary needs Prometheus for monitoringPassed'),
              pytest.mark.skipif(not shutil.which('git'), reason='the evidence repository needs git')]

ALICE = {'awx_user_name': 'alice', 'awx_user_email': 'alice@example.com'}
BOB = {'awx_user_name': 'bob', 'awx_user_email': 'bob@example.com'}
CAROL = {'awx_user_name': 'carol', 'awx_user_email': 'carol@example.com'}
# The AWX API (a stand-in: AWX cannot run here) of the approve-and-roll-out workflow job 31: its approval node,
# approved in AWX by bob, then the approve job; the controller credential's token.
AWX_TOKEN = 'tok-workflow-31-5e1d'
AWX_API = {'token': AWX_TOKEN, 'workflow_jobs': {'31': [
    approval_node(311, 31, 'approval', 'gpufleet: a second operator approves the canary', 3101),
    job_node(312, 31, 'approve', 'gpufleet approve', 3102, status='running')]},
    'workflow_approvals': {'3101': approval(3101, 31, 'gpufleet: a second operator approves the canary', by='bob')}}
FILES = {'gpufleet_plan_file': 'plans/gpu-upgrade-plan.json', 'gpufleet_qualification_dir': 'qualification',
         'gpufleet_evidence': 'evidence/gpu-rollout.json'}
# Group variables of the project's inventory (docs/awx.md: structured inputs a survey cannot express): how GPU intake
# is closed on this cluster (a tenant's GPU quota at 0) and the CUDA applications the upgraded nodes will run.
INTAKE_NAMESPACE = 'tenant-a'
INVENTORY = {
    'gpufleet_intake_checks': [{'api_version': 'v1', 'kind': 'ResourceQuota', 'namespace': INTAKE_NAMESPACE,
                                'name': 'gpu-intake', 'field': 'spec.hard["requests.nvidia.com/gpu"]',
                                'closed_values': ['0']}],
    'gpufleet_applications': [{'name': 'trainer', 'toolkit': '12.8'}, {'name': 'inference', 'toolkit': '12.4'}],
}
AWX_VARS = REPO / 'playbooks' / 'vars' / 'awx.yml'


def git(*args: str, cwd: pathlib.Path) -> str:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM='1', LC_ALL='C')
    return subprocess.run(['git', *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def project_checkout(dest: pathlib.Path) -> pathlib.Path:
    """A fresh checkout of the collection, as an AWX project sync gives it: the files git tracks, and the
    untracked ones it does not ignore, copied to <dest>/ansible_collections/gpufleet/upgrade."""
    root = dest / 'ansible_collections' / 'gpufleet' / 'upgrade'
    listed = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split('\0')
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    return root


def declare_intake(lab: Lab, gpus: str) -> None:
    """The tenant's GPU quota INVENTORY's intake check reads (`gpus` "0": intake closed), and what the operator who
    declares it grants the jobs' identity: `get` on that one object (docs/rbac's reader role reads no quota)."""
    ns, sa = labenv.OPERATOR_SA
    name = 'gpufleet-upgrade-intake-reader'
    lab.cluster.apply([
        {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': INTAKE_NAMESPACE}},
        {'apiVersion': 'v1', 'kind': 'ResourceQuota',
         'metadata': {'name': 'gpu-intake', 'namespace': INTAKE_NAMESPACE},
         'spec': {'hard': {'requests.nvidia.com/gpu': gpus}}},
        {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'Role',
         'metadata': {'name': name, 'namespace': INTAKE_NAMESPACE},
         'rules': [{'apiGroups': [''], 'resources': ['resourcequotas'], 'resourceNames': ['gpu-intake'],
                    'verbs': ['get']}]},
        {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'RoleBinding',
         'metadata': {'name': name, 'namespace': INTAKE_NAMESPACE},
         'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': name},
         'subjects': [{'kind': 'ServiceAccount', 'name': sa, 'namespace': ns}]}], settle=False)


def task_results(into: dict):
    """A job hook: (task name, host) -> (event, the module's result) of each task that ran, was skipped or failed."""
    def hook(event: dict) -> None:
        data = event.get('event_data') or {}
        if event.get('event') in ('runner_on_ok', 'runner_on_failed', 'runner_on_skipped'):
            into[(data.get('task'), data.get('host'))] = (event['event'], data.get('res') or {})
    return hook


def awx_workflow(name: str) -> dict[str, dict]:
    """The nodes of the AWX workflow `name` as playbooks/vars/awx.yml defines them (what awx_setup.yml creates):
    identifier -> {playbook (None for an approval node), success_nodes, failure_nodes, always_nodes} (identifiers),
    in the file's order."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_constructor('!unsafe', lambda loader, node: loader.construct_scalar(node))
    data = yaml.load(AWX_VARS.read_text(), Loader=Loader)  # noqa: S506 (a SafeLoader)
    playbooks = {t['name']: t['playbook'] for t in data['gpufleet_awx_job_templates']}
    wf = next(w for w in data['gpufleet_awx_workflows'] if w['name'] == name)
    # An approval node (`approval:`) runs no playbook: None.
    return {n['identifier']: dict({k: [x['identifier'] for x in (n.get('related') or {}).get(k) or []]
                                   for k in ('success_nodes', 'failure_nodes', 'always_nodes')},
                                  playbook=playbooks[n['template']] if 'template' in n else None)
            for n in wf['nodes']}


class Workflow:
    """The jobs of one workflow run: each in a fresh directory; `stats` are the artifacts passed on so far."""

    def __init__(self, lab: Lab, base: pathlib.Path, remote: pathlib.Path) -> None:
        self.lab, self.base, self.remote = lab, base, remote
        self.stats: dict = {}
        self.jobs: dict[str, pathlib.Path] = {}
        # Per job: the private clones of the evidence repository it left in its temporary directory.
        self.left: dict[str, list[str]] = {}

    def job(self, name: str, playbook: str, identity: dict, extra: dict | None = None, survey: dict | None = None,
            **kw) -> str:
        work = self.base / 'jobs' / name
        assert not work.exists(), work
        collection = project_checkout(work / 'project')
        self.jobs[name] = work
        stats: dict = {}

        def artifacts(event: dict) -> None:
            if event.get('event') == 'playbook_on_stats':
                stats.update((event.get('event_data') or {}).get('artifact_data') or {})
            if kw.get('hook'):
                kw['hook'](event)

        extravars = dict(FILES, gpufleet_evidence_repo=str(self.remote), **self.stats, **identity)
        # Nothing of a job outlives it but the repository and the cluster: its snapshots directory is its own.
        extravars.update(gpufleet_snapshot_dir=str(work / 'snapshots'), gpufleet_source_revision='')
        extravars.update(extra or {})
        # A workflow's survey answers take precedence over the artifacts of earlier jobs (AWX: "Workflow Job
        # extra_vars higher precedence than ancestor artifacts").
        extravars.update(survey or {})
        # The job's own temporary directory (TMPDIR; short: ansible-core's local RPC socket is made there): what
        # the job leaves there is in `left`.
        tmp = pathlib.Path(tempfile.mkdtemp(prefix='gf-job-'))
        try:
            status = self.lab.play(name, playbook, extravars, collection=collection, hook=artifacts,
                                   cancel_on=kw.get('cancel_on'), envvars={'TMPDIR': str(tmp)})
            self.left[name] = sorted(p.name for p in tmp.glob('gpufleet-evidence-*'))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.stats.update(stats)
        return status

    def launch(self, workflow: str, identity: dict, survey: dict | None = None) -> list[tuple[str, str]]:
        """Launch the AWX workflow `workflow` (awx_workflow) as `identity`: its root node's job, then the nodes its
        success_nodes name when the job succeeded, its failure_nodes when it failed, its always_nodes either way, as
        AWX walks the graph. Each job runs as job() runs it (named by its node). Returns (node, status) in order."""
        nodes = awx_workflow(workflow)
        children = {c for n in nodes.values() for k in ('success_nodes', 'failure_nodes', 'always_nodes') for c in n[k]}
        todo, ran = [n for n in nodes if n not in children], []
        while todo:
            node = todo.pop(0)
            status = self.job(node, nodes[node]['playbook'].rsplit('/', 1)[-1], identity, survey=survey)
            ran.append((node, status))
            todo += nodes[node]['success_nodes' if status == 'successful' else 'failure_nodes']
            todo += nodes[node]['always_nodes']
        return ran


def test_the_workflow_runs_job_by_job_with_nothing_shared_but_the_evidence_repository_and_the_cluster(tmp_path):
    remote = tmp_path / 'evidence.git'
    git('init', '-q', '--bare', '-b', 'main', str(remote), cwd=tmp_path)
    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, change='driver', workload_suite=True,
              lab_vars=INVENTORY)
    lab.dir.mkdir()
    try:
        lab.prepare()
        declare_intake(lab, '0')
        flow = Workflow(lab, tmp_path, remote)
        assert flow.job('plan', 'plan.yml', ALICE) == 'successful', lab.runs['plan']['failures']
        assert set(flow.stats) == {'gpufleet_evidence_revision', 'gpufleet_plan_digest'}, flow.stats
        planned = flow.stats['gpufleet_evidence_revision']
        plan = json.loads(git('show', '%s:plans/gpu-upgrade-plan.json' % planned, cwd=remote))
        assert plan['digest'] == flow.stats['gpufleet_plan_digest']

        # preflight (a blocking node of the qualify workflow): read-only, on the plan's target, its checks run on
        # the lab's nodes; it writes nothing to the repository and passes nothing on, so the canary gets the plan
        # job's artifacts (AWX passes an ancestor's artifacts on to every descendant).
        planned_stats = dict(flow.stats)
        ran: dict = {}
        assert flow.job('preflight', 'preflight.yml', ALICE, hook=task_results(ran)) == 'successful', \
            lab.runs['preflight']['failures']
        assert flow.stats == planned_stats and git('rev-parse', 'main', cwd=remote) == planned

        def once(task: str) -> dict:
            (event, res), = [v for (t, _h), v in ran.items() if t == task]
            assert event == 'runner_on_ok', (task, res)
            return res
        fleet = once('Tuple | Read the pool, the cluster components and the intake objects')
        assert sorted(n['name'] for n in fleet['nodes']) == lab.names, fleet['nodes']
        intake = once('Intake | GPU intake is closed as declared (seed 004, step 1)')
        assert intake['closed'] is True and [c['status'] for c in intake['checks']] == ['closed'], intake
        cuda = once('CUDA | Declared applications run on the target driver')
        assert cuda['passed'] is True and cuda['driver'] == plan['target']['driver'], cuda
        assert [a['name'] for a in cuda['applications']] == ['trainer', 'inference'], cuda
        summary = once('Result | Summary')['ansible_facts']['preflight_result']
        assert int(summary['nodes']) == len(lab.names) and summary['not_ready'] == [] and summary['cordoned'] == [], \
            summary
        for i, node in enumerate(lab.names):
            event, facts = ran[('Host | NVML facts', node)]
            assert event == 'runner_on_ok' and facts['driver_version'] == labenv.SOURCE_DRIVER, (node, facts)
            assert facts['pci_ids'] == [labenv.model_of(i, len(lab.names))['pci']], (node, facts)
            # The exact target driver resolved from the node's own package root (check mode: nothing installed).
            event, pin = ran[('Host | The target driver can be pinned (check mode, nothing changes)', node)]
            assert event == 'runner_on_ok' and pin['resolved'], (node, pin)
            assert all(v.startswith(plan['target']['driver']) for v in pin['resolved'].values()), (node, pin)
        rows = lab.node_view()
        assert all(r['driver'] == labenv.SOURCE_DRIVER and not r['cordoned'] and r['state'] == '-' for r in rows), rows

        assert flow.job('canary', 'canary.yml', ALICE) == 'successful', lab.runs['canary']['failures']
        canaried = flow.stats['gpufleet_evidence_revision']
        records = sorted(p for p in git('ls-tree', '-r', '--name-only', canaried, cwd=remote).splitlines()
                         if p.startswith('qualification/') and p.endswith('.yaml'))
        assert len(records) == len(plan['combinations']), records
        for rec in records:
            text = git('show', '%s:%s' % (canaried, rec), cwd=remote)
            assert 'state: "qualified"' in text and 'approvedBy: ""' in text, text
            # sourceRevision is the repository's commit that holds the record's exact bundle (the canary committed
            # its bundles and reports first, then the records).
            source = next(ln for ln in text.splitlines() if ln.startswith('sourceRevision:')).split('"')[1]
            bundle = rec[:-len('.yaml')] + '.json'
            assert git('show', '%s:%s' % (source, bundle), cwd=remote) == git('show', '%s:%s' % (canaried, bundle), cwd=remote)
            assert git('log', '--diff-filter=A', '--format=%an', canaried, '--', rec, cwd=remote) == 'alice'

        # Workflow 2 ("approve and roll out") is launched by a second operator with the revision the qualify
        # workflow ended on as its survey answer. The canary's own operator launching it is refused, nothing pushed.
        second = {'gpufleet_qualified_revision': canaried}
        flow.stats = {}          # another workflow: none of the first one's artifacts
        assert flow.job('approve-by-alice', 'approve.yml', ALICE, survey=second) == 'failed'
        msg = lab.runs['approve-by-alice']['failures'][-1]['msg']
        assert 'approval refused, nothing was changed' in msg and 'approved by "alice", who ran its canary' in msg, msg
        assert git('rev-parse', 'main', cwd=remote) == canaried

        # carol launches it; its first node, the AWX approval, is approved by bob; the approve job (run as the
        # launcher, carol, as AWX runs every job of a workflow) reads who approved from the AWX API with the
        # controller credential and records bob, in a commit authored by bob.
        with StandIn(AWX_API) as awx:
            controller = {'awx_workflow_job_id': 31, 'gpufleet_awx_host': awx.url, 'gpufleet_awx_token': AWX_TOKEN}
            assert flow.job('approve', 'approve.yml', CAROL, extra=controller, survey=second) == 'successful', \
                lab.runs['approve']['failures']
        assert awx.requests and all(r['method'] == 'GET' and r['authorized'] for r in awx.requests), awx.requests
        assert AWX_TOKEN not in json.dumps(lab.runs['approve'], default=str)
        approved = flow.stats['gpufleet_evidence_revision']
        assert flow.stats['gpufleet_plan_digest'] == plan['digest']
        assert git('log', '-1', '--format=%an <%ae>|%s', approved, cwd=remote).startswith('bob <bob@localhost>|approve: ')
        assert git('diff', '--name-only', canaried, approved, cwd=remote).splitlines() == records
        assert all('approvedBy: "bob"' in git('show', '%s:%s' % (approved, r), cwd=remote) for r in records)

        assert flow.job('upgrade_check', 'upgrade_check.yml', CAROL, survey=second) == 'successful', \
            lab.runs['upgrade_check']['failures']
        checked = flow.stats['gpufleet_evidence_revision']
        bundle = json.loads(git('show', '%s:evidence/gpu-rollout.json' % checked, cwd=remote))
        assert [g['kind'] for g in bundle['gates']] == ['upgrade_check'] * len(plan['combinations'])

        assert flow.job('rollout', 'rollout.yml', CAROL, survey=second) == 'successful', lab.runs['rollout']['failures']
        rolled = flow.stats['gpufleet_evidence_revision']
        bundle = json.loads(git('show', '%s:evidence/gpu-rollout.json' % rolled, cwd=remote))
        upgraded = [n for b in plan['batches'] for n in b if n not in plan['canaries']]
        assert sorted(n for n, e in bundle['nodes'].items() if e.get('verdict') == 'upgraded') == sorted(upgraded)
        rows = {r['node']: r for r in lab.node_view()}
        assert all(rows[n]['state'] == 'done' and rows[n]['driver'] == labenv.TARGET_DRIVER for n in rows), rows

        # The history: linear, every commit by the operator of the job that made it, nothing forced.
        log = git('log', '--format=%an|%s', '--reverse', rolled, cwd=remote).splitlines()
        assert log[0].startswith('alice|plan: ') and any(ln.startswith('bob|approve: ') for ln in log), log
        assert all(ln.split('|')[0] in ('alice', 'bob', 'carol') for ln in log), log
        assert git('rev-list', '--merges', '--count', rolled, cwd=remote) == '0'
        # Every job that ended removed its private clone of the repository; the refused one stopped on its failure
        # and kept it for inspection (tasks/evidence_cleanup.yml).
        assert {job: left for job, left in flow.left.items() if left} == \
            {'approve-by-alice': flow.left['approve-by-alice']}, flow.left
        assert len(flow.left['approve-by-alice']) == 1, flow.left
        # No job wrote its files where the next one could read them outside the repository.
        # (The lab creates its directories empty; the inventory's paths to them are overridden by the jobs.)
        assert not (lab.dir / 'plan.json').exists()
        assert not [p for d in ('qualification', 'evidence', 'snapshots') for p in (lab.dir / d).rglob('*')]
    finally:
        lab.stop()


def test_a_failed_preflight_ends_the_qualify_workflow_before_its_canary(tmp_path):
    """The qualify workflow launched while GPU intake is open (the tenant's GPU quota is not 0): the plan job
    succeeds, the preflight job fails on its intake check, and nothing follows it (a blocking node: no failure or
    always path in playbooks/vars/awx.yml), so no canary or rollback job is launched; the repository holds the plan
    alone and no node was touched."""
    remote = tmp_path / 'evidence.git'
    git('init', '-q', '--bare', '-b', 'main', str(remote), cwd=tmp_path)
    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, change='driver', metrics='off',
              lab_vars=INVENTORY)
    lab.dir.mkdir()
    try:
        lab.prepare()
        declare_intake(lab, '16')
        flow = Workflow(lab, tmp_path, remote)
        ran = flow.launch('gpufleet GPU upgrade: qualify', ALICE)
        assert ran == [('plan', 'successful'), ('preflight', 'failed')], [lab.runs[job[0]]['failures'] for job in ran]
        failure, = lab.runs['preflight']['failures']
        assert failure['task'] == 'Intake | GPU intake is closed as declared (seed 004, step 1)', failure
        assert failure['msg'].startswith('GPU intake NOT closed: 1/1 check(s) open'), failure
        assert set(flow.jobs) == {'plan', 'preflight'}
        assert git('log', '--format=%an|%s', 'main', cwd=remote).splitlines()[0].startswith('alice|plan: ')
        assert git('rev-list', '--count', 'main', cwd=remote) == '1'
        rows = lab.node_view()
        assert all(r['driver'] == labenv.SOURCE_DRIVER and not r['cordoned'] and r['state'] == '-'
                   and not r['canary'] for r in rows), rows
    finally:
        lab.stop()


def approved_and_checked(tmp_path: pathlib.Path, lab: Lab, prefix: str) -> tuple[Workflow, dict, dict]:
    """The qualify workflow's end state without its canary job (the first test runs it): the plan job's plan,
    alice's draft records committed by her, the canaries done and isolated; then the approve-and-roll-out workflow,
    launched by bob, up to its upgrade_check. Returns the workflow, the plan and bob's survey answers."""
    from test_rollout_wiring import canaries_as_the_canary_playbook_leaves_them
    from tools import records

    remote = tmp_path / 'evidence.git'
    git('init', '-q', '--bare', '-b', 'main', str(remote), cwd=tmp_path)
    lab.prepare()
    flow = Workflow(lab, tmp_path, remote)
    assert flow.job('plan', 'plan.yml', ALICE) == 'successful', lab.runs['plan']['failures']
    plan = json.loads(git('show', 'main:plans/gpu-upgrade-plan.json', cwd=remote))
    clone = tmp_path / 'alice'
    git('clone', '-q', str(remote), str(clone), cwd=tmp_path)
    (clone / 'qualification').mkdir()
    records.write_approved(clone / 'qualification', plan, lab.target, prefix, approver='pending')
    for rec in (clone / 'qualification').glob('*.yaml'):
        rec.write_text(re.sub(r'(?m)^approvedBy: .*$', 'approvedBy: ""', rec.read_text()))
    git('add', 'qualification', cwd=clone)
    git('-c', 'user.name=alice', '-c', 'user.email=alice@example.com', 'commit', '-q', '-m', 'canary: records', cwd=clone)
    git('push', '-q', 'origin', 'main', cwd=clone)
    second = {'gpufleet_qualified_revision': git('rev-parse', 'HEAD', cwd=clone)}
    flow.stats = {}          # another workflow: none of the first one's artifacts
    canaries_as_the_canary_playbook_leaves_them(lab, plan)
    assert flow.job('approve', 'approve.yml', BOB, survey=second) == 'successful', lab.runs['approve']['failures']
    assert flow.job('upgrade_check', 'upgrade_check.yml', BOB, survey=second) == 'successful', \
        lab.runs['upgrade_check']['failures']
    return flow, plan, second


def test_a_killed_rollout_relaunched_in_a_fresh_directory_resumes_and_rolls_back_from_the_stored_snapshot(tmp_path):
    """The rollout job is killed after a node recorded `installed`; AWX's relaunch runs in a fresh directory from a
    fresh checkout with the same extra vars and artifacts. It finds no snapshot file of its own: it fetches the one
    the Node records from its Secret, resumes the node there, and when the node's gate fails (the lab's Xid on its
    activation) rolls it back from that snapshot; the evidence goes on top of what the killed run committed."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state as us
    from test_rollout_resume import annotations

    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, change='driver')
    lab.dir.mkdir()
    try:
        flow, plan, second = approved_and_checked(tmp_path, lab, 'relaunch')
        remote = flow.remote
        checked = dict(flow.stats)

        node = next(n for b in plan['batches'] for n in b if n not in plan['canaries'])
        status = flow.job('rollout', 'rollout.yml', BOB, survey=second,
                          cancel_on=kill_after(node, 'Install | Record the phase'))
        assert status == 'canceled', lab.runs['rollout']['failures']
        assert annotations(lab, node).get(us.ANN_STATE) == 'installed', annotations(lab, node)
        killed_head = git('rev-parse', 'main', cwd=remote)

        # The relaunch: same artifacts as the killed job, a fresh directory; the node's activation brings up an Xid.
        lab.fault = node
        lab.write_conf()
        flow.stats = checked
        assert flow.job('rollout-relaunch', 'rollout.yml', BOB, survey=second) == 'failed'
        events = lab.runs['rollout-relaunch']['events']
        fetched = [e for e in events if e['host'] == node and e['event'] == 'runner_on_ok'
                   and (e['task'] or '').startswith('Progress | Fetch the snapshot the Node records')]
        assert fetched and fetched[0]['changed'] is True, fetched
        assert not [e for e in events if e['host'] == node and (e['task'] or '').startswith('Drain | Cordon')
                    and e['event'] == 'runner_on_ok'], 'the relaunch drained the node again'
        rows = {r['node']: r for r in lab.node_view()}
        assert rows[node]['state'] == 'rolled-back' and rows[node]['cordoned'] is True, rows[node]
        assert rows[node]['driver'] == labenv.SOURCE_DRIVER, rows[node]       # rolled back from the stored snapshot
        head = git('rev-parse', 'main', cwd=remote)
        assert subprocess.run(['git', 'merge-base', '--is-ancestor', killed_head, head], cwd=remote,
                              check=False).returncode == 0
        bundle = json.loads(git('show', 'main:evidence/gpu-rollout.json', cwd=remote))
        assert bundle['nodes'][node]['verdict'] == 'failed' and bundle['nodes'][node]['rolled_back'] is True, \
            bundle['nodes'][node]
        assert [g['kind'] for g in bundle['gates'] if g['kind'] == 'upgrade_check'], bundle['gates']
    finally:
        lab.stop()


def test_the_rollback_template_alone_in_a_fresh_directory_rolls_back_from_the_snapshot_in_the_cluster(tmp_path):
    """A node fails its gates and is left cordoned at the target (node_upgrade_rollback_on_failure false: the
    operator rolls back by hand); the rollback template then runs alone, in a fresh directory from a fresh checkout
    (another controller): no job left it a snapshot file, it fetches the one the Node records from its Secret,
    checks its digest and restores the node's driver."""
    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, change='driver')
    lab.dir.mkdir()
    try:
        flow, plan, second = approved_and_checked(tmp_path, lab, 'alone')
        node = next(n for b in plan['batches'] for n in b if n not in plan['canaries'])
        lab.fault = node
        lab.write_conf()
        assert flow.job('rollout', 'rollout.yml', BOB, survey=second,
                        extra={'node_upgrade_rollback_on_failure': False}) == 'failed'
        rows = {r['node']: r for r in lab.node_view()}
        assert rows[node]['state'] == 'failed' and rows[node]['cordoned'] is True, rows[node]
        assert rows[node]['driver'] == labenv.TARGET_DRIVER, rows[node]            # not rolled back

        assert flow.job('rollback', 'rollback.yml', BOB, survey=dict(second, gpufleet_rollback_nodes=node)) == \
            'successful', lab.runs['rollback']['failures']
        events = lab.runs['rollback']['events']
        fetched = [e for e in events if e['host'] == node and e['event'] == 'runner_on_ok'
                   and 'snapshot' in (e['task'] or '').lower() and 'fetch' in (e['task'] or '').lower()]
        assert fetched and fetched[0]['changed'] is True, [e['task'] for e in events if e['host'] == node]
        rows = {r['node']: r for r in lab.node_view()}
        assert rows[node]['driver'] == labenv.SOURCE_DRIVER and rows[node]['cordoned'] is True, rows[node]
    finally:
        lab.stop()
