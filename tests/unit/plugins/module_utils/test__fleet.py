"""What the orchestration reads about a pool from Node objects and workloads."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fleet as F


def node(**kw):
    n = {'metadata': {'name': 'gpu-07', 'labels': {'nvidia.com/gpu.product': 'NVIDIA-H100', 'gpufleet.io/platform': 'SYS-821GE'},
                      'annotations': {'gpufleet.io/upgrade-state': 'drained', 'other': 'x'}},
         'spec': {'unschedulable': True, 'taints': [{'key': 'k', 'effect': 'NoSchedule'}]},
         'status': {'allocatable': {'nvidia.com/gpu': '8'},
                    'conditions': [{'type': 'Ready', 'status': 'True'}],
                    'nodeInfo': {'kernelVersion': '6.8.0-134-generic', 'kubeletVersion': 'v1.35.3+rke2r3'}}}
    n.update(kw)
    return n


def test_node_facts_give_the_planner_row():
    facts = F.node_facts(node())
    assert facts['name'] == 'gpu-07' and facts['gpus'] == 8 and facts['ready'] is True
    assert facts['unschedulable'] is True and facts['kernel'] == '6.8.0-134-generic'
    assert facts['rke2'] == 'v1.35.3+rke2r3' and facts['platform'] == 'SYS-821GE'
    assert facts['annotations'] == {'gpufleet.io/upgrade-state': 'drained'}


def test_gpu_capacity_falls_back_to_the_count_label_and_not_ready_without_condition():
    n = node(status={'allocatable': {}})
    n['metadata']['labels']['nvidia.com/gpu.count'] = '4'
    assert F.gpu_capacity(n) == 4 and F.is_ready(n) is False


@pytest.mark.parametrize('image,version', [
    ('nvcr.io/nvidia/gpu-operator:v26.3.3', 'v26.3.3'),
    ('registry:5000/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04@sha256:' + 'a' * 64, '4.4.1-4.6.0-ubuntu22.04'),
    ('registry:5000/nvidia/gpu-operator', None),
])
def test_image_version_reads_the_tag_not_the_registry_port(image, version):
    ds = {'spec': {'template': {'spec': {'containers': [{'name': 'main', 'image': image}]}}}}
    assert F.image_version(ds) == version


def test_resource_entries_are_validated_by_index_and_key():
    with pytest.raises(F.FleetError, match=r'resources\[1\].kind: required'):
        F.validate_resource(1, {'api_version': 'v1'})
    with pytest.raises(F.FleetError, match=r'resources\[0\]: unknown keys colour'):
        F.validate_resource(0, {'api_version': 'v1', 'kind': 'Node', 'colour': 'x'})
    assert F.plural_of('ResourceQuota') == 'resourcequotas' and F.plural_of('DeviceClass') == 'deviceclasses'
    assert F.plural_of('Policy') == 'policies'


def test_node_identity_uid_machine_id_and_system_uuid():
    n = node()
    assert F.node_identity(n) == {'uid': None, 'machine_id': None, 'system_uuid': None}
    n['metadata']['uid'] = 'u-1'
    n['status']['nodeInfo'].update(machineID='m' * 32, systemUUID='s-1')
    assert F.node_identity(n) == {'uid': 'u-1', 'machine_id': 'm' * 32, 'system_uuid': 's-1'}
    facts = F.node_facts(n)
    assert (facts['uid'], facts['machine_id'], facts['system_uuid']) == ('u-1', 'm' * 32, 's-1')


# ---- the pool (issue 39 item 9): an explicit selector as given; the default works without GPU Feature Discovery

def bare(name, labels=None, capacity=None, allocatable=None, annotations=None):
    """A Node as the kubelet registers it on a cluster without GPU Feature Discovery."""
    return {'metadata': {'name': name, 'labels': dict({'kubernetes.io/hostname': name}, **(labels or {})),
                         'annotations': dict(annotations or {})},
            'status': {'capacity': dict({'cpu': '64'}, **(capacity or {})),
                       'allocatable': dict({'cpu': '63'}, **(allocatable or {}))}}


@pytest.mark.parametrize('n,gpu', [
    (bare('gfd', labels={'nvidia.com/gpu.present': 'true'}), True),
    (bare('gfd-false', labels={'nvidia.com/gpu.present': 'false'}), False),
    (bare('nfd', labels={'feature.node.kubernetes.io/pci-10de.present': 'true'}), True),
    (bare('nfd-class', labels={'feature.node.kubernetes.io/pci-0302_10de.present': 'true'}), True),
    (bare('nfd-nic', labels={'feature.node.kubernetes.io/pci-0200_15b3.present': 'true'}), False),
    (bare('nfd-bridge', labels={'feature.node.kubernetes.io/pci-0680_10de.present': 'true'}), False),
    (bare('dp', capacity={'nvidia.com/gpu': '8'}, allocatable={'nvidia.com/gpu': '8'}), True),
    (bare('dp-unhealthy', capacity={'nvidia.com/gpu': '8'}, allocatable={'nvidia.com/gpu': '0'}), True),
    (bare('mig', capacity={'nvidia.com/mig-1g.10gb': '7'}), True),
    (bare('shared', allocatable={'nvidia.com/gpu.shared': '16'}), True),
    (bare('zero', capacity={'nvidia.com/gpu': '0'}, allocatable={'nvidia.com/gpu': '0'}), False),
    (bare('other-vendor', capacity={'amd.com/gpu': '8'}), False),
    (bare('mid-upgrade', annotations={'gpufleet.io/upgrade-state': 'drained'}), True),
    (bare('cpu', annotations={'other.io/x': 'y'}), False),
    ({'metadata': {'name': 'empty'}}, False),
])
def test_is_gpu_node_without_gpu_feature_discovery(n, gpu):
    assert F.is_gpu_node(n) is gpu


POOL = [bare('cpu-1'), bare('gpu-dp', capacity={'nvidia.com/gpu': '4'}),
        bare('gpu-gfd', labels={'nvidia.com/gpu.present': 'true'})]


def test_default_pool_lists_every_node_and_keeps_the_gpu_nodes():
    """Without GPU Feature Discovery the old default (labelSelector nvidia.com/gpu.present=true) chose no Node."""
    assert F.pool_query(None) == {}
    assert [n['metadata']['name'] for n in F.pool_nodes(POOL, None)] == ['gpu-dp', 'gpu-gfd']


@pytest.mark.parametrize('selector,query', [
    ('nvidia.com/gpu.present=true', {'labelSelector': 'nvidia.com/gpu.present=true'}),
    (' gpufleet.io/pool in (a,b) ', {'labelSelector': 'gpufleet.io/pool in (a,b)'}),
    ('', {}),
])
def test_an_explicit_selector_keeps_its_exact_meaning(selector, query):
    assert F.pool_query(selector) == query
    # the API chose them: a CPU node an explicit selector (or the empty one, every Node) returns stays
    assert [n['metadata']['name'] for n in F.pool_nodes(POOL, selector)] == ['cpu-1', 'gpu-dp', 'gpu-gfd']
    assert F.in_pool(POOL[0], selector) is True


def test_named_nodes_are_read_whatever_they_report():
    assert [n['metadata']['name'] for n in F.pool_nodes(POOL, None, named=True)] == ['cpu-1', 'gpu-dp', 'gpu-gfd']


@pytest.mark.parametrize('selector', [7, ['a=b'], {'a': 'b'}])
def test_a_selector_that_is_not_a_string_is_named(selector):
    with pytest.raises(F.FleetError, match=r'node_selector: .* is not a label selector string'):
        F.pool_query(selector)
