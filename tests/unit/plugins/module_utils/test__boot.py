"""Unit tests of GRUB reading (_grub) and the trial/default/verify decisions (_boot)."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _boot as bt
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _grub as gb

from tools import grubsim

K134, K135 = '6.8.0-134-generic', '6.8.0-135-generic'
UUID = 'u-1'
E = 'gnulinux-advanced-u-1>gnulinux-%s-advanced-u-1'
CFG = grubsim.render_grub_cfg([K134, K135], UUID)


def files(env=None, default='saved', cfg=CFG):
    return bt.BootFiles('/boot/grub/grubenv', dict(env or {}), '/boot/grub/grub.cfg', gb.parse_grub_cfg(cfg),
                        '/etc/default/grub', default)


def test_parse_grub_cfg_and_entries():
    menu = gb.parse_grub_cfg(CFG)
    top = [(i.kind, i.id, i.kernel) for i in menu]
    assert top == [('menuentry', 'gnulinux-simple-u-1', K135), ('submenu', 'gnulinux-advanced-u-1', None)]
    assert [(i.kernel, i.recovery) for i in menu[1].children] == [(K135, False), (K135, True), (K134, False), (K134, True)]
    assert gb.entries_for_kernel(menu, K135) == [E % K135, 'gnulinux-simple-u-1']
    assert gb.entries_for_kernel(menu, K134) == [E % K134]
    assert gb.entries_for_kernel(menu, '6.8.0-1-generic') == []


@pytest.mark.parametrize('entry, kernel', [
    ('0', K135), ('', K135), (None, K135), ('1>2', K134), ('1>1', K135), (E % K134, K134),
    ('Advanced options for Ubuntu>Ubuntu, with Linux %s' % K134, K134), ('gnulinux-simple-u-1', K135),
    ('1', None), ('7', None), ('nope', None),
])
def test_resolve_entry(entry, kernel):
    item = gb.resolve_entry(gb.parse_grub_cfg(CFG), entry)
    assert (item.kernel if item else None) == kernel


def test_grubenv_round_trip_and_rejects():
    block = gb.render_grubenv({'saved_entry': E % K134, 'next_entry': ''})
    assert len(block) == 1024
    assert gb.parse_grubenv(block.encode(), 'f') == {'saved_entry': E % K134, 'next_entry': ''}
    with pytest.raises(gb.GrubError, match=r"^f is not a GRUB environment block \(expected 1024 bytes starting with "
                                           r"'# GRUB Environment Block', as grub-editenv writes it; found 14 bytes"):
        gb.parse_grubenv(b'saved_entry=x\n', 'f')


def test_grub_default_last_assignment_wins():
    assert gb.grub_default(['GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n', None, 'GRUB_DEFAULT="saved"\n']) == 'saved'
    assert gb.grub_default(["GRUB_DEFAULT='1>2'\n"]) == '1>2'
    assert gb.grub_default(['# GRUB_DEFAULT=saved\n']) is None


def test_next_boot():
    menu = gb.parse_grub_cfg(CFG)
    nb = gb.next_boot(menu, {'saved_entry': E % K134, 'next_entry': E % K135}, 'saved')
    assert nb.as_dict() == {'entry': E % K135, 'kernel': K135, 'once': True, 'fallback_entry': E % K134, 'fallback_kernel': K134}
    nb = gb.next_boot(menu, {'saved_entry': E % K134, 'next_entry': ''}, 'saved')
    assert (nb.kernel, nb.once) == (K134, False)
    # GRUB_DEFAULT=0 boots the newest kernel, whatever saved_entry says.
    assert gb.next_boot(menu, {'saved_entry': E % K134}, '0').kernel == K135


def test_trial_sets_next_entry_and_keeps_the_fallback():
    p = bt.plan_trial(files({'saved_entry': E % K134}), K135, K134, None)
    assert (p.sets, p.unsets, p.entry, p.fallback_kernel, p.changed) == ({'next_entry': E % K135}, [], E % K135, K134, True)
    assert p.commands('grub-editenv', '/g') == [['grub-editenv', '/g', 'set', 'next_entry=%s' % (E % K135)]]
    assert p.after == {'saved_entry': E % K134, 'next_entry': E % K135}
    # Again: nothing to do.
    assert not bt.plan_trial(files(p.after), K135, K134, None).changed


@pytest.mark.parametrize('env', [{}, {'saved_entry': E % K135}, {'saved_entry': 'gone'}])
def test_trial_points_saved_entry_at_the_fallback(env):
    p = bt.plan_trial(files(env), K135, K134, None)
    assert p.sets == {'next_entry': E % K135, 'saved_entry': E % K134}


def test_trial_when_the_target_runs_already():
    p = bt.plan_trial(files({'saved_entry': E % K135}), K135, K135, None)
    assert (p.changed, p.booted) == (False, True)


@pytest.mark.parametrize('kw, msg', [
    (dict(default='0'), "/etc/default/grub sets GRUB_DEFAULT=0, expected GRUB_DEFAULT=saved: after the one-shot trial"),
    (dict(default=None), '/etc/default/grub sets GRUB_DEFAULT=(unset, 0), expected GRUB_DEFAULT=saved'),
    (dict(cfg=grubsim.render_grub_cfg([K134], UUID)), '/boot/grub/grub.cfg has no menu entry that boots kernel %s (expected a '
     "menuentry with 'linux /boot/vmlinuz-%s', as update-grub writes once the kernel is installed; kernels listed: %s)"
     % (K135, K135, K134)),
])
def test_trial_refusals(kw, msg):
    f = files({'saved_entry': E % K134}, **kw)
    with pytest.raises(bt.BootError) as e:
        bt.plan_trial(f, K135, K134, None)
    assert str(e.value).startswith(msg)


def test_trial_fallback_errors():
    with pytest.raises(bt.BootError, match='^fallback_kernel 6.8.0-135-generic is the trial kernel itself'):
        bt.plan_trial(files(), K135, K134, K135)
    with pytest.raises(bt.BootError, match='has no menu entry that boots the fallback kernel 6.8.0-1-generic'):
        bt.plan_trial(files(), K135, '6.8.0-1-generic', None)
    with pytest.raises(bt.BootError, match='^the fallback kernel is unknown'):
        bt.plan_trial(files(), K135, None, None)


def test_menu_entry_override():
    p = bt.plan_trial(files({'saved_entry': E % K134}), K135, K134, None, menu_entry='1>0')
    assert p.sets == {'next_entry': '1>0'}
    with pytest.raises(bt.BootError, match=r"^menu_entry '1>2' does not name an entry of /boot/grub/grub.cfg that boots "
                                           r"kernel 6.8.0-135-generic \(it boots 6.8.0-134-generic\)"):
        bt.plan_trial(files(), K135, K134, None, menu_entry='1>2')


def test_default():
    p = bt.plan_default(files({'saved_entry': E % K134, 'next_entry': E % K135}), K135, K135, True, '/proc/sys/kernel/osrelease')
    assert (p.sets, p.unsets) == ({'saved_entry': E % K135}, ['next_entry'])
    assert p.commands('e', '/g') == [['e', '/g', 'set', 'saved_entry=%s' % (E % K135)], ['e', '/g', 'unset', 'next_entry']]
    assert not bt.plan_default(files({'saved_entry': E % K135, 'next_entry': ''}), K135, K135, True, 'x').changed
    with pytest.raises(bt.BootError, match=r"^kernel 6.8.0-135-generic is not running \(running: 6.8.0-134-generic, read from "
                                           r"/p/sys/kernel/osrelease\)"):
        bt.plan_default(files({'saved_entry': E % K134}), K135, K134, True, '/p/sys/kernel/osrelease')
    assert bt.plan_default(files({'saved_entry': E % K134}), K135, K134, False, 'x').sets == {'saved_entry': E % K135}


def test_verify():
    nv = {'driver_version': '580.130.00', 'build_kernel': None, 'open': True}
    v = bt.verify(K135, '580.130.00', K135, 'o', nv, 'n')
    assert v.ok and v.as_dict()['ok'] is True
    v = bt.verify(K135, '580.130.00', K134, 'o', dict(nv, driver_version='580.126.20', build_kernel=K134), 'n')
    assert v.problems == ['the running kernel is %s, expected %s (o)' % (K134, K135),
                          'the loaded NVIDIA kernel module is 580.126.20, expected 580.130.00 (n)',
                          'the loaded NVIDIA kernel module was built for kernel %s, not %s (n)' % (K134, K135)]
    v = bt.verify(K135, '580.130.00', None, 'o', None, 'n')
    assert v.problems == ['o cannot be read, so the running kernel is unknown',
                          'no NVIDIA kernel module is loaded (n does not exist), expected driver 580.130.00']


@pytest.mark.parametrize('bad', ['new', '', '6.8', None])
def test_check_release(bad):
    with pytest.raises(bt.BootError, match='is not a kernel release such as 6.8.0-135-generic'):
        bt.check_release(bad)


# -- RHEL family: BootLoaderSpec entries -------------------------------------------------------

R13, R16 = '5.14.0-427.13.1.el9_4.x86_64', '5.14.0-427.16.1.el9_4.x86_64'
MID = '3c1b6f0e8d2a4b7c9e5f1a2b3c4d5e6f'


def bls_text(kernel, title=None):
    return ('title %s\nversion %s\nlinux /vmlinuz-%s\ninitrd /initramfs-%s.img\noptions root=/dev/sda2 ro\n'
            'id rocky-20240601-%s\ngrub_class rocky\n' % (title or 'Rocky Linux (%s) 9.4 (Blue Onyx)' % kernel, kernel, kernel,
                                                          kernel, kernel))


BLS = {'%s-%s.conf' % (MID, R13): bls_text(R13), '%s-%s.conf' % (MID, R16): bls_text(R16),
       '%s-0-rescue.conf' % MID: 'title Rocky Linux (0-rescue-%s) 9.4\nlinux /vmlinuz-0-rescue-%s\n' % (MID, MID),
       'README': 'not an entry\n'}


def bls_files(env=None, default='saved', bls=None):
    return bt.BootFiles('/boot/grub2/grubenv', dict(env or {}), '/boot/loader/entries', gb.bls_menu(BLS if bls is None else bls),
                        '/etc/default/grub', default, bls=True)


def test_parse_bls_entry():
    item = gb.parse_bls_entry('%s-%s.conf' % (MID, R16), bls_text(R16))
    assert (item.kind, item.id, item.kernel, item.recovery) == ('menuentry', '%s-%s' % (MID, R16), R16, False)
    assert item.title == 'Rocky Linux (%s) 9.4 (Blue Onyx)' % R16
    # Comments, blank lines, tabs; the first value of a key counts; no title: the id.
    item = gb.parse_bls_entry('x.conf', '# c\n\nlinux\t/boot/vmlinuz-%s\nlinux /vmlinuz-other\n' % R13)
    assert (item.id, item.title, item.kernel) == ('x', 'x', R13)
    assert gb.parse_bls_entry('y.conf', 'title y\n').kernel is None
    rescue = gb.parse_bls_entry('r.conf', 'linux /vmlinuz-0-rescue-%s\n' % MID)
    assert (rescue.kernel, rescue.recovery) == (None, True)


def test_bls_menu_order_and_entries():
    menu = gb.bls_menu(BLS)
    assert [it.id for it in menu] == ['%s-%s' % (MID, R16), '%s-%s' % (MID, R13), '%s-0-rescue' % MID]
    assert gb.entries_for_kernel(menu, R13) == ['%s-%s' % (MID, R13)]
    assert gb.resolve_entry(menu, '0').kernel == R16
    assert gb.resolve_entry(menu, 'Rocky Linux (%s) 9.4 (Blue Onyx)' % R13).kernel == R13
    assert gb.resolve_entry(menu, 'rocky-20240601-%s' % R13) is None     # the `id` field is not the menu id
    # 5.14.0-427.100.1 is newer than 427.16.1 (numeric, not text, order).
    k100 = '5.14.0-427.100.1.el9_4.x86_64'
    assert gb.bls_menu({'a-%s.conf' % R16: bls_text(R16), 'a-%s.conf' % k100: bls_text(k100)})[0].kernel == k100


@pytest.mark.parametrize('has, setting, expected', [
    (True, 'true', True), (True, None, True), (True, 'false', False), (False, 'true', False)])
def test_use_bls(has, setting, expected):
    assert gb.use_bls(has, setting) is expected
    assert gb.grub_default(['GRUB_ENABLE_BLSCFG=true\nGRUB_DEFAULT=saved\n'], 'GRUB_ENABLE_BLSCFG') == 'true'


def test_bls_trial_default_and_refusal():
    e13, e16 = '%s-%s' % (MID, R13), '%s-%s' % (MID, R16)
    # kernel-install made the new kernel the saved default (UPDATEDEFAULT=yes): the trial points it back.
    p = bt.plan_trial(bls_files({'saved_entry': e16, 'kernelopts': 'root=/dev/sda2 ro'}), R16, R13, None)
    assert p.sets == {'next_entry': e16, 'saved_entry': e13} and p.fallback_kernel == R13
    nb = gb.next_boot(bls_files().menu, p.after, 'saved')
    assert (nb.kernel, nb.once, nb.fallback_kernel) == (R16, True, R13)
    d = bt.plan_default(bls_files({'saved_entry': e13, 'next_entry': ''}), R16, R16, True, 'o')
    assert (d.sets, d.unsets) == ({'saved_entry': e16}, [])
    with pytest.raises(bt.BootError) as e:
        bt.plan_trial(bls_files({'saved_entry': e13}, bls={k: v for k, v in BLS.items() if R16 not in k}), R16, R13, None)
    assert str(e.value) == (
        "/boot/loader/entries has no BootLoaderSpec entry that boots kernel %s (expected a <machine-id>-%s.conf with "
        "'linux /vmlinuz-%s', as the kernel package's kernel-install writes it; kernels with an entry: %s); run "
        "kernel-install add %s /lib/modules/%s/vmlinuz, nothing was changed" % (R16, R16, R16, R13, R16, R16))


def test_check_installed_names_the_package():
    with pytest.raises(bt.BootError, match=r'^kernel %s is not installed \(no kernel-core for %s package and no '
                                           r'boot/vmlinuz-%s under /r; installed kernels: %s\)' % (R16, R16, R16, R13)):
        bt.check_installed(R16, [R13], '/r', 'kernel-core for %s')


def test_menu_entry_error_names_what_was_searched():
    """The BLS entries directory on BootLoaderSpec, the generated grub.cfg otherwise."""
    with pytest.raises(bt.BootError) as e:
        bt.plan_trial(bls_files({'saved_entry': '%s-%s' % (MID, R13)}), R16, R13, None, menu_entry='%s-%s' % (MID, R13))
    assert str(e.value) == ("menu_entry '%s-%s' does not name a BootLoaderSpec entry in /boot/loader/entries (its file name "
                            "without .conf) that boots kernel %s (it boots %s)" % (MID, R13, R16, R13))
    assert 'grub.cfg' not in str(e.value)
    with pytest.raises(bt.BootError) as e:
        bt.plan_trial(bls_files(), R16, R13, None, menu_entry='nope')
    assert "does not name a BootLoaderSpec entry in /boot/loader/entries" in str(e.value) and 'nothing' in str(e.value)
    with pytest.raises(bt.BootError) as e:
        bt.plan_trial(files(), K135, K134, None, menu_entry='nope')
    assert str(e.value) == ("menu_entry 'nope' does not name an entry of /boot/grub/grub.cfg that boots kernel %s "
                            "(it boots nothing)" % K135)


# -- A one-shot that GRUB cannot clear (issue 37 item 5, review T3-5) ---------------------------

@pytest.mark.parametrize('fs, abstraction, problem', [
    ('ext2\n', '\n', None),
    ('xfs', '', None),
    ('ext2\n', 'diskfilter mdraid1x\n', '/g is on diskfilter mdraid1x (grub-probe --target=abstraction): GRUB cannot write '
     'to an LVM, RAID or encrypted device at boot'),
    ('ext2', 'diskfilter lvm', '/g is on diskfilter lvm (grub-probe --target=abstraction): GRUB cannot write to an LVM, '
     'RAID or encrypted device at boot'),
    ('ext2', 'cryptodisk luks2', '/g is on cryptodisk luks2 (grub-probe --target=abstraction): GRUB cannot write to an '
     'LVM, RAID or encrypted device at boot'),
    ('btrfs\n', '', '/g is on btrfs (grub-probe --target=fs): GRUB cannot write into a btrfs filesystem at boot'),
    ('zfs', '', '/g is on zfs (grub-probe --target=fs): GRUB cannot write into a zfs filesystem at boot'),
    ('', '', 'grub-probe --target=fs named no filesystem for /g'),
])
def test_env_block_problem(fs, abstraction, problem):
    assert gb.env_block_problem('/g', fs, abstraction) == problem


RAID = '/boot/grub/grubenv is on diskfilter mdraid1x (grub-probe --target=abstraction): GRUB cannot write ...'


def test_trial_refused_where_grub_cannot_clear_next_entry():
    plan = bt.plan_trial(files({'saved_entry': E % K134}), K135, K134, None)
    assert bt.check_one_shot(plan, None, False) is plan
    with pytest.raises(bt.BootError) as e:
        bt.check_one_shot(plan, RAID, False)
    assert str(e.value) == (
        'kernel %s cannot be booted once: %s, so the one-shot next_entry would never be cleared and every boot, a failed '
        'one included, would take kernel %s again instead of the fallback %s; nothing was changed. Set '
        'allow_no_fallback=true (the role: node_upgrade_kernel_allow_no_fallback) to boot it as the saved default '
        'without a fallback' % (K135, RAID, K135, K134))


def test_trial_without_fallback_makes_the_kernel_the_saved_default():
    plan = bt.check_one_shot(bt.plan_trial(files({'saved_entry': E % K134, 'next_entry': E % K135}), K135, K134, None),
                             RAID, True)
    assert (plan.sets, plan.unsets) == ({'saved_entry': E % K135}, ['next_entry'])
    assert (plan.fallback_kernel, plan.fallback_entry) == (None, None)
    assert plan.after == {'saved_entry': E % K135}
    assert not bt.check_one_shot(bt.plan_trial(files(plan.after), K135, K134, None), RAID, True).changed
    # The kernel runs already: nothing to boot, nothing refused.
    booted = bt.plan_trial(files({'saved_entry': E % K134}), K135, K135, None)
    assert bt.check_one_shot(booted, RAID, False) is booted


def test_cancel_clears_the_kernels_pending_one_shot_only():
    p = bt.plan_cancel(files({'saved_entry': E % K134, 'next_entry': E % K135}), K135)
    assert (p.unsets, p.sets, p.entry, p.fallback_kernel) == (['next_entry'], {}, E % K134, K134)
    assert p.commands('e', '/g') == [['e', '/g', 'unset', 'next_entry']]
    assert not bt.plan_cancel(files({'saved_entry': E % K134, 'next_entry': ''}), K135).changed
    with pytest.raises(bt.BootError, match=r'^next_entry=%s in /boot/grub/grubenv boots kernel %s, not kernel %s; '
                                           r'not clearing a one-shot boot of another kernel, nothing was changed$'
                                           % (E % K134, K134, K135)):
        bt.plan_cancel(files({'next_entry': E % K134}), K135)


def test_verify_fails_on_a_next_entry_left_pending():
    nv = {'driver_version': '580.130.00', 'build_kernel': None, 'open': True}
    v = bt.verify(K135, '580.130.00', K135, 'o', nv, 'n', E % K135, '/g')
    assert not v.ok and v.pending_next_entry == E % K135
    assert v.problems == ['GRUB did not clear the one-shot next_entry=%s in /g at boot (it cannot write its environment '
                          'block there: LVM, RAID, encryption, btrfs or ZFS under it), so every boot takes that entry '
                          'again; clear it (kernel_boot state=cancel, or grub-editenv /g unset next_entry)' % (E % K135)]
    assert bt.verify(K135, '580.130.00', K135, 'o', nv, 'n', '', '/g').ok
