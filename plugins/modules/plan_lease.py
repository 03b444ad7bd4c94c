#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: plan_lease
short_description: Hold a plan's Lease, so that one run at a time works the plan
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Keeps a C(coordination.k8s.io/v1) Lease per plan, named C(gpufleet-plan-<first 12 hex digits of the plan's
    digest>) in O(namespace), held by the run O(holder).
  - V(acquired) creates the Lease, renews it when O(holder) already holds it, or takes it over when no run holds
    it (released) or its holder's lease expired (C(renewTime) + C(leaseDurationSeconds) + O(clock_skew) passed on
    this machine's clock; C(acquireTime) is set and C(leaseTransitions) counts one more). While another holder's
    Lease is fresh the task B(fails), naming the holder, its C(renewTime) and when it expires.
  - V(renewed) renews the Lease O(holder) holds (even past its expiry, as long as no one took it over). A Lease that
    is gone, released or held by another fails the task (this run lost the plan and must stop).
  - V(released) clears C(spec.holderIdentity) of the Lease O(holder) holds, so the next run may take it at once
    (the Lease is kept, with its C(leaseTransitions) and last C(acquireTime)). A Lease held by another run, or none,
    is left as it is (RV(outcome=not_held), no change, no failure).
  - Every write carries the C(resourceVersion) of the read it was decided from; a 409 (another run wrote first, or
    created the Lease first) re-reads and decides again, at most 5 times.
  - A Lease of that name that the collection did not make (no label C(app.kubernetes.io/managed-by=gpufleet.upgrade)),
    or made for another plan (annotation C(gpufleet.io/plan-digest)), fails the task and is not touched.
  - The canary and rollout playbooks take it before their first write, renew it around each batch and release it
    at their end; it does not mark nodes (see docs/reliability.md).
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads the Lease, decides as the task would (a refusal fails in check mode too) and writes nothing.
  diff_mode:
    support: full
    details:
      - Shows the Lease's holder, times, duration and transitions before and after.
  idempotent:
    support: partial
    description: A second run with the same input gives the same Lease, but for its times.
    details:
      - V(acquired) and V(renewed) move C(renewTime) on every run (that is their point); V(released) is idempotent.
