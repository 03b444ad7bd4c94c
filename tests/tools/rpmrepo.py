"""Local RPM repository and dnf install roots for the RHEL-family kernel tests (issue 14).

Builds tiny RHEL-shaped packages with the real `rpmbuild` (no scriptlets; a file or two each),
indexes them with `createrepo_c`, and creates install roots (Rocky Linux 9 `etc/os-release`, a
`file://` repository in `etc/yum.repos.d`, an initialised rpm database, dnf's versionlock plugin
configured with its lock list under the root). Real `dnf --installroot` and `rpm --root` then act on
that root only; the tests pass `--setopt=pluginconfpath=<root>/etc/dnf/plugins` (as the modules do
under an install root) so the versionlock plugin never reads or writes the host's lock list.

    repo = cached_repo(base, kernel_repo_specs())
    root = DnfRoot.create(tmp / 'root', repo)
    root.dnf('install', 'kernel-5.14.0-427.13.1.el9_4')
    root.installed()          # {'kernel': ['5.14.0-427.13.1.el9_4'], ...}

Pytest fixture: `rpm_repo` (built once per session, cached on disk by content); `require_tools`
skips, naming what is missing, when rpm/rpmbuild/dnf/createrepo_c or the versionlock plugin is not there.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
from typing import Sequence

import pytest

BRANCH = '580'
OLD = '580.126.20'
NEW = '580.130.00'
DRIVER_RELEASE = '1.el9'
KERNEL_OLD = '5.14.0-427.13.1.el9_4.x86_64'
KERNEL_TARGET = '5.14.0-427.16.1.el9_4.x86_64'
# Kernel packages of every kernel release; kernel-devel is what DKMS builds against.
KERNEL_NAMES = ('kernel', 'kernel-core', 'kernel-modules', 'kernel-modules-core', 'kernel-devel')
# The driver user space (the required members of the `rhel-dnf` preset of _packages.py).
DRIVER_NAMES = ('nvidia-driver', 'nvidia-driver-libs', 'nvidia-driver-cuda', 'nvidia-driver-cuda-libs')
DKMS_NAME = 'kmod-nvidia-open-dkms'
# (kernel, driver): NVIDIA's precompiled kmod-nvidia-open-<driver>-<kver>-<krel>. The old kernel
# has builds for both drivers; the target kernel only for the newer one.
PRECOMPILED = ((KERNEL_OLD, OLD), (KERNEL_OLD, NEW), (KERNEL_TARGET, NEW))
VERSIONLOCK_CONF = 'etc/dnf/plugins/versionlock.conf'
VERSIONLOCK_LIST = 'etc/dnf/plugins/versionlock.list'
OS_RELEASE = ('NAME="Rocky Linux"\nVERSION="9.4 (Blue Onyx)"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'
              'VERSION_ID="9.4"\nPLATFORM_ID="platform:el9"\nPRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"\n')


@dataclasses.dataclass(frozen=True)
class RpmSpec:
    name: str
    version: str
    release: str
    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    # (path relative to /, text)
    files: tuple[tuple[str, str], ...] = ()
    arch: str = 'x86_64'


def split_kernel(kernel: str) -> tuple[str, str, str]:
    """5.14.0-427.16.1.el9_4.x86_64 -> ('5.14.0', '427.16.1.el9_4', 'x86_64')."""
    vr, arch = kernel.rsplit('.', 1)
    version, release = vr.split('-', 1)
    return version, release, arch


def kernel_evr(kernel: str) -> str:
    version, release = split_kernel(kernel)[:2]
    return '%s-%s' % (version, release)


def precompiled_name(driver: str, kernel: str) -> str:
    version, release = split_kernel(kernel)[:2]
    return 'kmod-nvidia-open-%s-%s-%s' % (driver, version, release.split('.el')[0])


def kernel_specs(releases: Sequence[str] = (KERNEL_OLD, KERNEL_TARGET)) -> list[RpmSpec]:
    specs = []
    for k in releases:
        version, release = split_kernel(k)[:2]
        evr = '%s-%s' % (version, release)
        mod = 'usr/lib/modules/%s' % k
        specs += [
            RpmSpec('kernel-core', version, release, provides=('installonlypkg(kernel)',),
                    files=(('boot/vmlinuz-%s' % k, 'kernel image %s\n' % k), (mod + '/vmlinuz', 'kernel image %s\n' % k))),
            RpmSpec('kernel-modules-core', version, release, requires=('kernel-core = %s' % evr,),
                    provides=('installonlypkg(kernel-module)',), files=((mod + '/modules.builtin', 'core\n'),)),
            RpmSpec('kernel-modules', version, release, requires=('kernel-core = %s' % evr,),
                    provides=('installonlypkg(kernel-module)',), files=((mod + '/kernel/drivers/modules.list', 'mods\n'),)),
            RpmSpec('kernel', version, release, requires=('kernel-core = %s' % evr, 'kernel-modules = %s' % evr)),
            RpmSpec('kernel-devel', version, release, provides=('installonlypkg(kernel)',),
                    files=(('usr/src/kernels/%s/Makefile' % k, 'devel %s\n' % k),)),
        ]
    return specs


def driver_specs(versions: Sequence[str] = (OLD, NEW)) -> list[RpmSpec]:
    specs = []
    for d in versions:
        specs += [RpmSpec(n, d, DRIVER_RELEASE, files=(('usr/share/doc/%s/VERSION' % n, '%s %s\n' % (n, d)),))
                  for n in DRIVER_NAMES]
        specs.append(RpmSpec(DKMS_NAME, d, DRIVER_RELEASE,
                             files=(('usr/src/nvidia-open-%s/dkms.conf' % d, 'PACKAGE_VERSION="%s"\n' % d),)))
    return specs


def precompiled_specs(builds: Sequence[tuple[str, str]] = PRECOMPILED) -> list[RpmSpec]:
    specs = []
    for k, d in builds:
        specs.append(RpmSpec(precompiled_name(d, k), d, DRIVER_RELEASE, requires=('kernel-core = %s' % kernel_evr(k),),
                             files=(('usr/lib/modules/%s/extra/nvidia-%s.ko' % (k, d), 'nvidia %s for %s\n' % (d, k)),)))
    return specs


def kernel_repo_specs() -> list[RpmSpec]:
    return kernel_specs() + driver_specs() + precompiled_specs()


def _spec_text(s: RpmSpec) -> str:
    lines = ['Name: %s' % s.name, 'Version: %s' % s.version, 'Release: %s' % s.release,
             'Summary: test stand-in for %s' % s.name, 'License: GPL', 'BuildArch: %s' % s.arch]
    lines += ['Requires: %s' % r for r in s.requires] + ['Provides: %s' % p for p in s.provides]
    lines += ['', '%description', 'Built by tests/tools/rpmrepo.py.', '', '%install']
    for rel, text in s.files:
        d = os.path.dirname(rel)
        lines.append('mkdir -p %%{buildroot}/%s' % d)
        lines.append("printf '%%s' %s > %%{buildroot}/%s" % (json.dumps(text), rel))
    lines += ['', '%files'] + ['/%s' % f[0] for f in s.files] + ['']
    return '\n'.join(lines)


def build_rpm(spec: RpmSpec, top: pathlib.Path, outdir: pathlib.Path) -> None:
    f = top / ('%s-%s.spec' % (spec.name, spec.version))
    f.write_text(_spec_text(spec))
    subprocess.run(['rpmbuild', '-bb', '--quiet', '--define', '_topdir %s' % top, '--define', '_rpmdir %s' % outdir,
                    '--define', '_build_id_links none', '--define', 'debug_package %{nil}',
                    '--define', '__os_install_post %{nil}', '--nodeps', str(f)],
                   check=True, capture_output=True, timeout=300)


def build_repo(repo: pathlib.Path, specs: Sequence[RpmSpec]) -> pathlib.Path:
    repo.mkdir(parents=True, exist_ok=True)
    top = repo / '.build'
    top.mkdir(exist_ok=True)
    for s in specs:
        build_rpm(s, top, repo)
    shutil.rmtree(top)
    subprocess.run(['createrepo_c', '--quiet', str(repo)], check=True, capture_output=True, timeout=300)
    return repo


def cached_repo(base: pathlib.Path, specs: Sequence[RpmSpec]) -> pathlib.Path:
    key = hashlib.sha256(json.dumps([dataclasses.asdict(s) for s in specs], sort_keys=True).encode()).hexdigest()[:16]
    repo = base / ('rpmrepo-' + key)
    if not (repo / 'repodata/repomd.xml').is_file():
        tmp = base / ('rpmrepo-%s.tmp-%d' % (key, os.getpid()))
        build_repo(tmp, specs)
        if (repo / 'repodata/repomd.xml').is_file():
            shutil.rmtree(tmp)
        else:
            tmp.rename(repo)
    return repo


def plugin_opts(root: pathlib.Path) -> list[str]:
    """The dnf options that keep the plugins' configuration (the versionlock list) under the root."""
    return ['--setopt=pluginconfpath=%s/etc/dnf/plugins' % root]


