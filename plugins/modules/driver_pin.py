#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: driver_pin
short_description: Freeze the NVIDIA driver package set at one exact version
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - Pins every package of the NVIDIA driver set (an explicit list, or a named O(preset) for a distribution and
    driver branch) to one exact version, and optionally installs, upgrades or downgrades them to it.
  - "apt: writes C(/etc/apt/preferences.d/gpufleet-nvidia-driver.pref) with one stanza per exact version
    (C(Pin: version <v>), C(Pin-Priority: 1001), so a rollback can downgrade) and holds the installed members
    with C(apt-mark hold)."
  - "dnf: versionlock entries (RHEL 10, Fedora) or the branch module stream C(nvidia-driver:<branch>-dkms)
    (RHEL/Rocky/Alma 8 and 9)."
  - Before anything changes, the module checks that the configured repositories offer the version for every
    required member; otherwise it fails and names each missing package and the versions on offer.
  - Optional members of a preset (Fabric Manager, NSCQ, meta packages) are kept equal to the driver when they
    are installed or offered at that version, and skipped otherwise.
  - Returns the previous pins, holds and pin file so that a rollback can restore them.
  - If the package transaction fails, the pin file and holds are put back as they were.
extends_documentation_fragment:
  - gpufleet.upgrade.dpkg
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.mutating
attributes:
  diff_mode:
    details:
      - The pin file, the set of held packages and, with O(install=true), the installed versions.
options:
  packages:
    description:
      - The exact package names to pin. All are required to be offered at O(version).
      - Mutually exclusive with O(preset).
    type: list
    elements: str
  preset:
    description:
      - A named package set. V(ubuntu-server) is Canonical's C(-server) flavour (C(nvidia-driver-<branch>-server),
        C(libnvidia-compute-<branch>-server), C(nvidia-kernel-common-<branch>-server), C(nvidia-dkms-<branch>-server),
        C(nvidia-utils-<branch>-server), C(nvidia-compute-utils-<branch>-server); optional
        C(nvidia-fabricmanager-<branch>), C(libnvidia-nscq-<branch>)). V(ubuntu) is the same without C(-server).
        V(ubuntu-server-prebuilt) is the C(-server) flavour for Canonical's signed prebuilt kernel modules
        (C(nvidia-headless-no-dkms-<branch>-server) instead of C(nvidia-driver-<branch>-server) and
        C(nvidia-dkms-<branch>-server); the per-kernel C(linux-modules-nvidia-<branch>-server-<kernel>) comes with
        the kernel through M(gpufleet.upgrade.kernel_packages)).
        V(cuda-repo) is NVIDIA's CUDA repository for Debian/Ubuntu (branch in the names up to 580, none from 590).
        V(rhel-dnf) is NVIDIA's repository for RHEL/Rocky/Fedora.
      - Requires O(branch). Mutually exclusive with O(packages).
    type: str
    choices: [ubuntu-server, ubuntu-server-prebuilt, ubuntu, cuda-repo, rhel-dnf]
  branch:
    description:
      - The driver branch, for example V(580). Required with O(preset) and with the dnf module stream.
      - When given, O(version) must belong to it.
    type: str
  version:
    description:
      - The version to pin. Either an upstream version such as V(580.126.20), matched per package (Fabric
        Manager and the driver have different Debian revisions), or an exact package version such as
        V(580.126.20-0ubuntu1).
      - Required when O(state=pinned).
    type: str
  state:
    description:
      - V(pinned) pins the set at O(version); V(unpinned) removes the pins and holds of the set.
    type: str
    choices: [pinned, unpinned]
    default: pinned
  install:
    description:
      - Also install, upgrade or downgrade the set to exactly O(version) (downgrades allowed, holds overridden).
      - Required members are installed; optional members only when already installed.
    type: bool
    default: false
  installroot:
    description:
      - Operate on the system under this directory instead of C(/), like dnf's C(--installroot). apt and dpkg
        read and write only under it (its C(etc/apt), C(var/lib/apt), C(var/lib/dpkg)).
    type: path
  backend:
    description:
      - The package manager. V(auto) uses the preset's; without O(preset) it decides as
        M(gpufleet.upgrade.kernel_packages) does, from the managed system's C(os-release) (C(etc/os-release) under
        O(installroot)), dnf on the RHEL family and apt on Ubuntu/Debian (failing when that tool is not on the node);
        without an C(os-release), apt when C(apt-get) and C(dpkg-query) exist, else dnf (with C(rpm)).
    type: str
    choices: [auto, apt, dnf]
    default: auto
  update_cache:
    description:
      - Refresh the package lists before the availability check (not in check mode).
    type: bool
    default: false
  dnf_lock:
    description:
      - How dnf freezes the version. V(auto) uses the module stream on RHEL-like 8 and 9, versionlock elsewhere.
    type: str
    choices: [auto, module, versionlock]
    default: auto
notes:
  - The apt pin file name is fixed (C(gpufleet-nvidia-driver.pref)); pins of other packages in it are kept.
seealso:
  - module: gpufleet.upgrade.node_snapshot
"""

EXAMPLES = r"""
- name: Pin the Ubuntu server driver set at 580.126.20 and install it
  gpufleet.upgrade.driver_pin:
    preset: ubuntu-server
    branch: "580"
    version: 580.126.20
    install: true
  register: pin

