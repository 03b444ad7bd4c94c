"""gpufleet.upgrade.dra_recovery_plan through ansible-playbook (ansible-runner)."""
from __future__ import annotations

DS_UID = '6f1c2a9e-0000-4000-8000-000000000001'

NODE = {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': 'gpu-a-07'},
        'status': {'conditions': [{'type': 'Ready', 'status': 'True'}]}}
SLICES = [
    {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice', 'metadata': {'name': 'gpu-a-07-gpu'},
     'spec': {'nodeName': 'gpu-a-07', 'driver': 'gpu.nvidia.com', 'pool': {'name': 'gpu-a-07'}, 'devices': []}},
    {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice', 'metadata': {'name': 'gpu-a-08-gpu'},
     'spec': {'nodeName': 'gpu-a-08', 'driver': 'gpu.nvidia.com', 'pool': {'name': 'gpu-a-08'},
              'devices': [{'name': 'gpu-0'}]}},
]
DS = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
      'metadata': {'name': 'nvidia-dra-driver-gpu-kubelet-plugin', 'namespace': 'nvidia-dra-driver-gpu',
                   'uid': DS_UID},
      'status': {'desiredNumberScheduled': 2, 'numberReady': 1, 'updatedNumberScheduled': 2}}


def pod(name, owner_uid=DS_UID, since='2026-07-14T11:40:00Z', node='gpu-a-07'):
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': name, 'namespace': 'nvidia-dra-driver-gpu', 'uid': 'uid-' + name,
                         'ownerReferences': [{'kind': 'DaemonSet', 'name': DS['metadata']['name'],
                                              'uid': owner_uid, 'controller': True}]},
            'spec': {'nodeName': node},
            'status': {'conditions': [{'type': 'Ready', 'status': 'False', 'lastTransitionTime': since}]}}


def _play(args, check=False):
    return [{'name': 'dra', 'hosts': 'localhost', 'gather_facts': False, 'check_mode': check, 'tasks': [
        {'name': 'plan', 'gpufleet.upgrade.dra_recovery_plan': args, 'register': 'plan', 'ignore_errors': True},
    ]}]


def test_prints_candidate_and_explains(run_playbook):
    args = {'node': NODE, 'resource_slices': SLICES, 'daemonset': DS, 'driver': 'gpu.nvidia.com',
            'pods': [pod('plugin-old'), pod('plugin-other-ds', owner_uid='old-uid'), pod('elsewhere', node='x')],
            'now': '2026-07-14T12:00:00Z'}
    for check in (False, True):
        run = run_playbook(_play(args, check))
        res = run.result('plan')
        assert res['_event'] == 'runner_on_ok' and res['changed'] is False, run.stdout
        assert res['candidate'] is True
        assert [c['name'] for c in res['candidates']] == ['plugin-old']
        assert res['candidates'][0]['unready_seconds'] == 1200
        assert [(c['name'], c['met']) for c in res['conditions']] == [
            ('node_ready', True), ('dra_inventory_empty', True), ('daemonset_degraded', True),
            ('stale_driver_pod', True)]
        assert [p['name'] for p in res['pods']] == ['plugin-old', 'plugin-other-ds']
        assert res['pods'][1]['owned_by_current_daemonset'] is False
        assert res['summary'] == 'node gpu-a-07: 1 stale driver Pod candidate(s): nvidia-dra-driver-gpu/plugin-old'


def test_no_candidate_under_min_unready_alias(run_playbook):
    args = {'node': NODE, 'resource_slices': SLICES, 'daemonset': DS, 'pods': [pod('plugin-old')],
            'now': '2026-07-14T12:00:00Z', 'min_unready': 3600, 'driver': 'gpu.nvidia.com'}
    res = run_playbook(_play(args)).result('plan')
    assert res['_event'] == 'runner_on_ok' and res['candidate'] is False and res['candidates'] == []
    assert res['summary'] == 'node gpu-a-07: no candidate; not met: stale_driver_pod'
    assert 'unready for 1200s only, less than 3600s' in res['conditions'][3]['reason']


def test_bad_now_fails_naming_the_option(run_playbook):
    args = {'node': NODE, 'daemonset': DS, 'now': 'noon'}
    res = run_playbook(_play(args)).result('plan')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == "now: 'noon' is not an RFC 3339 time such as 2026-07-14T12:00:00Z"
