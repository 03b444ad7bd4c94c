"""driver_pin and node_snapshot against real dpkg/apt under an install root.

The repository holds the Ubuntu `-server` driver set, Fabric Manager and NSCQ at 580.126.20 and
580.130.00 (tests/tools/debrepo.py). Every module runs through ansible-runner; every check reads
the root back with the real `dpkg-query`/`apt-mark`.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

from tools import debrepo
from tools.debrepo import BROKEN, KERNEL_NEW, KERNEL_OLD, NEW, OLD, AptRoot, host_dpkg_digest

pytestmark = pytest.mark.slow

DRIVER_SET = ['nvidia-driver-580-server', 'libnvidia-compute-580-server', 'nvidia-kernel-common-580-server',
              'nvidia-dkms-580-server', 'nvidia-utils-580-server', 'nvidia-compute-utils-580-server']
FM_SET = ['nvidia-fabricmanager-580', 'libnvidia-nscq-580']
PIN_FILE = 'etc/apt/preferences.d/gpufleet-nvidia-driver.pref'

# Fixtures from the test support module.
deb_repo = debrepo.deb_repo
apt_root = debrepo.apt_root
deb_repo_with_broken = debrepo.deb_repo_with_broken


@pytest.fixture(autouse=True)
def host_untouched():
    before = host_dpkg_digest()
    yield
    assert host_dpkg_digest() == before, "the host's dpkg database or apt preferences changed"


def pin_task(root: AptRoot, version: str | None = None, name: str = 'pin', **kw):
    args = {'preset': 'ubuntu-server', 'branch': '580', 'installroot': str(root.path)}
    if version:
        args['version'] = version
    args.update(kw)
    return {'name': name, 'gpufleet.upgrade.driver_pin': args, 'register': 'out'}


def play(*tasks, check: bool = False, diff: bool = False):
    p = {'hosts': 'localhost', 'gather_facts': False, 'tasks': list(tasks)}
    if check:
        p['check_mode'] = True
    if diff:
        p['diff'] = True
    return [p]


def expect(root: AptRoot, upstream: str, names: tuple[str, ...] | list[str] = tuple(DRIVER_SET + FM_SET)) -> None:
    inst = root.installed()
    want = {n: ('%s-1' % upstream if n in FM_SET else '%s-0ubuntu1' % upstream) for n in names}
    assert {n: inst.get(n) for n in names} == want


def fake_node(root: AptRoot, tmp_path: pathlib.Path, kernel: str = KERNEL_OLD,
              grub_default: str = 'saved', saved_entry: str | None = 'gnulinux-%s-advanced') -> pathlib.Path:
    """Boot, modprobe and /proc files of a node, under the root (proc is a separate directory).

    The running kernel's linux-image package is installed under the root, as on a real node.
    """
    root.apt_get('install', '-y', 'linux-image-%s' % kernel)
    (root.path / 'etc/default/grub').write_text('GRUB_DEFAULT="%s"\nGRUB_TIMEOUT=5\n' % grub_default)
    env = '# GRUB Environment Block\n' + ('saved_entry=%s\n' % (saved_entry % kernel) if saved_entry else '')
    (root.path / 'boot/grub/grubenv').write_text(env + '#' * (1024 - len(env)))
    (root.path / 'etc/modprobe.d').mkdir(parents=True, exist_ok=True)
    (root.path / 'etc/modprobe.d/nvidia.conf').write_text('options nvidia NVreg_EnableGpuFirmware=1\n')
    (root.path / 'etc/modprobe.d/blacklist.conf').write_text('blacklist floppy\n')
    proc = tmp_path / 'proc'
    (proc / 'sys/kernel').mkdir(parents=True, exist_ok=True)
    (proc / 'sys/kernel/osrelease').write_text(kernel + '\n')
    (proc / 'cmdline').write_text('BOOT_IMAGE=/vmlinuz-%s root=/dev/sda1 ro\n' % kernel)
    return proc


# As registered from gpufleet.upgrade.gpu_info: task-result keys included.
GPU_FACTS = {'changed': False, 'backend': 'nvml', 'driver_version': OLD, 'gpus': [
    {'index': 0, 'uuid': 'GPU-0', 'name': 'NVIDIA H100 80GB HBM3', 'bus_id': '00000000:17:00.0',
     'pci_id': '10de:2330/10de:16c1', 'mig_mode': {'current': True, 'pending': True}}]}


def test_pin_install_snapshot_upgrade_restore(apt_root, run_playbook, tmp_path):
    root = apt_root
    # An NVSwitch node: Fabric Manager and NSCQ come with the driver at the same version.
    # Their dependency on the versioned virtual package only resolves next to the same kernel-common.
    root.apt_get('install', '-y', 'nvidia-fabricmanager-580=%s-1' % OLD, 'libnvidia-nscq-580=%s-1' % OLD,
                 'nvidia-kernel-common-580-server=%s-0ubuntu1' % OLD)
    proc = fake_node(root, tmp_path)
    snap_path = tmp_path / 'snapshots' / 'gpu-1.json'

    r = run_playbook(play(pin_task(root, OLD, install=True)))
    assert r.rc == 0, r.stdout
    res = r.result('pin')
    assert res['changed'] is True and res['skipped_packages'] == []
    assert res['resolved']['nvidia-fabricmanager-580'] == '%s-1' % OLD
    expect(root, OLD)
    assert root.holds() == set(DRIVER_SET + FM_SET)
    pin_text = (root.path / PIN_FILE).read_text()
    assert 'Pin: version %s-0ubuntu1\nPin-Priority: 1001' % OLD in pin_text
    assert 'Package: libnvidia-nscq-580 nvidia-fabricmanager-580\nPin: version %s-1' % OLD in pin_text

    snap_task = {'name': 'snap', 'register': 'snap', 'gpufleet.upgrade.node_snapshot': {
        'state': 'captured', 'path': str(snap_path), 'installroot': str(root.path), 'proc_path': str(proc),
        'gpu_facts': GPU_FACTS}}
    r = run_playbook(play(snap_task))
    assert r.rc == 0, r.stdout
    snap = r.result('snap')
    assert snap['changed'] is True
    doc = json.loads(snap_path.read_text())
    assert doc['sha256'] == snap['sha256']
    s = doc['snapshot']
    assert s['packages']['nvidia-driver-580-server'] == '%s-0ubuntu1' % OLD
    assert s['packages']['nvidia-fabricmanager-580'] == '%s-1' % OLD
    assert sorted(s['holds']) == sorted(DRIVER_SET + FM_SET)
    assert s['pins']['content'] == pin_text
    assert s['boot'] == {'running_kernel': '6.8.0-134-generic', 'cmdline': 'BOOT_IMAGE=/vmlinuz-6.8.0-134-generic root=/dev/sda1 ro',
                         'grub_default': 'saved', 'grubenv_path': 'boot/grub/grubenv',
                         'saved_entry': 'gnulinux-6.8.0-134-generic-advanced', 'default_kernel': KERNEL_OLD}
    assert s['kernel_packages'] == {'linux-image-%s' % KERNEL_OLD: '6.8.0-134.134'}
    assert s['modprobe'] == {'etc/modprobe.d/nvidia.conf': 'options nvidia NVreg_EnableGpuFirmware=1\n'}
    assert s['mig']['gpus'][0]['mig_mode'] == {'current': True, 'pending': True}
    assert s['gpu_facts']['driver_version'] == OLD and 'changed' not in s['gpu_facts']
    assert (snap_path.stat().st_mode & 0o777) == 0o600

    # A second capture keeps the rollback point.
    r = run_playbook(play(snap_task))
    assert r.result('snap')['changed'] is False and json.loads(snap_path.read_text()) == doc

    # Upgrade: the pin moves, everything follows (FM and NSCQ included), holds are kept.
    r = run_playbook(play(pin_task(root, NEW, install=True)))
    assert r.rc == 0, r.stdout
    res = r.result('pin')
    assert res['previous']['pins']['nvidia-driver-580-server'] == '%s-0ubuntu1' % OLD
    assert res['installed_changes']['nvidia-fabricmanager-580'] == '%s-1' % NEW
    expect(root, NEW)
    assert root.holds() == set(DRIVER_SET + FM_SET)
    # The upgrade also installed a newer kernel, changed the boot default and the module options.
    root.apt_get('install', '-y', 'linux-image-%s' % KERNEL_NEW)
    (root.path / 'boot/grub/grubenv').write_text('# GRUB Environment Block\nsaved_entry=gnulinux-6.8.0-140-generic-advanced\n')
    (root.path / 'etc/modprobe.d/nvidia.conf').write_text('options nvidia NVreg_EnableGpuFirmware=0\n')

    restore = {'name': 'restore', 'register': 'rs', 'gpufleet.upgrade.node_snapshot': {
        'state': 'restored', 'path': str(snap_path), 'installroot': str(root.path), 'sha256': doc['sha256']}}
    digest_before = root.state_digest()
    r = run_playbook(play(restore, check=True, diff=True))
    assert r.rc == 0, r.stdout
    res = r.result('restore')
    assert res['changed'] is True and root.state_digest() == digest_before
    assert sorted(res['changed_files']) == ['boot/grub/grubenv', 'etc/modprobe.d/nvidia.conf']
    expect(root, NEW)

    r = run_playbook(play(restore, diff=True))
    assert r.rc == 0, r.stdout
    res = r.result('restore')
    assert res['changed'] is True
    expect(root, OLD)  # downgraded, verified with dpkg-query under the root
    assert root.holds() == set(DRIVER_SET + FM_SET)
    assert (root.path / PIN_FILE).read_text() == pin_text
    assert 'saved_entry=gnulinux-6.8.0-134-generic-advanced\n' in (root.path / 'boot/grub/grubenv').read_text()
    assert len((root.path / 'boot/grub/grubenv').read_bytes()) == 1024
    assert (root.path / 'etc/modprobe.d/nvidia.conf').read_text() == 'options nvidia NVreg_EnableGpuFirmware=1\n'

    r = run_playbook(play(restore))
    assert r.rc == 0 and r.result('restore')['changed'] is False


@pytest.mark.parametrize('install', [True, False])
def test_unavailable_version_fails_before_any_change(apt_root, run_playbook, install):
    root = apt_root
    r = run_playbook(play(pin_task(root, OLD, install=True)))
    assert r.rc == 0, r.stdout
    before = root.state_digest()
    r = run_playbook(play(pin_task(root, '580.999.99', install=install)))
    assert r.rc != 0
    res = r.result('pin')
    assert res['_event'] == 'runner_on_failed'
    assert 'version 580.999.99 is not available, nothing was changed' in res['msg']
    assert 'nvidia-driver-580-server 580.999.99 is not offered' in res['msg']
    assert '580.130.00-0ubuntu1, 580.126.20-0ubuntu1' in res['msg']
    assert root.state_digest() == before
    expect(root, OLD, DRIVER_SET)
    assert not any(c[:2] == ['apt-get', '-q'] and 'install' in c for c in res['commands'])


def test_version_outside_branch_is_rejected(apt_root, run_playbook):
    r = run_playbook(play(pin_task(apt_root, '570.195.03')))
    assert r.rc != 0
    assert r.result('pin')['msg'] == "version '570.195.03' is not in driver branch '580'"


def test_idempotency_ladder_and_diff(apt_root, run_playbook):
    root = apt_root
    task = pin_task(root, NEW, install=True)
    seen = []
    for check in (True, False, True, False):
        before = root.state_digest()
        r = run_playbook(play(task, check=check, diff=True))
        assert r.rc == 0, r.stdout
        res = r.result('pin')
        seen.append(res['changed'])
        if check:
            assert root.state_digest() == before
        if len(seen) == 1:
            # The first pin, in check mode: no hold before, the whole installed driver set held after.
            holds = res['diff'][1]
            assert (holds['before_header'], holds['after_header']) == ('holds', 'holds')
            assert holds['before'] == ''
            assert holds['after'] == ''.join(n + '\n' for n in sorted(DRIVER_SET))
    assert seen == [True, True, False, False]
    expect(root, NEW, DRIVER_SET)
    # Optional members not installed are pinned (offered at the version) but not installed.
    assert 'nvidia-fabricmanager-580' not in root.installed()
    assert root.holds() == set(DRIVER_SET)

    # Diff of a move to the older version: the pin file and installed versions, before and after.
    r = run_playbook(play(pin_task(root, OLD, install=True), check=True, diff=True))
    diff = r.result('pin')['diff']
    assert diff[0]['after_header'].endswith(PIN_FILE)
    assert 'Pin: version %s-0ubuntu1' % NEW in diff[0]['before']
    assert 'Pin: version %s-0ubuntu1' % OLD in diff[0]['after']
    assert 'nvidia-driver-580-server=%s-0ubuntu1\n' % OLD in diff[2]['after']
    expect(root, NEW, DRIVER_SET)


def test_unpin_removes_pins_and_holds(apt_root, run_playbook):
    root = apt_root
    assert run_playbook(play(pin_task(root, OLD, install=True))).rc == 0
    r = run_playbook(play(pin_task(root, state='unpinned'), diff=True))
    assert r.rc == 0, r.stdout
    res = r.result('pin')
    assert res['changed'] is True
    holds = res['diff'][1]
    assert (holds['before_header'], holds['after_header']) == ('holds', 'holds')
    assert holds['before'] == ''.join(n + '\n' for n in sorted(DRIVER_SET)) and holds['after'] == ''
    assert res['previous']['pins']['nvidia-driver-580-server'] == '%s-0ubuntu1' % OLD
    assert sorted(res['previous']['holds']) == sorted(DRIVER_SET)
    assert not (root.path / PIN_FILE).exists() and root.holds() == set()
    expect(root, OLD, DRIVER_SET)
    assert run_playbook(play(pin_task(root, state='unpinned'))).result('pin')['changed'] is False


def test_pin_without_install_changes_no_package(apt_root, run_playbook):
    root = apt_root
    assert run_playbook(play(pin_task(root, OLD, install=True))).rc == 0
    r = run_playbook(play({'name': 'pin', 'register': 'out', 'gpufleet.upgrade.driver_pin': {
        'packages': ['nvidia-driver-580-server'], 'version': '%s-0ubuntu1' % NEW, 'installroot': str(root.path)}}))
    assert r.rc == 0, r.stdout
    assert r.result('pin')['resolved'] == {'nvidia-driver-580-server': '%s-0ubuntu1' % NEW}
    expect(root, OLD, DRIVER_SET)
    policy = root.run(['apt-cache', 'policy', 'nvidia-driver-580-server']).stdout
    assert 'Candidate: %s-0ubuntu1' % NEW in policy


def test_tampered_snapshot_is_rejected(apt_root, run_playbook, tmp_path):
    root = apt_root
    assert run_playbook(play(pin_task(root, OLD, install=True))).rc == 0
    proc = fake_node(root, tmp_path)
    path = tmp_path / 'snap.json'
    r = run_playbook(play({'name': 'snap', 'gpufleet.upgrade.node_snapshot': {
        'path': str(path), 'installroot': str(root.path), 'proc_path': str(proc)}}))
    assert r.rc == 0, r.stdout
    assert run_playbook(play(pin_task(root, NEW, install=True))).rc == 0
    doc = json.loads(path.read_text())
    doc['snapshot']['packages']['nvidia-driver-580-server'] = '%s-0ubuntu1' % NEW
    path.write_text(json.dumps(doc))
    before = root.state_digest()
    r = run_playbook(play({'name': 'restore', 'gpufleet.upgrade.node_snapshot': {
        'state': 'restored', 'path': str(path), 'installroot': str(root.path)}}))
    assert r.rc != 0
    msg = r.result('restore')['msg']
    assert 'snapshot digest mismatch' in msg and 'nothing was restored' in msg
    assert root.state_digest() == before

    # A digest recorded elsewhere must match too.
    doc['snapshot']['packages']['nvidia-driver-580-server'] = '%s-0ubuntu1' % OLD
    path.write_text(json.dumps(doc))
    r = run_playbook(play({'name': 'restore', 'gpufleet.upgrade.node_snapshot': {
        'state': 'restored', 'path': str(path), 'installroot': str(root.path), 'sha256': '0' * 64}}))
    assert r.rc != 0 and 'does not match the expected sha256 ' + '0' * 64 in r.result('restore')['msg']
    assert root.state_digest() == before


def test_failed_transaction_puts_pins_and_holds_back(tmp_path, deb_repo_with_broken, run_playbook):
    root = AptRoot.create(tmp_path / 'root', deb_repo_with_broken)
    assert run_playbook(play(pin_task(root, OLD, install=True))).rc == 0
    pin_before = (root.path / PIN_FILE).read_text()
    before = root.state_digest()
    r = run_playbook(play(pin_task(root, BROKEN, install=True)))
    assert r.rc != 0
    msg = r.result('pin')['msg']
    assert msg.startswith('command failed (rc=100): apt-get -q -y install --allow-downgrades')
    assert 'nvidia-firmware-580-server-%s' % BROKEN in msg
    assert (root.path / PIN_FILE).read_text() == pin_before
    assert root.holds() == set(DRIVER_SET)
    assert root.state_digest() == before
    expect(root, OLD, DRIVER_SET)


def test_capture_in_check_mode_writes_nothing(apt_root, run_playbook, tmp_path):
    path = tmp_path / 'snap.json'
    r = run_playbook(play({'name': 'snap', 'gpufleet.upgrade.node_snapshot': {
        'path': str(path), 'installroot': str(apt_root.path), 'proc_path': str(tmp_path)}}, check=True, diff=True))
    assert r.rc == 0, r.stdout
    res = r.result('snap')
    assert res['changed'] is True and not path.exists()
    assert json.loads(res['diff']['after'])['sha256'] == res['sha256']
    assert res['snapshot']['packages'] == {} and res['snapshot']['boot']['running_kernel'] is None


def test_restore_to_a_node_that_had_no_pins(apt_root, run_playbook, tmp_path):
    """The first rollout on a node: the snapshot has no pin file and no holds; restore removes both."""
    root = apt_root
    root.apt_get('install', '-y', *['%s=%s-0ubuntu1' % (n, OLD) for n in DRIVER_SET])
    proc = fake_node(root, tmp_path)
    path = tmp_path / 'snap.json'
    snap = {'name': 'snap', 'gpufleet.upgrade.node_snapshot': {
        'path': str(path), 'installroot': str(root.path), 'proc_path': str(proc)}}
    assert run_playbook(play(snap)).rc == 0
    s = json.loads(path.read_text())['snapshot']
    assert s['pins']['content'] is None and s['holds'] == []
    assert run_playbook(play(pin_task(root, NEW, install=True))).rc == 0
    expect(root, NEW, DRIVER_SET)
    r = run_playbook(play({'name': 'restore', 'gpufleet.upgrade.node_snapshot': {
        'state': 'restored', 'path': str(path), 'installroot': str(root.path)}}, diff=True))
    assert r.rc == 0, r.stdout
    res = r.result('restore')
    assert res['changed'] is True and res['extra_packages'] == {}
    expect(root, OLD, DRIVER_SET)
    assert not (root.path / PIN_FILE).exists() and root.holds() == set()
    assert res['diff'][0]['after'] == '' and 'Pin-Priority: 1001' in res['diff'][0]['before']


def snapshot_and_restore_tasks(root: AptRoot, proc: pathlib.Path, path: pathlib.Path):
    capture = {'name': 'snap', 'gpufleet.upgrade.node_snapshot': {
        'path': str(path), 'installroot': str(root.path), 'proc_path': str(proc)}}
    restore = {'name': 'restore', 'gpufleet.upgrade.node_snapshot': {
        'state': 'restored', 'path': str(path), 'installroot': str(root.path)}}
    return capture, restore


def boot_files(root: AptRoot) -> tuple[str, bytes]:
    return (root.path / 'etc/default/grub').read_text(), (root.path / 'boot/grub/grubenv').read_bytes()


def test_restore_brings_back_the_default_boot_kernel(apt_root, run_playbook, tmp_path):
    """Ubuntu's default: GRUB_DEFAULT=0 and no saved_entry; a kernel upgrade makes entry 0 the new kernel."""
    root = apt_root
    proc = fake_node(root, tmp_path, grub_default='0', saved_entry=None)
    path = tmp_path / 'snap.json'
    capture, restore = snapshot_and_restore_tasks(root, proc, path)
    assert run_playbook(play(capture)).rc == 0
    boot = json.loads(path.read_text())['snapshot']['boot']
    assert (boot['grub_default'], boot['saved_entry'], boot['default_kernel']) == ('0', None, KERNEL_OLD)

    root.apt_get('install', '-y', 'linux-image-%s' % KERNEL_NEW)
    assert set(root.installed()) == {'linux-image-%s' % KERNEL_OLD, 'linux-image-%s' % KERNEL_NEW}
    entry = 'Advanced options for Ubuntu>Ubuntu, with Linux %s' % KERNEL_OLD

    before = boot_files(root)
    r = run_playbook(play(restore, check=True, diff=True))
    assert r.rc == 0, r.stdout
    res = r.result('restore')
    assert res['changed'] is True and boot_files(root) == before
    assert res['boot_kernel'] == {'kernel': KERNEL_OLD, 'would_boot_now': KERNEL_NEW,
                                  'would_boot_captured_config': KERNEL_NEW, 'set': True, 'keep': False,
                                  'saved_entry': entry}
    assert sorted(res['changed_files']) == ['boot/grub/grubenv', 'etc/default/grub']
    diffs = {d['after_header']: d for d in res['diff']}
    assert diffs['etc/default/grub']['before'] == 'GRUB_DEFAULT="0"\nGRUB_TIMEOUT=5\n'
    assert diffs['etc/default/grub']['after'] == 'GRUB_DEFAULT="saved"\nGRUB_TIMEOUT=5\n'
    assert 'saved_entry' not in diffs['boot/grub/grubenv']['before']
    assert 'saved_entry=%s\n' % entry in diffs['boot/grub/grubenv']['after']

    r = run_playbook(play(restore))
    assert r.rc == 0, r.stdout
    assert r.result('restore')['changed'] is True
    grub, env = boot_files(root)
    assert grub == 'GRUB_DEFAULT="saved"\nGRUB_TIMEOUT=5\n'
    assert env.decode().startswith('# GRUB Environment Block\nsaved_entry=%s\n#' % entry) and len(env) == 1024

    r = run_playbook(play(restore, check=True, diff=True))
    res = r.result('restore')
    assert res['changed'] is False and res['changed_files'] == []
    assert res['boot_kernel']['would_boot_now'] == KERNEL_OLD
    assert run_playbook(play(restore)).result('restore')['changed'] is False


