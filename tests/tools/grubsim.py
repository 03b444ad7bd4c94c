"""A GRUB boot, simulated for tests and the lab: which kernel boots, with GRUB's one-shot rule.

Written from GRUB's generated `00_header` (Debian/Ubuntu), independently of the collection's
code under test:

    if [ "${next_entry}" ] ; then
       set default="${next_entry}"
       set next_entry=
       save_env next_entry
       set boot_once=true
    else
       set default="${saved_entry}"      # with GRUB_DEFAULT=saved; otherwise GRUB_DEFAULT
    fi

So a set `next_entry` boots once and is cleared (the block keeps an empty `next_entry=`), and the
next boot, or a power cycle of a node that did not come up, takes `saved_entry`. The environment
block is read and written with the real `grub-editenv` (Debian's `grub-common`).

    cfg.write_text(render_grub_cfg([KERNEL_TARGET, KERNEL_OLD]))      # what update-grub writes
    res = boot(grubenv, cfg, proc=proc, driver='580.130.00')           # reboot the node
    res.kernel, res.boots                                              # what came up, every try
    boot(grubenv, cfg, fails={KERNEL_TARGET})                          # the target panics: fallback
    update_grub(root)                   # grub.cfg of root/boot/vmlinuz-*, as update-grub writes it

The RHEL family (8 and later) keeps the menu in BootLoaderSpec entries instead, one file per kernel,
`boot/loader/entries/<machine-id>-<release>.conf`, which the kernel package's `kernel-install add`
scriptlet writes (`write_bls_entry` writes the same file for an install root, where no scriptlet
runs); GRUB's `blscfg` makes one menu entry per file, its id the file name without `.conf`, newest
kernel first, and the 00_header one-shot rule is the same: `boot(grubenv, entries=<dir>)`.

`python grubsim.py update-grub <root>` is update_grub from the command line: the lab's install
roots run it after every dpkg run of apt (DPkg::Post-Invoke, tests/tools/labenv.py), as a
kernel's postinst runs update-grub on Ubuntu.

The disk under the environment block: GRUB's `save_env` writes the block's sectors in place through
the device it booted from, which it cannot do through a virtual device (its `diskfilter` - md RAID,
LVM - or `cryptodisk` - LUKS: "diskfilter writes are not supported") nor into btrfs or ZFS. There
the `save_env next_entry` above fails at boot and `next_entry` stays set: every boot takes it again.
`set_disk(grub_dir, fs=..., abstraction=...)` says what the block's directory sits on (default: ext2
on a plain partition, where save_env works); `boot` honours it, and `python grubsim.py grub-probe
--target=fs|abstraction <dir>` answers as grub-probe would (`probe_tool(bin_dir)` writes an
executable for a module's `grub_probe`).

    set_disk(root / 'boot/grub', abstraction=['diskfilter', 'mdraid1x'])   # /boot on md RAID1
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import os
import shlex
import shutil
import stat
import subprocess
import sys
from typing import Callable, Collection, Optional, Sequence, Union

UUID = '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0'
MACHINE_ID = '3c1b6f0e8d2a4b7c9e5f1a2b3c4d5e6f'


def editenv() -> str:
    tool = shutil.which('grub-editenv')
    if not tool:
        raise RuntimeError('grub-editenv not found: install Debian package grub-common')
    return tool


def create_grubenv(path: pathlib.Path, **values: str) -> pathlib.Path:
    """A fresh GRUB environment block (what grub-install creates) with `values` set."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    subprocess.run([editenv(), str(path), 'create'], check=True)
    if values:
        subprocess.run([editenv(), str(path), 'set'] + ['%s=%s' % kv for kv in values.items()], check=True)
    return path


DISK_FILE = '.grubsim-disk.json'      # in the environment block's directory: what it sits on


def set_disk(grub_dir: pathlib.Path, fs: str = 'ext2', abstraction: Sequence[str] = ()) -> pathlib.Path:
    """What the directory of the environment block sits on, as grub-probe names it: the filesystem
    module (`ext2` for ext2/3/4, `xfs`, `btrfs`, `zfs`, ...) and the abstraction modules from the
    device up (`diskfilter mdraid1x` for md RAID1, `diskfilter lvm`, `cryptodisk luks`; none for a
    plain partition)."""
    grub_dir.mkdir(parents=True, exist_ok=True)
    path = grub_dir / DISK_FILE
    path.write_text(json.dumps({'fs': fs, 'abstraction': list(abstraction)}))
    return path


