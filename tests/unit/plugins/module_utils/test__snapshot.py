"""Unit tests of the snapshot core: digest and verification, boot files, MIG extraction."""
from __future__ import annotations

import copy
import json

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as sn

SNAP = {
    'backend': 'apt', 'packages': {'nvidia-driver-580-server': '580.126.20-0ubuntu1'}, 'holds': ['nvidia-driver-580-server'],
    'pins': {'pin_file': 'etc/apt/preferences.d/gpufleet-nvidia-driver.pref', 'content': None, 'pins': {}},
    'boot': {'running_kernel': '6.8.0-134-generic', 'grub_default': 'saved', 'saved_entry': 'x'},
    'gpu_facts': {'gpus': [{'index': 0, 'name': 'NVIDIA H100 80GB HBM3 ü'}]},
}


def test_digest_is_canonical():
    reordered = json.loads(json.dumps(SNAP, sort_keys=False))
    reordered = dict(reversed(list(reordered.items())))
    assert sn.digest(reordered) == sn.digest(SNAP)
    assert len(sn.digest(SNAP)) == 64
    doc = sn.make_document(SNAP)
    assert doc['format'] == sn.FORMAT and doc['sha256'] == sn.digest(SNAP)


def test_verify_round_trip_through_text():
    text = sn.dump_document(sn.make_document(SNAP))
    assert sn.verify_document(text) == SNAP
    assert sn.verify_document(text, sn.digest(SNAP).upper()) == SNAP


def test_tampered_snapshot_rejected():
    doc = sn.make_document(copy.deepcopy(SNAP))
    doc['snapshot']['packages']['nvidia-driver-580-server'] = '580.130.00-0ubuntu1'
    with pytest.raises(sn.SnapshotError) as e:
        sn.verify_document(doc)
    assert str(e.value).startswith('snapshot digest mismatch: recorded sha256 %s, content hashes to ' % sn.digest(SNAP))
    assert str(e.value).endswith('nothing was restored')


def test_rehashed_tamper_caught_by_expected_digest():
    doc = sn.make_document(copy.deepcopy(SNAP))
    expected = doc['sha256']
    doc['snapshot']['holds'] = []
    doc = sn.make_document(doc['snapshot'])  # an attacker recomputed the embedded digest
    assert sn.verify_document(doc)['holds'] == []
    with pytest.raises(sn.SnapshotError, match='does not match the expected sha256 %s' % expected):
        sn.verify_document(doc, expected)


@pytest.mark.parametrize('doc,msg', [
    ('{not json', 'not valid JSON'),
    ('[]', 'must be a JSON object, got list'),
    ({'format': 'other/v9', 'sha256': 'x', 'snapshot': {}}, "unknown snapshot format 'other/v9'"),
    ({'format': sn.FORMAT, 'snapshot': {}}, 'lacks its snapshot or sha256'),
    (sn.make_document({'packages': {}}), "the snapshot lacks 'pins'"),
])
def test_malformed_documents(doc, msg):
    with pytest.raises(sn.SnapshotError, match=msg.replace('(', r'\(')):
        sn.verify_document(doc)


def test_default_grub_parse_and_set():
    text = '# comment\nGRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_DEFAULT="saved"\n'
    assert sn.parse_default_grub(text) == 'saved'
    assert sn.parse_default_grub("GRUB_DEFAULT='1>2'\n") == '1>2'
    assert sn.parse_default_grub('GRUB_TIMEOUT=5\n') is None
    assert sn.set_default_grub(text, 'gnulinux-advanced>gnulinux-6.8.0-134') == (
        '# comment\nGRUB_DEFAULT="gnulinux-advanced>gnulinux-6.8.0-134"\nGRUB_TIMEOUT=5\n')
    assert sn.set_default_grub('GRUB_TIMEOUT=5\n', '0') == 'GRUB_TIMEOUT=5\nGRUB_DEFAULT="0"\n'
    assert sn.set_default_grub(text, None) == '# comment\nGRUB_TIMEOUT=5\n'


def test_grubenv_block():
    block = sn.render_grubenv({'saved_entry': 'gnulinux-6.8.0-134-generic', 'next_entry': ''})
    assert len(block.encode()) == 1024
    assert block.startswith('# GRUB Environment Block\nsaved_entry=gnulinux-6.8.0-134-generic\nnext_entry=\n#')
    assert sn.parse_grubenv(block) == {'saved_entry': 'gnulinux-6.8.0-134-generic', 'next_entry': ''}
    with pytest.raises(sn.SnapshotError, match='exceed 1024 bytes'):
        sn.render_grubenv({'k': 'v' * 1100})


