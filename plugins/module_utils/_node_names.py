# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Kubernetes Node name <-> inventory host: a host is the Node named by its ``gpufleet_node_name``, else by
its inventory name (an FQDN inventory host of Node ``gpu-h100-03`` sets ``gpufleet_node_name: gpu-h100-03``).

The plan, the canary and the rollout name Nodes; Ansible runs on inventory hosts. Every place that turns
one into the other goes through this module: a Node without an inventory host, or with two, is refused
naming it (and the hosts), never guessed (an ``add_host`` of a Node name would make a new bare host
without the inventory's connection variables)."""

from __future__ import annotations

import fnmatch
from typing import Any, Dict, List, Mapping, Optional, Sequence

__all__ = ['NodeNameError', 'node_name', 'node_claims', 'inventory_hosts', 'node_names', 'plan_hosts']


class NodeNameError(ValueError):
    """A Node name that maps to no inventory host or to several, or a malformed gpufleet_node_name."""


def node_name(host: str, declared: Any = None) -> str:
    """The Node name of inventory host `host` whose gpufleet_node_name is `declared` (None: not set)."""
    if not isinstance(host, str) or not host:
        raise NodeNameError('inventory host: %r is not a host name' % (host,))
    if declared is None:
        return host
    if not isinstance(declared, str) or not declared.strip() or declared != declared.strip():
        raise NodeNameError('gpufleet_node_name of host %s: %r is not a Kubernetes Node name' % (host, declared))
    return declared


def node_claims(hosts: Mapping[str, Any]) -> Dict[str, List[str]]:
    """{Node name: [inventory hosts that claim it]} from `hosts` (inventory host -> its gpufleet_node_name,
    None where it is not set)."""
    if not isinstance(hosts, Mapping):
        raise NodeNameError('hosts: %r is not a mapping of inventory host to gpufleet_node_name' % (hosts,))
    claims: Dict[str, List[str]] = {}
    for host in sorted(hosts):
        claims.setdefault(node_name(host, hosts[host]), []).append(host)
    return claims


def _resolve(nodes: Sequence[str], claims: Dict[str, List[str]], where: str, hint: str = '') -> Dict[str, str]:
    missing = [n for n in nodes if not claims.get(n)]
    if missing:
        raise NodeNameError(
            '%s: Node(s) %s have no inventory host (a host is the Node named by its gpufleet_node_name, else by its '
            'inventory name); add a host for each or set gpufleet_node_name on its host%s'
            % (where, ', '.join(missing), hint))
    twice = ['Node %s is claimed by hosts %s' % (n, ' and '.join(claims[n])) for n in nodes if len(claims[n]) > 1]
    if twice:
        raise NodeNameError('%s: %s; one inventory host per Node (gpufleet_node_name, else the inventory name)'
                            % (where, '; '.join(twice)))
    return {n: claims[n][0] for n in nodes}


def _names(value: Any, what: str) -> List[str]:
    if not isinstance(value, (list, tuple)):
        raise NodeNameError('%s: %r is not a list of names' % (what, value))
    for i, v in enumerate(value):
        if not isinstance(v, str) or not v:
            raise NodeNameError('%s[%d]: %r is not a name' % (what, i, v))
    return list(value)


def inventory_hosts(nodes: Sequence[str], hosts: Mapping[str, Any], where: str = 'nodes') -> List[str]:
    """The inventory host of each Node of `nodes`, in order (`hosts`: inventory host -> its gpufleet_node_name
    or None). A Node without a host, or claimed by two, is refused naming it (`where` names the list)."""
    nodes = _names(nodes, where)
    by_node = _resolve(list(dict.fromkeys(nodes)), node_claims(hosts), where)
    return [by_node[n] for n in nodes]


def node_names(hosts: Sequence[str], declared: Mapping[str, Any]) -> List[str]:
    """The Node name of each inventory host of `hosts`, in order (`declared`: host -> gpufleet_node_name or
    None; a host not in it is its own Node name)."""
    hosts = _names(hosts, 'hosts')
    if not isinstance(declared, Mapping):
        raise NodeNameError('declared: %r is not a mapping of inventory host to gpufleet_node_name' % (declared,))
    return [node_name(h, declared.get(h)) for h in hosts]


def plan_hosts(fleet_nodes: Sequence[str], hosts: Mapping[str, Any],
               exclude: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """{Node name: inventory host} for the plan: every Node of fleet_info's selection (`fleet_nodes`) that
    `exclude` (gpufleet_exclude: names or globs) does not leave out must have exactly one inventory host among
    `hosts` (the GPU hosts whose NVML facts the plan reads: host -> gpufleet_node_name or None); else the plan
    is refused naming the Node (it would form a combination of PCI identity ``unknown`` whose canary or batch
    has no host to run on). An excluded Node is mapped when it has a host, and skipped when not."""
    fleet_nodes = _names(fleet_nodes, 'fleet.nodes')
    patterns = _names([] if exclude is None else exclude, 'exclude')
    claims = node_claims(hosts)
    kept = [n for n in fleet_nodes if not any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    out = _resolve(kept, claims, 'GPU hosts (gpufleet_hosts)', ', or leave the Node out (gpufleet_exclude)')
    for n in fleet_nodes:
        if n not in out and len(claims.get(n) or ()) == 1:
            out[n] = claims[n][0]
    return out
