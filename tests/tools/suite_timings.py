"""Where the test suite's time goes: wall and CPU by test module and by lab phase (issue 36).

Two writers, one reader:

- the pytest plugin below (`tests/conftest.py` registers it; on when `GPUFLEET_TIMINGS` names a directory, as
  `make test` sets it) writes one JSON line per test: its wall time and its CPU, counted as the worker's own CPU
  plus that of every process below it (alive ones read from /proc with their reaped children, reaped ones from
  the worker's rusage), before and after the test;
- the lab (`tests/tools/lab.py`, in-process or as `lab.py`) writes one JSON line per phase it runs (fleet
  set-up, plan, canary, approval, upgrade_check, rollout, release) with the test that ran it
  (`PYTEST_CURRENT_TEST`, which pytest exports to the processes a test starts);
- `python tests/tools/suite_timings.py DIR` prints the breakdown (markdown tables) of a run.

Processes that leave the worker's tree (a daemon re-parented to init) are not counted; none of the suite's does.
The CPU of one test includes what other tests' processes did not: with three workers on two cores a test's wall
time includes waiting for a core, which is why both figures are printed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import resource
import sys
import threading
import time
from typing import Any, Iterable

ENV = 'GPUFLEET_TIMINGS'
_TICK = os.sysconf('SC_CLK_TCK') if hasattr(os, 'sysconf') else 100
_lock = threading.Lock()


def _tree_cpu(root: int) -> float:
    """CPU seconds of `root`'s descendants that are alive (each with its own reaped children), from /proc."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for stat in pathlib.Path('/proc').glob('[0-9]*/stat'):
        try:
            fields = stat.read_text().rsplit(')', 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        # utime stime cutime cstime: fields 14-17 of stat, 12-15 after the command's closing parenthesis
        cpu[pid] = sum(int(x) for x in fields[11:15]) / _TICK
    total, todo = 0.0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def cpu_now() -> float:
    """This process's CPU, its reaped children's and its live descendants'."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + _tree_cpu(os.getpid())


def append(kind: str, record: dict[str, Any]) -> None:
    """One JSON line into $GPUFLEET_TIMINGS/<kind>-<pid>.jsonl; nothing when it is not set."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    line = json.dumps(dict(record, test=record.get('test') or current_test())) + '\n'
    with _lock, open(path / ('%s-%d.jsonl' % (kind, os.getpid())), 'a', encoding='utf-8') as f:
        f.write(line)


def current_test() -> str:
    """The pytest node id of the running test (pytest exports it to the processes a test starts), or ''."""
    return os.environ.get('PYTEST_CURRENT_TEST', '').rsplit(' (', 1)[0]


class Phase:
    """`with Phase('canary'):` records a lab phase's wall and CPU (this process and what it started)."""

    def __init__(self, phase: str, **extra: Any) -> None:
        self.phase, self.extra = phase, extra

    def __enter__(self) -> 'Phase':
        self.t0, self.c0 = time.monotonic(), cpu_now()
        return self

    def __exit__(self, *exc: Any) -> None:
        append('lab', dict(self.extra, phase=self.phase, wall=time.monotonic() - self.t0, cpu=cpu_now() - self.c0))


# -- the pytest plugin ----------------------------------------------------------------------------------------
def _hookwrapper(fn: Any) -> Any:
    try:
        import pytest
    except ImportError:      # the lab's own run (lab.py) imports this module without pytest's plugin
        return fn
    return pytest.hookimpl(hookwrapper=True)(fn)


@_hookwrapper
def pytest_runtest_protocol(item: Any, nextitem: Any):  # type: ignore[no-untyped-def]
    if not os.environ.get(ENV):
        yield
        return
    t0, c0 = time.monotonic(), cpu_now()
    yield
    append('tests', {'test': item.nodeid, 'module': item.nodeid.split('::', 1)[0], 'wall': time.monotonic() - t0,
                     'cpu': cpu_now() - c0, 'worker': os.environ.get('PYTEST_XDIST_WORKER', 'main')})


# -- the report -----------------------------------------------------------------------------------------------
def _read(directory: pathlib.Path, kind: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob('%s-*.jsonl' % kind)):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    header = list(header)
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def report(directory: pathlib.Path, top: int = 25) -> str:
    tests, phases = _read(directory, 'tests'), _read(directory, 'lab')
    if not tests:
        return 'no test timings under %s (run pytest with %s=%s)' % (directory, ENV, directory)
    by_module: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for t in tests:
        by_module[t['module']].append(t)
    wall = sum(t['wall'] for t in tests)
    cpu = sum(t['cpu'] for t in tests)
    lab_tests = {p['test'] for p in phases}
    out = ['%d tests: %.0f s of test wall time summed over the workers, %.0f s of CPU (%d tests ran a lab: %.0f s of '
           'wall, %.0f s of CPU)' % (len(tests), wall, cpu, len(lab_tests),
                                     sum(t['wall'] for t in tests if t['test'] in lab_tests),
                                     sum(t['cpu'] for t in tests if t['test'] in lab_tests)), '',
           '**By test module** (the %d with the most CPU; the rest summed)' % top, '']
    rows = sorted(by_module.items(), key=lambda kv: -sum(t['cpu'] for t in kv[1]))
    shown = [(m, len(ts), '%.0f' % sum(t['wall'] for t in ts), '%.0f' % sum(t['cpu'] for t in ts),
              '%.0f' % max(t['wall'] for t in ts), '%.0f%%' % (100 * sum(t['cpu'] for t in ts) / cpu if cpu else 0))
             for m, ts in rows[:top]]
    rest = [t for _m, ts in rows[top:] for t in ts]
    if rest:
        shown.append(('%d other modules' % (len(rows) - top), len(rest), '%.0f' % sum(t['wall'] for t in rest),
                      '%.0f' % sum(t['cpu'] for t in rest), '%.0f' % max(t['wall'] for t in rest),
                      '%.0f%%' % (100 * sum(t['cpu'] for t in rest) / cpu if cpu else 0)))
    out.append(_table(('module', 'tests', 'wall s', 'CPU s', 'longest test s', 'share of CPU'), shown))
    if phases:
        by_phase: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for p in phases:
            by_phase[p['phase']].append(p)
        out += ['', '**By lab phase** (every lab a test ran; CPU: for the fleet set-up everything the lab started, '
                'its control plane included; for a playbook ansible-playbook and the modules it ran)', '']
        out.append(_table(('phase', 'runs', 'wall s', 'CPU s', 'mean wall s'), [
            (ph, len(ps), '%.0f' % sum(p['wall'] for p in ps), '%.0f' % sum(p['cpu'] for p in ps),
             '%.1f' % (sum(p['wall'] for p in ps) / len(ps)))
            for ph, ps in sorted(by_phase.items(), key=lambda kv: -sum(p['wall'] for p in kv[1]))]))
    out += ['', '**The %d longest tests**' % min(top, len(tests)), '']
    out.append(_table(('test', 'wall s', 'CPU s'), [
        (t['test'], '%.0f' % t['wall'], '%.0f' % t['cpu']) for t in sorted(tests, key=lambda t: -t['wall'])[:top]]))
    return '\n'.join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('directory', type=pathlib.Path, nargs='?', default=pathlib.Path('tests/output/timings'))
    parser.add_argument('--top', type=int, default=25)
    args = parser.parse_args(argv)
    print(report(args.directory, args.top))
    return 0


if __name__ == '__main__':
    sys.exit(main())
