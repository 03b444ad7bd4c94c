"""The watch-fed cache the stand-ins read (tests/cluster/informer.py) on the real control plane: it follows
creates, changes and deletes; a watch that is cut resumes from the last resourceVersion; a 410 Gone (the
resourceVersion compacted away) makes it list again; and it always ends equal to a fresh list."""
from __future__ import annotations

import pytest

from cluster.informer import Informer

pytestmark = pytest.mark.slow


def configmap(name, value):
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name, 'namespace': 'default'},
            'data': {'v': value}}


def cached(informer):
    return {o['metadata']['name']: o['data']['v'] for o in informer.items()
            if o['metadata']['namespace'] == 'default' and o['metadata']['name'].startswith('inf-')}


def listed(cluster):
    return {o['metadata']['name']: o['data']['v'] for o in cluster.list('v1', 'ConfigMap', namespace='default')
            if o['metadata']['name'].startswith('inf-')}


@pytest.fixture
def informer(cluster):
    inf = Informer(cluster, 'v1', 'ConfigMap').start()
    yield inf
    inf.stop()
    assert not inf._thread.is_alive(), 'the informer thread outlived stop()'


def test_follows_creates_changes_and_deletes(cluster, informer):
    cluster.apply([configmap('inf-a', '1'), configmap('inf-b', '1')], settle=False)
    cluster.wait_for(lambda: cached(informer) == {'inf-a': '1', 'inf-b': '1'}, timeout=10, message='the creates')
    cluster.patch('v1', 'ConfigMap', 'inf-a', {'data': {'v': '2'}}, namespace='default')
    cluster.delete('v1', 'ConfigMap', 'inf-b', 'default')
    cluster.wait_for(lambda: cached(informer) == {'inf-a': '2'}, timeout=10, message='the change and the delete')
    assert cached(informer) == listed(cluster)
    assert informer.get('default', 'inf-a')['kind'] == 'ConfigMap' and informer.errors == 0


def test_a_cut_watch_resumes_from_its_last_version(cluster, informer):
    cluster.apply([configmap('inf-a', '1')], settle=False)
    cluster.wait_for(lambda: cached(informer) == {'inf-a': '1'}, timeout=10, message='the create')
    # the connection drops: the informer resumes from the last resourceVersion it saw, missing nothing
    cluster.wait_for(lambda: informer._response is not None, timeout=10, message='the watch')
    informer._response.shutdown()
    cluster.apply([configmap('inf-c', '1')], settle=False)
    cluster.wait_for(lambda: cached(informer) == {'inf-a': '1', 'inf-c': '1'}, timeout=15, message='the resumed watch')
    assert informer.lists == 1            # resumed, not listed again
    assert cached(informer) == listed(cluster)


def test_a_410_gone_lists_again(cluster, informer):
    """The server no longer has the resourceVersion the informer would resume from (compacted): its ERROR event
    (code 410) makes the informer list again. Sent here as the API server sends it, on the informer's own path."""
    cluster.apply([configmap('inf-a', '1')], settle=False)
    cluster.wait_for(lambda: cached(informer) == {'inf-a': '1'}, timeout=10, message='the create')
    assert informer._apply({'type': 'ERROR', 'object': {'kind': 'Status', 'code': 410, 'reason': 'Expired'}}) is False
    assert informer._apply({'type': 'ERROR', 'object': {'kind': 'Status', 'code': 500}}) is True    # resumed
    real_watch, gone = informer._watch, [True]

    def watch_once_gone():
        if gone:
            gone.clear()
            return False                 # what _watch returns on the 410
        return real_watch()
    informer._watch = watch_once_gone
    cluster.wait_for(lambda: informer._response is not None, timeout=10, message='the watch')
    informer._response.shutdown()
    cluster.delete('v1', 'ConfigMap', 'inf-a', 'default')
    cluster.apply([configmap('inf-d', '1')], settle=False)
    cluster.wait_for(lambda: cached(informer) == {'inf-d': '1'}, timeout=15, message='the list again')
    assert informer.lists == 2 and cached(informer) == listed(cluster)
