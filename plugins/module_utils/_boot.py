# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""Decisions of the one-shot trial boot (kernel_boot): what to write into the GRUB environment
block for `trial` (next_entry = the target, saved_entry = the fallback; refused where GRUB cannot
clear next_entry at boot unless allow_no_fallback), `default` (saved_entry = the target,
next_entry cleared) and `cancel` (a pending next_entry of the kernel cleared), and what `verify`
compares (a next_entry still pending after the reboot is a problem).

Pure: the module reads the files and runs `grub-editenv` with the `sets`/`unsets` planned here.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Optional, Sequence

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _grub as gb

STATES = ('trial', 'default', 'verify', 'cancel')
_RELEASE = re.compile(r'^\d+\.\d+\.\d+-[0-9][0-9A-Za-z._+-]*$')


class BootError(Exception):
    """A clear, user-facing error (nothing was changed)."""


def check_release(kernel: str, field: str = 'kernel') -> str:
    if not _RELEASE.match(str(kernel or '')):
        raise BootError('%s %r is not a kernel release such as 6.8.0-135-generic (as uname -r prints it)' % (field, kernel))
    return kernel


@dataclasses.dataclass
class BootFiles:
    """What the module read, with the paths it read them from (for messages)."""
    grubenv_path: str
    env: Dict[str, str]
    grub_cfg_path: str
    menu: List[gb.MenuItem]
    default_grub_path: str
    grub_default: Optional[str]
    bls: bool = False          # the menu is the BootLoaderSpec entries (grub_cfg_path is their directory)


@dataclasses.dataclass
class BootPlan:
    state: str
    kernel: str
    entry: str
    fallback_kernel: Optional[str]
    fallback_entry: Optional[str]
    sets: Dict[str, str]
    unsets: List[str]
    before: Dict[str, str]
    booted: bool

    @property
    def changed(self) -> bool:
        return bool(self.sets or self.unsets)

    @property
    def after(self) -> Dict[str, str]:
        env = dict(self.before)
        env.update(self.sets)
        for k in self.unsets:
            env.pop(k, None)
        return env

    def commands(self, editenv: str, path: str) -> List[List[str]]:
        cmds = []
        if self.sets:
            cmds.append([editenv, path, 'set'] + ['%s=%s' % kv for kv in sorted(self.sets.items())])
        if self.unsets:
            cmds.append([editenv, path, 'unset'] + sorted(self.unsets))
        return cmds


def target_entry(files: BootFiles, kernel: str, menu_entry: Optional[str]) -> str:
    if menu_entry:
        item = gb.resolve_entry(files.menu, menu_entry)
        if item is None or item.kernel != kernel:
            # Name what was searched: the BootLoaderSpec entries directory, or the generated grub.cfg.
            where = ('a BootLoaderSpec entry in %s (its file name without .conf)' if files.bls else 'an entry of %s') \
                % files.grub_cfg_path
            raise BootError('menu_entry %r does not name %s that boots kernel %s (it boots %s)'
                            % (menu_entry, where, kernel, item.kernel if item else 'nothing'))
        return menu_entry
    found = gb.entries_for_kernel(files.menu, kernel)
    if not found:
        listed = sorted({it.kernel for it in gb.menu_entries(files.menu) if it.kernel})
        if files.bls:
            raise BootError("%s has no BootLoaderSpec entry that boots kernel %s (expected a <machine-id>-%s.conf with "
                            "'linux /vmlinuz-%s', as the kernel package's kernel-install writes it; kernels with an "
                            "entry: %s); run kernel-install add %s /lib/modules/%s/vmlinuz, nothing was changed"
                            % (files.grub_cfg_path, kernel, kernel, kernel, ', '.join(listed) or 'none', kernel, kernel))
        raise BootError("%s has no menu entry that boots kernel %s (expected a menuentry with 'linux /boot/vmlinuz-%s', "
                        "as update-grub writes once the kernel is installed; kernels listed: %s); run update-grub, "
                        "nothing was changed" % (files.grub_cfg_path, kernel, kernel, ', '.join(listed) or 'none'))
    return found[0]


