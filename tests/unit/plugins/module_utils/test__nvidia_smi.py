"""The nvidia-smi -q -x fallback on recorded XML (R580 H100 schema and R470 V100 schema)."""
from __future__ import annotations

import pathlib

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost, _nvidia_smi, _nvml
from tools.recorded_runner import RecordedRunner

FIX = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'nvidia_smi'
_NONE = _nvml.NO_BINDING  # behave as if nvidia-ml-py were not installed


def gpu(index, **over):
    g = _gpuhost.empty_gpu(index)
    g.update(over)
    return g


def test_r580_h100_pair_new_ecc_schema_mig_and_processes():
    out = _nvidia_smi.parse_xml((FIX / 'h100x2_r580.xml').read_text())
    assert out['driver_version'] == '580.126.20'
    assert out['cuda_driver_version'] == '13.0'
    assert out['gpus'] == [
        gpu(0, uuid='GPU-4c6f3a2e-0d7f-4c39-9a51-1f7a3d2b9c01', name='NVIDIA H100 80GB HBM3',
            bus_id='00000000:17:00.0', pci_id='10de:2330/10de:16c1', mig_mode={'current': True, 'pending': True},
            # volatile: dram 5 corrected; aggregate: sram 12 + dram 118 corrected, dram 2 uncorrected
            ecc={'enabled': True, 'volatile_uncorrected': 0, 'aggregate_uncorrected': 2,
                 'volatile_corrected': 5, 'aggregate_corrected': 130},
            retired_pages_pending=False,
            remapped_rows={'correctable': 3, 'uncorrectable': 1, 'pending': True, 'failure': False},
            temperature_c=34,
            processes=[{'pid': 7001, 'name': '/usr/bin/python3', 'used_memory_mib': 19}]),
        gpu(1, uuid='GPU-9b1e6d4c-2a8f-4e1d-8c3b-6e5f7a9d0b12', name='NVIDIA H100 80GB HBM3',
            bus_id='00000000:2A:00.0', pci_id='10de:2330/10de:16c1', mig_mode={'current': False, 'pending': False},
            ecc={'enabled': True, 'volatile_uncorrected': 0, 'aggregate_uncorrected': 0,
                 'volatile_corrected': 0, 'aggregate_corrected': 0},
            retired_pages_pending=True,
            remapped_rows={'correctable': 0, 'uncorrectable': 0, 'pending': False, 'failure': False},
            temperature_c=41,
            # the graphics-only Xorg process (type G) is not a compute process; C+G is
            processes=[{'pid': 4242, 'name': 'python3 serve.py', 'used_memory_mib': 81919},
                       {'pid': 6161, 'name': '/opt/app/bin/render', 'used_memory_mib': 512}]),
    ]


def test_r470_v100_old_ecc_schema_and_error_values():
    out = _nvidia_smi.parse_xml((FIX / 'v100x2_r470.xml').read_text())
    assert (out['driver_version'], out['cuda_driver_version']) == ('470.256.02', '11.4')
    first, second = out['gpus']
    assert first == gpu(
        0, uuid='GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6', name='Tesla V100-PCIE-32GB', bus_id='00000000:3B:00.0',
        pci_id='10de:1db6/10de:124a',
        ecc={'enabled': True, 'volatile_uncorrected': 0, 'aggregate_uncorrected': 1,
             'volatile_corrected': 3, 'aggregate_corrected': 42},
        retired_pages_pending=True, temperature_c=36,
        processes=[{'pid': 3141, 'name': '/usr/bin/python3', 'used_memory_mib': 1024}])
    assert second['pci_id'] == '10de:1db6/10de:124a'
    assert second['temperature_c'] is None
    assert second['ecc']['enabled'] is None
    assert second['errors'] == {'temperature_c': 'Unknown Error', 'ecc': 'GPU requires reset'}
    assert second['mig_mode'] == {'current': None, 'pending': None}
    assert second['remapped_rows'] is None


@pytest.mark.parametrize('text, message', [
    ('<nvidia_smi_log><gpu>', 'nvidia-smi -q -x gave XML that does not parse'),
    ('<html/>', 'nvidia-smi -q -x gave <html>, expected <nvidia_smi_log>'),
])
def test_bad_xml_is_a_clear_error(text, message):
    with pytest.raises(_nvidia_smi.SmiError, match=message):
        _nvidia_smi.parse_xml(text)


def test_collect_runs_nvidia_smi_bounded():
    xml = (FIX / 'h100x2_r580.xml').read_text()
    runner = RecordedRunner([{'argv': ['nvidia-smi', '-q', '-x'], 'out': xml}], programs={'nvidia-smi'})
    assert [g['uuid'] for g in _nvidia_smi.collect(runner)['gpus']] == [
        'GPU-4c6f3a2e-0d7f-4c39-9a51-1f7a3d2b9c01', 'GPU-9b1e6d4c-2a8f-4e1d-8c3b-6e5f7a9d0b12']
    runner.assert_done()


def test_collect_reports_nvidia_smi_failure_text():
    runner = RecordedRunner([{'argv': ['nvidia-smi', '-q', '-x'], 'rc': 9,
                              'out': "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                                     "Make sure that the latest NVIDIA driver is installed and running.\n\n"}])
    with pytest.raises(_gpuhost.BackendError) as err:
        _nvidia_smi.collect(runner)
    assert str(err.value) == ("nvidia-smi -q -x failed (rc 9): NVIDIA-SMI has failed because it couldn't communicate "
                              "with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.")


def test_collect_facts_falls_back_to_nvidia_smi_without_the_binding(tmp_path):
    xml = (FIX / 'v100x2_r470.xml').read_text()
    modules = tmp_path / 'modules'
    modules.write_text('nvidia_uvm 1531904 0 - Live 0x0000000000000000 (POE)\n'
                       'nvidia 39067648 1 nvidia_uvm, Live 0x0000000000000000 (POE)\n')
    runner = RecordedRunner([{'argv': ['nvidia-smi', '-q', '-x'], 'out': xml}], programs={'nvidia-smi'})
    facts = _nvml.collect_facts(backend='auto', runner=runner, kernel_log=None, packages=False,
                                proc_modules=str(modules), nvml=_NONE)
    assert facts['backend'] == 'nvidia-smi'
    assert facts['pci_ids'] == ['10de:1db6/10de:124a']
    assert facts['modules'] == [{'name': 'nvidia_uvm', 'refcount': 0, 'used_by': []},
                                {'name': 'nvidia', 'refcount': 1, 'used_by': ['nvidia_uvm']}]
    runner.assert_done()


def test_neither_backend_is_a_missing_backend_error():
    with pytest.raises(_nvml.MissingBackend, match='neither the nvidia-ml-py Python binding .* nor nvidia-smi'):
        _nvml.collect_facts(runner=RecordedRunner([]), kernel_log=None, packages=False, nvml=_NONE)
    with pytest.raises(_nvml.MissingBackend, match='backend=nvidia-smi: nvidia-smi is not on this host'):
        _nvml.collect_facts(backend='nvidia-smi', runner=RecordedRunner([]), kernel_log=None, nvml=_NONE)
    with pytest.raises(_nvml.MissingBackend, match=r'backend=nvml: the nvidia-ml-py Python binding \(import pynvml\) is not installed'):
        _nvml.collect_facts(backend='nvml', runner=RecordedRunner([], programs={'nvidia-smi'}), kernel_log=None, nvml=_NONE)
