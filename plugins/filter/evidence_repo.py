# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Documentation: the YAML file of each filter next to this file.

"""The playbooks' decisions around the evidence repository (AWX): where a job's files are, what it
commits, and whether a record's approver is a second operator (thin: _evidence_repo decides)."""

from __future__ import annotations

import os
import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence_repo


def _call(name: str, fn: t.Callable[..., t.Any], *args: t.Any) -> t.Any:
    try:
        return fn(*args)
    except _evidence_repo.RepoError as exc:
        raise AnsibleFilterError('gpufleet.upgrade.%s: %s' % (name, exc))


def evidence_path(path: t.Any, root: t.Any = '', field: str = 'path') -> str:
    # A filter runs in the ansible-playbook process, whose working directory is where the operator started
    # it; modules and the pipe lookup run in the playbook's directory (inside the installed collection).
    return _call('evidence_path', _evidence_repo.repo_path, path, root, field, os.getcwd())


def user_path(path: t.Any, field: str = 'path') -> str:
    return _call('user_path', _evidence_repo.user_path, path, os.getcwd(), field)


def evidence_relative(paths: t.Any, root: t.Any = '') -> t.List[str]:
    return _call('evidence_relative', _evidence_repo.repo_relative, paths, root)


def self_approvals(approvals: t.Any, authors: t.Any) -> t.List[str]:
    return _call('self_approvals', _evidence_repo.self_approvals, approvals, authors)


def approval_problems(infos: t.Any, approver: t.Any, authors: t.Any) -> t.List[str]:
    return _call('approval_problems', _evidence_repo.approval_problems, infos, approver, authors)


class FilterModule:
    def filters(self) -> t.Dict[str, t.Callable[..., t.Any]]:
        return {'evidence_path': evidence_path, 'user_path': user_path, 'evidence_relative': evidence_relative,
                'self_approvals': self_approvals, 'approval_problems': approval_problems}
