# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Documentation: workload_suite.yml next to this file.

from __future__ import annotations

import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _workload_suite


def workload_suite(manifests: t.Any, gpus: t.Any = None, skip: t.Any = None, image_mirror: t.Any = None) -> t.Dict[str, t.Any]:
    """The workload_gate cases of a suite of annotated Job manifests (module_utils/_workload_suite.py)."""
    try:
        return _workload_suite.cases(manifests, gpus, skip, image_mirror)
    except _workload_suite.SuiteError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.workload_suite: %s' % exc)


def image_mirror(image: t.Any, mirror: t.Any = None) -> str:
    """An image reference as an air-gapped site's mirror serves it (module_utils/_workload_suite.py mirrored())."""
    try:
        return _workload_suite.mirrored(image, mirror)
    except _workload_suite.SuiteError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.image_mirror: %s' % exc)


class FilterModule:
    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'workload_suite': workload_suite, 'image_mirror': image_mirror}