def test_mig_from_facts():
    facts = {'gpus': [{'index': 0, 'uuid': 'GPU-a', 'pci_id': '10de:2330/10de:16c1', 'bus_id': '00000000:17:00.0',
                       'mig_mode': {'current': True, 'pending': False}, 'temperature_c': 40}, 'junk']}
    assert sn.mig_from_facts(facts) == [{'index': 0, 'uuid': 'GPU-a', 'pci_id': '10de:2330/10de:16c1',
                                         'bus_id': '00000000:17:00.0', 'mig_mode': {'current': True, 'pending': False}}]
    assert sn.mig_from_facts(None) == []
    registered = dict(facts, changed=False, failed=False, invocation={'module_args': {}}, _ansible_no_log=False)
    assert sn.clean_facts(registered) == facts


def test_modprobe_files_selects_nvidia(tmp_path):
    d = tmp_path / 'etc/modprobe.d'
    d.mkdir(parents=True)
    (d / 'nvidia-graphics-drivers.conf').write_text('blacklist nouveau\n')
    (d / 'local.conf').write_text('options nvidia NVreg_RestrictProfilingToAdminUsers=0\n')
    (d / 'floppy.conf').write_text('blacklist floppy\n')
    files = sn.modprobe_files(lambda rel: str(tmp_path / rel))
    assert sorted(files) == ['etc/modprobe.d/local.conf', 'etc/modprobe.d/nvidia-graphics-drivers.conf']


# --- default-boot kernel ---------------------------------------------------------------------

KERNELS = ['6.8.0-140-generic', '6.8.0-134-generic', '6.8.0-9-generic']


def test_installed_kernels_newest_first():
    names = ['linux-image-6.8.0-9-generic', 'linux-image-generic', 'linux-image-6.8.0-134-generic',
             'linux-image-unsigned-6.8.0-140-generic', 'linux-modules-6.8.0-134-generic', 'nvidia-driver-580-server']
    assert sn.installed_kernels(names) == KERNELS


@pytest.mark.parametrize('grub_default,saved_entry,kernel', [
    ('0', None, '6.8.0-140-generic'),
    (None, None, '6.8.0-140-generic'),
    ('saved', None, '6.8.0-140-generic'),
    ('saved', 'gnulinux-6.8.0-134-generic-advanced-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0', '6.8.0-134-generic'),
    ('saved', 'gnulinux-advanced-0f1e>gnulinux-6.8.0-134-generic-advanced-0f1e', '6.8.0-134-generic'),
    ('saved', 'Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-9-generic', '6.8.0-9-generic'),
    ('saved', 'Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-9-generic (recovery mode)', '6.8.0-9-generic'),
    ('saved', 'gnulinux-simple-0f1e', '6.8.0-140-generic'),
    ('Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-134-generic', 'ignored', '6.8.0-134-generic'),
    ('1>2', None, None),
    ('saved', '1>2', None),
])
def test_default_boot_kernel(grub_default, saved_entry, kernel):
    assert sn.default_boot_kernel(grub_default, saved_entry, KERNELS) == kernel


def test_grub_entry_for_prefers_the_grub_cfg_id():
    cfg = ("menuentry 'Ubuntu' $menuentry_id_option 'gnulinux-simple-u1' {\n}\n"
           "submenu 'Advanced options for Ubuntu' $menuentry_id_option 'gnulinux-advanced-u1' {\n"
           "\tmenuentry 'Ubuntu, with Linux 6.8.0-134-generic (recovery mode)' $menuentry_id_option "
           "'gnulinux-6.8.0-134-generic-recovery-u1' {\n\t}\n"
           "\tmenuentry 'Ubuntu, with Linux 6.8.0-134-generic' $menuentry_id_option "
           "'gnulinux-6.8.0-134-generic-advanced-u1' {\n\t}\n}\n")
    assert sn.grub_entry_for('6.8.0-134-generic', cfg) == 'gnulinux-advanced-u1>gnulinux-6.8.0-134-generic-advanced-u1'
    assert sn.grub_entry_for('6.8.0-140-generic', cfg) == 'Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-140-generic'
    assert sn.grub_entry_for('6.8.0-134-generic', None) == 'Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-134-generic'


