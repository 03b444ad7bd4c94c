"""Shared pytest set-up for every test layer.

`make units` / `make integration` put `.venv/collections` and `tests/` on sys.path (pytest.ini),
so tests import the collection as `ansible_collections.gpufleet.upgrade...` and the test support
packages (`cluster`, `tools`) by their plain names.
"""
from __future__ import annotations

import os
import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV_BIN = REPO_ROOT / '.venv' / 'bin'

# Subprocesses (ansible-playbook, kubectl, ansible-test) come from the project's venv.
if VENV_BIN.is_dir() and str(VENV_BIN) not in os.environ.get('PATH', '').split(os.pathsep):
    os.environ['PATH'] = str(VENV_BIN) + os.pathsep + os.environ.get('PATH', '')
os.environ.setdefault('ANSIBLE_COLLECTIONS_PATH', str(REPO_ROOT / '.venv' / 'collections'))

# Fixtures of the test tools: the real control plane (`control_plane`, `cluster`), the NVML stand-in
# (`fake_nvml`, `nvml_stub_lib`); each test's wall and CPU where GPUFLEET_TIMINGS is set (`tools.suite_timings`).
pytest_plugins = ['cluster.pytest_plugin', 'tools.nvml_stub', 'tools.suite_timings']


# How pytest-xdist shares the tests (the Makefile's PYTEST_N: --dist loadgroup --no-loadscope-reorder). Each
# test module is one unit of work, kept on one worker, so a module- or session-scoped fixture of its own (a
# lab, the real GPU Operator) is built once. The modules in SPREAD, whose tests each run whole playbooks on a
# lab of their own (minutes each) and share no fixture but the worker's control plane, are spread test by
# test instead, and go first: the workers share the long tests from the start, the other integration
# modules follow and the unit tests fill the end, so no worker is left alone on a long test while the
# others are idle. A module added to SPREAD must have no module-scoped fixture. The order is stable and
# the same on every worker, as xdist requires.
SPREAD = ('test_lab.py', 'test_rollout_resume.py', 'test_rollout_observation.py', 'test_rollout_parallel.py',
          'test_rollout_pause.py', 'test_rollout_rke2.py', 'test_rollout_wiring.py', 'test_fault_campaign.py',
          'test_awx_workflow.py')


def _share(item) -> int:
    if item.path.parent.name != 'integration':
        return 2
    return 0 if item.path.name in SPREAD else 1


@pytest.hookimpl(tryfirst=True)    # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items):
    for item in items:
        if _share(item) != 0:
            item.add_marker(pytest.mark.xdist_group(str(item.path.relative_to(REPO_ROOT))))
    items.sort(key=_share)
