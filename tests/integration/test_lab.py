"""The lab scenario end to end (tests/tools/lab.py) on a smaller pool, and the orchestration's
failure paths: the injected fault stops expansion and rolls the node back; without a fault the
whole rollout of the seed's change (kernel, RKE2 through the SUC stand-in, driver) completes and
every node is measured at the target; a node that does not come back Ready stops the rollout,
cordoned; a GPU that runs hot under the new driver fails the metric gate (a real Prometheus scraping
the lab's DCGM exporter stand-in), which stops expansion and rolls the node back; a target kernel
that does not come up falls back to the saved kernel, and the node stays cordoned on its previous
kernel and driver. The lab's host side on its own: install roots whose apt lists a new kernel in
grub.cfg, reboots by GRUB's rules with the NVIDIA module installed for the booted kernel.

Each run drives the real playbooks through ansible-runner against a real control plane (tests/cluster,
started and stopped by the lab; the playbooks run as the operator ServiceAccount, docs/rbac),
real dpkg/apt install roots and the stand-in NVML. `make lab` runs the same driver on 40 nodes.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.parse

import pytest
import yaml

from tools import debrepo, grubsim, lab_dcgm, lab_node, labenv

REPO = pathlib.Path(__file__).resolve().parents[2]
LAB = REPO / 'tests' / 'tools' / 'lab.py'
# The lab runs the metric gate when Prometheus is installed (`make system-deps` installs it).
PROMETHEUS = shutil.which('prometheus')
needs_prometheus = pytest.mark.skipif(not PROMETHEUS, reason='LOUD SKIP: no Prometheus for the lab\'s metric gate: '
                                      'apt-get install --no-install-recommends prometheus (or make system-deps as root)')

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')


def run_lab(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The package repository and the template root are cached between runs under --dir/cache. Preflight (read-only)
    # is left to the production run below, which runs it; these test the steps after it (issue 36: time).
    return subprocess.run([sys.executable, str(LAB), '--dir', str(tmp_path / 'lab'), '--quiet', '--no-preflight', *args], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=1500)


def annotations(lab: pathlib.Path, node: str) -> dict:
    return json.loads((lab / 'nodes' / node / 'nvml.json').read_text())


# The summary table's columns (lab.py Lab.summary).
BATCH, NODE, MODEL, K_BEFORE, K_AFTER, D_BEFORE, D_AFTER, RKE2, CORDONED, STATE, GATES = range(11)
K0, K1, D0, D1, R0, R1 = (labenv.KERNEL, labenv.TARGET_KERNEL, labenv.SOURCE_DRIVER, labenv.TARGET_DRIVER,
                          labenv.RKE2, labenv.TARGET_RKE2)
RESTORED = 'its rollback restored kernel %s with driver %s' % (K0, D0)


def measured(r: list[str]) -> list[str]:
    """kernel after, driver after, RKE2, cordoned, state."""
    return [r[K_AFTER], r[D_AFTER], r[RKE2], r[CORDONED], r[STATE]]


def rows(out: str) -> dict[str, list[str]]:
    table = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1].startswith('gpu-') and parts[0].isdigit():
            table[parts[1]] = parts
    return table


def canary_bundles(lab: pathlib.Path) -> list[pathlib.Path]:
    """The canary evidence bundles in the qualification directory (not the GPU Operator's snapshot, kept there
    too when the lab runs the real operator)."""
    return [p for p in sorted((lab / 'qualification').glob('*.json')) if not p.name.startswith('gpu-operator--')]


def evidence_bundles(lab: pathlib.Path) -> list[pathlib.Path]:
    """The canary bundles, then the rollout's: a node's later entry wins where a reader keeps the last."""
    return canary_bundles(lab) + [lab / 'evidence' / 'rollout.json']


def metric_gates(lab: pathlib.Path) -> dict[str, dict]:
    """node -> the metric gate's evidence entry, from the canary bundles and the rollout's."""
    out = {}
    for path in evidence_bundles(lab):
        for g in json.loads(path.read_text())['gates']:
            if g['kind'] == 'metric':
                out[g['node']] = g
    return out


@needs_prometheus
def test_lab_fault_stops_expansion_and_rolls_back(tmp_path):
    """What `make lab` runs as root, on 8 nodes: the Xid fault on gpu-04 stops expansion; the node stays cordoned and
    its rollback restores the host (kernel, driver) and takes its operands back with it (NVIDIA's real GPU Operator:
    Lab.verdict fails unless the faulty node's validator runs the source operator's revision again, the earlier
    nodes the target's, the later ones the source's, and the update strategy stays OnDelete). Issue 36: this run
    also holds the operand rollback of the apt install method that a lab run of its own (an operand fault) checked;
    the operand fault itself (the operands step fails) is the per-pool driver run's."""
    out = run_lab(tmp_path, '--nodes', '8', '--fault', 'gpu-04', '--gpu-operator')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert 'the fault on gpu-04 stopped expansion, the node stays cordoned and ' + RESTORED in out.stdout
    table = rows(out.stdout)
    # gpu-04's batch: the node is back on the previous kernel and driver (RKE2 is the rollback
    # boundary: it keeps the target's), cordoned, its state recorded.
    assert measured(table['gpu-04']) == [K0, D0, R1, 'yes', 'rolled-back']
    assert 'critical gate failed on gpu-04' in out.stdout and 'new Xid 79' in out.stdout
    # The canaries finished; the batch after the fault was never touched.
    assert measured(table['gpu-01']) == [K1, D1, R1, 'no', 'done']
    later = [n for n, r in table.items() if int(r[BATCH]) > int(table['gpu-04'][BATCH])]
    assert later and all(measured(table[n]) == [K0, D0, R0, 'no', '-'] for n in later)
    # NVML follows the install root: the stand-in reports the restored driver.
    assert annotations(tmp_path / 'lab', 'gpu-04')['driver_version'] == '580.126.20'
    if PROMETHEUS:
        # The metric gate ran on every upgraded node; on gpu-04 the GPU gate caught the Xid first.
        gates = metric_gates(tmp_path / 'lab')
        done = sorted(n for n, r in table.items() if r[STATE] == 'done')
        assert done and sorted(gates) == done and all(gates[n]['passed'] for n in done)
        assert table['gpu-04'][GATES].startswith('gpu:FAIL,') and 'metric' not in table['gpu-04'][GATES]
    else:
        assert 'metric gate: OFF, Prometheus is not available' in out.stdout
    report = tmp_path / 'lab' / 'report.html'
    assert report.is_file() and 'gpu-04' in report.read_text()
    assert_records_carry_the_measured_tuple(tmp_path / 'lab')


