# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of gpufleet.upgrade.gpu_gate.

With `facts` given (the node's gpu_info facts, read by an earlier task) the gate reads nothing on the node: it
is judged here, in Ansible's worker, with the module's options and checks (module_utils/_gpu_gate.py), and no
module is sent to the node. Without `facts` the module runs on the node and reads them there.
"""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_gate import ARGUMENT_SPEC, judge
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import ArgumentError, module_params

MODULE = 'gpufleet.upgrade.gpu_gate'


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        if self._task.args.get('facts') is None:
            result.update(self._execute_module(module_name=MODULE, module_args=self._task.args, task_vars=task_vars))
            return result
        try:
            params = module_params(self._task.args, ARGUMENT_SPEC, MODULE)
        except ArgumentError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(judge(params['facts'], params))
        return result
