"""Run a command, then append its CPU seconds (user + system of it and everything it waited for)
to a log file, one line per run.

The lab's benchmark (bench/lab_overhead.py, lab.py --account-node-cpu) wraps with it what in a real
fleet does not run on the controller: the modules run on the GPU nodes (their Python interpreter)
and the lab's emulated reboots and driver reloads (its hook). What the ansible tree spent minus the
log's sum is the controller's own CPU: playbook, workers, templating, and the modules delegated to
the controller (the Kubernetes API calls, the evidence bundle, the metric gate's queries).

    python cpu_account.py LOG COMMAND [ARG ...]
"""
from __future__ import annotations

import fcntl
import resource
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        sys.stderr.write('usage: cpu_account.py LOG COMMAND [ARG ...]\n')
        return 2
    log, command = argv[1], argv[2:]
    rc = subprocess.call(command)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, 'a', encoding='ascii') as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write('%.4f\n' % (used.ru_utime + used.ru_stime))
    return rc


def total(log: str) -> float:
    """The CPU seconds logged so far (0 when nothing ran yet)."""
    try:
        with open(log, encoding='ascii') as f:
            return sum(float(line) for line in f if line.strip())
    except FileNotFoundError:
        return 0.0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