def test_plan_boot_kernel():
    boot = {'grub_default': '0', 'saved_entry': None, 'default_kernel': '6.8.0-134-generic'}
    res = sn.plan_boot_kernel(boot, KERNELS[1:], KERNELS, '0', None, None, None)
    assert res == {'kernel': '6.8.0-134-generic', 'would_boot_now': '6.8.0-140-generic',
                   'would_boot_captured_config': '6.8.0-140-generic', 'set': True, 'keep': False,
                   'saved_entry': 'Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-134-generic'}
    # A snapshot without default_kernel: the captured config resolved over the captured kernels.
    old = {'grub_default': '0', 'saved_entry': None, 'running_kernel': '6.8.0-9-generic'}
    assert sn.plan_boot_kernel(old, KERNELS[1:], KERNELS, '0', None, None, None)['kernel'] == '6.8.0-134-generic'
    # Nothing resolvable: the running kernel at capture.
    assert sn.plan_boot_kernel(old, [], KERNELS, '0', None, None, None)['kernel'] == '6.8.0-9-generic'
    # The current configuration already boots it: kept.
    kept = sn.plan_boot_kernel(boot, KERNELS[1:], KERNELS, 'saved', 'gnulinux-6.8.0-134-generic-advanced-u1', None, None)
    assert (kept['set'], kept['keep']) == (False, True)
    # Nothing changes when the captured configuration still boots it.
    same = sn.plan_boot_kernel(boot, KERNELS[1:], KERNELS[1:], '0', None, None, None)
    assert (same['set'], same['keep']) == (False, False)
    with pytest.raises(sn.SnapshotError, match=r"default-boot kernel 6.8.0-134-generic is not installed \(no "
                       r"linux-image-6.8.0-134-generic package under /srv/root; installed kernels: 6.8.0-140-generic\)"):
        sn.plan_boot_kernel(boot, KERNELS[1:], KERNELS[:1], '0', None, None, '/srv/root')


# -- issue 12 (4): a kept snapshot must have been taken on the driver the node runs now ------------
def test_a_kept_snapshot_of_another_driver_is_refused():
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as snap_mod
    kept = {'gpu_facts': {'driver_version': '580.126.20'}}
    assert snap_mod.kept_snapshot_problem(kept, {'driver_version': '580.126.20'}) is None
    msg = snap_mod.kept_snapshot_problem(kept, {'driver_version': '580.130.00'})
    assert msg == ('the kept snapshot was taken when the node ran driver 580.126.20, but it runs 580.130.00 now: '
                   'it is not this node\'s rollback point (move it away, or set force: true to take a new one)')
    assert snap_mod.kept_snapshot_problem({'gpu_facts': {}}, {'driver_version': '580.130.00'}) is not None
    assert snap_mod.kept_snapshot_problem(kept, None) is None     # nothing to compare with


# -- issue 14 (4): restore on a RHEL 8/9 root, whose dnf pin is the module stream --------------------
ROCKY9 = 'ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n'
CAPTURED_LOCKS = '\n# Added lock on Mon Dec  1 10:00:00 2026\nnvidia-driver-0:580.126.20-1.el9.*\n'
RPM_QA = ('nvidia-driver\t0:580.126.20-1.el9\nkmod-nvidia-open-580.130.00-5.14.0-427.16.1\t0:580.130.00-1.el9\n'
          'kernel-core\t0:5.14.0-427.16.1.el9_4\n')


def rocky9_backend(root) -> pk.DnfBackend:
    """A DnfBackend of a Rocky 9 root (module mode) whose rpm lists RPM_QA and which has no module stream enabled."""
    (root / 'etc/dnf/plugins').mkdir(parents=True)
    (root / 'etc/os-release').write_text(ROCKY9)
    (root / 'etc/dnf/plugins/versionlock.conf').write_text('[main]\nenabled = 1\nlocklist = %s\n'
                                                           % (root / 'etc/dnf/plugins/versionlock.list'))

    def run(argv: list, env: dict) -> tuple:
        if argv[0] == 'rpm':
            return 0, RPM_QA, ''
        assert argv[0] == 'dnf' and 'module' in argv, argv    # `dnf module list --enabled nvidia-driver`: none
        return 1, '', 'Error: No matching Modules to list'
    return pk.DnfBackend(pk.Runner(run, str(root)))


