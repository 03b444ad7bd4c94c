"""The node_upgrade role's safety on reruns (issue 12): recorded progress counts only while the node is
cordoned, the rescue cordons the node before it records the failure, and a snapshot the Node records
must be the one on this controller. On the real control plane (tests/cluster), with failures injected
before anything reaches the node's packages."""
from __future__ import annotations

import os

import pytest

import k8s_scenario as S
from cluster import fixtures as f
from k8s_support import WhenRequests, kubectl, load, mutations, play
from tools import debrepo

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as sn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot_store as ss
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state as U

pytestmark = pytest.mark.slow

TARGET = {'driver': '580.130.00'}
KEY = U.target_key(TARGET)

# The node's packages: a real apt root whose repository offers the target driver, so the checks before the
# drain (package lists, the driver offered) pass and the failures injected below are what stops the role.
deb_repo = debrepo.deb_repo
apt_root = debrepo.apt_root


@pytest.fixture
def node_root(apt_root):
    return str(apt_root.path)


def role_play(cluster, tmp_path, installroot):
    role_vars = {'node_upgrade_node': S.NODE, 'node_upgrade_target': TARGET, 'node_upgrade_installroot': installroot,
                 'node_upgrade_snapshot_dir': str(tmp_path / 'snapshots'), 'node_upgrade_qualification': ''}
    plays = play(cluster, {'name': 'upgrade', 'ansible.builtin.include_role': {'name': 'gpufleet.upgrade.node_upgrade'},
                           'vars': role_vars})
    return plays


def annotations(cluster):
    return cluster.get('v1', 'Node', S.NODE)['metadata'].get('annotations') or {}


def test_a_rerun_after_a_manual_uncordon_drains_again_and_the_failure_leaves_the_node_cordoned(
        cluster, run_playbook, tmp_path, node_root):
    """`installed` is recorded but someone uncordoned the node since: the rerun does not trust the
    record (it drains again; its cordon is refused here), and the rescue cordons the node before it
    records `failed`."""
    load(cluster)
    cluster.patch('v1', 'Node', S.NODE, {'metadata': {'annotations': {
        U.ANN_STATE: 'installed', U.ANN_TARGET: KEY, U.ANN_INITIAL: 'false'}}})
    cluster.faults.add(method='PATCH', path=r'^/api/v1/nodes/%s$' % S.NODE, status=403, times=1)
    run = run_playbook(role_play(cluster, tmp_path, node_root))
    assert run.rc != 0
    progress = run.result('Progress | Read what the Node records for this target')
    assert progress['state']['done_phases'] == [] and progress['state']['cordon_lost'] is True
    assert run.result("Drain | Cordon (initial state recorded once) and evict the node's pods (PodDisruptionBudgets "
                      "honoured)")['_event'] == 'runner_on_failed'
    assert run.result('Failure | Cordon the node (before the failure is recorded)')['changed'] is True
    n = cluster.get('v1', 'Node', S.NODE)
    assert n['spec']['unschedulable'] is True
    assert annotations(cluster)[U.ANN_STATE] == 'failed'
    # nothing was installed (the driver was only checked, in check mode, before the drain)
    assert not run.task_results('Install | Pin and install the target driver')
    # the cordon came before the failure record
    patches = [m for m in mutations(cluster) if m == ('PATCH', '/api/v1/nodes/' + S.NODE)]
    assert len(patches) >= 2
    fail = run.result("Failure | Stop here")
    assert 'drain failed' in fail['msg'] and 'the node stays cordoned' in fail['msg']


