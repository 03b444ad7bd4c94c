# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of gpufleet.upgrade.node_snapshot: the snapshot file lives on the controller.

captured: run the module on the node (read only), then write its document to `path` here
(atomically, mode 0600), unless a snapshot is already there and `force` is false.
restored: read `path` here, verify its digest, pass the document to the module on the node.
"""
from __future__ import annotations

import json
import os

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.upgrade.plugins.module_utils._fsio import read_text, write_text
from ansible_collections.gpufleet.upgrade.plugins.module_utils._snapshot import (
    SnapshotError, dump_document, kept_snapshot_problem, verify_document)

MODULE = 'gpufleet.upgrade.node_snapshot'


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _path(self, args):
        path = args.get('path') or args.get('dest') or args.get('src')
        if not path:
            raise AnsibleActionFail('node_snapshot: path is required (the snapshot file on the controller)')
        path = os.path.expanduser(to_text(path))
        if not os.path.isabs(path):
            path = os.path.join(self._loader.get_basedir(), path)
        return path

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        try:
            path = self._path(args)
            for alias in ('dest', 'src'):
                args.pop(alias, None)
            args['path'] = path
            state = args.get('state', 'captured')
            if state == 'captured':
                return self._capture(result, args, path, task_vars)
            if state == 'restored':
                return self._restore(result, args, path, task_vars)
            raise AnsibleActionFail('node_snapshot: state must be captured or restored, got %r' % (state,))
        except AnsibleActionFail as e:
            result.update(failed=True, msg=to_text(e.message))
            return result

    def _capture(self, result, args, path, task_vars):
        existing = read_text(path)
        force = self._task.args.get('force', False)
        if isinstance(force, str):
            force = force.lower() in ('yes', 'true', '1', 'on')
        if existing is not None and not force:
            try:
                snap = verify_document(existing)
            except SnapshotError as e:
                raise AnsibleActionFail('node_snapshot: %s exists and is not a valid snapshot (%s); '
                                        'set force: true to replace it' % (path, e))
            problem = kept_snapshot_problem(snap, args.get('gpu_facts'))
            if problem:
                raise AnsibleActionFail('node_snapshot: %s: %s' % (path, problem))
            doc = json.loads(existing)
            result.update(changed=False, path=path, sha256=doc['sha256'], snapshot=snap, document=doc,
                          msg='snapshot %s exists; kept (force: false)' % path)
            return result
        mod = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
        if mod.get('failed'):
            result.update(mod)
            return result
        text = dump_document(mod['document'])
        changed = text != existing
        if changed and not self._play_context.check_mode:
            write_text(path, text, 0o600, prefix='.snapshot-')
        result.update(changed=changed, path=path, sha256=mod['sha256'], snapshot=mod['snapshot'],
                      document=mod['document'])
        if self._play_context.diff:
            result['diff'] = {'before_header': path, 'after_header': path, 'before': existing or '', 'after': text}
        return result

    def _restore(self, result, args, path, task_vars):
        if not os.path.isfile(path):
            raise AnsibleActionFail('node_snapshot: snapshot file %s does not exist on the controller' % path)
        with open(path, 'r', encoding='utf-8') as f:
            text = f.read()
        try:
            verify_document(text, args.get('sha256'))
        except SnapshotError as e:
            raise AnsibleActionFail('node_snapshot: %s: %s' % (path, e))
        args['snapshot'] = json.loads(text)
        mod = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
        result.update(mod)
        return result
