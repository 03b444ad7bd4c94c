"""gpufleet.upgrade.gpu_info run by ansible-playbook (ansible-runner) on localhost.

The module's Python loads the real nvidia-ml-py, which loads the stand-in libnvidia-ml.so.1
through LD_LIBRARY_PATH; the nvidia-smi fallback runs a `nvidia-smi` program on PATH that prints
recorded `-q -x` output.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / 'tests' / 'unit' / 'fixtures'
H100 = '10de:2330/10de:16c1'

STATE = {
    'driver_version': '580.126.20', 'cuda_version': 13000,
    'gpus': [
        {'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-4c6f3a2e-0d7f-4c39-9a51-1f7a3d2b9c01',
         'bus_id': '00000000:17:00.0', 'pci': H100, 'mig': (1, 1), 'ecc_mode': (1, 1),
         'ecc': {'uncorrected_volatile': 0, 'uncorrected_aggregate': 0, 'corrected_volatile': 0,
                 'corrected_aggregate': 7},
         'retired_pages_pending': 0, 'remapped_rows': (0, 0, 0, 0), 'temperature': 36},
        {'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-9b1e6d4c-2a8f-4e1d-8c3b-6e5f7a9d0b12',
         'bus_id': '00000000:2A:00.0', 'pci': H100, 'mig': (0, 1), 'ecc_mode': (1, 1),
         'retired_pages_pending': 0, 'temperature': 40,
         'fail': {'nvmlDeviceGetRemappedRows': 'NOT_SUPPORTED'},
         'processes': [{'pid': 4242, 'used_bytes': 2 * 1024 ** 3, 'name': 'python3'}]},
    ],
}


def play(task_args, name='facts'):
    return [{'hosts': 'localhost', 'gather_facts': False,
             'tasks': [{'name': name, 'gpufleet.upgrade.gpu_info': task_args, 'register': 'gpu'}]}]


def test_gpu_info_over_nvml_stand_in(run_playbook, fake_nvml, tmp_path):
    fake_nvml.write(STATE)
    log = tmp_path / 'kern.log'
    log.write_text((FIX / 'kernel_log' / 'journal_short_iso_precise.txt').read_text())
    run = run_playbook(play({'backend': 'nvml', 'kernel_log': str(log), 'xid_since': '2026-08-10T14:00:00Z'}),
                       envvars=fake_nvml.env)
    assert run.rc == 0, run.stdout
    res = run.result('facts')
    assert res['_event'] == 'runner_on_ok'
    assert res['changed'] is False
    assert res['backend'] == 'nvml'
    assert (res['driver_version'], res['cuda_driver_version']) == ('580.126.20', '13.0')
    assert res['kernel'] == os.uname().release
    assert res['pci_ids'] == [H100]
    assert isinstance(res['modules'], list) and isinstance(res['packages'], list)
    g0, g1 = res['gpus']
    assert (g0['index'], g0['uuid'], g0['bus_id'], g0['pci_id']) == (
        0, 'GPU-4c6f3a2e-0d7f-4c39-9a51-1f7a3d2b9c01', '00000000:17:00.0', H100)
    assert g0['mig_mode'] == {'current': True, 'pending': True}
    assert g0['ecc'] == {'enabled': True, 'volatile_uncorrected': 0, 'aggregate_uncorrected': 0,
                         'volatile_corrected': 0, 'aggregate_corrected': 7}
    assert g0['remapped_rows'] == {'correctable': 0, 'uncorrectable': 0, 'pending': False, 'failure': False}
    assert (g0['temperature_c'], g0['processes'], g0['errors']) == (36, [], {})
    assert g1['mig_mode'] == {'current': False, 'pending': True}
    assert g1['remapped_rows'] is None
    assert g1['errors'] == {'remapped_rows': 'Not Supported'}
    assert g1['processes'] == [{'pid': 4242, 'name': 'python3', 'used_memory_mib': 2048}]
    # both recorded lines are after xid_since; 0000:17:00 is GPU 0, 0000:2a:00 is GPU 1
    assert [(e['code'], e['severity'], e['gpu_index'], e['time']) for e in res['xid_events']] == [
        (120, 'high', 0, '2026-08-10T14:03:22.123456Z'),
        (74, 'high', 1, '2026-08-10T14:03:22.5Z'),
    ]


def test_gpu_info_check_mode_reads_the_same(run_playbook, fake_nvml):
    fake_nvml.write(STATE)
    run = run_playbook(play({'backend': 'auto', 'kernel_log': 'none', 'packages': False}),
                       envvars=fake_nvml.env, cmdline='--check')
    assert run.rc == 0, run.stdout
    res = run.result('facts')
    assert res['changed'] is False and res['backend'] == 'nvml'
    assert [g['uuid'] for g in res['gpus']] == [g['uuid'] for g in STATE['gpus']]
    assert res['xid_events'] == [] and res['packages'] == []


def test_gpu_info_driver_not_loaded(run_playbook, fake_nvml):
    fake_nvml.write({'init_error': 'DRIVER_NOT_LOADED'})
    run = run_playbook(play({'backend': 'nvml', 'kernel_log': 'none', 'packages': False}), envvars=fake_nvml.env)
    res = run.result('facts')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == 'NVML could not be initialised: Driver Not Loaded'
    run = run_playbook(play({'backend': 'nvml', 'kernel_log': 'none', 'packages': False, 'require_driver': False}),
                       envvars=fake_nvml.env)
    res = run.result('facts')
    assert res['_event'] == 'runner_on_ok'
    assert res['gpus'] == [] and res['errors'] == {'backend': 'NVML could not be initialised: Driver Not Loaded'}


def _fake_nvidia_smi(bin_dir: pathlib.Path, xml: pathlib.Path) -> None:
    bin_dir.mkdir()
    tool = bin_dir / 'nvidia-smi'
    tool.write_text('#!/bin/sh\n[ "$1 $2" = "-q -x" ] || exit 2\nexec cat %s\n' % xml)
    tool.chmod(0o755)


def _python39() -> str | None:
    """A working Python 3.9 (the GPU nodes' floor), if this machine has one."""
    import glob
    for cand in sorted(glob.glob(os.path.expanduser('~/.pyenv/versions/3.9*/bin/python3.9'))) + ['/usr/bin/python3.9']:
        if os.access(cand, os.X_OK) and subprocess.run([cand, '-c', 'import sys; assert sys.version_info[:2] == (3, 9)'],
                                                       capture_output=True, check=False).returncode == 0:
            return cand
    return None


@pytest.mark.parametrize('python', ['controller', 'python3.9'])
def test_gpu_info_nvidia_smi_fallback(run_playbook, tmp_path, python):
    inventory = None
    if python == 'python3.9':
        interpreter = _python39()
        if not interpreter:
            pytest.skip('no Python 3.9 on this machine')
        inventory = {'all': {'hosts': {'localhost': {'ansible_connection': 'local',
                                                     'ansible_python_interpreter': interpreter}}}}
    _fake_nvidia_smi(tmp_path / 'bin', FIX / 'nvidia_smi' / 'h100x2_r580.xml')
    log = tmp_path / 'kern.log'
    log.write_text((FIX / 'kernel_log' / 'dmesg_iso.txt').read_text())
    run = run_playbook(play({'backend': 'nvidia-smi', 'kernel_log': str(log), 'xid_since': '2026-08-10T00:00:00Z',
                             'packages': False}),
                       envvars={'PATH': '%s:%s' % (tmp_path / 'bin', os.environ['PATH'])}, inventory=inventory)
    assert run.rc == 0, run.stdout
    res = run.result('facts')
    assert res['backend'] == 'nvidia-smi'
    assert res['driver_version'] == '580.126.20'
    assert [(g['index'], g['pci_id'], g['mig_mode']['current']) for g in res['gpus']] == [(0, H100, True), (1, H100, False)]
    assert [(e['code'], e['gpu_index'], e['severity']) for e in res['xid_events']] == [(94, 0, 'medium'), (95, 1, 'critical')]


@pytest.mark.skipif(not os.path.exists('/usr/bin/python3'), reason='needs a system Python without nvidia-ml-py')
def test_gpu_info_without_binding_or_nvidia_smi_names_the_library(run_playbook, tmp_path):
    inventory = {'all': {'hosts': {'localhost': {'ansible_connection': 'local',
                                                 'ansible_python_interpreter': '/usr/bin/python3'}}}}
    if subprocess.run(['/usr/bin/python3', '-c', 'import pynvml'], capture_output=True, check=False).returncode == 0:
        pytest.skip('/usr/bin/python3 has pynvml')
    if shutil.which('nvidia-smi'):
        pytest.skip('this host has nvidia-smi')
    run = run_playbook(play({'kernel_log': 'none', 'packages': False}), inventory=inventory)
    res = run.result('facts')
    assert res['_event'] == 'runner_on_failed'
    assert 'Failed to import the required Python library (nvidia-ml-py)' in res['msg']
    assert 'neither the nvidia-ml-py Python binding (import pynvml) nor nvidia-smi is available' in res['msg']


@pytest.mark.parametrize('args, message', [
    ({'xid_since': 'yesterday'}, "xid_since='yesterday': expected 'boot', an RFC 3339 time"),
    ({'kernel_log': 'kern.log'}, "kernel_log='kern.log': expected journal, dmesg, none or an absolute file path"),
    ({'backend': 'dcgm'}, 'value of backend must be one of: auto, nvml, nvidia-smi, got: dcgm'),
])
def test_gpu_info_bad_input_names_field_and_value(run_playbook, fake_nvml, args, message):
    fake_nvml.write(STATE)
    args = dict({'packages': False}, **args)
    run = run_playbook(play(args), envvars=fake_nvml.env)
    res = run.result('facts')
    assert res['_event'] == 'runner_on_failed'
    assert message in res['msg']
    assert 'Traceback' not in res['msg']


@pytest.mark.gpu
@pytest.mark.skipif(not (os.path.exists('/dev/nvidiactl') and any(
    os.path.exists(os.path.join(d, 'libnvidia-ml.so.1'))
    for d in ('/usr/lib/x86_64-linux-gnu', '/usr/lib64', '/usr/lib/aarch64-linux-gnu', '/usr/lib'))),
    reason='needs a real NVIDIA GPU: /dev/nvidiactl and libnvidia-ml.so.1')
def test_gpu_info_on_a_real_gpu_has_the_contract_shape(run_playbook, tmp_path):
    """Opt-in: reads the real driver (read only). Saves the result for new fixtures."""
    # dmesg may be restricted to root (kernel.dmesg_restrict); the shape check must not depend on it
    run = run_playbook(play({'kernel_log': 'dmesg' if os.geteuid() == 0 else 'none', 'xid_since': 'boot'}))
    res = run.result('facts')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['backend'] == 'nvml'
    assert isinstance(res['driver_version'], str) and res['driver_version'].count('.') >= 1
    assert res['gpus'], 'a GPU host with no GPU'
    keys = {'index', 'uuid', 'name', 'bus_id', 'pci_id', 'mig_mode', 'ecc', 'retired_pages_pending',
            'remapped_rows', 'temperature_c', 'processes', 'errors'}
    for g in res['gpus']:
        assert keys <= set(g)
        assert g['uuid'].startswith('GPU-')
        assert len(g['pci_id']) == len('10de:2330/10de:16c1') and g['pci_id'].startswith('10de:')
    assert res['pci_ids'] == sorted({g['pci_id'] for g in res['gpus']})
    assert any(m['name'] == 'nvidia' for m in res['modules'])
    out = os.environ.get('GPUFLEET_GPU_RESULT_OUT')
    if out:
        import json
        pathlib.Path(out).write_text(json.dumps({k: v for k, v in res.items() if not k.startswith('_')}, indent=2))


def test_driver_unload_check_mode_on_this_host_plans_nothing(run_playbook):
    """The real module on the build host: no NVIDIA module is loaded, so nothing to do."""
    if os.path.exists('/sys/module/nvidia'):
        pytest.skip('an NVIDIA driver is loaded here')
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'unload', 'gpufleet.upgrade.driver_unload': {'services': []}, 'check_mode': True}]}])
    res = run.result('unload')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['changed'] is False
    assert res['plan']['unload_modules'] == [] and res['modules_unloaded'] == []


