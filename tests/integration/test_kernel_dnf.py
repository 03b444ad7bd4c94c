"""kernel_check and kernel_packages on the RHEL family: real dnf and rpm under an install root.

The repository (tests/tools/rpmrepo.py `rpm_repo`, built with rpmbuild and createrepo_c) holds
kernels 5.14.0-427.13.1.el9_4 and 5.14.0-427.16.1.el9_4 (`kernel`, `kernel-core`,
`kernel-modules`, `kernel-modules-core`, `kernel-devel`), the driver user space and
`kmod-nvidia-open-dkms` at 580.126.20 and 580.130.00, and NVIDIA's precompiled
`kmod-nvidia-open-<driver>-<kver>-<krel>` for 427.13.1 (both drivers) and 427.16.1 (580.130.00
only). The root says Rocky Linux 9 in its os-release, which makes the modules take dnf.

kernel_boot on that root: BootLoaderSpec entries in boot/loader/entries and the environment block
boot/grub2/grubenv, written with the real grub-editenv (Debian's grub-common; the block is the one
grub2-editenv writes), the boot simulated with GRUB's one-shot rule (tests/tools/grubsim.py).

node_snapshot on that root: captured on the previous pair, restored after the move to the target (real dnf
downgrade of the driver, the versionlock list and the BLS saved_entry put back).
"""
from __future__ import annotations

import json
import pathlib

import pytest

from tools import grubsim, rpmrepo
from tools.debian import ensure_binary
from tools.rpmrepo import (DRIVER_NAMES, KERNEL_OLD, KERNEL_TARGET, NEW, OLD, DnfRoot, host_rpm_digest, kernel_evr,
                           precompiled_name)

pytestmark = pytest.mark.slow

rpm_repo = rpmrepo.rpm_repo

E13, E16 = kernel_evr(KERNEL_OLD), kernel_evr(KERNEL_TARGET)
KERNEL = ('kernel', 'kernel-core', 'kernel-modules', 'kernel-modules-core')
DRV = '%s-1.el9'
PROTECT = 'var/lib/gpufleet/kernel-protect.json'


def lock(name: str, evr: str) -> str:
    return '%s-0:%s.*' % (name, evr)


@pytest.fixture(autouse=True)
def host_untouched():
    before = host_rpm_digest()
    yield
    assert host_rpm_digest() == before, "the host's rpm database, dpkg database or versionlock list changed"


class Node:
    def __init__(self, root: DnfRoot, proc: pathlib.Path, source: str):
        self.root, self.proc, self.source = root, proc, source

    def args(self, **kw) -> dict:
        a = {'kernel': KERNEL_TARGET, 'branch': '580', 'driver_version': NEW, 'module_source': self.source,
             'installroot': str(self.root.path), 'proc_path': str(self.proc)}
        a.update(kw)
        return a

    def dkms_build(self, driver: str, kernel: str) -> None:
        """What DKMS leaves once it built the module (no scriptlets run under the root)."""
        mod = self.root.path / 'var/lib/dkms/nvidia' / driver / kernel / 'x86_64/module'
        mod.mkdir(parents=True, exist_ok=True)
        (mod / 'nvidia.ko.xz').write_bytes(b'\0')


def make_node(tmp_path: pathlib.Path, repo: pathlib.Path, source: str) -> Node:
    """A node running 5.14.0-427.13.1.el9_4 with driver 580.126.20 from `source`."""
    root = DnfRoot.create(tmp_path / 'root', repo)
    pkgs = ['%s-%s' % (n, E13) for n in KERNEL] + ['%s-%s' % (n, OLD) for n in DRIVER_NAMES]
    if source == 'prebuilt':
        pkgs.append('%s-%s' % (precompiled_name(OLD, KERNEL_OLD), OLD))
    else:
        pkgs += ['kernel-devel-%s' % E13, 'kmod-nvidia-open-dkms-%s' % OLD]
    root.dnf('install', *pkgs)
    proc = tmp_path / 'proc'
    (proc / 'sys/kernel').mkdir(parents=True)
    (proc / 'sys/kernel/osrelease').write_text(KERNEL_OLD + '\n')
    node = Node(root, proc, source)
    if source == 'dkms':
        node.dkms_build(OLD, KERNEL_OLD)
    return node


