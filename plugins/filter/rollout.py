# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Documentation: the YAML file of each filter next to this file.

"""The playbooks' and roles' decisions between module calls, as filters over _plan, _node_record
and _rollout (thin: every decision is a tested function there)."""

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import (
    _gpu_operator, _node_gate, _node_names, _node_python, _node_record, _plan, _plan_digest, _rollout, _upgrade_state)

_ERRORS = (_node_record.RecordError, _plan.PlanInputError, _rollout.RolloutError, _upgrade_state.StateError,
           _plan_digest.PlanDigestError, _gpu_operator.GpuOperatorError, _node_names.NodeNameError,
           _node_gate.NodeGateError, _node_python.NodePythonError)


def _call(name: str, fn: t.Callable[..., t.Any], *args: t.Any, **kwargs: t.Any) -> t.Any:
    try:
        return fn(*args, **kwargs)
    except _ERRORS as exc:
        raise AnsibleFilterError('gpufleet.upgrade.%s: %s' % (name, exc))


def target_key(target: t.Dict[str, t.Any]) -> str:
    return _call('target_key', _upgrade_state.target_key, target)


def pci_slug(pci_ids: t.Any) -> str:
    return _call('pci_slug', _rollout.pci_slug, pci_ids)


def live_tuple_problems(plan: t.Any, nodes: t.Any, names: t.Any = None) -> t.List[str]:
    return _call('live_tuple_problems', _plan.live_tuple_problems, plan, nodes, names)


def combination_slug(combination: t.Any) -> str:
    return _call('combination_slug', _rollout.combination_slug, combination)


def snapshot_file(directory: str, node: str, target: t.Dict[str, t.Any]) -> str:
    return _call('snapshot_file', _rollout.snapshot_file, directory, node, target)


def operator_revisions(snapshot: t.Optional[t.Dict[str, t.Any]], node: str) -> t.Dict[str, str]:
    return _call('operator_revisions', _gpu_operator.snapshot_revisions, snapshot, node)


def rollback_activation(mode: t.Any, decision: t.Any, kernel_back: t.Any = False) -> str:
    return _call('rollback_activation', _rollout.rollback_activation, mode, decision, kernel_back)


def install_method_verdict(plan: t.Any, install_method: t.Any) -> t.Dict[str, t.Any]:
    return _call('install_method_verdict', _rollout.install_method_verdict, plan, install_method)


def operand_window_verdict(gpu_operator: t.Any, nodes: t.Any, pending: t.Any,
                           target: t.Dict[str, t.Any]) -> t.Dict[str, t.Any]:
    return _call('operand_window_verdict', _rollout.operand_window_verdict, gpu_operator, nodes, pending, target)


def operands_back(managed: t.Any, restore: t.Any, install_method: t.Any = 'apt') -> bool:
    return _call('operands_back', _rollout.operands_back, managed, restore, install_method)


def batch_admission(nodes: t.List[t.Dict[str, t.Any]], batch: t.List[str], plan: t.Dict[str, t.Any]) -> t.Dict[str, t.Any]:
    return _call('batch_admission', _plan.batch_admission, nodes, batch, plan)


def node_failure(step: str, rollback_on_failure: bool = True, progress: t.Optional[t.Dict[str, t.Any]] = None,
                 cordon_lost: bool = False) -> t.Dict[str, t.Any]:
    return _call('node_failure', _node_record.failure, step, bool(rollback_on_failure), progress, cordon_lost)


def gate_results(results: t.Dict[str, t.Any], node: str) -> t.Dict[str, t.Any]:
    return _call('gate_results', _rollout.gate_results, results, node)


def tuple_gate(target: t.Dict[str, t.Any], booted: t.Optional[t.Dict[str, t.Any]], gpu_after: t.Optional[t.Dict[str, t.Any]],
               node_gate: t.Optional[t.Dict[str, t.Any]]) -> t.Dict[str, t.Any]:
    return _call('tuple_gate', _rollout.judge_tuple, target, booted, gpu_after, node_gate)