@dataclasses.dataclass
class DnfRoot:
    """An install root with its own rpm database, repository file and versionlock configuration."""

    path: pathlib.Path
    repo: pathlib.Path

    @classmethod
    def create(cls, path: pathlib.Path, repo: pathlib.Path) -> 'DnfRoot':
        path = path.resolve()
        for d in ('etc/yum.repos.d', 'etc/dnf/plugins', 'var/lib/rpm', 'boot', 'var/cache/dnf'):
            (path / d).mkdir(parents=True, exist_ok=True)
        (path / 'etc/os-release').write_text(OS_RELEASE)
        (path / 'etc/dnf/dnf.conf').write_text('[main]\ngpgcheck=0\ninstallonly_limit=3\nclean_requirements_on_remove=True\n'
                                               'best=False\nskip_if_unavailable=False\n')
        (path / 'etc/yum.repos.d/gpufleet-test.repo').write_text(
            '[gpufleet-test]\nname=gpufleet test repository\nbaseurl=file://%s\nenabled=1\ngpgcheck=0\n'
            'metadata_expire=never\n' % repo.resolve())
        (path / VERSIONLOCK_CONF).write_text('[main]\nenabled = 1\nlocklist = %s\n' % (path / VERSIONLOCK_LIST))
        (path / VERSIONLOCK_LIST).write_text('')
        subprocess.run(['rpm', '--root', str(path), '--initdb'], check=True, capture_output=True, timeout=60)
        return cls(path=path, repo=repo.resolve())

    def run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, LC_ALL='C', LANG='C')
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
        if check and proc.returncode != 0:
            raise AssertionError('%s failed (rc=%d):\n%s\n%s' % (argv, proc.returncode, proc.stdout, proc.stderr))
        return proc

    def dnf(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(['dnf', '-y', '-q', '--installroot=%s' % self.path, '--releasever=9', *plugin_opts(self.path),
                         *args], check=check)

    def installed(self) -> dict[str, list[str]]:
        """{name: [version-release, ...]} under the root (`rpm --root <r> -qa`); kernels are multi-version."""
        out = self.run(['rpm', '--root', str(self.path), '-qa', '--qf', '%{NAME}\t%{VERSION}-%{RELEASE}\n']).stdout
        res: dict[str, list[str]] = {}
        for line in out.splitlines():
            if '\t' in line:
                name, evr = line.split('\t')
                res.setdefault(name, []).append(evr)
        return {n: sorted(v) for n, v in res.items()}

    def locks(self) -> list[str]:
        text = (self.path / VERSIONLOCK_LIST).read_text()
        return sorted(line.strip() for line in text.splitlines() if line.strip() and not line.startswith('#'))

    def digest(self) -> str:
        h = hashlib.sha256()
        h.update(self.run(['rpm', '--root', str(self.path), '-qa']).stdout.encode())
        for rel in (VERSIONLOCK_LIST, 'var/lib/gpufleet/kernel-protect.json'):
            p = self.path / rel
            h.update(rel.encode() + b'\0' + (p.read_bytes() if p.exists() else b'-'))
        return h.hexdigest()


def host_rpm_digest() -> str:
    """The host's rpm database listing and dnf versionlock list: must never change in tests."""
    h = hashlib.sha256()
    if shutil.which('rpm'):
        h.update(subprocess.run(['rpm', '-qa'], capture_output=True, text=True, timeout=60, check=True).stdout.encode())
    for p in (pathlib.Path('/etc/dnf/plugins/versionlock.list'), pathlib.Path('/var/lib/dpkg/status')):
        if p.is_file():
            h.update(str(p).encode() + b'\0' + p.read_bytes())
    return h.hexdigest()


def missing_tools() -> list[str]:
    missing = [t for t in ('rpm', 'rpmbuild', 'dnf', 'createrepo_c') if not shutil.which(t)]
    if not any(pathlib.Path(p, 'dnf-plugins/versionlock.py').is_file()
               for p in ('/usr/lib/python3/dist-packages', '/usr/lib/python3/site-packages')):
        missing.append('dnf versionlock plugin (Debian package dnf-plugins-core)')
    return missing


def require_tools() -> None:
    missing = missing_tools()
    if missing:
        pytest.skip('RHEL-family tools missing (make system-deps installs rpm dnf createrepo-c dnf-plugins-core): %s'
                    % ', '.join(missing))


@pytest.fixture(scope='module')
def rpm_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Kernels 5.14.0-427.13.1/16.1.el9_4, the driver at 580.126.20 and 580.130.00 (user space and
    kmod-nvidia-open-dkms) and the precompiled kmods of PRECOMPILED."""
    require_tools()
    return cached_repo(tmp_path_factory.getbasetemp(), kernel_repo_specs())
