"""The playbooks' input contract at run time: a missing or mistyped extra var fails the first task
(ansible.builtin.validate_argument_spec) with a message naming the variable, before anything else
runs and without one request to the Kubernetes API; survey-style inputs (strings, empty optional
answers) are accepted. The static survey <-> argument_spec contract is in test_awx_setup.py."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

import k8s_scenario as S
from k8s_support import load, mutations
from tools.records import CURRENT, PCI_IDS, TARGET

from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import digest_of

REPO = pathlib.Path(__file__).resolve().parents[2]
CHECK = {'plan': 'Plan | Check the inputs', 'preflight': 'Preflight | Check the inputs',
         'canary': 'Canary | Check the inputs', 'upgrade_check': 'Check the inputs',
         'rollout': 'Rollout | Check the inputs', 'rollback': 'Rollback | Check the inputs',
         'postflight': 'Postflight | Check the inputs', 'release': 'Release | Check the inputs',
         'approve': 'Approve | Check the inputs'}


def _inventory():
    local = {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable}
    return {'all': {'hosts': {'localhost': dict(local)},
                    'children': {'gpu_nodes': {'hosts': {S.NODE: dict(local), S.OTHER: dict(local)}}}}}


def _tasks_run(run):
    return [(e['event_data'].get('task'), e['event_data'].get('host'), e['event'])
            for e in run.events if e.get('event', '').startswith('runner_on_') and e['event'] != 'runner_on_start']


# (playbook, extra vars, the variable the message must name, a phrase of the message)
BAD = [
    ('rollout', {'gpufleet_qualification_dir': 'qualification', 'gpufleet_evidence': 'rollout.json'},
     'gpufleet_plan_file', 'missing required arguments'),
    ('rollout', {'gpufleet_plan_file': 'plan.json', 'gpufleet_qualification_dir': 'q', 'gpufleet_evidence': 'e.json',
                 'gpufleet_dra': 'perhaps'}, 'gpufleet_dra', 'bool'),
    ('plan', {'gpufleet_plan_file': 'plan.json', 'gpufleet_target': dict(TARGET),
              'gpufleet_canaries_per_combination': 'many'}, 'gpufleet_canaries_per_combination', 'int'),
    # Issue 39 item 4: the planner's switches are plan.yml's inputs, checked like the others.
    ('plan', {'gpufleet_plan_file': 'plan.json', 'gpufleet_target': dict(TARGET),
              'gpufleet_source_drift': 'spilt'}, 'gpufleet_source_drift', 'refuse, split'),
    ('plan', {'gpufleet_plan_file': 'plan.json', 'gpufleet_target': dict(TARGET),
              'gpufleet_omitted_block': 'perhaps'}, 'gpufleet_omitted_block', 'bool'),
    ('preflight', {'gpufleet_target': 'the next one'}, 'gpufleet_target', 'dict'),
    ('canary', {'gpufleet_plan_file': 'plan.json'}, 'gpufleet_qualification_dir', 'missing required arguments'),
    ('upgrade_check', {'gpufleet_qualification_file': 'q.yaml', 'gpufleet_pci_ids': list(PCI_IDS),
                       'gpufleet_current': 'whatever runs now', 'gpufleet_target': dict(TARGET)},
     'gpufleet_current', 'dict'),
    ('rollback', {'gpufleet_rollback_nodes': S.NODE, 'gpufleet_rollback_uncordon': 'maybe'},
     'gpufleet_rollback_uncordon', 'bool'),
    ('postflight', {'gpufleet_dra': 'perhaps'}, 'gpufleet_dra', 'bool'),
    ('release', {'gpufleet_evidence': 'rollout.json'}, 'gpufleet_plan_file', 'missing required arguments'),
    # The approval is a commit of the evidence repository: without one there is nothing to approve in.
    ('approve', {'gpufleet_plan_file': 'plan.json', 'gpufleet_qualification_dir': 'qualification'},
     'gpufleet_evidence_repo', 'missing required arguments'),
]


@pytest.mark.parametrize('name,extravars,var,phrase', BAD, ids=['%s-%s' % (b[0], b[2]) for b in BAD])
def test_bad_input_fails_the_first_task_naming_the_variable(cluster, run_playbook, name, extravars, var, phrase):
    load(cluster)
    extravars = dict(extravars, gpufleet_kubeconfig=cluster.kubeconfig)
    run = run_playbook(REPO / 'playbooks' / ('%s.yml' % name), extravars=extravars, inventory=_inventory())
    assert run.rc != 0 and run.status == 'failed'
    res = run.result(CHECK[name])
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'].startswith('Validation of arguments failed')
    assert var in res['msg'] and phrase in res['msg'], res['msg']
    # nothing ran but the check (once: on localhost, or run_once on the first GPU host)
    assert [t for t, _h, _e in _tasks_run(run)] == [CHECK[name]]
    # and the cluster was not even read
    assert cluster.requests == [] and mutations(cluster) == []


def test_rollout_without_the_plan_file_names_it_in_its_output(cluster, run_playbook):
    load(cluster)
    run = run_playbook(REPO / 'playbooks' / 'rollout.yml', inventory=_inventory(), extravars={
        'gpufleet_kubeconfig': cluster.kubeconfig, 'gpufleet_qualification_dir': 'q', 'gpufleet_evidence': 'e.json'})
    assert run.status == 'failed'
    assert 'missing required arguments: gpufleet_plan_file' in run.stdout
    assert mutations(cluster) == []


def test_plan_target_must_be_complete(cluster, run_playbook, tmp_path):
    """The five survey strings replace the mapping only when all five are given."""
    load(cluster)
    partial = {'gpufleet_target_kernel': TARGET['kernel'], 'gpufleet_target_driver': TARGET['driver']}
    run = run_playbook(REPO / 'playbooks' / 'plan.yml', inventory=_inventory(), extravars=dict(
        partial, gpufleet_plan_file=str(tmp_path / 'plan.json'), gpufleet_kubeconfig=cluster.kubeconfig))
    assert run.status == 'failed'
    res = run.result('Plan | The target is given once, as a mapping or as the five strings')
    assert res['_event'] == 'runner_on_failed'
    assert 'missing: gpufleet_target_rke2, gpufleet_target_gpu_operator, gpufleet_target_dcgm_exporter' in res['msg']
    assert run.result('Plan | Check the inputs')['_event'] == 'runner_on_ok'
    assert not run.task_results('Plan | NVML facts (driver, PCI identities, MIG) and the DMI identity (the platform where no label says it)')
    assert cluster.requests == [] and not (tmp_path / 'plan.json').exists()

    # the five strings and a mapping that disagrees with them
    strings = {'gpufleet_target_%s' % k: v for k, v in TARGET.items()}
    run = run_playbook(REPO / 'playbooks' / 'plan.yml', inventory=_inventory(), extravars=dict(
        strings, gpufleet_target=dict(TARGET, driver='580.130.01'), gpufleet_plan_file=str(tmp_path / 'plan.json'),
        gpufleet_kubeconfig=cluster.kubeconfig))
    assert run.status == 'failed'
    assert 'they must agree' in run.result('Plan | The target is given once, as a mapping or as the five strings')['msg']
    assert cluster.requests == []


def test_upgrade_check_collected_mode_takes_survey_answers(run_playbook, tmp_path):
    """What the AWX survey sends: the plan file, the qualification dir, an empty optional file answer. The gate
    runs per combination of the plan with the plan's tuples (here it blocks: no record in the dir)."""
    plan = tmp_path / 'plan.json'
    content = {'target': dict(TARGET), 'combinations': [
        {'id': 'c1', 'key': {'pci_ids': ','.join(PCI_IDS)}, 'source_tuples': [dict(CURRENT)]}]}
    plan.write_text(json.dumps(dict(content, digest=digest_of(content))))     # as upgrade_plan writes it
    run = run_playbook(REPO / 'playbooks' / 'upgrade_check.yml', extravars={
        'gpufleet_plan_file': str(plan), 'gpufleet_qualification_dir': str(tmp_path / 'qualification'),
        'gpufleet_qualification_file': '', 'gpufleet_max_canary_age': '720h'})
    assert run.status == 'failed'
    assert run.result('Check the inputs')['_event'] == 'runner_on_ok'
    assert run.result('Check that every gate input is given')['_event'] == 'runner_on_ok'
    gate = run.result('Run the GPU upgrade gate on every combination of the plan (collected from the hosts and the API)')
    slug = ','.join(PCI_IDS).replace(':', '').replace('/', '-').replace(',', '-')
    assert gate['_event'] == 'runner_on_failed'
    assert gate['results'][0]['problems'] == [
        'cannot read the qualification record "%s/%s.yaml": No such file or directory' % (tmp_path / 'qualification', slug)]

    # no plan and no tuples: the second check names every way to give them
    run = run_playbook(REPO / 'playbooks' / 'upgrade_check.yml', extravars={'gpufleet_qualification_dir': 'q'})
    assert run.status == 'failed'
    msg = run.result('Check that every gate input is given')['msg']
    assert 'gpufleet_plan_file' in msg and 'gpufleet_pci_ids' in msg and 'gpufleet_current' in msg


