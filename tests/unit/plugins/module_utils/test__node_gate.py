"""Node integration gate: every check passes and fails with its evidence and message."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _node_gate as G
from ansible_collections.gpufleet.upgrade.plugins.module_utils._node_record import ANN_DONE, ANN_STATE


def node(name='gpu-1', ready='True', alloc=None, cap=None, taints=None, unschedulable=True):
    alloc = {'cpu': '64', 'nvidia.com/gpu': '8'} if alloc is None else alloc
    return {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name},
            'spec': {'unschedulable': unschedulable, 'taints': taints if taints is not None else [
                {'key': 'node.kubernetes.io/unschedulable', 'effect': 'NoSchedule'}]},
            'status': {'allocatable': alloc, 'capacity': dict(alloc if cap is None else cap),
                       'conditions': [{'type': 'Ready', 'status': ready, 'reason': 'KubeletReady'}]}}


def pod(name, labels, node_name='gpu-1', ready=True, phase='Running', ns='gpu-operator'):
    return {'metadata': {'name': name, 'namespace': ns, 'labels': labels},
            'spec': {'nodeName': node_name, 'containers': [{'name': 'c', 'image': 'nvcr.io/x:1'}]},
            'status': {'phase': phase, 'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False'}],
                       'containerStatuses': [{'restartCount': 2}]}}


DP = {'app': 'nvidia-device-plugin-daemonset'}
VAL = {'app': 'nvidia-operator-validator'}


def pods(dp_ready=True, validator=True, val_ready=True):
    out = [pod('nvidia-device-plugin-daemonset-abc', DP, ready=dp_ready),
           pod('nvidia-device-plugin-daemonset-xyz', DP, node_name='gpu-2', ready=False)]
    if validator:
        out.append(pod('nvidia-operator-validator-abc', VAL, ready=val_ready, phase='Running' if val_ready else 'Pending'))
    return out


def test_pass_with_evidence():
    r = G.evaluate('gpu-1', node(), pods(), {'nvidia.com/gpu': 8})
    assert r['passed'] is True and r['problems'] == []
    assert r['msg'] == 'node gate: PASS for gpu-1 (allocatable, device_plugin, ready, taints, validator)'
    assert r['checks']['allocatable']['evidence'] == {'nvidia.com/gpu': {'expected': 8, 'allocatable': 8, 'capacity': 8}}
    dp = r['checks']['device_plugin']['evidence']
    assert [p['name'] for p in dp['pods']] == ['nvidia-device-plugin-daemonset-abc']  # the other node's pod is not ours
    assert dp['pods'][0]['restarts'] == 2 and dp['registered_resources'] == ['nvidia.com/gpu']
    assert r['checks']['validator']['evidence']['present'] is True


def test_not_ready():
    r = G.evaluate('gpu-1', node(ready='False'), pods(), {'nvidia.com/gpu': 8})
    assert r['passed'] is False
    assert r['checks']['ready']['problems'] == ['node gpu-1 is not Ready (Ready=False, reason KubeletReady)']


def test_missing_node():
    r = G.evaluate('gpu-9', None, [], {'nvidia.com/gpu': 8})
    assert r['passed'] is False and r['problems'] == ['node gpu-9 does not exist']


def test_allocatable_short_missing_and_unexpected():
    r = G.evaluate('gpu-1', node(alloc={'nvidia.com/gpu': '7'}), pods(), {'nvidia.com/gpu': 8})
    assert r['checks']['allocatable']['problems'] == ['nvidia.com/gpu: allocatable 7, expected 8']
    r = G.evaluate('gpu-1', node(alloc={'cpu': '4'}), pods(), {'nvidia.com/gpu': 8})
    assert r['checks']['allocatable']['problems'] == [
        'nvidia.com/gpu: not in allocatable (expected 8): the device plugin has not registered it']
    assert r['checks']['device_plugin']['evidence']['registered_resources'] == []
    # MIG mixed strategy: per-profile resources; a left-over full-GPU resource is unexpected
    mig = {'nvidia.com/mig-1g.10gb': '56', 'nvidia.com/gpu': '1'}
    r = G.evaluate('gpu-1', node(alloc=mig), pods(), {'nvidia.com/mig-1g.10gb': 56})
    assert r['checks']['allocatable']['problems'] == [
        'nvidia.com/gpu: allocatable 1, not expected (partition layout or MIG strategy changed?)']
    r = G.evaluate('gpu-1', node(alloc={'nvidia.com/mig-1g.10gb': '56', 'nvidia.com/gpu': '0'}), pods(),
                   {'nvidia.com/mig-1g.10gb': 56})
    assert r['passed'] is True


def test_device_plugin_missing_or_not_ready():
    r = G.evaluate('gpu-1', node(), pods(dp_ready=False), {'nvidia.com/gpu': 8})
    assert r['checks']['device_plugin']['problems'] == [
        'device plugin pod gpu-operator/nvidia-device-plugin-daemonset-abc is not Ready (phase Running)']
    r = G.evaluate('gpu-1', node(), [p for p in pods() if p['metadata']['labels'] != DP], {'nvidia.com/gpu': 8})
    assert r['checks']['device_plugin']['problems'] == [
        'no device plugin pod (app=nvidia-device-plugin-daemonset) on node gpu-1']


def test_validator_optional_unless_required():
    r = G.evaluate('gpu-1', node(), pods(validator=False), {'nvidia.com/gpu': 8})
    assert r['passed'] is True and r['checks']['validator']['evidence']['present'] is False
    r = G.evaluate('gpu-1', node(), pods(validator=False), {'nvidia.com/gpu': 8}, validator_required=True)
    assert r['problems'] == ['no GPU Operator validator pod (app=nvidia-operator-validator) on node gpu-1']
    r = G.evaluate('gpu-1', node(), pods(val_ready=False), {'nvidia.com/gpu': 8})
    assert r['problems'] == ['GPU Operator validator pod gpu-operator/nvidia-operator-validator-abc is not Ready '
                             '(phase Pending)']
    r = G.evaluate('gpu-1', node(), pods(val_ready=False), {'nvidia.com/gpu': 8}, validator_selector=None)
    assert r['passed'] is True and 'validator' not in r['checks']


def test_taints():
    taints = [{'key': 'node.kubernetes.io/unschedulable', 'effect': 'NoSchedule'},
              {'key': 'gpufleet.io/canary', 'value': 'true', 'effect': 'NoSchedule'},
              {'key': 'nvidia.com/gpu-broken', 'effect': 'NoExecute'}]
    r = G.evaluate('gpu-1', node(taints=taints), pods(), {'nvidia.com/gpu': 8}, allowed_taints=['gpufleet.io/canary'])
    assert r['checks']['taints']['problems'] == ['unexpected taint nvidia.com/gpu-broken:NoExecute']
    r = G.evaluate('gpu-1', node(taints=taints), pods(), {'nvidia.com/gpu': 8},
                   allowed_taints=['gpufleet.io/canary=false', 'nvidia.com/gpu-broken'])
    assert r['checks']['taints']['problems'] == ['unexpected taint gpufleet.io/canary=true:NoSchedule']


def test_selectors():
    sel = G.parse_label_selector('app=x, tier!=web,gpu,!cpu')
    assert sel == [('=', 'app', 'x'), ('!=', 'tier', 'web'), ('exists', 'gpu', None), ('!exists', 'cpu', None)]
    assert G.label_selector_matches({'app': 'x', 'gpu': ''}, sel)
    assert not G.label_selector_matches({'app': 'x', 'gpu': '', 'cpu': '1'}, sel)
    assert not G.label_selector_matches({'app': 'x', 'tier': 'web', 'gpu': ''}, sel)
    with pytest.raises(G.NodeGateError, match=r"device_plugin_selector: 'app in \(a\)' is not an equality-based"):
        G.parse_label_selector('app in (a)', 'device_plugin_selector')


@pytest.mark.parametrize('expected, message', [
    ({}, 'expected_gpus: {} is not a non-empty dict'),
    ({'cpu': 8}, "expected_gpus: 'cpu' is not a GPU resource"),
    ({'nvidia.com/gpu': 'eight'}, "expected_gpus.nvidia.com/gpu: 'eight' is not a non-negative integer"),
    ({'nvidia.com/gpu': True}, 'expected_gpus.nvidia.com/gpu: True is not a non-negative integer'),
])
def test_bad_expected(expected, message):
    with pytest.raises(G.NodeGateError) as exc:
        G.evaluate('gpu-1', node(), pods(), expected)
    assert message in str(exc.value)


def test_inputs_not_modified():
    n, p = node(), pods()
    before = copy.deepcopy((n, p))
    G.evaluate('gpu-1', n, p, {'nvidia.com/gpu': 8})
    assert (n, p) == before


def with_image(p, image, deleting=False):
    p = copy.deepcopy(p)
    p['spec']['containers'] = [{'name': 'exporter', 'image': image}]
    if deleting:
        p['metadata']['deletionTimestamp'] = '2026-12-01T12:00:00Z'
    return p


def test_measure_reads_the_cluster_side_of_the_tuple():
    n = node()
    n['status']['nodeInfo'] = {'kernelVersion': '6.8.0-135-generic', 'kubeletVersion': 'v1.36.1+rke2r1'}
    exporter = pod('dcgm-exporter-x', {'app': 'nvidia-dcgm-exporter'})
    here = with_image(exporter, 'nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04')
    elsewhere = with_image(pod('dcgm-exporter-y', {'app': 'nvidia-dcgm-exporter'}, node_name='gpu-2'),
                           'nvcr.io/nvidia/k8s/dcgm-exporter:9.9.9')
    old = with_image(pod('dcgm-exporter-old', {'app': 'nvidia-dcgm-exporter'}), 'dcgm-exporter:4.0.0', deleting=True)
    container = {'name': 'gpu-operator', 'image': 'nvcr.io/nvidia/gpu-operator:v26.3.3'}
    operator = {'spec': {'template': {'spec': {'containers': [container]}}}}
    m = G.measure('gpu-1', n, pods() + [here, elsewhere, old], gpu_operator=operator)
    assert m == {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04',
                 'gpu_operator': 'v26.3.3'}


def test_measure_unknown_when_absent_or_ambiguous():
    assert G.measure('gpu-1', None, []) == {'kernel': None, 'rke2': None, 'dcgm_exporter': None, 'gpu_operator': None}
    two = [with_image(pod('a', {'app': 'nvidia-dcgm-exporter'}), 'x/dcgm-exporter:1'),
           with_image(pod('b', {'app': 'nvidia-dcgm-exporter'}), 'x/dcgm-exporter:2')]
    assert G.measure('gpu-1', node(), two)['dcgm_exporter'] is None
    with pytest.raises(G.NodeGateError, match='dcgm_exporter_selector'):
        G.measure('gpu-1', node(), [], dcgm_exporter_selector='a in (b)')


def test_image_artifacts_carry_the_digest_the_kubelet_pulled_or_none():
    sha = 'sha256:' + 'ab' * 32
    exporter = pod('dcgm-exporter-1', {'app': 'nvidia-dcgm-exporter'})
    exporter['spec']['containers'] = [{'name': 'exporter', 'image': 'nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04'}]
    exporter['status']['containerStatuses'] = [{'name': 'exporter', 'imageID': 'nvcr.io/nvidia/k8s/dcgm-exporter@' + sha.upper()}]
    other = pod('dcgm-exporter-2', {'app': 'nvidia-dcgm-exporter'}, node_name='gpu-2')
    other['spec']['containers'] = [{'name': 'exporter', 'image': 'elsewhere:1'}]
    operator = {'spec': {'template': {'spec': {'containers': [{'image': 'nvcr.io/nvidia/gpu-operator:v26.3.4'}]}}}}
    arts = G.image_artifacts('gpu-1', [exporter, other], 'app=nvidia-dcgm-exporter', operator)
    assert arts == [{'kind': 'image', 'name': 'nvcr.io/nvidia/gpu-operator:v26.3.4', 'version': 'v26.3.4'},
                    {'kind': 'image', 'name': 'nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04',
                     'version': '4.4.1-4.6.0-ubuntu22.04', 'digest': sha}]
    # A reference pinned by digest gives it without a status; no status and no pin gives none.
    pinned = {'spec': {'containers': [{'image': 'nvcr.io/nvidia/gpu-operator@' + sha}]}}
    assert G.image_artifacts('gpu-1', [], 'app=x', pinned) == [
        {'kind': 'image', 'name': 'nvcr.io/nvidia/gpu-operator@' + sha, 'digest': sha}]
    exporter['status']['containerStatuses'] = []
    assert 'digest' not in G.image_artifacts('gpu-1', [exporter], 'app=nvidia-dcgm-exporter')[0]


def test_no_known_count_asks_capacity_in_full():
    # an observation window re-gating a node an earlier run upgraded: no count known, capacity is the rule
    r = G.evaluate('gpu-1', node(), pods(), None)
    assert r['passed'] is True
    assert r['checks']['allocatable']['evidence'] == {
        'expected_from': 'capacity', 'nvidia.com/gpu': {'expected': 8, 'allocatable': 8, 'capacity': 8}}
    r = G.evaluate('gpu-1', node(alloc={'nvidia.com/gpu': '7'}, cap={'nvidia.com/gpu': '8'}), pods(), None)
    assert r['passed'] is False and r['problems'] == ['nvidia.com/gpu: allocatable 7, expected 8']
    r = G.evaluate('gpu-1', node(alloc={'cpu': '64'}), pods(), None)
    assert r['problems'] == ['no GPU resource in the capacity of node gpu-1: the device plugin registered none']


def test_many_nodes_from_one_read():
    objects = {'gpu-1': node(), 'gpu-2': node('gpu-2', ready='False')}
    r = G.evaluate_nodes({'gpu-1': {'nvidia.com/gpu': 8}, 'gpu-2': None, 'gpu-3': None}, objects, pods())
    assert r['passed'] is False and r['failed_nodes'] == ['gpu-2', 'gpu-3']
    assert r['nodes']['gpu-1']['passed'] is True
    assert 'gpu-2: node gpu-2 is not Ready (Ready=False, reason KubeletReady)' in r['problems']
    assert 'gpu-2: device plugin pod gpu-operator/nvidia-device-plugin-daemonset-xyz is not Ready (phase Running)' in r['problems']
    assert 'gpu-3: node gpu-3 does not exist' in r['problems']
    assert r['msg'].startswith('node gate: FAIL for 2 of 3 node(s): gpu-2: ')
    ok = G.evaluate_nodes({'gpu-1': {'nvidia.com/gpu': 8}}, objects, pods())
    assert ok['passed'] is True and ok['failed_nodes'] == [] and ok['msg'] == 'node gate: PASS for 1 node(s)'


@pytest.mark.parametrize('nodes, message', [
    ({}, 'nodes: {} is not a non-empty dict'),
    (['gpu-1'], "nodes: ['gpu-1'] is not a non-empty dict"),
    ({' ': None}, "nodes: ' ' is not a node name"),
    ({'gpu-1': {'cpu': 1}}, "nodes.gpu-1.expected_gpus: 'cpu' is not a GPU resource"),
])
def test_bad_nodes(nodes, message):
    with pytest.raises(G.NodeGateError, match=message.replace('[', r'\[').replace(']', r'\]').replace('.', r'\.')):
        G.validate_nodes(nodes)
    assert G.validate_nodes({'gpu-1': {}, 'gpu-2': {'nvidia.com/gpu': '8'}}) == {'gpu-1': None, 'gpu-2': {'nvidia.com/gpu': 8}}


@pytest.mark.parametrize('selectors, lists', [
    # the defaults: one key, two values -> one set-based list
    ((G.DEFAULT_DEVICE_PLUGIN_SELECTOR, G.DEFAULT_VALIDATOR_SELECTOR),
     ['app in (nvidia-device-plugin-daemonset,nvidia-operator-validator)']),
    (('app==a', 'app=b'), ['app in (a,b)']),
    # the validator skipped (empty), or the same selector twice: one list of it
    (('app=a', ''), ['app=a']),
    (('app=a', None), ['app=a']),
    (('app=a', 'app=a'), ['app=a']),
    # not one equality on one shared key: one list each
    (('app=a', 'name=b'), ['app=a', 'name=b']),
    (('app=a,tier=x', 'app=b'), ['app=a,tier=x', 'app=b']),
    (('app!=a', 'app=b'), ['app!=a', 'app=b']),
    (('app', 'app=b'), ['app', 'app=b']),
    (('app=', 'app=b'), ['app=', 'app=b']),
])
def test_pod_list_selectors_fold_one_key_into_one_list(selectors, lists):
    assert G.pod_list_selectors(*selectors) == lists


def test_pod_list_selectors_reject_a_bad_selector():
    with pytest.raises(G.NodeGateError, match="'app in x' is not an equality-based"):
        G.pod_list_selectors('app in x', 'app=b')


def test_gated_nodes_judges_only_those_the_read_records_finished():
    done = node('gpu-1')
    done['metadata']['annotations'] = {ANN_DONE: 'key-1'}
    busy = node('gpu-2')     # recorded done for the key, but another upgrade is in progress on it
    busy['metadata']['annotations'] = {ANN_DONE: 'key-1', ANN_STATE: 'drain'}
    other = node('gpu-3')    # finished another target
    other['metadata']['annotations'] = {ANN_DONE: 'key-0'}
    objects = {'gpu-1': done, 'gpu-2': busy, 'gpu-3': other}
    wanted = {'gpu-1': {'nvidia.com/gpu': 8}, 'gpu-2': None, 'gpu-3': None, 'gpu-4': None}
    assert G.gated_nodes(wanted, objects, 'key-1') == ({'gpu-1': {'nvidia.com/gpu': 8}}, ['gpu-2', 'gpu-3', 'gpu-4'])
    # without a key every node is judged (a missing one then fails the gate: evaluate_nodes)
    assert G.gated_nodes(wanted, objects) == (wanted, [])
    for bad in ('', '  ', 7):
        with pytest.raises(G.NodeGateError, match=r'^finished_for: .* is not a target key$'):
            G.gated_nodes(wanted, objects, bad)
    # the same read's view of each named node that exists, by name
    views = G.node_views(['gpu-3', 'gpu-1', 'gpu-4'], objects)
    assert [(v['name'], v['ready'], v['annotations']) for v in views] == [
        ('gpu-1', True, {ANN_DONE: 'key-1'}), ('gpu-3', True, {ANN_DONE: 'key-0'})]


# -- issue 39 item 9: a MIG node's expectation comes from its own layout ----------------------------
def _baseline(*mig):
    return {'gpus': [{'index': i, 'mig_mode': {'current': m, 'pending': m}} for i, m in enumerate(mig)]}


def test_expected_from_baseline():
    assert G.expected_from_baseline({}, _baseline(False, False)) == {'nvidia.com/gpu': 2}
    assert G.expected_from_baseline(None, _baseline(None)) == {'nvidia.com/gpu': 1}       # MIG not supported
    assert G.expected_from_baseline({}, _baseline(False, True)) == {}                     # MIG on: its layout decides
    assert G.expected_from_baseline({'nvidia.com/mig-1g.10gb': '14'}, _baseline(True)) == {'nvidia.com/mig-1g.10gb': 14}
    with pytest.raises(G.NodeGateError, match="expected_gpus: 'gpu' is not a GPU resource"):
        G.expected_from_baseline({'gpu': 1}, _baseline(False))
    with pytest.raises(G.NodeGateError, match='baseline: .* has no list of GPUs'):
        G.expected_from_baseline({}, {'driver_version': '580'})


def test_a_mig_layout_passes_the_capacity_check_and_a_lost_instance_fails_it():
    node = {'metadata': {'name': 'gpu-mig'}, 'spec': {},
            'status': {'conditions': [{'type': 'Ready', 'status': 'True'}],
                       'capacity': {'nvidia.com/mig-1g.10gb': '14', 'nvidia.com/gpu': '0'},
                       'allocatable': {'nvidia.com/mig-1g.10gb': '14', 'nvidia.com/gpu': '0'}}}
    expected = G.expected_from_baseline({}, _baseline(True, True))
    verdict = G.evaluate('gpu-mig', node, [], expected or None, validator_selector=None)
    assert verdict['checks']['allocatable']['passed'] is True, verdict['checks']['allocatable']
    node['status']['allocatable']['nvidia.com/mig-1g.10gb'] = '13'
    verdict = G.evaluate('gpu-mig', node, [], expected or None, validator_selector=None)
    assert verdict['checks']['allocatable']['passed'] is False
