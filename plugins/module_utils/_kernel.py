# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""The kernel as part of the tuple: which packages make kernel <k> with the NVIDIA driver on a
node, whether the repositories offer them, one pinned apt transaction for kernel and driver, the
way back (the previous kernel with the previous driver's modules), and the protection of the
previous kernel from autoremove until the rollout releases it.

Module sources (how the NVIDIA kernel modules reach kernel <k>):

- ``dkms``: ``nvidia-dkms-<b>-server`` builds them for every kernel whose ``linux-headers-<k>`` is
  installed; the built module is in DKMS's tree ``/var/lib/dkms/nvidia/<driver>/<k>/``.
- ``prebuilt``: Canonical's signed ``linux-modules-nvidia-<b>-server-<k>``, one package per kernel
  ABI, with the ``nvidia-headless-no-dkms-<b>-server`` user space. Its Depends pin the driver:
  ``nvidia-kernel-common-<b>-server (>= <driver>)`` (and ``<= <driver>-1``).

The apt side runs for real through `_packages.AptBackend` (install roots included); the RHEL side
through `DnfKernel` (dnf and rpm, install roots included): one `dnf install` of the exact set,
`dnf versionlock` for it and for the previous kernel until `state=released`. `kernel_backend`
decides which, from the managed system's os-release.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fsio
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk

MODULE_SOURCES = ('dkms', 'prebuilt')
KERNEL_PIN_FILE = 'gpufleet-kernel.pref'
PROTECT_FILE = 'var/lib/gpufleet/kernel-protect.json'
DKMS_TREE = 'var/lib/dkms/nvidia'
# The driver user space that goes with each module source (presets of _packages).
SOURCE_PRESET = {'dkms': 'ubuntu-server', 'prebuilt': 'ubuntu-server-prebuilt'}

_UBUNTU_RELEASE = re.compile(r'^(\d+\.\d+\.\d+)-(\d+)-([a-z][a-z0-9]*(?:-[a-z0-9.]+)*)$')
_RPM_RELEASE = re.compile(r'^(\d+\.\d+\.\d+)-(\d[0-9A-Za-z._+]*?)\.(x86_64|aarch64|ppc64le|s390x)$')
_DRIVER_VERSION = re.compile(r'^\d{3}\.\d+(?:\.\d+)?$')


class KernelError(Exception):
    """A clear, user-facing error (the module turns it into fail_json(msg=...))."""


# --------------------------------------------------------------------------------------------
# Releases and versions
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class UbuntuRelease:
    release: str      # 6.8.0-135-generic
    base: str         # 6.8.0
    abi: str          # 135
    flavour: str      # generic

    @property
    def abi_name(self) -> str:
        return '%s-%s' % (self.base, self.abi)


def ubuntu_release(kernel: str, field: str = 'kernel') -> UbuntuRelease:
    m = _UBUNTU_RELEASE.match(str(kernel or ''))
    if not m:
        raise KernelError('%s %r is not an Ubuntu/Debian kernel release such as 6.8.0-135-generic '
                          '(<version>-<abi>-<flavour>, as uname -r prints it)' % (field, kernel))
    return UbuntuRelease(m.group(0), m.group(1), m.group(2), m.group(3))


@dataclasses.dataclass(frozen=True)
class RpmRelease:
    release: str      # 5.14.0-427.13.1.el9_4.x86_64
    version: str      # 5.14.0
    rel: str          # 427.13.1.el9_4
    arch: str         # x86_64

    @property
    def evr(self) -> str:
        return '%s-%s' % (self.version, self.rel)

    @property
    def rel_no_dist(self) -> str:
        """427.13.1 (the release without the .el9_4 dist tag), as NVIDIA's precompiled kmods name it."""
        return re.sub(r'\.(?:el|fc)\d.*$', '', self.rel)


def rpm_release(kernel: str, field: str = 'kernel') -> RpmRelease:
    m = _RPM_RELEASE.match(str(kernel or ''))
    if not m:
        raise KernelError('%s %r is not a RHEL-family kernel release such as 5.14.0-427.13.1.el9_4.x86_64 '
                          '(<version>-<release>.<arch>, as uname -r prints it)' % (field, kernel))
    return RpmRelease(m.group(0), m.group(1), m.group(2), m.group(3))


def check_driver_version(version: str, branch: Optional[str], field: str = 'driver_version') -> str:
    if not _DRIVER_VERSION.match(str(version or '')):
        raise KernelError('%s %r is not an NVIDIA driver version such as 580.130.00' % (field, version))
    if branch and version.split('.')[0] != branch:
        raise KernelError('%s %r is not in driver branch %r' % (field, version, branch))
    return version


def check_module_source(source: str) -> str:
    if source not in MODULE_SOURCES:
        raise KernelError('module_source must be one of %s, got %r' % (', '.join(MODULE_SOURCES), source))
    return source


# --------------------------------------------------------------------------------------------
# Package sets
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AptKernelSet:
    """The packages of kernel <k> with the NVIDIA modules for it, by role."""
    kernel: str
    image: Tuple[str, ...]            # required, one version (the kernel's source package)
    optional: Tuple[str, ...]         # same version when the archive has it (linux-modules-extra)
    headers: Tuple[str, ...]          # DKMS only
    nvidia_module: Optional[str]      # prebuilt only: linux-modules-nvidia-<b>-server-<k>

    @property
    def kernel_names(self) -> Tuple[str, ...]:
        return self.image + self.optional + self.headers

    @property
    def names(self) -> Tuple[str, ...]:
        return self.kernel_names + ((self.nvidia_module,) if self.nvidia_module else ())


def nvidia_module_package(branch: str, kernel: str) -> str:
    return 'linux-modules-nvidia-%s-server-%s' % (branch, kernel)


def apt_kernel_set(kernel: str, branch: str, source: str) -> AptKernelSet:
    r = ubuntu_release(kernel)
    pk.check_branch(branch)
    check_module_source(source)
    return AptKernelSet(
        kernel=r.release,
        image=('linux-image-%s' % r.release, 'linux-modules-%s' % r.release),
        optional=('linux-modules-extra-%s' % r.release,),
        headers=('linux-headers-%s' % r.release,) if source == 'dkms' else (),
        nvidia_module=nvidia_module_package(branch, r.release) if source == 'prebuilt' else None)


def kernel_meta_packages(kernel: str, branch: str) -> Tuple[str, ...]:
    """Meta packages that would pull a newer kernel (held with the kernel when installed)."""
    f = ubuntu_release(kernel).flavour
    return ('linux-%s' % f, 'linux-image-%s' % f, 'linux-headers-%s' % f,
            'linux-modules-nvidia-%s-server-%s' % (branch, f))


def dnf_kernel_set(kernel: str, driver_version: str, source: str, open_modules: bool = True) -> Dict[str, str]:
    """name -> version(-release) of the RHEL-family packages for kernel <k> with the NVIDIA modules.

    Kernel: ``kernel``, ``kernel-core``, ``kernel-modules`` (and ``kernel-modules-core``, RHEL 9.1
    and later) at the kernel's version-release. DKMS: ``kernel-devel`` at that version-release and
    ``kmod-nvidia-open-dkms`` (or ``kmod-nvidia-latest-dkms`` for the proprietary modules) at the
    driver version. Prebuilt (NVIDIA's precompiled streams): ``kmod-nvidia-open-<driver>-<kver>-<krel>``
    (or ``kmod-nvidia-<driver>-<kver>-<krel>``), whose version is the driver's.
    """
    r = rpm_release(kernel)
    check_driver_version(driver_version, None)
    check_module_source(source)
    out = {n: r.evr for n in ('kernel', 'kernel-core', 'kernel-modules', 'kernel-modules-core')}
    flavour = 'nvidia-open' if open_modules else 'nvidia'
    if source == 'dkms':
        out['kernel-devel'] = r.evr
        out['kmod-nvidia-open-dkms' if open_modules else 'kmod-nvidia-latest-dkms'] = driver_version
    else:
        out['kmod-%s-%s-%s-%s' % (flavour, driver_version, r.version, r.rel_no_dist)] = driver_version
    return out


DNF_OPTIONAL = ('kernel-modules-core',)


def dnf_kernel_commands(packages: Dict[str, str], offered: Dict[str, List[str]], installroot: Optional[str]) -> List[List[str]]:
    """`dnf install` of the exact set (members dnf does not offer and that are optional are dropped;
    a missing required one is a KernelError naming it) and `dnf versionlock add` for each."""
    missing = []
    names = {}
    for name, version in sorted(packages.items()):
        vs = offered.get(name, [])
        pick = next((v for v in vs if v == version or v.startswith(version + '-') or v.split(':')[-1] == version
                     or v.split(':')[-1].startswith(version + '-')), None)
        if pick is None:
            if name in DNF_OPTIONAL:
                continue
            missing.append('%s %s (offered: %s)' % (name, version, ', '.join(vs) or 'none'))
            continue
        names[name] = pick
    if missing:
        raise KernelError('the repositories do not offer: %s; nothing was changed' % '; '.join(missing))
    base = pk.dnf_base(installroot)
    specs = ['%s-%s' % kv for kv in sorted(names.items())]
    return [base + [DNF_KEEP_INSTALLONLY, 'install', '--allowerasing'] + specs, base + ['versionlock', 'add'] + specs]


# --------------------------------------------------------------------------------------------
# apt-cache show records (the Depends of the prebuilt module packages carry the driver version)
# --------------------------------------------------------------------------------------------

def parse_show(out: str) -> List[Dict[str, str]]:
    """`apt-cache show` records: one dict of fields per version."""
    records = []
    for para in re.split(r'\n\s*\n', out or ''):
        fields: Dict[str, str] = {}
        key = None
        for line in para.splitlines():
            if line[:1].isspace() and key:
                fields[key] += '\n' + line.strip()
            elif ':' in line:
                key, v = line.split(':', 1)
                fields[key.strip()] = v.strip()
        if 'Package' in fields and 'Version' in fields:
            records.append(fields)
    return records


def parse_depends(text: str) -> List[List[Tuple[str, Optional[str], Optional[str]]]]:
    """Depends -> [[(name, op, version), ...alternatives], ...]."""
    out = []
    for group in (text or '').split(','):
        alts = []
        for alt in group.split('|'):
            m = re.match(r'^\s*([^\s(]+)\s*(?:\(\s*([<>=]+)\s*([^)\s]+)\s*\))?\s*$', alt)
            if m:
                alts.append((m.group(1).split(':')[0], m.group(2), m.group(3)))
        if alts:
            out.append(alts)
    return out


def module_package_driver(depends: str, branch: str) -> Optional[str]:
    """The driver (upstream) version a linux-modules-nvidia package was built for: its
    ``nvidia-kernel-common-<b>[-server] (>= <driver>)`` dependency."""
    for group in parse_depends(depends):
        for name, op, version in group:
            if name in ('nvidia-kernel-common-%s-server' % branch, 'nvidia-kernel-common-%s' % branch) \
                    and op == '>=' and version:
                return pk.upstream_version(version)
    return None


def module_versions(records: Sequence[Dict[str, str]], package: str, branch: str) -> Dict[str, Optional[str]]:
    """{package version: driver version} of every record of `package`."""
    return {r['Version']: module_package_driver(r.get('Depends', ''), branch) for r in records if r['Package'] == package}


# --------------------------------------------------------------------------------------------
# The node: which module source the installed packages use, DKMS builds
# --------------------------------------------------------------------------------------------

def installed_module_source(installed: Dict[str, str]) -> Dict[str, List[str]]:
    """Installed packages that belong to each module source."""
    dkms = sorted(n for n in installed if n.startswith('nvidia-dkms-'))
    prebuilt = sorted(n for n in installed if n.startswith('linux-modules-nvidia-') or n.startswith('nvidia-headless-no-dkms-'))
    return {'dkms': dkms, 'prebuilt': prebuilt}


def check_source_matches(source: str, installed: Dict[str, str]) -> None:
    """KernelError when the installed packages use the other module source."""
    found = installed_module_source(installed)
    other = 'prebuilt' if source == 'dkms' else 'dkms'
    if found[other]:
        how = 'build the NVIDIA modules with DKMS' if other == 'dkms' else "are Canonical's prebuilt NVIDIA modules"
        raise KernelError('module_source=%s does not match the installed packages: %s %s; use module_source=%s '
                          '(switching module source is not done by this module), nothing was changed'
                          % (source, ', '.join('%s %s' % (n, installed[n]) for n in found[other]), how, other))


def dkms_builds(path_of, driver: Optional[str] = None) -> Dict[str, List[str]]:
    """{driver version: [kernel releases]} with a built nvidia module in DKMS's tree
    (``/var/lib/dkms/nvidia/<driver>/<k>/<arch>/module/nvidia.ko*``)."""
    top = path_of(DKMS_TREE)
    out: Dict[str, List[str]] = {}
    if not os.path.isdir(top):
        return out
    for ver in sorted(os.listdir(top)):
        if driver and ver != driver:
            continue
        vdir = os.path.join(top, ver)
        if not os.path.isdir(vdir) or os.path.islink(vdir):
            continue
        for k in sorted(os.listdir(vdir)):
            kdir = os.path.join(vdir, k)
            if not os.path.isdir(kdir) or k == 'source' or k == 'build':
                continue
            for arch in os.listdir(kdir):
                mod = os.path.join(kdir, arch, 'module')
                if os.path.isdir(mod) and any(f.startswith('nvidia.ko') for f in os.listdir(mod)):
                    out.setdefault(ver, []).append(k)
                    break
    return out


def has_dkms_build(path_of, driver: str, kernel: str) -> bool:
    return kernel in dkms_builds(path_of, driver).get(driver, [])


# --------------------------------------------------------------------------------------------
# Planning (read only)
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class KernelRequest:
    kernel: str
    branch: str
    driver_version: str
    module_source: str
    previous_kernel: Optional[str] = None
    previous_driver_version: Optional[str] = None
    check_way_back: bool = True

    def validate(self, release: Any = None) -> None:
        """KernelError naming the field and value; `release` parses a kernel release of the node's
        family (ubuntu_release by default, rpm_release on the RHEL family)."""
        parse = release or ubuntu_release
        parse(self.kernel)
        pk.check_branch(self.branch)
        check_driver_version(self.driver_version, self.branch)
        check_module_source(self.module_source)
        if self.previous_kernel:
            parse(self.previous_kernel, 'previous_kernel')
        if self.previous_driver_version:
            check_driver_version(self.previous_driver_version, self.branch, 'previous_driver_version')


@dataclasses.dataclass
class Availability:
    """What the repositories offer for the request: exact versions, or what is missing."""
    kernel_version: Optional[str]
    resolved: Dict[str, str]
    skipped: List[str]
    missing: List[str]
    module_versions: Dict[str, Optional[str]]


def _offered(policy: Dict[str, pk.PolicyEntry], name: str) -> List[str]:
    e = policy.get(name)
    return sorted(e.downloadable(), key=pk._deb_key, reverse=True) if e else []


def check_availability(kset: AptKernelSet, req: KernelRequest, policy: Dict[str, pk.PolicyEntry],
                       shows: Sequence[Dict[str, str]], installed: Dict[str, str],
                       kernel_version: Optional[str] = None) -> Availability:
    """Exact versions of the kernel packages (all at the image's version) and of the NVIDIA module
    package built for the driver; every missing one named."""
    missing: List[str] = []
    resolved: Dict[str, str] = {}
    skipped: List[str] = []
    image = kset.image[0]
    offered = _offered(policy, image)
    inst = installed.get(image)
    if kernel_version:
        kv = kernel_version if kernel_version in offered or inst == kernel_version else None
    elif inst is not None:
        kv = inst
    else:
        kv = offered[0] if offered else None
    if kv is None:
        wanted = ' ' + kernel_version if kernel_version else ''
        missing.append('%s%s (offered: %s)' % (image, wanted, ', '.join(offered) or 'none'))
    else:
        for name in kset.image + kset.optional + kset.headers:
            vs = _offered(policy, name)
            if kv in vs or installed.get(name) == kv:
                resolved[name] = kv
            elif name in kset.optional and not vs and name not in installed:
                skipped.append(name)
            else:
                missing.append('%s %s (offered: %s)' % (name, kv, ', '.join(vs) or 'none'))
    mv: Dict[str, Optional[str]] = {}
    if kset.nvidia_module:
        name = kset.nvidia_module
        vs = set(_offered(policy, name))
        mv = {v: d for v, d in module_versions(shows, name, req.branch).items() if v in vs or installed.get(name) == v}
        fits = sorted((v for v, d in mv.items() if d == req.driver_version), key=pk._deb_key, reverse=True)
        if installed.get(name) in fits:
            resolved[name] = installed[name]
        elif fits:
            resolved[name] = fits[0]
        else:
            builds = sorted(mv.items(), key=lambda x: pk._deb_key(x[0]), reverse=True)
            listed = ', '.join('%s for driver %s' % (v, d or 'unknown') for v, d in builds)
            missing.append('%s for driver %s (offered: %s)' % (name, req.driver_version, listed or 'none'))
    return Availability(kv, resolved, skipped, missing, mv)


@dataclasses.dataclass
class WayBack:
    previous_kernel: Optional[str]
    previous_driver_version: Optional[str]
    ok: bool
    problems: List[str]
    modules_on_node: Optional[bool]
    reinstallable: Optional[bool]

    def as_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self)


