"""The Kubernetes API emulator, driven by the real `kubernetes` Python client over HTTP."""
from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from emulator import fixtures as f


@pytest.fixture
def api(emulator):
    return config.new_client_from_config(config_file=emulator.kubeconfig)


@pytest.fixture
def core(api):
    return client.CoreV1Api(api)


def names(items):
    return sorted(o.metadata.name if hasattr(o, 'metadata') else o['metadata']['name'] for o in items)


def test_create_fills_metadata_and_answers_201(emulator, core):
    body = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'p1'},
            'spec': {'containers': [{'name': 'c', 'image': 'busybox'}]}}
    data, status, dummy = core.create_namespaced_pod_with_http_info('default', body)
    assert status == 201
    assert data.metadata.uid and data.metadata.resource_version and data.metadata.creation_timestamp
    assert data.status.phase == 'Pending'   # not bound to a node: no scheduler target, stays Pending
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod('default', body)
    assert exc.value.status == 409 and 'already exists' in exc.value.body
    rv1 = int(data.metadata.resource_version)
    patched = core.patch_namespaced_pod('p1', 'default', {'metadata': {'labels': {'a': 'b'}}})
    assert int(patched.metadata.resource_version) > rv1
    assert patched.metadata.uid == data.metadata.uid


def test_custom_objects_create_returns_the_object(emulator, api):
    co = client.CustomObjectsApi(api)
    vmi = f.vmi('vm-a', 'gpu-1')
    del vmi['metadata']['uid']
    made = co.create_namespaced_custom_object('kubevirt.io', 'v1', 'default', 'virtualmachineinstances', vmi)
    assert made['metadata']['name'] == 'vm-a' and made['metadata']['uid']
    cp = co.create_cluster_custom_object('nvidia.com', 'v1', 'clusterpolicies', f.cluster_policy())
    assert cp['kind'] == 'ClusterPolicy'
    listed = co.list_cluster_custom_object('resource.k8s.io', 'v1', 'resourceclaims')
    assert listed['kind'] == 'ResourceClaimList' and listed['items'] == []
    for group, plural in (('upgrade.cattle.io', 'plans'), ('kubevirt.io', 'virtualmachines')):
        assert co.list_cluster_custom_object(group, 'v1', plural)['items'] == []


def test_field_and_label_selectors(emulator, core):
    emulator.apply([f.gpu_node('gpu-1'), f.gpu_node('gpu-2'),
                    f.pod('a', 'gpu-1', labels={'app': 'train', 'tier': 'gpu'}),
                    f.pod('b', 'gpu-1', labels={'app': 'web'}, phase='Succeeded'),
                    f.pod('c', 'gpu-2', labels={'app': 'train'}),
                    f.pod('d', None, namespace='team', phase='Pending', node_selector={'pool': 'none'})])
    by_node = core.list_pod_for_all_namespaces(field_selector='spec.nodeName=gpu-1')
    assert by_node.kind == 'PodList'
    assert names(by_node.items) == ['a', 'b']
    assert names(core.list_pod_for_all_namespaces(field_selector='spec.nodeName=gpu-1,status.phase!=Succeeded')
                 .items) == ['a']
    assert names(core.list_pod_for_all_namespaces(field_selector='spec.nodeName=').items) == ['d']
    assert names(core.list_pod_for_all_namespaces(field_selector='metadata.name=c').items) == ['c']
    assert names(core.list_namespaced_pod('team').items) == ['d']
    assert names(core.list_pod_for_all_namespaces(label_selector='app=train').items) == ['a', 'c']
    assert names(core.list_pod_for_all_namespaces(label_selector='app in (web, train),tier').items) == ['a']
    assert names(core.list_pod_for_all_namespaces(label_selector='app notin (train)').items) == ['b', 'd']
    assert names(core.list_pod_for_all_namespaces(label_selector='!tier,app!=web').items) == ['c', 'd']
    with pytest.raises(ApiException) as exc:
        core.list_pod_for_all_namespaces(label_selector='app in train')
    assert exc.value.status == 400


