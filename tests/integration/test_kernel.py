"""kernel_check, kernel_packages and kernel_boot against real dpkg/apt under an install root and a
real GRUB environment block (grub-editenv from Debian's grub-common).

The repository (tests/tools/debrepo.py `kernel_repo`) holds the driver at 580.126.20 and
580.130.00 for both module sources (the DKMS `-server` set and the prebuilt user space
`nvidia-headless-no-dkms-580-server`), kernels 6.8.0-134-generic and 6.8.0-135-generic
(image, modules, modules-extra, headers), Canonical-shaped prebuilt modules for 134 (both
drivers) and 135 (580.130.00 only), and 6.8.0-136-generic without prebuilt modules. Boots are
simulated by tests/tools/grubsim.py with GRUB's one-shot rule.
"""
from __future__ import annotations

import hashlib
import pathlib

import pytest

from tools import debrepo, grubsim
from tools.debian import ensure_binary
from tools.debrepo import KERNEL_NOMOD, KERNEL_OLD, KERNEL_TARGET, NEW, OLD, UUID, AptRoot, host_dpkg_digest, kernel_version

pytestmark = pytest.mark.slow

kernel_repo = debrepo.kernel_repo

V134, V135 = kernel_version(KERNEL_OLD), kernel_version(KERNEL_TARGET)
LRM = 'linux-modules-nvidia-580-server-%s'
PREBUILT_SET = ['nvidia-headless-no-dkms-580-server', 'libnvidia-compute-580-server', 'nvidia-kernel-common-580-server',
                'nvidia-utils-580-server', 'nvidia-compute-utils-580-server']
DKMS_SET = ['nvidia-driver-580-server', 'libnvidia-compute-580-server', 'nvidia-kernel-common-580-server',
            'nvidia-dkms-580-server', 'nvidia-utils-580-server', 'nvidia-compute-utils-580-server']
ENTRY = 'gnulinux-advanced-%s>gnulinux-%%s-advanced-%s' % (UUID, UUID)


def kernel_pkgs(k: str, headers: bool = False) -> list[str]:
    return ['linux-image-%s' % k, 'linux-modules-%s' % k, 'linux-modules-extra-%s' % k] + (
        ['linux-headers-%s' % k] if headers else [])


@pytest.fixture(autouse=True)
def host_untouched():
    before = host_dpkg_digest()
    yield
    assert host_dpkg_digest() == before, "the host's dpkg database or apt preferences changed"


@pytest.fixture(scope='module')
def grub_editenv():
    path, why = ensure_binary('grub-common', 'grub-editenv')
    if not path:
        pytest.skip(why)
    return path


class Node:
    def __init__(self, root: AptRoot, proc: pathlib.Path, source: str):
        self.root, self.proc, self.source = root, proc, source
        self.grubenv = root.path / 'boot/grub/grubenv'
        self.grub_cfg = root.path / 'boot/grub/grub.cfg'

    def update_grub(self) -> None:
        """What the kernel's postinst hook (update-grub) does: list every installed kernel."""
        ks = [n[len('linux-image-'):] for n in self.root.installed() if n.startswith('linux-image-')]
        self.grub_cfg.write_text(grubsim.render_grub_cfg(ks, UUID))

    def dkms_build(self, driver: str, kernel: str) -> None:
        """What DKMS's autoinstall leaves once it built the module (there are no maintainer scripts here)."""
        mod = self.root.path / 'var/lib/dkms/nvidia' / driver / kernel / 'x86_64/module'
        mod.mkdir(parents=True, exist_ok=True)
        (mod / 'nvidia.ko.zst').write_bytes(b'\0')

    def digest(self) -> str:
        h = hashlib.sha256(self.root.state_digest().encode())
        for rel in ('var/lib/apt/extended_states', 'var/lib/gpufleet/kernel-protect.json', 'boot/grub/grubenv'):
            p = self.root.path / rel
            h.update(rel.encode() + b'\0' + (p.read_bytes() if p.exists() else b'-'))
        return h.hexdigest()

    def auto(self) -> set[str]:
        return set(self.root.apt_mark('showauto').stdout.split())

    def args(self, **kw) -> dict:
        a = {'kernel': KERNEL_TARGET, 'branch': '580', 'driver_version': NEW, 'module_source': self.source,
             'installroot': str(self.root.path), 'proc_path': str(self.proc)}
        a.update(kw)
        return a

    def boot_args(self, **kw) -> dict:
        # grub-probe answers for the install root from grubsim.set_disk (a plain ext4 partition unless a test says).
        a = {'kernel': KERNEL_TARGET, 'installroot': str(self.root.path), 'proc_path': str(self.proc),
             'grub_probe': str(grubsim.probe_tool(self.proc.parent / 'bin'))}
        a.update(kw)
        return a


