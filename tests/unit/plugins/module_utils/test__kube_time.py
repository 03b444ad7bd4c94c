"""The one RFC 3339 reader (Kubernetes objects, the evidence bundle, the metric gate's windows)."""
from __future__ import annotations

import datetime

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils._kube_time import format_time, parse_time

UTC = datetime.timezone.utc


@pytest.mark.parametrize('text,expected', [
    ('2026-07-14T12:00:00Z', datetime.datetime(2026, 7, 14, 12, tzinfo=UTC)),
    ('2026-07-14t12:00:00z', datetime.datetime(2026, 7, 14, 12, tzinfo=UTC)),
    ('2026-07-14 14:00:00+02:00', datetime.datetime(2026, 7, 14, 12, tzinfo=UTC)),
    ('2026-07-14T12:00:00.1234567Z', datetime.datetime(2026, 7, 14, 12, 0, 0, 123456, tzinfo=UTC)),
])
def test_accepted_forms_are_utc(text, expected):
    assert parse_time(text, 'f') == expected
    assert parse_time(text, 'f').tzinfo == UTC


@pytest.mark.parametrize('value,msg', [
    ('2026-07-14T12:00:00', "f: '2026-07-14T12:00:00' has no UTC offset (add Z or +00:00)"),
    ('2026-07-14T12:00Z', "f: '2026-07-14T12:00Z' is not an RFC 3339 time such as 2026-07-14T12:00:00Z"),
    ('20260714T120000Z', "f: '20260714T120000Z' is not an RFC 3339 time such as 2026-07-14T12:00:00Z"),
    ('2026-02-30T12:00:00Z', "f: '2026-02-30T12:00:00Z' is not a valid date and time"),
    (1752494400, "f: 1752494400 is not an RFC 3339 time such as 2026-07-14T12:00:00Z"),
    (datetime.datetime(2026, 7, 14), "f: '2026-07-14T00:00:00' has no time zone; give an RFC 3339 time such as "
                                     "2026-07-14T12:00:00Z"),
])
def test_refused_forms_name_the_field_and_value(value, msg):
    with pytest.raises(ValueError) as exc:
        parse_time(value, 'f')
    assert str(exc.value) == msg


def test_format_is_utc_seconds():
    assert format_time(datetime.datetime(2026, 7, 14, 14, 0, 0, 999, tzinfo=datetime.timezone(
        datetime.timedelta(hours=2)))) == '2026-07-14T12:00:00Z'


def test_format_time_pads_years_before_1000():
    """Issue 12 (9): strftime's %Y writes 999, which parse_time refuses."""
    moment = datetime.datetime(999, 12, 31, 23, 59, 59, tzinfo=datetime.timezone.utc)
    assert format_time(moment) == '0999-12-31T23:59:59Z'
    assert parse_time(format_time(moment), 't') == moment


@pytest.mark.parametrize('value', [
    '9999-12-31T23:59:59-00:01',
    '0001-01-01T00:00:00+00:01',
    datetime.datetime(1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1))),
])
def test_time_beyond_the_utc_range_is_refused_naming_the_field(value):
    """Found by tests/unit/plugins/module_utils/test_fuzz_parsers.py: a valid date whose offset moves it past year 9999
    or before year 1 in UTC raised OverflowError (a traceback from the evidence and qualification_record modules)."""
    with pytest.raises(ValueError) as exc:
        parse_time(value, 'gates[0].finished')
    assert str(exc.value).startswith('gates[0].finished: ')
    assert 'outside the years 1 to 9999 in UTC' in str(exc.value)