def assert_records_carry_the_measured_tuple(lab: pathlib.Path) -> None:
    """Each canary bundle's canaries carry the tuple node_upgrade measured (measured: true, recorded by
    the canary role), and the record's target is that measurement. Each canary's rollback was timed and
    judged against the lab's maintenance window (30m): an action and a passed rollback-time gate."""
    for path in canary_bundles(lab):
        bundle = json.loads(path.read_text())
        canaries = sorted(n for n, e in bundle['nodes'].items() if e.get('role') == 'canary')
        timed = {a['node']: a for a in bundle['actions'] if a['name'] == 'rollback-exercise'}
        gates = {g['node']: g for g in bundle['gates'] if g['name'] == 'rollback-time'}
        assert sorted(timed) == sorted(gates) == canaries, (timed, gates)
        for n in canaries:
            assert timed[n]['duration_s'] > 0 and timed[n]['result']['seconds'] > 0
            assert gates[n]['passed'] and gates[n]['category'] == 'rollback' and gates[n]['result']['window_s'] == 1800
    names = {'kernel': 'kernel', 'rke2': 'rke2', 'driver': 'driver', 'gpu_operator': 'gpuOperator',
             'dcgm_exporter': 'dcgmExporter'}
    bundles = canary_bundles(lab)
    assert bundles
    for path in bundles:
        canaries = [n for n in json.loads(path.read_text())['nodes'].values() if n.get('role') == 'canary']
        assert canaries and all(n.get('measured') is True and n.get('verdict') == 'upgraded' for n in canaries), canaries
        target = yaml.safe_load(path.with_suffix('.yaml').read_text())['target']
        assert all(target == {names[k]: v for k, v in n['tuple_after'].items()} for n in canaries), (target, canaries)
        assert target['driver'] == labenv.TARGET['driver']
        # Each canary claim points to gates of this bundle (issue 16); RKE2, when it moves, is declared one-way.
        bundle = json.loads(path.read_text())
        text = path.with_suffix('.yaml').read_text().splitlines()
        for claim in ('completedAt', 'allocationPassed', 'monitoringPassed', 'rollbackPassed'):
            line = next(ln for ln in text if ln.startswith('#   canary.%s: ' % claim))
            refs = line.split(': ', 1)[1].split(', ')
            assert set(refs) <= {g['id'] for g in bundle['gates']}, (path, line)
        # The shipped workload suite ran on each canary (6 cases x 3 runs, Jobs scheduled for real), then the GPU
        # gate again (the Xids the workloads caused); the allocation claim points to the workload gate too.
        for n in canaries:
            gates = {g['name']: g for g in bundle['gates'] if g.get('node') == n['name']}
            assert gates['workload']['passed'] and gates['workload']['category'] == 'allocation', gates.get('workload')
            assert gates['workload']['result']['msg'] == 'workload gate: PASS on %s (6 case(s) x 3 run(s))' % n['name']
            assert gates['gpu_after_workload']['passed'] and gates['gpu_after_workload']['kind'] == 'gpu'
        allocation = next(ln for ln in text if ln.startswith('#   canary.allocationPassed: '))
        assert 'workload@' in allocation, allocation
        # The monitoring claim rests on each canary's metric gate (its DCGM series read from Prometheus).
        monitoring = next(ln for ln in text if ln.startswith('#   canary.monitoringPassed: '))
        assert all('metric@%s#' % n['name'] in monitoring for n in canaries), monitoring
        scope = next(ln for ln in text if ln.startswith('#   canary.rollbackPassed scope: '))
        assert 'restored on the node: kernel, driver;' in scope or 'restored on the node: driver;' in scope, scope
        rke2_moved = bundle['tuple']['before']['rke2'] != bundle['tuple']['after']['rke2']
        assert ('rke2 (RKE2 is never downgraded' in scope) is rke2_moved, scope


@needs_prometheus
def test_lab_without_fault_completes_and_moves_every_component_with_the_real_gpu_operator(tmp_path):
    """The whole rollout, with NVIDIA's real GPU Operator running the operands (issue 15; what `make lab` runs as
    root): the canary's cluster step, each node's operands moved in its window, the update strategy restored at the
    end; the lab's own verdict (Lab.operand_problems) checks every node's operand pods at the target operator's
    current revision and RollingUpdate back. One run for both: the operator-less operands run in the other tests."""
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'none', '--gpu-operator')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert 'lab: OK' in out.stdout and 'the whole rollout completed' in out.stdout
    assert 'gpu_operator v26.3.3 -> v26.3.4' in out.stdout
    table = rows(out.stdout)
    assert sorted(table) == ['gpu-01', 'gpu-02', 'gpu-03', 'gpu-04']
    # Measured before and after: the kernel (proc), the loaded driver, RKE2 (the kubelet).
    assert all([r[K_BEFORE], r[D_BEFORE]] == [K0, D0] for r in table.values()), table
    assert all(measured(r) == [K1, D1, R1, 'no', 'done'] for r in table.values()), table
    lab = tmp_path / 'lab'
    for name in table:
        root = lab / 'nodes' / name / 'root'
        # The trial boot's next_entry was used and cleared; after the gates the target is the default.
        assert grubsim.read_env(root / 'boot/grub/grubenv') == {'saved_entry': grubsim.entry_id(K1), 'next_entry': ''}
        assert 'Linux version %s ' % K1 in (lab / 'nodes' / name / 'kern.log').read_text()
    # release.yml (issue 14): past the rollback boundary the previous kernel each node protected is
    # automatic again (apt's own record), its protection record gone, and the bundle says what moved.
    release = [a for a in json.loads((lab / 'evidence' / 'rollout.json').read_text())['actions']
               if a['name'] == 'kernel-release']
    assert len(release) == 1 and release[0]['ok'], release
    unmarked = release[0]['result']['unmarked']
    assert sorted(unmarked) == sorted(table), unmarked
    for name, pkgs in unmarked.items():
        root = lab / 'nodes' / name / 'root'
        assert 'linux-image-%s' % K0 in pkgs, (name, pkgs)
        assert not (root / 'var/lib/gpufleet/kernel-protect.json').exists()
        auto = {st['Package'] for st in apt_extended_states(root) if st.get('Auto-Installed') == '1'}
        assert set(pkgs) <= auto, (name, sorted(set(pkgs) - auto))
    if PROMETHEUS:
        assert 'metric gate: ON, Prometheus http://127.0.0.1:' in out.stdout
        assert 'metric gate verdicts: 4 nodes passed, 0 failed' in out.stdout
        assert all(r[GATES].startswith('gpu:ok,node:ok,tuple:ok,metric:ok') for r in table.values()), table
        assert all(g['passed'] for g in metric_gates(tmp_path / 'lab').values())
    assert_records_carry_the_measured_tuple(lab)
    assert_node_entries_carry_package_digests(lab, table)
    assert_windows_regate_every_upgraded_node(lab)
    after = _tuple_after(lab)
    assert sorted(after) == sorted(table)
    assert all(t['gpu_operator'] == labenv.TARGET_GPU_OPERATOR and t['dcgm_exporter'] == labenv.DCGM_EXPORTER
               for t in after.values()), after
    (snapshot,) = (lab / 'qualification').glob('gpu-operator--*.json')
    kept = json.loads(snapshot.read_text())
    assert kept['gpu_operator']['chart']['version'] == labenv.GPU_OPERATOR
    assert kept['chart_values']['daemonsets']['updateStrategy'] == 'RollingUpdate'


