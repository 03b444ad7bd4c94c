"""gpufleet.upgrade.snapshot_store through ansible-playbook (ansible-runner) on the real control plane
(tests/cluster), as a service account bound as docs/rbac says (gpufleet-upgrade-snapshots by a RoleBinding in
gpufleet-system only): store, rerun without a write, fetch back into a fresh controller directory, refuse a
tampered or missing Secret with nothing written, and stay inside the role (issue 17)."""
from __future__ import annotations

import base64
import os

import pytest

import rbac_check as R
from cluster import fixtures as f
from cluster import rbac

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as sn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot_store as ss

pytestmark = pytest.mark.slow

NS = 'gpufleet-system'
NODE = 'gpu-07'
TARGET = {'driver': '580.130.00'}
NEXT = {'driver': '580.142.00'}
SA = 'snapshots'
ROLE = 'gpufleet-upgrade-snapshots'


def document(driver: str = '580.126.20') -> bytes:
    snap = {'packages': {'nvidia-driver-580-server': driver}, 'pins': {'nvidia-driver-580-server': driver},
            'holds': [], 'boot': {'running_kernel': '6.8.0-134-generic'}, 'gpu_facts': {'driver_version': driver}}
    return sn.dump_document(sn.make_document(snap)).encode('utf-8')


def digest(content: bytes) -> str:
    return sn.make_document(sn.verify_document(content.decode()))['sha256']


@pytest.fixture
def emu(cluster):
    """The cluster, with the module's identity: the snapshots role in gpufleet-system only."""
    cluster.apply([f.namespace(NS)])
    cluster.module_kubeconfig = rbac.kubeconfig_for(cluster, ROLE, sa=SA, namespace=NS)
    mark = cluster.audit_mark()
    yield cluster
    assert rbac.refused(cluster.audit_events(since=mark, user=rbac.user(SA))) == []


def _play(emu, args, check=False, diff=False):
    return [{'name': 'snapshot_store', 'hosts': 'localhost', 'gather_facts': False, 'check_mode': check, 'diff': diff,
             'module_defaults': {'group/gpufleet.upgrade.k8s': {'kubeconfig': emu.module_kubeconfig,
                                                                'request_timeout': 5}},
             'tasks': [{'name': 'step', 'gpufleet.upgrade.snapshot_store': dict({'node': NODE, 'target': TARGET}, **args),
                        'register': 'out', 'ignore_errors': True}]}]


def _step(emu, run_playbook, seen, args, **kw):
    emu.clear_requests()
    run = run_playbook(_play(emu, args, **kw))
    seen.extend(emu.requests)
    return run, run.result('step')


