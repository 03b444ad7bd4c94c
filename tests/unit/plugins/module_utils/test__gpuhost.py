"""Host facts: /proc/modules, boot time, driver packages (recorded dpkg-query/rpm), kernel-log sources."""
from __future__ import annotations

import datetime as dt

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _gpuhost
from tools.recorded_runner import RecordedRunner

PROC_MODULES = """\
nvidia_uvm 1982464 4 - Live 0x0000000000000000 (POE)
nvidia_drm 122880 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1830912 1 nvidia_drm, Live 0x0000000000000000 (POE)
nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)
ib_core 507904 9 nvidia_peermem,rdma_cm,ib_ipoib,iw_cm,ib_umad,rdma_ucm,ib_uverbs,mlx5_ib,ib_cm, Live 0x0000000000000000
nvidia 104071168 37 nvidia_uvm,nvidia_modeset,nvidia_peermem, Live 0x0000000000000000 (POE)
drm_kms_helper 311296 1 nvidia_drm, Live 0x0000000000000000
gdrdrv 24576 0 - Live 0x0000000000000000 (OE)
"""

DPKG_PATTERNS = ['*nvidia*', 'cuda-drivers*', 'datacenter-gpu-manager*']
DPKG_ARGV = ['dpkg-query', '-W', '-f', '${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'] + DPKG_PATTERNS


def test_nvidia_modules_with_refcounts_and_users(tmp_path):
    path = tmp_path / 'modules'
    path.write_text(PROC_MODULES)
    assert _gpuhost.nvidia_modules(str(path)) == [
        {'name': 'nvidia_uvm', 'refcount': 4, 'used_by': []},
        {'name': 'nvidia_drm', 'refcount': 0, 'used_by': []},
        {'name': 'nvidia_modeset', 'refcount': 1, 'used_by': ['nvidia_drm']},
        {'name': 'nvidia_peermem', 'refcount': 0, 'used_by': []},
        {'name': 'nvidia', 'refcount': 37, 'used_by': ['nvidia_uvm', 'nvidia_modeset', 'nvidia_peermem']},
        {'name': 'gdrdrv', 'refcount': 0, 'used_by': []},
    ]
    assert _gpuhost.nvidia_modules(str(tmp_path / 'absent')) == []


def test_boot_time_from_proc_stat(tmp_path):
    stat = tmp_path / 'stat'
    stat.write_text('cpu  1 2 3 4\nintr 0\nctxt 99\nbtime 1786363200\nprocesses 1\n')
    assert _gpuhost.boot_time(str(stat)) == dt.datetime(2026, 8, 10, 12, 0, tzinfo=dt.timezone.utc)
    assert _gpuhost.boot_time(str(tmp_path / 'absent')) is None


def test_dpkg_packages_installed_only_sorted():
    out = ('ii \tnvidia-driver-580-server\t580.126.20-0ubuntu0.24.04.1\n'
           'hi \tlibnvidia-compute-580-server\t580.126.20-0ubuntu0.24.04.1\n'
           'un \tnvidia-driver-570-server\t\n'
           'rc \tnvidia-dkms-570-server\t570.195.03-0ubuntu0.24.04.1\n'
           'ii \tnvidia-fabricmanager-580\t580.126.20-1\n'
           'iW \tlinux-modules-nvidia-580-server-generic\t6.8.0-134.134\n')
    runner = RecordedRunner([{'argv': DPKG_ARGV, 'rc': 1, 'out': out,
                              'err': 'dpkg-query: no packages found matching datacenter-gpu-manager*\n'}],
                            programs={'dpkg-query', 'rpm'})
    assert _gpuhost.installed_driver_packages(runner) == [
        {'name': 'libnvidia-compute-580-server', 'version': '580.126.20-0ubuntu0.24.04.1'},
        {'name': 'linux-modules-nvidia-580-server-generic', 'version': '6.8.0-134.134'},
        {'name': 'nvidia-driver-580-server', 'version': '580.126.20-0ubuntu0.24.04.1'},
        {'name': 'nvidia-fabricmanager-580', 'version': '580.126.20-1'},
    ]
    runner.assert_done()


