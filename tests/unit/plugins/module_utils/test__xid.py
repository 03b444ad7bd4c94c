"""Xid parsing on recorded kernel-log lines in every format the reference lists."""
from __future__ import annotations

import datetime as dt
import pathlib

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _xid

FIX = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'kernel_log'
UTC = dt.timezone.utc
NOW = dt.datetime(2026, 8, 10, 18, 0, 0, tzinfo=UTC)
BOOT = dt.datetime(2026, 8, 10, 13, 0, 0, tzinfo=UTC)


def lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def brief(events):
    return [(e['time'], e['pci'], e['code'], e['severity']) for e in events]


def test_dmesg_without_timestamps_every_reference_line():
    events = _xid.parse_lines(lines('dmesg_plain.txt'), now=NOW, tz=UTC)
    assert brief(events) == [
        (None, '0000:05:00', 79, 'critical'),
        (None, '0000:01:00', 79, 'critical'),
        (None, '0000:03:00', 14, 'unknown'),      # no `PCI:` tag; 14 is not in the catalog
        (None, '0000:10:1c', 63, 'low'),
        (None, '0000:03:00', 31, 'medium'),
        (None, '0000:01:00', 62, 'high'),
        (None, '0000:01:00', 154, 'low'),
    ]
    assert events[0]['mnemonic'] == 'GPU_HAS_FALLEN_OFF_THE_BUS'
    assert events[0]['description'] == 'GPU has fallen off the bus'
    assert events[0]['action'] == 'RESTART_BM'
    assert events[0]['raw'] == "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert events[2]['mnemonic'] is None and events[2]['action'] is None


def test_dmesg_raw_seconds_use_boot_time():
    events = _xid.parse_lines(lines('dmesg_raw.txt'), now=NOW, boot_time=BOOT)
    assert brief(events) == [
        ('2026-08-10T14:00:05.250117Z', '0000:17:00', 79, 'critical'),
        ('2026-08-10T15:00:01.0045Z', '0000:2a:00', 63, 'low'),
        ('2026-08-10T15:01:40.000001Z', '0000:2a:00', 999, 'unknown'),
    ]
    # the follow-up "GPU has fallen off the bus" line without "Xid" is not an event
    assert all('Xid' in e['raw'] for e in events)


def test_dmesg_raw_seconds_without_boot_time_have_no_time():
    events = _xid.parse_lines(lines('dmesg_raw.txt'))
    assert [e['time'] for e in events] == [None, None, None]


def test_dmesg_human_time_is_local_time():
    tz = dt.timezone(dt.timedelta(hours=2))
    events = _xid.parse_lines(lines('dmesg_human.txt'), now=NOW, tz=tz)
    assert brief(events) == [
        ('2026-08-10T12:03:22Z', '0000:17:00', 48, 'critical'),
        ('2026-08-10T12:03:23Z', '0000:17:00', 63, 'low'),
    ]


def test_dmesg_iso_with_comma_fraction_and_offsets():
    events = _xid.parse_lines(lines('dmesg_iso.txt'), now=NOW)
    assert brief(events) == [
        ('2026-08-10T14:03:22.418712Z', '0000:17:00', 94, 'medium'),
        ('2026-08-10T14:03:22.000001Z', '0000:2a:00', 95, 'critical'),
    ]


def test_journalctl_short_iso():
    events = _xid.parse_lines(lines('journal_short_iso.txt'), now=NOW)
    assert brief(events) == [
        ('2026-08-10T14:03:22Z', '0000:17:00', 119, 'high'),
        ('2026-08-10T15:10:00Z', '0000:2a:00', 13, 'medium'),
    ]


def test_journalctl_short_iso_precise():
    events = _xid.parse_lines(lines('journal_short_iso_precise.txt'), now=NOW)
    assert brief(events) == [
        ('2026-08-10T14:03:22.123456Z', '0000:17:00', 120, 'high'),
        ('2026-08-10T14:03:22.5Z', '0000:2a:00', 74, 'high'),
    ]


def test_syslog_rfc3164_infers_the_year_and_prefers_the_wall_clock():
    events = _xid.parse_lines(lines('syslog_kern.log'), now=NOW, boot_time=BOOT, tz=UTC)
    assert brief(events) == [
        ('2026-08-10T14:03:22Z', '0000:17:00', 79, 'critical'),   # not boot + 3605 s
        ('2026-08-09T23:59:59Z', '0000:2a:00', 45, 'low'),
        ('2025-12-31T23:59:00Z', '0000:2a:00', 31, 'medium'),     # December seen in August: last year
    ]


