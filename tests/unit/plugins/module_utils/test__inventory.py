"""Unit tests of the gpu_nodes inventory plugin's decisions (plugins/module_utils/_inventory.py): host names,
host vars and groups from Node objects as the API server answers them."""
from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _inventory as I

from cluster import fixtures as f


def record(node: dict) -> dict:
    return I.node_record(node)


def entries(nodes: list[dict], hostname=('name',), ansible_host=()) -> dict:
    out = I.host_entries([record(n) for n in nodes], I.parse_sources('hostname', list(hostname)),
                         I.parse_sources('ansible_host', list(ansible_host)))
    return {e['name']: e for e in out}


def test_sources_are_checked_and_name_the_option():
    assert I.parse_sources('hostname', ['name', 'InternalIP', 'label:a/b', 'annotation: x ']) == [
        ('name', ''), ('address', 'InternalIP'), ('label', 'a/b'), ('annotation', 'x')]
    assert I.parse_sources('hostname', 'ExternalIP') == [('address', 'ExternalIP')]
    assert I.parse_sources('ansible_host', None) == [] and I.parse_sources('ansible_host', []) == []
    with pytest.raises(I.InventoryConfigError, match=r"^hostname: 'PodIP' is not a source \(use name, InternalIP"):
        I.parse_sources('hostname', ['PodIP'])
    with pytest.raises(I.InventoryConfigError, match=r"^ansible_host: 'label:' names no label key"):
        I.parse_sources('ansible_host', ['label:'])
    with pytest.raises(I.InventoryConfigError, match=r"^hostname: 3 is not a source"):
        I.parse_sources('hostname', [3])
    with pytest.raises(I.InventoryConfigError, match=r"^hostname: \{'a': 1\} is not a list of sources"):
        I.parse_sources('hostname', {'a': 1})
    with pytest.raises(I.InventoryConfigError, match=r'^hostname: give at least one source'):
        I.host_entries([], [], [])


def test_a_gpu_node_gets_its_node_name_role_facts_and_combination_groups():
    n = f.gpu_node('gpu-a', internal_ip='10.1.2.3', labels={'gpufleet.io/platform': 'DGX H100'},
                   annotations={'kubectl.kubernetes.io/last-applied-configuration': '{}', 'gpufleet.io/canary': 'x'})
    e = entries([n], ansible_host=['InternalIP'])['gpu-a']
    v = e['vars']
    assert v['gpufleet_node_name'] == 'gpu-a' and v['gpufleet_rke2_role'] == 'agent' and v['ansible_host'] == '10.1.2.3'
    node = v['gpufleet_node']
    assert (node['kernel'], node['kernel_line'], node['rke2_version']) == ('6.8.0-134-generic', '6.8', 'v1.34.2+rke2r1')
    assert (node['platform'], node['gpu_product'], node['gpus']) == ('DGX H100', 'NVIDIA-H100-80GB-HBM3', 8)
    assert (node['partition_mode'], node['mig_strategy'], node['install_method']) == ('none', 'single', None)
    assert node['labels']['nvidia.com/gpu.present'] == 'true' and node['ready'] is True
    assert e['groups'] == ['gpu_nodes', 'gpufleet_rke2_agent', 'gpufleet_platform_dgx_h100', 'gpufleet_partition_none',
                           'gpufleet_kernel_6_8', 'gpufleet_gpu_nvidia_h100_80gb_hbm3']
    # what the cache keeps is JSON, without kubectl's copy of the object
    rec = record(n)
    assert json.loads(json.dumps(rec)) == rec and rec['annotations'] == {'gpufleet.io/canary': 'x'}


def test_platform_falls_back_as_the_plan_reads_it():
    typed = f.gpu_node('a', labels={'node.kubernetes.io/instance-type': 'p5.48xlarge'})
    e = entries([typed, f.gpu_node('b')])
    assert e['a']['vars']['gpufleet_node']['platform'] == 'p5.48xlarge' and 'gpufleet_platform_p5_48xlarge' in e['a']['groups']
    assert e['b']['vars']['gpufleet_node']['platform'] == 'unknown' and 'gpufleet_platform_unknown' in e['b']['groups']


