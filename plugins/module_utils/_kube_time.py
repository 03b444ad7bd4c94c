# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside gpufleet.upgrade.
"""Kubernetes timestamps (RFC 3339, ``Z`` or offset, optional fraction) as aware UTC datetimes.

The one RFC 3339 reader of the Kubernetes, evidence and metric-gate code: a regular expression,
not `datetime.fromisoformat`, whose accepted forms differ between Python 3.9 and 3.11.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_RFC3339_RE = re.compile(
    r'^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$')
_NO_ZONE_RE = re.compile(r'^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?$')


def parse_time(value: Any, field_name: str) -> datetime.datetime:
    """Parse an RFC 3339 timestamp (or accept an aware datetime); ValueError names field and value."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ValueError('%s: %r has no time zone; give an RFC 3339 time such as 2026-07-14T12:00:00Z'
                             % (field_name, value.isoformat()))
        return _utc(value, value.isoformat(), field_name)
    m = _RFC3339_RE.match(value.strip()) if isinstance(value, str) else None
    if not m:
        if isinstance(value, str) and _NO_ZONE_RE.match(value.strip()):
            raise ValueError('%s: %r has no UTC offset (add Z or +00:00)' % (field_name, value))
        raise ValueError('%s: %r is not an RFC 3339 time such as 2026-07-14T12:00:00Z' % (field_name, value))
    date, clock, frac, zone = m.groups()
    micro = (frac[1:] + '000000')[:6] if frac else '000000'
    zone = '+00:00' if zone in ('Z', 'z') else zone
    try:
        parsed = datetime.datetime.fromisoformat('%sT%s.%s%s' % (date, clock, micro, zone))
    except ValueError:
        raise ValueError('%s: %r is not a valid date and time' % (field_name, value))
    return _utc(parsed, value, field_name)


def _utc(moment: datetime.datetime, shown: Any, field_name: str) -> datetime.datetime:
    """`moment` in UTC; ValueError (not OverflowError) when its offset moves it past 9999-12-31 or before 0001-01-01."""
    try:
        return moment.astimezone(datetime.timezone.utc)
    except OverflowError:
        raise ValueError('%s: %r is outside the years 1 to 9999 in UTC' % (field_name, shown)) from None


def format_time(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, seconds precision (the Kubernetes style)."""
    utc = value.astimezone(datetime.timezone.utc)
    # Explicit zero padding: strftime's %Y writes year 999 as "999" on glibc.
    return '%04d-%02d-%02dT%02d:%02d:%02dZ' % (utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second)
