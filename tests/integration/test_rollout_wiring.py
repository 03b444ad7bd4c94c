"""rollout.yml wiring on the lab's emulated pool (4 nodes): the DRA postflight after each node
(gpufleet_dra), the release of the canaries at the end of a successful rollout, and the per-node
entries of the evidence bundle.

The canaries are put in the state the canary playbook leaves them in (isolated under the canary
role's owner, upgraded, recorded done) instead of running canary.yml (test_lab.py covers it), so
the rollout skips them and upgrades the other nodes; the approved records are written directly.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests')]

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state as S  # noqa: E402
from cluster import fixtures as f  # noqa: E402
from tools import labenv  # noqa: E402
from tools.lab import Lab  # noqa: E402

sys.path[:0] = [str(REPO / 'tests' / 'integration')]
from test_rollout_resume import approved_records  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')

DRA_NS = 'nvidia-dra-driver-gpu'
OWNER = 'gpufleet.upgrade.canary'
PHASES = ['holders', 'drain', 'snapshot', 'install', 'activate', 'ready', 'gates', 'postflight', 'uncordon']


def dra_objects(names: list[str]) -> list[dict]:
    ds = f.daemonset('nvidia-dra-driver-gpu-kubelet-plugin', DRA_NS, labels={'app': 'dra-kubelet-plugin'})
    ds['status'] = {'desiredNumberScheduled': len(names), 'numberReady': len(names),
                    'updatedNumberScheduled': len(names), 'numberAvailable': len(names)}
    objs = [f.namespace(DRA_NS), f.device_class(), ds]
    for n in names:
        objs += [f.resource_slice(n), f.daemonset_pod(ds, n, suffix=n)]
    return objs


def canaries_as_the_canary_playbook_leaves_them(lab: Lab, plan: dict) -> None:
    key = S.target_key(labenv.TARGET)
    for name in plan['canaries']:
        lab.emu.patch('v1', 'Node', name, {
            'metadata': {'labels': {S.CANARY_KEY: 'true'},
                         'annotations': {S.ANN_ISOLATED_BY: OWNER, S.ANN_DONE: key}},
            'spec': {'taints': [{'key': S.CANARY_KEY, 'value': 'true', 'effect': 'NoSchedule'}]}})


def dra_lab(tmp_path: pathlib.Path) -> tuple[Lab, dict]:
    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, lab_vars={'gpufleet_dra': True})
    lab.dir.mkdir()
    lab.prepare()
    lab.emu.apply(dra_objects(lab.names))
    plan = lab.plan()
    approved_records(lab, plan)
    canaries_as_the_canary_playbook_leaves_them(lab, plan)
    return lab, plan


def bundle(lab: Lab) -> dict:
    return json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())


def ok_tasks(run: dict, host: str, prefix: str) -> list[str]:
    return [e['task'] for e in run['events'] if e['host'] == host and e['event'] == 'runner_on_ok'
            and (e['task'] or '').startswith(prefix)]


def test_dra_postflight_passes_canaries_released_and_nodes_in_the_evidence(tmp_path):
    lab, plan = dra_lab(tmp_path)
    try:
        others = [n for b in plan['batches'] for n in b if n not in plan['canaries']]
        assert others
        assert lab.play('rollout', 'rollout.yml') == 'successful', lab.runs['rollout']['failures']
        run = lab.runs['rollout']
        rows = {r['node']: r for r in lab.node_view()}
        for n in others:
            assert 'DRA | API, device class, inventory and driver pod' in ok_tasks(run, n, 'DRA |')
            assert ok_tasks(run, n, 'Postflight | Return the node to service')
            assert rows[n]['driver'] == labenv.TARGET_DRIVER and rows[n]['state'] == 'done' and not rows[n]['cordoned']
        # A driver-only target: the kubelets already run the target RKE2 (the progress read says so), so
        # no RKE2 task runs and no System Upgrade Controller request is made.
        assert not [t for n in others for t in ok_tasks(run, n, 'RKE2 |')]
        assert not [r for r in lab.emu.requests if 'upgrade.cattle.io' in r['path']]
        # The canaries the canary playbook isolated are released: label, taint and owner annotation gone.
        for c in plan['canaries']:
            node = lab.emu.get('v1', 'Node', c)
            assert S.CANARY_KEY not in node['metadata']['labels']
            assert not [t for t in node['spec'].get('taints') or [] if t['key'] == S.CANARY_KEY]
            assert S.ANN_ISOLATED_BY not in (node['metadata'].get('annotations') or {})
        # One evidence entry per node the rollout touched (the finished canaries were skipped).
        nodes = bundle(lab)['nodes']
        assert sorted(nodes) == sorted(others)
        for n in others:
            e = nodes[n]
            assert e['verdict'] == 'upgraded' and e['phases'] == PHASES and e['rolled_back'] is False
            assert e['role'] == 'batch' and e['batch'] == next(i for i, b in enumerate(plan['batches']) if n in b)
            assert e['tuple_before'] == labenv.CURRENT and e['tuple_after'] == labenv.TARGET
            assert e['started'] <= e['finished'] and e['duration_s'] >= 0
            assert 'failed_phase' not in e
    finally:
        lab.stop()


def test_failed_dra_postflight_stops_before_the_next_batch_with_the_node_cordoned(tmp_path):
    lab, plan = dra_lab(tmp_path)
    try:
        batches = [b for b in plan['batches'] if not set(b) & set(plan['canaries'])]
        assert len(batches) >= 2, plan['batches']
        victim = batches[0][0]
        later = [n for b in batches[1:] for n in b]
        # Empty DRA inventory for the victim: its driver publishes no ResourceSlice after the upgrade.
        lab.emu.delete('resource.k8s.io/v1', 'ResourceSlice', f.resource_slice(victim)['metadata']['name'])
        lab.emu.clear_requests()
        assert lab.play('rollout', 'rollout.yml') == 'failed'
        failures = lab.runs['rollout']['failures']
        stop = [x for x in failures if x['host'] == victim and x['task'].startswith('Node | Stop the rollout')]
        assert stop, failures
        assert stop[0]['msg'].startswith('node %s: DRA postflight failed (DRA postflight failed on %s: ' % (victim, victim))
        assert '0 ResourceSlice(s) of gpu.nvidia.com' in stop[0]['msg'] and 'the node stays cordoned' in stop[0]['msg']
        node = lab.emu.get('v1', 'Node', victim)
        assert node['spec'].get('unschedulable') is True
        assert node['metadata']['annotations'][S.ANN_STATE] == 'failed'
        # Never uncordoned on the way: no write cleared its cordon.
        assert not [r for r in lab.emu.mutating_requests() if r['path'].endswith('/nodes/' + victim)
                    and 'unschedulable' in json.dumps(r.get('body') or {}) and
                    (r['body'].get('spec') or {}).get('unschedulable') in (None, False)]
        rows = {r['node']: r for r in lab.node_view()}
        assert all(rows[n]['state'] == '-' and not rows[n]['cordoned'] and rows[n]['driver'] == labenv.SOURCE_DRIVER
                   for n in later), 'expansion did not stop'
        # The canaries stay isolated: the rollout did not succeed.
        assert all(lab.emu.get('v1', 'Node', c)['metadata']['labels'].get(S.CANARY_KEY) == 'true'
                   for c in plan['canaries'])
        e = bundle(lab)['nodes'][victim]
        assert e['verdict'] == 'failed' and e['failed_phase'] == 'postflight' and e['rolled_back'] is False
        assert e['phases'] == PHASES[:PHASES.index('postflight')]
        assert e['tuple_after']['driver'] == labenv.TARGET_DRIVER and 'DRA postflight failed' in e['message']
        assert sorted(bundle(lab)['nodes']) == [victim]
    finally:
        lab.stop()