def test_rollback_without_nodes_acts_on_the_recorded_failures_only(cluster, run_playbook, tmp_path):
    """Empty gpufleet_rollback_nodes (the survey's default): the nodes whose gpufleet.io/upgrade-state is
    "failed"; none -> nothing to do, and nothing but reads."""
    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps({'target': dict(TARGET)}))
    load(cluster, [S.node(S.NODE), S.node(S.OTHER, annotations={'gpufleet.io/upgrade-state': 'done'})])
    extravars = {'gpufleet_rollback_nodes': '', 'gpufleet_plan_file': str(plan), 'gpufleet_node_selector': '',
                 'gpufleet_kubeconfig': cluster.kubeconfig}
    run = run_playbook(REPO / 'playbooks' / 'rollback.yml', extravars=extravars, inventory=_inventory())
    assert (run.rc, run.status) == (0, 'successful'), run.stdout
    assert run.result('Rollback | The nodes')['msg'] == 'rolling back the nodes recorded as failed: none, nothing to do'
    assert not run.task_results("Rollback | Read the node's NVML facts (its PCI identity picks the record)")
    assert cluster.requests and mutations(cluster) == []

    cluster.patch('v1', 'Node', S.NODE, {'metadata': {'annotations': {'gpufleet.io/upgrade-state': 'failed'}}})
    cluster.clear_requests()
    run = run_playbook(REPO / 'playbooks' / 'rollback.yml', extravars=extravars, inventory=_inventory())
    assert run.result('Rollback | The nodes')['msg'] == 'rolling back the nodes recorded as failed: ' + S.NODE
    # the rollback play runs on that node only (here it stops at the node's NVML read: no GPU on this machine)
    hosts = {r['_host'] for r in run.task_results("Rollback | Read the node's NVML facts (its PCI identity picks the record)")}
    assert hosts == {S.NODE}
    assert mutations(cluster) == []