def test_gpu_info_one_state_per_emulated_node(run_playbook, nvml_stub_lib, tmp_path):
    """The lab's pattern: several inventory hosts on localhost, each with its own NVML state."""
    from tools.nvml_stub import write_state
    hosts = {}
    for name, driver, pci in (('gpu-a', '580.130.00', H100), ('gpu-b', '580.126.20', '10de:1db6/10de:124a')):
        state = write_state(tmp_path / (name + '.state'),
                            {'driver_version': driver, 'cuda_version': 13000, 'gpus': [{'pci': pci}]})
        hosts[name] = {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
                       'nvml_state': str(state)}
    playbook = [{'hosts': 'all', 'gather_facts': False,
                 'environment': {'LD_LIBRARY_PATH': str(nvml_stub_lib), 'GPUFLEET_FAKE_NVML_STATE': '{{ nvml_state }}'},
                 'tasks': [{'name': 'facts', 'gpufleet.upgrade.gpu_info': {'kernel_log': 'none', 'packages': False}}]}]
    run = run_playbook(playbook, inventory={'all': {'hosts': hosts}})
    assert run.rc == 0, run.stdout
    got = {r['_host']: (r['driver_version'], r['pci_ids']) for r in run.task_results('facts', event='runner_on_ok')}
    assert got == {'gpu-a': ('580.130.00', [H100]), 'gpu-b': ('580.126.20', ['10de:1db6/10de:124a'])}


