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
