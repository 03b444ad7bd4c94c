"""Fault injection: answer matching requests with an error status and/or after a delay."""
from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any, Pattern


@dataclasses.dataclass
class Fault:
    method: str | None          # HTTP verb, None for any
    path: Pattern[str]          # searched in the request path
    status: int | None          # error status to answer; None: serve normally (after `delay`)
    delay: float                # seconds to wait before answering
    times: int | None           # how many matching requests to affect; None: all of them
    query: dict[str, str] | None = None   # query parameters that must be present with these values
    message: str | None = None
    hits: int = 0               # how many requests it affected so far

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


class Faults:
    """`emu.faults.add(method='PATCH', path=r'/nodes/gpu-1$', status=409, times=2)`.

    Faults are checked in the order they were added; the first live match applies. A slow answer
    is `delay=` without `status=` (the request is then served normally), or both.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, method: str | None = None, path: str = '', status: int | None = None, delay: float = 0.0,
            times: int | None = None, query: dict[str, str] | None = None, message: str | None = None) -> Fault:
        if status is None and not delay:
            raise ValueError('a fault needs status= or delay=')
        fault = Fault(method.upper() if method else None, re.compile(path), status, float(delay), times, query,
                      message)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def __iter__(self):  # type: ignore[no-untyped-def]
        with self._lock:
            return iter(list(self._faults))

    def match(self, method: str, path: str, query: dict[str, Any]) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.exhausted:
                    continue
                if fault.method and fault.method != method.upper():
                    continue
                if not fault.path.search(path):
                    continue
                if fault.query and any(query.get(k) != v for k, v in fault.query.items()):
                    continue
                fault.hits += 1
                return fault
        return None
