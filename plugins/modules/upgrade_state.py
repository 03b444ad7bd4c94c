#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: upgrade_state
short_description: Read or record a GPU node's upgrade progress on its Node object
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Reads the progress of a node's upgrade from annotations on its Node, and records a phase when O(phase) is given,
    so that a rerun of the rollout resumes where it stopped and never drains a node twice.
  - C(gpufleet.io/upgrade-state) holds the last completed phase (M(gpufleet.upgrade.node_drain) writes C(cordoned),
    C(draining) and C(drained); the roles write C(snapshotted), C(installed), C(activated), C(validated), C(failed)
    and C(rolled-back)). C(gpufleet.io/upgrade-target) holds the target the phases belong to; phases recorded for
    another target, or without a target, do not count. Phases from C(drained) on count only while the node is
    cordoned (C(validated) also after the collection's own uncordon); a node uncordoned by hand since is drained
    again. V(done) removes both and writes C(gpufleet.io/upgraded-to).
  - C(gpufleet.io/initial-unschedulable) (written by M(gpufleet.upgrade.node_drain) when it cordons) tells whether
    the node was cordoned before the rollout; RV(state.was_cordoned) reports it.
  - With O(require_cordoned=true) the task fails, recording nothing, when the Node is not cordoned. The role
    P(gpufleet.upgrade.node_upgrade#role) reads it right before each step that takes the node's pods down (the trial
    boot, the reboot, the driver unload, the operand move), so that a node someone uncordoned since the drain is
    never rebooted or reloaded with pods the scheduler placed on it since.
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports the state the node would record and writes nothing.
      - O(require_cordoned) only warns in check mode (the drain before it predicted its cordon and wrote none).
  diff_mode:
    support: full
    details:
      - Shows the Node's C(gpufleet.io/*) annotations before and after.
  idempotent:
    support: full
    description: Recording the phase the node already records reports no change.
options:
  node:
    description: Name of the Node.
    type: str
    required: true
  target:
    description:
      - The target tuple of the upgrade (for example C(driver), C(kernel)); its values are strings without C(,) or C(=).
    type: dict
    required: true
  phase:
    description:
      - The phase to record. Without it the module only reads.
    type: str
    choices: [cordoned, drained, snapshotted, installed, activated, validated, failed, rolled-back, done]
  snapshot_sha256:
    description:
      - With O(phase=snapshotted), the SHA-256 of the rollback snapshot (RV(gpufleet.upgrade.node_snapshot#module:sha256)),
        recorded in C(gpufleet.io/snapshot-sha256) for this target. The snapshot file lives on the controller that
        took it; a rerun from another checkout, and a rollback, refuse a snapshot file that is missing or has
        another digest. V(done) retires it.
    type: str
  wait_ready:
    description:
      - Seconds to wait for the Node's Ready condition to be True before anything is recorded (after a reboot or a
        driver reload). V(0) does not wait. At the deadline the task fails, records nothing, and says so.
    type: float
    default: 0
  interval:
    description: Seconds between readiness checks while waiting.
    type: float
    default: 5
  require_cordoned:
    description:
      - Fail, recording nothing, when the Node is not cordoned (C(spec.unschedulable) not V(true)), read after
        O(wait_ready) and before O(phase) is recorded. The message names the node. Who uncordoned it is in the API
        server's audit log only (an uncordon drops C(spec.unschedulable), and C(metadata.managedFields) keep no
        owner of a dropped field); the message says so.
    type: bool
    default: false
notes:
  - Belongs to the C(gpufleet.upgrade.k8s) action group.
seealso:
  - module: gpufleet.upgrade.node_drain
"""

EXAMPLES = r"""
- name: Read where the node's upgrade stands
  gpufleet.upgrade.upgrade_state:
    node: gpu-07
    target: {driver: 580.130.00}
  register: progress

- name: Nothing takes the node's pods down unless it is still cordoned
  gpufleet.upgrade.upgrade_state:
    node: gpu-07
    target: {driver: 580.130.00}
    require_cordoned: true

- name: Record that the driver is installed
  gpufleet.upgrade.upgrade_state:
    node: gpu-07
    target: {driver: 580.130.00}
    phase: installed
  when: "'installed' not in progress.state.done_phases"
"""

RETURN = r"""
cordon_lost:
  description: With O(require_cordoned), the Node was not cordoned (the task failed, unless in check mode).
  returned: when require_cordoned found the node not cordoned
  type: bool
  sample: true
state:
  description: The node's progress after the task.
  returned: success
  type: dict
  contains:
    name:
      description: The node.
      type: str
    phase:
      description: The last completed phase for this target, or V(null).
      type: str
    recorded:
      description: The raw C(gpufleet.io/upgrade-state) value.
      type: str
    done_phases:
      description: The phases completed for this target, in order (C(cordoned) ... C(validated)), or the terminal one.
      type: list
      elements: str
    completed:
      description: The node finished this target (C(gpufleet.io/upgraded-to)).
      type: bool
    target:
      description: The target as recorded (C(key=value,...)).
      type: str
    stale_target:
      description:
        - A different target recorded on the node, V('') when progress is recorded without a target (stale as well),
          or V(null).
      type: str
    unschedulable:
      description: The node is cordoned now.
      type: bool
    was_cordoned:
      description: The node was cordoned before the rollout touched it.
      type: bool
    ready:
      description: The node's Ready condition is True.
      type: bool
    kernel:
      description: The kernel release the kubelet reports.
      type: str
    rke2:
      description: The kubelet version (the RKE2 version on an RKE2 node), for example V(v1.35.3+rke2r3).
      type: str
    uid:
      description: The Node object's UID (a node re-registered under the same name gets another).
      type: str
    machine_id:
      description: The machine-id its kubelet reports (C(status.nodeInfo.machineID)); null when not reported.
      type: str
    system_uuid:
      description: The system UUID its kubelet reports (C(status.nodeInfo.systemUUID)); null when not reported.
      type: str
    cordon_lost:
      description:
        - The node records C(drained) or a later phase for this target but is not cordoned (someone uncordoned it
          since); those phases do not count, and the rollout drains the node again before it installs anything.
      type: bool
    snapshot_sha256:
      description: The digest of this target's rollback snapshot recorded on the Node, or V(null).
      type: str
    vms_to_start:
      description:
        - The Node records VirtualMachines that M(gpufleet.upgrade.node_drain) halted (C(gpufleet.io/stopped-vms)), which
          its V(start_vms) state starts again.
      type: bool
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _upgrade_state
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule
from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import poll


def _gpufleet(node):
    ann = (node.get('metadata') or {}).get('annotations') or {}
    return {k: ann[k] for k in sorted(ann) if k.startswith('gpufleet.io/')}


# The module's own options (the Kubernetes auth options are added) and its work, as the Kubernetes modules run in
# Ansible's worker have them (plugin_utils/_in_worker.py); this one has no action plugin yet (docs/development.md).
OPTIONS = dict(
    node={'type': 'str', 'required': True},
    target={'type': 'dict', 'required': True},
    phase={'type': 'str', 'choices': list(_upgrade_state.SETTABLE)},
    snapshot_sha256={'type': 'str'},
    wait_ready={'type': 'float', 'default': 0},
    interval={'type': 'float', 'default': 5},
    require_cordoned={'type': 'bool', 'default': False},
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    p = module.params
    with module.errors(expected=(_upgrade_state.StateError,)):
        key = _upgrade_state.target_key(p['target'])
        if p['snapshot_sha256'] is not None:
            _upgrade_state.set_patch({}, p['phase'] or '(none)', key, p['snapshot_sha256'])
    if p['wait_ready'] < 0 or p['interval'] <= 0:
        module.fail_json(msg='wait_ready: %r must be 0 or more and interval: %r more than 0 seconds'
                         % (p['wait_ready'], p['interval']))
    path = path_for('v1', 'nodes', p['node'])
    lost = None
    with module.errors(expected=(_upgrade_state.StateError,), context='node %s' % p['node'],
                       not_found={path: 'node: %r does not exist' % p['node']}):
        if p['wait_ready']:
            ready = poll(lambda: _upgrade_state.is_ready(module.client.get(path)), p['wait_ready'], p['interval'])
            if not ready.done:
                module.fail_json(msg='node %s did not become Ready within %ss (%d checks); nothing recorded'
                                 % (p['node'], p['wait_ready'], ready.attempts), ready=False)
        if p['require_cordoned']:
            node = module.client.get(path)
            lost = _upgrade_state.cordon_lost_message(node)
            if lost:
                if not module.check_mode:
                    module.fail_json(msg=lost + '; nothing recorded', cordon_lost=True,
                                     state=_upgrade_state.view(node, key))
                module.warn('check mode: ' + lost)
        if p['phase']:
            before, after = module.update(
                path, lambda n: _upgrade_state.set_patch(n, p['phase'], key, p['snapshot_sha256']))
        else:
            before = after = module.client.get(path)
    result = {'changed': _gpufleet(before) != _gpufleet(after), 'state': _upgrade_state.view(after, key)}
    if lost:
        result['cordon_lost'] = True
    result.update(module.diff(_gpufleet(before), _gpufleet(after), 'node/%s' % p['node']))
    module.exit_json(**result)


def main() -> None:
    run(K8sModule('upgrade_state', OPTIONS))


if __name__ == '__main__':
    main()
