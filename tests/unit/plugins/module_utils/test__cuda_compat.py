"""CUDA compatibility at the boundaries of NVIDIA's tables (domain-facts.md section 1)."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _cuda_compat as C
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _cuda_data as D


def one(toolkit, driver, ptx_jit=False, forward_compat=False, gpu_class='other'):
    return C.check_application({'name': 'app', 'toolkit': toolkit, 'ptx_jit': ptx_jit,
                                'forward_compat': forward_compat}, driver, gpu_class)


def status(*args, **kw):
    return one(*args, **kw)['status']


# ---------------------------------------------------------------- the data itself

def test_table_drivers_never_decrease_with_the_toolkit():
    rows = sorted((k, tuple(int(x) for x in v.split('.'))) for k, v in D.TOOLKIT_DRIVERS)
    assert len(rows) == len(D.TOOLKIT_DRIVERS) == len({row[0] for row in rows})
    for (ka, da), (kb, db) in zip(rows, rows[1:]):
        assert da <= db, (ka, kb)


def test_family_floors_and_upper_bounds_agree_with_the_table():
    for major, branch, floor, upper in D.FAMILIES:
        assert floor.startswith('%d.' % branch)
        drivers = [tuple(int(x) for x in v.split('.')) for k, v in D.TOOLKIT_DRIVERS if k[0] == major]
        assert tuple(int(x) for x in floor.split('.')) >= min(drivers)
        if upper is not None:
            # every toolkit of the family shipped with a driver below the upper bound: at and above it,
            # plain backward compatibility covers the whole family
            assert max(drivers) < (int(upper),)
    assert D.SOURCE.startswith('NVIDIA CUDA Toolkit 13.2 Update 2 release notes')


# ---------------------------------------------------------------- parsing

@pytest.mark.parametrize('text, parsed', [
    ('12.4', (12, 4, 0)), ('12.4.1', (12, 4, 1)), ('12.4U1', (12, 4, 1)), ('12.4 Update 1', (12, 4, 1)),
    ('13.0u2', (13, 0, 2)), (12.4, (12, 4, 0)),
])
def test_parse_toolkit(text, parsed):
    assert C.parse_toolkit(text) == parsed


def test_bad_input_names_field_and_value():
    with pytest.raises(C.CudaCompatError, match=r"applications\[0\] \(svc\).toolkit: 'twelve' is not a CUDA"):
        C.check([{'name': 'svc', 'toolkit': 'twelve'}], '580.126.20')
    with pytest.raises(C.CudaCompatError, match=r"driver: 'r580' is not an NVIDIA driver version"):
        C.check([], 'r580')
    with pytest.raises(C.CudaCompatError, match=r"gpu_class: 'gaming' is not one of datacenter"):
        C.check([], '580.126.20', gpu_class='gaming')
    with pytest.raises(C.CudaCompatError, match=r"ptx_jit: 'yes' is not a boolean"):
        C.check([{'name': 'svc', 'toolkit': '12.4', 'ptx_jit': 'yes'}], '580.126.20')
    with pytest.raises(C.CudaCompatError, match=r'unknown field\(s\) cuda'):
        C.check([{'name': 'svc', 'toolkit': '12.4', 'cuda': '12.4'}], '580.126.20')
    with pytest.raises(C.CudaCompatError, match=r"applications\[1\].name: 'svc' repeats"):
        C.check([{'name': 'svc', 'toolkit': '12.4'}, {'name': 'svc', 'toolkit': '12.2'}], '580.126.20')


@pytest.mark.parametrize('driver, cuda', [
    ('580.126.20', '13.0'), ('580.65.06', '13.0'), ('580.65.05', '12.9'), ('590.44.01', '13.1'),
    ('560.28.03', '12.6'), ('525.60.13', '12.0'), ('525.60.12', '11.8'), ('595.71.05', '13.2'),
    ('610.10', '13.2'), ('410.47', None),
])
def test_driver_cuda_version(driver, cuda):
    assert C.driver_cuda_version(driver) == cuda


# ---------------------------------------------------------------- backward compatibility

@pytest.mark.parametrize('toolkit, driver, expected', [
    ('12.4', '550.54.14', 'backward'),        # exactly the driver 12.4 shipped with
    ('12.4', '550.54.13', 'minor_version'),   # one below: 12.x minor-version floor still met
    ('12.4.1', '550.54.14', 'minor_version'),  # 12.4 Update 1 shipped with 550.54.15
    ('12.4.1', '550.54.15', 'backward'),
    ('12.9.1', '580.65.06', 'backward'),      # every 12.x toolkit on an R580 driver
    ('11.8', '525.60.13', 'backward'),
    ('10.2', '440.33', 'backward'),
    ('13.2.2', '595.71.05', 'backward'),
])
def test_backward_compatibility_boundaries(toolkit, driver, expected):
    assert status(toolkit, driver) == expected


# ---------------------------------------------------------------- minor-version compatibility

@pytest.mark.parametrize('toolkit, driver, expected', [
    ('13.2', '580.65.06', 'minor_version'),   # 13.x floor exactly
    ('13.2', '580.65.05', 'incompatible'),    # one below the 13.x floor
    ('12.8', '525.60.13', 'minor_version'),   # 12.x floor exactly
    ('12.8', '525.60.12', 'incompatible'),
    ('12.0', '525.60.12', 'incompatible'),    # 12.0 GA shipped with the floor itself
    ('11.8', '450.80.02', 'minor_version'),   # 11.x MVC needs 450.80.02, not 11.0 GA's 450.51.05
    ('11.8', '450.80.01', 'incompatible'),
    ('11.0', '450.51.05', 'backward'),
    ('11.0', '450.51.04', 'incompatible'),
    ('10.2', '440.32', 'incompatible'),       # no minor-version compatibility before CUDA 11
    ('13.0', '575.57.08', 'incompatible'),    # never across the major family
])
def test_minor_version_boundaries(toolkit, driver, expected):
    assert status(toolkit, driver) == expected


def test_minor_version_is_compatible_with_caveats():
    r = one('12.8', '535.104.05')
    assert r['compatible'] is True and r['status'] == 'minor_version'
    assert r['flags'] == ['limited_feature_set']
    assert 'cudaErrorCallRequiresNewerDriver (36)' in r['reasons'][0]
    assert r['minimum_driver'] == {'backward': '570.26', 'minor_version': '525.60.13'}


def test_ptx_from_a_newer_toolkit_is_flagged():
    r = one('12.8', '535.104.05', ptx_jit=True)
    assert r['status'] == 'incompatible' and r['compatible'] is False
    assert 'ptx_newer_than_driver' in r['flags']
    assert "JIT-compiles PTX from CUDA 12.8, newer than the driver's CUDA 12.2" in r['reasons'][1]
    assert 'cudaErrorUnsupportedPtxVersion (222)' in r['reasons'][1]
    # same minor release, older update: the PTX ISA is the driver's own, no flag
    r = one('12.6.3', '560.28.03', ptx_jit=True)
    assert r['status'] == 'minor_version' and 'ptx_newer_than_driver' not in r['flags']
    # backward-compatible: the driver's JIT knows the PTX
    assert one('12.2', '580.126.20', ptx_jit=True)['status'] == 'backward'


# ---------------------------------------------------------------- forward compatibility

def test_forward_compat_only_on_datacenter_gpus():
    r = one('13.0', '570.172.08', forward_compat=True, gpu_class='datacenter')
    assert r['status'] == 'forward' and r['compatible'] is True
    assert 'cuda-compat-13-0' in r['reasons'][0]
    r = one('13.0', '570.172.08', forward_compat=True, gpu_class='other')
    assert r['status'] == 'incompatible'
    assert 'supported only on NVIDIA data-center GPUs' in r['reasons'][0]
    r = one('13.0', '570.172.08')
    assert r['status'] == 'incompatible'
    assert 'needs >= 580.65.06 (backward); >= 580.65.06 (CUDA 13.x minor-version floor)' in r['reasons'][0]
    assert 'cuda-compat-13-0' in r['reasons'][0]
    assert one('12.4', '470.82.01', forward_compat=True, gpu_class='jetson')['status'] == 'forward'


# ---------------------------------------------------------------- releases outside the table

def test_toolkit_update_not_in_table_is_judged_conservatively():
    # 12.9 Update 2 is not in the table: backward compatibility is proved by 13.0 GA's driver only
    r = one('12.9.2', '575.57.08')
    assert r['status'] == 'minor_version' and 'toolkit_not_in_table' in r['flags']
    assert one('12.9.2', '580.65.06')['status'] == 'backward'


def test_toolkit_newer_than_the_table():
    r = one('13.3', '595.71.05')
    assert r['status'] == 'minor_version' and 'toolkit_not_in_table' in r['flags']
    r = one('14.0', '595.71.05')
    assert r['status'] == 'incompatible' and 'family_not_in_table' in r['flags']


def test_check_summarises_the_fleet():
    res = C.check([
        {'name': 'triton', 'toolkit': '12.8', 'ptx_jit': False},
        {'name': 'trainer', 'toolkit': '13.1', 'ptx_jit': True},
        {'name': 'legacy', 'toolkit': '11.8'},
        {'name': 'next', 'toolkit': '13.2', 'ptx_jit': False},
    ], '580.126.20', gpu_class='datacenter')
    assert res['driver_cuda'] == '13.0'
    assert [a['status'] for a in res['applications']] == ['backward', 'incompatible', 'backward', 'minor_version']
    assert res['passed'] is False
    assert res['incompatible'] == ['trainer'] and res['flagged'] == ['trainer']
    assert res['minor_version'] == ['next']
    assert C.check([{'name': 'triton', 'toolkit': '12.8'}], '580.126.20')['passed'] is True


def test_minimum_drivers():
    assert C.minimum_drivers('12.4') == {'toolkit': '12.4', 'backward': '550.54.14', 'backward_known': True,
                                         'minor_version': '525.60.13', 'family_branch': 525}
    assert C.minimum_drivers('10.1')['minor_version'] is None
