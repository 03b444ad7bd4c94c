#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stop_switch_info
short_description: Read the rollout's stop switch (a ConfigMap an operator creates to stop the rollout)
version_added: 0.1.0
description:
  - Reads, with one GET request (with O(wait), one every O(interval) seconds), the stop switch - the ConfigMap
    O(namespace)/O(name). While it exists the rollout
    and canary playbooks start no further batch and no further node; a node already in progress finishes its
    upgrade or fails and stays cordoned. Deleting the ConfigMap lets a rerun resume where the nodes' records say.
  - The ConfigMap's C(data) may hold C(reason) (why), C(by) (who; the API server's audit log has the authenticated
    identity) and C(rollout) (the id of the one rollout it stops; absent or empty, it stops every rollout). Any
    other content still stops the rollout - the switch fails safe.
  - A C(rollout) that is not O(rollout_id) but close to it - the same letters and digits in another case or
    punctuation, or at most two edits (insertions, deletions, substitutions, swaps of adjacent characters) apart -
    is taken for a typo and stops this rollout too (a switch mistyped in a hurry fails safe, not open). Rollouts that
    run at the same time therefore need ids more than two edits apart (C(pool-a-w49) and C(pool-b-w49) are one edit
    apart, so a switch for either stops both). A switch for a clearly different rollout lets this one go on, with a
    warning naming it.
  - A switch that cannot be read (for example 403 because the role lacks the permission) is an error, never
    read as "not set".
author:
  - gpufleet.upgrade contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  namespace:
    description: The switch's namespace.
    type: str
    default: gpufleet-system
  name:
    description: The switch's ConfigMap name.
    type: str
    default: gpufleet-stop
  rollout_id:
    description: The id of the rollout asking (C(gpufleet_rollout_id)); a switch whose C(data.rollout) names another
      rollout does not stop this one.
    type: str
    default: ''
  fail_when_stopped:
    description: Fail, with the switch's reason, who set it and when in the message, when the switch stops the
      rollout (what the playbooks use); otherwise return RV(stopped) and let the caller decide.
    type: bool
    default: false
  wait:
    description:
      - Seconds to watch the switch - it is read every O(interval) seconds until it stops this rollout or O(wait)
        seconds passed; V(0) reads it once. A wait the switch did not end lasts O(wait) seconds, never longer.
      - The playbooks wait out each observation window with it, so a switch set during a window ends the rollout
        within O(interval) seconds instead of at the window's end.
    type: float
    default: 0
  interval:
    description: Seconds between reads while O(wait) runs; at most V(30).
    type: float
    default: 10
notes:
  - Belongs to the C(gpufleet.upgrade.k8s) action group.
  - "Setting the switch: C(kubectl -n gpufleet-system create configmap gpufleet-stop --from-literal=reason='...'
    --from-literal=by=\"$USER\"); who may set it is the Role C(gpufleet-upgrade-stop) of docs/rbac."
seealso:
  - module: gpufleet.upgrade.upgrade_state
"""

EXAMPLES = r"""
---
- name: Stop here when an operator set the stop switch
  gpufleet.upgrade.stop_switch_info:
    rollout_id: gpu-rollout
    fail_when_stopped: true

- name: Read the switch and decide later
  gpufleet.upgrade.stop_switch_info:
  register: stop_switch

- name: Wait out a 15-minute observation window, ending it early when the switch is set
  gpufleet.upgrade.stop_switch_info:
    rollout_id: gpu-rollout
    wait: 900
    interval: 10
  register: window_stop
"""

RETURN = r"""
stopped:
  description: Whether the switch stops this rollout.
  returned: success
  type: bool
  sample: false
switch:
  description: What was read.
  returned: success
  type: dict
  contains:
    exists:
      description: Whether the ConfigMap exists.
      type: bool
    namespace:
      description: Its namespace.
      type: str
    name:
      description: Its name.
      type: str
    reason:
      description: Its C(data.reason) (whitespace folded, at most 200 characters); empty when not given.
      type: str
    set_by:
      description: Its C(data.by); empty when not given.
      type: str
    set_at:
      description: Its creation time (RFC 3339); empty when it does not exist.
      type: str
    rollout:
      description: Its C(data.rollout), the one rollout it stops; empty for every rollout.
      type: str
  sample: {exists: true, namespace: gpufleet-system, name: gpufleet-stop, reason: Xid storm in rack 12, set_by: alice,
           set_at: '2026-12-02T07:00:00Z', rollout: ''}
waited:
  description: Seconds spent watching the switch (O(wait)); 0 for one read.
  returned: success
  type: float
  sample: 12.0
msg:
  description: The verdict in words (with O(fail_when_stopped), the failure message).
  returned: always
  type: str
"""

from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import NotFoundError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule
from ansible_collections.gpufleet.upgrade.plugins.module_utils._stop_switch import (
    DEFAULT_NAME, DEFAULT_NAMESPACE, StopSwitchError, watch)


# The module's own options (the Kubernetes auth options are added); the action plugin runs run() with them
# in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    namespace=dict(type='str', default=DEFAULT_NAMESPACE),
    name=dict(type='str', default=DEFAULT_NAME),
    rollout_id=dict(type='str', default=''),
    fail_when_stopped=dict(type='bool', default=False),
    wait=dict(type='float', default=0),
    interval=dict(type='float', default=10),
)


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    p = module.params
    with module.errors(expected=(StopSwitchError,), prefixes={StopSwitchError: 'stop_switch_info: '},
                       context='reading the stop switch'):
        def get(where: str) -> dict | None:
            try:
                return module.client.get(where)
            except NotFoundError:
                return None
        verdict, waited = watch(get, p['namespace'], p['name'], p['rollout_id'], p['wait'], p['interval'])
    switch = {k: v for k, v in verdict.as_dict().items() if k not in ('stopped', 'msg')}
    if verdict.exists and not verdict.stopped:
        module.warn(verdict.msg + '; this rollout goes on')
    if verdict.stopped and p['fail_when_stopped']:
        module.fail_json(msg=verdict.msg, stopped=True, switch=switch, waited=round(waited, 1))
    module.exit_json(changed=False, stopped=verdict.stopped, switch=switch, waited=round(waited, 1), msg=verdict.msg)


def main() -> None:
    run(K8sModule('stop_switch_info', OPTIONS))


if __name__ == '__main__':
    main()
