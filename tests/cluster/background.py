"""The loop every stand-in of tests/cluster runs in a daemon thread while its context is open.

    class MyStandIn(Background):
        label = 'my stand-in'
        def step(self) -> None: ...      # one pass; what goes wrong goes into self.errors

    with MyStandIn(interval=0.2) as s:
        ...                              # a clean exit raises AssertionError with s.errors (raise_errors)
"""
from __future__ import annotations

import threading
from typing import Any, TypeVar

B = TypeVar('B', bound='Background')


class Background:
    """`step()` every `interval` seconds in a daemon thread between __enter__ and __exit__; `errors` collects
    what the steps record, raised on a clean exit when `raise_errors`; the thread is joined within `join_timeout`."""

    label = 'stand-in'
    raise_errors = True
    join_timeout = 30.0

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self.label.replace(' ', '-'), daemon=True)

    def __enter__(self: B) -> B:
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=self.join_timeout)
        if self.raise_errors and self.errors and exc_type is None:
            raise AssertionError('%s: %s' % (self.label, '; '.join(self.errors[:5])))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.step()

    def step(self) -> None:
        raise NotImplementedError
