"""Unit tests of the GPU Operator's pure parts (plugins/module_utils/_gpu_operator.py), over plain
dicts shaped like the API's ClusterPolicy, HelmChart, DaemonSets, ControllerRevisions, pods and the
operator Deployment."""
from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpu_operator as G

NS = 'gpu-operator'
CP_UID = '5f0c6a9e-cp'
ANN = G.RESTORE_ANNOTATION
DCGM = {'repository': 'nvcr.io/nvidia/k8s', 'image': 'dcgm-exporter', 'version': '3.3.5-3.4.0-ubuntu22.04'}
DCGM_IMAGE = 'nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.0-ubuntu22.04'
NEW_DCGM = '3.3.8-3.6.0-ubuntu22.04'


# -- objects ------------------------------------------------------------------------------------
def cluster_policy(state='ready', error=None, annotations=None, spec=None):
    conds = [{'type': 'Ready', 'status': 'True' if state == 'ready' else 'False'}]
    if error:
        conds.append({'type': 'Error', 'status': 'True', 'reason': error[0], 'message': error[1]})
    return {'apiVersion': 'nvidia.com/v1', 'kind': 'ClusterPolicy',
            'metadata': {'name': 'cluster-policy', 'uid': CP_UID, 'annotations': dict(annotations or {})},
            'spec': copy.deepcopy(spec) if spec is not None else {
                'daemonsets': {'updateStrategy': 'RollingUpdate'},
                'driver': {'enabled': True, 'upgradePolicy': {'autoUpgrade': True}},
                'dcgmExporter': dict(DCGM)},
            'status': {'state': state, 'conditions': conds}}


def daemonset(name, image, strategy='OnDelete', generation=2, observed=2, owned=True):
    owners = [{'apiVersion': 'nvidia.com/v1', 'kind': 'ClusterPolicy', 'name': 'cluster-policy',
               'uid': CP_UID, 'controller': True}] if owned else []
    return {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
            'metadata': {'name': name, 'namespace': NS, 'uid': 'uid-' + name, 'generation': generation,
                         'ownerReferences': owners},
            'spec': {'updateStrategy': {'type': strategy},
                     'template': {'spec': {'containers': [{'name': 'main', 'image': image}]}}},
            'status': {'observedGeneration': observed, 'desiredNumberScheduled': 2, 'numberReady': 1,
                       'numberUnavailable': 1}}


def revision(ds_name, number, hash_, owner_uid=None):
    return {'apiVersion': 'apps/v1', 'kind': 'ControllerRevision', 'revision': number,
            'metadata': {'name': '%s-%s' % (ds_name, hash_), 'namespace': NS,
                         'labels': {'controller-revision-hash': hash_},
                         'ownerReferences': [{'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'name': ds_name,
                                              'uid': owner_uid or 'uid-' + ds_name, 'controller': True}]}}


def pod(ds_name, node, hash_, phase='Running', ready=True, deleting=False, image='img'):
    meta = {'name': '%s-%s-%s' % (ds_name, hash_, node), 'namespace': NS,
            'labels': {'controller-revision-hash': hash_},
            'ownerReferences': [{'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'name': ds_name,
                                 'uid': 'uid-' + ds_name, 'controller': True}]}
    if deleting:
        meta['deletionTimestamp'] = '2024-05-01T10:00:00Z'
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': meta,
            'spec': {'nodeName': node, 'containers': [{'name': 'main', 'image': image}]},
            'status': {'phase': phase, 'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False'}]}}


def helm_chart(values, version='v24.9.0', annotations=None, failed=None):
    conds = [{'type': 'Failed', 'status': 'True', 'reason': 'Error', 'message': failed}] if failed else []
    return {'apiVersion': 'helm.cattle.io/v1', 'kind': 'HelmChart',
            'metadata': {'name': 'gpu-operator', 'namespace': 'kube-system', 'annotations': dict(annotations or {})},
            'spec': {'chart': 'gpu-operator', 'repo': 'https://helm.ngc.nvidia.com/nvidia', 'version': version,
                     'targetNamespace': NS,
                     'valuesContent': values if isinstance(values, str) else yaml.safe_dump(values)},
            'status': {'conditions': conds}}


def deployment(image='nvcr.io/nvidia/gpu-operator:v24.9.0'):
    return {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'gpu-operator', 'namespace': NS},
            'spec': {'template': {'spec': {'containers': [{'name': 'gpu-operator', 'image': image}]}}}}


def objs(cp=None, chart=None, dss=None, revs=(), pods=(), dep=None):
    return {'cluster_policy': cp if cp is not None else cluster_policy(), 'helm_chart': chart,
            'daemonsets': dss if dss is not None else [daemonset('nvidia-dcgm-exporter', DCGM_IMAGE)],
            'revisions': list(revs), 'pods': list(pods), 'deployment': dep if dep is not None else deployment()}


def scenario():
    """gpu-1 runs an old dcgm-exporter pod and a current validator; gpu-2 runs a current dcgm-exporter."""
    dss = [daemonset('nvidia-dcgm-exporter', DCGM_IMAGE), daemonset('nvidia-operator-validator', 'validator:v1'),
           daemonset('unrelated-ds', 'x', owned=False)]
    revs = [revision('nvidia-dcgm-exporter', 1, 'aaa'), revision('nvidia-dcgm-exporter', 3, 'ccc'),
            revision('nvidia-dcgm-exporter', 2, 'bbb'),
            revision('nvidia-dcgm-exporter', 9, 'zzz', owner_uid='uid-an-older-incarnation'),
            revision('nvidia-operator-validator', 1, 'vvv')]
    pods = [pod('nvidia-dcgm-exporter', 'gpu-1', 'aaa'), pod('nvidia-operator-validator', 'gpu-1', 'vvv'),
            pod('nvidia-dcgm-exporter', 'gpu-2', 'ccc'), pod('unrelated-ds', 'gpu-1', 'xxx')]
    return objs(dss=dss, revs=revs, pods=pods)


def state(o):
    return G.state_of(o)


# -- values -------------------------------------------------------------------------------------
def test_merge_values_deep_merges_mappings_and_replaces_the_rest_without_touching_inputs():
    base = {'driver': {'enabled': True, 'version': '550'}, 'list': [1, 2], 'keep': 1}
    extra = {'driver': {'version': '560'}, 'list': [3], 'new': {'a': 1}}
    out = G.merge_values(base, extra)
    assert out == {'driver': {'enabled': True, 'version': '560'}, 'list': [3], 'keep': 1, 'new': {'a': 1}}
    assert base['driver']['version'] == '550' and base['list'] == [1, 2]
    out['new']['a'] = 2
    assert extra['new']['a'] == 1
    assert G.merge_values('scalar', {'a': 1}) == {'a': 1}


def test_image_of_tag_digest_and_no_version():
    assert G.image_of(DCGM) == DCGM_IMAGE
    assert G.image_of({'repository': 'nvcr.io/nvidia/', 'image': 'driver', 'version': 'sha256:ab12'}) == \
        'nvcr.io/nvidia/driver@sha256:ab12'
    assert G.image_of({'image': 'gfd', 'version': 'v0.8'}) == 'gfd:v0.8'
    assert G.image_of({'repository': 'nvcr.io/nvidia', 'image': 'driver'}) is None
    assert G.image_of(None) is None


def test_plan_change_always_sets_ondelete_and_no_auto_upgrade_and_records_what_was_there():
    values = cluster_policy()['spec']
    after, restore = G.plan_change(values, {'values': {'toolkit': {'version': 'v1.17'}},
                                            'dcgm_exporter_version': NEW_DCGM})
    assert after['daemonsets']['updateStrategy'] == 'OnDelete'
    assert after['driver']['upgradePolicy']['autoUpgrade'] is False
    assert after['dcgmExporter']['version'] == NEW_DCGM and after['toolkit'] == {'version': 'v1.17'}
    assert restore == {'daemonsets.updateStrategy': 'RollingUpdate', 'driver.upgradePolicy.autoUpgrade': True}
    assert values['daemonsets']['updateStrategy'] == 'RollingUpdate'          # input untouched


def test_plan_change_keeps_the_recorded_restore_on_a_rerun():
    recorded = {'daemonsets.updateStrategy': 'RollingUpdate', 'driver.upgradePolicy.autoUpgrade': True}
    after_first = G.plan_change(cluster_policy()['spec'], {})[0]
    after, restore = G.plan_change(after_first, {}, recorded)
    assert restore == recorded and restore is not recorded
    assert after['daemonsets']['updateStrategy'] == 'OnDelete'


@pytest.mark.parametrize('extra, key', [
    ({'daemonsets': {'updateStrategy': 'RollingUpdate'}}, 'values.daemonsets.updateStrategy'),
    ({'driver': {'upgradePolicy': {'autoUpgrade': True}}}, 'values.driver.upgradePolicy.autoUpgrade'),
])
def test_plan_change_refuses_values_that_undo_the_safe_settings(extra, key):
    with pytest.raises(G.GpuOperatorError, match=key):
        G.plan_change({}, {'values': extra})
    # the safe values themselves are accepted
    after = G.plan_change({}, {'values': {'daemonsets': {'updateStrategy': 'OnDelete'}}})[0]
    assert after['daemonsets']['updateStrategy'] == 'OnDelete'


def test_plan_change_refuses_non_mapping_values():
    with pytest.raises(G.GpuOperatorError, match='expected a mapping'):
        G.plan_change({}, {'values': ['driver']})


