# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of gpufleet.upgrade.drain_info: delegated to the controller (a local connection, no become) the
module's own code runs in Ansible's worker, without a Python start-up per call; anywhere else, or when the
controller's Python cannot import what the module needs, the module process runs (plugin_utils/_in_worker.py)."""
from __future__ import annotations

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import K8sInWorker


class ActionModule(K8sInWorker):
    NAME = 'drain_info'
