"""cuda_compat module and filters run through ansible-playbook (ansible-runner)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def play(tasks):
    return [{'name': 'cuda', 'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}]


def test_cuda_compat_gate(run_playbook):
    r = run_playbook(play([
        {'name': 'ok', 'gpufleet.upgrade.cuda_compat': {
            'driver': '580.126.20', 'applications': [{'name': 'triton', 'toolkit': '12.8'},
                                                     {'name': 'next', 'toolkit': '13.2'}]}},
        {'name': 'ptx', 'gpufleet.upgrade.cuda_compat': {
            'driver': '580.126.20', 'gpu_class': 'datacenter',
            'applications': [{'name': 'trainer', 'toolkit': '13.1.1', 'ptx_jit': True}]},
         'ignore_errors': True},
        {'name': 'bad', 'gpufleet.upgrade.cuda_compat': {
            'driver': 'r580', 'applications': [{'name': 'x', 'toolkit': '12.8'}]}, 'ignore_errors': True},
        {'name': 'filter', 'ansible.builtin.set_fact': {
            'verdict': "{{ [{'name': 'old', 'toolkit': '13.0', 'forward_compat': true}] "
                       "| gpufleet.upgrade.cuda_compat(driver='570.172.08', gpu_class='datacenter') }}",
            'mins': "{{ '12.4U1' | gpufleet.upgrade.cuda_minimum_driver }}"}},
    ]))
    assert r.rc == 0, r.stdout
    ok = r.result('ok')
    assert ok['passed'] is True and ok['changed'] is False
    assert [a['status'] for a in ok['applications']] == ['backward', 'minor_version']
    assert ok['minor_version'] == ['next'] and ok['driver_cuda'] == '13.0'
    ptx = r.result('ptx')
    assert ptx['_event'] == 'runner_on_failed' and ptx['passed'] is False
    assert ptx['msg'].startswith('CUDA compatibility gate failed for driver 580.126.20: trainer (CUDA 13.1U1): ')
    assert 'cudaErrorUnsupportedPtxVersion (222)' in ptx['msg']
    assert ptx['flagged'] == ['trainer']
    assert r.result('bad')['msg'] == "driver: 'r580' is not an NVIDIA driver version (e.g. 580.126.20)"
    facts = r.result('filter')['ansible_facts']
    assert facts['verdict']['applications'][0]['status'] == 'forward'
    assert facts['mins']['backward'] == '550.54.15' and facts['mins']['minor_version'] == '525.60.13'
