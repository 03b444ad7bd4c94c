"""pytest fixtures of the real control plane (registered in tests/conftest.py).

- `control_plane` (session): one control plane and fault proxy per pytest session, started on first
  use, stopped at the end (no process left behind).
- `cluster` (function): the `Cluster` test-side API on it, reset before each test (every test's
  objects, nodes, proxy rules and request log gone), so tests are isolated by running one at a time
  on it (under pytest-xdist each worker is its own session, with its own control plane).
"""
from __future__ import annotations

import sys
from typing import Iterator

import pytest

from . import start_cluster
from .client import Cluster


def _log(msg: str) -> None:
    print(msg, file=sys.__stderr__, flush=True)


@pytest.fixture(scope='session')
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cp, proxy, cluster = start_cluster(tmp_path_factory.mktemp('control-plane'), log=_log)
    try:
        yield cluster
    finally:
        cluster.stop_informers()
        proxy.stop()
        cp.stop()


@pytest.fixture
def cluster(control_plane: Cluster) -> Iterator[Cluster]:
    control_plane.reset()
    yield control_plane
