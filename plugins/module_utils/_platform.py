# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Imported by gpu_info on the node: Python 3.9.
"""A GPU node's server platform, the plan's `platform` combination key: one decision for the collection.

`node_platform(labels, dmi)` is the precedence: the Node label `gpufleet.io/platform` (the operator's word), else
`node.kubernetes.io/instance-type` (a cloud provider's), else the machine's DMI identity as the node's firmware
reports it (`dmi_platform`: system vendor and product name, else board vendor and board name), else `unknown`.
On bare metal neither label is usually set: without DMI every node would be `unknown` and distinct server
platforms would be merged into one combination with one canary.

`read_dmi(sys_path)` reads the DMI fields on the node (gpu_info), from `<sys_path>/class/dmi/id/`; a field that
cannot be read (a machine without DMI tables, a /sys not mounted, a file not readable) is None.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

__all__ = ['DMI_FIELDS', 'INSTANCE_TYPE_LABEL', 'PLATFORM_LABEL', 'UNKNOWN', 'dmi_platform', 'node_platform',
           'read_dmi']

PLATFORM_LABEL = 'gpufleet.io/platform'
INSTANCE_TYPE_LABEL = 'node.kubernetes.io/instance-type'
UNKNOWN = 'unknown'
# World-readable files of /sys/class/dmi/id (the serials and UUIDs are root-only, and not a platform).
DMI_FIELDS = ('sys_vendor', 'product_name', 'board_vendor', 'board_name')
# What firmware writes where the vendor left a field empty: no identity, so never a platform.
_PLACEHOLDERS = frozenset((
    '', 'none', 'n/a', 'na', 'null', 'unknown', 'not specified', 'not applicable', 'not available', 'default string',
    'to be filled by o.e.m.', 'to be filled by oem', 'o.e.m.', 'oem', 'system product name', 'system manufacturer',
    'system name', 'base board product name', 'base board manufacturer', 'type1productconfigid', '0123456789',
    'x.x', '$(default_string)', 'invalid',
))
# A DMI string is at most 255 bytes (SMBIOS); anything longer is not a DMI field.
_MAX_FIELD = 255


def _read_field(path: str) -> Optional[str]:
    try:
        with open(path, 'rb') as handle:
            raw = handle.read(_MAX_FIELD + 1)
    except (OSError, ValueError):      # absent, not readable, not a file: no DMI here
        return None
    return raw.decode('utf-8', 'replace')


def read_dmi(sys_path: str = '/sys') -> Dict[str, Optional[str]]:
    """The DMI fields of this machine, each its text stripped, or None where unreadable or empty."""
    base = os.path.join(sys_path, 'class', 'dmi', 'id')
    out: Dict[str, Optional[str]] = {}
    for field in DMI_FIELDS:
        text = _read_field(os.path.join(base, field))
        out[field] = (text.strip() or None) if text is not None else None
    return out


def _clean(value: Any) -> Optional[str]:
    """A DMI field as an identity: printable, whitespace collapsed; None for a placeholder or a non-string."""
    if not isinstance(value, str):
        return None
    text = ' '.join(''.join(c if c.isprintable() else ' ' for c in value).split())
    if text.lower() in _PLACEHOLDERS:
        return None
    return text


def _join(vendor: Optional[str], product: str) -> str:
    if vendor and not product.lower().startswith(vendor.lower()):
        return '%s %s' % (vendor, product)
    return product


def dmi_platform(dmi: Any) -> Optional[str]:
    """The platform a machine's DMI fields say: `<sys_vendor> <product_name>` (e.g. `Supermicro SYS-821GE-TNHR`),
    else, where the product name is empty or a firmware placeholder, `<board_vendor> <board_name>`; None when
    neither names the machine (no DMI, or placeholders only). A vendor the product name already starts with is
    not repeated; a placeholder vendor is left out."""
    if not isinstance(dmi, Mapping):
        return None
    product = _clean(dmi.get('product_name'))
    if product:
        return _join(_clean(dmi.get('sys_vendor')), product)
    board = _clean(dmi.get('board_name'))
    if board:
        return _join(_clean(dmi.get('board_vendor')), board)
    return None


def _label(labels: Mapping[str, Any], key: str) -> Optional[str]:
    value = labels.get(key)
    return (value.strip() or None) if isinstance(value, str) else None


def node_platform(labels: Any, dmi: Any = None) -> str:
    """The node's platform: label `gpufleet.io/platform`, else label `node.kubernetes.io/instance-type`, else the
    DMI identity (`dmi_platform(dmi)`, `dmi` being gpu_info's `dmi` result; None where the caller has none), else
    `unknown`."""
    labels = labels if isinstance(labels, Mapping) else {}
    return (_label(labels, PLATFORM_LABEL) or _label(labels, INSTANCE_TYPE_LABEL) or dmi_platform(dmi)
            or UNKNOWN)
