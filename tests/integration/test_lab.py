"""The lab scenario end to end (tests/tools/lab.py) on a smaller pool, and the orchestration's
failure paths: the injected fault stops expansion and rolls the node back; without a fault the
whole rollout completes; a node that does not come back Ready stops the rollout, cordoned; a GPU
that runs hot under the new driver fails the metric gate (a real Prometheus scraping the lab's DCGM
exporter stand-in), which stops expansion and rolls the node back.

Each run drives the real playbooks through ansible-runner against a real control plane (tests/cluster,
started and stopped by the lab; the playbooks run as the operator ServiceAccount, docs/rbac),
real dpkg/apt install roots and the stand-in NVML. `make lab` runs the same driver on 40 nodes.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import urllib.parse

import pytest
import yaml

from tools import lab_dcgm, labenv

REPO = pathlib.Path(__file__).resolve().parents[2]
LAB = REPO / 'tests' / 'tools' / 'lab.py'
# The lab runs the metric gate when Prometheus is installed (`make system-deps` installs it).
PROMETHEUS = shutil.which('prometheus')
needs_prometheus = pytest.mark.skipif(not PROMETHEUS, reason='LOUD SKIP: no Prometheus for the lab\'s metric gate: '
                                      'apt-get install --no-install-recommends prometheus (or make system-deps as root)')

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')


def run_lab(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The package repository and the template root are cached between runs under --dir/cache.
    return subprocess.run([sys.executable, str(LAB), '--dir', str(tmp_path / 'lab'), '--quiet', *args], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=1500)


def annotations(lab: pathlib.Path, node: str) -> dict:
    return json.loads((lab / 'nodes' / node / 'nvml.json').read_text())


def rows(out: str) -> dict[str, list[str]]:
    table = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1].startswith('gpu-') and parts[0].isdigit():
            table[parts[1]] = parts
    return table


def metric_gates(lab: pathlib.Path) -> dict[str, dict]:
    """node -> the metric gate's evidence entry, from the canary bundles and the rollout's."""
    out = {}
    for path in sorted((lab / 'qualification').glob('*.json')) + [lab / 'evidence' / 'rollout.json']:
        for g in json.loads(path.read_text())['gates']:
            if g['kind'] == 'metric':
                out[g['node']] = g
    return out


def test_lab_fault_stops_expansion_and_rolls_back(tmp_path):
    out = run_lab(tmp_path, '--nodes', '8', '--fault', 'gpu-04')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert 'the fault on gpu-04 stopped expansion, the node stays cordoned and its rollback restored 580.126.20' in out.stdout
    table = rows(out.stdout)
    # gpu-04's batch: the node is back on the previous driver, cordoned, its state recorded.
    assert table['gpu-04'][3:6] == ['580.126.20', 'yes', 'rolled-back']
    assert 'critical gate failed on gpu-04' in out.stdout and 'new Xid 79' in out.stdout
    # The canaries finished; the batch after the fault was never touched.
    assert table['gpu-01'][3:6] == ['580.130.00', 'no', 'done']
    later = [n for n, r in table.items() if int(r[0]) > int(table['gpu-04'][0])]
    assert later and all(table[n][3:6] == ['580.126.20', 'no', '-'] for n in later)
    # NVML follows the install root: the stand-in reports the restored driver.
    assert annotations(tmp_path / 'lab', 'gpu-04')['driver_version'] == '580.126.20'
    if PROMETHEUS:
        # The metric gate ran on every upgraded node; on gpu-04 the GPU gate caught the Xid first.
        gates = metric_gates(tmp_path / 'lab')
        done = sorted(n for n, r in table.items() if r[5] == 'done')
        assert done and sorted(gates) == done and all(gates[n]['passed'] for n in done)
        assert table['gpu-04'][6].startswith('gpu:FAIL,') and 'metric' not in table['gpu-04'][6]
    else:
        assert 'metric gate: OFF, Prometheus is not available' in out.stdout
    report = tmp_path / 'lab' / 'report.html'
    assert report.is_file() and 'gpu-04' in report.read_text()
    assert_records_carry_the_measured_tuple(tmp_path / 'lab')


def assert_records_carry_the_measured_tuple(lab: pathlib.Path) -> None:
    """Each canary bundle's canaries carry the tuple node_upgrade measured (measured: true, recorded by
    the canary role), and the record's target is that measurement."""
    names = {'kernel': 'kernel', 'rke2': 'rke2', 'driver': 'driver', 'gpu_operator': 'gpuOperator',
             'dcgm_exporter': 'dcgmExporter'}
    bundles = sorted((lab / 'qualification').glob('*.json'))
    assert bundles
    for path in bundles:
        canaries = [n for n in json.loads(path.read_text())['nodes'].values() if n.get('role') == 'canary']
        assert canaries and all(n.get('measured') is True and n.get('verdict') == 'upgraded' for n in canaries), canaries
        target = yaml.safe_load(path.with_suffix('.yaml').read_text())['target']
        assert all(target == {names[k]: v for k, v in n['tuple_after'].items()} for n in canaries), (target, canaries)
        assert target['driver'] == labenv.TARGET['driver']


