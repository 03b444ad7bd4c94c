"""Each Kubernetes module's requests (from the emulator's request log) stay inside the ClusterRole
docs/rbac/modules.yml gives it."""
from __future__ import annotations

import pytest

import k8s_scenario as S
import rbac_check as R
from k8s_support import KubeVirtStandIn, load, play

pytestmark = pytest.mark.slow


def _run(emulator, run_playbook, task):
    emulator.clear_requests()
    run = run_playbook(play(emulator, task))
    assert run.rc == 0, run.stdout
    reqs = list(emulator.requests)
    assert reqs, 'the module made no request'
    return reqs


def test_gpu_holders_info_stays_inside_the_reader_role(emulator, run_playbook):
    load(emulator)
    role = R.module_roles()['gpu_holders_info']
    for args in ({}, {'nodes': [S.NODE, S.OTHER]}):
        reqs = _run(emulator, run_playbook, {'gpufleet.upgrade.gpu_holders_info': args})
        assert R.violations(role, reqs) == []


def test_node_drain_stays_inside_the_operator_role(emulator, run_playbook):
    load(emulator)
    role = R.module_roles()['node_drain']
    seen = []
    with KubeVirtStandIn(emulator):
        for args in ({'name': S.NODE, 'state': 'drain', 'force': True, 'delete_local_data': True,
                      'vmi_policy': 'stop', 'retry_interval': 0.5},
                     {'name': S.NODE, 'state': 'uncordon'},
                     {'name': S.OTHER, 'state': 'cordon'}):
            reqs = _run(emulator, run_playbook, {'gpufleet.upgrade.node_drain': args})
            assert R.violations(role, reqs) == []
            seen += reqs
        # disable_eviction deletes pods (bypassing PodDisruptionBudgets): the operator role refuses
        # that; the opt-in role for the option allows it.
        reqs = _run(emulator, run_playbook, {'gpufleet.upgrade.node_drain': {
            'name': S.OTHER, 'state': 'drain', 'disable_eviction': True, 'retry_interval': 0.5}})
        deletes = [r for r in reqs if r['verb'] == 'DELETE']
        assert deletes and len(R.violations(role, reqs)) == len(deletes)
        assert R.violations([role, R.option_roles()['node_drain']['disable_eviction']], reqs) == []
    attrs = {(a['verb'], a['resource']) for a in (R.attributes(r['verb'], r['path'], r['query']) for r in seen)}
    # the role is exercised, and it is needed: the reader role would refuse the writes
    assert {('patch', 'nodes'), ('create', 'pods/eviction'), ('patch', 'virtualmachines')} <= attrs
    assert len(R.violations(R.module_roles()['gpu_holders_info'], seen)) > 0
