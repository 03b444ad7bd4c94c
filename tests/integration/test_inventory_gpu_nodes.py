"""The gpufleet.upgrade.gpu_nodes inventory plugin on the real control plane, through ansible-inventory: the GPU
Nodes become hosts named as configured, with the Node name, RKE2 role and combination groups; constructed
keyed_groups; K8S_AUTH_* environment auth; the inventory cache reads no Node a second time; a bad source and an
unreachable API are clear errors (issue 39 item 2)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
from typing import Any

import yaml

from cluster import fixtures as f, rbac

REPO = pathlib.Path(__file__).resolve().parents[2]


def inventory(config: pathlib.Path, body: dict[str, Any], env: dict[str, str] | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    config.write_text(yaml.safe_dump(dict({'plugin': 'gpufleet.upgrade.gpu_nodes'}, **body)))
    run_env = {'ANSIBLE_COLLECTIONS_PATH': os.environ['ANSIBLE_COLLECTIONS_PATH'], 'PATH': os.environ['PATH'],
               'HOME': os.environ.get('HOME', str(config.parent)), 'ANSIBLE_NOCOLOR': '1',
               'ANSIBLE_INVENTORY_UNPARSED_FAILED': '1', 'ANSIBLE_LOCAL_TEMP': str(config.parent / 'tmp')}
    run_env.update(env or {})
    cp = subprocess.run(['ansible-inventory', '-i', str(config), '--list'], capture_output=True, text=True,
                        env=run_env, timeout=120, check=False)
    if check:
        assert cp.returncode == 0, cp.stderr
    return cp


def plain(value: Any) -> Any:
    """ansible-inventory's JSON without the {'__ansible_unsafe': ...} wrapping of values an inventory plugin set
    (they are data, never templates)."""
    if isinstance(value, dict):
        if set(value) == {'__ansible_unsafe'}:
            return value['__ansible_unsafe']
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def listed(cp: subprocess.CompletedProcess) -> dict[str, Any]:
    return plain(json.loads(cp.stdout))


def node_lists(cluster) -> list[dict[str, Any]]:
    return [r for r in cluster.requests if r['verb'] == 'GET' and r['path'] == '/api/v1/nodes']


def test_gpu_nodes_become_hosts_with_groups_auth_and_cache(cluster, tmp_path):
    cluster.apply([
        f.gpu_node('gpu-a', internal_ip='10.9.0.1', labels={'gpufleet.io/platform': 'dgx-h100'}),
        f.gpu_node('gpu-cp', internal_ip='10.9.0.2', kernel='6.11.0-29-generic',
                   labels={'node-role.kubernetes.io/control-plane': 'true', 'node-role.kubernetes.io/etcd': 'true'}),
        f.gpu_node('gpu-mig', internal_ip='10.9.0.3', mig={'1g.10gb': 7}, product='NVIDIA-A100-SXM4-40GB',
                   labels={'nvidia.com/mig.config': 'all-1g.10gb', 'gpufleet.io/install-method': 'apt'}),
        f.node('cpu-x', internal_ip='10.9.0.9'),
    ])
    reader = rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-reader')   # the read-only role of docs/rbac is enough
    cluster.clear_requests()
    config = tmp_path / 'prod.gpu_nodes.yml'
    out = listed(inventory(config, {
        'kubeconfig': reader, 'ansible_host': ['InternalIP'],
        'keyed_groups': [{'key': "gpufleet_node.labels['nvidia.com/gpu.count']", 'prefix': 'gpus'}],
        'compose': {'node_ready': 'gpufleet_node.ready'},
    }))
    hv = out['_meta']['hostvars']
    assert sorted(hv) == ['gpu-a', 'gpu-cp', 'gpu-mig']          # the CPU node is not in the GPU pool
    assert sorted(out['gpu_nodes']['hosts']) == ['gpu-a', 'gpu-cp', 'gpu-mig']
    assert hv['gpu-a']['ansible_host'] == '10.9.0.1' and hv['gpu-a']['gpufleet_node_name'] == 'gpu-a'
    assert hv['gpu-a']['gpufleet_node']['kernel_line'] == '6.8' and hv['gpu-a']['node_ready'] is True
    assert hv['gpu-a']['gpufleet_node']['rke2_version'] == 'v1.34.2+rke2r1'
    assert out['gpufleet_rke2_server']['hosts'] == ['gpu-cp'] and hv['gpu-cp']['gpufleet_rke2_role'] == 'server'
    assert sorted(out['gpufleet_rke2_agent']['hosts']) == ['gpu-a', 'gpu-mig']
    assert out['gpufleet_platform_dgx_h100']['hosts'] == ['gpu-a']
    assert out['gpufleet_kernel_6_11']['hosts'] == ['gpu-cp']
    assert out['gpufleet_partition_mig']['hosts'] == ['gpu-mig'] and out['gpufleet_install_apt']['hosts'] == ['gpu-mig']
    assert out['gpufleet_gpu_nvidia_a100_sxm4_40gb']['hosts'] == ['gpu-mig']
    assert sorted(out['gpus_8']['hosts']) == ['gpu-a', 'gpu-cp', 'gpu-mig']
    # the default pool: every Node listed once, the NVIDIA GPU Nodes kept (_fleet.is_gpu_node)
    assert [(r['query'].get('labelSelector')) for r in node_lists(cluster)] == [None]
    assert cluster.mutating_requests() == []

    # Named by an address that differs from the Node name, authenticated by K8S_AUTH_* alone (no kubeconfig),
    # cached: the second run reads no Node.
    cache_dir = tmp_path / 'cache'
    env = {'K8S_AUTH_HOST': cluster.url, 'K8S_AUTH_API_KEY': cluster.cp.tokens['gpufleet-admin'],
           'K8S_AUTH_SSL_CA_CERT': cluster.cp.ca_path, 'KUBECONFIG': str(tmp_path / 'none')}
    body = {'hostname': ['InternalIP'], 'cache': True, 'cache_plugin': 'ansible.builtin.jsonfile',
            'cache_connection': str(cache_dir), 'cache_timeout': 3600}
    cluster.clear_requests()
    first = listed(inventory(config, body, env))
    assert sorted(first['_meta']['hostvars']) == ['10.9.0.1', '10.9.0.2', '10.9.0.3']
    assert first['_meta']['hostvars']['10.9.0.2']['gpufleet_node_name'] == 'gpu-cp'
    assert len(node_lists(cluster)) == 1
    cluster.clear_requests()
    second = listed(inventory(config, body, env))
    assert second == first and node_lists(cluster) == []

    # The documented example works as shipped (its kubeconfig and cache directory here).
    example = yaml.safe_load((REPO / 'docs' / 'examples' / 'gpu_nodes.yml').read_text())
    example.update(kubeconfig=cluster.kubeconfig, cache_connection=str(tmp_path / 'example-cache'))
    shown = listed(inventory(tmp_path / 'example.gpu_nodes.yml', example))
    assert sorted(shown['gpu_model_NVIDIA_H100_80GB_HBM3']['hosts']) == ['gpu-a', 'gpu-cp']
    assert shown['_meta']['hostvars']['gpu-mig']['ansible_host'] == '10.9.0.3'


def test_default_pool_needs_no_gpu_feature_discovery_and_a_selector_is_used_as_given(cluster, tmp_path):
    """Issue 39 item 9: on a cluster without GPU Feature Discovery no Node carries nvidia.com/gpu.present, so the old
    default selector made an empty inventory. Unset, the hosts are the Nodes with NVIDIA GPU capacity (or the
    GFD/NFD label, or this collection's annotations); an explicit selector, the empty one too, is used as given and
    cached apart from the default. The platform group is the label's, else unknown (no DMI on a Node)."""
    cluster.apply([
        f.node('gpu-bare', allocatable={'nvidia.com/gpu': '8'}),
        f.node('gpu-mig', allocatable={'nvidia.com/mig-3g.40gb': '2'}, labels={'gpufleet.io/platform': 'dgx-a100'}),
        f.node('gpu-upgrading', annotations={'gpufleet.io/upgrade-state': 'drained'}),
        f.node('cpu-x'),
    ])
    config = tmp_path / 'gpu_nodes.yml'
    body = {'kubeconfig': cluster.kubeconfig, 'cache': True, 'cache_plugin': 'ansible.builtin.jsonfile',
            'cache_connection': str(tmp_path / 'cache'), 'cache_timeout': 3600}
    out = listed(inventory(config, body))
    assert sorted(out['gpu_nodes']['hosts']) == ['gpu-bare', 'gpu-mig', 'gpu-upgrading']
    assert sorted(out['gpufleet_platform_unknown']['hosts']) == ['gpu-bare', 'gpu-upgrading']
    assert out['gpufleet_platform_dgx_a100']['hosts'] == ['gpu-mig']
    every = listed(inventory(config, dict(body, node_selector='')))
    assert sorted(every['gpu_nodes']['hosts']) == ['cpu-x', 'gpu-bare', 'gpu-mig', 'gpu-upgrading']
    cluster.clear_requests()
    chosen = listed(inventory(config, dict(body, node_selector='gpufleet.io/platform=dgx-a100')))
    assert chosen['gpu_nodes']['hosts'] == ['gpu-mig']
    assert [r['query'].get('labelSelector') for r in node_lists(cluster)] == ['gpufleet.io/platform=dgx-a100']


def test_bad_source_and_unreachable_api_are_clear_errors(cluster, tmp_path):
    cluster.apply([f.gpu_node('gpu-a')])
    config = tmp_path / 'gpu_nodes.yml'
    bad = inventory(config, {'kubeconfig': cluster.kubeconfig, 'hostname': ['PodIP']}, check=False)
    assert bad.returncode != 0 and "hostname: 'PodIP' is not a source" in bad.stderr and 'Traceback' not in bad.stderr
    token = cluster.cp.tokens['gpufleet-admin']
    down = inventory(config, {'host': 'https://127.0.0.1:9', 'api_key': token, 'validate_certs': False,
                              'request_timeout': 2}, check=False)
    assert down.returncode != 0 and 'cannot list the Nodes' in down.stderr and 'Traceback' not in down.stderr
    assert token not in down.stderr
