#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pause_approval_info
short_description: Wait, bounded, for the approval of a pause point of the rollout's plan
version_added: 0.1.0
description:
  - A pause point is a batch of the reviewed plan that does not start before someone approves it (the plan's
    C(pauses), from M(gpufleet.upgrade.upgrade_plan)'s O(gpufleet.upgrade.upgrade_plan#module:pause_before)). The
    approval is the ConfigMap O(namespace)/C(gpufleet-approve-<first 12 hex digits of the plan digest>-batch-<k>),
    bound to the plan by its digest, so an approval given for another plan approves nothing here.
  - Reads it with GET requests, every O(wait_interval) seconds, until it exists or O(wait_timeout) seconds passed
    (V(0) reads once). Makes no other request and writes nothing.
  - Its C(data.by) (optional) names who approved; the API server's audit log has the authenticated identity.
  - An approval that cannot be read (for example 403 because the role lacks the permission) is an error, never
    read as "not approved yet" or as approved.
author:
  - gpufleet.upgrade contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  plan_digest:
    description: The reviewed plan's C(digest) (V(sha256:) and 64 hex digits).
    type: str
    required: true
  batch:
    description: The batch number, as the plan's summary numbers its batches (1 is the first).
    type: int
    required: true
  namespace:
    description: The approvals' namespace (kept apart from the stop switch's, so that who may stop a rollout
      cannot approve one).
    type: str
    default: gpufleet-approvals
  stop_namespace:
    description:
      - The stop switch's namespace (M(gpufleet.upgrade.stop_switch_info)'s O(gpufleet.upgrade.stop_switch_info#module:namespace)).
        O(namespace) equal to it is refused before anything is read - whoever may create the stop switch's ConfigMap
        there could approve a batch. An empty value checks nothing.
    type: str
    default: gpufleet-system
  stop_name:
    description:
      - The stop switch's ConfigMap name (M(gpufleet.upgrade.stop_switch_info)'s
        O(gpufleet.upgrade.stop_switch_info#module:name)). Given, each read of the approval reads the stop switch too
        (in O(stop_namespace)); a switch that stops O(rollout_id) ends the wait, not approved, with the switch's
        message (RV(stopped)). Empty (the default), the switch is not read.
    type: str
    default: ''
  rollout_id:
    description: The id of the rollout waiting (C(gpufleet_rollout_id)), for a switch scoped to one rollout.
    type: str
    default: ''
  wait_timeout:
    description: How long to wait for the approval - seconds, or a duration such as V(30m) or V(4h); V(0) reads
      once. Bounded.
    type: raw
    default: 0
  wait_interval:
    description: Seconds between reads.
    type: float
    default: 10
  fail_when_not_approved:
    description: Fail, naming the ConfigMap to create, when the batch is not approved by the deadline (what the
      rollout uses); otherwise return RV(approved) and let the caller decide.
    type: bool
    default: false
notes:
  - Belongs to the C(gpufleet.upgrade.k8s) action group.
  - "Approving: C(kubectl -n gpufleet-approvals create configmap gpufleet-approve-<digest12>-batch-<k>
    --from-literal=by=\"$USER\"); who may approve is the Role C(gpufleet-upgrade-approve) of docs/rbac,
    bound in that namespace; the rollout reads it with C(gpufleet-upgrade-approvals-reader)."
seealso:
  - module: gpufleet.upgrade.upgrade_plan
  - module: gpufleet.upgrade.stop_switch_info
"""

EXAMPLES = r"""
---
- name: Wait up to an hour for the approval of batch 3
  gpufleet.upgrade.pause_approval_info:
    plan_digest: "{{ plan.digest }}"
    batch: 3
    wait_timeout: 3600
    wait_interval: 30
    fail_when_not_approved: true
"""

RETURN = r"""
approved:
  description: Whether the batch is approved.
  returned: success
  type: bool
  sample: true
approval:
  description: What was read.
  returned: success
  type: dict
  contains:
    namespace:
      description: The approval's namespace.
      type: str
    name:
      description: The approval ConfigMap's name.
      type: str
    batch:
      description: The batch number.
      type: int
    approved_by:
      description: Its C(data.by) (whitespace folded, at most 200 characters); empty when not given or not approved.
      type: str
    approved_at:
      description: Its creation time (RFC 3339); empty when not approved.
      type: str
  sample: {namespace: gpufleet-approvals, name: gpufleet-approve-0123456789ab-batch-3, batch: 3, approved_by: alice,
           approved_at: '2026-12-03T07:00:00Z'}
started:
  description: When the wait began (RFC 3339, UTC).
  returned: success
  type: str
  sample: '2026-12-03T06:59:47Z'
waited:
  description: Seconds spent waiting.
  returned: success
  type: float
  sample: 12.5
stopped:
  description: Whether the stop switch (read with O(stop_name)) ended the wait.
  returned: success
  type: bool
  sample: false
msg:
  description: The verdict in words (with O(fail_when_not_approved), the failure message).
  returned: always
  type: str
"""

import datetime

from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import NotFoundError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule
from ansible_collections.gpufleet.upgrade.plugins.module_utils._pause import DEFAULT_NAMESPACE, PauseError, wait_for_approval


def main() -> None:
    module = K8sModule('pause_approval_info', dict(
        plan_digest=dict(type='str', required=True),
        batch=dict(type='int', required=True),
        namespace=dict(type='str', default=DEFAULT_NAMESPACE),
        stop_namespace=dict(type='str', default='gpufleet-system'),
        stop_name=dict(type='str', default=''),
        rollout_id=dict(type='str', default=''),
        wait_timeout=dict(type='raw', default=0),
        wait_interval=dict(type='float', default=10),
        fail_when_not_approved=dict(type='bool', default=False),
    ))
    p = module.params
    started = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')

    def get(where: str):
        try:
            return module.client.get(where)
        except NotFoundError:
            return None

    with module.errors(expected=(PauseError,), prefixes={PauseError: 'pause_approval_info: '},
                       context='reading the approval'):
        stops: list = []
        verdict, waited = wait_for_approval(get, p['namespace'], p['plan_digest'], p['batch'], p['wait_timeout'],
                                            p['wait_interval'], stop_namespace=p['stop_namespace'],
                                            stop_name=p['stop_name'], rollout_id=p['rollout_id'], stopped=stops)
    approval = {k: v for k, v in verdict.as_dict().items() if k not in ('approved', 'msg')}
    if not verdict.approved and p['fail_when_not_approved']:
        module.fail_json(msg=verdict.msg, approved=False, approval=approval, started=started, waited=round(waited, 1),
                         stopped=bool(stops))
    module.exit_json(changed=False, approved=verdict.approved, approval=approval, started=started,
                     waited=round(waited, 1), stopped=bool(stops), msg=verdict.msg)


if __name__ == '__main__':
    main()
