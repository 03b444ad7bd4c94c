"""Node name <-> inventory host (issue 39 item 3): a host is the Node named by its gpufleet_node_name, else
by its inventory name; a Node with no host or two is refused naming it."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _node_names as N

FQDN = {'gpu-h100-01.example.com': 'gpu-h100-01', 'gpu-h100-03.example.com': 'gpu-h100-03', 'gpu-a100-01': None}


def test_a_host_is_the_node_its_gpufleet_node_name_names_else_its_inventory_name():
    assert N.node_claims(FQDN) == {'gpu-h100-01': ['gpu-h100-01.example.com'],
                                   'gpu-h100-03': ['gpu-h100-03.example.com'], 'gpu-a100-01': ['gpu-a100-01']}
    assert N.node_names(['gpu-h100-03.example.com', 'gpu-a100-01'], FQDN) == ['gpu-h100-03', 'gpu-a100-01']
    assert N.node_names(['not-declared'], FQDN) == ['not-declared']


def test_inventory_hosts_maps_the_plans_node_names_to_the_existing_hosts_in_order():
    assert N.inventory_hosts(['gpu-h100-03', 'gpu-a100-01', 'gpu-h100-01'], FQDN) == [
        'gpu-h100-03.example.com', 'gpu-a100-01', 'gpu-h100-01.example.com']
    assert N.inventory_hosts([], FQDN) == []


def test_a_node_without_an_inventory_host_is_refused_naming_it():
    with pytest.raises(N.NodeNameError) as err:
        N.inventory_hosts(['gpu-h100-03', 'gpu-h100-09', 'gpu-h100-01.example.com'], FQDN, 'canaries')
    assert str(err.value).startswith('canaries: Node(s) gpu-h100-09, gpu-h100-01.example.com have no inventory host')
    assert 'gpufleet_node_name' in str(err.value)


def test_two_hosts_claiming_one_node_is_refused_naming_both():
    hosts = dict(FQDN, **{'gpu-h100-03': None})      # the short name as a host of its own, and the FQDN host
    with pytest.raises(N.NodeNameError) as err:
        N.inventory_hosts(['gpu-h100-03'], hosts, 'batches')
    assert str(err.value).startswith('batches: Node gpu-h100-03 is claimed by hosts gpu-h100-03 and gpu-h100-03.example.com')
    # a clash that no Node asked for is none of this call's business
    assert N.inventory_hosts(['gpu-a100-01'], hosts) == ['gpu-a100-01']


@pytest.mark.parametrize('declared', ['', ' gpu-1', 7, ['gpu-1']])
def test_a_malformed_gpufleet_node_name_is_refused_naming_the_host(declared):
    with pytest.raises(N.NodeNameError) as err:
        N.node_names(['h1.example.com'], {'h1.example.com': declared})
    assert str(err.value) == 'gpufleet_node_name of host h1.example.com: %r is not a Kubernetes Node name' % (declared,)


@pytest.mark.parametrize('call,message', [
    (lambda: N.inventory_hosts('gpu-1', FQDN), "nodes: 'gpu-1' is not a list of names"),
    (lambda: N.inventory_hosts(['gpu-1', None], FQDN), 'nodes[1]: None is not a name'),
    (lambda: N.inventory_hosts(['gpu-1'], ['gpu-1']), "hosts: ['gpu-1'] is not a mapping of inventory host to gpufleet_node_name"),
    (lambda: N.node_names(None, FQDN), 'hosts: None is not a list of names'),
    (lambda: N.plan_hosts(['gpu-1'], {'gpu-1': None}, 'gpu-*'), "exclude: 'gpu-*' is not a list of names"),
])
def test_bad_input_is_refused_naming_the_field(call, message):
    with pytest.raises(N.NodeNameError) as err:
        call()
    assert str(err.value) == message


def test_plan_hosts_refuses_a_pool_node_without_a_gpu_host_unless_excluded():
    pool = ['gpu-h100-01', 'gpu-h100-03', 'gpu-h100-07']
    with pytest.raises(N.NodeNameError) as err:
        N.plan_hosts(pool, FQDN)
    assert str(err.value).startswith('GPU hosts (gpufleet_hosts): Node(s) gpu-h100-07 have no inventory host')
    assert str(err.value).endswith('or leave the Node out (gpufleet_exclude)')
    assert N.plan_hosts(pool, FQDN, ['gpu-h100-0[7-9]']) == {
        'gpu-h100-01': 'gpu-h100-01.example.com', 'gpu-h100-03': 'gpu-h100-03.example.com'}
    # an excluded Node that has a host keeps it
    assert N.plan_hosts(pool[:2], FQDN, ['gpu-h100-01'])['gpu-h100-01'] == 'gpu-h100-01.example.com'


def test_plan_hosts_refuses_two_hosts_for_one_pool_node():
    with pytest.raises(N.NodeNameError, match='Node gpu-h100-01 is claimed by hosts gpu-h100-01 and gpu-h100-01.example.com'):
        N.plan_hosts(['gpu-h100-01'], dict(FQDN, **{'gpu-h100-01': None}))
