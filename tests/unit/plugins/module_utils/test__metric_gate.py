"""Unit tests of the metric gate's input parsing and comparison (no Prometheus here)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _metric_gate as mg

W = mg.Window(1_000_000.0, 1_003_600.0)


@pytest.mark.parametrize('text,seconds', [('90s', 90), ('15m', 900), ('24h', 86400), ('7d', 604800),
                                          ('1h30m', 5400), ('500ms', 0.5), ('1w', 604800)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert mg.parse_duration(text, 'window') == seconds


@pytest.mark.parametrize('text', ['', '10', 'h', '1x', '1h 30m', '-1h', '0s'])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(mg.MetricGateError, match=r'^window: '):
        mg.parse_duration(text, 'window')


def test_parse_time_forms() -> None:
    assert mg.parse_time('2026-07-14T12:00:00Z', 'x') == mg.parse_time('2026-07-14T14:00:00+02:00', 'x')
    assert mg.parse_time('1700000000.5', 'x') == 1700000000.5
    with pytest.raises(mg.MetricGateError, match=r"^window_end: '2026-07-14T12:00:00' has no UTC offset"):
        mg.parse_time('2026-07-14T12:00:00', 'window_end')
    with pytest.raises(mg.MetricGateError, match=r"^x: 'yesterday' is not an RFC 3339 time"):
        mg.parse_time('yesterday', 'x')


def test_resolve_window() -> None:
    w = mg.resolve_window('1h', None, None, now=5000.0)
    assert (w.start, w.end) == (1400.0, 5000.0)
    w = mg.resolve_window(None, '100', '200', now=5000.0)
    assert (w.start, w.end) == (100.0, 200.0)
    with pytest.raises(mg.MetricGateError, match='mutually exclusive'):
        mg.resolve_window('1h', '100', None, now=5000.0)
    with pytest.raises(mg.MetricGateError, match='is not before end'):
        mg.resolve_window(None, '300', '200', now=5000.0)
    with pytest.raises(mg.MetricGateError, match='window_end: .* is in the future'):
        mg.resolve_window('1h', None, '9000', now=5000.0)


def test_resolve_step() -> None:
    assert mg.resolve_step(None, mg.Window(0, 86400)) == 345.0
    assert mg.resolve_step(None, mg.Window(0, 20)) == 1.0
    with pytest.raises(mg.MetricGateError, match=r"^step: '1s' gives more than 11000 points"):
        mg.resolve_step('1s', mg.Window(0, 86400))


def q(**kw: Any) -> dict[str, Any]:
    base = {'name': 'err', 'expr': 'rate(x[5m])'}
    base.update(kw)
    return base


def test_parse_query_baseline_offset_shifts_the_window() -> None:
    spec = mg.parse_query(q(baseline={'offset': '7d'}), 0, W, 10)
    assert spec.compare == 'baseline'
    assert spec.reference_expr == 'rate(x[5m])'
    assert (spec.reference_window.start, spec.reference_window.end) == (W.start - 604800, W.end - 604800)
    assert spec.min_samples == 10 and spec.critical is True


@pytest.mark.parametrize('raw,message', [
    (q(), r'^queries\[0\] \(err\): give exactly one of baseline, control or limit \(got none\)$'),
    (q(limit=1, baseline={'offset': '1d'}), r'got baseline, limit'),
    (q(baseline={'offset': '30m'}), r"baseline.offset: '30m' is shorter than the 3600s window"),
    (q(baseline={'start': 1_000_000 - 7200, 'end': 1_000_001}), r'baseline: ends at .* after the observation window'),
    (q(baseline={'offset': '1d', 'start': 1}), r'baseline: give either offset, or start and end'),
    (q(baseline={'start': 1}), r'baseline: start and end are both required'),
    (q(control={}), r'control.expr is required'),
    (q(limit='hot'), r"limit: 'hot' is not a number"),
    (q(limit=1, tolerance={'rel': -0.1}), r'tolerance.rel: -0.1 must be at least 0'),
    (q(limit=1, tolerance={'pct': 5}), r'tolerance: unknown field\(s\) pct'),
    (q(limit=1, direction='up'), r"direction: 'up' is not one of higher_is_worse, lower_is_worse, any"),
    (q(limit=1, reduce='p99'), r"reduce: 'p99' is not one of"),
    (q(limit=1, min_samples=0), r'min_samples: 0 must be an integer of at least 1'),
    (q(limit=1, count_expr='sum(x)'), r'count_expr and min_count go together'),
    (q(limit=1, critical='yes'), r"critical: 'yes' is not a boolean"),
    (q(limit=1, window='1h'), r'unknown field\(s\) window'),
    ({'expr': 'x', 'limit': 1}, r'^queries\[0\].name is required$'),
])
def test_parse_query_errors_name_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(mg.MetricGateError, match=message):
        mg.parse_query(raw, 0, W, 10)


@pytest.mark.parametrize('direction,ref,obs,ok', [
    ('higher_is_worse', 100.0, 110.0, True), ('higher_is_worse', 100.0, 110.5, False),
    ('higher_is_worse', 100.0, 0.0, True), ('lower_is_worse', 100.0, 90.0, True),
    ('lower_is_worse', 100.0, 89.0, False), ('lower_is_worse', 100.0, 1e9, True),
    ('any', 100.0, 111.0, False), ('any', 100.0, 89.0, False), ('any', 100.0, 105.0, True),
    ('higher_is_worse', 0.0, 0.5, True), ('higher_is_worse', 0.0, 1.5, False),  # abs is the floor near zero
])
def test_tolerance_is_the_larger_of_abs_and_rel(direction: str, ref: float, obs: float, ok: bool) -> None:
    spec = mg.parse_query(q(limit=ref, direction=direction, tolerance={'rel': 0.1, 'abs': 1.0}), 0, W, 1)
    assert (mg._compare(spec, obs, ref, 'limit', '') is None) is ok


def test_reduce_series_skips_nan_and_counts_samples() -> None:
    res = [{'metric': {'gpu': '0'}, 'values': [[1, '1'], [2, 'NaN'], [3, '3'], [4, '+Inf']]},
           {'metric': {'gpu': '1'}, 'values': [[1, 'NaN']]}]
    out = mg.reduce_series(res, 'mean')
    assert out[0]['value'] == 2.0 and out[0]['samples'] == 2 and out[0]['invalid_points'] == 2
    assert out[1]['value'] is None and out[1]['samples'] == 0
    assert mg.reduce_series(res, 'max')[0]['value'] == 3.0
    assert mg.reduce_series(res, 'last')[0]['value'] == 3.0


def test_presets_use_dcgm_exporter_names_and_escape_the_node() -> None:
    specs = mg.preset_queries(['xid', 'ecc', 'row_remap', 'temperature'], 'gpu"1', 'Hostname', 80.0, 5)
    assert [s.expr for s in specs] == [
        'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu\\"1"}', 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{Hostname="gpu\\"1"}',
        'DCGM_FI_DEV_ROW_REMAP_FAILURE{Hostname="gpu\\"1"}', 'DCGM_FI_DEV_GPU_TEMP{Hostname="gpu\\"1"}']
    assert [s.limit for s in specs] == [0.0, 0.0, 0.0, 80.0]
    assert all(s.critical and s.reduce == 'max' and s.min_samples == 5 for s in specs)
    with pytest.raises(mg.MetricGateError, match='node is required with presets'):
        mg.preset_queries(['xid'], None, 'Hostname', 80.0, 5)
    with pytest.raises(mg.MetricGateError, match="node_label: 'host-name' is not a Prometheus label name"):
        mg.preset_queries(['xid'], 'n', 'host-name', 80.0, 5)


def stub_opener(answers: dict[str, Any]):
    """One function stubbed: the HTTP opener, answering by the query text."""
    def opener(url: str, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        from urllib.parse import parse_qs, urlparse
        query = parse_qs(urlparse(url).query)['query'][0]
        status, doc = answers[query]
        return status, json.dumps(doc).encode()
    return opener


def matrix(*series: tuple[dict[str, str], list[float]]) -> dict[str, Any]:
    return {'status': 'success', 'data': {'resultType': 'matrix', 'result': [
        {'metric': m, 'values': [[W.start + i, str(v)] for i, v in enumerate(vals)]} for m, vals in series]}}


def test_baseline_series_missing_in_observation_is_lost_telemetry() -> None:
    answers = {'x': (200, matrix(({'gpu': '0'}, [1, 1, 1])))}
    spec = mg.parse_query({'name': 'n', 'expr': 'x', 'baseline': {'offset': '1d', 'expr': 'y'}}, 0, W, 3)
    answers['y'] = (200, matrix(({'gpu': '0'}, [1, 1, 1]), ({'gpu': '1'}, [1, 1, 1])))
    client = mg.PrometheusClient('http://prom:9090', stub_opener(answers))
    v = mg.run_gate(client, [spec], W, 60)
    assert v['problems'] == ['n: series {gpu="1"} is in the baseline but missing in the observation window '
                             '(lost telemetry)']


def test_control_needs_single_series() -> None:
    answers = {'x': (200, matrix(({'gpu': '0'}, [1]), ({'gpu': '1'}, [1]))), 'c': (200, matrix(({}, [1])))}
    spec = mg.parse_query({'name': 'n', 'expr': 'x', 'control': {'expr': 'c'}}, 0, W, 1)
    v = mg.run_gate(mg.PrometheusClient('http://prom', stub_opener(answers)), [spec], W, 60)
    assert v['problems'] == ['n: a control comparison needs one series on each side (got 2 observed, 1 control); '
                             'aggregate with sum() or avg()']


def test_run_gate_rejects_duplicates_and_empty() -> None:
    client = mg.PrometheusClient('http://prom', stub_opener({}))
    with pytest.raises(mg.MetricGateError, match='declare at least one query'):
        mg.run_gate(client, [], W, 60)
    spec = mg.parse_query(q(limit=1), 0, W, 1)
    with pytest.raises(mg.MetricGateError, match='duplicate name'):
        mg.run_gate(client, [spec, spec], W, 60)


def test_client_rejects_bad_url_and_timeout() -> None:
    with pytest.raises(mg.MetricGateError, match="url: 'prom:9090' is not an http"):
        mg.PrometheusClient('prom:9090', stub_opener({}))
    with pytest.raises(mg.MetricGateError, match='timeout: 0 must be between 1 and 300'):
        mg.PrometheusClient('http://prom', stub_opener({}), timeout=0)


def test_window_placeholder_is_the_window_length() -> None:
    spec = mg.parse_query(q(expr='rate(x[$window])', control={'expr': 'sum(y[$window])'},
                            count_expr='sum(increase(r[$window]))', min_count=1), 0, W, 1)
    assert spec.expr == 'rate(x[3600s])'
    assert spec.reference_expr == 'sum(y[3600s])'
    assert spec.count_expr == 'sum(increase(r[3600s]))'


def test_prometheus_errors_name_the_url_without_its_credentials():
    """Issue 12 (11)."""
    from urllib.error import URLError

    def opener(url, headers, timeout):
        raise URLError('connection refused to http://scrape:pw0rd@prom:9090')

    client = mg.PrometheusClient('http://prom:9090', opener)
    with pytest.raises(mg.PrometheusError) as exc:
        client.query('up', 0)
    assert 'pw0rd' not in str(exc.value) and 'scrape' not in str(exc.value)
    assert 'http://prom:9090' in str(exc.value)
    with pytest.raises(mg.MetricGateError) as exc:
        mg.PrometheusClient('ftp://scrape:pw0rd@prom', opener)
    assert 'pw0rd' not in str(exc.value)


@pytest.mark.parametrize('url', ['http://scrape:pw0rd@prom:9090', 'https://scrape:pw0rd@prom/', 'http://pw0rd@prom'])
def test_a_url_with_credentials_is_refused(url):
    """2026-12-06 review T3-10: the url is in the task result's invocation, so it carries no credential."""
    with pytest.raises(mg.MetricGateError) as exc:
        mg.PrometheusClient(url, stub_opener({}))
    assert str(exc.value).startswith("url: '%s://prom" % url.split(':')[0])
    assert str(exc.value).endswith('has credentials in it; give them as url_username and url_password, or a token '
                                   'as bearer_token')
    assert 'pw0rd' not in str(exc.value)


