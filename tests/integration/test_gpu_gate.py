"""gpu_gate through ansible-runner over gpu_info-shaped facts (the lead wires it to the real gpu_info)."""
from __future__ import annotations

from typing import Any


def node_facts(driver: str, xids: list[dict[str, Any]]) -> dict[str, Any]:
    gpus = [{'index': i, 'uuid': 'GPU-%d' % i, 'bus_id': '00000000:%02X:00.0' % (0x17 + i),
             'pci_id': '10de:2330/10de:16c1',
             'ecc': {'enabled': True, 'volatile_uncorrected': 0, 'aggregate_uncorrected': 0},
             'retired_pages_pending': False,
             'remapped_rows': {'correctable': 0, 'uncorrectable': 0, 'pending': False, 'failure': False},
             'temperature_c': 40, 'errors': {}} for i in range(2)]
    return {'backend': 'nvml', 'driver_version': driver, 'pci_ids': ['10de:2330/10de:16c1'], 'gpus': gpus,
            'xid_events': xids}


def test_gpu_gate_module(run_playbook: Any) -> None:
    base = node_facts('580.126.20', [])
    xid79 = {'time': '2026-07-14T12:00:00Z', 'pci': '0000:18:00', 'code': 79,
             'mnemonic': 'GPU has fallen off the bus', 'severity': 'critical', 'raw': 'NVRM: Xid (PCI:0000:18:00): 79'}
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'clean', 'gpufleet.upgrade.gpu_gate': {'facts': node_facts('580.130.00', []), 'baseline': base,
                                                        'target_driver': '580.130.00'}},
        {'name': 'xid', 'gpufleet.upgrade.gpu_gate': {'facts': node_facts('580.130.00', [xid79]), 'baseline': base,
                                                      'target_driver': '580.130.00'}, 'ignore_errors': True},
    ]}])
    clean = run.result('clean')
    assert clean['_event'] == 'runner_on_ok' and clean['passed'] is True and clean['changed'] is False
    bad = run.result('xid')
    assert bad['_event'] == 'runner_on_failed'
    assert bad['msg'] == ('GPU gate: FAIL: xid: new Xid 79 (GPU has fallen off the bus, severity critical) on '
                          '0000:18:00 at 2026-07-14T12:00:00Z')
    assert bad['checks']['xid']['evidence']['failing'] == 1
