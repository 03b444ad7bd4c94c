"""fleet_info on the real control plane: one named node is read alone (a field selector), not every Node of
the cluster (issue 18); a name that is not in the pool is a clear error."""
from __future__ import annotations

from cluster import fixtures as f
from k8s_support import play


def info_task(ignore_errors: bool = False, **args) -> dict:
    task = {'name': 'info', 'gpufleet.upgrade.fleet_info': dict({'gpu_operator': {}, 'dcgm_exporter': {}}, **args),
            'register': 'info'}
    return dict(task, ignore_errors=True) if ignore_errors else task


def test_one_named_node_is_read_alone_and_a_missing_one_is_named(cluster, run_playbook):
    cluster.apply([f.gpu_node('gpu-a'), f.gpu_node('gpu-b'), f.node('cpu-c')])
    cluster.clear_requests()
    res = run_playbook(play(cluster, info_task(names=['gpu-b'], node_selector='nvidia.com/gpu.present=true'))).result('info')
    assert [n['name'] for n in res['nodes']] == ['gpu-b'] and res['nodes'][0]['gpus'] == 8
    lists = [r['query'] for r in cluster.requests if r['verb'] == 'GET' and r['path'] == '/api/v1/nodes']
    assert [(q.get('fieldSelector'), q.get('labelSelector')) for q in lists] == [
        ('metadata.name=gpu-b', 'nvidia.com/gpu.present=true')]
    # several names: the pool is listed once and filtered
    res = run_playbook(play(cluster, info_task(names=['gpu-b', 'gpu-a']))).result('info')
    assert [n['name'] for n in res['nodes']] == ['gpu-a', 'gpu-b']
    # a name outside the pool (here: not a GPU node) fails, naming it
    res = run_playbook(play(cluster, info_task(True, names=['cpu-c'], node_selector='nvidia.com/gpu.present=true'))).result('info')
    assert res['_event'] == 'runner_on_failed' and res['msg'] == 'names: no such node in the pool: cpu-c'
    assert cluster.mutating_requests() == []


def test_default_pool_needs_no_gpu_feature_discovery(cluster, run_playbook):
    """Issue 39 item 9: without GPU Feature Discovery no Node carries nvidia.com/gpu.present, and the old default
    selector chose none. Unset, the pool is every Node with NVIDIA GPU capacity (or the GFD/NFD label, or this
    collection's progress annotations); an explicit selector is used as given; named Nodes are read as they are."""
    # gpu-bare and gpu-mig as the kubelet registers them with the device plugin and no GFD/NFD: GPU resources only
    cluster.apply([f.gpu_node('gpu-a'), f.node('gpu-bare', allocatable={'nvidia.com/gpu': '4'}),
                   f.node('gpu-mig', allocatable={'nvidia.com/mig-1g.10gb': '7'}), f.node('cpu-c')])
    cluster.clear_requests()
    res = run_playbook(play(cluster, info_task())).result('info')
    assert [n['name'] for n in res['nodes']] == ['gpu-a', 'gpu-bare', 'gpu-mig']
    lists = [r['query'] for r in cluster.requests if r['verb'] == 'GET' and r['path'] == '/api/v1/nodes']
    assert [q.get('labelSelector') for q in lists] == [None]
    # explicit: exactly that selector ('' lists every Node)
    res = run_playbook(play(cluster, info_task(node_selector='nvidia.com/gpu.present=true'))).result('info')
    assert [n['name'] for n in res['nodes']] == ['gpu-a']
    res = run_playbook(play(cluster, info_task(node_selector=''))).result('info')
    assert [n['name'] for n in res['nodes']] == ['cpu-c', 'gpu-a', 'gpu-bare', 'gpu-mig']
    # named, no selector: read whatever they report
    res = run_playbook(play(cluster, info_task(names=['cpu-c', 'gpu-bare']))).result('info')
    assert [n['name'] for n in res['nodes']] == ['cpu-c', 'gpu-bare']
    assert cluster.mutating_requests() == []