def _require_saved(files: BootFiles, why: str) -> None:
    if files.grub_default != 'saved':
        raise BootError('%s sets GRUB_DEFAULT=%s, expected GRUB_DEFAULT=saved: %s; set GRUB_DEFAULT=saved and run '
                        'update-grub, nothing was changed'
                        % (files.default_grub_path, files.grub_default if files.grub_default is not None else '(unset, 0)', why))


def check_installed(kernel: str, installed_kernels: Sequence[str], where: str, package: str = 'linux-image-%s') -> None:
    """`package`: the kernel's package name pattern (`kernel-core-%s` with the version-release on RPM)."""
    if kernel not in installed_kernels:
        pkg = package % kernel if '%s' in package else package
        raise BootError('kernel %s is not installed (no %s package and no boot/vmlinuz-%s under %s; installed '
                        'kernels: %s), nothing was changed' % (kernel, pkg, kernel, where, ', '.join(installed_kernels) or 'none'))


def plan_trial(files: BootFiles, kernel: str, running: Optional[str], fallback: Optional[str],
               menu_entry: Optional[str] = None) -> BootPlan:
    """next_entry = the target (boots once, GRUB clears it); saved_entry = the fallback kernel
    (the running one by default), so the boot after the trial and any power cycle come back to it."""
    entry = target_entry(files, kernel, menu_entry)
    _require_saved(files, 'after the one-shot trial (or a power cycle) GRUB boots saved_entry, the fallback kernel')
    env = files.env
    saved_item = gb.resolve_entry(files.menu, gb.default_entry(env, files.grub_default))
    fb = fallback or running
    if running == kernel and not fallback:
        # Already booted into the target: nothing is left to try once.
        return BootPlan('trial', kernel, entry, saved_item.kernel if saved_item else None,
                        gb.default_entry(env, files.grub_default), {}, [], dict(env), True)
    if fb is None:
        raise BootError('the fallback kernel is unknown (no running kernel read and no fallback_kernel given), nothing was changed')
    if fb == kernel:
        raise BootError('fallback_kernel %s is the trial kernel itself; the fallback must be the kernel to come back to' % fb)
    sets: Dict[str, str] = {}
    fb_entry = gb.default_entry(env, files.grub_default)
    if saved_item is None or saved_item.kernel != fb:
        cands = gb.entries_for_kernel(files.menu, fb)
        if not cands:
            raise BootError('%s has no menu entry that boots the fallback kernel %s, so a failed trial could not come '
                            'back to it; nothing was changed' % (files.grub_cfg_path, fb))
        fb_entry = cands[0]
        sets['saved_entry'] = fb_entry
    if env.get('next_entry') != entry:
        sets['next_entry'] = entry
    return BootPlan('trial', kernel, entry, fb, fb_entry, sets, [], dict(env), False)


def check_one_shot(plan: BootPlan, problem: Optional[str], allow_no_fallback: bool) -> BootPlan:
    """The trial `plan` where GRUB can clear next_entry at boot (`problem` None: `_grub.env_block_problem`
    found none). Where it cannot, or it is not known (`problem` says why), the one-shot would boot the trial
    kernel on every boot, a kernel that does not come up included: refused (BootError, nothing was
    changed) unless `allow_no_fallback`; then the plan makes the kernel the saved default (saved_entry,
    a pending next_entry cleared) with no fallback, so no next_entry is left behind either way. A plan
    that found the kernel running already (booted) writes nothing and is returned as it is."""
    if problem is None or plan.booted:
        return plan
    if not allow_no_fallback:
        raise BootError('kernel %s cannot be booted once: %s, so the one-shot next_entry would never be cleared and '
                        'every boot, a failed one included, would take kernel %s again instead of the fallback %s; '
                        'nothing was changed. Set allow_no_fallback=true (the role: node_upgrade_kernel_allow_no_fallback) '
                        'to boot it as the saved default without a fallback'
                        % (plan.kernel, problem, plan.kernel, plan.fallback_kernel))
    env = plan.before
    sets = {} if env.get('saved_entry') == plan.entry else {'saved_entry': plan.entry}
    unsets = ['next_entry'] if env.get('next_entry') else []
    return BootPlan('trial', plan.kernel, plan.entry, None, None, sets, unsets, dict(env), False)


