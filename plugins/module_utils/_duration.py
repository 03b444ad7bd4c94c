# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside
# gpufleet.upgrade.
"""The one duration grammar of the collection.

A duration is one or more parts written together, each a number (whole or decimal) and a unit:
``ms``, ``s``, ``m``, ``h``, ``d`` or ``w`` (``500ms``, ``90s``, ``1.5h``, ``1h30m``, ``7d``,
``1w``); blanks may stand between a number and its unit (``24 h``), not between parts. Leading and
trailing blanks are ignored.

- ``seconds_of(text)``: the seconds, or None when `text` is not a duration (for fields that
  accept other forms too, such as ``xid_since``).
- ``parse_seconds(value, name)``: the seconds, more than 0 (metric_gate's window, step, offset).
- ``parse(value, name)``: the strict form of the same grammar for records: a whole number with one
  unit ``s``, ``m``, ``h`` or ``d`` (``720h``), whole seconds, more than 0 (max_canary_age).

Every error is a ValueError naming the field and the value.
"""
from __future__ import annotations

import re
import typing as t

from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show

UNITS = {'ms': 0.001, 's': 1, 'm': 60, 'h': 3600, 'd': 86400, 'w': 604800}
_PART_RE = re.compile(r'(?P<n>[0-9]+(?:\.[0-9]+)?)(?P<blank>\s*)(?P<unit>ms|s|m|h|d|w)')
_STRICT_UNITS = ('s', 'm', 'h', 'd')


class _Part(t.NamedTuple):
    number: str
    blank: str
    unit: str


def _parts(text: str) -> t.Optional[t.List[_Part]]:
    """The parts of a duration covering all of `text` (stripped), or None."""
    text = text.strip()
    parts: t.List[_Part] = []
    pos = 0
    while pos < len(text):
        m = _PART_RE.match(text, pos)
        if m is None:
            return None
        parts.append(_Part(m.group('n'), m.group('blank'), m.group('unit')))
        pos = m.end()
    return parts or None


def _total(parts: t.Sequence[_Part]) -> float:
    return sum(float(p.number) * UNITS[p.unit] for p in parts)


def seconds_of(text: t.Any) -> t.Optional[float]:
    """The seconds of the duration `text` (0 included), or None when it is not one."""
    parts = _parts(text) if isinstance(text, str) else None
    return None if parts is None else _total(parts)


def parse_seconds(value: t.Any, name: str) -> float:
    """The seconds of the duration `value`, which must be more than 0, or ValueError naming `name`."""
    seconds = seconds_of(str(value) if value is not None else '')
    if seconds is None:
        raise ValueError('%s: %r is not a duration (use e.g. 90s, 15m, 24h, 7d, 1h30m)' % (name, value))
    if seconds <= 0:
        raise ValueError('%s: %r must be greater than zero' % (name, value))
    return seconds


def _strict(text: str) -> t.Optional[int]:
    """Whole seconds of `text` in the strict form, or None."""
    parts = _parts(text)
    if (parts is None or len(parts) != 1 or '.' in parts[0].number or parts[0].blank
            or parts[0].unit not in _STRICT_UNITS):
        return None
    return int(parts[0].number) * UNITS[parts[0].unit]


def parse(value: t.Any, name: str = 'duration') -> int:
    """Whole seconds of `value` in the strict form (a whole number with one unit s, m, h or d),
    more than 0; else ValueError naming ``name`` and the value."""
    text = value.strip() if isinstance(value, str) else ''
    seconds = _strict(text)
    if seconds is None and not (text.startswith('-') and _strict(text[1:]) is not None):
        raise ValueError('%s %s is not a duration: use a whole number with unit s, m, h or d, e.g. 720h'
                         % (name, show(value)))
    if seconds is None or seconds <= 0:
        raise ValueError('%s %s must be positive' % (name, show(value)))
    return seconds


def format_seconds(seconds: int) -> str:
    """Shortest exact rendering, preferring hours (the default 720h stays 720h)."""
    for unit, size in (('h', 3600), ('m', 60)):
        if seconds % size == 0:
            return '%d%s' % (seconds // size, unit)
    return '%ds' % seconds
