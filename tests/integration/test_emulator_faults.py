"""Fault injection, the `make emulator` entry point and a fleet-sized store."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from emulator import fixtures as f

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def core(emulator):
    return client.CoreV1Api(config.new_client_from_config(config_file=emulator.kubeconfig))


@pytest.mark.parametrize('status', [500, 503])
def test_error_answers_n_times(emulator, core, status):
    emulator.apply(f.node('n1'))
    fault = emulator.faults.add(method='GET', path=r'^/api/v1/nodes$', status=status, times=2)
    for _attempt in range(2):
        with pytest.raises(ApiException) as exc:
            core.list_node()
        assert exc.value.status == status and 'injected fault' in exc.value.body
    assert [n.metadata.name for n in core.list_node().items] == ['n1']
    assert fault.hits == 2 and fault.exhausted
    assert [r.get('fault', False) for r in emulator.requests] == [True, True, False]
    assert [r['status'] for r in emulator.requests] == [status, status, 200]
    core.read_node('n1')   # the path regex did not match the single-node URL


def test_conflicts_on_a_patch_change_nothing(emulator, core):
    emulator.apply(f.node('n1'))
    emulator.faults.add(method='PATCH', path=r'/nodes/n1$', status=409, times=2)
    for _attempt in range(2):
        with pytest.raises(ApiException) as exc:
            core.patch_node('n1', {'spec': {'unschedulable': True}})
        assert exc.value.status == 409
        assert not emulator.get('v1', 'Node', 'n1')['spec'].get('unschedulable')
    core.patch_node('n1', {'spec': {'unschedulable': True}})
    assert emulator.get('v1', 'Node', 'n1')['spec']['unschedulable'] is True


def test_slow_answer_beyond_the_client_timeout(emulator, core):
    emulator.apply(f.node('n1'))
    slow = emulator.faults.add(method='GET', path=r'/nodes/n1$', delay=1.0)
    with pytest.raises(urllib3.exceptions.MaxRetryError) as exc:
        core.read_node('n1', _request_timeout=0.3)
    assert isinstance(exc.value.reason, urllib3.exceptions.ReadTimeoutError)
    assert slow.hits == 4   # urllib3's default 3 retries of the kubernetes client, each timed out
    emulator.faults.clear()
    assert core.read_node('n1', _request_timeout=5).metadata.name == 'n1'


def test_slow_then_failing_and_query_matching(emulator, core):
    emulator.apply([f.node('n1'), f.pod('p', 'n1')])
    emulator.faults.add(method='GET', path=r'/pods$', query={'fieldSelector': 'spec.nodeName=n1'}, status=500,
                        delay=0.2)
    assert len(core.list_pod_for_all_namespaces().items) == 1
    with pytest.raises(ApiException) as exc:
        core.list_pod_for_all_namespaces(field_selector='spec.nodeName=n1')
    assert exc.value.status == 500
    emulator.faults.clear()
    assert len(core.list_pod_for_all_namespaces(field_selector='spec.nodeName=n1').items) == 1
    with pytest.raises(ValueError):
        emulator.faults.add(method='GET', path='/x')


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which('kubectl') is None, reason='kubectl is not installed')
def test_make_emulator_entry_point(tmp_path):
    """`python -m emulator` (what `make emulator` runs): port and kubeconfig from the environment,
    seeded from a --fleet file, serves kubectl, stops cleanly on SIGINT."""
    fleet = tmp_path / 'fleet.yml'
    fleet.write_text('generate: {nodes: 3, pods_per_node: 2, namespaces: 1}\n'
                     'objects:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: marker}, data: {a: b}}\n')
    port = _free_port()
    kubeconfig = tmp_path / 'lab' / 'kubeconfig'
    env = dict(os.environ, EMULATOR_PORT=str(port), EMULATOR_KUBECONFIG=str(kubeconfig),
               PYTHONPATH=str(REPO / 'tests'))
    proc = subprocess.Popen([sys.executable, '-m', 'emulator', '--fleet', str(fleet)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = [proc.stdout.readline() for dummy in range(3)]
        assert lines[0].strip() == 'Kubernetes API emulator: http://127.0.0.1:%d' % port, lines
        assert lines[1].strip() == 'kubeconfig: %s' % kubeconfig
        r = subprocess.run([shutil.which('kubectl'), '--kubeconfig', str(kubeconfig), 'get', 'nodes,configmaps',
                            '-o', 'json'], capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        names = sorted(o['metadata']['name'] for o in json.loads(r.stdout)['items'])
        assert names == ['gpu-0', 'gpu-1', 'gpu-2', 'marker']
    finally:
        proc.send_signal(signal.SIGINT)
        out, _err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and 'emulator stopped' in out


def test_a_fleet_sized_store_pages_completely(emulator, core):
    """1,000 nodes and 20,000 pods (the 5,000 / 100,000 run is bench/emulator_scale.py): a
    cluster-wide paginated list returns every pod exactly once; per-node queries use the index."""
    count = emulator.load(f.fleet(1000, 20, namespaces=5))
    assert count == 5 + 5 + 1000 + 20000
    seen, token = set(), None
    pages = 0
    while True:
        resp = core.list_pod_for_all_namespaces(limit=500, _continue=token, _preload_content=False)
        data = json.loads(resp.data)
        pages += 1
        for item in data['items']:
            key = (item['metadata']['namespace'], item['metadata']['name'])
            assert key not in seen
            seen.add(key)
        token = data['metadata'].get('continue')
        if not token:
            break
    assert len(seen) == 20000 and pages == 40
    on_node = core.list_pod_for_all_namespaces(field_selector='spec.nodeName=gpu-517')
    assert sorted(p.metadata.name for p in on_node.items) == sorted('gpu-517-p%d' % i for i in range(20))
    gpu_nodes = core.list_node(label_selector='nvidia.com/gpu.present=true', limit=100)
    assert len(gpu_nodes.items) == 100 and gpu_nodes.metadata.remaining_item_count is None