def test_dnf_restore_compares_the_versionlock_list_not_the_module_stream(tmp_path):
    backend = rocky9_backend(tmp_path)
    assert backend.mode == 'module'
    lock_list = tmp_path / 'etc/dnf/plugins/versionlock.list'
    snap = {'backend': 'dnf', 'packages': {'nvidia-driver': '580.126.20-1.el9'}, 'holds': [], 'boot': {},
            'pins': {'pin_file': 'etc/dnf/plugins/versionlock.list', 'content': CAPTURED_LOCKS, 'pins': {}}}
    # The list as captured: nothing to do (the module stream, None here, is not what the snapshot holds).
    lock_list.write_text(CAPTURED_LOCKS)
    plan = sn.plan_restore(backend, snap)
    assert plan.changed is False and plan.files == []
    assert plan.pin_plan.before.pin_file == str(lock_list) and plan.pin_plan.before.pin_text == CAPTURED_LOCKS
    # Driver-set packages installed since the snapshot are reported, not only the snapshot's names.
    assert plan.extra_packages == {'kmod-nvidia-open-580.130.00-5.14.0-427.16.1': '580.130.00-1.el9'}
    # Another list: the restore writes the captured one back and reports the list, not the stream.
    lock_list.write_text('nvidia-driver-0:580.130.00-1.el9.*\n')
    plan = sn.plan_restore(backend, snap)
    assert plan.changed is True and plan.pin_plan.install == {}
    assert plan.diff()[0] == {'before_header': str(lock_list), 'after_header': str(lock_list),
                              'before': 'nvidia-driver-0:580.130.00-1.el9.*\n', 'after': CAPTURED_LOCKS}
    now = sn.apply_restore(backend, plan)
    assert lock_list.read_text() == CAPTURED_LOCKS
    assert (now.pin_file, now.pin_text, now.pins) == (str(lock_list), CAPTURED_LOCKS, {'nvidia-driver': '0:580.126.20-1.el9'})
    assert sn.plan_restore(backend, snap).changed is False


# -- T3-1 (2026-12-06 review): a restore writes only what a capture can have written -----------------------
DEBIAN_NVIDIA_CONF = ('alias nvidia nvidia-current\n'
                      'install nvidia modprobe -i nvidia-current $CMDLINE_OPTS\n'
                      'remove nvidia modprobe -r -i nvidia-drm nvidia-modeset nvidia-uvm nvidia\n')


def forged(**changes) -> dict:
    """A dnf snapshot of rocky9_backend's root (nothing to install), with `changes` over its fields."""
    snap = {'backend': 'dnf', 'packages': {'nvidia-driver': '580.126.20-1.el9'}, 'holds': [],
            'pins': {'pin_file': 'etc/dnf/plugins/versionlock.list', 'content': CAPTURED_LOCKS, 'pins': {}},
            'boot': {'grub_default': None, 'saved_entry': 'x', 'grubenv_path': 'boot/grub2/grubenv'},
            'modprobe': {'etc/modprobe.d/nvidia.conf': 'options nvidia NVreg_EnableGpuFirmware=1\n'},
            'mig': {'gpus': [], 'config_files': {}}}
    for dotted, value in changes.items():
        where = snap
        *path, last = dotted.split('.')
        for part in path:
            where = where[part]
        where[last] = value
    return snap


def written(root) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob('*') if p.is_file())