def assert_windows_regate_every_upgraded_node(lab: pathlib.Path) -> None:
    """Issue 16 (2): every observation window (the canaries', each batch's) re-ran the node gate and the plan's
    workload case (the lab's plan declares device-query) on every node upgraded so far, and passed; a node whose
    GPUs its tenants all hold is named as not run (busy), not failed."""
    plan = json.loads((lab / 'plan.json').read_text())
    assert plan['observation']['workloads'] == {'cases': ['device-query'], 'repeat': 1}, plan['observation']
    windows = [g for path in evidence_bundles(lab)
               for g in json.loads(path.read_text())['gates'] if g['kind'] == 'observation']
    rollout = [g for g in json.loads((lab / 'evidence' / 'rollout.json').read_text())['gates'] if g['kind'] == 'observation']
    assert rollout and windows, windows
    for window in windows:
        result = window['result']
        assert window['passed'] is True, window
        # a node whose tenants (the lab's training ReplicaSets) hold every GPU runs no case (busy) and fails nothing
        assert result['node_gated'] == sorted(result['nodes']) == sorted(result['workload_gated'] + result['workload_busy'])
    assert any(w['result']['workload_gated'] for w in windows), windows
    # the last window re-gated every node of the plan
    assert sorted(rollout[-1]['result']['nodes']) == sorted(plan['canaries'] + [n for b in plan['batches'] for n in b
                                                                                if n not in plan['canaries']]), rollout[-1]


def assert_node_entries_carry_package_digests(lab: pathlib.Path, table: dict) -> None:
    """Issue 16 (5): each node's evidence entry lists the packages its upgrade installed with the SHA-256 the
    repository's index gives, which is the digest of the .deb file in the lab's repository."""
    files = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in (lab / 'cache').glob('debrepo-*/*.deb')}
    entries = {}
    for path in evidence_bundles(lab):
        entries.update((n['name'], n) for n in json.loads(path.read_text())['nodes'].values() if n.get('artifacts'))
    assert sorted(entries) == sorted(table), sorted(entries)
    for name, entry in entries.items():
        packages = [a for a in entry['artifacts'] if a['kind'] == 'package']
        assert packages and all((files.get(a.get('sha256')) or '').startswith(
            '%s_%s_' % (a['name'], a['version'].replace(':', '%3a'))) for a in packages), (name, packages)
        assert any(a['version'].startswith(D1) for a in packages), (name, packages)


def apt_extended_states(root: pathlib.Path) -> list[dict[str, str]]:
    """apt's record of automatically installed packages under an install root, one dict per stanza."""
    path = root / 'var/lib/apt/extended_states'
    text = path.read_text() if path.exists() else ''
    return [dict(line.split(': ', 1) for line in stanza.splitlines() if ': ' in line)
            for stanza in text.split('\n\n') if stanza.strip()]


def _tuple_after(lab: pathlib.Path) -> dict[str, dict]:
    """node -> the tuple measured after its upgrade (the canary bundles, then the rollout's evidence)."""
    out = {}
    for path in evidence_bundles(lab):
        for n in json.loads(path.read_text())['nodes'].values():
            if n.get('tuple_after'):
                out[n['name']] = n['tuple_after']
    return out


@needs_prometheus
def test_lab_operator_managed_driver_moves_every_node_with_the_operator(tmp_path):
    """install_method operator (issue 15): the operator's driver container is the driver. The cluster step sets
    driver.version with the rest; each node's activation moves its driver pod (the lab's hook loads the module of
    the version the pod runs, as a driver container does); no host package is installed; the canaries' rollback
    exercise takes the driver pod back and forward again; every node ends measured at the target."""
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'none', '--gpu-operator', '--install-method', 'operator',
                  '--change', 'driver')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert 'the whole rollout completed' in out.stdout
    table = rows(out.stdout)
    assert all(measured(r) == [K0, D1, R0, 'no', 'done'] for r in table.values()), table
    lab = tmp_path / 'lab'
    for name in table:     # the host's driver packages did not move: the driver container is the driver
        assert lab_node.installed_driver(lab / 'nodes' / name / 'root') == D0, name
    (snapshot,) = (lab / 'qualification').glob('gpu-operator--*.json')
    driver = next(o for o in json.loads(snapshot.read_text())['gpu_operator']['operands']
                  if o['name'] == 'nvidia-driver-daemonset')
    assert driver['image'].endswith(':%s-ubuntu22.04' % D0), driver