def make_node(tmp_path: pathlib.Path, repo: pathlib.Path, source: str) -> Node:
    """A node on kernel 134 with driver 580.126.20 from `source`, GRUB_DEFAULT=saved booting 134."""
    root = AptRoot.create(tmp_path / 'root', repo)
    kp = ['%s=%s' % (n, V134) for n in kernel_pkgs(KERNEL_OLD, headers=source == 'dkms')]
    if source == 'prebuilt':
        drv = ['%s=%s-0ubuntu1' % (n, OLD) for n in PREBUILT_SET] + ['%s=%s+1' % (LRM % KERNEL_OLD, V134)]
    else:
        drv = ['%s=%s-0ubuntu1' % (n, OLD) for n in DKMS_SET]
    root.apt_get('install', '-y', *kp, *drv)
    # As on a node where a meta package pulled the kernel: automatically installed.
    root.apt_mark('auto', *[n for n in root.installed() if n.startswith('linux-')])
    proc = tmp_path / 'proc'
    node = Node(root, proc, source)
    if source == 'dkms':
        node.dkms_build(OLD, KERNEL_OLD)
    (root.path / 'etc/default/grub').write_text('GRUB_DEFAULT=saved\nGRUB_TIMEOUT=5\n')
    node.update_grub()
    grubsim.create_grubenv(node.grubenv, saved_entry=ENTRY % KERNEL_OLD)
    assert grubsim.boot(node.grubenv, node.grub_cfg, proc=proc, driver=OLD).kernel == KERNEL_OLD
    return node


def play(*tasks, check: bool = False, diff: bool = False):
    p = {'hosts': 'localhost', 'gather_facts': False, 'tasks': list(tasks)}
    if check:
        p['check_mode'] = True
    if diff:
        p['diff'] = True
    return [p]


def task(module: str, args: dict, name: str = 't') -> dict:
    return {'name': name, 'gpufleet.upgrade.%s' % module: args}


def run(run_playbook, module: str, args: dict, check: bool = False, diff: bool = False) -> dict:
    r = run_playbook(play(task(module, args), check=check, diff=diff))
    res = r.result('t')
    res['_rc'] = r.rc
    return res


def ok(res: dict) -> dict:
    assert res['_event'] == 'runner_on_ok', res.get('msg', res)
    return res


def failed(res: dict) -> str:
    assert res['_event'] == 'runner_on_failed', res
    assert 'Traceback' not in res.get('msg', '')
    return res['msg']


