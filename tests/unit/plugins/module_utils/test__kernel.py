"""Unit tests of the kernel core: releases, package sets (apt and dnf), apt-cache show records, the
module source of installed packages, DKMS builds, availability, the way back, /proc/driver/nvidia/version."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _kernel as kn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk

K134, K135 = '6.8.0-134-generic', '6.8.0-135-generic'
LRM = 'linux-modules-nvidia-580-server-%s'

# Recorded shape of `apt-cache show` for Canonical's prebuilt modules (two versions of one package).
SHOW = """\
Package: linux-modules-nvidia-580-server-6.8.0-134-generic
Version: 6.8.0-134.134+2
Architecture: all
Depends: linux-image-6.8.0-134-generic | linux-image-unsigned-6.8.0-134-generic,
 nvidia-kernel-common-580-server (<= 580.130.00-1), nvidia-kernel-common-580-server (>= 580.130.00)
Description: test stand-in
 Built by tests/tools/debrepo.py; one file.

Package: linux-modules-nvidia-580-server-6.8.0-134-generic
Version: 6.8.0-134.134+1
Architecture: all
Depends: linux-image-6.8.0-134-generic | linux-image-unsigned-6.8.0-134-generic,
 nvidia-kernel-common-580-server (<= 580.126.20-1), nvidia-kernel-common-580-server (>= 580.126.20)
Description: test stand-in