def test_dpkg_failure_is_an_error():
    runner = RecordedRunner([{'argv': DPKG_ARGV, 'rc': 2, 'err': 'dpkg-query: error: database is locked\n'}],
                            programs={'dpkg-query'})
    with pytest.raises(_gpuhost.HostError, match='dpkg-query failed \\(rc 2\\): dpkg-query: error: database is locked'):
        _gpuhost.installed_driver_packages(runner)


def test_rpm_packages_drop_zero_epoch():
    argv = ['rpm', '-qa', '--qf', '%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\n'] + DPKG_PATTERNS
    out = ('kmod-nvidia-open-dkms\t3:580.126.20-1.el9\n'
           'nvidia-driver\t3:580.126.20-1.el9\n'
           'nvidia-fabric-manager\t0:580.126.20-1\n')
    runner = RecordedRunner([{'argv': argv, 'out': out}], programs={'rpm'})
    assert _gpuhost.installed_driver_packages(runner) == [
        {'name': 'kmod-nvidia-open-dkms', 'version': '3:580.126.20-1.el9'},
        {'name': 'nvidia-driver', 'version': '3:580.126.20-1.el9'},
        {'name': 'nvidia-fabric-manager', 'version': '580.126.20-1'},
    ]


def test_no_package_tool_gives_no_packages():
    assert _gpuhost.installed_driver_packages(RecordedRunner([])) == []


def test_journal_since_boot_and_since_time():
    lines = '2026-08-10T14:03:22.123456+00:00 n kernel: NVRM: Xid (PCI:0000:17:00): 79, x\n'
    runner = RecordedRunner([
        {'argv': ['journalctl', '-k', '--no-pager', '-q', '-o', 'short-iso-precise', '-b'], 'out': lines},
        {'argv': ['journalctl', '-k', '--no-pager', '-q', '-o', 'short-iso-precise', '--since', '@1786363200'], 'out': ''},
    ], programs={'journalctl'})
    assert _gpuhost.read_kernel_log(runner, 'journal', None, True) == [lines.strip()]
    since = dt.datetime(2026, 8, 10, 12, 0, tzinfo=dt.timezone.utc)
    assert _gpuhost.read_kernel_log(runner, 'journal', since, False) == []
    runner.assert_done()


def test_dmesg_falls_back_to_raw_times():
    runner = RecordedRunner([
        {'argv': ['dmesg', '--time-format', 'iso'], 'rc': 1, 'err': "dmesg: unknown time format: iso\n"},
        {'argv': ['dmesg'], 'out': '[ 3605.250117] NVRM: Xid (PCI:0000:17:00): 79, x\n'},
    ], programs={'dmesg'})
    assert _gpuhost.read_kernel_log(runner, 'dmesg', None, True) == ['[ 3605.250117] NVRM: Xid (PCI:0000:17:00): 79, x']
    runner.assert_done()


def test_kernel_log_sources_missing_are_clear_errors(tmp_path):
    with pytest.raises(_gpuhost.HostError, match='kernel_log=journal: journalctl not found on this host'):
        _gpuhost.read_kernel_log(RecordedRunner([]), 'journal', None, True)
    with pytest.raises(_gpuhost.HostError, match='kernel_log=.*absent.log: cannot read the file: No such file or directory'):
        _gpuhost.read_kernel_log(RecordedRunner([]), str(tmp_path / 'absent.log'), None, True)


def test_module_runner_bounds_commands_with_timeout():
    class FakeModule:
        def __init__(self):
            self.seen = None

        def get_bin_path(self, name, required=False):
            return {'timeout': '/usr/bin/timeout'}.get(name)

        def run_command(self, argv, check_rc=False, environ_update=None):
            self.seen = (argv, environ_update)
            return 0, 'out', ''

    m = FakeModule()
    assert _gpuhost.ModuleRunner(m).run(['nvidia-smi', '-q', '-x'], timeout=60) == (0, 'out', '')
    assert m.seen == (['/usr/bin/timeout', '-k', '5', '60', 'nvidia-smi', '-q', '-x'], {'LANG': 'C', 'LC_ALL': 'C'})
