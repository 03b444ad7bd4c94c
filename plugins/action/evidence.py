# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of gpufleet.upgrade.evidence: the bundle lives on the controller.

When the task runs on the controller itself (a local connection, no become), the update runs here, in
Ansible's worker, instead of in a module process: the same options, validation, lock, merge and atomic
write (module_utils/_evidence_file.py), without a Python start-up per call (a rollout records a few
entries per node). Anywhere else (delegated to another host, or with become) the module runs as before.
"""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence import EvidenceError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence_file import ARGUMENT_SPEC, update_bundle
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import ArgumentError, module_params, runs_here

MODULE = 'gpufleet.upgrade.evidence'


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        if not runs_here(self):
            result.update(self._execute_module(module_name=MODULE, module_args=self._task.args, task_vars=task_vars))
            return result
        try:
            params = module_params(self._task.args, ARGUMENT_SPEC, MODULE)
            result.update(update_bundle(params, check_mode=bool(self._task.check_mode), diff=bool(self._task.diff)))
        except (ArgumentError, EvidenceError) as exc:
            result.update(failed=True, msg=str(exc))
        return result
