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
    (O(values) merged in, O(dcgm_exporter_version) as C(dcgmExporter.version)), and always sets
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
      - With O(state=cluster) and O(state=restore), the values (and chart version) before and after.
  idempotent:
    support: full
    description: A second run with the same input changes nothing (a node whose operands are current restarts none).
options:
  state:
    description: Which step (see the description).
    type: str
    choices: [cluster, node, restore, pause, resume]
    required: true
  version:
    description: With O(state=cluster), the target chart version (the operator's version). Needs the HelmChart.
    type: str
  dcgm_exporter_version:
    description: With O(state=cluster), the target DCGM exporter version (C(dcgmExporter.version)).
    type: str
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
    description: With O(state=node), O(state=pause) and O(state=resume), the node.
    type: str
  operands:
    description:
      - With O(state=node), only these operand DaemonSets (by name, for example C(nvidia-dcgm-exporter)). Default
        - every operand pod on the node that is not current.
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
    OPERATOR_ARG_SPEC, GpuOperatorError, node_paused, node_restarts, node_settled, plan_cluster, plan_pause,
    plan_restore, plan_resume, read_objects, rendered, state_of, untolerated)
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
        state=dict(type='str', choices=['cluster', 'node', 'restore', 'pause', 'resume'], required=True),
        **OPERATOR_ARG_SPEC,
        version=dict(type='str'),
        dcgm_exporter_version=dict(type='str'),
        values=dict(type='dict'),
        replace_values=dict(type='bool', default=False),
        tolerations=dict(type='list', elements='dict'),
        node=dict(type='str'),
        operands=dict(type='list', elements='str'),
        allow_stale=dict(type='bool', default=False),
        wait=dict(type='bool', default=True),
        timeout=dict(type='int', default=600),
        interval=dict(type='float', default=2.0),
    ), required_if=[('state', 'node', ('node',)), ('state', 'pause', ('node',)), ('state', 'resume', ('node',))])
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
            if waiting and plan['changed'] and p['state'] == 'cluster':
                try:
                    polled, out['waited'] = _wait(lambda: rendered(read(), plan), p['timeout'], p['interval'])
                except GpuOperatorError as exc:
                    if plan.get('undo'):  # the helm-controller refused the chart: put it back as it was
                        client.patch(plan['path'], plan['undo'])
                    raise GpuOperatorError('%s; the HelmChart was put back as it was' % exc)
                if not polled.done:
                    module.fail_json(msg='gpu_operator_update: the operator did not render the change within %d s: %s'
                                     % (p['timeout'], '; '.join(polled.value[1])), gpu_operator=state_of(read()), **out)
            out['gpu_operator'] = state_of(read()) if not module.check_mode else state_of(objs)
            module.exit_json(**out)

        node = p['node']
        state = state_of(objs)
        if p['state'] in ('pause', 'resume'):
            node_path = '/api/v1/nodes/%s' % node
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
        restart = node_restarts(state, node, p['operands'])
        if restart:
            blocked = untolerated(client.get('/api/v1/nodes/%s' % node), objs['daemonsets'],
                                  sorted({x['operand'] for x in restart}))
            if blocked:
                module.fail_json(msg='gpu_operator_update: %s; its pod would not come back after the restart, nothing '
                                 'was deleted (add the toleration with tolerations at the cluster step)'
                                 % '; '.join(blocked))
        out = dict(changed=bool(restart), restarted=restart)
        if restart and not module.check_mode:
            for pod in restart:
                client.delete('/api/v1/namespaces/%s/pods/%s' % (p['namespace'], pod['pod']))
        if waiting:
            # What must be back: the pods deleted, and those already current (the validator among them).
            names = sorted({x['operand'] for x in restart}
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
