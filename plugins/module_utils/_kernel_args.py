# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""Argument spec and request building shared by kernel_check and kernel_packages (their options
are documented in the gpufleet.upgrade.kernel doc fragment)."""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, Optional, Union

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fsio
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel as kn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import module_runner

_SPEC: Dict[str, Dict[str, Any]] = dict(
    kernel=dict(type='str', required=True),
    branch=dict(type='str', required=True),
    driver_version=dict(type='str', required=True),
    module_source=dict(type='str', required=True, choices=list(kn.MODULE_SOURCES)),
    previous_kernel=dict(type='str'),
    previous_driver_version=dict(type='str'),
    check_way_back=dict(type='bool', default=True),
    installroot=dict(type='path'),
    proc_path=dict(type='path', default='/proc'),
    update_cache=dict(type='bool', default=False),
)


def argument_spec() -> Dict[str, Dict[str, Any]]:
    return copy.deepcopy(_SPEC)


def make_node(module: Any) -> Union[kn.AptKernel, kn.DnfKernel]:
    """The node through apt or dnf: `_kernel.kernel_backend` decides from the managed system's
    os-release (under O(installroot) when given) and the tools on the node."""
    p = module.params
    if p['installroot'] and not os.path.isdir(p['installroot']):
        raise kn.KernelError('installroot %r is not a directory' % p['installroot'])
    runner = module_runner(module, p['installroot'])
    if kn.managed_backend(runner) == 'dnf':
        return kn.DnfKernel(runner)
    return kn.AptKernel(pk.AptBackend(runner))


def running_kernel(proc_path: str) -> Optional[str]:
    text = _fsio.read_text(os.path.join(proc_path, 'sys/kernel/osrelease'))
    return text.strip() if text else None


def request(module: Any) -> kn.KernelRequest:
    p = module.params
    return kn.KernelRequest(kernel=p['kernel'], branch=p['branch'], driver_version=p['driver_version'],
                            module_source=p['module_source'], previous_kernel=p['previous_kernel'],
                            previous_driver_version=p['previous_driver_version'], check_way_back=p['check_way_back'])
