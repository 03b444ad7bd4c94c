"""metric_gate against a real Prometheus (Debian package) scraping an exporter the test controls.

One scenario feeds every test: phase A (the baseline window), then phase B (the observation
window) with a canary within tolerance, one beyond it, one whose series disappears, one that
appears too late to have enough samples, a quiet one without traffic, a control node, and DCGM
series of a healthy node and of a node with Xid 79.
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _metric_gate as mg
from tools import prometheus as prom_tools
from tools.debian import ensure_binary
from tools.prometheus import PrometheusServer, urllib_opener

# The session-scoped fixture: a real Prometheus on loopback scraping the test's exporter.
prometheus_server = prom_tools.prometheus_server

pytestmark = pytest.mark.slow

LAT = 'app_latency_seconds'
REQ = 'app_requests_total'
MARGIN = 2.0      # seconds after a switch before a window starts (scrapes every second)


def dcgm(exp: Any, host: str, xid: float, temp: float = 55.0) -> None:
    for gpu in ('0', '1'):
        labels = {'Hostname': host, 'gpu': gpu, 'UUID': 'GPU-%s-%s' % (host, gpu)}
        exp.set('DCGM_FI_DEV_XID_ERRORS', labels, xid if gpu == '1' else 0)
        exp.set('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL', labels, 0)
        exp.set('DCGM_FI_DEV_ROW_REMAP_FAILURE', labels, 0)
        exp.set('DCGM_FI_DEV_GPU_TEMP', labels, temp)


@pytest.fixture(scope='module')
def scenario(prometheus_server: PrometheusServer) -> dict[str, Any]:  # noqa: F811
    prom = prometheus_server
    exp = prom.exporter
    # Phase A: baseline, every canary at 100 ms.
    t_a0 = time.time()
    for node in ('canary-ok', 'canary-bad', 'canary-gone', 'canary-quiet'):
        exp.set(LAT, {'node': node}, 0.100)
    exp.grow(REQ, {'node': 'canary-ok'}, 25)
    exp.grow(REQ, {'node': 'canary-quiet'}, 0)
    t_a1 = prom.wait_for_points('%s{node="canary-ok"}' % LAT, t_a0 + MARGIN, 5)
    # Phase B: observation.
    t_b0 = time.time()
    exp.set(LAT, {'node': 'canary-ok'}, 0.102)
    exp.set(LAT, {'node': 'canary-bad'}, 0.150)
    exp.remove(LAT, {'node': 'canary-gone'})
    exp.set(LAT, {'node': 'control-1'}, 0.100)
    dcgm(exp, 'gpu-ok', 0)
    dcgm(exp, 'gpu-xid', 79)
    dcgm(exp, 'gpu-hot', 0, temp=91)
    # The window starts once Prometheus has scraped the switched values, not only MARGIN after the switch (a
    # Prometheus held up for MARGIN on a loaded machine would leave phase A's values, and canary-gone, at its start).
    t_b_start = max(t_b0 + MARGIN, scraped_again(exp))
    prom.wait_for_points('%s{node="canary-ok"}' % LAT, t_b_start, 6)
    t_late = time.time()
    exp.set(LAT, {'node': 'canary-late'}, 0.100)
    t_b1 = prom.wait_for_points('%s{node="canary-late"}' % LAT, t_late, 2)
    return {'prom': prom, 'baseline': mg.Window(t_a0 + MARGIN, t_a1), 'window': mg.Window(t_b_start, t_b1)}


def scraped_again(exp: Any, timeout: float = 60.0) -> float:
    """Wait (bounded) until the exporter was scraped after the values set so far; returns when that was seen.

    That scrape rendered them (the exporter renders under the lock its setters take), and Prometheus stamps a sample
    with the time its scrape started, before the render: from the returned time on, the latest sample of each series,
    at every step of a query, has the new values (or is the staleness marker of a series removed)."""
    before = exp.scrapes
    deadline = time.monotonic() + timeout
    while exp.scrapes <= before:
        if time.monotonic() > deadline:
            raise AssertionError('Prometheus did not scrape the exporter in %ss' % timeout)
        time.sleep(0.05)
    return time.time()


def gate(scenario: dict[str, Any], queries: list[dict[str, Any]], presets: list[str] | None = None,
         node: str | None = None, min_samples: int = 4) -> dict[str, Any]:
    window = scenario['window']
    specs = [mg.parse_query(q, i, window, min_samples) for i, q in enumerate(queries)]
    specs += mg.preset_queries(presets or [], node, 'Hostname', 85.0, min_samples)
    client = mg.PrometheusClient(scenario['prom'].url, urllib_opener, timeout=10)
    return mg.run_gate(client, specs, window, 1.0)


def baseline_query(scenario: dict[str, Any], node: str, **extra: Any) -> dict[str, Any]:
    b = scenario['baseline']
    q = {'name': 'latency', 'expr': '%s{node="%s"}' % (LAT, node), 'baseline': {'start': b.start, 'end': b.end},
         'tolerance': {'rel': 0.05}}
    q.update(extra)
    return q


def test_pass_within_baseline_tolerance(scenario: dict[str, Any]) -> None:
    v = gate(scenario, [baseline_query(scenario, 'canary-ok')])
    q = v['queries'][0]
    assert v['passed'] is True, v['problems']
    assert v['msg'].startswith('metric gate: PASS')
    assert q['observed']['value'] == pytest.approx(0.102)
    assert q['reference']['kind'] == 'baseline'
    assert q['reference']['value'] == pytest.approx(0.100)
    assert q['allowed'][0]['high'] == pytest.approx(0.105)
    assert q['observed']['series'][0]['samples'] >= 4
    assert q['observed']['series'][0]['labels']['node'] == 'canary-ok'


def test_breach_beyond_baseline_tolerance(scenario: dict[str, Any]) -> None:
    v = gate(scenario, [baseline_query(scenario, 'canary-bad')])
    assert v['passed'] is False
    assert v['failed_critical'] == ['latency']
    assert len(v['problems']) == 1
    assert v['problems'][0].startswith('latency: 0.15 is above the allowed 0.105 (baseline 0.1 + tolerance 0.005)')


def test_breach_of_non_critical_query_is_only_reported(scenario: dict[str, Any]) -> None:
    v = gate(scenario, [baseline_query(scenario, 'canary-bad', critical=False),
                        dict(baseline_query(scenario, 'canary-ok'), name='latency-ok')])
    assert v['passed'] is True
    assert v['failed_noncritical'] == ['latency']
    assert v['warnings'][0].startswith('non-critical: latency: 0.15 is above')


def test_one_failed_critical_query_fails_even_when_throughput_looks_normal(scenario: dict[str, Any]) -> None:
    """The conjunctive stop rule: the aggregate passes, one canary breaches, the gate fails."""
    b = scenario['baseline']
    aggregate = {'name': 'fleet_latency', 'expr': 'avg(%s{node=~"canary-ok|canary-bad|control-1"})' % LAT,
                 'control': {'expr': 'avg(%s{node="control-1"})' % LAT}, 'tolerance': {'rel': 0.25}}
    v = gate(scenario, [aggregate, baseline_query(scenario, 'canary-bad')])
    by_name = {q['name']: q for q in v['queries']}
    assert by_name['fleet_latency']['passed'] is True
    assert by_name['latency']['passed'] is False
    assert v['passed'] is False and v['failed_critical'] == ['latency']
    assert b.end <= scenario['window'].start


def test_missing_series_fails(scenario: dict[str, Any]) -> None:
    v = gate(scenario, [baseline_query(scenario, 'canary-gone')])
    q = v['queries'][0]
    assert v['passed'] is False
    assert q['observed']['series'] == []
    assert q['reference']['series'][0]['samples'] >= 4   # it was there in the baseline
    assert v['problems'] == ['latency: no series for app_latency_seconds{node="canary-gone"} in the observation '
                             'window (missing telemetry is a failure)']


def test_missing_dcgm_series_fail_every_preset(scenario: dict[str, Any]) -> None:
    v = gate(scenario, [], presets=['xid', 'ecc', 'row_remap', 'temperature'], node='gpu-never-scraped')
    assert v['passed'] is False
    assert v['failed_critical'] == ['dcgm_xid', 'dcgm_ecc_uncorrected', 'dcgm_row_remap_failure',
                                    'dcgm_gpu_temperature']
    assert all('no series for' in p for p in v['problems'])


def test_too_few_samples_fails(scenario: dict[str, Any]) -> None:
    late = scenario['prom'].points('%s{node="canary-late"}' % LAT, scenario['window'].start, scenario['window'].end)
    ok = scenario['prom'].points('%s{node="canary-ok"}' % LAT, scenario['window'].start, scenario['window'].end)
    assert late < ok
    q = {'name': 'late', 'expr': '%s{node="canary-late"}' % LAT, 'limit': 0.2, 'min_samples': ok}
    v = gate(scenario, [q, {'name': 'ok', 'expr': '%s{node="canary-ok"}' % LAT, 'limit': 0.2, 'min_samples': ok}])
    assert v['failed_critical'] == ['late']
    assert v['problems'] == ['late: %d valid sample(s) for {__name__="app_latency_seconds", instance="%s", '
                             'job="test-exporter", node="canary-late"} in the observation window, at least %d required'
                             % (late, '127.0.0.1:%d' % scenario['prom'].exporter.port, ok)]


def test_too_little_traffic_fails(scenario: dict[str, Any]) -> None:
    quiet = baseline_query(scenario, 'canary-quiet', count_expr='sum(increase(%s{node="canary-quiet"}[$window]))'
                           % REQ, min_count=10)
    busy = dict(baseline_query(scenario, 'canary-ok', count_expr='sum(increase(%s{node="canary-ok"}[$window]))'
                               % REQ, min_count=10), name='busy')
    v = gate(scenario, [quiet, busy])
    by_name = {q['name']: q for q in v['queries']}
    assert by_name['busy']['passed'] is True, by_name['busy']['problems']
    assert by_name['busy']['count']['value'] >= 10
    assert by_name['latency']['count']['value'] == 0
    assert by_name['busy']['count']['expr'] == 'sum(increase(%s{node="canary-ok"}[%ds]))' % (
        REQ, round(scenario['window'].length))
    assert v['failed_critical'] == ['latency']
    assert v['problems'] == ['latency: 0 transaction(s) in the window, at least 10 required (a quiet canary proves '
                             'nothing)']


def test_control_node_comparison(scenario: dict[str, Any]) -> None:
    control = {'expr': '%s{node="control-1"}' % LAT}
    ok = {'name': 'vs_control_ok', 'expr': '%s{node="canary-ok"}' % LAT, 'control': control,
          'tolerance': {'rel': 0.05}}
    bad = {'name': 'vs_control_bad', 'expr': '%s{node="canary-bad"}' % LAT, 'control': control,
           'tolerance': {'rel': 0.05}}
    v = gate(scenario, [ok, bad])
    by_name = {q['name']: q for q in v['queries']}
    assert by_name['vs_control_ok']['passed'] is True
    assert by_name['vs_control_ok']['reference']['kind'] == 'control'
    assert by_name['vs_control_ok']['reference']['window'] == scenario['window'].as_dict()
    assert by_name['vs_control_bad']['problems'] == [
        'vs_control_bad: 0.15 is above the allowed 0.105 (control 0.1 + tolerance 0.005)']


def test_lower_is_worse_against_control(scenario: dict[str, Any]) -> None:
    q = {'name': 'throughput', 'expr': '%s{node="control-1"}' % LAT, 'direction': 'lower_is_worse',
         'control': {'expr': '%s{node="canary-bad"}' % LAT}, 'tolerance': {'rel': 0.1}}
    v = gate(scenario, [q])
    assert v['problems'] == ['throughput: 0.1 is below the allowed 0.135 (control 0.15 - tolerance 0.015)']


def test_dcgm_xid_preset(scenario: dict[str, Any]) -> None:
    ok = gate(scenario, [], presets=['xid', 'ecc', 'row_remap', 'temperature'], node='gpu-ok')
    assert ok['passed'] is True, ok['problems']
    assert [q['observed']['expr'] for q in ok['queries']] == [
        'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-ok"}', 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{Hostname="gpu-ok"}',
        'DCGM_FI_DEV_ROW_REMAP_FAILURE{Hostname="gpu-ok"}', 'DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-ok"}']
    assert all(len(q['observed']['series']) == 2 for q in ok['queries'])
    bad = gate(scenario, [], presets=['xid'], node='gpu-xid')
    assert bad['passed'] is False
    assert len(bad['problems']) == 1
    assert bad['problems'][0].startswith('dcgm_xid: 79 is above the allowed 0 (limit 0 + tolerance 0) for {')
    assert 'gpu="1"' in bad['problems'][0]


def test_dcgm_temperature_preset(scenario: dict[str, Any]) -> None:
    v = gate(scenario, [], presets=['temperature', 'xid'], node='gpu-hot')
    assert v['failed_critical'] == ['dcgm_gpu_temperature']
    assert v['problems'][0].startswith('dcgm_gpu_temperature: 91 is above the allowed 85 (limit 85')


def test_unreachable_prometheus_is_a_failure_not_a_pass(scenario: dict[str, Any]) -> None:
    from tools.prometheus import free_port
    window = scenario['window']
    spec = mg.parse_query({'name': 'x', 'expr': 'up', 'limit': 1}, 0, window, 1)
    client = mg.PrometheusClient('http://127.0.0.1:%d' % free_port(), urllib_opener, timeout=2)
    v = mg.run_gate(client, [spec], window, 1.0)
    assert v['passed'] is False
    assert v['problems'][0].startswith('x: cannot reach Prometheus at http://127.0.0.1:')


def test_bad_promql_names_the_query(scenario: dict[str, Any]) -> None:
    v = gate(scenario, [{'name': 'broken', 'expr': 'sum(', 'limit': 1}])
    assert v['passed'] is False
    assert v['problems'][0].startswith("broken: Prometheus /api/v1/query_range answered HTTP 400 for 'sum(': bad_data: ")


def test_module_through_ansible_runner(scenario: dict[str, Any], run_playbook: Any) -> None:
    w, b = scenario['window'], scenario['baseline']
    common = {'url': scenario['prom'].url, 'window_start': '%.3f' % w.start, 'window_end': '%.3f' % w.end,
              'step': '1s', 'min_samples': 4, 'timeout': 5}
    play = [{'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'healthy canary', 'gpufleet.upgrade.metric_gate': dict(common, presets=['xid', 'temperature'],
         node='gpu-ok', queries=[{'name': 'latency', 'expr': '%s{node="canary-ok"}' % LAT,
                                  'baseline': {'start': '%.3f' % b.start, 'end': '%.3f' % b.end},
                                  'tolerance': {'rel': 0.05}}])},
        {'name': 'xid canary', 'gpufleet.upgrade.metric_gate': dict(common, presets=['xid'], node='gpu-xid'),
         'ignore_errors': True},
        {'name': 'bad input', 'gpufleet.upgrade.metric_gate': dict(common, queries=[
            {'name': 'q', 'expr': 'up', 'limit': 1, 'control': {'expr': 'up'}}]), 'ignore_errors': True},
    ]}]
    run = run_playbook(play)
    ok = run.result('healthy canary')
    assert ok['_event'] == 'runner_on_ok', ok.get('msg')
    assert ok['passed'] is True and ok['changed'] is False
    assert [q['name'] for q in ok['queries']] == ['latency', 'dcgm_xid', 'dcgm_gpu_temperature']
    bad = run.result('xid canary')
    assert bad['_event'] == 'runner_on_failed'
    assert bad['passed'] is False
    assert bad['msg'].startswith('metric gate: FAIL: dcgm_xid: 79 is above the allowed 0')
    inval = run.result('bad input')
    assert inval['_event'] == 'runner_on_failed'
    assert inval['msg'] == 'metric gate: invalid input: queries[0] (q): give exactly one of baseline, control or ' \
                           'limit (got control, limit)'


# The process a test or the lab starts Prometheus from, reduced to that: it launches the server and prints its pid.
LAUNCHER = '''
import pathlib, sys, time, types
sys.path[:0] = sys.argv[3:]
from tools.prometheus import PrometheusServer
server = PrometheusServer(sys.argv[1], pathlib.Path(sys.argv[2]), types.SimpleNamespace(port=9))
server.launch()
print(server.proc.pid, flush=True)
time.sleep(300)
'''


def _running(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (a container's init may never reap it): unlike
    tests/tools/molecule_lab.py's `_alive` (signal 0), which counts a zombie as alive."""
    try:
        stat = pathlib.Path('/proc/%d/stat' % pid).read_text()
    except OSError:
        return False
    return stat.rsplit(')', 1)[1].split()[0] != 'Z'


