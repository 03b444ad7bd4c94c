"""pytest fixture `emulator`: a fresh Kubernetes API emulator per test (registered in tests/conftest.py)."""
from __future__ import annotations

from typing import Iterator

import pytest

from .emulator import Emulator


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator() as emu:
        yield emu