def _dmi_tree(root: pathlib.Path, **fields: str) -> str:
    base = root / 'class' / 'dmi' / 'id'
    base.mkdir(parents=True)
    for name, text in fields.items():
        (base / name).write_text(text)
    return str(root)


def test_gpu_info_reads_the_dmi_identity_under_sys_path(run_playbook, fake_nvml, tmp_path):
    """Issue 39 item 9: the machine's DMI identity, the plan's platform where no Node label names it; read under
    sys_path (a stand-in tree here), a field that cannot be read is null, a relative sys_path is refused by name."""
    fake_nvml.write(STATE)
    root = _dmi_tree(tmp_path / 'sys', sys_vendor='Supermicro\n', product_name='SYS-821GE-TNHR\n',
                     board_name='X13DEG-OAD\n')
    run = run_playbook(play({'kernel_log': 'none', 'packages': False, 'sys_path': root}), envvars=fake_nvml.env)
    assert run.rc == 0, run.stdout
    assert run.result('facts')['dmi'] == {'sys_vendor': 'Supermicro', 'product_name': 'SYS-821GE-TNHR',
                                          'board_vendor': None, 'board_name': 'X13DEG-OAD'}
    run = run_playbook(play({'kernel_log': 'none', 'packages': False, 'sys_path': str(tmp_path / 'none')}),
                       envvars=fake_nvml.env)
    assert run.result('facts')['dmi'] == {'sys_vendor': None, 'product_name': None, 'board_vendor': None,
                                          'board_name': None}
    res = run_playbook(play({'kernel_log': 'none', 'packages': False, 'sys_path': 'sys'}),
                       envvars=fake_nvml.env).result('facts')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == "sys_path='sys': expected an absolute directory path (the sysfs root, /sys)"
