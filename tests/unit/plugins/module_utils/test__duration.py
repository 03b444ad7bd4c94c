"""Durations: 10s, 90m, 720h, 30d; zero, negative and unit-less values refused."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _duration

NOT_A_DURATION = 'max_canary_age %s is not a duration: use a whole number with unit s, m, h or d, e.g. 720h'


@pytest.mark.parametrize('text,seconds', [
    ('10s', 10), ('90m', 5400), ('720h', 2592000), ('30d', 2592000), (' 1h ', 3600), ('0010s', 10),
])
def test_parse(text, seconds):
    assert _duration.parse(text, 'max_canary_age') == seconds


@pytest.mark.parametrize('text,message', [
    ('0h', 'max_canary_age "0h" must be positive'),
    ('0d', 'max_canary_age "0d" must be positive'),
    ('-1h', 'max_canary_age "-1h" must be positive'),
    ('720', NOT_A_DURATION % '"720"'),
    ('1.5h', NOT_A_DURATION % '"1.5h"'),
    ('1H', NOT_A_DURATION % '"1H"'),
    ('1h30m', NOT_A_DURATION % '"1h30m"'),
    ('', NOT_A_DURATION % '""'),
    ('h', NOT_A_DURATION % '"h"'),
    (720, NOT_A_DURATION % '720'),
])
def test_parse_refuses(text, message):
    with pytest.raises(ValueError) as err:
        _duration.parse(text, 'max_canary_age')
    assert str(err.value) == message


@pytest.mark.parametrize('seconds,text', [(2592000, '720h'), (5400, '90m'), (10, '10s'), (3600, '1h'), (86400, '24h')])
def test_format_seconds(seconds, text):
    assert _duration.format_seconds(seconds) == text


# -- the one grammar: every form any of the three parsers (_duration, metric_gate, xid) accepted --
@pytest.mark.parametrize('text,seconds', [
    ('90s', 90), ('15m', 900), ('24h', 86400), ('7d', 604800), ('1w', 604800),   # all three or two
    ('1h30m', 5400), ('500ms', 0.5), ('1.5h', 5400),                              # metric_gate
    ('24 h', 86400), (' 30m ', 1800), ('0.5d', 43200),                             # xid_since
    ('0010s', 10), ('0s', 0),
])
def test_seconds_of(text, seconds):
    assert _duration.seconds_of(text) == seconds


@pytest.mark.parametrize('text', ['', ' ', '10', 'h', '1x', '1h 30m', '-1h', '1H', '1.h', '.5h', 'boot',
                                  '2026-08-10', '@17', None, 24])
def test_seconds_of_other_text_is_none(text):
    assert _duration.seconds_of(text) is None


def test_parse_seconds_names_the_field_and_the_value():
    assert _duration.parse_seconds('1h30m', 'window') == 5400
    with pytest.raises(ValueError) as err:
        _duration.parse_seconds('1h 30m', 'window')
    assert str(err.value) == "window: '1h 30m' is not a duration (use e.g. 90s, 15m, 24h, 7d, 1h30m)"
    with pytest.raises(ValueError) as err:
        _duration.parse_seconds('0s', 'step')
    assert str(err.value) == "step: '0s' must be greater than zero"
    with pytest.raises(ValueError, match=r"^step: None is not a duration"):
        _duration.parse_seconds(None, 'step')
