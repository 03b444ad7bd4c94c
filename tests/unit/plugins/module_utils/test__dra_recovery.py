from __future__ import annotations

import copy
import datetime

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils._dra_recovery import (
    RecoveryInputError, plan_recovery)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._kube_time import parse_time

NOW = datetime.datetime(2026, 7, 14, 12, 0, 0, tzinfo=datetime.timezone.utc)
DS_UID = 'ds-uid-current'


def node(ready='True', name='gpu-1'):
    return {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name},
            'status': {'conditions': [{'type': 'MemoryPressure', 'status': 'False'},
                                      {'type': 'Ready', 'status': ready, 'reason': 'KubeletReady'}]}}


def rslice(node_name='gpu-1', devices=0, driver='gpu.nvidia.com', name=None):
    return {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice',
            'metadata': {'name': name or '%s-%s-%d' % (node_name, driver, devices)},
            'spec': {'nodeName': node_name, 'driver': driver, 'pool': {'name': node_name},
                     'devices': [{'name': 'gpu-%d' % i} for i in range(devices)]}}


def daemonset(desired=4, ready=3, updated=4, uid=DS_UID):
    return {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
            'metadata': {'name': 'nvidia-dra-driver-gpu-kubelet-plugin', 'namespace': 'nvidia-dra', 'uid': uid,
                         'generation': 2},
            'status': {'desiredNumberScheduled': desired, 'numberReady': ready, 'updatedNumberScheduled': updated,
                       'observedGeneration': 2}}


def pod(name='plugin-abc', node_name='gpu-1', owner_uid=DS_UID, ready='False',
        since='2026-07-14T11:45:00Z', deleting=None):
    meta = {'name': name, 'namespace': 'nvidia-dra', 'uid': 'pod-%s' % name,
            'creationTimestamp': '2026-07-14T09:00:00Z',
            'ownerReferences': [{'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'controller': True,
                                 'name': 'nvidia-dra-driver-gpu-kubelet-plugin', 'uid': owner_uid}]}
    if deleting:
        meta['deletionTimestamp'] = deleting
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': meta, 'spec': {'nodeName': node_name},
            'status': {'conditions': [{'type': 'Ready', 'status': ready, 'lastTransitionTime': since}]}}


def run(**kw):
    args = dict(node=node(), resource_slices=[rslice(devices=0)], daemonset=daemonset(), pods=[pod()], now=NOW)
    args.update(kw)
    return plan_recovery(**args)


def met(plan):
    return {c.name: c.met for c in plan.conditions}


def test_all_conditions_met_prints_candidate_and_never_deletes():
    plan = run()
    assert plan.candidate is True
    assert met(plan) == {'node_ready': True, 'dra_inventory_empty': True, 'daemonset_degraded': True,
                         'stale_driver_pod': True}
    assert plan.candidates == [{
        'namespace': 'nvidia-dra', 'name': 'plugin-abc', 'uid': 'pod-plugin-abc',
        'unready_since': '2026-07-14T11:45:00Z', 'unready_seconds': 900,
        'manual_step': 'after review, an operator may delete Pod nvidia-dra/plugin-abc (uid pod-plugin-abc) so that '
                       'DaemonSet nvidia-dra/nvidia-dra-driver-gpu-kubelet-plugin recreates it, e.g. kubectl -n '
                       'nvidia-dra delete pod plugin-abc; this planner never deletes'}]
    assert plan.summary == 'node gpu-1: 1 stale driver Pod candidate(s): nvidia-dra/plugin-abc'
    reasons = {c.name: c.reason for c in plan.conditions}
    assert reasons['daemonset_degraded'] == ('DaemonSet nvidia-dra/nvidia-dra-driver-gpu-kubelet-plugin is degraded: '
                                             'numberReady 3 < desiredNumberScheduled 4')
    assert reasons['dra_inventory_empty'].startswith('the 1 ResourceSlice(s) for node gpu-1 list no device')


def test_exactly_min_unready_qualifies_one_second_less_does_not():
    assert run(pods=[pod(since='2026-07-14T11:50:00Z')]).candidate is True
    plan = run(pods=[pod(since='2026-07-14T11:50:01Z')])
    assert plan.candidate is False and plan.candidates == []
    assert plan.pods[0].reason == 'unready for 599s only, less than 600s'
    assert met(plan)['stale_driver_pod'] is False
    assert plan.summary == 'node gpu-1: no candidate; not met: stale_driver_pod'


def test_min_unready_configurable():
    assert run(pods=[pod(since='2026-07-14T11:58:00Z')], min_unready_seconds=120).candidate is True
    assert run(pods=[pod(since='2026-07-14T11:45:00Z')], min_unready_seconds=3600).candidate is False


def test_node_not_ready_blocks():
    plan = run(node=node(ready='Unknown'))
    assert plan.candidate is False and plan.candidates == []
    assert met(plan)['node_ready'] is False and met(plan)['stale_driver_pod'] is True
    assert plan.conditions[0].reason == ('node gpu-1 Ready condition is Unknown (reason KubeletReady): a recovery '
                                         'plan needs a Ready node')


def test_node_without_ready_condition_blocks():
    n = node()
    n['status']['conditions'] = []
    assert met(run(node=n))['node_ready'] is False