@pytest.mark.parametrize('field, value, msg', [
    ('modprobe', {'../outside-the-root/evil.conf': 'install nvidia x\n'},
     "modprobe: '../outside-the-root/evil.conf' is not a file directly under etc/modprobe.d, usr/lib/modprobe.d, "
     'lib/modprobe.d (a plain name; no absolute path, no "..")'),
    ('modprobe', {'/etc/cron.d/nvidia': '* * * * * root id\n'}, "modprobe: '/etc/cron.d/nvidia' is not a file directly"),
    ('modprobe', {'etc/modprobe.d/../../etc/cron.d/nvidia': 'x\n'},
     "modprobe: 'etc/modprobe.d/../../etc/cron.d/nvidia' is not a file directly"),
    ('modprobe', {'etc/modprobe.d/..': 'nvidia\n'}, "modprobe: 'etc/modprobe.d/..' is not a file directly"),
    ('modprobe', {'etc/modprobe.d/sub/nvidia.conf': 'nvidia\n'}, "modprobe: 'etc/modprobe.d/sub/nvidia.conf' is not a"),
    ('modprobe', {'etc/sudoers.d/nvidia': 'ALL ALL=(ALL) NOPASSWD: ALL\n'}, "modprobe: 'etc/sudoers.d/nvidia' is not a"),
    ('modprobe', {'etc/modprobe.d/i915.conf': 'install i915 /bin/sh -c id\n'},
     'modprobe: etc/modprobe.d/i915.conf neither is named for nvidia nor mentions nvidia or NVreg: the capture does not '
     'record such a file'),
    ('modprobe', {'etc/modprobe.d/nvidia.conf': None}, "modprobe: etc/modprobe.d/nvidia.conf: expected the file's text"),
    ('modprobe', ['etc/modprobe.d/nvidia.conf'], 'modprobe: expected a mapping of path to content, got list'),
    ('boot.grubenv_path', '../outside-the-root/grubenv',
     "boot.grubenv_path: '../outside-the-root/grubenv' is not one of boot/grub/grubenv, boot/grub2/grubenv"),
    ('boot.grubenv_path', '/boot/grub2/grubenv', "boot.grubenv_path: '/boot/grub2/grubenv' is not one of"),
    ('boot.grub_default', 'saved"\nGRUB_CMDLINE_LINUX="init=/bin/sh', "boot.grub_default: 'saved\"\\nGRUB_CMDLINE_LINUX"),
    ('boot.saved_entry', 'x\nkernelopts=init=/bin/sh', "boot.saved_entry: 'x\\nkernelopts=init=/bin/sh' is not one line"),
    ('boot.saved_entry', 7, 'boot.saved_entry: 7 is not one line of text'),
    ('mig.config_files', {'etc/cron.d/mig': 'x'},
     "mig.config_files: 'etc/cron.d/mig' is not one of etc/nvidia-mig-manager/config.yaml"),
])
def test_restore_refuses_what_a_capture_cannot_have_written_before_any_change(tmp_path, field, value, msg):
    backend = rocky9_backend(tmp_path)
    before = written(tmp_path)
    # the rest of the snapshot (a modprobe.d file to write, unless that is the field) is not written either,
    # digest vouched for or not
    snap = forged(**{field: value})
    for plan in (lambda: sn.plan_restore(backend, copy.deepcopy(snap)),
                 lambda: sn.plan_restore(backend, copy.deepcopy(snap), vouched=True)):
        with pytest.raises(sn.SnapshotError) as e:
            plan()
        assert str(e.value).startswith('the snapshot holds what a capture cannot have recorded, nothing was restored: ')
        assert msg in str(e.value), str(e.value)
    assert written(tmp_path) == before and not (tmp_path.parent / 'outside-the-root').exists()


