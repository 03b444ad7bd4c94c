# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""NVIDIA Xid events: the catalog and a parser for kernel-log lines.

The driver logs `NVRM: Xid (PCI:<domain:bus:dev>): <code>, <details>` (the `PCI:` tag, `pid=` and
`name=` vary by driver version). Lines come from `dmesg` (raw `[seconds]`, `-T` human time or
`--time-format iso`), `journalctl -k` (`-o short`, `short-iso`, `short-iso-precise`,
`short-monotonic`) or syslog files (RFC 3164 `Aug 10 14:03:22 host kernel: …` and RFC 3339
high-precision stamps). This module only parses text; it never reads logs itself.
"""
from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Iterable, NamedTuple, Optional

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _duration

__all__ = ['CATALOG', 'XidInfo', 'describe', 'parse_line', 'parse_lines', 'parse_since',
           'normalize_pci', 'pci_of_bus_id', 'format_time', 'SinceError']


class XidInfo(NamedTuple):
    mnemonic: str
    description: str
    action: str
    severity: str   # critical | high | medium | low


# The catalog. Codes, mnemonics and resolution actions follow NVIDIA's Xid catalog for Ampere and
# later (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) as carried by NVIDIA
# NVSentinel's gpu-health-monitor `xiderrorsmapping.csv`; descriptions condense NVIDIA's Xid
# guidance. Severity is this collection's reading of the resolution bucket:
#   critical - the node or the GPU is gone or corrupt: reboot/reset now, drain the node
#   high     - the GPU needs a reset (fatal to its workloads) or link/firmware failure
#   medium   - an application fault the driver contained (restart the application)
#   low      - informational or recorded for later (reset at convenience)
# Codes not listed here are reported with severity "unknown".
CATALOG = {
    8: XidInfo('FIFO_ERROR_IDLE_TIMEOUT', 'GPU stopped processing', 'RESTART_APP', 'medium'),
    13: XidInfo('GR_EXCEPTION', 'Graphics engine exception (often the application)', 'RESTART_APP', 'medium'),
    31: XidInfo('FIFO_ERROR_MMU_ERR_FLT', 'GPU memory page fault (usually an application bug)', 'RESTART_APP', 'medium'),
    32: XidInfo('PBDMA_ERROR', 'Invalid or corrupted push buffer stream', 'RESTART_APP', 'medium'),
    38: XidInfo('FECS_ERR_WATCHDOG_TIMEOUT', 'Driver firmware error', 'IGNORE', 'low'),
    43: XidInfo('RESETCHANNEL_VERIF_ERROR', 'GPU stopped processing (application error)', 'IGNORE', 'low'),
    45: XidInfo('PREEMPTIVE_REMOVAL', 'Preemptive cleanup after an earlier error', 'WORKFLOW_XID_45', 'low'),
    46: XidInfo('GPU_TIMEOUT_ERROR', 'GPU stopped processing', 'RESET_GPU', 'high'),
    48: XidInfo('GPU_ECC_DBE', 'Double-bit ECC error', 'WORKFLOW_XID_48', 'critical'),
    61: XidInfo('PMU_BREAKPOINT', 'Internal micro-controller breakpoint', 'UNEXPECTED_ERR_REPORT_ISSUE', 'high'),
    62: XidInfo('PMU_HALT_ERROR', 'Internal micro-controller halt', 'RESET_GPU', 'high'),
    63: XidInfo('INFOROM_DRAM_RETIREMENT_EVENT', 'Page retirement or row remap recorded', 'IGNORE', 'low'),
    64: XidInfo('INFOROM_DRAM_RETIREMENT_FAILURE', 'Page retirement or row remap recording failed', 'RESET_GPU', 'critical'),
    68: XidInfo('NVDEC0_ERROR', 'NVDEC0 exception', 'RESTART_APP', 'medium'),
    69: XidInfo('GR_CLASS_ERROR', 'Graphics engine class error', 'RESTART_APP', 'medium'),
    74: XidInfo('NVLINK_ERROR', 'NVLink error', 'WORKFLOW_NVLINK_ERR', 'high'),
    79: XidInfo('GPU_HAS_FALLEN_OFF_THE_BUS', 'GPU has fallen off the bus', 'RESTART_BM', 'critical'),
    92: XidInfo('EXCESSIVE_SBE_INTERRUPTS', 'High single-bit ECC error rate', 'IGNORE', 'low'),
    94: XidInfo('CONTAINED_ERROR', 'Contained ECC error', 'RESTART_APP', 'medium'),
    95: XidInfo('UNCONTAINED_ERROR', 'Uncontained ECC error', 'RESET_GPU', 'critical'),
    109: XidInfo('CTXSW_TIMEOUT_ERROR', 'Context switch timeout', 'RESET_GPU', 'high'),
    119: XidInfo('GSP_RPC_TIMEOUT', 'GSP firmware RPC timeout', 'RESET_GPU', 'high'),
    120: XidInfo('GSP_ERROR', 'GSP firmware error', 'RESET_GPU', 'high'),
    121: XidInfo('C2C_ERROR', 'C2C link error', 'IGNORE', 'low'),
    140: XidInfo('UNRECOVERABLE_ECC_ERROR_ESCAPE', 'Unrecovered ECC error', 'RESET_GPU', 'critical'),
    143: XidInfo('GPU_INIT_ERROR', 'GPU initialization failure', 'RESET_GPU', 'high'),
    154: XidInfo('GPU_RECOVERY_ACTION_CHANGED', 'GPU recovery action changed (follow the linked Xid)', 'LINKED_XID', 'low'),
}

SEVERITIES = ('critical', 'high', 'medium', 'low', 'unknown')

_XID_RE = re.compile(
    r'NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\): '
    r'(?P<code>\d+)(?:,|\s|$)')

_MONTHS = {m: i + 1 for i, m in enumerate(
    ('jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec'))}

# Optional printk level `<4>` or dmesg -x `kern  :warn  : ` before a stamp.
_LEAD = r'^(?:<\d+>)?\s*'
# 2026-08-10T14:03:22+0000 | 2026-08-10T14:03:22.123456+00:00 | ,123456 (dmesg iso) | Z | none
_ISO_RE = re.compile(_LEAD + r'(?P<date>\d{4}-\d{2}-\d{2})[T ](?P<time>\d{2}:\d{2}:\d{2})'
                     r'(?:[.,](?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?(?=\s)')
# Aug 10 14:03:22 (RFC 3164 syslog, journalctl -o short)
_SYSLOG_RE = re.compile(_LEAD + r'(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2}) (?P<time>\d{2}:\d{2}:\d{2})\s')
# [Mon Aug 10 14:03:22 2026] (dmesg -T)
_CTIME_RE = re.compile(_LEAD + r'\[(?:[A-Z][a-z]{2} )?(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2}) '
                       r'(?P<time>\d{2}:\d{2}:\d{2}) (?P<year>\d{4})\]')
# [ 1234.567890] (dmesg raw, journalctl -o short-monotonic), anywhere before NVRM:
_MONO_RE = re.compile(r'\[\s*(?P<secs>\d+\.\d+)\]')

_UTC = _dt.timezone.utc


class SinceError(ValueError):
    pass


def describe(code: int) -> dict[str, Any]:
    """Catalog fields for one code; unknown codes get severity `unknown`."""
    info = CATALOG.get(int(code))
    if info is None:
        return {'mnemonic': None, 'description': None, 'action': None, 'severity': 'unknown'}
    return {'mnemonic': info.mnemonic, 'description': info.description, 'action': info.action,
            'severity': info.severity}


def normalize_pci(pci: str) -> str:
    """`0000:17:00` (4-digit domain, lowercase) from a kernel-log or NVML PCI address."""
    parts = pci.lower().split(':')
    if len(parts) >= 3:
        domain = parts[-3][-4:].rjust(4, '0')
        return '%s:%s:%s' % (domain, parts[-2], parts[-1].split('.')[0])
    return pci.lower()


def pci_of_bus_id(bus_id: str) -> str:
    """The Xid `pci` form of an NVML/nvidia-smi bus id: `00000000:17:00.0` -> `0000:17:00`."""
    return normalize_pci(bus_id)


def format_time(t: Optional[_dt.datetime]) -> Optional[str]:
    """RFC 3339 in UTC (`2026-08-10T14:03:22Z`, fractions kept)."""
    if t is None:
        return None
    t = t.astimezone(_UTC)
    text = '%04d-%02d-%02dT%02d:%02d:%02d' % (t.year, t.month, t.day, t.hour, t.minute, t.second)  # zero-padded year
    if t.microsecond:
        text += ('.%06d' % t.microsecond).rstrip('0')
    return text + 'Z'


def _tzinfo(tz: Optional[_dt.tzinfo]) -> _dt.tzinfo:
    if tz is not None:
        return tz
    local = _dt.datetime.now().astimezone().tzinfo
    return local if local is not None else _UTC


def _clock(text: str) -> tuple[int, int, int]:
    h, m, s = text.split(':')
    return int(h), int(m), int(s)


def line_time(line: str, now: Optional[_dt.datetime] = None, boot_time: Optional[_dt.datetime] = None,
              tz: Optional[_dt.tzinfo] = None) -> Optional[_dt.datetime]:
    """The wall-clock time a kernel-log line carries, or None when it carries none.

    Naive stamps (syslog, dmesg -T) are read in `tz` (default: this host's zone); a syslog stamp
    has no year, so it takes the year of `now` unless that would put it more than a day in the
    future (then the year before). Raw dmesg seconds need `boot_time`.
    """
    m = _ISO_RE.match(line)
    if m:
        frac = (m.group('frac') or '0')[:6].ljust(6, '0')
        h, mi, s = _clock(m.group('time'))
        y, mo, d = (int(x) for x in m.group('date').split('-'))
        zone = m.group('tz')
        if zone is None:
            tzi = _tzinfo(tz)
        elif zone == 'Z':
            tzi = _UTC
        else:
            sign = -1 if zone[0] == '-' else 1
            digits = zone[1:].replace(':', '')
            tzi = _dt.timezone(sign * _dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
        return _dt.datetime(y, mo, d, h, mi, s, int(frac), tzinfo=tzi)
    m = _CTIME_RE.match(line)
    if m and m.group('mon').lower() in _MONTHS:
        h, mi, s = _clock(m.group('time'))
        return _dt.datetime(int(m.group('year')), _MONTHS[m.group('mon').lower()], int(m.group('day')),
                            h, mi, s, tzinfo=_tzinfo(tz))
    m = _SYSLOG_RE.match(line)
    if m and m.group('mon').lower() in _MONTHS:
        h, mi, s = _clock(m.group('time'))
        ref = now or _dt.datetime.now(_UTC)
        tzi = _tzinfo(tz)
        year = ref.astimezone(tzi).year
        t = _dt.datetime(year, _MONTHS[m.group('mon').lower()], int(m.group('day')), h, mi, s, tzinfo=tzi)
        if t - ref > _dt.timedelta(days=1):
            t = t.replace(year=year - 1)
        return t
    head = line.split('NVRM:', 1)[0]
    m = _MONO_RE.search(head)
    if m and boot_time is not None:
        return boot_time + _dt.timedelta(seconds=float(m.group('secs')))
    return None


def parse_line(line: str, now: Optional[_dt.datetime] = None, boot_time: Optional[_dt.datetime] = None,
               tz: Optional[_dt.tzinfo] = None) -> Optional[dict[str, Any]]:
    """One Xid event (the gpu_info `xid_events` item) from a log line, or None for other lines."""
    m = _XID_RE.search(line)
    if not m:
        return None
    code = int(m.group('code'))
    t = line_time(line, now=now, boot_time=boot_time, tz=tz)
    event = {'time': format_time(t), 'pci': normalize_pci(m.group('pci')), 'code': code}
    event.update(describe(code))
    event['raw'] = line.rstrip('\r\n')
    event['_t'] = t
    return event


def parse_lines(lines: Iterable[str], since: Optional[_dt.datetime] = None, now: Optional[_dt.datetime] = None,
                boot_time: Optional[_dt.datetime] = None, tz: Optional[_dt.tzinfo] = None) -> list[dict[str, Any]]:
    """Every Xid event in `lines`, in log order, at or after `since`.

    A line whose time cannot be read is kept (a gate must not miss an Xid because its log had
    no stamp); its `time` is None.
    """
    events = []
    for line in lines:
        ev = parse_line(line, now=now, boot_time=boot_time, tz=tz)
        if ev is None:
            continue
        t = ev.pop('_t')
        if since is not None and t is not None and t < since:
            continue
        events.append(ev)
    return events


def parse_since(value: Any, now: Optional[_dt.datetime] = None,
                boot_time: Optional[_dt.datetime] = None) -> Optional[_dt.datetime]:
    """`xid_since`: `boot`, an RFC 3339 / ISO 8601 time, `@<epoch seconds>`, or a duration back
    from now (`30m`, `24h`, `7d`). None/empty means no lower bound."""
    if value is None or value == '':
        return None
    if isinstance(value, _dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=_UTC)
    text = str(value).strip()
    now = now or _dt.datetime.now(_UTC)
    if text == 'boot':
        if boot_time is None:
            raise SinceError('xid_since=boot: the boot time of this host could not be read')
        return boot_time
    if text.startswith('@'):
        try:
            return _dt.datetime.fromtimestamp(float(text[1:]), _UTC)
        except ValueError:
            raise SinceError('xid_since=%r: not a number of seconds after @' % text)
    back = _duration.seconds_of(text)
    if back is not None:
        return now - _dt.timedelta(seconds=back)
    if _ISO_RE.match(text + ' '):
        # any fraction length and +0000 / +00:00 / Z, which fromisoformat on Python 3.9 rejects
        return line_time(text + ' ', tz=_UTC)
    iso = text[:-1] + '+00:00' if text.endswith(('Z', 'z')) else text
    try:
        t = _dt.datetime.fromisoformat(iso)
    except ValueError:
        raise SinceError("xid_since=%r: expected 'boot', an RFC 3339 time such as 2026-08-10T14:00:00Z, "
                         "'@<epoch seconds>' or a duration such as 24h" % text)
    return t if t.tzinfo else t.replace(tzinfo=_UTC)
