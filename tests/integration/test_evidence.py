"""The evidence module through ansible-runner, and its HTML report rendered by headless Chromium."""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import pytest

from tools.chromium import chromium_binary, colour_counts, decode_png, screenshot

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
OUTPUT = REPO_ROOT / 'tests' / 'output'
BEFORE = {'kernel': '6.8.0-134-generic', 'rke2': 'v1.35.3+rke2r3', 'driver': '580.126.20',
          'gpu_operator': 'v26.3.3', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}
AFTER = dict(BEFORE, kernel='6.8.0-135-generic', rke2='v1.36.1+rke2r1', driver='580.130.00')


def t(minute: int) -> str:
    return '2026-07-14T12:%02d:00Z' % minute


def rollout_tasks(path: str, report: str, deb: str) -> list[dict[str, Any]]:
    ev = 'gpufleet.upgrade.evidence'
    return [
        {'name': 'create', ev: {'path': path, 'id': 'lab-rollout-1', 'tuple_before': BEFORE, 'tuple_after': AFTER,
                                'artifacts': [{'kind': 'driver-package', 'name': 'nvidia-driver-580-server',
                                               'version': '580.130.00-0ubuntu1', 'path': deb},
                                              {'kind': 'image', 'name': 'nvcr.io/nvidia/k8s/dcgm-exporter:' + AFTER['dcgm_exporter'],
                                               'digest': 'sha256:' + 'ab' * 32}],
                                'omitted': [{'key': {'pci_id': '10de:20b5/10de:1533', 'kernel': '6.8'}, 'nodes': 3,
                                             'reason': 'no canary available', 'blocks': True}]}},
        {'name': 'canary batch', ev: {'path': path, 'batches': [
            {'index': 0, 'kind': 'canary', 'nodes': ['gpu-a1', 'gpu-h1'], 'started': t(0), 'finished': t(30)},
            {'index': 1, 'nodes': ['gpu-a2', 'gpu-h2'], 'started': t(32), 'finished': t(55)}],
            'nodes': [{'name': 'gpu-a1', 'role': 'canary', 'uid': 'uid-a1', 'machine_id': 'ma1', 'system_uuid': 'sa1',
                       'pci_ids': ['10de:20b0/10de:1450'], 'tuple_before': BEFORE, 'tuple_after': AFTER},
                      {'name': 'gpu-h1', 'role': 'canary', 'uid': 'uid-h1', 'pci_ids': ['10de:2330/10de:16c1']},
                      {'name': 'gpu-a2', 'role': 'batch', 'uid': 'uid-a2'},
                      {'name': 'gpu-h2', 'role': 'batch', 'uid': 'uid-h2'}],
            'actions': [{'name': 'drain', 'node': n, 'batch': b, 'started': t(s), 'finished': t(s + 3)}
                        for n, b, s in (('gpu-a1', 0, 1), ('gpu-h1', 0, 1), ('gpu-a2', 1, 33), ('gpu-h2', 1, 33))]}},
        {'name': 'gates', ev: {'path': path, 'report': report, 'gates': [
            {'name': 'node', 'kind': 'node', 'node': 'gpu-a1', 'batch': 0, 'passed': True, 'started': t(6), 'finished': t(8)},
            {'name': 'workload', 'kind': 'workload', 'node': 'gpu-a1', 'batch': 0, 'passed': True, 'started': t(8), 'finished': t(16)},
            {'name': 'metrics', 'kind': 'metric', 'node': 'gpu-a1', 'batch': 0, 'passed': True, 'started': t(16), 'finished': t(26)},
            {'name': 'node', 'kind': 'node', 'node': 'gpu-h1', 'batch': 0, 'passed': True, 'started': t(6), 'finished': t(9)},
            {'name': 'metrics', 'kind': 'metric', 'node': 'gpu-h1', 'batch': 0, 'passed': True, 'started': t(16), 'finished': t(26)},
            {'name': 'rollback', 'kind': 'rollback', 'node': 'gpu-h1', 'batch': 0, 'passed': True, 'started': t(26), 'finished': t(29)},
            {'name': 'node', 'kind': 'node', 'node': 'gpu-a2', 'batch': 1, 'passed': True, 'started': t(38), 'finished': t(40)},
            {'name': 'gpu', 'kind': 'gpu', 'node': 'gpu-h2', 'batch': 1, 'passed': False, 'started': t(38), 'finished': t(46),
             'result': {'problems': ['GPU 0: new Xid 79 (critical) since the baseline']}},
            {'name': 'fleet-throughput', 'kind': 'metric', 'batch': 1, 'passed': True, 'critical': False,
             'started': t(40), 'finished': t(54)}]}},
    ]


