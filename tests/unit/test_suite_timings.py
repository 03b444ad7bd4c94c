"""tests/tools/suite_timings.py: the suite's time by test module and by lab phase (issue 36)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from tools import suite_timings

BURN = 'x = sum(i * i for i in range(4_000_000))'


def test_cpu_now_counts_a_live_child_and_a_reaped_one():
    before = suite_timings.cpu_now()
    child = subprocess.Popen([sys.executable, '-c', BURN + '\nimport time; time.sleep(30)'])
    try:
        deadline = time.monotonic() + 60
        while suite_timings.cpu_now() - before < 0.1:       # the live child's CPU, read from /proc
            assert time.monotonic() < deadline, 'the running child\'s CPU was never counted'
            time.sleep(0.05)
        alive = suite_timings.cpu_now() - before
    finally:
        child.kill()
        child.wait()
    # reaped: its CPU moves to this process's children rusage and is neither lost nor counted twice
    reaped = suite_timings.cpu_now() - before
    assert alive >= 0.1 and alive - 0.05 <= reaped <= alive + 0.5, (alive, reaped)


def test_records_go_to_the_directory_only_when_it_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv(suite_timings.ENV, raising=False)
    suite_timings.append('lab', {'phase': 'plan', 'wall': 1.0, 'cpu': 0.5})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(suite_timings.ENV, str(tmp_path / 'timings'))
    monkeypatch.setenv('PYTEST_CURRENT_TEST', 'tests/integration/test_x.py::test_a (call)')
    with suite_timings.Phase('fleet set-up', nodes=4):
        subprocess.run([sys.executable, '-c', BURN], check=True)
    [path] = (tmp_path / 'timings').glob('lab-*.jsonl')
    [record] = [json.loads(line) for line in path.read_text().splitlines()]
    assert record['phase'] == 'fleet set-up' and record['nodes'] == 4
    assert record['test'] == 'tests/integration/test_x.py::test_a'
    assert record['cpu'] >= 0.1 and record['wall'] >= record['cpu'] * 0.5


def _write(directory, kind, rows):
    directory.mkdir(exist_ok=True)
    (directory / ('%s-1.jsonl' % kind)).write_text(''.join(json.dumps(r) + '\n' for r in rows) + 'not json\n')


def test_the_report_sums_by_module_and_by_phase(tmp_path):
    _write(tmp_path, 'tests', [
        {'test': 'tests/integration/test_lab.py::test_a', 'module': 'tests/integration/test_lab.py', 'wall': 300, 'cpu': 200},
        {'test': 'tests/integration/test_lab.py::test_b', 'module': 'tests/integration/test_lab.py', 'wall': 100, 'cpu': 50},
        {'test': 'tests/unit/test_u.py::test_c', 'module': 'tests/unit/test_u.py', 'wall': 1, 'cpu': 1}])
    _write(tmp_path, 'lab', [
        {'test': 'tests/integration/test_lab.py::test_a', 'phase': 'canary', 'wall': 120, 'cpu': 90},
        {'test': 'tests/integration/test_lab.py::test_a', 'phase': 'rollout', 'wall': 90, 'cpu': 60},
        {'test': 'tests/integration/test_lab.py::test_b', 'phase': 'rollout', 'wall': 50, 'cpu': 20}])
    out = suite_timings.report(tmp_path, top=1)
    assert out.startswith('3 tests: 401 s of test wall time summed over the workers, 251 s of CPU '
                          '(2 tests ran a lab: 400 s of wall, 250 s of CPU)')
    assert '| tests/integration/test_lab.py | 2 | 400 | 250 | 300 | 100% |' in out
    assert '| 1 other modules | 1 | 1 | 1 | 1 | 0% |' in out
    assert '| rollout | 2 | 140 | 80 | 70.0 |' in out and '| canary | 1 | 120 | 90 | 120.0 |' in out
    assert out.index('| rollout |') < out.index('| canary |')          # by wall time
    assert '| tests/integration/test_lab.py::test_a | 300 | 200 |' in out


def test_the_report_of_an_empty_directory_says_how_to_fill_it(tmp_path):
    assert suite_timings.report(tmp_path).startswith('no test timings under %s (run pytest with GPUFLEET_TIMINGS=' % tmp_path)
