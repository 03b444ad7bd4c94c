"""Resumability: the controller is killed (the ansible-playbook process group of the
ansible-runner run gets SIGKILL) inside each phase of a node's upgrade, then rollout.yml runs
again. It resumes from what the Node records, never drains a node twice, never uncordons a node
that was cordoned before the rollout, and ends with the same verdict as an uninterrupted run.

One lab of 6 nodes (tests/tools/labenv.py, on a real control plane that tests/tools/lab.py starts;
KubeVirt's VM controller played by tests/cluster/kubevirt.py) with the injected fault (a new Xid 79
after the new driver came up) on a node of the last batch; the approved records are written directly (the
canary playbook is covered by test_lab.py), so the test exercises rollout.yml only. The kills are
chained over reruns of the same lab, cheap on 2 cores:

- the victim (first node of the first batch, running a GPU VM, vmi_policy=stop) is killed once in
  each phase: holders, drain (once the drain has cordoned it), snapshot, install (while driver_pin
  runs), activate (after the lab's reload, before Ready is recorded), gates (between the GPU and
  the node gate), VMs (while the stopped VM is started again) and uncordon (after the uncordon,
  before `done`). Each kill is triggered by the runner_on_start event of a task inside the phase
  (Lab.play kills at that event, not at runner's next poll) and the Node's recorded phase is
  asserted exactly;
- the faulty node is killed in its activate, then in its gates; the last rerun stops there with
  the node cordoned and rolled back, as an uninterrupted run does (Lab.verdict, which test_lab.py
  applies to the uninterrupted lab).
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests')]

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state as us  # noqa: E402
from cluster.kubevirt import KubeVirtStandIn  # noqa: E402
from tools import grubsim, labenv, records  # noqa: E402
from tools.lab import Lab  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')

# The driver change (a reload): the kill points are the phases of that rollout (the kernel's trial boot is
# covered by test_lab's FAULT_KIND=kernel run, not by a kill in it).
TARGET = labenv.CHANGES['driver']
KEY = us.target_key(TARGET)
KV = 'kubevirt.io/v1'
ANN_STATE, ANN_TARGET, ANN_DONE = us.ANN_STATE, us.ANN_TARGET, us.ANN_DONE
ANN_VMS = 'gpufleet.io/stopped-vms'

# (phase, first words of the task whose start triggers the kill, state the Node records then).
# The kill lands while that task runs (each task takes far longer than the event takes to arrive).
VICTIM_KILLS = [
    ('progress', 'Drain | Step', None),         # before the cordon: nothing changed yet
    ('drain', 'Drain | Cordon', 'draining'),      # waits until the drain has cordoned the node
    ('snapshot', 'Snapshot | Capture', 'drained'),
    ('install', 'Install | The target kernel with the driver', 'snapshotted'),   # prebuilt roots: kernel_packages
    ('activate', 'Ready | Wait for the Node', 'installed'),
    ('gates', 'Gates | Node gate', 'activated'),
    ('vms', 'VMs | Start again', 'validated'),
    ('uncordon', 'Uncordon | Record that the node finished', 'validated'),
]
FAULT_KILLS = [
    ('activate', 'Ready | Wait for the Node', 'installed'),
    ('gates', 'Gates | Node gate', 'activated'),
]


def approved_records(lab: Lab, plan: dict, target: dict | None = None) -> None:
    records.write_approved(lab.dir / 'qualification', plan, TARGET if target is None else target, 'resume')


def task_events(run: dict, node: str, prefix: str, event: str = 'runner_on_ok') -> list[dict]:
    return [e for e in run['events'] if e['host'] == node and (e['task'] or '').startswith(prefix)
            and e['event'] == event]


def annotations(lab: Lab, node: str) -> dict:
    return lab.cluster.get('v1', 'Node', node)['metadata'].get('annotations') or {}


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    """Block the event handler (the controller runs on) until `predicate()`: ordering by state."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError('timed out waiting for ' + what)
        time.sleep(0.01)


def kill_at(lab: Lab, node: str, phase: str, prefix: str):
    def trigger(event: dict) -> bool:
        data = event.get('event_data', {})
        if not (event.get('event') == 'runner_on_start' and data.get('host') == node
                and (data.get('task') or '').startswith(prefix)):
            return False
        if phase == 'drain':
            wait_for(lambda: annotations(lab, node).get(ANN_STATE) == 'draining', node + ' cordoned by the drain')
        return True
    return trigger