def check_way_back(req: KernelRequest, policy: Dict[str, pk.PolicyEntry], shows: Sequence[Dict[str, str]],
                   installed: Dict[str, str], path_of) -> WayBack:
    """The previous driver has modules for the previous kernel on the node, and the rollback can
    put them back from the repositories (the driver's packages at that version are offered)."""
    pkern, pdrv = req.previous_kernel, req.previous_driver_version
    if not pkern or not pdrv:
        return WayBack(pkern, pdrv, True, [], None, None)
    problems: List[str] = []
    # Once the driver moved (a rerun after the transaction), the previous driver's modules are no
    # longer on the node by design; what counts then is that the rollback can reinstall them.
    moved = installed_driver(installed, req.branch) == req.driver_version != pdrv
    if 'linux-image-%s' % pkern not in installed:
        problems.append('the previous kernel %s is not installed (no linux-image-%s)' % (pkern, pkern))
    b = req.branch
    if req.module_source == 'prebuilt':
        name = nvidia_module_package(b, pkern)
        mv = module_versions(shows, name, b)
        on_node = name in installed and mv.get(installed[name]) == pdrv
        if not on_node and not moved:
            problems.append('%s for driver %s is not installed (installed: %s)' % (
                name, pdrv, '%s for driver %s' % (installed[name], mv.get(installed[name]) or 'unknown')
                if name in installed else 'none'))
        offered = set(_offered(policy, name))
        again = [v for v, d in mv.items() if d == pdrv and v in offered]
        if not again:
            problems.append('the repositories do not offer %s for driver %s, so a rollback could not reinstall it'
                            % (name, pdrv))
        dkms_name = None
    else:
        on_node = has_dkms_build(path_of, pdrv, pkern)
        if not on_node and not moved:
            problems.append('DKMS has no nvidia %s module built for %s (no %s/%s/%s/<arch>/module/nvidia.ko*)'
                            % (pdrv, pkern, '/' + DKMS_TREE, pdrv, pkern))
        hdr = 'linux-headers-%s' % pkern
        if hdr not in installed:
            problems.append('%s is not installed, so DKMS could not rebuild the previous driver for it' % hdr)
        dkms_name = 'nvidia-dkms-%s-server' % b
        again = [v for v in _offered(policy, dkms_name) if pk.version_matches(v, pdrv)]
        if not again:
            problems.append('the repositories do not offer %s %s, so a rollback could not reinstall it' % (dkms_name, pdrv))
    return WayBack(pkern, pdrv, not problems, problems, on_node, bool(again))