def test_pagination_with_limit_and_continue(emulator, core):
    emulator.apply([f.node('n1')] + [f.pod('p%02d' % i, 'n1', namespace='ns%d' % (i % 3)) for i in range(25)])
    seen, token, pages = [], None, 0
    while True:
        page = core.list_pod_for_all_namespaces(limit=10, _continue=token)
        pages += 1
        seen += [(p.metadata.namespace, p.metadata.name) for p in page.items]
        token = page.metadata._continue
        if pages == 1:
            assert page.metadata.remaining_item_count == 15
        if not token:
            break
    assert pages == 3
    assert len(seen) == 25 and len(set(seen)) == 25
    assert seen == sorted(seen)
    # a selector applies across pages
    page = core.list_pod_for_all_namespaces(limit=2, field_selector='metadata.namespace=ns1')
    assert [p.metadata.namespace for p in page.items] == ['ns1', 'ns1'] and page.metadata._continue


def test_stale_resource_version_conflicts(emulator, core):
    emulator.apply(f.node('n1'))
    node = core.read_node('n1')
    stale = node.metadata.resource_version
    core.patch_node('n1', {'metadata': {'labels': {'x': '1'}}})
    with pytest.raises(ApiException) as exc:
        core.patch_node('n1', {'metadata': {'resourceVersion': stale, 'labels': {'x': '2'}}})
    assert exc.value.status == 409 and 'the object has been modified' in exc.value.body
    node.metadata.labels['x'] = '3'
    with pytest.raises(ApiException) as exc:
        core.replace_node('n1', node)
    assert exc.value.status == 409
    fresh = core.read_node('n1')
    fresh.metadata.labels['x'] = '3'
    assert core.replace_node('n1', fresh).metadata.labels['x'] == '3'
    assert emulator.get('v1', 'Node', 'n1')['metadata']['labels']['x'] == '3'


def test_status_subresource_keeps_spec_and_status_apart(emulator, core):
    emulator.apply(f.node('n1'))
    core.patch_node('n1', {'spec': {'unschedulable': True}, 'status': {'allocatable': {'cpu': '1'}}})
    node = emulator.get('v1', 'Node', 'n1')
    assert node['spec']['unschedulable'] is True and node['status']['allocatable']['cpu'] == '128'
    core.patch_node_status('n1', {'spec': {'unschedulable': False}, 'status': {'allocatable': {'cpu': '2'}}})
    node = emulator.get('v1', 'Node', 'n1')
    assert node['spec']['unschedulable'] is True and node['status']['allocatable']['cpu'] == '2'


def test_namespaces_create_and_cascade(emulator, core):
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map('nowhere', {'metadata': {'name': 'c'}, 'data': {}})
    assert exc.value.status == 404
    core.create_namespace({'metadata': {'name': 'nowhere'}})
    core.create_namespaced_config_map('nowhere', {'metadata': {'name': 'c'}, 'data': {'k': 'v'}})
    assert core.read_namespaced_config_map('c', 'nowhere').data == {'k': 'v'}
    assert 'nowhere' in names(core.list_namespace().items)
    core.delete_namespace('nowhere')
    assert emulator.list('v1', 'ConfigMap', 'nowhere') == []


def _evict(core, name, ns='default'):
    return core.create_namespaced_pod_eviction(name, ns, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=name, namespace=ns)))


@pytest.mark.parametrize('spec, expect_first, expect_second', [
    ({'min_available': 2}, 201, 429),        # 3 ready: one may go, then 2 left = minimum
    ({'min_available': 3}, 429, 429),
    ({'min_available': '50%'}, 201, 429),    # ceil(1.5) = 2 must stay
    ({'min_available': '34%'}, 201, 429),    # ceil(1.02) = 2
    ({'min_available': '33%'}, 201, 201),    # ceil(0.99) = 1
    ({'max_unavailable': 1}, 201, 429),
    ({'max_unavailable': 0}, 429, 429),
    ({'max_unavailable': '50%'}, 201, 201),  # ceil(1.5) = 2 may be unavailable
    ({'max_unavailable': '10%'}, 201, 429),  # ceil(0.3) = 1
])
def test_eviction_budget_arithmetic(emulator, core, spec, expect_first, expect_second):
    rs = f.replicaset('web', replicas=3)
    pods = [f.replicaset_pod(rs, 'n1', name='web-%d' % i) for i in range(3)]
    emulator.apply([f.node('n1'), rs, *pods, f.pdb('pdb', {'app': 'web'}, **spec)])
    results = []
    for name in ('web-0', 'web-1'):
        try:
            _evict(core, name)
            results.append(201)
        except ApiException as exc:
            assert 'disruption budget' in exc.body
            results.append(exc.status)
    assert results == [expect_first, expect_second]