def test_a_redirect_to_another_origin_gets_no_token_and_fails_the_query():
    """2026-12-06 review T3-9 (repro/metric_gate_redirect_token.py): two real loopback servers, the module's opener."""
    import http.server
    import threading
    from ansible_collections.gpufleet.upgrade.plugins.module_utils._http import http_get

    seen = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get('Authorization'))
            body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
            self.send_response(200)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    other = http.server.HTTPServer(('127.0.0.1', 0), Elsewhere)

    class Prometheus(Elsewhere):
        def do_GET(self):  # noqa: N802
            self.send_response(302)
            self.send_header('Location', 'http://localhost:%d%s' % (other.server_port, self.path))
            self.send_header('Content-Length', '0')
            self.end_headers()

    prom = http.server.HTTPServer(('127.0.0.1', 0), Prometheus)
    for srv in (other, prom):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = mg.PrometheusClient('http://127.0.0.1:%d' % prom.server_port,
                                     http_get, timeout=5,
                                     headers={'Authorization': 'Bearer s3cr3t-prometheus-token'})
        with pytest.raises(mg.PrometheusError) as exc:
            client.query('up', 0)
    finally:
        for srv in (other, prom):
            srv.shutdown()
            srv.server_close()
    assert seen == []
    assert str(exc.value) == ('Prometheus at http://127.0.0.1:%d answered HTTP 302 with a redirect to '
                              'http://localhost:%d, another origin than http://127.0.0.1:%d: not followed, so that '
                              'no credential goes there' % (prom.server_port, other.server_port, prom.server_port))