def disk(grub_dir: pathlib.Path) -> dict:
    path = grub_dir / DISK_FILE
    return json.loads(path.read_text()) if path.is_file() else {'fs': 'ext2', 'abstraction': []}


def save_env_writes(grub_dir: pathlib.Path) -> bool:
    """Whether GRUB's save_env can write the block at boot: only straight onto a partition (no
    diskfilter or cryptodisk device between) and into a filesystem whose sectors it can rewrite."""
    d = disk(grub_dir)
    return not ({'diskfilter', 'cryptodisk'} & set(d['abstraction'])) and d['fs'] in ('ext2', 'xfs', 'fat')


def probe_tool(bin_dir: pathlib.Path) -> pathlib.Path:
    """An executable `grub-probe` answering from set_disk (for kernel_boot's grub_probe)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / 'grub-probe'
    tool.write_text('#!/bin/sh\nexec %s %s grub-probe "$@"\n'
                    % (shlex.quote(sys.executable), shlex.quote(str(pathlib.Path(__file__).resolve()))))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return tool


def grub_probe(argv: list[str]) -> int:
    """`grub-probe --target=fs|abstraction <path>`: the answer set_disk gave for <path>."""
    if len(argv) != 2 or argv[0] not in ('--target=fs', '--target=abstraction'):
        print('usage: grubsim.py grub-probe --target=fs|abstraction <path>', file=sys.stderr)
        return 2
    path = pathlib.Path(argv[1])
    if not path.exists():
        print("grub-probe: error: failed to get canonical path of `%s'." % path, file=sys.stderr)
        return 1
    d = disk(path if path.is_dir() else path.parent)
    print(d['fs'] if argv[0] == '--target=fs' else ' '.join(d['abstraction']))
    return 0


def read_env(path: pathlib.Path) -> dict[str, str]:
    out = subprocess.run([editenv(), str(path), 'list'], check=True, capture_output=True, text=True).stdout
    return dict(line.split('=', 1) for line in out.splitlines() if '=' in line)


def _version_key(release: str) -> list[int]:
    return [int(x) for x in re.findall(r'\d+', release)]


def render_grub_cfg(kernels: Sequence[str], uuid: str = UUID,
                    distributor: str = 'Ubuntu', grub_default: str = 'saved') -> str:
    """The menu part of the grub.cfg update-grub generates: the newest kernel first as the simple
    entry, then the "Advanced options" submenu with a normal and a recovery entry per kernel."""
    ks = sorted(kernels, key=_version_key, reverse=True)
    head = ['### BEGIN /etc/grub.d/00_header ###', 'if [ -s $prefix/grubenv ]; then', '  load_env', 'fi',
            'if [ "${next_entry}" ] ; then', '   set default="${next_entry}"', '   set next_entry=',
            '   save_env next_entry', '   set boot_once=true', 'else',
            '   set default="%s"' % ('${saved_entry}' if grub_default == 'saved' else grub_default), 'fi',
            'function load_video {', '  insmod all_video', '}', '### END /etc/grub.d/00_header ###',
            '### BEGIN /etc/grub.d/10_linux ###']
    body = ["menuentry '%s' --class ubuntu $menuentry_id_option 'gnulinux-simple-%s' {" % (distributor, uuid),
            '\tlinux\t/boot/vmlinuz-%s root=UUID=%s ro' % (ks[0], uuid), '\tinitrd\t/boot/initrd.img-%s' % ks[0], '}',
            "submenu 'Advanced options for %s' $menuentry_id_option 'gnulinux-advanced-%s' {" % (distributor, uuid)]
    for k in ks:
        for kind, title in (('advanced', '%s, with Linux %s' % (distributor, k)),
                            ('recovery', '%s, with Linux %s (recovery mode)' % (distributor, k))):
            body += ["\tmenuentry '%s' --class ubuntu $menuentry_id_option 'gnulinux-%s-%s-%s' {" % (title, k, kind, uuid),
                     '\t\tlinux\t/boot/vmlinuz-%s root=UUID=%s ro%s' % (k, uuid, ' recovery nomodeset' if kind == 'recovery' else ''),
                     '\t\tinitrd\t/boot/initrd.img-%s' % k, '\t}']
    body.append('}')
    return '\n'.join(head + body + ['### END /etc/grub.d/10_linux ###']) + '\n'


def boot_kernels(root: pathlib.Path) -> list[str]:
    """The kernel releases update-grub would list: root/boot/vmlinuz-<release>, newest first."""
    boot_dir = root / 'boot'
    found = [p.name[len('vmlinuz-'):] for p in boot_dir.glob('vmlinuz-*')] if boot_dir.is_dir() else []
    return sorted(found, key=_version_key, reverse=True)


def entry_id(kernel: str, uuid: str = UUID) -> str:
    """The `>` path of a kernel's normal entry in render_grub_cfg's menu (what grub-reboot takes)."""
    return 'gnulinux-advanced-%s>gnulinux-%s-advanced-%s' % (uuid, kernel, uuid)


def update_grub(root: pathlib.Path, uuid: str = UUID) -> list[str]:
    """update-grub for an install root: root/boot/grub/grub.cfg lists root/boot/vmlinuz-* (written
    atomically; with no kernel left, the menu is empty). Returns the kernels listed."""
    kernels = boot_kernels(root)
    cfg = root / 'boot' / 'grub' / 'grub.cfg'
    cfg.parent.mkdir(parents=True, exist_ok=True)
    tmp = cfg.with_name('grub.cfg.new')
    tmp.write_text(render_grub_cfg(kernels, uuid) if kernels else
                   '### BEGIN /etc/grub.d/00_header ###\n### END /etc/grub.d/00_header ###\n')
    os.replace(tmp, cfg)
    return kernels


@dataclasses.dataclass
class _Item:
    title: str
    id: Optional[str]
    kernel: Optional[str]
    children: list['_Item']


def _menu(cfg: str) -> list[_Item]:
    top: list[_Item] = []
    stack = [top]
    items: list[Optional[_Item]] = [None]
    for line in cfg.splitlines():
        m = re.match(r"^\s*(menuentry|submenu) '([^']*)'.*?\$menuentry_id_option '([^']*)' \{$", line)
        if m:
            it = _Item(m.group(2), m.group(3), None, [])
            stack[-1].append(it)
            stack.append(it.children)
            items.append(it)
            continue
        lm = re.match(r'^\s*linux\s+/boot/vmlinuz-(\S+)', line)
        if lm and items[-1] is not None and items[-1].kernel is None:
            items[-1].kernel = lm.group(1)
        if line.strip() == '}' and len(stack) > 1:
            stack.pop()
            items.pop()
    return top


def kernel_of(cfg: str, entry: str) -> Optional[str]:
    """The kernel a GRUB `default` (index, id or title, `>` into submenus) boots; None if none."""
    level = _menu(cfg)
    it: Optional[_Item] = None
    for step in (entry or '0').split('>'):
        it = None
        if step.isdigit():
            it = level[int(step)] if int(step) < len(level) else None
        else:
            it = next((x for x in level if step in (x.id, x.title)), None)
        if it is None:
            return None
        level = it.children
    return it.kernel if it else None


def bls_id(kernel: str, machine_id: str = MACHINE_ID) -> str:
    """The BLS entry id of a kernel (the file name without .conf), what grub2-reboot takes."""
    return '%s-%s' % (machine_id, kernel)


def write_bls_entry(root: pathlib.Path, kernel: str, machine_id: str = MACHINE_ID) -> pathlib.Path:
    """What `kernel-install add <kernel>` writes on Rocky Linux 9 (its 20-grub.install plugin)."""
    path = root / 'boot/loader/entries' / ('%s.conf' % bls_id(kernel, machine_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('title Rocky Linux (%s) 9.4 (Blue Onyx)\nversion %s\nlinux /vmlinuz-%s\ninitrd /initramfs-%s.img\n'
                    'options root=UUID=%s ro crashkernel=1G-4G:192M\ngrub_users $grub_users\ngrub_arg --unrestricted\n'
                    'grub_class rocky\n' % (kernel, kernel, kernel, kernel, UUID))
    return path


def bls_kernel_of(entries: pathlib.Path, entry: str) -> Optional[str]:
    """The kernel blscfg's menu entry `entry` (index, id = file stem, or title) boots; None if none."""
    items = []
    for f in entries.glob('*.conf'):
        fields = dict((line.split(None, 1) + [''])[:2] for line in f.read_text().splitlines() if line.strip())
        m = re.match(r'^/?vmlinuz-(\S+)', fields.get('linux', ''))
        items.append((f.name[:-len('.conf')], fields.get('title', '').strip(), m.group(1) if m else None))
    items.sort(key=lambda it: (_version_key(it[2] or ''), it[0]), reverse=True)
    e = entry or '0'
    if e.isdigit():
        return items[int(e)][2] if int(e) < len(items) else None
    return next((it[2] for it in items if e in (it[0], it[1])), None)


