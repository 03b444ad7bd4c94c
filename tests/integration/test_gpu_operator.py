"""gpufleet.upgrade.gpu_operator_info and gpu_operator_update on the real control plane with NVIDIA's real GPU
Operator (tests/cluster/gpuoperator.py: built from its Go module, reconciling the real ClusterPolicy CRD into
its operand DaemonSets, which the real DaemonSet controller runs and KWOK plays). The modules run as service
accounts bound to docs/rbac's roles (the reader for the info module; for the update, modules.yml's three: the
ClusterRole gpufleet-upgrade-gpu-operator cluster-wide, the Roles for the operand pods in gpu-operator and the
HelmChart in kube-system by RoleBindings there), so the API server's authorizer refuses what a role lacks.

What the operator cannot do here (no containers, no Helm): its operands run nothing (the validator's pod
is Ready when KWOK says so), and the RKE2 HelmChart is rendered by HelmChartStandIn, not by helm-controller.
"""
from __future__ import annotations

import copy
import json
import pathlib
import sys

import pytest
import yaml

from cluster import fixtures as f
from cluster import rbac
from cluster.gpuoperator import GpuOperator, HelmChartStandIn, deployment
from rbac_check import module_roles

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _rollout

pytestmark = pytest.mark.slow

NODES = ('gpu-1', 'gpu-2', 'gpu-3')
NS = 'gpu-operator'
OLD_DCGM = f.DCGM_EXPORTER_VERSION
NEW_DCGM = '4.4.1-4.5.0-ubuntu22.04'
NEW_OPERATOR = 'v26.3.4'
EXPORTER = 'nvidia-dcgm-exporter'
# the update's roles (docs/rbac/modules.yml), bound to the service account gpufleet-system/gpu-operator
UPDATE_ROLES = module_roles()['gpu_operator_update']


@pytest.fixture(scope='module')
def operator(control_plane):
    with GpuOperator(control_plane) as op:
        yield op


def _deploy(cluster, operator, extra_labels=None, operands=5, driver_crd=False, pools=(), **policy):
    """Three GPU nodes (labelled as NFD labels them, plus `extra_labels`), the operator's Deployment and the
    ClusterPolicy the chart renders (`policy`: operator_values' keywords; `driver_crd`: the driver rendered per
    node pool from the NVIDIADriver objects `pools`), reconciled to ready with `operands` pods per node; the
    reader's and the updater's kubeconfigs on `cluster`."""
    nodes = []
    for name in NODES:
        node = f.gpu_node(name)
        labels = {k: v for k, v in node['metadata']['labels'].items() if not k.startswith('nvidia.com/gpu.deploy.')}
        node['metadata']['labels'] = dict(labels, **(extra_labels or {}))
        nodes.append(node)
    cluster.apply(nodes + [f.namespace(NS), deployment(f.OPERATOR_VERSION)], settle=False)
    cp = f.operator_cluster_policy(**policy)
    if driver_crd:
        cp['spec']['driver']['useNvidiaDriverCRD'] = True
    cluster.apply([cp] + list(pools), settle=False)
    operator.wait_ready()
    cluster.wait_for(lambda: len(operator.operand_pods()) >= operands * len(NODES), timeout=60,
                     message='%d operand pods on every node' % operands)
    cluster.info_kubeconfig = rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-reader')
    cluster.update_kubeconfig = rbac.kubeconfig_for(cluster, UPDATE_ROLES)
    return cluster


@pytest.fixture
def fleet(cluster, operator):
    """The chart's defaults: RollingUpdate, driver auto-upgrade on, host drivers."""
    yield _deploy(cluster, operator)


# What Node Feature Discovery labels and the operator needs to render its driver DaemonSet (the image's OS tag,
# and the kernel its driver container builds for).
NFD_HOST = {'feature.node.kubernetes.io/kernel-version.full': '6.8.0-134-generic',
            'feature.node.kubernetes.io/system-os_release.ID': 'ubuntu',
            'feature.node.kubernetes.io/system-os_release.VERSION_ID': '22.04'}
OLD_DRIVER = '580.126.20'
NEW_DRIVER = '580.159.03'
DRIVER = 'nvidia-driver-daemonset'


@pytest.fixture
def driver_fleet(cluster, operator):
    """As `fleet`, with the operator's driver container as the driver (driver.enabled: install_method operator)."""
    yield _deploy(cluster, operator, NFD_HOST, operands=6, driver_enabled=True, driver_version=OLD_DRIVER)


def _driver_images(cluster):
    """node -> the image of the driver pod running there (the DaemonSet's or a rollback's)."""
    return {p['spec']['nodeName']: p['spec']['containers'][0]['image'] for p in cluster.list('v1', 'Pod', namespace=NS)
            if p['metadata']['labels'].get('app') == DRIVER and not p['metadata'].get('deletionTimestamp')}


def _play(kubeconfig, module, args, check=False, diff=False, name='step'):
    return [{'name': module, 'hosts': 'localhost', 'gather_facts': False, 'check_mode': check, 'diff': diff,
             'tasks': [{'name': name, 'gpufleet.upgrade.%s' % module: dict(args, kubeconfig=kubeconfig),
                        'register': 'out', 'ignore_errors': True}]}]


def _update(cluster, run_playbook, args, check=False, diff=False):
    run = run_playbook(_play(cluster.update_kubeconfig, 'gpu_operator_update',
                             dict({'interval': 0.5, 'timeout': 120}, **args), check=check, diff=diff))
    return run.result('step')


def _pods(operator):
    """uid -> (node, operand, image) of every operand pod."""
    out = {}
    for p in operator.operand_pods():
        owner = next(r['name'] for r in p['metadata']['ownerReferences'] if r['kind'] == 'DaemonSet')
        out[p['metadata']['uid']] = (p['spec']['nodeName'], owner, p['spec']['containers'][0]['image'])
    return out


def _exporter_images(operator):
    # a pod the DaemonSet just created, not yet bound by the scheduler, runs nowhere
    return {p['spec']['nodeName']: p['spec']['containers'][0]['image'] for p in operator.operand_pods()
            if p['metadata']['labels'].get('app') == EXPORTER and not p['metadata'].get('deletionTimestamp')
            and p['spec'].get('nodeName')}


