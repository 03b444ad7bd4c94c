"""Unit tests of GPU holder classification (plugins/module_utils/_holders.py)."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _holders as H

import k8s_scenario as S


def _split(objs):
    pods = [o for o in objs if o['kind'] == 'Pod']
    vmis = [o for o in objs if o['kind'] == 'VirtualMachineInstance']
    claims = [o for o in objs if o['kind'] == 'ResourceClaim']
    for i, p in enumerate(pods):
        p['metadata'].setdefault('uid', 'uid-%d' % i)
    return pods, vmis, claims


def test_scenario_is_classified_exactly():
    pods, vmis, claims = _split(S.scenario())
    holders = H.classify(pods, vmis, claims)
    assert [S.holder_key(h) for h in holders] == S.EXPECTED_HOLDERS


def test_by_node_counts_every_kind_and_lists_idle_nodes():
    pods, vmis, claims = _split(S.scenario())
    counts = H.by_node(H.classify(pods, vmis, claims), nodes=['gpu-1', 'gpu-2', 'gpu-3'])
    assert counts == {
        'gpu-1': {'Pod': 7, 'VirtualMachineInstance': 1, 'ResourceClaim': 1, 'total': 9},
        'gpu-2': {'Pod': 1, 'VirtualMachineInstance': 0, 'ResourceClaim': 0, 'total': 1},
        'gpu-3': {'Pod': 0, 'VirtualMachineInstance': 0, 'ResourceClaim': 0, 'total': 0},
    }


def test_nodes_filter_keeps_only_those_nodes():
    pods, vmis, claims = _split(S.scenario())
    holders = H.classify(pods, vmis, claims, nodes=['gpu-2'])
    assert [(h['kind'], h['name']) for h in holders] == [('Pod', 'other-gpu')]


def test_launcher_pod_is_reported_under_its_vmi_never_as_a_pod():
    launcher = S.launcher_pod('vm-gpu', resource='nvidia.com/gpu')
    holders = H.classify([launcher], [S.vmi('vm-gpu')])
    assert [(h['kind'], h['name']) for h in holders] == [('VirtualMachineInstance', 'vm-gpu')]
    assert holders[0]['reasons'] == ['VMI gpu nvidia.com/GH100_H100', 'launcher pod resource nvidia.com/gpu']
    assert holders[0]['launcher_pod'] == 'virt-launcher-vm-gpu-x7k2p'


def test_launcher_pod_with_gpu_resource_makes_a_vmi_holder_even_without_vmi_devices():
    launcher = S.launcher_pod('vm-vgpu', resource='nvidia.com/gpu')
    holders = H.classify([launcher], [S.vmi('vm-vgpu', gpu=None)])
    assert [(h['kind'], h['name'], h['reason']) for h in holders] == [
        ('VirtualMachineInstance', 'vm-vgpu', 'launcher pod resource nvidia.com/gpu')]


def test_vmi_without_gpu_is_not_a_holder_and_its_launcher_is_not_a_pod_holder():
    assert H.classify([S.launcher_pod('plain', resource=None)], [S.vmi('plain', gpu=None)]) == []


def test_host_device_vmi_holds_gpus():
    holders = H.classify([], [S.vmi('pt', gpu=None, host_device='nvidia.com/GA100')])
    assert holders[0]['reason'] == 'VMI hostDevice nvidia.com/GA100'


@pytest.mark.parametrize('phase', ['Succeeded', 'Failed'])
def test_finished_pods_hold_nothing(phase):
    assert H.classify([S.pod('done', resources={'nvidia.com/gpu': '1'}, phase=phase)]) == []


def test_unscheduled_pod_holds_nothing():
    assert H.classify([S.pod('pending', node_name='', resources={'nvidia.com/gpu': '1'}, phase='Pending')]) == []


def test_zero_quantity_is_not_a_request():
    assert H.classify([S.pod('zero', resources={'nvidia.com/gpu': '0'})]) == []


def test_init_container_gpu_counts():
    p = S.pod('init')
    p['spec']['initContainers'] = [{'name': 'i', 'resources': {'limits': {'nvidia.com/mig-3g.40gb': '1'}}}]
    assert H.classify([p])[0]['reason'] == 'resource nvidia.com/mig-3g.40gb'


def test_custom_options_replace_defaults():
    pods = [S.pod('a', resources={'nvidia.com/gpu': '1'}), S.pod('b', runtime_class='nvidia-cdi'),
            S.pod('c', resources={'amd.com/gpu': '1'})]
    holders = H.classify(pods, gpu_resources=['amd.com/*'], runtime_classes=['nvidia-cdi'])
    assert [(h['name'], h['reason']) for h in holders] == [('b', 'runtimeClass nvidia-cdi'),
                                                           ('c', 'resource amd.com/gpu')]


def test_claim_of_another_driver_is_not_a_holder_and_does_not_make_its_pod_one():
    c = S.claim('net', driver='sriov.example.com', reserved_for=['p'])
    assert H.classify([S.pod('p', claims=['net'])], claims=[c]) == []


def test_claim_from_template_resolved_through_pod_status():
    p = S.pod('tp')
    p['spec']['resourceClaims'] = [{'name': 'gpu', 'resourceClaimTemplateName': 'tmpl'}]
    p['status']['resourceClaimStatuses'] = [{'name': 'gpu', 'resourceClaimName': 'tp-gpu-xyz'}]
    holders = H.classify([p], claims=[S.claim('tp-gpu-xyz', reserved_for=['tp'])])
    assert [(h['kind'], h['name'], h['reason']) for h in holders] == [
        ('Pod', 'tp', 'DRA claim tp-gpu-xyz'), ('ResourceClaim', 'tp-gpu-xyz', 'DRA devices gpu.nvidia.com gpu-0')]
    assert holders[1]['phase'] == 'Reserved'


def test_claim_node_falls_back_to_reserved_pod():
    c = S.claim('c1', reserved_for=['p'])
    del c['status']['allocation']['nodeSelector']
    p = S.pod('p', node_name='gpu-9', uid='u-9')
    c['status']['reservedFor'][0]['uid'] = 'u-9'
    assert H.claim_node(c, {'u-9': p}) == 'gpu-9'


def test_several_reasons_are_joined():
    p = S.pod('multi', resources={'nvidia.com/gpu': '1'}, runtime_class='nvidia')
    h = H.classify([p])[0]
    assert h['reason'] == 'resource nvidia.com/gpu; runtimeClass nvidia'
    assert h['reasons'] == ['resource nvidia.com/gpu', 'runtimeClass nvidia']


def test_node_advertises_gpu():
    assert H.node_advertises_gpu(S.node('a'), H.DEFAULT_GPU_RESOURCES)
    assert not H.node_advertises_gpu(S.node('b', gpus=0), H.DEFAULT_GPU_RESOURCES)
    assert H.node_advertises_gpu(S.node('c', gpus=0, extra_resources={'nvidia.com/mig-1g.10gb': '7'}),
                                 H.DEFAULT_GPU_RESOURCES)


def test_shared_gpus_are_gpu_resources_by_default():
    # Defect fixed in issue 13: the default list missed nvidia.com/gpu.shared (time-slicing or MPS
    # with renameByDefault), so such a pod was no GPU holder and such a node no GPU node.
    p = S.pod('ts', resources={'nvidia.com/gpu.shared': '1'})
    assert H.pod_gpu_resources(p, H.DEFAULT_GPU_RESOURCES) == ['nvidia.com/gpu.shared']
    assert [h['reason'] for h in H.classify([p])] == ['resource nvidia.com/gpu.shared']
    assert H.node_advertises_gpu(S.node('d', gpus=0, extra_resources={'nvidia.com/gpu.shared': '16'}),
                                 H.DEFAULT_GPU_RESOURCES)


def test_slice_nodes():
    slices = [{'spec': {'driver': 'gpu.nvidia.com', 'nodeName': 'n2'}},
              {'spec': {'driver': 'other', 'nodeName': 'n3'}},
              {'spec': {'driver': 'gpu.nvidia.com', 'nodeName': 'n1'}}]
    assert H.slice_nodes(slices, ['gpu.nvidia.com']) == ['n1', 'n2']


@pytest.mark.parametrize('opt,value,err', [
    ('gpu_resources', '', "gpu_resources: '' is not a valid name"),
    ('gpu_resources', 'nvidia.com/*gpu', "gpu_resources: 'nvidia.com/*gpu': * is allowed only at the end"),
    ('runtime_classes', '*', "runtime_classes: '*' is not a valid name"),
    ('dra_drivers', 3, 'dra_drivers: 3 is not a valid name'),
])
def test_validate_options_names_field_and_value(opt, value, err):
    kwargs = {'gpu_resources': ['nvidia.com/gpu'], 'runtime_classes': ['nvidia'], 'dra_drivers': ['gpu.nvidia.com']}
    kwargs[opt] = [value]
    with pytest.raises(H.HolderOptionError) as exc:
        H.validate_options(**kwargs)
    assert str(exc.value).startswith(err)


def test_classify_does_not_modify_input():
    pods, vmis, claims = _split(S.scenario())
    before = copy.deepcopy((pods, vmis, claims))
    H.classify(pods, vmis, claims)
    assert (pods, vmis, claims) == before


def test_streaming_classifier_equals_one_shot_classification():
    pods, vmis, claims = _split(S.scenario())
    c = H.Classifier(vmis, claims)
    for i in range(0, len(pods), 3):           # pages of 3, the VMI's launcher pod in a later page
        c.add_pods(pods[i:i + 3])
    assert [S.holder_key(h) for h in c.holders()] == S.EXPECTED_HOLDERS


def test_streaming_claim_without_node_selector_takes_the_node_of_its_reserved_pod():
    claim = S.claim('c1', reserved_for=['p'])
    del claim['status']['allocation']['nodeSelector']
    claim['status']['reservedFor'][0]['uid'] = 'u-7'
    c = H.Classifier((), [claim])
    c.add_pods([S.pod('other', node_name='gpu-3', uid='u-1')])
    c.add_pods([S.pod('p', node_name='gpu-7', uid='u-7', claims=['c1'])])
    assert [(h['kind'], h['name'], h['node']) for h in c.holders()] == [
        ('Pod', 'p', 'gpu-7'), ('ResourceClaim', 'c1', 'gpu-7')]
