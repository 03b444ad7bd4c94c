"""Map API requests (the fault proxy's request log) to RBAC attributes and check them against the
ClusterRoles and Roles in docs/rbac/; refuse a ClusterRole that writes namespaced resources (cluster_wide_writes)."""
from __future__ import annotations

import pathlib
from typing import Any
from urllib.parse import unquote

import yaml

RBAC_DIR = pathlib.Path(__file__).resolve().parent.parent / 'docs' / 'rbac'


def attributes(verb: str, path: str, query: dict | None = None) -> dict[str, Any]:
    """{'verb', 'apiGroup', 'resource' ('pods/eviction' for a subresource), 'namespace', 'name'}
    or {'nonResourceURL': path, 'verb': ...} for discovery paths."""
    parts = [unquote(p) for p in path.split('?')[0].strip('/').split('/') if p]
    method = verb.upper()
    if parts[:1] == ['api'] and len(parts) >= 2:
        group, rest = '', parts[2:]
    elif parts[:1] == ['apis'] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return {'nonResourceURL': '/' + '/'.join(parts), 'verb': method.lower()}
    if not rest:
        return {'nonResourceURL': '/' + '/'.join(parts), 'verb': method.lower()}
    namespace = None
    if rest[0] == 'namespaces' and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else None
    if len(rest) >= 3:
        resource = '%s/%s' % (resource, rest[2])
    q = query or {}
    if method in ('GET', 'HEAD'):
        k8s_verb = 'get' if name else ('watch' if str(q.get('watch', '')).lower() in ('1', 'true') else 'list')
    elif method == 'POST':
        k8s_verb = 'create'
    elif method == 'PUT':
        k8s_verb = 'update'
    elif method == 'PATCH':
        k8s_verb = 'patch'
    elif method == 'DELETE':
        k8s_verb = 'delete' if name else 'deletecollection'
    else:
        k8s_verb = method.lower()
    return {'verb': k8s_verb, 'apiGroup': group, 'resource': resource, 'namespace': namespace, 'name': name}


ROLE_KINDS = ('ClusterRole', 'Role')
# The annotation by which a ClusterRole of docs/rbac lists the namespaced resources it may write cluster-wide, each
# with its reason ("<resource>[.<group>]: reason" a line, e.g. "pods/eviction: the drain evicts ...").
WRITES_ANNOTATION = 'gpufleet.io/cluster-wide-writes'
WRITE_VERBS = ('create', 'update', 'patch', 'delete', 'deletecollection', 'escalate', 'bind', 'impersonate', '*')
# Cluster-scoped resources the roles name ("<resource>[.<group>]"); any other resource counts as namespaced.
CLUSTER_SCOPED = frozenset({
    'nodes', 'namespaces', 'persistentvolumes', 'clusterpolicies.nvidia.com', 'nvidiadrivers.nvidia.com',
    'resourceslices.resource.k8s.io', 'deviceclasses.resource.k8s.io', 'clusterroles.rbac.authorization.k8s.io',
    'clusterrolebindings.rbac.authorization.k8s.io', 'customresourcedefinitions.apiextensions.k8s.io'})


def role_docs(rbac_dir: pathlib.Path | None = None) -> list[tuple[pathlib.Path, dict[str, Any]]]:
    """(file, object) for every ClusterRole and Role of docs/rbac (or `rbac_dir`)."""
    out = []
    for f in sorted((rbac_dir or RBAC_DIR).glob('*.yml')):
        for doc in yaml.safe_load_all(f.read_text()):
            if isinstance(doc, dict) and doc.get('kind') in ROLE_KINDS:
                out.append((f, doc))
    return out


def load_role(name: str, namespace: str | None = None) -> dict[str, Any]:
    """The ClusterRole or Role `name` of docs/rbac; a Role moved to `namespace` when given (as an operator
    applies it in another namespace)."""
    for _f, doc in role_docs():
        if doc['metadata']['name'] == name:
            if doc['kind'] == 'Role' and namespace:
                doc = dict(doc, metadata=dict(doc['metadata'], namespace=namespace))
            return doc
    raise KeyError('no ClusterRole or Role %r under %s' % (name, RBAC_DIR))


def role_names(roles: str | list[str]) -> list[str]:
    """modules.yml's value (one role or the list bound together) as a list."""
    return [roles] if isinstance(roles, str) else list(roles)


def _resource_key(group: str, resource: str) -> str:
    return '%s.%s' % (resource, group) if group else resource


def _is_cluster_scoped(group: str, resource: str) -> bool:
    """A cluster-scoped resource or a subresource of one (nodes/status)."""
    return _resource_key(group, resource.split('/', 1)[0]) in CLUSTER_SCOPED