def test_restore_values_puts_back_recorded_and_removes_what_was_unset():
    after = G.plan_change(cluster_policy()['spec'], {})[0]
    out = G.restore_values(after, {'daemonsets.updateStrategy': 'RollingUpdate',
                                   'driver.upgradePolicy.autoUpgrade': None})
    assert out['daemonsets']['updateStrategy'] == 'RollingUpdate'
    assert 'autoUpgrade' not in out['driver']['upgradePolicy']                 # None: unset before, unset again
    assert after['daemonsets']['updateStrategy'] == 'OnDelete'                 # input untouched
    assert after['driver']['upgradePolicy']['autoUpgrade'] is False


def test_plan_restore_of_a_cluster_policy_removes_an_unset_setting_with_a_null():
    ann = {G.RESTORE_ANNOTATION: json.dumps({'daemonsets.updateStrategy': 'RollingUpdate',
                                             'driver.upgradePolicy.autoUpgrade': None})}
    cp = cluster_policy(state='notReady', annotations=ann)
    plan = G.plan_restore(objs(cp=cp))
    assert plan['patch']['spec']['driver']['upgradePolicy']['autoUpgrade'] is None
    assert plan['patch']['spec']['daemonsets']['updateStrategy'] == 'RollingUpdate'


def test_plan_cluster_replace_values_records_the_defaults_and_checks_the_replacement():
    spec = cluster_policy()['spec']
    spec.pop('daemonsets', None)
    cp = cluster_policy(spec=spec)
    plan = G.plan_cluster(objs(cp=cp), {'replace_values': True, 'values': {'dcgmExporter': {'version': 'old'}}})
    assert plan['restore']['daemonsets.updateStrategy'] == 'RollingUpdate'
    assert plan['values']['dcgmExporter'] == {'version': 'old'}
    assert plan['values']['daemonsets']['updateStrategy'] == 'OnDelete'
    with pytest.raises(G.GpuOperatorError, match='values.daemonsets.updateStrategy'):
        G.plan_cluster(objs(cp=cp), {'replace_values': True,
                                     'values': {'daemonsets': {'updateStrategy': 'OnFailure'}}})


def test_plan_cluster_replace_values_takes_a_snapshot_with_the_settings_the_change_recorded():
    """The failed canary's way back: the snapshot (gpu_operator_info's chart_values before the cluster
    step) names RollingUpdate and autoUpgrade true, which the change recorded; the replacement keeps
    OnDelete until the restore, and the record is kept as it was."""
    snapshot = cluster_policy()['spec']
    ann = {ANN: json.dumps({'daemonsets.updateStrategy': 'RollingUpdate', 'driver.upgradePolicy.autoUpgrade': True})}
    changed = copy.deepcopy(snapshot)
    changed['daemonsets']['updateStrategy'] = 'OnDelete'
    changed['driver']['upgradePolicy']['autoUpgrade'] = False
    changed['dcgmExporter']['version'] = NEW_DCGM
    cp = cluster_policy(state='notReady', annotations=ann, spec=changed)
    plan = G.plan_cluster(objs(cp=cp), {'replace_values': True, 'values': snapshot})
    assert plan['values']['dcgmExporter'] == DCGM
    assert plan['values']['daemonsets']['updateStrategy'] == 'OnDelete'
    assert plan['values']['driver']['upgradePolicy']['autoUpgrade'] is False
    assert plan['restore'] == json.loads(ann[ANN])
    assert snapshot['daemonsets']['updateStrategy'] == 'RollingUpdate'   # the input is not changed
    # autoUpgrade true where the record says it was unset: refused
    ann_unset = {ANN: json.dumps({'daemonsets.updateStrategy': 'RollingUpdate', 'driver.upgradePolicy.autoUpgrade': None})}
    cp = cluster_policy(state='notReady', annotations=ann_unset, spec=changed)
    with pytest.raises(G.GpuOperatorError, match='values.driver.upgradePolicy.autoUpgrade'):
        G.plan_cluster(objs(cp=cp), {'replace_values': True, 'values': snapshot})


def test_plan_cluster_replace_values_of_a_cluster_policy_removes_what_the_cluster_step_added():
    """A ClusterPolicy is merge-patched: the way back names with null what the snapshot does not have (the
    canary toleration the cluster step added), else every operand's template would keep it and the nodes never
    moved would no longer run their DaemonSets' current revision."""
    snapshot = cluster_policy()['spec']
    canary = {'key': 'gpufleet.io/canary', 'operator': 'Exists', 'effect': 'NoSchedule'}
    first = G.plan_cluster(objs(), {'dcgm_exporter_version': NEW_DCGM, 'tolerations': [canary]})
    assert first['patch']['spec']['daemonsets']['tolerations'] == [GPU_TOLERATION, canary]
    assert first['patch']['spec']['dcgmExporter'] == {'version': NEW_DCGM}            # only what changes
    cp = cluster_policy(state='notReady', annotations=first['patch']['metadata']['annotations'], spec=first['values'])
    back = G.plan_cluster(objs(cp=cp), {'replace_values': True, 'values': snapshot})
    assert back['patch']['spec']['daemonsets'] == {'tolerations': None}
    assert back['patch']['spec']['dcgmExporter'] == {'version': DCGM['version']}
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._merge_patch import apply_merge_patch
    assert apply_merge_patch(first['values'], back['patch']['spec']) == back['values']


def test_recorded_restore_reads_json_and_refuses_bad_json():
    assert G.recorded_restore(cluster_policy()) is None
    assert G.recorded_restore(None) is None
    good = cluster_policy(annotations={ANN: json.dumps({'daemonsets.updateStrategy': 'RollingUpdate'})})
    assert G.recorded_restore(good) == {'daemonsets.updateStrategy': 'RollingUpdate'}
    with pytest.raises(G.GpuOperatorError, match=ANN):
        G.recorded_restore(cluster_policy(annotations={ANN: '{not json'}))


# -- read_state ---------------------------------------------------------------------------------
def test_read_state_current_revision_is_the_highest_owned_and_pods_are_flagged():
    s = state(scenario())
    ops = {op['name']: op for op in s['operands']}
    assert set(ops) == {'nvidia-dcgm-exporter', 'nvidia-operator-validator'}      # unowned, unlisted DS left out
    assert ops['nvidia-dcgm-exporter']['revision'] == 'ccc'                       # not 'zzz' (other uid), not last
    assert ops['nvidia-dcgm-exporter']['component'] == 'dcgmExporter'
    assert ops['nvidia-dcgm-exporter']['deploy_label'] == 'nvidia.com/gpu.deploy.dcgm-exporter'
    assert ops['nvidia-dcgm-exporter']['update_strategy'] == 'OnDelete'
    gpu1 = {p['operand']: p for p in s['nodes']['gpu-1']}
    assert set(gpu1) == {'nvidia-dcgm-exporter', 'nvidia-operator-validator'}
    assert gpu1['nvidia-dcgm-exporter']['current'] is False
    assert gpu1['nvidia-operator-validator']['current'] is True and gpu1['nvidia-operator-validator']['ready']
    assert [p['current'] for p in s['nodes']['gpu-2']] == [True]


def test_read_state_operator_version_and_chart():
    o = scenario()
    o['helm_chart'] = helm_chart({'driver': {'enabled': True}}, failed='chart render failed')
    o['deployment'] = deployment('nvcr.io/nvidia/gpu-operator:v24.6.2')
    s = state(o)
    assert s['version'] == 'v24.6.2'
    assert s['chart']['version'] == 'v24.9.0' and s['chart']['failed'] is True
    assert s['chart']['message'] == 'chart render failed'
    o['helm_chart'] = helm_chart({})
    assert state(o)['chart']['failed'] is False
    o['deployment'] = deployment('nvcr.io/nvidia/gpu-operator@sha256:feed')
    assert state(o)['version'] == 'sha256:feed'


def test_read_state_operand_not_ready_is_not_an_error_but_reconcile_failed_is():
    o = scenario()
    o['cluster_policy'] = cluster_policy('notReady', error=('OperandNotReady', 'nvidia-dcgm-exporter not ready'))
    cp = state(o)['cluster_policy']
    assert cp['error'] is None and cp['not_ready'] == 'nvidia-dcgm-exporter not ready'
    assert cp['state'] == 'notReady' and cp['update_strategy'] == 'RollingUpdate' and cp['auto_upgrade'] is True
    o['cluster_policy'] = cluster_policy('notReady', error=('ReconcileFailed', 'failed to render driver'))
    cp = state(o)['cluster_policy']
    assert cp['error'] == 'failed to render driver' and cp['not_ready'] is None


# -- reconciled ---------------------------------------------------------------------------------
def _values(version=DCGM['version']):
    return {'dcgmExporter': dict(DCGM, version=version), 'daemonsets': {'updateStrategy': 'OnDelete'}}


def test_reconciled_done_when_images_strategy_and_generation_match():
    done, waiting = G.reconciled(state(scenario()), _values())
    assert (done, waiting) == (True, [])


@pytest.mark.parametrize('change, expect', [
    (lambda o: None, 'image %s, not nvcr.io/nvidia/k8s/dcgm-exporter:%s' % (DCGM_IMAGE, NEW_DCGM)),
    (lambda o: o['daemonsets'][0]['spec']['updateStrategy'].update(type='RollingUpdate'), 'not OnDelete'),
    (lambda o: o['daemonsets'][0]['metadata'].update(generation=3), 'generation 3 not yet observed'),
    (lambda o: o.update(cluster_policy=cluster_policy(error=('ReconcileFailed', 'boom'))), 'reports an error: boom'),
])
def test_reconciled_waits(change, expect):
    o = scenario()
    change(o)
    values = _values(NEW_DCGM) if 'image' in expect else _values()
    done, waiting = G.reconciled(state(o), values)
    assert not done and any(expect in w for w in waiting), waiting


