#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_snapshot
short_description: Capture and restore what a GPU node's driver rollback needs
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - "O(state=captured) reads, without changing anything, the installed driver, Fabric Manager and kernel
    package versions, the driver pin file, every apt preferences file (or the dnf versionlock list), the
    holds, the running kernel and kernel command line, the default-boot setting (C(GRUB_DEFAULT) in
    C(/etc/default/grub) and C(saved_entry) in the GRUB environment block), the C(modprobe.d) files that
    configure nvidia, the MIG mode per GPU and the mig-manager configuration, and the node's GPU facts.
    It writes them as JSON with a SHA-256 digest to O(path) B(on the controller)."
  - "O(state=restored) reads O(path) on the controller, verifies the digest (and O(sha256) when given) before
    anything else, checks that every package version of the snapshot is installed or offered, then puts the
    pin file, the exact package versions (downgrades included), the holds, the C(modprobe.d) files and the
    default-boot setting back."
  - "A restore writes only what a capture can have recorded, and checks the whole snapshot before it changes
    anything: every C(modprobe.d) file must be a plain file name directly under C(etc/modprobe.d),
    C(usr/lib/modprobe.d) or C(lib/modprobe.d) whose name or content mentions nvidia (or C(NVreg)), as the capture
    selects them; the GRUB environment block must be C(boot/grub/grubenv) or C(boot/grub2/grubenv) and the MIG
    config C(etc/nvidia-mig-manager/config.yaml); C(GRUB_DEFAULT) and C(saved_entry) must be one line each.
    Absolute paths and C(..) are refused, naming the field and the value."
  - "C(modprobe.d) C(install) and C(remove) directives run a command as root when the module is loaded or removed,
    and a genuine capture may hold some (distribution packages and administrators write them), so their content
    alone cannot tell a captured one from a forged one. Without O(sha256) a restore that would add such a directive
    (one the file on the node does not have now), or write a C(GRUB_DEFAULT) with a shell expansion (C($), a
    backtick: C(/etc/default/grub) is sourced as root), is refused; with O(sha256) (a digest recorded outside the file, the
    one the Node records) the snapshot's content is the captured one and is restored as it is."
  - "On apt nodes the restore brings back the default-boot B(kernel), not only the captured GRUB settings: when
    the captured C(GRUB_DEFAULT)/C(saved_entry) would now boot another kernel (for example C(GRUB_DEFAULT=0)
    after a newer C(linux-image) package was installed), it sets C(GRUB_DEFAULT=saved) and C(saved_entry) to
    the captured kernel's menu entry (the entry id when the root's C(boot/grub/grub.cfg) lists it, else
    C(Advanced options for Ubuntu>Ubuntu, with Linux <release>)). It fails before any change, naming the
    kernel, when that kernel's C(linux-image) package is not installed."
  - An action plugin of the same name does the controller side (reading and writing O(path)); the module
    runs on the node.
  - "apt, restored: before any change, a dpkg database that holds an unfinished transaction (a journal left in
    C(/var/lib/dpkg/updates) by a killed dpkg, or packages C(dpkg --audit) lists as unpacked but not configured) fails
    the task naming it, with nothing changed. The module does not run C(dpkg --configure -a): it cannot tell
    another tool's or an operator's half-done transaction from its own killed run, so it does not finish one it did
    not start. Each apt write waits at most 300 seconds for the dpkg lock another process holds (C(apt-get) with
    C(DPkg::Lock::Timeout), C(apt-mark) retried), then fails naming the holder."
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.mutating
attributes:
  diff_mode:
    details:
      - Captured, the snapshot file; restored, the pin file, holds, installed versions and boot and modprobe files.
  idempotent:
    description: >-
      Capturing again keeps an existing snapshot unless O(force=true); restoring again changes nothing.
