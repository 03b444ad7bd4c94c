"""Label and field selectors as the Kubernetes API server understands them.

Label selectors: equality (`a=b`, `a==b`, `a!=b`), set-based (`a in (x,y)`, `a notin (x,y)`),
existence (`a`, `!a`), comma-separated (AND). Also the structured form of a LabelSelector
(`matchLabels` / `matchExpressions` with In, NotIn, Exists, DoesNotExist) used by PDBs, jobs...

Field selectors: `path=value`, `path==value`, `path!=value`, comma-separated (AND). Any dotted
path of the object is accepted (`spec.nodeName`, `status.phase`, `metadata.name`...); a missing
field compares as the empty string, booleans as `true`/`false`, as the API server does.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping

Predicate = Callable[[Mapping[str, Any]], bool]


class SelectorError(ValueError):
    """A selector the API server would reject with 400 Bad Request."""


_LABEL_KEY = r'[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?'
_SET_RE = re.compile(r'^\s*(!?)\s*(%s)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$' % _LABEL_KEY)
_EQ_RE = re.compile(r'^\s*(%s)\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)\s*$' % _LABEL_KEY)


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms, depth, cur = [], 0, []
    for ch in text:
        if ch == '(':
            depth += 1
        elif ch == ')':
            depth -= 1
        if ch == ',' and depth == 0:
            terms.append(''.join(cur))
            cur = []
        else:
            cur.append(ch)
    terms.append(''.join(cur))
    return [t for t in (t.strip() for t in terms) if t]


def parse_label_selector(text: str | None) -> Callable[[Mapping[str, str]], bool]:
    """Compile a label selector string into a predicate over a labels dict."""
    if not text or not text.strip():
        return lambda labels: True
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_terms(text):
        m = _EQ_RE.match(term)
        if m:
            key, op, value = m.group(1), m.group(3), m.group(4)
            if op == '!=':
                checks.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                checks.append(lambda lb, k=key, v=value: k in lb and lb[k] == v)
            continue
        m = _SET_RE.match(term)
        if m:
            neg, key, op, values = m.group(1), m.group(2), m.group(4), m.group(5)
            if op is None:
                if neg:
                    checks.append(lambda lb, k=key: k not in lb)
                else:
                    checks.append(lambda lb, k=key: k in lb)
                continue
            if neg:
                raise SelectorError('unable to parse requirement: %r' % term)
            vals = frozenset(v.strip() for v in values.split(',') if v.strip())
            if op == 'in':
                checks.append(lambda lb, k=key, vs=vals: k in lb and lb[k] in vs)
            else:
                checks.append(lambda lb, k=key, vs=vals: lb.get(k) not in vs)
            continue
        raise SelectorError('unable to parse requirement: %r' % term)
    return lambda labels: all(c(labels) for c in checks)


def label_selector_from_dict(selector: Mapping[str, Any] | None) -> Callable[[Mapping[str, str]], bool] | None:
    """Compile a structured LabelSelector. None selects nothing; {} selects everything."""
    if selector is None:
        return None
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for key, value in (selector.get('matchLabels') or {}).items():
        checks.append(lambda lb, k=key, v=value: lb.get(k) == v)
    for expr in selector.get('matchExpressions') or []:
        key, op, values = expr.get('key'), expr.get('operator'), frozenset(expr.get('values') or ())
        if op == 'In':
            checks.append(lambda lb, k=key, vs=values: k in lb and lb[k] in vs)
        elif op == 'NotIn':
            checks.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif op == 'Exists':
            checks.append(lambda lb, k=key: k in lb)
        elif op == 'DoesNotExist':
            checks.append(lambda lb, k=key: k not in lb)
        else:
            raise SelectorError('%r is not a valid label selector operator' % op)
    return lambda labels: all(c(labels) for c in checks)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string value of a dotted field path, '' when missing (API server semantics)."""
    cur: Any = obj
    for part in path.split('.'):
        if not isinstance(cur, Mapping) or part not in cur:
            return ''
        cur = cur[part]
    if cur is None:
        return ''
    if isinstance(cur, bool):
        return 'true' if cur else 'false'
    return str(cur)


_FIELD_RE = re.compile(r'^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$')


def parse_field_selector(text: str | None) -> list[tuple[str, str, str]]:
    """Parse a field selector into (path, op, value) terms, op being '=' or '!='."""
    if not text or not text.strip():
        return []
    terms = []
    for term in _split_terms(text):
        m = _FIELD_RE.match(term)
        if not m:
            raise SelectorError('invalid selector: %r; can\'t understand %r' % (text, term))
        op = '!=' if m.group(2) == '!=' else '='
        terms.append((m.group(1), op, m.group(3)))
    return terms


def field_predicate(terms: list[tuple[str, str, str]]) -> Predicate:
    if not terms:
        return lambda obj: True

    def check(obj: Mapping[str, Any]) -> bool:
        for path, op, value in terms:
            actual = field_value(obj, path)
            if (actual == value) != (op == '='):
                return False
        return True
    return check
