# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to the collection: no compatibility promise.
"""Driver package pinning: presets, version matching, apt and dnf backends behind one interface.

Everything that touches a node goes through `Runner`, which honours an install root the way
dnf's `--installroot` does: apt gets an `APT_CONFIG` file (outside the root) that sets `Dir` to
the root before any other configuration is read, and dpkg gets `--root`/`--admindir`, so nothing
outside the root is read or written. Planning (`plan_pin`) only reads; `apply_pin` writes and
undoes its own pin/hold changes when the package transaction fails.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Type

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fsio

PIN_FILE = 'gpufleet-nvidia-driver.pref'
PIN_PRIORITY = 1001
VERSIONLOCK_FILE = 'etc/dnf/plugins/versionlock.list'
VERSIONLOCK_CONF = 'etc/dnf/plugins/versionlock.conf'


class PackageError(Exception):
    """A clear, user-facing error (the module turns it into fail_json(msg=...))."""


# The longest an apt/dpkg write waits for the dpkg lock another process holds (unattended-upgrades
# often does for minutes), then the write fails naming the holder; the retry interval of the commands
# that do not wait themselves (apt-mark runs `dpkg --set-selections`, which fails at once).
DPKG_LOCK_TIMEOUT = 300
DPKG_LOCK_RETRY = 2.0
_LOCK_RES = (
    re.compile(r'Could not get lock (\S+?)\.? It is held by process (\d+)(?: \(([^)]*)\))?'),
    re.compile(r'Unable to acquire the dpkg frontend lock \((\S+)\)'),
    re.compile(r'dpkg (?:frontend lock|status database) (?:was|is) locked by another process(?: with pid (\d+))?'),
)


def lock_holder(output: str) -> Optional[str]:
    """Pure: what apt's or dpkg's `output` says holds the dpkg lock (the lock, the process), or None when it does
    not say the lock is held."""
    for rx in _LOCK_RES:
        m = rx.search(output or '')
        if m:
            return m.group(0).rstrip('.')
    return None


def dpkg_interrupted(journal: Sequence[str], audit: str) -> Optional[str]:
    """Pure: why dpkg's database is not ready for a new transaction, or None. `journal`: the names of the
    files in ``var/lib/dpkg/updates`` (a dpkg killed before it folded its journal into the status file
    leaves numbered ones: apt refuses with "dpkg was interrupted"); `audit`: what ``dpkg --audit`` says
    (packages unpacked but not configured, half-configured, half-installed, triggers pending)."""
    pending = sorted(name for name in journal if name.isdigit())
    if pending:
        return 'dpkg was interrupted: its journal holds %d unapplied update(s) (var/lib/dpkg/updates/%s)' % (
            len(pending), ', '.join(pending))
    lines = [line.strip() for line in (audit or '').splitlines() if line.strip()]
    if lines:
        return 'dpkg --audit reports an unfinished package transaction: %s' % ' '.join(lines)[:1500]
    return None


# --------------------------------------------------------------------------------------------
# Debian version comparison and matching
# --------------------------------------------------------------------------------------------

def _split_deb(version: str) -> Tuple[int, str, str]:
    epoch = 0
    rest = version
    if ':' in version:
        e, rest = version.split(':', 1)
        epoch = int(e) if e.isdigit() else 0
    if '-' in rest:
        upstream, revision = rest.rsplit('-', 1)
    else:
        upstream, revision = rest, ''
    return epoch, upstream, revision


def _order(c: str) -> int:
    if c == '~':
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _cmp_part(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        while i < len(a) and a[i] == '0':
            i += 1
        while j < len(b) and b[j] == '0':
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return -1 if first_diff < 0 else 1
    return 0


def deb_compare(a: str, b: str) -> int:
    """dpkg's version ordering: -1, 0 or 1 (same result as `dpkg --compare-versions`)."""
    ea, ua, ra = _split_deb(a)
    eb, ub, rb = _split_deb(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _cmp_part(ua, ub) or _cmp_part(ra, rb)


def upstream_version(version: str) -> str:
    """The upstream part of a Debian or RPM version: no epoch, no revision/release."""
    return _split_deb(version)[1]


def version_matches(candidate: str, wanted: str) -> bool:
    """`wanted` is an exact package version, or an upstream version such as 580.126.20."""
    if candidate == wanted:
        return True
    no_epoch = candidate.split(':', 1)[1] if ':' in candidate else candidate
    if no_epoch == wanted:
        return True
    if '-' not in wanted and ':' not in wanted:
        return upstream_version(candidate) == wanted
    return False


def pick_version(candidates: Sequence[str], wanted: str) -> Optional[str]:
    """The highest candidate matching `wanted` (several Debian revisions of one upstream)."""
    best = None
    for c in candidates:
        if version_matches(c, wanted) and (best is None or deb_compare(c, best) > 0):
            best = c
    return best


# --------------------------------------------------------------------------------------------
# Presets: named package sets per distribution and branch
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PackageSet:
    """`required` members must be offered at the version; `optional` ones (Fabric Manager,
    NSCQ, meta packages) are kept equal to the driver when installed or offered, else skipped."""
    required: Tuple[str, ...]
    optional: Tuple[str, ...] = ()

    @property
    def names(self) -> Tuple[str, ...]:
        return self.required + tuple(n for n in self.optional if n not in self.required)


class Preset(NamedTuple):
    """A named driver package set: its backend and the templates of its members ({b} is the
    branch, e.g. 580); from branch `unbranched_from` on, the repository names them `unbranched`."""
    backend: str
    required: Tuple[str, ...]
    optional: Tuple[str, ...] = ()
    unbranched_from: Optional[int] = None
    unbranched: Optional[PackageSet] = None

    def packages(self, branch: str) -> PackageSet:
        if self.unbranched is not None and self.unbranched_from is not None and int(branch) >= self.unbranched_from:
            return self.unbranched
        return PackageSet(tuple(t.format(b=branch) for t in self.required),
                          tuple(t.format(b=branch) for t in self.optional))


PRESETS: Dict[str, Preset] = {
    # Canonical archive, server (LTSB/PB) flavour.
    'ubuntu-server': Preset('apt', (
        'nvidia-driver-{b}-server', 'libnvidia-compute-{b}-server', 'nvidia-kernel-common-{b}-server',
        'nvidia-dkms-{b}-server', 'nvidia-utils-{b}-server', 'nvidia-compute-utils-{b}-server'),
        ('nvidia-fabricmanager-{b}', 'libnvidia-nscq-{b}')),
    # Canonical archive, server flavour with Canonical's signed prebuilt kernel modules
    # (linux-modules-nvidia-{b}-server-<kernel>, one per kernel ABI, installed with the kernel by
    # kernel_packages): the user space without DKMS.
    'ubuntu-server-prebuilt': Preset('apt', (
        'nvidia-headless-no-dkms-{b}-server', 'libnvidia-compute-{b}-server', 'nvidia-kernel-common-{b}-server',
        'nvidia-utils-{b}-server', 'nvidia-compute-utils-{b}-server'),
        ('nvidia-fabricmanager-{b}', 'libnvidia-nscq-{b}')),
    # Canonical archive, desktop flavour.
    'ubuntu': Preset('apt', (
        'nvidia-driver-{b}', 'libnvidia-compute-{b}', 'nvidia-kernel-common-{b}', 'nvidia-dkms-{b}',
        'nvidia-utils-{b}', 'nvidia-compute-utils-{b}'),
        ('nvidia-fabricmanager-{b}', 'libnvidia-nscq-{b}')),
    # NVIDIA CUDA repository for Debian/Ubuntu (branch in the names up to 580; from branch 590
    # NVIDIA's Debian/Ubuntu repository drops the branch from the names).
    'cuda-repo': Preset('apt', ('libnvidia-compute-{b}', 'nvidia-dkms-{b}-open'), (
        'cuda-drivers-{b}', 'nvidia-driver-{b}-open', 'nvidia-fabricmanager-{b}', 'libnvidia-nscq-{b}',
        'cuda-drivers-fabricmanager-{b}'),
        unbranched_from=590,
        unbranched=PackageSet(('libnvidia-compute', 'nvidia-dkms-open'),
                              ('cuda-drivers', 'nvidia-open', 'nvidia-fabricmanager', 'libnvidia-nscq'))),
    # NVIDIA CUDA repository for RHEL/Rocky/Fedora (dnf).
    'rhel-dnf': Preset('dnf', ('nvidia-driver', 'nvidia-driver-libs', 'nvidia-driver-cuda', 'nvidia-driver-cuda-libs'), (
        'kmod-nvidia-open-dkms', 'kmod-nvidia-latest-dkms', 'nvidia-persistenced', 'nvidia-fabric-manager',
        'libnvidia-nscq')),
}


def check_branch(branch: str) -> str:
    if not re.match(r'^[0-9]{3}$', str(branch or '')):
        raise PackageError("branch must be a driver branch such as '580', got %r" % (branch,))
    return str(branch)


def check_version_in_branch(version: str, branch: Optional[str]) -> None:
    if branch and upstream_version(version).split('.')[0] != branch:
        raise PackageError('version %r is not in driver branch %r' % (version, branch))


def _preset(preset: str) -> Preset:
    if preset not in PRESETS:
        raise PackageError('unknown preset %r; known presets: %s' % (preset, ', '.join(sorted(PRESETS))))
    return PRESETS[preset]


def preset_backend(preset: str) -> str:
    return _preset(preset).backend


def preset_packages(preset: str, branch: str) -> PackageSet:
    record = _preset(preset)
    return record.packages(check_branch(branch))


# --------------------------------------------------------------------------------------------
# Command runner honouring an install root
# --------------------------------------------------------------------------------------------

RunFn = Callable[[List[str], Dict[str, str]], Tuple[int, str, str]]


@dataclasses.dataclass
class CommandResult:
    rc: int
    stdout: str
    stderr: str


class Runner:
    """Runs commands through `run(argv, env) -> (rc, stdout, stderr)` and records them."""

    def __init__(self, run: RunFn, installroot: Optional[str] = None) -> None:
        self._run = run
        root = (installroot or '').rstrip('/')
        self.installroot = root or None
        self.commands: List[List[str]] = []

    def path(self, rel: str) -> str:
        """A path of the managed system, on the machine the module runs on."""
        return os.path.join(self.installroot or '/', rel.lstrip('/'))

    def __call__(self, argv: List[str], env: Optional[Dict[str, str]] = None, check: bool = True,
                 ok_rcs: Sequence[int] = (0,)) -> CommandResult:
        self.commands.append(list(argv))
        rc, out, err = self._run(list(argv), dict(env or {}))
        if check and rc not in ok_rcs:
            raise command_failed(argv, rc, out, err)
        return CommandResult(rc, out, err)


def command_failed(argv: Sequence[str], rc: int, out: str, err: str) -> PackageError:
    # apt explains on stdout (unmet dependencies) and concludes on stderr: keep both tails.
    detail = ' | '.join(x.strip()[-1500:] for x in (out or '', err or '') if x.strip())
    return PackageError('command failed (rc=%d): %s: %s' % (rc, ' '.join(argv), detail))


# --------------------------------------------------------------------------------------------
# State shared by the backends
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class PinState:
    """What a pin changes on a node: the pin file (text), pins parsed from it, holds, versions."""
    pin_file: str
    pin_text: Optional[str]
    pins: Dict[str, str]
    holds: List[str]
    installed: Dict[str, str]

    def as_dict(self) -> Dict[str, object]:
        return {'pin_file': self.pin_file, 'pin_file_content': self.pin_text, 'pins': dict(sorted(self.pins.items())),
                'holds': sorted(self.holds), 'installed': dict(sorted(self.installed.items()))}


@dataclasses.dataclass
class PinPlan:
    backend: str
    state: str
    version: Optional[str]
    resolved: Dict[str, str]
    skipped: List[str]
    before: PinState
    after: PinState
    install: Dict[str, str]
    commands: List[List[str]] = dataclasses.field(default_factory=list)
    # apt: packages removed in the same transaction (a snapshot restore's module packages built for another driver).
    remove: List[str] = dataclasses.field(default_factory=list)

    @property
    def changed(self) -> bool:
        b, a = self.before, self.after
        return (b.pin_text != a.pin_text or sorted(b.holds) != sorted(a.holds) or bool(self.install)
                or bool(self.commands) or bool(self.remove))

    def diff(self) -> List[Dict[str, str]]:
        b, a = self.before, self.after
        out = [
            {'before_header': b.pin_file, 'after_header': a.pin_file,
             'before': b.pin_text or '', 'after': a.pin_text or ''},
            {'before_header': 'holds', 'after_header': 'holds',
             'before': ''.join(h + '\n' for h in sorted(b.holds)), 'after': ''.join(h + '\n' for h in sorted(a.holds))},
        ]
        if self.install:
            out.append({'before_header': 'installed versions', 'after_header': 'installed versions',
                        'before': ''.join('%s=%s\n' % kv for kv in sorted(b.installed.items())),
                        'after': ''.join('%s=%s\n' % kv for kv in sorted(a.installed.items()))})
        return out


# --------------------------------------------------------------------------------------------
# apt
# --------------------------------------------------------------------------------------------

def render_preferences(pins: Dict[str, str], priority: int = PIN_PRIORITY) -> Optional[str]:
    """apt_preferences(5) text: one stanza per exact version, priority >= 1000 (allows downgrades)."""
    if not pins:
        return None
    if priority < 1000:
        raise PackageError('pin priority must be >= 1000 so a rollback can downgrade, got %d' % priority)
    by_version: Dict[str, List[str]] = {}
    for name, version in pins.items():
        by_version.setdefault(version, []).append(name)
    stanzas = []
    for version in sorted(by_version, key=lambda v: (upstream_version(v), v)):
        stanzas.append('Explanation: managed by gpufleet.upgrade.driver_pin; exact driver version\n'
                       'Package: %s\nPin: version %s\nPin-Priority: %d\n'
                       % (' '.join(sorted(by_version[version])), version, priority))
    return '\n'.join(stanzas)


def parse_preferences(text: Optional[str]) -> Dict[str, str]:
    """{package: version} of the exact-version stanzas (`Pin: version X`) in a preferences file."""
    pins: Dict[str, str] = {}
    for stanza in re.split(r'\n\s*\n', text or ''):
        fields: Dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith('#') or ':' not in line:
                continue
            k, v = line.split(':', 1)
            fields[k.strip().lower()] = v.strip()
        pin = fields.get('pin', '')
        if not pin.startswith('version ') or 'package' not in fields:
            continue
        version = pin[len('version '):].strip()
        for name in fields['package'].split():
            pins[name] = version
    return pins


@dataclasses.dataclass
class DpkgEntry:
    version: str
    want: str
    status: str

    @property
    def installed(self) -> bool:
        return self.status in ('installed', 'half-configured', 'unpacked', 'triggers-awaited', 'triggers-pending')


DPKG_QUERY_FORMAT = '${Package}\\t${Version}\\t${Status}\\n'


def parse_dpkg_query(out: str) -> Dict[str, DpkgEntry]:
    """Parse `dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n'` (Status: want flag status)."""
    res: Dict[str, DpkgEntry] = {}
    for line in out.splitlines():
        parts = line.split('\t')
        if len(parts) != 3:
            continue
        name, version, status = parts
        words = status.split()
        if len(words) != 3:
            continue
        res[name.split(':')[0]] = DpkgEntry(version=version, want=words[0], status=words[2])
    return res


def parse_showhold(out: str) -> List[str]:
    """`apt-mark showhold`: one package per line (an architecture qualifier is dropped)."""
    return sorted({line.strip().split(':')[0] for line in out.splitlines() if line.strip()})


@dataclasses.dataclass
class PolicyEntry:
    installed: Optional[str]
    candidate: Optional[str]
    versions: Dict[str, List[str]]  # version -> sources ("500 file:/repo ./ Packages")

    def downloadable(self) -> List[str]:
        return [v for v, srcs in self.versions.items()
                if any(not s.split(None, 1)[-1].endswith('/var/lib/dpkg/status') for s in srcs)]


def parse_policy(out: str) -> Dict[str, PolicyEntry]:
    """Parse `apt-cache policy <pkg>...`."""
    res: Dict[str, PolicyEntry] = {}
    cur: Optional[PolicyEntry] = None
    version: Optional[str] = None
    for line in out.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(':'):
            cur = PolicyEntry(None, None, {})
            res[line.rstrip()[:-1].split(':')[0]] = cur
            version = None
            continue
        if cur is None:
            continue
        s = line.strip()
        if s.startswith('Installed:'):
            v = s.split(':', 1)[1].strip()
            cur.installed = None if v == '(none)' else v
        elif s.startswith('Candidate:'):
            v = s.split(':', 1)[1].strip()
            cur.candidate = None if v == '(none)' else v
        elif s.startswith('Version table:'):
            continue
        else:
            m = re.match(r'^ (?:\*\*\*| {3}) (\S+) (-?\d+)$', line)
            if m:
                version = m.group(1)
                cur.versions.setdefault(version, [])
                continue
            m = re.match(r'^ {8}(-?\d+) (.+)$', line)
            if m and version is not None:
                cur.versions[version].append('%s %s' % (m.group(1), m.group(2)))
    return res


_SHA256 = re.compile(r'^[0-9a-f]{64}$')


def parse_apt_show(out: str) -> Dict[Tuple[str, str], str]:
    """`apt-cache show name=version ...`: the SHA-256 the repository's index gives for each package file,
    keyed by (package, version). Records without a valid SHA256 field are left out."""
    found: Dict[Tuple[str, str], str] = {}
    for block in re.split(r'\n\s*\n', out or ''):
        fields: Dict[str, str] = {}
        for line in block.splitlines():
            if line[:1] in (' ', '\t') or ':' not in line:
                continue
            key, value = line.split(':', 1)
            fields.setdefault(key.strip(), value.strip())
        sha = fields.get('SHA256', '').lower()
        if fields.get('Package') and fields.get('Version') and _SHA256.match(sha):
            found.setdefault((fields['Package'], fields['Version']), sha)
    return found


def package_artifacts(versions: Dict[str, str], digests: Dict[Tuple[str, str], str]) -> List[Dict[str, str]]:
    """The evidence artifacts of a package transaction: one per package and version installed, with the
    repository's SHA-256 of its file where the index gives one (absent otherwise: the evidence says so)."""
    out = []
    for name, version in sorted(versions.items()):
        entry = {'kind': 'package', 'name': name, 'version': version}
        if (name, version) in digests:
            entry['sha256'] = digests[(name, version)]
        out.append(entry)
    return out


def apt_config_for_root(root: str, as_root: bool = True) -> str:
    """APT_CONFIG text that confines apt (and the dpkg it runs) to `root`."""
    opts = ['--root=%s' % root, '--admindir=%s/var/lib/dpkg' % root, '--log=%s/var/log/dpkg.log' % root]
    if not as_root:
        opts.append('--force-not-root')
    return ('Dir "%s/";\nDir::State::status "%s/var/lib/dpkg/status";\nDPkg::Options { %s };\n'
            % (root, root, ' '.join('"%s";' % o for o in opts)))


class AptBackend:
    name = 'apt'

    def __init__(self, runner: Runner, pin_file: str = PIN_FILE, lock_timeout: float = DPKG_LOCK_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.runner = runner
        self.pin_path = runner.path('etc/apt/preferences.d/' + pin_file)
        self._conf: Optional[str] = None
        self.lock_timeout = lock_timeout
        self.clock = clock
        self.sleep = sleep

    # -- before a write (T3-18 of the 2026-12-06 review)
    def check_dpkg(self) -> None:
        """Refuse, before anything is changed, when dpkg's database holds an unfinished transaction. It is
        not finished here (no ``dpkg --configure -a``): it may be another tool's or an operator's half-done
        change, and this module cannot tell it apart from its own killed run; configuring it could run
        maintainer scripts nobody reviewed on a node the rollout is about to reboot."""
        updates = self.runner.path('var/lib/dpkg/updates')
        journal = sorted(os.listdir(updates)) if os.path.isdir(updates) else []
        audit = ''
        if not any(name.isdigit() for name in journal):
            audit = self.runner(['dpkg'] + self._admindir() + ['--audit'], env=self.env(), ok_rcs=(0, 1)).stdout
        why = dpkg_interrupted(journal, audit)
        if why:
            raise PackageError(
                '%s. This module does not finish a package transaction it did not start: find out what it was '
                "(/var/log/dpkg.log, /var/log/apt/history.log), finish it (dpkg --configure -a) or undo it by hand, "
                'then rerun; nothing was changed' % why)

    def write(self, argv: List[str]) -> CommandResult:
        """Run an apt/dpkg write that needs the dpkg lock, waiting at most `lock_timeout` seconds for it while
        another process holds it: apt-get waits itself (DPkg::Lock::Timeout, apt >= 1.9.11), apt-mark is retried
        every DPKG_LOCK_RETRY seconds. At the deadline the command fails naming the holder."""
        deadline = self.clock() + self.lock_timeout
        while True:
            cmd = list(argv)
            if cmd[0] == 'apt-get':
                cmd += ['-o', 'DPkg::Lock::Timeout=%d' % max(0, int(deadline - self.clock()))]
            r = self.runner(cmd, env=self.env(), check=False)
            if r.rc == 0:
                return r
            held = lock_holder('%s\n%s' % (r.stdout, r.stderr))
            if held is None:
                raise command_failed(cmd, r.rc, r.stdout, r.stderr)
            now = self.clock()
            if now >= deadline:
                raise PackageError(
                    'the dpkg lock is held by another process for more than %gs (%s; unattended-upgrades or another '
                    'apt run?): %s did not run; rerun once the lock is free' % (self.lock_timeout, held, ' '.join(argv)))
            self.sleep(min(DPKG_LOCK_RETRY, deadline - now))

    # -- environment
    def env(self) -> Dict[str, str]:
        env = {'DEBIAN_FRONTEND': 'noninteractive', 'LC_ALL': 'C', 'LANG': 'C'}
        root = self.runner.installroot
        if root:
            if self._conf is None:
                fd, self._conf = tempfile.mkstemp(prefix='gpufleet-apt-', suffix='.conf')
                with os.fdopen(fd, 'w') as f:
                    f.write(apt_config_for_root(root, as_root=os.geteuid() == 0))
            env['APT_CONFIG'] = self._conf
        return env

    def close(self) -> None:
        if self._conf and os.path.exists(self._conf):
            os.unlink(self._conf)
        self._conf = None

    def _admindir(self) -> List[str]:
        return ['--admindir=%s' % self.runner.path('var/lib/dpkg')] if self.runner.installroot else []

    # -- reads
    def dpkg_entries(self) -> Dict[str, DpkgEntry]:
        r = self.runner(['dpkg-query'] + self._admindir() + ['-W', '-f=' + DPKG_QUERY_FORMAT],
                        env=self.env(), ok_rcs=(0, 1))
        return parse_dpkg_query(r.stdout)

    def read_state(self, names: Sequence[str]) -> PinState:
        text = _fsio.read_text(self.pin_path)
        entries = self.dpkg_entries()
        wanted = set(names) | set(parse_preferences(text))
        return PinState(
            pin_file=self.pin_path, pin_text=text, pins=parse_preferences(text),
            holds=sorted(n for n, e in entries.items() if e.want == 'hold' and n in wanted),
            installed={n: e.version for n, e in entries.items() if e.installed and n in wanted})

    def installed_all(self) -> Dict[str, DpkgEntry]:
        return self.dpkg_entries()

    def available(self, names: Sequence[str]) -> Dict[str, PolicyEntry]:
        if not names:
            return {}
        r = self.runner(['apt-cache', 'policy'] + list(names), env=self.env())
        return parse_policy(r.stdout)

    def index_age(self, now: Optional[float] = None) -> Optional[float]:
        """Seconds since the package lists under the root were refreshed (index_age)."""
        return index_age(self.runner.path('var/lib/apt/lists'),
                         self.runner.path('var/lib/apt/periodic/update-success-stamp'), now)

    def update_cache(self, max_age: int = 0, now: Optional[float] = None) -> bool:
        """`apt-get update`, unless the package lists are younger than `max_age` seconds (refresh_due).
        True when it ran."""
        if not refresh_due(self.index_age(now) if max_age > 0 else None, max_age):
            return False
        self.runner(['apt-get', '-q', 'update'], env=self.env())
        return True

    def repo_digests(self, versions: Dict[str, str]) -> Dict[Tuple[str, str], str]:
        """The repository's SHA-256 of each package file (apt-cache show; a version no index lists is left out)."""
        if not versions:
            return {}
        r = self.runner(['apt-cache', 'show'] + ['%s=%s' % kv for kv in sorted(versions.items())],
                        env=self.env(), ok_rcs=(0, 100))
        return parse_apt_show(r.stdout)

    # -- writes
    def render_pins(self, pins: Dict[str, str]) -> Optional[str]:
        return render_preferences(pins)

    def parse_pins(self, text: Optional[str]) -> Dict[str, str]:
        return parse_preferences(text)

    def install(self, versions: Dict[str, str], remove: Sequence[str] = ()) -> None:
        if not versions and not remove:
            return
        argv = ['apt-get', '-q', '-y', 'install', '--allow-downgrades', '--allow-change-held-packages',
                '--no-install-recommends', '-o', 'Dpkg::Options::=--force-confdef', '-o', 'Dpkg::Options::=--force-confold']
        argv += ['%s=%s' % kv for kv in sorted(versions.items())]
        # apt's `name-`: removed in the same transaction.
        argv += ['%s-' % n for n in sorted(remove)]
        self.write(argv)

    def set_holds(self, hold: Sequence[str], unhold: Sequence[str]) -> None:
        if unhold:
            self.write(['apt-mark', 'unhold'] + sorted(unhold))
        if hold:
            self.write(['apt-mark', 'hold'] + sorted(hold))

    def write_pins(self, text: Optional[str]) -> None:
        _fsio.write_text(self.pin_path, text, 0o644)


# --------------------------------------------------------------------------------------------
# dnf (RHEL 8/9 module streams, RHEL 10/Fedora versionlock)
# --------------------------------------------------------------------------------------------

def parse_os_release(text: Optional[str]) -> Dict[str, str]:
    res = {}
    for line in (text or '').splitlines():
        if '=' in line and not line.startswith('#'):
            k, v = line.split('=', 1)
            res[k.strip()] = v.strip().strip('"\'')
    return res


def read_os_release(runner: Runner) -> Dict[str, str]:
    """The managed system's os-release (``etc/os-release`` under the runner's install root); empty when absent."""
    return parse_os_release(_fsio.read_text(runner.path('etc/os-release')))


def versionlock_list_path(runner: Runner, default: Optional[str] = None,
                          error: Type[Exception] = PackageError) -> str:
    """The versionlock list the dnf plugin reads and `dnf versionlock add` writes: the `locklist` of
    the plugin configuration (``etc/dnf/plugins/versionlock.conf`` under the install root, the one
    `dnf_base` makes dnf read). Without that configuration or setting: `default` (relative to the
    root) when given, else an `error`. With an install root the list must lie under it (dnf would
    otherwise read and write the host's list): an `error` naming the list and the root otherwise."""
    conf = runner.path(VERSIONLOCK_CONF)
    text = _fsio.read_text(conf)
    m = re.search(r'^\s*locklist\s*=\s*(\S+)\s*$', text, re.M) if text is not None else None
    if m:
        path = m.group(1)
    elif default is not None:
        path = runner.path(default)
    elif text is None:
        raise error('%s does not exist: the dnf versionlock plugin (python3-dnf-plugin-versionlock) is '
                    'needed to lock the kernel; nothing was changed' % conf)
    else:
        raise error('%s has no locklist setting; nothing was changed' % conf)
    root = runner.installroot
    if root and not os.path.abspath(path).startswith(root.rstrip('/') + '/'):
        raise error('installroot %r: the versionlock list of %s is %r, outside the install root; '
                    'nothing was changed' % (root, conf, path))
    return path


def dnf_lock_mode(os_release: Dict[str, str]) -> str:
    """'module' (RHEL/Rocky/Alma 8 and 9: branch module stream) or 'versionlock' (10, Fedora)."""
    ids = {os_release.get('ID', '')} | set(os_release.get('ID_LIKE', '').split())
    major = os_release.get('VERSION_ID', '').split('.')[0]
    if ids & {'rhel', 'centos', 'rocky', 'almalinux', 'ol'} and major in ('8', '9'):
        return 'module'
    return 'versionlock'


def versionlock_entry(name: str, evr: str) -> str:
    """A versionlock.list line: name-[epoch:]version-release.* (any architecture)."""
    return '%s-%s.*' % (name, evr)


def parse_versionlock(text: Optional[str]) -> Dict[str, str]:
    """{name: [epoch:]version-release} from versionlock.list (`name-evr.arch` lines, `!` excludes skipped)."""
    res: Dict[str, str] = {}
    for line in (text or '').splitlines():
        line = line.strip()
        if not line or line.startswith('#') or line.startswith('!'):
            continue
        m = re.match(r'^(.+)-((?:\d+:)?[^-]+-[^-]+?)(?:\.[^.-]+|\.\*)?$', line)
        if m:
            res[m.group(1)] = m.group(2)
    return res


def index_age(lists_dir: str, stamp: str, now: Optional[float] = None) -> Optional[float]:
    """Seconds since apt's package lists were last refreshed: the newest of the update-success stamp
    (Ubuntu's APT::Update::Post-Invoke-Success touches it) and the index files in `lists_dir`; None when
    there is neither (never refreshed). An update that found nothing new rewrites no index, so the age
    may overstate: a refresh then runs again, never the other way round."""
    newest: Optional[float] = None
    candidates = [stamp]
    try:
        candidates += [os.path.join(lists_dir, n) for n in os.listdir(lists_dir) if n not in ('lock', 'partial', 'auxfiles')]
    except OSError:
        pass
    for path in candidates:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if os.path.isfile(path):
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    if newest is None:
        return None
    return max(0.0, (time.time() if now is None else now) - newest)


def refresh_due(age: Optional[float], max_age: int) -> bool:
    """Whether lists `age` seconds old (None: never refreshed, or not known) are refreshed under the bound
    `max_age` (0: every time)."""
    return max_age <= 0 or age is None or age >= max_age


def dnf_expire(max_age: int) -> List[str]:
    """dnf options that expire repository metadata older than `max_age` seconds (none for 0)."""
    return ['--setopt=metadata_expire=%d' % max_age] if max_age > 0 else []


def dnf_base(installroot: Optional[str]) -> List[str]:
    """`dnf -y -q`, for an install root with the root's plugin configuration: `--installroot` alone
    moves the rpm database and the repositories but not `pluginconfpath`, so the versionlock plugin
    would read (and `versionlock add` write) the host's lock list. Every dnf command goes through here."""
    argv = ['dnf', '-y', '-q']
    if installroot:
        argv.append('--installroot=%s' % installroot)
        argv.append('--setopt=pluginconfpath=%s' % os.path.join(installroot, 'etc/dnf/plugins'))
    return argv


def dnf_pin_commands(pins: Dict[str, str], previous: Dict[str, str], mode: str, branch: Optional[str],
                     stream_suffix: str, install: Dict[str, str], installroot: Optional[str],
                     enable_stream: bool = True) -> List[List[str]]:
    """The dnf commands that pin (and optionally install) exact versions."""
    base = dnf_base(installroot)
    cmds: List[List[str]] = []
    if mode == 'module' and enable_stream:
        if not branch:
            raise PackageError('the dnf module stream needs a branch (e.g. branch: 580)')
        cmds.append(base + ['module', 'reset', 'nvidia-driver'])
        cmds.append(base + ['module', 'enable', 'nvidia-driver:%s%s' % (branch, stream_suffix)])
    if install:
        cmds.append(base + ['install', '--allowerasing'] + ['%s-%s' % kv for kv in sorted(install.items())])
    if mode == 'versionlock':
        stale = sorted(n for n in pins if n in previous and previous[n] != pins[n])
        if stale:
            cmds.append(base + ['versionlock', 'delete'] + stale)
        new = sorted(n for n in pins if previous.get(n) != pins[n])
        if new:
            cmds.append(base + ['versionlock', 'add'] + ['%s-%s' % (n, pins[n]) for n in new])
    return cmds


def parse_module_list(out: str, module: str = 'nvidia-driver') -> Optional[str]:
    """The enabled stream of `module` in `dnf module list` output (`[e]` marks it), or None."""
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == module and '[e]' in line:
            return parts[1]
    return None


def dnf_unpin_commands(names: Sequence[str], previous: Dict[str, str], installroot: Optional[str]) -> List[List[str]]:
    drop = sorted(n for n in names if n in previous)
    return [dnf_base(installroot) + ['versionlock', 'delete'] + drop] if drop else []


def parse_rpm_query(out: str) -> Dict[str, str]:
    """`rpm -qa --qf '%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\n'` -> {name: evr} (epoch 0 dropped)."""
    res = {}
    for line in out.splitlines():
        parts = line.split('\t')
        if len(parts) == 2:
            evr = parts[1][2:] if parts[1].startswith('0:') else parts[1]
            res[parts[0]] = evr
    return res


def parse_dnf_list(out: str) -> Dict[str, List[str]]:
    """`dnf list --showduplicates --available` -> {name: [evr, ...]}; the arch suffix is dropped."""
    res: Dict[str, List[str]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or '.' not in parts[0] or parts[0].endswith(':'):
            continue
        name = parts[0].rsplit('.', 1)[0]
        res.setdefault(name, [])
        if parts[1] not in res[name]:
            res[name].append(parts[1])
    return res


class DnfBackend:
    name = 'dnf'

    def __init__(self, runner: Runner, branch: Optional[str] = None, mode: Optional[str] = None,
                 stream_suffix: str = '-dkms') -> None:
        self.runner = runner
        self.branch = branch
        self.stream_suffix = stream_suffix
        self.mode = mode or dnf_lock_mode(read_os_release(runner))
        self._pin_path: Optional[str] = None

    @property
    def pin_path(self) -> str:
        """The versionlock list (the plugin configuration's `locklist`, else VERSIONLOCK_FILE under the
        root); a PackageError when it lies outside the install root, before anything reads or writes it."""
        if self._pin_path is None:
            self._pin_path = versionlock_list_path(self.runner, default=VERSIONLOCK_FILE)
        return self._pin_path

    def env(self) -> Dict[str, str]:
        return {'LC_ALL': 'C', 'LANG': 'C'}

    def close(self) -> None:
        pass

    def target_stream(self) -> str:
        if not self.branch:
            raise PackageError('the dnf module stream needs a branch (e.g. branch: 580)')
        return 'nvidia-driver:%s%s' % (self.branch, self.stream_suffix)

    def read_state(self, names: Sequence[str]) -> PinState:
        root = ['--root=%s' % self.runner.installroot] if self.runner.installroot else []
        r = self.runner(['rpm'] + root + ['-qa', '--qf', '%{NAME}\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\n'], env=self.env())
        inst = parse_rpm_query(r.stdout)
        wanted = set(names)
        installed = {n: v for n, v in inst.items() if n in wanted}
        if self.mode == 'module':
            # The pin is the enabled module stream.
            m = self.runner(dnf_base(self.runner.installroot) + ['module', 'list', '--enabled', 'nvidia-driver'],
                            env=self.env(), ok_rcs=(0, 1))
            stream = parse_module_list(m.stdout)
            return PinState(pin_file='dnf module nvidia-driver', pin_text='nvidia-driver:%s\n' % stream if stream else None,
                            pins={}, holds=[], installed=installed)
        text = _fsio.read_text(self.pin_path)
        return PinState(pin_file=self.pin_path, pin_text=text, pins=parse_versionlock(text), holds=[], installed=installed)

    def available(self, names: Sequence[str]) -> Dict[str, PolicyEntry]:
        r = self.runner(dnf_base(self.runner.installroot) + ['list', '--showduplicates', '--available'] + list(names),
                        env=self.env(), ok_rcs=(0, 1))
        return {n: PolicyEntry(None, None, {v: ['repo'] for v in vs}) for n, vs in parse_dnf_list(r.stdout).items()}

    def update_cache(self, max_age: int = 0, now: Optional[float] = None) -> bool:  # pylint: disable=unused-argument
        """`dnf makecache`; with `max_age` (seconds, > 0) metadata older than that is expired first (dnf's own
        metadata_expire, 48 hours by default, is the bound otherwise). True: dnf ran (it decides per repository)."""
        self.runner(dnf_base(self.runner.installroot) + dnf_expire(max_age) + ['makecache'], env=self.env())
        return True

    def repo_digests(self, versions: Dict[str, str]) -> Dict[Tuple[str, str], str]:  # pylint: disable=unused-argument
        """Not read on dnf: the artifacts are recorded without a SHA-256 (the evidence lists them as undigested)."""
        return {}

    # Used by snapshot restore (driver_pin runs the generated commands instead).
    def install(self, versions: Dict[str, str]) -> None:
        if versions:
            self.runner(dnf_base(self.runner.installroot) + ['install', '--allowerasing']
                        + ['%s-%s' % kv for kv in sorted(versions.items())], env=self.env())

    def set_holds(self, hold: Sequence[str], unhold: Sequence[str]) -> None:
        return None

    def write_pins(self, text: Optional[str]) -> None:
        _fsio.write_text(self.pin_path, text, 0o644)


# --------------------------------------------------------------------------------------------
# Planning and applying a pin (backend-neutral for apt; dnf runs generated commands)
# --------------------------------------------------------------------------------------------

def resolve(pkgs: PackageSet, version: str, policy: Dict[str, PolicyEntry], installed: Dict[str, str],
            install: bool) -> Tuple[Dict[str, str], List[str]]:
    """Exact version per package, or a PackageError naming every missing one; optional members
    that are neither installed nor offered are skipped."""
    resolved: Dict[str, str] = {}
    skipped: List[str] = []
    problems: List[str] = []
    for name in pkgs.names:
        entry = policy.get(name)
        offered = entry.downloadable() if entry else []
        inst = installed.get(name)
        # An installed version that matches is kept (no churn between Debian revisions).
        pick = inst if inst is not None and version_matches(inst, version) else pick_version(offered, version)
        if pick is not None:
            resolved[name] = pick
            continue
        if name not in pkgs.required and name not in installed:
            skipped.append(name)
            continue
        problems.append('%s %s is not offered by the configured repositories (offered: %s%s)' % (
            name, version, ', '.join(sorted(offered, key=_deb_key, reverse=True)) or 'none',
            '; installed: %s' % installed[name] if name in installed else ''))
    if problems:
        raise PackageError('version %s is not available, nothing was changed: %s' % (version, '; '.join(problems)))
    return resolved, skipped


_deb_key = functools.cmp_to_key(deb_compare)


def plan_pin(backend, pkgs: PackageSet, version: Optional[str], state: str, install: bool) -> PinPlan:
    """Read the node and compute the pin (or unpin) without changing anything."""
    names = list(pkgs.names)
    before = backend.read_state(names)
    if state == 'unpinned':
        pins = {n: v for n, v in before.pins.items() if n not in names}
        after = PinState(before.pin_file, None, pins, [h for h in before.holds if h not in names], dict(before.installed))
        plan = PinPlan(backend.name, state, version, {}, [], before, after, {})
        if backend.name == 'apt':
            after.pin_text = render_preferences(pins)
        else:
            if backend.mode == 'module':
                plan.commands = [dnf_base(backend.runner.installroot) + ['module', 'reset', 'nvidia-driver']] \
                    if before.pin_text else []
            else:
                plan.commands = dnf_unpin_commands(names, before.pins, backend.runner.installroot)
                after.pin_text = before.pin_text if not plan.commands else _versionlock_text(pins)
        return plan
    if not version:
        raise PackageError('version is required when state is pinned')
    policy = backend.available(names)
    resolved, skipped = resolve(pkgs, version, policy, before.installed, install)
    to_install: Dict[str, str] = {}
    if install:
        for name, v in resolved.items():
            if name in pkgs.required or name in before.installed:
                if before.installed.get(name) != v:
                    to_install[name] = v
    installed_after = dict(before.installed)
    installed_after.update(to_install)
    pins = dict(before.pins)
    pins.update(resolved)
    after = PinState(before.pin_file, None, pins, [], installed_after)
    plan = PinPlan(backend.name, state, version, resolved, skipped, before, after, {})
    if backend.name == 'apt':
        after.pin_text = render_preferences(pins)
        after.holds = sorted(set(before.holds) | {n for n in resolved if n in installed_after})
        # A transaction must name every installed member so apt keeps them equal.
        if to_install:
            plan.install = {n: v for n, v in resolved.items() if n in to_install or n in before.installed}
    else:
        plan.install = to_install
        if backend.mode == 'module':
            after.pin_text = backend.target_stream() + '\n'
            after.pins = {}
        else:
            after.pin_text = _versionlock_text(pins)
        plan.commands = dnf_pin_commands(resolved, before.pins, backend.mode, backend.branch, backend.stream_suffix,
                                         to_install, backend.runner.installroot,
                                         enable_stream=before.pin_text != after.pin_text)
    return plan


def _versionlock_text(pins: Dict[str, str]) -> Optional[str]:
    if not pins:
        return None
    return ''.join(versionlock_entry(n, v) + '\n' for n, v in sorted(pins.items()))


def apply_pin(backend, plan: PinPlan) -> PinState:
    """Carry out `plan`; on a failed transaction put the pin file and holds back, then re-raise."""
    if backend.name == 'dnf' and plan.commands:
        for argv in plan.commands:
            backend.runner(argv, env=backend.env())
        return backend.read_state(list(plan.after.installed) + list(plan.resolved))
    before, after = plan.before, plan.after
    names = sorted(set(plan.resolved) | set(before.holds) | set(after.holds))
    if backend.name == 'apt':
        backend.check_dpkg()
    try:
        if plan.state == 'unpinned':
            backend.set_holds([], [h for h in before.holds if h not in after.holds])
            if before.pin_text != after.pin_text:
                backend.write_pins(after.pin_text)
        else:
            if before.pin_text != after.pin_text:
                backend.write_pins(after.pin_text)
            if plan.remove:
                backend.install(plan.install, remove=plan.remove)
            else:
                backend.install(plan.install)
            # apt drops the hold of a package it changed: hold from what is there now.
            held = backend.read_state(names).holds if plan.install or plan.remove else before.holds
            backend.set_holds([h for h in after.holds if h not in held], [h for h in held if h not in after.holds])
    except PackageError:
        backend.write_pins(before.pin_text)
        now = backend.read_state(names)
        backend.set_holds([h for h in before.holds if h not in now.holds], [h for h in now.holds if h not in before.holds])
        raise
    now = backend.read_state(names)
    wrong = ['%s is %s, expected %s' % (n, now.installed.get(n, 'not installed'), v)
             for n, v in plan.install.items() if now.installed.get(n) != v]
    if plan.remove:
        left = backend.read_state(list(plan.remove)).installed
        wrong += ['%s is still installed (%s), expected removed' % (n, left[n]) for n in plan.remove if n in left]
    if wrong:
        raise PackageError('the package transaction finished but: %s' % '; '.join(wrong))
    return now
