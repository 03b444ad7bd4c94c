# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Documentation: pci_id.yml next to this file.

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _pci


def pci_id(value: t.Any) -> str:
    """`` 10DE:1DB6/10de:124A `` -> ``10de:1db6/10de:124a``; malformed ids raise."""
    try:
        return _pci.normalize(value)
    except ValueError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.pci_id: %s' % exc)


class FilterModule:
    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'pci_id': pci_id}
