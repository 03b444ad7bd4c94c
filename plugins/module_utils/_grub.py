# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""GRUB as the kernel modules read it: the environment block (grubenv), the generated menu
(grub.cfg), GRUB_DEFAULT, and which kernel a node boots next.

GRUB's rule (Debian/Ubuntu `00_header`): a non-empty `next_entry` boots once and GRUB clears it
(`set next_entry=` then `save_env next_entry`, leaving `next_entry=` in the block); otherwise, with
`GRUB_DEFAULT=saved`, `saved_entry` boots (entry 0 when unset); otherwise GRUB_DEFAULT itself.
Entries are a menu entry id, a title, or an index, and `>` walks into a submenu.

On the RHEL family (8 and later) the menu is not in grub.cfg but in BootLoaderSpec entries, one file
per kernel in /boot/loader/entries (`bls_menu`); the environment block and the one-shot rule are
the same (`grub2-editenv`, `grub2-reboot`).

Everything here is pure (text in, values out); writing goes through `grub-editenv` in the modules.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

GRUBENV_SIZE = 1024
GRUBENV_HEADER = '# GRUB Environment Block\n'
GRUBENV_PATHS = ('boot/grub/grubenv', 'boot/grub2/grubenv')
GRUB_CFG_PATHS = ('boot/grub/grub.cfg', 'boot/grub2/grub.cfg')
DEFAULT_GRUB = 'etc/default/grub'
DEFAULT_GRUB_DIR = 'etc/default/grub.d'
BLS_DIR = 'boot/loader/entries'


class GrubError(Exception):
    """A clear, user-facing error naming the file and what was expected."""


# --------------------------------------------------------------------------------------------
# grubenv
# --------------------------------------------------------------------------------------------

def parse_grubenv(data: bytes, path: str) -> Dict[str, str]:
    """The variables of a GRUB environment block; GrubError when `data` is not one."""
    if len(data) != GRUBENV_SIZE or not data.startswith(GRUBENV_HEADER.encode()):
        raise GrubError('%s is not a GRUB environment block (expected %d bytes starting with %r, as '
                        'grub-editenv writes it; found %d bytes starting with %r)'
                        % (path, GRUBENV_SIZE, GRUBENV_HEADER.strip(), len(data), data[:24].decode('utf-8', 'replace')))
    env: Dict[str, str] = {}
    for line in data.decode('utf-8', 'replace').split('\n'):
        if not line or line.startswith('#') or '=' not in line:
            continue
        k, v = line.split('=', 1)
        env[k] = v.replace('\\\n', '\n').replace('\\\\', '\\')
    return env


def render_grubenv(env: Dict[str, str]) -> str:
    """The block grub-editenv would write for `env` (used for check-mode diffs only)."""
    body = GRUBENV_HEADER + ''.join('%s=%s\n' % (k, v.replace('\\', '\\\\').replace('\n', '\\\n'))
                                    for k, v in env.items())
    if len(body.encode('utf-8')) > GRUBENV_SIZE:
        raise GrubError('the GRUB environment block would exceed %d bytes' % GRUBENV_SIZE)
    return body + '#' * (GRUBENV_SIZE - len(body.encode('utf-8')))


def env_text(env: Dict[str, str]) -> str:
    """A readable listing for diffs (what `grub-editenv list` prints)."""
    return ''.join('%s=%s\n' % kv for kv in env.items())


# --------------------------------------------------------------------------------------------
# Whether GRUB can write the block at boot (`save_env`), so that a one-shot `next_entry` is cleared
# --------------------------------------------------------------------------------------------
#
# GRUB's `save_env` writes the block in place, sector by sector, through the device it booted from.
# It cannot on a virtual device (an "abstraction": GRUB's diskfilter, md RAID, LVM, dmraid, LDM, and
# its cryptodisk, LUKS and GELI: "diskfilter writes are not supported") nor on a filesystem whose
# blocks it cannot rewrite in place (btrfs, ZFS, and the read-only ones). Ubuntu's
# /etc/grub.d/00_header tests the same with `grub-probe --target=abstraction` and `--target=fs` on
# the block's directory before it lets `recordfail` write. There `save_env next_entry` fails at boot,
# `next_entry` stays set, and every boot takes it again: the one-shot is not one.

# `grub-probe --target=fs` names (GRUB's filesystem modules) that save_env cannot write into: Ubuntu's
# 00_header list.
UNWRITABLE_FS = ('btrfs', 'zfs', 'cpiofs', 'newc', 'odc', 'romfs', 'squash4', 'tarfs')


