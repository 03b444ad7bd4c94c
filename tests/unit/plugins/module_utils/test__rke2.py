"""RKE2 version parsing and the one-minor, no-downgrade hop rule."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _rke2


@pytest.mark.parametrize('text,parts,kubernetes', [
    ('v1.36.1+rke2r1', (36, 1, 1), 'v1.36.1'),
    ('1.36.1+rke2r1', (36, 1, 1), 'v1.36.1'),
    ('v1.35.3+rke2r3', (35, 3, 3), 'v1.35.3'),
    ('v1.0.0+rke2r0', (0, 0, 0), 'v1.0.0'),
    ('v1.100.20+rke2r12', (100, 20, 12), 'v1.100.20'),
])
def test_parse(text, parts, kubernetes):
    version = _rke2.parse(text)
    assert tuple(version) == parts
    assert version.kubernetes == kubernetes
    assert version.as_dict() == {'minor': parts[0], 'patch': parts[1], 'rev': parts[2], 'kubernetes': kubernetes}
    assert str(version) == 'v1.%d.%d+rke2r%d' % parts


@pytest.mark.parametrize('text,reason', [
    ('v1.36.1-rc1+rke2r1', 'pre-release versions are not allowed'),
    ('v1.36.1-rc1', 'pre-release versions are not allowed'),
    ('v2.0.1+rke2r1', 'the major version must be 1'),
    ('v0.36.1+rke2r1', 'the major version must be 1'),
    ('v1.36+rke2r1', 'expected v1.MINOR.PATCH+rke2rREV'),
    ('v1.36.1', 'expected v1.MINOR.PATCH+rke2rREV'),
    ('v1.36.1+k3s1', 'expected v1.MINOR.PATCH+rke2rREV'),
    ('V1.36.1+rke2r1', 'expected v1.MINOR.PATCH+rke2rREV'),
    ('v1.036.1+rke2r1', 'expected v1.MINOR.PATCH+rke2rREV'),
    (' v1.36.1+rke2r1', 'expected v1.MINOR.PATCH+rke2rREV'),
    ('v1.36.1+rke2r1\n', 'expected v1.MINOR.PATCH+rke2rREV'),
    ('v1.3\u0666.1+rke2r1', 'expected v1.MINOR.PATCH+rke2rREV'),  # a non-ASCII digit
    ('', 'expected v1.MINOR.PATCH+rke2rREV'),
])
def test_parse_refuses(text, reason):
    with pytest.raises(ValueError) as err:
        _rke2.parse(text)
    assert str(err.value) == '%s is not a valid RKE2 version: %s' % (_rke2.show(text), reason)


def test_parse_refuses_non_strings():
    with pytest.raises(ValueError) as err:
        _rke2.parse(1.36)
    assert str(err.value) == '1.36 is not an RKE2 version string (expected v1.MINOR.PATCH+rke2rREV)'


@pytest.mark.parametrize('current,target,problems', [
    ('v1.35.3+rke2r3', 'v1.36.1+rke2r1', []),
    ('v1.36.1+rke2r1', 'v1.36.1+rke2r1', []),
    ('v1.36.1+rke2r1', 'v1.36.1+rke2r2', []),
    ('v1.36.1+rke2r9', 'v1.36.2+rke2r1', []),
    ('v1.36.1+rke2r2', 'v1.36.1+rke2r1', ['RKE2 downgrade is not allowed']),
    ('v1.36.2+rke2r1', 'v1.36.1+rke2r9', ['RKE2 downgrade is not allowed']),
    ('v1.36.0+rke2r1', 'v1.35.9+rke2r9', ['RKE2 downgrade is not allowed']),
    ('v1.34.9+rke2r1', 'v1.36.0+rke2r1', ['RKE2 upgrade cannot skip a Kubernetes minor']),
    ('v1.30.0+rke2r1', 'v1.36.0+rke2r1', ['RKE2 upgrade cannot skip a Kubernetes minor']),
])
def test_transition(current, target, problems):
    assert _rke2.transition_problems(_rke2.parse(current), _rke2.parse(target)) == problems


# ---- the RKE2 role of a Node, from its labels (issue 39 item 8: no per-host variable decides it)

@pytest.mark.parametrize('labels,role,label', [
    ({'node-role.kubernetes.io/control-plane': 'true'}, 'server', 'node-role.kubernetes.io/control-plane'),
    ({'node-role.kubernetes.io/etcd': 'true'}, 'server', 'node-role.kubernetes.io/etcd'),
    ({'node-role.kubernetes.io/master': ''}, 'server', 'node-role.kubernetes.io/master'),
    ({'node-role.kubernetes.io/etcd': 'true', 'node-role.kubernetes.io/control-plane': 'true'}, 'server',
     'node-role.kubernetes.io/control-plane'),
    ({'node-role.kubernetes.io/worker': 'true', 'nvidia.com/gpu.present': 'true'}, 'agent', None),
    ({}, 'agent', None),
    (None, 'agent', None),
])
def test_node_role_is_server_with_any_server_label(labels, role, label):
    got = _rke2.node_role(labels)
    assert (got.role, got.label) == (role, label)


def test_role_problem_names_the_declared_role_and_the_nodes():
    server = _rke2.node_role({'node-role.kubernetes.io/control-plane': 'true'})
    assert _rke2.role_problem('gpu-1', None, server) is None
    assert _rke2.role_problem('gpu-1', '', server) is None
    assert _rke2.role_problem('gpu-1', 'server', server) is None
    msg = _rke2.role_problem('gpu-1', 'agent', server, 'gpufleet_rke2_role')
    assert msg.startswith('gpufleet_rke2_role: node gpu-1 is declared an RKE2 agent, but its Node is an RKE2 server '
                          '(label node-role.kubernetes.io/control-plane=true)')
    assert 'not one of server, agent' in _rke2.role_problem('gpu-1', 'worker', server)
