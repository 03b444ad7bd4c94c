"""upgrade_plan's main(): the source_drift option (issue 39 item 4) - drift refused by default with the nodes of each
source tuple named, split on request, a bad value refused by the argument spec (tests/integration/test_upgrade_plan.py
runs the module through ansible-playbook)."""
from __future__ import annotations

from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.upgrade.plugins.modules import upgrade_plan
from tools.module_exit import ModuleExit, capture_module_exits

H100 = '10de:2330/10de:16c1'
CURRENT = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '570.172.08',
           'gpu_operator': 'v26.3.3', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}
TARGET = dict(CURRENT, driver='580.126.20', gpu_operator='v26.3.4')


def nodes_with_kernel_drift() -> list[dict[str, Any]]:
    out = []
    for i in range(1, 5):
        kernel = '6.8.0-134-generic' if i <= 2 else '6.8.0-131-generic'
        out.append({'name': 'gpu-%02d' % i, 'pci_ids': [H100], 'platform': 'SYS-821GE', 'kernel': kernel,
                    'partition_mode': 'none', 'install_method': 'apt', 'current': dict(CURRENT, kernel=kernel),
                    'ready': True, 'unschedulable': False, 'gpus': 8})
    return out


def run_main(monkeypatch, **args: Any) -> dict[str, Any]:
    capture_module_exits(monkeypatch)
    with patch_module_args(dict({'nodes': nodes_with_kernel_drift(), 'target': TARGET, 'max_unavailable': 2}, **args)):
        with pytest.raises(ModuleExit) as exc:
            upgrade_plan.main()
    return exc.value.result


def test_kernel_drift_is_refused_by_default_naming_the_nodes(monkeypatch) -> None:
    result = run_main(monkeypatch)
    assert result['failed']
    assert 'source-tuple drift in combination pci_ids=%s|' % H100 in result['msg']
    assert 'kernel 6.8.0-131-generic on 2 node(s): gpu-03, gpu-04' in result['msg']
    assert 'kernel 6.8.0-134-generic on 2 node(s): gpu-01, gpu-02' in result['msg']
    assert result['plan']['source_drift'][0]['action'] == 'refuse'
    assert result['plan']['policy']['source_drift'] == 'refuse'


def test_split_plans_one_combination_per_source_tuple(monkeypatch) -> None:
    result = run_main(monkeypatch, source_drift='split', max_unavailable=3)
    assert not result['failed'], result.get('msg')
    assert [c['nodes'] for c in result['combinations']] == [['gpu-03', 'gpu-04'], ['gpu-01', 'gpu-02']]
    assert all(len(c['source_tuples']) == 1 for c in result['combinations'])
    assert result['canaries'] == ['gpu-01', 'gpu-03']
    assert result['source_drift'][0]['components'] == ['kernel']
    assert 'warnings' not in result and 'problems' not in result  # warnings reach the user through module.warn


def test_bad_source_drift_is_refused_by_the_argument_spec(monkeypatch) -> None:
    result = run_main(monkeypatch, source_drift='spilt')
    assert result['failed']
    assert 'source_drift' in result['msg'] and 'spilt' in result['msg'] and 'refuse, split' in result['msg']
