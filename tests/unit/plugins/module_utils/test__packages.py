"""Unit tests of the package core: versions, presets, preference files, parsers, dnf commands."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk

# Recorded from apt 2.6.1 under a test install root (tests/tools/debrepo.py).
POLICY = """\
libnvidia-compute-580-server:
  Installed: 580.126.20-0ubuntu1
  Candidate: 580.126.20-0ubuntu1
  Version table:
     580.130.00-0ubuntu1 500
        500 file:/tmp/repo ./ Packages
 *** 580.126.20-0ubuntu1 1001
        500 file:/tmp/repo ./ Packages
        100 /tmp/root/var/lib/dpkg/status
libnvidia-nscq-580:
  Installed: (none)
  Candidate: 580.130.00-1
  Version table:
     580.130.00-1 500
        500 file:/tmp/repo ./ Packages
     580.126.20-1 500
        500 file:/tmp/repo ./ Packages
nvidia-driver-565-server:
  Installed: 565.57.01-0ubuntu1
  Candidate: 565.57.01-0ubuntu1
  Version table:
 *** 565.57.01-0ubuntu1 100
        100 /var/lib/dpkg/status
"""

DPKG_QUERY = (
    'nvidia-driver-580-server\t580.126.20-0ubuntu1\thold ok installed\n'
    'libnvidia-compute-580-server:amd64\t580.126.20-0ubuntu1\tinstall ok installed\n'
    'nvidia-dkms-580-server\t580.126.20-0ubuntu1\tdeinstall ok config-files\n'
    'nvidia-utils-580-server\t\thold ok not-installed\n'
    'garbage line\n'
)


# -- versions -----------------------------------------------------------------------------------

@pytest.mark.parametrize('a,b,expected', [
    ('580.126.20-0ubuntu1', '580.130.00-0ubuntu1', -1),
    ('580.130.00-0ubuntu1', '580.126.20-0ubuntu1', 1),
    ('580.126.20-0ubuntu1', '580.126.20-0ubuntu1', 0),
    ('580.126.20-0ubuntu0.24.04.1', '580.126.20-0ubuntu1', -1),
    ('1:535.0-1', '580.0-1', 1),
    ('580.95.05-1', '580.95.05~rc1-1', 1),
    ('580.65.06', '580.65.06-1', -1),
    ('1.0a', '1.0', 1),
    ('1.0+b1', '1.0', 1),
])
def test_deb_compare(a, b, expected):
    assert pk.deb_compare(a, b) == expected


_part = st.text(alphabet='0123456789.+~abz', min_size=1, max_size=8).filter(lambda s: s[0].isdigit())


@pytest.mark.skipif(not shutil.which('dpkg'), reason='needs dpkg')
@settings(max_examples=60, deadline=None)
@given(_part, _part, st.sampled_from(['', '-1', '-0ubuntu1', '-1~rc']), st.sampled_from(['', '-1', '-2']))
def test_deb_compare_agrees_with_dpkg(u1, u2, r1, r2):
    a, b = u1 + r1, u2 + r2
    ours = pk.deb_compare(a, b)
    dpkg = [op for op in ('lt', 'eq', 'gt')
            if subprocess.run(['dpkg', '--compare-versions', a, op, b], stderr=subprocess.DEVNULL, check=False).returncode == 0]
    assert len(dpkg) == 1, (a, b, dpkg)
    assert ours == {'lt': -1, 'eq': 0, 'gt': 1}[dpkg[0]], (a, b)


def test_version_matching_and_pick():
    assert pk.version_matches('580.126.20-0ubuntu1', '580.126.20')
    assert pk.version_matches('3:580.126.20-1.el9', '580.126.20')
    assert pk.version_matches('580.126.20-1', '580.126.20-1')
    assert pk.version_matches('1:580.126.20-1', '580.126.20-1')
    assert not pk.version_matches('580.126.200-1', '580.126.20')
    assert not pk.version_matches('580.126.20-0ubuntu1', '580.126.20-1')
    offered = ['580.126.20-0ubuntu0.24.04.1', '580.126.20-0ubuntu1', '580.130.00-0ubuntu1']
    assert pk.pick_version(offered, '580.126.20') == '580.126.20-0ubuntu1'
    assert pk.pick_version(offered, '580.999.99') is None


# -- presets ------------------------------------------------------------------------------------

def test_presets():
    s = pk.preset_packages('ubuntu-server', '580')
    assert s.required[0] == 'nvidia-driver-580-server'
    assert 'nvidia-kernel-common-580-server' in s.required
    assert s.optional == ('nvidia-fabricmanager-580', 'libnvidia-nscq-580')
    assert pk.preset_packages('ubuntu', '570').required[0] == 'nvidia-driver-570'
    assert pk.preset_packages('cuda-repo', '580').required == ('libnvidia-compute-580', 'nvidia-dkms-580-open')
    assert pk.preset_packages('cuda-repo', '590').required == ('libnvidia-compute', 'nvidia-dkms-open')
    assert pk.preset_backend('rhel-dnf') == 'dnf'
    with pytest.raises(pk.PackageError, match="branch must be a driver branch such as '580', got '58x'"):
        pk.preset_packages('ubuntu-server', '58x')
    with pytest.raises(pk.PackageError, match="unknown preset 'suse'"):
        pk.preset_packages('suse', '580')
    with pytest.raises(pk.PackageError, match="version '570.1.2' is not in driver branch '580'"):
        pk.check_version_in_branch('570.1.2', '580')


def test_presets_are_named_records():
    assert all(isinstance(p, pk.Preset) and p.backend in ('apt', 'dnf') for p in pk.PRESETS.values())
    cuda = pk.PRESETS['cuda-repo']
    assert cuda.unbranched_from == 590
    assert cuda.packages('589').optional[0] == 'cuda-drivers-589'
    unbranched = pk.PackageSet(('libnvidia-compute', 'nvidia-dkms-open'),
                               ('cuda-drivers', 'nvidia-open', 'nvidia-fabricmanager', 'libnvidia-nscq'))
    assert cuda.packages('600') == unbranched
    assert pk.PRESETS['rhel-dnf'].packages('580').required[0] == 'nvidia-driver'


# -- apt preferences, holds, policy -------------------------------------------------------------

def test_render_preferences_exact_text():
    text = pk.render_preferences({'nvidia-driver-580-server': '580.126.20-0ubuntu1',
                                  'libnvidia-compute-580-server': '580.126.20-0ubuntu1',
                                  'nvidia-fabricmanager-580': '580.126.20-1'})
    assert text == (
        'Explanation: managed by gpufleet.upgrade.driver_pin; exact driver version\n'
        'Package: libnvidia-compute-580-server nvidia-driver-580-server\n'
        'Pin: version 580.126.20-0ubuntu1\n'
        'Pin-Priority: 1001\n'
        '\n'
        'Explanation: managed by gpufleet.upgrade.driver_pin; exact driver version\n'
        'Package: nvidia-fabricmanager-580\n'
        'Pin: version 580.126.20-1\n'
        'Pin-Priority: 1001\n')
    assert pk.render_preferences({}) is None
    with pytest.raises(pk.PackageError, match='>= 1000'):
        pk.render_preferences({'a': '1'}, priority=990)


def test_parse_preferences_roundtrip_and_foreign_stanzas():
    pins = {'a': '1.0-1', 'b': '1.0-1', 'c': '2:3.0'}
    assert pk.parse_preferences(pk.render_preferences(pins)) == pins
    foreign = ('# comment\nPackage: *\nPin: release o=Ubuntu\nPin-Priority: 500\n\n'
               'Package: nvidia-*\nPin: version 580.95.05*\nPin-Priority: 1000\n')
    assert pk.parse_preferences(foreign) == {'nvidia-*': '580.95.05*'}
    assert pk.parse_preferences(None) == {}


def test_parse_dpkg_query_holds():
    e = pk.parse_dpkg_query(DPKG_QUERY)
    assert sorted(e) == ['libnvidia-compute-580-server', 'nvidia-dkms-580-server', 'nvidia-driver-580-server',
                         'nvidia-utils-580-server']
    assert e['nvidia-driver-580-server'].want == 'hold' and e['nvidia-driver-580-server'].installed
    assert not e['nvidia-dkms-580-server'].installed
    assert e['nvidia-utils-580-server'].want == 'hold' and not e['nvidia-utils-580-server'].installed
    assert pk.parse_showhold('nvidia-driver-580-server\nlibnvidia-compute-580-server:amd64\n\n') == [
        'libnvidia-compute-580-server', 'nvidia-driver-580-server']


def test_parse_policy():
    p = pk.parse_policy(POLICY)
    lc = p['libnvidia-compute-580-server']
    assert lc.installed == '580.126.20-0ubuntu1' and lc.candidate == '580.126.20-0ubuntu1'
    assert list(lc.versions) == ['580.130.00-0ubuntu1', '580.126.20-0ubuntu1']
    assert lc.downloadable() == ['580.130.00-0ubuntu1', '580.126.20-0ubuntu1']
    assert p['libnvidia-nscq-580'].installed is None
    # Installed only (from the status file): not downloadable.
    assert p['nvidia-driver-565-server'].downloadable() == []


def test_apt_config_for_root_confines_apt_and_dpkg():
    text = pk.apt_config_for_root('/srv/root', as_root=False)
    assert 'Dir "/srv/root/";' in text
    assert 'Dir::State::status "/srv/root/var/lib/dpkg/status";' in text
    assert '"--root=/srv/root"; "--admindir=/srv/root/var/lib/dpkg";' in text
    assert '"--force-not-root";' in text
    assert '--force-not-root' not in pk.apt_config_for_root('/srv/root', as_root=True)


# -- resolution ---------------------------------------------------------------------------------

def _policy(versions_by_name):
    return {n: pk.PolicyEntry(None, None, {v: ['500 file:/r ./ Packages'] for v in vs})
            for n, vs in versions_by_name.items()}


def test_resolve_optional_members_and_errors():
    pkgs = pk.PackageSet(('drv',), ('fm', 'nscq'))
    policy = _policy({'drv': ['580.126.20-0ubuntu1'], 'fm': ['580.126.20-1']})
    resolved, skipped = pk.resolve(pkgs, '580.126.20', policy, {}, install=True)
    assert resolved == {'drv': '580.126.20-0ubuntu1', 'fm': '580.126.20-1'}
    assert skipped == ['nscq']
    # An installed optional member that cannot follow the driver is an error, not a skip.
    with pytest.raises(pk.PackageError) as e:
        pk.resolve(pkgs, '580.126.20', policy, {'nscq': '580.95.05-1'}, install=True)
    assert str(e.value) == ('version 580.126.20 is not available, nothing was changed: nscq 580.126.20 is not '
                            'offered by the configured repositories (offered: none; installed: 580.95.05-1)')
    # An installed matching version is kept even when another revision is offered.
    resolved = pk.resolve(pk.PackageSet(('drv',)), '580.126.20',
                          _policy({'drv': ['580.126.20-0ubuntu2']}), {'drv': '580.126.20-0ubuntu1'}, install=True)[0]
    assert resolved == {'drv': '580.126.20-0ubuntu1'}


class FakeRunner(pk.Runner):
    """A runner answering from recorded outputs (argv prefix -> (rc, stdout, stderr))."""

    def __init__(self, answers, installroot=None):
        def run(argv, env):
            for prefix, answer in answers:
                if argv[:len(prefix)] == prefix:
                    return answer
            raise AssertionError('unexpected command %s' % argv)
        super().__init__(run, installroot)


def test_apt_plan_reads_only(tmp_path):
    runner = FakeRunner([
        (['dpkg-query'], (0, 'nvidia-driver-580-server\t580.126.20-0ubuntu1\thold ok installed\n', '')),
        (['apt-cache', 'policy'], (0, 'nvidia-driver-580-server:\n  Installed: 580.126.20-0ubuntu1\n'
                                      '  Candidate: 580.126.20-0ubuntu1\n  Version table:\n'
                                      '     580.130.00-0ubuntu1 500\n        500 file:/r ./ Packages\n'
                                      ' *** 580.126.20-0ubuntu1 100\n        500 file:/r ./ Packages\n', '')),
    ], installroot=str(tmp_path))
    b = pk.AptBackend(runner)
    try:
        plan = pk.plan_pin(b, pk.PackageSet(('nvidia-driver-580-server',)), '580.130.00', 'pinned', True)
    finally:
        b.close()
    assert plan.install == {'nvidia-driver-580-server': '580.130.00-0ubuntu1'}
    assert plan.before.holds == ['nvidia-driver-580-server']
    assert plan.after.pin_text.count('Pin: version 580.130.00-0ubuntu1') == 1
    assert [c[0] for c in runner.commands] == ['dpkg-query', 'apt-cache']
    assert runner.commands[0][1] == '--admindir=%s/var/lib/dpkg' % tmp_path
    assert not (tmp_path / 'etc').exists()
    d = plan.diff()
    assert d[0]['before'] == '' and 'Pin-Priority: 1001' in d[0]['after']
    assert d[2]['before'] == 'nvidia-driver-580-server=580.126.20-0ubuntu1\n'


def test_runner_error_names_command():
    r = FakeRunner([(['apt-get'], (100, '', 'E: Unable to locate package x'))])
    with pytest.raises(pk.PackageError, match=r'command failed \(rc=100\): apt-get install x: E: Unable to locate package x'):
        r(['apt-get', 'install', 'x'])


# -- T3-18: a held dpkg lock is waited for (bounded), an interrupted dpkg is refused ------------------
APT_LOCKED = ('E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (unattended-upgr)\n'
              'E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?')
DPKG_LOCKED = 'dpkg: error: dpkg frontend lock was locked by another process with pid 4242\nE: Sub-process dpkg --set-selections returned an error code (2)'


@pytest.mark.parametrize('output, held', [
    (APT_LOCKED, 'Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (unattended-upgr)'),
    (DPKG_LOCKED, 'dpkg frontend lock was locked by another process with pid 4242'),
    ('dpkg: error: dpkg status database is locked by another process', 'dpkg status database is locked by another process'),
    ('E: Unable to locate package x', None),
    ('', None),
])
def test_lock_holder(output, held):
    assert pk.lock_holder(output) == held


@pytest.mark.parametrize('journal, audit, why', [
    ([], '', None),
    (['tmp.i'], '', None),
    (['0001', '0000', 'tmp.i'], '', 'dpkg was interrupted: its journal holds 2 unapplied update(s) (var/lib/dpkg/updates/0000, 0001)'),
    ([], 'The following packages have been unpacked but not yet configured.\n libnvidia-nscq-580  stand-in\n',
     'dpkg --audit reports an unfinished package transaction: The following packages have been unpacked but not yet '
     'configured. libnvidia-nscq-580  stand-in'),
])
def test_dpkg_interrupted(journal, audit, why):
    assert pk.dpkg_interrupted(journal, audit) == why


class Clock:
    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds):
        self.now += seconds


def locked_backend(tmp_path, answers):
    """An apt backend whose commands answer in turn from `answers` (rc, stdout, stderr), on a fake clock."""
    calls = []
    clock = Clock()

    def run(argv, env):
        calls.append((clock.now, argv))
        return answers.pop(0) if len(answers) > 1 else answers[0]
    b = pk.AptBackend(pk.Runner(run, str(tmp_path)), lock_timeout=10, clock=lambda: clock.now, sleep=clock.sleep)
    return b, calls, clock


def test_apt_mark_is_retried_while_the_lock_is_held_then_runs(tmp_path):
    b, calls, clock = locked_backend(tmp_path, [(2, '', DPKG_LOCKED)] * 3 + [(0, '', '')])
    try:
        b.set_holds(['drv'], [])
    finally:
        b.close()
    assert calls == [(0.0, ['apt-mark', 'hold', 'drv']), (2.0, ['apt-mark', 'hold', 'drv']),
                     (4.0, ['apt-mark', 'hold', 'drv']), (6.0, ['apt-mark', 'hold', 'drv'])]


def test_apt_get_waits_for_the_lock_itself_within_what_is_left(tmp_path):
    b, calls, clock = locked_backend(tmp_path, [(100, '', APT_LOCKED), (0, '', '')])
    try:
        b.install({'drv': '1'})
    finally:
        b.close()
    assert [call[1][-2:] for call in calls] == [['-o', 'DPkg::Lock::Timeout=10'], ['-o', 'DPkg::Lock::Timeout=8']]
    assert calls[0][1][:4] == ['apt-get', '-q', '-y', 'install']


def test_a_lock_held_past_the_deadline_fails_naming_the_holder(tmp_path):
    b, calls, clock = locked_backend(tmp_path, [(2, '', DPKG_LOCKED)])
    with pytest.raises(pk.PackageError) as err:
        b.set_holds([], ['drv'])
    b.close()
    assert str(err.value) == (
        'the dpkg lock is held by another process for more than 10s (dpkg frontend lock was locked by another process '
        'with pid 4242; unattended-upgrades or another apt run?): apt-mark unhold drv did not run; rerun once the lock '
        'is free')
    assert clock.now == 10 and len(calls) == 6


def test_another_failure_is_not_retried(tmp_path):
    b, calls, clock = locked_backend(tmp_path, [(100, '', 'E: Unable to locate package drv')])
    with pytest.raises(pk.PackageError, match=r'^command failed \(rc=100\): apt-get -q -y install .* drv=1 -o '
                                              r'DPkg::Lock::Timeout=10: E: Unable to locate package drv$'):
        b.install({'drv': '1'})
    b.close()
    assert len(calls) == 1


def test_an_interrupted_dpkg_is_refused_before_anything_changes(tmp_path):
    (tmp_path / 'var/lib/dpkg/updates').mkdir(parents=True)
    (tmp_path / 'var/lib/dpkg/updates/0003').write_text('')
    b, calls, clock = locked_backend(tmp_path, [(0, '', '')])
    with pytest.raises(pk.PackageError) as err:
        b.check_dpkg()
    b.close()
    assert str(err.value).startswith('dpkg was interrupted: its journal holds 1 unapplied update(s) '
                                     '(var/lib/dpkg/updates/0003). This module does not finish a package transaction '
                                     'it did not start')
    assert str(err.value).endswith('then rerun; nothing was changed')
    assert calls == []


def test_unconfigured_packages_are_refused_and_a_clean_database_passes(tmp_path):
    audit = 'The following packages have been unpacked but not yet configured.\n drv   the driver\n'
    b, calls, clock = locked_backend(tmp_path, [(0, audit, '')])
    with pytest.raises(pk.PackageError, match='^dpkg --audit reports an unfinished package transaction: The following'):
        b.check_dpkg()
    assert calls[0][1] == ['dpkg', '--admindir=%s/var/lib/dpkg' % tmp_path, '--audit']
    b.close()
    b, calls, clock = locked_backend(tmp_path, [(0, '', '')])
    b.check_dpkg()
    b.close()


# -- dnf ----------------------------------------------------------------------------------------

@pytest.mark.parametrize('os_release,mode', [
    ('ID="rhel"\nVERSION_ID="9.4"\n', 'module'),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="8.10"\n', 'module'),
    ('ID="rhel"\nVERSION_ID="10.0"\n', 'versionlock'),
    ('ID=fedora\nVERSION_ID=42\n', 'versionlock'),
])
def test_dnf_lock_mode(os_release, mode):
    assert pk.dnf_lock_mode(pk.parse_os_release(os_release)) == mode


def test_dnf_versionlock_commands():
    pins = {'nvidia-driver': '3:580.126.20-1.el10', 'nvidia-driver-libs': '3:580.126.20-1.el10'}
    prev = {'nvidia-driver': '3:580.95.05-1.el10'}
    cmds = pk.dnf_pin_commands(pins, prev, 'versionlock', '580', '-dkms', {'nvidia-driver': '3:580.126.20-1.el10'}, '/mnt/sysimage')
    base = ['dnf', '-y', '-q', '--installroot=/mnt/sysimage', '--setopt=pluginconfpath=/mnt/sysimage/etc/dnf/plugins']
    assert cmds == [
        base + ['install', '--allowerasing', 'nvidia-driver-3:580.126.20-1.el10'],
        base + ['versionlock', 'delete', 'nvidia-driver'],
        base + ['versionlock', 'add', 'nvidia-driver-3:580.126.20-1.el10', 'nvidia-driver-libs-3:580.126.20-1.el10'],
    ]
    # Already locked at that version: nothing to do.
    assert pk.dnf_pin_commands(pins, dict(pins), 'versionlock', '580', '-dkms', {}, None) == []
    assert pk.dnf_unpin_commands(['nvidia-driver', 'x'], prev, None) == [
        ['dnf', '-y', '-q', 'versionlock', 'delete', 'nvidia-driver']]


def test_dnf_base_reads_the_plugin_configuration_under_the_root():
    # --installroot alone leaves pluginconfpath on the host: `versionlock add` would write the host's list.
    assert pk.dnf_base(None) == ['dnf', '-y', '-q']
    assert pk.dnf_base('/mnt/sysimage') == ['dnf', '-y', '-q', '--installroot=/mnt/sysimage',
                                            '--setopt=pluginconfpath=/mnt/sysimage/etc/dnf/plugins']
    assert pk.dnf_unpin_commands(['nvidia-driver'], {'nvidia-driver': '3:580.95.05-1.el10'}, '/mnt/sysimage') == [
        pk.dnf_base('/mnt/sysimage') + ['versionlock', 'delete', 'nvidia-driver']]


def test_dnf_backend_commands_use_the_roots_plugins(tmp_path):
    runner = FakeRunner([(['dnf'], (0, '', ''))], installroot=str(tmp_path))
    b = pk.DnfBackend(runner, branch='580', mode='versionlock')
    b.available(['nvidia-driver'])
    b.update_cache()
    b.install({'nvidia-driver': '3:580.130.00-1.el9'})
    dnf = [c for c in runner.commands if c[0] == 'dnf']
    assert len(dnf) == 3
    assert all(c[3:5] == ['--installroot=%s' % tmp_path, '--setopt=pluginconfpath=%s/etc/dnf/plugins' % tmp_path]
               for c in dnf)


def test_dnf_module_stream_commands():
    cmds = pk.dnf_pin_commands({'nvidia-driver': '3:580.126.20-1.el9'}, {}, 'module', '580', '-dkms',
                               {'nvidia-driver': '3:580.126.20-1.el9'}, None)
    assert cmds == [
        ['dnf', '-y', '-q', 'module', 'reset', 'nvidia-driver'],
        ['dnf', '-y', '-q', 'module', 'enable', 'nvidia-driver:580-dkms'],
        ['dnf', '-y', '-q', 'install', '--allowerasing', 'nvidia-driver-3:580.126.20-1.el9'],
    ]
    with pytest.raises(pk.PackageError, match='needs a branch'):
        pk.dnf_pin_commands({'a': '1-1'}, {}, 'module', None, '-dkms', {}, None)


def test_versionlock_parse_and_entries():
    text = ('# added by dnf\nnvidia-driver-3:580.126.20-1.el10.*\nnvidia-driver-libs-3:580.126.20-1.el10.x86_64\n'
            '!kernel-6.1-1.fc40.*\nlibnvidia-nscq-580.126.20-1.*\n')
    assert pk.parse_versionlock(text) == {'nvidia-driver': '3:580.126.20-1.el10', 'nvidia-driver-libs': '3:580.126.20-1.el10',
                                          'libnvidia-nscq': '580.126.20-1'}
    assert pk.versionlock_entry('nvidia-driver', '3:580.126.20-1.el10') == 'nvidia-driver-3:580.126.20-1.el10.*'
    assert pk.parse_versionlock(pk.versionlock_entry('a-b', '1.0-2') + '\n') == {'a-b': '1.0-2'}


def test_dnf_list_and_rpm_parsers():
    out = ('Available Packages\nnvidia-driver.x86_64   3:580.126.20-1.el10   cuda-rhel10-x86_64\n'
           'nvidia-driver.x86_64   3:580.130.00-1.el10   cuda-rhel10-x86_64\n')
    assert pk.parse_dnf_list(out) == {'nvidia-driver': ['3:580.126.20-1.el10', '3:580.130.00-1.el10']}
    assert pk.parse_rpm_query('nvidia-driver\t3:580.126.20-1.el10\nkernel\t0:6.12.0-55.el10\n') == {
        'nvidia-driver': '3:580.126.20-1.el10', 'kernel': '6.12.0-55.el10'}


def test_dnf_plan_with_recorded_outputs(tmp_path):
    (tmp_path / 'etc').mkdir()
    (tmp_path / 'etc/os-release').write_text('ID="rhel"\nVERSION_ID="10.0"\n')
    runner = FakeRunner([
        (['rpm'], (0, 'nvidia-driver\t3:580.95.05-1.el10\n', '')),
        (pk.dnf_base(str(tmp_path)) + ['list'],
         (0, 'nvidia-driver.x86_64  3:580.126.20-1.el10  cuda\nnvidia-driver.x86_64  3:580.95.05-1.el10  cuda\n', '')),
    ], installroot=str(tmp_path))
    b = pk.DnfBackend(runner, branch='580')
    assert b.mode == 'versionlock'
    plan = pk.plan_pin(b, pk.PackageSet(('nvidia-driver',)), '580.126.20', 'pinned', True)
    assert plan.changed
    assert plan.commands[-1][-3:] == ['versionlock', 'add', 'nvidia-driver-3:580.126.20-1.el10']
    assert plan.after.pin_text == 'nvidia-driver-3:580.126.20-1.el10.*\n'
    assert runner.commands[0] == ['rpm', '--root=%s' % tmp_path, '-qa', '--qf', '%{NAME}\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\n']


def _rhel10_versionlock(tmp_path, conf):
    (tmp_path / 'etc/dnf/plugins').mkdir(parents=True)
    (tmp_path / 'etc/os-release').write_text('ID="rhel"\nVERSION_ID="10.0"\n')
    if conf is not None:
        (tmp_path / 'etc/dnf/plugins/versionlock.conf').write_text(conf)
    runner = FakeRunner([
        (['rpm'], (0, 'nvidia-driver\t3:580.95.05-1.el10\n', '')),
        (pk.dnf_base(str(tmp_path)) + ['list'], (0, 'nvidia-driver.x86_64  3:580.126.20-1.el10  cuda\n', '')),
    ], installroot=str(tmp_path))
    return pk.DnfBackend(runner, branch='580')


def test_dnf_backend_refuses_a_lock_list_outside_the_root(tmp_path):
    # The root's plugin configuration (the one dnf_base makes dnf read) names the host's list.
    b = _rhel10_versionlock(tmp_path, '[main]\nenabled = 1\nlocklist = /etc/dnf/plugins/versionlock.list\n')
    with pytest.raises(pk.PackageError) as e:
        pk.plan_pin(b, pk.PackageSet(('nvidia-driver',)), '580.126.20', 'pinned', True)
    assert str(e.value) == ("installroot %r: the versionlock list of %s/etc/dnf/plugins/versionlock.conf is "
                            "'/etc/dnf/plugins/versionlock.list', outside the install root; nothing was changed"
                            % (str(tmp_path), tmp_path))
    assert [c[0] for c in b.runner.commands] == ['rpm']     # refused before dnf ran


def test_dnf_backend_lock_list_under_the_root(tmp_path):
    lock = tmp_path / 'var/lib/locks/versionlock.list'
    b = _rhel10_versionlock(tmp_path, '[main]\nlocklist = %s\n' % lock)
    assert b.pin_path == str(lock)
    # Without the configuration (or its locklist setting): the plugin's default list under the root.
    assert _rhel10_versionlock(tmp_path / 'a', None).pin_path == str(tmp_path / 'a/etc/dnf/plugins/versionlock.list')
    assert _rhel10_versionlock(tmp_path / 'b', '[main]\n').pin_path == str(tmp_path / 'b/etc/dnf/plugins/versionlock.list')


MODULE_LIST = """\
Red Hat Enterprise Linux 9 for x86_64 - AppStream
Name            Stream         Profiles                     Summary
nvidia-driver   580-dkms [e]   default [d], fm, ks, src      Nvidia driver for 580-dkms branch