def test_prometheus_dies_with_the_process_that_started_it(tmp_path: pathlib.Path) -> None:
    """A killed test run or lab leaves no Prometheus behind (as the control plane's processes): the server gets
    SIGKILL when the process that launched it dies, whatever killed that one."""
    binary, reason = ensure_binary('prometheus', 'prometheus')
    if binary is None:
        pytest.skip('LOUD SKIP: no real Prometheus: ' + reason)
    launcher = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, '-c', LAUNCHER, binary, str(tmp_path)] + sys.path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = 0
    try:
        line = launcher.stdout.readline() if launcher.stdout else ''
        assert line.strip().isdigit(), (line, launcher.stderr.read() if launcher.poll() is not None else '')
        pid = int(line)
        assert _running(pid) and 'prometheus' in pathlib.Path('/proc/%d/cmdline' % pid).read_text(), pid
        # Prometheus is up on its own (its storage directory exists) before its parent is killed.
        deadline = time.monotonic() + 30
        while not (tmp_path / 'data').is_dir():
            assert _running(pid) and time.monotonic() < deadline, (tmp_path / 'prometheus.log').read_text()
            time.sleep(0.1)
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(pid), 'prometheus (pid %d) outlived the process that started it' % pid
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
        if pid and _running(pid):
            os.kill(pid, signal.SIGKILL)