def test_syslog_rfc3339():
    events = _xid.parse_lines(lines('syslog_rfc3339.log'), now=NOW)
    assert brief(events) == [('2026-08-10T14:03:22.123456Z', '0000:17:00', 64, 'critical')]


def test_since_filters_timed_lines_and_keeps_untimed_ones():
    since = dt.datetime(2026, 8, 10, 14, 5, tzinfo=UTC)
    timed = _xid.parse_lines(lines('journal_short_iso.txt'), since=since, now=NOW)
    assert [e['code'] for e in timed] == [13]
    untimed = _xid.parse_lines(lines('dmesg_plain.txt'), since=since, now=NOW)
    assert len(untimed) == 7


def test_since_is_inclusive():
    since = dt.datetime(2026, 8, 10, 14, 3, 22, tzinfo=UTC)
    assert [e['code'] for e in _xid.parse_lines(lines('journal_short_iso.txt'), since=since)] == [119, 13]


@pytest.mark.parametrize('value, expected', [
    ('boot', BOOT),
    ('2026-08-10T14:00:00Z', dt.datetime(2026, 8, 10, 14, 0, tzinfo=UTC)),
    ('2026-08-10T16:00:00+02:00', dt.datetime(2026, 8, 10, 14, 0, tzinfo=UTC)),
    ('2026-08-10 14:00:00', dt.datetime(2026, 8, 10, 14, 0, tzinfo=UTC)),
    ('2026-08-10T14:00:00.5+0000', dt.datetime(2026, 8, 10, 14, 0, 0, 500000, tzinfo=UTC)),
    ('2026-08-10', dt.datetime(2026, 8, 10, 0, 0, tzinfo=UTC)),
    ('@1786456800', dt.datetime(2026, 8, 11, 14, 0, tzinfo=UTC)),
    ('24h', dt.datetime(2026, 8, 9, 18, 0, tzinfo=UTC)),
    ('30m', dt.datetime(2026, 8, 10, 17, 30, tzinfo=UTC)),
    ('7d', dt.datetime(2026, 8, 3, 18, 0, tzinfo=UTC)),
    (None, None),
    ('', None),
])
def test_parse_since(value, expected):
    assert _xid.parse_since(value, now=NOW, boot_time=BOOT) == expected


@pytest.mark.parametrize('value, message', [
    ('yesterday', "xid_since='yesterday': expected 'boot', an RFC 3339 time"),
    ('@soon', "xid_since='@soon': not a number of seconds after @"),
])
def test_parse_since_rejects_bad_values_naming_them(value, message):
    with pytest.raises(_xid.SinceError) as err:
        _xid.parse_since(value, now=NOW, boot_time=BOOT)
    assert message in str(err.value)


def test_since_boot_without_boot_time_is_a_clear_error():
    with pytest.raises(_xid.SinceError, match='boot time of this host could not be read'):
        _xid.parse_since('boot', now=NOW, boot_time=None)


def test_catalog_covers_the_reference_table_with_known_severities():
    reference = {8, 13, 31, 32, 38, 43, 45, 46, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95,
                 109, 119, 120, 121, 140, 143, 154}
    assert set(_xid.CATALOG) == reference
    assert {i.severity for i in _xid.CATALOG.values()} <= set(_xid.SEVERITIES) - {'unknown'}
    assert _xid.describe(12345) == {'mnemonic': None, 'description': None, 'action': None, 'severity': 'unknown'}


@pytest.mark.parametrize('raw, expected', [
    ('00000000:17:00.0', '0000:17:00'),
    ('0000:2A:00', '0000:2a:00'),
    ('00000001:C1:00.0', '0001:c1:00'),
])
def test_pci_normalisation(raw, expected):
    assert _xid.pci_of_bus_id(raw) == expected


def test_other_nvrm_lines_are_not_events():
    assert _xid.parse_line('NVRM: GPU 0000:17:00.0: GPU has fallen off the bus.') is None
    assert _xid.parse_line('kernel: nvidia-modeset: Xid is not here') is None


def test_format_time_pads_years_before_1000():
    """Issue 12 (9)."""
    import datetime
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _xid
    assert _xid.format_time(datetime.datetime(999, 1, 2, 3, 4, 5, 600000, tzinfo=datetime.timezone.utc)) == \
        '0999-01-02T03:04:05.6Z'
