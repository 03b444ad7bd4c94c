#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_isolation
short_description: Label and taint a GPU node as a canary (or release it)
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - V(present) adds the label C(<key>=true) and the taint C(<key>=true:NoSchedule) (default key
    C(gpufleet.io/canary)), so production work stays off the canary pool while it is qualified.
  - V(absent) removes exactly that label and taint; other taints are kept.
  - With O(owner), V(present) records who isolated the node in the annotation C(gpufleet.io/isolated-by)
    (only when it adds the label itself), and V(absent) releases only a node whose annotation names
    O(owner) - a node someone else isolated is left alone (RV(released) false).
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether the node would change and writes nothing.
  diff_mode:
    support: full
    details:
      - Shows the node's label and taints before and after.
  idempotent:
    support: full
    description: A second run reports no change.
options:
  node:
    description: Name of the Node.
    type: str
    required: true
  state:
    description: Isolated (V(present)) or released (V(absent)).
    type: str
    choices: [present, absent]
    default: present
  key:
    description: Label and taint key.
    type: str
    default: gpufleet.io/canary
  owner:
    description:
      - Who isolates (V(present)) or may release (V(absent)) the node, for example V(gpufleet.upgrade.canary)
        (the canary role). Without it, V(absent) releases any isolation.
    type: str
notes:
  - Belongs to the C(gpufleet.upgrade.k8s) action group.
"""

EXAMPLES = r"""
- name: Isolate the canary
  gpufleet.upgrade.node_isolation:
    node: gpu-01

- name: Release it after the rollout
  gpufleet.upgrade.node_isolation:
    node: gpu-01
    state: absent

- name: Release it only if the canary role isolated it
  gpufleet.upgrade.node_isolation:
    node: gpu-01
    state: absent
    owner: gpufleet.upgrade.canary
"""

RETURN = r"""
labels:
  description: The node's labels after the task.
  returned: success
  type: dict
taints:
  description: The node's taints after the task.
  returned: success
  type: list
  elements: dict
released:
  description: With O(state=absent), whether the node is (or would be) free of the isolation after the task.
    False when O(owner) does not match the node's C(gpufleet.io/isolated-by) annotation.
  returned: when I(state=absent)
  type: bool
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule


def _view(node):
    return {'labels': dict((node.get('metadata') or {}).get('labels') or {}),
            'taints': list((node.get('spec') or {}).get('taints') or [])}


# The module's own options (the Kubernetes auth options are added); the action plugin runs run() with them
# in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    node={'type': 'str', 'required': True},
    state={'type': 'str', 'choices': ['present', 'absent'], 'default': 'present'},
    key={'type': 'str', 'default': _upgrade_state.CANARY_KEY, 'no_log': False},
    owner={'type': 'str'},
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    p = module.params
    present = p['state'] == 'present'
    path = path_for('v1', 'nodes', p['node'])
    with module.errors(context='node %s' % p['node'], not_found={path: 'node: %r does not exist' % p['node']}):
        before, after = module.update(
            path, lambda n: _upgrade_state.isolation_patch(n, present, p['key'], owner=p['owner']))
    result = dict(changed=_view(before) != _view(after), **_view(after))
    if not present:
        result['released'] = p['key'] not in result['labels'] and not any(
            t.get('key') == p['key'] for t in result['taints'])
    result.update(module.diff(_view(before), _view(after), 'node/%s' % p['node']))
    module.exit_json(**result)


def main() -> None:
    run(K8sModule('node_isolation', OPTIONS))


if __name__ == '__main__':
    main()
