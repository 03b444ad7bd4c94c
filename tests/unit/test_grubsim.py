"""tests/tools/grubsim.py: GRUB's boot choice with the real grub-editenv (Debian's grub-common)."""
from __future__ import annotations

import pytest

from tools import grubsim
from tools.debian import ensure_binary

K134, K135 = '6.8.0-134-generic', '6.8.0-135-generic'
E = 'gnulinux-advanced-u>gnulinux-%s-advanced-u'


@pytest.fixture
def grub(tmp_path):
    path, why = ensure_binary('grub-common', 'grub-editenv')
    if not path:
        pytest.skip(why)
    cfg = tmp_path / 'grub.cfg'
    cfg.write_text(grubsim.render_grub_cfg([K134, K135], 'u'))
    return tmp_path / 'grubenv', cfg


def test_next_entry_boots_once_and_is_cleared(grub):
    env, cfg = grub
    grubsim.create_grubenv(env, saved_entry=E % K134, next_entry=E % K135)
    assert len(env.read_bytes()) == 1024
    first = grubsim.boot(env, cfg)
    assert (first.kernel, first.entry) == (K135, E % K135)
    # GRUB's save_env of the emptied variable: `next_entry=` stays in the block, empty.
    assert grubsim.read_env(env) == {'saved_entry': E % K134, 'next_entry': ''}
    assert grubsim.boot(env, cfg).kernel == K134


def test_failed_one_shot_falls_back_to_saved_entry(grub, tmp_path):
    env, cfg = grub
    grubsim.create_grubenv(env, saved_entry=E % K134, next_entry=E % K135)
    proc = tmp_path / 'proc'
    res = grubsim.boot(env, cfg, fails={K135}, proc=proc, driver='580.126.20')
    assert res.boots == [(E % K135, K135, False), (E % K134, K134, True)]
    assert (proc / 'sys/kernel/osrelease').read_text() == K134 + '\n'
    assert '  580.126.20  ' in (proc / 'driver/nvidia/version').read_text()


def test_without_saved_entry_or_with_grub_default_0_entry_0_boots(grub):
    env, cfg = grub
    grubsim.create_grubenv(env)
    assert grubsim.boot(env, cfg).kernel == K135          # newest first, as update-grub orders
    grubsim.create_grubenv(env, saved_entry=E % K134)
    assert grubsim.boot(env, cfg, grub_default='0').kernel == K135
    assert grubsim.boot(env, cfg, grub_default='1>2').kernel == K134


def test_nothing_comes_up(grub):
    env, cfg = grub
    grubsim.create_grubenv(env, saved_entry=E % K134)
    res = grubsim.boot(env, cfg, fails={K134}, max_boots=2)
    assert res.kernel is None and [b[2] for b in res.boots] == [False, False]


def test_kernel_of_titles_and_indexes():
    cfg = grubsim.render_grub_cfg([K135, K134], 'u')
    assert grubsim.kernel_of(cfg, 'Advanced options for Ubuntu>Ubuntu, with Linux %s' % K134) == K134
    assert grubsim.kernel_of(cfg, '1>1') == K135                   # the recovery entry of the newest
    assert grubsim.kernel_of(cfg, 'gnulinux-simple-u') == K135
    assert grubsim.kernel_of(cfg, '9') is None


def test_bls_entries_one_shot(grub, tmp_path):
    """The RHEL family: BLS entries (as kernel-install writes them), ids = file stems, newest first."""
    env = grub[0]
    r13, r16 = '5.14.0-427.13.1.el9_4.x86_64', '5.14.0-427.16.1.el9_4.x86_64'
    for k in (r13, r16):
        grubsim.write_bls_entry(tmp_path, k)
    entries = tmp_path / 'boot/loader/entries'
    assert sorted(p.name for p in entries.iterdir()) == ['%s.conf' % grubsim.bls_id(k) for k in (r13, r16)]
    assert grubsim.bls_kernel_of(entries, '0') == r16
    grubsim.create_grubenv(env, saved_entry=grubsim.bls_id(r13), next_entry=grubsim.bls_id(r16))
    assert grubsim.boot(env, entries=entries, fails={r16}).boots == [
        (grubsim.bls_id(r16), r16, False), (grubsim.bls_id(r13), r13, True)]
    assert grubsim.read_env(env) == {'saved_entry': grubsim.bls_id(r13), 'next_entry': ''}


@pytest.mark.parametrize('fs, abstraction', [('ext2', ['diskfilter', 'mdraid1x']), ('ext2', ['diskfilter', 'lvm']),
                                             ('ext2', ['cryptodisk', 'luks']), ('btrfs', []), ('zfs', [])])
def test_a_block_save_env_cannot_write_keeps_next_entry_for_every_boot(grub, tmp_path, fs, abstraction):
    """/boot on md RAID1, LVM, LUKS, btrfs or ZFS: GRUB's save_env fails at boot, the one-shot stays set,
    and a trial kernel that does not come up is booted on every power cycle."""
    env, cfg = grub
    grubsim.set_disk(env.parent, fs=fs, abstraction=abstraction)
    grubsim.create_grubenv(env, saved_entry=E % K134, next_entry=E % K135)
    assert grubsim.boot(env, cfg).kernel == K135
    assert grubsim.read_env(env) == {'saved_entry': E % K134, 'next_entry': E % K135}
    assert grubsim.boot(env, cfg).kernel == K135
    res = grubsim.boot(env, cfg, fails={K135})
    assert res.kernel is None and res.boots == [(E % K135, K135, False)] * 3


def test_grub_probe_answers_from_set_disk(tmp_path):
    import subprocess
    tool = grubsim.probe_tool(tmp_path / 'bin')
    grub_dir = tmp_path / 'root/boot/grub'
    grub_dir.mkdir(parents=True)

    def probe(target, path=grub_dir):
        r = subprocess.run([str(tool), '--target=%s' % target, str(path)], capture_output=True, text=True, check=False)
        return r.returncode, r.stdout, r.stderr

    assert probe('fs') == (0, 'ext2\n', '') and probe('abstraction') == (0, '\n', '')
    grubsim.set_disk(grub_dir, abstraction=['diskfilter', 'mdraid1x'])
    assert probe('fs') == (0, 'ext2\n', '') and probe('abstraction') == (0, 'diskfilter mdraid1x\n', '')
    grubsim.set_disk(grub_dir, fs='btrfs')
    assert probe('fs') == (0, 'btrfs\n', '') and grubsim.save_env_writes(grub_dir) is False
    assert probe('fs', tmp_path / 'gone')[0] == 1
