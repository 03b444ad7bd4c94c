"""The read-only modules of issue 6 fed from a Kubernetes API (read and written with the real kubectl),
as the roles will feed them: SUC Plans applied with kubectl and matched against the nodes by the real
API server's selector code; the intake gate before and after a quota is opened (the real control plane,
tests/cluster); the stale-driver recovery plan before and after the driver DaemonSet is recreated (new UID): on the
real cluster the DaemonSet controller computes the DaemonSet's status from the pods, and a recreated
DaemonSet with the same selector adopts the orphaned pods at once (their owner reference then carries the
new UID), so the stale pod is the current DaemonSet's again and still the candidate (the "owned by an older
DaemonSet" branch, a state a live cluster holds only for moments, is unit-tested)."""
from __future__ import annotations

import json
import subprocess

from cluster import fixtures as f
from cluster.client import FIXED

TGT = 'v1.36.1+rke2r1'
CUR = 'v1.35.3+rke2r3'
NS = 'nvidia-dra-driver-gpu'
DS_NAME = 'nvidia-dra-driver-gpu-kubelet-plugin'


def kubectl(emu, *args):
    res = subprocess.run(['kubectl', '--kubeconfig', emu.kubeconfig, *args], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _read_task(name, emu, *args):
    """A playbook task that reads objects with kubectl and parses them (what a role does with k8s_info)."""
    return {'name': name, 'ansible.builtin.command': {'argv': ['kubectl', '--kubeconfig', emu.kubeconfig, 'get',
                                                               *args, '-o', 'json']},
            'register': name, 'changed_when': False}


def _selector_string(match_expressions):
    parts = []
    for e in match_expressions:
        if e['operator'] == 'In':
            parts.append('%s in (%s)' % (e['key'], ','.join(e['values'])))
        elif e['operator'] == 'DoesNotExist':
            parts.append('!%s' % e['key'])
        else:
            raise AssertionError('unexpected operator %r' % e['operator'])
    return ','.join(parts)


def test_suc_plans_applied_with_kubectl_each_select_exactly_its_node(cluster, run_playbook, tmp_path):
    emu = cluster
    servers = ['cp-1', 'cp-2']
    agents = ['gpu-a-%02d' % i for i in range(6)]
    emu.apply([f.namespace('system-upgrade')]
              + [f.node(n, labels={'node-role.kubernetes.io/control-plane': 'true'}) for n in servers]
              + [f.gpu_node(n) for n in agents])
    plans_file = tmp_path / 'plans.yaml'
    nodes = [{'name': n, 'role': 'server'} for n in servers] + [{'name': n, 'role': 'agent'} for n in agents]
    run = run_playbook([{'name': 'rke2', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        {'name': 'render', 'gpufleet.upgrade.suc_plan': {'target_rke2': TGT, 'current_rke2': CUR, 'nodes': nodes},
         'register': 'suc'},
        {'name': 'write', 'ansible.builtin.copy': {
            'dest': str(plans_file), 'mode': '0600',
            'content': "{{ suc.plans | map('ansible.builtin.to_nice_yaml') | join('---\n') }}"}},
        {'name': 'apply', 'ansible.builtin.command': {
            'argv': ['kubectl', '--kubeconfig', emu.kubeconfig, 'apply', '-f', str(plans_file)]}},
    ]}])
    assert run.rc == 0, run.stdout
    stored = {p['metadata']['name']: p for p in emu.list('upgrade.cattle.io/v1', 'Plan', 'system-upgrade')}
    assert len(stored) == 8
    for plan in run.result('render')['plans']:
        got = stored[plan['metadata']['name']]
        assert got['spec'] == plan['spec']  # the API kept every field
        selector = _selector_string(got['spec']['nodeSelector']['matchExpressions'])
        matched = [n['metadata']['name'] for n in emu.list('v1', 'Node', label_selector=selector)]
        assert matched == [plan['metadata']['annotations']['gpufleet.io/node']], (selector, matched)
    # kubectl reads them back, and a second apply changes nothing
    listed = json.loads(kubectl(emu, 'get', 'plans.upgrade.cattle.io', '-n', 'system-upgrade', '-o', 'json'))
    assert sorted(p['metadata']['name'] for p in listed['items']) == sorted(stored)
    assert kubectl(emu, 'apply', '-f', str(plans_file)).count('unchanged') == 8


def _driver_daemonset():
    """The DRA driver's kubelet-plugin DaemonSet, updated OnDelete (with RollingUpdate the real controller
    would itself replace a pod of an older revision that is not Ready, which is the state under test)."""
    ds = f.daemonset(DS_NAME, NS)
    ds['spec']['updateStrategy'] = {'type': 'OnDelete'}
    return ds