def test_restore_uses_the_grub_cfg_entry_id_when_listed(apt_root, run_playbook, tmp_path):
    root = apt_root
    proc = fake_node(root, tmp_path, grub_default='0', saved_entry=None)
    path = tmp_path / 'snap.json'
    capture, restore = snapshot_and_restore_tasks(root, proc, path)
    assert run_playbook(play(capture)).rc == 0
    root.apt_get('install', '-y', 'linux-image-%s' % KERNEL_NEW)
    uuid = '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0'
    cfg = ["menuentry 'Ubuntu' --class ubuntu $menuentry_id_option 'gnulinux-simple-%s' {" % uuid, '}',
           "submenu 'Advanced options for Ubuntu' $menuentry_id_option 'gnulinux-advanced-%s' {" % uuid]
    for k in (KERNEL_NEW, KERNEL_OLD):
        cfg += ["\tmenuentry 'Ubuntu, with Linux %s' --class ubuntu $menuentry_id_option "
                "'gnulinux-%s-advanced-%s' {" % (k, k, uuid), '\t}',
                "\tmenuentry 'Ubuntu, with Linux %s (recovery mode)' --class ubuntu $menuentry_id_option "
                "'gnulinux-%s-recovery-%s' {" % (k, k, uuid), '\t}']
    (root.path / 'boot/grub/grub.cfg').write_text('\n'.join(cfg + ['}']) + '\n')
    r = run_playbook(play(restore))
    assert r.rc == 0, r.stdout
    entry = 'gnulinux-advanced-%s>gnulinux-%s-advanced-%s' % (uuid, KERNEL_OLD, uuid)
    assert r.result('restore')['boot_kernel']['saved_entry'] == entry
    assert 'saved_entry=%s\n' % entry in (root.path / 'boot/grub/grubenv').read_text()
    assert run_playbook(play(restore)).result('restore')['changed'] is False