def test_reconciled_does_not_ask_ondelete_of_the_driver_and_needs_a_cluster_policy():
    o = objs(dss=[daemonset('nvidia-driver-daemonset', 'driver:550', strategy='RollingUpdate')])
    assert G.reconciled(state(o), {}) == (True, [])
    s = state(o)
    s['cluster_policy'] = None
    assert G.reconciled(s, {})[0] is False


# -- per node -----------------------------------------------------------------------------------
def test_node_restarts_only_not_current_pods_of_that_node_and_operands_filter():
    s = state(scenario())
    assert [p['pod'] for p in G.node_restarts(s, 'gpu-1')] == ['nvidia-dcgm-exporter-aaa-gpu-1']
    assert G.node_restarts(s, 'gpu-1', ['nvidia-operator-validator']) == []
    assert G.node_restarts(s, 'gpu-2') == []
    assert G.node_restarts(s, 'gpu-9') == []


def test_node_settled_states():
    ops = ['nvidia-dcgm-exporter', 'nvidia-operator-validator']
    o = scenario()
    done, waiting = G.node_settled(state(o), 'gpu-1', ops)
    assert not done and waiting == ['nvidia-dcgm-exporter: pod nvidia-dcgm-exporter-aaa-gpu-1 at revision aaa '
                                    '(Running, Ready)']
    # the old pod deleted: none yet
    o['pods'] = [p for p in o['pods'] if p['metadata']['name'] != 'nvidia-dcgm-exporter-aaa-gpu-1']
    done, waiting = G.node_settled(state(o), 'gpu-1', ops)
    assert not done and waiting == ['nvidia-dcgm-exporter: no pod on gpu-1 yet']
    # the new one Running and Ready while the old one still terminates
    o['pods'] += [pod('nvidia-dcgm-exporter', 'gpu-1', 'ccc'),
                  pod('nvidia-dcgm-exporter', 'gpu-1', 'aaa', deleting=True)]
    done, waiting = G.node_settled(state(o), 'gpu-1', ops)
    assert not done and waiting == ['nvidia-dcgm-exporter: 2 pods on gpu-1 (an old one is still terminating)']
    # the new one not Ready yet
    o['pods'] = [p for p in o['pods'] if not p['metadata'].get('deletionTimestamp')]
    o['pods'][-1]['status']['conditions'][0]['status'] = 'False'
    assert G.node_settled(state(o), 'gpu-1', ops)[0] is False
    o['pods'][-1]['status']['conditions'][0]['status'] = 'True'
    assert G.node_settled(state(o), 'gpu-1', ops) == (True, [])


# -- the cluster step ---------------------------------------------------------------------------
@pytest.mark.parametrize('cp, msg', [
    (cluster_policy('notReady', error=('ReconcileFailed', 'bad spec')), 'error state'),
    (cluster_policy('notReady'), "'notReady', not ready"),
])
def test_plan_cluster_refuses_an_unusable_cluster_policy_before_the_first_change(cp, msg):
    with pytest.raises(G.GpuOperatorError) as err:
        G.plan_cluster(objs(cp=cp), {'dcgm_exporter_version': NEW_DCGM})
    assert msg in str(err.value) and 'nothing was changed' in str(err.value)


def test_plan_cluster_allows_not_ready_on_a_rerun_but_never_an_error():
    recorded = {'daemonsets.updateStrategy': 'RollingUpdate', 'driver.upgradePolicy.autoUpgrade': True}
    after = G.plan_change(cluster_policy()['spec'], {'dcgm_exporter_version': NEW_DCGM})[0]
    cp = cluster_policy('notReady', error=('OperandNotReady', 'not all at the current revision'),
                        annotations={ANN: json.dumps(recorded)}, spec=after)
    plan = G.plan_cluster(objs(cp=cp), {'dcgm_exporter_version': NEW_DCGM})
    assert plan['kind'] == 'ClusterPolicy' and plan['restore'] == recorded
    assert plan['changed'] is False                                     # already applied, already recorded
    assert json.loads(plan['patch']['metadata']['annotations'][ANN]) == recorded
    cp['status']['conditions'][-1]['reason'] = 'ReconcileFailed'
    with pytest.raises(G.GpuOperatorError, match='nothing was changed'):
        G.plan_cluster(objs(cp=cp), {})


def test_plan_cluster_cluster_policy_path_patches_spec_and_refuses_a_version():
    plan = G.plan_cluster(objs(), {'dcgm_exporter_version': NEW_DCGM})
    assert plan['path'] == '/apis/nvidia.com/v1/clusterpolicies/cluster-policy' and plan['changed'] is True
    assert plan['patch']['spec']['dcgmExporter']['version'] == NEW_DCGM
    assert plan['patch']['spec']['daemonsets']['updateStrategy'] == 'OnDelete'
    assert json.loads(plan['patch']['metadata']['annotations'][ANN]) == {
        'daemonsets.updateStrategy': 'RollingUpdate', 'driver.upgradePolicy.autoUpgrade': True}
    assert plan['undo'] is None
    with pytest.raises(G.GpuOperatorError, match="version: 'v25.3.0'"):
        G.plan_cluster(objs(), {'version': 'v25.3.0'})


def test_plan_cluster_helm_chart_path_patches_values_content_and_version_with_an_undo():
    values = {'driver': {'enabled': True, 'upgradePolicy': {'autoUpgrade': True}}, 'dcgmExporter': dict(DCGM)}
    chart = helm_chart(values)
    original = chart['spec']['valuesContent']
    plan = G.plan_cluster(objs(chart=chart), {'version': 'v25.3.0', 'dcgm_exporter_version': NEW_DCGM})
    assert plan['kind'] == 'HelmChart'
    assert plan['path'] == '/apis/helm.cattle.io/v1/namespaces/kube-system/helmcharts/gpu-operator'
    parsed = yaml.safe_load(plan['patch']['spec']['valuesContent'])
    assert parsed == plan['values']
    assert parsed['dcgmExporter']['version'] == NEW_DCGM and parsed['daemonsets'] == {'updateStrategy': 'OnDelete'}
    assert parsed['driver']['upgradePolicy']['autoUpgrade'] is False
    assert plan['patch']['spec']['version'] == 'v25.3.0' and plan['version'] == 'v25.3.0'
    assert plan['before']['version'] == 'v24.9.0' and plan['changed'] is True
    assert plan['undo'] == {'spec': {'valuesContent': original, 'version': 'v24.9.0'},
                            'metadata': {'annotations': {ANN: None}}}
    assert chart['spec']['valuesContent'] == original


def test_values_of_broken_yaml_and_non_mapping():
    with pytest.raises(G.GpuOperatorError, match='spec.valuesContent'):
        G.values_of(helm_chart('driver: [unclosed\n'), None)
    with pytest.raises(G.GpuOperatorError, match='not a mapping'):
        G.values_of(helm_chart('- a\n- b\n'), None)
    assert G.values_of(helm_chart(''), cluster_policy()) == {}
    with pytest.raises(G.GpuOperatorError, match='not deployed'):
        G.values_of(None, None)


# -- the end of the rollout ---------------------------------------------------------------------
def test_plan_restore_without_a_record_changes_nothing():
    plan = G.plan_restore(objs())
    assert plan['changed'] is False and plan['patch'] is None
    assert plan['values'] == cluster_policy()['spec']


def test_plan_restore_puts_back_the_record_and_removes_the_annotation():
    recorded = {'daemonsets.updateStrategy': 'RollingUpdate', 'driver.upgradePolicy.autoUpgrade': True}
    after = G.plan_change(cluster_policy()['spec'], {})[0]
    cp = cluster_policy(annotations={ANN: json.dumps(recorded)}, spec=after)
    plan = G.plan_restore(objs(cp=cp))
    assert plan['changed'] is True and plan['restore'] == recorded
    assert plan['patch']['metadata']['annotations'] == {ANN: None}
    assert plan['patch']['spec']['daemonsets']['updateStrategy'] == 'RollingUpdate'
    assert plan['patch']['spec']['driver']['upgradePolicy']['autoUpgrade'] is True
    chart = helm_chart(after, annotations={ANN: json.dumps(recorded)})
    plan = G.plan_restore(objs(chart=chart))
    assert plan['kind'] == 'HelmChart' and plan['patch']['metadata']['annotations'] == {ANN: None}
    assert yaml.safe_load(plan['patch']['spec']['valuesContent'])['daemonsets']['updateStrategy'] == 'RollingUpdate'


# -- rendered -----------------------------------------------------------------------------------
def _rendered_objs(chart, dep_image, cp_strategy='OnDelete'):
    spec = cluster_policy()['spec']
    spec['daemonsets']['updateStrategy'] = cp_strategy
    return objs(cp=cluster_policy(spec=spec), chart=chart, dep=deployment(dep_image))


def test_rendered_raises_when_the_helm_chart_failed():
    values = {'dcgmExporter': dict(DCGM)}
    plan = G.plan_cluster(objs(chart=helm_chart(values)), {'version': 'v25.3.0'})
    o = _rendered_objs(helm_chart(values, failed='template: gpu-operator: error'), 'gpu-operator:v25.3.0')
    with pytest.raises(G.GpuOperatorError, match='failed: template: gpu-operator: error'):
        G.rendered(o, plan)