# --------------------------------------------------------------------------------------------
# Pins, holds, protection
# --------------------------------------------------------------------------------------------

def render_kernel_pins(pins: Dict[str, str], priority: int = pk.PIN_PRIORITY) -> Optional[str]:
    if not pins:
        return None
    by_version: Dict[str, List[str]] = {}
    for name, version in pins.items():
        by_version.setdefault(version, []).append(name)
    return '\n'.join('Explanation: managed by gpufleet.upgrade.kernel_packages; exact kernel version\n'
                     'Package: %s\nPin: version %s\nPin-Priority: %d\n' % (' '.join(sorted(ns)), v, priority)
                     for v, ns in sorted(by_version.items()))


def previous_kernel_packages(kernel: str, branch: str, installed: Dict[str, str]) -> List[str]:
    """The installed packages of the previous kernel and its NVIDIA modules, to keep installed."""
    names = ['linux-image-%s' % kernel, 'linux-modules-%s' % kernel, 'linux-modules-extra-%s' % kernel,
             'linux-headers-%s' % kernel, nvidia_module_package(branch, kernel)]
    return [n for n in names if n in installed]


def parse_protect(text: Optional[str], path: str) -> Dict[str, object]:
    if text is None:
        return {}
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise KernelError('%s is not the JSON record this module writes (%s); remove it or fix it' % (path, e))
    if not isinstance(doc, dict) or not isinstance(doc.get('marked_manual', []), list):
        raise KernelError('%s is not the JSON record this module writes (expected an object with marked_manual)' % path)
    return doc


def render_protect(kernel: str, previous: Optional[str], previous_driver: Optional[str], marked: Sequence[str],
                   protected: Sequence[str]) -> str:
    return json.dumps({'kernel': kernel, 'previous_kernel': previous, 'previous_driver_version': previous_driver,
                       'protected': sorted(protected), 'marked_manual': sorted(marked)}, indent=2, sort_keys=True) + '\n'


