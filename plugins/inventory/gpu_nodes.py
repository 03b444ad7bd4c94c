# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_nodes
short_description: The GPU Nodes of an RKE2 cluster as inventory hosts
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Lists the cluster's GPU Nodes (O(node_selector)) and makes one host of each, in the group C(gpu_nodes) that the
    collection's playbooks target.
  - Each host has C(gpufleet_node_name) (the Node name, which the playbooks use to find the host's Node),
    C(gpufleet_rke2_role) (V(server) for a Node with a C(node-role.kubernetes.io/control-plane), C(etcd) or C(master)
    label, whatever its value - the role M(gpufleet.upgrade.suc_plan) and M(gpufleet.upgrade.suc_info) read - else
    V(agent)), and C(gpufleet_node), a dictionary of what the Node says - C(kernel), C(kernel_line),
    C(rke2_version) (the kubelet version), C(platform), C(gpu_product), C(gpus), C(partition_mode), C(mig_strategy),
    C(install_method), C(addresses), C(labels), C(ready) and C(unschedulable).
  - Groups by the upgrade plan's combination keys as far as a Node says them - C(gpufleet_platform_<platform>)
    (label C(gpufleet.io/platform), else C(node.kubernetes.io/instance-type), else V(unknown) - the inventory sees
    the Node only, not the machine's DMI identity that the plan falls back to where no label says the platform, so
    two platforms the plan tells apart by DMI can share the group C(gpufleet_platform_unknown)),
    C(gpufleet_kernel_<line>) (the kernel's major.minor, C(6.8) as C(6_8)), C(gpufleet_partition_<mode>),
    C(gpufleet_install_<method>) (only where a C(gpufleet.io/install-method) label says it), C(gpufleet_gpu_<product>)
    (label C(nvidia.com/gpu.product)) - and by RKE2 role, C(gpufleet_rke2_server) and C(gpufleet_rke2_agent).
    Group names are lower case, every character outside C([a-z0-9_]) replaced by C(_).
  - The GPU PCI id, the plan's first combination key, is not on a Node (a label value cannot hold C(:)); the plan
    reads it from NVML on the host. Hosts are grouped by the GPU product label instead, which two PCI ids (another
    subsystem, another board) can share.
  - The partition mode is V(mig) where the Node offers C(nvidia.com/mig-*) resources or its C(nvidia.com/mig.config)
    label asks mig-manager for a layout other than V(all-disabled), else V(none); the plan takes it from the GPUs'
    current MIG mode on the host.
  - It only reads (lists Nodes); it needs RBAC to C(list) C(nodes) and nothing else, which the collection's
    C(gpufleet-upgrade-reader) ClusterRole (C(docs/rbac)) grants.
  - Authenticates as the collection's modules do - O(kubeconfig), O(context), explicit O(host) and credentials, the
    C(K8S_AUTH_*) environment variables, E(KUBECONFIG), else the in-cluster service account.
  - The configuration file's name must end in C(gpu_nodes.yml) or C(gpu_nodes.yaml). The C(auto) inventory plugin,
    enabled by default, loads this plugin from the file's C(plugin) key; where C(enable_plugins)
    (E(ANSIBLE_INVENTORY_ENABLED)) is set, list C(gpufleet.upgrade.gpu_nodes) (or C(auto)) in it.
  - With O(cache), the Nodes read are kept per the configuration file and O(node_selector); the host names, variables
    and groups are computed again on each run, from the cached Nodes.
options:
  plugin:
    description: The name of this plugin; the configuration file is read only with this value.
    type: str
    required: true
    choices: [gpufleet.upgrade.gpu_nodes]
  node_selector:
    description:
      - Label selector of the Nodes to list (the GPU pool), used exactly as given. An empty string lists every Node.
      - Not set (the default), the hosts are the NVIDIA GPU Nodes, as M(gpufleet.upgrade.fleet_info) and the playbooks
        choose them without a selector - labelled C(nvidia.com/gpu.present=true) by GPU Feature Discovery or
        C(feature.node.kubernetes.io/pci-10de.present=true) by Node Feature Discovery, or reporting an NVIDIA GPU
        resource in their capacity or allocatable, or carrying a C(gpufleet.io/) annotation; no GPU Feature Discovery
        is needed.
    type: str
  hostname:
    description:
      - How a host is named, from its Node, by sources tried in order; the first that gives a value names the host.
      - V(name) is the Node name; V(InternalIP), V(ExternalIP), V(Hostname), V(InternalDNS) and V(ExternalDNS) are the
        Node's address of that type; V(label:<key>) and V(annotation:<key>) the value of that label or annotation.
      - A Node that no source names, and a host name two Nodes would share, fail the inventory, naming the Nodes.
      - The collection's playbooks find each Node's host by its C(gpufleet_node_name), so any source works for them;
        O(ansible_host) says where to connect independently of the name.
    type: list
    elements: str
    default: [name]
  ansible_host:
    description:
      - Where Ansible connects to a host (C(ansible_host)), by sources as for O(hostname), e.g. V([InternalIP]).
      - Not set (the default), Ansible connects to the host name. A Node that no source names fails the inventory.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - constructed
  - inventory_cache
notes:
  - O(kubeconfig) and the credentials may also be left out of the configuration file and given by the C(K8S_AUTH_*)
    environment variables.
seealso:
  - module: gpufleet.upgrade.fleet_info
"""

EXAMPLES = r"""
# inventories/prod/gpu_nodes.yml
plugin: gpufleet.upgrade.gpu_nodes
kubeconfig: ~/.kube/rke2-prod.yaml
ansible_host: [InternalIP]
---
# A pool of one's own label rather than every NVIDIA GPU Node
plugin: gpufleet.upgrade.gpu_nodes
node_selector: gpufleet.io/pool=h100
---
# Named by an address, and extra groups with the constructed options
plugin: gpufleet.upgrade.gpu_nodes
hostname: [Hostname, name]
ansible_host: [InternalIP, ExternalIP]
keyed_groups:
  - key: gpufleet_node.labels['nvidia.com/gpu.memory'] | default('unknown')
    prefix: gpu_memory
compose:
  ansible_user: "'ubuntu'"
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/gpufleet-inventory
cache_timeout: 600
"""

import hashlib
from typing import Any, Dict, List

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable

from ansible_collections.gpufleet.upgrade.plugins.module_utils._fleet import FleetError, pool_nodes, pool_query
from ansible_collections.gpufleet.upgrade.plugins.module_utils._inventory import (
    InventoryConfigError, are_records, host_entries, node_record, parse_sources)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import AUTH_ARG_SPEC, K8sClient, K8sError


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    """The GPU Nodes of the cluster as hosts (the decisions are in module_utils/_inventory.py)."""

    NAME = 'gpufleet.upgrade.gpu_nodes'

    def verify_file(self, path: str) -> bool:
        return bool(super().verify_file(path)) and path.endswith(('gpu_nodes.yml', 'gpu_nodes.yaml'))

    def _fail(self, msg: str) -> AnsibleParserError:
        return AnsibleParserError('%s: %s' % (self.NAME, msg))

    def _auth_params(self) -> Dict[str, Any]:
        return {name: self.get_option(name) for name in AUTH_ARG_SPEC}

    def _list_nodes(self) -> List[Dict[str, Any]]:
        selector = self.get_option('node_selector')     # None: the default pool (_fleet.is_gpu_node)
        try:
            client = K8sClient.from_params(self._auth_params())
            nodes = client.list_all('/api/v1/nodes', pool_query(selector) or None)
            return [node_record(n) for n in pool_nodes(nodes, selector)]
        except K8sError as exc:
            raise self._fail('cannot list the Nodes (node_selector=%r): %s' % (selector, exc)) from None
        except (InventoryConfigError, FleetError) as exc:
            raise self._fail(str(exc)) from None

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        try:
            hostname = parse_sources('hostname', self.get_option('hostname'))
            ansible_host = parse_sources('ansible_host', self.get_option('ansible_host'))
        except InventoryConfigError as exc:
            raise self._fail(str(exc)) from None

        selector = self.get_option('node_selector')
        # The default pool and the empty selector (every Node) are two pools: two cache entries.
        pool = 'default-pool' if selector is None else 'selector=%s' % selector
        cache_key = '%s_%s' % (self.get_cache_key(path), hashlib.sha256(pool.encode('utf-8')).hexdigest()[:12])
        use_cache = bool(self.get_option('cache'))
        records = None
        if use_cache and cache:
            try:
                records = self._cache[cache_key]
            except KeyError:
                records = None
        if not are_records(records):     # not cached, expired, or written by another version: read again
            records = self._list_nodes()
            if use_cache:
                self._cache[cache_key] = records

        try:
            entries = host_entries(records, hostname, ansible_host)
        except InventoryConfigError as exc:
            raise self._fail(str(exc)) from None
        self._populate(entries)

    def _populate(self, entries: List[Dict[str, Any]]) -> None:
        strict = self.get_option('strict')
        for entry in entries:
            name = entry['name']
            for group in entry['groups']:
                self.inventory.add_group(group)
            self.inventory.add_host(name, group=entry['groups'][0])
            for group in entry['groups'][1:]:
                self.inventory.add_host(name, group=group)
            for key, value in entry['vars'].items():
                self.inventory.set_variable(name, key, value)
            host_vars = self.inventory.get_host(name).get_vars()
            self._set_composite_vars(self.get_option('compose'), host_vars, name, strict=strict)
            self._add_host_to_composed_groups(self.get_option('groups'), host_vars, name, strict=strict)
            self._add_host_to_keyed_groups(self.get_option('keyed_groups'), host_vars, name, strict=strict)
