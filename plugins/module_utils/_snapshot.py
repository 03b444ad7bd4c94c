# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to the collection: no compatibility promise.
"""Node snapshots for rollback: capture, digest, verify, plan and apply a restore.

A snapshot document is `{"format": FORMAT, "sha256": <hex>, "snapshot": {...}}`; the digest is the
SHA-256 of the canonical JSON of `snapshot` (sorted keys, no spaces, UTF-8). A restore verifies
the digest (and, when given, the digest recorded elsewhere) before it reads anything else.
"""
from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import hashlib
import json
import os
import re
import socket
from typing import Any, Dict, List, Optional, Sequence

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fsio
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk

FORMAT = 'gpufleet.upgrade/node-snapshot/v1'
DEFAULT_PACKAGE_PATTERNS = ('*nvidia*', 'cuda-drivers*')
KERNEL_MODULE_PATTERN = 'linux-modules-nvidia-*'
KERNEL_PACKAGE_PATTERNS = ('linux-image-*', 'linux-modules-[0-9]*', 'kernel', 'kernel-core', 'kernel-modules')
MODPROBE_DIRS = ('etc/modprobe.d', 'usr/lib/modprobe.d', 'lib/modprobe.d')
GRUBENV_PATHS = ('boot/grub/grubenv', 'boot/grub2/grubenv')
MIG_CONFIG_PATHS = ('etc/nvidia-mig-manager/config.yaml',)
GRUBENV_SIZE = 1024
GRUBENV_HEADER = '# GRUB Environment Block\n'


class SnapshotError(Exception):
    """A clear, user-facing error."""


# --------------------------------------------------------------------------------------------
# Digest and document
# --------------------------------------------------------------------------------------------

def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(',', ':'), ensure_ascii=False).encode('utf-8')


def digest(snapshot: Dict[str, Any]) -> str:
    return hashlib.sha256(canonical(snapshot)).hexdigest()


def make_document(snapshot: Dict[str, Any]) -> Dict[str, Any]:
    return {'format': FORMAT, 'sha256': digest(snapshot), 'snapshot': snapshot}


