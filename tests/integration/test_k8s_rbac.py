"""Each Kubernetes module's requests stay inside the ClusterRole docs/rbac/modules.yml gives it, on the real
control plane: the module runs as a service account bound to docs/rbac's roles, so the API server's RBAC
authorizer refuses (403) what a role lacks; the proxy's request log is checked against the role too
(rbac_check), and the audit log says what the API server saw."""
from __future__ import annotations

import json

import pytest

import k8s_scenario as S
import rbac_check as R
from cluster import fixtures as f
from cluster import rbac
from k8s_support import KubeVirtStandIn, kubectl, load, play

pytestmark = pytest.mark.slow


class As:
    """`play()`'s view of a cluster whose modules run with another kubeconfig."""

    def __init__(self, kubeconfig):
        self.kubeconfig = kubeconfig


def _run(cluster, run_playbook, kubeconfig, task):
    cluster.clear_requests()
    run = run_playbook(play(As(kubeconfig), task))
    assert run.rc == 0, run.stdout
    reqs = list(cluster.requests)
    assert reqs, 'the module made no request'
    return reqs


def test_gpu_holders_info_stays_inside_the_reader_role(cluster, run_playbook):
    load(cluster)
    role = R.module_roles()['gpu_holders_info']
    kubeconfig = rbac.kubeconfig_for(cluster, role)
    for args in ({}, {'nodes': [S.NODE, S.OTHER]}):
        mark = cluster.audit_mark()
        reqs = _run(cluster, run_playbook, kubeconfig, {'gpufleet.upgrade.gpu_holders_info': args})
        assert R.violations(role, reqs) == []
        events = cluster.audit_events(since=mark, user=rbac.user(rbac.SERVICE_ACCOUNTS[role]))
        assert len(events) == len(reqs)                      # every request reached the API server as the reader
        assert rbac.non_reads(events) == [] and rbac.refused(events) == []


def test_node_drain_stays_inside_the_operator_role(cluster, run_playbook):
    """As the service account docs/rbac/bindings-example.yml binds (reader + operator)."""
    load(cluster)
    role = R.module_roles()['node_drain']
    kubeconfig = rbac.apply_example_bindings(cluster)
    seen = []
    mark = cluster.audit_mark()
    with KubeVirtStandIn(cluster):
        for args in ({'name': S.NODE, 'state': 'drain', 'force': True, 'delete_local_data': True,
                      'vmi_policy': 'stop', 'retry_interval': 0.5},
                     {'name': S.NODE, 'state': 'uncordon'},
                     {'name': S.OTHER, 'state': 'cordon'}):
            reqs = _run(cluster, run_playbook, kubeconfig, {'gpufleet.upgrade.node_drain': args})
            assert R.violations(role, reqs) == []
            seen += reqs
    assert rbac.refused(cluster.audit_events(since=mark, user=rbac.user('gpufleet-upgrade'))) == []
    # disable_eviction deletes pods (bypassing PodDisruptionBudgets): the operator role refuses that
    # (the real authorizer answers 403); the option's own opt-in role allows it.
    disable = {'name': 'disable', 'gpufleet.upgrade.node_drain': {
        'name': S.OTHER, 'state': 'drain', 'disable_eviction': True, 'retry_interval': 0.5}}
    mark = cluster.audit_mark()
    run = run_playbook(play(As(kubeconfig), dict(disable, ignore_errors=True)))
    assert run.result('disable')['_event'] == 'runner_on_failed'
    refused = rbac.refused(cluster.audit_events(since=mark, user=rbac.user('gpufleet-upgrade')))
    assert refused and all(r.startswith('delete /api/v1/namespaces/') and '/pods/' in r for r in refused), refused
    opt_in = R.option_roles()['node_drain']['disable_eviction']
    rbac.bind(cluster, opt_in, sa='gpufleet-upgrade')
    try:
        reqs = _run(cluster, run_playbook, kubeconfig, disable)
    finally:  # cluster-wide bindings outlive the reset between tests
        cluster.delete('rbac.authorization.k8s.io/v1', 'ClusterRoleBinding', 'gpufleet-test-%s-gpufleet-upgrade' % opt_in)
    deletes = [r for r in reqs if r['verb'] == 'DELETE']
    assert deletes and len(R.violations(role, reqs)) == len(deletes)
    assert R.violations([role, opt_in], reqs) == []
    attrs = {(a['verb'], a['resource']) for a in (R.attributes(r['verb'], r['path'], r['query']) for r in seen)}
    # the role is exercised, and it is needed: the reader role would refuse the writes
    assert {('patch', 'nodes'), ('create', 'pods/eviction'), ('patch', 'virtualmachines')} <= attrs
    assert len(R.violations(R.module_roles()['gpu_holders_info'], seen)) > 0


