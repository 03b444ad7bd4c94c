"""The collection's RBAC (docs/rbac) on the test control plane: apply its ClusterRoles and Roles, bind them to a
service account, and hand that identity to the modules under test; the API server's authorizer
then answers 403 for anything the role lacks, and its audit log says what was sent.

    kubeconfig = rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-reader')           # SA gpufleet-system/reader
    kubeconfig = rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-workload-gate', namespace='qualify')  # the Role moved
    kubeconfig = rbac.kubeconfig_for(cluster, R.module_roles()['gpu_operator_update'])   # several roles, one SA
    mark = cluster.audit_mark(); ...; rbac.non_reads(cluster.audit_events(since=mark, user=rbac.user('reader')))
"""
from __future__ import annotations

import pathlib
from typing import Any

import yaml

RBAC_DIR = pathlib.Path(__file__).resolve().parents[2] / 'docs' / 'rbac'
SA_NAMESPACE = 'gpufleet-system'
READ_VERBS = ('get', 'list', 'watch')
# the service account each role's tests run as (gpufleet-upgrade is the one bindings-example.yml binds)
SERVICE_ACCOUNTS = {'gpufleet-upgrade-reader': 'reader', 'gpufleet-upgrade-workload-gate': 'workload-gate',
                    'gpufleet-upgrade-rke2-plans': 'rke2-plans', 'gpufleet-upgrade-operator': 'operator',
                    'gpufleet-upgrade-gpu-operator': 'gpu-operator', 'gpufleet-upgrade-snapshots': 'snapshots',
                    'gpufleet-upgrade-gpu-operator-operands': 'gpu-operator',
                    'gpufleet-upgrade-gpu-operator-helmchart': 'gpu-operator', 'gpufleet-upgrade-plan-lease': 'plan-lease'}
ROLE_KINDS = ('ClusterRole', 'Role')


def user(sa: str, namespace: str = SA_NAMESPACE) -> str:
    return 'system:serviceaccount:%s:%s' % (namespace, sa)


def docs(name: str | None = None) -> list[dict[str, Any]]:
    """The objects of docs/rbac/*.yml (one file's with `name`), List items expanded."""
    out: list[dict[str, Any]] = []
    for path in sorted(RBAC_DIR.glob((name or '*') + '.yml')):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or 'kind' not in doc:
                continue
            out.extend(doc['items'] if doc['kind'] == 'List' else [doc])
    return out


def apply_roles(cluster: Any) -> list[str]:
    """Create or replace every ClusterRole of docs/rbac; their names. (A Role is applied by bind(), in the
    namespace it is bound in.)"""
    roles = [d for d in docs() if d['kind'] == 'ClusterRole']
    cluster.apply(roles, settle=False)
    return [r['metadata']['name'] for r in roles]


def role(name: str) -> dict[str, Any]:
    """The ClusterRole or Role `name` of docs/rbac."""
    found = [d for d in docs() if d['kind'] in ROLE_KINDS and d['metadata']['name'] == name]
    if not found:
        raise KeyError('no ClusterRole or Role %r under %s' % (name, RBAC_DIR))
    return found[0]


def _can(cluster: Any, username: str, verb: str, resource: str, group: str = '', namespace: str | None = None) -> bool:
    attrs: dict[str, Any] = {'verb': verb, 'resource': resource, 'group': group}
    if namespace:
        attrs['namespace'] = namespace
    review = cluster.api.request('POST', '/apis/authorization.k8s.io/v1/subjectaccessreviews', body={
        'apiVersion': 'authorization.k8s.io/v1', 'kind': 'SubjectAccessReview',
        'spec': {'user': username, 'resourceAttributes': attrs,
                 'groups': ['system:serviceaccounts', 'system:serviceaccounts:' + SA_NAMESPACE, 'system:authenticated']}})
    return bool((review.get('status') or {}).get('allowed'))


