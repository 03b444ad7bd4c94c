#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: package_index
short_description: Refresh the node's package lists when they are older than a bound
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Runs C(apt-get update) (C(dnf makecache) on the RHEL family) so that what the repositories offer is read from
    lists no older than O(cache_valid_time). The availability checks that follow (M(gpufleet.upgrade.driver_pin) in
    check mode, M(gpufleet.upgrade.kernel_check)) then refuse a target the mirror does not offer before a node is
    drained, instead of failing at the install afterwards.
  - "apt: the lists' age is the newest of C(/var/lib/apt/periodic/update-success-stamp) and the index files in
    C(/var/lib/apt/lists); younger than O(cache_valid_time), nothing runs. An update that found nothing new rewrites
    no index, so the age may overstate and a refresh run again; it never understates."
  - "dnf: C(makecache) with C(metadata_expire) set to O(cache_valid_time), so dnf refreshes each repository whose
    metadata is older."
  - Changes no installed package, pin or hold; only the package manager's cache of the repositories' indexes.
  - Runs on the GPU node (Python 3.9 or later).
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.mutating
attributes:
  diff_mode:
    support: none
    details:
      - The lists are a cache of the repositories; there is nothing to show.
options:
  cache_valid_time:
    description:
      - Seconds the package lists stay valid. V(0) refreshes them every time.
    type: int
    default: 3600
  backend:
    description:
      - The package manager. V(auto) decides as M(gpufleet.upgrade.kernel_packages) does, from the managed system's
        C(os-release) (under O(installroot)) and the tools on the node.
    type: str
    choices: [auto, apt, dnf]
    default: auto
  installroot:
    description:
      - Operate on the system under this directory instead of C(/).
    type: path
notes:
  - In check mode nothing runs; C(changed) says whether a refresh would (apt; on dnf always true, dnf decides per
    repository).
seealso:
  - module: gpufleet.upgrade.driver_pin
  - module: gpufleet.upgrade.kernel_check
"""

EXAMPLES = r"""
- name: Refresh the package lists when older than an hour, before the availability checks
  gpufleet.upgrade.package_index:
    cache_valid_time: 3600
"""

RETURN = r"""
backend:
  description: The package manager (apt or dnf).
  returned: success
  type: str
  sample: apt
refreshed:
  description: Whether the refresh ran (in check mode, whether it would).
  returned: success
  type: bool
age:
  description: Seconds since apt's lists were refreshed, before this run; null when never, or on dnf.
  returned: success
  type: float
commands:
  description: The commands run.
  returned: always
  type: list
  elements: list
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel as kn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import HostTask, module_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            cache_valid_time=dict(type='int', default=3600),
            backend=dict(type='str', default='auto', choices=['auto', 'apt', 'dnf']),
            installroot=dict(type='path'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p['cache_valid_time'] < 0:
        module.fail_json(msg='package_index: cache_valid_time must be 0 or more seconds, got %d' % p['cache_valid_time'])
    if p['installroot'] and not os.path.isdir(p['installroot']):
        module.fail_json(msg='package_index: installroot %r is not a directory' % p['installroot'])
    with HostTask(module, 'package_index', (pk.PackageError, kn.KernelError), report_commands=True) as task:
        runner = module_runner(module, p['installroot'])
        name = kn.managed_backend(runner) if p['backend'] == 'auto' else p['backend']
        backend = pk.AptBackend(runner) if name == 'apt' else pk.DnfBackend(runner)
        task.backend = backend
        age = backend.index_age() if name == 'apt' else None
        if module.check_mode:  # dnf decides per repository: a refresh may always run there
            refreshed = name == 'dnf' or pk.refresh_due(age, p['cache_valid_time'])
        else:
            refreshed = backend.update_cache(p['cache_valid_time'])
        module.exit_json(changed=refreshed, backend=name, refreshed=refreshed, age=age,
                         commands=list(backend.runner.commands))


if __name__ == '__main__':
    main()
