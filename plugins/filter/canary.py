# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Documentation: the YAML file of each filter next to this file.

"""The canary role's decisions between module calls, as filters over _qualification_record (thin:
every decision is a tested function there)."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification_record


def canary_measured_nodes(node: t.Any, result: t.Any = None) -> t.List[t.Dict[str, t.Any]]:
    try:
        return _qualification_record.canary_measured_nodes(node, result)
    except _qualification_record.RecordError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.canary_measured_nodes: %s' % exc)


class FilterModule:
    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'canary_measured_nodes': canary_measured_nodes}