@pytest.mark.parametrize('cordoned_before', [False, True], ids=['schedulable', 'cordoned-by-someone-else'])
def test_a_failure_before_the_drain_leaves_an_untouched_node_as_it_was(cluster, run_playbook, tmp_path, cordoned_before, node_root):
    """T3-19: the kernel's preflight (kernel_check) fails before the drain, on a node that records no
    progress of this target: nothing was changed on it, so the rescue neither cordons it nor records
    `failed` (a cordon someone else set stays as it is), and the message says so."""
    load(cluster)
    if cordoned_before:
        cluster.patch('v1', 'Node', S.NODE, {'spec': {'unschedulable': True}})
    before = annotations(cluster)
    cluster.clear_requests()
    plays = role_play(cluster, tmp_path, node_root)
    plays[0]['tasks'][0]['vars'].update({'node_upgrade_target': dict(TARGET, kernel='6.8.0-999-generic')})
    run = run_playbook(plays)
    assert run.rc != 0
    check = run.result('Kernel | The repositories offer the target kernel with the driver\'s modules, and the way back is '
                       'on the node')
    assert check['_event'] == 'runner_on_failed'
    assert run.result('Failure | Cordon the node (before the failure is recorded)')['_event'] == 'runner_on_skipped'
    n = cluster.get('v1', 'Node', S.NODE)
    assert bool(n['spec'].get('unschedulable')) is cordoned_before
    assert annotations(cluster) == before
    assert not [m for m in mutations(cluster) if m[1] == '/api/v1/nodes/' + S.NODE]
    fail = run.result('Failure | Stop here')
    assert 'kernel_check failed' in fail['msg']
    assert ('this run changed nothing on the node and left it as it was (%s); it was not cordoned and no failure is '
            'recorded on it' % ('cordoned' if cordoned_before else 'schedulable')) in fail['msg'], fail['msg']


def test_a_recorded_snapshot_missing_here_fails_before_anything_is_drained(cluster, run_playbook, tmp_path, node_root):
    load(cluster)
    cluster.patch('v1', 'Node', S.NODE, {'spec': {'unschedulable': True}, 'metadata': {'annotations': {
        U.ANN_STATE: 'snapshotted', U.ANN_TARGET: KEY, U.ANN_INITIAL: 'false', U.ANN_SNAPSHOT: 'ab' * 32}}})
    cluster.clear_requests()
    run = run_playbook(role_play(cluster, tmp_path, node_root))
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


def snapshot_document(modprobe: dict, **gpu_facts) -> bytes:
    snap = {'backend': 'apt', 'packages': {'nvidia-driver-580-server': '580.126.20-0ubuntu1'}, 'holds': [],
            'pins': {'pin_file': 'etc/apt/preferences.d/gpufleet-nvidia-driver.pref', 'content': None, 'pins': {}},
            'boot': {'running_kernel': '6.8.0-134-generic'}, 'modprobe': modprobe,
            'gpu_facts': dict({'driver_version': '580.126.20'}, **gpu_facts)}
    return sn.dump_document(sn.make_document(snap)).encode('utf-8')


def rollback_preflight(cluster, path):
    return play(cluster, {'name': 'rollback', 'ansible.builtin.include_role': {
        'name': 'gpufleet.upgrade.rollback', 'tasks_from': 'preflight'},
        'vars': {'rollback_node': S.NODE, 'rollback_target': TARGET, 'rollback_snapshot': str(path)}})