def test_restore_adds_no_modprobe_command_unless_the_digest_was_vouched_for(tmp_path):
    backend = rocky9_backend(tmp_path)
    conf = tmp_path / 'etc/modprobe.d/nvidia.conf'
    conf.parent.mkdir(parents=True)
    conf.write_text('options nvidia NVreg_EnableGpuFirmware=0\n')
    evil = 'options nvidia NVreg_EnableGpuFirmware=1\ninstall nvidia /bin/sh -c "id > /tmp/pwned"; modprobe -i nvidia\n'
    snap = forged(modprobe={'etc/modprobe.d/nvidia.conf': evil})
    with pytest.raises(sn.SnapshotError) as e:
        sn.plan_restore(backend, snap)
    assert str(e.value) == (
        'the snapshot would add modprobe install/remove directives or a GRUB_DEFAULT expansion (commands run as root) '
        'that the files on the node do not have, and its digest was not checked against one recorded outside it (sha256: the digest the Node '
        'records), nothing was restored: etc/modprobe.d/nvidia.conf: install nvidia /bin/sh -c "id > /tmp/pwned"; '
        'modprobe -i nvidia')
    assert conf.read_text() == 'options nvidia NVreg_EnableGpuFirmware=0\n'
    # a directive continued over two lines is one directive; a commented one is none
    for text in ('options nvidia NVreg_X=1\ninst\\\nall nvidia /bin/id\n', 'options nvidia NVreg_X=1\nremove \\\n nvidia /bin/id\n'):
        with pytest.raises(sn.SnapshotError, match='would add modprobe install/remove directives'):
            sn.plan_restore(backend, forged(modprobe={'etc/modprobe.d/nvidia.conf': text}))
    assert sn.plan_restore(backend, forged(modprobe={
        'etc/modprobe.d/nvidia.conf': '# install nvidia /bin/id\noptions nvidia NVreg_X=1\n'})).changed
    # /etc/default/grub is sourced by update-grub as root: a GRUB_DEFAULT expansion is a command as well
    grub = forged(**{'boot.grub_default': '$(id > /tmp/pwned)'})
    with pytest.raises(sn.SnapshotError, match=r"etc/default/grub: GRUB_DEFAULT='\$\(id > /tmp/pwned\)'"):
        sn.plan_restore(backend, grub)
    assert 'etc/default/grub' in [f.rel for f in sn.plan_restore(backend, grub, vouched=True).files]
    assert not (tmp_path / 'etc/default/grub').exists()
    # vouched for by the digest the Node records: the captured content as it is
    plan = sn.plan_restore(backend, snap, vouched=True)
    assert [f.rel for f in plan.files if f.rel.startswith('etc/modprobe.d')] == ['etc/modprobe.d/nvidia.conf']
    # the same directive already on the node: the restore adds no command, also unvouched
    conf.write_text(DEBIAN_NVIDIA_CONF)
    plan = sn.plan_restore(backend, forged(modprobe={
        'etc/modprobe.d/nvidia.conf': 'options nvidia NVreg_X=1\n' + DEBIAN_NVIDIA_CONF}))
    assert [f.rel for f in plan.files if f.rel.startswith('etc/modprobe.d')] == ['etc/modprobe.d/nvidia.conf']


def test_a_genuine_capture_is_restorable(tmp_path):
    """The rules never refuse what the capture records: files named for nvidia or mentioning it, with install/remove
    directives (Debian's nvidia.conf), in all three modprobe directories, the grubenv it finds, the MIG config."""
    backend = rocky9_backend(tmp_path)
    for rel, text in (('etc/modprobe.d/nvidia.conf', DEBIAN_NVIDIA_CONF), ('usr/lib/modprobe.d/nvidia-blacklist', 'x\n'),
                      ('lib/modprobe.d/local.conf', 'options nvidia_uvm uvm_disable_hmm=1\n'),
                      ('etc/modprobe.d/floppy.conf', 'blacklist floppy\n'),
                      ('boot/grub2/grubenv', sn.render_grubenv({'saved_entry': 'abc-5.14.0'})),
                      ('etc/default/grub', 'GRUB_DEFAULT=saved\n'),
                      ('etc/nvidia-mig-manager/config.yaml', 'version: v1\n'),
                      ('etc/dnf/plugins/versionlock.list', CAPTURED_LOCKS)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    snap = sn.capture(backend, proc_path=str(tmp_path / 'proc'), hostname='gpu-1')
    assert sorted(snap['modprobe']) == ['etc/modprobe.d/nvidia.conf', 'lib/modprobe.d/local.conf',
                                        'usr/lib/modprobe.d/nvidia-blacklist']
    assert sn.capture_problems(snap) == []
    assert sn.plan_restore(backend, sn.verify_document(sn.make_document(snap))).changed is False
    # the upgrade changed the directives: only a vouched restore puts the captured ones back
    (tmp_path / 'etc/modprobe.d/nvidia.conf').write_text('alias nvidia nvidia-current\n')
    with pytest.raises(sn.SnapshotError, match='install nvidia modprobe -i nvidia-current'):
        sn.plan_restore(backend, snap)
    plan = sn.plan_restore(backend, snap, vouched=True)
    sn.apply_restore(backend, plan)
    assert (tmp_path / 'etc/modprobe.d/nvidia.conf').read_text() == DEBIAN_NVIDIA_CONF


def test_modprobe_commands():
    assert sn.modprobe_commands(DEBIAN_NVIDIA_CONF) == [
        'install nvidia modprobe -i nvidia-current $CMDLINE_OPTS',
        'remove nvidia modprobe -r -i nvidia-drm nvidia-modeset nvidia-uvm nvidia']
    assert sn.modprobe_commands('#install a b\n  install\tb  c\\\n d\noptions install x\ninstallx y\n') == ['install b c d']
    assert sn.modprobe_commands('remove a \\') == ['remove a']