def cluster_wide_writes(role: dict[str, Any], where: str = '') -> list[str]:
    """A ClusterRole's writes on namespaced resources that its annotation WRITES_ANNOTATION does not list with a
    reason: one message each (empty for a Role, which no binding can take beyond its namespace)."""
    if role.get('kind') != 'ClusterRole':
        return []
    name = role['metadata']['name']
    prefix = '%sClusterRole %s' % (where + ': ' if where else '', name)
    raw = ((role['metadata'].get('annotations') or {}).get(WRITES_ANNOTATION))
    allowed_writes: dict[str, Any] = {}
    out = []
    if raw is not None:
        try:
            allowed_writes = yaml.safe_load(raw) or {}
        except yaml.YAMLError as e:
            return ['%s: metadata.annotations[%r] is not "<resource>[.<group>]: reason" lines: %s'
                    % (prefix, WRITES_ANNOTATION, e)]
        if not isinstance(allowed_writes, dict):
            return ['%s: metadata.annotations[%r] is %r, not "<resource>[.<group>]: reason" lines'
                    % (prefix, WRITES_ANNOTATION, raw)]
        for key, reason in allowed_writes.items():
            if not isinstance(reason, str) or not reason.strip():
                out.append('%s: metadata.annotations[%r] lists %r without a reason' % (prefix, WRITES_ANNOTATION, key))
    for i, rule in enumerate(role.get('rules') or []):
        verbs = [v for v in rule.get('verbs') or [] if v in WRITE_VERBS]
        if not verbs or 'nonResourceURLs' in rule:
            continue
        for group in rule.get('apiGroups') or []:
            for resource in rule.get('resources') or []:
                key = _resource_key(group, resource)
                if resource != '*' and group != '*' and _is_cluster_scoped(group, resource):
                    continue
                if key in allowed_writes and isinstance(allowed_writes[key], str) and allowed_writes[key].strip():
                    continue
                out.append('%s: rules[%d] grants %s on %s, a namespaced resource, and a ClusterRoleBinding would '
                           'grant it in every namespace: make it a Role in the objects\' namespace, or list %r with '
                           'its reason in metadata.annotations[%r]'
                           % (prefix, i, ', '.join(verbs), key, key, WRITES_ANNOTATION))
    return out


def role_problems(rbac_dir: pathlib.Path | None = None) -> list[str]:
    """Every ClusterRole's unlisted namespaced writes, and every Role without its namespace, in docs/rbac."""
    out = []
    for f, doc in role_docs(rbac_dir):
        where = f.name
        if doc['kind'] == 'Role' and not (doc['metadata'].get('namespace') or '').strip():
            out.append('%s: Role %s has no metadata.namespace (the namespace its objects live in, the default to '
                       'change)' % (where, doc['metadata']['name']))
        out.extend(cluster_wide_writes(doc, where))
    return out


def module_roles() -> dict[str, str | list[str]]:
    """{module: role, or the list of roles bound together}."""
    return yaml.safe_load((RBAC_DIR / 'modules.yml').read_text())


def option_roles() -> dict[str, dict[str, str]]:
    """{module: {option: extra ClusterRole}}: options that need more than the module's role."""
    return yaml.safe_load((RBAC_DIR / 'options.yml').read_text())


def allowed(role: dict[str, Any], attrs: dict[str, Any]) -> bool:
    if role.get('kind') == 'Role':
        # a Role grants in its own namespace only (and nothing cluster-scoped, no non-resource URL)
        if 'nonResourceURL' in attrs or attrs.get('namespace') != role['metadata'].get('namespace'):
            return False
    for rule in role.get('rules') or []:
        verbs = rule.get('verbs') or []
        if attrs['verb'] not in verbs and '*' not in verbs:
            continue
        if 'nonResourceURL' in attrs:
            if attrs['nonResourceURL'] in (rule.get('nonResourceURLs') or []):
                return True
            continue
        if attrs['apiGroup'] not in (rule.get('apiGroups') or []) and '*' not in (rule.get('apiGroups') or []):
            continue
        if attrs['resource'] not in (rule.get('resources') or []) and '*' not in (rule.get('resources') or []):
            continue
        names = rule.get('resourceNames')
        if names and attrs.get('name') not in names:
            continue
        return True
    return False


def violations(role_name: str | list[str], requests: list[dict[str, Any]], namespace: str | None = None) -> list[str]:
    """The requests that none of the roles (one name or several, bound together) allows; a Role applies in its
    namespace (or in `namespace`, where it was applied instead)."""
    roles = [load_role(n, namespace) for n in role_names(role_name)]
    out = []
    for r in requests:
        attrs = attributes(r['verb'], r['path'], r.get('query'))
        if not any(allowed(role, attrs) for role in roles):
            out.append('%s %s -> %s' % (r['verb'], r['path'], attrs))
    return out