def test_killed_in_each_phase_resumes_to_the_uninterrupted_verdict(tmp_path):
    t0 = time.monotonic()
    lab = Lab(tmp_path / 'lab', nodes=6, fault='auto', stuck=[], quiet=True, change='driver',
              lab_vars={'node_upgrade_vmi_policy': 'stop'})
    lab.dir.mkdir()
    kubevirt = None
    try:
        lab.prepare()
        plan = lab.plan()
        approved_records(lab, plan)
        batches = plan['batches']
        victim = batches[0][0]
        fault = lab.fault
        fault_batch = next(i for i, b in enumerate(batches) if fault in b)
        assert fault_batch > 0 and victim != fault, plan
        # A node of the first batch was cordoned by someone else before the rollout: it stays cordoned.
        pre_cordoned = batches[0][1]
        lab.cluster.patch('v1', 'Node', pre_cordoned, {'spec': {'unschedulable': True}})
        # A GPU VM runs on the victim (KubeVirt's VM controller: the stand-in, which starts VMs too).
        kubevirt = KubeVirtStandIn(lab.cluster, start_vms=True).__enter__()
        lab.cluster.patch('v1', 'Node', victim, {'metadata': {'labels': {'lab/vm-host': 'true'}}})
        vm_spec = {'runStrategy': 'RerunOnFailure', 'template': {'spec': {
            'nodeSelector': {'lab/vm-host': 'true'},
            'domain': {'devices': {'gpus': [{'name': 'gpu0', 'deviceName': 'nvidia.com/GH100_H100'}]}}}}}
        lab.cluster.apply([{'apiVersion': KV, 'kind': 'VirtualMachine', 'metadata': {'name': 'vm-gpu', 'namespace': 'ml'},
                            'spec': vm_spec}])
        wait_for(lambda: (lab.cluster.get(KV, 'VirtualMachineInstance', 'vm-gpu', 'ml') or {}).get('status', {})
                 .get('nodeName') == victim, 'the VM running on ' + victim, 10)

        runs = []
        kills = [(victim,) + k for k in VICTIM_KILLS] + [(fault,) + k for k in FAULT_KILLS]
        snapshots = lab.dir / 'snapshots'
        for i, (node, phase, prefix, recorded) in enumerate(kills):
            if i:   # each rerun is an AWX relaunch (issue 17): a fresh controller, no snapshot directory
                shutil.rmtree(snapshots)
                snapshots.mkdir()
            name = 'killed-%s-%s' % (node, phase)
            status = lab.play(name, 'rollout.yml', cancel_on=kill_at(lab, node, phase, prefix))
            runs.append(name)
            assert status == 'canceled', (name, lab.runs[name]['failures'])
            # The kill landed inside the phase: the Node records the phase before it, exactly.
            ann = annotations(lab, node)
            assert ann.get(ANN_STATE) == recorded, (name, ann)
            assert ANN_DONE not in ann, (name, ann)
            if recorded in us.PHASES[2:]:     # written by the role (node_drain's states carry no target)
                assert ann[ANN_TARGET] == KEY
            cordoned = lab.cluster.get('v1', 'Node', node)['spec'].get('unschedulable') is True
            assert cordoned is (phase not in ('progress', 'uncordon')), (name, cordoned)
            if phase == 'vms':
                vm = lab.cluster.get(KV, 'VirtualMachine', 'vm-gpu', 'ml')
                assert vm['spec']['runStrategy'] in ('Halted', 'RerunOnFailure')
            if phase == 'uncordon':
                assert ANN_VMS not in ann
                assert lab.cluster.get(KV, 'VirtualMachine', 'vm-gpu', 'ml')['spec']['runStrategy'] == 'RerunOnFailure'

        shutil.rmtree(snapshots)
        snapshots.mkdir()
        final = lab.play('resumed-final', 'rollout.yml')
        runs.append('resumed-final')
        assert final == 'failed', lab.runs['resumed-final']
        # The same verdict as an uninterrupted run: stopped at the faulty node, which stays cordoned
        # and is rolled back; every node before its batch upgraded and in service (but the one
        # cordoned before the rollout); nothing after its batch touched.
        # (Lab.verdict does not know of the node cordoned before the rollout: it stays cordoned, as it must.)
        assert lab.verdict(plan, final) == [
            '%s (batch 0, before the fault) is not upgraded and in service: cordoned' % pre_cordoned]
        failures = lab.runs['resumed-final']['failures']
        assert {f['host'] for f in failures} == {fault}
        # The role's rescue stops the node (with its rollback); rollout.yml's rescue records the node's
        # evidence and stops the rollout with the same message.
        assert [f['task'] for f in failures] == ['Gates | Every gate passed', 'Failure | Stop here',
                                                 'Node | Stop the rollout here (max_fail_percentage 0)']
        assert failures[-1]['msg'] == failures[-2]['msg']
        assert failures[-1]['msg'].startswith('node %s: gates failed' % fault), failures[-1]['msg']
        assert 'critical gate failed on %s: GPU gate: FAIL: xid: new Xid 79' % fault in failures[-1]['msg'], failures[-1]['msg']
        assert 'gpu gate: GPU gate' not in failures[-1]['msg'] and 'rollback: ' in failures[-1]['msg'], failures[-1]['msg']
        rows = {r['node']: r for r in lab.node_view()}
        assert rows[fault]['cordoned'] is True and rows[fault]['driver'] == rows[fault]['nvml'] == labenv.SOURCE_DRIVER
        assert annotations(lab, fault)[ANN_STATE] == 'rolled-back'
        for b in batches[:fault_batch]:
            for n in b:
                assert rows[n]['driver'] == rows[n]['nvml'] == labenv.TARGET_DRIVER, rows[n]
                assert annotations(lab, n).get(ANN_DONE) == KEY and ANN_STATE not in annotations(lab, n)
                assert rows[n]['cordoned'] is (n == pre_cordoned), rows[n]
        # Never drained twice: one completed drain per node over all the runs, none of a finished node.
        for n in lab.names:
            drains = sum(len(task_events(lab.runs[r], n, 'Drain | Cordon')) for r in runs)
            assert drains <= 1, (n, drains)
        assert sum(len(task_events(lab.runs[r], victim, 'Drain | Cordon')) for r in runs) == 1
        # The resumes skipped what the Node recorded: one snapshot and one install of the victim in all.
        for task in ('Snapshot | Capture', 'Install | The target kernel with the driver', 'Gates | Record the phase'):
            assert sum(len(task_events(lab.runs[r], victim, task)) for r in runs) == 1, task
        # The snapshots came back from the cluster (snapshot_store's Secrets), verified against the digest each
        # Node records: every rerun after the victim's snapshot fetched it into the empty directory, and the faulty
        # node's rerun fetched its own, from which its rollback restored it (asserted above).
        fetched = {n: sum(1 for r in runs for e in task_events(lab.runs[r], n, 'Progress | Fetch the snapshot')
                          if e['changed']) for n in (victim, fault)}
        assert fetched[victim] >= 4 and fetched[fault] >= 1, fetched
        stored = {s['metadata']['annotations']['gpufleet.io/node']: s['metadata']['annotations']['gpufleet.io/snapshot-sha256']
                  for s in lab.cluster.list('v1', 'Secret', 'gpufleet-system',
                                            label_selector='app.kubernetes.io/managed-by=gpufleet.upgrade')}
        assert set(stored) >= {fault} | {n for b in batches[:fault_batch] for n in b}, stored   # kept after done
        (fault_file,) = snapshots.glob(fault + '--*.json')
        assert json.loads(fault_file.read_text())['sha256'] == stored[fault]
        # The VM the drain stopped is started again with its exact previous run strategy; its record is gone.
        vm = lab.cluster.get(KV, 'VirtualMachine', 'vm-gpu', 'ml')
        assert vm['spec']['runStrategy'] == 'RerunOnFailure'
        # The stand-in starts it once the node is back in service (a VM is not placed on a cordoned node).
        wait_for(lambda: lab.cluster.get(KV, 'VirtualMachineInstance', 'vm-gpu', 'ml') is not None,
                 'the VM running again', 30)
        assert ANN_VMS not in annotations(lab, victim)
        print('resume test: %d rollout runs, %.0f s wall; %s' % (len(runs), time.monotonic() - t0, ', '.join(
            '%s %.1fs%s' % (t['step'], t['wall'], ' (killed at %.1fs)' % t['killed_at'] if 'killed_at' in t else '')
            for t in lab.timings)))
    finally:
        if kubevirt is not None:
            kubevirt.__exit__(None, None, None)
        lab.stop()


