"""Issue 16 on the lab's pool (4 nodes, a real control plane), one lab for both tests, in order:

- the plan the gate passed with: upgrade_check.yml keeps each PASS with the plan file's SHA-256 in the
  rollout's evidence bundle; the plan edited after the gate is refused before anything changes;
- the stop switch: an operator creates the ConfigMap gpufleet-system/gpufleet-stop while the first batch's
  node is being drained; that node finishes its upgrade (nothing half-done), no node of a later batch starts
  any phase, the stop is in the evidence bundle, a rerun is refused before it reads the plan, and once the
  ConfigMap is deleted a rerun resumes and finishes;
- one run per plan (T3-3): while another controller's run holds the plan's Lease a rollout is refused before
  anything changes; the stopped run keeps its Lease, which the rerun on the same controller takes over (that
  run's ansible-playbook process has ended), and the finished rollout releases it.

The canaries are left as the canary playbook leaves them and the records are written directly
(test_rollout_wiring does the same), so the rollout upgrades the other nodes.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import pathlib
import shutil
import socket
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests'), str(REPO / 'tests' / 'integration')]

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _lease  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _node_record as R  # noqa: E402
from tools import labenv  # noqa: E402
from tools.lab import Lab  # noqa: E402
from test_rollout_wiring import past_the_canary  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')

SWITCH = {'apiVersion': 'v1', 'kind': 'ConfigMap',
          'metadata': {'name': 'gpufleet-stop', 'namespace': 'gpufleet-system'},
          'data': {'reason': 'Xid 79 on a canary-like node in rack 12', 'by': 'oncall-alice'}}


def started(run: dict, node: str) -> list[str]:
    """The node_upgrade tasks that ran on `node` (any phase started)."""
    return [e['task'] for e in run['events'] if e['host'] == node and e['event'] == 'runner_on_ok'
            and (e['task'] or '').split(' | ')[0] in ('Progress', 'Drain', 'Snapshot', 'Install', 'Activate')]


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    lab = Lab(tmp_path_factory.mktemp('stop') / 'lab', nodes=4, fault='none', stuck=[], quiet=True, change='driver')
    lab.dir.mkdir()
    try:
        lab.plan_doc = past_the_canary(lab)
        yield lab
    finally:
        lab.stop()


def bundle(lab: Lab) -> dict:
    return json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())


def test_a_plan_edited_after_the_gate_is_refused(lab):
    plan_file = lab.dir / 'plan.json'
    reviewed = plan_file.read_bytes()
    lab.gate()
    digest = hashlib.sha256(reviewed).hexdigest()
    gates = [g for g in bundle(lab)['gates'] if g['kind'] == 'upgrade_check']
    assert gates and all(g['passed'] and g['inputs']['plan_sha256'] == digest for g in gates), gates
    assert sorted(g['id'] for g in gates) == sorted('upgrade_check@' + c['id'] for c in lab.plan_doc['combinations'])
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import digest_of
    edited = dict(lab.plan_doc, batches=list(reversed(lab.plan_doc['batches'])))
    try:
        # Edited by hand: its content no longer matches the digest it carries.
        plan_file.write_text(json.dumps(edited, indent=2))
        lab.cluster.clear_requests()
        assert lab.play('hand-edited', 'rollout.yml') == 'failed'
        failures = lab.runs['hand-edited']['failures']
        assert [f['task'] for f in failures] == [
            'Plan | The plan is the one planned and the one the workflow passed on (gpufleet_plan_digest)'], failures
        assert 'it was edited after it was planned; nothing was changed' in failures[0]['msg'], failures[0]['msg']
        assert lab.cluster.mutating_requests() == []
        # Re-planned (a consistent plan, with its own digest), but not the plan upgrade_check passed with.
        edited['digest'] = digest_of(edited)
        plan_file.write_text(json.dumps(edited, indent=2))
        lab.cluster.clear_requests()
        assert lab.play('edited', 'rollout.yml') == 'failed'
        failures = lab.runs['edited']['failures']
        assert [f['task'] for f in failures] == [
            "Rollout | The plan is the one upgrade_check passed with (its SHA-256 against the evidence bundle's records)"]
        edited_digest = hashlib.sha256(plan_file.read_bytes()).hexdigest()
        assert failures[0]['msg'].startswith('the plan file %s (sha256 %s) is not the plan upgrade_check passed with: '
                                             % (plan_file, edited_digest))
        assert 'passed with sha256 %s' % digest in failures[0]['msg']
        assert lab.cluster.mutating_requests() == []
        # The reviewed plan, with another install method than the one it was planned (and qualified) with.
        plan_file.write_bytes(reviewed)
        lab.cluster.clear_requests()
        assert lab.play('other-method', 'rollout.yml', extravars={'gpufleet_install_method': 'operator'}) == 'failed'
        failures = lab.runs['other-method']['failures']
        assert [f['task'] for f in failures] == [
            "Rollout | The plan was made with this run's install method (filter install_method_verdict)"], failures
        assert failures[0]['msg'] == ('the plan was made with install method apt, this run has gpufleet_install_method '
                                      'operator: re-plan (and re-qualify) with the same install method')
        assert lab.cluster.mutating_requests() == []
    finally:
        plan_file.write_bytes(reviewed)


def lease_of(lab: Lab) -> dict:
    return lab.cluster.get(_lease.API_VERSION, 'Lease', _lease.lease_name(lab.plan_doc['digest']), 'gpufleet-system')


def test_a_run_of_another_controller_holding_the_plan_refuses_the_rollout_before_anything_changes(lab):
    lab.gate()
    other = 'cli:ops@jump-2.example.org:4242.123456'
    name = _lease.lease_name(lab.plan_doc['digest'])
    held = _lease.desired('gpufleet-system', lab.plan_doc['digest'], other,
                          datetime.datetime.now(datetime.timezone.utc), 600)
    lab.cluster.apply([held], settle=False)
    try:
        lab.cluster.clear_requests()
        assert lab.play('second-controller', 'rollout.yml') == 'failed'
        failures = lab.runs['second-controller']['failures']
        assert [f['task'] for f in failures] == [
            "Rollout | Hold the plan's Lease (one run per plan; refused while another run's is fresh)"], failures
        assert failures[0]['msg'].startswith('Lease gpufleet-system/%s is held by "%s" (renewTime ' % (name, other))
        assert lab.cluster.mutating_requests() == []
        assert all(r['state'] == '-' and not r['cordoned'] for r in lab.node_view() if not r['canary'])
        assert lease_of(lab)['spec']['holderIdentity'] == other
    finally:
        lab.cluster.delete(_lease.API_VERSION, 'Lease', name, 'gpufleet-system')


def test_stop_switch_stops_before_the_next_node_and_a_rerun_resumes_after_it_is_deleted(lab):
    plan = lab.plan_doc
    batches = [b for b in plan['batches'] if not set(b) & set(plan['canaries'])]
    assert len(batches) >= 2, plan['batches']
    first, later = batches[0], [n for b in batches[1:] for n in b]

    # Set once the first batch's observation window has ended (its re-gate reads the cluster): the window did not
    # see it; the next batch's nodes read it before they start. (Set during a window: the rerun-window run below.)
    def set_switch_after_the_window(event: dict) -> None:
        data = event.get('event_data') or {}
        if (event.get('event') == 'runner_on_ok' and data.get('host') == first[0]     # run once: the batch's first host
                and (data.get('task') or '').startswith("Observe | Re-read the cluster at the window's end")):
            lab.cluster.apply([SWITCH], settle=False)

    assert lab.play('rollout', 'rollout.yml', hook=set_switch_after_the_window) == 'failed'
    run = lab.runs['rollout']
    rows = {r['node']: r for r in lab.node_view()}
    # The node in progress when the switch was set finished its upgrade: done, back in service.
    for n in first:
        assert rows[n]['state'] == 'done' and not rows[n]['cordoned'] and rows[n]['driver'] == labenv.TARGET_DRIVER
    # No node of a later batch started any phase: untouched, never cordoned, on the source driver.
    for n in later:
        assert started(run, n) == [], started(run, n)
        assert rows[n]['state'] == '-' and not rows[n]['cordoned'] and rows[n]['driver'] == labenv.SOURCE_DRIVER
    stops = [f for f in run['failures'] if f['task'] == 'Stop switch | Stop before the node starts']
    assert sorted(f['host'] for f in stops) == sorted(batches[1])
    assert all(f['msg'].startswith('rollout stopped by the stop switch (ConfigMap gpufleet-system/gpufleet-stop, '
                                   'reason: Xid 79 on a canary-like node in rack 12, set by oncall-alice, at ')
               for f in stops), stops
    assert {f['task'] for f in run['failures']} == {'Stop switch | Stop before the node starts'}
    # The canaries stay isolated: the rollout did not finish.
    assert all(rows[c]['canary'] for c in plan['canaries'])
    stop_actions = [a for a in bundle(lab)['actions'] if a['name'] == 'stop-switch']
    assert len(stop_actions) == 1 and stop_actions[0]['ok'] is False
    assert stop_actions[0]['result']['reason'] == SWITCH['data']['reason']
    assert stop_actions[0]['result']['set_by'] == 'oncall-alice'
    assert sorted(stop_actions[0]['result']['batch']) == sorted(batches[1])
    # The stopped run still holds the plan: its Lease names this controller's ansible-playbook process.
    stopped_holder = lease_of(lab)['spec']['holderIdentity']
    assert _lease.cli_process(stopped_holder)[0] == socket.gethostname(), stopped_holder
    assert sorted(bundle(lab)['nodes']) == sorted(first)
    # Each entry names the machine, not only the name: the Node's UID, machine-id and system UUID.
    for n in first:
        node, entry = lab.cluster.get('v1', 'Node', n), bundle(lab)['nodes'][n]
        info = node['status']['nodeInfo']
        assert (entry['uid'], entry['machine_id'], entry['system_uuid']) == (
            node['metadata']['uid'], info['machineID'], info['systemUUID'])

    # While the switch is set a rerun is refused at once: nothing read from the plan, no write.
    lab.cluster.clear_requests()
    assert lab.play('rerun-stopped', 'rollout.yml') == 'failed'
    failures = lab.runs['rerun-stopped']['failures']
    assert [f['task'] for f in failures] == [
        'Rollout | The stop switch is not set (an operator stopped the rollout; delete the ConfigMap to resume)']
    assert 'reason: Xid 79' in failures[0]['msg']
    assert lab.cluster.mutating_requests() == []
    # Closing the rollback boundary (release.yml) is refused too while the switch is set.
    assert lab.play('release-stopped', 'release.yml') == 'failed'
    assert [f['task'] for f in lab.runs['release-stopped']['failures']] == ['Release | The stop switch is not set']
    assert lab.cluster.mutating_requests() == []

    # Deleted: the boundary still stays open while nodes of the plan have not finished (nothing written).
    lab.cluster.delete('v1', 'ConfigMap', 'gpufleet-stop', 'gpufleet-system')
    lab.cluster.clear_requests()
    assert lab.play('release-early', 'release.yml') == 'failed'
    failures = lab.runs['release-early']['failures']
    assert [f['task'] for f in failures] == ['Release | Every node of the plan finished its target (else nothing is released)']
    assert failures[0]['msg'].startswith('not released: ') and all(n in failures[0]['msg'] for n in later), failures
    assert not any(e['host'] in later for e in lab.runs['release-early']['events'] if e['event'] == 'runner_on_ok')
    assert lab.cluster.mutating_requests() == []
    assert not [a for a in bundle(lab)['actions'] if a['name'] == 'kernel-release']

    # Issue 40 item 5: set while a batch upgrades, the switch is seen by the batch's observation window (its wait
    # watches the switch): the batch finishes, the run stops in the window before its re-gate, the stop recorded.
    def set_switch_mid_drain(event: dict) -> None:
        data = event.get('event_data') or {}
        if (event.get('event') == 'runner_on_ok' and data.get('host') == later[0]
                and (data.get('task') or '').startswith('Drain | Cordon')):
            lab.cluster.apply([SWITCH], settle=False)

    assert lab.play('rerun-window', 'rollout.yml', hook=set_switch_mid_drain) == 'failed'
    failures = lab.runs['rerun-window']['failures']
    assert [f['task'] for f in failures] == ['Observe | Stop during the window'], failures
    assert failures[0]['msg'].startswith('rollout stopped by the stop switch (ConfigMap gpufleet-system/gpufleet-stop, '
                                         'reason: Xid 79') and 'its re-gate did not run' in failures[0]['msg'], failures
    assert not any((e['task'] or '').startswith("Observe | Re-read the cluster at the window's end")
                   for e in lab.runs['rerun-window']['events'] if e['event'] == 'runner_on_ok')
    rows = {r['node']: r for r in lab.node_view()}
    for n in later:
        assert rows[n]['state'] == 'done' and not rows[n]['cordoned'] and rows[n]['driver'] == labenv.TARGET_DRIVER
    window_stops = [a for a in bundle(lab)['actions'] if a['name'] == 'stop-switch' and 'window' in a['result']]
    assert len(window_stops) == 1 and window_stops[0]['ok'] is False, window_stops
    assert window_stops[0]['result']['window'] == plan['batches'].index(batches[1])
    assert window_stops[0]['result']['set_by'] == 'oncall-alice' and window_stops[0]['result']['waited_s'] >= 0
    stopped_holder = lease_of(lab)['spec']['holderIdentity']
    lab.cluster.delete('v1', 'ConfigMap', 'gpufleet-stop', 'gpufleet-system')

    # The rerun resumes (the finished nodes are skipped) and finishes the rest.
    held = []

    def lease_results(event: dict) -> None:
        data = event.get('event_data') or {}
        if event.get('event') == 'runner_on_ok' and (data.get('task') or '').startswith("Rollout | Hold the plan's Lease"):
            held.append(data.get('res') or {})

    assert lab.play('rerun', 'rollout.yml', hook=lease_results) == 'successful', lab.runs['rerun']['failures']
    # ...taking over the stopped run's Lease (its process has ended), then releasing it at its end.
    assert [r.get('outcome') for r in held] == ['taken_over'], held
    assert held[0]['msg'].endswith('its holder "%s" was a run on this controller whose process has ended (its lease '
                                   'would have expired at %s)' % (stopped_holder, held[0]['msg'].rsplit(' ', 1)[1][:-1]))
    lease = lease_of(lab)
    assert not lease['spec'].get('holderIdentity') and lease['spec']['leaseTransitions'] == 2, lease['spec']
    rows = {r['node']: r for r in lab.node_view()}
    for n in first + later:
        assert rows[n]['state'] == 'done' and not rows[n]['cordoned'] and rows[n]['driver'] == labenv.TARGET_DRIVER
    assert all(started(lab.runs['rerun'], n) == ['Progress | Read what the Node records for this target']
               for n in first + later)
    assert not any(rows[c]['canary'] for c in plan['canaries'])
    for n in later:
        assert lab.cluster.get('v1', 'Node', n)['metadata']['annotations'][R.ANN_DONE]
    # Every node finished: the boundary closes. A driver-only change protected no previous kernel, so
    # each node reports nothing to release, and the bundle records that.
    assert lab.play('release', 'release.yml') == 'successful', lab.runs['release']['failures']
    release = [a for a in bundle(lab)['actions'] if a['name'] == 'kernel-release']
    assert len(release) == 1 and release[0]['ok'] is True, release
    assert release[0]['result']['unmarked'] == {n: [] for b in plan['batches'] for n in b}, release