# --------------------------------------------------------------------------------------------
# nodes: the presets over several nodes, one query per preset, honest per node
# --------------------------------------------------------------------------------------------

NODES = ['gpu-7', 'gpu-8.example.com', 'gpu-9']


def _promql_string(literal: str) -> str:
    """The value of a double-quoted PromQL string literal (Go escapes, as these selectors use them)."""
    assert literal.startswith('"') and literal.endswith('"')
    return json.loads(literal)


def test_presets_over_nodes_select_all_of_them_in_one_query() -> None:
    specs = mg.preset_queries(['xid', 'temperature'], None, 'Hostname', 80.0, 5, nodes=NODES)
    assert [s.expr for s in specs] == [
        'DCGM_FI_DEV_XID_ERRORS{Hostname=~"gpu-7|gpu-8\\\\.example\\\\.com|gpu-9"}',
        'DCGM_FI_DEV_GPU_TEMP{Hostname=~"gpu-7|gpu-8\\\\.example\\\\.com|gpu-9"}']
    assert all(s.expect_label == ('Hostname', tuple(NODES)) for s in specs)
    # The RE2 regex inside the literal matches exactly these names (Prometheus anchors it).
    regex = _promql_string(specs[0].expr.split('=~', 1)[1][:-1])
    assert regex == 'gpu-7|gpu-8\\.example\\.com|gpu-9'
    import re
    for name in NODES:
        assert re.fullmatch(regex, name)
    for name in ('gpu-8xexample.com', 'gpu-77', 'gpu-9.example.com', 'gpu-7|gpu-9', ''):
        assert not re.fullmatch(regex, name)
    # Repeats collapse; the single-node selector is unchanged.
    assert mg.preset_queries(['xid'], None, 'Hostname', 80.0, 5, nodes=['a', 'b', 'a'])[0].expr == \
        'DCGM_FI_DEV_XID_ERRORS{Hostname=~"a|b"}'
    assert mg.preset_queries(['xid'], 'gpu-7', 'Hostname', 80.0, 5)[0].expect_label is None


