from __future__ import annotations

import copy
import re

import pytest
from ansible.module_utils.testing import patch_module_args
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpufleet.upgrade.plugins.module_utils._suc_plan import (
    SucPlanError, check_hop, parse_rke2_version, plan_name, render_plans)
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _suc_plan as S
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule
from ansible_collections.gpufleet.upgrade.plugins.modules import suc_plan
from tools.module_exit import ModuleExit, capture_module_exits

CUR = 'v1.35.3+rke2r3'
TGT = 'v1.36.1+rke2r1'


def _problems(**kw):
    with pytest.raises(SucPlanError) as exc:
        render_plans(**kw)
    return exc.value.problems


def test_parse_rke2_version_orders_minor_patch_rev():
    assert parse_rke2_version('v1.36.1+rke2r2') > parse_rke2_version('v1.36.1+rke2r1')
    assert parse_rke2_version('v1.36.10+rke2r1') > parse_rke2_version('v1.36.9+rke2r9')
    assert str(parse_rke2_version('v1.36.1+rke2r1')) == 'v1.36.1+rke2r1'
    # the shared rule (_rke2) accepts the tag without its leading v; Plans always carry it
    assert str(parse_rke2_version('1.36.1+rke2r1')) == 'v1.36.1+rke2r1'


@pytest.mark.parametrize('bad,why', [
    ('v1.36.1', 'expected v1.MINOR.PATCH+rke2rREV'), ('v1.36.1-rke2r1', 'pre-release versions are not allowed'),
    ('v1.36+rke2r1', 'expected v1.MINOR.PATCH+rke2rREV'), ('v2.1.1+rke2r1', 'the major version must be 1'),
    ('', 'expected v1.MINOR.PATCH+rke2rREV')])
def test_parse_rejects_other_forms_naming_field(bad, why):
    with pytest.raises(SucPlanError) as exc:
        parse_rke2_version(bad, 'target_rke2')
    assert exc.value.problems == ['target_rke2: "%s" is not a valid RKE2 version: %s' % (bad, why)]


@pytest.mark.parametrize('bad', [None, 136])
def test_parse_rejects_non_strings(bad):
    with pytest.raises(SucPlanError) as exc:
        parse_rke2_version(bad, 'current_rke2')
    assert exc.value.problems == ['current_rke2: %r is not an RKE2 version string (expected '
                                  'v1.MINOR.PATCH+rke2rREV)' % (bad,)]


@pytest.mark.parametrize('cur,tgt,word', [
    ('v1.36.1+rke2r2', 'v1.36.1+rke2r1', 'RKE2 downgrade is not allowed'),
    ('v1.36.2+rke2r1', 'v1.36.1+rke2r9', 'RKE2 downgrade is not allowed'),
    ('v1.36.1+rke2r1', 'v1.35.9+rke2r9', 'RKE2 downgrade is not allowed'),
    ('v1.34.1+rke2r1', 'v1.36.1+rke2r1', 'cannot skip a Kubernetes minor (skips 1.35;'),
    ('v1.33.1+rke2r1', 'v1.36.1+rke2r1', 'cannot skip a Kubernetes minor (skips 1.34, 1.35;'),
])
def test_check_hop_refuses(cur, tgt, word):
    msg = check_hop(parse_rke2_version(cur), parse_rke2_version(tgt), 'node x')
    assert msg is not None and word in msg and cur in msg and tgt in msg


@pytest.mark.parametrize('cur,tgt', [(CUR, TGT), ('v1.36.1+rke2r1', 'v1.36.1+rke2r2'),
                                     ('v1.36.1+rke2r1', 'v1.36.3+rke2r1'), (TGT, TGT)])
def test_check_hop_allows(cur, tgt):
    assert check_hop(parse_rke2_version(cur), parse_rke2_version(tgt), 'n') is None


@given(st.tuples(st.integers(0, 40), st.integers(0, 20), st.integers(1, 9)),
       st.tuples(st.integers(0, 40), st.integers(0, 20), st.integers(1, 9)))
def test_check_hop_property(a, b):
    cur = parse_rke2_version('v1.%d.%d+rke2r%d' % a)
    tgt = parse_rke2_version('v1.%d.%d+rke2r%d' % b)
    allowed = check_hop(cur, tgt, 'n') is None
    assert allowed == (b >= a and b[0] <= a[0] + 1)


def test_render_one_plan_per_node_servers_then_agents():
    res = render_plans(nodes=[{'name': 'cp-1', 'role': 'server'}, {'name': 'cp-2', 'role': 'server'},
                              {'name': 'gpu-a-01', 'role': 'agent'}, {'name': 'gpu-b-01', 'role': 'agent'}],
                       target_rke2=TGT, current_rke2=CUR)
    assert [p['metadata']['name'] for p in res.plans] == [
        'gpufleet-rke2-server-cp-1', 'gpufleet-rke2-server-cp-2',
        'gpufleet-rke2-agent-gpu-a-01', 'gpufleet-rke2-agent-gpu-b-01']
    for seq, (plan, node) in enumerate(zip(res.plans, ['cp-1', 'cp-2', 'gpu-a-01', 'gpu-b-01']), start=1):
        assert plan['apiVersion'] == 'upgrade.cattle.io/v1' and plan['kind'] == 'Plan'
        assert plan['metadata']['namespace'] == 'system-upgrade'
        assert plan['metadata']['annotations']['gpufleet.io/sequence'] == str(seq)
        spec = plan['spec']
        assert spec['concurrency'] == 1 and spec['exclusive'] is True and spec['cordon'] is True
        assert spec['version'] == TGT
        assert spec['upgrade'] == {'image': 'rancher/rke2-upgrade'}
        assert spec['serviceAccountName'] == 'system-upgrade'
        exprs = spec['nodeSelector']['matchExpressions']
        assert exprs[0] == {'key': 'kubernetes.io/hostname', 'operator': 'In', 'values': [node]}
        assert 'drain' not in spec and 'channel' not in spec
    server, agent = res.plans[1]['spec'], res.plans[2]['spec']
    assert server['nodeSelector']['matchExpressions'][1] == {
        'key': 'node-role.kubernetes.io/control-plane', 'operator': 'In', 'values': ['true']}
    assert server['tolerations'][0]['key'] == 'CriticalAddonsOnly' and 'prepare' not in server
    assert agent['nodeSelector']['matchExpressions'][1] == {
        'key': 'node-role.kubernetes.io/control-plane', 'operator': 'DoesNotExist'}
    # agents wait for the last server Plan
    assert agent['prepare'] == {'image': 'rancher/rke2-upgrade', 'args': ['prepare', 'gpufleet-rke2-server-cp-2']}
    assert [(n.name, n.action, n.sequence) for n in res.nodes] == [
        ('cp-1', 'plan', 1), ('cp-2', 'plan', 2), ('gpu-a-01', 'plan', 3), ('gpu-b-01', 'plan', 4)]
    assert res.notes == []