def _dra_cluster(emu, pod_ready_since):
    """The DaemonSet and its pods as the real DaemonSet controller makes them (one a node; a pod of the
    test's own beside the controller's would be an excess pod the controller deletes); the one on
    gpu-a-07 is then marked unready since `pod_ready_since` (annotated so KWOK keeps that status).
    Returns the DaemonSet and the name of the stale pod."""
    emu.apply([f.namespace(NS), f.gpu_node('gpu-a-07'), f.gpu_node('gpu-a-08'),
               f.resource_slice('gpu-a-07', devices=0), f.resource_slice('gpu-a-08', devices=8), _driver_daemonset()])
    ds = emu.get('apps/v1', 'DaemonSet', DS_NAME, NS)

    def pods_by_node():
        pods = {p['spec'].get('nodeName'): p for p in emu.list('v1', 'Pod', NS)}
        return pods if {'gpu-a-07', 'gpu-a-08'} <= set(pods) else None

    stale = emu.wait_for(pods_by_node, timeout=60, message='the DaemonSet controller to create its pods')['gpu-a-07']
    name = stale['metadata']['name']
    emu.patch('v1', 'Pod', name, {'metadata': {'annotations': {FIXED: 'fixed'}}}, namespace=NS)
    conditions = [{'type': t, 'status': s, 'lastTransitionTime': pod_ready_since}
                  for t, s in (('PodScheduled', 'True'), ('Initialized', 'True'), ('ContainersReady', 'False'),
                               ('Ready', 'False'))]
    emu.patch('v1', 'Pod', name, {'status': {'conditions': conditions}}, namespace=NS, subresource='status')
    emu.wait_for(lambda: _ready(emu.get('v1', 'Pod', name, NS)) == 'False', timeout=30,
                 message='the stale pod unready')
    return ds, name


def _ready(pod):
    return next((c.get('status') for c in ((pod or {}).get('status') or {}).get('conditions') or []
                 if c.get('type') == 'Ready'), None)


def _dra_play(emu, now, min_unready=600):
    return [{'name': 'postflight', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
        _read_task('node', emu, 'node', 'gpu-a-07'),
        _read_task('slices', emu, 'resourceslices.resource.k8s.io'),
        _read_task('ds', emu, 'daemonset', DS_NAME, '-n', NS),
        _read_task('pods', emu, 'pods', '-n', NS),
        {'name': 'plan', 'gpufleet.upgrade.dra_recovery_plan': {
            'node': '{{ node.stdout | ansible.builtin.from_json }}',
            'resource_slices': '{{ (slices.stdout | ansible.builtin.from_json)["items"] }}',
            'daemonset': '{{ ds.stdout | ansible.builtin.from_json }}',
            'pods': '{{ (pods.stdout | ansible.builtin.from_json)["items"] }}',
            'driver': 'gpu.nvidia.com', 'now': now, 'min_unready_seconds': min_unready}, 'register': 'plan'},
    ]}]


def test_dra_recovery_plan_from_the_api_and_after_the_daemonset_is_recreated(cluster, run_playbook):
    emu = cluster
    ds, stale = _dra_cluster(emu, '2026-07-14T11:40:00Z')
    stale_uid = emu.get('v1', 'Pod', stale, NS)['metadata']['uid']
    emu.clear_requests()
    res = run_playbook(_dra_play(emu, '2026-07-14T12:00:00Z')).result('plan')
    assert res['candidate'] is True, res['conditions']
    assert [(c['name'], c['uid']) for c in res['candidates']] == [(stale, stale_uid)]
    assert res['pods'][0]['unready_seconds'] == 1200
    assert emu.mutating_requests() == []  # read-only: nothing written, nothing deleted
    assert emu.get('v1', 'Pod', stale, NS) is not None

    # The DaemonSet is deleted (orphaning its pods) and recreated: same name, new UID. The real
    # DaemonSet controller adopts the orphaned pods (same selector): the stale pod is the current
    # DaemonSet's, unready as before, so it is still the one candidate.
    kubectl(emu, 'delete', 'daemonset', DS_NAME, '-n', NS, '--cascade=orphan')
    emu.wait_for(lambda: emu.get('apps/v1', 'DaemonSet', DS_NAME, NS) is None, timeout=30,
                 message='the DaemonSet to go')
    emu.apply([_driver_daemonset()], settle=False)
    new_uid = emu.get('apps/v1', 'DaemonSet', DS_NAME, NS)['metadata']['uid']
    assert new_uid != ds['metadata']['uid']

    def adopted():
        pod = emu.get('v1', 'Pod', stale, NS)
        return pod and [o['uid'] for o in pod['metadata'].get('ownerReferences') or []] == [new_uid]

    emu.wait_for(adopted, timeout=60, message='the new DaemonSet to adopt the orphaned pods')
    res = run_playbook(_dra_play(emu, '2026-07-14T12:00:00Z')).result('plan')
    assert res['candidate'] is True, res['conditions']
    assert [(c['name'], c['uid']) for c in res['candidates']] == [(stale, stale_uid)]