@needs_prometheus
def test_lab_per_pool_driver_moves_with_each_node_and_a_failed_node_goes_back(tmp_path):
    """install_method operator with the driver rendered per node pool from an NVIDIADriver (--driver-pools,
    driver.useNvidiaDriverCRD) and FAULT_KIND=operand (the faulty node's new DCGM exporter never starts: admission
    refuses it; its operands step fails): the cluster step moves the NVIDIADriver's version (the
    ClusterPolicy's driver.version stays), the canaries and the first node move their pool's driver pod through
    the roles, the faulty node's rollback takes it back to the snapshot's revision and its gates pass on the old
    driver. (The ClusterPolicy's driver goes back in the canaries' rollback exercise of the test above.)"""
    out = run_lab(tmp_path, '--nodes', '4', '--gpu-operator', '--install-method', 'operator', '--change', 'driver',
                  '--driver-pools', '--fault-kind', 'operand')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    table = rows(out.stdout)
    faulty = [n for n, r in table.items() if 'INJECTED' in ' '.join(r)]
    assert len(faulty) == 1, table
    assert measured(table[faulty[0]]) == [K0, D0, R0, 'yes', 'rolled-back'], table
    assert table[faulty[0]][GATES] == 'rollback-gpu:ok', table
    assert 'operands failed' in out.stdout and 'nvidia-dcgm-exporter: no pod on %s yet' % faulty[0] in out.stdout
    assert 'its rollback restored kernel %s with driver %s' % (K0, D0) in out.stdout
    assert all(measured(r) == [K0, D1, R0, 'no', 'done'] for n, r in table.items()
               if r[STATE] == 'done'), table
    (snapshot,) = (tmp_path / 'lab' / 'qualification').glob('gpu-operator--*.json')
    snap = json.loads(snapshot.read_text())
    assert [(d['name'], d['version']) for d in snap['drivers']] == [(labenv.DRIVER_POOL, D0)], snap['drivers']
    (pool,) = [o for o in snap['gpu_operator']['operands'] if o['nvidia_driver'] == labenv.DRIVER_POOL]
    assert pool['name'].startswith('nvidia-gpu-driver-') and pool['image'].endswith(':%s-ubuntu22.04' % D0), pool


def test_lab_without_canary_is_refused_with_the_real_gpu_operator(tmp_path):
    # canary.yml makes the operator's cluster step: without it the rollout would run against an operator the
    # canary never moved. Refused before anything starts (no lab directory, no control plane).
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'none', '--gpu-operator', '--without-canary')
    assert out.returncode == 1, out.stdout + out.stderr
    assert '--without-canary cannot run with --gpu-operator' in out.stderr, out.stderr
    assert not (tmp_path / 'lab').exists()


@needs_prometheus
def test_node_not_ready_after_reboot_stops_the_rollout_cordoned(tmp_path):
    # gpu-02 never comes back Ready after its (lab) reboot: the wait is bounded, the node stays
    # cordoned, no rollback is attempted on a node that is not up, and the run fails saying why.
    # --without-canary (here and in the two tests below): the subject is the rollout, so the lab writes the
    # approved records instead of running canary.yml (about half of a lab run); this file's other runs qualify.
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'none', '--stuck', 'gpu-02', '--without-canary')
    assert 'approval: WITHOUT CANARY' in out.stdout and '== canary' not in out.stdout, out.stdout[-6000:]
    assert out.returncode == 1, out.stdout[-6000:]
    assert 'node gpu-02 did not become Ready within 30' in out.stdout
    assert 'recover it by hand, then run gpufleet.upgrade.rollback' in out.stdout
    table = rows(out.stdout)
    assert table['gpu-02'][CORDONED] == 'yes' and table['gpu-02'][STATE] == 'failed'
    assert 'rollout did not complete' in out.stdout


@needs_prometheus
def test_lab_hot_gpu_fails_the_metric_gate_and_rolls_back(tmp_path):
    # gpu-02 (batch 1 of 3) runs GPU 5 at 92 C under the new driver: NVML reads 38 C at the GPU
    # gate's instant, only the DCGM series over the metric gate's window show it. The canaries (gpu-01, gpu-03)
    # are upgraded by the rollout's first batch (--without-canary).
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'gpu-02', '--fault-kind', 'temperature', '--without-canary')
    assert 'approval: WITHOUT CANARY' in out.stdout and '== canary' not in out.stdout, out.stdout[-6000:]
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert ('the fault on gpu-02 stopped expansion, the node stays cordoned and %s '
            '(injected: GPU 5 at 92 C under load)' % RESTORED) in out.stdout
    table = rows(out.stdout)
    assert measured(table['gpu-02']) == [K0, D0, R1, 'yes', 'rolled-back']
    assert table['gpu-02'][GATES] == 'gpu:ok,node:ok,tuple:ok,metric:FAIL,rollback-gpu:ok'
    assert 'critical gate failed on gpu-02: metric gate' in out.stdout
    assert measured(table['gpu-04']) == [K0, D0, R0, 'no', '-'] and table['gpu-04'][GATES] == '-'
    assert measured(table['gpu-01']) == [K1, D1, R1, 'no', 'done']
    gates = metric_gates(tmp_path / 'lab')
    assert sorted(gates) == ['gpu-01', 'gpu-02', 'gpu-03']
    assert gates['gpu-01']['passed'] is True and gates['gpu-03']['passed'] is True
    assert gates['gpu-02']['passed'] is False
    assert gates['gpu-02']['problems'][0].startswith('dcgm_gpu_temperature: 92 is above the allowed 85')
    assert 'UUID="GPU-gpu-02-0005"' in gates['gpu-02']['problems'][0]
    # Prometheus kept its data under the lab directory.
    assert (tmp_path / 'lab' / 'prometheus' / 'data').is_dir()


@needs_prometheus
def test_lab_target_kernel_that_does_not_boot_stays_cordoned_on_the_previous_pair(tmp_path):
    # gpu-02 (batch 1 of 3): kernel 6.8.0-135-generic does not come up; its one-shot trial boot
    # falls back to saved_entry (134), where the module package the transaction installed for 134
    # (built for 580.130.00) loads. The node is Ready on the wrong kernel: detected, cordoned, rolled
    # back to 134 with 580.126.20; the batch after it untouched (--without-canary).
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'gpu-02', '--fault-kind', 'kernel', '--without-canary')
    assert 'approval: WITHOUT CANARY' in out.stdout and '== canary' not in out.stdout, out.stdout[-6000:]
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert ('the fault on gpu-02 stopped expansion, the node stays cordoned and %s (injected: kernel %s does not '
            'come up)' % (RESTORED, K1)) in out.stdout
    table = rows(out.stdout)
    assert measured(table['gpu-02']) == [K0, D0, R1, 'yes', 'rolled-back']
    assert measured(table['gpu-01']) == [K1, D1, R1, 'no', 'done']
    assert measured(table['gpu-04']) == [K0, D0, R0, 'no', '-']
    node = tmp_path / 'lab' / 'nodes' / 'gpu-02'
    assert 'Linux version %s ' % K1 not in (node / 'kern.log').read_text()     # it never came up
    assert grubsim.read_env(node / 'root/boot/grub/grubenv')['saved_entry'] == grubsim.entry_id(K0)
    assert 'rollout stopped at gpu-02' in out.stdout and K1 in out.stdout


