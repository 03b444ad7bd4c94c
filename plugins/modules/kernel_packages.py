#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_packages
short_description: Install a kernel and the NVIDIA driver for it as one pinned package transaction
version_added: 0.1.0
author:
  - gpufleet.upgrade contributors (@gpufleet)
description:
  - "O(state=present): checks everything M(gpufleet.upgrade.kernel_check) checks (nothing changes when a package is
    missing or the way back is broken), then runs B(one) C(apt-get install) of the target kernel
    (C(linux-image-<kernel>), C(linux-modules-<kernel>), C(linux-modules-extra-<kernel>) where the archive has it),
    the NVIDIA kernel part for it by O(module_source) (C(linux-headers-<kernel>) for DKMS, or
    C(linux-modules-nvidia-<branch>-server-<kernel>) built for the target driver), and the driver user space of the
    module source's preset at exactly O(driver_version), each at an exact version."
  - Pins the kernel packages in C(/etc/apt/preferences.d/gpufleet-kernel.pref) and the driver set in the file that
    M(gpufleet.upgrade.driver_pin) writes, and holds the installed members of both (and the installed kernel meta
    packages such as C(linux-generic), so unattended upgrades cannot pull another kernel under the held driver).
  - Other installed kernels' prebuilt NVIDIA module packages follow the driver in the same transaction where the
    repositories offer them for the target driver.
  - Keeps the previous kernel and its NVIDIA modules installed and protected from autoremove (C(apt-mark manual)),
    recorded in C(/var/lib/gpufleet/kernel-protect.json) until O(state=released) (the rollout's rollback boundary)
    marks them automatic again.
  - For V(dkms), the transaction only counts when DKMS built the module for the kernel
    (C(/var/lib/dkms/nvidia/<driver>/<kernel>/<arch>/module/nvidia.ko*)); otherwise the task fails.
  - If the transaction fails, the pin files and holds are put back.
  - Does not change what boots; see M(gpufleet.upgrade.kernel_boot).
extends_documentation_fragment:
  - gpufleet.upgrade.dpkg
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.mutating
  - gpufleet.upgrade.kernel
attributes:
  diff_mode:
    details:
      - Both pin files, the held packages, the protection record and the installed versions.
options:
  state:
    description:
      - V(present) installs, pins, holds and protects. V(released) ends the protection of the previous kernel (its
        packages marked manual by V(present) become automatic again); pins and holds stay.
    type: str
    choices: [present, released]
    default: present
notes:
  - Runs on the GPU node (Python 3.9 or later). Ubuntu/Debian through apt; the RHEL family (the managed system's
    C(os-release) says so) through dnf, see C(docs/host.md). There, B(one) C(dnf install) of the exact set (the kernel
    packages, the NVIDIA kmod for O(module_source) and the C(rhel-dnf) preset's driver user space at
    O(driver_version)), then C(dnf versionlock add) of the set; the previous kernel's packages (and its precompiled
    kmod) are version-locked too, recorded in C(/var/lib/gpufleet/kernel-protect.json), and O(state=released)
    deletes exactly those locks. A versionlock does not stop dnf's C(installonly_limit) from removing the oldest
    kernel when a new one is installed, so the install runs with C(--setopt=installonly_limit=0) (unlimited) and
    keeps the previous (rollback) kernel. RV(holds) lists the versionlock entries after the task, RV(unmarked)
    the locks deleted.
  - The kernel's own hooks (C(update-grub), DKMS autoinstall, initramfs) run as on any kernel install; under
    O(installroot) packages must not have maintainer scripts.
seealso:
  - module: gpufleet.upgrade.kernel_check
  - module: gpufleet.upgrade.kernel_boot
  - module: gpufleet.upgrade.driver_pin
"""

EXAMPLES = r"""
---
- name: Install kernel 6.8.0-135-generic with driver 580.130.00 (prebuilt signed modules)
  gpufleet.upgrade.kernel_packages:
    kernel: 6.8.0-135-generic
    branch: "580"
    driver_version: 580.130.00
    module_source: prebuilt
  register: kernel_install

- name: Past the rollback boundary, let autoremove take the previous kernel again
  gpufleet.upgrade.kernel_packages:
    kernel: 6.8.0-135-generic
    branch: "580"
    driver_version: 580.130.00
    module_source: prebuilt
    state: released
"""

RETURN = r"""
kernel_version:
  description: The package version of the target kernel's packages.
  returned: state=present
  type: str
  sample: 6.8.0-135.135
