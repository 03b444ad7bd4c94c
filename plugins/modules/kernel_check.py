#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_check
short_description: Preflight of a kernel and NVIDIA driver change on a GPU node (read only)
version_added: 0.1.0
author:
  - gpufleet.upgrade contributors (@gpufleet)
description:
  - Checks, before anything moves, that the node's configured repositories offer the exact packages of the target
    kernel (C(linux-image-<kernel>), C(linux-modules-<kernel>), C(linux-modules-extra-<kernel>) where the archive has
    it) and, for the module source, the headers DKMS needs (C(linux-headers-<kernel>)) or Canonical's ABI-exact
    C(linux-modules-nvidia-<branch>-server-<kernel>) built for the target driver, plus the driver user space at the
    target version.
  - Checks the way back, the previous driver with modules for the previous kernel on the node, and that a rollback
    could reinstall them from the repositories.
  - Fails naming every missing package and every problem of the way back; changes nothing.
  - Ubuntu/Debian through apt; the RHEL family (the managed system's C(os-release) says so) through dnf, where the
    set is C(kernel), C(kernel-core), C(kernel-modules) (and C(kernel-modules-core)) at the kernel's
    version-release, C(kernel-devel) and C(kmod-nvidia-open-dkms) (V(dkms)) or NVIDIA's precompiled
    C(kmod-nvidia-open-<driver>-<kver>-<krel>) (V(prebuilt)), and the C(rhel-dnf) preset's driver user space at
    O(driver_version) (see C(docs/host.md)).
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
  - gpufleet.upgrade.kernel
notes:
  - Runs on the GPU node (Python 3.9 or later). O(update_cache) is not run in check mode.
seealso:
  - module: gpufleet.upgrade.kernel_packages
  - module: gpufleet.upgrade.kernel_boot
"""

EXAMPLES = r"""
---
- name: Preflight the kernel and driver change (before the drain)
  gpufleet.upgrade.kernel_check:
    kernel: 6.8.0-135-generic
    branch: "580"
    driver_version: 580.130.00
    module_source: prebuilt
  register: kernel_preflight

- name: Show what would be installed
  ansible.builtin.debug:
    var: kernel_preflight.packages
"""

RETURN = r"""
kernel:
  description: The target kernel release.
  returned: always
  type: str
  sample: 6.8.0-135-generic
kernel_version:
  description: The package version of the target kernel's packages (V(null) when not offered).
  returned: always
  type: str
  sample: 6.8.0-135.135
packages:
  description: The exact version of each kernel-side package (kernel, headers or prebuilt NVIDIA modules).
  returned: always
  type: dict
  sample: {linux-image-6.8.0-135-generic: 6.8.0-135.135, linux-modules-nvidia-580-server-6.8.0-135-generic: 6.8.0-135.135+1}
skipped_packages:
  description: Optional members the archive does not have for this kernel (C(linux-modules-extra-<kernel>)).
  returned: always
  type: list
  elements: str
missing:
  description: Packages the repositories do not offer, with what they do offer.
  returned: always
  type: list
  elements: str
driver_problem:
  description: Why the driver user space is not available at O(driver_version), or V(null).
  returned: always
  type: str
module_versions:
  description: For V(prebuilt), each offered version of the target kernel's NVIDIA module package and the driver it was built for.
  returned: always
  type: dict
  sample: {"6.8.0-135.135+1": 580.130.00}
way_back:
  description: The check of the way back.
  returned: always
  type: dict
  contains:
    previous_kernel: {description: The previous kernel., type: str}
    previous_driver_version: {description: The previous driver., type: str}
    ok: {description: Whether the way back holds., type: bool}
    problems: {description: What is missing., type: list, elements: str}
    modules_on_node: {description: The previous driver's modules for the previous kernel are on the node., type: bool}
    reinstallable: {description: The repositories offer them again., type: bool}
installed_module_source:
  description: Installed packages of each module source (C(dkms), C(prebuilt)).
  returned: always
  type: dict
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel as kn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel_args as ka
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import HostTask


def dnf_check(module, node):
    running = ka.running_kernel(module.params['proc_path'])
    req, resolved, skipped, missing, way = kn.dnf_inspect(node, ka.request(module), running)[:5]
    result = dict(changed=False, kernel=req.kernel, kernel_version=kn.rpm_release(req.kernel).evr, packages=resolved,
                  skipped_packages=skipped, missing=missing, driver_problem=None, module_versions={},
                  way_back=way.as_dict(), installed_module_source={})
    try:
        kn.refuse(kn.Availability(result['kernel_version'], resolved, skipped, missing, {}), way, req)
    except kn.KernelError as e:
        module.fail_json(msg=str(e), **result)
    module.exit_json(**result)


def main():
    module = AnsibleModule(argument_spec=ka.argument_spec(), supports_check_mode=True)
    with HostTask(module, 'kernel_check', (kn.KernelError, pk.PackageError)) as task:
        node = ka.make_node(module)
        task.backend = node.backend
        if module.params['update_cache'] and not module.check_mode:
            node.backend.update_cache()
        if node.name == 'dnf':
            dnf_check(module, node)
        req, kset, avail, way, installed = kn.inspect(node, ka.request(module), ka.running_kernel(module.params['proc_path']))
        driver = kn.driver_problem(node, req, installed)
        result = dict(changed=False, kernel=req.kernel, kernel_version=avail.kernel_version, packages=avail.resolved,
                      skipped_packages=avail.skipped, missing=avail.missing, driver_problem=driver,
                      module_versions=avail.module_versions, way_back=way.as_dict(),
                      installed_module_source=kn.installed_module_source(installed))
        try:
            kn.refuse(avail, way, req)
        except kn.KernelError as e:
            module.fail_json(msg=str(e) + ('; ' + driver if driver else ''), **result)
        if driver:
            module.fail_json(msg='kernel %s with driver %s: %s' % (req.kernel, req.driver_version, driver), **result)
        module.exit_json(**result)


if __name__ == '__main__':
    main()