def bind(cluster: Any, role_name: str | list[str], sa: str | None = None, namespace: str | None = None) -> str:
    """Bind `role_name` (one role of docs/rbac, or several) to service account gpufleet-system/<sa>, as docs/rbac
    says: a ClusterRole cluster-wide (or with a RoleBinding in `namespace`), a Role by a RoleBinding in its own
    namespace (or, with `namespace`, applied and bound there instead, as an operator changes its
    metadata.namespace); wait until the authorizer applies it; the SA's user name."""
    names = [role_name] if isinstance(role_name, str) else list(role_name)
    sa = sa or SERVICE_ACCOUNTS[names[0]]
    apply_roles(cluster)
    username = user(sa)
    for name in names:
        doc = role(name)
        binding_ns = namespace
        objs: list[dict[str, Any]] = [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': SA_NAMESPACE}}]
        if doc['kind'] == 'Role':
            binding_ns = namespace or doc['metadata']['namespace']
            objs.append(dict(doc, metadata=dict(doc['metadata'], namespace=binding_ns)))   # apply creates the namespace
        binding_name = 'gpufleet-test-%s-%s' % (name, sa)
        subjects = [{'kind': 'ServiceAccount', 'name': sa, 'namespace': SA_NAMESPACE}]
        ref = {'apiGroup': 'rbac.authorization.k8s.io', 'kind': doc['kind'], 'name': name}
        if binding_ns:
            binding = {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'RoleBinding',
                       'metadata': {'name': binding_name, 'namespace': binding_ns}, 'roleRef': ref, 'subjects': subjects}
        else:
            binding = {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding',
                       'metadata': {'name': binding_name}, 'roleRef': ref, 'subjects': subjects}
        cluster.apply(objs + [binding], settle=False)
        rule = next(r for r in doc['rules'] if r.get('resources'))
        cluster.wait_for(lambda: _can(cluster, username, rule['verbs'][0], rule['resources'][0], rule['apiGroups'][0],
                                      binding_ns), timeout=15, message='the authorizer to apply %s' % binding_name)
    return username


def kubeconfig_for(cluster: Any, role_name: str | list[str], sa: str | None = None, namespace: str | None = None) -> str:
    """A kubeconfig (through the fault proxy) of a service account bound to `role_name` (one or several) only."""
    names = [role_name] if isinstance(role_name, str) else list(role_name)
    sa = sa or SERVICE_ACCOUNTS[names[0]]
    bind(cluster, names, sa, namespace)
    return cluster.sa_kubeconfig(SA_NAMESPACE, sa)


def apply_example_bindings(cluster: Any) -> str:
    """docs/rbac/bindings-example.yml as shipped (gpufleet-system/gpufleet-upgrade bound to the reader
    and operator ClusterRoles, and to the Roles it binds in their namespaces); that service account's kubeconfig."""
    apply_roles(cluster)
    bindings = docs('bindings-example')
    ref_roles = [role(b['roleRef']['name']) for b in bindings if b['roleRef']['kind'] == 'Role']
    cluster.apply([{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': SA_NAMESPACE}}]
                  + ref_roles + bindings, settle=False)
    cluster.wait_for(lambda: _can(cluster, user('gpufleet-upgrade'), 'patch', 'nodes'), timeout=15,
                     message='the authorizer to apply bindings-example.yml')
    cluster.wait_for(lambda: _can(cluster, user('gpufleet-upgrade'), 'create', 'secrets', namespace=SA_NAMESPACE),
                     timeout=15, message='the authorizer to apply bindings-example.yml\'s RoleBindings')
    return cluster.sa_kubeconfig(SA_NAMESPACE, 'gpufleet-upgrade')


def non_reads(events: list[dict[str, Any]]) -> list[str]:
    """Audit events whose verb is not get, list or watch."""
    return ['%s %s -> %s' % (e.get('verb'), e.get('requestURI'), (e.get('responseStatus') or {}).get('code'))
            for e in events if e.get('verb') not in READ_VERBS]


def refused(events: list[dict[str, Any]]) -> list[str]:
    """Audit events the authorizer refused (403)."""
    return ['%s %s' % (e.get('verb'), e.get('requestURI')) for e in events
            if (e.get('responseStatus') or {}).get('code') == 403]
