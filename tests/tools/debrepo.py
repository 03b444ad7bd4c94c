"""Local Debian driver repository and apt install roots for integration tests.

Builds tiny NVIDIA-driver-shaped packages with the real `dpkg-deb` (no maintainer scripts, one
file each), writes a flat file repository with its own `Packages` index (generated here, so
`dpkg-dev`/`apt-utils` are not needed), and creates install roots with their own dpkg database
and apt configuration. Real `apt-get`, `apt-cache`, `apt-mark`, `dpkg` and `dpkg-query` then act
on that root only: `APT_CONFIG` points at a file that sets `Dir` to the root before apt reads any
other configuration, so the host's `/etc/apt` and `/var/lib/dpkg` are never read or written.

    repo = build_repo(path, driver_specs(('580.126.20', '580.130.00')))
    root = AptRoot.create(tmp, repo)          # runs `apt-get update` under the root
    root.apt_get('install', '-y', 'nvidia-driver-580-server=580.126.20-0ubuntu1')
    root.installed()                          # {'nvidia-driver-580-server': '580.126.20-0ubuntu1', ...}

Pytest fixtures (import them into a test module): `deb_repo` (built once per session, cached on
disk by content; driver sets and two `linux-image-<release>` kernels, see `kernel_specs`) and
`apt_root` (a fresh root per test).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
from typing import Iterable, Sequence

import pytest

BRANCH = '580'
OLD = '580.126.20'
NEW = '580.130.00'
# Offered, but not installable (see broken_specs).
BROKEN = '580.142.00'
REVISION = '0ubuntu1'
# Fabric Manager and NSCQ come from another source package with another Debian revision, as in
# NVIDIA's CUDA repository: only the upstream version matches the driver's.
FM_REVISION = '1'


@dataclasses.dataclass(frozen=True)
class DebSpec:
    name: str
    version: str
    depends: str = ''
    provides: str = ''
    architecture: str = 'all'
    section: str = 'non-free/libs'
    # Extra files the package ships: (path relative to /, text), e.g. a kernel's /boot/vmlinuz-<k>.
    files: tuple[tuple[str, str], ...] = ()

    @property
    def filename(self) -> str:
        return '%s_%s_%s.deb' % (self.name, self.version.replace(':', '%3a'), self.architecture)


def deb_version(upstream: str, revision: str = REVISION) -> str:
    return '%s-%s' % (upstream, revision)


def driver_specs(versions: Sequence[str] = (OLD, NEW), branch: str = BRANCH) -> list[DebSpec]:
    """The Ubuntu `-server` driver set, Fabric Manager and NSCQ at each upstream version."""
    specs: list[DebSpec] = []
    for up in versions:
        v = deb_version(up)
        fv = deb_version(up, FM_REVISION)
        common = 'nvidia-kernel-common-%s-server' % branch
        # Ubuntu: the kernel-common package provides a versioned virtual package that Fabric
        # Manager depends on, so FM can only be installed next to the same driver version.
        specs.append(DebSpec(common, v, provides='%s-%s' % (common, up)))
        specs.append(DebSpec('libnvidia-compute-%s-server' % branch, v))
        specs.append(DebSpec('nvidia-utils-%s-server' % branch, v,
                             depends='libnvidia-compute-%s-server (= %s)' % (branch, v)))
        specs.append(DebSpec('nvidia-compute-utils-%s-server' % branch, v,
                             depends='libnvidia-compute-%s-server (= %s)' % (branch, v)))
        specs.append(DebSpec('nvidia-dkms-%s-server' % branch, v, depends='%s (= %s)' % (common, v)))
        specs.append(DebSpec('nvidia-driver-%s-server' % branch, v, depends=', '.join(
            '%s (= %s)' % (n % branch, v) for n in (
                'libnvidia-compute-%s-server', 'nvidia-kernel-common-%s-server', 'nvidia-dkms-%s-server',
                'nvidia-utils-%s-server', 'nvidia-compute-utils-%s-server'))))
        specs.append(DebSpec('nvidia-fabricmanager-%s' % branch, fv, depends='%s-%s' % (common, up)))
        specs.append(DebSpec('libnvidia-nscq-%s' % branch, fv, depends='%s-%s' % (common, up)))
    return specs


KERNEL_OLD = '6.8.0-134-generic'
KERNEL_NEW = '6.8.0-140-generic'


def kernel_specs(releases: Sequence[str] = (KERNEL_OLD, KERNEL_NEW)) -> list[DebSpec]:
    """Tiny Ubuntu kernel image packages: `linux-image-<release>` at version `<x.y.z>-<abi>.<abi>`."""
    specs = []
    for rel in releases:
        base, abi = rel.split('-')[:2]
        specs.append(DebSpec('linux-image-%s' % rel, '%s-%s.%s' % (base, abi, abi), section='kernel'))
    return specs


def broken_specs(upstream: str = BROKEN, branch: str = BRANCH) -> list[DebSpec]:
    """A driver set whose driver package depends on a package no repository has: the version is
    offered (the availability check passes) but the apt transaction fails."""
    out = []
    for s in driver_specs((upstream,), branch):
        if s.name == 'nvidia-driver-%s-server' % branch:
            s = dataclasses.replace(s, depends=s.depends + ', nvidia-firmware-%s-server-%s' % (branch, upstream))
        out.append(s)
    return out


def _control(spec: DebSpec) -> str:
    lines = ['Package: ' + spec.name, 'Version: ' + spec.version, 'Architecture: ' + spec.architecture,
             'Maintainer: gpufleet tests <tests@example.invalid>', 'Section: ' + spec.section,
             'Priority: optional']
    if spec.depends:
        lines.append('Depends: ' + spec.depends)
    if spec.provides:
        lines.append('Provides: ' + spec.provides)
    lines += ['Description: test stand-in for %s' % spec.name, ' Built by tests/tools/debrepo.py; one file.']
    return '\n'.join(lines) + '\n'


def build_deb(spec: DebSpec, workdir: pathlib.Path, outdir: pathlib.Path) -> pathlib.Path:
    tree = workdir / ('%s-%s' % (spec.name, spec.version))
    if tree.exists():
        shutil.rmtree(tree)
    (tree / 'DEBIAN').mkdir(parents=True)
    doc = tree / 'usr' / 'share' / 'doc' / spec.name
    doc.mkdir(parents=True)
    (doc / 'VERSION').write_text('%s %s\n' % (spec.name, spec.version))
    for rel, text in spec.files:
        f = tree / rel.lstrip('/')
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (tree / 'DEBIAN' / 'control').write_text(_control(spec))
    out = outdir / spec.filename
    subprocess.run(['dpkg-deb', '--root-owner-group', '-Zgzip', '--build', str(tree), str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(tree)
    return out


def _packages_entry(deb: pathlib.Path, repo: pathlib.Path) -> str:
    control = subprocess.run(['dpkg-deb', '--field', str(deb)], check=True, capture_output=True,
                             text=True).stdout.rstrip('\n')
    data = deb.read_bytes()
    extra = ['Filename: ./%s' % deb.relative_to(repo).as_posix(), 'Size: %d' % len(data),
             'MD5sum: ' + hashlib.md5(data).hexdigest(), 'SHA256: ' + hashlib.sha256(data).hexdigest()]
    # Keep the Description last, as dpkg-scanpackages does.
    head, sep, desc = control.partition('\nDescription:')
    return head + '\n' + '\n'.join(extra) + (sep + desc if sep else '') + '\n'


def build_repo(repo: pathlib.Path, specs: Iterable[DebSpec]) -> pathlib.Path:
    """Build every spec into `repo` and write its flat `Packages` index. Returns `repo`."""
    repo.mkdir(parents=True, exist_ok=True)
    work = repo / '.build'
    work.mkdir(exist_ok=True)
    debs = [build_deb(s, work, repo) for s in specs]
    shutil.rmtree(work)
    (repo / 'Packages').write_text('\n'.join(_packages_entry(d, repo) for d in sorted(debs)))
    # apt's sandbox user must be able to read a file repository; keep it world-readable.
    for p in [repo, *repo.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return repo


def cached_repo(base: pathlib.Path, specs: Sequence[DebSpec]) -> pathlib.Path:
    """`build_repo` once per content: a repo keyed by the specs' digest is reused."""
    def spec_key(s: DebSpec) -> dict:
        d = dataclasses.asdict(s)
        if not d['files']:
            del d['files']      # repositories without extra files keep their cache key
        return d
    key = hashlib.sha256(json.dumps([spec_key(s) for s in specs], sort_keys=True).encode()).hexdigest()[:16]
    repo = base / ('debrepo-' + key)
    if not (repo / 'Packages').is_file():
        tmp = base / ('debrepo-' + key + '.tmp-%d' % os.getpid())
        build_repo(tmp, specs)
        if (repo / 'Packages').is_file():
            shutil.rmtree(tmp)
        else:
            tmp.rename(repo)
    return repo