def test_prebuilt_install_trial_boot_commit_release(tmp_path, kernel_repo, run_playbook, grub_editenv):
    node = make_node(tmp_path, kernel_repo, 'prebuilt')
    root = node.root

    res = ok(run(run_playbook, 'kernel_check', node.args()))
    assert res['changed'] is False and res['missing'] == [] and res['driver_problem'] is None
    assert res['packages'] == {'linux-image-%s' % KERNEL_TARGET: V135, 'linux-modules-%s' % KERNEL_TARGET: V135,
                               'linux-modules-extra-%s' % KERNEL_TARGET: V135, LRM % KERNEL_TARGET: V135 + '+1'}
    assert res['module_versions'] == {V135 + '+1': NEW}
    assert res['way_back'] == {'previous_kernel': KERNEL_OLD, 'previous_driver_version': OLD, 'ok': True, 'problems': [],
                               'modules_on_node': True, 'reinstallable': True}

    # Check mode and diff: predicted, nothing written.
    before = node.digest()
    res = ok(run(run_playbook, 'kernel_packages', node.args(), check=True, diff=True))
    assert res['changed'] is True and node.digest() == before
    assert res['installed_changes'][LRM % KERNEL_TARGET] == V135 + '+1'
    assert res['installed_changes'][LRM % KERNEL_OLD] == V134 + '+2'   # the old kernel's modules follow the driver
    assert res['installed_changes']['nvidia-headless-no-dkms-580-server'] == NEW + '-0ubuntu1'
    diffs = {d['after_header']: d for d in res['diff']}
    assert 'Pin: version %s\n' % V135 in diffs['gpufleet-kernel.pref']['after']

    # The one transaction.
    res = ok(run(run_playbook, 'kernel_packages', node.args()))
    assert res['changed'] is True and res['removed'] == []
    installs = [c for c in res['commands'] if c[:2] == ['apt-get', '-q'] and 'install' in c]
    assert len(installs) == 1
    inst = root.installed()
    for n in kernel_pkgs(KERNEL_TARGET):
        assert inst[n] == V135
    assert inst[LRM % KERNEL_TARGET] == V135 + '+1' and inst[LRM % KERNEL_OLD] == V134 + '+2'
    assert {n: inst[n] for n in PREBUILT_SET} == {n: NEW + '-0ubuntu1' for n in PREBUILT_SET}
    for n in kernel_pkgs(KERNEL_OLD):
        assert inst[n] == V134                                            # the previous kernel stays
    assert root.holds() == set(PREBUILT_SET) | set(kernel_pkgs(KERNEL_TARGET)) | {LRM % KERNEL_TARGET}
    pins = (root.path / 'etc/apt/preferences.d/gpufleet-kernel.pref').read_text()
    assert 'Pin: version %s+1\nPin-Priority: 1001' % V135 in pins
    assert 'Pin: version %s-0ubuntu1' % NEW in (root.path / 'etc/apt/preferences.d/gpufleet-nvidia-driver.pref').read_text()
    # Protected from autoremove until released.
    protected = set(kernel_pkgs(KERNEL_OLD)) | {LRM % KERNEL_OLD}
    assert sorted(res['protected']) == sorted(protected) and not (protected & node.auto())
    sim = root.apt_get('-s', 'autoremove').stdout
    assert 'linux-image-%s' % KERNEL_OLD not in sim

    # Idempotent.
    assert ok(run(run_playbook, 'kernel_packages', node.args()))['changed'] is False
    assert ok(run(run_playbook, 'kernel_packages', node.args(), check=True))['changed'] is False

    # Trial boot: next_entry is the target, saved_entry stays on the running kernel.
    node.update_grub()
    trial = node.boot_args(state='trial', module_source='prebuilt', branch='580', driver_version=NEW)
    before = node.grubenv.read_bytes()
    res = ok(run(run_playbook, 'kernel_boot', trial, check=True, diff=True))
    assert res['changed'] is True and node.grubenv.read_bytes() == before
    assert res['diff']['after'] == 'saved_entry=%s\nnext_entry=%s\n' % (ENTRY % KERNEL_OLD, ENTRY % KERNEL_TARGET)
    res = ok(run(run_playbook, 'kernel_boot', trial))
    assert res['changed'] is True and res['entry'] == ENTRY % KERNEL_TARGET and res['fallback_kernel'] == KERNEL_OLD
    assert res['commands'] == [['grub-editenv', str(node.grubenv), 'set', 'next_entry=%s' % (ENTRY % KERNEL_TARGET)]]
    assert grubsim.read_env(node.grubenv) == {'saved_entry': ENTRY % KERNEL_OLD, 'next_entry': ENTRY % KERNEL_TARGET}
    assert res['next_boot'] == {'entry': ENTRY % KERNEL_TARGET, 'kernel': KERNEL_TARGET, 'once': True,
                                'fallback_entry': ENTRY % KERNEL_OLD, 'fallback_kernel': KERNEL_OLD}
    assert ok(run(run_playbook, 'kernel_boot', trial))['changed'] is False

    # Reboot: GRUB boots the target once and clears next_entry.
    b = grubsim.boot(node.grubenv, node.grub_cfg, proc=node.proc, driver=NEW)
    assert b.kernel == KERNEL_TARGET
    assert grubsim.read_env(node.grubenv) == {'saved_entry': ENTRY % KERNEL_OLD, 'next_entry': ''}
    res = ok(run(run_playbook, 'kernel_boot', node.boot_args(state='verify', driver_version=NEW)))
    assert res['changed'] is False and res['verification']['ok'] is True
    assert res['verification']['running_kernel'] == KERNEL_TARGET and res['verification']['loaded_driver_version'] == NEW
    assert res['next_boot']['kernel'] == KERNEL_OLD and res['next_boot']['once'] is False

    # After the gates: the target becomes the saved default.
    res = ok(run(run_playbook, 'kernel_boot', node.boot_args(state='default'), diff=True))
    assert res['changed'] is True
    assert grubsim.read_env(node.grubenv)['saved_entry'] == ENTRY % KERNEL_TARGET
    assert ok(run(run_playbook, 'kernel_boot', node.boot_args(state='default')))['changed'] is False
    assert grubsim.boot(node.grubenv, node.grub_cfg).kernel == KERNEL_TARGET

    # Past the rollback boundary: the previous kernel is automatic again, autoremove may take it.
    res = ok(run(run_playbook, 'kernel_packages', node.args(state='released')))
    assert res['changed'] is True and sorted(res['unmarked']) == sorted(protected)
    assert protected <= node.auto() and not (root.path / 'var/lib/gpufleet/kernel-protect.json').exists()
    assert 'linux-image-%s' % KERNEL_OLD in root.apt_get('-s', 'autoremove').stdout
    assert ok(run(run_playbook, 'kernel_packages', node.args(state='released')))['changed'] is False


