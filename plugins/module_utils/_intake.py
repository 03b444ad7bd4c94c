# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside gpufleet.upgrade.
"""GPU intake closure check (seed 004, step 1: keep GPU billing and tenant Pod/VM creation closed).

The operator declares which Kubernetes objects and field values mean "GPU intake is closed" (a
ResourceQuota of 0 GPUs, an admission policy binding that denies, a label on a namespace, ...).
Each check names one object and one field and lists the values that mean closed. The check is
closed only when the object exists, the field exists and its value is one of the closed values;
a missing object or field is not closed (a ResourceQuota without the GPU key does not limit GPUs).

Field paths are dotted, with bracketed keys for names that contain dots or slashes and bracketed
integers for list items::

    spec.hard["requests.nvidia.com/gpu"]
    spec.validationActions[0]
    metadata.labels['gpufleet.io/intake']

Values compare as canonical strings for scalars (``0`` and ``"0"`` are the same, booleans are
``true``/``false``) and by equality for lists and mappings. List every spelling that means closed
(for example ``["0", "0m"]`` for a quantity).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

PathPart = Union[str, int]

_IDENT_RE = re.compile(r'[A-Za-z0-9_$-]+')
_MISSING = object()


class IntakeError(ValueError):
    """A check is malformed; the message names the check and the field."""


def parse_field_path(path: Any, what: str = 'field') -> List[PathPart]:
    """Parse ``a.b["c.d/e"][0]`` into ``['a', 'b', 'c.d/e', 0]``."""
    if not isinstance(path, str) or not path.strip():
        raise IntakeError('%s: %r is not a field path such as spec.hard["requests.nvidia.com/gpu"]' % (what, path))
    parts: List[PathPart] = []
    i, n = 0, len(path)
    expect_name = True
    while i < n:
        ch = path[i]
        if ch == '[':
            end = path.find(']', i)
            if path[i + 1:i + 2] in ('"', "'"):
                quote = path[i + 1]
                close = path.find(quote + ']', i + 2)
                if close < 0:
                    raise IntakeError('%s: %r has an unterminated quoted key at position %d' % (what, path, i))
                parts.append(path[i + 2:close])
                i = close + 2
            elif end > i + 1 and path[i + 1:end].isdigit():
                parts.append(int(path[i + 1:end]))
                i = end + 1
            else:
                raise IntakeError('%s: %r has a bracket at position %d that holds neither a quoted key nor a '
                                  'list index' % (what, path, i))
            expect_name = False
        elif ch == '.':
            if expect_name:
                raise IntakeError('%s: %r has an empty segment at position %d' % (what, path, i))
            expect_name = True
            i += 1
        else:
            if not expect_name:
                raise IntakeError('%s: %r needs a dot or a bracket before position %d' % (what, path, i))
            m = _IDENT_RE.match(path, i)
            if not m:
                raise IntakeError('%s: %r has an unexpected character %r at position %d' % (what, path, ch, i))
            parts.append(m.group(0))
            i = m.end()
            expect_name = False
    if expect_name:
        raise IntakeError('%s: %r ends with a dot' % (what, path))
    return parts


def _step(walked: str, part: PathPart) -> str:
    if isinstance(part, int):
        return '%s[%d]' % (walked, part)
    if _IDENT_RE.fullmatch(part):
        return '%s.%s' % (walked, part) if walked else part
    return '%s[%s]' % (walked, '"%s"' % part)


def resolve(obj: Any, parts: List[PathPart]) -> Tuple[Any, Optional[str]]:
    """(value, None) at ``parts``, or (_MISSING, the path up to the first missing part)."""
    cur = obj
    walked = ''
    for part in parts:
        walked = _step(walked, part)
        if isinstance(part, int):
            if not isinstance(cur, list) or part >= len(cur):
                return _MISSING, walked
            cur = cur[part]
        else:
            if not isinstance(cur, dict) or part not in cur:
                return _MISSING, walked
            cur = cur[part]
    return cur, None


def canonical(value: Any) -> Any:
    """Scalars as strings (booleans lowercase, integral floats without .0); lists and dicts as is."""
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float, str)):
        return str(value)
    if value is None:
        return 'null'
    return value


@dataclass
class CheckResult:
    index: int
    api_version: str
    kind: str
    namespace: Optional[str]
    name: str
    field: str
    closed_values: List[Any]
    status: str  # closed | open | missing_object | missing_field
    value: Any
    reason: str
    uid: Optional[str] = None
    resource_version: Optional[str] = None
    description: Optional[str] = None

    @property
    def closed(self) -> bool:
        return self.status == 'closed'

    def as_dict(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        d['closed'] = self.closed
        return d


@dataclass
class IntakeResult:
    closed: bool
    checks: List[CheckResult]
    summary: str


_REQUIRED = ('api_version', 'kind', 'name', 'field', 'closed_values')


def _validate_check(i: int, check: Any) -> List[PathPart]:
    where = 'checks[%d]' % i
    if not isinstance(check, dict):
        raise IntakeError('%s: %r is not a mapping with %s' % (where, check, ', '.join(_REQUIRED)))
    for key in _REQUIRED:
        if check.get(key) in (None, ''):
            raise IntakeError('%s.%s is required' % (where, key))
    for key in ('api_version', 'kind', 'name'):
        if not isinstance(check[key], str):
            raise IntakeError('%s.%s: %r is not a string' % (where, key, check[key]))
    if check.get('namespace') is not None and not isinstance(check['namespace'], str):
        raise IntakeError('%s.namespace: %r is not a string' % (where, check['namespace']))
    if not isinstance(check['closed_values'], list) or not check['closed_values']:
        raise IntakeError('%s.closed_values: %r must be a non-empty list of the values that mean closed'
                          % (where, check['closed_values']))
    return parse_field_path(check['field'], '%s.field' % where)


def _find(objects: List[Dict[str, Any]], check: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    ns = check.get('namespace') or None
    for obj in objects:
        meta = obj.get('metadata') or {}
        if (obj.get('apiVersion') == check['api_version'] and obj.get('kind') == check['kind']
                and meta.get('name') == check['name'] and (meta.get('namespace') or None) == ns):
            return obj
    return None


def check_intake(checks: Any, objects: Any) -> IntakeResult:
    """Evaluate every check over ``objects``; closed only when every check is closed."""
    if not isinstance(checks, list) or not checks:
        raise IntakeError('checks: %r must be a non-empty list; declare at least one object and field that '
                          'keeps GPU intake closed' % (checks,))
    if not isinstance(objects, list):
        raise IntakeError('objects: %r is not a list of Kubernetes objects' % (objects,))
    for j, obj in enumerate(objects):
        if not isinstance(obj, dict):
            raise IntakeError('objects[%d]: %r is not a Kubernetes object (a mapping)' % (j, obj))
    paths = [_validate_check(i, c) for i, c in enumerate(checks)]

    results: List[CheckResult] = []
    for i, (check, parts) in enumerate(zip(checks, paths)):
        ns = check.get('namespace') or None
        ref = '%s %s %s' % (check['api_version'], check['kind'], '%s/%s' % (ns, check['name']) if ns else check['name'])
        closed_values = list(check['closed_values'])
        wanted = [canonical(v) for v in closed_values]
        base = dict(index=i, api_version=check['api_version'], kind=check['kind'], namespace=ns,
                    name=check['name'], field=check['field'], closed_values=closed_values,
                    description=check.get('description'))
        obj = _find(objects, check)
        if obj is None:
            results.append(CheckResult(status='missing_object', value=None,
                                       reason='%s not found: intake is not proven closed' % ref, **base))
            continue
        meta = obj.get('metadata') or {}
        base.update(uid=meta.get('uid'), resource_version=meta.get('resourceVersion'))
        value, stopped = resolve(obj, parts)
        if value is _MISSING:
            results.append(CheckResult(status='missing_field', value=None,
                                       reason='%s has no %s (stopped at %s): not closed' % (ref, check['field'], stopped),
                                       **base))
            continue
        if canonical(value) in wanted:
            results.append(CheckResult(status='closed', value=value,
                                       reason='%s %s = %r is a closed value' % (ref, check['field'], value), **base))
        else:
            results.append(CheckResult(status='open', value=value,
                                       reason='%s %s = %r is not one of the closed values %r'
                                       % (ref, check['field'], value, closed_values), **base))
    closed = all(r.closed for r in results)
    not_closed = [r for r in results if not r.closed]
    if closed:
        summary = 'GPU intake closed: %d/%d check(s) closed' % (len(results), len(results))
    else:
        summary = 'GPU intake NOT closed: %d/%d check(s) open or missing: %s' % (
            len(not_closed), len(results), '; '.join(r.reason for r in not_closed))
    return IntakeResult(closed=closed, checks=results, summary=summary)
