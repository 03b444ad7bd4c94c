"""Issue 39 item 1: a GPU node whose Python the collection's node-side modules cannot run with (older than 3.9, or
one Ansible cannot run a module with at all) is refused by the first task each playbook runs on the nodes, naming
the node, its interpreter and version, the requirement and ansible_python_interpreter; nothing runs on any node
after it (no NVML read, no role) and nothing is written. Each playbook through ansible-runner; only the canary reads
the cluster before the check (its stop switch), the others need none."""
from __future__ import annotations

import glob
import json
import os
import pathlib
import sys

import pytest

from k8s_support import load, mutations
from tools.records import CURRENT, PCI_IDS, TARGET

from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import digest_of

REPO = pathlib.Path(__file__).resolve().parents[2]
CHECK = 'Node Python | Python 3.9 or later on every GPU node (else set ansible_python_interpreter; nothing was changed)'
READ = 'Node Python | Read the Python of each GPU node (ansible.builtin.setup, the python facts only)'
# A real Python 3.8 where one is installed (pyenv): ansible-core 2.19/2.20 run setup with it (the version is
# read), 2.21 refuses it itself (the version is in its message); the node is refused the same way either way.
PY38 = sorted(glob.glob(os.path.expanduser('~/.pyenv/versions/3.8*/bin/python3.8')))
NO_KUBECONFIG = '/nonexistent/kubeconfig'


@pytest.fixture
def broken(tmp_path):
    """An interpreter no module runs with (what Python 2.7 or 3.6 answers ansible-core's module wrapper)."""
    path = tmp_path / 'python2.7'
    path.write_text('#!/bin/sh\necho \'  File "AnsiballZ_setup.py", line 40\' >&2\necho "SyntaxError: invalid syntax" >&2\nexit 1\n')
    path.chmod(0o755)
    return str(path)


def _inventory(hosts: dict) -> dict:
    local = {'ansible_connection': 'local'}
    return {'all': {'hosts': {'localhost': dict(local, ansible_python_interpreter=sys.executable)},
                    'children': {'gpu_nodes': {'hosts': {h: dict(local, ansible_python_interpreter=p)
                                                         for h, p in hosts.items()}}}}}


def _ran(run) -> set:
    return {e['event_data'].get('task') for e in run.events
            if e.get('event') in ('runner_on_ok', 'runner_on_failed', 'runner_on_skipped')}


def _refused(run, hosts: dict) -> dict:
    """{host: message} of the check; every host was read and checked."""
    assert run.status == 'failed' and run.rc != 0, run.stdout
    assert {r['_host'] for r in run.task_results(READ)} == set(hosts)
    results = {r['_host']: r for r in run.task_results(CHECK) if r['_event'] != 'runner_on_start'}
    assert set(results) == set(hosts), results
    return {h: r['msg'] for h, r in results.items() if r['_event'] == 'runner_on_failed'}


def _want(broken: str) -> dict:
    want = {'gpu-old-01': 'gpu-old-01: Ansible could not run a Python module with %s (SyntaxError: invalid syntax); '
                          "the collection's node-side modules need Python 3.9 or later on every GPU node; "
                          'set ansible_python_interpreter for the host (its host_vars, or the group_vars of the GPU '
                          'nodes) to a Python 3.9 or later installed on the node, e.g. '
                          'ansible_python_interpreter=/usr/bin/python3.11.' % broken}
    if PY38:
        want['gpu-py38-01'] = ("gpu-py38-01: Python 3.8.%s (%s) is older than the Python 3.9 the collection's node-side "
                               'modules need on every GPU node; set ansible_python_interpreter for the host'
                               % (PY38[0].split('/versions/3.8.')[1].split('/')[0], PY38[0]))
    return want


def _expect(refused: dict, broken: str) -> None:
    want = _want(broken)
    assert set(refused) == set(want), refused
    for host, msg in want.items():
        assert refused[host].startswith(msg), refused[host]
        assert refused[host].endswith('Nothing was changed.')


def _hosts(broken: str) -> dict:
    hosts = {'gpu-ok-01': sys.executable, 'gpu-old-01': broken}
    if PY38:
        hosts['gpu-py38-01'] = PY38[0]
    return hosts


