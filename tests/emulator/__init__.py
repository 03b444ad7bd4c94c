"""Kubernetes API emulator for tests and the lab (not shipped in the collection artifact).

    from emulator import Emulator, fixtures
    with Emulator() as emu:
        emu.apply([fixtures.gpu_node('gpu-1'), fixtures.gpu_pod('train', 'gpu-1')])

See tests/emulator/README.md.
"""
from __future__ import annotations

from . import fixtures
from .emulator import Emulator
from .faults import Fault, Faults
from .resources import ResourceType
from .simulator import Simulator
from .store import ApiError

__all__ = ['Emulator', 'fixtures', 'Fault', 'Faults', 'ResourceType', 'Simulator', 'ApiError']