def test_a_rollback_after_done_fetches_only_the_snapshot_the_node_recorded(cluster, run_playbook, tmp_path):
    """T3-1: `done` keeps the snapshot digest on the Node, and the rollback's fetch from the cluster is checked
    against it. A self-consistent Secret (its annotation its content's digest: anyone who may write Secrets in
    gpufleet-system can make one) with a modprobe `install` directive is refused and nothing is written; on a Node
    that records no digest, no Secret is trusted at all."""
    load(cluster)
    cluster.apply([f.namespace('gpufleet-system')])
    genuine = snapshot_document({'etc/modprobe.d/nvidia.conf': 'options nvidia NVreg_EnableGpuFirmware=1\n'})
    sha = sn.make_document(sn.verify_document(genuine.decode()))['sha256']
    forged = snapshot_document({'etc/modprobe.d/nvidia.conf': 'install nvidia /bin/sh -c "id > /tmp/pwned"\n'})
    forged_sha = sn.make_document(sn.verify_document(forged.decode()))['sha256']
    # node_upgrade's records: `snapshotted` with the digest, then `done` (rollout_postflight's)
    run = run_playbook(play(cluster, *[{'name': 'record %s' % phase, 'gpufleet.upgrade.upgrade_state': dict(
        {'node': S.NODE, 'target': TARGET, 'phase': phase}, **extra)} for phase, extra in (
            ('snapshotted', {'snapshot_sha256': sha}), ('done', {}))],
        {'name': 'read', 'gpufleet.upgrade.upgrade_state': {'node': S.NODE, 'target': TARGET}}))
    state = run.result('read')['state']
    assert state['completed'] is True and state['snapshot_sha256'] == sha, state
    assert annotations(cluster)[U.ANN_DONE] == KEY and annotations(cluster)[U.ANN_SNAPSHOT] == sha

    # the forged Secret in place of the genuine one; a fresh controller (no file): refused, nothing written
    cluster.apply([ss.desired(S.NODE, TARGET, 'gpufleet-system', forged, forged_sha)])
    path = tmp_path / 'snapshots' / 'gpu.json'
    path.parent.mkdir()
    run = run_playbook(rollback_preflight(cluster, path))
    assert run.rc != 0 and not path.exists()
    refused = run.result('Preflight | Refuse without a snapshot')
    assert refused['_event'] == 'runner_on_failed'
    assert ('digest mismatch: expected sha256 %s (recorded on the Node), the stored snapshot is %s' % (sha, forged_sha)
            in refused['msg']), refused['msg']

    # the genuine Secret: fetched, the digest the Node records
    cluster.apply([ss.desired(S.NODE, TARGET, 'gpufleet-system', genuine, sha)])
    run = run_playbook(rollback_preflight(cluster, path))
    assert run.rc == 0 and path.read_bytes() == genuine
    assert run.result('Preflight | Fetch the snapshot the Node records from the cluster when it is not here')['sha256'] == sha

    # a Node that finished before `done` kept the digest: no Secret vouches for itself
    path.unlink()
    cluster.patch('v1', 'Node', S.NODE, {'metadata': {'annotations': {U.ANN_SNAPSHOT: None}}})
    cluster.apply([ss.desired(S.NODE, TARGET, 'gpufleet-system', forged, forged_sha)])
    cluster.clear_requests()
    run = run_playbook(rollback_preflight(cluster, path))
    assert run.rc != 0 and not path.exists()
    assert 'a Secret that only vouches for itself restores nothing' in run.result('Preflight | Refuse without a snapshot')['msg']
    assert not [r for r in cluster.requests if '/secrets' in r['path']]


# -- issue 37 (2), T3-2: nothing is activated on a node that is no longer cordoned ------------------
def require_cordoned(name='check', **flags):
    return dict({'name': name, 'gpufleet.upgrade.upgrade_state': {'node': S.NODE, 'target': TARGET,
                                                                  'require_cordoned': True}}, **flags)


def test_require_cordoned_fails_on_an_uncordoned_node_naming_it(cluster, run_playbook):
    load(cluster)
    cluster.patch('v1', 'Node', S.NODE, {'spec': {'unschedulable': True}, 'metadata': {'annotations': {
        U.ANN_STATE: 'installed', U.ANN_TARGET: KEY, U.ANN_INITIAL: 'false'}}})
    run = run_playbook(play(cluster, require_cordoned('cordoned')))
    assert run.rc == 0 and 'cordon_lost' not in run.result('cordoned'), run.stdout

    # kubectl uncordon drops spec.unschedulable: the API keeps no owner of it, and the message says so
    kubectl(cluster, 'uncordon', S.NODE)
    cluster.clear_requests()
    run = run_playbook(play(cluster, require_cordoned('by-kubectl', ignore_errors=True),
                            require_cordoned('check-mode', check_mode=True)))
    failed = run.result('by-kubectl')
    assert failed['_event'] == 'runner_on_failed' and failed['cordon_lost'] is True
    assert failed['msg'].startswith("node %s is no longer cordoned (the API keeps no record of who uncordoned it: the "
                                    "API server's audit log does)" % S.NODE), failed['msg']
    assert failed['msg'].endswith('nothing is activated on a schedulable node; nothing recorded'), failed['msg']
    # check mode: the drain before it wrote no cordon; a warning, no failure
    checked = run.result('check-mode')
    assert checked['_event'] == 'runner_on_ok' and checked['cordon_lost'] is True, checked
    assert any('is no longer cordoned' in w for w in checked.get('warnings') or []), checked
    assert mutations(cluster) == []

    # a remediation operator sets spec.unschedulable to false under its own field manager: dropped all the same
    cluster.patch('v1', 'Node', S.NODE, {'spec': {'unschedulable': True}})
    cluster.api.request('PATCH', '/api/v1/nodes/' + S.NODE, body={'spec': {'unschedulable': False}},
                        query={'fieldManager': 'remediation-operator'}, content_type='application/merge-patch+json')
    run = run_playbook(play(cluster, require_cordoned('by-operator', ignore_errors=True),
                            {'name': 'record', 'ignore_errors': True, 'gpufleet.upgrade.upgrade_state': {
                                'node': S.NODE, 'target': TARGET, 'phase': 'activated', 'require_cordoned': True}}))
    failed = run.result('by-operator')
    assert failed['cordon_lost'] is True and 'the API keeps no record of who uncordoned it' in failed['msg'], failed
    assert not [e for e in cluster.get('v1', 'Node', S.NODE)['metadata']['managedFields']
                if e['manager'] == 'remediation-operator'], 'the API now records who uncordoned: name it in the message'
    # with a phase: nothing is recorded
    assert run.result('record')['_event'] == 'runner_on_failed'
    assert annotations(cluster)[U.ANN_STATE] == 'installed'


