"""Node name != inventory name end to end (issue 39 item 3): the plan's NVML join, and the filters the
canary, rollout, rollback and release use to turn the plan's Node names into the existing inventory hosts."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.filter import rollout as F
from ansible_collections.gpufleet.upgrade.plugins.filter.upgrade_plan import planner_nodes_filter

FACTS = {'pci_ids': ['10de:2330/10de:16c1'], 'driver_version': '570.172.08', 'gpus': []}
# hostvars as a play sees them: FQDN inventory hosts that name their Node, and one host named as its Node
HOSTVARS = {
    'gpu-h100-03.example.com': {'gpufleet_node_name': 'gpu-h100-03', 'gpufleet_gpu_facts': FACTS},
    'gpu-h100-04.example.com': {'gpufleet_node_name': 'gpu-h100-04', 'gpufleet_gpu_facts': FACTS},
    'gpu-a100-01': {'gpufleet_gpu_facts': dict(FACTS, pci_ids=['10de:20b2/10de:1463'])},
    'localhost': {},
}


def fleet(*names):
    return {'cluster': {}, 'nodes': [{'name': n, 'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'ready': True,
                                      'unschedulable': False, 'gpus': 8, 'labels': {}} for n in names]}


def test_planner_nodes_joins_a_node_to_the_host_that_names_it():
    nodes = planner_nodes_filter(fleet('gpu-h100-03', 'gpu-h100-04', 'gpu-a100-01'), HOSTVARS, {}, 'apt',
                                 hosts=['gpu-h100-03.example.com', 'gpu-h100-04.example.com', 'gpu-a100-01'])
    assert [(n['name'], n['pci_ids'], n['current']['driver']) for n in nodes] == [
        ('gpu-h100-03', ['10de:2330/10de:16c1'], '570.172.08'), ('gpu-h100-04', ['10de:2330/10de:16c1'], '570.172.08'),
        ('gpu-a100-01', ['10de:20b2/10de:1463'], '570.172.08')]
    # hosts default to every inventory host
    assert planner_nodes_filter(fleet('gpu-h100-03'), HOSTVARS)[0]['pci_ids'] == ['10de:2330/10de:16c1']


def test_planner_nodes_refuses_a_pool_node_without_a_gpu_host_naming_it():
    with pytest.raises(AnsibleFilterError) as err:
        planner_nodes_filter(fleet('gpu-h100-03', 'gpu-h100-09'), HOSTVARS, {}, 'apt',
                             hosts=['gpu-h100-03.example.com', 'gpu-h100-04.example.com'])
    assert str(err.value).startswith('gpufleet.upgrade.planner_nodes: GPU hosts (gpufleet_hosts): Node(s) gpu-h100-09 '
                                     'have no inventory host')
    # a host outside gpufleet_hosts does not count; an excluded Node needs none (its combination is left out)
    with pytest.raises(AnsibleFilterError, match='Node\\(s\\) gpu-a100-01 have no inventory host'):
        planner_nodes_filter(fleet('gpu-a100-01'), HOSTVARS, hosts=['gpu-h100-03.example.com'])
    nodes = planner_nodes_filter(fleet('gpu-h100-03', 'gpu-h100-09'), HOSTVARS, hosts=['gpu-h100-03.example.com'],
                                 exclude=['gpu-h100-09'])
    assert [n['pci_ids'] for n in nodes] == [['10de:2330/10de:16c1'], ['unknown']]


def test_planner_nodes_keeps_unknown_for_a_host_without_nvml_facts():
    hostvars = dict(HOSTVARS, **{'gpu-h100-04.example.com': {'gpufleet_node_name': 'gpu-h100-04'}})
    node = planner_nodes_filter(fleet('gpu-h100-04'), hostvars, hosts=['gpu-h100-04.example.com'])[0]
    assert (node['pci_ids'], node['current']['driver']) == (['unknown'], None)


def test_planner_nodes_refuses_two_hosts_for_one_node_naming_both():
    hostvars = dict(HOSTVARS, **{'gpu-h100-03': {'gpufleet_gpu_facts': FACTS}})
    with pytest.raises(AnsibleFilterError, match='Node gpu-h100-03 is claimed by hosts gpu-h100-03 and gpu-h100-03.example.com'):
        planner_nodes_filter(fleet('gpu-h100-03'), hostvars)


def test_inventory_hosts_gives_the_existing_hosts_of_the_plans_nodes():
    assert F.inventory_hosts(['gpu-h100-04', 'gpu-a100-01', 'gpu-h100-03'], HOSTVARS, 'batches') == [
        'gpu-h100-04.example.com', 'gpu-a100-01', 'gpu-h100-03.example.com']
    with pytest.raises(AnsibleFilterError) as err:
        F.inventory_hosts(['gpu-h100-03', 'gpu-h100-09'], HOSTVARS, 'canaries')
    assert str(err.value).startswith('gpufleet.upgrade.inventory_hosts: canaries: Node(s) gpu-h100-09 have no inventory host')


def test_node_names_gives_the_node_of_each_host():
    assert F.node_names(['gpu-h100-03.example.com', 'gpu-a100-01'], HOSTVARS) == ['gpu-h100-03', 'gpu-a100-01']
    with pytest.raises(AnsibleFilterError, match="gpufleet_node_name of host h: '' is not a Kubernetes Node name"):
        F.node_names(['h'], {'h': {'gpufleet_node_name': ''}})
