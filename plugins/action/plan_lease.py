# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of gpufleet.upgrade.plan_lease: delegated to the controller (a local connection, no become) the
module's own code runs in Ansible's worker, without a Python start-up per call; anywhere else, or when the
controller's Python cannot import what the module needs, the module process runs (plugin_utils/_in_worker.py).

Without `holder`, the run's id is set here, in Ansible's worker on the controller: in AWX the job template's
(`awx:template-<id>`), otherwise the ansible-playbook process's (the worker's parent) with its start time."""
from __future__ import annotations

import getpass
import os
import socket

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _lease
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import K8sInWorker


def default_holder(task_vars: dict) -> str:
    """The run id of the play that runs this task."""
    template = (task_vars or {}).get('awx_job_template_id') or (task_vars or {}).get('tower_job_template_id')
    if template not in (None, ''):
        return _lease.check_holder('awx:template-%s' % template)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    pid = os.getppid()
    return _lease.cli_holder(user, socket.gethostname(), pid, _lease.process_start(pid) or 0)


class ActionModule(K8sInWorker):
    NAME = 'plan_lease'

    def run(self, tmp=None, task_vars=None):
        if self._task.args.get('holder') in (None, ''):
            try:
                self._task.args['holder'] = default_holder(task_vars or {})
            except _lease.LeaseError as exc:
                return {'failed': True, 'msg': 'gpufleet.upgrade.plan_lease: %s' % exc}
        return super().run(tmp, task_vars)
