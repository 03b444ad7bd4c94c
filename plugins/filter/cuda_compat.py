# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters over the CUDA compatibility rules: cuda_compat and cuda_minimum_driver (docs in the sidecar YAML files)."""

from __future__ import annotations

from typing import Any, Dict, List

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils._cuda_compat import (
    CudaCompatError, check, minimum_drivers,
)


def cuda_compat(applications: List[Dict[str, Any]], driver: str, gpu_class: str = 'other') -> Dict[str, Any]:
    """Every declared application against the target driver."""
    try:
        return check(applications, driver, gpu_class)
    except CudaCompatError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.cuda_compat: %s' % exc)


def cuda_minimum_driver(toolkit: str) -> Dict[str, Any]:
    """The drivers a toolkit needs for backward and for minor-version compatibility."""
    try:
        return minimum_drivers(toolkit)
    except CudaCompatError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.cuda_minimum_driver: %s' % exc)


class FilterModule(object):
    def filters(self) -> Dict[str, Any]:
        return {'cuda_compat': cuda_compat, 'cuda_minimum_driver': cuda_minimum_driver}