def env_block_problem(path: str, fs: str, abstraction: str) -> Optional[str]:
    """Why GRUB cannot write the environment block `path` at boot, from what `grub-probe
    --target=fs` and `--target=abstraction` print for its directory; None when it can. Any
    abstraction counts (GRUB writes to none of its virtual devices)."""
    names = abstraction.split()
    fs = fs.strip()
    if names:
        return ('%s is on %s (grub-probe --target=abstraction): GRUB cannot write to an LVM, RAID or encrypted '
                'device at boot' % (path, ' '.join(names)))
    if fs in UNWRITABLE_FS:
        return '%s is on %s (grub-probe --target=fs): GRUB cannot write into a %s filesystem at boot' % (path, fs, fs)
    if not fs:
        return 'grub-probe --target=fs named no filesystem for %s' % path
    return None


# --------------------------------------------------------------------------------------------
# /etc/default/grub (and grub.d/*.cfg, read after it, as update-grub sources them)
# --------------------------------------------------------------------------------------------

def grub_default(texts: Sequence[Optional[str]], name: str = 'GRUB_DEFAULT') -> Optional[str]:
    """GRUB_DEFAULT (or the setting `name`) after sourcing every text in order (last assignment
    wins), unquoted."""
    value = None
    for text in texts:
        for line in (text or '').splitlines():
            m = re.match(r'^\s*(?:export\s+)?%s=(.*?)\s*$' % re.escape(name), line)
            if m:
                v = m.group(1)
                if len(v) >= 2 and v[0] == v[-1] and v[0] in '"\'':
                    v = v[1:-1]
                value = v
    return value


# --------------------------------------------------------------------------------------------
# grub.cfg
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class MenuItem:
    kind: str                 # 'menuentry' or 'submenu'
    title: str
    id: Optional[str]
    kernel: Optional[str] = None     # from the entry's `linux /boot/vmlinuz-<release>` line
    recovery: bool = False
    children: List['MenuItem'] = dataclasses.field(default_factory=list)


_ITEM_RE = re.compile(r"""^\s*(menuentry|submenu)\s+(?:'([^']*)'|"([^"]*)"|(\S+))(.*)\{\s*$""")
_ID_RE = re.compile(r"""(?:\$menuentry_id_option|--id)\s+(?:'([^']*)'|"([^"]*)"|(\S+))""")
_LINUX_RE = re.compile(r'^\s*linux(?:efi|16)?\s+\S*?/vmlinuz-(\S+)')


def parse_grub_cfg(text: str) -> List[MenuItem]:
    """The menu tree of a generated grub.cfg (top-level items, submenus with their children)."""
    top: List[MenuItem] = []
    stack: List[Tuple[Optional[MenuItem], List[MenuItem]]] = [(None, top)]
    depth_other = 0          # braces of other blocks (if/function) inside the current level
    for line in text.splitlines():
        m = _ITEM_RE.match(line)
        if m:
            title = next(g for g in m.group(2, 3, 4) if g is not None)
            idm = _ID_RE.search(m.group(5) or '')
            item_id = next((g for g in idm.groups() if g is not None), None) if idm else None
            item = MenuItem(m.group(1), title, item_id, recovery='recovery mode' in title)
            stack[-1][1].append(item)
            stack.append((item, item.children))
            continue
        s = line.strip()
        current = stack[-1][0]
        if current is not None and current.kind == 'menuentry':
            lm = _LINUX_RE.match(line)
            if lm and current.kernel is None:
                current.kernel = lm.group(1)
        if s.endswith('{') and not s.startswith('#'):
            depth_other += 1
        elif s == '}':
            if depth_other:
                depth_other -= 1
            elif len(stack) > 1:
                stack.pop()
    return top


def _walk(items: Sequence[MenuItem], prefix_ids: Tuple[str, ...] = ()) -> List[Tuple[Tuple[str, ...], MenuItem]]:
    out = []
    for it in items:
        path = prefix_ids + ((it.id or it.title),)
        if it.kind == 'menuentry':
            out.append((path, it))
        else:
            out.extend(_walk(it.children, path))
    return out


def entries_for_kernel(menu: Sequence[MenuItem], kernel: str) -> List[str]:
    """`>`-joined id paths of the normal (not recovery) entries that boot `kernel`, the
    submenu entries first (their ids name the release, so they stay right when kernels are added)."""
    found = [(len(path) == 1, '>'.join(path)) for path, it in _walk(menu) if it.kernel == kernel and not it.recovery]
    return [item[1] for item in sorted(found, key=lambda x: x[0])]


def menu_entries(menu: Sequence[MenuItem]) -> List[MenuItem]:
    """Every menu entry, submenus walked, in menu order."""
    return [item for path, item in _walk(menu)]