def lab_root(tmp_path: pathlib.Path, names: list[str]) -> pathlib.Path:
    lab = tmp_path / 'lab'
    labenv.make_roots(lab, names)
    labenv.write_node_files(lab, names)
    return lab


def collection_apt_get(root: pathlib.Path, *args: str) -> None:
    """apt-get under `root` configured as the collection's AptBackend does it (its own APT_CONFIG,
    outside the root, setting Dir to the root): what kernel_packages runs."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
    conf = root.parent / 'collection-apt.conf'
    conf.write_text(pk.apt_config_for_root(str(root.resolve()), as_root=os.geteuid() == 0))
    subprocess.run(['apt-get', '-q', '-y', *args], env=dict(os.environ, APT_CONFIG=str(conf), DEBIAN_FRONTEND='noninteractive'),
                   check=True, capture_output=True, text=True, timeout=300)


# The collection's one transaction for the seed's change with the prebuilt module source.
V134, V135 = debrepo.kernel_version(K0), debrepo.kernel_version(K1)
TRANSACTION = (['%s=%s' % (n % K1, V135) for n in ('linux-image-%s', 'linux-modules-%s', 'linux-modules-extra-%s')]
               + ['linux-modules-nvidia-580-server-%s=%s+1' % (K1, V135), 'linux-modules-nvidia-580-server-%s=%s+2' % (K0, V134)]
               + ['%s=%s-0ubuntu1' % (n, D1) for n in labenv.PREBUILT_SET])


def test_lab_node_roots_list_new_kernels_and_boot_by_grub_rules(tmp_path):
    """The lab's host side without a cluster: the install root at the source (prebuilt set, kernel 134,
    GRUB), grub.cfg regenerated after the collection-style apt transaction, reboots by GRUB's rules
    (next_entry once, then saved_entry; a kernel that fails falls back; none up: nothing runs) with
    the NVIDIA module installed for the booted kernel, and a reload."""
    lab = lab_root(tmp_path, ['gpu-01'])
    node = lab / 'nodes' / 'gpu-01'
    root = node / 'root'
    inst = debrepo.AptRoot(root, root, node / 'root.apt.conf').installed()
    assert {n: inst[n] for n in labenv.PREBUILT_SET} == {n: D0 + '-0ubuntu1' for n in labenv.PREBUILT_SET}
    assert inst['linux-modules-nvidia-580-server-%s' % K0] == V134 + '+1' and 'nvidia-driver-580-server' not in inst
    assert sorted(p.name for p in (root / 'boot').glob('vmlinuz-*')) == ['vmlinuz-' + K0]
    assert 'GRUB_DEFAULT=saved' in (root / 'etc/default/grub').read_text()
    assert grubsim.read_env(root / 'boot/grub/grubenv') == {'saved_entry': grubsim.entry_id(K0)}
    assert labenv.measured(lab, 'gpu-01') == {'kernel': K0, 'loaded': D0, 'nvml': D0, 'installed': D0}

    collection_apt_get(root, 'install', '--allow-downgrades', *TRANSACTION)
    cfg = (root / 'boot/grub/grub.cfg').read_text()
    assert grubsim.kernel_of(cfg, grubsim.entry_id(K1)) == K1 and grubsim.kernel_of(cfg, grubsim.entry_id(K0)) == K0
    # Installed, not booted: the old module still runs (until the reboot).
    assert labenv.measured(lab, 'gpu-01') == {'kernel': K0, 'loaded': D0, 'nvml': D0, 'installed': D1}

    env = root / 'boot/grub/grubenv'
    subprocess.run([grubsim.editenv(), str(env), 'set', 'next_entry=' + grubsim.entry_id(K1)], check=True)
    res = lab_node.boot_host(node, set())
    assert (res['kernel'], res['driver']) == (K1, D1) and [b[2] for b in res['boots']] == [True]
    assert grubsim.read_env(env) == {'saved_entry': grubsim.entry_id(K0), 'next_entry': ''}
    assert labenv.measured(lab, 'gpu-01') == {'kernel': K1, 'loaded': D1, 'nvml': D1, 'installed': D1}
    assert (node / 'proc/cmdline').read_text().startswith('BOOT_IMAGE=/boot/vmlinuz-%s ' % K1)
    assert 'driver_version %s\n' % D1 in (node / 'nvml.state').read_text()
    assert (node / 'kern.log').read_text().splitlines()[-1].split(' kernel: ')[1].startswith('Linux version %s ' % K1)
    # next_entry was one-shot: the next boot takes saved_entry (134, with its module built for 580.130.00).
    assert lab_node.boot_host(node, set())['kernel'] == K0
    assert labenv.measured(lab, 'gpu-01')['loaded'] == D1
    # A trial of a kernel that does not come up: power-cycled into saved_entry.
    subprocess.run([grubsim.editenv(), str(env), 'set', 'next_entry=' + grubsim.entry_id(K1)], check=True)
    res = lab_node.boot_host(node, {K1})
    assert [(b[1], b[2]) for b in res['boots']] == [(K1, False), (K0, True)] and res['kernel'] == K0
    # Nothing comes up: nothing runs (no kernel, no module to read).
    res = lab_node.boot_host(node, {K0, K1})
    assert res == {'kernel': None, 'driver': None, 'boots': [[grubsim.entry_id(K0), K0, False]] * 3}
    assert not (node / 'proc/sys/kernel/osrelease').exists() and not (node / 'proc/driver/nvidia').joinpath('version').exists()

    # Back to the previous pair (what the rollback's transaction does), then a reload on 134.
    lab_node.boot_host(node, set())
    collection_apt_get(root, 'install', '--allow-downgrades', 'linux-modules-nvidia-580-server-%s=%s+1' % (K0, V134),
                       *['%s=%s-0ubuntu1' % (n, D0) for n in labenv.PREBUILT_SET], 'linux-modules-nvidia-580-server-%s-' % K1)
    assert lab_node.load_module(node, K0) == D0
    assert labenv.measured(lab, 'gpu-01') == {'kernel': K0, 'loaded': D0, 'nvml': D0, 'installed': D0}
    # A kernel without a module package: no NVIDIA module loads, NVML says so.
    assert lab_node.load_module(node, K1) is None
    assert 'init_error DRIVER_NOT_LOADED' in (node / 'nvml.state').read_text()
    assert labenv.measured(lab, 'gpu-01')['loaded'] is None


def test_dcgm_stand_in_follows_nvml_state_and_kernel_log(tmp_path):
    """The DCGM stand-in's series, rendered from files alone (no Prometheus, no lab run)."""
    node = tmp_path / 'nodes' / 'gpu-01'
    node.mkdir(parents=True)
    state = labenv.nvml_state(labenv.MODELS[0], 'gpu-01', labenv.TARGET_DRIVER)
    state['gpus'][2]['ecc']['uncorrected_volatile'] = 3
    state['gpus'][2]['remapped_rows'] = (1, 2, 0, 1)
    (node / 'nvml.json').write_text(json.dumps(state))
    bus = state['gpus'][3]['bus_id'][4:14].lower()
    (node / 'kern.log').write_text(
        '2026-01-01T00:00:05+00:00 gpu-01 kernel: NVRM: Xid (PCI:%s): 48, pid=0, before the restart\n'
        '2026-01-01T00:00:20+00:00 gpu-01 kernel: NVRM: Xid (PCI:%s): 79, pid=0, GPU has fallen off the bus.\n'
        % (bus, bus))
    (tmp_path / 'lab.json').write_text(json.dumps({'fault': 'gpu-01', 'fault_kind': 'temperature',
                                                   'target_driver': labenv.TARGET_DRIVER}))

    def value(text: str, name: str, gpu: int) -> float:
        line = next(l for l in text.splitlines() if l.startswith(name + '{') and 'gpu="%d"' % gpu in l)
        assert 'Hostname="gpu-01"' in line and 'UUID="GPU-gpu-01-%04d"' % gpu in line
        return float(line.rsplit(' ', 1)[1])

    stand_in = lab_dcgm.DcgmStandIn(tmp_path, ['gpu-01', 'gpu-02'])   # gpu-02 has no files: left out
    try:
        # Before the exporter (re)start recorded in dcgm.since: both Xids count, the last one wins.
        text = stand_in.render()
        assert value(text, 'DCGM_FI_DEV_XID_ERRORS', 3) == 79 and value(text, 'DCGM_FI_DEV_XID_ERRORS', 0) == 0
        assert value(text, 'DCGM_FI_DEV_GPU_TEMP', 5) == lab_dcgm.HOT_C
        assert value(text, 'DCGM_FI_DEV_GPU_TEMP', 4) == 38
        assert value(text, 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL', 2) == 3
        assert value(text, 'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS', 2) == 2
        assert value(text, 'DCGM_FI_DEV_ROW_REMAP_FAILURE', 2) == 1
        assert 'dcgm_lab_driver_info{Hostname="gpu-01",DCGM_FI_DRIVER_VERSION="%s"} 1.0' % labenv.TARGET_DRIVER in text
        assert 'gpu-02' not in text
        # After a restart (the activation hook writes dcgm.since), older Xids are gone; the old
        # driver (a rollback) is not the hot one.
        (node / 'dcgm.since').write_text('2026-01-01T00:00:30+00:00\n')
        state['driver_version'] = labenv.SOURCE_DRIVER
        (node / 'nvml.json').write_text(json.dumps(state))
        text = stand_in.render()
        assert value(text, 'DCGM_FI_DEV_XID_ERRORS', 3) == 0
        assert value(text, 'DCGM_FI_DEV_GPU_TEMP', 5) == 38
        assert 'DCGM_FI_DRIVER_VERSION="%s"' % labenv.SOURCE_DRIVER in text
    finally:
        stand_in.stop()


def ready_history(cluster, name: str, resource_version: str) -> list[str]:
    """The Node's Ready status after each change since `resource_version`, repeats collapsed."""
    query = urllib.parse.urlencode({'watch': '1', 'resourceVersion': resource_version, 'timeoutSeconds': '2',
                                    'fieldSelector': 'metadata.name=' + name})
    resp = cluster.api.pool.request('GET', '%s/api/v1/nodes?%s' % (cluster.api.url, query), timeout=30,
                                    headers={'Accept': 'application/json'})
    seen: list[str] = []
    for line in resp.data.splitlines():
        obj = json.loads(line)['object']
        ready = {c['type']: c['status'] for c in obj['status'].get('conditions') or []}.get('Ready', '-')
        if not seen or seen[-1] != ready:
            seen.append(ready)
    return seen


def test_lab_reboot_hook_reboots_the_node_through_the_api(tmp_path, cluster):
    """The lab's reboot path (lab_node.py reboot) on the real control plane: the kubelet stops (Ready
    False), GRUB boots the trial kernel (next_entry) with its module, the Node reports the boot (a
    new bootID, the booted kernel, the kubeletVersion it had), comes back Ready with its pods Ready,
    and carries the driver labels of the loaded module. lab.json `misreport` makes a kubelet
    report another kernel than the one that runs."""
    names = labenv.node_names(2)
    lab = lab_root(tmp_path, names)
    root = lab / 'nodes' / 'gpu-01' / 'root'
    collection_apt_get(root, 'install', '--allow-downgrades', *TRANSACTION)
    subprocess.run([grubsim.editenv(), str(root / 'boot/grub/grubenv'), 'set', 'next_entry=' + grubsim.entry_id(K1)],
                   check=True)
    labenv.apply_pool(cluster, names)
    # What the SUC stand-in leaves on a node whose RKE2 Job completed: the boot keeps it.
    cluster.patch('v1', 'Node', 'gpu-01', {'status': {'nodeInfo': {'kubeletVersion': R1}}}, subresource='status')
    conf = {'kubeconfig': cluster.admin_kubeconfig, 'fault': None, 'stuck': [], 'target_driver': D1, 'target_kernel': K1}
    (lab / 'lab.json').write_text(json.dumps(conf))
    before = cluster.get('v1', 'Node', 'gpu-01')
    cluster.clear_requests()
    out = subprocess.run([sys.executable, str(REPO / 'tests' / 'tools' / 'lab_node.py'), str(lab), 'reboot', 'gpu-01'],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout) == {'changed': True, 'kernel': K1, 'driver': D1, 'ready': True, 'fault': False,
                                      'boots': [[grubsim.entry_id(K1), K1, True]], 'mode': 'reboot', 'scraped': None}
    # Every change of the Node since (a watch from its resourceVersion replays them): Ready went False
    # (the kubelet stopped) and came back True (KWOK plays the kubelet again), once.
    assert ready_history(cluster, 'gpu-01', before['metadata']['resourceVersion']) == ['True', 'False', 'True']
    after = cluster.get('v1', 'Node', 'gpu-01')
    assert {c['type']: c['status'] for c in after['status']['conditions']}['Ready'] == 'True'
    info, old = after['status']['nodeInfo'], before['status']['nodeInfo']
    assert info['kernelVersion'] == K1 and info['bootID'] != old['bootID']
    assert info['kubeletVersion'] == old['kubeletVersion'] == R1
    assert after['metadata']['labels']['nvidia.com/cuda.driver.minor'] == D1.split('.')[1]
    pods = [p for p in cluster.list('v1', 'Pod', field_selector='spec.nodeName=gpu-01')
            if p['metadata']['labels'].get('app') != 'gpu-operator']     # the operator's pod may run there too
    assert sorted(p['metadata']['labels'].get('app') for p in pods) == [
        'nvidia-dcgm-exporter', 'nvidia-device-plugin-daemonset', 'train-h100']
    for p in pods:
        assert {c['type']: c['status'] for c in p['status']['conditions']}['Ready'] == 'True', p['status']
    # The hook plays the kubelet with the setup identity, straight to the API server: nothing through the proxy.
    assert cluster.requests == []
    assert cluster.get('v1', 'Node', 'gpu-02')['status']['nodeInfo']['bootID'] == \
        labenv.node_info('gpu-02', labenv.KERNEL)['bootID']
    # The next boot takes saved_entry (134, its module built for 580.130.00); the kubelet is made to
    # report another kernel than the one running (what a test of the measured tuple needs).
    (lab / 'lab.json').write_text(json.dumps(dict(conf, misreport={'gpu-01': {'kernelVersion': '6.8.0-1-lab',
                                                                              'dcgm_exporter': '4.4.0-lab'}})))
    out = subprocess.run([sys.executable, str(REPO / 'tests' / 'tools' / 'lab_node.py'), str(lab), 'reboot', 'gpu-01'],
                         capture_output=True, text=True, check=False, timeout=120)
    assert json.loads(out.stdout)['kernel'] == K0 and json.loads(out.stdout)['driver'] == D1
    assert cluster.get('v1', 'Node', 'gpu-01')['status']['nodeInfo']['kernelVersion'] == '6.8.0-1-lab'
    assert labenv.measured(lab, 'gpu-01')['kernel'] == K0
    dcgm = cluster.list('v1', 'Pod', 'gpu-operator', label_selector='app=nvidia-dcgm-exporter', field_selector='spec.nodeName=gpu-01')
    assert [c['image'] for p in dcgm for c in p['spec']['containers']] == ['nvcr.io/nvidia/k8s/dcgm-exporter:4.4.0-lab']


def test_evidence_tuple_after_is_measured(tmp_path):
    """The rollout's evidence bundle records each node's tuple AFTER as measured, not the plan's target:
    the lab makes gpu-02's dcgm-exporter pod run another image tag after its activation (`misreport`,
    what a real node whose exporter did not move would show); its tuple gate fails on it, the node is
    rolled back, and the bundle's tuple_after carries the tag that was measured. The records are
    approved directly (as test_rollout_rke2.py does): the canary playbook is test_lab's other runs."""
    import datetime

    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q
    from tools.lab import Lab

    names = {'kernel': 'kernel', 'rke2': 'rke2', 'driver': 'driver', 'gpu_operator': 'gpuOperator',
             'dcgm_exporter': 'dcgmExporter'}
    lab = Lab(tmp_path / 'lab', nodes=4, fault='none', stuck=[], quiet=True, metrics='off',
              misreport={'gpu-02': {'dcgm_exporter': '4.4.0-lab'}})
    lab.dir.mkdir()
    try:
        lab.prepare()
        plan = lab.plan()
        now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        for c in plan['combinations']:
            slug = c['key']['pci_ids'].replace(':', '').replace('/', '-').replace(',', '-')
            (lab.dir / 'qualification' / (slug + '.yaml')).write_text(q.dump_record({
                'apiVersion': 'kube-dc.io/v1alpha1', 'kind': 'GPUUpgradeQualification', 'id': 'measured-' + slug,
                'state': 'qualified', 'approvedBy': 'test-approver', 'sourceRevision': 'a' * 40,
                'hardware': c['key']['pci_ids'].split(','), 'target': {names[k]: v for k, v in labenv.TARGET.items()},
                'canary': {'completedAt': now, 'allocationPassed': True, 'monitoringPassed': True,
                           'rollbackPassed': True, 'evidence': 'measured-test'}}))
        assert plan['batches'][1] == ['gpu-02'], plan['batches']
        assert lab.play('rollout', 'rollout.yml') == 'failed'
        bundle = json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())
        nodes = bundle['nodes']
        for name in plan['batches'][0]:
            assert nodes[name]['verdict'] == 'upgraded' and nodes[name]['tuple_after'] == labenv.TARGET, nodes[name]
        bad = nodes['gpu-02']
        assert bad['verdict'] == 'failed' and bad['tuple_after']['dcgm_exporter'] == '4.4.0-lab', bad
        assert bad['tuple_after']['kernel'] == K0 and bad['tuple_after']['driver'] == D0, bad      # rolled back
        tuple_gate = [g for g in bundle['gates'] if g['node'] == 'gpu-02' and g['name'] == 'tuple']
        assert tuple_gate and not tuple_gate[-1]['passed'], bundle['gates']
        assert any('dcgm_exporter: measured 4.4.0-lab' in p for p in tuple_gate[-1]['problems']), tuple_gate
        assert 'gpu-04' not in nodes or nodes['gpu-04']['verdict'] != 'upgraded'
    finally:
        lab.stop()


