#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_operator_update
short_description: Change the NVIDIA GPU Operator once for the cluster, then move each node's operands in its window
version_added: 0.1.0
description:
  - Couples the GPU Operator's operand upgrades to each node's maintenance window (docs/gpu-operator.md).
  - O(state=cluster) - one reviewed cluster step, before the canary. Changes the operator's RKE2 C(HelmChart)
    (C(spec.version), C(spec.valuesContent)) or, without one, its C(ClusterPolicy) spec to the target values
    (O(values) merged in, O(dcgm_exporter_version) as C(dcgmExporter.version), O(driver_version) as
    C(driver.version) for the operator-managed driver), and always sets
    C(daemonsets.updateStrategy=OnDelete) and C(driver.upgradePolicy.autoUpgrade=false), so that the change
    itself restarts no operand pod on any node. What those two settings were is recorded once, in the
    annotation C(gpufleet.io/gpu-operator-restore) of the object it changes (a rerun keeps the first
    record). Then waits, at most O(timeout) seconds, until the operator has rendered the new templates -
    the HelmChart rendered without failure, the operator's Deployment at the chart version, every operand
    DaemonSet of a changed component at the image its values name, with C(OnDelete) and its generation
    observed. It does not wait for the ClusterPolicy's C(ready) - under C(OnDelete) the operator reports
    C(notReady) until every node runs the new revision.
  - Refuses, writing nothing, a ClusterPolicy in an error state or not C(ready) (before the first change),
    values that do not parse, O(values) that set another update strategy or driver auto-upgrade, and a chart
    version without a HelmChart. A HelmChart the helm-controller fails to render (for example a chart version the
    repository does not have) is put back as it was and the task fails with the controller's message; no per-node
    step has started.
  - O(state=node) - inside one node's window (after its drain and snapshot). Deletes the node's operand pods
    that do not run their DaemonSet's current revision (O(operands) limits which), so that their DaemonSets
    bring them back at it, and waits, at most O(timeout) seconds, until each - and the operator validator -
    has one pod on the node, Running, Ready and at the current revision. Every other node keeps its operands.
    On a node whose operands O(state=back) took back, first sets its deploy labels back, removes the record and
    deletes the pods it created (so the DaemonSets' current pods return).
  - O(state=back) - a node's rollback (past the canary too). Under C(OnDelete) a DaemonSet recreates a deleted pod
    at its current revision only; this takes the node's operands back to O(revisions) (operand DaemonSet to
    revision, what the snapshot taken before the cluster step recorded for the node). For each operand not
    already at its revision it sets the node's C(nvidia.com/gpu.deploy.<operand>) label from C(true) to
    C(rolled-back-by-gpufleet) (the DaemonSet takes its pod off the node), waits until that pod is gone, and
    creates one pod from the DaemonSet's own C(ControllerRevision) of that revision, bound to the node and
    controlled by the Node (as a kubelet's mirror pod; no DaemonSet adopts it). What the labels were and the
    revisions are recorded in the Node's annotation C(gpufleet.io/operands-back). Waits, at most O(timeout)
    seconds, until each is Running and Ready. Every other node keeps its operands. Refuses, changing nothing, an
    operand that is not an operand DaemonSet, a revision its DaemonSet no longer keeps (C(revisionHistoryLimit)),
    and a deploy label someone set to anything but C(true).
  - O(state=restore) - at the end of a successful rollout. Puts back the recorded update strategy and driver
    auto-upgrade and removes the record. Refuses while any operand pod is not at its DaemonSet's current
    revision (restoring C(RollingUpdate) would restart it outside its node's window), unless
    O(allow_stale=true).
  - O(state=pause) - the host driver's reload path, before M(gpufleet.upgrade.driver_unload). Sets the node's
    C(nvidia.com/gpu.deploy.<operand>) labels of the operands that hold C(/dev/nvidia*) (O(operands); default the
    device plugin, DCGM, DCGM exporter, GPU feature discovery, MIG manager, validator and node status exporter)
    from C(true) to C(paused-for-driver-upgrade), the value NVIDIA's driver manager uses (the operator keeps a
    label's existing value; the DaemonSets select C(true)), recording what they were and which operands had a
    pod on the node in the Node's annotation C(gpufleet.io/operands-paused). Waits, at most O(timeout) seconds,
    until none of their pods is left on the node. A label that is not C(true) is left alone.
  - O(state=resume) - after the reload. Sets the recorded labels back (those still paused), removes the
    record, and waits until each operand that had a pod on the node has one again, Running, Ready and current.
  - To roll the cluster step back after a failed canary, run O(state=cluster) with the snapshot's chart version
    and values (RV(gpufleet.upgrade.gpu_operator_info#module:chart_values)) and O(replace_values=true), then
    O(state=node) on each canary.
author:
  - gpufleet.upgrade contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.gpu_operator
  - gpufleet.upgrade.attributes
requirements:
  - PyYAML
attributes:
  check_mode:
    support: full
    details:
      - Reads and reports what would be written (C(changed), RV(restarted), the diff) without writing or waiting.
  diff_mode:
    support: full
    details:
      - With O(state=cluster) and O(state=restore), the values (and chart version) before and after; with
        per-pool drivers changed, their versions and tolerations (C(nvidia_drivers)).
  idempotent:
    support: full
    description: A second run with the same input changes nothing (a node whose operands are current restarts none).
options:
  state:
    description: Which step (see the description).
    type: str
    choices: [cluster, node, restore, pause, resume, back]
    required: true
  version:
    description: With O(state=cluster), the target chart version (the operator's version). Needs the HelmChart.
    type: str
  dcgm_exporter_version:
    description: With O(state=cluster), the target DCGM exporter version (C(dcgmExporter.version)).
    type: str
  driver_version:
    description:
      - With O(state=cluster), the target version of the operator-managed driver (C(driver.version); the
        install method C(operator)). Refused where the ClusterPolicy does not enable the driver.
      - Where the ClusterPolicy renders the driver per node pool from C(NVIDIADriver) objects
        (C(driver.useNvidiaDriverCRD)), the version goes to the C(spec.version) of the NVIDIADrivers in
        O(nvidia_drivers) instead (their DaemonSets are always C(OnDelete), so no driver pod restarts), together with
        O(tolerations); C(driver.version) is left as it is.
    type: str
  nvidia_drivers:
    description:
      - With O(state=cluster) and O(driver_version), the C(NVIDIADriver) objects (node pools) that take the target
        driver. Default - the only one there is; with several, naming them is required (a pool on another driver
        branch is never changed by accident). Refused where the ClusterPolicy does not use NVIDIADriver objects.
    type: list
    elements: str
  restore_nvidia_drivers:
    description:
      - With O(state=cluster), the way back of the per-pool drivers - the C(NVIDIADriver) objects as
        RV(gpufleet.upgrade.gpu_operator_info#module:drivers) recorded them before the cluster step (C(name),
        C(version), C(tolerations)). Each one's version and tolerations are set back, so its DaemonSet's template is
        the one the nodes not yet moved still run. Refused where the ClusterPolicy does not use NVIDIADriver objects,
        with O(driver_version), and for a name that is no NVIDIADriver.
    type: list
    elements: dict
  revisions:
    description:
      - With O(state=back), operand DaemonSet name to the revision (C(controller-revision-hash)) its pod on the
        node is to run, usually what RV(gpufleet.upgrade.gpu_operator_info#module:gpu_operator.nodes) recorded for
        the node before the cluster step (filter P(gpufleet.upgrade.operator_revisions#filter)).
    type: dict
  values:
    description:
      - With O(state=cluster), chart values merged into the current ones (or replacing them, O(replace_values)).
    type: dict
  replace_values:
    description: With O(state=cluster), O(values) replace the current values whole (a rollback to a snapshot).
    type: bool
    default: false
  tolerations:
    description:
      - With O(state=cluster), tolerations every operand DaemonSet must have (appended to C(daemonsets.tolerations)
        unless there; where the values set none, to the chart's default C(nvidia.com/gpu:NoSchedule)). The canary
        playbook adds the canary taint's, so the canaries' operands come back while they are isolated. Never removed
        by O(state=restore) (removing one would change every operand's template again).
    type: list
    elements: dict
  node:
    description: With O(state=node), O(state=pause), O(state=resume) and O(state=back), the node.
    type: str
  operands:
    description:
      - With O(state=node), only these operand DaemonSets (by name, for example C(nvidia-dcgm-exporter)). Default
        - every operand pod on the node that is not current. C(nvidia-driver-daemonset) stands for the node's driver
        DaemonSet whichever renders it (the ClusterPolicy, or an NVIDIADriver per node pool).
      - With O(state=pause), the operands to pause. Default - those that hold C(/dev/nvidia*).
    type: list
    elements: str
  allow_stale:
    description: With O(state=restore), restore even while operand pods are not current (they will restart).
    type: bool
    default: false
  wait:
    description: Wait for the step to take effect (see the description). Not in check mode.
    type: bool
    default: true
  timeout:
    description: Seconds to wait. Bounded; at the deadline the task fails naming what was not yet done.
    type: int
    default: 600
  interval:
    description: Seconds between reads while waiting.
    type: float
    default: 2
seealso:
  - module: gpufleet.upgrade.gpu_operator_info
"""

EXAMPLES = r"""
---
- name: The cluster step, once, before the canary
  gpufleet.upgrade.gpu_operator_update:
    state: cluster
    version: v26.3.4
    dcgm_exporter_version: 4.4.1-4.5.0-ubuntu22.04

- name: Inside a node's window, after drain and snapshot
  gpufleet.upgrade.gpu_operator_update:
    state: node
    node: "{{ inventory_hostname }}"
    timeout: 600

- name: A failed node's operands back at the revisions it ran before the cluster step
  gpufleet.upgrade.gpu_operator_update:
    state: back
    node: gpu-17
    revisions: "{{ (lookup('ansible.builtin.file', operator_snapshot_file) | from_json).gpu_operator
                   | gpufleet.upgrade.operator_revisions('gpu-17') }}"

- name: After the last node
  gpufleet.upgrade.gpu_operator_update:
    state: restore
"""

RETURN = r"""
kind:
  description: What was (or would be) changed, V(HelmChart) or V(ClusterPolicy).
  returned: when I(state) is C(cluster) or C(restore)
  type: str
restore:
  description: The settings recorded to put back (C(daemonsets.updateStrategy), C(driver.upgradePolicy.autoUpgrade)).
  returned: when I(state) is C(cluster) or C(restore)
  type: dict
paused:
  description: With O(state=pause) and O(state=resume), the deploy labels paused (or set back) and the operands waited for.
  returned: when I(state) is C(pause) or C(resume)
  type: dict
  sample: {labels: [nvidia.com/gpu.deploy.dcgm-exporter, nvidia.com/gpu.deploy.device-plugin],
           operands: [nvidia-dcgm-exporter, nvidia-device-plugin-daemonset]}
back:
  description: With O(state=back), the operands taken back (operand to revision) and the pods created; with
    O(state=node), what an earlier O(state=back) had done and was undone (C(operands), C(deleted)).
  returned: when I(state) is C(back), or C(node) on a node taken back
  type: dict
restarted:
  description: With O(state=node), the operand pods deleted (operand, pod, revision, image).
  returned: when I(state=node)
  type: list
  elements: dict
operands:
  description: With O(state=node), the node's operand pods as last read.
  returned: when I(state=node)
  type: list
  elements: dict
waited:
  description: Seconds waited and whether the step took effect (C(seconds), C(done), C(waiting) - what was not yet).
  returned: when waiting
  type: dict
gpu_operator:
  description: The operator's deployment as last read (as RV(gpufleet.upgrade.gpu_operator_info#module:gpu_operator)).
  returned: success
  type: dict
"""

import time

from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_operator import (
    OPERATOR_ARG_SPEC, GpuOperatorError, node_back_settled, node_paused, node_restarts, node_settled, operand_names,
    plan_back,
    plan_cluster, plan_forward, plan_pause, plan_restore, plan_resume, read_objects, rendered, state_of, untolerated)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule
from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import poll


def _wait(fn, timeout, interval):
    """Poll fn() -> (done, waiting) within the deadline; fail naming what was not yet done."""
    t0 = time.monotonic()
    polled = poll(fn, timeout, interval, done=lambda v: v[0])
    waited = {'seconds': round(time.monotonic() - t0, 1), 'done': polled.done, 'waiting': polled.value[1]}
    return polled, waited


def main() -> None:
    module = K8sModule('gpu_operator_update', dict(
        state=dict(type='str', choices=['cluster', 'node', 'restore', 'pause', 'resume', 'back'], required=True),
        **OPERATOR_ARG_SPEC,
        version=dict(type='str'),
        dcgm_exporter_version=dict(type='str'),
        driver_version=dict(type='str'),
        nvidia_drivers=dict(type='list', elements='str'),
        restore_nvidia_drivers=dict(type='list', elements='dict'),
        revisions=dict(type='dict'),
        values=dict(type='dict'),
        replace_values=dict(type='bool', default=False),
        tolerations=dict(type='list', elements='dict'),
        node=dict(type='str'),
        operands=dict(type='list', elements='str'),
        allow_stale=dict(type='bool', default=False),
        wait=dict(type='bool', default=True),
        timeout=dict(type='int', default=600),
        interval=dict(type='float', default=2.0),
    ), required_if=[('state', 'node', ('node',)), ('state', 'pause', ('node',)), ('state', 'resume', ('node',)),
                    ('state', 'back', ('node', 'revisions'))])
    p = module.params
    if p['timeout'] <= 0 or p['interval'] <= 0:
        module.fail_json(msg='timeout (%r) and interval (%r) must be positive' % (p['timeout'], p['interval']))
    client = None
    prefixes = {GpuOperatorError: 'gpu_operator_update: ', K8sError: 'gpu_operator_update: '}

    def read():
        return read_objects(client, p['namespace'], p['cluster_policy'],
                            (p['helm_chart_namespace'], p['helm_chart_name']), p['manage'])

    with module.errors(expected=(GpuOperatorError,), prefixes=prefixes):
        client = module.client
        objs = read()
        waiting = p['wait'] and not module.check_mode
        if p['state'] in ('cluster', 'restore'):
            if p['state'] == 'cluster':
                plan = plan_cluster(objs, {'version': p['version'], 'values': p['values'],
                                           'dcgm_exporter_version': p['dcgm_exporter_version'],
                                           'driver_version': p['driver_version'],
                                           'nvidia_drivers': p['nvidia_drivers'],
                                           'restore_drivers': p['restore_nvidia_drivers'],
                                           'replace_values': p['replace_values'], 'tolerations': p['tolerations']})
            else:
                plan = plan_restore(objs)
                stale = sorted({n for n, pods in state_of(objs)['nodes'].items() for x in pods if not x['current']})
                if plan['changed'] and stale and not p['allow_stale']:
                    raise GpuOperatorError(
                        'operand pods on %s do not run their DaemonSet\'s current revision: restoring the update '
                        'strategy would restart them outside their maintenance window; finish those nodes '
                        '(state=node) or set allow_stale=true; nothing was changed' % ', '.join(stale))
            out = dict(changed=plan['changed'], kind=plan['kind'], restore=plan['restore'],
                       **module.diff(plan['before'], plan['after'], '%s' % plan['kind']))
            if plan['changed'] and not module.check_mode:
                client.patch(plan['path'], plan['patch'])
                for driver in plan.get('drivers') or []:   # per-pool drivers: OnDelete, nothing restarts
                    client.patch(driver['path'], driver['patch'])
            if waiting and plan['changed'] and p['state'] == 'cluster':
                try:
                    polled, out['waited'] = _wait(lambda: rendered(read(), plan), p['timeout'], p['interval'])
                except GpuOperatorError as exc:
                    if plan.get('undo'):  # the helm-controller refused the chart: put it back as it was
                        client.patch(plan['path'], plan['undo'])
                        for driver in plan.get('drivers') or []:
                            client.patch(driver['path'], driver['undo'])
                    raise GpuOperatorError('%s; the HelmChart was put back as it was' % exc)
                if not polled.done:
                    module.fail_json(msg='gpu_operator_update: the operator did not render the change within %d s: %s'
                                     % (p['timeout'], '; '.join(polled.value[1])), gpu_operator=state_of(read()), **out)
            out['gpu_operator'] = state_of(read()) if not module.check_mode else state_of(objs)
            module.exit_json(**out)

        node = p['node']
        state = state_of(objs)
        node_path = '/api/v1/nodes/%s' % node
        if p['state'] == 'back':
            node_obj = client.get(node_path)
            plan = plan_back(node_obj, objs, p['revisions'])
            out = dict(changed=plan['changed'], back={'operands': plan['operands'],
                                                      'created': [x['metadata']['name'] for x in plan['pods']]})
            if module.check_mode:
                module.exit_json(operands=state['nodes'].get(node, []), **out)
            if plan['patch']:
                client.patch(node_path, plan['patch'])
            if plan['pods']:
                # The DaemonSets' pods leave first: never two of a device holder on the node at once.
                polled, out['waited'] = _wait(lambda: node_paused(state_of(read()), node, sorted(plan['operands'])),
                                              p['timeout'], p['interval'])
                if not polled.done:
                    module.fail_json(msg='gpu_operator_update: the operands of %s did not leave it within %d s: %s' % (
                        node, p['timeout'], '; '.join(polled.value[1])), **out)
                for pod in plan['pods']:
                    client.post('/api/v1/namespaces/%s/pods' % p['namespace'], pod)
            if waiting:
                polled, out['waited'] = _wait(lambda: node_back_settled(state_of(read()), node, plan['operands']),
                                              p['timeout'], p['interval'])
                if not polled.done:
                    module.fail_json(msg='gpu_operator_update: the operands of %s did not come back at their earlier '
                                     'revisions within %d s: %s' % (node, p['timeout'], '; '.join(polled.value[1])),
                                     **out)
            module.exit_json(operands=state_of(read())['nodes'].get(node, []), **out)
        forward = plan_forward(client.get(node_path), state) if p['state'] == 'node' else None
        if forward and forward['changed']:
            if not module.check_mode:
                if forward['patch']:
                    client.patch(node_path, forward['patch'])
                for name in forward['delete']:
                    client.delete('/api/v1/namespaces/%s/pods/%s' % (p['namespace'], name))
                objs = read()
                state = state_of(objs)
        if p['state'] in ('pause', 'resume'):
            node_obj = client.get(node_path)
            present = sorted({x['operand'] for x in state['nodes'].get(node, [])})
            plan = plan_pause(node_obj, present, p['operands']) if p['state'] == 'pause' else plan_resume(node_obj)
            if p['state'] == 'pause' and plan['patch']:
                blocked = untolerated(node_obj, objs['daemonsets'], plan['operands'])
                if blocked:
                    module.fail_json(msg='gpu_operator_update: %s; their pods would not come back after the pause, '
                                     'nothing was changed' % '; '.join(blocked))
            out = dict(changed=plan['changed'], paused={'labels': plan['labels'], 'operands': plan['operands']})
            if plan['patch'] and not module.check_mode:
                client.patch(node_path, plan['patch'])
            if waiting:
                if p['state'] == 'pause':
                    def check():
                        return node_paused(state_of(read()), node, plan['operands'])
                else:
                    def check():
                        return node_settled(state_of(read()), node, plan['operands'])
                polled, out['waited'] = _wait(check, p['timeout'], p['interval'])
                if not polled.done:
                    module.fail_json(msg='gpu_operator_update: the operands of %s did not %s within %d s: %s' % (
                        node, 'stop' if p['state'] == 'pause' else 'come back current and Ready', p['timeout'],
                        '; '.join(polled.value[1])), **out)
            out['operands'] = state_of(read())['nodes'].get(node, []) if not module.check_mode else \
                state['nodes'].get(node, [])
            module.exit_json(**out)
        restart = node_restarts(state, node, operand_names(state, p['operands']))
        if restart:
            blocked = untolerated(client.get('/api/v1/nodes/%s' % node), objs['daemonsets'],
                                  sorted({x['operand'] for x in restart}))
            if blocked:
                module.fail_json(msg='gpu_operator_update: %s; its pod would not come back after the restart, nothing '
                                 'was deleted (add the toleration with tolerations at the cluster step)'
                                 % '; '.join(blocked))
        out = dict(changed=bool(restart) or bool(forward and forward['changed']), restarted=restart)
        if forward and forward['changed']:
            out['back'] = {'operands': forward['operands'], 'deleted': forward['delete']}
        if restart and not module.check_mode:
            for pod in restart:
                client.delete('/api/v1/namespaces/%s/pods/%s' % (p['namespace'], pod['pod']))
        if waiting:
            # What must be back: the pods deleted, and those already current (the validator among them).
            names = sorted({x['operand'] for x in restart} | set(forward['operands'] if forward else [])
                           | {x['operand'] for x in state['nodes'].get(node, []) if x['current']})
            polled, out['waited'] = _wait(lambda: node_settled(state_of(read()), node, names),
                                          p['timeout'], p['interval'])
            state = state_of(read())
            out.update(operands=state['nodes'].get(node, []), gpu_operator=state)
            if not polled.done:
                module.fail_json(msg='gpu_operator_update: the operands of %s did not come back current and Ready within '
                                 '%d s: %s' % (node, p['timeout'], '; '.join(polled.value[1])), **out)
        else:
            out.update(operands=state['nodes'].get(node, []), gpu_operator=state)
        module.exit_json(**out)


if __name__ == '__main__':
    main()