def test_plan_refuses_every_old_interpreter_before_reading_a_gpu(run_playbook, broken, tmp_path):
    hosts = _hosts(broken)
    plan = tmp_path / 'plan.json'
    run = run_playbook(REPO / 'playbooks' / 'plan.yml', inventory=_inventory(hosts), extravars={
        'gpufleet_plan_file': str(plan), 'gpufleet_target': dict(TARGET), 'gpufleet_kubeconfig': NO_KUBECONFIG})
    _expect(_refused(run, hosts), broken)
    # the node with a good Python passed the check, then the play stopped for every node: no NVML read, no plan
    assert {r['_host'] for r in run.task_results(CHECK, 'runner_on_ok')} == {'gpu-ok-01'}
    assert not run.task_results('Plan | NVML facts (driver, PCI identities, MIG) and the DMI identity (the platform where no label says it)')
    assert not any((t or '').startswith('Plan | Read the pool') for t in _ran(run))
    assert not plan.exists()


def test_preflight_refuses_before_its_role(run_playbook, broken):
    hosts = _hosts(broken)
    run = run_playbook(REPO / 'playbooks' / 'preflight.yml', inventory=_inventory(hosts), extravars={
        'gpufleet_target': dict(TARGET), 'gpufleet_kubeconfig': NO_KUBECONFIG})
    _expect(_refused(run, hosts), broken)
    assert not any((t or '').startswith(('Tuple |', 'Holders |', 'RKE2 |', 'Intake |', 'Host |')) for t in _ran(run)), \
        _ran(run)


def test_rollback_refuses_every_node_before_the_first_is_rolled_back(run_playbook, broken):
    hosts = _hosts(broken)
    run = run_playbook(REPO / 'playbooks' / 'rollback.yml', inventory=_inventory(hosts), extravars={
        'gpufleet_rollback_nodes': ','.join(hosts), 'gpufleet_target': dict(TARGET),
        'gpufleet_kubeconfig': NO_KUBECONFIG})
    _expect(_refused(run, hosts), broken)
    # the rollback play takes the nodes one at a time: not even the first (whose Python is fine) was touched
    assert not run.task_results("Rollback | Read the node's NVML facts (its PCI identity picks the record)")


def test_a_supported_interpreter_passes_the_check(run_playbook, tmp_path):
    run = run_playbook(REPO / 'playbooks' / 'plan.yml', inventory=_inventory({'gpu-ok-01': sys.executable}), extravars={
        'gpufleet_plan_file': str(tmp_path / 'plan.json'), 'gpufleet_target': dict(TARGET),
        'gpufleet_kubeconfig': NO_KUBECONFIG})
    assert run.result(CHECK)['_event'] == 'runner_on_ok'
    # the next task on the node ran (here it fails: no GPU on this machine)
    assert run.task_results('Plan | NVML facts (driver, PCI identities, MIG) and the DMI identity (the platform where no label says it)')


def test_canary_refuses_before_the_lease_the_evidence_and_the_operator_step(cluster, run_playbook, broken, tmp_path):
    """The canary groups its canaries and checks them in a play on them, after the plan's checks and before its
    first change (the plan's Lease)."""
    load(cluster)
    hosts = _hosts(broken)
    canaries = sorted(hosts)
    content = {'target': dict(TARGET), 'canaries': canaries, 'batches': [canaries], 'combinations': [
        {'id': 'c1', 'key': {'pci_ids': ','.join(PCI_IDS), 'install_method': 'apt'}, 'canaries': canaries,
         'nodes': canaries, 'source_tuples': [dict(CURRENT)]}]}
    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps(dict(content, digest=digest_of(content))))
    run = run_playbook(REPO / 'playbooks' / 'canary.yml', inventory=_inventory(hosts), extravars={
        'gpufleet_kubeconfig': cluster.kubeconfig, 'gpufleet_plan_file': str(plan), 'gpufleet_source_revision': 'c' * 40,
        'gpufleet_qualification_dir': str(tmp_path / 'qualification'), 'gpufleet_gpu_operator_managed': True})
    assert run.status == 'failed', run.stdout
    _expect(_refused(run, hosts), broken)
    assert not any((t or '').startswith(("Canary | Hold the plan's Lease", 'Canary | Open one evidence bundle',
                                         'Canary | GPU Operator')) for t in _ran(run))
    assert 'Canary | Group the canaries' in _ran(run)
    assert mutations(cluster) == [] and not (tmp_path / 'qualification').exists()