Hint: [d]efault, [e]nabled, [x]disabled, [i]nstalled
"""


def _rhel9(tmp_path, enabled_out):
    (tmp_path / 'etc').mkdir(exist_ok=True)
    (tmp_path / 'etc/os-release').write_text('ID="rhel"\nVERSION_ID="9.4"\n')
    return FakeRunner([
        (['rpm'], (0, 'nvidia-driver\t3:580.126.20-1.el9\n', '')),
        (pk.dnf_base(str(tmp_path)) + ['module', 'list'], (0, enabled_out, '')),
        (pk.dnf_base(str(tmp_path)) + ['list'],
         (0, 'nvidia-driver.x86_64  3:580.126.20-1.el9  cuda\nnvidia-driver.x86_64  3:580.130.00-1.el9  cuda\n', '')),
    ], installroot=str(tmp_path))


def test_parse_module_list():
    assert pk.parse_module_list(MODULE_LIST) == '580-dkms'
    assert pk.parse_module_list(MODULE_LIST.replace(' [e]', '')) is None


def test_dnf_module_stream_plan(tmp_path):
    # Stream already enabled and version installed: nothing to do.
    b = pk.DnfBackend(_rhel9(tmp_path, MODULE_LIST), branch='580')
    assert b.mode == 'module'
    plan = pk.plan_pin(b, pk.PackageSet(('nvidia-driver',)), '580.126.20', 'pinned', True)
    assert not plan.changed and plan.commands == []
    # Another version: install only (the stream stays).
    plan = pk.plan_pin(b, pk.PackageSet(('nvidia-driver',)), '580.130.00', 'pinned', True)
    assert plan.commands == [pk.dnf_base(str(tmp_path)) + ['install', '--allowerasing', 'nvidia-driver-3:580.130.00-1.el9']]
    # No stream enabled: reset + enable, shown in the diff.
    b = pk.DnfBackend(_rhel9(tmp_path, ''), branch='580')
    plan = pk.plan_pin(b, pk.PackageSet(('nvidia-driver',)), '580.126.20', 'pinned', False)
    assert [c[5:] for c in plan.commands] == [['module', 'reset', 'nvidia-driver'], ['module', 'enable', 'nvidia-driver:580-dkms']]
    assert plan.diff()[0] == {'before_header': 'dnf module nvidia-driver', 'after_header': 'dnf module nvidia-driver',
                              'before': '', 'after': 'nvidia-driver:580-dkms\n'}
    # Unpinned resets the module when a stream is enabled.
    b = pk.DnfBackend(_rhel9(tmp_path, MODULE_LIST), branch='580')
    plan = pk.plan_pin(b, pk.PackageSet(('nvidia-driver',)), None, 'unpinned', False)
    assert [c[5:] for c in plan.commands] == [['module', 'reset', 'nvidia-driver']]


APT_SHOW = """Package: nvidia-driver-580-server
Version: 580.130.00-0ubuntu1
Architecture: amd64
Description: NVIDIA driver
 a continuation line: SHA256: not this one
