"""Map API requests (the emulator's request log) to RBAC attributes and check them against the
ClusterRoles in docs/rbac/."""
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


def load_role(name: str) -> dict[str, Any]:
    for f in sorted(RBAC_DIR.glob('*.yml')):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get('kind') == 'ClusterRole' and doc['metadata']['name'] == name:
                return doc
    raise KeyError('no ClusterRole %r under %s' % (name, RBAC_DIR))


def module_roles() -> dict[str, str]:
    return yaml.safe_load((RBAC_DIR / 'modules.yml').read_text())


def option_roles() -> dict[str, dict[str, str]]:
    """{module: {option: extra ClusterRole}}: options that need more than the module's role."""
    return yaml.safe_load((RBAC_DIR / 'options.yml').read_text())


def allowed(role: dict[str, Any], attrs: dict[str, Any]) -> bool:
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


def violations(role_name: str | list[str], requests: list[dict[str, Any]]) -> list[str]:
    """The requests that none of the roles (one name or several, bound together) allows."""
    roles = [load_role(n) for n in ([role_name] if isinstance(role_name, str) else role_name)]
    out = []
    for r in requests:
        attrs = attributes(r['verb'], r['path'], r.get('query'))
        if not any(allowed(role, attrs) for role in roles):
            out.append('%s %s -> %s' % (r['verb'], r['path'], attrs))
    return out