def play(*tasks, check: bool = False, diff: bool = False):
    p = {'hosts': 'localhost', 'gather_facts': False, 'tasks': list(tasks)}
    if check:
        p['check_mode'] = True
    if diff:
        p['diff'] = True
    return [p]


def run(run_playbook, module: str, args: dict, check: bool = False, diff: bool = False) -> dict:
    r = run_playbook(play({'name': 't', 'gpufleet.upgrade.%s' % module: args}, check=check, diff=diff))
    return r.result('t')


def ok(res: dict) -> dict:
    assert res['_event'] == 'runner_on_ok', res.get('msg', res)
    return res


def failed(res: dict) -> str:
    assert res['_event'] == 'runner_on_failed', res
    assert 'Traceback' not in res.get('msg', '')
    return res['msg']


def test_prebuilt_one_transaction_versionlock_protect_release(tmp_path, rpm_repo, run_playbook):
    node = make_node(tmp_path, rpm_repo, 'prebuilt')
    root = node.root
    kmod13, kmod16 = precompiled_name(OLD, KERNEL_OLD), precompiled_name(NEW, KERNEL_TARGET)
    target = {**{n: E16 for n in KERNEL}, kmod16: DRV % NEW, **{n: DRV % NEW for n in DRIVER_NAMES}}
    previous = {**{n: E13 for n in KERNEL}, kmod13: DRV % OLD}

    res = ok(run(run_playbook, 'kernel_check', node.args()))
    assert res['changed'] is False and res['missing'] == [] and res['packages'] == target
    assert res['way_back'] == {'previous_kernel': KERNEL_OLD, 'previous_driver_version': OLD, 'ok': True, 'problems': [],
                               'modules_on_node': True, 'reinstallable': True}

    # Check mode with diff: predicted, nothing written.
    before = root.digest()
    res = ok(run(run_playbook, 'kernel_packages', node.args(), check=True, diff=True))
    assert res['changed'] is True and root.digest() == before
    assert res['installed_changes'] == target
    diffs = {d['after_header']: d for d in res['diff']}
    predicted = diffs[str(root.path / rpmrepo.VERSIONLOCK_LIST)]['after']
    assert not any(c for c in res['commands'] if 'install' in c or 'versionlock' in c)

    # The one transaction, then the locks.
    res = ok(run(run_playbook, 'kernel_packages', node.args()))
    assert res['changed'] is True
    installs = [c for c in res['commands'] if c[0] == 'dnf' and 'install' in c]
    assert len(installs) == 1 and installs[0][-len(target):] == sorted('%s-%s' % kv for kv in target.items())
    inst = root.installed()
    for n in KERNEL:
        assert inst[n] == [E13, E16]                          # side by side: the previous kernel stays
    assert inst[kmod13] == [DRV % OLD] and inst[kmod16] == [DRV % NEW]
    assert {n: inst[n] for n in DRIVER_NAMES} == {n: [DRV % NEW] for n in DRIVER_NAMES}
    locks = root.locks()
    assert locks == sorted([lock(n, v) for n, v in target.items()] + [lock(n, v) for n, v in previous.items()])
    assert predicted == ''.join(x + '\n' for x in locks)
    assert sorted(res['holds']) == locks
    assert sorted(res['protected']) == sorted(previous)
    rec = json.loads((root.path / PROTECT).read_text())
    assert rec['previous_kernel'] == KERNEL_OLD and rec['kernel'] == KERNEL_TARGET
    assert rec['versionlocked'] == sorted('%s-%s' % kv for kv in previous.items())
    # The lock holds: dnf offers no other version of a locked package.
    assert root.dnf('install', 'nvidia-driver-%s' % OLD, check=False).returncode != 0

    # Idempotent (real and check mode).
    assert ok(run(run_playbook, 'kernel_packages', node.args()))['changed'] is False
    assert ok(run(run_playbook, 'kernel_packages', node.args(), check=True))['changed'] is False

    # Past the rollback boundary: only the previous kernel's locks go; the target's stay.
    before = root.digest()
    res = ok(run(run_playbook, 'kernel_packages', node.args(state='released'), check=True, diff=True))
    assert res['changed'] is True and root.digest() == before and res['diff']['after'] == ''
    res = ok(run(run_playbook, 'kernel_packages', node.args(state='released')))
    assert res['changed'] is True and sorted(res['unmarked']) == sorted(lock(n, v) for n, v in previous.items())
    assert root.locks() == sorted(lock(n, v) for n, v in target.items())
    assert not (root.path / PROTECT).exists()
    assert root.installed()['kernel'] == [E13, E16]           # released, not removed
    assert ok(run(run_playbook, 'kernel_packages', node.args(state='released')))['changed'] is False