options:
  state:
    description: Take or keep the Lease (V(acquired)), keep it (V(renewed)) or let it go (V(released)).
    type: str
    choices: [acquired, renewed, released]
    default: acquired
  plan_digest:
    description:
      - The plan's digest, C(sha256:) and 64 lowercase hex digits, as C(gpufleet.upgrade.upgrade_plan) returns it
        (RV(gpufleet.upgrade.upgrade_plan#module:digest)). Two runs of the same plan contend for one Lease.
    type: str
    required: true
  holder:
    description:
      - The run's id, 1 to 128 letters, digits and C(._:@/+=-). A second run with the same id counts as the same
        run (it renews the Lease, or takes it back); give a run the id of one whose controller is gone to resume
        it at once.
      - Default, set on the controller by the action plugin - in AWX, C(awx:template-<awx_job_template_id>) (AWX
        runs one job of a template at a time, so a relaunch is the same run); elsewhere
        C(cli:<user>@<controller host>:<pid>.<start>), the C(ansible-playbook) process and its start time.
      - A command-line run's Lease is taken over at once, fresh or not, by a run on the same controller once
        that process has ended (a failed, stopped or killed run rerun there); from another controller, only once
        it expired.
    type: str
  namespace:
    description: The Lease's namespace.
    type: str
    default: gpufleet-system
  duration:
    description:
      - C(leaseDurationSeconds) written by V(acquired) and V(renewed), 1 to 604800. Longer than the longest time
        between two renewals (a batch), or another run may take the plan over while this one still works it.
    type: int
    default: 3600
  clock_skew:
    description:
      - Seconds another holder's clock may run behind this one's, 0 to 300; its Lease counts as expired only that
        much after C(renewTime) + C(leaseDurationSeconds).
    type: int
    default: 5
notes:
  - Belongs to the C(gpufleet.upgrade.k8s) action group.
  - Needs the Role C(gpufleet-upgrade-plan-lease) (docs/rbac/gpufleet-upgrade-plan-lease.yml) in O(namespace).
seealso:
  - module: gpufleet.upgrade.upgrade_plan
"""

EXAMPLES = r"""
- name: Hold the plan for this run (fails while another run holds it)
  gpufleet.upgrade.plan_lease:
    plan_digest: "{{ plan.digest }}"
    duration: 7200
  register: lease

- name: Renew it before each batch (fails if this run lost it)
  gpufleet.upgrade.plan_lease:
    state: renewed
    plan_digest: "{{ plan.digest }}"
    holder: "{{ lease.holder }}"
    duration: 7200

- name: Release it at the end
  gpufleet.upgrade.plan_lease:
    state: released
    plan_digest: "{{ plan.digest }}"
    holder: "{{ lease.holder }}"

- name: Resume the run of a controller that is gone, at once (its id from the refusal's message)
  gpufleet.upgrade.plan_lease:
    plan_digest: "{{ plan.digest }}"
    holder: "cli:ops@jump-1:48213.91827364"
"""

RETURN = r"""
outcome:
  description:
    - V(created), V(taken_over) (released or expired), V(renewed), V(released), V(not_held) (a release of a Lease
      this run does not hold, nothing changed), V(held) (refused, another run's Lease is fresh) or V(lost) (a
      renewal of a Lease this run no longer holds); the last two fail the task.
  returned: always, once the inputs are valid and the Lease was read
  type: str
  sample: taken_over
lease:
  description: The Lease after the task (before it, when the task failed), or V(null) when there is none.
  returned: always, once the inputs are valid and the Lease was read
  type: dict
  contains:
    name:
      description: The Lease's name.
      type: str
      sample: gpufleet-plan-3f9a1c0d2e4b
    namespace:
      description: Its namespace.
      type: str
    holder:
      description: C(spec.holderIdentity), V(null) when no run holds it.
      type: str
    acquire_time:
      description: C(spec.acquireTime) (RFC 3339 micro-time).
      type: str
    renew_time:
      description: C(spec.renewTime) (RFC 3339 micro-time).
      type: str
    duration:
      description: C(spec.leaseDurationSeconds).
      type: int
    transitions:
      description: C(spec.leaseTransitions).
      type: int
    expires:
      description: C(renewTime) + C(leaseDurationSeconds) while held, V(null) when no run holds it.
      type: str
    plan_digest:
      description: The plan's digest (the annotation C(gpufleet.io/plan-digest)).
      type: str
holder:
  description: The run id this task held, renewed or released the Lease as (the default the action plugin set).
  returned: always, once the inputs are valid
  type: str
  sample: cli:ops@jump-1:48213.91827364
attempts:
  description: How often the Lease was read and decided on (more than 1 when a 409 made the task decide again).
  returned: success
  type: int
"""

import datetime
import os
import socket

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _lease
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule

# The module's own options (the Kubernetes auth options are added); the action plugin runs run() with them
# in Ansible's worker when the task runs on the controller (plugin_utils/_in_worker).
OPTIONS = dict(
    state={'type': 'str', 'choices': ['acquired', 'renewed', 'released'], 'default': 'acquired'},
    plan_digest={'type': 'str', 'required': True},
    holder={'type': 'str'},
    namespace={'type': 'str', 'default': _lease.DEFAULT_NAMESPACE},
    duration={'type': 'int', 'default': _lease.DEFAULT_DURATION},
    clock_skew={'type': 'int', 'default': _lease.DEFAULT_SKEW},
)

CHANGES = ('created', 'taken_over', 'renewed', 'released')


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


# The holder's process on this machine (a test replaces it).
process_start = _lease.process_start


def run(module: K8sModule) -> None:
    """The module's work on `module` (its params, client, exit_json and fail_json)."""
    p = module.params
    with module.errors(expected=(_lease.LeaseError,)):
        digest = _lease.check_digest(p['plan_digest'])
        if p['holder'] is None:
            raise _lease.LeaseError('holder: missing (the action plugin sets it when the task runs on the controller; '
                                    'give it where the task runs elsewhere)')
        holder = _lease.check_holder(p['holder'])
        namespace = _lease.check_namespace(p['namespace'])
        duration = _lease.check_duration(p['duration'])
        skew = _lease.check_skew(p['clock_skew'])
    name = _lease.lease_name(digest)
    path = path_for(_lease.API_VERSION, 'leases', name, namespace)
    collection = path_for(_lease.API_VERSION, 'leases', namespace=namespace)

    def decide(lease):
        if p['state'] == 'released':
            return _lease.release(lease, digest, holder)
        if p['state'] == 'renewed':
            return _lease.renewal(lease, digest, holder, _now(), duration, skew, namespace)
        # only where /proc tells which processes run (Linux): elsewhere no holder is known to have ended
        ended = os.path.isdir('/proc/self') and _lease.holder_ended(
            _lease.holder_of(lease), socket.gethostname(), process_start)
        return _lease.judge(lease, digest, holder, _now(), duration, skew, namespace, ended=ended)

    not_found = {collection: 'namespace: %r does not exist (docs/rbac/gpufleet-system-namespace.yml creates '
                             'gpufleet-system)' % namespace}
    with module.errors(expected=(_lease.LeaseError,), not_found=not_found):
        done = _lease.settle(module.client, path, collection, decide, check_mode=module.check_mode, sleep=module.client.sleep)
    verdict = done.verdict
    result = dict(changed=verdict.outcome in CHANGES, outcome=verdict.outcome, msg=verdict.msg, holder=holder,
                  lease=_lease.summary(done.after), attempts=done.attempts)
    if verdict.action == 'refuse':
        module.fail_json(**result)
    result.update(module.diff(_lease.summary(done.before), _lease.summary(done.after), 'lease/%s/%s' % (namespace, name)))
    module.exit_json(**result)


def main() -> None:
    run(K8sModule('plan_lease', OPTIONS))


if __name__ == '__main__':
    main()