def test_production_fleet_from_the_installed_collection_plans_splits_and_rolls_out(tmp_path):
    """Issue 39, "Done when": the fleet shaped like a real one (labenv.FLEETS['production']: gpu-03 on another kernel
    ABI, gpu-07 on another RKE2 patch, gpu-01 and gpu-05 RKE2 servers) runs plan -> preflight -> canary -> approve ->
    upgrade_check -> rollout -> release from the collection built with `ansible-galaxy collection build` and installed
    read-only, started by FQCN from the lab's directory (relative paths), with the collection's dynamic inventory
    (hosts named by InternalIP, so no host is named as its Node), Kubernetes credentials only as K8S_AUTH_*, no
    evidence repository. The drift is split at plan time, each part with its own canary and qualification record;
    the servers' role comes from their Nodes; the drifted RKE2 node is brought to the fleet's patch.

    Issue 39 item 3 on the same fleet (issue 36: it was a lab run of its own, with its own canary and rollout): a
    static inventory that names its hosts by FQDN and gives each its Node with gpufleet_node_name plans the same
    combinations (each Node joined to its host's NVML facts, no PCI identity `unknown`), and a Node of the pool
    without an inventory host is refused at plan time, naming it. The canary and rollout on hosts not named as their
    Nodes are the dynamic inventory's runs below (InternalIP hosts)."""
    from tools.lab import LAB_ONLY_VARS, Lab

    lab = Lab(tmp_path / 'lab', nodes=0, fault='none', stuck=[], quiet=True, fleet='production', workload_suite=True)
    lab.dir.mkdir()
    try:
        lab.prepare()
        assert isinstance(lab.inventory, str) and 'kubeconfig' not in (lab.dir / 'inventory' / 'group_vars' / 'all.yml').read_text()
        plan = lab.plan()
        combos = {c['id']: c for c in plan['combinations']}
        assert len(combos) == 4, sorted(combos)
        parts = sorted(k for c in combos.values() for k in c['key'] if k.startswith('source.'))
        assert parts == ['source.kernel', 'source.kernel', 'source.rke2', 'source.rke2'], parts
        alone = {n for c in combos.values() if c['count'] == 1 for n in c['nodes']}
        assert alone == {'gpu-03', 'gpu-07'}, combos
        assert len(plan['canaries']) == 4 and sorted(n for b in plan['batches'] for n in b) == lab.names
        assert {'gpu-03', 'gpu-07'} <= set(plan['canaries'])
        assert_fqdn_inventory_plans_the_same(lab, plan, LAB_ONLY_VARS)

        lab.preflight()
        if lab.play('canary', 'canary.yml') != 'successful':
            raise AssertionError('canary.yml failed: %s' % lab.runs['canary']['failures'])
        hosts = {e['host'] for e in lab.runs['canary']['events'] if e['event'] == 'runner_on_ok'} - {'localhost'}
        assert hosts and all(h.startswith('10.0.') for h in hosts), hosts        # InternalIP hosts, not Node names
        records = sorted(p.name for p in (lab.dir / 'qualification').glob('*.yaml'))
        assert len(records) == 4 and sum('--' in r for r in records) == 4, records     # one record per part
        lab.approve()
        lab.approve_pauses(plan)
        # The gate re-reads the nodes, not the plan file's copy of their tuple: a rollout node whose kernel moved
        # since the plan (what unattended-upgrades and a reboot leave) is refused, naming it; back, the gate passes.
        victim = plan['batches'][-1][-1]
        info = lab.cluster.get('v1', 'Node', victim)['status']['nodeInfo']
        lab.cluster.patch('v1', 'Node', victim, {'status': {'nodeInfo': dict(info, kernelVersion='6.8.0-140-generic')}},
                          subresource='status')
        with pytest.raises(Exception, match='node %s runs kernel 6.8.0-140-generic now' % victim):
            lab.gate()
        lab.cluster.patch('v1', 'Node', victim, {'status': {'nodeInfo': info}}, subresource='status')
        lab.gate()
        rollout = lab.play('rollout', 'rollout.yml')
        problems = lab.verdict(plan, rollout)
        assert problems == [] and lab.release() == [], problems
        rows = {r['node']: r for r in lab.node_view()}
        assert rows['gpu-07']['kubelet'] == labenv.RKE2 and rows['gpu-03']['kernel'] == labenv.TARGET_KERNEL
        for server in ('gpu-01', 'gpu-05'):
            labels = lab.cluster.get('v1', 'Node', server)['metadata']['labels']
            assert labels.get('node-role.kubernetes.io/etcd') == 'true' and not rows[server]['cordoned']
        assert lab.installed_changes() == []
        assert not (lab.installed / 'ansible_collections' / 'gpufleet' / 'upgrade' / 'playbooks' / 'plan.json').exists()
        assert (lab.dir / 'plan.json').is_file() and (lab.dir / 'evidence' / 'rollout.json').is_file()
        bundle = json.loads((lab.dir / 'evidence' / 'rollout.json').read_text())
        # the rollout's entries are keyed by Node name (the canaries were upgraded and recorded by the canary)
        assert sorted(bundle['nodes']) == sorted(set(lab.names) - set(plan['canaries'])), sorted(bundle['nodes'])
    finally:
        lab.stop()