def test_evidence_module_builds_the_bundle_idempotently(tmp_path: pathlib.Path, run_playbook: Any) -> None:
    deb = tmp_path / 'nvidia-driver.deb'
    deb.write_bytes(b'\x00driver bytes')
    path, report = str(tmp_path / 'bundle.json'), str(tmp_path / 'report.html')
    tasks = rollout_tasks(path, report, str(deb))
    check = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks[:1]}], cmdline='--check --diff')
    assert check.result('create')['changed'] is True
    assert not pathlib.Path(path).exists()
    first = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}])
    assert first.rc == 0, first.stdout
    assert [first.result(n)['changed'] for n in ('create', 'canary batch', 'gates')] == [True, True, True]
    summary = first.result('gates')['summary']
    assert summary['stop'] is True and summary['failed_critical'] == ['gpu@gpu-h2#1']
    assert summary['failed_noncritical'] == [] and summary['gates'] == 9 and summary['omitted_blocking'] == 1
    bundle = json.loads(pathlib.Path(path).read_text())
    import hashlib
    assert bundle['artifacts'][0]['sha256'] == hashlib.sha256(b'\x00driver bytes').hexdigest()
    assert bundle['nodes']['gpu-a1'] == {'name': 'gpu-a1', 'role': 'canary', 'uid': 'uid-a1', 'machine_id': 'ma1',
                                         'system_uuid': 'sa1', 'pci_ids': ['10de:20b0/10de:1450'],
                                         'tuple_before': BEFORE, 'tuple_after': AFTER}
    html_before = pathlib.Path(report).read_text()
    again = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}])
    assert [again.result(n)['changed'] for n in ('create', 'canary batch', 'gates')] == [False, False, False]
    assert json.loads(pathlib.Path(path).read_text()) == bundle
    assert pathlib.Path(report).read_text() == html_before
    bad = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'bad', 'gpufleet.upgrade.evidence': {'path': path, 'gates': [{'name': 'x'}]}, 'ignore_errors': True},
        {'name': 'wrong id', 'gpufleet.upgrade.evidence': {'path': path, 'id': 'other'}, 'ignore_errors': True}]}])
    assert bad.result('bad')['msg'] == 'evidence: gates[0] (x).passed is required (true or false)'
    assert bad.result('wrong id')['msg'] == "evidence: id: 'other' does not match the bundle id 'lab-rollout-1' in %s" % path
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / 'evidence-report.html').write_text(html_before)


