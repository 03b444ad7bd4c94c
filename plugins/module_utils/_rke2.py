# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside
# gpufleet.upgrade.
"""RKE2 release versions ``v1.MINOR.PATCH+rke2rREV`` and the upgrade-hop rule.

Only released versions of Kubernetes major 1 are accepted: the leading ``v`` is optional, a
pre-release suffix (``-rc1``) is refused. RKE2 is not treated as safely downgradeable, and a
hop may not skip a Kubernetes minor.
"""
from __future__ import annotations

import re
import typing as t

from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show

RKE2_FORMAT = 'v1.MINOR.PATCH+rke2rREV'
_NUM = r'(0|[1-9][0-9]*)'
_RKE2_RE = re.compile(r'v?1\.' + _NUM + r'\.' + _NUM + r'\+rke2r' + _NUM)
_MAJOR_RE = re.compile(r'v?([0-9]+)\.[0-9]+\.[0-9]+\+rke2r[0-9]+')
_PRERELEASE_RE = re.compile(r'v?[0-9]+\.[0-9]+\.[0-9]+-[0-9A-Za-z.-]+(\+.*)?')

DOWNGRADE = 'RKE2 downgrade is not allowed'
MINOR_SKIP = 'RKE2 upgrade cannot skip a Kubernetes minor'


class Rke2Version(t.NamedTuple):
    minor: int
    patch: int
    rev: int

    @property
    def kubernetes(self) -> str:
        return 'v1.%d.%d' % (self.minor, self.patch)

    def __str__(self) -> str:
        return 'v1.%d.%d+rke2r%d' % (self.minor, self.patch, self.rev)

    def as_dict(self) -> t.Dict[str, t.Any]:
        return {'minor': self.minor, 'patch': self.patch, 'rev': self.rev, 'kubernetes': self.kubernetes}


def parse(value: t.Any) -> Rke2Version:
    """Parse an RKE2 version or raise ValueError with a message that names it."""
    if not isinstance(value, str):
        raise ValueError('%s is not an RKE2 version string (expected %s)' % (show(value), RKE2_FORMAT))
    m = _RKE2_RE.fullmatch(value)
    if m:
        return Rke2Version(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    if _PRERELEASE_RE.fullmatch(value):
        reason = 'pre-release versions are not allowed'
    else:
        major = _MAJOR_RE.fullmatch(value)
        reason = 'the major version must be 1' if major and major.group(1) != '1' else 'expected %s' % RKE2_FORMAT
    raise ValueError('%s is not a valid RKE2 version: %s' % (show(value), reason))


def transition_problems(current: Rke2Version, target: Rke2Version) -> t.List[str]:
    """Problems of the hop current -> target: a downgrade, or a skipped Kubernetes minor."""
    if target < current:
        return [DOWNGRADE]
    if target.minor - current.minor > 1:
        return [MINOR_SKIP]
    return []


# The labels RKE2 puts on a server's Node (any of them: an etcd-only or a control-plane-only server is a
# server too); an agent has none. The Node is the truth: no per-host variable decides the role.
CONTROL_PLANE_LABEL = 'node-role.kubernetes.io/control-plane'
SERVER_ROLE_LABELS = (CONTROL_PLANE_LABEL, 'node-role.kubernetes.io/etcd', 'node-role.kubernetes.io/master')
ROLES = ('server', 'agent')


class NodeRole(t.NamedTuple):
    """A Node's RKE2 role and the label that says so (None for an agent) with its value."""
    role: str
    label: t.Optional[str] = None
    value: t.Optional[str] = None

    def __str__(self) -> str:
        if self.label is None:
            return '%s (none of the labels %s)' % (self.role, ', '.join(SERVER_ROLE_LABELS))
        return '%s (label %s=%s)' % (self.role, self.label, self.value)


def node_role(labels: t.Any) -> NodeRole:
    """The RKE2 role of a Node from its labels: ``server`` when it carries any of ``SERVER_ROLE_LABELS``
    (whatever the value: Kubernetes role labels count by their presence; RKE2 sets them to "true"), the
    first of them in that order naming why; otherwise ``agent``."""
    labels = labels if isinstance(labels, dict) else {}
    for key in SERVER_ROLE_LABELS:
        if key in labels:
            return NodeRole('server', key, str(labels[key]))
    return NodeRole('agent')


def role_problem(node: str, declared: t.Any, actual: NodeRole, field: str = 'role') -> t.Optional[str]:
    """The refusal when a role declared for ``node`` (a per-host variable) is not the one its Node has,
    naming both; None when it agrees or none is declared (None or empty)."""
    if declared is None or declared == '':
        return None
    if declared not in ROLES:
        return '%s: %s for node %s is not one of %s' % (field, show(declared), node, ', '.join(ROLES))
    if declared != actual.role:
        return ('%s: node %s is declared an RKE2 %s, but its Node is an RKE2 %s; the Node decides: remove the '
                'declaration (or correct the Node\'s labels)' % (field, node, declared, actual))
    return None