def test_restore_fails_when_the_default_boot_kernel_is_gone(apt_root, run_playbook, tmp_path):
    root = apt_root
    proc = fake_node(root, tmp_path, grub_default='0', saved_entry=None)
    path = tmp_path / 'snap.json'
    capture, restore = snapshot_and_restore_tasks(root, proc, path)
    assert run_playbook(play(capture)).rc == 0
    root.apt_get('install', '-y', 'linux-image-%s' % KERNEL_NEW)
    root.apt_get('purge', '-y', 'linux-image-%s' % KERNEL_OLD)
    assert 'linux-image-%s' % KERNEL_OLD not in root.installed()
    before = (root.state_digest(), boot_files(root))
    for check in (True, False):
        r = run_playbook(play(restore, check=check, diff=True))
        assert r.rc != 0
        res = r.result('restore')
        assert res['_event'] == 'runner_on_failed'
        assert res['msg'] == (
            "the snapshot's default-boot kernel %s is not installed (no linux-image-%s package under %s; "
            "installed kernels: %s); install it before restoring, nothing was changed"
            % (KERNEL_OLD, KERNEL_OLD, root.path, KERNEL_NEW))
        assert (root.state_digest(), boot_files(root)) == before


# -- T3-18: a held dpkg lock is waited for, an interrupted dpkg is refused ---------------------------
LOCK_HOLDER = '''
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX)
print('locked', flush=True)
sys.stdin.readline()     # held until the test writes a line (or closes stdin)
'''