def test_refusals_change_nothing(tmp_path, rpm_repo, run_playbook):
    node = make_node(tmp_path, rpm_repo, 'prebuilt')
    before = node.root.digest()
    # A release string that is not a RHEL kernel's.
    msg = failed(run(run_playbook, 'kernel_packages', node.args(kernel='5.14.0-427.16.1.el9_4')))
    assert msg.startswith("kernel '5.14.0-427.16.1.el9_4' is not a RHEL-family kernel release")
    # A kernel the repository does not offer: every missing package named.
    res = run(run_playbook, 'kernel_check', node.args(kernel='5.14.0-427.99.1.el9_4.x86_64'))
    msg = failed(res)
    assert 'kernel-core 5.14.0-427.99.1.el9_4 (offered: %s, %s)' % (E16, E13) in msg
    assert 'kmod-nvidia-open-580.130.00-5.14.0-427.99.1 580.130.00 (offered: none)' in msg
    assert 'nothing was changed' in msg and res['missing']
    # No precompiled kmod of the target kernel for that driver.
    msg = failed(run(run_playbook, 'kernel_packages', node.args(driver_version=OLD)))
    assert '%s %s (offered: none)' % (precompiled_name(OLD, KERNEL_TARGET), OLD) in msg
    assert node.root.digest() == before


def test_dkms_counts_only_with_the_build(tmp_path, rpm_repo, run_playbook):
    node = make_node(tmp_path, rpm_repo, 'dkms')
    res = ok(run(run_playbook, 'kernel_check', node.args()))
    assert res['packages']['kernel-devel'] == E16 and res['packages']['kmod-nvidia-open-dkms'] == DRV % NEW
    assert res['way_back']['ok'] is True and res['way_back']['modules_on_node'] is True
    msg = failed(run(run_playbook, 'kernel_packages', node.args()))
    assert 'DKMS has not built nvidia %s for kernel %s' % (NEW, KERNEL_TARGET) in msg
    inst = node.root.installed()
    assert inst['kernel-devel'] == [E13, E16] and inst['kmod-nvidia-open-dkms'] == [DRV % NEW]
    # The single-version DKMS kmod: locked at the target only.
    assert lock('kmod-nvidia-open-dkms', DRV % NEW) in node.root.locks()
    assert lock('kmod-nvidia-open-dkms', DRV % OLD) not in node.root.locks()
    node.dkms_build(NEW, KERNEL_TARGET)
    assert ok(run(run_playbook, 'kernel_packages', node.args()))['changed'] is False


@pytest.fixture(scope='module')
def grub_editenv():
    path, why = ensure_binary('grub-common', 'grub-editenv')
    if not path:
        pytest.skip(why)
    return path


def tasks(run_playbook, *steps: tuple) -> dict:
    """One play of kernel_boot tasks (name, args, task keywords such as check_mode, diff, ignore_errors):
    {name: result}. Several tasks per play keep the test short on a loaded machine."""
    r = run_playbook(play(*[dict({'name': name, 'gpufleet.upgrade.kernel_boot': args}, **kw) for name, args, kw in steps]))
    return {step[0]: r.result(step[0]) for step in steps}


