# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Who set a field of a Kubernetes object, as the API server records it in ``metadata.managedFields``.

The API server keeps, for every write, the manager (the request's ``fieldManager``, else a name derived
from its User-Agent), the operation and the time, with the set of fields that manager owns
(``fieldsV1``: ``{"f:spec": {"f:unschedulable": {}}}``). A write that changes a field takes it over
from its previous owner; a write that removes a field leaves no owner for it. The collection's own
writes of ``spec.unschedulable`` carry ``fieldManager=gpufleet.upgrade`` (FIELD_MANAGER), so whether the
node's cordon is the collection's is a fact the API keeps, not a guess from the time of another
controller's taint.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

# The fieldManager of the collection's writes of a Node's spec.unschedulable (node_drain). It is also the
# name the API server derived from the collection's User-Agent before the writes named it.
FIELD_MANAGER = 'gpufleet.upgrade'


def owners(obj: Dict[str, Any], path: Sequence[str]) -> List[Dict[str, Any]]:
    """The managedFields entries that own the field at `path` (e.g. ('spec', 'unschedulable')) of the
    object itself (not of a subresource such as status), each as {manager, operation, time}; []
    when no entry owns it (the field is absent, or the object carries no managedFields)."""
    found: List[Dict[str, Any]] = []
    entries = (obj.get('metadata') or {}).get('managedFields') or []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get('subresource'):
            continue
        fields: Any = entry.get('fieldsV1')
        for name in path:
            fields = fields.get('f:' + name) if isinstance(fields, dict) else None
        if fields is not None:
            found.append({'manager': entry.get('manager'), 'operation': entry.get('operation'),
                          'time': entry.get('time')})
    return found


def owned_only_by(obj: Dict[str, Any], path: Sequence[str], manager: str) -> bool:
    """The field at `path` is owned, and only by `manager`."""
    found = owners(obj, path)
    return bool(found) and all(o['manager'] == manager for o in found)


def describe(found: List[Dict[str, Any]]) -> str:
    """'kubectl-cordon (Update, 2026-12-06T10:00:00Z)' for each owner, comma separated."""
    out = []
    for o in found:
        details = ', '.join(str(v) for v in (o.get('operation'), o.get('time')) if v)
        out.append('%s%s' % (o.get('manager') or '(no manager)', ' (%s)' % details if details else ''))
    return ', '.join(out)