"""


def policy(**versions):
    return {name.replace('_', '-'): pk.PolicyEntry(None, None, {v: ['500 file:/repo ./ Packages'] for v in vs})
            for name, vs in versions.items()}


def test_ubuntu_release():
    r = kn.ubuntu_release(K135)
    assert (r.base, r.abi, r.flavour, r.abi_name) == ('6.8.0', '135', 'generic', '6.8.0-135')
    assert kn.ubuntu_release('6.8.0-1016-nvidia-64k').flavour == 'nvidia-64k'


@pytest.mark.parametrize('bad', ['6.8.0', 'latest', '', None, '6.8.0-135', '5.14.0-427.13.1.el9_4.x86_64'])
def test_ubuntu_release_rejects(bad):
    with pytest.raises(kn.KernelError) as e:
        kn.ubuntu_release(bad)
    assert str(e.value) == ('kernel %r is not an Ubuntu/Debian kernel release such as 6.8.0-135-generic '
                            '(<version>-<abi>-<flavour>, as uname -r prints it)' % (bad,))


def test_rpm_release():
    r = kn.rpm_release('5.14.0-427.13.1.el9_4.x86_64')
    got = (r.version, r.rel, r.arch, r.evr, r.rel_no_dist)
    assert got == ('5.14.0', '427.13.1.el9_4', 'x86_64', '5.14.0-427.13.1.el9_4', '427.13.1')
    with pytest.raises(kn.KernelError, match="kernel '6.8.0-135-generic' is not a RHEL-family kernel release"):
        kn.rpm_release(K135)


@pytest.mark.parametrize('source, expected', [
    ('dkms', ('linux-image-%s' % K135, 'linux-modules-%s' % K135, 'linux-modules-extra-%s' % K135, 'linux-headers-%s' % K135)),
    ('prebuilt', ('linux-image-%s' % K135, 'linux-modules-%s' % K135, 'linux-modules-extra-%s' % K135, LRM % K135)),
])
def test_apt_kernel_set(source, expected):
    assert kn.apt_kernel_set(K135, '580', source).names == expected


def test_apt_kernel_set_bad_input():
    with pytest.raises(kn.KernelError, match=r"^module_source must be one of dkms, prebuilt, got 'kmod'$"):
        kn.apt_kernel_set(K135, '580', 'kmod')
    with pytest.raises(pk.PackageError, match="branch must be a driver branch such as '580', got '58'"):
        kn.apt_kernel_set(K135, '58', 'dkms')


def test_kernel_meta_packages():
    expected = ('linux-generic', 'linux-image-generic', 'linux-headers-generic', 'linux-modules-nvidia-580-server-generic')
    assert kn.kernel_meta_packages(K135, '580') == expected


@pytest.mark.parametrize('source, open_modules, expected', [
    ('dkms', True, {'kernel-devel': '5.14.0-427.13.1.el9_4', 'kmod-nvidia-open-dkms': '580.130.00'}),
    ('dkms', False, {'kernel-devel': '5.14.0-427.13.1.el9_4', 'kmod-nvidia-latest-dkms': '580.130.00'}),
    ('prebuilt', True, {'kmod-nvidia-open-580.130.00-5.14.0-427.13.1': '580.130.00'}),
    ('prebuilt', False, {'kmod-nvidia-580.130.00-5.14.0-427.13.1': '580.130.00'}),
])
def test_dnf_kernel_set(source, open_modules, expected):
    got = kn.dnf_kernel_set('5.14.0-427.13.1.el9_4.x86_64', '580.130.00', source, open_modules)
    kernel = {n: '5.14.0-427.13.1.el9_4' for n in ('kernel', 'kernel-core', 'kernel-modules', 'kernel-modules-core')}
    assert got == dict(kernel, **expected)


def test_dnf_kernel_commands():
    pkgs = kn.dnf_kernel_set('5.14.0-427.13.1.el9_4.x86_64', '580.130.00', 'prebuilt')
    offered = {n: [v + '-3.el9_4' if n.startswith('kmod') else v] for n, v in pkgs.items() if n != 'kernel-modules-core'}
    cmds = kn.dnf_kernel_commands(pkgs, offered, '/srv/root')
    specs = ['kernel-5.14.0-427.13.1.el9_4', 'kernel-core-5.14.0-427.13.1.el9_4', 'kernel-modules-5.14.0-427.13.1.el9_4',
             'kmod-nvidia-open-580.130.00-5.14.0-427.13.1-580.130.00-3.el9_4']
    base = ['dnf', '-y', '-q', '--installroot=/srv/root', '--setopt=pluginconfpath=/srv/root/etc/dnf/plugins']
    # installonly_limit=0: dnf must not remove the previous kernel to make room for this one.
    assert cmds == [base + ['--setopt=installonly_limit=0', 'install', '--allowerasing'] + specs,
                    base + ['versionlock', 'add'] + specs]
    del offered['kmod-nvidia-open-580.130.00-5.14.0-427.13.1']
    with pytest.raises(kn.KernelError, match=r'^the repositories do not offer: kmod-nvidia-open-580\.130\.00-5\.14\.0-427\.13\.1 '
                       r'580\.130\.00 \(offered: none\); nothing was changed$'):
        kn.dnf_kernel_commands(pkgs, offered, None)


def test_parse_show_and_module_driver():
    recs = kn.parse_show(SHOW)
    assert [r['Version'] for r in recs] == ['6.8.0-134.134+2', '6.8.0-134.134+1']
    assert recs[0]['Description'] == 'test stand-in\nBuilt by tests/tools/debrepo.py; one file.'
    assert kn.module_versions(recs, LRM % K134, '580') == {'6.8.0-134.134+2': '580.130.00', '6.8.0-134.134+1': '580.126.20'}
    assert kn.module_package_driver('linux-image-x, nvidia-kernel-common-580 (>= 580.95.05-0ubuntu1)', '580') == '580.95.05'
    assert kn.module_package_driver('linux-image-x', '580') is None


def test_parse_depends():
    assert kn.parse_depends('a (>= 1), b | c:amd64 (= 2), d') == [
        [('a', '>=', '1')], [('b', None, None), ('c', '=', '2')], [('d', None, None)]]


def test_installed_module_source_and_mismatch():
    inst = {'nvidia-dkms-580-server': '580.126.20-0ubuntu1', 'libnvidia-compute-580-server': '580.126.20-0ubuntu1'}
    assert kn.installed_module_source(inst) == {'dkms': ['nvidia-dkms-580-server'], 'prebuilt': []}
    kn.check_source_matches('dkms', inst)
    with pytest.raises(kn.KernelError, match=r'^module_source=prebuilt does not match the installed packages: '
                       r'nvidia-dkms-580-server 580\.126\.20-0ubuntu1 build the NVIDIA modules with DKMS; use module_source=dkms'):
        kn.check_source_matches('prebuilt', inst)
    kn.check_source_matches('prebuilt', {})


def test_dkms_builds(tmp_path):
    def path_of(rel):
        return str(tmp_path / rel)
    for drv, k in (('580.126.20', K134), ('580.130.00', K135)):
        d = tmp_path / 'var/lib/dkms/nvidia' / drv / k / 'x86_64/module'
        d.mkdir(parents=True)
        (d / 'nvidia.ko.zst').write_bytes(b'')
    (tmp_path / 'var/lib/dkms/nvidia/580.130.00' / K134 / 'x86_64/module').mkdir(parents=True)   # built nothing
    (tmp_path / 'var/lib/dkms/nvidia/580.130.00/source').mkdir()
    assert kn.dkms_builds(path_of) == {'580.126.20': [K134], '580.130.00': [K135]}
    assert kn.has_dkms_build(path_of, '580.130.00', K135) and not kn.has_dkms_build(path_of, '580.130.00', K134)
    assert kn.dkms_builds(lambda rel: str(tmp_path / 'nowhere' / rel)) == {}


REQ = kn.KernelRequest(kernel=K135, branch='580', driver_version='580.130.00', module_source='prebuilt',
                       previous_kernel=K134, previous_driver_version='580.126.20')


def test_availability_prebuilt_picks_the_module_for_the_driver():
    kset = kn.apt_kernel_set(K135, '580', 'prebuilt')
    pol = policy(**{'linux-image-%s' % K135: ['6.8.0-135.135'], 'linux-modules-%s' % K135: ['6.8.0-135.135'],
                    LRM % K135: ['6.8.0-135.135+1', '6.8.0-135.135+2']})
    shows = [{'Package': LRM % K135, 'Version': '6.8.0-135.135+2', 'Depends': 'nvidia-kernel-common-580-server (>= 580.142.00)'},
             {'Package': LRM % K135, 'Version': '6.8.0-135.135+1', 'Depends': 'nvidia-kernel-common-580-server (>= 580.130.00)'}]
    a = kn.check_availability(kset, REQ, pol, shows, {})
    assert a.missing == [] and a.skipped == ['linux-modules-extra-%s' % K135]
    assert a.resolved == {'linux-image-%s' % K135: '6.8.0-135.135', 'linux-modules-%s' % K135: '6.8.0-135.135',
                          LRM % K135: '6.8.0-135.135+1'}
    a = kn.check_availability(kset, kn.KernelRequest(K135, '580', '580.126.20', 'prebuilt'), pol, shows, {})
    assert a.missing == ['%s for driver 580.126.20 (offered: 6.8.0-135.135+2 for driver 580.142.00, 6.8.0-135.135+1 for '
                         'driver 580.130.00)' % (LRM % K135)]


def test_availability_names_every_missing_package():
    kset = kn.apt_kernel_set(K135, '580', 'dkms')
    pol = policy(**{'linux-image-%s' % K135: ['6.8.0-135.135'], 'linux-modules-extra-%s' % K135: ['6.8.0-135.134']})
    a = kn.check_availability(kset, REQ, pol, [], {})
    assert a.missing == ['linux-modules-%s 6.8.0-135.135 (offered: none)' % K135,
                         'linux-modules-extra-%s 6.8.0-135.135 (offered: 6.8.0-135.134)' % K135,
                         'linux-headers-%s 6.8.0-135.135 (offered: none)' % K135]
    a = kn.check_availability(kset, REQ, {}, [], {})
    assert a.missing == ['linux-image-%s (offered: none)' % K135] and a.kernel_version is None


def test_way_back_prebuilt():
    installed = {'linux-image-%s' % K134: '6.8.0-134.134', LRM % K134: '6.8.0-134.134+1',
                 'nvidia-kernel-common-580-server': '580.126.20-0ubuntu1'}
    recs = kn.parse_show(SHOW)
    pol = policy(**{LRM % K134: ['6.8.0-134.134+1', '6.8.0-134.134+2']})
    w = kn.check_way_back(REQ, pol, recs, installed, lambda rel: '/nonexistent/' + rel)
    assert (w.ok, w.modules_on_node, w.reinstallable) == (True, True, True)
    # The archive dropped the old build: a rollback could not reinstall it.
    w = kn.check_way_back(REQ, policy(**{LRM % K134: ['6.8.0-134.134+2']}), recs, installed, str)
    assert w.problems == ['the repositories do not offer %s for driver 580.126.20, so a rollback could not reinstall it'
                          % (LRM % K134)]
    # After the transaction (the driver moved): the old build is no longer on the node by design.
    moved = dict(installed, **{LRM % K134: '6.8.0-134.134+2', 'nvidia-kernel-common-580-server': '580.130.00-0ubuntu1'})
    w = kn.check_way_back(REQ, pol, recs, moved, str)
    assert (w.ok, w.modules_on_node) == (True, False)
    # A previous driver the node never had is not mistaken for a moved one.
    wrong = kn.KernelRequest(K135, '580', '580.130.00', 'prebuilt', K134, '580.142.00')
    w = kn.check_way_back(wrong, pol, recs, installed, str)
    assert w.problems[0] == '%s for driver 580.142.00 is not installed (installed: 6.8.0-134.134+1 for driver 580.126.20)' % (LRM % K134)


def test_way_back_dkms(tmp_path):
    req = kn.KernelRequest(K135, '580', '580.130.00', 'dkms', K134, '580.126.20')
    installed = {'linux-image-%s' % K134: 'v', 'nvidia-kernel-common-580-server': '580.126.20-0ubuntu1'}
    pol = policy(nvidia_dkms_580_server=['580.130.00-0ubuntu1'])
    w = kn.check_way_back(req, pol, [], installed, lambda rel: str(tmp_path / rel))
    assert w.problems == [
        'DKMS has no nvidia 580.126.20 module built for %s (no /var/lib/dkms/nvidia/580.126.20/%s/<arch>/module/nvidia.ko*)'
        % (K134, K134),
        'linux-headers-%s is not installed, so DKMS could not rebuild the previous driver for it' % K134,
        'the repositories do not offer nvidia-dkms-580-server 580.126.20, so a rollback could not reinstall it']


def test_previous_from_record_and_installed():
    inst = {'nvidia-kernel-common-580-server': '580.130.00-0ubuntu1'}
    base = kn.KernelRequest(K135, '580', '580.130.00', 'dkms')
    assert kn.previous_from_installed(base, inst, K134).previous_kernel == K134
    assert kn.previous_from_installed(base, inst, K135).previous_kernel is None
    rec = {'kernel': K135, 'previous_kernel': K134, 'previous_driver_version': '580.126.20'}
    r = kn.previous_from_installed(base, inst, K135, rec)
    assert (r.previous_kernel, r.previous_driver_version) == (K134, '580.126.20')
    r = kn.previous_from_installed(base, inst, K135, dict(rec, kernel='6.8.0-140-generic'))
    assert (r.previous_kernel, r.previous_driver_version) == (None, '580.130.00')


def test_protect_record():
    text = kn.render_protect(K135, K134, '580.126.20', ['b', 'a'], ['a', 'b', 'c'])
    assert kn.parse_protect(text, 'p') == {'kernel': K135, 'previous_kernel': K134, 'previous_driver_version': '580.126.20',
                                           'protected': ['a', 'b', 'c'], 'marked_manual': ['a', 'b']}
    assert kn.parse_protect(None, 'p') == {}
    with pytest.raises(kn.KernelError, match=r'^p is not the JSON record this module writes'):
        kn.parse_protect('{', 'p')


def test_render_kernel_pins():
    assert kn.render_kernel_pins({'b': '2', 'a': '2', 'c': '1'}) == (
        'Explanation: managed by gpufleet.upgrade.kernel_packages; exact kernel version\nPackage: c\nPin: version 1\n'
        'Pin-Priority: 1001\n\nExplanation: managed by gpufleet.upgrade.kernel_packages; exact kernel version\n'
        'Package: a b\nPin: version 2\nPin-Priority: 1001\n')
    assert pk.parse_preferences(kn.render_kernel_pins({'a': '2'})) == {'a': '2'}
    assert kn.render_kernel_pins({}) is None


@pytest.mark.parametrize('text, expected', [
    ('NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.130.00  Release Build  (dvs-builder@U22-I3-AF03-09-1)  '
     'Sat Jan 10 05:20:46 UTC 2026\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n',
     {'driver_version': '580.130.00', 'build_kernel': None, 'open': True}),
    ('NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024 (6.8.0-134-generic)\n',
     {'driver_version': '535.183.01', 'build_kernel': '6.8.0-134-generic', 'open': False}),
    (None, {'driver_version': None, 'build_kernel': None, 'open': None}),
])
def test_parse_nvidia_version(text, expected):
    assert kn.parse_nvidia_version(text) == expected


@pytest.mark.parametrize('version, branch, msg', [
    ('580', '580', "driver_version '580' is not an NVIDIA driver version such as 580.130.00"),
    ('570.195.03', '580', "driver_version '570.195.03' is not in driver branch '580'"),
])
def test_check_driver_version(version, branch, msg):
    with pytest.raises(kn.KernelError, match='^%s$' % msg.replace('.', r'\.')):
        kn.check_driver_version(version, branch)


# --------------------------------------------------------------------------------------------
# RHEL family (dnf)
# --------------------------------------------------------------------------------------------

R13, R16 = '5.14.0-427.13.1.el9_4.x86_64', '5.14.0-427.16.1.el9_4.x86_64'
E13, E16 = '5.14.0-427.13.1.el9_4', '5.14.0-427.16.1.el9_4'
ROCKY = {'ID': 'rocky', 'ID_LIKE': 'rhel centos fedora', 'VERSION_ID': '9.4', 'PRETTY_NAME': 'Rocky Linux 9.4'}


@pytest.mark.parametrize('os_release, has_apt, has_dnf, expected', [
    (ROCKY, True, True, 'dnf'),
    ({'ID': 'almalinux', 'ID_LIKE': 'rhel centos fedora'}, False, True, 'dnf'),
    ({'ID': 'ubuntu', 'ID_LIKE': 'debian'}, True, True, 'apt'),
    ({}, True, True, 'apt'),          # an install root without os-release: the tools decide, apt first
    ({}, False, True, 'dnf'),
])
def test_kernel_backend(os_release, has_apt, has_dnf, expected):
    assert kn.kernel_backend(os_release, has_apt, has_dnf) == expected


@pytest.mark.parametrize('os_release, has_apt, has_dnf, msg', [
    (ROCKY, True, False, 'the managed system is Rocky Linux 9.4 (RHEL family) but this node has no dnf'),
    ({'ID': 'debian'}, False, True, 'the managed system is debian (Ubuntu/Debian) but this node has no apt-get/dpkg-query'),
    ({'ID': 'arch'}, False, False, "the managed system (os-release ID 'arch') has neither apt-get/dpkg-query nor dnf"),
])
def test_kernel_backend_refuses(os_release, has_apt, has_dnf, msg):
    with pytest.raises(kn.KernelError) as e:
        kn.kernel_backend(os_release, has_apt, has_dnf)
    assert str(e.value) == msg


@pytest.mark.parametrize('os_release, tools, expected', [
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', ('apt-get', 'dpkg-query', 'dnf', 'rpm'), 'dnf'),
    ('ID=ubuntu\nID_LIKE=debian\n', ('apt-get', 'dpkg-query', 'dnf', 'rpm'), 'apt'),
    (None, ('apt-get', 'dpkg-query', 'dnf', 'rpm'), 'apt'),   # no os-release under the root: the tools, apt first
    (None, ('dnf', 'rpm'), 'dnf'),
    (None, ('apt-get', 'dnf'), 'KernelError'),                # half a toolset counts as none
])
def test_managed_backend(tmp_path, os_release, tools, expected):
    """kernel_backend on the os-release under the install root and the tools found by `which`."""
    if os_release is not None:
        (tmp_path / 'etc').mkdir()
        (tmp_path / 'etc/os-release').write_text(os_release)
    runner = pk.Runner(lambda argv, env: (0, '', ''), str(tmp_path))

    def which(name):
        return '/usr/bin/' + name if name in tools else None
    if expected == 'KernelError':
        with pytest.raises(kn.KernelError, match='has neither apt-get/dpkg-query nor dnf'):
            kn.managed_backend(runner, which)
    else:
        assert kn.managed_backend(runner, which) == expected


def test_managed_backend_refuses_a_rhel_root_without_dnf(tmp_path):
    (tmp_path / 'etc').mkdir()
    (tmp_path / 'etc/os-release').write_text('ID="rocky"\nPRETTY_NAME="Rocky Linux 9.4"\n')
    runner = pk.Runner(lambda argv, env: (0, '', ''), str(tmp_path))
    with pytest.raises(kn.KernelError, match=r'^the managed system is Rocky Linux 9\.4 \(RHEL family\) but this node has no dnf$'):
        kn.managed_backend(runner, lambda name: '/usr/bin/' + name if name in ('apt-get', 'dpkg-query') else None)


@pytest.mark.parametrize('entry, key', [
    ('kernel-0:5.14.0-427.13.1.el9_4.*', 'kernel-5.14.0-427.13.1.el9_4'),
    ('nvidia-driver-3:580.130.00-1.el9.*', 'nvidia-driver-580.130.00-1.el9'),
    ('kmod-nvidia-open-580.130.00-5.14.0-427.16.1-0:580.130.00-1.el9.x86_64',
     'kmod-nvidia-open-580.130.00-5.14.0-427.16.1-580.130.00-1.el9'),
    ('!kernel-0:5.14.0-427.13.1.el9_4.*', None),
    ('garbage', None),
])
def test_lock_key(entry, key):
    assert kn.lock_key(entry) == key


def test_locks_rpm_and_specs():
    assert kn.parse_locks('# Added lock on x\nkernel-0:%s.*\n\n' % E13) == ['kernel-0:%s.*' % E13]
    assert kn.parse_rpm_multi('kernel\t0:%s\nkernel\t0:%s\nnvidia-driver\t3:580.130.00-1.el9\n' % (E16, E13)) == {
        'kernel': [E13, E16], 'nvidia-driver': ['3:580.130.00-1.el9']}
    assert kn.pick_evr(['3:580.126.20-1.el9', '3:580.130.00-1.el9'], '580.130.00') == '3:580.130.00-1.el9'
    assert kn.pick_evr([E13, E16], E16) == E16 and kn.pick_evr([E13], E16) is None
    assert kn.spec_split('kernel-core-%s' % E16) == ('kernel-core', E16)
    assert kn.plugin_lock_entry('kernel-core-%s' % E16) == 'kernel-core-0:%s.*' % E16


def test_dnf_target_set_and_previous():
    req = kn.KernelRequest(R16, '580', '580.130.00', 'prebuilt')
    assert kn.dnf_target_set(req) == {
        'kernel': E16, 'kernel-core': E16, 'kernel-modules': E16, 'kernel-modules-core': E16,
        'kmod-nvidia-open-580.130.00-5.14.0-427.16.1': '580.130.00', 'nvidia-driver': '580.130.00',
        'nvidia-driver-libs': '580.130.00', 'nvidia-driver-cuda': '580.130.00', 'nvidia-driver-cuda-libs': '580.130.00'}
    installed = {'kernel': [E13, E16], 'kernel-core': [E13, E16], 'kernel-modules': [E13],
                 'kmod-nvidia-open-580.126.20-5.14.0-427.13.1': ['580.126.20-1.el9'],
                 'kmod-nvidia-open-580.130.00-5.14.0-427.13.1': ['580.130.00-1.el9']}
    assert kn.dnf_previous_packages(R13, '580.126.20', 'prebuilt', installed) == {
        'kernel': E13, 'kernel-core': E13, 'kernel-modules': E13,
        'kmod-nvidia-open-580.126.20-5.14.0-427.13.1': '580.126.20-1.el9'}
    assert kn.dnf_installonly('kernel-devel') and kn.dnf_installonly('kmod-nvidia-open-580.130.00-5.14.0-427.16.1')
    assert not kn.dnf_installonly('kmod-nvidia-open-dkms') and not kn.dnf_installonly('nvidia-driver')


@pytest.mark.parametrize('field, value, msg', [
    ('kernel', '6.8.0-135-generic', "kernel '6.8.0-135-generic' is not a RHEL-family kernel release"),
    ('previous_kernel', E13, "previous_kernel '%s' is not a RHEL-family kernel release" % E13),
    ('driver_version', '570.1.2', "driver_version '570.1.2' is not in driver branch '580'"),
])
def test_validate_rpm_request(field, value, msg):
    req = kn.KernelRequest(R16, '580', '580.130.00', 'prebuilt')
    setattr(req, field, value)
    with pytest.raises(kn.KernelError) as e:
        kn.validate_rpm_request(req)
    assert str(e.value).startswith(msg)


DNF_LIST = """\
Available Packages
kernel.x86_64                 %(e13)s           repo
kernel.x86_64                 %(e16)s           repo
kernel-core.x86_64            %(e16)s           repo
kernel-modules.x86_64         %(e16)s           repo
nvidia-driver.x86_64          580.126.20-1.el9  repo
nvidia-driver.x86_64          580.130.00-1.el9  repo
nvidia-driver-libs.x86_64     580.130.00-1.el9  repo
nvidia-driver-cuda.x86_64     580.130.00-1.el9  repo
nvidia-driver-cuda-libs.x86_64 580.130.00-1.el9 repo
kmod-nvidia-open-580.126.20-5.14.0-427.13.1.x86_64 580.126.20-1.el9 repo
kmod-nvidia-open-580.130.00-5.14.0-427.16.1.x86_64 580.130.00-1.el9 repo
""" % {'e13': E13, 'e16': E16}
RPM_QA = ''.join('%s\t0:%s\n' % kv for kv in [
    ('kernel', E13), ('kernel-core', E13), ('kernel-modules', E13), ('nvidia-driver', '580.126.20-1.el9'),
    ('kmod-nvidia-open-580.126.20-5.14.0-427.13.1', '580.126.20-1.el9')])


def dnf_node(tmp_path, locks=''):
    (tmp_path / 'etc/dnf/plugins').mkdir(parents=True)
    (tmp_path / 'etc/os-release').write_text('ID="rocky"\nVERSION_ID="9.4"\n')
    (tmp_path / 'etc/dnf/plugins/versionlock.conf').write_text(
        '[main]\nenabled = 1\nlocklist = %s/etc/dnf/plugins/versionlock.list\n' % tmp_path)
    (tmp_path / 'etc/dnf/plugins/versionlock.list').write_text(locks)

    def run(argv, env):
        if argv[0] == 'rpm':
            return 0, RPM_QA, ''
        assert '--disableplugin=versionlock' in argv and 'list' in argv, argv
        return 0, DNF_LIST, ''
    return kn.DnfKernel(pk.Runner(run, str(tmp_path)))


def test_dnf_plan(tmp_path):
    node = dnf_node(tmp_path, locks='nvidia-driver-0:580.126.20-1.el9.*\n')
    p = kn.dnf_plan(node, kn.KernelRequest(R16, '580', '580.130.00', 'prebuilt'), R13)
    assert p.skipped == ['kernel-modules-core'] and p.way_back.ok
    assert p.install == {'kernel': E16, 'kernel-core': E16, 'kernel-modules': E16,
                         'kmod-nvidia-open-580.130.00-5.14.0-427.16.1': '580.130.00-1.el9',
                         'nvidia-driver': '580.130.00-1.el9', 'nvidia-driver-libs': '580.130.00-1.el9',
                         'nvidia-driver-cuda': '580.130.00-1.el9', 'nvidia-driver-cuda-libs': '580.130.00-1.el9'}
    assert p.lock_delete == ['nvidia-driver-0:580.126.20-1.el9.*']       # the driver's old lock goes
    assert 'kernel-%s' % E13 in p.lock_add and 'kernel-%s' % E16 in p.lock_add
    assert p.protected == {'kernel': E13, 'kernel-core': E13, 'kernel-modules': E13,
                           'kmod-nvidia-open-580.126.20-5.14.0-427.13.1': '580.126.20-1.el9'}
    assert p.changed and 'kernel-0:%s.*\n' % E16 in p.diff()[0]['after']
    base = ['dnf', '-y', '-q', '--installroot=%s' % tmp_path, '--setopt=pluginconfpath=%s/etc/dnf/plugins' % tmp_path,
            '--releasever=9']
    assert node.runner.commands[1][:len(base)] == base


def test_dnf_plan_refuses(tmp_path):
    node = dnf_node(tmp_path)
    with pytest.raises(kn.KernelError) as e:
        kn.dnf_plan(node, kn.KernelRequest(R16, '580', '580.126.20', 'prebuilt'), R13)
    assert 'the repositories do not offer kmod-nvidia-open-580.126.20-5.14.0-427.16.1 580.126.20 (offered: none)' in str(e.value)
    assert 'nothing was changed' in str(e.value)


def test_dnf_lock_list_outside_the_root(tmp_path):
    node = dnf_node(tmp_path)
    (tmp_path / 'etc/dnf/plugins/versionlock.conf').write_text('[main]\nlocklist = /etc/dnf/plugins/versionlock.list\n')
    with pytest.raises(kn.KernelError) as e:
        kn.dnf_plan(node, kn.KernelRequest(R16, '580', '580.130.00', 'prebuilt'), R13)
    assert "the versionlock list of %s/etc/dnf/plugins/versionlock.conf is '/etc/dnf/plugins/versionlock.list', " \
        "outside the install root" % tmp_path in str(e.value)


def test_dnf_apply_keeps_the_previous_kernel(tmp_path):
    """A versionlock does not stop installonly_limit: the install transaction sets it to 0 (unlimited)."""
    node = dnf_node(tmp_path)
    p = kn.dnf_plan(node, kn.KernelRequest(R16, '580', '580.130.00', 'prebuilt', previous_kernel=R13), R13)
    after = RPM_QA + ''.join('%s\t0:%s\n' % kv for kv in p.install.items())

    def run(argv, env):
        return (0, after, '') if argv[0] == 'rpm' else (0, '', '')
    node.runner = pk.Runner(run, str(tmp_path))
    kn.dnf_apply(node, p)
    install = [c for c in node.runner.commands if 'install' in c]
    assert len(install) == 1 and '--setopt=installonly_limit=0' in install[0]
    assert install[0].index('--setopt=installonly_limit=0') < install[0].index('install')


def test_dnf_module_problem(tmp_path):
    """kernel_boot's gate on the RHEL family: the precompiled kmod of that kernel and driver, or DKMS's build."""
    kmod16 = 'kmod-nvidia-open-580.130.00-5.14.0-427.16.1'
    inst = {'kernel-core': ['5.14.0-427.13.1.el9_4', '5.14.0-427.16.1.el9_4'], kmod16: ['3:580.130.00-1.el9'],
            'kmod-nvidia-open-580.126.20-5.14.0-427.13.1': ['3:580.126.20-1.el9']}

    def path_of(rel):
        return str(tmp_path / rel)

    assert kn.dnf_module_problem(path_of, R16, 'prebuilt', '580.130.00', inst) is None
    assert kn.dnf_module_problem(path_of, R16, 'prebuilt', None, inst) is None
    assert kn.dnf_module_problem(path_of, R16, 'prebuilt', '580.126.20', inst) == (
        'kmod-nvidia-open-580.126.20-5.14.0-427.16.1 is not installed (precompiled kmods for %s: %s)' % (R16, kmod16))
    with pytest.raises(kn.KernelError, match=r'^module_source=dkms does not match the installed packages: '
                                             r'kmod-nvidia-open-580.126.20-5.14.0-427.13.1 3:580.126.20-1.el9, '):
        kn.dnf_module_problem(path_of, R16, 'dkms', '580.130.00', inst)
    dkms = {'kmod-nvidia-open-dkms': ['3:580.130.00-1.el9']}
    assert kn.dnf_module_problem(path_of, R16, 'dkms', '580.130.00', dkms).startswith(
        'DKMS has no nvidia 580.130.00 module built for %s' % R16)
    mod = tmp_path / 'var/lib/dkms/nvidia/580.130.00' / R16 / 'x86_64/module'
    mod.mkdir(parents=True)
    (mod / 'nvidia.ko.xz').write_bytes(b'\0')
    assert kn.dnf_module_problem(path_of, R16, 'dkms', '580.130.00', dkms) is None
    with pytest.raises(kn.KernelError, match='^module_source=prebuilt does not match'):
        kn.dnf_module_problem(path_of, R16, 'prebuilt', '580.130.00', dkms)
