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
