# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside
# gpufleet.upgrade.
"""How values appear in error messages."""
from __future__ import annotations

import json
import re
import typing as t


def show(value: t.Any, limit: int = 100) -> str:
    """Quote a value for an error message: strings JSON-quoted (control characters escaped, so
    nothing from a record reaches a terminal raw), anything else as repr; both bounded."""
    if isinstance(value, str):
        if len(value) > limit:
            value = value[:limit - 3] + '...'
        return json.dumps(value, ensure_ascii=False)
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4300 decimal digits (sys.get_int_max_str_digits)
        return '<a number of more than 4300 digits>'
    if len(text) > limit:
        text = text[:limit - 3] + '...'
    return text


# scheme://userinfo@ : the userinfo (user, or user:password) of any URL in a text.
_USERINFO_RE = re.compile(r'(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@')


def redact_urls(text: t.Any) -> str:
    """`text` (anything, as str) with the userinfo of every URL in it removed
    (``https://user:pass@proxy:3128`` becomes ``https://proxy:3128``): for messages and results,
    which must never carry a proxy's or a server's credentials."""
    return _USERINFO_RE.sub(r'\1', str(text))


def url_userinfo(url: t.Any) -> t.Optional[str]:
    """The userinfo (``user`` or ``user:password``) of the URL `url`, None when it has none or is not a
    string: what a module adds to its no_log values, so that the task result's invocation, which holds
    the option as given, does not show it."""
    if not isinstance(url, str):
        return None
    m = re.match(r'(?i)^\s*[a-z][a-z0-9+.-]*://([^/?#@\s]*)@', url)
    return m.group(1) if m and m.group(1) else None


def text_field(entry: t.Dict[str, t.Any], key: str, where: str, required: bool = False,
               error: t.Type[Exception] = ValueError, numbers: bool = False) -> t.Optional[str]:
    """`entry[key]` stripped, or None when it is missing or blank (then `error` '<where>.<key> is
    required' when `required`); anything but a string is `error` '<where>.<key>: <value> is not a
    string' (with `numbers`, an int, not a bool, is taken as its digits)."""
    value = entry.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise error('%s.%s is required' % (where, key))
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int) if numbers else str):
        raise error('%s.%s: %r is not a string' % (where, key, value))
    return str(value).strip()


def named_entry(raw: t.Any, where: str, error: t.Type[Exception] = ValueError,
                expected: str = 'a dict') -> str:
    """The non-empty string `name` of the list entry `raw` (a dict) at `where`; else `error`
    naming `where`: '<where>: expected <expected>, got <raw>' or '<where>.name: <name> is not a
    non-empty string'. Later messages say '<where> (<name>)'."""
    if not isinstance(raw, dict):
        raise error('%s: expected %s, got %r' % (where, expected, raw))
    name = raw.get('name')
    if not isinstance(name, str) or not name:
        raise error('%s.name: %r is not a non-empty string' % (where, name))
    return name


# A namespace name is a DNS label; most other object names (a node's, a ConfigMap's) are DNS subdomains.
DNS_LABEL = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')
DNS_SUBDOMAIN = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')


def check_namespace(value: t.Any, error: t.Type[Exception] = ValueError, field: str = 'namespace') -> str:
    """`value` when it is a Kubernetes namespace name (a DNS label of at most 63 characters), else `error`
    naming the field and the value."""
    if not isinstance(value, str) or len(value) > 63 or not DNS_LABEL.match(value):
        raise error('%s: %r is not a Kubernetes namespace name (a DNS label)' % (field, value))
    return value


def folded(data: t.Dict[str, t.Any], key: str, limit: int = 200) -> str:
    """A string value of `data` (an object's data or annotations) to show in a message: whitespace folded,
    cut to `limit` characters; '' when absent or not a string."""
    value = data.get(key)
    if not isinstance(value, str):
        return ''
    value = ' '.join(value.split())
    return value if len(value) <= limit else value[:limit - 3] + '...'