options:
  state:
    description:
      - V(captured) takes a snapshot; V(restored) puts the node back to one.
    type: str
    choices: [captured, restored]
    default: captured
  path:
    description:
      - The snapshot file on the controller. A relative path is relative to the playbook directory.
    type: path
    required: true
    aliases: [dest, src]
  force:
    description:
      - With O(state=captured), replace an existing snapshot file. By default an existing snapshot is kept, so a
        rerun after the upgrade cannot overwrite the rollback point.
    type: bool
    default: false
  sha256:
    description:
      - With O(state=restored), the digest the snapshot must have, recorded outside the file (the one the Node records,
        RV(gpufleet.upgrade.upgrade_state#module:state.snapshot_sha256), or the evidence's). The digest inside the file
        is always checked as well.
      - Only with it may a restore add modprobe C(install)/C(remove) directives (see the description); passing the
        file's own digest vouches for nothing.
    type: str
  snapshot:
    description:
      - The snapshot document. Filled in by the action plugin from O(path); set it only when running the module
        without its action plugin.
    type: dict
  gpu_facts:
    description:
      - The node's GPU facts (the registered result of M(gpufleet.upgrade.gpu_info)); MIG mode per GPU is taken
        from them. Task result keys (C(changed), C(failed), C(invocation), ...) are dropped.
    type: dict
  installroot:
    description:
      - Operate on the system under this directory instead of C(/) (packages, pin files, boot and modprobe files).
    type: path
  proc_path:
    description:
      - Where to read the running kernel (C(sys/kernel/osrelease)) and the kernel command line (C(cmdline)).
    type: path
    default: /proc
  package_patterns:
    description:
      - Shell patterns of the package names that belong to the driver set (captured and restored).
    type: list
    elements: str
    default: ['*nvidia*', 'cuda-drivers*']
  backend:
    description:
      - The package manager. V(auto) decides as M(gpufleet.upgrade.kernel_packages) does, from the managed system's
        C(os-release) (C(etc/os-release) under O(installroot)), dnf on the RHEL family and apt on Ubuntu/Debian (failing
        when that tool is not on the node); without an C(os-release), apt when C(apt-get) and C(dpkg-query) exist,
        else dnf (with C(rpm)).
    type: str
    choices: [auto, apt, dnf]
    default: auto
  update_bootloader:
    description:
      - When a restore changes C(GRUB_DEFAULT) on C(/), run C(update-grub) (or C(grub2-mkconfig)) afterwards.
        Never run with O(installroot).
    type: bool
    default: true
notes:
  - Packages of the driver set installed after the snapshot was taken are reported in RV(extra_packages) and left
    installed, except Canonical's kernel-bound C(linux-modules-nvidia-*) packages (a new kernel's prebuilt modules,
    built for the newer driver), which the restore removes in its transaction (RV(removed_packages)); kernel
    packages are recorded but not reinstalled (a missing default-boot kernel fails the restore).
  - On dnf nodes the default-boot kernel is restored only through the captured C(GRUB_DEFAULT)/C(saved_entry).
  - On dnf nodes the pin captured and restored is the versionlock list, also on RHEL 8/9 where M(gpufleet.upgrade.driver_pin)
    pins the C(nvidia-driver) module stream; the module stream is neither captured nor restored.
  - Only the collection's own pin file is restored; other apt preference files are recorded for evidence.
seealso:
  - module: gpufleet.upgrade.driver_pin
"""

EXAMPLES = r"""
- name: Read GPU facts
  gpufleet.upgrade.gpu_info:
  register: gpu

- name: Snapshot the node before the driver upgrade
  gpufleet.upgrade.node_snapshot:
    state: captured
    path: "snapshots/{{ inventory_hostname }}.json"
    gpu_facts: "{{ gpu }}"
  register: snap

- name: Roll the node back to the snapshot
  gpufleet.upgrade.node_snapshot:
    state: restored
    path: "snapshots/{{ inventory_hostname }}.json"
    sha256: "{{ snap.sha256 }}"
"""

RETURN = r"""
path:
  description: The snapshot file on the controller.
  returned: always
  type: str
sha256:
  description: SHA-256 of the canonical JSON of the snapshot.
  returned: always
  type: str
document:
  description: The snapshot file's content (format, sha256, snapshot), as written to O(path).
  returned: always
  type: dict
snapshot:
  description: The snapshot (packages, kernel_packages, holds, pins, preferences, boot, modprobe, mig, gpu_facts).
  returned: always
  type: dict
restored:
  description: With O(state=restored), the pin state after the restore (pin file, pins, holds, installed versions).
  returned: when state is restored
  type: dict
extra_packages:
  description: Driver-set packages installed now that the snapshot does not have (left installed).
  returned: when state is restored
  type: dict
removed_packages:
  description: C(linux-modules-nvidia-*) packages the snapshot does not have, removed by the restore.
  returned: when state is restored
  type: list
  elements: str
boot_kernel:
  description:
    - With O(state=restored) on apt nodes, the default-boot kernel of the snapshot (C(kernel)), what the current
      configuration boots (C(would_boot_now)), what the captured GRUB configuration would boot with the kernels
      installed now (C(would_boot_captured_config)), whether the restore sets C(GRUB_DEFAULT=saved) and
      C(saved_entry) (C(set), C(saved_entry)) or keeps a configuration that already boots it (C(keep)).
    - Null on dnf nodes.
  returned: when state is restored
  type: dict
  sample: {kernel: 6.8.0-134-generic, would_boot_now: 6.8.0-140-generic, would_boot_captured_config: 6.8.0-140-generic,
           set: true, keep: false, saved_entry: "Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-134-generic"}
changed_files:
  description: Files (relative to the root) that the restore rewrote or would rewrite.
  returned: when state is restored
  type: list
  elements: str
"""

import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel as kn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as sn
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import HostTask, module_runner


def backend_for(module):
    p = module.params

    runner = module_runner(module, p['installroot'])
    name = kn.managed_backend(runner) if p['backend'] == 'auto' else p['backend']
    return pk.AptBackend(runner) if name == 'apt' else pk.DnfBackend(runner)


def regenerate_bootloader(module, backend):
    for argv in (['update-grub'], ['grub2-mkconfig', '-o', '/boot/grub2/grub.cfg']):
        if shutil.which(argv[0]):
            backend.runner(argv)
            return True
    module.warn('GRUB_DEFAULT was restored but neither update-grub nor grub2-mkconfig was found; '
                'regenerate the boot loader configuration before rebooting')
    return False


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type='str', default='captured', choices=['captured', 'restored']),
            path=dict(type='path', required=True, aliases=['dest', 'src']),
            force=dict(type='bool', default=False),
            sha256=dict(type='str'),
            snapshot=dict(type='dict'),
            gpu_facts=dict(type='dict'),
            installroot=dict(type='path'),
            proc_path=dict(type='path', default='/proc'),
            package_patterns=dict(type='list', elements='str', default=list(sn.DEFAULT_PACKAGE_PATTERNS)),
            backend=dict(type='str', default='auto', choices=['auto', 'apt', 'dnf']),
            update_bootloader=dict(type='bool', default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    with HostTask(module, 'node_snapshot', (pk.PackageError, sn.SnapshotError, kn.KernelError), report_commands=True) as task:
        backend = task.backend = backend_for(module)
        if p['state'] == 'captured':
            snap = sn.capture(backend, proc_path=p['proc_path'], gpu_facts=p['gpu_facts'],
                              package_patterns=p['package_patterns'])
            module.exit_json(changed=False, path=p['path'], sha256=sn.digest(snap), snapshot=snap,
                             document=sn.make_document(snap))
        if p['snapshot'] is None:
            module.fail_json(msg='state=restored needs the snapshot document (the action plugin reads it from path %r)'
                             % p['path'])
        snap = sn.verify_document(p['snapshot'], p['sha256'])
        plan = sn.plan_restore(backend, snap, p['package_patterns'], vouched=bool(p['sha256']))
        for w in plan.warnings:
            module.warn(w)
        current = plan.pin_plan.after
        if plan.changed and not module.check_mode:
            current = sn.apply_restore(backend, plan)
            if plan.grub_default_changed and p['update_bootloader'] and not backend.runner.installroot:
                regenerate_bootloader(module, backend)
        result = dict(changed=plan.changed, path=p['path'], sha256=sn.digest(snap), snapshot=snap,
                      restored=current.as_dict(), extra_packages=plan.extra_packages,
                      removed_packages=plan.pin_plan.remove,
                      changed_files=[f.rel for f in plan.files], boot_kernel=plan.boot_kernel,
                      commands=backend.runner.commands)
        if module._diff:
            result['diff'] = plan.diff()
        module.exit_json(**result)


if __name__ == '__main__':
    main()
