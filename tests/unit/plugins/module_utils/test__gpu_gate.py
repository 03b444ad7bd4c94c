"""Unit tests of the GPU gate over gpu_info fact dicts (CONTRACTS.md shape)."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpu_gate as gg

PCI = '10de:2330/10de:16c1'


def gpu(index: int, **kw: Any) -> dict[str, Any]:
    g = {'index': index, 'uuid': 'GPU-%d' % index, 'name': 'NVIDIA H100 80GB HBM3',
         'bus_id': '00000000:%02X:00.0' % (0x17 + index), 'pci_id': PCI,
         'mig_mode': {'current': False, 'pending': False},
         'ecc': {'enabled': True, 'volatile_uncorrected': 0, 'aggregate_uncorrected': 2,
                 'volatile_corrected': 5, 'aggregate_corrected': 40},
         'retired_pages_pending': False,
         'remapped_rows': {'correctable': 0, 'uncorrectable': 1, 'pending': False, 'failure': False},
         'temperature_c': 41, 'processes': [], 'errors': {}}
    g.update(kw)
    return g


def facts(driver: str = '580.126.20', gpus: list[dict[str, Any]] | None = None,
          xids: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    gpus = gpus if gpus is not None else [gpu(0), gpu(1)]
    return {'backend': 'nvml', 'driver_version': driver, 'cuda_driver_version': '13.0', 'kernel': '6.8.0-134-generic',
            'modules': [], 'pci_ids': sorted({g['pci_id'] for g in gpus}), 'gpus': gpus,
            'xid_events': xids or [], 'packages': []}


def xid(code: int, severity: str, time: str = '2026-07-14T12:00:00Z') -> dict[str, Any]:
    return {'time': time, 'pci': '0000:17:00', 'code': code, 'mnemonic': 'M%d' % code, 'severity': severity,
            'raw': 'NVRM: Xid (PCI:0000:17:00): %d, ...' % code}


OLD_XID = xid(13, 'medium', '2026-07-01T00:00:00Z')
BASE = facts(xids=[OLD_XID])


def after(**kw: Any) -> dict[str, Any]:
    f = facts(driver='580.130.00', xids=[OLD_XID])
    f.update(kw)
    return f


def test_clean_upgrade_passes() -> None:
    v = gg.evaluate(after(), BASE, '580.130.00')
    assert v['passed'] is True, v['problems']
    assert v['msg'] == 'GPU gate: PASS (driver 580.130.00, 2 GPU(s))'
    assert set(v['checks']) == set(gg.CHECKS)
    assert v['checks']['ecc']['evidence']['gpus'][0]['aggregate_delta'] == 0
    assert v['checks']['xid']['evidence']['new_events'] == []


def test_driver_must_equal_target() -> None:
    v = gg.evaluate(facts(), BASE, '580.130.00')
    assert v['problems'] == ['driver: loaded 580.126.20, target 580.130.00']
    v = gg.evaluate(after(driver_version=None), BASE, '580.130.00')
    assert v['problems'] == ['driver: the loaded driver version is unknown (is the nvidia module loaded?); '
                             'target 580.130.00']


def test_pci_identity_set_change() -> None:
    other = gpu(1, pci_id='10de:2331/10de:1626')
    v = gg.evaluate(after(gpus=[gpu(0), other], pci_ids=[PCI, '10de:2331/10de:1626']), BASE, '580.130.00')
    assert v['problems'] == [
        'pci_identity: PCI id set changed since the baseline (missing: none; new: 10de:2331/10de:1626)',
        'pci_identity: GPU at 00000000:18:00.0 changed from 10de:2330/10de:16c1 to 10de:2331/10de:1626']


def test_gpu_fallen_off_the_bus_with_identical_ids() -> None:
    v = gg.evaluate(after(gpus=[gpu(0)]), BASE, '580.130.00')
    assert v['passed'] is False
    assert v['checks']['pci_identity']['problems'] == [
        'pci_identity: GPU at 00000000:18:00.0 (10de:2330/10de:16c1) is missing since the baseline']
    assert v['checks']['pci_identity']['evidence']['pci_ids'] == [PCI]


def test_case_and_spacing_of_pci_ids_do_not_matter() -> None:
    v = gg.evaluate(after(pci_ids=[' 10DE:2330/10DE:16C1 ']), BASE, '580.130.00')
    assert v['passed'] is True, v['problems']


@pytest.mark.parametrize('threshold,severity,fails', [
    ('medium', 'medium', True), ('medium', 'low', False), ('high', 'medium', False), ('high', 'critical', True),
    ('critical', 'high', False), ('high', 'unknown', True), ('critical', 'unknown', False), ('low', 'low', True),
])
def test_new_xid_against_the_threshold(threshold: str, severity: str, fails: bool) -> None:
    new = xid(79, severity)
    v = gg.evaluate(after(xid_events=[OLD_XID, new]), BASE, '580.130.00', xid_severity_threshold=threshold)
    assert v['passed'] is not fails
    ev = v['checks']['xid']['evidence']
    assert ev['new_events'] == [new] and ev['failing'] == int(fails) and ev['tolerated'] == int(not fails)
    if fails:
        assert v['problems'] == ['xid: new Xid 79 (M79, severity %s) on 0000:17:00 at 2026-07-14T12:00:00Z' % severity]


def test_xid_in_the_baseline_is_not_new() -> None:
    v = gg.evaluate(after(xid_events=[OLD_XID]), facts(xids=[OLD_XID]), '580.130.00', xid_severity_threshold='low')
    assert v['passed'] is True


def test_uncorrected_ecc_delta() -> None:
    grown = gpu(1, ecc=dict(gpu(1)['ecc'], aggregate_uncorrected=5))
    v = gg.evaluate(after(gpus=[gpu(0), grown]), BASE, '580.130.00')
    assert v['problems'] == ['ecc: GPU 1 (00000000:18:00.0) uncorrected ECC errors grew by 3 since the baseline']


def test_volatile_reset_is_not_growth_but_new_volatile_errors_are() -> None:
    base = facts(gpus=[gpu(0, ecc=dict(gpu(0)['ecc'], volatile_uncorrected=4, aggregate_uncorrected=None))],
                 xids=[OLD_XID])
    reset = gpu(0, ecc=dict(gpu(0)['ecc'], volatile_uncorrected=0, aggregate_uncorrected=None))
    assert gg.evaluate(after(gpus=[reset]), base, '580.130.00')['passed'] is True
    newer = gpu(0, ecc=dict(gpu(0)['ecc'], volatile_uncorrected=2, aggregate_uncorrected=None))
    v = gg.evaluate(after(gpus=[newer]), base, '580.130.00')
    assert v['problems'] == ['ecc: GPU 0 (00000000:17:00.0) uncorrected ECC errors grew by 2 since the baseline']


def test_ecc_unreadable_fails_and_disabled_is_noted() -> None:
    blind = gpu(0, ecc={'enabled': True, 'volatile_uncorrected': None, 'aggregate_uncorrected': None})
    v = gg.evaluate(after(gpus=[blind]), facts(gpus=[gpu(0)], xids=[OLD_XID]), '580.130.00')
    assert v['problems'] == ['ecc: GPU 0 (00000000:17:00.0) uncorrected ECC count unavailable, so the delta cannot '
                             'be shown to be 0']
    off = gpu(0, ecc={'enabled': False, 'volatile_uncorrected': None, 'aggregate_uncorrected': None})
    v = gg.evaluate(after(gpus=[off]), facts(gpus=[gpu(0)], xids=[OLD_XID]), '580.130.00')
    assert v['passed'] is True
    assert v['checks']['ecc']['evidence']['gpus'][0]['note'] == 'ECC disabled'


def test_row_remap_failure_pending_and_retired_pages() -> None:
    bad = gpu(0, remapped_rows={'correctable': 0, 'uncorrectable': 3, 'pending': True, 'failure': True},
              retired_pages_pending=True)
    v = gg.evaluate(after(gpus=[bad, gpu(1)]), BASE, '580.130.00')
    assert v['checks']['row_remap']['problems'] == [
        'row_remap: GPU 0 (00000000:17:00.0) reports a row-remapping failure',
        'row_remap: GPU 0 (00000000:17:00.0) has a row remap pending (GPU reset required)',
        'row_remap: GPU 0 (00000000:17:00.0) has retired pages pending (GPU reset required)']
    pre_ampere = gpu(0, remapped_rows=None)
    assert gg.evaluate(after(gpus=[pre_ampere, gpu(1)]), BASE, '580.130.00')['passed'] is True


def test_temperature_limit_is_strict_and_unknown_fails() -> None:
    v = gg.evaluate(after(gpus=[gpu(0, temperature_c=85), gpu(1, temperature_c=None)]), BASE, '580.130.00')
    assert v['checks']['temperature']['problems'] == [
        'temperature: GPU 0 (00000000:17:00.0) at 85 C, limit 85.0 C',
        'temperature: GPU 1 (00000000:18:00.0) temperature unavailable']
    assert gg.evaluate(after(gpus=[gpu(0, temperature_c=84), gpu(1)]), BASE, '580.130.00')['passed'] is True


def test_every_problem_is_collected() -> None:
    broken = gpu(0, temperature_c=99, remapped_rows={'correctable': 0, 'uncorrectable': 0, 'pending': False,
                                                     'failure': True})
    v = gg.evaluate(facts(gpus=[broken], xids=[OLD_XID, xid(48, 'critical')]), BASE, '580.130.00')
    failed = [name for name, c in v['checks'].items() if c['passed'] is False]
    assert failed == ['driver', 'pci_identity', 'xid', 'row_remap', 'temperature']
    assert v['msg'].startswith('GPU gate: FAIL: driver: loaded 580.126.20, target 580.130.00; ')


def test_skip_is_recorded() -> None:
    v = gg.evaluate(facts(), BASE, '580.130.00', skip=['driver'])
    assert v['passed'] is True
    assert v['checks']['driver'] == {'passed': None, 'skipped': True, 'problems': [], 'evidence': {}}


def test_no_gpu_is_a_failure() -> None:
    v = gg.evaluate(after(gpus=[], pci_ids=[]), BASE, '580.130.00')
    assert 'no GPU in the facts: nothing to judge' in v['problems']


@pytest.mark.parametrize('args,message', [
    (('x', BASE, '1'), r"^facts: 'x' is not a dict"),
    ((BASE, None, '1'), r'^baseline: None is not a dict'),
    ((BASE, BASE, ' '), r"^target_driver: ' ' must be a non-blank string"),
])
def test_bad_input(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(gg.GpuGateError, match=message):
        gg.evaluate(*args)


def test_bad_options() -> None:
    with pytest.raises(gg.GpuGateError, match=r"xid_severity_threshold: 'severe' is not one of"):
        gg.evaluate(BASE, BASE, '1', xid_severity_threshold='severe')
    with pytest.raises(gg.GpuGateError, match=r"skip: 'fans' not one of"):
        gg.evaluate(BASE, BASE, '1', skip=['fans'])
    with pytest.raises(gg.GpuGateError, match=r'temperature_max: 0 must be a number between 0 and 150'):
        gg.evaluate(BASE, BASE, '1', temperature_max=0)
    with pytest.raises(gg.GpuGateError, match=r"facts.gpus: 'x' is not a list of dicts"):
        gg.evaluate(dict(BASE, gpus='x'), BASE, '1')


def test_input_is_not_mutated() -> None:
    f, b = after(), copy.deepcopy(BASE)
    snap = copy.deepcopy((f, b))
    gg.evaluate(f, b, '580.130.00')
    assert (f, b) == snap


def params(**kw: Any) -> dict[str, Any]:
    p = {k: v.get('default') for k, v in gg.ARGUMENT_SPEC.items()}
    p.update(baseline=BASE, target_driver='580.130.00', **kw)
    return p


def test_judge_is_the_module_result_passed_failed_or_bad_input() -> None:
    good = gg.judge(after(), params(facts=after()))
    assert good['passed'] is True and good['changed'] is False and 'failed' not in good and 'facts' not in good
    assert good['msg'] == 'GPU gate: PASS (driver 580.130.00, 2 GPU(s))'
    old = facts(xids=[OLD_XID])
    bad = gg.judge(old, params(facts=None))       # facts the module read itself are returned with the verdict
    assert bad['failed'] is True and bad['passed'] is False and bad['facts'] is old
    assert bad['msg'] == 'GPU gate: FAIL: driver: loaded 580.126.20, target 580.130.00'
    invalid = gg.judge(['not', 'facts'], params(facts=['not', 'facts']))
    assert invalid == {'failed': True, 'changed': False, 'passed': False,
                       'msg': "GPU gate: invalid input: facts: ['not', 'facts'] is not a dict (gpu_info facts)",
                       'problems': ["facts: ['not', 'facts'] is not a dict (gpu_info facts)"]}


def test_argument_spec_choices_are_the_checks_severities_and_nvml_backends() -> None:
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _nvml
    assert gg.ARGUMENT_SPEC['backend']['choices'] == list(_nvml.BACKENDS)
    assert gg.ARGUMENT_SPEC['skip']['choices'] == list(gg.CHECKS)
    assert gg.ARGUMENT_SPEC['xid_severity_threshold']['choices'] == ['low', 'medium', 'high', 'critical']