def rocky_boot(root: pathlib.Path, kernel: str, saved: str) -> pathlib.Path:
    """What `kernel-install add <kernel>` leaves on Rocky 9 (a BLS entry), its /etc/default/grub, and a fresh
    environment block with `saved`'s entry as the saved default: the grubenv path."""
    grubsim.write_bls_entry(root, kernel)
    (root / 'etc/default').mkdir(parents=True, exist_ok=True)
    (root / 'etc/default/grub').write_text('GRUB_TIMEOUT=5\nGRUB_DEFAULT=saved\nGRUB_ENABLE_BLSCFG=true\n')
    return grubsim.create_grubenv(root / 'boot/grub2/grubenv', saved_entry=grubsim.bls_id(saved), kernelopts='root=/dev/sda2 ro')


def test_bls_trial_boot_verify_default(tmp_path, rpm_repo, run_playbook, grub_editenv):
    node = make_node(tmp_path, rpm_repo, 'prebuilt')
    root = node.root.path
    ok(run(run_playbook, 'kernel_packages', node.args()))
    assert (root / ('boot/vmlinuz-%s' % KERNEL_TARGET)).is_file()
    # No scriptlet runs under an install root: write what the kernel packages' `kernel-install add`
    # would (one BLS entry per kernel; the target's below), the /etc/default/grub of Rocky 9, and the
    # environment block with the new kernel as the saved default (kernel-install does that with
    # UPDATEDEFAULT=yes in /etc/sysconfig/kernel).
    grubenv = rocky_boot(root, KERNEL_OLD, saved=KERNEL_TARGET)
    old_id, new_id = grubsim.bls_id(KERNEL_OLD), grubsim.bls_id(KERNEL_TARGET)
    entries = root / 'boot/loader/entries'
    # grub-probe answers for the install root (a plain partition, where GRUB clears next_entry at boot).
    boot = {'kernel': KERNEL_TARGET, 'installroot': str(root), 'proc_path': str(node.proc),
            'grub_probe': str(grubsim.probe_tool(tmp_path / 'bin'))}
    trial = dict(boot, state='trial', module_source='prebuilt', branch='580', driver_version=NEW)
    refuse = {'ignore_errors': True}

    # Refusals change nothing: the target has no BLS entry yet; the environment block is not one.
    before = grubenv.read_bytes()
    bad = root / 'boot/grub2/grubenv.bad'
    bad.write_bytes(b'saved_entry=%s\n' % old_id.encode())
    res = tasks(run_playbook, ('no-entry', trial, refuse), ('bad-env', dict(trial, grubenv=str(bad)), refuse))
    msg = failed(res['no-entry'])
    assert msg.startswith('%s has no BootLoaderSpec entry that boots kernel %s' % (entries, KERNEL_TARGET))
    assert 'kernels with an entry: %s' % KERNEL_OLD in msg and msg.endswith('nothing was changed')
    assert failed(res['bad-env']).startswith('%s is not a GRUB environment block (expected 1024 bytes' % bad)
    assert grubenv.read_bytes() == before

    grubsim.write_bls_entry(root, KERNEL_TARGET)
    res = tasks(run_playbook,
                # No precompiled kmod of the target kernel for that driver: refused.
                ('wrong-driver', dict(trial, driver_version=OLD), refuse),
                # Check mode with diff: predicted, nothing written.
                ('check', trial, {'check_mode': True, 'diff': True}),
                # Trial: next_entry is the target's BLS id, saved_entry goes back to the running kernel's.
                ('trial', trial, {}), ('again', trial, {}))
    assert '%s is not installed' % precompiled_name(OLD, KERNEL_TARGET) in failed(res['wrong-driver'])
    chk = ok(res['check'])
    assert chk['changed'] is True
    assert chk['diff']['after'] == 'saved_entry=%s\nkernelopts=root=/dev/sda2 ro\nnext_entry=%s\n' % (old_id, new_id)
    t = ok(res['trial'])
    # The check-mode task wrote nothing: the real task after it still had both variables to set.
    assert t['changed'] is True and t['entry'] == new_id and t['fallback_kernel'] == KERNEL_OLD
    assert t['commands'] == [['grub-editenv', str(grubenv), 'set', 'next_entry=%s' % new_id, 'saved_entry=%s' % old_id]]
    assert t['next_boot'] == {'entry': new_id, 'kernel': KERNEL_TARGET, 'once': True, 'fallback_entry': old_id,
                              'fallback_kernel': KERNEL_OLD}
    assert ok(res['again'])['changed'] is False
    assert grubsim.read_env(grubenv) == {'saved_entry': old_id, 'kernelopts': 'root=/dev/sda2 ro', 'next_entry': new_id}

    # Reboot: GRUB boots the target once and clears next_entry. Then verify what came up, and after
    # the gates make the target the saved default.
    assert grubsim.boot(grubenv, entries=entries, proc=node.proc, driver=NEW).kernel == KERNEL_TARGET
    assert grubsim.read_env(grubenv)['next_entry'] == ''
    res = tasks(run_playbook, ('verify', dict(boot, state='verify', driver_version=NEW), {}),
                ('default', dict(boot, state='default'), {'diff': True}), ('again', dict(boot, state='default'), {}))
    v = ok(res['verify'])
    assert v['verification']['ok'] is True and v['verification']['running_kernel'] == KERNEL_TARGET
    assert v['next_boot']['kernel'] == KERNEL_OLD and v['next_boot']['once'] is False
    d = ok(res['default'])
    assert d['changed'] is True and d['entry'] == new_id
    assert d['diff']['after'] == 'saved_entry=%s\nkernelopts=root=/dev/sda2 ro\nnext_entry=\n' % new_id
    assert ok(res['again'])['changed'] is False
    assert grubsim.read_env(grubenv) == {'saved_entry': new_id, 'kernelopts': 'root=/dev/sda2 ro', 'next_entry': ''}
    assert grubsim.boot(grubenv, entries=entries).kernel == KERNEL_TARGET


