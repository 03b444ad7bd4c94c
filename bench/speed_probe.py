"""How fast the machine is while a benchmark runs: a thread that does one fixed piece of work every few seconds
and records the CPU seconds it took (the thread's own CPU clock, so neither waiting for a core nor for the GIL
counts; only how much a core does per CPU second).

A benchmark that compares the CPU of two runs made one after the other (bench/rollout_scale.py: the rollout,
then its ping floor) assumes the machine did the same work for the same CPU seconds in both. On a shared virtual
machine it need not: a busier host (another guest on the core's sibling, a lower clock) makes every process of
the guest take more CPU seconds for the same work, and that lands on whichever run was going. The probe's mean
over each run's time says by how much, and `at_speed` scales one run's CPU to another's speed.

The work is what Ansible and its modules mostly do on the controller: compile Python source and round-trip
JSON. It is a thread of the benchmark, not a process: its CPU is in no child's account, so it never lands in
the figures it corrects. About 30 ms of CPU every 5 s (under 1 % of one core) on the 2-core build machine.
"""
from __future__ import annotations

import json
import threading
import time

# Fixed work: a module-sized source to compile and a result-sized document to encode and decode.
_SOURCE = '\n'.join(
    'def f%d(a, b=None, *args, **kw):\n    x = [i * a for i in range(10) if i %% 2]\n    return {"k": x, "b": b}\n' % i
    for i in range(60))
_DOC = {'changed': False, 'invocation': {'module_args': {'name': 'gpu-1', 'labels': {'a': 'b' * 20}}},
        'items': [{'n': i, 's': 'x' * 40, 'f': i / 7.0} for i in range(40)]}


def work() -> float:
    """The fixed work once; the CPU seconds it took on this thread."""
    t0 = time.thread_time()
    for _round in range(12):
        compile(_SOURCE, '<speed-probe>', 'exec')
        for _copy in range(10):
            json.loads(json.dumps(_DOC))
    return time.thread_time() - t0


def mean_between(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The mean CPU seconds of the samples (time, seconds) taken in [start, end]; None when none was."""
    inside = [cpu for t, cpu in samples if start <= t <= end]
    return sum(inside) / len(inside) if inside else None


def at_speed(cpu: float, probe_during: float | None, probe_reference: float | None) -> float | None:
    """`cpu` measured while the probe took `probe_during`, scaled to the speed of a time when it took
    `probe_reference` (a slower machine, a larger probe: its CPU shrinks when brought to a faster one)."""
    if not probe_during or not probe_reference:
        return None
    return cpu * probe_reference / probe_during


class SpeedProbe:
    """The fixed work every `every` seconds in a daemon thread, from start() to stop(); `samples` holds
    (wall-clock time, CPU seconds) of each."""

    def __init__(self, every: float = 5.0) -> None:
        if every <= 0:
            raise ValueError('every: %r is not a positive number of seconds' % (every,))
        self.every = every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            cpu = work()
            self.samples.append((time.time(), cpu))
            if self._stop.wait(self.every):
                return

    def start(self) -> SpeedProbe:
        self._thread = threading.Thread(target=self._run, name='speed-probe', daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def mean(self, start: float, end: float) -> float | None:
        return mean_between(list(self.samples), start, end)