@pytest.mark.parametrize('nodes,message', [
    (['gpu-7', 'GPU-8'], r"^nodes\[1\]: 'GPU-8' is not a Kubernetes node name"),
    (['gpu"7'], r"^nodes\[0\]: 'gpu\"7' is not a Kubernetes node name"),
    (['gpu-7|.*'], r"^nodes\[0\]: 'gpu-7\|\.\*' is not a Kubernetes node name"),
    (['-gpu'], r"^nodes\[0\]: '-gpu' is not a Kubernetes node name"),
    (['gpu..7'], r"^nodes\[0\]: 'gpu\.\.7' is not a Kubernetes node name"),
    (['a' * 254], r"^nodes\[0\]: 'a{254}' is not a Kubernetes node name"),
    ([7], r"^nodes\[0\]: 7 is not a Kubernetes node name"),
    ([], r'^nodes: give at least one node name$'),
    ('gpu-7', r"^nodes: 'gpu-7' is not a list of node names$"),
])
def test_bad_node_names_are_rejected_naming_field_and_value(nodes: Any, message: str) -> None:
    with pytest.raises(mg.MetricGateError, match=message):
        mg.preset_queries(['xid'], None, 'Hostname', 80.0, 5, nodes=nodes)


def test_node_and_nodes_are_mutually_exclusive() -> None:
    with pytest.raises(mg.MetricGateError, match='^node and nodes are mutually exclusive: give one$'):
        mg.preset_queries(['xid'], 'gpu-7', 'Hostname', 80.0, 5, nodes=['gpu-8'])