def dump_document(doc: Dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + '\n'


def verify_document(doc: Any, expected_sha256: Optional[str] = None) -> Dict[str, Any]:
    """The snapshot inside `doc` (a dict or JSON text) once its digest checks out."""
    if isinstance(doc, (str, bytes)):
        try:
            doc = json.loads(doc)
        except ValueError as e:
            raise SnapshotError('the snapshot is not valid JSON: %s' % e)
    if not isinstance(doc, dict):
        raise SnapshotError('the snapshot must be a JSON object, got %s' % type(doc).__name__)
    if doc.get('format') != FORMAT:
        raise SnapshotError('unknown snapshot format %r (expected %r)' % (doc.get('format'), FORMAT))
    snap = doc.get('snapshot')
    recorded = doc.get('sha256')
    if not isinstance(snap, dict) or not isinstance(recorded, str):
        raise SnapshotError('the snapshot document lacks its snapshot or sha256 field')
    actual = digest(snap)
    if actual != recorded:
        raise SnapshotError('snapshot digest mismatch: recorded sha256 %s, content hashes to %s; '
                            'the snapshot was modified or corrupted, nothing was restored' % (recorded, actual))
    if expected_sha256 and expected_sha256.lower() != actual:
        raise SnapshotError('snapshot digest %s does not match the expected sha256 %s; nothing was restored'
                            % (actual, expected_sha256))
    for key in ('packages', 'pins', 'holds', 'boot'):
        if key not in snap:
            raise SnapshotError('the snapshot lacks %r' % key)
    return snap


def kept_snapshot_problem(snapshot: Dict[str, Any], gpu_facts: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why a snapshot already on disk is not the rollback point of the node as it is now (None when
    it is, or when there are no GPU facts to compare with): it was taken on another driver, for
    example before an earlier rollout."""
    if not gpu_facts:
        return None
    now = gpu_facts.get('driver_version')
    then = ((snapshot or {}).get('gpu_facts') or {}).get('driver_version')
    if now is not None and then != now:
        return ('the kept snapshot was taken when the node ran driver %s, but it runs %s now: it is not this node\'s '
                'rollback point (move it away, or set force: true to take a new one)' % (then, now))
    return None


# --------------------------------------------------------------------------------------------
# Boot configuration: /etc/default/grub and grubenv
# --------------------------------------------------------------------------------------------

def parse_default_grub(text: Optional[str]) -> Optional[str]:
    """The value of the last GRUB_DEFAULT= line, unquoted; None when absent."""
    value = None
    for line in (text or '').splitlines():
        m = re.match(r'^\s*GRUB_DEFAULT=(.*)$', line)
        if m:
            value = m.group(1).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in '"\'':
                value = value[1:-1]
    return value


def set_default_grub(text: Optional[str], value: Optional[str]) -> Optional[str]:
    """`text` with GRUB_DEFAULT set to `value` (quoted), or removed when None."""
    lines = (text or '').splitlines()
    out = [line for line in lines if not re.match(r'^\s*GRUB_DEFAULT=', line)] if value is None else []
    if value is not None:
        new = 'GRUB_DEFAULT="%s"' % value.replace('"', '\\"')
        done = False
        for line in lines:
            if re.match(r'^\s*GRUB_DEFAULT=', line):
                if not done:
                    out.append(new)
                    done = True
                continue
            out.append(line)
        if not done:
            out.append(new)
    if text is None and value is None:
        return None
    return '\n'.join(out) + '\n'


def parse_grubenv(text: Optional[str]) -> Dict[str, str]:
    res = {}
    for line in (text or '').splitlines():
        if line.startswith('#') or '=' not in line:
            continue
        k, v = line.split('=', 1)
        res[k] = v
    return res


def render_grubenv(env: Dict[str, str]) -> str:
    """A 1024-byte GRUB environment block, as grub-editenv writes it."""
    body = GRUBENV_HEADER + ''.join('%s=%s\n' % kv for kv in env.items())
    if len(body.encode('utf-8')) > GRUBENV_SIZE:
        raise SnapshotError('the GRUB environment block would exceed %d bytes' % GRUBENV_SIZE)
    return body + '#' * (GRUBENV_SIZE - len(body.encode('utf-8')))


def find_grubenv(path_of) -> str:
    for rel in GRUBENV_PATHS:
        if os.path.exists(path_of(rel)):
            return rel
    return GRUBENV_PATHS[0]


GRUB_CFG_PATHS = ('boot/grub/grub.cfg', 'boot/grub2/grub.cfg')
_KERNEL_IMAGE_RE = re.compile(r'^linux-image-(?:unsigned-)?(\d[^\s]*)$')
_ENTRY_ID_RE = re.compile(r'^gnulinux-(\d.*?)-(?:advanced|recovery)(?:-.*)?$')
_ENTRY_TITLE_RE = re.compile(r' with Linux (\S+?)(?: \(recovery mode\))?$')


def installed_kernels(package_names: Sequence[str]) -> List[str]:
    """Kernel releases with an installed `linux-image-<release>` package, newest first (GRUB's order)."""
    found = set()
    for name in package_names:
        m = _KERNEL_IMAGE_RE.match(name)
        if m:
            found.add(m.group(1))
    return sorted(found, key=pk._deb_key, reverse=True)


def kernel_of_entry(entry: Optional[str], kernels: Sequence[str]) -> Optional[str]:
    """The kernel release a GRUB default (`0`, a menu entry id or title, `submenu>entry`) boots.

    `kernels` are the installed releases, newest first: entry 0 (and `gnulinux-simple-*`) boots the
    newest. None when the entry cannot be resolved without the generated grub.cfg (`1>2`).
    """
    if entry is None or entry.strip() in ('', '0'):
        return kernels[0] if kernels else None
    last = entry.split('>')[-1].strip()
    if last.startswith('gnulinux-simple-') and '>' not in entry:
        return kernels[0] if kernels else None
    for regex in (_ENTRY_ID_RE, _ENTRY_TITLE_RE):
        m = regex.search(last)
        if m:
            return m.group(1)
    return None


def default_boot_kernel(grub_default: Optional[str], saved_entry: Optional[str], kernels: Sequence[str]) -> Optional[str]:
    """The kernel release that GRUB_DEFAULT (and, with `saved`, the grubenv saved_entry) boots."""
    if grub_default == 'saved':
        return kernel_of_entry(saved_entry, kernels)
    return kernel_of_entry(grub_default, kernels)


def grub_entry_for(kernel: str, grub_cfg: Optional[str]) -> str:
    """The saved_entry that boots `kernel`.

    The entry id (`gnulinux-advanced-<uuid>>gnulinux-<kernel>-advanced-<uuid>`) when the generated
    grub.cfg lists it; otherwise Ubuntu's title path `Advanced options for Ubuntu>Ubuntu, with Linux
    <kernel>`, which update-grub generates on Ubuntu.
    """
    submenu_id = None
    for line in (grub_cfg or '').splitlines():
        m = re.match(r"^\s*(submenu|menuentry)\s.*\$menuentry_id_option\s+'([^']+)'", line)
        if not m:
            continue
        if m.group(1) == 'submenu':
            submenu_id = m.group(2)
        elif m.group(2).startswith('gnulinux-%s-advanced-' % kernel) and line.startswith((' ', '\t')) and submenu_id:
            return '%s>%s' % (submenu_id, m.group(2))
    return 'Advanced options for Ubuntu>Ubuntu, with Linux %s' % kernel


def find_grub_cfg(path_of) -> Optional[str]:
    for rel in GRUB_CFG_PATHS:
        text = _fsio.read_text(path_of(rel))
        if text is not None:
            return text
    return None


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------

def _read_proc(proc_path: str, rel: str) -> Optional[str]:
    text = _fsio.read_text(os.path.join(proc_path, rel))
    return text.strip() if text is not None else None


def modprobe_files(path_of) -> Dict[str, str]:
    """{relative path: content} of modprobe.d files that name or configure nvidia."""
    res = {}
    for d in MODPROBE_DIRS:
        full = path_of(d)
        if not os.path.isdir(full):
            continue
        for name in sorted(os.listdir(full)):
            p = os.path.join(full, name)
            if not os.path.isfile(p):
                continue
            text = _fsio.read_text(p) or ''
            if 'nvidia' in name.lower() or 'nvidia' in text.lower() or 'nvreg' in text.lower():
                res['%s/%s' % (d, name)] = text
    return res


def _matching(names: Sequence[str], patterns: Sequence[str]) -> List[str]:
    return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns))


RESULT_KEYS = ('changed', 'failed', 'invocation', 'warnings', 'deprecations', 'msg', 'skipped')


def clean_facts(gpu_facts: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """GPU facts without the task-result keys of a registered gpu_info result."""
    if gpu_facts is None:
        return None
    return {k: v for k, v in gpu_facts.items() if k not in RESULT_KEYS and not k.startswith('_ansible')}


def mig_from_facts(gpu_facts: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for g in (gpu_facts or {}).get('gpus') or []:
        if isinstance(g, dict):
            out.append({'index': g.get('index'), 'uuid': g.get('uuid'), 'pci_id': g.get('pci_id'),
                        'bus_id': g.get('bus_id'), 'mig_mode': g.get('mig_mode')})
    return out


def capture(backend, proc_path: str = '/proc', gpu_facts: Optional[Dict[str, Any]] = None,
            package_patterns: Sequence[str] = DEFAULT_PACKAGE_PATTERNS, hostname: Optional[str] = None,
            now: Optional[datetime.datetime] = None) -> Dict[str, Any]:
    """Read everything a rollback needs from the node (nothing is changed)."""
    runner = backend.runner
    path_of = runner.path
    gpu_facts = clean_facts(gpu_facts)
    if backend.name == 'apt':
        entries = backend.dpkg_entries()
        installed = {n: e.version for n, e in entries.items() if e.installed}
        held = sorted(n for n, e in entries.items() if e.want == 'hold')
        pref_dir = path_of('etc/apt/preferences.d')
        preferences = {}
        if os.path.isdir(pref_dir):
            for name in sorted(os.listdir(pref_dir)):
                if os.path.isfile(os.path.join(pref_dir, name)):
                    preferences['etc/apt/preferences.d/' + name] = _fsio.read_text(os.path.join(pref_dir, name)) or ''
    else:
        installed = rpm_installed(backend)
        held = []
        preferences = {}
        vl = _fsio.read_text(backend.pin_path)
        if vl is not None:
            preferences[pk.VERSIONLOCK_FILE] = vl
    driver = _matching(list(installed), package_patterns)
    kernel = _matching(list(installed), KERNEL_PACKAGE_PATTERNS)
    pin_text = _fsio.read_text(backend.pin_path)
    grubenv_rel = find_grubenv(path_of)
    default_grub = _fsio.read_text(path_of('etc/default/grub'))
    saved_entry = parse_grubenv(_fsio.read_text(path_of(grubenv_rel))).get('saved_entry')
    grub_default = parse_default_grub(default_grub)
    snap = {
        'captured_at': (now or datetime.datetime.now(datetime.timezone.utc)).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'hostname': hostname or socket.gethostname(),
        'installroot': runner.installroot,
        'backend': backend.name,
        'packages': {n: installed[n] for n in driver},
        'kernel_packages': {n: installed[n] for n in kernel},
        'holds': [h for h in held if h in driver],
        'pins': {'pin_file': os.path.relpath(backend.pin_path, path_of('')), 'content': pin_text,
                 'pins': backend_parse_pins(backend, pin_text)},
        'preferences': preferences,
        'boot': {
            'running_kernel': _read_proc(proc_path, 'sys/kernel/osrelease'),
            'cmdline': _read_proc(proc_path, 'cmdline'),
            'grub_default': grub_default,
            'grubenv_path': grubenv_rel,
            'saved_entry': saved_entry,
            # What that configuration boots, with the kernels installed now (apt roots; None when unknown).
            'default_kernel': default_boot_kernel(grub_default, saved_entry, installed_kernels(list(installed)))
            if backend.name == 'apt' else None,
        },
        'modprobe': modprobe_files(path_of),
        'mig': {'gpus': mig_from_facts(gpu_facts),
                'config_files': {rel: _fsio.read_text(path_of(rel)) for rel in MIG_CONFIG_PATHS
                                 if os.path.isfile(path_of(rel))}},
        'gpu_facts': gpu_facts,
    }
    return snap


def rpm_installed(backend) -> Dict[str, str]:
    """{name: [epoch:]version-release} of every package rpm has under the root (dnf nodes)."""
    runner = backend.runner
    r = runner(['rpm'] + (['--root=%s' % runner.installroot] if runner.installroot else [])
               + ['-qa', '--qf', '%{NAME}\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\n'], env=backend.env())
    return pk.parse_rpm_query(r.stdout)


def backend_parse_pins(backend, text: Optional[str]) -> Dict[str, str]:
    return pk.parse_preferences(text) if backend.name == 'apt' else pk.parse_versionlock(text)


def snapshot_pin_state(backend, state: pk.PinState) -> pk.PinState:
    """`state` (what `backend.read_state` gave) with the pin file a snapshot records and a restore writes.
    On dnf that is the versionlock list (what `capture` reads and `write_pins` writes), also where the
    backend's own pin is the `nvidia-driver` module stream (RHEL 8/9 roots), which the snapshot does not hold:
    comparing the captured list with the stream made every restore report a change."""
    if backend.name == 'dnf' and state.pin_file != backend.pin_path:
        text = _fsio.read_text(backend.pin_path)
        state = dataclasses.replace(state, pin_file=backend.pin_path, pin_text=text, pins=pk.parse_versionlock(text))
    return state


# --------------------------------------------------------------------------------------------
# What a restore may write: only what a capture can have recorded
# --------------------------------------------------------------------------------------------

# modprobe.d directives that run a command (as root, when the module is loaded or removed).
MODPROBE_COMMANDS = ('install', 'remove')


def _single_line(value: Any) -> bool:
    """A GRUB value as the capture records it: None, or text of one line (it splits the file into lines)."""
    return value is None or (isinstance(value, str) and value.splitlines() in ([], [value]))


def modprobe_path_problem(rel: Any) -> Optional[str]:
    """Why `rel` is not a path the capture records for a modprobe.d file (one of MODPROBE_DIRS, then a
    plain file name), None when it is one."""
    if not isinstance(rel, str):
        return 'modprobe: %r is not a path' % (rel,)
    head, _sep, name = rel.rpartition('/')
    if head not in MODPROBE_DIRS or name in ('', '.', '..') or '\0' in name:
        return ('modprobe: %r is not a file directly under %s (a plain name; no absolute path, no "..")'
                % (rel, ', '.join(MODPROBE_DIRS)))
    return None


def modprobe_commands(text: str) -> List[str]:
    """The `install`/`remove` directives of a modprobe.d file (continued lines joined, comments skipped)."""
    out = []
    logical = ''
    for line in text.splitlines():
        if line.endswith('\\'):
            logical += line[:-1]
            continue
        logical += line
        words = logical.split()
        if words and not words[0].startswith('#') and words[0] in MODPROBE_COMMANDS:
            out.append(' '.join(words))
        logical = ''
    words = logical.split()
    if words and words[0] in MODPROBE_COMMANDS:
        out.append(' '.join(words))
    return out


def capture_problems(snap: Dict[str, Any]) -> List[str]:
    """Why `snap` holds something a capture cannot have recorded, from its content alone ([] when nothing).

    A capture records modprobe.d files directly under MODPROBE_DIRS whose name or content mentions
    nvidia (`modprobe_files`), the GRUB environment block at one of GRUBENV_PATHS, the MIG config at
    MIG_CONFIG_PATHS, and GRUB_DEFAULT/saved_entry as one line each. A restore writes the first two and
    GRUB_DEFAULT/saved_entry into /etc/default/grub and grubenv: anything else is refused before any change.
    """
    problems = []
    modprobe = snap.get('modprobe')
    if modprobe is not None and not isinstance(modprobe, dict):
        problems.append('modprobe: expected a mapping of path to content, got %s' % type(modprobe).__name__)
        modprobe = {}
    for rel, text in sorted((modprobe or {}).items(), key=lambda kv: str(kv[0])):
        problem = modprobe_path_problem(rel)
        if problem:
            problems.append(problem)
        elif not isinstance(text, str):
            problems.append('modprobe: %s: expected the file\'s text, got %s' % (rel, type(text).__name__))
        elif not ('nvidia' in rel.rpartition('/')[2].lower() or 'nvidia' in text.lower() or 'nvreg' in text.lower()):
            problems.append('modprobe: %s neither is named for nvidia nor mentions nvidia or NVreg: the capture does not '
                            'record such a file' % rel)
    boot = snap.get('boot') or {}
    if not isinstance(boot, dict):
        problems.append('boot: expected a mapping, got %s' % type(boot).__name__)
        boot = {}
    if boot.get('grubenv_path') is not None and boot.get('grubenv_path') not in GRUBENV_PATHS:
        problems.append('boot.grubenv_path: %r is not one of %s' % (boot.get('grubenv_path'), ', '.join(GRUBENV_PATHS)))
    for key in ('grub_default', 'saved_entry'):
        if not _single_line(boot.get(key)):
            problems.append('boot.%s: %r is not one line of text' % (key, boot.get(key)))
    mig = snap.get('mig')
    files = mig.get('config_files') if isinstance(mig, dict) else None
    if mig is not None and not isinstance(mig, dict):
        problems.append('mig: expected a mapping, got %s' % type(mig).__name__)
    elif files is not None and not isinstance(files, dict):
        problems.append('mig.config_files: expected a mapping of path to content, got %s' % type(files).__name__)
    else:
        for rel in sorted(str(r) for r in (files or {}) if r not in MIG_CONFIG_PATHS):
            problems.append('mig.config_files: %r is not one of %s' % (rel, ', '.join(MIG_CONFIG_PATHS)))
    return problems


def check_restorable(snap: Dict[str, Any]) -> None:
    """SnapshotError naming every field a capture cannot have written (nothing is changed then)."""
    problems = capture_problems(snap)
    if problems:
        raise SnapshotError('the snapshot holds what a capture cannot have recorded, nothing was restored: %s'
                            % '; '.join(problems))


def new_commands(files: Sequence['FileChange']) -> List[str]:
    """`file: directive` for each install/remove directive that writing `files` adds to a file on the node
    (one the file there now does not have)."""
    out = []
    for f in files:
        if f.rel.rpartition('/')[0] in MODPROBE_DIRS and f.after is not None:
            have = set(modprobe_commands(f.before or ''))
            out.extend('%s: %s' % (f.rel, c) for c in modprobe_commands(f.after) if c not in have)
    return out


# --------------------------------------------------------------------------------------------
# Restore
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class FileChange:
    rel: str
    before: Optional[str]
    after: Optional[str]


@dataclasses.dataclass
class RestorePlan:
    pin_plan: pk.PinPlan
    files: List[FileChange]
    extra_packages: Dict[str, str]
    grub_default_changed: bool
    warnings: List[str]
    boot_kernel: Optional[Dict[str, Any]] = None

    @property
    def changed(self) -> bool:
        return self.pin_plan.changed or bool(self.files)

    def diff(self) -> List[Dict[str, str]]:
        out = self.pin_plan.diff()
        if not self.pin_plan.install:
            b, a = self.pin_plan.before, self.pin_plan.after
            if b.installed != a.installed:
                out.append({'before_header': 'installed versions', 'after_header': 'installed versions',
                            'before': ''.join('%s=%s\n' % kv for kv in sorted(b.installed.items())),
                            'after': ''.join('%s=%s\n' % kv for kv in sorted(a.installed.items()))})
        for f in self.files:
            out.append({'before_header': f.rel, 'after_header': f.rel, 'before': f.before or '', 'after': f.after or ''})
        return out


def plan_restore(backend, snap: Dict[str, Any], patterns: Sequence[str] = DEFAULT_PACKAGE_PATTERNS,
                 vouched: bool = False) -> RestorePlan:
    """What a restore changes; fails before any change when a snapshot version is unavailable, when the
    snapshot holds what a capture cannot have recorded (`check_restorable`), or when it would add a modprobe
    `install`/`remove` directive (a command run as root) and `vouched` is false: the snapshot's digest was
    not checked against one recorded outside the document (the Node's), so its content may be anyone's."""
    check_restorable(snap)
    if snap.get('backend') and snap['backend'] != backend.name:
        raise SnapshotError('the snapshot was taken with backend %r, this node uses %r' % (snap['backend'], backend.name))
    path_of = backend.runner.path
    packages: Dict[str, str] = dict(snap.get('packages') or {})
    names = sorted(packages)
    before = snapshot_pin_state(backend, backend.read_state(names))
    if backend.name == 'apt':
        all_installed = {n: e.version for n, e in backend.dpkg_entries().items() if e.installed}
    else:
        # Every package, not only the snapshot's (read_state's): driver-set packages installed since are reported.
        all_installed = rpm_installed(backend)
    to_install = {n: v for n, v in packages.items() if before.installed.get(n) != v}
    problems = []
    if to_install:
        policy = backend.available(sorted(to_install))
        for n, v in sorted(to_install.items()):
            entry = policy.get(n)
            offered = entry.downloadable() if entry else []
            if v not in offered:
                problems.append('%s %s (offered: %s)' % (n, v, ', '.join(sorted(offered, key=pk._deb_key, reverse=True)) or 'none'))
    if problems:
        raise SnapshotError('the snapshot needs package versions the configured repositories do not offer, '
                            'nothing was changed: %s' % '; '.join(problems))
    pins_snap = snap.get('pins') or {}
    pin_text = pins_snap.get('content')
    after_installed = dict(before.installed)
    after_installed.update(packages)
    after = pk.PinState(before.pin_file, pin_text, backend_parse_pins(backend, pin_text),
                        sorted(h for h in snap.get('holds') or [] if h in packages), after_installed)
    extra = {n: v for n, v in all_installed.items()
             if n not in packages and any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    # Kernel-bound NVIDIA module packages installed since the snapshot (a new kernel's prebuilt modules) are built
    # for the newer driver: the restored driver cannot satisfy them, so the restore removes them in its transaction.
    remove = sorted(n for n in extra if backend.name == 'apt' and fnmatch.fnmatchcase(n, KERNEL_MODULE_PATTERN))
    extra = dict((n, v) for n, v in extra.items() if n not in remove)
    pin_plan = pk.PinPlan(backend.name, 'pinned', None, dict(packages), [], before, after,
                          dict(packages) if (to_install or remove) else {}, remove=remove)
    files: List[FileChange] = []
    warnings: List[str] = []
    # modprobe.d files as captured (files created since then are reported, not removed).
    for rel, text in sorted((snap.get('modprobe') or {}).items()):
        cur = _fsio.read_text(path_of(rel))
        if cur != text:
            files.append(FileChange(rel, cur, text))
    now_modprobe = modprobe_files(path_of)
    for rel in sorted(set(now_modprobe) - set(snap.get('modprobe') or {})):
        warnings.append('%s mentions nvidia and is not in the snapshot; left as it is' % rel)
    boot = snap.get('boot') or {}
    grub_default, saved_entry = boot.get('grub_default'), boot.get('saved_entry')
    envrel = boot.get('grubenv_path') or find_grubenv(path_of)
    cur_grub = _fsio.read_text(path_of('etc/default/grub'))
    cur_env_text = _fsio.read_text(path_of(envrel))
    cur_env = parse_grubenv(cur_env_text)
    boot_kernel = None
    if backend.name == 'apt':
        boot_kernel = plan_boot_kernel(boot, installed_kernels(list(snap.get('kernel_packages') or {})),
                                       installed_kernels(list(all_installed)),
                                       parse_default_grub(cur_grub), cur_env.get('saved_entry'),
                                       find_grub_cfg(path_of), backend.runner.installroot)
        if boot_kernel['set']:
            grub_default, saved_entry = 'saved', boot_kernel['saved_entry']
        elif boot_kernel['keep']:
            grub_default, saved_entry = parse_default_grub(cur_grub), cur_env.get('saved_entry')
    grub_changed = False
    if grub_default is not None and parse_default_grub(cur_grub) != grub_default:
        files.append(FileChange('etc/default/grub', cur_grub, set_default_grub(cur_grub, grub_default)))
        grub_changed = True
    # A pending one-shot boot (kernel_boot state=trial's next_entry) would boot the trial kernel once more:
    # the restore clears it, so the next boot is the snapshot's default kernel.
    pending = bool(cur_env.get('next_entry'))
    if cur_env.get('saved_entry') != saved_entry or pending:
        new_env = dict(cur_env)
        if saved_entry is None:
            new_env.pop('saved_entry', None)
        else:
            new_env['saved_entry'] = saved_entry
        if pending:
            new_env['next_entry'] = ''
            warnings.append('a pending one-shot boot (next_entry=%s) was cleared' % cur_env['next_entry'])
        files.append(FileChange(envrel, cur_env_text, render_grubenv(new_env)))
    added = [] if vouched else new_commands(files)
    # /etc/default/grub is a shell script update-grub sources as root: an expansion in GRUB_DEFAULT is a command too.
    if grub_changed and not vouched and any(c in grub_default for c in '$`'):
        added.append('etc/default/grub: GRUB_DEFAULT=%r (a shell expansion)' % grub_default)
    if added:
        raise SnapshotError('the snapshot would add modprobe install/remove directives or a GRUB_DEFAULT expansion '
                            '(commands run as root) that the files on the node do not have, and its digest was not checked against one recorded '
                            'outside it (sha256: the digest the Node records), nothing was restored: %s'
                            % '; '.join(added))
    return RestorePlan(pin_plan, files, extra, grub_changed, warnings, boot_kernel)


def plan_boot_kernel(boot: Dict[str, Any], captured_kernels: Sequence[str], kernels: Sequence[str],
                     cur_default: Optional[str],
                     cur_saved: Optional[str], grub_cfg: Optional[str], installroot: Optional[str]) -> Dict[str, Any]:
    """How the restore brings the snapshot's default-boot kernel back (apt/GRUB nodes).

    The captured kernel is `boot.default_kernel` (what the captured configuration booted), else the
    captured configuration resolved over the captured kernel packages, else the running kernel at
    capture. `captured_kernels`/`kernels`: installed kernel releases then and now, newest first. Its linux-image
    package must be installed (SnapshotError otherwise, before any change). When the captured
    GRUB_DEFAULT/saved_entry would boot another kernel now (GRUB_DEFAULT=0 after a newer kernel was
    installed), the default becomes GRUB_DEFAULT=saved with saved_entry set to the kernel's entry.
    `captured_cfg` (what the captured configuration boots with today's kernels) equal to the kernel
    means the captured files are restored as they were; a current configuration that already boots
    the kernel is kept. Returns {kernel, would_boot_now, would_boot_captured_config, set, keep,
    saved_entry}.
    """
    captured_cfg = default_boot_kernel(boot.get('grub_default'), boot.get('saved_entry'), kernels)
    kernel = (boot.get('default_kernel')
              or default_boot_kernel(boot.get('grub_default'), boot.get('saved_entry'), captured_kernels)
              or boot.get('running_kernel'))
    res = {'kernel': kernel, 'would_boot_now': default_boot_kernel(cur_default, cur_saved, kernels),
           'would_boot_captured_config': captured_cfg, 'set': False, 'keep': False, 'saved_entry': None}
    if not kernel:
        return res
    if kernel not in kernels:
        raise SnapshotError('the snapshot\'s default-boot kernel %s is not installed (no linux-image-%s package under %s; '
                            'installed kernels: %s); install it before restoring, nothing was changed'
                            % (kernel, kernel, installroot or '/', ', '.join(kernels) or 'none'))
    if captured_cfg != kernel:
        if res['would_boot_now'] == kernel:
            res['keep'] = True  # the current configuration already boots it: leave it as it is
        else:
            res['set'] = True
            res['saved_entry'] = grub_entry_for(kernel, grub_cfg)
    return res


def apply_restore(backend, plan: RestorePlan) -> pk.PinState:
    now = plan.pin_plan.before
    if plan.pin_plan.changed:
        now = snapshot_pin_state(backend, pk.apply_pin(backend, plan.pin_plan))
    for f in plan.files:
        _fsio.write_text(backend.runner.path(f.rel), f.after, 0o644)
    return now
