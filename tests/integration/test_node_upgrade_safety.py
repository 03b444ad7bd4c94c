"""The node_upgrade role's safety on reruns (issue 12): recorded progress counts only while the node is
cordoned, the rescue cordons the node before it records the failure, and a snapshot the Node records
must be the one on this controller. On the real control plane (tests/cluster), with failures injected
before anything reaches the node's packages."""
from __future__ import annotations

import pytest

import k8s_scenario as S
from k8s_support import load, mutations, play

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state as U

pytestmark = pytest.mark.slow

TARGET = {'driver': '580.130.00'}
KEY = U.target_key(TARGET)


def role_play(cluster, tmp_path):
    role_vars = {'node_upgrade_node': S.NODE, 'node_upgrade_target': TARGET,
                 'node_upgrade_snapshot_dir': str(tmp_path / 'snapshots'), 'node_upgrade_qualification': ''}
    plays = play(cluster, {'name': 'upgrade', 'ansible.builtin.include_role': {'name': 'gpufleet.upgrade.node_upgrade'},
                           'vars': role_vars})
    return plays


def annotations(cluster):
    return cluster.get('v1', 'Node', S.NODE)['metadata'].get('annotations') or {}


def test_a_rerun_after_a_manual_uncordon_drains_again_and_the_failure_leaves_the_node_cordoned(
        cluster, run_playbook, tmp_path):
    """`installed` is recorded but someone uncordoned the node since: the rerun does not trust the
    record (it drains again; its cordon is refused here), and the rescue cordons the node before it
    records `failed`."""
    load(cluster)
    cluster.patch('v1', 'Node', S.NODE, {'metadata': {'annotations': {
        U.ANN_STATE: 'installed', U.ANN_TARGET: KEY, U.ANN_INITIAL: 'false'}}})
    cluster.faults.add(method='PATCH', path=r'^/api/v1/nodes/%s$' % S.NODE, status=403, times=1)
    run = run_playbook(role_play(cluster, tmp_path))
    assert run.rc != 0
    progress = run.result('Progress | Read what the Node records for this target')
    assert progress['state']['done_phases'] == [] and progress['state']['cordon_lost'] is True
    assert run.result("Drain | Cordon (initial state recorded once) and evict the node's pods (PodDisruptionBudgets "
                      "honoured)")['_event'] == 'runner_on_failed'
    assert run.result('Failure | Cordon the node (before the failure is recorded)')['changed'] is True
    n = cluster.get('v1', 'Node', S.NODE)
    assert n['spec']['unschedulable'] is True
    assert annotations(cluster)[U.ANN_STATE] == 'failed'
    assert not [t for t in run.task_results() if t.get('_event') == 'runner_on_ok' and 'driver_pin' in str(t)]
    # the cordon came before the failure record
    patches = [m for m in mutations(cluster) if m == ('PATCH', '/api/v1/nodes/' + S.NODE)]
    assert len(patches) >= 2
    fail = run.result('Failure | Stop here')
    assert 'drain failed' in fail['msg'] and 'the node stays cordoned' in fail['msg']


def test_a_recorded_snapshot_missing_here_fails_before_anything_is_drained(cluster, run_playbook, tmp_path):
    load(cluster)
    cluster.patch('v1', 'Node', S.NODE, {'spec': {'unschedulable': True}, 'metadata': {'annotations': {
        U.ANN_STATE: 'snapshotted', U.ANN_TARGET: KEY, U.ANN_INITIAL: 'false', U.ANN_SNAPSHOT: 'ab' * 32}}})
    cluster.clear_requests()
    run = run_playbook(role_play(cluster, tmp_path))
    assert run.rc != 0
    check = run.result('Progress | The snapshot the Node records is the one here (same SHA-256), before anything is '
                       'drained')
    assert check['_event'] == 'runner_on_failed'
    assert 'records the rollback snapshot sha256 ' + 'ab' * 32 in check['msg'] and 'is missing' in check['msg']
    # the cluster was asked first (issue 17: the snapshot_store copy) and had none
    assert 'and the cluster has none: no snapshot of node %s for target %s' % (S.NODE, KEY) in check['msg'], check['msg']
    assert 'the Secret does not exist' in check['msg']
    assert not any(r['path'].endswith('/eviction') for r in cluster.requests)
    assert cluster.get('v1', 'Node', S.NODE)['spec']['unschedulable'] is True
    assert annotations(cluster)[U.ANN_STATE] == 'failed'
