"""The lab's DCGM exporter stand-in: one loopback /metrics for every lab node, derived live.

At each scrape every lab node's series are rendered from what the node is NOW (nothing cached):

- `<lab>/nodes/<node>/nvml.json`, the stand-in NVML state the activation hook rewrites (driver
  version, per-GPU temperature, ECC counters, remapped rows);
- `<lab>/nodes/<node>/kern.log`: `DCGM_FI_DEV_XID_ERRORS` is the last Xid code logged for the GPU
  since the node's dcgm-exporter (re)started, i.e. since `<lab>/nodes/<node>/dcgm.since` (the
  activation hook writes it at every reboot/reload, as the exporter pod restarts with the driver);
- `<lab>/lab.json`: with `fault_kind: temperature`, GPU 5 of the `fault` node reports `HOT_C` once
  the NEW driver is loaded: a GPU that runs hot under load with the new driver. The GPU gate reads
  one idle instant right after the activation and sees 38 C; only the metric gate's window sees it.

The gated series carry the labels dcgm-exporter sets (`gpu`, `UUID`, `device`, `modelName`,
`pci_bus_id`, `Hostname`) but not the driver version, so a driver change does not start new series
(the metric gate counts samples per series). The driver is on its own series,
`dcgm_lab_driver_info{Hostname=..., DCGM_FI_DRIVER_VERSION=...} 1`, which the activation hook polls
to know that Prometheus has scraped the node as it now is (tests/tools/lab_node.py).
"""
from __future__ import annotations

import json
import pathlib
import re
import threading
from typing import Any

from tools.prometheus import MetricsEndpoint

HOT_C = 92            # the temperature fault: above the metric gate's default limit (85 C)
HOT_GPU = 5
DRIVER_INFO = 'dcgm_lab_driver_info'
BOOT_EPOCH = '2026-01-01T00:00:00+00:00'   # labenv's kernel log "boot" line
_XID = re.compile(r'^(\S+) \S+ kernel: NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)')


def _escape(value: str) -> str:
    return value.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def _series(name: str, labels: dict[str, str], value: float) -> str:
    return '%s{%s} %s' % (name, ','.join('%s="%s"' % (k, _escape(v)) for k, v in labels.items()), repr(float(value)))


def xids_since(kern_log: pathlib.Path, since: str) -> dict[str, int]:
    """PCI bus id (domain:bus:dev, lower case) -> last Xid code logged at or after `since`."""
    out: dict[str, int] = {}
    try:
        text = kern_log.read_text(errors='replace')
    except OSError:
        return out
    for line in text.splitlines():
        m = _XID.match(line)
        if m and m.group(1) >= since:
            out[m.group(2).lower()] = int(m.group(3))
    return out


def node_metrics(lab: pathlib.Path, node: str, conf: dict[str, Any]) -> list[str]:
    d = lab / 'nodes' / node
    state = json.loads((d / 'nvml.json').read_text())
    try:
        since = (d / 'dcgm.since').read_text().strip() or BOOT_EPOCH
    except OSError:
        since = BOOT_EPOCH
    xids = xids_since(d / 'kern.log', since)
    driver = state.get('driver_version') or ''
    hot = (conf.get('fault') == node and conf.get('fault_kind') == 'temperature'
           and driver == conf.get('target_driver'))
    lines = [_series(DRIVER_INFO, {'Hostname': node, 'DCGM_FI_DRIVER_VERSION': driver}, 1)]
    for i, g in enumerate(state['gpus']):
        labels = {'gpu': str(i), 'UUID': g['uuid'], 'device': 'nvidia%d' % i, 'modelName': g['name'],
                  'pci_bus_id': g['bus_id'], 'Hostname': node}
        ecc = g.get('ecc') or {}
        rows = g.get('remapped_rows') or (0, 0, 0, 0)
        temp = HOT_C if hot and i == HOT_GPU else g.get('temperature', 0)
        lines += [
            _series('DCGM_FI_DEV_GPU_TEMP', labels, temp),
            _series('DCGM_FI_DEV_XID_ERRORS', labels, xids.get(g['bus_id'][4:14].lower(), 0)),
            _series('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL', labels, ecc.get('corrected_volatile', 0)),
            _series('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL', labels, ecc.get('uncorrected_volatile', 0)),
            _series('DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS', labels, rows[0]),
            _series('DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS', labels, rows[1]),
            _series('DCGM_FI_DEV_ROW_REMAP_FAILURE', labels, rows[3]),
        ]
    return lines


class DcgmStandIn(MetricsEndpoint):
    """A ThreadingHTTPServer on 127.0.0.1 serving /metrics for every node of the lab."""

    def __init__(self, lab: pathlib.Path, names: list[str]) -> None:
        self.lab = lab
        self.names = list(names)
        self.scrapes = 0
        self._last: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        super().__init__('lab-dcgm')

    def render(self) -> str:
        try:
            conf = json.loads((self.lab / 'lab.json').read_text())
        except (OSError, ValueError):
            conf = {}
        lines = []
        with self._lock:
            self.scrapes += 1
            for node in self.names:
                try:
                    self._last[node] = node_metrics(self.lab, node, conf)
                except (OSError, ValueError, KeyError):
                    pass     # a file being rewritten: this scrape repeats the node's previous series
                lines += self._last.get(node, [])
        return '\n'.join(lines) + '\n'