DRIVER_POOL = {'apiVersion': 'nvidia.com/v1alpha1', 'kind': 'NVIDIADriver', 'metadata': {'name': 'h100-pool'},
               'spec': {'driverType': 'gpu', 'repository': 'nvcr.io/nvidia', 'image': 'driver', 'version': '580.130.00',
                        'nodeSelector': {'gpufleet.io/model': 'h100'}}}


def test_info_reads_the_real_operator_read_only(fleet, operator, run_playbook):
    # One node pool's operator-managed driver, on the operator's real NVIDIADriver CRD (the ClusterPolicy does
    # not enable driver.nvidiaDriverCRD, so the operator leaves it alone).
    fleet.apply([DRIVER_POOL], settle=False)
    mark = fleet.audit_mark()
    try:
        run = run_playbook(_play(fleet.info_kubeconfig, 'gpu_operator_info', {}))
    finally:
        fleet.delete('nvidia.com/v1alpha1', 'NVIDIADriver', 'h100-pool')
    res = run.result('step')
    assert [(d['name'], d['driver_type'], d['version'], d['image'], d['node_selector']) for d in res['drivers']] == [
        ('h100-pool', 'gpu', '580.130.00', 'nvcr.io/nvidia/driver:580.130.00', {'gpufleet.io/model': 'h100'})], res
    assert res['_event'] == 'runner_on_ok', res
    op = res['gpu_operator']
    assert op['version'] == f.OPERATOR_VERSION and op['chart'] is None
    assert op['cluster_policy']['state'] == 'ready' and op['cluster_policy']['update_strategy'] == 'RollingUpdate'
    assert op['cluster_policy']['dcgm_exporter_version'] == OLD_DCGM and op['cluster_policy']['restore'] is None
    exporter = next(o for o in op['operands'] if o['name'] == EXPORTER)
    assert exporter['component'] == 'dcgmExporter' and exporter['revision']
    assert exporter['image'] == 'nvcr.io/nvidia/k8s/dcgm-exporter:' + OLD_DCGM
    assert exporter['desired'] == exporter['ready'] == len(NODES)
    assert sorted(op['nodes']) == list(NODES)
    assert all(p['current'] and p['ready'] for pods in op['nodes'].values() for p in pods)
    assert res['chart_values']['dcgmExporter']['version'] == OLD_DCGM
    events = fleet.audit_events(since=mark, user=rbac.user('reader'))
    assert events and rbac.non_reads(events) == [] and rbac.refused(events) == []


def test_cluster_step_restarts_nothing_then_each_node_moves_in_its_own_window(fleet, operator, run_playbook):
    before = _pods(operator)
    args = {'state': 'cluster', 'dcgm_exporter_version': NEW_DCGM}

    # Check mode: the change predicted, no write.
    mark = fleet.audit_mark()
    res = _update(fleet, run_playbook, args, check=True, diff=True)
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True, res
    assert res['diff']['after']['values']['daemonsets']['updateStrategy'] == 'OnDelete'
    assert rbac.non_reads(fleet.audit_events(since=mark, user=rbac.user('gpu-operator'))) == []

    res = _update(fleet, run_playbook, args)
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    assert res['kind'] == 'ClusterPolicy'
    assert res['restore'] == {'daemonsets.updateStrategy': 'RollingUpdate', 'driver.upgradePolicy.autoUpgrade': True}
    exporter = next(o for o in res['gpu_operator']['operands'] if o['name'] == EXPORTER)
    assert exporter['image'] == 'nvcr.io/nvidia/k8s/dcgm-exporter:' + NEW_DCGM
    assert exporter['update_strategy'] == 'OnDelete'
    fleet.settle(horizon=3)
    assert _pods(operator) == before                     # the cluster step restarted no operand pod
    assert set(_exporter_images(operator).values()) == {'nvcr.io/nvidia/k8s/dcgm-exporter:' + OLD_DCGM}

    # A rerun changes nothing and keeps the first record (never its own OnDelete as "before").
    res = _update(fleet, run_playbook, args)
    assert res['_event'] == 'runner_on_ok', res
    assert res['changed'] is False and res['restore']['daemonsets.updateStrategy'] == 'RollingUpdate', res

    # Restoring now would restart the nodes not yet upgraded: refused.
    res = _update(fleet, run_playbook, {'state': 'restore'})
    assert res['_event'] == 'runner_on_failed' and 'outside their maintenance window' in res['msg'], res

    # gpu-1's window: its exporter moves, the others' pods are the same pods.
    others = {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'}
    res = _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-1'})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    assert [p['operand'] for p in res['restarted']] == [EXPORTER]
    mine = {p['operand']: p for p in res['operands']}
    assert mine[EXPORTER]['image'] == 'nvcr.io/nvidia/k8s/dcgm-exporter:' + NEW_DCGM
    assert all(p['current'] and p['ready'] for p in res['operands'])
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == others
    assert _exporter_images(operator) == {
        'gpu-1': 'nvcr.io/nvidia/k8s/dcgm-exporter:' + NEW_DCGM,
        'gpu-2': 'nvcr.io/nvidia/k8s/dcgm-exporter:' + OLD_DCGM,
        'gpu-3': 'nvcr.io/nvidia/k8s/dcgm-exporter:' + OLD_DCGM}

    # The node gate measures each node's DCGM exporter from the operand pod that runs there.
    run = run_playbook([{'name': 'gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': node, 'gpufleet.upgrade.node_gate': {'kubeconfig': fleet.info_kubeconfig, 'node': node,
                                                      'expected_gpus': {'nvidia.com/gpu': 8}},
         'ignore_errors': True} for node in ('gpu-1', 'gpu-2')]}])
    assert run.result('gpu-1')['measured']['dcgm_exporter'] == NEW_DCGM, run.result('gpu-1')
    assert run.result('gpu-2')['measured']['dcgm_exporter'] == OLD_DCGM
    assert run.result('gpu-1')['measured']['gpu_operator'] == f.OPERATOR_VERSION

    # T3-6: on-call deletes gpu-3's exporter pod outside its window. OnDelete at the new template brings it back
    # at the new revision; the rollout's batch admission (operand_window_verdict, over the real operator's state)
    # names it, gpu-2 (also waiting) being the comparison.
    target = {'gpu_operator': f.OPERATOR_VERSION, 'dcgm_exporter': NEW_DCGM}
    nodes = [{'name': n['metadata']['name'], 'annotations': n['metadata'].get('annotations') or {}}
             for n in fleet.list('v1', 'Node')]
    assert _rollout.operand_window_verdict(_info(fleet, run_playbook), nodes, ['gpu-2', 'gpu-3'], target)['ok']
    victim = next(p['metadata']['name'] for p in operator.operand_pods()
                  if p['spec'].get('nodeName') == 'gpu-3' and p['metadata']['labels'].get('app') == EXPORTER)
    fleet.delete('v1', 'Pod', victim, namespace=NS)
    fleet.wait_for(lambda: _exporter_images(operator).get('gpu-3') == 'nvcr.io/nvidia/k8s/dcgm-exporter:' + NEW_DCGM,
                   timeout=60, message="gpu-3's exporter recreated at the new revision")
    fleet.wait_for(lambda: all(p['current'] for p in _info(fleet, run_playbook)['nodes']['gpu-3']
                               if p['operand'] == EXPORTER), timeout=60, message='the recreated pod seen at its revision')
    verdict = _rollout.operand_window_verdict(_info(fleet, run_playbook), nodes, ['gpu-2', 'gpu-3'], target)
    assert not verdict['ok'] and [(m['node'], m['operand']) for m in verdict['moved']] == [('gpu-3', EXPORTER)], verdict

    # A second run of gpu-1's step restarts nothing.
    res = _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-1'})
    assert res['changed'] is False and res['restarted'] == [], res

    for node in ('gpu-2', 'gpu-3'):
        assert _update(fleet, run_playbook, {'state': 'node', 'node': node})['waited']['done'] is True
    settled = _pods(operator)
    res = _update(fleet, run_playbook, {'state': 'restore'})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True, res
    policy = fleet.get('nvidia.com/v1', 'ClusterPolicy', 'cluster-policy')
    assert policy['spec']['daemonsets']['updateStrategy'] == 'RollingUpdate'
    assert policy['spec']['driver']['upgradePolicy']['autoUpgrade'] is True
    assert 'gpufleet.io/gpu-operator-restore' not in (policy['metadata'].get('annotations') or {})
    operator.wait_ready()
    fleet.settle(horizon=3)
    assert _pods(operator) == settled                    # restoring RollingUpdate restarted nothing
    assert set(_exporter_images(operator).values()) == {'nvcr.io/nvidia/k8s/dcgm-exporter:' + NEW_DCGM}