def rollout_node_entry(plan: t.Dict[str, t.Any], host: str, **kwargs: t.Any) -> t.Dict[str, t.Any]:
    return _call('rollout_node_entry', _rollout.node_entry, plan, host, **kwargs)


def plan_nodes(plan: t.Dict[str, t.Any]) -> t.List[str]:
    return _call('plan_nodes', _rollout.plan_nodes, plan)


def unfinished_nodes(nodes: t.List[t.Dict[str, t.Any]], target: t.Dict[str, t.Any]) -> t.List[str]:
    return _call('unfinished_nodes', _rollout.unfinished_nodes, nodes, target)


def rollback_result(node: str, decision: t.Dict[str, t.Any], restored: bool, gpu_after: t.Dict[str, t.Any],
                    gates: t.Dict[str, t.Any], driver_before_upgrade: str) -> t.Dict[str, t.Any]:
    return _call('rollback_result', _rollout.rollback_result, node, decision, restored, gpu_after, gates,
                 driver_before_upgrade)


def plan_gate_entries(results: t.List[t.Dict[str, t.Any]], plan_sha256: str, plan_file: str,
                      started: str = '') -> t.List[t.Dict[str, t.Any]]:
    return _call('plan_gate_entries', _plan_digest.gate_entries, results, plan_sha256, plan_file, started)


def plan_digest(bundle: t.Any, plan_sha256: str, plan_file: str) -> t.Dict[str, t.Any]:
    return _call('plan_digest', _plan_digest.verdict, bundle, plan_sha256, plan_file)


def plan_workflow_digest(plan: t.Dict[str, t.Any], expected: t.Any = '') -> t.Dict[str, t.Any]:
    return _call('plan_workflow_digest', _plan_digest.workflow_verdict, plan, expected)


def forks_verdict(batches: t.List[t.List[str]], forks: int) -> t.Dict[str, t.Any]:
    return _call('forks_verdict', _rollout.forks_verdict, batches, forks)


def activation(mode: str, kernel_change: bool, booted: bool = False, install_method: str = 'apt') -> str:
    return _call('activation', _rollout.activation, mode, kernel_change, booted, install_method)


def rollback_time(node: str, start: t.Any, end: t.Any, window: t.Any = '') -> t.Dict[str, t.Any]:
    return _call('rollback_time', _rollout.rollback_time, node, start, end, window)


def plan_serial(plan: t.Dict[str, t.Any]) -> t.List[int]:
    return _call('plan_serial', _rollout.plan_serial, plan)


def observation_window(window: t.Any, started: t.Any, now: t.Any) -> t.Dict[str, t.Any]:
    return _call('observation_window', _rollout.observation_window, window, started, now)


def observation_settings(plan: t.Dict[str, t.Any], default_window: t.Any,
                         metric_gate: t.Optional[t.Dict[str, t.Any]] = None) -> t.Dict[str, t.Any]:
    return _call('observation_settings', _rollout.observation_settings, plan, default_window, metric_gate)


def observation_cases(cases: t.List[t.Dict[str, t.Any]], workloads: t.Any) -> t.List[t.Dict[str, t.Any]]:
    return _call('observation_cases', _rollout.observation_cases, cases, workloads)


def observation_verdict(nodes: t.List[t.Dict[str, t.Any]], plan: t.Dict[str, t.Any], window: t.Dict[str, t.Any],
                        metric: t.Optional[t.Dict[str, t.Any]] = None,
                        host: t.Optional[t.Dict[str, t.Any]] = None,
                        node_gate: t.Optional[t.Dict[str, t.Any]] = None,
                        workload: t.Optional[t.Dict[str, t.Any]] = None) -> t.Dict[str, t.Any]:
    return _call('observation_verdict', _rollout.observation_verdict, nodes, plan, window, metric, host, node_gate, workload)


def observation_hosts(results: t.Mapping[str, t.Any], upgraded: t.List[str],
                      hosts: t.Optional[t.List[str]] = None,
                      expected: t.Optional[t.Dict[str, t.Any]] = None) -> t.Dict[str, t.Any]:
    # With `hosts`, `results` is hostvars: each host's node_upgrade_result, None where the role did not set one.
    if hosts is not None:
        results = {h: (results[h] if h in results else {}).get('node_upgrade_result') for h in hosts}
    return _call('observation_hosts', _rollout.observation_hosts, dict(results), upgraded, expected)