@dataclasses.dataclass
class BootResult:
    kernel: Optional[str]           # what runs now (None: nothing came up within max_boots)
    entry: str
    boots: list[tuple[str, Optional[str], bool]]   # (entry, kernel, came up) per try


def boot(grubenv: pathlib.Path, grub_cfg: Optional[pathlib.Path] = None, grub_default: str = 'saved', fails: Collection[str] = (),
         max_boots: int = 3, proc: Optional[pathlib.Path] = None,
         driver: Union[None, str, Callable[[str], Optional[str]]] = None,
         entries: Optional[pathlib.Path] = None) -> BootResult:
    """Reboot: GRUB picks the entry (and clears a set next_entry with grub-editenv, as save_env does,
    unless save_env cannot write the block: set_disk); a kernel in `fails` does not come up and the
    node is power-cycled. With `proc`, what came up is
    written as `sys/kernel/osrelease` and `cmdline` and, with `driver` (a version, or a function of
    the booted kernel giving the version of the NVIDIA module that loads with it, None for none),
    `driver/nvidia/version` (removed when no NVIDIA module loads). With `entries` (a BLS entries
    directory) the menu is those entries rather than `grub_cfg`."""
    cfg = grub_cfg.read_text() if entries is None and grub_cfg is not None else ''
    tries: list[tuple[str, Optional[str], bool]] = []
    while len(tries) < max_boots:
        env = read_env(grubenv)
        if env.get('next_entry'):
            entry = env['next_entry']
            if save_env_writes(grubenv.parent):
                subprocess.run([editenv(), str(grubenv), 'set', 'next_entry='], check=True)
        else:
            entry = (env.get('saved_entry') or '0') if grub_default == 'saved' else grub_default
        kernel = bls_kernel_of(entries, entry) if entries is not None else kernel_of(cfg, entry)
        up = kernel is not None and kernel not in fails
        tries.append((entry, kernel, up))
        if up:
            if proc is not None:
                (proc / 'sys/kernel').mkdir(parents=True, exist_ok=True)
                (proc / 'sys/kernel/osrelease').write_text(kernel + '\n')
                (proc / 'cmdline').write_text('BOOT_IMAGE=/boot/vmlinuz-%s root=UUID=%s ro\n' % (kernel, UUID))
                nv = proc / 'driver/nvidia/version'
                if callable(driver):
                    driver = driver(kernel)
                if driver:
                    nv.parent.mkdir(parents=True, exist_ok=True)
                    nv.write_text(nvidia_version_text(driver))
                elif nv.exists():
                    nv.unlink()
            return BootResult(kernel, entry, tries)
    return BootResult(None, tries[-1][0] if tries else '', tries)


def nvidia_version_text(driver: str, open_modules: bool = True) -> str:
    """`/proc/driver/nvidia/version` as the R580 driver writes it."""
    kind = 'Open Kernel Module for x86_64' if open_modules else 'x86_64 Kernel Module'
    return ('NVRM version: NVIDIA UNIX %s  %s  Release Build  (dvs-builder@U22-I3-AF03-09-1)  '
            'Sat Jan 10 05:20:46 UTC 2026\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n'
            % (kind, driver))


def main(argv: list[str]) -> int:
    if argv[:1] == ['grub-probe']:
        return grub_probe(argv[1:])
    if len(argv) != 2 or argv[0] != 'update-grub':
        print('usage: grubsim.py update-grub <install root> | grub-probe --target=fs|abstraction <path>', file=sys.stderr)
        return 2
    update_grub(pathlib.Path(argv[1]))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