SHA256: 0F3A5E1B2C3D4E5F60718293A4B5C6D7E8F90A1B2C3D4E5F60718293A4B5C6D7
Filename: pool/n/nvidia-driver-580-server_580.130.00-0ubuntu1_amd64.deb

Package: nvidia-fabricmanager-580
Version: 580.130.00-1
SHA256: short

Package: libnvidia-compute-580-server
Version: 580.130.00-0ubuntu1
SHA256: 1111111111111111111111111111111111111111111111111111111111111111
"""


def test_parse_apt_show_gives_each_package_files_sha256_from_the_index():
    found = pk.parse_apt_show(APT_SHOW)
    assert found == {('nvidia-driver-580-server', '580.130.00-0ubuntu1'): '0f3a5e1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7',
                     ('libnvidia-compute-580-server', '580.130.00-0ubuntu1'): '1' * 64}
    assert pk.parse_apt_show('') == {}


def test_package_artifacts_record_every_package_and_a_digest_only_where_the_index_gives_one():
    versions = {'nvidia-driver-580-server': '580.130.00-0ubuntu1', 'nvidia-fabricmanager-580': '580.130.00-1'}
    arts = pk.package_artifacts(versions, pk.parse_apt_show(APT_SHOW))
    assert arts == [{'kind': 'package', 'name': 'nvidia-driver-580-server', 'version': '580.130.00-0ubuntu1',
                     'sha256': '0f3a5e1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7'},
                    {'kind': 'package', 'name': 'nvidia-fabricmanager-580', 'version': '580.130.00-1'}]


def test_index_age_is_the_newest_of_the_stamp_and_the_lists(tmp_path):
    lists = tmp_path / 'lists'
    lists.mkdir()
    stamp = tmp_path / 'update-success-stamp'
    assert pk.index_age(str(lists), str(stamp), now=1000.0) is None          # never refreshed
    (lists / 'lock').write_text('')
    (lists / 'partial').mkdir()
    assert pk.index_age(str(lists), str(stamp), now=1000.0) is None          # the lock and partial/ are no index
    idx = lists / 'mirror_dists_noble_InRelease'
    idx.write_text('x')
    os.utime(idx, (400.0, 400.0))
    assert pk.index_age(str(lists), str(stamp), now=1000.0) == 600.0
    stamp.write_text('')
    os.utime(stamp, (900.0, 900.0))
    assert pk.index_age(str(lists), str(stamp), now=1000.0) == 100.0
    assert pk.index_age(str(lists), str(stamp), now=800.0) == 0.0            # a clock behind the files


def test_update_cache_skips_lists_younger_than_the_bound(tmp_path):
    ran = []

    def run(argv, env):
        ran.append(argv)
        return 0, '', ''
    b = pk.AptBackend(pk.Runner(run, str(tmp_path)))
    lists = tmp_path / 'var/lib/apt/lists'
    lists.mkdir(parents=True)
    (lists / 'InRelease').write_text('x')
    now = (lists / 'InRelease').stat().st_mtime
    assert b.update_cache(3600, now=now + 60) is False and ran == []
    assert b.update_cache(3600, now=now + 4000) is True and ran[-1][:3] == ['apt-get', '-q', 'update']
    assert b.update_cache(0, now=now) is True and len(ran) == 2                # 0: always
    b.close()


def test_dnf_metadata_expire():
    assert pk.dnf_expire(0) == [] and pk.dnf_expire(900) == ['--setopt=metadata_expire=900']
