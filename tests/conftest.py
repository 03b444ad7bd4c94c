"""Shared pytest set-up for every test layer.

`make units` / `make integration` put `.venv/collections` and `tests/` on sys.path (pytest.ini),
so tests import the collection as `ansible_collections.gpufleet.upgrade...` and the test support
packages (`cluster`, `tools`) by their plain names.
"""
from __future__ import annotations

import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV_BIN = REPO_ROOT / '.venv' / 'bin'

# Subprocesses (ansible-playbook, kubectl, ansible-test) come from the project's venv.
if VENV_BIN.is_dir() and str(VENV_BIN) not in os.environ.get('PATH', '').split(os.pathsep):
    os.environ['PATH'] = str(VENV_BIN) + os.pathsep + os.environ.get('PATH', '')
os.environ.setdefault('ANSIBLE_COLLECTIONS_PATH', str(REPO_ROOT / '.venv' / 'collections'))

# Fixtures of the test tools: the real control plane (`control_plane`, `cluster`), the NVML stand-in
# (`fake_nvml`, `nvml_stub_lib`).
pytest_plugins = ['cluster.pytest_plugin', 'tools.nvml_stub']