def resolve_entry(menu: Sequence[MenuItem], entry: Optional[str]) -> Optional[MenuItem]:
    """The menu entry a GRUB default names (index, id or title per `>` step); None if none."""
    if entry is None or entry.strip() == '':
        entry = '0'
    level: Sequence[MenuItem] = menu
    item: Optional[MenuItem] = None
    for step in entry.split('>'):
        step = step.strip()
        item = None
        if step.isdigit():
            if int(step) < len(level):
                item = level[int(step)]
        else:
            item = next((it for it in level if it.id == step), None) or \
                next((it for it in level if it.title == step), None)
        if item is None:
            return None
        level = item.children
    return item if item is not None and item.kind == 'menuentry' else None


@dataclasses.dataclass
class NextBoot:
    """What GRUB boots next: the entry, its kernel, whether it is a one-shot (`next_entry`), and
    what boots after that one-shot (the fallback)."""
    entry: str
    kernel: Optional[str]
    once: bool
    fallback_entry: str
    fallback_kernel: Optional[str]

    def as_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self)


def default_entry(env: Dict[str, str], default: Optional[str]) -> str:
    if default == 'saved':
        return env.get('saved_entry') or '0'
    return default if default not in (None, '') else '0'


def next_boot(menu: Sequence[MenuItem], env: Dict[str, str], default: Optional[str]) -> NextBoot:
    fallback = default_entry(env, default)
    fb_item = resolve_entry(menu, fallback)
    nxt = env.get('next_entry') or ''
    if nxt:
        item = resolve_entry(menu, nxt)
        return NextBoot(nxt, item.kernel if item else None, True, fallback, fb_item.kernel if fb_item else None)
    return NextBoot(fallback, fb_item.kernel if fb_item else None, False, fallback, fb_item.kernel if fb_item else None)


# --------------------------------------------------------------------------------------------
# BootLoaderSpec entries (RHEL family 8 and later: GRUB_ENABLE_BLSCFG=true)
# --------------------------------------------------------------------------------------------
#
# The rules, from public sources:
# - Red Hat, RHEL 8 "Managing, monitoring and updating the kernel", "What boot entries are": one
#   file per installed kernel in /boot/loader/entries, named <machine-id>-<kernel release>.conf
#   (written by the kernel package's `kernel-install add` scriptlet), with `title`, `version`,
#   `linux /vmlinuz-<release>` (relative to /boot), `initrd`, `options` (and an `id` field that GRUB
#   does not use for the menu).
# - Fedora/RHEL grub2's `blscfg` command (the BLS patches; Fedora grub2 commit 420527a "Fix menu
#   entry selection based on ID and title", "sort everything with rpm package comparison") makes
#   one menu entry per file, its id the file name without `.conf`, the newest version first.
# - grub2-reboot(8): MENU_ENTRY is a number, a title or a menu item identifier; it writes
#   `next_entry` into /boot/grub2/grubenv. `grub2-set-default <id>` and `grubby --set-default
#   /boot/vmlinuz-<release>` write `saved_entry=<id>` (the same file stem).
# - The one-shot rule is the 00_header of grub2-mkconfig, the same as Debian's (module docstring).


def use_bls(has_entries: bool, enable_blscfg: Optional[str]) -> bool:
    """The menu comes from the BLS entries when there are some, unless /etc/default/grub says
    GRUB_ENABLE_BLSCFG=false (then grub2-mkconfig writes the entries into grub.cfg)."""
    return has_entries and (enable_blscfg or '').strip().lower() != 'false'


def parse_bls_entry(name: str, text: str) -> MenuItem:
    """One BLS entry file (`name` is its file name) as the menu entry blscfg makes of it: id = the
    file name without `.conf`, the `title`, the kernel of its `linux /vmlinuz-<release>` line; a
    rescue entry (`vmlinuz-0-rescue-<machine-id>`) counts as recovery."""
    fields: Dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if not parts or parts[0].startswith('#'):
            continue
        fields.setdefault(parts[0], parts[1].strip() if len(parts) > 1 else '')
    stem = name[:-len('.conf')] if name.endswith('.conf') else name
    m = re.match(r'^\S*?/?vmlinuz-(\S+)', fields.get('linux', ''))
    kernel = m.group(1) if m else None
    rescue = kernel is not None and kernel.startswith('0-rescue-')
    return MenuItem('menuentry', fields.get('title') or stem, stem, None if rescue else kernel, recovery=rescue)


def _bls_key(item: MenuItem) -> Tuple[List[int], str]:
    return [int(x) for x in re.findall(r'\d+', item.kernel or '')], item.id or ''


def bls_menu(files: Dict[str, str]) -> List[MenuItem]:
    """The menu blscfg builds from {file name: text} of /boot/loader/entries/*.conf: newest kernel
    first (the numeric fields of the release compared in order, then the file name), rescue last."""
    items = [parse_bls_entry(n, t) for n, t in files.items() if n.endswith('.conf')]
    kernels = sorted((it for it in items if it.kernel), key=_bls_key, reverse=True)
    return kernels + sorted((it for it in items if not it.kernel), key=lambda it: it.id or '')