def _info(cluster, run_playbook):
    run = run_playbook(_play(cluster.info_kubeconfig, 'gpu_operator_info', {}))
    return run.result('step')['gpu_operator']


def test_a_failed_nodes_operands_go_back_to_the_snapshots_revision_and_its_next_window_moves_them_again(
        fleet, operator, run_playbook):
    """state=back (the rollback role's step, past the canary): under OnDelete the DaemonSet can only recreate
    gpu-1's exporter at the new revision, so the node's deploy label takes the DaemonSet's pod off it and a pod
    from the DaemonSet's own ControllerRevision of the snapshot's revision runs there; every other node keeps
    its pods. state=node (the node's next window) undoes it."""
    snapshot = _info(fleet, run_playbook)                 # what canary.yml keeps before the cluster step
    old_rev = next(p['revision'] for p in snapshot['nodes']['gpu-1'] if p['operand'] == EXPORTER)
    revisions = {p['operand']: p['revision'] for p in snapshot['nodes']['gpu-1']}
    assert _update(fleet, run_playbook, {'state': 'cluster', 'dcgm_exporter_version': NEW_DCGM})['changed'] is True
    assert _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-1'})['waited']['done'] is True
    assert _exporter_images(operator)['gpu-1'].endswith(':' + NEW_DCGM)
    others = {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'}

    # Check mode: predicted, nothing written.
    mark = fleet.audit_mark()
    res = _update(fleet, run_playbook, {'state': 'back', 'node': 'gpu-1', 'revisions': revisions}, check=True)
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True, res
    assert res['back']['operands'] == {EXPORTER: old_rev}, res          # only the operand that moved
    assert rbac.non_reads(fleet.audit_events(since=mark, user=rbac.user('gpu-operator'))) == []

    res = _update(fleet, run_playbook, {'state': 'back', 'node': 'gpu-1', 'revisions': revisions})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    node = fleet.get('v1', 'Node', 'gpu-1')
    assert node['metadata']['labels']['nvidia.com/gpu.deploy.dcgm-exporter'] == 'rolled-back-by-gpufleet'
    assert json.loads(node['metadata']['annotations']['gpufleet.io/operands-back']) == {
        'labels': {'nvidia.com/gpu.deploy.dcgm-exporter': 'true'}, 'operands': {EXPORTER: old_rev}}
    back = [p for p in fleet.list('v1', 'Pod', namespace=NS) if p['metadata']['labels'].get('gpufleet.io/operand-back')]
    assert len(back) == 1, back
    (pod,) = back
    assert pod['spec']['nodeName'] == 'gpu-1' and pod['metadata']['labels']['controller-revision-hash'] == old_rev
    assert pod['spec']['containers'][0]['image'] == 'nvcr.io/nvidia/k8s/dcgm-exporter:' + OLD_DCGM
    assert pod['metadata']['ownerReferences'][0]['kind'] == 'Node'
    fleet.settle(horizon=3)
    # No DaemonSet adopted the pod or put its own back on gpu-1; no other node's pod changed.
    assert not any(v[0] == 'gpu-1' and v[1] == EXPORTER for v in _pods(operator).values())
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == others
    assert fleet.get('v1', 'Pod', pod['metadata']['name'], NS)['metadata']['uid'] == pod['metadata']['uid']
    # The node gate measures the old exporter on gpu-1 (its pod carries the DaemonSet's labels).
    run = run_playbook([{'name': 'gate', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'gpu-1', 'gpufleet.upgrade.node_gate': {'kubeconfig': fleet.info_kubeconfig, 'node': 'gpu-1',
                                                         'expected_gpus': {'nvidia.com/gpu': 8}},
         'ignore_errors': True}]}])
    assert run.result('gpu-1')['measured']['dcgm_exporter'] == OLD_DCGM, run.result('gpu-1')

    # A rerun changes nothing; a revision the DaemonSet does not keep is refused, nothing changed.
    res = _update(fleet, run_playbook, {'state': 'back', 'node': 'gpu-1', 'revisions': revisions})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is False, res
    mark = fleet.audit_mark()
    res = _update(fleet, run_playbook, {'state': 'back', 'node': 'gpu-2', 'revisions': {EXPORTER: 'deadbeef'}})
    assert res['_event'] == 'runner_on_failed' and 'no longer keeps revision deadbeef' in res['msg'], res
    assert rbac.non_reads(fleet.audit_events(since=mark, user=rbac.user('gpu-operator'))) == []

    # The node's next window: the label set back, the pod deleted, the DaemonSet's current pod back.
    res = _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-1'})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    assert res['back']['deleted'] == [pod['metadata']['name']], res
    node = fleet.get('v1', 'Node', 'gpu-1')
    assert node['metadata']['labels']['nvidia.com/gpu.deploy.dcgm-exporter'] == 'true'
    assert 'gpufleet.io/operands-back' not in (node['metadata'].get('annotations') or {})
    assert _exporter_images(operator)['gpu-1'].endswith(':' + NEW_DCGM)
    assert not [p for p in fleet.list('v1', 'Pod', namespace=NS) if p['metadata']['labels'].get('gpufleet.io/operand-back')]
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == others


