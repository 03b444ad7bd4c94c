# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""GPU facts from `nvidia-smi -q -x` (the fallback when the nvidia-ml-py binding is missing).

The XML follows nvidia-smi's `nvsmi_device_v*.dtd`. Field names moved between driver branches,
so both spellings are read: ECC counts are `dram_uncorrectable`/`sram_uncorrectable*` (R520 and
later) or `double_bit/total` (older); the retired-page flag is `pending_retirement` or
`pending_blacklist`. `N/A` values become None; bracketed or error values (`[Not Supported]`,
`[GPU requires reset]`, `Unknown Error`) become None with the text in the GPU's `errors`.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any, Optional

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost

__all__ = ['parse_xml', 'collect', 'SmiError']

_NA = ('', 'n/a', '[n/a]', 'none')
_ERRORS_UNBRACKETED = ('unknown error', 'gpu is lost')


class SmiError(Exception):
    pass


class _Gpu:
    def __init__(self, node: ET.Element, gpu: dict[str, Any]) -> None:
        self.node = node
        self.gpu = gpu

    def raw(self, path: str) -> Optional[str]:
        el = self.node.find(path)
        if el is None or el.text is None:
            return None
        return el.text.strip()

    def value(self, field: str, path: str) -> Optional[str]:
        """The text at `path`, None for N/A; an error value is recorded under `field`."""
        text = self.raw(path)
        if text is None or text.lower() in _NA:
            return None
        if (text.startswith('[') and text.endswith(']')) or text.lower() in _ERRORS_UNBRACKETED:
            self.gpu['errors'].setdefault(field, text.strip('[]'))
            return None
        return text

    def number(self, field: str, path: str) -> Optional[int]:
        text = self.value(field, path)
        if text is None:
            return None
        m = re.match(r'^(\d+)', text)
        if not m:
            self.gpu['errors'].setdefault(field, text)
            return None
        return int(m.group(1))

    def flag(self, field: str, path: str, true: tuple[str, ...] = ('enabled', 'yes')) -> Optional[bool]:
        text = self.value(field, path)
        if text is None:
            return None
        return text.lower() in true

    def total(self, field: str, paths: tuple[str, ...]) -> Optional[int]:
        """Sum of the counters present at `paths` (None when none is present)."""
        values = [self.number(field, p) for p in paths if self.node.find(p) is not None]
        present = [v for v in values if v is not None]
        return sum(present) if present else None


def _hex32(text: Optional[str]) -> Optional[int]:
    if not text:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _ecc_counter(g: _Gpu, scope: str, kind: str) -> Optional[int]:
    base = 'ecc_errors/' + scope + '/'
    field = 'ecc.%s_%s' % (scope, kind)
    if kind == 'uncorrected':
        new = (base + 'dram_uncorrectable', base + 'sram_uncorrectable', base + 'sram_uncorrectable_parity',
               base + 'sram_uncorrectable_secded')
        old = (base + 'double_bit/total',)
    else:
        new = (base + 'dram_correctable', base + 'sram_correctable')
        old = (base + 'single_bit/total',)
    if any(g.node.find(p) is not None for p in new):
        return g.total(field, new)
    return g.total(field, old)


def parse_xml(text: str) -> dict[str, Any]:
    """driver_version, cuda_driver_version and gpus (the gpu_info shape) from `nvidia-smi -q -x`."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise SmiError('nvidia-smi -q -x gave XML that does not parse: %s' % e)
    if root.tag != 'nvidia_smi_log':
        raise SmiError('nvidia-smi -q -x gave <%s>, expected <nvidia_smi_log>' % root.tag)

    def top(tag: str) -> Optional[str]:
        el = root.find(tag)
        t = el.text.strip() if el is not None and el.text else None
        return None if t is None or t.lower() in _NA else t

    out: dict[str, Any] = {'driver_version': top('driver_version'), 'cuda_driver_version': top('cuda_version'),
                           'gpus': [], 'errors': {}}
    for index, node in enumerate(root.findall('gpu')):
        gpu = _gpuhost.empty_gpu(index)
        g = _Gpu(node, gpu)
        gpu['uuid'] = g.value('uuid', 'uuid')
        gpu['name'] = g.value('name', 'product_name')
        gpu['bus_id'] = g.value('pci', 'pci/pci_bus_id') or node.get('id')
        dev = _hex32(g.value('pci', 'pci/pci_device_id'))
        sub = _hex32(g.value('pci', 'pci/pci_sub_system_id'))
        if dev is not None and sub is not None:
            # nvidia-smi prints NVML's pciDeviceId (device<<16 | vendor) as 8 hex digits.
            gpu['pci_id'] = '%04x:%04x/%04x:%04x' % (dev & 0xffff, dev >> 16, sub & 0xffff, sub >> 16)
        gpu['mig_mode'] = {'current': g.flag('mig_mode', 'mig_mode/current_mig'),
                           'pending': g.flag('mig_mode', 'mig_mode/pending_mig')}
        gpu['ecc']['enabled'] = g.flag('ecc', 'ecc_mode/current_ecc')
        if gpu['ecc']['enabled']:
            for scope in ('volatile', 'aggregate'):
                for kind in ('uncorrected', 'corrected'):
                    gpu['ecc']['%s_%s' % (scope, kind)] = _ecc_counter(g, scope, kind)
        pending_path = ('retired_pages/pending_retirement'
                        if node.find('retired_pages/pending_retirement') is not None
                        else 'retired_pages/pending_blacklist')
        gpu['retired_pages_pending'] = g.flag('retired_pages_pending', pending_path, true=('yes',))
        if node.find('remapped_rows') is not None:
            corr = g.number('remapped_rows', 'remapped_rows/remapped_row_corr')
            unc = g.number('remapped_rows', 'remapped_rows/remapped_row_unc')
            pend = g.flag('remapped_rows', 'remapped_rows/remapped_row_pending', true=('yes',))
            fail = g.flag('remapped_rows', 'remapped_rows/remapped_row_failure', true=('yes',))
            if None not in (corr, unc, pend, fail):
                gpu['remapped_rows'] = {'correctable': corr, 'uncorrectable': unc, 'pending': pend, 'failure': fail}
        gpu['temperature_c'] = g.number('temperature_c', 'temperature/gpu_temp')
        for p in node.findall('processes/process_info'):
            ptype = (p.findtext('type') or '').strip()
            if 'C' not in ptype:   # C compute, G graphics, C+G both: gpu_info lists compute ones
                continue
            pid = (p.findtext('pid') or '').strip()
            mem = re.match(r'^(\d+)\s*MiB', (p.findtext('used_memory') or '').strip())
            name = (p.findtext('process_name') or '').strip()
            if pid.isdigit():
                gpu['processes'].append({'pid': int(pid), 'name': name or None,
                                         'used_memory_mib': int(mem.group(1)) if mem else None})
        out['gpus'].append(gpu)
    return out


def collect(runner: Any) -> dict[str, Any]:
    """Run `nvidia-smi -q -x` (bounded to 60 s) and parse it."""
    res = runner.run(['nvidia-smi', '-q', '-x'], timeout=60)
    if res.rc != 0:
        detail = (res.stdout.strip() or res.stderr.strip()).splitlines()
        raise _gpuhost.BackendError('nvidia-smi -q -x failed (rc %d): %s' % (res.rc, detail[0] if detail else 'no output'))
    try:
        return parse_xml(res.stdout)
    except SmiError as e:
        raise _gpuhost.BackendError(str(e))