def assert_fqdn_inventory_plans_the_same(lab, plan: dict, lab_only_vars) -> None:
    """plan.yml from the installed collection with a static inventory of FQDN hosts (gpufleet_node_name gives each
    its Node) writes the plan the dynamic inventory wrote (to a file of its own); without one Node's host it is
    refused at plan time, naming that Node. The lab's inventory is the dynamic one again afterwards."""
    dynamic = lab.inventory
    static = labenv.inventory(lab.dir, lab.names, lab.lib_dir, lab.role_vars())
    for key in lab_only_vars:
        static['all']['vars'].pop(key, None)
    groups = static['all']['children']['gpu_nodes']['children']
    for group in groups.values():
        group['hosts'] = {name + '.gpu.example.com': dict(hv, gpufleet_node_name=name) for name, hv in group['hosts'].items()}
    try:
        lab.inventory = static
        assert lab.play('plan-fqdn', 'plan.yml', {'gpufleet_plan_file': 'plan-fqdn.json'}) == 'successful', \
            lab.runs['plan-fqdn']['failures']
        fqdn = json.loads((lab.dir / 'plan-fqdn.json').read_text())
        keys = sorted(c['key']['pci_ids'] for c in fqdn['combinations'])
        assert 'unknown' not in ','.join(keys) and keys == sorted(c['key']['pci_ids'] for c in plan['combinations']), keys
        assert fqdn['batches'] == plan['batches'] and fqdn['canaries'] == plan['canaries'], fqdn
        missing = lab.names[-1]
        for group in groups.values():
            group['hosts'].pop(missing + '.gpu.example.com', None)
        assert lab.play('plan-missing', 'plan.yml', {'gpufleet_plan_file': 'plan-missing.json'}) == 'failed'
        msgs = [f['msg'] or '' for f in lab.runs['plan-missing']['failures']]
        assert any('Node(s) %s have no inventory host' % missing in m for m in msgs), msgs
    finally:
        lab.inventory = dynamic