@dataclasses.dataclass
class KernelPlan:
    request: KernelRequest
    availability: Availability
    way_back: WayBack
    driver: pk.PinPlan
    install: Dict[str, str]
    kernel_pins_before: Optional[str]
    kernel_pins_after: Optional[str]
    holds_before: List[str]
    holds_after: List[str]
    protect: List[str]            # previous kernel packages to mark manual (auto now)
    protected: List[str]          # previous kernel packages kept (manual after)
    protect_before: Optional[str]
    protect_after: Optional[str]
    removed: List[str] = dataclasses.field(default_factory=list)

    @property
    def changed(self) -> bool:
        return (bool(self.install) or self.kernel_pins_before != self.kernel_pins_after
                or self.driver.before.pin_text != self.driver.after.pin_text
                or sorted(self.holds_before) != sorted(self.holds_after) or bool(self.protect)
                or self.protect_before != self.protect_after)

    def diff(self) -> List[Dict[str, str]]:
        d = self.driver
        before_inst = dict(d.before.installed)
        after_inst = dict(before_inst)
        after_inst.update(self.install)
        out = [
            {'before_header': d.before.pin_file, 'after_header': d.after.pin_file,
             'before': d.before.pin_text or '', 'after': d.after.pin_text or ''},
            {'before_header': KERNEL_PIN_FILE, 'after_header': KERNEL_PIN_FILE,
             'before': self.kernel_pins_before or '', 'after': self.kernel_pins_after or ''},
            {'before_header': 'holds', 'after_header': 'holds',
             'before': ''.join(h + '\n' for h in sorted(self.holds_before)),
             'after': ''.join(h + '\n' for h in sorted(self.holds_after))},
            {'before_header': PROTECT_FILE, 'after_header': PROTECT_FILE,
             'before': self.protect_before or '', 'after': self.protect_after or ''},
        ]
        if self.install:
            out.append({'before_header': 'installed versions', 'after_header': 'installed versions',
                        'before': ''.join('%s=%s\n' % kv for kv in sorted(before_inst.items()) if kv[0] in self.install),
                        'after': ''.join('%s=%s\n' % kv for kv in sorted(after_inst.items()) if kv[0] in self.install)})
        return out


def refuse(avail: Availability, way_back: WayBack, req: KernelRequest) -> None:
    problems = []
    if avail.missing:
        problems.append('the repositories do not offer %s' % '; '.join(avail.missing))
    if not way_back.ok:
        problems.append('no way back to kernel %s with driver %s: %s' % (
            way_back.previous_kernel, way_back.previous_driver_version, '; '.join(way_back.problems)))
    if problems:
        raise KernelError('kernel %s with driver %s (module_source=%s) cannot be installed, nothing was changed: %s'
                          % (req.kernel, req.driver_version, req.module_source, ' / '.join(problems)))


class AptKernel:
    """Reads and changes a node through `_packages.AptBackend` (install roots honoured)."""

    name = 'apt'

    def __init__(self, backend: pk.AptBackend) -> None:
        self.backend = backend
        self.runner = backend.runner

    def path_of(self, rel: str) -> str:
        return self.runner.path(rel)

    def installed(self) -> Dict[str, str]:
        return {n: e.version for n, e in self.backend.dpkg_entries().items() if e.installed}

    def holds(self) -> List[str]:
        return sorted(n for n, e in self.backend.dpkg_entries().items() if e.want == 'hold')

    def auto(self) -> List[str]:
        r = self.runner(['apt-mark', 'showauto'], env=self.backend.env())
        return pk.parse_showhold(r.stdout)

    def show(self, names: Sequence[str]) -> List[Dict[str, str]]:
        if not names:
            return []
        r = self.runner(['apt-cache', 'show'] + list(names), env=self.backend.env(), ok_rcs=(0, 100))
        return parse_show(r.stdout)

    def read(self, rel: str) -> Optional[str]:
        return _fsio.read_text(self.path_of(rel))


def installed_driver(installed: Dict[str, str], branch: str) -> Optional[str]:
    """The upstream version of the installed nvidia-kernel-common of the branch, or None."""
    for name in ('nvidia-kernel-common-%s-server' % branch, 'nvidia-kernel-common-%s' % branch):
        if name in installed:
            return pk.upstream_version(installed[name])
    return None


def previous_from_installed(req: KernelRequest, installed: Dict[str, str], running: Optional[str],
                            record: Optional[Dict[str, object]] = None) -> KernelRequest:
    """Fill in the previous kernel and driver when not given: from the protection record of an
    earlier run for the same target kernel (a rerun, also after the trial boot), else the running
    kernel and the installed nvidia-kernel-common's upstream version."""
    rec = record if record and record.get('kernel') == req.kernel else {}
    prev_k = req.previous_kernel or rec.get('previous_kernel') or (running if running and running != req.kernel else None)
    prev_d = req.previous_driver_version or rec.get('previous_driver_version') or installed_driver(installed, req.branch)
    return dataclasses.replace(req, previous_kernel=prev_k, previous_driver_version=prev_d)  # type: ignore[arg-type]


Inspection = Tuple[KernelRequest, AptKernelSet, Availability, WayBack, Dict[str, str]]


def inspect(node: AptKernel, req: KernelRequest, running: Optional[str]) -> Inspection:
    """Read-only preflight: availability and the way back. Raises nothing for missing packages."""
    req.validate()
    installed = node.installed()
    check_source_matches(req.module_source, installed)
    req = previous_from_installed(req, installed, running, parse_protect(node.read(PROTECT_FILE), PROTECT_FILE))
    kset = apt_kernel_set(req.kernel, req.branch, req.module_source)
    names = list(kset.names)
    module_names = [kset.nvidia_module] if kset.nvidia_module else []
    if req.previous_kernel:
        if req.module_source == 'prebuilt':
            module_names.append(nvidia_module_package(req.branch, req.previous_kernel))
        else:
            names.append('nvidia-dkms-%s-server' % req.branch)
        names += [n for n in module_names if n not in names]
    policy = node.backend.available(names)
    shows = node.show([n for n in module_names if n in policy and policy[n].versions])
    avail = check_availability(kset, req, policy, shows, installed)
    if req.check_way_back:
        way = check_way_back(req, policy, shows, installed, node.path_of)
    else:
        way = WayBack(req.previous_kernel, req.previous_driver_version, True, [], None, None)
    return req, kset, avail, way, installed


