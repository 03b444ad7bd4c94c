# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""The names of the NVIDIA GPU extended resources, one definition for the whole collection.

The NVIDIA device plugin advertises whole GPUs as ``nvidia.com/gpu``; with time-slicing or MPS
and ``renameByDefault`` the shared replicas as ``nvidia.com/gpu.shared``; with the MIG ``mixed``
strategy one resource per profile, ``nvidia.com/mig-<profile>`` (``nvidia.com/mig-1g.10gb``, and
``nvidia.com/mig-1g.10gb.shared`` when those are shared too).
"""
from __future__ import annotations

import re

__all__ = ['GPU', 'GPU_RESOURCES', 'GPU_SHARED', 'MIG_PREFIX', 'is_gpu_resource']

GPU = 'nvidia.com/gpu'
GPU_SHARED = 'nvidia.com/gpu.shared'
MIG_PREFIX = 'nvidia.com/mig-'
# As a list of names and prefixes (an entry ending in * is a prefix): gpu_holders_info's default.
GPU_RESOURCES = (GPU, GPU_SHARED, MIG_PREFIX + '*')

_MIG_RE = re.compile(re.escape(MIG_PREFIX) + r'[0-9a-z.+-]+')


def is_gpu_resource(name: str) -> bool:
    """`name` is one of the NVIDIA GPU resources above (a MIG name needs a profile)."""
    return name in (GPU, GPU_SHARED) or _MIG_RE.fullmatch(name) is not None
