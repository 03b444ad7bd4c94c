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
        for name in R.role_names(role):
            R.load_role(name)


def test_the_operator_role_cannot_delete_pods_only_the_opt_in_role_can():
    """Issue 12 (12): the operator role is bound cluster-wide; deleting a pod bypasses its
    PodDisruptionBudget, so only the opt-in role for disable_eviction allows it."""
    delete = [{'verb': 'DELETE', 'path': '/api/v1/namespaces/ml/pods/train-0'}]
    assert R.violations('gpufleet-upgrade-operator', delete) != []
    assert R.option_roles() == {'node_drain': {'disable_eviction': 'gpufleet-upgrade-pod-delete'}}
    assert R.violations(['gpufleet-upgrade-operator', 'gpufleet-upgrade-pod-delete'], delete) == []
    extra = R.load_role('gpufleet-upgrade-pod-delete')
    assert extra['rules'] == [{'apiGroups': [''], 'resources': ['pods'], 'verbs': ['delete']}]


def test_no_cluster_role_writes_a_namespaced_resource_unless_it_says_why():
    """Issue 37 (9): a ClusterRole bound cluster-wide grants its writes in every namespace; every write on a
    namespaced resource is in a Role of the objects' namespace, or listed with its reason (the drain's)."""
    assert R.role_problems() == []
    allowed = {R.load_role(n)['metadata']['name']: R.load_role(n)['metadata'].get('annotations', {}).get(R.WRITES_ANNOTATION)
               for n in ('gpufleet-upgrade-operator', 'gpufleet-upgrade-pod-delete')}
    assert all(allowed.values()), allowed
    kinds = {doc['metadata']['name']: (doc['kind'], doc['metadata'].get('namespace')) for _f, doc in R.role_docs()}
    assert {n: k for n, k in kinds.items() if k[0] == 'Role'} == {
        'gpufleet-upgrade-approve': ('Role', 'gpufleet-approvals'),
        'gpufleet-upgrade-approvals-reader': ('Role', 'gpufleet-approvals'),
        'gpufleet-upgrade-gpu-operator-helmchart': ('Role', 'kube-system'),
        'gpufleet-upgrade-gpu-operator-operands': ('Role', 'gpu-operator'),
        'gpufleet-upgrade-plan-lease': ('Role', 'gpufleet-system'),
        'gpufleet-upgrade-rke2-plans': ('Role', 'system-upgrade'),
        'gpufleet-upgrade-snapshots': ('Role', 'gpufleet-system'),
        'gpufleet-upgrade-stop': ('Role', 'gpufleet-system'),
        'gpufleet-upgrade-workload-gate': ('Role', 'default')}


def _cluster_role(rules, annotation=None):
    role = {'kind': 'ClusterRole', 'metadata': {'name': 'r'}, 'rules': rules}
    if annotation is not None:
        role['metadata']['annotations'] = {R.WRITES_ANNOTATION: annotation}
    return role


def test_cluster_wide_writes_names_the_rule_the_verbs_and_the_resource():
    pods = {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['get', 'create', 'delete']}
    assert R.cluster_wide_writes(_cluster_role([pods]), 'x.yml') == [
        "x.yml: ClusterRole r: rules[0] grants create, delete on pods, a namespaced resource, and a ClusterRoleBinding "
        "would grant it in every namespace: make it a Role in the objects' namespace, or list 'pods' with its reason "
        "in metadata.annotations['gpufleet.io/cluster-wide-writes']"]
    # listed with a reason: allowed; listed without one, or another resource listed: refused
    assert R.cluster_wide_writes(_cluster_role([pods], 'pods: the drain')) == []
    assert R.cluster_wide_writes(_cluster_role([pods], 'pods: ""')) == [
        "ClusterRole r: metadata.annotations['gpufleet.io/cluster-wide-writes'] lists 'pods' without a reason",
        "ClusterRole r: rules[0] grants create, delete on pods, a namespaced resource, and a ClusterRoleBinding would "
        "grant it in every namespace: make it a Role in the objects' namespace, or list 'pods' with its reason in "
        "metadata.annotations['gpufleet.io/cluster-wide-writes']"]
    assert len(R.cluster_wide_writes(_cluster_role([pods], 'pods/eviction: the drain'))) == 1
    assert R.cluster_wide_writes(_cluster_role([pods], 'just text')) == [
        "ClusterRole r: metadata.annotations['gpufleet.io/cluster-wide-writes'] is 'just text', not "
        '"<resource>[.<group>]: reason" lines']
    # a group's resource is named resource.group; wildcards are never cluster-scoped
    plans = {'apiGroups': ['upgrade.cattle.io'], 'resources': ['plans'], 'verbs': ['patch']}
    assert "on plans.upgrade.cattle.io," in R.cluster_wide_writes(_cluster_role([plans]))[0]
    assert len(R.cluster_wide_writes(_cluster_role([{'apiGroups': ['*'], 'resources': ['nodes'], 'verbs': ['*']}]))) == 1
    # cluster-scoped writes, reads, and any Role pass
    ok = [{'apiGroups': [''], 'resources': ['nodes', 'nodes/status'], 'verbs': ['patch']},
          {'apiGroups': ['nvidia.com'], 'resources': ['clusterpolicies', 'nvidiadrivers'], 'verbs': ['patch']},
          {'apiGroups': [''], 'resources': ['secrets'], 'verbs': ['get', 'list']}]
    assert R.cluster_wide_writes(_cluster_role(ok)) == []
    assert R.cluster_wide_writes(dict(_cluster_role([pods]), kind='Role')) == []