def test_failed_trial_boot_falls_back_to_the_saved_kernel(tmp_path, kernel_repo, run_playbook, grub_editenv):
    node = make_node(tmp_path, kernel_repo, 'prebuilt')
    ok(run(run_playbook, 'kernel_packages', node.args()))
    node.update_grub()
    ok(run(run_playbook, 'kernel_boot', node.boot_args(state='trial')))
    # The target kernel does not come up; the node is power-cycled and GRUB takes saved_entry.
    b = grubsim.boot(node.grubenv, node.grub_cfg, fails={KERNEL_TARGET}, proc=node.proc, driver=NEW)
    assert b.boots == [(ENTRY % KERNEL_TARGET, KERNEL_TARGET, False), (ENTRY % KERNEL_OLD, KERNEL_OLD, True)]
    assert b.kernel == KERNEL_OLD
    res = run(run_playbook, 'kernel_boot', node.boot_args(state='verify', driver_version=NEW))
    msg = failed(res)
    assert 'the running kernel is %s, expected %s' % (KERNEL_OLD, KERNEL_TARGET) in msg
    assert res['verification']['ok'] is False
    # Committing it is refused: it is not running.
    before = node.grubenv.read_bytes()
    msg = failed(run(run_playbook, 'kernel_boot', node.boot_args(state='default')))
    assert msg.startswith('kernel %s is not running (running: %s' % (KERNEL_TARGET, KERNEL_OLD))
    assert node.grubenv.read_bytes() == before


def test_dkms_install_requires_the_dkms_build(tmp_path, kernel_repo, run_playbook, grub_editenv):
    node = make_node(tmp_path, kernel_repo, 'dkms')
    root = node.root
    res = ok(run(run_playbook, 'kernel_check', node.args()))
    assert res['packages'] == {n: V135 for n in kernel_pkgs(KERNEL_TARGET, headers=True)}
    assert res['way_back']['ok'] is True and res['way_back']['modules_on_node'] is True

    # The packages go in, but DKMS has not built the module for the new kernel: the task fails.
    msg = failed(run(run_playbook, 'kernel_packages', node.args()))
    assert 'DKMS has not built nvidia %s for kernel %s' % (NEW, KERNEL_TARGET) in msg
    inst = root.installed()
    assert {n: inst[n] for n in kernel_pkgs(KERNEL_TARGET, headers=True)} == {
        n: V135 for n in kernel_pkgs(KERNEL_TARGET, headers=True)}
    assert {n: inst[n] for n in DKMS_SET} == {n: NEW + '-0ubuntu1' for n in DKMS_SET}
    node.update_grub()
    trial = node.boot_args(state='trial', module_source='dkms', driver_version=NEW)
    before = node.grubenv.read_bytes()
    msg = failed(run(run_playbook, 'kernel_boot', trial))
    assert msg.startswith('kernel %s has no NVIDIA module to boot with: DKMS has no nvidia %s module built for %s'
                          % (KERNEL_TARGET, NEW, KERNEL_TARGET))
    assert node.grubenv.read_bytes() == before

    node.dkms_build(NEW, KERNEL_TARGET)
    res = ok(run(run_playbook, 'kernel_packages', node.args()))
    assert res['changed'] is False
    assert root.holds() == set(DKMS_SET) | set(kernel_pkgs(KERNEL_TARGET, headers=True))
    assert set(kernel_pkgs(KERNEL_OLD, headers=True)).isdisjoint(node.auto())
    assert ok(run(run_playbook, 'kernel_boot', trial))['changed'] is True
    assert grubsim.boot(node.grubenv, node.grub_cfg).kernel == KERNEL_TARGET


