# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""The decisions of the `gpufleet.upgrade.gpu_nodes` inventory plugin (pure functions).

- `node_record(node)`: what the inventory keeps of a Node (JSON, so the inventory cache holds it): fleet_info's
  view (`_fleet.node_facts`: the platform as far as the Node says it, `gpufleet.io/platform` else the instance
  type else `unknown`; the plan also falls back to the host's DMI identity, which a Node does not carry)
  plus the addresses, every annotation and the MIG resources it offers.
- `parse_sources(option, value)`: a checked `hostname` / `ansible_host` source list
  (V(name), an address type, V(label:<key>), V(annotation:<key>)).
- `host_entries(records, hostname, ansible_host)`: one entry per Node (`name`, `vars`, `groups`), sorted; two Nodes
  with the same host name, or a Node that no source names, is an `InventoryConfigError` naming them.

The groups are the upgrade plan's material combination keys as far as a Node says them (platform, kernel line,
partition mode, install method where a label says it; the GPU model by its product label: a Node label cannot carry
a PCI id, ':' is not valid in a label value, the plan reads it from NVML on the host) and the RKE2 role.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._fleet import node_facts
from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_resources import MIG_PREFIX
from ansible_collections.gpufleet.upgrade.plugins.module_utils._rke2 import node_role
from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import PlanInputError, kernel_line

# The group the playbooks target (hosts: gpufleet_hosts | default('gpu_nodes')).
ALL_GROUP = 'gpu_nodes'
ADDRESS_TYPES = ('InternalIP', 'ExternalIP', 'Hostname', 'InternalDNS', 'ExternalDNS')
INSTALL_METHOD_LABEL = 'gpufleet.io/install-method'
PRODUCT_LABEL = 'nvidia.com/gpu.product'
MIG_CONFIG_LABEL = 'nvidia.com/mig.config'
MIG_STRATEGY_LABEL = 'nvidia.com/mig.strategy'
# kubectl apply's copy of the object: large, and nothing a host needs.
_DROPPED_ANNOTATIONS = ('kubectl.kubernetes.io/last-applied-configuration',)
_UNSAFE_GROUP_CHARS = re.compile(r'[^a-z0-9_]')


class InventoryConfigError(ValueError):
    """Bad inventory configuration, or Nodes it cannot name; `str()` is fit for a user."""


Source = Tuple[str, str]   # (kind, key): ('name', ''), ('address', 'InternalIP'), ('label', k), ('annotation', k)


def parse_source(option: str, value: Any) -> Source:
    """One `hostname` / `ansible_host` entry, checked."""
    if not isinstance(value, str) or not value.strip():
        raise InventoryConfigError('%s: %r is not a source (use name, %s, label:<key> or annotation:<key>)'
                                   % (option, value, ', '.join(ADDRESS_TYPES)))
    text = value.strip()
    if text == 'name':
        return ('name', '')
    if text in ADDRESS_TYPES:
        return ('address', text)
    kind, sep, key = text.partition(':')
    if sep and kind in ('label', 'annotation'):
        if not key.strip():
            raise InventoryConfigError('%s: %r names no %s key' % (option, value, kind))
        return (kind, key.strip())
    raise InventoryConfigError('%s: %r is not a source (use name, %s, label:<key> or annotation:<key>)'
                               % (option, value, ', '.join(ADDRESS_TYPES)))