def test_inventory_with_devices_blocks_and_other_nodes_or_drivers_ignored():
    plan = run(resource_slices=[rslice(devices=2)])
    assert plan.candidate is False
    assert plan.conditions[1].reason == ('node gpu-1 still publishes 2 device(s) in gpu-1-gpu.nvidia.com-2 (2): the '
                                         'DRA driver is serving')
    others = [rslice(node_name='gpu-2', devices=8), rslice(devices=4, driver='net.example.com')]
    assert met(run(resource_slices=others, driver='gpu.nvidia.com'))['dra_inventory_empty'] is True
    assert met(run(resource_slices=others))['dra_inventory_empty'] is False  # no driver filter: counts all
    assert run(resource_slices=[]).conditions[1].reason == 'no ResourceSlice publishes devices for node gpu-1'


@pytest.mark.parametrize('kw,degraded', [
    (dict(desired=4, ready=4, updated=4), False),
    (dict(desired=4, ready=4, updated=3), True),
    (dict(desired=4, ready=2, updated=2), True),
    (dict(desired=0, ready=0, updated=0), False),
])
def test_daemonset_degraded(kw, degraded):
    assert met(run(daemonset=daemonset(**kw)))['daemonset_degraded'] is degraded
    assert run(daemonset=daemonset(**kw)).candidate is degraded


def test_daemonset_omitted_counters_are_zero_and_missing_status_is_unknown():
    ds = daemonset()
    ds['status'] = {'desiredNumberScheduled': 2, 'numberReady': 2}  # updatedNumberScheduled omitted → 0
    assert met(run(daemonset=ds))['daemonset_degraded'] is True
    ds = daemonset()
    del ds['status']
    plan = run(daemonset=ds)
    assert plan.candidate is False and 'has no status' in plan.conditions[2].reason


def test_stale_status_is_reported():
    ds = daemonset()
    ds['status']['observedGeneration'] = 1
    assert 'observed generation 1 < generation 2' in run(daemonset=ds).conditions[2].reason


def test_pod_of_old_daemonset_uid_is_not_a_candidate():
    plan = run(pods=[pod(owner_uid='ds-uid-old')])
    assert plan.candidate is False
    assert plan.pods[0].owned_by_current_daemonset is False
    assert plan.pods[0].reason == ('owned by DaemonSet nvidia-dra-driver-gpu-kubelet-plugin uid ds-uid-old, not the '
                                   'current DaemonSet nvidia-dra/nvidia-dra-driver-gpu-kubelet-plugin (uid ds-uid-current)')


def test_terminating_ready_and_foreign_pods_are_not_candidates():
    plan = run(pods=[pod(name='t', deleting='2026-07-14T11:59:00Z'), pod(name='r', ready='True'),
                     pod(name='elsewhere', node_name='gpu-2')])
    assert plan.candidate is False
    assert [(p.name, p.reason) for p in plan.pods] == [
        ('t', 'already being deleted (deletionTimestamp 2026-07-14T11:59:00Z)'), ('r', 'Ready')]


def test_only_qualifying_pods_listed_when_several():
    plan = run(pods=[pod(name='old'), pod(name='new', since='2026-07-14T11:59:00Z'), pod(name='r', ready='True')])
    assert plan.candidate is True and [c['name'] for c in plan.candidates] == ['old']


def test_missing_ready_condition_falls_back_to_creation_time():
    p = pod()
    p['status'] = {'phase': 'Pending'}
    plan = run(pods=[p])
    assert plan.candidate is True and plan.candidates[0]['unready_since'] == '2026-07-14T09:00:00Z'
    del p['metadata']['creationTimestamp']
    plan = run(pods=[p])
    assert plan.candidate is False and 'since when is unknown' in plan.pods[0].reason


def test_no_pod_on_node():
    plan = run(pods=[])
    assert plan.conditions[3].reason == 'no Pod of the given ones runs on node gpu-1' and not plan.candidate


def test_inputs_are_not_modified():
    args = dict(node=node(), resource_slices=[rslice()], daemonset=daemonset(), pods=[pod()])
    before = copy.deepcopy(args)
    plan_recovery(now=NOW, **args)
    assert args == before


@pytest.mark.parametrize('kw,msg', [
    (dict(node={'metadata': {}}), 'node.metadata.name: None is not a node name'),
    (dict(node=[]), 'node: [] is not a Kubernetes object (a mapping)'),
    (dict(daemonset={'kind': 'DaemonSet', 'metadata': {'name': 'x'}}), 'daemonset.metadata.uid: None is missing'),
    (dict(daemonset={'kind': 'Deployment', 'metadata': {'uid': 'u'}}), "daemonset: kind 'Deployment' is not DaemonSet"),
    (dict(pods='x'), "pods: 'x' is not a list of Pod objects"),
    (dict(resource_slices=[{'kind': 'Pod'}]), "resource_slices[0]: kind 'Pod' is not ResourceSlice"),
    (dict(min_unready_seconds=0), 'min_unready_seconds: 0 must be a positive number of seconds'),
    (dict(pods=[pod(since='yesterday')]), "pods[0] Ready lastTransitionTime: 'yesterday' is not an RFC 3339 time"),
])
def test_bad_input_names_field_and_value(kw, msg):
    with pytest.raises(RecoveryInputError) as exc:
        run(**kw)
    assert str(exc.value).startswith(msg)


@pytest.mark.parametrize('text,expected', [
    ('2026-07-14T12:00:00Z', NOW),
    ('2026-07-14T14:00:00+02:00', NOW),
    ('2026-07-14T12:00:00.123456789Z', NOW.replace(microsecond=123456)),
])
def test_parse_time(text, expected):
    assert parse_time(text, 'now') == expected


def test_parse_time_rejects_naive():
    with pytest.raises(ValueError, match='now: .* has no time zone'):
        parse_time(datetime.datetime(2026, 1, 1), 'now')