def test_eviction_deletes_honouring_grace_and_watchers_see_it(emulator, core, api):
    emulator.apply([f.node('n1'), f.pod('p', 'n1', termination_grace=30)])
    emulator.simulator.max_grace_seconds = 2   # long enough to observe the terminating state under load
    events, ready = [], threading.Event()

    def watcher():
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_pod, 'default', timeout_seconds=5, _request_timeout=10):
            events.append((ev['type'], ev['object'].metadata.name, ev['object'].metadata.deletion_timestamp))
            ready.set()
            if ev['type'] == 'DELETED':
                w.stop()
    t = threading.Thread(target=watcher)
    t.start()
    assert ready.wait(5)
    _evict(core, 'p')
    pod = emulator.get('v1', 'Pod', 'p')
    assert pod is not None and pod['metadata']['deletionGracePeriodSeconds'] == 30  # terminating
    t.join(10)
    assert events[0][:2] == ('ADDED', 'p')
    assert ('MODIFIED', 'p') in [e[:2] for e in events] and events[-1][:2] == ('DELETED', 'p')
    assert emulator.get('v1', 'Pod', 'p') is None


def test_eviction_of_unready_or_unprotected_pods(emulator, core):
    emulator.apply([f.node('n1'), f.pod('ready', 'n1', labels={'app': 'x'}),
                    f.pod('sick', 'n1', labels={'app': 'x'}, ready=False),
                    f.pod('free', 'n1'), f.pdb('pdb', {'app': 'x'}, min_available=1)])
    _evict(core, 'sick')    # not ready, budget met (1 healthy >= 1): allowed
    _evict(core, 'free')    # no budget
    with pytest.raises(ApiException) as exc:
        _evict(core, 'ready')
    assert exc.value.status == 429
    with pytest.raises(ApiException) as exc:
        _evict(core, 'ghost')
    assert exc.value.status == 404
    emulator.patch('policy/v1', 'PodDisruptionBudget', 'pdb', {'spec': {'minAvailable': 0}})
    _evict(core, 'ready')
    emulator.wait_for(lambda: emulator.list('v1', 'Pod') == [], message='pods gone')


def test_pdb_status_is_computed(emulator, api):
    emulator.apply([f.node('n1'), f.pod('a', 'n1', labels={'app': 'x'}), f.pod('b', 'n1', labels={'app': 'x'}),
                    f.pdb('pdb', {'app': 'x'}, max_unavailable=1)])
    pdb = client.PolicyV1Api(api).read_namespaced_pod_disruption_budget('pdb', 'default')
    assert (pdb.status.current_healthy, pdb.status.desired_healthy, pdb.status.disruptions_allowed,
            pdb.status.expected_pods) == (2, 1, 1, 2)


def test_request_log(emulator, core):
    emulator.apply(f.node('n1'))
    emulator.clear_requests()
    core.list_node(label_selector='a=b', limit=5)
    core.patch_node('n1', {'spec': {'unschedulable': True}})
    reqs = emulator.requests
    assert [(r['verb'], r['path']) for r in reqs] == [('GET', '/api/v1/nodes'), ('PATCH', '/api/v1/nodes/n1')]
    assert reqs[0]['query'] == {'labelSelector': 'a=b', 'limit': '5'}
    assert reqs[1]['body'] == {'spec': {'unschedulable': True}} and reqs[1]['status'] == 200
    assert [r['verb'] for r in emulator.mutating_requests()] == ['PATCH']


def test_discovery_with_trailing_slashes(emulator, api):
    groups = client.ApisApi(api).get_api_versions()
    assert 'policy' in [g.name for g in groups.groups] and 'metrics.k8s.io' not in [g.name for g in groups.groups]
    assert client.VersionApi(api).get_code().git_version.startswith('v1.')
    res = client.CoreV1Api(api).get_api_resources()
    assert res.group_version == 'v1'
    ev = [r for r in res.resources if r.name == 'pods/eviction'][0]
    assert (ev.group, ev.version, ev.kind) == ('policy', 'v1', 'Eviction')


def test_watch_resumes_from_resource_version(emulator, core):
    emulator.apply(f.node('n1'))
    rv = core.list_node().metadata.resource_version
    emulator.apply(f.node('n2'))
    emulator.delete('v1', 'Node', 'n1')
    w = watch.Watch()
    seen = []
    for ev in w.stream(core.list_node, resource_version=rv, timeout_seconds=1, _request_timeout=5):
        seen.append((ev['type'], ev['object'].metadata.name))
        if len(seen) == 2:
            w.stop()
    assert seen == [('ADDED', 'n2'), ('DELETED', 'n1')]