def test_rendered_waits_for_the_operator_deployment_version_and_the_cluster_policy():
    values = {'dcgmExporter': dict(DCGM)}
    plan = G.plan_cluster(objs(chart=helm_chart(values)), {'version': 'v25.3.0'})
    o = _rendered_objs(helm_chart(values, version='v25.3.0'), 'nvcr.io/nvidia/gpu-operator:v24.9.0', 'RollingUpdate')
    done, waiting = G.rendered(o, plan)
    assert not done
    assert 'operator Deployment at v24.9.0, not v25.3.0' in waiting
    assert any('not yet rendered' in w for w in waiting)
    o = _rendered_objs(helm_chart(values, version='v25.3.0'), 'nvcr.io/nvidia/gpu-operator:v25.3.0')
    assert G.rendered(o, plan) == (True, [])


# -- pausing a node's operands -------------------------------------------------------------------------
def node_obj(labels, annotations=None):
    return {'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': 'gpu-1', 'labels': dict(labels), 'annotations': dict(annotations or {})}}


def test_plan_pause_pauses_only_true_labels_and_records_what_they_were():
    node = node_obj({'nvidia.com/gpu.deploy.device-plugin': 'true', 'nvidia.com/gpu.deploy.dcgm': 'false',
                     'nvidia.com/gpu.deploy.container-toolkit': 'true'})
    plan = G.plan_pause(node, present=['nvidia-device-plugin-daemonset', 'nvidia-container-toolkit-daemonset'])
    assert plan['changed'] is True
    assert plan['patch']['metadata']['labels'] == {'nvidia.com/gpu.deploy.device-plugin': G.PAUSE_VALUE}
    record = json.loads(plan['patch']['metadata']['annotations'][G.PAUSED_ANNOTATION])
    assert record == {'labels': {'nvidia.com/gpu.deploy.device-plugin': 'true'},
                      'operands': ['nvidia-device-plugin-daemonset']}
    with pytest.raises(G.GpuOperatorError, match="operands: 'nope' not operand DaemonSets"):
        G.plan_pause(node, present=[], operands=['nope'])


def test_plan_pause_rerun_keeps_the_record_and_resume_sets_back_only_what_is_still_paused():
    record = {'labels': {'nvidia.com/gpu.deploy.device-plugin': 'true', 'nvidia.com/gpu.deploy.dcgm-exporter': 'true'},
              'operands': ['nvidia-dcgm-exporter', 'nvidia-device-plugin-daemonset']}
    node = node_obj({'nvidia.com/gpu.deploy.device-plugin': G.PAUSE_VALUE,
                     'nvidia.com/gpu.deploy.dcgm-exporter': 'false'},       # changed by someone since
                    {G.PAUSED_ANNOTATION: json.dumps(record)})
    again = G.plan_pause(node, present=[])
    assert again['changed'] is False and again['patch'] is None and again['operands'] == record['operands']
    resume = G.plan_resume(node)
    assert resume['patch']['metadata']['labels'] == {'nvidia.com/gpu.deploy.device-plugin': 'true'}
    assert resume['patch']['metadata']['annotations'] == {G.PAUSED_ANNOTATION: None}
    assert resume['operands'] == record['operands']
    assert G.plan_resume(node_obj({}))['changed'] is False
    with pytest.raises(G.GpuOperatorError, match='is not what a pause records'):
        G.plan_resume(node_obj({}, {G.PAUSED_ANNOTATION: '["x"]'}))


def test_node_paused_waits_for_every_pod_of_the_paused_operands():
    st = {'nodes': {'gpu-1': [{'operand': 'nvidia-dcgm-exporter', 'pod': 'e', 'phase': 'Running'},
                              {'operand': 'nvidia-container-toolkit-daemonset', 'pod': 't', 'phase': 'Running'}]}}
    done, waiting = G.node_paused(st, 'gpu-1', ['nvidia-dcgm-exporter'])
    assert not done and waiting == ['nvidia-dcgm-exporter: pod e still on gpu-1 (Running)']
    assert G.node_paused(st, 'gpu-1', ['nvidia-dcgm'])[0] is True


def test_drivers_of_reads_each_pool_and_sorts_by_name():
    drivers = [
        {'metadata': {'name': 'h100-pool'}, 'spec': {
            'driverType': 'gpu', 'repository': 'nvcr.io/nvidia', 'image': 'driver', 'version': '580.130.00',
            'nodeSelector': {'gpufleet.io/model': 'h100'}, 'usePrecompiled': False, 'useOpenKernelModules': True,
            'tolerations': [{'key': 'gpufleet.io/canary', 'operator': 'Exists'}]},
         'status': {'state': 'ready'}},
        {'metadata': {'name': 'a100-pool'}, 'spec': {'driverType': 'gpu', 'image': 'driver', 'version': '580'}},
    ]
    out = G.drivers_of(drivers)
    assert [d['name'] for d in out] == ['a100-pool', 'h100-pool']
    assert out[1] == {'name': 'h100-pool', 'driver_type': 'gpu', 'version': '580.130.00',
                      'image': 'nvcr.io/nvidia/driver:580.130.00', 'node_selector': {'gpufleet.io/model': 'h100'},
                      'use_precompiled': False, 'use_open_kernel_modules': True, 'state': 'ready',
                      'tolerations': [{'key': 'gpufleet.io/canary', 'operator': 'Exists'}]}
    assert out[0]['tolerations'] == []
    assert out[0]['state'] is None and out[0]['image'] == 'driver:580' and out[0]['node_selector'] == {}
    assert G.drivers_of([]) == []


class _Client:
    def __init__(self, exc=None, items=()):
        self.exc, self.items, self.paths = exc, list(items), []

    def list_all(self, path):
        self.paths.append(path)
        if self.exc:
            raise self.exc
        return self.items


class _ApiError(Exception):
    def __init__(self, status):
        super().__init__('HTTP %d' % status)
        self.status = status


def test_read_drivers_is_empty_where_the_api_is_not_served_and_raises_other_errors():
    client = _Client(items=[{'metadata': {'name': 'x'}}])
    assert G.read_drivers(client) == [{'metadata': {'name': 'x'}}]
    assert client.paths == [G.NVIDIADRIVERS_PATH]
    assert G.read_drivers(_Client(exc=_ApiError(404))) == []
    with pytest.raises(_ApiError):
        G.read_drivers(_Client(exc=_ApiError(403)))


CANARY_TAINT = {'key': 'gpufleet.io/canary', 'value': 'true', 'effect': 'NoSchedule'}
CANARY_TOLERATION = {'key': 'gpufleet.io/canary', 'operator': 'Exists', 'effect': 'NoSchedule'}