def plan(node: AptKernel, req: KernelRequest, running: Optional[str]) -> KernelPlan:
    """Everything the transaction will do, read only; KernelError (nothing changed) on missing packages."""
    req, kset, avail, way, installed = inspect(node, req, running)
    refuse(avail, way, req)
    pkgs = pk.preset_packages(SOURCE_PRESET[req.module_source], req.branch)
    driver = pk.plan_pin(node.backend, pkgs, req.driver_version, 'pinned', install=True)
    install = dict(driver.install)
    # The kernel part: every resolved package not installed at that version.
    for name, v in avail.resolved.items():
        if installed.get(name) != v:
            install[name] = v
    # Other installed kernels' prebuilt NVIDIA modules must follow the driver (their Depends pin
    # nvidia-kernel-common); keep them at the version for the target driver where offered.
    removed: List[str] = []
    if req.module_source == 'prebuilt' and driver.install:
        prefix = 'linux-modules-nvidia-%s-server-' % req.branch
        others = [n for n in installed if n.startswith(prefix) and n != kset.nvidia_module
                  and _UBUNTU_RELEASE.match(n[len(prefix):])]
        if others:
            policy = node.backend.available(others)
            for rec_name in others:
                mv = module_versions(node.show([rec_name]), rec_name, req.branch)
                offered = set(_offered(policy, rec_name))
                fits = sorted((v for v, d in mv.items() if d == req.driver_version and v in offered),
                              key=pk._deb_key, reverse=True)
                if fits:
                    if installed[rec_name] != fits[0]:
                        install[rec_name] = fits[0]
                else:
                    removed.append(rec_name)
    if not install:
        install = {}
    elif driver.install:
        # Name every installed member of the driver set so apt keeps them equal (as driver_pin does).
        install.update({n: v for n, v in driver.resolved.items() if n in installed and n not in install})
    holds_before = node.holds()
    kernel_pins = dict(avail.resolved)
    before_pins_text = node.read('etc/apt/preferences.d/' + KERNEL_PIN_FILE)
    pins = {n: v for n, v in pk.parse_preferences(before_pins_text).items()
            if not n.startswith(('linux-image-', 'linux-modules-', 'linux-headers-'))}
    pins.update(kernel_pins)
    installed_after = dict(installed)
    installed_after.update(install)
    meta = [n for n in kernel_meta_packages(req.kernel, req.branch) if n in installed]
    holds_after = sorted(set(holds_before) | set(driver.after.holds) | set(kernel_pins) | set(meta))
    holds_after = [h for h in holds_after if h in installed_after and h not in removed]
    # Protection of the previous kernel from autoremove (apt-mark manual), recorded for release.
    protect_text = node.read(PROTECT_FILE)
    record = parse_protect(protect_text, PROTECT_FILE)
    protected: List[str] = []
    protect: List[str] = []
    if req.previous_kernel:
        protected = [n for n in previous_kernel_packages(req.previous_kernel, req.branch, installed) if n not in removed]
        auto = set(node.auto())
        protect = [n for n in protected if n in auto]
    marked = set(protect)
    if record.get('previous_kernel') == req.previous_kernel:
        marked |= set(record.get('marked_manual', []))  # type: ignore[arg-type]
    protect_after = protect_text
    if req.previous_kernel:
        protect_after = render_protect(req.kernel, req.previous_kernel, req.previous_driver_version, sorted(marked), protected)
    return KernelPlan(req, avail, way, driver, install, before_pins_text, render_kernel_pins(pins),
                      holds_before, holds_after, protect, protected, protect_text, protect_after, removed)


def apply(node: AptKernel, p: KernelPlan) -> Dict[str, str]:
    """One apt transaction for kernel and driver; pins and holds put back when it fails."""
    b = node.backend
    kpath = node.path_of('etc/apt/preferences.d/' + KERNEL_PIN_FILE)
    b.check_dpkg()
    holds_now = node.holds()
    try:
        if p.driver.before.pin_text != p.driver.after.pin_text:
            b.write_pins(p.driver.after.pin_text)
        if p.kernel_pins_before != p.kernel_pins_after:
            _fsio.write_text(kpath, p.kernel_pins_after, 0o644)
        if p.install:
            b.install(p.install)
        held = node.holds()
        b.set_holds([h for h in p.holds_after if h not in held], [h for h in held if h not in p.holds_after])
    except pk.PackageError:
        b.write_pins(p.driver.before.pin_text)
        _fsio.write_text(kpath, p.kernel_pins_before, 0o644)
        now = node.holds()
        b.set_holds([h for h in holds_now if h not in now], [h for h in now if h not in holds_now])
        raise
    if p.protect:
        b.write(['apt-mark', 'manual'] + sorted(p.protect))
    if p.protect_after != p.protect_before:
        _fsio.write_text(node.path_of(PROTECT_FILE), p.protect_after, 0o644)
    installed = node.installed()
    wrong = ['%s is %s, expected %s' % (n, installed.get(n, 'not installed'), v)
             for n, v in p.install.items() if installed.get(n) != v]
    if wrong:
        raise KernelError('the package transaction finished but: %s' % '; '.join(wrong))
    return installed


def check_dkms(node: AptKernel, req: KernelRequest) -> None:
    """With module_source=dkms, the transaction only counts when DKMS built the module for the kernel."""
    if req.module_source == 'dkms' and not has_dkms_build(node.path_of, req.driver_version, req.kernel):
        raise KernelError('the packages are installed but DKMS has not built nvidia %s for kernel %s (no %s/%s/%s/'
                          '<arch>/module/nvidia.ko*); see /var/lib/dkms/nvidia/%s/build/make.log; do not boot %s'
                          % (req.driver_version, req.kernel, '/' + DKMS_TREE, req.driver_version, req.kernel,
                             req.driver_version, req.kernel))


@dataclasses.dataclass
class ReleasePlan:
    record_before: Optional[str]
    unmark: List[str]

    @property
    def changed(self) -> bool:
        return self.record_before is not None


def plan_release(node: AptKernel) -> ReleasePlan:
    """Past the rollback boundary: the previous kernel's packages go back to automatic (so a later
    autoremove may take them), as they were before the protection."""
    text = node.read(PROTECT_FILE)
    rec = parse_protect(text, PROTECT_FILE)
    installed = node.installed()
    return ReleasePlan(text, sorted(n for n in rec.get('marked_manual', []) if n in installed))


def apply_release(node: AptKernel, p: ReleasePlan) -> None:
    if p.unmark:
        node.backend.write(['apt-mark', 'auto'] + p.unmark)
    _fsio.write_text(node.path_of(PROTECT_FILE), None)


# --------------------------------------------------------------------------------------------
# The NVIDIA module for a kernel (trial boot gate) and /proc/driver/nvidia/version
# --------------------------------------------------------------------------------------------

def nvidia_module_present(node: AptKernel, kernel: str, branch: str, source: str, driver: Optional[str],
                          installed: Dict[str, str]) -> Optional[str]:
    """None when kernel <k> has the NVIDIA module for `driver`; else what is missing."""
    if source == 'prebuilt':
        name = nvidia_module_package(branch, kernel)
        if name not in installed:
            return '%s is not installed' % name
        if driver:
            got = module_versions(node.show([name]), name, branch).get(installed[name])
            if got != driver:
                return '%s %s carries driver %s, not %s' % (name, installed[name], got or 'unknown', driver)
        return None
    builds = dkms_builds(node.path_of, driver)
    if not any(kernel in ks for ks in builds.values()):
        return 'DKMS has no nvidia%s module built for %s (no %s/%s/%s/<arch>/module/nvidia.ko*)' % (
            ' ' + driver if driver else '', kernel, '/' + DKMS_TREE, driver or '<driver>', kernel)
    return None


_NVRM = re.compile(r'NVRM version:.*?\s(\d{3}\.\d+(?:\.\d+)?)\s')
_KREL = re.compile(r'\b(\d+\.\d+\.\d+-\d+[-.][0-9A-Za-z._-]*[0-9A-Za-z])\b')


def parse_nvidia_version(text: Optional[str]) -> Dict[str, Any]:
    """Driver version and, when the file names one, the kernel release the module was built for."""
    if not text:
        return {'driver_version': None, 'build_kernel': None, 'open': None}
    m = _NVRM.search(text)
    build = None
    for line in text.splitlines():
        if line.startswith('GCC version'):
            continue
        k = _KREL.search(line.split('NVRM version:', 1)[-1]) if 'NVRM' in line else None
        if k and not _DRIVER_VERSION.match(k.group(1)):
            build = k.group(1)
    return {'driver_version': m.group(1) if m else None, 'build_kernel': build, 'open': 'Open Kernel Module' in text}


def driver_problem(node: AptKernel, req: KernelRequest, installed: Dict[str, str]) -> Optional[str]:
    """None when the repositories offer the driver user space of the module source at the version."""
    pkgs = pk.preset_packages(SOURCE_PRESET[req.module_source], req.branch)
    try:
        pk.resolve(pkgs, req.driver_version, node.backend.available(list(pkgs.names)), installed, True)
    except pk.PackageError as e:
        return str(e)
    return None