def test_evidence_runs_in_the_worker_on_the_controller_and_as_the_module_elsewhere(
        tmp_path: pathlib.Path, run_playbook: Any) -> None:
    """The action plugin updates the bundle inside Ansible's worker when the task runs on the controller (a local
    connection without become), and runs the module otherwise; both give the same bundle, results and errors."""
    deb = tmp_path / 'nvidia-driver.deb'
    deb.write_bytes(b'driver')
    bundles, results = {}, {}
    for way, extra in (('worker', {}), ('module', {'become': True, 'become_method': 'ansible.builtin.su'})):
        path, report = str(tmp_path / (way + '.json')), str(tmp_path / (way + '.html'))
        tasks = [dict(task, **extra) for task in rollout_tasks(path, report, str(deb))]
        ev = 'gpufleet.upgrade.evidence'
        naive_gate = {'name': 'n', 'kind': 'node', 'passed': True, 'started': '{{ now() }}'}
        tasks += [dict(task, ignore_errors=True, **extra) for task in (
            {'name': 'unknown option', ev: {'path': path, 'nope': 1}},
            {'name': 'no directory', ev: {'path': str(tmp_path / 'none' / 'b.json'), 'id': 'x'}},
            {'name': 'naive time', ev: {'path': path, 'gates': [naive_gate]}})]
        # No Python for modules on this host: only the worker's way can succeed without one.
        for interpreter in ('/nonexistent/python', sys.executable):
            inventory = {'all': {'hosts': {'localhost': {'ansible_connection': 'local',
                                                         'ansible_python_interpreter': interpreter}}}}
            run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks[:1]}], inventory=inventory,
                               envvars={'ANSIBLE_PYTHON_INTERPRETER': interpreter})
            if interpreter != sys.executable:
                assert (run.rc == 0) is (way == 'worker'), (way, run.stdout)
                pathlib.Path(path).unlink(missing_ok=True)
        run = run_playbook([{'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}])
        assert run.rc == 0, run.stdout
        results[way] = {t['name']: {k: v for k, v in run.result(t['name']).items() if k in ('changed', 'msg', 'summary')}
                        for t in tasks}
        bundle = json.loads(pathlib.Path(path).read_text())
        bundles[way] = {k: v for k, v in bundle.items() if k not in ('created', 'updated')}
        assert pathlib.Path(report).is_file()
    assert bundles['worker'] == bundles['module'] and bundles['worker']['gates']
    naive = {way: r.pop('naive time')['msg'] for way, r in results.items()}
    assert results['worker'] == results['module']
    assert results['worker']['unknown option']['msg'].startswith(
        'Unsupported parameters for (gpufleet.upgrade.evidence) module: nope.')
    assert results['worker']['no directory']['msg'] == 'evidence: directory %s of path does not exist' % (tmp_path / 'none')
    assert all(m.startswith('evidence: gates[0] (n).started: ') and m.endswith('has no UTC offset (add Z or +00:00)')
               for m in naive.values()), naive


def test_report_renders_in_headless_chromium(tmp_path: pathlib.Path, run_playbook: Any) -> None:
    binary, reason = chromium_binary()
    if binary is None:
        pytest.skip('LOUD SKIP: no headless Chromium to render the evidence report: ' + reason)
    deb = tmp_path / 'nvidia-driver.deb'
    deb.write_bytes(b'driver')
    path, report = str(tmp_path / 'bundle.json'), tmp_path / 'report.html'
    run = run_playbook([{'hosts': 'localhost', 'gather_facts': False,
                         'tasks': rollout_tasks(path, str(report), str(deb))}])
    assert run.rc == 0, run.stdout
    OUTPUT.mkdir(exist_ok=True)
    png = OUTPUT / 'evidence-report.png'
    if png.exists():
        png.unlink()
    proc = screenshot(binary, report, png, size=(1200, 900))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert png.is_file() and png.stat().st_size > 1000, proc.stderr[-2000:]
    width, height, bpp, rows = decode_png(png.read_bytes())
    assert (width, height) == (1200, 900)
    counts = colour_counts(width, rows, bpp)
    assert len(counts) > 50, 'screenshot looks blank: %d colours' % len(counts)
    top = max(counts.values())
    assert top < 0.97 * width * height, 'screenshot is almost one colour'

    def near(rgb: tuple[int, int, int], tol: int = 6) -> int:
        return sum(n for c, n in counts.items() if all(abs(a - b) <= tol for a, b in zip(c, rgb)))
    # The timeline's bars: passed gates (green), the failed critical gate (red), batch bands (blue).
    assert near((0x2e, 0x7d, 0x32)) > 300
    assert near((0xc6, 0x28, 0x28)) > 100
    assert near((0x90, 0xca, 0xf9)) > 300