def test_lab_without_fault_completes(tmp_path):
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'none')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert 'lab: OK' in out.stdout and 'the whole rollout completed' in out.stdout
    table = rows(out.stdout)
    assert sorted(table) == ['gpu-01', 'gpu-02', 'gpu-03', 'gpu-04']
    assert all(r[3:6] == ['580.130.00', 'no', 'done'] for r in table.values())
    if PROMETHEUS:
        assert 'metric gate: ON, Prometheus http://127.0.0.1:' in out.stdout
        assert 'metric gate verdicts: 4 nodes passed, 0 failed' in out.stdout
        assert all(r[6].startswith('gpu:ok,node:ok,metric:ok') for r in table.values()), table
        assert all(g['passed'] for g in metric_gates(tmp_path / 'lab').values())


def test_node_not_ready_after_reboot_stops_the_rollout_cordoned(tmp_path):
    # gpu-02 never comes back Ready after its (lab) reboot: the wait is bounded, the node stays
    # cordoned, no rollback is attempted on a node that is not up, and the run fails saying why.
    # Also the lab without the metric gate (--metrics off): it says so and the other gates decide.
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'none', '--stuck', 'gpu-02', '--metrics', 'off')
    assert out.returncode == 1, out.stdout[-6000:]
    assert 'metric gate: OFF (--metrics off); the GPU and node gates decide' in out.stdout
    assert 'metric:' not in out.stdout and not (tmp_path / 'lab' / 'prometheus').exists()
    assert 'node gpu-02 did not become Ready within 30' in out.stdout
    assert 'recover it by hand, then run gpufleet.upgrade.rollback' in out.stdout
    table = rows(out.stdout)
    assert table['gpu-02'][4] == 'yes' and table['gpu-02'][5] == 'failed'
    assert 'rollout did not complete' in out.stdout


@needs_prometheus
def test_lab_hot_gpu_fails_the_metric_gate_and_rolls_back(tmp_path):
    # gpu-02 (batch 1 of 3) runs GPU 5 at 92 C under the new driver: NVML reads 38 C at the GPU
    # gate's instant, only the DCGM series over the metric gate's window show it.
    out = run_lab(tmp_path, '--nodes', '4', '--fault', 'gpu-02', '--fault-kind', 'temperature')
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert ('the fault on gpu-02 stopped expansion, the node stays cordoned and its rollback restored 580.126.20 '
            '(injected: GPU 5 at 92 C under load)') in out.stdout
    table = rows(out.stdout)
    assert table['gpu-02'][3:7] == ['580.126.20', 'yes', 'rolled-back', 'gpu:ok,node:ok,metric:FAIL,rollback-gpu:ok']
    assert 'critical gate failed on gpu-02: metric gate' in out.stdout
    assert table['gpu-04'][3:7] == ['580.126.20', 'no', '-', '-']
    assert table['gpu-01'][3:6] == ['580.130.00', 'no', 'done']
    gates = metric_gates(tmp_path / 'lab')
    assert sorted(gates) == ['gpu-01', 'gpu-02', 'gpu-03']
    assert gates['gpu-01']['passed'] is True and gates['gpu-03']['passed'] is True
    assert gates['gpu-02']['passed'] is False
    assert gates['gpu-02']['problems'][0].startswith('dcgm_gpu_temperature: 92 is above the allowed 85')
    assert 'UUID="GPU-gpu-02-0005"' in gates['gpu-02']['problems'][0]
    # Prometheus kept its data under the lab directory.
    assert (tmp_path / 'lab' / 'prometheus' / 'data').is_dir()


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
    False), the Node reports the boot (a new bootID, the running kernel), comes back Ready with its
    pods Ready, and carries the driver labels of what is installed under its root."""
    names = labenv.node_names(2)
    lab = tmp_path / 'lab'
    labenv.make_roots(lab, names)
    labenv.write_node_files(lab, names)
    (lab / 'nodes' / 'gpu-01' / 'proc' / 'sys' / 'kernel' / 'osrelease').write_text('6.8.0-140-generic\n')
    labenv.apply_pool(cluster, names)
    (lab / 'lab.json').write_text(json.dumps({'kubeconfig': cluster.admin_kubeconfig, 'fault': None, 'stuck': [],
                                              'target_driver': labenv.TARGET_DRIVER}))
    before = cluster.get('v1', 'Node', 'gpu-01')
    cluster.clear_requests()
    out = subprocess.run([sys.executable, str(REPO / 'tests' / 'tools' / 'lab_node.py'), str(lab), 'reboot', 'gpu-01'],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout) == {'changed': True, 'driver': labenv.SOURCE_DRIVER, 'ready': True, 'fault': False,
                                      'mode': 'reboot', 'scraped': None}
    # Every change of the Node since (a watch from its resourceVersion replays them): Ready went False
    # (the kubelet stopped) and came back True (KWOK plays the kubelet again), once.
    assert ready_history(cluster, 'gpu-01', before['metadata']['resourceVersion']) == ['True', 'False', 'True']
    after = cluster.get('v1', 'Node', 'gpu-01')
    assert {c['type']: c['status'] for c in after['status']['conditions']}['Ready'] == 'True'
    info, old = after['status']['nodeInfo'], before['status']['nodeInfo']
    assert info['kernelVersion'] == '6.8.0-140-generic' and info['bootID'] != old['bootID']
    assert info['kubeletVersion'] == old['kubeletVersion'] == labenv.RKE2
    assert after['metadata']['labels']['nvidia.com/cuda.driver.minor'] == labenv.SOURCE_DRIVER.split('.')[1]
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