@pytest.mark.parametrize('args, expected', [
    ({'kernel': KERNEL_NOMOD},
     'the repositories do not offer %s for driver %s (offered: none)' % (LRM % KERNEL_NOMOD, NEW)),
    ({'kernel': '6.8.0-999-generic'}, 'the repositories do not offer linux-image-6.8.0-999-generic (offered: none)'),
    ({'driver_version': OLD}, 'the repositories do not offer %s for driver %s (offered: %s+1 for driver %s)'
     % (LRM % KERNEL_TARGET, OLD, V135, NEW)),
    ({'kernel': 'latest'}, "kernel 'latest' is not an Ubuntu/Debian kernel release such as 6.8.0-135-generic"),
    ({'driver_version': '570.195.03'}, "driver_version '570.195.03' is not in driver branch '580'"),
    ({'module_source': 'dkms'}, 'module_source=dkms does not match the installed packages: %s %s+1, '
     'nvidia-headless-no-dkms-580-server %s-0ubuntu1 are Canonical\'s prebuilt NVIDIA modules' % (LRM % KERNEL_OLD, V134, OLD)),
    ({'previous_driver_version': NEW}, 'no way back to kernel %s with driver %s: %s for driver %s is not installed '
     '(installed: %s+1 for driver %s)' % (KERNEL_OLD, NEW, LRM % KERNEL_OLD, NEW, V134, OLD)),
])
def test_refusals_change_nothing(tmp_path, kernel_repo, run_playbook, grub_editenv, args, expected):
    node = make_node(tmp_path, kernel_repo, 'prebuilt')
    before = node.digest()
    for module in ('kernel_check', 'kernel_packages'):
        res = run(run_playbook, module, node.args(**args))
        assert expected in failed(res), (module, res['msg'])
        assert node.digest() == before


def test_dkms_way_back_needs_the_previous_build(tmp_path, kernel_repo, run_playbook, grub_editenv):
    node = make_node(tmp_path, kernel_repo, 'dkms')
    import shutil
    shutil.rmtree(node.root.path / 'var/lib/dkms')
    before = node.digest()
    msg = failed(run(run_playbook, 'kernel_check', node.args()))
    assert ('no way back to kernel %s with driver %s: DKMS has no nvidia %s module built for %s'
            % (KERNEL_OLD, OLD, OLD, KERNEL_OLD)) in msg
    assert node.digest() == before


def test_kernel_boot_refusals(tmp_path, kernel_repo, run_playbook, grub_editenv):
    node = make_node(tmp_path, kernel_repo, 'prebuilt')
    root = node.root
    trial = node.boot_args(state='trial')
    before = node.grubenv.read_bytes()

    msg = failed(run(run_playbook, 'kernel_boot', trial))
    assert msg.startswith('kernel %s is not installed (no linux-image-%s package' % (KERNEL_TARGET, KERNEL_TARGET))
    assert 'installed kernels: %s' % KERNEL_OLD in msg

    ok(run(run_playbook, 'kernel_packages', node.args()))
    # Installed, but grub.cfg was not regenerated.
    msg = failed(run(run_playbook, 'kernel_boot', trial))
    assert msg.startswith('%s has no menu entry that boots kernel %s' % (node.grub_cfg, KERNEL_TARGET))
    assert 'kernels listed: %s' % KERNEL_OLD in msg
    node.update_grub()

    (root.path / 'etc/default/grub').write_text('GRUB_DEFAULT=0\n')
    msg = failed(run(run_playbook, 'kernel_boot', trial))
    assert msg.startswith('%s sets GRUB_DEFAULT=0, expected GRUB_DEFAULT=saved' % (root.path / 'etc/default/grub'))
    (root.path / 'etc/default/grub').write_text('GRUB_DEFAULT=saved\n')

    node.grubenv.write_text('saved_entry=x\n')
    msg = failed(run(run_playbook, 'kernel_boot', trial))
    assert msg.startswith('%s is not a GRUB environment block (expected 1024 bytes' % node.grubenv)
    node.grubenv.write_bytes(before)

    msg = failed(run(run_playbook, 'kernel_boot', node.boot_args(state='trial', module_source='dkms', driver_version=NEW)))
    assert msg.startswith('module_source=dkms does not match the installed packages')
    msg = failed(run(run_playbook, 'kernel_boot', node.boot_args(kernel='6.8.0-135', state='trial')))
    assert 'kernel %s is not installed' % '6.8.0-135' in msg
    msg = failed(run(run_playbook, 'kernel_boot', node.boot_args(kernel='new', state='trial')))
    assert msg == "kernel 'new' is not a kernel release such as 6.8.0-135-generic (as uname -r prints it)"
    assert node.grubenv.read_bytes() == before
    assert not (tmp_path / 'root/boot/grub2').exists()