def test_rollback_queues_the_failed_nodes_inventory_host_by_gpufleet_node_name(cluster, run_playbook, tmp_path):
    """Issue 39 item 3: a failed Node whose inventory host is an FQDN naming it with gpufleet_node_name is rolled
    back on that host (not on a new bare host of the Node name); a failed Node without a host is refused, named."""
    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps({'target': dict(TARGET)}))
    load(cluster, [S.node(S.NODE, annotations={'gpufleet.io/upgrade-state': 'failed'}), S.node(S.OTHER)])
    extravars = {'gpufleet_rollback_nodes': '', 'gpufleet_plan_file': str(plan), 'gpufleet_node_selector': '',
                 'gpufleet_kubeconfig': cluster.kubeconfig}
    inventory = _inventory()
    hosts = inventory['all']['children']['gpu_nodes']['hosts']
    fqdn = S.NODE + '.gpu.example.com'
    hosts[fqdn] = dict(hosts.pop(S.NODE), gpufleet_node_name=S.NODE)
    run = run_playbook(REPO / 'playbooks' / 'rollback.yml', extravars=extravars, inventory=inventory)
    assert run.result('Rollback | The nodes')['msg'] == 'rolling back the nodes recorded as failed: ' + fqdn
    ran = {r['_host'] for r in run.task_results("Rollback | Read the node's NVML facts (its PCI identity picks the record)")}
    assert ran == {fqdn}

    del hosts[fqdn]
    run = run_playbook(REPO / 'playbooks' / 'rollback.yml', extravars=extravars, inventory=inventory)
    assert run.status == 'failed'
    res = run.result('Rollback | Queue the failed nodes')
    assert res['_event'] == 'runner_on_failed'
    assert 'failed nodes: Node(s) %s have no inventory host' % S.NODE in res['msg'], res['msg']
    assert mutations(cluster) == []