def dcgm_series(host: str, gpu: str, vals: list[float]) -> tuple[dict[str, str], list[float]]:
    return ({'Hostname': host, 'gpu': gpu, '__name__': 'DCGM_FI_DEV_XID_ERRORS'}, vals)


def nodes_gate(answers: dict[str, Any], presets: list[str], nodes: list[str], min_samples: int = 3) -> dict[str, Any]:
    specs = mg.preset_queries(presets, None, 'Hostname', 85.0, min_samples, nodes=nodes)
    client = mg.PrometheusClient('http://prom:9090', stub_opener(answers))
    v = mg.run_gate(client, specs, W, 60, nodes=nodes, node_label='Hostname')
    assert client.requests == len(presets)   # one query per preset, whatever the number of nodes
    return v


def test_node_without_series_fails_and_the_others_pass() -> None:
    sel = '{Hostname=~"gpu-7|gpu-8\\\\.example\\\\.com|gpu-9"}'
    answers = {
        'DCGM_FI_DEV_XID_ERRORS' + sel: (200, matrix(dcgm_series('gpu-7', '0', [0, 0, 0]), dcgm_series('gpu-7', '1', [0, 0, 0]),
                                                     dcgm_series('gpu-9', '0', [0, 0, 0]))),
        'DCGM_FI_DEV_GPU_TEMP' + sel: (200, matrix(dcgm_series('gpu-7', '0', [50, 51, 52]),
                                                   dcgm_series('gpu-8.example.com', '0', [50, 50, 50]),
                                                   dcgm_series('gpu-9', '0', [50, 50, 50]))),
    }
    v = nodes_gate(answers, ['xid', 'temperature'], NODES)
    missing = ('dcgm_xid: no series of node gpu-8.example.com in the observation window '
               '(its monitoring is lost: a failure)')
    assert v['passed'] is False
    assert v['problems'] == [missing]
    assert v['failed_critical'] == ['dcgm_xid']
    assert v['failed_nodes'] == ['gpu-8.example.com']
    xid, temp = v['queries']
    assert xid['by_node'] == {'gpu-7': [], 'gpu-8.example.com': [missing], 'gpu-9': []}
    assert temp['passed'] is True and temp['by_node'] == {'gpu-7': [], 'gpu-8.example.com': [], 'gpu-9': []}