def test_operator_managed_driver_moves_in_its_nodes_window_and_goes_back_with_its_rollback(
        driver_fleet, operator, run_playbook):
    """install_method operator on the real operator: the cluster step sets driver.version (the driver DaemonSet is
    OnDelete: no driver pod restarts anywhere), gpu-1's window moves its driver pod to the new driver, its rollback
    takes it back to the snapshot's revision (the old driver), its next window moves it again; every other node's
    driver pod is the same pod throughout."""
    fleet = driver_fleet
    old_image = 'nvcr.io/nvidia/driver:%s-ubuntu22.04' % OLD_DRIVER
    new_image = 'nvcr.io/nvidia/driver:%s-ubuntu22.04' % NEW_DRIVER
    assert _driver_images(fleet) == {n: old_image for n in NODES}
    snapshot = _info(fleet, run_playbook)
    revisions = {p['operand']: p['revision'] for p in snapshot['nodes']['gpu-1']}
    assert DRIVER in revisions
    start = _pods(operator)

    res = _update(fleet, run_playbook, {'state': 'cluster', 'driver_version': NEW_DRIVER})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    driver_ds = next(o for o in res['gpu_operator']['operands'] if o['name'] == DRIVER)
    assert driver_ds['image'] == new_image and driver_ds['update_strategy'] == 'OnDelete', driver_ds
    fleet.settle(horizon=3)
    assert _pods(operator) == start and _driver_images(fleet) == {n: old_image for n in NODES}

    res = _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-1'})
    assert res['_event'] == 'runner_on_ok' and res['waited']['done'] is True, res
    assert DRIVER in [p['operand'] for p in res['restarted']], res
    assert _driver_images(fleet) == {'gpu-1': new_image, 'gpu-2': old_image, 'gpu-3': old_image}
    others = {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'}
    assert others == {uid: v for uid, v in start.items() if v[0] != 'gpu-1'}

    res = _update(fleet, run_playbook, {'state': 'back', 'node': 'gpu-1', 'revisions': revisions})
    assert res['_event'] == 'runner_on_ok' and res['waited']['done'] is True, res
    assert res['back']['operands'][DRIVER] == revisions[DRIVER], res
    assert _driver_images(fleet) == {n: old_image for n in NODES}
    fleet.settle(horizon=3)
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == others

    res = _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-1'})
    assert res['_event'] == 'runner_on_ok' and res['waited']['done'] is True, res
    assert _driver_images(fleet) == {'gpu-1': new_image, 'gpu-2': old_image, 'gpu-3': old_image}
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == others


# One node pool's driver from an NVIDIADriver object (driver.useNvidiaDriverCRD): the operator's NVIDIADriver
# controller renders its DaemonSet (always OnDelete), named after the driver type, the OS and a hash.
POOL = {'apiVersion': 'nvidia.com/v1alpha1', 'kind': 'NVIDIADriver', 'metadata': {'name': 'gpu-pool'},
        'spec': {'driverType': 'gpu', 'repository': 'nvcr.io/nvidia', 'image': 'driver', 'version': OLD_DRIVER,
                 'manager': {'repository': 'nvcr.io/nvidia/cloud-native', 'image': 'k8s-driver-manager',
                             'version': 'v0.8.1'}}}


@pytest.fixture
def pool_fleet(cluster, operator):
    """As `driver_fleet`, with the driver rendered from the NVIDIADriver `POOL` instead of driver.version."""
    yield _deploy(cluster, operator, NFD_HOST, operands=6, driver_crd=True, pools=[POOL], driver_enabled=True,
                  driver_version='570.0.0')


def _pool_driver_images(cluster):
    """node -> the image of the per-pool driver pod running there (the DaemonSet's or a rollback's)."""
    return {p['spec']['nodeName']: p['spec']['containers'][0]['image'] for p in cluster.list('v1', 'Pod', namespace=NS)
            if p['metadata']['labels'].get('app.kubernetes.io/component') == 'nvidia-driver'
            and not p['metadata'].get('deletionTimestamp')}


def test_per_pool_driver_moves_in_its_nodes_window_and_the_way_back_restores_the_pools_version(
        pool_fleet, operator, run_playbook):
    """install_method operator with the driver per node pool (NVIDIADriver) on the real operator: the cluster step
    sets the NVIDIADriver's version, not driver.version (its DaemonSet is OnDelete: no driver pod restarts
    anywhere); gpu-1's window moves its driver pod (named as the ClusterPolicy's driver DaemonSet, as the role
    does); its rollback takes it back to the snapshot's revision; the way back of a failed canary sets the pool's
    version back from the snapshot."""
    fleet = pool_fleet
    old_image = 'nvcr.io/nvidia/driver:%s-ubuntu22.04' % OLD_DRIVER
    new_image = 'nvcr.io/nvidia/driver:%s-ubuntu22.04' % NEW_DRIVER
    assert _pool_driver_images(fleet) == {n: old_image for n in NODES}
    run = run_playbook(_play(fleet.info_kubeconfig, 'gpu_operator_info', {}))
    info = run.result('step')
    snapshot = info['gpu_operator']
    assert snapshot['cluster_policy']['driver_crd'] is True
    assert [(d['name'], d['version']) for d in info['drivers']] == [('gpu-pool', OLD_DRIVER)]
    (pool_ds,) = [o for o in snapshot['operands'] if o['nvidia_driver'] == 'gpu-pool']
    assert pool_ds['component'] == 'driver' and pool_ds['update_strategy'] == 'OnDelete', pool_ds
    assert not any(o['name'] == DRIVER for o in snapshot['operands'])     # the ClusterPolicy renders none
    revisions = {p['operand']: p['revision'] for p in snapshot['nodes']['gpu-1']}
    assert pool_ds['name'] in revisions
    start = _pods(operator)

    # Check mode: the pool's version predicted in the diff, nothing written.
    mark = fleet.audit_mark()
    res = _update(fleet, run_playbook, {'state': 'cluster', 'driver_version': NEW_DRIVER}, check=True, diff=True)
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True, res
    assert res['diff']['after']['nvidia_drivers']['gpu-pool']['version'] == NEW_DRIVER, res['diff']
    assert rbac.non_reads(fleet.audit_events(since=mark, user=rbac.user('gpu-operator'))) == []

    res = _update(fleet, run_playbook, {'state': 'cluster', 'driver_version': NEW_DRIVER})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    assert fleet.get('nvidia.com/v1alpha1', 'NVIDIADriver', 'gpu-pool')['spec']['version'] == NEW_DRIVER
    cp = fleet.get('nvidia.com/v1', 'ClusterPolicy', 'cluster-policy')
    assert cp['spec']['driver']['version'] == '570.0.0'                   # not what runs: left alone
    moved = next(o for o in res['gpu_operator']['operands'] if o['name'] == pool_ds['name'])
    assert moved['image'] == new_image, moved
    fleet.settle(horizon=3)
    assert _pods(operator) == start and _pool_driver_images(fleet) == {n: old_image for n in NODES}

    res = _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-1', 'operands': [DRIVER]})
    assert res['_event'] == 'runner_on_ok' and res['waited']['done'] is True, res
    assert [p['operand'] for p in res['restarted']] == [pool_ds['name']], res
    assert _pool_driver_images(fleet) == {'gpu-1': new_image, 'gpu-2': old_image, 'gpu-3': old_image}
    others = {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'}
    assert others == {uid: v for uid, v in start.items() if v[0] != 'gpu-1'}

    res = _update(fleet, run_playbook, {'state': 'back', 'node': 'gpu-1', 'revisions': revisions})
    assert res['_event'] == 'runner_on_ok' and res['waited']['done'] is True, res
    assert res['back']['operands'] == {pool_ds['name']: revisions[pool_ds['name']]}, res
    assert fleet.get('v1', 'Node', 'gpu-1')['metadata']['labels']['nvidia.com/gpu.deploy.driver'] == \
        'rolled-back-by-gpufleet'
    assert _pool_driver_images(fleet) == {n: old_image for n in NODES}
    fleet.settle(horizon=3)
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == others

    # A failed canary's way back (gpu_operator_back.yml): the snapshot's values and the pool's version, then the
    # node's window runs the restored revision.
    res = _update(fleet, run_playbook, {'state': 'cluster', 'values': info['chart_values'],
                                        'replace_values': True,
                                        'restore_nvidia_drivers': info['drivers']})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    assert fleet.get('nvidia.com/v1alpha1', 'NVIDIADriver', 'gpu-pool')['spec']['version'] == OLD_DRIVER
    res = _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-1'})
    assert res['_event'] == 'runner_on_ok' and res['waited']['done'] is True, res
    assert _pool_driver_images(fleet) == {n: old_image for n in NODES}
    node = fleet.get('v1', 'Node', 'gpu-1')
    assert node['metadata']['labels']['nvidia.com/gpu.deploy.driver'] == 'true'
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == others

    # Bad input changes nothing: a pool that does not exist; pool versions where the driver is not per pool.
    mark = fleet.audit_mark()
    res = _update(fleet, run_playbook, {'state': 'cluster', 'driver_version': NEW_DRIVER, 'nvidia_drivers': ['b200']})
    assert res['_event'] == 'runner_on_failed', res
    assert res['msg'] == ("gpu_operator_update: nvidia_drivers: 'b200' not NVIDIADriver objects of the cluster "
                          "(gpu-pool); nothing was changed"), res
    assert rbac.non_reads(fleet.audit_events(since=mark, user=rbac.user('gpu-operator'))) == []


def test_helm_chart_step_moves_the_operator_version_and_a_missing_chart_is_put_back(fleet, operator, run_playbook):
    values = f.operator_values()
    fleet.apply([f.helm_chart(values=values)], settle=False)
    with HelmChartStandIn(fleet, missing_versions=('v99.0.0',)) as helm:
        fleet.wait_for(lambda: helm.rendered, timeout=30, message='the HelmChart rendered once')
        operator.wait_ready()
        before = _pods(operator)
        chart_before = copy.deepcopy(fleet.get('helm.cattle.io/v1', 'HelmChart', 'gpu-operator', 'kube-system')['spec'])

        res = _update(fleet, run_playbook, {'state': 'cluster', 'version': 'v99.0.0', 'dcgm_exporter_version': NEW_DCGM})
        assert res['_event'] == 'runner_on_failed', res
        assert 'version "v99.0.0" not found' in res['msg'] and 'put back as it was' in res['msg'], res
        chart = fleet.get('helm.cattle.io/v1', 'HelmChart', 'gpu-operator', 'kube-system')
        assert chart['spec']['version'] == chart_before['version']
        assert chart['spec']['valuesContent'] == chart_before['valuesContent']
        assert _pods(operator) == before

        res = _update(fleet, run_playbook, {'state': 'cluster', 'version': NEW_OPERATOR,
                                            'dcgm_exporter_version': NEW_DCGM})
        assert res['_event'] == 'runner_on_ok' and res['kind'] == 'HelmChart' and res['waited']['done'], res
        assert res['gpu_operator']['version'] == NEW_OPERATOR
        assert res['gpu_operator']['chart']['version'] == NEW_OPERATOR
        validator = next(o for o in res['gpu_operator']['operands'] if o['name'] == 'nvidia-operator-validator')
        assert validator['image'].endswith(':' + NEW_OPERATOR)
        fleet.settle(horizon=3)
        assert _pods(operator) == before

        # Every operand's template moved: their init containers run the validator's image, which follows
        # the operator version. gpu-2's window restarts them all, and nothing elsewhere.
        others = {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-2'}
        on_node = sorted(v[1] for v in before.values() if v[0] == 'gpu-2')
        res = _update(fleet, run_playbook, {'state': 'node', 'node': 'gpu-2'})
        assert res['waited']['done'] is True, res
        assert sorted(p['operand'] for p in res['restarted']) == on_node
        assert {p['operand']: p['image'] for p in res['operands']}['nvidia-operator-validator'].endswith(NEW_OPERATOR)
        assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-2'} == others


def test_bad_input_changes_nothing(fleet, operator, run_playbook):
    mark = fleet.audit_mark()
    cases = [
        ({'state': 'cluster', 'values': {'daemonsets': {'updateStrategy': 'RollingUpdate'}}},
         'values.daemonsets.updateStrategy'),
        ({'state': 'cluster', 'version': NEW_OPERATOR}, "version: 'v26.3.4' needs the operator's HelmChart"),
        ({'state': 'cluster', 'cluster_policy': 'nope'}, "ClusterPolicy 'nope' does not exist"),
        ({'state': 'node'}, 'state is node but all of the following are missing: node'),
        ({'state': 'cluster', 'timeout': 0}, 'must be positive'),
        ({'state': 'cluster', 'driver_version': '580.126.20'}, "driver_version: '580.126.20', but ClusterPolicy"),
        ({'state': 'back', 'node': 'gpu-1'}, 'state is back but all of the following are missing: revisions'),
        ({'state': 'back', 'node': 'gpu-1', 'revisions': {'nope': 'abc'}}, "revisions: 'nope' is not an operand"),
    ]
    for args, message in cases:
        res = _update(fleet, run_playbook, args)
        assert res['_event'] == 'runner_on_failed' and message in res['msg'], (args, res)
        assert 'Traceback' not in res['msg']
    assert rbac.non_reads(fleet.audit_events(since=mark, user=rbac.user('gpu-operator'))) == []


def test_pause_takes_the_device_holders_off_one_node_and_resume_brings_them_back(fleet, operator, run_playbook):
    # Someone disabled DCGM on gpu-1 before: the pause leaves that label alone and the resume does not enable it.
    fleet.patch('v1', 'Node', 'gpu-1', {'metadata': {'labels': {'nvidia.com/gpu.deploy.dcgm': 'false'}}})
    fleet.wait_for(lambda: not [p for p in operator.operand_pods('gpu-1') if p['metadata']['labels'].get('app') ==
                                'nvidia-dcgm'], timeout=60, message="gpu-1's DCGM pod gone")
    others = {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'}
    toolkit = {uid for uid, v in _pods(operator).items() if v[0] == 'gpu-1' and v[1] == 'nvidia-container-toolkit-daemonset'}

    res = _update(fleet, run_playbook, {'state': 'pause', 'node': 'gpu-1'})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    assert 'nvidia.com/gpu.deploy.dcgm' not in res['paused']['labels']
    assert 'nvidia-device-plugin-daemonset' in res['paused']['operands']
    left = {v[1] for v in _pods(operator).values() if v[0] == 'gpu-1'}
    assert left == {'nvidia-container-toolkit-daemonset'}        # the toolkit holds no device: it stays
    assert {uid for uid, v in _pods(operator).items() if v[0] == 'gpu-1'} == toolkit
    labels = fleet.get('v1', 'Node', 'gpu-1')['metadata']['labels']
    assert labels['nvidia.com/gpu.deploy.device-plugin'] == 'paused-for-driver-upgrade'
    assert labels['nvidia.com/gpu.deploy.dcgm'] == 'false'
    fleet.settle(horizon=3)                                      # the operator keeps a label's value
    assert fleet.get('v1', 'Node', 'gpu-1')['metadata']['labels'][
        'nvidia.com/gpu.deploy.device-plugin'] == 'paused-for-driver-upgrade'

    again = _update(fleet, run_playbook, {'state': 'pause', 'node': 'gpu-1'})
    assert again['changed'] is False and again['paused'] == res['paused'], again

    res = _update(fleet, run_playbook, {'state': 'resume', 'node': 'gpu-1'})
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['waited']['done'] is True, res
    node = fleet.get('v1', 'Node', 'gpu-1')
    assert node['metadata']['labels']['nvidia.com/gpu.deploy.device-plugin'] == 'true'
    assert node['metadata']['labels']['nvidia.com/gpu.deploy.dcgm'] == 'false'
    assert 'gpufleet.io/operands-paused' not in (node['metadata'].get('annotations') or {})
    back = {v[1] for v in _pods(operator).values() if v[0] == 'gpu-1'}
    assert 'nvidia-device-plugin-daemonset' in back and 'nvidia-dcgm' not in back
    assert all(p['ready'] and p['current'] for p in res['operands'])
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == others
    assert _update(fleet, run_playbook, {'state': 'resume', 'node': 'gpu-1'})['changed'] is False


# -- the playbooks' and roles' own tasks on the real operator ----------------------------------------
ROOT = pathlib.Path(__file__).resolve().parents[2]
HOOK = [sys.executable, '-c', 'import json; print(json.dumps({"changed": True}))']


def _wiring_play(kubeconfig, tasks, canaries, qdir, target):
    """A localhost play that runs the collection's own task files as canary.yml and node_upgrade run them."""
    pre = [{'name': 'plan', 'ansible.builtin.set_fact': {'__canary_plan': {'target': target, 'canaries': canaries}}}]
    return [{'name': 'wiring', 'hosts': 'localhost', 'gather_facts': False,
             'module_defaults': {'group/gpufleet.upgrade.k8s': {'kubeconfig': kubeconfig}},
             'vars': {'gpufleet_qualification_dir': str(qdir), 'gpufleet_kubeconfig': kubeconfig, 'gpufleet_target': target,
                      'gpufleet_gpu_operator_managed': True, 'gpufleet_gpu_operator_timeout': 120},
             'tasks': pre + tasks}]


def _include(name):
    return {'name': name, 'ansible.builtin.include_tasks': str(ROOT / 'playbooks' / 'tasks' / name)}


def _role(tasks_from, **role_vars):
    return {'name': tasks_from, 'ansible.builtin.include_role': {'name': 'gpufleet.upgrade.node_upgrade',
                                                                 'tasks_from': tasks_from}, 'vars': role_vars}


def _snapshot_back(qdir):
    (path,) = qdir.glob('gpu-operator--*.json')
    return {'name': 'snapshot', 'ansible.builtin.set_fact': {
        '__canary_operator_snapshot': json.loads(path.read_text())}}


def test_canary_cluster_step_node_windows_reload_path_and_the_failed_canarys_way_back(
        fleet, operator, run_playbook, tmp_path):
    """canary.yml's cluster step (playbooks/tasks/gpu_operator_cluster.yml), node_upgrade's operands step
    (tasks/operands.yml) and its reload path's pause and resume (tasks/activate.yml), and the failed canary's
    way back (playbooks/tasks/gpu_operator_back.yml), as the playbooks run them, on the real operator: gpu-3,
    never in a window, keeps every operand pod it had from the start to the end."""
    kubeconfig = rbac.kubeconfig_for(fleet, 'gpufleet-upgrade-reader', sa='gpu-operator')
    kubeconfig = rbac.kubeconfig_for(fleet, UPDATE_ROLES)
    values = f.operator_values()
    fleet.apply([f.helm_chart(values=values)], settle=False)
    qdir = tmp_path / 'qualification'
    qdir.mkdir()
    target = {'gpu_operator': NEW_OPERATOR, 'dcgm_exporter': NEW_DCGM}
    with HelmChartStandIn(fleet) as helm:
        fleet.wait_for(lambda: helm.rendered, timeout=30, message='the HelmChart rendered once')
        operator.wait_ready()
        start = _pods(operator)
        gpu3 = {uid: v for uid, v in start.items() if v[0] == 'gpu-3'}

        # The cluster step, twice (a rerun keeps the snapshot taken before the change and changes nothing).
        for attempt in (1, 2):
            run = run_playbook(_wiring_play(kubeconfig, [_include('gpu_operator_cluster.yml')], ['gpu-1', 'gpu-2'],
                                            qdir, target))
            assert run.rc == 0, run.stdout
            step = run.result('GPU Operator | The cluster step (target chart and DCGM exporter, under OnDelete; '
                              'restarts no operand pod)')
            assert step['changed'] is (attempt == 1), step
            fleet.settle(horizon=3)
            assert _pods(operator) == start
        (snap_path,) = qdir.glob('gpu-operator--*.json')
        snap = json.loads(snap_path.read_text())
        assert snap['gpu_operator']['chart']['version'] == f.OPERATOR_VERSION
        assert snap['chart_values']['dcgmExporter']['version'] == OLD_DCGM
        assert snap['chart_values']['daemonsets']['updateStrategy'] == 'RollingUpdate'
        chart = fleet.get('helm.cattle.io/v1', 'HelmChart', 'gpu-operator', 'kube-system')
        assert chart['spec']['version'] == NEW_OPERATOR

        # gpu-1's window: node_upgrade's operands step moves every operand of gpu-1 and nothing else (on the
        # node the drain cordoned: the step refuses a schedulable one, issue 37 (2)).
        fleet.patch('v1', 'Node', 'gpu-1', {'spec': {'unschedulable': True}})
        run = run_playbook(_wiring_play(kubeconfig, [_role('operands', node_upgrade_node='gpu-1')], [], qdir, target))
        assert run.rc == 0, run.stdout
        moved = run.result("Operands | Move the node's operands to their DaemonSets' current revision, each Running "
                           "and Ready")
        assert moved['waited']['done'] is True and moved['restarted'], moved
        assert _exporter_images(operator)['gpu-1'].endswith(':' + NEW_DCGM)
        assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == {
            uid: v for uid, v in start.items() if v[0] != 'gpu-1'}

        # gpu-2's reload path: the device holders leave before the (lab) unload and come back after it.
        fleet.patch('v1', 'Node', 'gpu-2', {'spec': {'unschedulable': True}})
        holders = {uid for uid, v in start.items() if v[0] == 'gpu-2' and v[1] != 'nvidia-container-toolkit-daemonset'}
        run = run_playbook(_wiring_play(kubeconfig, [_role(
            'activate', node_upgrade_node='gpu-2', node_upgrade_activation='lab', node_upgrade_lab_hook=HOOK,
            __node_upgrade_how='reload', node_upgrade_gpu_operator_managed=True)], [], qdir, target))
        assert run.rc == 0, run.stdout
        order = [e['event_data']['task'] for e in run.events if e.get('event') == 'runner_on_ok']
        pause = "Activate | Take the node's device-holding GPU Operator operands off it before the driver unloads"
        hook = 'Activate | Lab reboot path (emulated reboot or driver reload of a lab node)'
        resume = 'Activate | Bring the paused operands back (they load the new modules; each Ready and current)'
        assert order.index(pause) < order.index(hook) < order.index(resume), order
        assert run.result(pause)['changed'] is True and run.result(resume)['waited']['done'] is True
        now = _pods(operator)
        assert not holders & set(now)                                # every device holder of gpu-2 came back new
        assert _exporter_images(operator)['gpu-2'].endswith(':' + NEW_DCGM)
        assert 'gpufleet.io/operands-paused' not in (fleet.get('v1', 'Node', 'gpu-2')['metadata'].get('annotations') or {})

        # A canary failed: canary.yml's rescue puts the cluster step back from the snapshot, moves the canaries'
        # operands back and restores the update strategy.
        load = _snapshot_back(qdir)
        run = run_playbook(_wiring_play(kubeconfig, [load, _include('gpu_operator_back.yml')], ['gpu-1', 'gpu-2'],
                                        qdir, target))
        assert run.rc == 0, run.stdout
        chart = fleet.get('helm.cattle.io/v1', 'HelmChart', 'gpu-operator', 'kube-system')
        assert chart['spec']['version'] == f.OPERATOR_VERSION
        back = yaml.safe_load(chart['spec']['valuesContent'])
        assert back['dcgmExporter']['version'] == OLD_DCGM
        assert back['daemonsets']['updateStrategy'] == 'RollingUpdate'
        assert back['driver']['upgradePolicy']['autoUpgrade'] is True
        assert 'gpufleet.io/gpu-operator-restore' not in (chart['metadata'].get('annotations') or {})
        images = _exporter_images(operator)
        assert images['gpu-1'].endswith(':' + OLD_DCGM) and images['gpu-2'].endswith(':' + OLD_DCGM), images
        fleet.settle(horizon=3)
        assert {uid: v for uid, v in _pods(operator).items() if v[0] == 'gpu-3'} == gpu3


def test_canary_cluster_step_and_way_back_with_per_pool_drivers(pool_fleet, operator, run_playbook, tmp_path):
    """install_method operator with the driver per node pool, through the playbooks' task files: the cluster step
    (gpu_operator_cluster.yml) sets the NVIDIADriver's version and its snapshot keeps the pool's; node_upgrade's
    activation (tasks/activate.yml, `operator`) moves gpu-1's driver pod; the failed canary's way back
    (gpu_operator_back.yml) puts the pool's version back and gpu-1 runs the old driver again. gpu-2 and gpu-3 keep
    every pod they had."""
    fleet = pool_fleet
    kubeconfig = rbac.kubeconfig_for(fleet, UPDATE_ROLES)
    qdir = tmp_path / 'qualification'
    qdir.mkdir()
    target = {'gpu_operator': f.OPERATOR_VERSION, 'dcgm_exporter': OLD_DCGM, 'driver': NEW_DRIVER}
    old_image = 'nvcr.io/nvidia/driver:%s-ubuntu22.04' % OLD_DRIVER
    new_image = 'nvcr.io/nvidia/driver:%s-ubuntu22.04' % NEW_DRIVER
    start = _pods(operator)
    rest = {uid: v for uid, v in start.items() if v[0] != 'gpu-1'}

    def play(tasks, canaries):
        p = _wiring_play(kubeconfig, tasks, canaries, qdir, target)
        p[0]['vars']['gpufleet_install_method'] = 'operator'
        return p

    run = run_playbook(play([_include('gpu_operator_cluster.yml')], ['gpu-1']))
    assert run.rc == 0, run.stdout
    assert fleet.get('nvidia.com/v1alpha1', 'NVIDIADriver', 'gpu-pool')['spec']['version'] == NEW_DRIVER
    (snap_path,) = qdir.glob('gpu-operator--*.json')
    snap = json.loads(snap_path.read_text())
    assert [(d['name'], d['version']) for d in snap['drivers']] == [('gpu-pool', OLD_DRIVER)], snap['drivers']
    assert snap['gpu_operator']['cluster_policy']['driver_crd'] is True
    fleet.settle(horizon=3)
    assert _pods(operator) == start

    fleet.patch('v1', 'Node', 'gpu-1', {'spec': {'unschedulable': True}})   # drained: activate.yml requires it
    run = run_playbook(play([_role('activate', node_upgrade_node='gpu-1', node_upgrade_activation='lab',
                                   node_upgrade_lab_hook=HOOK, __node_upgrade_how='operator',
                                   node_upgrade_gpu_operator_managed=True)], []))
    assert run.rc == 0, run.stdout
    moved = run.result("Activate | The operator's driver container on the node at its DaemonSet's current revision")
    assert moved['waited']['done'] is True and len(moved['restarted']) == 1, moved
    assert _pool_driver_images(fleet) == {'gpu-1': new_image, 'gpu-2': old_image, 'gpu-3': old_image}

    run = run_playbook(play([_snapshot_back(qdir), _include('gpu_operator_back.yml')], ['gpu-1']))
    assert run.rc == 0, run.stdout
    pool = fleet.get('nvidia.com/v1alpha1', 'NVIDIADriver', 'gpu-pool')['spec']
    assert pool['version'] == OLD_DRIVER and 'tolerations' not in pool, pool
    # The ClusterPolicy without the canary toleration the step added (a merge patch names it null), so every
    # node not in a window runs its DaemonSets' current revision and the update strategy was restored.
    cp = fleet.get('nvidia.com/v1', 'ClusterPolicy', 'cluster-policy')['spec']
    assert 'tolerations' not in cp['daemonsets'] and cp['daemonsets']['updateStrategy'] == 'RollingUpdate', cp
    assert _pool_driver_images(fleet) == {n: old_image for n in NODES}
    fleet.settle(horizon=3)
    assert {uid: v for uid, v in _pods(operator).items() if v[0] != 'gpu-1'} == rest