def test_preflight_needs_the_plan_or_the_target(cluster, run_playbook, tmp_path):
    load(cluster)
    run = run_playbook(REPO / 'playbooks' / 'preflight.yml', inventory=_inventory(),
                       extravars={'gpufleet_kubeconfig': cluster.kubeconfig, 'gpufleet_plan_file': ''})
    assert run.status == 'failed'
    res = run.result('Preflight | The target is known (from the plan or gpufleet_target) and they agree')
    assert res['_event'] == 'runner_on_failed' and 'Set gpufleet_plan_file' in res['msg']
    assert cluster.requests == []

    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps({'target': dict(TARGET)}))
    run = run_playbook(REPO / 'playbooks' / 'preflight.yml', inventory=_inventory(), extravars={
        'gpufleet_kubeconfig': cluster.kubeconfig, 'gpufleet_plan_file': str(plan),
        'gpufleet_target': dict(TARGET, kernel='6.8.0-136-generic')})
    assert run.status == 'failed'
    assert 're-plan' in run.result('Preflight | The target is known (from the plan or gpufleet_target) and they agree')['msg']
    assert cluster.requests == []


@pytest.mark.parametrize('case', ['unreachable', 'revision', 'absolute'])
def test_a_bad_evidence_repository_fails_the_job_before_the_cluster_is_read(cluster, run_playbook, tmp_path, case):
    """Issue 17: an evidence remote that cannot be reached, a revision it does not have, or a file input outside
    the repository: the job fails at its first play, saying which, and neither the cluster nor a node is touched."""
    import subprocess
    load(cluster)
    remote = tmp_path / 'evidence.git'
    subprocess.run(['git', 'init', '-q', '--bare', '-b', 'main', str(remote)], check=True)
    extravars = {'gpufleet_kubeconfig': cluster.kubeconfig, 'gpufleet_plan_file': 'plans/plan.json',
                 'gpufleet_qualification_dir': 'qualification', 'gpufleet_evidence': 'evidence/rollout.json',
                 'gpufleet_evidence_repo': str(remote)}
    if case == 'unreachable':
        extravars['gpufleet_evidence_repo'] = str(tmp_path / 'nowhere.git')
    elif case == 'revision':
        extravars['gpufleet_evidence_revision'] = 'f' * 40
    else:
        extravars['gpufleet_plan_file'] = '/etc/plan.json'
    run = run_playbook(REPO / 'playbooks' / 'rollout.yml', extravars=extravars, inventory=_inventory())
    assert run.status == 'failed'
    failed = [(t, e) for t, _h, e in _tasks_run(run) if e == 'runner_on_failed']
    assert len(failed) == 1 and failed[0][0].startswith('Evidence | '), _tasks_run(run)
    msg = run.stdout
    expect = {'unreachable': 'nowhere.git', 'revision': 'f' * 40,
              'absolute': 'gpufleet_plan_file: "/etc/plan.json" is absolute'}[case]
    assert expect in msg, msg[-3000:]
    assert cluster.requests == [] and mutations(cluster) == []
    if case == 'absolute':      # refused before anything was cloned
        assert [t for t, _h, e in _tasks_run(run)] == ['Evidence | Every file input is a path inside the repository '
                                                       '(checked before anything is cloned)']


def test_canary_without_an_evidence_repository_or_revision_stops_before_anything_moves(cluster, run_playbook, tmp_path):
    """Review H4: the draft record needs a commit holding its evidence. Without gpufleet_evidence_repo and without
    gpufleet_source_revision the canary used to fail at its last task, after the canaries were upgraded, rolled
    back, upgraded again and observed; now its first checks refuse, naming both ways, and nothing is read."""
    load(cluster)
    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps({'target': dict(TARGET)}))
    run = run_playbook(REPO / 'playbooks' / 'canary.yml', inventory=_inventory(), extravars={
        'gpufleet_kubeconfig': cluster.kubeconfig, 'gpufleet_plan_file': str(plan),
        'gpufleet_qualification_dir': str(tmp_path / 'qualification')})
    assert run.status == 'failed'
    res = run.result('Canary | The evidence has a commit to live in (gpufleet_evidence_repo or gpufleet_source_revision)')
    assert res['_event'] == 'runner_on_failed'
    assert 'gpufleet_evidence_repo' in res['msg'] and 'gpufleet_source_revision' in res['msg'], res['msg']
    assert [t for t, _h, _e in _tasks_run(run)] == [
        CHECK['canary'], 'Canary | The evidence has a commit to live in (gpufleet_evidence_repo or gpufleet_source_revision)']
    assert cluster.requests == [] and mutations(cluster) == []