- name: Pin explicit packages at an exact Debian version (no install)
  gpufleet.upgrade.driver_pin:
    packages: [nvidia-driver-580-server, libnvidia-compute-580-server]
    version: 580.130.00-0ubuntu1

- name: Remove the pins and holds
  gpufleet.upgrade.driver_pin:
    preset: ubuntu-server
    branch: "580"
    state: unpinned
"""

RETURN = r"""
backend:
  description: The package manager used.
  returned: always
  type: str
  sample: apt
resolved:
  description: The exact version pinned per package.
  returned: always
  type: dict
  sample: {nvidia-driver-580-server: 580.126.20-0ubuntu1, nvidia-fabricmanager-580: 580.126.20-1}
skipped_packages:
  description: Optional preset members neither installed nor offered at the version.
  returned: always
  type: list
  elements: str
installed_changes:
  description: Packages the transaction (would) install, upgrade or downgrade, with their target version.
  returned: always
  type: dict
previous:
  description: The state before the module ran, to restore on rollback.
  returned: always
  type: dict
  contains:
    pin_file:
      description: Path of the pin file (apt preferences or dnf versionlock list).
      type: str
    pin_file_content:
      description: Its content, null when absent.
      type: str
    pins:
      description: Package to pinned version, parsed from the pin file.
      type: dict
    holds:
      description: Held packages of the set.
      type: list
      elements: str
    installed:
      description: Installed versions of the set.
      type: dict
current:
  description: The state after the module ran (in check mode, the predicted state). Same keys as RV(previous).
  returned: always
  type: dict
commands:
  description: The commands run (or, in check mode, the dnf commands that would run).
  returned: always
  type: list
  elements: list
artifacts:
  description:
    - The packages pinned and installed, each with the SHA-256 of its file as the repository's index gives it (apt -
      C(apt-cache show)); without C(sha256) where the index gives none (dnf - not read). For the evidence bundle.
  returned: when O(install) and O(state=pinned), not in check mode
  type: list
  elements: dict
  sample: [{kind: package, name: nvidia-driver-580-server, version: 580.130.00-0ubuntu1, sha256: "0f3a..."}]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel as kn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import HostTask, module_runner


def build(module):
    p = module.params
    if p['installroot'] and not os.path.isdir(p['installroot']):
        raise pk.PackageError('installroot %r is not a directory' % p['installroot'])
    backend = p['backend']
    if p['preset']:
        if not p['branch']:
            raise pk.PackageError('branch is required with preset %r' % p['preset'])
        pkgs = pk.preset_packages(p['preset'], p['branch'])
        preset_backend = pk.preset_backend(p['preset'])
        if backend == 'auto':
            backend = preset_backend
        elif backend != preset_backend:
            raise pk.PackageError('preset %r is for backend %r, not backend=%r' % (p['preset'], preset_backend, backend))
    else:
        names = [n.strip() for n in p['packages'] or [] if n and n.strip()]
        if not names:
            raise pk.PackageError('packages must name at least one package')
        pkgs = pk.PackageSet(tuple(names))
        if p['branch']:
            pk.check_branch(p['branch'])
    if p['version'] and p['state'] == 'pinned':
        pk.check_version_in_branch(p['version'], p['branch'])
    runner = module_runner(module, p['installroot'])
    if backend == 'auto':
        backend = kn.managed_backend(runner)
    if backend == 'apt':
        return pk.AptBackend(runner), pkgs
    mode = None if p['dnf_lock'] == 'auto' else p['dnf_lock']
    return pk.DnfBackend(runner, branch=p['branch'], mode=mode), pkgs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            packages=dict(type='list', elements='str'),
            preset=dict(type='str', choices=sorted(pk.PRESETS)),
            branch=dict(type='str'),
            version=dict(type='str'),
            state=dict(type='str', default='pinned', choices=['pinned', 'unpinned']),
            install=dict(type='bool', default=False),
            installroot=dict(type='path'),
            backend=dict(type='str', default='auto', choices=['auto', 'apt', 'dnf']),
            update_cache=dict(type='bool', default=False),
            dnf_lock=dict(type='str', default='auto', choices=['auto', 'module', 'versionlock']),
        ),
        mutually_exclusive=[('packages', 'preset')],
        required_one_of=[('packages', 'preset')],
        required_if=[('state', 'pinned', ['version'])],
        supports_check_mode=True,
    )
    with HostTask(module, 'driver_pin', (pk.PackageError, kn.KernelError), report_commands=True) as task:
        task.backend, pkgs = build(module)
        backend = task.backend
        if module.params['update_cache'] and not module.check_mode:
            backend.update_cache()
        plan = pk.plan_pin(backend, pkgs, module.params['version'], module.params['state'], module.params['install'])
        current = plan.after
        if plan.changed and not module.check_mode:
            current = pk.apply_pin(backend, plan)
        result = dict(
            changed=plan.changed, backend=backend.name, resolved=plan.resolved, skipped_packages=plan.skipped,
            installed_changes=plan.install, previous=plan.before.as_dict(), current=current.as_dict(),
            commands=plan.commands if module.check_mode else backend.runner.commands)
        if module.params['install'] and module.params['state'] == 'pinned' and not module.check_mode:
            result['artifacts'] = pk.package_artifacts(plan.resolved, backend.repo_digests(plan.resolved))
        if module._diff:
            result['diff'] = plan.diff()
        module.exit_json(**result)


if __name__ == '__main__':
    main()
