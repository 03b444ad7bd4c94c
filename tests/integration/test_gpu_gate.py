"""gpu_gate through ansible-runner, over real gpu_info output from the NVML stand-in.

One play: gpu_info reads the baseline state from the stand-in libnvidia-ml (through the real
nvidia-ml-py) and Xid events from a kernel log file; then, for each scenario, the play copies a
changed NVML state and kernel log into place, runs gpu_info again and judges the new facts with
gpu_gate against the baseline.
"""
from __future__ import annotations

import copy
import pathlib
from typing import Any

OLD = '580.126.20'
NEW = '580.130.00'
H100 = '10de:2330/10de:16c1'

BASE_STATE: dict[str, Any] = {
    'driver_version': OLD, 'cuda_version': 13000,
    'gpus': [
        {'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-4c6f3a2e-0d7f-4c39-9a51-1f7a3d2b9c01',
         'bus_id': '00000000:17:00.0', 'pci': H100, 'mig': (0, 0), 'ecc_mode': (1, 1),
         'ecc': {'uncorrected_volatile': 0, 'uncorrected_aggregate': 2, 'corrected_volatile': 0,
                 'corrected_aggregate': 7},
         'retired_pages_pending': 0, 'remapped_rows': (3, 0, 0, 0), 'temperature': 36},
        {'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-9b1e6d4c-2a8f-4e1d-8c3b-6e5f7a9d0b12',
         'bus_id': '00000000:2A:00.0', 'pci': H100, 'mig': (0, 0), 'ecc_mode': (1, 1),
         'ecc': {'uncorrected_volatile': 0, 'uncorrected_aggregate': 0, 'corrected_volatile': 0,
                 'corrected_aggregate': 0},
         'retired_pages_pending': 0, 'remapped_rows': (0, 0, 0, 0), 'temperature': 40},
    ],
}

# An Xid from before the baseline (in both logs, so not new) and the Xid 79 that appears after it.
OLD_XID = ('2026-08-10T14:03:22+0000 gpu-node-7 kernel: NVRM: Xid (PCI:0000:17:00): 13, pid=1520, name=python3, '
           'Graphics Exception: ESR 0x405840=0x0\n')
XID_79 = ('2026-08-10T15:10:00+0000 gpu-node-7 kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid=\'<unknown>\', '
          'name=<unknown>, GPU has fallen off the bus.\n')


def upgraded(**changes: Any) -> dict[str, Any]:
    """The baseline state after a clean driver upgrade, with per-GPU changes {index: {field: value}}."""
    state = copy.deepcopy(BASE_STATE)
    state['driver_version'] = NEW
    for index, fields in changes.get('gpus', {}).items():
        state['gpus'][index].update(fields)
    if 'driver_version' in changes:
        state['driver_version'] = changes['driver_version']
    if 'drop' in changes:
        del state['gpus'][changes['drop']]
    return state


SCENARIOS: dict[str, tuple[dict[str, Any], str]] = {
    'clean': (upgraded(), OLD_XID),
    'driver': (upgraded(driver_version=OLD), OLD_XID),
    'ecc': (upgraded(gpus={0: {'ecc': dict(BASE_STATE['gpus'][0]['ecc'], uncorrected_aggregate=3)}}), OLD_XID),
    'row_remap': (upgraded(gpus={1: {'remapped_rows': (0, 1, 0, 1)}}), OLD_XID),
    'missing': (upgraded(drop=1), OLD_XID),
    'xid': (upgraded(), OLD_XID + XID_79),
}