def snapshot_task(name: str, path: pathlib.Path, node: Node, **kw) -> dict:
    args = {'path': str(path), 'installroot': str(node.root.path), 'proc_path': str(node.proc), **kw}
    return {'name': name, 'gpufleet.upgrade.node_snapshot': args}


def test_snapshot_rollback_after_kernel_and_driver_move(tmp_path, rpm_repo, run_playbook, grub_editenv):
    """One engineer's rollback on a RHEL node: snapshot on the previous pair, move to the target kernel and
    driver (kernel_packages, BLS trial boot, new default), then node_snapshot state=restored."""
    node = make_node(tmp_path, rpm_repo, 'prebuilt')
    root = node.root
    kmod13, kmod16 = precompiled_name(OLD, KERNEL_OLD), precompiled_name(NEW, KERNEL_TARGET)
    entries, old_id, new_id = root.path / 'boot/loader/entries', grubsim.bls_id(KERNEL_OLD), grubsim.bls_id(KERNEL_TARGET)
    # The previous pair as it runs: the driver locked at its version (real `dnf versionlock add`), booting 427.13.1.
    root.dnf('versionlock', 'add', *('%s-%s' % (n, DRV % OLD) for n in DRIVER_NAMES))
    grubenv = rocky_boot(root.path, KERNEL_OLD, saved=KERNEL_OLD)
    captured_locks, captured_text = root.locks(), (root.path / rpmrepo.VERSIONLOCK_LIST).read_text()
    assert captured_locks == sorted(lock(n, DRV % OLD) for n in DRIVER_NAMES)
    snap_path = tmp_path / 'node-snapshot.json'
    boot = {'kernel': KERNEL_TARGET, 'installroot': str(root.path), 'proc_path': str(node.proc),
            'grub_probe': str(grubsim.probe_tool(tmp_path / 'bin'))}

    # Snapshot, then the target kernel with the driver in one transaction (the snapshot keeps the rollback point).
    r = run_playbook(play(snapshot_task('capture', snap_path, node, state='captured'),
                          {'name': 'move', 'gpufleet.upgrade.kernel_packages': node.args()}))
    cap, moved = ok(r.result('capture')), ok(r.result('move'))
    snap = cap['snapshot']
    assert cap['changed'] is True and json.loads(snap_path.read_text())['sha256'] == cap['sha256']
    assert snap['backend'] == 'dnf' and snap['packages'] == {**{n: DRV % OLD for n in DRIVER_NAMES}, kmod13: DRV % OLD}
    assert snap['pins']['content'] == captured_text
    assert snap['boot']['saved_entry'] == old_id and snap['boot']['grub_default'] == 'saved'
    assert moved['changed'] is True
    # kernel-install of the target (its BLS entry, UPDATEDEFAULT=yes), the trial boot, verify and the new default.
    rocky_boot(root.path, KERNEL_TARGET, saved=KERNEL_TARGET)
    trial = dict(boot, state='trial', module_source='prebuilt', branch='580', driver_version=NEW)
    assert ok(tasks(run_playbook, ('trial', trial, {}))['trial'])['changed'] is True
    assert grubsim.boot(grubenv, entries=entries, proc=node.proc, driver=NEW).kernel == KERNEL_TARGET
    res = tasks(run_playbook, ('verify', dict(boot, state='verify', driver_version=NEW), {}),
                ('default', dict(boot, state='default'), {}))
    assert ok(res['verify'])['verification']['ok'] is True and ok(res['default'])['entry'] == new_id
    inst = root.installed()
    assert {n: inst[n] for n in DRIVER_NAMES} == {n: [DRV % NEW] for n in DRIVER_NAMES} and inst[kmod16] == [DRV % NEW]
    assert lock('nvidia-driver', DRV % NEW) in root.locks() and root.locks() != captured_locks
    assert grubsim.read_env(grubenv)['saved_entry'] == new_id

    # Bad input: an altered snapshot (digest mismatch) is refused before anything changes.
    doc = json.loads(snap_path.read_text())
    doc['snapshot']['packages']['nvidia-driver'] = DRV % NEW
    altered = tmp_path / 'altered-snapshot.json'
    altered.write_text(json.dumps(doc))
    before, rpm_before, env_before = root.digest(), root.installed(), grubenv.read_bytes()
    msg = failed(run(run_playbook, 'node_snapshot', {'state': 'restored', 'path': str(altered),
                                                     'installroot': str(root.path)}))
    assert msg.startswith('node_snapshot: %s: snapshot digest mismatch: recorded sha256 %s' % (altered, cap['sha256']))
    assert msg.endswith('nothing was restored')
    assert root.digest() == before and root.installed() == rpm_before and grubenv.read_bytes() == env_before

    # The rollback, then again: nothing left to do.
    restore = {'state': 'restored', 'sha256': cap['sha256']}
    r = run_playbook(play(snapshot_task('restore', snap_path, node, **restore),
                          snapshot_task('again', snap_path, node, **restore)))
    res, again = ok(r.result('restore')), ok(r.result('again'))
    assert res['changed'] is True, res
    installs = [c for c in res['commands'] if c[0] == 'dnf' and 'install' in c]
    assert len(installs) == 1 and installs[0][-len(DRIVER_NAMES):] == sorted('%s-%s' % (n, DRV % OLD) for n in DRIVER_NAMES)
    assert res['changed_files'] == ['boot/grub2/grubenv'] and res['restored']['pin_file'] == str(root.path / rpmrepo.VERSIONLOCK_LIST)
    assert again['changed'] is False, again
    assert not [c for c in again['commands'] if c[0] == 'dnf' and 'install' in c] and again['changed_files'] == []
    inst = root.installed()
    assert {n: inst[n] for n in DRIVER_NAMES} == {n: [DRV % OLD] for n in DRIVER_NAMES}
    assert inst[kmod13] == [DRV % OLD]
    for n in KERNEL:
        assert inst[n] == [E13, E16]                          # the previous kernel is still there (the target too)
    assert res['extra_packages'] == {kmod16: DRV % NEW}       # the target kernel's kmod: reported, left installed
    assert root.locks() == captured_locks
    assert (root.path / rpmrepo.VERSIONLOCK_LIST).read_text() == captured_text
    assert grubsim.read_env(grubenv) == {'saved_entry': old_id, 'kernelopts': 'root=/dev/sda2 ro', 'next_entry': ''}
    assert grubsim.boot(grubenv, entries=entries).kernel == KERNEL_OLD
