"""PATCH bodies as the API server applies them: JSON merge patch, strategic merge patch (the common
subset: lists of containers, conditions, taints... merged by their key), JSON patch."""
from __future__ import annotations

import copy
from typing import Any

import jsonpatch

# Strategic merge keys of the list fields the collection and kubectl touch (from the Kubernetes
# OpenAPI `x-kubernetes-patch-merge-key`); other lists are replaced as in a JSON merge patch.
MERGE_KEYS = {
    'containers': 'name', 'initContainers': 'name', 'ephemeralContainers': 'name', 'volumes': 'name',
    'env': 'name', 'volumeMounts': 'mountPath', 'ports': 'containerPort', 'conditions': 'type',
    'taints': 'key', 'ownerReferences': 'uid', 'containerStatuses': 'name',
    'initContainerStatuses': 'name', 'imagePullSecrets': 'name', 'hostAliases': 'ip',
    'tolerations': None, 'finalizers': None,
}
# Lists of scalars merged as sets.
SET_LISTS = {'finalizers'}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str | None = None) -> Any:
    if isinstance(patch, dict):
        if patch.get('$patch') == 'replace':
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != '$patch'}
        if patch.get('$patch') == 'delete':
            return None
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith('$'):
                continue
            if key.startswith('$deleteFromPrimitiveList/'):
                continue
            if value is None:
                result.pop(key, None)
            else:
                merged = strategic_merge_patch(result.get(key), value, key)
                result[key] = merged
        # Directives on primitive lists: {"$deleteFromPrimitiveList/finalizers": ["x"]}
        for key, value in patch.items():
            if key.startswith('$deleteFromPrimitiveList/'):
                name = key.split('/', 1)[1]
                if isinstance(result.get(name), list):
                    result[name] = [v for v in result[name] if v not in value]
        return result
    if isinstance(patch, list) and field is not None:
        if field in SET_LISTS and isinstance(target, list):
            out = list(target)
            for v in patch:
                if v not in out:
                    out.append(v)
            return out
        key = MERGE_KEYS.get(field)
        if key and isinstance(target, list) and all(isinstance(p, dict) for p in patch):
            out = [copy.deepcopy(t) for t in target]
            for item in patch:
                if item.get('$patch') == 'replace':
                    return [{k: v for k, v in i.items() if k != '$patch'} for i in patch]
                pos = next((i for i, t in enumerate(out) if isinstance(t, dict) and t.get(key) == item.get(key)),
                           None)
                if item.get('$patch') == 'delete':
                    if pos is not None:
                        out.pop(pos)
                    continue
                if pos is None:
                    out.append({k: v for k, v in item.items() if not k.startswith('$')})
                else:
                    out[pos] = strategic_merge_patch(out[pos], item)
            return out
    return copy.deepcopy(patch)


def json_patch(target: Any, ops: Any) -> Any:
    return jsonpatch.JsonPatch(ops).apply(target)


def apply_patch(target: dict, body: Any, content_type: str) -> dict:
    """Apply a PATCH body by its Content-Type; raises ValueError for an unsupported one."""
    ctype = (content_type or '').split(';')[0].strip().lower()
    if ctype == 'application/json-patch+json':
        if not isinstance(body, list):
            raise ValueError('a JSON patch must be a list of operations')
        return json_patch(target, body)
    if not isinstance(body, dict):
        raise ValueError('a merge patch must be a JSON object')
    if ctype == 'application/merge-patch+json':
        return merge_patch(target, body)
    if ctype in ('application/strategic-merge-patch+json', 'application/apply-patch+yaml',
                 'application/apply-patch+json'):
        return strategic_merge_patch(target, body)
    raise ValueError('unsupported patch type %r' % content_type)