def write_snapshot(tmp_path):
    """The snapshot a resumed run finds here, as node_upgrade took it (its digest is what the Node records)."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _rollout
    doc = snapshot_document({'etc/modprobe.d/nvidia.conf': 'options nvidia NVreg_EnableGpuFirmware=1\n'},
                            gpus=[{'index': 0, 'pci_bus_id': '00000000:17:00.0'}])
    path = _rollout.snapshot_file(str(tmp_path / 'snapshots'), S.NODE, TARGET)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as fh:
        fh.write(doc)
    return sn.make_document(sn.verify_document(doc.decode()))['sha256']


def test_a_node_uncordoned_after_its_install_is_not_activated_and_fails_cordoned(cluster, run_playbook, tmp_path, node_root):
    """T3-2: the node records `installed` (cordoned by this rollout); someone uncordons it after the role read its
    progress; the role reads the Node again right before the activation, refuses it (the lab's reboot/reload hook
    never runs), and the rescue cordons it again and records `failed`, without a rollback (its own reboot would
    take the pods placed on the node meanwhile down as well)."""
    load(cluster)
    sha = write_snapshot(tmp_path)
    cluster.patch('v1', 'Node', S.NODE, {'spec': {'unschedulable': True}, 'metadata': {'annotations': {
        U.ANN_STATE: 'installed', U.ANN_TARGET: KEY, U.ANN_INITIAL: 'false', U.ANN_SNAPSHOT: sha}}})
    marker = tmp_path / 'activated'
    plays = role_play(cluster, tmp_path, node_root)
    plays[0]['tasks'][0]['vars'].update({
        'node_upgrade_snapshot_store': 'local', 'node_upgrade_activation': 'lab',
        'node_upgrade_lab_hook': ['sh', '-c', 'touch %s; echo "{\\"changed\\": true}"' % marker, 'hook']})
    node_path = '/api/v1/nodes/' + S.NODE
    # the uncordon lands once the role's progress read was answered; the next read of the Node (the check
    # before the activation) waits for it
    cluster.faults.add(method='GET', path='^%s$' % node_path, delay=2, skip=1, times=1)

    def progress_read(reqs):
        return any(r['verb'] == 'GET' and r['path'] == node_path and r.get('status') == 200 for r in reqs)

    cluster.clear_requests()
    with WhenRequests(cluster, progress_read, lambda: cluster.patch('v1', 'Node', S.NODE, {
            'spec': {'unschedulable': None}})) as when:
        run = run_playbook(plays)
    assert when.fired.is_set()
    assert run.rc != 0
    assert run.result('Progress | Read what the Node records for this target')['state']['done_phases'][-1] == 'installed'
    check = run.result('Activate | The node is still cordoned (nothing below takes its pods down on a schedulable node)')
    assert check['_event'] == 'runner_on_failed' and check['cordon_lost'] is True, check
    assert not marker.exists()
    assert not run.task_results('Activate | Lab reboot path (emulated reboot or driver reload of a lab node)',
                                event='runner_on_ok')
    assert run.result('Failure | Cordon the node (before the failure is recorded)')['changed'] is True
    assert cluster.get('v1', 'Node', S.NODE)['spec']['unschedulable'] is True
    assert annotations(cluster)[U.ANN_STATE] == 'failed'
    assert not run.task_results('Failure | Roll the node back from its snapshot (settings shared through the '
                                'gpufleet_* variables)', event='runner_on_ok')
    fail = run.result("Failure | Stop here")
    assert fail['msg'].startswith('node %s: activate failed (node %s is no longer cordoned' % (S.NODE, S.NODE)), fail
    assert 'the node stays cordoned' in fail['msg'] and 'someone uncordoned the node during its upgrade' in fail['msg']