# --------------------------------------------------------------------------------------------
# Which package manager: apt (Ubuntu/Debian) or dnf (RHEL family)
# --------------------------------------------------------------------------------------------

KERNEL_BACKENDS = ('apt', 'dnf')
RHEL_FAMILY = frozenset(('rhel', 'centos', 'rocky', 'almalinux', 'ol', 'fedora'))
DEBIAN_FAMILY = frozenset(('debian', 'ubuntu'))


def kernel_backend(os_release: Dict[str, str], has_apt: bool, has_dnf: bool) -> str:
    """'apt' or 'dnf' for the managed system: its os-release (ID, ID_LIKE) decides; without one
    (an install root that has none) the tools on the node do, apt first."""
    ids = {os_release.get('ID', '')} | set(os_release.get('ID_LIKE', '').split())
    name = os_release.get('PRETTY_NAME') or os_release.get('ID') or 'unknown'
    if ids & RHEL_FAMILY:
        if not has_dnf:
            raise KernelError('the managed system is %s (RHEL family) but this node has no dnf' % name)
        return 'dnf'
    if ids & DEBIAN_FAMILY:
        if not has_apt:
            raise KernelError('the managed system is %s (Ubuntu/Debian) but this node has no apt-get/dpkg-query' % name)
        return 'apt'
    if has_apt:
        return 'apt'
    if has_dnf:
        return 'dnf'
    raise KernelError('the managed system (os-release ID %r) has neither apt-get/dpkg-query nor dnf' % (
        os_release.get('ID') or 'none',))


def managed_backend(runner: pk.Runner, which: Optional[Callable[[str], Optional[str]]] = None) -> str:
    """`kernel_backend` for the system the runner manages: its os-release (under the install root)
    and the tools on this node (`which`, default shutil.which). KernelError as there."""
    which = which or shutil.which
    return kernel_backend(pk.read_os_release(runner), bool(which('apt-get') and which('dpkg-query')),
                          bool(which('dnf') and which('rpm')))


# --------------------------------------------------------------------------------------------
# RHEL family (dnf): one dnf transaction, versionlock, the previous kernel locked until released
# --------------------------------------------------------------------------------------------

DNF_DRIVER_PRESET = 'rhel-dnf'
VERSIONLOCK_CONF = pk.VERSIONLOCK_CONF
# dnf removes the oldest installonly package (kernel, kernel-core, ...) once `installonly_limit` of them are
# installed, whatever is versionlocked (the lock only filters what dnf may install; the install runs with the
# plugin disabled anyway). 0 is unlimited: the transaction that brings kernel <k> keeps the previous kernel.
DNF_KEEP_INSTALLONLY = '--setopt=installonly_limit=0'
_ARCHES = ('x86_64', 'aarch64', 'ppc64le', 's390x', 'noarch', 'i686')
_LOCK_ENTRY = re.compile(r'^(?P<name>.+)-(?:(?P<epoch>\d+):)?(?P<version>[^-:]+)-(?P<release>[^-]+?)'
                         r'(?:\.(?:\*|%s))?$' % '|'.join(_ARCHES))


def validate_rpm_request(req: KernelRequest) -> None:
    """KernelError naming the field and value for a request the RHEL family cannot have."""
    req.validate(rpm_release)


def _no_epoch(evr: str) -> str:
    return evr.split(':', 1)[1] if ':' in evr else evr


def lock_key(entry: str) -> Optional[str]:
    """A versionlock.list line (``kernel-0:5.14.0-427.13.1.el9_4.*``) as ``name-version-release``
    (the epoch dropped, as in the specs this module passes to dnf), or None for an exclude (``!``)
    or a line this module does not read."""
    m = _LOCK_ENTRY.match(entry.strip())
    if not m or entry.strip().startswith('!'):
        return None
    return '%s-%s-%s' % (m.group('name'), m.group('version'), m.group('release'))


def parse_locks(text: Optional[str]) -> List[str]:
    """The entries of versionlock.list (comments and blank lines dropped), as written."""
    return [ln.strip() for ln in (text or '').splitlines() if ln.strip() and not ln.strip().startswith('#')]


def parse_rpm_multi(out: str) -> Dict[str, List[str]]:
    """`rpm -qa --qf '%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\n'` -> {name: [evr, ...]} (kernels
    are installed side by side; epoch 0 dropped)."""
    res: Dict[str, List[str]] = {}
    for line in out.splitlines():
        parts = line.split('\t')
        if len(parts) == 2:
            res.setdefault(parts[0], []).append(parts[1][2:] if parts[1].startswith('0:') else parts[1])
    return {n: sorted(v) for n, v in res.items()}


def pick_evr(candidates: Sequence[str], wanted: str) -> Optional[str]:
    """The candidate [epoch:]version-release that is `wanted` (a version-release, or a version)."""
    for v in sorted(candidates, reverse=True):
        ne = _no_epoch(v)
        if ne == wanted or ne.startswith(wanted + '-'):
            return v
    return None


def dnf_target_set(req: KernelRequest) -> Dict[str, str]:
    """name -> wanted version of the one transaction: the kernel set of `dnf_kernel_set` and the
    driver user space of the `rhel-dnf` preset (its required members) at the driver version."""
    out = dnf_kernel_set(req.kernel, req.driver_version, req.module_source)
    for name in pk.preset_packages(DNF_DRIVER_PRESET, req.branch).required:
        out[name] = req.driver_version
    return out


def dnf_installonly(name: str) -> bool:
    """Packages dnf installs side by side (one per kernel): kept when another version comes."""
    return name.startswith('kernel') or (name.startswith('kmod-nvidia') and not name.endswith('-dkms'))


def dnf_previous_packages(prev_kernel: str, prev_driver: Optional[str], source: str,
                          installed: Dict[str, List[str]]) -> Dict[str, str]:
    """The installed packages of the previous kernel and its NVIDIA modules (name -> evr) to keep."""
    r = rpm_release(prev_kernel, 'previous_kernel')
    out: Dict[str, str] = {}
    for name in ('kernel', 'kernel-core', 'kernel-modules', 'kernel-modules-core', 'kernel-devel'):
        if r.evr in installed.get(name, []):
            out[name] = r.evr
    if source == 'prebuilt':
        prefix = 'kmod-nvidia-open-'
        suffix = '-%s-%s' % (r.version, r.rel_no_dist)
        for name, evrs in installed.items():
            if name.startswith(prefix) and name.endswith(suffix) and (
                    not prev_driver or name == '%s%s%s' % (prefix, prev_driver, suffix)):
                out[name] = evrs[-1]
    return out


