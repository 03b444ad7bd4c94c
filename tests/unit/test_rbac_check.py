"""Unit tests of the request -> RBAC mapping used by the RBAC integration test, and of the roles."""
from __future__ import annotations

import pytest

import rbac_check as R


@pytest.mark.parametrize('verb,path,query,expected', [
    ('GET', '/api/v1/nodes', {}, ('list', '', 'nodes', None, None)),
    ('GET', '/api/v1/nodes/gpu-1', {}, ('get', '', 'nodes', None, 'gpu-1')),
    ('PATCH', '/api/v1/nodes/gpu-1', {}, ('patch', '', 'nodes', None, 'gpu-1')),
    ('GET', '/api/v1/pods', {'watch': 'true'}, ('watch', '', 'pods', None, None)),
    ('POST', '/api/v1/namespaces/ml/pods/a/eviction', {}, ('create', '', 'pods/eviction', 'ml', 'a')),
    ('DELETE', '/api/v1/namespaces/ml/pods/a', {}, ('delete', '', 'pods', 'ml', 'a')),
    ('GET', '/api/v1/namespaces/ml', {}, ('get', '', 'namespaces', None, 'ml')),
    ('GET', '/apis/kubevirt.io/v1/virtualmachineinstances', {}, ('list', 'kubevirt.io', 'virtualmachineinstances', None, None)),
    ('PATCH', '/apis/kubevirt.io/v1/namespaces/vms/virtualmachines/v', {}, ('patch', 'kubevirt.io', 'virtualmachines', 'vms', 'v')),
])
def test_attributes(verb, path, query, expected):
    a = R.attributes(verb, path, query)
    assert (a['verb'], a['apiGroup'], a['resource'], a['namespace'], a['name']) == expected


def test_discovery_is_a_non_resource_url():
    assert R.attributes('GET', '/apis', {}) == {'nonResourceURL': '/apis', 'verb': 'get'}


def test_reader_role_is_read_only_and_operator_cannot_delete_nodes():
    reader = R.load_role('gpufleet-upgrade-reader')
    for rule in reader['rules']:
        assert set(rule['verbs']) <= {'get', 'list'}
    assert R.violations('gpufleet-upgrade-reader', [{'verb': 'PATCH', 'path': '/api/v1/nodes/x'}]) == [
        "PATCH /api/v1/nodes/x -> {'verb': 'patch', 'apiGroup': '', 'resource': 'nodes', 'namespace': None, "
        "'name': 'x'}"]
    assert R.violations('gpufleet-upgrade-operator', [{'verb': 'DELETE', 'path': '/api/v1/nodes/x'}]) != []
    assert R.violations('gpufleet-upgrade-operator', [
        {'verb': 'POST', 'path': '/api/v1/namespaces/a/pods/p/eviction'},
        {'verb': 'PATCH', 'path': '/api/v1/nodes/x'}]) == []


def test_every_k8s_module_has_a_role():
    import yaml
    runtime = yaml.safe_load((R.RBAC_DIR.parent.parent / 'meta' / 'runtime.yml').read_text())
    roles = R.module_roles()
    assert sorted(roles) == sorted(runtime['action_groups']['k8s'])
    for role in roles.values():
        R.load_role(role)


def test_the_operator_role_cannot_delete_pods_only_the_opt_in_role_can():
    """Issue 12 (12): the operator role is bound cluster-wide; deleting a pod bypasses its
    PodDisruptionBudget, so only the opt-in role for disable_eviction allows it."""
    delete = [{'verb': 'DELETE', 'path': '/api/v1/namespaces/ml/pods/train-0'}]
    assert R.violations('gpufleet-upgrade-operator', delete) != []
    assert R.option_roles() == {'node_drain': {'disable_eviction': 'gpufleet-upgrade-pod-delete'}}
    assert R.violations(['gpufleet-upgrade-operator', 'gpufleet-upgrade-pod-delete'], delete) == []
    extra = R.load_role('gpufleet-upgrade-pod-delete')
    assert extra['rules'] == [{'apiGroups': [''], 'resources': ['pods'], 'verbs': ['delete']}]
