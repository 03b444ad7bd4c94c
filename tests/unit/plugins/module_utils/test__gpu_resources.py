# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one definition of the NVIDIA GPU resource names, and its users agreeing on it."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpu_resources as R
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _holders as H


@pytest.mark.parametrize('name', ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/mig-1g.10gb',
                                  'nvidia.com/mig-3g.40gb.shared', 'nvidia.com/mig-1g.5gb+me'])
def test_gpu_resources(name):
    assert R.is_gpu_resource(name)
    assert H.resource_matches(name, H.DEFAULT_GPU_RESOURCES)


@pytest.mark.parametrize('name', ['nvidia.com/gpu.count', 'nvidia.com/mig-', 'nvidia.com/gpux', 'amd.com/gpu',
                                  'cpu', 'nvidia.com/gpu\n'])
def test_not_gpu_resources(name):
    assert not R.is_gpu_resource(name)


def test_the_holders_default_is_the_one_list():
    assert tuple(H.DEFAULT_GPU_RESOURCES) == R.GPU_RESOURCES
