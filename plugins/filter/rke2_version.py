# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Documentation: rke2_version.yml next to this file.

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _rke2


def rke2_version(value: t.Any) -> t.Dict[str, t.Any]:
    """``v1.36.1+rke2r1`` -> ``{minor: 36, patch: 1, rev: 1, kubernetes: v1.36.1}``."""
    try:
        return _rke2.parse(value).as_dict()
    except ValueError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.rke2_version: %s' % exc)


class FilterModule:
    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'rke2_version': rke2_version}