def parse_sources(option: str, value: Any) -> List[Source]:
    """A source list (a string is one source); None or [] is no source."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise InventoryConfigError('%s: %r is not a list of sources' % (option, value))
    return [parse_source(option, v) for v in value]


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def partition_mode(labels: Dict[str, str], mig_resources: int) -> str:
    """V(mig) where the Node offers MIG devices (`nvidia.com/mig-*` allocatable) or mig-manager is told to
    partition it (`nvidia.com/mig.config` other than V(all-disabled)); else V(none). The plan reads the mode
    from NVML on the host (a GPU's current MIG mode): this is what the Node says of it."""
    if mig_resources > 0:
        return 'mig'
    config = str(labels.get(MIG_CONFIG_LABEL) or '').strip()
    if config and config != 'all-disabled':
        return 'mig'
    return 'none'


def node_record(node: Dict[str, Any]) -> Dict[str, Any]:
    """What the inventory keeps of one Node (JSON-serialisable)."""
    if not isinstance(node, dict) or not isinstance((node.get('metadata') or {}).get('name'), str):
        raise InventoryConfigError('the API answered a Node without a name: %r' % (node,))
    facts = node_facts(node)
    meta = node.get('metadata') or {}
    status = node.get('status') or {}
    alloc = status.get('allocatable') or {}
    annotations = {k: v for k, v in sorted((meta.get('annotations') or {}).items()) if k not in _DROPPED_ANNOTATIONS}
    addresses = [{'type': str(a.get('type')), 'address': str(a.get('address'))}
                 for a in status.get('addresses') or [] if isinstance(a, dict) and a.get('address')]
    mig = sum(_int(v) for k, v in alloc.items() if k.startswith(MIG_PREFIX))
    return {
        'name': facts['name'], 'labels': facts['labels'], 'annotations': annotations, 'addresses': addresses,
        'kernel': facts['kernel'], 'rke2': facts['rke2'], 'platform': facts['platform'],
        'gpu_product': facts['gpu_product'], 'gpus': facts['gpus'], 'mig_resources': mig,
        'ready': facts['ready'], 'unschedulable': facts['unschedulable'],
    }


def are_records(value: Any) -> bool:
    """Whether a cached value is a list of Node records as node_record() writes them (else: read the Nodes again)."""
    return isinstance(value, list) and all(isinstance(r, dict) and isinstance(r.get('name'), str)
                                           and isinstance(r.get('labels'), dict) for r in value)


def resolve(record: Dict[str, Any], sources: Sequence[Source]) -> Optional[str]:
    """The first value the sources give for the record (None: none)."""
    for kind, key in sources:
        value: Any = None
        if kind == 'name':
            value = record.get('name')
        elif kind == 'address':
            value = next((a['address'] for a in record.get('addresses') or [] if a.get('type') == key), None)
        elif kind == 'label':
            value = (record.get('labels') or {}).get(key)
        elif kind == 'annotation':
            value = (record.get('annotations') or {}).get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def group_name(prefix: str, value: Any) -> str:
    """`prefix` + value, lower case, every character outside [a-z0-9_] as `_` (a valid Ansible group name)."""
    return prefix + _UNSAFE_GROUP_CHARS.sub('_', str(value).lower())


def _kernel_line(kernel: Any) -> Optional[str]:
    try:
        return kernel_line(kernel)
    except PlanInputError:
        return None


def _describe(sources: Sequence[Source]) -> str:
    return ', '.join(key if kind == 'address' else ('%s:%s' % (kind, key) if key else kind) for kind, key in sources)


def host_entry(record: Dict[str, Any], hostname: Sequence[Source], ansible_host: Sequence[Source]) -> Dict[str, Any]:
    """The inventory host of one Node record: `name`, `vars`, `groups`."""
    node = record['name']
    name = resolve(record, hostname)
    if name is None:
        raise InventoryConfigError('hostname: Node %s has no value for any of %s' % (node, _describe(hostname)))
    labels = record.get('labels') or {}
    # The one RKE2 role decision (suc_plan and preflight use it too): a role label present makes a server.
    role = node_role(labels).role
    mode = partition_mode(labels, _int(record.get('mig_resources')))
    line = _kernel_line(record.get('kernel'))
    method = str(labels.get(INSTALL_METHOD_LABEL) or '').strip() or None
    facts = {
        'kernel': record.get('kernel'), 'kernel_line': line, 'rke2_version': record.get('rke2'),
        'platform': record.get('platform') or 'unknown', 'gpu_product': record.get('gpu_product'),
        'gpus': record.get('gpus'), 'partition_mode': mode, 'mig_strategy': labels.get(MIG_STRATEGY_LABEL),
        'install_method': method, 'addresses': list(record.get('addresses') or []), 'labels': dict(labels),
        'ready': record.get('ready'), 'unschedulable': record.get('unschedulable'),
    }
    host_vars: Dict[str, Any] = {'gpufleet_node_name': node, 'gpufleet_rke2_role': role, 'gpufleet_node': facts}
    if ansible_host:
        address = resolve(record, ansible_host)
        if address is None:
            raise InventoryConfigError('ansible_host: Node %s has no value for any of %s'
                                       % (node, _describe(ansible_host)))
        host_vars['ansible_host'] = address
    groups = [ALL_GROUP, group_name('gpufleet_rke2_', role), group_name('gpufleet_platform_', facts['platform']),
              group_name('gpufleet_partition_', mode)]
    if line:
        groups.append(group_name('gpufleet_kernel_', line))
    if facts['gpu_product']:
        groups.append(group_name('gpufleet_gpu_', facts['gpu_product']))
    if method:
        groups.append(group_name('gpufleet_install_', method))
    return {'name': name, 'vars': host_vars, 'groups': groups}


def host_entries(records: Sequence[Dict[str, Any]], hostname: Sequence[Source],
                 ansible_host: Sequence[Source]) -> List[Dict[str, Any]]:
    """One host per Node record, by host name; a host name two Nodes share is an error naming both."""
    if not hostname:
        raise InventoryConfigError('hostname: give at least one source (name, an address type, label:<key> or '
                                   'annotation:<key>)')
    out: Dict[str, Dict[str, Any]] = {}
    for record in records:
        entry = host_entry(record, hostname, ansible_host)
        other = out.get(entry['name'])
        if other is not None:
            raise InventoryConfigError('hostname: Nodes %s and %s both give the host name %s (%s); choose a source '
                                       'that tells them apart' % (other['vars']['gpufleet_node_name'], record['name'],
                                                                  entry['name'], _describe(hostname)))
        out[entry['name']] = entry
    return [out[k] for k in sorted(out)]