class DnfKernel:
    """Reads and changes a RHEL-family node through dnf and rpm (install roots honoured: the
    plugins' configuration, hence the versionlock list, is read under the root)."""

    name = 'dnf'

    def __init__(self, runner: pk.Runner) -> None:
        self.runner = runner
        self.os_release = pk.read_os_release(runner)

    @property
    def backend(self) -> 'DnfKernel':
        """What `_host_module.HostTask` closes and reports the commands of (as AptKernel.backend)."""
        return self

    def path_of(self, rel: str) -> str:
        return self.runner.path(rel)

    def env(self) -> Dict[str, str]:
        return {'LC_ALL': 'C', 'LANG': 'C'}

    def close(self) -> None:
        pass

    def base(self) -> List[str]:
        root = self.runner.installroot
        argv = pk.dnf_base(root)
        if root:
            major = self.os_release.get('VERSION_ID', '').split('.')[0]
            if major:
                argv.append('--releasever=%s' % major)
        return argv

    def lock_path(self) -> str:
        """The versionlock list the plugin uses (its configuration's `locklist`, required here), which
        must be under the install root when there is one (`_packages.versionlock_list_path`)."""
        return pk.versionlock_list_path(self.runner, error=KernelError)

    def read_locks(self) -> Tuple[str, Optional[str]]:
        path = self.lock_path()
        return path, _fsio.read_text(path)

    def installed(self) -> Dict[str, List[str]]:
        root = ['--root=%s' % self.runner.installroot] if self.runner.installroot else []
        r = self.runner(['rpm'] + root + ['-qa', '--qf', '%{NAME}\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\n'], env=self.env())
        return parse_rpm_multi(r.stdout)

    def offered(self, names: Sequence[str]) -> Dict[str, List[str]]:
        """What the repositories offer, whatever is locked (the lock is this module's to manage)."""
        if not names:
            return {}
        r = self.runner(self.base() + ['--disableplugin=versionlock', 'list', '--showduplicates', '--available']
                        + list(names), env=self.env(), ok_rcs=(0, 1))
        return pk.parse_dnf_list(r.stdout)

    def update_cache(self, max_age: int = 0, now: Optional[float] = None) -> bool:  # pylint: disable=unused-argument
        self.runner(self.base() + pk.dnf_expire(max_age) + ['makecache'], env=self.env())
        return True

    def read(self, rel: str) -> Optional[str]:
        return _fsio.read_text(self.path_of(rel))


def _installed_driver_rpm(installed: Dict[str, List[str]]) -> Optional[str]:
    evrs = installed.get('nvidia-driver')
    return pk.upstream_version(evrs[-1]) if evrs else None


@dataclasses.dataclass
class DnfPlan:
    request: KernelRequest
    packages: Dict[str, str]          # the resolved target set: name -> [epoch:]version-release
    skipped: List[str]
    missing: List[str]
    way_back: WayBack
    install: Dict[str, str]           # not installed at that version yet
    lock_path: str
    lock_before: Optional[str]
    lock_add: List[str]               # name-evr specs for `dnf versionlock add`
    lock_delete: List[str]            # stale entries of single-version packages of the set
    protected: Dict[str, str]         # the previous kernel's packages kept (locked)
    protect_before: Optional[str]
    protect_after: Optional[str]

    @property
    def changed(self) -> bool:
        return bool(self.install or self.lock_add or self.lock_delete) or self.protect_before != self.protect_after

    def locks_after(self) -> List[str]:
        keep = [e for e in parse_locks(self.lock_before) if e not in self.lock_delete]
        return keep + [plugin_lock_entry(s) for s in self.lock_add]

    def diff(self) -> List[Dict[str, str]]:
        def lines(xs: Sequence[str]) -> str:
            return ''.join(x + '\n' for x in sorted(xs))
        out = [{'before_header': self.lock_path, 'after_header': self.lock_path,
                'before': lines(parse_locks(self.lock_before)), 'after': lines(self.locks_after())},
               {'before_header': PROTECT_FILE, 'after_header': PROTECT_FILE,
                'before': self.protect_before or '', 'after': self.protect_after or ''}]
        if self.install:
            out.append({'before_header': 'installed versions', 'after_header': 'installed versions', 'before': '',
                        'after': ''.join('%s-%s\n' % kv for kv in sorted(self.install.items()))})
        return out


def plugin_lock_entry(spec: str) -> str:
    """The line `dnf versionlock add <name-version-release>` writes: ``name-epoch:version-release.*``."""
    name, evr = spec_split(spec)
    return '%s-%s.*' % (name, evr if ':' in evr else '0:' + evr)


def spec_split(spec: str) -> Tuple[str, str]:
    """'kernel-5.14.0-427.16.1.el9_4' -> ('kernel', '5.14.0-427.16.1.el9_4')."""
    name, version, release = spec.rsplit('-', 2)
    return name, '%s-%s' % (version, release)


def dnf_check_way_back(req: KernelRequest, offered: Dict[str, List[str]], installed: Dict[str, List[str]],
                       path_of) -> WayBack:
    """The previous kernel is installed with the previous driver's modules for it, and the
    repositories offer those modules again (a rollback can reinstall them)."""
    pkern, pdrv = req.previous_kernel, req.previous_driver_version
    if not pkern or not pdrv:
        return WayBack(pkern, pdrv, True, [], None, None)
    r = rpm_release(pkern, 'previous_kernel')
    problems: List[str] = []
    moved = _installed_driver_rpm(installed) == req.driver_version != pdrv
    if r.evr not in installed.get('kernel-core', []):
        problems.append('the previous kernel %s is not installed (no kernel-core-%s)' % (pkern, r.evr))
    if req.module_source == 'prebuilt':
        kmod = [n for n in dnf_kernel_set(pkern, pdrv, 'prebuilt') if n.startswith('kmod-')][0]
        on_node = kmod in installed
        if not on_node and not moved:
            problems.append('%s is not installed' % kmod)
        again = pick_evr(offered.get(kmod, []), pdrv)
        if not again:
            problems.append('the repositories do not offer %s, so a rollback could not reinstall it' % kmod)
    else:
        on_node = has_dkms_build(path_of, pdrv, pkern)
        if not on_node and not moved:
            problems.append('DKMS has no nvidia %s module built for %s (no %s/%s/%s/<arch>/module/nvidia.ko*)'
                            % (pdrv, pkern, '/' + DKMS_TREE, pdrv, pkern))
        if r.evr not in installed.get('kernel-devel', []):
            problems.append('kernel-devel-%s is not installed, so DKMS could not rebuild the previous driver for it' % r.evr)
        again = pick_evr(offered.get('kmod-nvidia-open-dkms', []), pdrv)
        if not again:
            problems.append('the repositories do not offer kmod-nvidia-open-dkms %s, so a rollback could not reinstall it'
                            % pdrv)
    return WayBack(pkern, pdrv, not problems, problems, on_node, bool(again))


DnfInspection = Tuple[KernelRequest, Dict[str, str], List[str], List[str], WayBack, Dict[str, List[str]]]


def dnf_inspect(node: DnfKernel, req: KernelRequest, running: Optional[str]) -> DnfInspection:
    """Read-only preflight on the RHEL family: (request with the previous kernel and driver filled
    in, resolved set, skipped optional members, missing, way back, installed)."""
    validate_rpm_request(req)
    installed = node.installed()
    rec = parse_protect(node.read(PROTECT_FILE), PROTECT_FILE)
    rec = rec if rec.get('kernel') == req.kernel else {}
    prev_k = req.previous_kernel or rec.get('previous_kernel') or (running if running and running != req.kernel else None)
    prev_d = req.previous_driver_version or rec.get('previous_driver_version') or _installed_driver_rpm(installed)
    req = dataclasses.replace(req, previous_kernel=prev_k, previous_driver_version=prev_d)  # type: ignore[arg-type]
    if prev_k:
        rpm_release(prev_k, 'previous_kernel')
    wanted = dnf_target_set(req)
    names = sorted(wanted)
    if prev_k and prev_d:
        names += [n for n in dnf_kernel_set(prev_k, prev_d, req.module_source) if n.startswith('kmod-') and n not in names]
    offered = node.offered(names)
    resolved: Dict[str, str] = {}
    skipped: List[str] = []
    missing: List[str] = []
    for name, version in sorted(wanted.items()):
        vs = offered.get(name, [])
        pick = pick_evr(installed.get(name, []), version) or pick_evr(vs, version)
        if pick:
            resolved[name] = pick
        elif name in DNF_OPTIONAL and not vs and name not in installed:
            skipped.append(name)
        else:
            missing.append('%s %s (offered: %s)' % (name, version, ', '.join(sorted(vs, reverse=True)) or 'none'))
    if req.check_way_back:
        way = dnf_check_way_back(req, offered, installed, node.path_of)
    else:
        way = WayBack(prev_k, prev_d, True, [], None, None)
    return req, resolved, skipped, missing, way, installed


