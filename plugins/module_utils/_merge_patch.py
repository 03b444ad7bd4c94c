# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""JSON merge patches (RFC 7386), pure: no HTTP client, so the decision code and the filters can use them
without importing `_k8s` (and urllib3) in every Ansible worker.

- `merge_patch(current, desired)`: the patch that turns `current` into `desired` (None when equal).
- `apply_merge_patch(obj, patch)`: `obj` after the patch, as a new object (check mode's prediction).
"""

from __future__ import annotations

import copy
from typing import Any, Dict


def merge_patch(current: Any, desired: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``current`` into ``desired``; None when equal.

    Mappings are patched key by key (keys absent from ``desired`` are set to null, i.e. removed);
    anything else is replaced whole.
    """
    if isinstance(current, dict) and isinstance(desired, dict):
        patch: Dict[str, Any] = {}
        for key in current:
            if key not in desired:
                patch[key] = None
        for key, value in desired.items():
            if key not in current:
                patch[key] = value
            else:
                sub = merge_patch(current[key], value)
                if sub is not None:
                    patch[key] = sub
        return patch or None
    return None if current == desired else desired


def apply_merge_patch(obj: Any, patch: Any) -> Any:
    """`obj` after the JSON merge patch `patch` (RFC 7386), as a new object; `obj` is not changed.

    A mapping is merged key by key (null removes the key); anything else (a list, a string)
    replaces the value whole. None as the patch (nothing to change) returns a copy of `obj`."""
    if patch is None:
        return copy.deepcopy(obj)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(obj) if isinstance(obj, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = apply_merge_patch(out.get(key), value)
        else:
            out[key] = copy.deepcopy(value)
    return out
