#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_boot
short_description: One-shot trial boot of a kernel through GRUB, its commit as the default, and its verification
version_added: 0.1.0
author:
  - gpufleet.upgrade contributors (@gpufleet)
description:
  - "O(state=trial): makes O(kernel) the B(next) boot only, as C(grub-reboot) does: C(grub-editenv <grubenv> set
    next_entry=<entry>). GRUB boots a set C(next_entry) once and clears it, so the boot after that (and any power
    cycle of a node that did not come up) returns to C(saved_entry). The module also points C(saved_entry) at the
    fallback kernel (the running one unless O(fallback_kernel)) when it does not already boot it."
  - "O(state=trial) first asks C(grub-probe --target=fs) and C(--target=abstraction) (C(grub2-probe) on the RHEL
    family) about the directory of the environment block, as Ubuntu's C(/etc/grub.d/00_header) does: GRUB cannot
    write the block at boot on an abstraction (md RAID, LVM, dmraid, LUKS: any C(--target=abstraction) answer) or on
    btrfs, ZFS or a read-only filesystem. There C(save_env) fails, C(next_entry) is never cleared and every boot,
    a power cycle of a node whose trial kernel did not come up included, takes the trial kernel again. The module then
    refuses, with nothing changed (also when C(grub-probe) is missing or fails), unless O(allow_no_fallback=true)."
  - "O(state=cancel): clears a pending C(next_entry) that boots O(kernel) (a trial not taken, or one GRUB could not
    clear at boot), so C(saved_entry) boots next; C(saved_entry) is not changed. A C(next_entry) of another kernel is
    refused. Nothing else is required (the kernel need not be installed)."
  - "O(state=default): makes O(kernel) the saved default (C(saved_entry), as C(grub-set-default) does) and clears a
    pending C(next_entry). Only while O(kernel) is running (after the trial boot and the node's gates) unless
    O(require_running=false)."
  - "O(state=verify): read only. Compares the running kernel (C(<proc_path>/sys/kernel/osrelease)) with O(kernel)
    and the loaded NVIDIA module (C(<proc_path>/driver/nvidia/version)) with O(driver_version), reports the kernel
    the module was built for when the file names it, and fails on a mismatch unless O(fail_on_mismatch=false).
    A C(next_entry) still set is a mismatch too: read after the trial's reboot, it is a one-shot GRUB did not clear
    (the node boots it again on every boot; clear it with O(state=cancel))."
  - The menu entry is found in the generated C(grub.cfg) (the entry whose C(linux) line loads C(/boot/vmlinuz-<kernel>),
    by its C($menuentry_id_option) id path, for example
    C(gnulinux-advanced-<uuid>>gnulinux-6.8.0-135-generic-advanced-<uuid>)), or given as O(menu_entry).
  - "On the RHEL family (8 and later, C(GRUB_ENABLE_BLSCFG=true)) the menu is the BootLoaderSpec entries in
    C(/boot/loader/entries): the entry of a kernel is the file whose C(linux) line loads C(/vmlinuz-<kernel>), by its
    id, the file name without C(.conf) (C(<machine-id>-<kernel>)), what C(grub2-reboot) and C(grub2-set-default) /
    C(grubby --set-default) write. The environment block is C(/boot/grub2/grubenv); the packages are read through rpm
    (the precompiled C(kmod-nvidia-open-<driver>-<kver>-<krel>) or the DKMS build)."
  - Refuses, with nothing changed, a kernel that is not installed, a menu (C(grub.cfg) or the BootLoaderSpec entries)
    without an entry for it, a GRUB environment block that is not one, C(GRUB_DEFAULT) other than C(saved) (the
    one-shot fallback needs it), and with O(module_source) a kernel without the NVIDIA module for O(driver_version) or
    a module source that does not match the installed packages.
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.mutating
attributes:
  diff_mode:
    details:
      - The GRUB environment variables before and after.
options:
  kernel:
    description:
      - The kernel release as C(uname -r) prints it, for example V(6.8.0-135-generic) or, on the RHEL family,
        V(5.14.0-427.16.1.el9_4.x86_64).
    type: str
    required: true
  state:
    description:
      - V(trial), V(default), V(verify) or V(cancel), see the description.
    type: str
    required: true
    choices: [trial, default, verify, cancel]
  fallback_kernel:
    description:
      - With O(state=trial), the kernel GRUB returns to after the trial. Default is the running kernel.
    type: str
  menu_entry:
    description:
      - The GRUB menu entry (id, title or index path joined by C(>)) that boots O(kernel), instead of finding it in
        C(grub.cfg). It must still resolve in C(grub.cfg) to an entry that boots O(kernel); where the menu is the
        BootLoaderSpec entries, to one of C(boot/loader/entries) (by its id, the file name without C(.conf)).
    type: str
  driver_version:
    description:
      - The NVIDIA driver expected with O(kernel) (for example V(580.130.00)); compared by O(state=verify) and, with
        O(module_source), required as a module for O(kernel) by O(state=trial).
    type: str
  module_source:
    description:
      - With O(state=trial) or O(state=default), require the NVIDIA module for O(kernel) from this source (the DKMS
        build, or C(linux-modules-nvidia-<branch>-server-<kernel>) installed for O(driver_version)).
    type: str
    choices: [dkms, prebuilt]
  branch:
    description:
      - The driver branch; required with O(module_source=prebuilt).
    type: str
  require_running:
    description:
      - With O(state=default), refuse unless O(kernel) is the running kernel.
    type: bool
    default: true
  fail_on_mismatch:
    description:
      - With O(state=verify), fail when the running kernel or the loaded driver differ from the expected ones.
    type: bool
    default: true
  installroot:
    description:
      - Operate on the system under this directory instead of C(/) (the GRUB files, packages and DKMS tree under it).
    type: path
  grubenv:
    description:
      - The GRUB environment block. Default C(boot/grub/grubenv), else C(boot/grub2/grubenv), under O(installroot).
    type: path
  grub_cfg:
    description:
      - The generated GRUB configuration. Default C(boot/grub/grub.cfg), else C(boot/grub2/grub.cfg), under O(installroot).
      - Not read when the menu is the BootLoaderSpec entries (C(boot/loader/entries/*.conf) under O(installroot), unless
        C(GRUB_ENABLE_BLSCFG=false)) and this option is not given.
    type: path
  proc_path:
    description:
      - Where C(/proc) is (C(sys/kernel/osrelease), C(driver/nvidia/version)).
    type: path
    default: /proc
  grub_editenv:
    description:
      - The C(grub-editenv) program (from C(grub-common); C(grub2-editenv) on the RHEL family, from C(grub2-tools-minimal)).
      - Default C(grub-editenv), else C(grub2-editenv), the first found on the node.
    type: str
  grub_probe:
    description:
      - The C(grub-probe) program O(state=trial) asks where the environment block is (C(grub2-probe) on the RHEL family,
        from C(grub2-tools)). It is run as C(<grub_probe> --target=fs <dir>) and C(--target=abstraction <dir>), <dir> the
        block's directory (under O(installroot)).
      - Default C(grub-probe), else C(grub2-probe), the first found on the node.
    type: str
  allow_no_fallback:
    description:
      - With O(state=trial), where GRUB cannot clear C(next_entry) at boot (see the description) or C(grub-probe) cannot
        tell, make O(kernel) the saved default (C(saved_entry); a pending C(next_entry) cleared) instead of refusing.
        There is no fallback then - a kernel that does not come up is booted again on every power cycle until someone
        picks another entry at the console (or the node's rollback restores the snapshot's C(saved_entry)) - so set it
        only for nodes with console access, after the kernel was qualified on the canary.
      - No effect where the one-shot works.
    type: bool
    default: false
notes:
  - Runs on the GPU node (Python 3.9 or later). The module does not reboot; reboot after O(state=trial).
  - "GRUB clears C(next_entry) only where it can write its environment block at boot (not on LVM, RAID, LUKS, btrfs
    or ZFS; GRUB's manual, Environment block): O(state=trial) refuses there (O(allow_no_fallback)), and
    O(state=verify) fails on a C(next_entry) still pending after the reboot."
seealso:
  - module: gpufleet.upgrade.kernel_packages
  - module: gpufleet.upgrade.kernel_check
"""

EXAMPLES = r"""
---
- name: Boot the new kernel once
  gpufleet.upgrade.kernel_boot:
    kernel: 6.8.0-135-generic
    state: trial
    module_source: prebuilt
    branch: "580"
    driver_version: 580.130.00

- name: After the reboot, verify what came up
  gpufleet.upgrade.kernel_boot:
    kernel: 6.8.0-135-generic
    state: verify
    driver_version: 580.130.00
  register: booted

- name: Verify failed on a next_entry GRUB did not clear (verification.pending_next_entry); boot the saved kernel next
  gpufleet.upgrade.kernel_boot:
    kernel: 6.8.0-135-generic
    state: cancel

- name: After the node's gates passed, keep the new kernel
  gpufleet.upgrade.kernel_boot:
    kernel: 6.8.0-135-generic
    state: default
"""

RETURN = r"""
entry:
  description: >-
    The GRUB menu entry of O(kernel) (on the RHEL family, its BootLoaderSpec id); with O(state=cancel), the entry that
    boots next (C(saved_entry)).
  returned: state=trial, state=default or state=cancel
  type: str
  sample: gnulinux-advanced-0f1e2d3c>gnulinux-6.8.0-135-generic-advanced-0f1e2d3c
fallback_kernel:
  description: >-
    With O(state=trial), the kernel GRUB returns to after the trial (V(null) with no fallback, O(allow_no_fallback));
    with O(state=cancel), the kernel that boots next.
  returned: state=trial or state=cancel
  type: str
env_block:
  description: >-
    With O(state=trial) (unless O(kernel) runs already), where the environment block is, C(path), whether GRUB can clear
    C(next_entry) in it at boot, C(one_shot), and if not, why, C(problem).
  returned: state=trial
  type: dict
  sample: {path: /boot/grub/grubenv, one_shot: true, problem: null}
booted:
  description: O(kernel) is the running kernel already.
  returned: state=trial, state=default or state=cancel
  type: bool
grubenv:
  description: The GRUB environment variables after the task (predicted in check mode).
  returned: state=trial, state=default or state=cancel
  type: dict
next_boot:
  description: >-
    What GRUB boots next, C(entry), C(kernel), C(once) (a pending C(next_entry)), C(fallback_entry),
    C(fallback_kernel); V(null) when the GRUB files cannot be read (verify only).
  returned: always
  type: dict
verification:
  description: >-
    With O(state=verify), C(kernel), C(running_kernel), C(driver_version), C(loaded_driver_version),
    C(module_build_kernel), C(open_module), C(pending_next_entry) (a C(next_entry) still set), C(problems), C(ok).
  returned: state=verify
  type: dict
commands:
  description: The commands run (in check mode, the ones that would run).
  returned: always
  type: list
  elements: list
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fsio
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _boot as bt
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _grub as gb
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel as kn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel_args as ka
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import HostTask


EDITENV = ('grub-editenv', 'grub2-editenv')
PROBE = ('grub-probe', 'grub2-probe')


def _under(root, rel):
    return os.path.join(root or '/', rel.lstrip('/'))


def _pick(root, given, candidates):
    if given:
        return given if os.path.isabs(given) else _under(root, given)
    for rel in candidates:
        if os.path.exists(_under(root, rel)):
            return _under(root, rel)
    return _under(root, candidates[0])


def read_files(p):
    root = p['installroot']
    env_path = _pick(root, p['grubenv'], gb.GRUBENV_PATHS)
    cfg_path = _pick(root, p['grub_cfg'], gb.GRUB_CFG_PATHS)
    try:
        with open(env_path, 'rb') as f:
            data = f.read()
    except OSError as e:
        raise bt.BootError('cannot read the GRUB environment block %s (%s); expected the 1024-byte block that '
                           'grub-install creates, nothing was changed' % (env_path, e.strerror or e))
    env = gb.parse_grubenv(data, env_path)
    default_path = _under(root, gb.DEFAULT_GRUB)
    texts = [_fsio.read_text(default_path)]
    ddir = _under(root, gb.DEFAULT_GRUB_DIR)
    if os.path.isdir(ddir):
        texts += [_fsio.read_text(os.path.join(ddir, n)) for n in sorted(os.listdir(ddir)) if n.endswith('.cfg')]
    if texts[0] is None:
        raise bt.BootError('cannot read %s; expected the GRUB_DEFAULT settings update-grub reads, nothing was changed' % default_path)
    bls = read_bls(root) if not p['grub_cfg'] else {}
    if gb.use_bls(bool(bls), gb.grub_default(texts, 'GRUB_ENABLE_BLSCFG')):
        bls_dir = _under(root, gb.BLS_DIR)
        menu = gb.bls_menu(bls)
        if not any(it.kernel for it in menu):
            raise bt.BootError("%s has no BootLoaderSpec entry with a 'linux /vmlinuz-<release>' line; expected the "
                               "entries kernel-install writes, nothing was changed" % bls_dir)
        return bt.BootFiles(env_path, env, bls_dir, menu, default_path, gb.grub_default(texts), bls=True)
    cfg = _fsio.read_text(cfg_path)
    if cfg is None:
        raise bt.BootError('cannot read the GRUB configuration %s; expected the grub.cfg that update-grub generates, '
                           'nothing was changed' % cfg_path)
    menu = gb.parse_grub_cfg(cfg)
    if not any(it.kernel for it in gb.menu_entries(menu)):
        raise bt.BootError("%s lists no menu entry with a 'linux /boot/vmlinuz-<release>' line; expected the grub.cfg "
                           "that update-grub generates, nothing was changed" % cfg_path)
    return bt.BootFiles(env_path, env, cfg_path, menu, default_path, gb.grub_default(texts))


def read_bls(root):
    """{file name: text} of the BootLoaderSpec entries under `root` (empty when there are none)."""
    bls_dir = _under(root, gb.BLS_DIR)
    if not os.path.isdir(bls_dir):
        return {}
    out = {}
    for name in sorted(os.listdir(bls_dir)):
        if name.endswith('.conf'):
            text = _fsio.read_text(os.path.join(bls_dir, name))
            if text is None:
                raise bt.BootError('cannot read the BootLoaderSpec entry %s; nothing was changed' % os.path.join(bls_dir, name))
            out[name] = text
    return out


def make_node(module):
    """apt or dnf/rpm, as kernel_check and kernel_packages decide (the managed system's os-release)."""
    return ka.make_node(module)


def installed_kernels(module, node):
    found = set()
    if isinstance(node, kn.DnfKernel):
        # An RPM kernel release is <version>-<release>.<arch>; its package kernel-core-<version>-<release>.
        cores = node.installed().get('kernel-core', [])
        for k in (module.params['kernel'], module.params['fallback_kernel']):
            try:
                if k and kn.rpm_release(k).evr in cores:
                    found.add(k)
            except kn.KernelError:
                pass
    elif module.params['installroot'] or module.get_bin_path('dpkg-query'):
        for name in node.installed():
            if name.startswith('linux-image-') and name[len('linux-image-'):][:1].isdigit():
                found.add(name[len('linux-image-'):])
    boot = _under(module.params['installroot'], 'boot')
    if os.path.isdir(boot):
        found |= {n[len('vmlinuz-'):] for n in os.listdir(boot) if n.startswith('vmlinuz-')}
    return sorted(found)


def gate_module(module, node, kernel):
    p = module.params
    if not p['module_source']:
        return
    if p['module_source'] == 'prebuilt' and not p['branch']:
        raise bt.BootError('branch is required with module_source=prebuilt')
    if p['driver_version']:
        kn.check_driver_version(p['driver_version'], p['branch'])
    installed = node.installed()
    if isinstance(node, kn.DnfKernel):
        missing = kn.dnf_module_problem(node.path_of, kernel, p['module_source'], p['driver_version'], installed)
    else:
        kn.check_source_matches(p['module_source'], installed)
        missing = kn.nvidia_module_present(node, kernel, p['branch'] or '', p['module_source'], p['driver_version'], installed)
    if missing:
        raise bt.BootError('kernel %s has no NVIDIA module to boot with: %s; not changing what boots' % (kernel, missing))


def env_block_problem(module, p, grubenv_path):
    """Why GRUB cannot clear next_entry in the block at boot (grub-probe on its directory), or why that is
    not known; None when it can."""
    probe = p['grub_probe'] or next((t for t in PROBE if module.get_bin_path(t, required=False)), PROBE[0])
    if os.path.isabs(probe):
        tool = probe if os.access(probe, os.X_OK) else None
    else:
        tool = module.get_bin_path(probe, required=False)
    if not tool:
        return ('%s was not found on the node (grub-common; grub2-tools on the RHEL family), so it is not known whether '
                'GRUB can clear next_entry in %s' % (probe, grubenv_path))
    out = {}
    for target in ('fs', 'abstraction'):
        argv = [tool, '--target=%s' % target, os.path.dirname(grubenv_path)]
        rc, stdout, err = module.run_command(argv)
        if rc != 0:
            return ('%s failed (rc=%d: %s), so it is not known whether GRUB can clear next_entry in %s'
                    % (' '.join(argv), rc, (err or stdout).strip(), grubenv_path))
        out[target] = stdout
    return gb.env_block_problem(grubenv_path, out['fs'], out['abstraction'])


def do_verify(module, p, running, osrelease):
    nv_path = os.path.join(p['proc_path'], 'driver/nvidia/version')
    text = _fsio.read_text(nv_path)
    nvidia = kn.parse_nvidia_version(text) if text is not None else None
    try:
        files = read_files(p)
        nb = gb.next_boot(files.menu, files.env, files.grub_default).as_dict()
        pending, env_path = files.env.get('next_entry'), files.grubenv_path
    except (bt.BootError, gb.GrubError):
        nb, pending, env_path = None, None, 'the GRUB environment block'
    v = bt.verify(p['kernel'], p['driver_version'], running, osrelease, nvidia, nv_path, pending, env_path)
    result = dict(changed=False, verification=v.as_dict(), next_boot=nb, commands=[])
    if not v.ok and p['fail_on_mismatch']:
        with_driver = ' with driver %s' % p['driver_version'] if p['driver_version'] else ''
        module.fail_json(msg='kernel %s%s: %s' % (p['kernel'], with_driver, '; '.join(v.problems)), **result)
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            kernel=dict(type='str', required=True),
            state=dict(type='str', required=True, choices=list(bt.STATES)),
            fallback_kernel=dict(type='str'),
            menu_entry=dict(type='str'),
            driver_version=dict(type='str'),
            module_source=dict(type='str', choices=list(kn.MODULE_SOURCES)),
            branch=dict(type='str'),
            require_running=dict(type='bool', default=True),
            fail_on_mismatch=dict(type='bool', default=True),
            installroot=dict(type='path'),
            grubenv=dict(type='path'),
            grub_cfg=dict(type='path'),
            proc_path=dict(type='path', default='/proc'),
            grub_editenv=dict(type='str'),
            grub_probe=dict(type='str'),
            allow_no_fallback=dict(type='bool', default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    with HostTask(module, 'kernel_boot', (bt.BootError, gb.GrubError, kn.KernelError, pk.PackageError)) as task:
        bt.check_release(p['kernel'])
        if p['fallback_kernel']:
            bt.check_release(p['fallback_kernel'], 'fallback_kernel')
        if p['installroot'] and not os.path.isdir(p['installroot']):
            raise bt.BootError('installroot %r is not a directory' % p['installroot'])
        osrelease = os.path.join(p['proc_path'], 'sys/kernel/osrelease')
        text = _fsio.read_text(osrelease)
        running = text.strip() if text else None
        if p['state'] == 'verify':
            do_verify(module, p, running, osrelease)
        env_block = None
        if p['state'] == 'cancel':
            # Nothing else is required: the rescue of a failed node clears a one-shot GRUB did not.
            files = read_files(p)
            plan = bt.plan_cancel(files, p['kernel'])
        else:
            node = make_node(module)
            task.backend = node.backend
            rpm = isinstance(node, kn.DnfKernel)
            bt.check_installed(p['kernel'], installed_kernels(module, node), p['installroot'] or '/',
                               'kernel-core for %s' if rpm else 'linux-image-%s')
            files = read_files(p)
            gate_module(module, node, p['kernel'])
        if p['state'] == 'trial':
            plan = bt.plan_trial(files, p['kernel'], running, p['fallback_kernel'], p['menu_entry'])
            if not plan.booted:
                problem = env_block_problem(module, p, files.grubenv_path)
                env_block = dict(path=files.grubenv_path, one_shot=problem is None, problem=problem)
                plan = bt.check_one_shot(plan, problem, p['allow_no_fallback'])
                if problem is not None:
                    module.warn('kernel %s boots as the saved default without a fallback (allow_no_fallback): %s'
                                % (p['kernel'], problem))
        elif p['state'] == 'default':
            plan = bt.plan_default(files, p['kernel'], running, p['require_running'], osrelease, p['menu_entry'])
        editenv = p['grub_editenv'] or next((t for t in EDITENV if module.get_bin_path(t, required=False)), EDITENV[0])
        cmds = plan.commands(editenv, files.grubenv_path)
        if plan.changed and not module.check_mode:
            tool = module.get_bin_path(editenv, required=False) if not os.path.isabs(editenv) else editenv
            if not tool:
                raise bt.BootError('%s not found on the node (install grub-common, or grub2-tools-minimal on the RHEL '
                                   'family); nothing was changed' % editenv)
            for argv in plan.commands(tool, files.grubenv_path):
                rc, out, err = module.run_command(argv)
                if rc != 0:
                    raise bt.BootError('command failed (rc=%d): %s: %s' % (rc, ' '.join(argv), (err or out).strip()))
            files = read_files(p)
        env_after = files.env if not module.check_mode else plan.after
        result = dict(changed=plan.changed, entry=plan.entry, fallback_kernel=plan.fallback_kernel, booted=plan.booted,
                      grubenv=env_after, next_boot=gb.next_boot(files.menu, env_after, files.grub_default).as_dict(),
                      commands=cmds)
        if env_block is not None:
            result['env_block'] = env_block
        if module._diff:
            result['diff'] = {'before_header': files.grubenv_path, 'after_header': files.grubenv_path,
                              'before': gb.env_text(plan.before), 'after': gb.env_text(plan.after)}
        module.exit_json(**result)


if __name__ == '__main__':
    main()