def test_every_plan_selects_exactly_one_hostname():
    nodes = [{'name': 'gpu-%02d' % i, 'role': 'agent'} for i in range(40)]
    res = render_plans(nodes=nodes, target_rke2=TGT, current_rke2=CUR, control_plane_rke2=TGT)
    assert len(res.plans) == 40
    selected = []
    for plan in res.plans:
        host = [e for e in plan['spec']['nodeSelector']['matchExpressions'] if e['key'] == 'kubernetes.io/hostname']
        assert len(host) == 1 and host[0]['operator'] == 'In' and len(host[0]['values']) == 1
        selected.append(host[0]['values'][0])
    assert selected == [n['name'] for n in nodes]
    assert len({p['metadata']['name'] for p in res.plans}) == 40


def test_up_to_date_nodes_get_no_plan_and_per_node_current_overrides():
    res = render_plans(nodes=[{'name': 'a', 'role': 'agent', 'current_rke2': TGT},
                              {'name': 'b', 'role': 'agent'}],
                       target_rke2=TGT, current_rke2=CUR, server_plan='server-plan')
    assert [(n.name, n.action) for n in res.nodes] == [('a', 'up_to_date'), ('b', 'plan')]
    assert len(res.plans) == 1 and res.plans[0]['spec']['prepare']['args'] == ['prepare', 'server-plan']
    assert res.plans[0]['metadata']['annotations']['gpufleet.io/sequence'] == '1'
    assert any('control_plane_rke2 not given' in n for n in res.notes)


def test_all_up_to_date_notes_it():
    res = render_plans(nodes=[{'name': 'a', 'role': 'agent'}], target_rke2=TGT, current_rke2=TGT)
    assert res.plans == [] and res.notes == ['every node already runs %s: no Plan to apply' % TGT]


def test_agents_without_server_plan_are_noted():
    res = render_plans(nodes=[{'name': 'a', 'role': 'agent'}], target_rke2=TGT, current_rke2=CUR,
                       control_plane_rke2=TGT)
    assert 'prepare' not in res.plans[0]['spec']
    assert res.notes == ['agent Plans have no prepare step: no server Plan in this set and server_plan not given']


def test_refuses_downgrade_and_skip_for_each_node_listing_all():
    probs = _problems(nodes=[{'name': 'a', 'role': 'agent', 'current_rke2': 'v1.36.2+rke2r1'},
                             {'name': 'b', 'role': 'agent', 'current_rke2': 'v1.34.9+rke2r1'},
                             {'name': 'c', 'role': 'agent'}],
                      target_rke2=TGT, current_rke2=CUR)
    assert len(probs) == 2
    assert probs[0] == ("node 'a': v1.36.2+rke2r1 → v1.36.1+rke2r1: RKE2 downgrade is not allowed (restore through "
                        "the platform recovery procedure instead)")
    assert probs[1] == ("node 'b': v1.34.9+rke2r1 → v1.36.1+rke2r1: RKE2 upgrade cannot skip a Kubernetes minor "
                        "(skips 1.35; upgrade one minor at a time)")


def test_refuses_missing_current_version():
    probs = _problems(nodes=[{'name': 'a', 'role': 'agent'}], target_rke2=TGT)
    assert probs == ["nodes[0].current_rke2: node 'a' has no current RKE2 version and current_rke2 is not set; "
                     "a downgrade or minor skip cannot be ruled out"]


def test_refuses_server_after_agent_and_duplicates_and_bad_role():
    probs = _problems(nodes=[{'name': 'g1', 'role': 'agent'}, {'name': 'cp', 'role': 'server'},
                             {'name': 'g1', 'role': 'agent'}, {'name': 'x', 'role': 'worker'}],
                      target_rke2=TGT, current_rke2=CUR)
    assert "nodes[1]: server 'cp' comes after agent 'g1' (nodes[0]); RKE2 upgrades every server before any agent" \
        in probs
    assert "nodes[2].name: node 'g1' appears twice (also nodes[0]); each node gets exactly one Plan" in probs
    assert "nodes[3].role: 'worker' for node 'x' must be one of server, agent" in probs


def test_refuses_agents_newer_than_control_plane():
    probs = _problems(nodes=[{'name': 'g1', 'role': 'agent'}], target_rke2=TGT, current_rke2=CUR,
                      control_plane_rke2=CUR)
    assert probs == ['control_plane_rke2: the control plane runs v1.35.3+rke2r3, older than target '
                     'v1.36.1+rke2r1; agents may not be newer than the control plane: upgrade the servers first']


@pytest.mark.parametrize('kw,expected', [
    ({'target_rke2': 'latest'}, 'target_rke2: "latest" is not a valid RKE2 version'),
    ({'current_rke2': 'v1.35'}, 'current_rke2: "v1.35" is not a valid RKE2 version'),
    ({'namespace': 'System_Upgrade'}, "namespace: 'System_Upgrade' is not a DNS-1123 label"),
    ({'image': 'rancher/rke2-upgrade:v1.36.1-rke2r1'}, 'image: ' + repr('rancher/rke2-upgrade:v1.36.1-rke2r1')),
    ({'nodes': []}, 'nodes: [] must be a non-empty list'),
])
def test_bad_inputs_name_field_and_value(kw, expected):
    args = dict(nodes=[{'name': 'a', 'role': 'agent'}], target_rke2=TGT, current_rke2=CUR)
    args.update(kw)
    probs = _problems(**args)
    assert any(p.startswith(expected) for p in probs), probs


def test_drain_options_rendered_in_suc_field_names():
    res = render_plans(nodes=[{'name': 'a', 'role': 'agent'}], target_rke2=TGT, current_rke2=CUR,
                       control_plane_rke2=TGT,
                       drain={'timeout': 600, 'grace_period': 30, 'delete_emptydir_data': True,
                              'ignore_daemonsets': True, 'force': False, 'disable_eviction': None,
                              'skip_wait_for_delete_timeout': 60})
    assert res.plans[0]['spec']['drain'] == {'timeout': '600s', 'gracePeriod': 30, 'deleteEmptydirData': True,
                                             'ignoreDaemonSets': True, 'force': False,
                                             'skipWaitForDeleteTimeout': 60}