def test_every_read_only_module_reads_only_under_the_reader_role(cluster, run_playbook):
    """Issue 11: the read-only Kubernetes modules (docs/rbac/modules.yml: the reader role's), run as a
    service account bound to that role only; the API server's audit log shows that they made only
    get/list/watch requests and that none was refused."""
    load(cluster)
    role = 'gpufleet-upgrade-reader'
    modules = sorted(m for m, r in R.module_roles().items() if r == role)
    assert modules == ['drain_info', 'fleet_info', 'gpu_holders_info', 'gpu_operator_info', 'node_gate', 'stop_switch_info',
                       'suc_info']
    kubeconfig = rbac.kubeconfig_for(cluster, role)
    tasks = {
        'drain_info': {'nodes': [S.NODE, S.OTHER], 'vmi_policy': 'stop'},
        'fleet_info': {'node_selector': 'nvidia.com/gpu.present=true'},
        'gpu_holders_info': {'nodes': [S.NODE]},
        'gpu_operator_info': {},
        'node_gate': {'node': S.OTHER, 'expected_gpus': {'nvidia.com/gpu': 8}, 'timeout': 5},
        'stop_switch_info': {},
        'suc_info': {'nodes': [S.NODE, S.OTHER]},
    }
    mark = cluster.audit_mark()
    run = run_playbook(play(As(kubeconfig), *({'name': m, 'ignore_errors': True, 'gpufleet.upgrade.%s' % m: tasks[m]}
                                              for m in modules)))
    for m in ('drain_info', 'fleet_info', 'gpu_holders_info', 'gpu_operator_info', 'stop_switch_info', 'suc_info'):
        assert run.result(m)['_event'] == 'runner_on_ok', run.result(m)
    assert sorted(r['name'] for r in run.result('drain_info')['refused']) == ['bare-debug', 'cache-gpu']
    assert run.result('stop_switch_info')['stopped'] is False
    assert run.result('suc_info')['controller']['crd_established'] is True  # the CRD read under the reader role
    # the scenario's gpu-2 has no device plugin pod: the gate's verdict, read with the reader's rights
    assert run.result('node_gate')['msg'].startswith('node gate: FAIL for gpu-2: no device plugin pod')
    events = cluster.audit_events(since=mark, user=rbac.user(rbac.SERVICE_ACCOUNTS[role]))
    assert len(events) >= len(modules)
    assert {e['verb'] for e in events} <= {'get', 'list', 'watch'}, rbac.non_reads(events)
    assert rbac.non_reads(events) == [] and rbac.refused(events) == []
    assert cluster.mutating_requests() == []


