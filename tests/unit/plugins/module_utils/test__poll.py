# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unit tests for _poll: the one bounded wait, on a fake clock."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import Polled, poll


class Clock:
    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def test_returns_at_once_when_done_first():
    c = Clock()
    assert poll(lambda: 'x', 10, 1, c, c.sleep) == Polled('x', True, 1, 0.0)
    assert c.sleeps == []


def test_the_last_sleep_is_cut_to_the_deadline_and_one_last_look_is_taken():
    c = Clock()
    r = poll(lambda: None, 25, 10, c, c.sleep)
    assert c.sleeps == [10, 10, 5]
    assert r == Polled(None, False, 4, 25.0)
    assert c.now == 125.0


def test_never_overruns_when_fn_itself_takes_time():
    c = Clock()

    def slow():
        c.now += 3
        return False
    r = poll(slow, 10, 4, c, c.sleep)
    # 0+3 → sleep 4 → 10 → sleep 0 (deadline reached) is not taken: 10 >= deadline ends the wait
    assert c.sleeps == [4] and r.attempts == 2 and not r.done and r.elapsed == 10.0


def test_timeout_zero_is_one_look():
    c = Clock()
    assert poll(lambda: 0, 0, 5, c, c.sleep) == Polled(0, False, 1, 0.0)
    assert c.sleeps == []


def test_done_predicate_and_value_of_the_last_call():
    c = Clock()
    seen = iter([{'ok': False, 'n': 1}, {'ok': False, 'n': 2}, {'ok': True, 'n': 3}])
    r = poll(lambda: next(seen), 60, 2, c, c.sleep, done=lambda v: v['ok'])
    assert r == Polled({'ok': True, 'n': 3}, True, 3, 4.0)
    assert c.sleeps == [2, 2]


def test_callable_interval_is_asked_each_round_and_still_bounded():
    c = Clock()
    pauses = iter([0.5, 3.0, 100.0])
    r = poll(lambda: False, 5, lambda: next(pauses), c, c.sleep)
    assert c.sleeps == [0.5, 3.0, 1.5] and r.elapsed == 5.0 and r.attempts == 4


def test_negative_timeout_is_refused_and_fn_errors_pass_through():
    with pytest.raises(ValueError, match='timeout -1 must be 0 or more seconds'):
        poll(lambda: True, -1, 1)

    def boom():
        raise KeyError('x')
    with pytest.raises(KeyError):
        poll(boom, 1, 1, sleep=lambda s: None)