def test_json_patch_and_strategic_merge(emulator, core):
    emulator.apply(f.node('n1', taints=[{'key': 'a', 'effect': 'NoSchedule'}]))
    core.patch_node('n1', [{'op': 'add', 'path': '/metadata/annotations', 'value': {'k': 'v'}}])
    assert emulator.get('v1', 'Node', 'n1')['metadata']['annotations'] == {'k': 'v'}
    core.patch_node('n1', {'spec': {'taints': [{'key': 'b', 'effect': 'NoExecute'}]}})  # strategic: merged by key
    assert [t['key'] for t in emulator.get('v1', 'Node', 'n1')['spec']['taints']] == ['a', 'b']


def test_timestamps_and_uid_on_apply(emulator):
    before = time.strftime('%Y-%m-%d', time.gmtime())
    made = emulator.apply({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'c'}, 'data': {}})[0]
    assert made['metadata']['creationTimestamp'].startswith(before[:4])
    again = emulator.apply({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'c'}, 'data': {'a': '1'}})[0]
    assert again['metadata']['uid'] == made['metadata']['uid']
    assert int(again['metadata']['resourceVersion']) > int(made['metadata']['resourceVersion'])


def test_two_budgets_on_one_pod_answer_500(emulator, core):
    emulator.apply([f.node('n1'), f.pod('p', 'n1', labels={'app': 'x', 'tier': 'y'}),
                    f.pdb('a', {'app': 'x'}, max_unavailable=5), f.pdb('b', {'tier': 'y'}, max_unavailable=5)])
    with pytest.raises(ApiException) as exc:
        _evict(core, 'p')
    assert exc.value.status == 500 and 'more than one PodDisruptionBudget' in exc.value.body


def test_unhealthy_pod_eviction_policy_always_allow(emulator, core):
    emulator.apply([f.node('n1'), f.pod('ok', 'n1', labels={'app': 'x'}),
                    f.pod('sick', 'n1', labels={'app': 'x'}, ready=False),
                    f.pdb('pdb', {'app': 'x'}, min_available=2)])   # budget not met: 1 healthy < 2
    with pytest.raises(ApiException) as exc:
        _evict(core, 'sick')
    assert exc.value.status == 429
    emulator.patch('policy/v1', 'PodDisruptionBudget', 'pdb', {'spec': {'unhealthyPodEvictionPolicy': 'AlwaysAllow'}})
    _evict(core, 'sick')
    with pytest.raises(ApiException) as exc:
        _evict(core, 'ok')
    assert exc.value.status == 429


def test_pending_and_finished_pods_ignore_budgets(emulator, core):
    emulator.simulator.enabled = False   # keep the bound Pending pod Pending
    emulator.apply([f.node('n1'), f.pod('pend', 'n1', labels={'app': 'x'}, phase='Pending'),
                    f.pod('done', 'n1', labels={'app': 'x'}, phase='Succeeded'),
                    f.pdb('pdb', {'app': 'x'}, max_unavailable=0)])
    _evict(core, 'pend')
    _evict(core, 'done')
    assert emulator.get('v1', 'Pod', 'done') is None   # finished: removed at once
    emulator.wait_for(lambda: emulator.list('v1', 'Pod') == [], message='pending pod gone after its grace')


def test_kmock_reactions_take_precedence(emulator, core):
    emulator.apply(f.node('n1'))
    ghost = {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': 'ghost'}}
    emulator.kmock['get /api/v1/nodes/ghost'] << ghost
    assert core.read_node('ghost').metadata.name == 'ghost'
    assert core.read_node('n1').metadata.name == 'n1'


def test_register_a_custom_resource(emulator, api):
    from emulator import ResourceType
    emulator.register(ResourceType('example.com', 'v1', 'widgets', 'Widget', namespaced=True, short_names=('wd',)))
    co = client.CustomObjectsApi(api)
    made = co.create_namespaced_custom_object('example.com', 'v1', 'default', 'widgets', {
        'apiVersion': 'example.com/v1', 'kind': 'Widget', 'metadata': {'name': 'w'}, 'spec': {'size': 3}})
    assert made['metadata']['uid'] and emulator.get('example.com/v1', 'Widget', 'w')['spec'] == {'size': 3}
    groups = [g.name for g in client.ApisApi(api).get_api_versions().groups]
    assert 'example.com' in groups