def test_gpu_gate_over_gpu_info_from_the_nvml_stand_in(run_playbook: Any, fake_nvml: Any,
                                                       tmp_path: pathlib.Path) -> None:
    from tools.nvml_stub import write_state
    fake_nvml.write(BASE_STATE)
    log = tmp_path / 'kern.log'
    log.write_text(OLD_XID)
    info = {'backend': 'nvml', 'kernel_log': str(log), 'xid_since': '2026-08-10T00:00:00Z', 'packages': False}
    tasks: list[dict[str, Any]] = [
        {'name': 'baseline', 'gpufleet.upgrade.gpu_info': info, 'register': 'base'}]
    for name, (state, log_text) in SCENARIOS.items():
        state_file = write_state(tmp_path / ('%s.state' % name), state)
        log_file = tmp_path / ('%s.log' % name)
        log_file.write_text(log_text)
        tasks += [
            {'name': 'state %s' % name, 'ansible.builtin.copy': {
                'src': str(state_file), 'dest': str(fake_nvml.state_path), 'mode': '0644'}},
            {'name': 'log %s' % name, 'ansible.builtin.copy': {'src': str(log_file), 'dest': str(log), 'mode': '0644'}},
            {'name': 'facts %s' % name, 'gpufleet.upgrade.gpu_info': info, 'register': 'now'},
            {'name': 'gate %s' % name, 'ignore_errors': True, 'gpufleet.upgrade.gpu_gate': {
                'facts': '{{ now }}', 'baseline': '{{ base }}', 'target_driver': NEW}},
            # The same gate reading the facts itself (the observation window's one task per node).
            {'name': 'read and gate %s' % name, 'ignore_errors': True, 'gpufleet.upgrade.gpu_gate': {
                'baseline': '{{ base }}', 'target_driver': NEW, 'backend': 'nvml', 'kernel_log': str(log),
                'xid_since': '2026-08-10T00:00:00Z'}},
        ]
    # With facts given nothing runs on the node (the action plugin judges them in Ansible's worker): no Python
    # there is needed. Its option checks are the module's.
    no_python = {'ansible_python_interpreter': '/nonexistent/python'}
    gate = 'gpufleet.upgrade.gpu_gate'
    tasks += [
        {'name': 'gate clean, no module', 'vars': no_python,
         gate: {'facts': '{{ run_facts_clean }}', 'baseline': '{{ base }}', 'target_driver': NEW}},
        {'name': 'bad skip', 'ignore_errors': True,
         gate: {'facts': '{{ base }}', 'baseline': '{{ base }}', 'target_driver': OLD, 'skip': ['nope']}},
        {'name': 'bad facts', 'ignore_errors': True,
         gate: {'facts': {'gpus': 'none'}, 'baseline': '{{ base }}', 'target_driver': OLD}},
        {'name': 'read, no module', 'vars': no_python, 'ignore_errors': True,
         gate: {'baseline': '{{ base }}', 'target_driver': NEW}}]
    for i, task in enumerate(tasks):
        if task['name'] == 'facts clean':
            tasks.insert(i + 1, {'name': 'keep clean facts', 'ansible.builtin.set_fact': {'run_facts_clean': '{{ now }}'}})
            break
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}], envvars=fake_nvml.env)

    base = run.result('baseline')
    assert base['_event'] == 'runner_on_ok', base.get('msg')
    assert base['driver_version'] == OLD and base['pci_ids'] == [H100] and len(base['gpus']) == 2
    assert [(e['code'], e['pci']) for e in base['xid_events']] == [(13, '0000:17:00')]
    # gpu_info really read each changed state.
    assert run.result('facts clean')['driver_version'] == NEW
    assert run.result('facts ecc')['gpus'][0]['ecc']['aggregate_uncorrected'] == 3
    assert run.result('facts row_remap')['gpus'][1]['remapped_rows'] == {
        'correctable': 0, 'uncorrectable': 1, 'pending': False, 'failure': True}
    assert [g['bus_id'] for g in run.result('facts missing')['gpus']] == ['00000000:17:00.0']

    clean = run.result('gate clean')
    assert clean['_event'] == 'runner_on_ok', clean.get('msg')
    assert clean['passed'] is True and clean['changed'] is False
    assert clean['msg'] == 'GPU gate: PASS (driver %s, 2 GPU(s))' % NEW
    assert clean['checks']['xid']['evidence']['baseline_events'] == 1

    expected = {
        'driver': 'GPU gate: FAIL: driver: loaded %s, target %s' % (OLD, NEW),
        'ecc': 'GPU gate: FAIL: ecc: GPU 0 (00000000:17:00.0) uncorrected ECC errors grew by 1 since the baseline',
        'row_remap': 'GPU gate: FAIL: row_remap: GPU 1 (00000000:2A:00.0) reports a row-remapping failure',
        'missing': 'GPU gate: FAIL: pci_identity: GPU at 00000000:2A:00.0 (%s) is missing since the baseline' % H100,
        'xid': 'GPU gate: FAIL: xid: new Xid 79 (GPU_HAS_FALLEN_OFF_THE_BUS, severity critical) on 0000:2a:00 '
               'at 2026-08-10T15:10:00Z',
    }
    read = run.result('read and gate clean')
    assert read['_event'] == 'runner_on_ok' and read['msg'] == clean['msg'] and read['facts']['driver_version'] == NEW
    for name, msg in expected.items():
        for task in ('gate %s' % name, 'read and gate %s' % name):
            res = run.result(task)
            assert res['_event'] == 'runner_on_failed', (task, res.get('msg'))
            assert res['passed'] is False
            assert res['msg'] == msg, task
    assert run.result('gate xid')['checks']['xid']['evidence']['failing'] == 1
    unmoduled = run.result('gate clean, no module')
    assert unmoduled['_event'] == 'runner_on_ok' and unmoduled['msg'] == clean['msg'], unmoduled.get('msg')
    assert 'facts' not in unmoduled and unmoduled['checks'] == clean['checks']
    assert run.result('read, no module')['_event'] == 'runner_on_failed'    # that one is the module, on the node
    assert run.result('bad skip')['msg'].startswith('value of skip must be one or more of: driver, pci_identity')
    bad = run.result('bad facts')
    assert bad['_event'] == 'runner_on_failed' and bad['passed'] is False
    assert bad['msg'].startswith('GPU gate: invalid input: '), bad['msg']
