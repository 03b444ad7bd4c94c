"""gpufleet.upgrade.gpu_holders_info through ansible-runner against the real control plane (tests/cluster),
cross-checked with kubectl."""
from __future__ import annotations

import pytest

import k8s_scenario as S
from k8s_support import kubectl_json, load, play

pytestmark = pytest.mark.slow

HOLDERS = {'name': 'holders', 'gpufleet.upgrade.gpu_holders_info': {}, 'register': 'h'}


def test_fleet_holders_are_classified_exactly_with_zero_mutations(cluster, run_playbook):
    load(cluster)
    run = run_playbook(play(cluster, HOLDERS))
    res = run.result('holders')
    assert run.rc == 0, run.stdout
    assert res['changed'] is False
    assert [S.holder_key(h) for h in res['holders']] == S.EXPECTED_HOLDERS
    assert res['by_node'] == {
        'gpu-1': {'Pod': 7, 'VirtualMachineInstance': 1, 'ResourceClaim': 1, 'total': 9},
        'gpu-2': {'Pod': 1, 'VirtualMachineInstance': 0, 'ResourceClaim': 0, 'total': 1},
    }
    assert res['nodes'] == ['gpu-1', 'gpu-2']            # cpu-1 advertises no GPU
    vmi = [h for h in res['holders'] if h['kind'] == 'VirtualMachineInstance'][0]
    assert vmi['launcher_pod'] == 'virt-launcher-vm-gpu-x7k2p'
    # read-only: zero mutating requests; pods listed once, cluster-wide, paginated
    assert cluster.mutating_requests() == []
    pod_lists = [r for r in cluster.requests if r['path'] == '/api/v1/pods']
    assert len(pod_lists) == 1
    assert str(pod_lists[0]['query'].get('limit')) == '500'
    assert not any(r['path'].startswith('/api/v1/namespaces/') for r in cluster.requests)


def test_fleet_mode_pages_through_a_small_page_size(cluster, run_playbook):
    load(cluster)
    run = run_playbook(play(cluster, {'name': 'holders', 'gpufleet.upgrade.gpu_holders_info': {'page_size': 3}}))
    res = run.result('holders')
    assert [S.holder_key(h) for h in res['holders']] == S.EXPECTED_HOLDERS
    pod_lists = [r for r in cluster.requests if r['path'] == '/api/v1/pods']
    assert 4 <= len(pod_lists) <= 5                         # 12 running pods, 3 per page
    assert all('continue' in r['query'] for r in pod_lists[1:])


def test_single_node_mode_uses_a_field_selector(cluster, run_playbook):
    load(cluster)
    run = run_playbook(play(cluster, {'name': 'holders', 'gpufleet.upgrade.gpu_holders_info': {'nodes': ['gpu-2']}}))
    res = run.result('holders')
    assert [S.holder_key(h) for h in res['holders']] == [k for k in S.EXPECTED_HOLDERS if k[3] == 'gpu-2']
    assert res['by_node'] == {'gpu-2': {'Pod': 1, 'VirtualMachineInstance': 0, 'ResourceClaim': 0, 'total': 1}}
    pod_lists = [r for r in cluster.requests if r['path'] == '/api/v1/pods']
    assert [r['query']['fieldSelector'] for r in pod_lists] == [
        'spec.nodeName=gpu-2,status.phase!=Succeeded,status.phase!=Failed']
    assert cluster.mutating_requests() == []


def test_holders_match_what_kubectl_sees(cluster, run_playbook):
    """Cross-check: the pods kubectl lists on gpu-1 with a GPU request, runtimeClass or claim are
    exactly our Pod holders there (the launcher pod is ours as a VMI)."""
    load(cluster)
    run = run_playbook(play(cluster, {'name': 'holders', 'gpufleet.upgrade.gpu_holders_info': {'nodes': ['gpu-1']}}))
    ours = {(h['namespace'], h['name']) for h in run.result('holders')['holders'] if h['kind'] == 'Pod'}
    pods = kubectl_json(cluster, 'get', 'pods', '-A', '--field-selector', 'spec.nodeName=gpu-1')['items']
    theirs = set()
    for p in pods:
        limits = {}
        for c in p['spec']['containers']:
            limits.update((c.get('resources') or {}).get('limits') or {})
        if (any(k == 'nvidia.com/gpu' or k.startswith('nvidia.com/mig-') for k in limits)
                or p['spec'].get('runtimeClassName') == 'nvidia' or p['spec'].get('resourceClaims')):
            theirs.add((p['metadata']['namespace'], p['metadata']['name']))
    assert ours == theirs
    assert len(pods) == 10, sorted(p["metadata"]["name"] for p in pods)  # 7 Pod holders + the launcher + web-1 + the mirror pod
    claims = kubectl_json(cluster, 'get', 'resourceclaims.resource.k8s.io', '-A')['items']
    assert [c['metadata']['name'] for c in claims] == ['dra-claim']


def test_unknown_node_and_bad_option_fail_clearly(cluster, run_playbook):
    load(cluster)
    run = run_playbook(play(
        cluster,
        {'name': 'missing', 'gpufleet.upgrade.gpu_holders_info': {'nodes': ['gpu-404']}, 'ignore_errors': True},
        {'name': 'bad', 'gpufleet.upgrade.gpu_holders_info': {'gpu_resources': ['nvidia.com/*gpu']},
         'ignore_errors': True}))
    assert run.result('missing')['msg'] == "nodes: node 'gpu-404' does not exist"
    assert run.result('bad')['msg'] == "gpu_resources: 'nvidia.com/*gpu': * is allowed only at the end (a prefix)"
    assert cluster.mutating_requests() == []


def test_faults_on_reads_are_retried(cluster, run_playbook):
    load(cluster)
    cluster.faults.add(method='GET', path=r'^/api/v1/pods$', status=503, times=2)
    cluster.faults.add(method='GET', path=r'^/api/v1/nodes$', status=500, times=1)
    run = run_playbook(play(cluster, HOLDERS))
    res = run.result('holders')
    assert run.rc == 0, run.stdout
    assert [S.holder_key(h) for h in res['holders']] == S.EXPECTED_HOLDERS
    assert len([r for r in cluster.requests if r['path'] == '/api/v1/pods']) == 3
    assert len([r for r in cluster.requests if r['path'] == '/api/v1/nodes']) == 2


def test_slow_answer_beyond_the_client_timeout_is_retried(cluster, run_playbook):
    load(cluster)
    cluster.faults.add(method='GET', path=r'^/api/v1/pods$', delay=4, times=1)
    run = run_playbook(play(cluster, HOLDERS, request_timeout=1))
    res = run.result('holders')
    assert run.rc == 0, run.stdout
    assert [S.holder_key(h) for h in res['holders']] == S.EXPECTED_HOLDERS


def test_persistent_server_errors_fail_with_a_clear_message(cluster, run_playbook):
    load(cluster)
    cluster.faults.add(method='GET', path=r'^/api/v1/pods$', status=500, times=100)
    run = run_playbook(play(cluster, dict(HOLDERS, ignore_errors=True)))
    res = run.result('holders')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'].startswith('GET /api/v1/pods: HTTP 500')
    assert res['msg'].endswith('(gave up after 4 attempts)')
    assert 'Traceback' not in res['msg']
