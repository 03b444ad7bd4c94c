# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Documentation: xid_severity.yml next to this file.

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _xid


def xid_severity(value: t.Any) -> str:
    """Severity of an Xid code (int, decimal string, or a gpu_info `xid_events` item)."""
    code = value.get('code') if isinstance(value, dict) else value
    if isinstance(code, bool) or not isinstance(code, (int, str)):
        raise AnsibleFilterError('gpufleet.upgrade.xid_severity: expected an Xid code or an Xid event, got %r' % (value,))
    try:
        number = int(code)
    except ValueError:
        raise AnsibleFilterError('gpufleet.upgrade.xid_severity: %r is not an Xid code (a non-negative integer)' % (code,))
    if number < 0:
        raise AnsibleFilterError('gpufleet.upgrade.xid_severity: %r is not an Xid code (a non-negative integer)' % (code,))
    return _xid.describe(number)['severity']


class FilterModule:
    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'xid_severity': xid_severity}