def test_failed_nodes_attributes_series_problems_to_their_node() -> None:
    sel = '{Hostname=~"gpu-7|gpu-9"}'
    answers = {
        # gpu-7: Xid 79 on GPU 1; gpu-9: too few samples on GPU 0.
        'DCGM_FI_DEV_XID_ERRORS' + sel: (200, matrix(dcgm_series('gpu-7', '0', [0, 0, 0]), dcgm_series('gpu-7', '1', [0, 79, 79]),
                                                     dcgm_series('gpu-9', '0', [0]))),
        'DCGM_FI_DEV_GPU_TEMP' + sel: (200, matrix(dcgm_series('gpu-7', '0', [50, 50, 50]),
                                                   dcgm_series('gpu-9', '0', [50, 50, 50]))),
    }
    v = nodes_gate(answers, ['xid', 'temperature'], ['gpu-7', 'gpu-9'])
    assert v['failed_nodes'] == ['gpu-7', 'gpu-9']
    by_node = v['queries'][0]['by_node']
    assert len(by_node['gpu-7']) == 1 and 'is above the allowed 0' in by_node['gpu-7'][0] and 'gpu="1"' in by_node['gpu-7'][0]
    assert len(by_node['gpu-9']) == 1 and '1 valid sample(s)' in by_node['gpu-9'][0]
    assert v['queries'][1]['by_node'] == {'gpu-7': [], 'gpu-9': []}
    # All clean: passed, and no failed node.
    answers['DCGM_FI_DEV_XID_ERRORS' + sel] = (200, matrix(dcgm_series('gpu-7', '0', [0, 0, 0]),
                                                           dcgm_series('gpu-9', '0', [0, 0, 0])))
    v = nodes_gate(answers, ['xid', 'temperature'], ['gpu-7', 'gpu-9'])
    assert v['passed'] is True and v['failed_nodes'] == [] and v['problems'] == []


def test_problems_without_a_series_go_to_every_node() -> None:
    sel = '{Hostname=~"gpu-7|gpu-9"}'
    answers = {'DCGM_FI_DEV_XID_ERRORS' + sel: (503, {'status': 'error', 'errorType': 'unavailable', 'error': 'down'}),
               'DCGM_FI_DEV_GPU_TEMP' + sel: (200, matrix())}
    v = nodes_gate(answers, ['xid', 'temperature'], ['gpu-7', 'gpu-9'])
    assert v['failed_nodes'] == ['gpu-7', 'gpu-9']
    xid, temp = v['queries']
    assert xid['by_node']['gpu-7'] == xid['by_node']['gpu-9'] == xid['problems'] and len(xid['problems']) == 1
    # No series at all: the general message for every node, and each node's own.
    assert temp['by_node']['gpu-7'] == [temp['problems'][0], 'dcgm_gpu_temperature: no series of node gpu-7 in the '
                                        'observation window (its monitoring is lost: a failure)']
    assert temp['problems'][0].startswith('dcgm_gpu_temperature: no series for ')


def test_custom_queries_get_by_node_but_no_presence_check() -> None:
    answers = {'err': (200, matrix(({'Hostname': 'gpu-7'}, [0.5, 0.5]), ({'Hostname': 'gpu-9'}, [0.0, 0.0]))),
               'agg': (200, matrix(({}, [5.0, 5.0])))}
    specs = [mg.parse_query({'name': 'err', 'expr': 'err', 'limit': 0.1}, 0, W, 2),
             mg.parse_query({'name': 'agg', 'expr': 'agg', 'limit': 1, 'critical': False}, 1, W, 2)]
    client = mg.PrometheusClient('http://prom', stub_opener(answers))
    v = mg.run_gate(client, specs, W, 60, nodes=['gpu-7', 'gpu-8', 'gpu-9'])
    assert specs[0].expect_label is None
    err, agg = v['queries']
    assert err['by_node']['gpu-8'] == [] and err['by_node']['gpu-9'] == [] and len(err['by_node']['gpu-7']) == 1
    assert len(agg['by_node']['gpu-8']) == 1          # a series of no listed node: every node
    assert v['failed_nodes'] == ['gpu-7']             # agg is not critical


def test_single_node_result_is_unchanged() -> None:
    answers = {'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-7"}': (200, matrix(dcgm_series('gpu-7', '0', [0, 0, 0])))}
    specs = mg.preset_queries(['xid'], 'gpu-7', 'Hostname', 85.0, 3)
    v = mg.run_gate(mg.PrometheusClient('http://prom', stub_opener(answers)), specs, W, 60)
    assert v['passed'] is True and 'failed_nodes' not in v and 'by_node' not in v['queries'][0]