@pytest.mark.parametrize('labels,role', [
    ({'node-role.kubernetes.io/control-plane': 'true'}, 'server'),
    ({'node-role.kubernetes.io/etcd': 'true'}, 'server'),
    ({'node-role.kubernetes.io/master': ''}, 'server'),
    # present means server, as for suc_plan and preflight (_rke2.node_role): one decision for the role
    ({'node-role.kubernetes.io/control-plane': 'false'}, 'server'),
    ({}, 'agent'),
])
def test_rke2_role_from_the_role_labels(labels, role):
    e = entries([f.gpu_node('n', labels=labels)])['n']
    assert e['vars']['gpufleet_rke2_role'] == role and 'gpufleet_rke2_%s' % role in e['groups']


@pytest.mark.parametrize('kwargs,mode', [
    ({'mig': {'1g.10gb': 7}}, 'mig'),
    ({'labels': {'nvidia.com/mig.config': 'all-1g.10gb'}}, 'mig'),
    ({'labels': {'nvidia.com/mig.config': 'all-disabled'}}, 'none'),
    ({'mig': {'1g.10gb': 0}}, 'none'),
    ({}, 'none'),
])
def test_partition_mode_from_mig_resources_and_the_mig_config_label(kwargs, mode):
    e = entries([f.gpu_node('n', **kwargs)])['n']
    assert e['vars']['gpufleet_node']['partition_mode'] == mode and 'gpufleet_partition_%s' % mode in e['groups']


def test_install_method_only_where_a_label_says_it_and_never_as_the_run_variable():
    e = entries([f.gpu_node('n', labels={'gpufleet.io/install-method': 'Operator'})])['n']
    assert e['vars']['gpufleet_node']['install_method'] == 'Operator' and 'gpufleet_install_operator' in e['groups']
    assert 'gpufleet_install_method' not in e['vars']     # the playbooks' run variable stays the user's


def test_an_unparseable_kernel_gets_no_kernel_group():
    e = entries([f.gpu_node('n', kernel='weird')])['n']
    assert e['vars']['gpufleet_node']['kernel_line'] is None and not any(g.startswith('gpufleet_kernel_') for g in e['groups'])


def test_host_names_from_sources_in_order():
    a = f.gpu_node('node-a', internal_ip='10.0.0.1', labels={'example.com/fqdn': 'a.example.net'},
                   annotations={'example.com/ssh': 'a-ssh.example.net'})
    b = f.gpu_node('node-b', internal_ip='10.0.0.2')
    assert sorted(entries([a, b], hostname=['InternalIP'])) == ['10.0.0.1', '10.0.0.2']
    by_label = entries([a, b], hostname=['label:example.com/fqdn', 'name'])
    assert sorted(by_label) == ['a.example.net', 'node-b']
    assert by_label['a.example.net']['vars']['gpufleet_node_name'] == 'node-a'
    by_ann = entries([a], hostname=['annotation:example.com/ssh'], ansible_host=['ExternalIP', 'Hostname'])
    assert by_ann['a-ssh.example.net']['vars']['ansible_host'] == 'node-a'


def test_a_node_no_source_names_and_a_shared_host_name_are_errors_naming_the_nodes():
    a = f.gpu_node('node-a', labels={'example.com/rack': 'r1'})
    b = f.gpu_node('node-b', labels={'example.com/rack': 'r1'})
    with pytest.raises(I.InventoryConfigError, match=r'^hostname: Node node-a has no value for any of ExternalIP, label:x$'):
        entries([a], hostname=['ExternalIP', 'label:x'])
    with pytest.raises(I.InventoryConfigError, match=r'^ansible_host: Node node-a has no value for any of ExternalIP$'):
        entries([a], ansible_host=['ExternalIP'])
    with pytest.raises(I.InventoryConfigError,
                       match=r'^hostname: Nodes node-a and node-b both give the host name r1 \(label:example.com/rack\)'):
        entries([a, b], hostname=['label:example.com/rack'])


def test_a_node_without_a_name_is_refused():
    with pytest.raises(I.InventoryConfigError, match='the API answered a Node without a name'):
        I.node_record({'metadata': {}})


def test_group_names_are_valid():
    assert I.group_name('gpufleet_gpu_', 'NVIDIA A100-SXM4-40GB (MIG)') == 'gpufleet_gpu_nvidia_a100_sxm4_40gb__mig_'


def test_only_records_node_record_wrote_are_taken_from_the_cache():
    assert I.are_records([record(f.gpu_node('a'))]) and I.are_records([])
    assert not I.are_records(None) and not I.are_records({'a': 1}) and not I.are_records([{'name': 'a'}])
