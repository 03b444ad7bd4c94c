# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unit tests for _text.text_field, the one reader of an optional or required text field."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show, text_field, url_userinfo


class Bad(ValueError):
    pass


def test_text_field_strips_and_treats_blank_as_missing():
    assert text_field({'a': ' x '}, 'a', 'q') == 'x'
    assert text_field({'a': '  '}, 'a', 'q') is None
    assert text_field({}, 'a', 'q') is None


@pytest.mark.parametrize('entry,numbers,message', [
    ({}, False, 'q.a is required'),
    ({'a': ' '}, False, 'q.a is required'),
    ({'a': 3}, False, 'q.a: 3 is not a string'),
    ({'a': True}, True, 'q.a: True is not a string'),
    ({'a': [1]}, True, 'q.a: [1] is not a string'),
])
def test_text_field_errors_name_the_field(entry, numbers, message):
    with pytest.raises(Bad) as err:
        text_field(entry, 'a', 'q', required=True, error=Bad, numbers=numbers)
    assert str(err.value) == message


def test_numbers_are_taken_as_their_digits_when_allowed():
    assert text_field({'a': 42}, 'a', 'q', numbers=True) == '42'


@pytest.mark.parametrize('url,userinfo', [
    ('http://ops:Pr0xy@proxy:3128', 'ops:Pr0xy'),
    ('socks5h://TOKEN@10.0.0.1:1080', 'TOKEN'),
    ('https://prometheus:9090/x@y', None),      # an @ in the path is no userinfo
    ('http://@proxy', None),
    ('proxy:3128', None),
    (None, None),
])
def test_url_userinfo(url, userinfo):
    assert url_userinfo(url) == userinfo


def test_show_bounds_an_int_too_long_for_repr():
    # repr() of an int of more than 4300 digits raises ValueError: a message must not (review 2026-12-06 T3-14)
    assert show(10 ** 5000) == '<a number of more than 4300 digits>'
    assert show(-10 ** 5000) == '<a number of more than 4300 digits>'
    assert show(10 ** 200, 20) == '1' + '0' * 16 + '...'