packages:
  description: The exact version of each kernel-side package.
  returned: state=present
  type: dict
installed_changes:
  description: The packages the transaction (would) install, upgrade or downgrade, with their versions.
  returned: state=present
  type: dict
holds:
  description: The held packages after the task.
  returned: state=present
  type: list
  elements: str
protected:
  description: The previous kernel's packages kept installed and protected from autoremove.
  returned: state=present
  type: list
  elements: str
removed:
  description: Prebuilt NVIDIA module packages of other kernels that apt removes because the repositories do not offer them for the target driver.
  returned: state=present
  type: list
  elements: str
way_back:
  description: The check of the way back (see M(gpufleet.upgrade.kernel_check)).
  returned: state=present
  type: dict
previous_driver_pins:
  description: The driver pin file state before the task, as M(gpufleet.upgrade.driver_pin) returns it in C(previous).
  returned: state=present
  type: dict
unmarked:
  description: With O(state=released), the packages marked automatic again.
  returned: state=released
  type: list
  elements: str
commands:
  description: The commands run.
  returned: always
  type: list
  elements: list
artifacts:
  description:
    - The packages of the transaction's target (the kernel's and the driver's, by the version resolved), each with the
      SHA-256 of its file as the repository's index gives it (apt - C(apt-cache show)); for the evidence bundle.
  returned: state=present with apt, not in check mode
  type: list
  elements: dict
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel as kn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel_args as ka
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import HostTask


def release(module, node):
    """state=released through the node's package manager: apt marks the protected packages automatic
    again, dnf deletes the versionlocks it added for the previous kernel."""
    dnf = node.name == 'dnf'
    rp = kn.dnf_plan_release(node) if dnf else kn.plan_release(node)
    if rp.changed and not module.check_mode:
        if dnf:
            kn.dnf_apply_release(node, rp)
        else:
            kn.apply_release(node, rp)
    result = dict(changed=rp.changed, unmarked=rp.unlock if dnf else rp.unmark, commands=node.runner.commands)
    if module._diff:
        result['diff'] = {'before_header': kn.PROTECT_FILE, 'after_header': kn.PROTECT_FILE,
                          'before': rp.record_before or '', 'after': ''}
    module.exit_json(**result)


def dnf_present(module, node):
    plan = kn.dnf_plan(node, ka.request(module), ka.running_kernel(module.params['proc_path']))
    if plan.changed and not module.check_mode:
        kn.dnf_apply(node, plan)
    if not (plan.changed and module.check_mode):
        kn.check_dkms(node, plan.request)
    result = dict(changed=plan.changed, kernel_version=kn.rpm_release(plan.request.kernel).evr, packages=plan.packages,
                  installed_changes=plan.install, holds=sorted(plan.locks_after()), protected=sorted(plan.protected),
                  removed=[], way_back=plan.way_back.as_dict(), previous_driver_pins={}, commands=node.runner.commands)
    if module._diff:
        result['diff'] = plan.diff()
    module.exit_json(**result)


def main():
    spec = ka.argument_spec()
    spec['state'] = dict(type='str', default='present', choices=['present', 'released'])
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    with HostTask(module, 'kernel_packages', (kn.KernelError, pk.PackageError), report_commands=True) as task:
        node = ka.make_node(module)
        task.backend = node.backend
        if module.params['state'] == 'released':
            release(module, node)
        if module.params['update_cache'] and not module.check_mode:
            node.backend.update_cache()
        if node.name == 'dnf':
            dnf_present(module, node)
        plan = kn.plan(node, ka.request(module), ka.running_kernel(module.params['proc_path']))
        if plan.changed and not module.check_mode:
            kn.apply(node, plan)
        if not (plan.changed and module.check_mode):
            kn.check_dkms(node, plan.request)
        result = dict(changed=plan.changed, kernel_version=plan.availability.kernel_version,
                      packages=plan.availability.resolved, installed_changes=plan.install, holds=plan.holds_after,
                      protected=plan.protected, removed=plan.removed, way_back=plan.way_back.as_dict(),
                      previous_driver_pins=plan.driver.before.as_dict(), commands=node.runner.commands)
        if not module.check_mode:
            # The kernel's packages, the driver's (pinned with it) and whatever else the transaction moved.
            target = dict(plan.availability.resolved, **plan.driver.resolved)
            target.update(plan.install)
            result['artifacts'] = pk.package_artifacts(target, node.backend.repo_digests(target))
        if module._diff:
            result['diff'] = plan.diff()
        module.exit_json(**result)


if __name__ == '__main__':
    main()
