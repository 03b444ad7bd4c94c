"""gpu_info facts over the REAL nvidia-ml-py binding and the stand-in libnvidia-ml.so.1.

pynvml loads `libnvidia-ml.so.1` by name, found through LD_LIBRARY_PATH, which the dynamic
loader reads when a process starts: every case runs the collection in a fresh Python process
started with the stand-in's environment.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost, _nvml

H100 = '10de:2330/10de:16c1'
L40S = '10de:26b9/10de:1851'

SCRIPT = r'''
import json, sys
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _nvml
args = json.loads(sys.argv[1])
try:
    facts = _nvml.collect_facts(**args)
except _nvml.BackendError as e:
    facts = {'raised': type(e).__name__, 'msg': str(e)}
print(json.dumps(facts))
'''


def child_env(fake_nvml) -> dict:
    """The stand-in's environment plus the collection on the child's import path."""
    env = dict(os.environ, **fake_nvml.env)
    env['PYTHONPATH'] = os.pathsep.join(p for p in (os.environ['ANSIBLE_COLLECTIONS_PATH'], os.environ.get('PYTHONPATH')) if p)
    return env


def collect(fake_nvml, state, tmp_path, **kwargs):
    fake_nvml.write(state)
    modules = tmp_path / 'modules'
    if not modules.exists():
        modules.write_text('')
    args = {'backend': 'nvml', 'kernel_log': None, 'packages': False, 'proc_modules': str(modules)}
    args.update(kwargs)
    proc = subprocess.run([sys.executable, '-c', SCRIPT, json.dumps(args)], env=child_env(fake_nvml),
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def gpu(index, **over):
    g = _gpuhost.empty_gpu(index)
    g.update(over)
    return g


TWO_H100_MIG = {
    'driver_version': '580.126.20', 'cuda_version': 13000,
    'gpus': [
        {'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-4c6f3a2e-0d7f-4c39-9a51-1f7a3d2b9c01',
         'bus_id': '00000000:17:00.0', 'pci': H100, 'mig': (1, 1), 'ecc_mode': (1, 1),
         'ecc': {'uncorrected_volatile': 0, 'uncorrected_aggregate': 2, 'corrected_volatile': 5,
                 'corrected_aggregate': 130},
         'retired_pages_pending': 0, 'remapped_rows': (3, 1, 1, 0), 'temperature': 34},
        {'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-9b1e6d4c-2a8f-4e1d-8c3b-6e5f7a9d0b12',
         'bus_id': '00000000:2A:00.0', 'pci': H100, 'mig': (0, 0), 'ecc_mode': (1, 1),
         'ecc': {'uncorrected_volatile': 0, 'uncorrected_aggregate': 0, 'corrected_volatile': 0,
                 'corrected_aggregate': 0},
         'retired_pages_pending': 1, 'remapped_rows': (0, 0, 0, 0), 'temperature': 41,
         'processes': [{'pid': 4242, 'used_bytes': 80 * 1024 ** 3 - 1, 'name': 'python3 serve.py'},
                       {'pid': 5151, 'used_bytes': 512 * 1024 ** 2}]},
    ],
}


def test_two_h100_mig_on_one_exactly(fake_nvml, tmp_path):
    facts = collect(fake_nvml, TWO_H100_MIG, tmp_path)
    assert facts['backend'] == 'nvml'
    assert facts['driver_version'] == '580.126.20'
    assert facts['cuda_driver_version'] == '13.0'
    assert facts['kernel'] == os.uname().release
    assert facts['pci_ids'] == [H100]
    assert facts['errors'] == {}
    assert facts['gpus'] == [
        gpu(0, uuid='GPU-4c6f3a2e-0d7f-4c39-9a51-1f7a3d2b9c01', name='NVIDIA H100 80GB HBM3',
            bus_id='00000000:17:00.0', pci_id=H100, mig_mode={'current': True, 'pending': True},
            ecc={'enabled': True, 'volatile_uncorrected': 0, 'aggregate_uncorrected': 2,
                 'volatile_corrected': 5, 'aggregate_corrected': 130},
            retired_pages_pending=False,
            remapped_rows={'correctable': 3, 'uncorrectable': 1, 'pending': True, 'failure': False},
            temperature_c=34),
        gpu(1, uuid='GPU-9b1e6d4c-2a8f-4e1d-8c3b-6e5f7a9d0b12', name='NVIDIA H100 80GB HBM3',
            bus_id='00000000:2A:00.0', pci_id=H100, mig_mode={'current': False, 'pending': False},
            ecc={'enabled': True, 'volatile_uncorrected': 0, 'aggregate_uncorrected': 0,
                 'volatile_corrected': 0, 'aggregate_corrected': 0},
            retired_pages_pending=True,
            remapped_rows={'correctable': 0, 'uncorrectable': 0, 'pending': False, 'failure': False},
            temperature_c=41,
            processes=[{'pid': 4242, 'name': 'python3 serve.py', 'used_memory_mib': 81919},
                       {'pid': 5151, 'name': None, 'used_memory_mib': 512}]),
    ]


def test_unsupported_calls_are_per_field_errors(fake_nvml, tmp_path):
    state = {'driver_version': '535.274.02', 'cuda_version': 12020,
             'fail': {'nvmlSystemGetCudaDriverVersion': 'NOT_SUPPORTED'},
             'gpus': [{'name': 'NVIDIA L40S', 'uuid': 'GPU-l40s', 'bus_id': '00000000:C1:00.0', 'pci': L40S,
                       'ecc_mode': (0, 0), 'temperature': 29,
                       'fail': {'nvmlDeviceGetMigMode': 'NOT_SUPPORTED',
                                'nvmlDeviceGetRemappedRows': 'NOT_SUPPORTED',
                                'nvmlDeviceGetRetiredPagesPendingStatus': 'NO_PERMISSION'}}]}
    facts = collect(fake_nvml, state, tmp_path)
    assert facts['cuda_driver_version'] is None
    assert facts['errors'] == {'cuda_driver_version': 'Not Supported'}
    assert facts['gpus'] == [gpu(
        0, uuid='GPU-l40s', name='NVIDIA L40S', bus_id='00000000:C1:00.0', pci_id=L40S,
        ecc={'enabled': False, 'volatile_uncorrected': None, 'aggregate_uncorrected': None,
             'volatile_corrected': None, 'aggregate_corrected': None},
        temperature_c=29,
        errors={'mig_mode': 'Not Supported', 'remapped_rows': 'Not Supported',
                'retired_pages_pending': 'Insufficient Permissions'})]


def test_gpu_lost_does_not_hide_the_healthy_gpu(fake_nvml, tmp_path):
    state = {'driver_version': '580.126.20', 'cuda_version': 13000, 'gpus': [
        {'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-ok', 'bus_id': '00000000:17:00.0', 'pci': H100,
         'ecc_mode': (1, 1), 'temperature': 33, 'fail': {'nvmlDeviceGetTemperature': 'GPU_IS_LOST'}},
        {'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-lost', 'bus_id': '00000000:2A:00.0', 'pci': H100,
         'fail': {'*': 'GPU_IS_LOST'}},
    ]}
    facts = collect(fake_nvml, state, tmp_path)
    first, second = facts['gpus']
    assert first['uuid'] == 'GPU-ok' and first['pci_id'] == H100
    assert first['temperature_c'] is None
    assert first['errors'] == {'temperature_c': 'GPU is lost'}
    assert second == gpu(1, errors={'handle': 'GPU is lost'})
    assert facts['pci_ids'] == [H100]


def test_many_processes_two_call_protocol_and_unknown_memory(fake_nvml, tmp_path):
    procs = [{'pid': 1000 + i, 'used_bytes': (i + 1) * 1024 ** 2, 'name': 'worker-%d' % i} for i in range(9)]
    procs.append({'pid': 2000, 'used_bytes': None, 'name': 'wddm-like'})
    state = {'driver_version': '580.126.20', 'cuda_version': 12090,
             'gpus': [{'name': 'NVIDIA H100 80GB HBM3', 'pci': H100, 'processes': procs}]}
    facts = collect(fake_nvml, state, tmp_path)
    assert facts['cuda_driver_version'] == '12.9'
    assert facts['gpus'][0]['processes'] == (
        [{'pid': 1000 + i, 'name': 'worker-%d' % i, 'used_memory_mib': i + 1} for i in range(9)]
        + [{'pid': 2000, 'name': 'wddm-like', 'used_memory_mib': None}])


def test_process_listing_failure_is_a_field_error(fake_nvml, tmp_path):
    state = {'driver_version': '580.126.20', 'cuda_version': 13000,
             'gpus': [{'pci': H100, 'fail': {'nvmlDeviceGetComputeRunningProcesses_v3': 'NO_PERMISSION'}}]}
    g = collect(fake_nvml, state, tmp_path)['gpus'][0]
    assert g['processes'] == []
    assert g['errors'] == {'processes': 'Insufficient Permissions'}


def test_older_driver_without_v3_process_call_falls_back_to_v2(fake_nvml, tmp_path):
    state = {'driver_version': '470.256.02', 'cuda_version': 11040,
             'gpus': [{'pci': '10de:1db6/10de:124a', 'processes': [{'pid': 77, 'used_bytes': 3 * 1024 ** 2, 'name': 'a'}],
                       'fail': {'nvmlDeviceGetComputeRunningProcesses_v3': 'FUNCTION_NOT_FOUND'}}]}
    g = collect(fake_nvml, state, tmp_path)['gpus'][0]
    assert g['processes'] == [{'pid': 77, 'name': 'a', 'used_memory_mib': 3}]
    assert g['errors'] == {}


def test_driver_not_loaded_raises_or_reports(fake_nvml, tmp_path):
    state = {'init_error': 'DRIVER_NOT_LOADED'}
    assert collect(fake_nvml, state, tmp_path) == {
        'raised': 'BackendError', 'msg': 'NVML could not be initialised: Driver Not Loaded'}
    modules = tmp_path / 'modules'
    modules.write_text('nvidia_fs 270336 0 - Live 0x0000000000000000 (OE)\n'
                       'ext4 1097728 1 - Live 0x0000000000000000\n')
    facts = collect(fake_nvml, state, tmp_path, require_driver=False)
    assert facts['gpus'] == [] and facts['driver_version'] is None
    assert facts['errors'] == {'backend': 'NVML could not be initialised: Driver Not Loaded'}
    assert facts['modules'] == [{'name': 'nvidia_fs', 'refcount': 0, 'used_by': []}]


def test_xid_events_are_matched_to_gpus(fake_nvml, tmp_path):
    log = tmp_path / 'kern.log'
    log.write_text(
        "2026-08-10T14:03:22.123456+00:00 gpu-node-7 kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.\n"
        "2026-08-10T10:00:00.000000+00:00 gpu-node-7 kernel: NVRM: Xid (PCI:0000:17:00): 13, old event\n"
        "2026-08-10T14:05:00.000000+00:00 gpu-node-7 kernel: NVRM: Xid (PCI:0000:99:00): 200, unknown code\n")
    facts = collect(fake_nvml, TWO_H100_MIG, tmp_path, kernel_log=str(log), xid_since='2026-08-10T12:00:00Z')
    assert [(e['code'], e['gpu_index'], e['severity'], e['time']) for e in facts['xid_events']] == [
        (79, 1, 'critical', '2026-08-10T14:03:22.123456Z'),
        (200, None, 'unknown', '2026-08-10T14:05:00Z'),
    ]


def test_stand_in_delivers_xid_events_through_the_binding(fake_nvml):
    fake_nvml.write({'driver_version': '580.126.20', 'cuda_version': 13000,
                     'gpus': [{'pci': H100, 'xids': [79, 48]}, {'pci': H100}]})
    script = r'''
import pynvml as n
n.nvmlInit()
es = n.nvmlEventSetCreate()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    if n.nvmlDeviceGetSupportedEventTypes(h) & n.nvmlEventTypeXidCriticalError:
        n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
got = []
while True:
    try:
        d = n.nvmlEventSetWait_v2(es, 1000)
    except n.NVMLError_Timeout:
        break
    got.append((d.eventType, d.eventData, n.nvmlDeviceGetIndex(d.device)))
n.nvmlEventSetFree(es)
n.nvmlShutdown()
print(got)
'''
    proc = subprocess.run([sys.executable, '-c', script], env=dict(os.environ, **fake_nvml.env),
                          capture_output=True, text=True, check=True, timeout=60)
    assert proc.stdout.strip() == '[(8, 79, 0), (8, 48, 0)]'


def test_malformed_state_fails_init_with_the_line(fake_nvml, tmp_path):
    fake_nvml.state_path.write_text('driver_version 1\ngpu\nbogus 1\n')
    proc = subprocess.run([sys.executable, '-c', 'import pynvml as n\ntry:\n n.nvmlInit()\nexcept n.NVMLError as e:\n print(e)'],
                          env=dict(os.environ, **fake_nvml.env), capture_output=True, text=True, check=True, timeout=60)
    assert proc.stdout.strip() == 'Unknown Error'
    assert "nvml.state:3: unknown or malformed GPU key: bogus 1" in proc.stderr


@pytest.mark.parametrize('device, sub, expected', [
    (0x233010de, 0x16c110de, '10de:2330/10de:16c1'),
    (0x1db610de, 0x124a10de, '10de:1db6/10de:124a'),
])
def test_pci_id_format(device, sub, expected):
    assert _nvml.pci_id(device, sub) == expected


@pytest.mark.parametrize('value, text', [(12040, '12.4'), (13000, '13.0'), (11080, '11.8'), (None, None)])
def test_cuda_version_text(value, text):
    assert _nvml.cuda_version_text(value) == text


def test_pci_ids_are_in_the_gate_format():
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _pci
    value = _nvml.pci_id(0x233010de, 0x16c110de)
    assert _pci.normalize(value) == value