def test_role_problems_refuses_a_role_without_its_namespace(tmp_path):
    (tmp_path / 'x.yml').write_text('kind: Role\nmetadata: {name: r}\nrules: []\n')
    assert R.role_problems(tmp_path) == [
        'x.yml: Role r has no metadata.namespace (the namespace its objects live in, the default to change)']


def _req(verb, path):
    return [{'verb': verb, 'path': path}]


def test_gpu_operator_update_writes_pods_in_the_operators_namespace_only():
    """Issue 37 (9): gpu_operator_update's roles let it create and delete pods in gpu-operator and patch the
    HelmChart in kube-system, nowhere else; ClusterPolicies, NVIDIADrivers and Nodes cluster-wide."""
    roles = R.module_roles()['gpu_operator_update']
    for verb, path in (('POST', '/api/v1/namespaces/gpu-operator/pods'),
                       ('DELETE', '/api/v1/namespaces/gpu-operator/pods/nvidia-driver-daemonset-x'),
                       ('GET', '/api/v1/namespaces/gpu-operator/pods'),
                       ('GET', '/apis/apps/v1/namespaces/gpu-operator/controllerrevisions'),
                       ('PATCH', '/apis/helm.cattle.io/v1/namespaces/kube-system/helmcharts/gpu-operator'),
                       ('PATCH', '/apis/nvidia.com/v1/clusterpolicies/cluster-policy'),
                       ('PATCH', '/apis/nvidia.com/v1alpha1/nvidiadrivers/gpu-pool'),
                       ('PATCH', '/api/v1/nodes/gpu-1')):
        assert R.violations(roles, _req(verb, path)) == [], (verb, path)
    for verb, path in (('POST', '/api/v1/namespaces/default/pods'),
                       ('POST', '/api/v1/namespaces/kube-system/pods'),
                       ('DELETE', '/api/v1/namespaces/default/pods/p'),
                       ('POST', '/api/v1/pods'),
                       ('PATCH', '/apis/helm.cattle.io/v1/namespaces/default/helmcharts/gpu-operator'),
                       ('PATCH', '/apis/helm.cattle.io/v1/namespaces/gpu-operator/helmcharts/gpu-operator')):
        assert len(R.violations(roles, _req(verb, path))) == 1, (verb, path)
    # applied in another namespace (metadata.namespace changed), the operand Role follows it
    other = '/api/v1/namespaces/nvidia-gpu-operator/pods'
    assert R.violations('gpufleet-upgrade-gpu-operator-operands', _req('POST', other), namespace='nvidia-gpu-operator') == []
    assert R.violations('gpufleet-upgrade-gpu-operator-operands', _req('POST', other)) != []


@pytest.mark.parametrize('module,namespace,verb,path', [
    ('snapshot_store', 'gpufleet-system', 'POST', '/api/v1/namespaces/{ns}/secrets'),
    ('snapshot_store', 'gpufleet-system', 'DELETE', '/api/v1/namespaces/{ns}/secrets/s'),
    ('plan_lease', 'gpufleet-system', 'POST', '/apis/coordination.k8s.io/v1/namespaces/{ns}/leases'),
    ('plan_lease', 'gpufleet-system', 'PATCH', '/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/gpufleet-plan-1'),
    ('pause_approval_info', 'gpufleet-approvals', 'GET', '/api/v1/namespaces/{ns}/configmaps/c'),
    ('suc_plan', 'system-upgrade', 'POST', '/apis/upgrade.cattle.io/v1/namespaces/{ns}/plans'),
    ('workload_gate', 'default', 'POST', '/apis/batch/v1/namespaces/{ns}/jobs'),
])
def test_the_namespaced_roles_end_at_their_namespace(module, namespace, verb, path):
    """A Role of docs/rbac grants in its own namespace and not in another, whatever binds it."""
    role = R.module_roles()[module]
    assert R.violations(role, _req(verb, path.format(ns=namespace))) == []
    assert len(R.violations(role, _req(verb, path.format(ns='ml')))) == 1


def test_the_plan_lease_role_reads_creates_and_patches_leases_in_gpufleet_system_only():
    """plan_lease (issue 37 item 3): get, create and merge-patch its Lease; a release clears the holder, so no delete;
    nothing in kube-node-lease (the kubelets' heartbeats) or kube-system (leader election)."""
    role = R.module_roles()['plan_lease']
    assert role == 'gpufleet-upgrade-plan-lease'
    lease = '/apis/coordination.k8s.io/v1/namespaces/%s/leases/gpufleet-plan-3f9a1c0d2e4b'
    for verb, path in (('GET', lease % 'gpufleet-system'), ('PATCH', lease % 'gpufleet-system'),
                       ('POST', '/apis/coordination.k8s.io/v1/namespaces/gpufleet-system/leases')):
        assert R.violations(role, _req(verb, path)) == [], (verb, path)
    for verb, path in (('DELETE', lease % 'gpufleet-system'), ('PUT', lease % 'gpufleet-system'),
                       ('GET', '/apis/coordination.k8s.io/v1/namespaces/gpufleet-system/leases'),
                       ('PATCH', lease % 'kube-node-lease'), ('PATCH', lease % 'kube-system'),
                       ('GET', '/apis/coordination.k8s.io/v1/leases')):
        assert len(R.violations(role, _req(verb, path))) == 1, (verb, path)