def apt_get_waiting(root: AptRoot) -> bool:
    """An apt-get of the collection (its DPkg::Lock::Timeout) is running on this root: it waits for the lock.
    On this root: its APT_CONFIG sets Dir to it (another test's apt-get, on another pytest-xdist worker, does not
    count)."""
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            cmdline = pathlib.Path('/proc/%s/cmdline' % pid).read_bytes().split(b'\0')
            environ = pathlib.Path('/proc/%s/environ' % pid).read_bytes().split(b'\0')
        except OSError:
            continue
        if not (cmdline[0].endswith(b'apt-get') and any(a.startswith(b'DPkg::Lock::Timeout=') for a in cmdline)):
            continue
        conf = [e[len(b'APT_CONFIG='):] for e in environ if e.startswith(b'APT_CONFIG=')]
        try:
            if conf and ('Dir "%s/";' % root.path) in pathlib.Path(os.fsdecode(conf[0])).read_text():
                return True
        except OSError:
            continue
    return False


def test_a_held_dpkg_lock_is_waited_for_and_the_install_runs_once_it_is_free(apt_root, run_playbook):
    """unattended-upgrades holds the dpkg lock when the transaction starts: apt-get waits for it (bounded) instead
    of failing at once; the test frees the lock once it sees apt-get waiting."""
    root = apt_root
    assert run_playbook(play(pin_task(root, OLD, install=True))).rc == 0
    holder = subprocess.Popen([sys.executable, '-c', LOCK_HOLDER, str(root.path / 'var/lib/dpkg/lock-frontend')],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'locked'
        result = {}
        worker = threading.Thread(target=lambda: result.update(run=run_playbook(play(pin_task(root, NEW, install=True)))))
        worker.start()
        deadline = time.monotonic() + 120
        while worker.is_alive() and not apt_get_waiting(root) and time.monotonic() < deadline:
            time.sleep(0.1)
        waited = worker.is_alive() and apt_get_waiting(root)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    worker.join(timeout=300)
    assert waited, 'the module did not wait for the lock: %s' % result['run'].result('pin').get('msg')
    assert result['run'].rc == 0, result['run'].result('pin').get('msg')
    expect(root, NEW, DRIVER_SET)
    assert root.holds() == set(DRIVER_SET)


def test_an_interrupted_dpkg_is_refused_before_anything_changes(apt_root, run_playbook):
    """A package unpacked but never configured (a transaction killed half-way, someone else's or ours): the module
    does not finish it (no dpkg --configure -a); it fails naming the state and changes nothing."""
    root = apt_root
    assert run_playbook(play(pin_task(root, OLD, install=True))).rc == 0
    deb = sorted(root.repo.glob('libnvidia-nscq-580_%s*.deb' % NEW))[0]
    dpkg = ['dpkg', '--root=%s' % root.path, '--admindir=%s/var/lib/dpkg' % root.path, '--force-script-chrootless']
    if os.geteuid() != 0:
        dpkg.append('--force-not-root')
    root.run(dpkg + ['--unpack', str(deb)])
    before = root.state_digest()
    r = run_playbook(play(pin_task(root, NEW, install=True)))
    assert r.rc != 0
    msg = r.result('pin')['msg']
    assert msg.startswith('dpkg --audit reports an unfinished package transaction: The following packages have been '
                          'unpacked but not yet configured.'), msg
    assert 'libnvidia-nscq-580' in msg and msg.endswith('then rerun; nothing was changed')
    assert root.state_digest() == before


def _age_lists(root: AptRoot, seconds: float) -> None:
    then = time.time() - seconds
    for p in [*(root.path / 'var/lib/apt/lists').iterdir(), root.path / 'var/lib/apt/periodic/update-success-stamp']:
        if p.is_file():
            os.utime(p, (then, then))


def test_package_index_refreshes_only_stale_lists(apt_root, run_playbook):
    """Issue 39 item 7 (review M8): the lists are refreshed before an availability check when older than the
    bound, with the real apt-get under the root; fresh lists are left alone; check mode runs nothing."""
    root = apt_root
    task = {'name': 'index', 'gpufleet.upgrade.package_index': {'installroot': str(root.path), 'cache_valid_time': 3600}}
    r = run_playbook(play(task))
    assert r.rc == 0, r.stdout
    fresh = r.result('index')
    assert fresh['refreshed'] is False and fresh['changed'] is False and fresh['commands'] == []
    assert fresh['backend'] == 'apt' and 0 <= fresh['age'] < 3600

    _age_lists(root, 7200)
    r = run_playbook(play(task, check=True))
    assert r.rc == 0, r.stdout
    assert r.result('index')['changed'] is True and r.result('index')['commands'] == []
    assert min(p.stat().st_mtime for p in (root.path / 'var/lib/apt/lists').iterdir() if p.is_file()) < time.time() - 7000

    r = run_playbook(play(task))
    assert r.rc == 0, r.stdout
    stale = r.result('index')
    assert stale['refreshed'] is True and stale['age'] >= 7200
    assert [c[:3] for c in stale['commands']] == [['apt-get', '-q', 'update']]
    # The driver set is read from the refreshed lists: the availability check that follows passes.
    r = run_playbook(play(pin_task(root, NEW, install=True, name='check'), check=True))
    assert r.rc == 0 and r.result('check')['changed'] is True, r.stdout

    r = run_playbook(play({'name': 'bad', 'gpufleet.upgrade.package_index': {'installroot': str(root.path),
                                                                             'cache_valid_time': -5}}))
    assert r.rc != 0
    assert r.result('bad')['msg'] == 'package_index: cache_valid_time must be 0 or more seconds, got -5'