def test_restore_after_a_trial_boot_returns_to_the_snapshot_kernel_and_driver(tmp_path, kernel_repo, run_playbook,
                                                                              grub_editenv):
    """The rollback's kernel part: a node whose trial kernel is pending (next_entry set, not yet
    booted) is restored from its snapshot: the driver set and module packages of 134 back at the old
    driver, next_entry cleared, saved_entry the snapshot's kernel; the next boot is 134 with 580.126.20."""
    node = make_node(tmp_path, kernel_repo, 'prebuilt')
    snap = tmp_path / 'snap.json'
    taken = ok(run(run_playbook, 'node_snapshot', {
        'state': 'captured', 'path': str(snap), 'installroot': str(node.root.path), 'proc_path': str(node.proc)}))
    assert taken['snapshot']['boot']['default_kernel'] == KERNEL_OLD
    ok(run(run_playbook, 'kernel_packages', node.args()))
    node.update_grub()
    ok(run(run_playbook, 'kernel_boot', node.boot_args(state='trial')))
    assert grubsim.read_env(node.grubenv)['next_entry'] == ENTRY % KERNEL_TARGET
    res = ok(run(run_playbook, 'node_snapshot', {
        'state': 'restored', 'path': str(snap), 'sha256': taken['sha256'], 'installroot': str(node.root.path)}))
    assert res['changed'] is True
    assert any('pending one-shot boot' in w for w in res.get('warnings') or []), res.get('warnings')
    assert grubsim.read_env(node.grubenv) == {'saved_entry': ENTRY % KERNEL_OLD, 'next_entry': ''}
    inst = node.root.installed()
    assert inst[LRM % KERNEL_OLD] == V134 + '+1'
    assert {n: inst[n] for n in PREBUILT_SET} == {n: OLD + '-0ubuntu1' for n in PREBUILT_SET}
    assert grubsim.boot(node.grubenv, node.grub_cfg, proc=node.proc, driver=OLD).kernel == KERNEL_OLD
    res = ok(run(run_playbook, 'kernel_boot', node.boot_args(kernel=KERNEL_OLD, state='verify', driver_version=OLD)))
    assert res['verification']['ok'] is True