def test_who_may_stop_a_rollout_the_stop_role_and_the_reader(cluster, run_playbook):
    """Issue 16: docs/rbac/gpufleet-upgrade-stop.yml, bound with a RoleBinding in gpufleet-system, lets its subject
    set and clear the stop switch and nothing else; the reader role (stop_switch_info's) reads that one ConfigMap
    and may not set it. The real authorizer answers."""
    load(cluster)
    stop = As(rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-stop', sa='oncall', namespace='gpufleet-system'))
    # a reader of its own: the 403s this test provokes stay out of the audit log of the SA other tests check
    reader = As(rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-reader', sa='stop-reader'))
    ns = ('-n', 'gpufleet-system')

    def refused(who, *args):
        cp = kubectl(who, *args, check=False)
        return cp.returncode != 0 and 'forbidden' in cp.stderr.lower()

    try:
        # the reader may not set it
        assert refused(reader, *ns, 'create', 'configmap', 'gpufleet-stop', '--from-literal=reason=x')
        kubectl(stop, *ns, 'create', 'configmap', 'gpufleet-stop', '--from-literal=reason=rack 12', '--from-literal=by=alice')
        run = run_playbook(play(reader, {'name': 'switch', 'gpufleet.upgrade.stop_switch_info': {}}))
        assert run.rc == 0, run.stdout
        res = run.result('switch')
        assert res['stopped'] is True and res['switch']['reason'] == 'rack 12' and res['switch']['set_by'] == 'alice'
        # the stop role reaches no other ConfigMap and no other namespace
        kubectl(cluster, *ns, 'create', 'configmap', 'other', '--from-literal=a=b')
        assert refused(stop, *ns, 'get', 'configmap', 'other')
        assert refused(stop, *ns, 'delete', 'configmap', 'other')
        assert refused(stop, '-n', 'default', 'create', 'configmap', 'gpufleet-stop', '--from-literal=reason=x')
        assert refused(reader, *ns, 'get', 'configmap', 'other')
        kubectl(stop, *ns, 'delete', 'configmap', 'gpufleet-stop')
        run = run_playbook(play(reader, {'name': 'switch', 'gpufleet.upgrade.stop_switch_info': {}}))
        assert run.result('switch')['stopped'] is False and run.result('switch')['switch']['exists'] is False
    finally:  # a switch left behind would stop every later rollout on this control plane
        for name in ('gpufleet-stop', 'other'):
            cluster.delete('v1', 'ConfigMap', name, 'gpufleet-system')


def test_who_may_approve_a_pause_point_the_approve_role_and_the_rollouts_reader(cluster, run_playbook):
    """Issue 16, pause points: docs/rbac/gpufleet-upgrade-approve.yml, bound in gpufleet-approvals, lets its subject
    create an approval; the rollout reads it with gpufleet-upgrade-approvals-reader bound there (get only, nothing
    outside that namespace); neither the stop role (gpufleet-system) nor the reader can approve. The real authorizer
    answers, and the audit log shows pause_approval_info made only GET requests."""
    load(cluster)
    cluster.apply([{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'gpufleet-approvals'}}], settle=False)
    approver = As(rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-approve', sa='approver', namespace='gpufleet-approvals'))
    rollout = As(rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-approvals-reader', sa='pauses',
                                     namespace='gpufleet-approvals'))
    stop = As(rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-stop', sa='oncall', namespace='gpufleet-system'))
    reader = As(rbac.kubeconfig_for(cluster, 'gpufleet-upgrade-reader', sa='stop-reader'))
    digest = 'sha256:' + 'ab12' * 16
    name = 'gpufleet-approve-ab12ab12ab12-batch-2'
    ns = ('-n', 'gpufleet-approvals')

    def refused(who, *args):
        cp = kubectl(who, *args, check=False)
        return cp.returncode != 0 and 'forbidden' in cp.stderr.lower()

    def pause(**args):
        task = {'name': 'pause', 'ignore_errors': True,
                'gpufleet.upgrade.pause_approval_info': dict({'plan_digest': digest, 'batch': 2}, **args)}
        return run_playbook(play(rollout, task)).result('pause')

    try:
        mark = cluster.audit_mark()
        res = pause(wait_timeout=1, wait_interval=0.3, fail_when_not_approved=True)
        assert res['_event'] == 'runner_on_failed' and res['approved'] is False
        assert res['msg'].startswith('batch 2 waits for its approval: create the ConfigMap gpufleet-approvals/%s' % name)
        assert 'not approved within 1s' in res['msg']
        for who in (stop, reader, rollout):
            assert refused(who, *ns, 'create', 'configmap', name, '--from-literal=by=mallory')
        kubectl(approver, *ns, 'create', 'configmap', name, '--from-literal=by=alice')
        res = pause()
        assert res['_event'] == 'runner_on_ok' and res['approved'] is True and res['approval']['approved_by'] == 'alice'
        # an approval of another plan (another digest) approves nothing here
        res = pause(plan_digest='sha256:' + 'cd34' * 16)
        assert res['approved'] is False and res['approval']['name'] == 'gpufleet-approve-cd34cd34cd34-batch-2'
        events = cluster.audit_events(since=mark, user=rbac.user('pauses'))
        # the module's requests: GETs only; the one create in the log is this test's, refused above
        assert events and {e['verb'] for e in events if e['verb'] != 'create'} == {'get'}
        assert [(e['verb'], (e.get('responseStatus') or {}).get('code')) for e in events if e['verb'] != 'get'] == [
            ('create', 403)]
        # the rollout's reader reaches no ConfigMap outside the approvals' namespace
        assert refused(rollout, '-n', 'gpufleet-system', 'get', 'configmap', 'gpufleet-stop')
    finally:
        cluster.delete('v1', 'ConfigMap', name, 'gpufleet-approvals')


def test_snapshot_store_with_the_example_bindings_in_gpufleet_system_only(cluster, run_playbook, tmp_path):
    """Issue 17: docs/rbac/bindings-example.yml binds gpufleet-upgrade-snapshots with a RoleBinding in gpufleet-system:
    the rollout's identity keeps and fetches snapshots there, and reads no Secret of any other namespace."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as sn
    load(cluster)
    kubeconfig = rbac.apply_example_bindings(cluster)
    role = R.module_roles()['snapshot_store']
    assert role == 'gpufleet-upgrade-snapshots'
    path = tmp_path / 'gpu-1--driver_580.130.00.json'
    doc = sn.make_document({'packages': {}, 'pins': {}, 'holds': [], 'boot': {}})
    path.write_text(sn.dump_document(doc))
    args = {'node': S.NODE, 'target': {'driver': '580.130.00'}, 'path': str(path)}
    mark = cluster.audit_mark()
    reqs = _run(cluster, run_playbook, kubeconfig, {'gpufleet.upgrade.snapshot_store': dict(args, state='stored')})
    path.unlink()
    reqs += _run(cluster, run_playbook, kubeconfig, {'gpufleet.upgrade.snapshot_store': dict(
        args, state='fetched', sha256=doc['sha256'])})
    assert path.exists()
    assert R.violations(role, reqs) == []
    assert rbac.refused(cluster.audit_events(since=mark, user=rbac.user('gpufleet-upgrade'))) == []
    cp = kubectl(As(kubeconfig), '-n', 'default', 'get', 'secrets', check=False)
    assert cp.returncode != 0 and 'forbidden' in cp.stderr.lower()


def test_the_gpu_operator_and_snapshot_write_rights_end_at_their_namespace(cluster):
    """Issue 37 (9): gpu_operator_update's pod rights (create, delete) hold in the operator's namespace only and its
    HelmChart patch in kube-system only, bound as docs/rbac says (modules.yml's three roles); the snapshots Role,
    bound by bindings-example.yml, writes Secrets in gpufleet-system only; and no ClusterRoleBinding can take a Role
    beyond its namespace. The real authorizer answers (requests, and SubjectAccessReviews for the CRDs)."""
    from cluster.client import ApiError
    load(cluster)
    roles = R.role_names(R.module_roles()['gpu_operator_update'])
    updater = As(rbac.kubeconfig_for(cluster, roles))
    username = rbac.user(rbac.SERVICE_ACCOUNTS[roles[0]])
    cluster.apply([{'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'victim', 'namespace': ns},
                    'spec': {'containers': [{'name': 'c', 'image': 'busybox'}]}}
                   for ns in ('gpu-operator', 'default')], settle=False)

    def refused(who, *args):
        cp = kubectl(who, *args, check=False)
        return cp.returncode != 0 and 'forbidden' in cp.stderr.lower()

    def can(verb, resource, group='', namespace=None):
        return rbac._can(cluster, username, verb, resource, group, namespace)

    run = ('run', 'p', '--image=busybox', '--restart=Never', '--dry-run=server')
    kubectl(updater, '-n', 'gpu-operator', *run)
    for ns in ('default', 'kube-system', 'gpufleet-system'):
        assert refused(updater, '-n', ns, *run), ns
        assert refused(updater, '-n', ns, 'delete', 'pod', 'victim', '--dry-run=server'), ns
    kubectl(updater, '-n', 'gpu-operator', 'delete', 'pod', 'victim', '--dry-run=server')
    assert cluster.get('v1', 'Pod', 'victim', 'default')
    assert [can(v, 'pods', namespace='gpu-operator') for v in ('create', 'delete')] == [True, True]
    assert [can(v, 'pods', namespace='default') for v in ('create', 'delete')] == [False, False]
    assert not can('create', 'pods')                                     # not cluster-wide either
    assert can('patch', 'helmcharts', 'helm.cattle.io', 'kube-system')
    assert not can('patch', 'helmcharts', 'helm.cattle.io', 'gpu-operator')
    assert not can('patch', 'helmcharts', 'helm.cattle.io', 'default')
    assert can('patch', 'clusterpolicies', 'nvidia.com') and can('patch', 'nvidiadrivers', 'nvidia.com')
    assert can('patch', 'nodes') and not can('delete', 'nodes')

    # the rollout's identity (bindings-example.yml): Secrets in gpufleet-system, none elsewhere
    rollout = As(rbac.apply_example_bindings(cluster))
    secret = ('create', 'secret', 'generic', 's', '--from-literal=a=b', '--dry-run=server')
    kubectl(rollout, '-n', 'gpufleet-system', *secret)
    for ns in ('default', 'gpu-operator', 'kube-system'):
        assert refused(rollout, '-n', ns, *secret), ns
        assert refused(rollout, '-n', ns, 'delete', 'secret', 's', '--dry-run=server'), ns
    assert not rbac._can(cluster, rbac.user('gpufleet-upgrade'), 'create', 'secrets')

    # a Role cannot be bound cluster-wide: the API refuses a ClusterRoleBinding to it
    for name in ('gpufleet-upgrade-gpu-operator-operands', 'gpufleet-upgrade-snapshots'):
        with pytest.raises(ApiError) as exc:
            cluster.api.request('POST', '/apis/rbac.authorization.k8s.io/v1/clusterrolebindings', body={
                'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding',
                'metadata': {'name': 'widen-' + name},
                'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': name},
                'subjects': [{'kind': 'ServiceAccount', 'name': 'gpufleet-upgrade', 'namespace': 'gpufleet-system'}]})
        assert exc.value.status == 422, exc.value


def test_the_node_patch_policy_admits_what_the_collection_writes_and_denies_the_rest(cluster):
    """T3-22 of the 2026-12-06 review: docs/rbac's ValidatingAdmissionPolicy (and its binding, Deny) on the real
    kube-apiserver's CEL, for the identity bindings-example.yml binds: the cordon, gpufleet.io/ annotations, the
    canary label and taint and the GPU Operator's nvidia.com/gpu.deploy.* labels (gpu_operator_update pauses and
    moves operands with them; the policy denied them before) pass; any other label, annotation or taint is denied
    with the policy's message. Another identity is not matched."""
    node = 'policy-n1'
    cluster.apply(f.node(node, labels={'nvidia.com/gpu.deploy.driver': 'true', 'team': 'ml'}), settle=False)
    operator = As(rbac.apply_example_bindings(cluster))
    objs = rbac.docs('gpufleet-upgrade-node-patch-policy') + rbac.docs('gpufleet-upgrade-node-patch-policy-binding')
    assert [o['kind'] for o in objs] == ['ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding']

    def patch(body, who=operator):
        return kubectl(who, 'patch', 'node', node, '--type', 'merge', '-p', json.dumps(body), check=False)

    def label(key, value):
        return {'metadata': {'labels': {key: value}}}

    tries = iter(range(10 ** 6))
    try:
        cluster.apply(objs, settle=False)
        # the policy is enforced once the API server's admission has loaded it (bounded)
        # the policy is enforced once the API server's admission has loaded it (bounded). Each try changes the
        # label: a patch that changes nothing is not admitted at all.
        cluster.wait_for(lambda: patch(label('team', 'try-%d' % next(tries))).returncode != 0, timeout=60,
                         interval=0.2, message='the node-patch policy to be enforced')
        denied = patch(label('team', 'other'))
        assert 'may set or remove only the gpufleet.io/canary and nvidia.com/gpu.deploy.* labels' in denied.stderr
        assert 'ValidatingAdmissionPolicy' in denied.stderr
        # the canary taint first: a merge patch replaces the whole list, and the cordon below makes the node
        # lifecycle controller add its own taint, which the list must then carry
        taints = (cluster.get('v1', 'Node', node)['spec'].get('taints') or [])
        for body in ({'spec': {'taints': taints + [{'key': 'gpufleet.io/canary', 'value': 'true', 'effect': 'NoSchedule'}]}},
                     label('gpufleet.io/canary', 'true'),
                     {'spec': {'unschedulable': True}},
                     {'metadata': {'annotations': {'gpufleet.io/upgrade-state': 'drained'}}},
                     label('nvidia.com/gpu.deploy.driver', 'paused-for-driver-upgrade'),
                     label('nvidia.com/gpu.deploy.device-plugin', 'false'),
                     label('nvidia.com/gpu.deploy.device-plugin', None),
                     {'spec': {'unschedulable': None}}):
            done = patch(body)
            assert done.returncode == 0, (body, done.stderr)
        for body, said in (({'metadata': {'annotations': {'example.com/owner': 'x'}}}, 'annotations under gpufleet.io/'),
                           (label('team', None), 'nvidia.com/gpu.deploy.* labels'),
                           ({'spec': {'taints': [{'key': 'example.com/maintenance', 'effect': 'NoSchedule'}]}},
                            'only the gpufleet.io/canary taint')):
            refused = patch(body)
            assert refused.returncode != 0 and said in refused.stderr, (body, refused.stderr)
        # the policy matches the operator identity only: the test's administrator is not limited
        assert patch(label('team', 'admin'), who=cluster).returncode == 0
        got = cluster.get('v1', 'Node', node)
        assert got['metadata']['labels']['nvidia.com/gpu.deploy.driver'] == 'paused-for-driver-upgrade'
        assert got['metadata']['labels']['team'] == 'admin' and 'nvidia.com/gpu.deploy.device-plugin' not in got['metadata']['labels']
    finally:
        cluster.delete('admissionregistration.k8s.io/v1', 'ValidatingAdmissionPolicyBinding', 'gpufleet-upgrade-node-patch')
        cluster.delete('admissionregistration.k8s.io/v1', 'ValidatingAdmissionPolicy', 'gpufleet-upgrade-node-patch')
        # no later test of this worker meets the policy: wait until the operator identity may set any label again
        cluster.wait_for(lambda: patch(label('team', 'after-%d' % next(tries))).returncode == 0, timeout=60,
                         interval=0.2, message='the node-patch policy to be gone')
        cluster.delete('v1', 'Node', node)