def test_store_rerun_fetch_and_refusals_inside_the_role(emu, run_playbook, tmp_path):
    seen: list = []
    path = tmp_path / 'snapshots' / ('%s--driver_580.130.00.json' % NODE)
    path.parent.mkdir()
    content = document()
    path.write_bytes(content)
    sha = digest(content)
    name = ss.secret_name(NODE, TARGET)
    store = {'state': 'stored', 'path': str(path), 'namespace': NS}

    # check mode: what would be created, nothing written
    _reqs, res = _step(emu, run_playbook, seen, store, check=True, diff=True)
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['action'] == 'created', res.get('msg')
    assert res['diff']['before'] is None and res['diff']['after']['annotations'][ss.ANN_SHA] == sha
    assert emu.mutating_requests() == [] and emu.get('v1', 'Secret', name, NS) is None

    run, res = _step(emu, run_playbook, seen, store)
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True, res.get('msg')
    assert (res['action'], res['secret'], res['sha256'], res['size']) == (
        'created', {'name': name, 'namespace': NS}, sha, len(content))
    secret = emu.get('v1', 'Secret', name, NS)
    assert secret['type'] == 'Opaque'
    assert secret['metadata']['labels'] == {'app.kubernetes.io/managed-by': 'gpufleet.upgrade', 'gpufleet.io/node': NODE,
                                            'gpufleet.io/snapshot-target': 'driver_580.130.00'}
    assert secret['metadata']['annotations'][ss.ANN_SHA] == sha   # the digest node_snapshot returns, the Node records
    assert base64.b64decode(secret['data'][ss.DATA_KEY]) == content
    encoded = secret['data'][ss.DATA_KEY]
    assert content.decode() not in run.stdout and encoded not in run.stdout and encoded not in str(run.events)

    # rerun: unchanged, no write
    _reqs, res = _step(emu, run_playbook, seen, store)
    assert res['changed'] is False and res['action'] == 'unchanged' and res['retired'] == []
    assert emu.mutating_requests() == []

    # a fresh controller (an AWX relaunch): the file is gone; fetch writes it back, verified
    path.unlink()
    fetch = {'state': 'fetched', 'path': str(path), 'sha256': sha, 'namespace': NS}
    _reqs, res = _step(emu, run_playbook, seen, fetch, check=True)
    assert res['changed'] is True and res['action'] == 'fetched' and not path.exists()
    _reqs, res = _step(emu, run_playbook, seen, fetch)
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['action'] == 'fetched', res.get('msg')
    assert path.read_bytes() == content and digest(path.read_bytes()) == sha
    assert oct(os.stat(path).st_mode & 0o777) == '0o600'
    assert emu.mutating_requests() == []
    # the file is here with that digest: nothing read, nothing written
    _reqs, res = _step(emu, run_playbook, seen, fetch)
    assert res['changed'] is False and res['action'] == 'unchanged' and emu.requests == []

    # tampered: the Secret holds another (valid) snapshot under the same annotation; refused, nothing written
    path.unlink()
    other = document('580.95.05')
    emu.patch('v1', 'Secret', name, {'data': {ss.DATA_KEY: base64.b64encode(other).decode()}}, NS)
    _reqs, res = _step(emu, run_playbook, seen, fetch)
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == ('no snapshot of node %s for target driver=580.130.00 could be fetched from Secret %s/%s: '
                          'digest mismatch: expected sha256 %s (recorded on the Node), the stored snapshot is %s'
                          % (NODE, NS, name, sha, digest(other))), res['msg']
    assert not path.exists() and list(path.parent.iterdir()) == []
    # the annotation disagrees with the content
    emu.patch('v1', 'Secret', name, {'data': {ss.DATA_KEY: encoded}, 'metadata': {'annotations': {ss.ANN_SHA: 'cd' * 32}}},
              NS)
    _reqs, res = _step(emu, run_playbook, seen, fetch)
    assert res['_event'] == 'runner_on_failed' and "annotation gpufleet.io/snapshot-sha256 says sha256 " + 'cd' * 32 in res['msg']
    assert not path.exists()
    # store repairs it (a replace guarded by the resourceVersion)
    path.write_bytes(content)
    _reqs, res = _step(emu, run_playbook, seen, store)
    assert res['action'] == 'replaced' and [r['verb'] for r in emu.mutating_requests()] == ['PATCH']
    assert emu.mutating_requests()[0]['body']['metadata']['resourceVersion']
    assert emu.get('v1', 'Secret', name, NS)['metadata']['annotations'][ss.ANN_SHA] == sha
    # without the digest the Node records, a Secret only vouches for itself: nothing is asked or written (T3-1)
    path.unlink()
    _reqs, res = _step(emu, run_playbook, seen, {'state': 'fetched', 'path': str(path), 'namespace': NS})
    assert res['_event'] == 'runner_on_failed' and emu.requests == [] and not path.exists()
    assert res['msg'].startswith('sha256: required with state=fetched (the digest the Node records'), res['msg']

    # missing Secret: refused, nothing written
    emu.delete('v1', 'Secret', name, NS)
    _reqs, res = _step(emu, run_playbook, seen, fetch)
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'].startswith('no snapshot of node %s for target driver=580.130.00 could be fetched from Secret %s/%s: '
                                 'the Secret does not exist (the Node records sha256 %s' % (NODE, NS, name, sha))
    assert not path.exists()

    # a Secret of that name gpufleet did not create: refused, untouched
    emu.apply([{'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': name, 'namespace': NS},
                'type': 'Opaque', 'data': {'x': 'eQ=='}}])
    path.write_bytes(content)
    _reqs, res = _step(emu, run_playbook, seen, store)
    assert res['_event'] == 'runner_on_failed' and emu.mutating_requests() == []
    assert res['msg'].startswith('Secret %s/%s exists and is not managed by gpufleet.upgrade' % (NS, name)), res['msg']
    assert emu.get('v1', 'Secret', name, NS)['data'] == {'x': 'eQ=='}
    emu.delete('v1', 'Secret', name, NS)

    # the next target's snapshot retires the node's earlier one
    _reqs, res = _step(emu, run_playbook, seen, store)
    assert res['action'] == 'created'
    nxt = tmp_path / 'snapshots' / ('%s--driver_580.142.00.json' % NODE)
    nxt.write_bytes(other)
    emu.clear_requests()
    run = run_playbook([dict(_play(emu, {})[0], tasks=[{
        'name': 'step', 'register': 'out', 'gpufleet.upgrade.snapshot_store': {
            'node': NODE, 'target': NEXT, 'state': 'stored', 'path': str(nxt), 'namespace': NS}}])])
    seen.extend(emu.requests)
    res = run.result('step')
    assert res['action'] == 'created' and res['retired'] == [name], res
    assert emu.get('v1', 'Secret', name, NS) is None
    assert emu.get('v1', 'Secret', ss.secret_name(NODE, NEXT), NS) is not None

    # every request stayed inside the role, and the role is what it needs
    assert R.violations(R.module_roles()['snapshot_store'], seen) == []
    verbs = {(a['verb'], a['resource']) for a in (R.attributes(r['verb'], r['path'], r['query']) for r in seen)}
    assert verbs == {('get', 'secrets'), ('create', 'secrets'), ('patch', 'secrets'), ('list', 'secrets'),
                     ('delete', 'secrets')}
    assert {R.attributes(r['verb'], r['path'], r['query'])['namespace'] for r in seen} == {NS}


@pytest.mark.parametrize('args, msg', [
    ({'state': 'fetched', 'path': '/nonexistent/s.json', 'sha256': 'xyz'},
     "sha256: 'xyz' is not a SHA-256 digest (64 hex digits)"),
    ({'state': 'stored', 'path': '/nonexistent/s.json', 'namespace': 'Bad_NS'},
     "namespace: 'Bad_NS' is not a Kubernetes namespace name (a DNS label)"),
    ({'state': 'stored', 'path': '/nonexistent/s.json', 'target': {'driver': 'a=b'}},
     'target.driver: \'a=b\' may not contain "," or "="'),
    ({'state': 'stored', 'path': '/nonexistent/s.json'}, "path: '/nonexistent/s.json' does not exist: there is no snapshot "
                                                         'to keep'),
])
def test_bad_input_names_the_field(emu, run_playbook, args, msg):
    emu.clear_requests()
    res = run_playbook(_play(emu, args)).result('step')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'].startswith(msg), res['msg']
    assert 'Traceback' not in res.get('exception', '') and 'Traceback' not in res['msg']
    assert emu.mutating_requests() == []