@pytest.mark.parametrize('tolerations, taint, expected', [
    ([{'key': 'gpufleet.io/canary', 'operator': 'Exists'}], CANARY_TAINT, True),
    ([CANARY_TOLERATION], dict(CANARY_TAINT, effect='NoExecute'), False),
    ([{'operator': 'Exists'}], CANARY_TAINT, True),
    ([{'key': 'gpufleet.io/canary', 'value': 'true'}], CANARY_TAINT, True),
    ([{'key': 'gpufleet.io/canary', 'value': 'false'}], CANARY_TAINT, False),
    ([{'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}], CANARY_TAINT, False),
    ([], CANARY_TAINT, False),
])
def test_tolerates_as_the_scheduler_matches(tolerations, taint, expected):
    assert G.tolerates(tolerations, taint) is expected


def test_untolerated_names_each_operand_and_taint_and_ignores_what_daemonsets_always_tolerate():
    node = {'metadata': {'name': 'gpu-01'}, 'spec': {'unschedulable': True, 'taints': [
        CANARY_TAINT, {'key': 'node.kubernetes.io/unschedulable', 'effect': 'NoSchedule'},
        {'key': 'example.com/soft', 'effect': 'PreferNoSchedule'}]}}
    exporter = daemonset('nvidia-dcgm-exporter', DCGM_IMAGE)
    plugin = daemonset('nvidia-device-plugin-daemonset', 'plugin:1')
    plugin['spec']['template']['spec']['tolerations'] = [CANARY_TOLERATION]
    assert G.untolerated(node, [exporter, plugin], ['nvidia-dcgm-exporter', 'nvidia-device-plugin-daemonset']) == [
        'nvidia-dcgm-exporter does not tolerate the taint gpufleet.io/canary=true:NoSchedule of gpu-01']
    assert G.untolerated(node, [exporter, plugin], ['nvidia-device-plugin-daemonset']) == []
    assert G.untolerated({'metadata': {'name': 'n'}, 'spec': {}}, [exporter], ['nvidia-dcgm-exporter']) == []


def test_plan_change_appends_tolerations_to_the_values_or_to_the_charts_default():
    after, _restore = G.plan_change({'daemonsets': {'tolerations': [{'key': 'a', 'operator': 'Exists'}]}},
                                    {'tolerations': [CANARY_TOLERATION]})
    assert after['daemonsets']['tolerations'] == [{'key': 'a', 'operator': 'Exists'}, CANARY_TOLERATION]
    again, _restore = G.plan_change(after, {'tolerations': [CANARY_TOLERATION]})
    assert again['daemonsets']['tolerations'] == after['daemonsets']['tolerations']
    default, _restore = G.plan_change({}, {'tolerations': [CANARY_TOLERATION]})
    assert default['daemonsets']['tolerations'] == list(G.CHART_TOLERATIONS) + [CANARY_TOLERATION]
    with pytest.raises(G.GpuOperatorError, match='tolerations: .* is not a toleration with a key'):
        G.plan_change({}, {'tolerations': [{'operator': 'Exists'}]})


# -- a node's operands back at a snapshot's revisions (plan_back / plan_forward) -----------------

DS_DCGM = 'nvidia-dcgm-exporter'
DS_VAL = 'nvidia-operator-validator'
DEPLOY_DCGM = 'nvidia.com/gpu.deploy.dcgm-exporter'
DEPLOY_VAL = 'nvidia.com/gpu.deploy.operator-validator'
DEPLOY_GFD = 'nvidia.com/gpu.deploy.gpu-feature-discovery'
NODE_UID = 'uid-node-gpu-1'
GPU_TOLERATION = {'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}


def revision_with_data(ds_name, number, hash_, image='img', selector=None, tolerations=None, owner_uid=None):
    """A ControllerRevision with the `data` the DaemonSet controller writes (the template, '$patch': replace)."""
    rev = revision(ds_name, number, hash_, owner_uid=owner_uid)
    deploy = 'nvidia.com/gpu.deploy.%s' % G.OPERANDS.get(ds_name, ('driver', 'driver'))[1]
    rev['data'] = {'spec': {'template': {
        'metadata': {'labels': {'app': ds_name}, 'annotations': {'kubectl.kubernetes.io/default-container': 'main'}},
        'spec': {'nodeSelector': dict(selector) if selector is not None else {deploy: 'true',
                                                                              'kubernetes.io/os': 'linux'},
                 'containers': [{'name': 'main', 'image': image}],
                 'tolerations': copy.deepcopy(tolerations) if tolerations is not None else [
                     dict(GPU_TOLERATION), dict(G.DAEMONSET_TOLERATIONS[0])]},
        '$patch': 'replace'}}}
    return rev


def back_node(labels, annotations=None):
    node = node_obj(labels, annotations)
    node['metadata']['uid'] = NODE_UID
    return node


def as_running(p, ready=True, phase='Running'):
    """A created back pod as the API shows it once the kubelet runs it."""
    p = copy.deepcopy(p)
    p['status'] = {'phase': phase, 'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False'}]}
    return p


def back_objs(pods=None):
    """dcgm-exporter's current revision is ccc (aaa and bbb still kept); the validator's is vvv; gpu-1
    runs dcgm-exporter at ccc (after the upgrade) and the validator at vvv."""
    dss = [daemonset(DS_DCGM, DCGM_IMAGE), daemonset(DS_VAL, 'validator:v1')]
    revs = [revision_with_data(DS_DCGM, 1, 'aaa', image='dcgm:old'), revision_with_data(DS_DCGM, 3, 'ccc'),
            revision_with_data(DS_DCGM, 2, 'bbb'), revision_with_data(DS_VAL, 1, 'vvv'),
            revision_with_data(DS_DCGM, 9, 'zzz', owner_uid='uid-an-older-incarnation')]
    if pods is None:
        pods = [pod(DS_DCGM, 'gpu-1', 'ccc'), pod(DS_VAL, 'gpu-1', 'vvv'), pod(DS_DCGM, 'gpu-2', 'ccc')]
    return objs(dss=dss, revs=revs, pods=pods)


def _rev(o, ds_name, hash_):
    return next(r for r in o['revisions'] if r['metadata']['name'] == '%s-%s' % (ds_name, hash_)
                and r['metadata']['ownerReferences'][0]['uid'] == 'uid-' + ds_name)


def _dcgm_back_pod(o, node=None, hash_='aaa', ready=True):
    node = node if node is not None else back_node({DEPLOY_DCGM: G.BACK_VALUE})
    return as_running(G.back_pod(o['daemonsets'][0], _rev(o, DS_DCGM, hash_), node, hash_), ready=ready)


def test_snapshot_revisions_per_node_skips_back_pods_and_unknown_nodes():
    snap = state(scenario())
    assert G.snapshot_revisions(snap, 'gpu-1') == {DS_DCGM: 'aaa', DS_VAL: 'vvv'}
    assert G.snapshot_revisions(snap, 'gpu-2') == {DS_DCGM: 'ccc'}
    assert G.snapshot_revisions(snap, 'gpu-9') == {}
    assert G.snapshot_revisions(None, 'gpu-1') == {}
    assert G.snapshot_revisions({}, 'gpu-1') == {}
    # a rollback's pod listed first is not what the node ran
    manual = {'nodes': {'gpu-1': [{'operand': DS_DCGM, 'pod': 'x', 'revision': 'old', 'back': True},
                                  {'operand': DS_DCGM, 'pod': 'y', 'revision': 'ccc', 'back': False},
                                  {'operand': DS_VAL, 'pod': 'z', 'revision': None}]}}
    assert G.snapshot_revisions(manual, 'gpu-1') == {DS_DCGM: 'ccc'}
    # from read_state: a node running only a back pod has nothing to go back to
    o = back_objs(pods=[])
    o['pods'] = [_dcgm_back_pod(o)]
    assert G.snapshot_revisions(state(o), 'gpu-1') == {}


def test_read_state_marks_back_pods_and_node_restarts_and_node_paused_ignore_them():
    o = back_objs()
    bp = _dcgm_back_pod(o, hash_='ccc')                                   # even at the current revision
    bp_aaa = _dcgm_back_pod(o)
    bp_aaa['metadata']['name'] = 'other-back'
    with_ds_owner = pod(DS_DCGM, 'gpu-1', 'aaa')                          # label but a DaemonSet's pod
    with_ds_owner['metadata']['labels'][G.BACK_LABEL] = DS_DCGM
    stray = copy.deepcopy(bp_aaa)                                         # label naming no operand DaemonSet
    stray['metadata']['name'] = 'stray'
    stray['metadata']['labels'][G.BACK_LABEL] = 'not-an-operand'
    o['pods'] = [bp, bp_aaa, with_ds_owner, stray, pod(DS_VAL, 'gpu-1', 'vvv')]
    s = state(o)
    by_pod = {p['pod']: p for p in s['nodes']['gpu-1']}
    assert set(by_pod) == {bp['metadata']['name'], 'other-back', with_ds_owner['metadata']['name'],
                           'nvidia-operator-validator-vvv-gpu-1'}
    assert by_pod[bp['metadata']['name']]['back'] is True and by_pod['other-back']['back'] is True
    assert by_pod[bp['metadata']['name']]['operand'] == DS_DCGM
    assert by_pod[bp['metadata']['name']]['current'] is False             # a back pod is never current
    assert by_pod[bp['metadata']['name']]['ready'] is True
    assert by_pod[with_ds_owner['metadata']['name']]['back'] is False
    assert by_pod['nvidia-operator-validator-vvv-gpu-1']['back'] is False
    # node_restarts: only the DaemonSet's own old pod, never the back pods
    assert [p['pod'] for p in G.node_restarts(s, 'gpu-1')] == [with_ds_owner['metadata']['name']]
    # node_paused: back pods do not keep a pause waiting
    only_back = back_objs(pods=[bp])
    assert G.node_paused(state(only_back), 'gpu-1', [DS_DCGM]) == (True, [])
    assert G.node_restarts(state(only_back), 'gpu-1') == []
    done, waiting = G.node_paused(s, 'gpu-1', [DS_DCGM])
    assert not done and waiting == ['%s: pod %s still on gpu-1 (Running)' % (DS_DCGM, with_ds_owner['metadata']['name'])]


def test_back_pod_is_the_revisions_template_bound_to_the_node_and_controlled_by_it():
    o = back_objs()
    cr = _rev(o, DS_DCGM, 'aaa')
    before = copy.deepcopy(cr)
    node = back_node({DEPLOY_DCGM: 'true'})
    p = G.back_pod(o['daemonsets'][0], cr, node, 'aaa')
    assert cr == before                                                   # the revision is not changed
    assert p['apiVersion'] == 'v1' and p['kind'] == 'Pod'
    assert p['metadata']['name'] == G.back_pod_name(DS_DCGM, 'gpu-1') == 'nvidia-dcgm-exporter-back-gpu-1'
    assert p['metadata']['namespace'] == NS
    assert p['metadata']['labels'] == {'app': DS_DCGM, 'controller-revision-hash': 'aaa', G.BACK_LABEL: DS_DCGM}
    assert p['metadata']['annotations'] == {'kubectl.kubernetes.io/default-container': 'main'}
    assert p['metadata']['ownerReferences'] == [{'apiVersion': 'v1', 'kind': 'Node', 'name': 'gpu-1',
                                                 'uid': NODE_UID, 'controller': True}]
    spec = p['spec']
    assert spec['nodeName'] == 'gpu-1'
    assert spec['nodeSelector'] == {'kubernetes.io/os': 'linux'}          # the deploy label no longer selects it
    assert spec['containers'] == [{'name': 'main', 'image': 'dcgm:old'}]
    assert '$patch' not in spec and '$patch' not in p and '$patch' not in p['metadata']
    assert spec['tolerations'][:2] == [GPU_TOLERATION, G.DAEMONSET_TOLERATIONS[0]]
    for tol in G.DAEMONSET_TOLERATIONS:
        assert spec['tolerations'].count(tol) == 1
    assert len(spec['tolerations']) == 1 + len(G.DAEMONSET_TOLERATIONS)
    # only deploy labels in the selector: no selector at all; no tolerations: the DaemonSet's
    deploy_only = {DEPLOY_DCGM: 'true', 'nvidia.com/gpu.deploy.driver': 'true'}
    only_deploy = revision_with_data(DS_DCGM, 1, 'aaa', selector=deploy_only, tolerations=[])
    p2 = G.back_pod(o['daemonsets'][0], only_deploy, node, 'aaa')
    assert 'nodeSelector' not in p2['spec']
    assert p2['spec']['tolerations'] == [dict(t) for t in G.DAEMONSET_TOLERATIONS]
    # the labels the caller's revision wins over a stale hash in the template
    stale = revision_with_data(DS_DCGM, 1, 'aaa')
    stale['data']['spec']['template']['metadata']['labels']['controller-revision-hash'] = 'other'
    assert G.back_pod(o['daemonsets'][0], stale, node, 'aaa')['metadata']['labels']['controller-revision-hash'] == 'aaa'


@pytest.mark.parametrize('data', [None, {}, {'spec': {}}, {'spec': {'template': {'$patch': 'replace'}}},
                                  {'spec': {'template': {'metadata': {'labels': {'a': 'b'}}, 'spec': {}}}}])
def test_back_pod_refuses_a_revision_without_a_template(data):
    cr = revision(DS_DCGM, 1, 'aaa')
    if data is not None:
        cr['data'] = data
    with pytest.raises(G.GpuOperatorError, match='ControllerRevision nvidia-dcgm-exporter-aaa holds no pod template'):
        G.back_pod(daemonset(DS_DCGM, DCGM_IMAGE), cr, back_node({}), 'aaa')


def test_back_pod_name_is_bounded():
    assert G.back_pod_name('a', 'n') == 'a-back-n'
    long_name = G.back_pod_name('x' * 200, 'y' * 200)
    assert len(long_name) <= 253 and long_name.startswith('x' * 200 + '-back-')
    assert not G.back_pod_name('x' * 247, 'node').endswith('-')


def test_plan_back_takes_one_operand_back_and_records_the_labels_and_revisions():
    o = back_objs()
    node = back_node({DEPLOY_DCGM: 'true', DEPLOY_VAL: 'true', 'other': 'x'})
    plan = G.plan_back(node, o, {DS_DCGM: 'aaa', DS_VAL: 'vvv'})           # vvv is the validator's current
    assert plan['changed'] is True
    assert plan['patch']['metadata']['labels'] == {DEPLOY_DCGM: G.BACK_VALUE}
    record = json.loads(plan['patch']['metadata']['annotations'][G.BACK_ANNOTATION])
    assert record == {'labels': {DEPLOY_DCGM: 'true'}, 'operands': {DS_DCGM: 'aaa'}}
    assert plan['operands'] == {DS_DCGM: 'aaa'} and plan['labels'] == [DEPLOY_DCGM]
    assert len(plan['pods']) == 1
    created = plan['pods'][0]
    assert created == G.back_pod(o['daemonsets'][0], _rev(o, DS_DCGM, 'aaa'), node, 'aaa')
    assert created['metadata']['labels']['controller-revision-hash'] == 'aaa'
    assert created['spec']['containers'][0]['image'] == 'dcgm:old'
    assert node['metadata']['labels'][DEPLOY_DCGM] == 'true'                # input untouched
    # the revision found by the revision's name when it carries no hash label
    del _rev(o, DS_DCGM, 'aaa')['metadata']['labels']['controller-revision-hash']
    assert len(G.plan_back(node, o, {DS_DCGM: 'aaa'})['pods']) == 1


def test_plan_back_leaves_alone_what_already_runs_the_revision():
    # the node's DaemonSet pod still at aaa (the node never moved): nothing to take back
    o = back_objs(pods=[pod(DS_DCGM, 'gpu-1', 'aaa'), pod(DS_VAL, 'gpu-1', 'vvv')])
    node = back_node({DEPLOY_DCGM: 'true', DEPLOY_VAL: 'true'})
    plan = G.plan_back(node, o, {DS_DCGM: 'aaa'})
    assert plan == {'patch': None, 'pods': [], 'operands': {}, 'labels': [], 'changed': False}
    # the requested revision is the DaemonSet's current one (even with no pod on the node)
    o = back_objs(pods=[])
    plan = G.plan_back(node, o, {DS_DCGM: 'ccc', DS_VAL: 'vvv'})
    assert plan['changed'] is False and plan['pods'] == [] and plan['patch'] is None
    assert G.plan_back(node, o, {})['changed'] is False


@pytest.mark.parametrize('revisions, labels, msg', [
    ({'nope': 'aaa'}, {}, "revisions: 'nope' is not an operand DaemonSet"),
    ({'gpu-feature-discovery': 'g1'}, {}, "revisions: 'gpu-feature-discovery' is not an operand DaemonSet"),
    ({DS_DCGM: 'ddd'}, {}, 'DaemonSet nvidia-dcgm-exporter no longer keeps revision ddd'),
    ({DS_DCGM: 'zzz'}, {}, 'DaemonSet nvidia-dcgm-exporter no longer keeps revision zzz'),   # another uid's
    ({DS_DCGM: 'aaa'}, {DEPLOY_DCGM: 'false'}, "label nvidia.com/gpu.deploy.dcgm-exporter is 'false'"),
    ({DS_DCGM: 'aaa'}, {DEPLOY_DCGM: None}, "label nvidia.com/gpu.deploy.dcgm-exporter is None"),
    ({DS_DCGM: 'aaa'}, {DEPLOY_DCGM: G.PAUSE_VALUE}, 'label nvidia.com/gpu.deploy.dcgm-exporter is'),
    ({DS_DCGM: 'aaa', DS_VAL: 'gone'}, {}, 'DaemonSet nvidia-operator-validator no longer keeps revision gone'),
    ({DS_DCGM: ''}, {}, 'revisions.nvidia-dcgm-exporter'),
])
def test_plan_back_refuses_before_planning_anything(revisions, labels, msg):
    o = back_objs()
    node_labels = {DEPLOY_DCGM: 'true', DEPLOY_VAL: 'true'}
    for k, v in labels.items():
        if v is None:
            node_labels.pop(k)
        else:
            node_labels[k] = v
    node = back_node(node_labels)
    before = copy.deepcopy((o, node))
    with pytest.raises(G.GpuOperatorError, match=re.escape(msg)) as err:
        G.plan_back(node, o, revisions)
    if 'not an operand' not in msg and 'revisions.' not in msg:
        assert 'nothing was changed' in str(err.value)
    assert (o, node) == before


def test_plan_back_refuses_a_non_mapping():
    with pytest.raises(G.GpuOperatorError, match='revisions: expected a mapping'):
        G.plan_back(back_node({}), back_objs(), [DS_DCGM])


def test_plan_back_rerun_after_the_back_pod_runs_plans_nothing():
    o = back_objs()
    node = back_node({DEPLOY_DCGM: 'true', DEPLOY_VAL: 'true'})
    first = G.plan_back(node, o, {DS_DCGM: 'aaa'})
    applied = back_node({DEPLOY_DCGM: G.BACK_VALUE, DEPLOY_VAL: 'true'},
                        first['patch']['metadata']['annotations'])
    # the DaemonSet's pod has left, the back pod runs Ready
    o['pods'] = [as_running(first['pods'][0]), pod(DS_VAL, 'gpu-1', 'vvv')]
    again = G.plan_back(applied, o, {DS_DCGM: 'aaa'})
    assert again['changed'] is False and again['pods'] == [] and again['patch'] is None
    assert again['operands'] == {DS_DCGM: 'aaa'} and again['labels'] == [DEPLOY_DCGM]
    # while the DaemonSet's pod still leaves: no second back pod either
    o['pods'].append(pod(DS_DCGM, 'gpu-1', 'ccc', deleting=True))
    assert G.plan_back(applied, o, {DS_DCGM: 'aaa'})['pods'] == []
    # the label set, the record written, but the back pod not created yet (a failed create): it is planned
    o['pods'] = [pod(DS_VAL, 'gpu-1', 'vvv')]
    retry = G.plan_back(applied, o, {DS_DCGM: 'aaa'})
    assert [p['metadata']['name'] for p in retry['pods']] == [G.back_pod_name(DS_DCGM, 'gpu-1')]
    assert retry['changed'] is True and retry['patch'] is None          # the record is already there


def test_node_back_settled_waits_for_the_daemonsets_pod_to_leave_and_the_back_pod_to_be_ready():
    o = back_objs()
    bp = _dcgm_back_pod(o)
    revs = {DS_DCGM: 'aaa'}
    o['pods'] = [pod(DS_DCGM, 'gpu-1', 'ccc'), bp]
    done, waiting = G.node_back_settled(state(o), 'gpu-1', revs)
    assert not done and waiting == ["nvidia-dcgm-exporter: 2 pods on gpu-1 (the DaemonSet's is still leaving)"]
    o['pods'] = [bp]
    assert G.node_back_settled(state(o), 'gpu-1', revs) == (True, [])
    o['pods'] = [_dcgm_back_pod(o, ready=False)]
    done, waiting = G.node_back_settled(state(o), 'gpu-1', revs)
    assert not done and waiting == ['nvidia-dcgm-exporter: no Ready pod at revision aaa on gpu-1 yet (pods: '
                                    'nvidia-dcgm-exporter-back-gpu-1 at aaa (ours) Running, not Ready)']
    o['pods'] = [pod(DS_DCGM, 'gpu-1', 'ccc')]                              # only the DaemonSet's (new) pod
    done, waiting = G.node_back_settled(state(o), 'gpu-1', revs)
    assert not done and waiting[0].endswith('(pods: %s at ccc Ready)' % o['pods'][0]['metadata']['name'])
    o['pods'] = []
    assert G.node_back_settled(state(o), 'gpu-1', revs)[1][0].endswith('(pods: none)')
    assert G.node_back_settled(state(o), 'gpu-1', revs)[0] is False
    assert G.node_back_settled(state(o), 'gpu-1', {}) == (True, [])


def test_plan_forward_nothing_without_a_record_or_back_pods():
    o = back_objs()
    plan = G.plan_forward(back_node({DEPLOY_DCGM: 'true'}), state(o))
    assert plan == {'patch': None, 'delete': [], 'operands': [], 'changed': False}
    assert G.plan_forward(back_node({}), state(back_objs(pods=[])))['changed'] is False


def test_plan_forward_sets_back_only_what_is_still_ours_and_deletes_the_back_pods():
    record = {'labels': {DEPLOY_DCGM: 'true', DEPLOY_GFD: 'true'},
              'operands': {DS_DCGM: 'aaa', 'gpu-feature-discovery': 'g1'}}
    node = back_node({DEPLOY_DCGM: G.BACK_VALUE, DEPLOY_GFD: 'false'},          # gfd changed by someone since
                     {G.BACK_ANNOTATION: json.dumps(record)})
    o = back_objs()
    bp = _dcgm_back_pod(o)
    o['pods'] = [bp, pod(DS_VAL, 'gpu-1', 'vvv'), pod(DS_DCGM, 'gpu-2', 'ccc')]
    plan = G.plan_forward(node, state(o))
    assert plan['changed'] is True
    assert plan['patch'] == {'metadata': {'labels': {DEPLOY_DCGM: 'true'}, 'annotations': {G.BACK_ANNOTATION: None}}}
    assert plan['delete'] == [bp['metadata']['name']] == [G.back_pod_name(DS_DCGM, 'gpu-1')]
    assert plan['operands'] == sorted([DS_DCGM, 'gpu-feature-discovery'])
    # back pods left without a record (the annotation removed by hand): still deleted, nothing to patch
    plan = G.plan_forward(back_node({DEPLOY_DCGM: 'true'}), state(o))
    assert plan == {'patch': None, 'delete': [bp['metadata']['name']], 'operands': [DS_DCGM], 'changed': True}
    # the record without pods (the pods already deleted): the labels and the record still go
    o['pods'] = []
    plan = G.plan_forward(node, state(o))
    assert plan['delete'] == [] and plan['changed'] is True
    assert plan['patch']['metadata']['annotations'] == {G.BACK_ANNOTATION: None}


def test_plan_back_then_plan_forward_round_trip():
    o = back_objs()
    node = back_node({DEPLOY_DCGM: 'true', DEPLOY_VAL: 'true'})
    back = G.plan_back(node, o, {DS_DCGM: 'aaa'})
    applied = back_node({DEPLOY_DCGM: G.BACK_VALUE, DEPLOY_VAL: 'true'}, back['patch']['metadata']['annotations'])
    o['pods'] = [as_running(back['pods'][0]), pod(DS_VAL, 'gpu-1', 'vvv')]
    forward = G.plan_forward(applied, state(o))
    assert forward['patch']['metadata']['labels'] == {DEPLOY_DCGM: 'true'}
    assert forward['delete'] == [back['pods'][0]['metadata']['name']]
    assert forward['operands'] == [DS_DCGM]


@pytest.mark.parametrize('raw', ['{not json', '["x"]', '{"labels": {}}', '{"operands": {}}',
                                 '{"labels": [], "operands": {}}', '{"labels": {}, "operands": ["a"]}'])
def test_a_malformed_back_record_is_refused(raw):
    node = back_node({DEPLOY_DCGM: G.BACK_VALUE}, {G.BACK_ANNOTATION: raw})
    o = back_objs()
    with pytest.raises(G.GpuOperatorError, match=re.escape('annotation %s of node gpu-1' % G.BACK_ANNOTATION)):
        G.plan_forward(node, state(o))
    with pytest.raises(G.GpuOperatorError, match=re.escape(G.BACK_ANNOTATION)):
        G.plan_back(node, o, {DS_DCGM: 'aaa'})


# -- driver_version ------------------------------------------------------------------------------
def test_plan_change_sets_the_driver_version():
    values = cluster_policy()['spec']
    after, _restore = G.plan_change(values, {'driver_version': '570.124.06'})
    assert after['driver']['version'] == '570.124.06' and after['driver']['enabled'] is True
    assert 'version' not in values['driver']                              # input untouched
    after, _restore = G.plan_change({}, {'driver_version': 570})
    assert after['driver']['version'] == '570'
    assert 'version' not in G.plan_change(values, {'driver_version': ''})[0]['driver']


@pytest.mark.parametrize('driver', [{'enabled': False}, {}, None])
def test_plan_cluster_refuses_a_driver_version_the_operator_does_not_manage(driver):
    spec = cluster_policy()['spec']
    if driver is None:
        spec.pop('driver')
    else:
        spec['driver'] = driver
    cp = cluster_policy(spec=spec)
    for chart in (None, helm_chart({'driver': {'enabled': True}})):
        with pytest.raises(G.GpuOperatorError) as err:
            G.plan_cluster(objs(cp=cp, chart=chart), {'driver_version': '570.124.06'})
        assert str(err.value).startswith('driver_version:')
        assert "'570.124.06'" in str(err.value) and 'nothing was changed' in str(err.value)
    # without a driver_version the same ClusterPolicy is changed
    assert G.plan_cluster(objs(cp=cp), {'dcgm_exporter_version': NEW_DCGM})['changed'] is True


def test_plan_cluster_with_an_operator_managed_driver_carries_the_version():
    plan = G.plan_cluster(objs(), {'driver_version': '570.124.06'})
    assert plan['kind'] == 'ClusterPolicy'
    assert plan['values']['driver']['version'] == '570.124.06'
    assert plan['patch']['spec']['driver']['version'] == '570.124.06'
    assert plan['values']['driver']['upgradePolicy']['autoUpgrade'] is False
    chart = helm_chart({'driver': {'enabled': True}})
    plan = G.plan_cluster(objs(chart=chart), {'driver_version': '570.124.06'})
    assert plan['kind'] == 'HelmChart'
    assert yaml.safe_load(plan['patch']['spec']['valuesContent'])['driver']['version'] == '570.124.06'
    assert plan['values']['driver']['version'] == '570.124.06'


def test_plan_back_refuses_a_second_rollback_to_another_revision_and_records_a_label_left_at_back_value():
    """A node already taken back to `aaa` is not taken to `bbb` (or the current revision) over it: the pod name
    would clash and the first record would be lost; and a BACK_VALUE label with no record is still recorded,
    so the next window sets it back."""
    o = back_objs()
    node = back_node({DEPLOY_DCGM: 'true'})
    first = G.plan_back(node, o, {DS_DCGM: 'aaa'})
    node['metadata']['labels'].update(first['patch']['metadata']['labels'])
    node['metadata'].setdefault('annotations', {}).update(first['patch']['metadata']['annotations'])
    o['pods'] = [p for p in o['pods'] if not (p['spec'].get('nodeName') == 'gpu-1'
                                              and p['metadata']['name'].startswith(DS_DCGM))]
    o['pods'].append(as_running(first['pods'][0]))
    for rev in ('bbb', 'ccc'):
        with pytest.raises(G.GpuOperatorError, match='from an earlier rollback'):
            G.plan_back(node, o, {DS_DCGM: rev})
    del node['metadata']['annotations'][G.BACK_ANNOTATION]
    again = G.plan_back(node, o, {DS_DCGM: 'aaa'})
    record = json.loads(again['patch']['metadata']['annotations'][G.BACK_ANNOTATION])
    assert record['labels'] == {DEPLOY_DCGM: 'true'}, record
    assert again['pods'] == []


def test_reconciled_takes_the_driver_image_with_the_os_tag_the_operator_appends():
    values = {'driver': {'repository': 'nvcr.io/nvidia', 'image': 'driver', 'version': '580.159.03'}}
    state = {'cluster_policy': {'name': 'cluster-policy', 'error': None}, 'operands': [
        {'name': 'nvidia-driver-daemonset', 'component': 'driver', 'image': 'nvcr.io/nvidia/driver:580.159.03-ubuntu22.04',
         'generation': 2, 'observed_generation': 2, 'update_strategy': 'OnDelete'}]}
    assert G.reconciled(state, values) == (True, [])
    state['operands'][0]['image'] = 'nvcr.io/nvidia/driver:580.126.20-ubuntu22.04'
    done, waiting = G.reconciled(state, values)
    assert not done and 'not nvcr.io/nvidia/driver:580.159.03' in waiting[0]
    state['operands'][0]['image'] = 'nvcr.io/nvidia/driver:580.159.031-ubuntu22.04'
    assert G.reconciled(state, values)[0] is False


# -- per-pool drivers (NVIDIADriver objects, driver.useNvidiaDriverCRD) ---------------------------
POOL_DS = 'nvidia-gpu-driver-ubuntu22.04-7c9d5b6f8'


def nvidia_driver(name='h100-pool', version='580.126.20', tolerations=None):
    spec = {'driverType': 'gpu', 'repository': 'nvcr.io/nvidia', 'image': 'driver', 'version': version,
            'nodeSelector': {'gpufleet.io/pool': name}}
    if tolerations is not None:
        spec['tolerations'] = tolerations
    return {'apiVersion': 'nvidia.com/v1alpha1', 'kind': 'NVIDIADriver', 'metadata': {'name': name, 'uid': 'uid-nvd-' + name},
            'spec': spec}


def pool_daemonset(name=POOL_DS, driver='h100-pool', version='580.126.20', label='driver'):
    """What the operator's NVIDIADriver controller renders: owned by the NVIDIADriver, always OnDelete."""
    ds = daemonset(name, 'nvcr.io/nvidia/driver:%s-ubuntu22.04' % version, owned=False)
    ds['metadata']['ownerReferences'] = [{'apiVersion': 'nvidia.com/v1alpha1', 'kind': 'NVIDIADriver', 'name': driver,
                                          'uid': 'uid-nvd-' + driver, 'controller': True}]
    ds['spec']['template']['spec']['nodeSelector'] = {'nvidia.com/gpu.deploy.%s' % label: 'true',
                                                      'nvidia.com/gpu.present': 'true'}
    return ds


def crd_objs(drivers=None, cp_driver=None, pods=(), revs=None, dss=None):
    spec = cluster_policy()['spec']
    spec['driver'] = dict(spec['driver'], useNvidiaDriverCRD=True, version='570.0.0', **(cp_driver or {}))
    o = objs(cp=cluster_policy(spec=spec),
             dss=dss if dss is not None else [daemonset('nvidia-dcgm-exporter', DCGM_IMAGE), pool_daemonset()],
             revs=revs if revs is not None else [revision(POOL_DS, 1, 'd01')], pods=pods)
    o['drivers'] = drivers if drivers is not None else [nvidia_driver()]
    return o


def test_read_state_takes_a_per_pool_driver_daemonset_as_the_driver_operand():
    st = state(crd_objs(pods=[pod(POOL_DS, 'gpu-1', 'd01')]))
    op = next(o for o in st['operands'] if o['name'] == POOL_DS)
    assert (op['component'], op['deploy_label'], op['nvidia_driver']) == (
        'driver', 'nvidia.com/gpu.deploy.driver', 'h100-pool')
    assert next(o for o in st['operands'] if o['name'] == 'nvidia-dcgm-exporter')['nvidia_driver'] is None
    assert st['nodes']['gpu-1'] == [{'operand': POOL_DS, 'pod': '%s-d01-gpu-1' % POOL_DS, 'revision': 'd01',
                                     'image': 'img', 'phase': 'Running', 'ready': True, 'current': True, 'back': False}]
    assert st['cluster_policy']['driver_crd'] is True and state(objs())['cluster_policy']['driver_crd'] is False
    vgpu = pool_daemonset('nvidia-vgpu-manager-ubuntu22.04-1', label='vgpu-manager')
    st = state(crd_objs(dss=[vgpu]))
    assert st['operands'][0]['deploy_label'] == 'nvidia.com/gpu.deploy.vgpu-manager'


def test_operand_names_lets_the_driver_daemonset_name_stand_for_every_driver_daemonset():
    st = state(crd_objs())
    assert G.operand_names(st, None) is None
    assert G.operand_names(st, ['nvidia-driver-daemonset']) == ['nvidia-driver-daemonset', POOL_DS]
    assert G.operand_names(st, ['nvidia-dcgm-exporter']) == ['nvidia-dcgm-exporter']


def test_plan_cluster_sends_the_driver_version_to_the_one_nvidiadriver_and_leaves_driver_version_alone():
    o = crd_objs(drivers=[nvidia_driver(tolerations=[dict(GPU_TOLERATION)])])
    canary = {'key': 'gpufleet.io/canary', 'operator': 'Exists', 'effect': 'NoSchedule'}
    plan = G.plan_cluster(o, {'driver_version': '580.159.03', 'tolerations': [canary]})
    assert plan['values']['driver']['version'] == '570.0.0'            # not what runs: untouched
    (drv,) = plan['drivers']
    assert drv['path'] == G.NVIDIADRIVERS_PATH + '/h100-pool'
    assert drv['patch'] == {'spec': {'version': '580.159.03', 'tolerations': [GPU_TOLERATION, canary]}}
    assert drv['undo'] == {'spec': {'version': '580.126.20', 'tolerations': [GPU_TOLERATION]}}
    assert plan['before']['nvidia_drivers'] == {'h100-pool': {'version': '580.126.20', 'tolerations': [GPU_TOLERATION]}}
    assert plan['after']['nvidia_drivers']['h100-pool']['version'] == '580.159.03'
    assert plan['changed'] is True
    # Already there: nothing to write to it; a ClusterPolicy without the CRD gets no driver plans.
    o['drivers'] = [nvidia_driver(version='580.159.03', tolerations=[dict(GPU_TOLERATION), canary])]
    assert G.plan_cluster(o, {'driver_version': '580.159.03', 'tolerations': [canary]})['drivers'] == []
    assert G.plan_cluster(objs(), {'driver_version': '580.159.03'})['drivers'] == []


def test_plan_drivers_needs_the_pools_named_when_there_are_several_and_refuses_unknown_names():
    two = [nvidia_driver('a100-pool', '570.124.06'), nvidia_driver('h100-pool')]
    with pytest.raises(G.GpuOperatorError, match=r"^nvidia_drivers: .*\(a100-pool, h100-pool\); name the ones"):
        G.plan_drivers(two, {'driver_version': '580.159.03'})
    plans = G.plan_drivers(two, {'driver_version': '580.159.03', 'nvidia_drivers': ['h100-pool']})
    assert [(p['name'], p['after']['version']) for p in plans] == [('h100-pool', '580.159.03')]
    with pytest.raises(G.GpuOperatorError, match=r"^nvidia_drivers: 'b200-pool' not NVIDIADriver objects .*nothing"):
        G.plan_drivers(two, {'driver_version': '580.159.03', 'nvidia_drivers': ['b200-pool']})
    with pytest.raises(G.GpuOperatorError, match=r"^nvidia_drivers: \['h100-pool'\] without driver_version"):
        G.plan_drivers(two, {'nvidia_drivers': ['h100-pool']})
    for bad in (['h100-pool'], [{'name': 'h100-pool'}], [{'name': 'h100-pool', 'version': '1', 'tolerations': 'x'}]):
        with pytest.raises(G.GpuOperatorError, match=r'^restore_nvidia_drivers: .* is not a driver of a gpu_operator'):
            G.plan_drivers(two, {'restore_drivers': bad})
    with pytest.raises(G.GpuOperatorError, match=r'^restore_nvidia_drivers: .*not with driver_version'):
        G.plan_drivers(two, {'restore_drivers': [], 'driver_version': '580.159.03'})


def test_plan_drivers_way_back_sets_the_snapshots_version_and_tolerations():
    canary = {'key': 'gpufleet.io/canary', 'operator': 'Exists', 'effect': 'NoSchedule'}
    snapshot = G.drivers_of([nvidia_driver('a100-pool', '570.124.06'), nvidia_driver('h100-pool')])
    assert snapshot[1]['tolerations'] == [] and snapshot[1]['version'] == '580.126.20'
    now = [nvidia_driver('a100-pool', '570.124.06'), nvidia_driver('h100-pool', '580.159.03', tolerations=[canary])]
    back = G.plan_drivers(now, {'restore_drivers': snapshot, 'tolerations': [canary]})
    # The toleration the cluster step added goes too (null removes the key): the template is the nodes' again.
    assert [(p['name'], p['patch']) for p in back] == [
        ('h100-pool', {'spec': {'version': '580.126.20', 'tolerations': None}})]
    assert G.plan_drivers(now[:1], {'restore_drivers': snapshot[:1]}) == []


def test_plan_cluster_refuses_pool_drivers_where_the_cluster_policy_does_not_use_them():
    with pytest.raises(G.GpuOperatorError, match=r"^nvidia_drivers: \['h100-pool'\], but ClusterPolicy cluster-policy "
                                                 r"does not render the driver from NVIDIADriver"):
        G.plan_cluster(objs(), {'restore_drivers': [{'name': 'h100-pool', 'version': '580.126.20'}]})


def test_rendered_waits_for_each_changed_pools_daemonset_at_its_new_driver():
    o = crd_objs()
    plan = G.plan_cluster(o, {'driver_version': '580.159.03'})
    o['cluster_policy']['spec'] = plan['values']
    done, waiting = G.rendered(o, plan)
    assert not done and waiting == ['DaemonSet %s of NVIDIADriver h100-pool: image nvcr.io/nvidia/driver:580.126.20-'
                                    'ubuntu22.04, not driver 580.159.03' % POOL_DS], waiting
    o['daemonsets'][1] = pool_daemonset(version='580.159.03')
    assert G.rendered(o, plan) == (True, [])


def test_plan_back_takes_a_per_pool_driver_back_by_its_deploy_label():
    dss = [pool_daemonset()]
    revs = [revision_with_data(POOL_DS, 1, 'd01', selector={'nvidia.com/gpu.deploy.driver': 'true'}),
            revision_with_data(POOL_DS, 2, 'd02', selector={'nvidia.com/gpu.deploy.driver': 'true'})]
    o = crd_objs(dss=dss, revs=revs, pods=[pod(POOL_DS, 'gpu-1', 'd02')])
    plan = G.plan_back(back_node({'nvidia.com/gpu.deploy.driver': 'true'}), o, {POOL_DS: 'd01'})
    assert plan['patch']['metadata']['labels'] == {'nvidia.com/gpu.deploy.driver': G.BACK_VALUE}
    assert plan['operands'] == {POOL_DS: 'd01'} and len(plan['pods']) == 1
    assert plan['pods'][0]['spec']['nodeName'] == 'gpu-1'
