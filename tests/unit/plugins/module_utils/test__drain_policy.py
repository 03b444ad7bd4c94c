"""The drain policy (issue 40 item 1): local data, unmanaged pods and grace periods by namespace and selector."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain as D
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _drain_policy as P

RS = [{'apiVersion': 'apps/v1', 'kind': 'ReplicaSet', 'name': 'train-h100-7f', 'uid': 'u1', 'controller': True}]


def pod(name, namespace='ml', labels=None, volumes=(), owners=tuple(RS)):
    return {'metadata': {'name': name, 'namespace': namespace, 'labels': dict(labels or {}), 'uid': name,
                         'ownerReferences': list(owners)},
            'spec': {'nodeName': 'gpu-01', 'volumes': list(volumes)}, 'status': {'phase': 'Running'}}


SHM = {'name': 'dshm', 'emptyDir': {'medium': 'Memory', 'sizeLimit': '16Gi'}}
SCRATCH = {'name': 'scratch', 'emptyDir': {}}


def test_defaults_delete_memory_backed_shm_refuse_disk_backed_and_bare_pods():
    policy = P.parse(None)
    assert policy.as_dict() == {'local_data': 'memory', 'unmanaged_pods': 'refuse', 'grace_period': None, 'rules': []}
    assert P.refusal(pod('train', volumes=[SHM]), policy.for_pod(pod('train'))) is None
    why = P.refusal(pod('etl', volumes=[SHM, SCRATCH]), policy.for_pod(pod('etl')))
    assert why.startswith("emptyDir scratch on the node's disk would be lost (local_data=memory, the drain policy's "
                          'defaults'), why
    why = P.refusal(pod('notebook', owners=()), policy.for_pod(pod('notebook')))
    assert why.startswith('no controller manages it: deleted, it is gone for ever (unmanaged_pods=refuse'), why


def test_first_matching_rule_wins_by_namespace_glob_and_selector():
    policy = P.parse({'grace_period': 30, 'rules': [
        {'namespaces': ['scratch-*'], 'unmanaged_pods': 'delete', 'local_data': 'delete'},
        {'namespaces': 'inference', 'selector': 'app=vllm', 'grace_period': 120},
        {'selector': 'gpufleet.io/keep-data', 'local_data': 'refuse'}]})
    bare = pod('nb', namespace='scratch-alice', owners=(), volumes=[SCRATCH])
    pp = policy.for_pod(bare)
    assert (pp.rule, pp.unmanaged_pods, pp.local_data, pp.grace_period) == (0, 'delete', 'delete', 30)
    assert P.refusal(bare, pp) is None
    vllm = pod('vllm-0', namespace='inference', labels={'app': 'vllm'}, volumes=[SHM])
    assert policy.for_pod(vllm).rule == 1 and policy.for_pod(vllm).grace_period == 120
    assert policy.for_pod(pod('vllm-0', namespace='inference', labels={'app': 'triton'})).rule is None
    keep = pod('db', labels={'gpufleet.io/keep-data': 'yes'}, volumes=[SHM])
    assert P.refusal(keep, policy.for_pod(keep)).startswith('emptyDir dshm would be lost (local_data=refuse, drain '
                                                            'policy rule 2')
    rules = [{'namespaces': ['inference'], 'grace_period': 120}]
    opts = D.options_from_params({'policy': {'grace_period': 30, 'rules': rules}})
    assert opts.grace_for(vllm) == 120 and opts.grace_for(keep) == 30
    assert D.options_from_params({'grace_period': 5}).grace_for(vllm) == 5


@pytest.mark.parametrize('value, message', [
    ('delete', 'drain_policy: "delete" is not a mapping'),
    ({'local_data': 'wipe'}, 'drain_policy.local_data: "wipe" is not one of memory, delete, refuse'),
    ({'unmanaged_pods': True}, 'drain_policy.unmanaged_pods: True is not one of refuse, delete'),
    ({'grace_period': -1}, 'drain_policy.grace_period: -1 is not a whole number of seconds'),
    ({'force': True}, 'drain_policy: unknown key(s) force'),
    ({'rules': {}}, 'drain_policy.rules: {} is not a list'),
    ({'rules': [{'namespaces': ['ml']}]}, 'drain_policy.rules[0]: says nothing'),
    ({'rules': [{'namespace': 'ml', 'local_data': 'delete'}]}, 'drain_policy.rules[0]: unknown key(s) namespace'),
    ({'rules': [{'namespaces': [''], 'local_data': 'delete'}]}, 'drain_policy.rules[0].namespaces'),
    ({'rules': [{'selector': 'app in (a,b)', 'local_data': 'delete'}]}, 'drain_policy.rules[0].selector'),
])
def test_bad_policies_are_refused_naming_the_field_and_the_value(value, message):
    with pytest.raises(P.DrainPolicyError) as exc:
        P.parse(value)
    assert message in str(exc.value), str(exc.value)
    with pytest.raises(D.DrainError):
        D.options_from_params({'policy': value if isinstance(value, dict) else {'local_data': 'wipe'}})


def test_the_drain_plans_by_the_policy_where_one_is_given():
    """kubectl drain's defaults (and node_drain's without a policy) block on /dev/shm; the policy's defaults evict it,
    and a bare pod still blocks, named with the rule's source."""
    pods = [pod('train-0', volumes=[SHM]), pod('nb', namespace='scratch', owners=())]
    plain = D.plan_drain(pods, [], {}, D.options_from_params({}))
    assert [b['name'] for b in plain.blocked] == ['train-0', 'nb']
    planned = D.plan_drain(pods, [], {}, D.options_from_params({'policy': {}}))
    assert [p['metadata']['name'] for p in planned.evict] == ['train-0']
    assert [(b['name'], b['reason'].split(':')[0]) for b in planned.blocked] == [('nb', 'no controller manages it')]
    ruled = D.plan_drain(pods, [], {}, D.options_from_params({'policy': {'rules': [
        {'namespaces': ['scratch'], 'unmanaged_pods': 'delete'}]}}))
    assert sorted(p['metadata']['name'] for p in ruled.evict) == ['nb', 'train-0'] and not ruled.blocked
    assert P.describe(pods, P.parse({}))[1]['action'] == 'refuse'


def test_dry_run_judges_every_node_from_one_pod_list():
    pods = [pod('train-0', volumes=[SHM]), pod('nb', namespace='scratch', owners=()),
            dict(pod('etl', volumes=[SCRATCH]), spec={'nodeName': 'gpu-02', 'volumes': [SCRATCH]}),
            dict(pod('far'), spec={'nodeName': 'gpu-09'})]
    out = D.dry_run(['gpu-01', 'gpu-02'], pods, [], P.parse({'rules': [{'namespaces': ['scratch'],
                                                                        'unmanaged_pods': 'delete'}]}))
    assert [n['node'] for n in out] == ['gpu-01', 'gpu-02']
    assert out[0]['refuse'] == [] and out[0]['evict'] == ['ml/train-0', 'scratch/nb']
    assert out[0]['local_data_deleted'] == ['ml/train-0']
    assert [r['name'] for r in out[1]['refuse']] == ['etl'] and out[1]['evict'] == []