def observation_share(hosts: t.List[str], workers: t.List[str], worker: str) -> t.List[str]:
    return _call('observation_share', _rollout.observation_share, hosts, workers, worker)


def observation_gpu(registered: t.List[t.Any], regate: t.Dict[str, t.Any]) -> t.Dict[str, t.Any]:
    return _call('observation_gpu', _rollout.observation_gpu, registered, regate)


def _declared(hostvars: t.Any, hosts: t.Any) -> t.Dict[str, t.Any]:
    # {inventory host: its gpufleet_node_name, None where not set}; hosts not a list is refused by _node_names.
    if not isinstance(hosts, (list, tuple)):
        return {}
    return {h: (hostvars[h].get('gpufleet_node_name') if h in hostvars else None) for h in hosts if isinstance(h, str)}


def inventory_hosts(nodes: t.List[str], hostvars: t.Any, where: str = 'nodes') -> t.List[str]:
    # Every inventory host is read (the Node a host stands for is its gpufleet_node_name, else its name).
    return _call('inventory_hosts', _node_names.inventory_hosts, nodes, _declared(hostvars, list(hostvars)), where)


def node_names(hosts: t.List[str], hostvars: t.Any) -> t.List[str]:
    return _call('node_names', _node_names.node_names, hosts, _declared(hostvars, hosts))


def expected_gpus(explicit: t.Any, baseline: t.Any) -> t.Dict[str, int]:
    return _call('expected_gpus', _node_gate.expected_from_baseline, explicit, baseline)


def node_python(registered: t.Any, hostvars: t.Any = None, host: t.Optional[str] = None) -> t.List[str]:
    # One message per node whose Python the collection's node-side modules cannot run with: `registered` is
    # setup's result on `host`, or a loop's ({'results': [...]}, each with its host as `item`). Each host's
    # ansible_python_interpreter (where set) names the interpreter when setup could not report it.
    if isinstance(registered, t.Mapping) and 'results' not in registered and host is not None:
        registered = {'results': [dict(registered, item=host)]}
    results = registered.get('results', [registered]) if isinstance(registered, t.Mapping) else registered
    hosts = [r.get('item') for r in results if isinstance(r, t.Mapping)] if isinstance(results, list) else []
    interpreters = {h: hostvars[h].get('ansible_python_interpreter')
                    for h in hosts if isinstance(h, str) and hostvars is not None and h in hostvars}
    return _call('node_python', _node_python.problems, results, interpreters)


class FilterModule:
    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'target_key': target_key, 'pci_slug': pci_slug, 'combination_slug': combination_slug, 'live_tuple_problems': live_tuple_problems,
                'snapshot_file': snapshot_file,
                'batch_admission': batch_admission, 'node_failure': node_failure, 'gate_results': gate_results,
                'tuple_gate': tuple_gate,
                'rollout_node_entry': rollout_node_entry, 'unfinished_nodes': unfinished_nodes, 'plan_nodes': plan_nodes,
                'plan_serial': plan_serial,
                'rollback_result': rollback_result, 'plan_gate_entries': plan_gate_entries,
                'plan_digest': plan_digest, 'plan_workflow_digest': plan_workflow_digest, 'forks_verdict': forks_verdict,
                'rollback_time': rollback_time, 'activation': activation,
                'observation_window': observation_window, 'observation_verdict': observation_verdict,
                'observation_cases': observation_cases,
                'observation_settings': observation_settings, 'observation_hosts': observation_hosts,
                'observation_share': observation_share, 'observation_gpu': observation_gpu,
                'operator_revisions': operator_revisions, 'operands_back': operands_back,
                'operand_window_verdict': operand_window_verdict,
                'rollback_activation': rollback_activation,
                'install_method_verdict': install_method_verdict,
                'inventory_hosts': inventory_hosts, 'node_names': node_names, 'expected_gpus': expected_gpus,
                'node_python': node_python}