# The seed's change (kernel 6.8.0-134 -> 6.8.0-135 with the driver, RKE2 through the SUC): the controller is
# killed in the one-shot trial boot (issue 14): (phase, task whose start triggers the kill, recorded state).
TRIAL_KILLS = [
    # while kernel_boot state=trial makes the target the next boot only
    ('trial', 'Activate | Boot the target kernel once', 'installed'),
    # after the trial boot (the target kernel runs once; GRUB's saved default is still the previous
    # kernel, so a power cycle now would bring the previous pair back), before Ready is recorded: the
    # kill lands at the end of the lab's reboot (its runner_on_ok), before the Ready wait can write
    ('booted', 'Activate | Lab reboot path', 'installed'),
]


def kill_after(node: str, prefix: str):
    """Kill the controller when `node`'s task `prefix` has finished (its runner_on_ok)."""
    def trigger(event: dict) -> bool:
        data = event.get('event_data', {})
        return (event.get('event') == 'runner_on_ok' and data.get('host') == node
                and (data.get('task') or '').startswith(prefix))
    return trigger


def test_killed_in_the_trial_boot_resumes_on_the_target_kernel(tmp_path):
    """A kill inside the trial boot leaves the node cordoned at `installed`, on a boot setup a power cycle
    undoes; the rerun boots the target once again, verifies it, makes it the saved default and finishes."""
    target = labenv.CHANGES['seed']
    k0, k1 = labenv.KERNEL, target['kernel']
    assert k0 != k1
    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, change='seed')
    lab.dir.mkdir()
    try:
        lab.prepare()
        plan = lab.plan()
        approved_records(lab, plan, target)
        victim = plan['batches'][0][0]
        root = lab.dir / 'nodes' / victim / 'root'
        runs = []
        for phase, prefix, recorded in TRIAL_KILLS:
            name = 'killed-%s-%s' % (victim, phase)
            trigger = kill_after(victim, prefix) if phase == 'booted' else kill_at(lab, victim, phase, prefix)
            status = lab.play(name, 'rollout.yml', cancel_on=trigger)
            runs.append(name)
            assert status == 'canceled', (name, lab.runs[name]['failures'])
            assert annotations(lab, victim).get(ANN_STATE) == recorded, (name, annotations(lab, victim))
            assert lab.cluster.get('v1', 'Node', victim)['spec'].get('unschedulable') is True, name
            env = grubsim.read_env(root / 'boot/grub/grubenv')
            # The saved default never moved before the gates passed: a power cycle boots the previous kernel.
            assert env.get('saved_entry') == grubsim.entry_id(k0), (name, env)
            if phase == 'booted':
                row = {r['node']: r for r in lab.node_view()}[victim]
                assert row['kernel'] == k1 and env.get('next_entry') == '', (row, env)   # the one shot is used

        assert annotations(lab, victim).get(ANN_STATE) == 'installed'   # the rerun takes the trial path again
        final = lab.play('resumed-final', 'rollout.yml')
        runs.append('resumed-final')
        assert final == 'successful', lab.runs['resumed-final']['failures']
        assert lab.verdict(plan, final) == []
        row = {r['node']: r for r in lab.node_view()}[victim]
        assert (row['kernel'], row['node_kernel'], row['loaded']) == (k1, k1, target['driver']), row
        assert grubsim.read_env(root / 'boot/grub/grubenv') == {'saved_entry': grubsim.entry_id(k1), 'next_entry': ''}
        assert annotations(lab, victim).get(ANN_DONE) == us.target_key(target)
        # Resumed, not redone: one drain, one snapshot and one install of the victim over all the runs;
        # the trial boot ran again after each kill (the rerun takes it from `installed`).
        for task in ('Drain | Cordon', 'Snapshot | Capture', 'Install | The target kernel with the driver'):
            assert sum(len(task_events(lab.runs[r], victim, task)) for r in runs) == 1, task
        # and found the target kernel running: nothing was activated again (a reboot would have booted the
        # saved default, the previous kernel, and failed the node)
        assert len(task_events(lab.runs['resumed-final'], victim, 'Activate | Boot the target kernel once')) == 1
        assert task_events(lab.runs['resumed-final'], victim, 'Activate | Lab reboot path') == []
    finally:
        lab.stop()