def plan_cancel(files: BootFiles, kernel: str) -> BootPlan:
    """next_entry cleared where it is the pending one-shot of `kernel` (a trial not taken, or one GRUB
    could not clear at boot), so saved_entry boots next; saved_entry is not changed. A next_entry that
    boots another kernel is refused (someone else's one-shot, nothing was changed)."""
    env = files.env
    pending = env.get('next_entry') or ''
    fb = gb.default_entry(env, files.grub_default)
    fb_item = gb.resolve_entry(files.menu, fb)
    if pending:
        item = gb.resolve_entry(files.menu, pending)
        if item is None or item.kernel != kernel:
            raise BootError('next_entry=%s in %s boots %s, not kernel %s; not clearing a one-shot boot of another kernel, '
                            'nothing was changed' % (pending, files.grubenv_path,
                                                     'kernel %s' % item.kernel if item and item.kernel else 'no entry', kernel))
    return BootPlan('cancel', kernel, fb, fb_item.kernel if fb_item else None, fb, {}, ['next_entry'] if pending else [],
                    dict(env), False)


def plan_default(files: BootFiles, kernel: str, running: Optional[str], require_running: bool, osrelease_path: str,
                 menu_entry: Optional[str] = None) -> BootPlan:
    """saved_entry = the target (after the trial boot into it and the node's gates); a pending
    next_entry is cleared."""
    entry = target_entry(files, kernel, menu_entry)
    _require_saved(files, 'saved_entry is what boots by default')
    if require_running and running != kernel:
        raise BootError('kernel %s is not running (running: %s, read from %s); make it the saved default only after the '
                        'trial boot into it and the node\'s gates passed, nothing was changed' % (kernel, running, osrelease_path))
    env = files.env
    sets = {} if env.get('saved_entry') == entry else {'saved_entry': entry}
    unsets = ['next_entry'] if 'next_entry' in env and env.get('next_entry', '') != '' else []
    return BootPlan('default', kernel, entry, None, None, sets, unsets, dict(env), running == kernel)


@dataclasses.dataclass
class Verification:
    kernel: str
    running_kernel: Optional[str]
    driver_version: Optional[str]
    loaded_driver_version: Optional[str]
    module_build_kernel: Optional[str]
    open_module: Optional[bool]
    problems: List[str]
    pending_next_entry: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> Dict[str, object]:
        d = dataclasses.asdict(self)
        d['ok'] = self.ok
        return d


def verify(kernel: str, driver_version: Optional[str], running: Optional[str], osrelease_path: str,
           nvidia: Optional[Dict[str, Any]], nvidia_path: str, pending: Optional[str] = None,
           grubenv_path: str = 'the GRUB environment block') -> Verification:
    """`pending`: the next_entry of the environment block now (None when it was not read). Read after
    the reboot, a set one is a one-shot GRUB did not clear: every boot takes it again."""
    problems = []
    if running is None:
        problems.append('%s cannot be read, so the running kernel is unknown' % osrelease_path)
    elif running != kernel:
        problems.append('the running kernel is %s, expected %s (%s)' % (running, kernel, osrelease_path))
    loaded = nvidia.get('driver_version') if nvidia else None
    build = nvidia.get('build_kernel') if nvidia else None
    if driver_version:
        if nvidia is None:
            problems.append('no NVIDIA kernel module is loaded (%s does not exist), expected driver %s' % (nvidia_path, driver_version))
        elif loaded != driver_version:
            problems.append('the loaded NVIDIA kernel module is %s, expected %s (%s)' % (loaded or 'unreadable', driver_version, nvidia_path))
    if build and build != kernel:
        problems.append('the loaded NVIDIA kernel module was built for kernel %s, not %s (%s)' % (build, kernel, nvidia_path))
    if pending:
        problems.append('GRUB did not clear the one-shot next_entry=%s in %s at boot (it cannot write its environment '
                        'block there: LVM, RAID, encryption, btrfs or ZFS under it), so every boot takes that entry '
                        'again; clear it (kernel_boot state=cancel, or grub-editenv %s unset next_entry)'
                        % (pending, grubenv_path, grubenv_path))
    return Verification(kernel, running, driver_version, loaded, build, nvidia.get('open') if nvidia else None, problems,
                        pending or None)
