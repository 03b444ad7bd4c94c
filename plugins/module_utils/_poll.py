# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""One bounded wait for every wait of the collection.

``poll(fn, timeout, interval)`` calls ``fn`` until ``done(value)`` holds or ``timeout`` seconds
have passed since the first call. It never waits past its deadline: the last sleep is cut to the
deadline, and one last call is made there. ``fn`` is always called at least once (a ``timeout`` of
0 is one look). ``interval`` is a number of seconds, or a function of no argument that gives the
next pause (for waits whose pause depends on what ``fn`` saw); a pause of 0 or less is no sleep. ``clock`` and ``sleep`` are seams
for unit tests.
"""
from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple, TypeVar, Union

__all__ = ['Polled', 'poll']

T = TypeVar('T')


class Polled(NamedTuple):
    """What a wait ended with: the last value of ``fn``, whether it was done, how many calls,
    and the seconds from the first call to the last."""
    value: Any
    done: bool
    attempts: int
    elapsed: float


def poll(fn: Callable[[], T], timeout: float, interval: Union[float, Callable[[], float]],
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
         done: Callable[[T], Any] = bool) -> Polled:
    """Call ``fn`` until ``done(fn())`` or the deadline ``timeout`` seconds after the start.

    Raises ValueError for a negative ``timeout``; whatever ``fn`` raises goes through."""
    if timeout < 0:
        raise ValueError('timeout %r must be 0 or more seconds' % (timeout,))
    start = clock()
    deadline = start + timeout
    attempts = 0
    while True:
        attempts += 1
        value = fn()
        now = clock()
        if done(value):
            return Polled(value, True, attempts, now - start)
        if now >= deadline:
            return Polled(value, False, attempts, now - start)
        pause = min(interval() if callable(interval) else interval, deadline - now)
        if pause > 0:
            sleep(pause)