def render_protect_dnf(kernel: str, previous: Optional[str], previous_driver: Optional[str],
                       protected: Dict[str, str], locked: Sequence[str]) -> str:
    return json.dumps({'kernel': kernel, 'previous_kernel': previous, 'previous_driver_version': previous_driver,
                       'protected': sorted('%s-%s' % (n, _no_epoch(v)) for n, v in protected.items()), 'marked_manual': [],
                       'versionlocked': sorted(locked)}, indent=2, sort_keys=True) + '\n'


def dnf_plan(node: DnfKernel, req: KernelRequest, running: Optional[str]) -> DnfPlan:
    """Everything the dnf transaction will do, read only; KernelError (nothing changed) on a
    missing package or a broken way back."""
    req, resolved, skipped, missing, way, installed = dnf_inspect(node, req, running)
    refuse(Availability(rpm_release(req.kernel).evr, resolved, skipped, missing, {}), way, req)
    lock_path, lock_text = node.read_locks()
    locked = {lock_key(e): e for e in parse_locks(lock_text)}
    install = {n: v for n, v in resolved.items() if v not in installed.get(n, [])}
    protected: Dict[str, str] = {}
    if req.previous_kernel and req.previous_kernel != req.kernel:
        protected = dnf_previous_packages(req.previous_kernel, req.previous_driver_version, req.module_source,
                                          installed)
    wanted = ['%s-%s' % (n, _no_epoch(v)) for n, v in sorted(resolved.items())]
    keep = ['%s-%s' % (n, _no_epoch(v)) for n, v in sorted(protected.items())]
    lock_add = [s for s in wanted + keep if s not in locked]
    # Single-version packages of the set (the driver, the DKMS kmod): other locked versions go.
    lock_delete = []
    for key, entry in sorted(locked.items(), key=lambda kv: kv[1]):
        if key is None or key in wanted:
            continue
        name = spec_split(key)[0]
        if name in resolved and not dnf_installonly(name):
            lock_delete.append(entry)
    protect_text = node.read(PROTECT_FILE)
    rec = parse_protect(protect_text, PROTECT_FILE)
    ours = set(rec.get('versionlocked', [])) if rec.get('previous_kernel') == req.previous_kernel else set()  # type: ignore[arg-type]
    ours |= {s for s in keep if s not in locked}
    protect_after = protect_text
    if protected:
        protect_after = render_protect_dnf(req.kernel, req.previous_kernel, req.previous_driver_version, protected,
                                           sorted(ours))
    return DnfPlan(req, resolved, skipped, missing, way, install, lock_path, lock_text, lock_add, lock_delete,
                   protected, protect_text, protect_after)


def dnf_apply(node: DnfKernel, p: DnfPlan) -> Dict[str, List[str]]:
    """One dnf transaction of the exact set (the lock does not hide it), then the versionlock
    changes and the protection record; checks what rpm then has."""
    if p.install:
        # DNF_KEEP_INSTALLONLY: installonly_limit must not remove the previous (rollback) kernel.
        node.runner(node.base() + ['--disableplugin=versionlock', DNF_KEEP_INSTALLONLY, 'install', '--allowerasing']
                    + ['%s-%s' % (n, _no_epoch(v)) for n, v in sorted(p.install.items())], env=node.env())
    if p.lock_delete:
        node.runner(node.base() + ['versionlock', 'delete'] + p.lock_delete, env=node.env())
    if p.lock_add:
        node.runner(node.base() + ['versionlock', 'add'] + p.lock_add, env=node.env())
    if p.protect_after != p.protect_before:
        _fsio.write_text(node.path_of(PROTECT_FILE), p.protect_after, 0o644)
    installed = node.installed()
    wrong = ['%s-%s is not installed (installed: %s)' % (n, v, ', '.join(installed.get(n, [])) or 'none')
             for n, v in sorted(p.install.items()) if v not in installed.get(n, [])]
    if wrong:
        raise KernelError('the dnf transaction finished but: %s' % '; '.join(wrong))
    return installed


@dataclasses.dataclass
class DnfReleasePlan:
    record_before: Optional[str]
    lock_path: str
    unlock: List[str]

    @property
    def changed(self) -> bool:
        return self.record_before is not None


def dnf_plan_release(node: DnfKernel) -> DnfReleasePlan:
    """Past the rollback boundary: drop the locks `present` added for the previous kernel (and only
    those), so dnf's installonly_limit may remove it again."""
    text = node.read(PROTECT_FILE)
    rec = parse_protect(text, PROTECT_FILE)
    path, lock_text = node.read_locks() if text is not None else ('', None)
    ours = set(rec.get('versionlocked', []))  # type: ignore[arg-type]
    unlock = sorted(e for e in parse_locks(lock_text) if lock_key(e) in ours)
    return DnfReleasePlan(text, path, unlock)


def dnf_apply_release(node: DnfKernel, p: DnfReleasePlan) -> None:
    if p.unlock:
        node.runner(node.base() + ['versionlock', 'delete'] + p.unlock, env=node.env())
    _fsio.write_text(node.path_of(PROTECT_FILE), None)


def dnf_module_problem(path_of, kernel: str, source: str, driver: Optional[str],
                       installed: Dict[str, List[str]]) -> Optional[str]:
    """None when RHEL-family kernel <k> has the NVIDIA module for `driver` (the trial boot's gate,
    as `nvidia_module_present` on apt): the precompiled `kmod-nvidia-open-<driver>-<kver>-<krel>`
    installed, or DKMS's build of it; else what is missing. KernelError when the installed kmods
    are of the other module source."""
    r = rpm_release(kernel)
    dkms = sorted(n for n in installed if n in ('kmod-nvidia-open-dkms', 'kmod-nvidia-latest-dkms'))
    pre = sorted(n for n in installed if re.match(r'^kmod-nvidia(?:-open)?-\d{3}\.\d+', n))
    other = dkms if source == 'prebuilt' else pre
    if other:
        raise KernelError('module_source=%s does not match the installed packages: %s; use module_source=%s '
                          '(switching module source is not done by this module), nothing was changed'
                          % (source, ', '.join('%s %s' % (n, installed[n][-1]) for n in other),
                             'dkms' if source == 'prebuilt' else 'prebuilt'))
    if source == 'prebuilt':
        suffix = '-%s-%s' % (r.version, r.rel_no_dist)
        if driver:
            name = [n for n in dnf_kernel_set(kernel, driver, 'prebuilt') if n.startswith('kmod-')][0]
            if name in installed:
                return None
            have = [n for n in pre if n.endswith(suffix)]
            return '%s is not installed (precompiled kmods for %s: %s)' % (name, kernel, ', '.join(have) or 'none')
        if any(n.endswith(suffix) for n in pre):
            return None
        return 'no precompiled kmod-nvidia-open-<driver>%s is installed' % suffix
    builds = dkms_builds(path_of, driver)
    if not any(kernel in ks for ks in builds.values()):
        return 'DKMS has no nvidia%s module built for %s (no %s/%s/%s/<arch>/module/nvidia.ko*)' % (
            ' ' + driver if driver else '', kernel, '/' + DKMS_TREE, driver or '<driver>', kernel)
    return None
