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
import typing as t


def show(value: t.Any, limit: int = 100) -> str:
    """Quote a value for an error message: strings JSON-quoted (control characters escaped, so
    nothing from a record reaches a terminal raw), anything else as repr; both bounded."""
    if isinstance(value, str):
        if len(value) > limit:
            value = value[:limit - 3] + '...'
        return json.dumps(value, ensure_ascii=False)
    text = repr(value)
    if len(text) > limit:
        text = text[:limit - 3] + '...'
    return text
