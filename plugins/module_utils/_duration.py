# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside
# gpufleet.upgrade.
"""Durations written as a positive whole number with one unit: ``10s``, ``90m``, ``720h``, ``30d``."""
from __future__ import annotations

import re
import typing as t

from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show

UNITS = {'s': 1, 'm': 60, 'h': 3600, 'd': 86400}
_DURATION_RE = re.compile(r'([0-9]+)([smhd])')


def parse(value: t.Any, name: str = 'duration') -> int:
    """Return the duration in seconds, or raise ValueError naming ``name`` and the value."""
    if not isinstance(value, str):
        raise ValueError('%s %s is not a duration: use a whole number with unit s, m, h or d, e.g. 720h'
                         % (name, show(value)))
    text = value.strip()
    m = _DURATION_RE.fullmatch(text)
    if not m:
        if re.fullmatch(r'-[0-9]+[smhd]', text):
            raise ValueError('%s %s must be positive' % (name, show(value)))
        raise ValueError('%s %s is not a duration: use a whole number with unit s, m, h or d, e.g. 720h'
                         % (name, show(value)))
    seconds = int(m.group(1)) * UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError('%s %s must be positive' % (name, show(value)))
    return seconds


def format_seconds(seconds: int) -> str:
    """Shortest exact rendering, preferring hours (the default 720h stays 720h)."""
    for unit, size in (('h', 3600), ('m', 60)):
        if seconds % size == 0:
            return '%d%s' % (seconds // size, unit)
    return '%ds' % seconds
