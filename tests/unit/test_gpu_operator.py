"""Unit tests of the GPU Operator's pure parts (plugins/module_utils/_gpu_operator.py), over plain
dicts shaped like the API's ClusterPolicy, HelmChart, DaemonSets, ControllerRevisions, pods and the
operator Deployment."""
from __future__ import annotations

import copy
import json

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
            'nodeSelector': {'gpufleet.io/model': 'h100'}, 'usePrecompiled': False, 'useOpenKernelModules': True},
         'status': {'state': 'ready'}},
        {'metadata': {'name': 'a100-pool'}, 'spec': {'driverType': 'gpu', 'image': 'driver', 'version': '580'}},
    ]
    out = G.drivers_of(drivers)
    assert [d['name'] for d in out] == ['a100-pool', 'h100-pool']
    assert out[1] == {'name': 'h100-pool', 'driver_type': 'gpu', 'version': '580.130.00',
                      'image': 'nvcr.io/nvidia/driver:580.130.00', 'node_selector': {'gpufleet.io/model': 'h100'},
                      'use_precompiled': False, 'use_open_kernel_modules': True, 'state': 'ready'}
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
