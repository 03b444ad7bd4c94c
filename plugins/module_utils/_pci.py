# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside
# gpufleet.upgrade.
"""PCI hardware identities in the gate's format: ``vendor:device/subvendor:subdevice``.

Every side (the node's accelerator discovery, the qualification record) is trimmed and
lowercased before comparison, so ``10DE:1DB6/10de:124A`` and ``10de:1db6/10de:124a`` are one id.
"""
from __future__ import annotations

import re
import typing as t

from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show

PCI_ID_FORMAT = 'vendor:device/subvendor:subdevice'
PCI_ID_EXAMPLE = '10de:1db6/10de:124a'
_PCI_ID_RE = re.compile(r'[0-9a-f]{4}:[0-9a-f]{4}/[0-9a-f]{4}:[0-9a-f]{4}')


def malformed_message(value: t.Any) -> str:
    return 'PCI id %s is malformed: expected %s in hex, e.g. %s' % (show(value), PCI_ID_FORMAT, PCI_ID_EXAMPLE)


def normalize(value: t.Any) -> str:
    """Return the trimmed, lowercased id, or raise ValueError with a message naming the value."""
    if not isinstance(value, str):
        raise ValueError(malformed_message(value))
    norm = value.strip().lower()
    if not _PCI_ID_RE.fullmatch(norm):
        raise ValueError(malformed_message(value))
    return norm


def is_valid(value: t.Any) -> bool:
    try:
        normalize(value)
    except ValueError:
        return False
    return True


def split_items(items: t.Any) -> t.List[t.Any]:
    """Flatten a list whose items may hold comma-separated ids (one string counts as one item)."""
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, (list, tuple)):
        return [items]
    out: t.List[t.Any] = []
    for item in items:
        if isinstance(item, str) and ',' in item:
            out.extend(item.split(','))
        else:
            out.append(item)
    return out


def normalize_all(items: t.Any, prefix: str = '') -> t.Tuple[t.List[str], t.List[str]]:
    """Normalise a list of ids: (sorted unique valid ids, problems).

    Malformed and duplicate entries are problems; ``prefix`` (``'record '``) marks their side.
    """
    seen: t.List[str] = []
    problems: t.List[str] = []
    for item in split_items(items):
        try:
            norm = normalize(item)
        except ValueError as exc:
            problems.append(prefix + str(exc))
            continue
        if norm in seen:
            message = 'PCI id %s is listed more than once' % show(norm)
            if prefix + message not in problems:
                problems.append(prefix + message)
            continue
        seen.append(norm)
    return sorted(seen), problems
