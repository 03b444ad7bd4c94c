# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters over the upgrade planner: upgrade_plan and kernel_line (docs in the sidecar YAML files)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import (
    DEFAULT_COMBINATION_KEYS, DEFAULT_SOURCE_DRIFT, PlanInputError, PlanRefused, build_plan, kernel_line, planner_nodes,
)


def upgrade_plan(nodes: List[Dict[str, Any]], target: Optional[Dict[str, Any]] = None,
                 canaries_per_combination: int = 1, batch_size: Any = '10%', max_unavailable: Any = '25%',
                 failure_allowance: Optional[Dict[str, Any]] = None,
                 combination_keys: Optional[List[str]] = None, exclude: Optional[List[str]] = None,
                 omitted_block: bool = True, single_node_pool_acknowledged: bool = False,
                 canaries_isolated: bool = True, source_drift: str = DEFAULT_SOURCE_DRIFT) -> Dict[str, Any]:
    """The plan dict (same shape as the upgrade_plan module's result)."""
    try:
        return build_plan(
            nodes, target=target, canaries_per_combination=canaries_per_combination, batch_size=batch_size,
            max_unavailable=max_unavailable, failure_allowance=failure_allowance,
            combination_keys=combination_keys or DEFAULT_COMBINATION_KEYS, exclude=exclude or (),
            omitted_block=omitted_block, single_node_pool_acknowledged=single_node_pool_acknowledged,
            canaries_isolated=canaries_isolated, source_drift=source_drift)
    except (PlanInputError, PlanRefused) as exc:
        raise AnsibleFilterError('gpufleet.upgrade.upgrade_plan: %s' % exc)


def kernel_line_filter(kernel: str) -> str:
    """The kernel line (major.minor) of a kernel release."""
    try:
        return kernel_line(kernel)
    except PlanInputError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.kernel_line: %s' % exc)


def planner_nodes_filter(fleet: Dict[str, Any], hostvars: Any, holders: Optional[Dict[str, Any]] = None,
                         install_method: str = 'apt') -> List[Dict[str, Any]]:
    """The planner's input from fleet_info's result, the hosts' NVML facts and the holders count."""
    facts = {}
    for node in (fleet or {}).get('nodes') or []:
        name = node.get('name') if isinstance(node, dict) else None
        if name and name in hostvars:
            facts[name] = hostvars[name].get('gpufleet_gpu_facts')
    try:
        return planner_nodes(fleet, facts, holders, install_method)
    except PlanInputError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.planner_nodes: %s' % exc)


class FilterModule(object):
    def filters(self) -> Dict[str, Any]:
        return {'upgrade_plan': upgrade_plan, 'kernel_line': kernel_line_filter, 'planner_nodes': planner_nodes_filter}