def apt_config_text(root: pathlib.Path) -> str:
    """apt configuration that confines apt and dpkg to `root` (read first, through APT_CONFIG)."""
    dpkg_opts = ['--root=%s' % root, '--admindir=%s/var/lib/dpkg' % root, '--log=%s/var/log/dpkg.log' % root]
    if os.geteuid() != 0:
        dpkg_opts.append('--force-not-root')
    return '\n'.join([
        'Dir "%s/";' % root,
        'Dir::State::status "%s/var/lib/dpkg/status";' % root,
        'DPkg::Options { %s };' % ' '.join('"%s";' % o for o in dpkg_opts),
        '',
    ])


@dataclasses.dataclass
class AptRoot:
    """An install root with its own dpkg database and apt configuration."""

    path: pathlib.Path
    repo: pathlib.Path
    apt_config: pathlib.Path

    @classmethod
    def create(cls, path: pathlib.Path, repo: pathlib.Path) -> 'AptRoot':
        path = path.resolve()
        for d in ('etc/apt/apt.conf.d', 'etc/apt/preferences.d', 'etc/apt/sources.list.d', 'etc/default',
                  'var/lib/dpkg/info', 'var/lib/dpkg/updates', 'var/lib/dpkg/triggers',
                  'var/lib/apt/lists/partial', 'var/cache/apt/archives/partial', 'var/log/apt', 'boot/grub'):
            (path / d).mkdir(parents=True, exist_ok=True)
        for f in ('var/lib/dpkg/status', 'var/lib/dpkg/available'):
            (path / f).touch()
        (path / 'etc/apt/sources.list').write_text('deb [trusted=yes] file:%s ./\n' % repo.resolve())
        # Under the root: file repository read as root (pytest's tmp dirs are 0700), no recommends.
        (path / 'etc/apt/apt.conf.d/00gpufleet-tests').write_text(
            'APT::Sandbox::User "root";\nAPT::Install-Recommends "false";\nAcquire::Languages "none";\n')
        # The configuration lives OUTSIDE the root, like the module's own runner does it.
        conf = path.parent / (path.name + '.apt.conf')
        conf.write_text(apt_config_text(path))
        root = cls(path=path, repo=repo.resolve(), apt_config=conf)
        root.apt_get('update')
        return root

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({'APT_CONFIG': str(self.apt_config), 'DEBIAN_FRONTEND': 'noninteractive', 'LC_ALL': 'C'})
        return env

    def run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=300, check=False)
        if check and proc.returncode != 0:
            raise AssertionError('%s failed (rc=%d):\n%s\n%s' % (argv, proc.returncode, proc.stdout, proc.stderr))
        return proc

    def apt_get(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(['apt-get', '-q', *args], check=check)

    def apt_mark(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(['apt-mark', *args])

    def dpkg_query(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(['dpkg-query', '--admindir=%s/var/lib/dpkg' % self.path, *args], check=check)

    def installed(self) -> dict[str, str]:
        """{package: version} of the packages installed under the root (`dpkg-query`)."""
        out = self.dpkg_query('-W', '-f=${Package}\t${Version}\t${db:Status-Abbrev}\n').stdout
        res = {}
        for line in out.splitlines():
            name, version, status = line.split('\t')
            if status.startswith('ii') or status.startswith('hi'):
                res[name] = version
        return res

    def holds(self) -> set[str]:
        return set(self.apt_mark('showhold').stdout.split())

    def state_digest(self) -> str:
        """A digest of everything a pin/install can change under the root."""
        h = hashlib.sha256()
        for rel in ('var/lib/dpkg/status',):
            h.update((self.path / rel).read_bytes())
        for d in ('etc/apt/preferences.d',):
            for p in sorted((self.path / d).iterdir()):
                h.update(p.name.encode() + b'\0' + p.read_bytes())
        return h.hexdigest()


def host_dpkg_digest() -> str:
    """Digest of the host's dpkg database and apt preferences: must never change in tests."""
    h = hashlib.sha256()
    for p in [pathlib.Path('/var/lib/dpkg/status'), *sorted(pathlib.Path('/etc/apt/preferences.d').glob('*'))]:
        if p.is_file():
            h.update(str(p).encode() + b'\0' + p.read_bytes())
    return h.hexdigest()


def require_tools() -> None:
    missing = [t for t in ('dpkg-deb', 'dpkg', 'dpkg-query', 'apt-get', 'apt-cache', 'apt-mark') if not shutil.which(t)]
    if missing:
        pytest.fail('Debian tools missing (install dpkg and apt): %s' % ', '.join(missing))


@pytest.fixture(scope='session')
def deb_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    require_tools()
    return cached_repo(tmp_path_factory.getbasetemp(), driver_specs() + kernel_specs())


@pytest.fixture(scope='session')
def deb_repo_with_broken(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The driver repository plus a version (BROKEN) whose transaction fails."""
    require_tools()
    return cached_repo(tmp_path_factory.getbasetemp(), driver_specs() + kernel_specs() + broken_specs())


@pytest.fixture
def apt_root(tmp_path: pathlib.Path, deb_repo: pathlib.Path) -> AptRoot:
    return AptRoot.create(tmp_path / 'root', deb_repo)


# --------------------------------------------------------------------------------------------
# Kernel stacks for the kernel modules (issue 14): both module sources, both kernel releases
# --------------------------------------------------------------------------------------------

# The seed's kernel change; KERNEL_OLD (6.8.0-134-generic) is the one nodes run now.
KERNEL_TARGET = '6.8.0-135-generic'
# Offered with its kernel packages but without Canonical's prebuilt NVIDIA modules (and without
# linux-modules-extra), as a new ABI is for a while after its release.
KERNEL_NOMOD = '6.8.0-136-generic'
UUID = '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0'
# (kernel, driver, n): linux-modules-nvidia-580-server-<kernel> at <kernel version>+<n>, built for
# <driver>. Kernel 134 has builds for both drivers; 135 only for the newer driver.
PREBUILT_MODULES = ((KERNEL_OLD, OLD, 1), (KERNEL_OLD, NEW, 2), (KERNEL_TARGET, NEW, 1))
# An older ABI some nodes of a production-shaped lab fleet still run (kernel drift: labenv.FLEETS), with the
# prebuilt module of the source driver for it.
KERNEL_DRIFT = '6.8.0-133-generic'


def kernel_version(release: str) -> str:
    """Ubuntu's package version of a kernel release: 6.8.0-135-generic -> 6.8.0-135.135."""
    base, abi = release.split('-')[:2]
    return '%s-%s.%s' % (base, abi, abi)


def kernel_stack_specs(releases: Sequence[str] = (KERNEL_OLD, KERNEL_TARGET), extra: bool = True,
                       boot: bool = False) -> list[DebSpec]:
    """`linux-image-<k>` (depends on `linux-modules-<k>` at its version, as Ubuntu's does),
    `linux-modules-<k>`, `linux-modules-extra-<k>` (unless `extra` is false) and `linux-headers-<k>`.
    With `boot`, `linux-image-<k>` ships `/boot/vmlinuz-<k>` as Ubuntu's does (what update-grub
    lists; the lab's install roots)."""
    specs = []
    for rel in releases:
        v = kernel_version(rel)
        files = (('boot/vmlinuz-%s' % rel, 'lab kernel image %s %s\n' % (rel, v)),) if boot else ()
        specs.append(DebSpec('linux-modules-%s' % rel, v, section='kernel'))
        specs.append(DebSpec('linux-image-%s' % rel, v, depends='linux-modules-%s (= %s)' % (rel, v), section='kernel',
                             files=files))
        if extra:
            specs.append(DebSpec('linux-modules-extra-%s' % rel, v, depends='linux-modules-%s (= %s)' % (rel, v),
                                 section='kernel'))
        specs.append(DebSpec('linux-headers-%s' % rel, v, section='kernel'))
    return specs


def prebuilt_module_specs(builds: Sequence[tuple[str, str, int]] = PREBUILT_MODULES, branch: str = BRANCH) -> list[DebSpec]:
    """Canonical's signed prebuilt modules: one package per kernel ABI whose Depends pin the driver
    (`nvidia-kernel-common-<b>-server (<= <driver>-1)` and `(>= <driver>)`, as the archive's do)."""
    specs = []
    common = 'nvidia-kernel-common-%s-server' % branch
    for rel, driver, n in builds:
        specs.append(DebSpec('linux-modules-nvidia-%s-server-%s' % (branch, rel), '%s+%d' % (kernel_version(rel), n),
                             depends='linux-image-%s | linux-image-unsigned-%s, %s (<= %s-1), %s (>= %s)'
                             % (rel, rel, common, driver, common, driver), section='kernel'))
    return specs


def prebuilt_driver_specs(versions: Sequence[str] = (OLD, NEW), branch: str = BRANCH) -> list[DebSpec]:
    """`nvidia-headless-no-dkms-<b>-server`: the user space for the prebuilt modules (the rest of
    the set comes from `driver_specs`)."""
    specs = []
    for up in versions:
        v = deb_version(up)
        specs.append(DebSpec('nvidia-headless-no-dkms-%s-server' % branch, v, depends=', '.join(
            '%s (= %s)' % (n % branch, v) for n in (
                'nvidia-kernel-common-%s-server', 'libnvidia-compute-%s-server', 'nvidia-compute-utils-%s-server'))))
    return specs


def kernel_repo_specs() -> list[DebSpec]:
    return (driver_specs() + prebuilt_driver_specs() + kernel_stack_specs()
            + kernel_stack_specs((KERNEL_NOMOD,), extra=False) + prebuilt_module_specs())


def lab_repo_specs() -> list[DebSpec]:
    """The lab's repository (tests/tools/labenv.py): both driver versions for both module sources,
    kernels 6.8.0-134-generic and 6.8.0-135-generic (and KERNEL_DRIFT, 133, some nodes of the production fleet run)
    whose images ship /boot/vmlinuz-<k>, and the prebuilt NVIDIA modules of PREBUILT_MODULES (and of the source
    driver for KERNEL_DRIFT)."""
    return (driver_specs() + prebuilt_driver_specs() + kernel_stack_specs((KERNEL_OLD, KERNEL_TARGET, KERNEL_DRIFT), boot=True)
            + prebuilt_module_specs(PREBUILT_MODULES + ((KERNEL_DRIFT, OLD, 1),)))


def update_grub_hook_text(command: Sequence[str]) -> str:
    """An apt.conf.d snippet that runs `command` after every dpkg run of apt (DPkg::Post-Invoke), as
    the kernel's postinst runs update-grub on Ubuntu. Under an install root dpkg runs no maintainer
    scripts for us (they would need a chroot), so the lab's roots regenerate grub.cfg this way."""
    line = ' '.join(shlex.quote(a) for a in command)
    if '"' in line:
        raise ValueError('an apt configuration string cannot hold a double quote: %r' % line)
    return 'DPkg::Post-Invoke { "%s"; };\n' % line


@pytest.fixture(scope='session')
def kernel_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Driver sets (both module sources) and kernels 6.8.0-134/135/136-generic."""
    require_tools()
    return cached_repo(tmp_path_factory.getbasetemp(), kernel_repo_specs())