def test_plan_names_are_dns_labels_and_unique():
    long = 'gpu-node-' + 'x' * 80 + '.rack7.example.com'
    n1 = plan_name('gpufleet-rke2', 'agent', long)
    n2 = plan_name('gpufleet-rke2', 'agent', long + 'y')
    n3 = plan_name('gpufleet-rke2', 'agent', 'GPU.Node_1')
    for n in (n1, n2, n3):
        assert len(n) <= 63 and re.match(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$', n), n
    assert n1 != n2
    assert n3.startswith('gpufleet-rke2-agent-gpu-node-1-') and n3 != plan_name('gpufleet-rke2', 'agent', 'gpu-node-1')
    assert plan_name('p', 'server', 'cp-1') == 'p-server-cp-1'


# ------------------------------------------------------------------------------- applying
from ansible_collections.gpufleet.upgrade.plugins.module_utils._suc_plan import (  # noqa: E402
    apply_plans, merge_patch, plan_path)


@pytest.mark.parametrize('cur,want,patch', [
    ({'a': 1}, {'a': 1}, None),
    ({'a': 1}, {'a': 2}, {'a': 2}),
    ({'a': 1, 'drain': {'force': True}}, {'a': 1}, {'drain': None}),
    ({'drain': {'force': True, 'timeout': '60s'}}, {'drain': {'force': True}}, {'drain': {'timeout': None}}),
    ({'l': [1, 2]}, {'l': [1]}, {'l': [1]}),
    ({}, {'x': {'y': 1}}, {'x': {'y': 1}}),
])
def test_merge_patch(cur, want, patch):
    assert merge_patch(cur, want) == patch


class FakePlanClient:
    """A dict store with the three calls apply_plans makes (one function's unit test)."""

    def __init__(self, objs=()):
        self.store = {plan_path(o['metadata']['namespace'], o['metadata']['name']): o for o in objs}
        self.writes = []

    def get_or_none(self, path):
        return copy.deepcopy(self.store.get(path))

    def post(self, path, body):
        self.writes.append(('POST', path))
        self.store[plan_path(body['metadata']['namespace'], body['metadata']['name'])] = copy.deepcopy(body)

    def update(self, path, compute):
        patch = compute(copy.deepcopy(self.store[path]))
        self.writes.append(('PATCH', path, patch))
        obj = self.store[path]
        for part in ('labels', 'annotations'):
            have = obj['metadata'].setdefault(part, {})
            for key, value in ((patch.get('metadata') or {}).get(part) or {}).items():
                if value is None:
                    have.pop(key, None)
                else:
                    have[key] = value
        if 'spec' in patch:
            obj['spec'] = _apply_merge(obj['spec'], patch['spec'])


def _apply_merge(target, patch):
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _apply_merge(out.get(k), v)
    return out


def _two_plans(**kw):
    return render_plans(nodes=[{'name': 'cp-1', 'role': 'server'}, {'name': 'g-1', 'role': 'agent'}],
                        target_rke2=TGT, current_rke2=CUR, **kw).plans


def test_apply_creates_then_is_idempotent_then_updates_minimal_patch():
    client = FakePlanClient()
    res = apply_plans(client, _two_plans())
    assert res.changed and [a['action'] for a in res.applied] == ['created', 'created']
    assert [w[0] for w in client.writes] == ['POST', 'POST']
    client.writes.clear()
    res = apply_plans(client, _two_plans())
    assert not res.changed and [a['action'] for a in res.applied] == ['unchanged', 'unchanged']
    assert client.writes == []
    res = apply_plans(client, _two_plans(drain={'force': True}))
    assert [a['action'] for a in res.applied] == ['updated', 'updated']
    assert client.writes[0][2] == {'spec': {'drain': {'force': True}}}
    assert res.before['system-upgrade/gpufleet-rke2-server-cp-1']['spec'].get('drain') is None
    client.writes.clear()
    apply_plans(client, _two_plans())  # drain removed again: set to null
    assert client.writes[0][2] == {'spec': {'drain': None}}
    assert 'drain' not in client.store[plan_path('system-upgrade', 'gpufleet-rke2-server-cp-1')]['spec']


def test_apply_check_mode_reads_only():
    client = FakePlanClient()
    res = apply_plans(client, _two_plans(), check_mode=True)
    assert res.changed and [a['action'] for a in res.applied] == ['created', 'created'] and client.writes == []


def test_apply_refuses_foreign_plan_before_writing_anything():
    foreign = copy.deepcopy(_two_plans()[1])
    del foreign['metadata']['labels']['app.kubernetes.io/managed-by']
    client = FakePlanClient([foreign])
    with pytest.raises(SucPlanError) as exc:
        apply_plans(client, _two_plans())
    assert exc.value.problems == ['Plan system-upgrade/gpufleet-rke2-agent-g-1 exists and is not managed by '
                                  'gpufleet.upgrade (label app.kubernetes.io/managed-by); refusing to change it']
    assert client.writes == []


def test_apply_keeps_foreign_labels_and_annotations():
    plan = copy.deepcopy(_two_plans()[0])
    plan['metadata']['labels']['team'] = 'platform'
    plan['metadata']['annotations']['note'] = 'x'
    client = FakePlanClient([plan])
    res = apply_plans(client, _two_plans()[:1])
    assert not res.changed and client.writes == []


# ------------------------------------------------------------------ waiting for one node's Plan
def _plan_obj(complete=None, reason=None, message='', latest='v1.36.1-rke2r1', applying=None, phash='h1'):
    status = {'latestVersion': latest, 'latestHash': phash}
    if complete is not None:
        status['conditions'] = [{'type': 'Complete', 'status': complete, 'reason': reason or '', 'message': message}]
    if applying:
        status['applying'] = applying
    return {'metadata': {'name': 'gpufleet-rke2-agent-gpu-1', 'namespace': 'system-upgrade'}, 'status': status}


def _node_obj(kubelet='v1.35.3+rke2r3', label=None):
    labels = {'plan.upgrade.cattle.io/gpufleet-rke2-agent-gpu-1': label} if label else {}
    return {'metadata': {'name': 'gpu-1', 'labels': labels}, 'status': {'nodeInfo': {'kubeletVersion': kubelet}}}


def test_progress_done_only_with_complete_label_and_kubelet():
    tgt = 'v1.36.1+rke2r1'
    done = S.plan_progress(_plan_obj('True', 'Complete'), _node_obj(tgt, 'h1'), tgt)
    assert done.done and done.failed is None and done.kubelet_version == tgt
    # Complete from an older version (latestVersion not yet the target): keep waiting.
    stale = S.plan_progress(_plan_obj('True', 'Complete', latest='v1.35.3-rke2r3'), _node_obj(tgt, 'h1'), tgt)
    assert not stale.done and stale.failed is None
    # Kubelet at target but no completion label yet: keep waiting.
    assert not S.plan_progress(_plan_obj('False', 'SyncJob', applying=['gpu-1']), _node_obj(tgt), tgt).done
    # Label of another hash: not done.
    assert not S.plan_progress(_plan_obj('True', 'Complete'), _node_obj(tgt, 'old'), tgt).done


def test_progress_fails_fast_on_job_failed_and_on_a_plan_that_missed_the_node():
    tgt = 'v1.36.1+rke2r1'
    failed = S.plan_progress(_plan_obj('False', 'JobFailed', 'Job x failed on Node gpu-1: BackoffLimitExceeded'),
                             _node_obj(), tgt)
    assert failed.failed == 'the upgrade Job failed: Job x failed on Node gpu-1: BackoffLimitExceeded'
    missed = S.plan_progress(_plan_obj('True', 'Complete'), _node_obj(), tgt)
    assert 'completed without upgrading node gpu-1' in missed.failed and 'role labels' in missed.failed
    assert S.plan_progress(None, _node_obj(), tgt).failed.startswith('the Plan does not exist')
    assert S.plan_progress(_plan_obj(), None, tgt).failed == 'the Node does not exist'
    assert missed.summary == ('Plan gpufleet-rke2-agent-gpu-1: Complete=True (Complete), latestVersion '
                              'v1.36.1-rke2r1, applying -; node gpu-1 kubeletVersion v1.35.3+rke2r3')


class _FakeClient:
    def __init__(self, plans, nodes):
        self.plans, self.nodes, self.reads = list(plans), list(nodes), 0

    def get_or_none(self, path):
        self.reads += 1
        if '/plans/' in path:
            return self.plans.pop(0) if len(self.plans) > 1 else self.plans[0]
        return self.nodes.pop(0) if len(self.nodes) > 1 else self.nodes[0]


def test_wait_is_bounded_and_returns_when_done():
    tgt = 'v1.36.1+rke2r1'
    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s
    plan = S.render_plans([{'name': 'gpu-1', 'role': 'agent'}], tgt, 'v1.35.3+rke2r3').plans[0]
    stuck = _FakeClient([_plan_obj('False', 'SyncJob', applying=['gpu-1'])], [_node_obj()])
    progress, waited = S.wait_for_plan(stuck, plan, 'gpu-1', tgt, timeout=25, interval=10,
                                       clock=lambda: now[0], sleep=sleep)
    assert not progress.done and progress.failed.startswith('not complete after 25s (wait_timeout): Plan ')
    assert sleeps == [10, 10, 5] and waited == 25
    now[0] = 0.0
    ok = _FakeClient([_plan_obj('False', 'SyncJob', applying=['gpu-1']), _plan_obj('True', 'Complete')],
                     [_node_obj(), _node_obj(tgt, 'h1')])
    progress, waited = S.wait_for_plan(ok, plan, 'gpu-1', tgt, timeout=60, interval=2, clock=lambda: now[0], sleep=sleep)
    assert progress.done and waited == 2
    with pytest.raises(S.SucPlanError, match='must be positive'):
        S.wait_for_plan(ok, plan, 'gpu-1', tgt, timeout=0, interval=1)


def test_cordon_false_is_rendered():
    plans = S.render_plans([{'name': 'gpu-1', 'role': 'agent'}], 'v1.36.1+rke2r1', 'v1.35.3+rke2r3', cordon=False).plans
    assert plans[0]['spec']['cordon'] is False


def test_unfinished_plans_block_the_next_one():
    tgt = 'v1.36.1+rke2r1'
    done, running = (S.render_plans([{'name': n, 'role': 'agent'}], tgt, 'v1.35.3+rke2r3').plans[0]
                     for n in ('gpu-1', 'gpu-2'))
    done['status'] = {'latestVersion': 'v1.36.1-rke2r1', 'conditions': [{'type': 'Complete', 'status': 'True'}]}
    running['status'] = {'latestVersion': 'v1.36.1-rke2r1',
                         'conditions': [{'type': 'Complete', 'status': 'False', 'reason': 'SyncJob'}]}
    foreign = {'metadata': {'name': 'other'}, 'spec': {'version': tgt}}
    assert S.unfinished_plans([done, running, foreign], ['gpufleet-rke2-agent-gpu-3']) == [
        'Plan system-upgrade/gpufleet-rke2-agent-gpu-2 (node gpu-2) is not complete (Complete=False, SyncJob)']
    assert S.unfinished_plans([done, running], ['gpufleet-rke2-agent-gpu-2']) == []
    # Complete for an older version is not complete for the new one.
    done['spec']['version'] = 'v1.36.2+rke2r1'
    assert len(S.unfinished_plans([done], [])) == 1


# ------------------------------------------------------------ one Plan at a time, each waited for
class _SequenceClient(FakePlanClient):
    """FakePlanClient plus the Plan list and Nodes, with a stand-in controller: a written Plan
    completes at once and upgrades its node, unless the node is in `fail` (its Job fails)."""

    def __init__(self, objs=(), fail=()):
        super().__init__(objs)
        self.fail = set(fail)
        self.events = []
        self.broken_patch = False

    def list_all(self, path, query=None):
        selector = (query or {}).get('labelSelector')
        self.events.append(('LIST', path, selector))
        # the two terms the code sends: key=value and !key
        terms = [t.split('=', 1) if '=' in t else (t, None) for t in (selector or '').split(',') if t]
        return [copy.deepcopy(o) for p, o in sorted(self.store.items()) if p.startswith(path + '/')
                and all((o['metadata'].get('labels') or {}).get(k.lstrip('!')) == v if not k.startswith('!')
                        else k[1:] not in (o['metadata'].get('labels') or {}) for k, v in terms)]

    def patch(self, path, body):
        self.events.append(('MARK', path.rsplit('/', 1)[1], body))
        if self.broken_patch:
            raise K8sError('PATCH %s: 503 Service Unavailable' % path, status=503, method='PATCH', path=path)
        self.store[path]['metadata'].setdefault('labels', {}).update(body['metadata']['labels'])

    def post(self, path, body):
        self.events.append(('POST', body['metadata']['name']))
        super().post(path, body)
        node = body['metadata']['annotations']['gpufleet.io/node']
        obj = self.store[plan_path(body['metadata']['namespace'], body['metadata']['name'])]
        if node in self.fail:
            obj['status'] = {'latestVersion': TGT.replace('+', '-'), 'latestHash': 'h1', 'conditions': [
                {'type': 'Complete', 'status': 'False', 'reason': 'JobFailed', 'message': 'Job failed on %s' % node}]}
        else:
            obj['status'] = {'latestVersion': TGT.replace('+', '-'), 'latestHash': 'h1',
                             'conditions': [{'type': 'Complete', 'status': 'True', 'reason': 'Complete'}]}

    def get_or_none(self, path):
        if path.startswith('/api/v1/nodes/'):
            name = path.rsplit('/', 1)[1]
            self.events.append(('GET node', name))
            upgraded = any(o['metadata']['annotations']['gpufleet.io/node'] == name and
                           (o.get('status') or {}).get('conditions', [{}])[0].get('status') == 'True'
                           for o in self.store.values())
            labels = {'plan.upgrade.cattle.io/%s' % o['metadata']['name']: 'h1' for o in self.store.values()
                      if o['metadata']['annotations']['gpufleet.io/node'] == name} if upgraded else {}
            return {'metadata': {'name': name, 'labels': labels},
                    'status': {'nodeInfo': {'kubeletVersion': TGT if upgraded else CUR}}}
        return super().get_or_none(path)


def _sequence(client, plans, **kw):
    return S.apply_one_at_a_time(client, plans, 'system-upgrade', TGT, timeout=kw.pop('timeout', 30),
                                 interval=kw.pop('interval', 5), clock=lambda: 0.0, sleep=lambda s: None)


def test_sequence_writes_each_plan_after_the_previous_node_is_done():
    client = _SequenceClient()
    out = _sequence(client, _two_plans())
    assert out.msg is None and not out.refused and out.problems == []
    assert client.events[0] == ('LIST', '/apis/upgrade.cattle.io/v1/namespaces/system-upgrade/plans',
                                'app.kubernetes.io/managed-by=gpufleet.upgrade,!gpufleet.io/rke2-complete')
    # The agent's Plan is written only once the server's node runs the target; each finished Plan is marked.
    mark = {'metadata': {'labels': {'gpufleet.io/rke2-complete': 'v1.36.1-rke2r1'}}}
    assert [e for e in client.events if e[0] != 'LIST'] == [
        ('POST', 'gpufleet-rke2-server-cp-1'), ('GET node', 'cp-1'), ('MARK', 'gpufleet-rke2-server-cp-1', mark),
        ('POST', 'gpufleet-rke2-agent-g-1'), ('GET node', 'g-1'), ('MARK', 'gpufleet-rke2-agent-g-1', mark)]
    assert out.warnings == []
    assert out.applied.changed and [a['action'] for a in out.applied.applied] == ['created', 'created']
    assert sorted(out.applied.after) == ['system-upgrade/gpufleet-rke2-agent-g-1',
                                         'system-upgrade/gpufleet-rke2-server-cp-1']
    assert [(w['name'], w['node'], w['done'], w['kubelet_version']) for w in out.waited] == [
        ('gpufleet-rke2-server-cp-1', 'cp-1', True, TGT), ('gpufleet-rke2-agent-g-1', 'g-1', True, TGT)]


def test_sequence_lists_only_unmarked_plans_and_a_rewrite_unmarks():
    client = _SequenceClient()
    assert _sequence(client, _two_plans()).msg is None
    # The next node's check lists neither finished Plan; a rerun of the same Plans writes nothing.
    client.events.clear()
    client.writes.clear()
    out = _sequence(client, _two_plans())
    assert out.msg is None and not out.applied.changed and client.writes == []
    assert [e for e in client.events if e[0] in ('LIST', 'MARK')] == [
        ('LIST', '/apis/upgrade.cattle.io/v1/namespaces/system-upgrade/plans', S.UNFINISHED_SELECTOR)]
    assert client.list_all('/apis/upgrade.cattle.io/v1/namespaces/system-upgrade/plans',
                           {'labelSelector': S.UNFINISHED_SELECTOR}) == []
    # A Plan rewritten for another version loses the mark in the same patch: unfinished again, and listed.
    newer = render_plans(nodes=[{'name': 'g-1', 'role': 'agent'}], target_rke2='v1.36.2+rke2r1', current_rke2=TGT,
                         server_plan='gpufleet-rke2-server-cp-1').plans
    existing = client.store[plan_path('system-upgrade', 'gpufleet-rke2-agent-g-1')]
    patch = S._desired_patch(existing, newer[0])
    assert patch['metadata']['labels'] == {'gpufleet.io/rke2-complete': None}
    assert patch['spec']['version'] == 'v1.36.2+rke2r1'
    # A mark that names another version than the spec's (set by hand) is removed, even with the spec unchanged.
    assert S._desired_patch(dict(existing, metadata=dict(existing['metadata'], labels=dict(
        existing['metadata']['labels'], **{'gpufleet.io/rke2-complete': 'v1.35.0-rke2r1'}))), _two_plans()[1]) == {
        'metadata': {'labels': {'gpufleet.io/rke2-complete': None}}}
    assert S._desired_patch(existing, _two_plans()[1]) is None


def test_sequence_a_failed_mark_is_a_warning_not_a_failure():
    client = _SequenceClient()
    client.broken_patch = True
    out = _sequence(client, _two_plans())
    assert out.msg is None and out.error is None and [w['done'] for w in out.waited] == [True, True]
    assert out.warnings == [
        'RKE2 Plan gpufleet-rke2-%s for node %s finished, but labelling it gpufleet.io/rke2-complete=v1.36.1-rke2r1 '
        'failed (PATCH /apis/upgrade.cattle.io/v1/namespaces/system-upgrade/plans/gpufleet-rke2-%s: 503 Service '
        'Unavailable): the next node lists it again' % (role, node, role) for role, node in
        (('server-cp-1', 'cp-1'), ('agent-g-1', 'g-1'))]


def test_sequence_stops_at_the_first_plan_that_fails():
    client = _SequenceClient(fail=['cp-1'])
    out = _sequence(client, _two_plans())
    assert out.msg == ('RKE2 Plan gpufleet-rke2-server-cp-1 for node cp-1: the upgrade Job failed: Job failed on '
                       'cp-1. %s.' % S.RECOVERY_HINT)
    assert not out.refused
    assert ('POST', 'gpufleet-rke2-agent-g-1') not in client.events          # the next Plan is not written
    assert [a['name'] for a in out.applied.applied] == ['gpufleet-rke2-server-cp-1']
    assert [(w['node'], w['done']) for w in out.waited] == [('cp-1', False)]
    assert not [e for e in client.events if e[0] == 'MARK']                  # a failed Plan is never marked


def test_sequence_refuses_while_another_upgrade_is_unfinished():
    other = S.render_plans([{'name': 'g-9', 'role': 'agent'}], TGT, CUR).plans[0]
    other['status'] = {'latestVersion': TGT.replace('+', '-'),
                       'conditions': [{'type': 'Complete', 'status': 'False', 'reason': 'SyncJob'}]}
    client = _SequenceClient([other])
    out = _sequence(client, _two_plans())
    busy = 'Plan system-upgrade/gpufleet-rke2-agent-g-9 (node g-9) is not complete (Complete=False, SyncJob)'
    assert out.refused and out.problems == [busy]
    assert out.msg == ('refusing to write the RKE2 Plan of cp-1, g-1 while another RKE2 upgrade is unfinished: '
                       '%s. %s.' % (busy, S.RECOVERY_HINT))
    assert client.writes == [] and out.waited == [] and not out.applied.changed


def _foreign_agent_plan():
    foreign = copy.deepcopy(_two_plans()[1])
    del foreign['metadata']['labels']['app.kubernetes.io/managed-by']
    return foreign


FOREIGN = ('Plan system-upgrade/gpufleet-rke2-agent-g-1 exists and is not managed by gpufleet.upgrade '
           '(label app.kubernetes.io/managed-by); refusing to change it')


def test_sequence_refuses_a_foreign_plan_before_writing_it():
    client = _SequenceClient([_foreign_agent_plan()])
    out = _sequence(client, _two_plans())
    assert [w[0] for w in client.writes] == ['POST']                          # only the server's Plan
    assert isinstance(out.error, SucPlanError) and out.problems == [FOREIGN] and not out.refused
    assert out.msg == 'RKE2 Plan gpufleet-rke2-agent-g-1 for node g-1: %s' % FOREIGN
    # The server's Plan was written (and waited for) before the refusal: the result says so.
    assert out.applied.changed is True
    assert [(a['name'], a['action']) for a in out.applied.applied] == [('gpufleet-rke2-server-cp-1', 'created')]
    assert list(out.applied.after) == ['system-upgrade/gpufleet-rke2-server-cp-1']
    assert [(w['node'], w['done']) for w in out.waited] == [('cp-1', True)]


class _FailingPostClient(_SequenceClient):
    """_SequenceClient whose API fails the write of the Plan of the nodes in `broken`."""

    def __init__(self, objs=(), broken=()):
        super().__init__(objs)
        self.broken = set(broken)

    def post(self, path, body):
        if body['metadata']['annotations']['gpufleet.io/node'] in self.broken:
            raise K8sError('POST %s: 503 Service Unavailable' % path, status=503, method='POST', path=path)
        super().post(path, body)


def test_sequence_stops_at_an_api_error_keeping_the_plans_written():
    client = _FailingPostClient(broken=['g-1'])
    out = _sequence(client, _two_plans())
    assert isinstance(out.error, K8sError) and out.problems == [] and not out.refused
    assert out.msg == ('RKE2 Plan gpufleet-rke2-agent-g-1 for node g-1: POST /apis/upgrade.cattle.io/v1/namespaces/'
                       'system-upgrade/plans: 503 Service Unavailable')
    assert out.applied.changed is True
    assert [a['name'] for a in out.applied.applied] == ['gpufleet-rke2-server-cp-1']
    assert [(w['node'], w['done']) for w in out.waited] == [('cp-1', True)]


def test_sequence_error_on_the_first_plan_wrote_nothing():
    client = _FailingPostClient(broken=['cp-1'])
    out = _sequence(client, _two_plans())
    assert isinstance(out.error, K8sError) and client.writes == []
    assert out.applied.changed is False and out.applied.applied == [] and out.waited == []


def _run_suc_plan(monkeypatch, client, **args):
    """suc_plan's main() against `client` (state=present, wait=true): its exit or failure result."""
    capture_module_exits(monkeypatch)
    monkeypatch.setattr(K8sModule, 'client', property(lambda self: client))
    params = dict({'state': 'present', 'wait': True, 'wait_timeout': 30, 'wait_interval': 1, 'target_rke2': TGT,
                   'current_rke2': CUR, 'nodes': [{'name': 'cp-1', 'role': 'server'}, {'name': 'g-1', 'role': 'agent'}]},
                  **args)
    with patch_module_args(params):
        with pytest.raises(ModuleExit) as out:
            suc_plan.main()
    return out.value.result


@pytest.mark.parametrize('client,msg,problems', [
    (lambda: _SequenceClient([_foreign_agent_plan()]), 'refusing to apply RKE2 Plans: ' + FOREIGN, [FOREIGN]),
    (lambda: _FailingPostClient(broken=['g-1']), 'applying RKE2 Plans failed: POST /apis/upgrade.cattle.io/v1/'
     'namespaces/system-upgrade/plans: 503 Service Unavailable', None),
])
def test_module_failure_lists_the_plans_written_before_the_error(monkeypatch, client, msg, problems):
    res = _run_suc_plan(monkeypatch, client())
    assert res['failed'] is True and res['msg'] == msg and res.get('problems') == problems
    # The server's Plan was written before the error: changed, and listed.
    assert res['changed'] is True
    assert res['applied'] == [{'name': 'gpufleet-rke2-server-cp-1', 'namespace': 'system-upgrade', 'node': 'cp-1',
                               'action': 'created'}]
    assert [(w['node'], w['done']) for w in res['waited']] == [('cp-1', True)]
    assert [pl['metadata']['name'] for pl in res['plans']] == ['gpufleet-rke2-server-cp-1', 'gpufleet-rke2-agent-g-1']


def test_module_succeeds_with_every_plan_written(monkeypatch):
    res = _run_suc_plan(monkeypatch, _SequenceClient())
    assert res['failed'] is False and res['changed'] is True
    assert [a['name'] for a in res['applied']] == ['gpufleet-rke2-server-cp-1', 'gpufleet-rke2-agent-g-1']


def test_sequence_of_nothing_reads_nothing():
    client = _SequenceClient()
    out = _sequence(client, [])
    assert client.events == [] and out.msg is None and out.waited == [] and not out.applied.changed


# ---- read_versions: what the cluster runs, read before rendering (suc_plan read_cluster)

class FakeNodes:
    def __init__(self, nodes):
        self.nodes = {n['metadata']['name']: n for n in nodes}
        self.queries = []

    def get(self, path, query=None):
        from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import NotFoundError
        name = path.rsplit('/', 1)[1]
        if name not in self.nodes:
            raise NotFoundError('nodes %s not found' % name)
        return self.nodes[name]

    def list_all(self, path, query=None):
        self.queries.append((path, query))
        key, value = query['labelSelector'].split('=', 1)
        return [n for n in self.nodes.values() if n['metadata'].get('labels', {}).get(key) == value]


def _node(name, version, server=False):
    labels = {'node-role.kubernetes.io/control-plane': 'true'} if server else {}
    return {'metadata': {'name': name, 'labels': labels}, 'status': {'nodeInfo': {'kubeletVersion': version}}}


def test_read_versions_reads_each_node_and_the_one_control_plane_version():
    client = FakeNodes([_node('cp-1', 'v1.36.1+rke2r1', True), _node('cp-2', 'v1.36.1+rke2r1', True),
                        _node('gpu-1', 'v1.35.3+rke2r3')])
    currents, running = S.read_versions(client, ['gpu-1'])
    assert currents == {'gpu-1': 'v1.35.3+rke2r3'} and running == 'v1.36.1+rke2r1'
    assert client.queries == [('/api/v1/nodes', {'labelSelector': 'node-role.kubernetes.io/control-plane=true'})]


def test_read_versions_without_control_plane_nodes_says_none():
    assert S.read_versions(FakeNodes([_node('gpu-1', 'v1.35.3+rke2r3')]), ['gpu-1']) == ({'gpu-1': 'v1.35.3+rke2r3'}, None)


def test_read_versions_refuses_a_control_plane_on_mixed_versions():
    client = FakeNodes([_node('cp-1', 'v1.36.1+rke2r1', True), _node('cp-2', 'v1.35.3+rke2r3', True),
                        _node('gpu-1', 'v1.35.3+rke2r3')])
    with pytest.raises(S.SucPlanError, match=r'control plane nodes run different RKE2 versions '
                                             r'\(v1\.35\.3\+rke2r3, v1\.36\.1\+rke2r1\): finish the control plane'):
        S.read_versions(client, ['gpu-1'])


def test_read_nodes_lets_servers_upgrade_one_at_a_time_on_a_mixed_control_plane():
    """Upgrading GPU servers one after the other: the second sees the first at the target, a mixed control plane;
    its own Plan may go on (no agent is upgraded); an agent in the same set is still refused."""
    client = FakeNodes([_node('cp-1', 'v1.36.1+rke2r1', True), _node('gpu-s2', 'v1.35.3+rke2r3', True),
                        _node('gpu-1', 'v1.35.3+rke2r3')])
    currents, roles, running = S.read_nodes(client, ['gpu-s2'])
    assert currents == {'gpu-s2': 'v1.35.3+rke2r3'} and roles['gpu-s2'].role == 'server' and running is None
    with pytest.raises(S.SucPlanError, match=r'finish the control plane upgrade before upgrading agents \(gpu-1\)'):
        S.read_nodes(client, ['gpu-s2', 'gpu-1'])


def test_read_versions_refuses_a_missing_node_by_name():
    with pytest.raises(S.SucPlanError, match='node gpu-9: not found in the API'):
        S.read_versions(FakeNodes([_node('gpu-1', 'v1.35.3+rke2r3')]), ['gpu-9'])


def test_tolerations_reach_every_plan_and_servers_keep_theirs():
    nodes = [{'name': 'cp-1', 'role': 'server'}, {'name': 'gpu-01', 'role': 'agent'}]
    canary = S.taint_tolerations(['gpufleet.io/canary', 'dedicated=gpu'])
    assert canary == [{'key': 'gpufleet.io/canary', 'operator': 'Exists'},
                      {'key': 'dedicated', 'operator': 'Equal', 'value': 'gpu'}]
    res = S.render_plans(nodes, TGT, current_rke2=CUR, tolerations=canary)
    server, agent = [p['spec'] for p in res.plans]
    assert server['tolerations'][0]['key'] == 'CriticalAddonsOnly' and server['tolerations'][1:] == canary
    assert agent['tolerations'] == canary
    assert 'tolerations' not in S.render_plans(nodes[1:], TGT, current_rke2=CUR, control_plane_rke2=TGT).plans[0]['spec']


@pytest.mark.parametrize('tolerations,problem', [
    ('x', "tolerations: 'x' is not a list of tolerations"),
    ([{'key': 'a', 'operator': 'Maybe'}], "tolerations[0]: operator 'Maybe' is not Exists or Equal"),
    ([{'key': 'a', 'effect': 'Sometimes'}], "tolerations[0]: effect 'Sometimes' is not one of"),
    ([{'key': 'a', 'operator': 'Exists', 'value': 'v'}], "tolerations[0]: operator Exists takes no value"),
    ([{'value': 'v'}], 'tolerations[0]: a toleration without a key needs operator Exists'),
    ([{'key': 'a', 'colour': 'red'}], 'tolerations[0]: unknown field(s) colour'),
])
def test_bad_tolerations_are_refused_naming_the_entry(tolerations, problem):
    with pytest.raises(SucPlanError) as exc:
        S.render_plans([{'name': 'gpu-01', 'role': 'agent'}], TGT, current_rke2=CUR, control_plane_rke2=TGT,
                       tolerations=tolerations)
    assert any(p.startswith(problem) for p in exc.value.problems), exc.value.problems


@pytest.mark.parametrize('taints', ['gpufleet.io/canary', [''], ['=v'], [3]])
def test_bad_taints_to_tolerate(taints):
    with pytest.raises(SucPlanError, match='tolerate_taints'):
        S.taint_tolerations(taints)


# ---- the role from the Node (issue 39 item 8, review M9 trap 2)

def test_read_nodes_gives_each_nodes_role_from_its_labels():
    etcd = _node('gpu-2', 'v1.35.3+rke2r3')
    etcd['metadata']['labels'] = {'node-role.kubernetes.io/etcd': 'true'}
    client = FakeNodes([_node('gpu-1', 'v1.35.3+rke2r3', True), etcd, _node('gpu-3', 'v1.35.3+rke2r3')])
    _currents, roles, _running = S.read_nodes(client, ['gpu-1', 'gpu-2', 'gpu-3'])
    assert {n: r.role for n, r in roles.items()} == {'gpu-1': 'server', 'gpu-2': 'server', 'gpu-3': 'agent'}


def test_a_gpu_node_that_is_a_server_gets_a_server_plan_selecting_it_by_its_label():
    etcd = _node('gpu-2', CUR)
    etcd['metadata']['labels'] = {'node-role.kubernetes.io/etcd': 'true'}
    _c, roles, _r = S.read_nodes(FakeNodes([_node('gpu-1', CUR, True), etcd]), ['gpu-1', 'gpu-2'])
    nodes = S.assign_roles([{'name': 'gpu-1'}, {'name': 'gpu-2'}], roles)
    res = render_plans(nodes=nodes, target_rke2=TGT, current_rke2=CUR)
    sel = [p['spec']['nodeSelector']['matchExpressions'][1] for p in res.plans]
    assert [p['metadata']['labels']['gpufleet.io/rke2-upgrade'] for p in res.plans] == ['server', 'server']
    assert sel == [{'key': 'node-role.kubernetes.io/control-plane', 'operator': 'In', 'values': ['true']},
                   {'key': 'node-role.kubernetes.io/etcd', 'operator': 'In', 'values': ['true']}]


def test_a_declared_role_that_is_not_the_nodes_is_refused_naming_both():
    _c, roles, _r = S.read_nodes(FakeNodes([_node('gpu-1', CUR, True), _node('gpu-2', CUR)]), ['gpu-1', 'gpu-2'])
    with pytest.raises(SucPlanError) as exc:
        S.assign_roles([{'name': 'gpu-1', 'role': 'agent'}, {'name': 'gpu-2', 'role': 'agent'}], roles)
    assert exc.value.problems == [
        'nodes[0].role: node gpu-1 is declared an RKE2 agent, but its Node is an RKE2 server (label '
        'node-role.kubernetes.io/control-plane=true); the Node decides: remove the declaration (or correct the '
        "Node's labels)"]


def test_a_node_without_a_role_and_without_reading_the_cluster_is_refused():
    assert _problems(nodes=[{'name': 'gpu-1'}], target_rke2=TGT, current_rke2=CUR) == [
        "nodes[0].role: not given for node 'gpu-1'; give it, or read it from the Node (read_cluster)"]


# ---- preflight: the System Upgrade Controller runs, hops and roles (suc_info)

CRD_OK = {'metadata': {'name': 'plans.upgrade.cattle.io'},
          'status': {'conditions': [{'type': 'Established', 'status': 'True'}]}}
DEPLOY_OK = {'metadata': {'name': 'system-upgrade-controller'}, 'spec': {'replicas': 1},
             'status': {'readyReplicas': 1}}


@pytest.mark.parametrize('crd,deployment,problems', [
    (CRD_OK, DEPLOY_OK, []),
    (None, DEPLOY_OK, ['CustomResourceDefinition plans.upgrade.cattle.io not found: the System Upgrade Controller is '
                       'not installed (install it before an RKE2 upgrade)']),
    ({'status': {'conditions': [{'type': 'Established', 'status': 'False'}]}}, DEPLOY_OK,
     ['CustomResourceDefinition plans.upgrade.cattle.io is not Established']),
    (CRD_OK, None, ['Deployment system-upgrade/system-upgrade-controller not found: the System Upgrade Controller does '
                    'not run there (namespace, controller)']),
    (CRD_OK, {'spec': {'replicas': 1}, 'status': {}},
     ['Deployment system-upgrade/system-upgrade-controller has 0 ready replicas of 1: the System Upgrade Controller '
      'is not running']),
])
def test_controller_state(crd, deployment, problems):
    state, got = S.controller_state(crd, deployment, 'system-upgrade', 'system-upgrade-controller')
    assert got == problems and state['ready'] is (not problems)


def test_preflight_nodes_refuses_a_minor_skip_a_downgrade_and_a_wrong_declared_role():
    nodes = [_node('gpu-1', 'v1.34.2+rke2r1'), _node('gpu-2', 'v1.36.2+rke2r1'), _node('gpu-3', CUR, True),
             _node('gpu-4', TGT), _node('gpu-5', 'garbage')]
    rows, problems = S.preflight_nodes(nodes, ['gpu-1', 'gpu-2', 'gpu-3', 'gpu-4', 'gpu-5', 'gpu-9'], TGT,
                                       {'gpu-3': 'agent', 'gpu-4': 'agent'})
    assert [(r['name'], r['role'], r['action']) for r in rows] == [
        ('gpu-1', 'agent', 'upgrade'), ('gpu-2', 'agent', 'upgrade'), ('gpu-3', 'server', 'upgrade'),
        ('gpu-4', 'agent', 'up_to_date'), ('gpu-5', 'agent', None)]
    assert len(problems) == 6, problems
    assert 'node gpu-9: not found in the API' in problems
    assert any(p.startswith('agents gpu-1, gpu-2 would move RKE2 to v1.36.1+rke2r1, but the control plane is not there: '
                            'servers gpu-3 (%s)' % CUR) for p in problems), problems
    assert any(p.startswith('node gpu-1: v1.34.2+rke2r1 → v1.36.1+rke2r1: RKE2 upgrade cannot skip a Kubernetes minor '
                            '(skips 1.35') for p in problems)
    assert any(p.startswith('node gpu-2: v1.36.2+rke2r1 → v1.36.1+rke2r1: RKE2 downgrade is not allowed') for p in problems)
    assert any(p.startswith('declared_roles[gpu-3]: node gpu-3 is declared an RKE2 agent, but its Node is an RKE2 server')
               for p in problems)
    assert any(p.startswith('node gpu-5: kubeletVersion "garbage" is not a valid RKE2 version') for p in problems)


def test_preflight_nodes_refuses_agents_before_a_server_behind_the_target_and_lets_servers_go_first():
    """An agent may not be newer than the control plane: with a server (GPU or not, any Node of the cluster with a
    server role label) behind the target, moving agents is refused at preflight, before any drain; servers alone
    (their own plan first) and agents once every server is at the target pass."""
    cp = _node('cp-1', CUR, True)
    rows, problems = S.preflight_nodes([cp, _node('gpu-1', CUR)], ['gpu-1'], TGT)
    assert problems == ['agents gpu-1 would move RKE2 to v1.36.1+rke2r1, but the control plane is not there: servers '
                        'cp-1 (%s); RKE2 upgrades every server before any agent (an agent may not be newer than the '
                        'control plane): upgrade the servers first' % CUR]
    assert S.preflight_nodes([cp, _node('gpu-1', CUR)], ['cp-1'], TGT)[1] == []
    assert S.preflight_nodes([_node('cp-1', TGT, True), _node('gpu-1', CUR)], ['gpu-1'], TGT)[1] == []
