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
from ansible_collections.gpufleet.upgrade.plugins.module_utils._node_names import NodeNameError, plan_hosts


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


def _declared(hostvars: Any, hosts: Any) -> Dict[str, Any]:
    """{inventory host: its gpufleet_node_name, None where not set} for `hosts` (all of hostvars' when None)."""
    names = list(hostvars) if hosts is None else hosts
    if not isinstance(names, (list, tuple)):
        raise NodeNameError('hosts: %r is not a list of inventory host names' % (names,))
    return {h: (hostvars[h].get('gpufleet_node_name') if h in hostvars else None) for h in names}


def planner_nodes_filter(fleet: Dict[str, Any], hostvars: Any, holders: Optional[Dict[str, Any]] = None,
                         install_method: str = 'apt', hosts: Optional[List[str]] = None,
                         exclude: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """The planner's input from fleet_info's result, the hosts' NVML facts and the holders count; each Node's
    facts are its inventory host's (gpufleet_node_name, else the inventory name; _node_names.plan_hosts)."""
    try:
        fleet_nodes = (fleet or {}).get('nodes') if isinstance(fleet, dict) else None
        names = [n['name'] for n in fleet_nodes or [] if isinstance(n, dict) and isinstance(n.get('name'), str)] \
            if isinstance(fleet_nodes, list) else []
        by_node = plan_hosts(names, _declared(hostvars, hosts), exclude)
        facts = {node: hostvars[host].get('gpufleet_gpu_facts') for node, host in by_node.items() if host in hostvars}
        return planner_nodes(fleet, facts, holders, install_method)
    except (PlanInputError, NodeNameError) as exc:
        raise AnsibleFilterError('gpufleet.upgrade.planner_nodes: %s' % exc)


class FilterModule(object):
    def filters(self) -> Dict[str, Any]:
        return {'upgrade_plan': upgrade_plan, 'kernel_line': kernel_line_filter, 'planner_nodes': planner_nodes_filter}
