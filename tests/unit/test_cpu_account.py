"""tests/tools/cpu_account.py: the lab benchmark's accounting of node-side CPU."""
from __future__ import annotations

import pathlib
import subprocess
import sys

from tools import cpu_account

TOOL = pathlib.Path(__file__).resolve().parents[1] / 'tools' / 'cpu_account.py'


def test_logs_the_commands_cpu_and_keeps_its_exit_status_and_output(tmp_path):
    log = tmp_path / 'cpu.log'
    burn = 'import sys; x = sum(i * i for i in range(3_000_000)); print("out"); sys.exit(3)'
    p = subprocess.run([sys.executable, str(TOOL), str(log), sys.executable, '-c', burn],
                       capture_output=True, text=True, check=False, timeout=120)
    assert p.returncode == 3 and p.stdout == 'out\n'
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and float(lines[0]) > 0.05
    subprocess.run([sys.executable, str(TOOL), str(log), 'true'], check=True, timeout=60)
    assert len(log.read_text().splitlines()) == 2
    assert cpu_account.total(str(log)) == sum(float(x) for x in log.read_text().split())


def test_total_of_a_missing_log_is_zero_and_usage_is_explained(tmp_path):
    assert cpu_account.total(str(tmp_path / 'none.log')) == 0.0
    p = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, check=False, timeout=60)
    assert p.returncode == 2 and 'usage: cpu_account.py LOG COMMAND' in p.stderr
