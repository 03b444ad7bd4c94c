"""rollout.yml wiring on the lab's pool (4 nodes, a real control plane: tests/tools/lab.py starts
it): the DRA postflight after each node (gpufleet_dra), the release of the canaries at the end of a
successful rollout, and the per-node entries of the evidence bundle. The DRA driver's kubelet
plugin is a real DaemonSet (its pods made by the DaemonSet controller, run by KWOK); each node's
ResourceSlice is what the plugin publishes.

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
from tools import labenv  # noqa: E402
from tools.lab import Lab  # noqa: E402

sys.path[:0] = [str(REPO / 'tests' / 'integration')]
from test_rollout_resume import approved_records  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')

DRA_NS = 'nvidia-dra-driver-gpu'
OWNER = 'gpufleet.upgrade.canary'
# The driver change (no RKE2 Plan, no kernel steps): what this test asserts is the DRA postflight's wiring.
TARGET = labenv.CHANGES['driver']
PHASES = ['drain', 'snapshot', 'install', 'activate', 'ready', 'verify', 'gates', 'postflight', 'uncordon']


def resource_slice(node: str) -> dict:
    """What the DRA driver's kubelet plugin publishes for a node: its 8 GPUs in one pool."""
    return {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice',
            'metadata': {'name': '%s-gpu-nvidia-com' % node},
            'spec': {'driver': 'gpu.nvidia.com', 'nodeName': node,
                     'pool': {'name': node, 'generation': 1, 'resourceSliceCount': 1},
                     'devices': [{'name': 'gpu-%d' % i, 'attributes': {}} for i in range(8)]}}


def dra_objects(names: list[str]) -> list[dict]:
    labels = {'app': 'dra-kubelet-plugin'}
    ds = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
          'metadata': {'name': 'nvidia-dra-driver-gpu-kubelet-plugin', 'namespace': DRA_NS, 'labels': labels},
          'spec': {'selector': {'matchLabels': labels}, 'template': {'metadata': {'labels': labels}, 'spec': {
              'nodeSelector': {'nvidia.com/gpu.present': 'true'},
              'containers': [{'name': 'plugin', 'image': 'nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0'}]}}}}
    device_class = {'apiVersion': 'resource.k8s.io/v1', 'kind': 'DeviceClass', 'metadata': {'name': 'gpu.nvidia.com'},
                    'spec': {'selectors': [{'cel': {'expression': "device.driver == 'gpu.nvidia.com'"}}]}}
    return [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': DRA_NS}}, device_class, ds] + \
        [resource_slice(n) for n in names]


def wait_dra_plugin(lab: Lab) -> None:
    """The DaemonSet controller made the plugin's pods, KWOK runs them: Ready on every node."""
    def ready() -> bool:
        st = lab.cluster.get('apps/v1', 'DaemonSet', 'nvidia-dra-driver-gpu-kubelet-plugin', DRA_NS).get('status') or {}
        return st.get('desiredNumberScheduled') == len(lab.names) and st.get('numberReady') == len(lab.names)
    lab.cluster.wait_for(ready, timeout=60, interval=0.2, message='the DRA kubelet plugin Ready on every node')


def canaries_as_the_canary_playbook_leaves_them(lab: Lab, plan: dict) -> None:
    key = S.target_key(TARGET)
    for name in plan['canaries']:
        lab.cluster.patch('v1', 'Node', name, {
            'metadata': {'labels': {S.CANARY_KEY: 'true'},
                         'annotations': {S.ANN_ISOLATED_BY: OWNER, S.ANN_DONE: key}},
            'spec': {'taints': [{'key': S.CANARY_KEY, 'value': 'true', 'effect': 'NoSchedule'}]}})


def past_the_canary(lab: Lab) -> dict:
    """Start the lab and plan; leave the canaries and the approved records as canary.yml and the approval
    do (the rollout then upgrades the other nodes). Returns the plan."""
    lab.prepare()
    plan = lab.plan()
    approved_records(lab, plan)
    canaries_as_the_canary_playbook_leaves_them(lab, plan)
    return plan


def dra_lab(tmp_path: pathlib.Path) -> tuple[Lab, dict]:
    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, change='driver',
              lab_vars={'gpufleet_dra': True})
    lab.dir.mkdir()
    try:
        lab.prepare()
        lab.cluster.apply(dra_objects(lab.names))
        wait_dra_plugin(lab)
        plan = lab.plan()
        approved_records(lab, plan)
        canaries_as_the_canary_playbook_leaves_them(lab, plan)
    except BaseException:
        lab.stop()          # no control plane left behind
        raise
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
        assert not [r for r in lab.cluster.requests if 'upgrade.cattle.io' in r['path']]
        # The canaries the canary playbook isolated are released: label, taint and owner annotation gone.
        for c in plan['canaries']:
            node = lab.cluster.get('v1', 'Node', c)
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
            assert e['tuple_before'] == labenv.CURRENT and e['tuple_after'] == TARGET
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
        lab.cluster.delete('resource.k8s.io/v1', 'ResourceSlice', resource_slice(victim)['metadata']['name'])
        lab.cluster.clear_requests()
        assert lab.play('rollout', 'rollout.yml') == 'failed'
        failures = lab.runs['rollout']['failures']
        stop = [x for x in failures if x['host'] == victim and x['task'].startswith('Node | Stop the rollout')]
        assert stop, failures
        assert stop[0]['msg'].startswith('node %s: DRA postflight failed (DRA postflight failed on %s: ' % (victim, victim))
        assert '0 ResourceSlice(s) of gpu.nvidia.com' in stop[0]['msg'] and 'the node stays cordoned' in stop[0]['msg']
        node = lab.cluster.get('v1', 'Node', victim)
        assert node['spec'].get('unschedulable') is True
        assert node['metadata']['annotations'][S.ANN_STATE] == 'failed'
        # Never uncordoned on the way: no write cleared its cordon.
        assert not [r for r in lab.cluster.mutating_requests() if r['path'].endswith('/nodes/' + victim)
                    and 'unschedulable' in json.dumps(r.get('body') or {}) and
                    (r['body'].get('spec') or {}).get('unschedulable') in (None, False)]
        rows = {r['node']: r for r in lab.node_view()}
        assert all(rows[n]['state'] == '-' and not rows[n]['cordoned'] and rows[n]['driver'] == labenv.SOURCE_DRIVER
                   for n in later), 'expansion did not stop'
        # The canaries stay isolated: the rollout did not succeed.
        assert all(lab.cluster.get('v1', 'Node', c)['metadata']['labels'].get(S.CANARY_KEY) == 'true'
                   for c in plan['canaries'])
        e = bundle(lab)['nodes'][victim]
        assert e['verdict'] == 'failed' and e['failed_phase'] == 'postflight' and e['rolled_back'] is False
        assert e['phases'] == PHASES[:PHASES.index('postflight')]
        assert e['tuple_after']['driver'] == labenv.TARGET_DRIVER and 'DRA postflight failed' in e['message']
        assert sorted(bundle(lab)['nodes']) == [victim]
    finally:
        lab.stop()