def test_trial_boot_where_grub_cannot_clear_next_entry(tmp_path, kernel_repo, run_playbook, grub_editenv):
    """/boot on md RAID1 (issue 37 item 5, review T3-5): GRUB's save_env cannot clear next_entry there, so a
    one-shot would boot the trial kernel on every boot. The trial is refused with nothing changed (check mode
    too), or with allow_no_fallback the kernel becomes the saved default and no next_entry is left behind."""
    node = make_node(tmp_path, kernel_repo, 'prebuilt')
    ok(run(run_playbook, 'kernel_packages', node.args()))
    node.update_grub()
    grubsim.set_disk(node.grubenv.parent, abstraction=['diskfilter', 'mdraid1x'])
    trial = node.boot_args(state='trial')
    before = node.grubenv.read_bytes()
    for check in (True, False):
        msg = failed(run(run_playbook, 'kernel_boot', trial, check=check))
        assert msg.startswith('kernel %s cannot be booted once: %s is on diskfilter mdraid1x (grub-probe '
                              '--target=abstraction): GRUB cannot write to an LVM, RAID or encrypted device at boot, so '
                              'the one-shot next_entry would never be cleared' % (KERNEL_TARGET, node.grubenv)), msg
        assert 'nothing was changed. Set allow_no_fallback=true' in msg
        assert node.grubenv.read_bytes() == before

    # grub-probe missing: not known, refused the same way.
    msg = failed(run(run_playbook, 'kernel_boot', dict(trial, grub_probe=str(tmp_path / 'no-probe'))))
    assert ('kernel %s cannot be booted once: %s was not found on the node' % (KERNEL_TARGET, tmp_path / 'no-probe')) in msg
    assert node.grubenv.read_bytes() == before

    no_fallback = dict(trial, allow_no_fallback=True)
    res = ok(run(run_playbook, 'kernel_boot', no_fallback, check=True, diff=True))
    assert res['changed'] is True and node.grubenv.read_bytes() == before
    assert res['diff']['after'] == 'saved_entry=%s\n' % (ENTRY % KERNEL_TARGET)
    res = ok(run(run_playbook, 'kernel_boot', no_fallback))
    assert res['changed'] is True and res['fallback_kernel'] is None
    assert res['env_block'] == {'path': str(node.grubenv), 'one_shot': False,
                                'problem': '%s is on diskfilter mdraid1x (grub-probe --target=abstraction): GRUB cannot '
                                           'write to an LVM, RAID or encrypted device at boot' % node.grubenv}
    assert any('without a fallback (allow_no_fallback)' in w for w in res['warnings'])
    assert grubsim.read_env(node.grubenv) == {'saved_entry': ENTRY % KERNEL_TARGET}
    assert ok(run(run_playbook, 'kernel_boot', no_fallback))['changed'] is False
    assert grubsim.boot(node.grubenv, node.grub_cfg, proc=node.proc, driver=NEW).kernel == KERNEL_TARGET
    assert ok(run(run_playbook, 'kernel_boot', node.boot_args(state='verify', driver_version=NEW)))['verification']['ok']


def test_verify_fails_on_a_next_entry_grub_did_not_clear_and_cancel_clears_it(tmp_path, kernel_repo, run_playbook,
                                                                              grub_editenv):
    """A one-shot set where GRUB cannot clear it (by hand with grub-reboot, or by a collection that did not
    probe): the trial kernel comes up, next_entry is still set; verify fails and says so, cancel clears it
    (check mode predicts), and the next boot is the saved kernel."""
    node = make_node(tmp_path, kernel_repo, 'prebuilt')
    ok(run(run_playbook, 'kernel_packages', node.args()))
    node.update_grub()
    ok(run(run_playbook, 'kernel_boot', node.boot_args(state='trial')))
    grubsim.set_disk(node.grubenv.parent, abstraction=['diskfilter', 'lvm'])
    assert grubsim.boot(node.grubenv, node.grub_cfg, proc=node.proc, driver=NEW).kernel == KERNEL_TARGET
    assert grubsim.read_env(node.grubenv)['next_entry'] == ENTRY % KERNEL_TARGET

    res = run(run_playbook, 'kernel_boot', node.boot_args(state='verify', driver_version=NEW))
    msg = failed(res)
    assert ('GRUB did not clear the one-shot next_entry=%s in %s at boot' % (ENTRY % KERNEL_TARGET, node.grubenv)) in msg
    assert res['verification']['pending_next_entry'] == ENTRY % KERNEL_TARGET and res['next_boot']['once'] is True

    before = node.grubenv.read_bytes()
    res = ok(run(run_playbook, 'kernel_boot', node.boot_args(state='cancel'), check=True, diff=True))
    assert res['changed'] is True and node.grubenv.read_bytes() == before
    res = ok(run(run_playbook, 'kernel_boot', node.boot_args(state='cancel')))
    assert res['changed'] is True and res['commands'] == [['grub-editenv', str(node.grubenv), 'unset', 'next_entry']]
    assert res['next_boot'] == {'entry': ENTRY % KERNEL_OLD, 'kernel': KERNEL_OLD, 'once': False,
                                'fallback_entry': ENTRY % KERNEL_OLD, 'fallback_kernel': KERNEL_OLD}
    assert grubsim.read_env(node.grubenv) == {'saved_entry': ENTRY % KERNEL_OLD}
    assert ok(run(run_playbook, 'kernel_boot', node.boot_args(state='cancel')))['changed'] is False
    assert grubsim.boot(node.grubenv, node.grub_cfg).kernel == KERNEL_OLD
