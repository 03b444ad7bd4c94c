"""metric_gate's main() with the HTTP opener stubbed: `nodes` and its mutual exclusion with `node`."""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.upgrade.plugins.modules import metric_gate
from tools.module_exit import ModuleExit, capture_module_exits

SEL = '{Hostname=~"gpu-7|gpu-8\\\\.example\\\\.com"}'


def matrix(*series: tuple[dict[str, str], list[float]]) -> dict[str, Any]:
    return {'status': 'success', 'data': {'resultType': 'matrix', 'result': [
        {'metric': m, 'values': [[1000.0 + i, str(v)] for i, v in enumerate(vals)]} for m, vals in series]}}


def run_main(monkeypatch, args: dict[str, Any], answers: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """main() with the opener answering by the query text; returns the result and the queries asked."""
    asked = []

    def opener(url: str, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        query = parse_qs(urlparse(url).query)['query'][0]
        asked.append(query)
        status, doc = answers[query]
        return status, json.dumps(doc).encode()

    capture_module_exits(monkeypatch)
    monkeypatch.setattr(metric_gate, '_opener', lambda module: opener)
    with patch_module_args(dict({'url': 'http://prom:9090', 'window': '1h', 'min_samples': 2}, **args)):
        with pytest.raises(ModuleExit) as exc:
            metric_gate.main()
    return exc.value.result, asked


def test_node_and_nodes_are_mutually_exclusive(monkeypatch) -> None:
    result, asked = run_main(monkeypatch, {'presets': ['xid'], 'node': 'gpu-7', 'nodes': ['gpu-8']}, {})
    assert result['failed'] is True and asked == []
    assert 'mutually exclusive' in result['msg'] and 'node' in result['msg'] and 'nodes' in result['msg']


def test_bad_node_name_is_invalid_input(monkeypatch) -> None:
    result, asked = run_main(monkeypatch, {'presets': ['xid'], 'nodes': ['gpu-7', 'gpu_8']}, {})
    assert result['failed'] is True and asked == []
    assert result['msg'].startswith("metric gate: invalid input: nodes[1]: 'gpu_8' is not a Kubernetes node name")
    assert 'failed_nodes' not in result


def test_nodes_one_query_per_preset_and_failed_nodes(monkeypatch) -> None:
    host7 = {'Hostname': 'gpu-7', 'gpu': '0'}
    answers = {'DCGM_FI_DEV_XID_ERRORS' + SEL: (200, matrix((host7, [0, 0]))),
               'DCGM_FI_DEV_GPU_TEMP' + SEL: (200, matrix((host7, [50, 50]), ({'Hostname': 'gpu-8.example.com'}, [50, 50])))}
    result, asked = run_main(monkeypatch, {'presets': ['xid', 'temperature'], 'nodes': ['gpu-7', 'gpu-8.example.com']},
                             answers)
    assert asked == ['DCGM_FI_DEV_XID_ERRORS' + SEL, 'DCGM_FI_DEV_GPU_TEMP' + SEL]
    assert result['failed'] is True
    assert result['failed_nodes'] == ['gpu-8.example.com']
    assert result['problems'] == ['dcgm_xid: no series of node gpu-8.example.com in the observation window '
                                  '(its monitoring is lost: a failure)']
    # Every node with its series: passed, no failed node.
    answers['DCGM_FI_DEV_XID_ERRORS' + SEL] = (200, matrix((host7, [0, 0]), ({'Hostname': 'gpu-8.example.com'}, [0, 0])))
    result, asked = run_main(monkeypatch, {'presets': ['xid', 'temperature'], 'nodes': ['gpu-7', 'gpu-8.example.com']},
                             answers)
    assert result['failed'] is False and result['passed'] is True and result['failed_nodes'] == []


def test_single_node_has_no_failed_nodes(monkeypatch) -> None:
    answers = {'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-7"}': (200, matrix(({'Hostname': 'gpu-7'}, [0, 0])))}
    result, asked = run_main(monkeypatch, {'presets': ['xid'], 'node': 'gpu-7'}, answers)
    assert result['passed'] is True and 'failed_nodes' not in result and 'by_node' not in result['queries'][0]


def test_url_with_credentials_is_refused_without_showing_them(monkeypatch) -> None:
    """2026-12-06 review T3-10: the url is in the task result's invocation; credentials go in no_log options."""
    result, asked = run_main(monkeypatch, {'url': 'http://scrape:Pr0mPassw0rd@prom:9090', 'presets': ['xid'],
                                           'node': 'gpu-7'}, {})
    assert result['failed'] is True and asked == []
    assert result['msg'] == ("metric gate: invalid input: url: 'http://prom:9090' has credentials in it; give them as "
                             "url_username and url_password, or a token as bearer_token")
    assert 'Pr0mPassw0rd' not in json.dumps(result)


def test_url_password_needs_url_username_and_excludes_bearer_token(monkeypatch) -> None:
    result, _asked = run_main(monkeypatch, {'url_password': 'pw', 'presets': ['xid'], 'node': 'gpu-7'}, {})
    assert result['failed'] is True and 'url_password' in result['msg'] and 'url_username' in result['msg']
    result, _asked = run_main(monkeypatch, {'url_username': 'u', 'url_password': 'pw', 'bearer_token': 't',
                                            'presets': ['xid'], 'node': 'gpu-7'}, {})
    assert result['failed'] is True and 'mutually exclusive' in result['msg'] and 'bearer_token' in result['msg']
