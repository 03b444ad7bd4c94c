# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Used by the evidence module and its action plugin.
"""One update of the evidence bundle file: lock it, read it, merge the entries, write it back atomically.

The evidence module and its action plugin share this: the action plugin runs it inside Ansible's worker
when the task runs on the controller itself (a local connection without become), the module everywhere
else. ``ARGUMENT_SPEC`` is the options of both; ``update_bundle`` takes them validated.
"""
from __future__ import annotations

import os
from typing import Any, Dict

from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence import (
    EvidenceError, dumps, loads, merge, new_bundle, render_html, summary)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._fsio import LockTimeout, lock_exclusive, read_text, write_text

__all__ = ['ARGUMENT_SPEC', 'UPDATES', 'update_bundle']

ARGUMENT_SPEC: Dict[str, Dict[str, Any]] = dict(
    path=dict(type='path', required=True),
    id=dict(type='str'),
    tuple_before=dict(type='dict'),
    tuple_after=dict(type='dict'),
    nodes=dict(type='list', elements='dict', default=[]),
    artifacts=dict(type='list', elements='dict', default=[]),
    batches=dict(type='list', elements='dict', default=[]),
    gates=dict(type='list', elements='dict', default=[]),
    actions=dict(type='list', elements='dict', default=[]),
    omitted=dict(type='list', elements='dict', default=[]),
    report=dict(type='path'),
    lock_timeout=dict(type='int', default=30),
    return_bundle=dict(type='bool', default=False),
)

# The options that add to the bundle (the rest say where and how).
UPDATES = ('tuple_before', 'tuple_after', 'nodes', 'artifacts', 'batches', 'gates', 'actions', 'omitted')


def update_bundle(params: Dict[str, Any], check_mode: bool = False, diff: bool = False) -> Dict[str, Any]:
    """Add `params`' entries to the bundle at params['path'] (created with params['id'] when missing) and
    write it, and the HTML report when params['report'] is set; in check mode, write nothing. Returns the
    module result (changed, path, summary, and bundle, report and diff when asked). Raises EvidenceError,
    its message starting with ``evidence:``, for bad input or a file that cannot be used; nothing is
    written then (an OSError reading or writing a file is reported the same way)."""
    try:
        return _update(params, check_mode, diff)
    except OSError as exc:
        raise EvidenceError('evidence: %s' % exc) from None


def _update(params: Dict[str, Any], check_mode: bool, diff: bool) -> Dict[str, Any]:
    path = params['path']
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise EvidenceError('evidence: directory %s of path does not exist' % directory)
    lock_timeout = params['lock_timeout']
    if lock_timeout < 1 or lock_timeout > 3600:
        raise EvidenceError('evidence: lock_timeout %r must be between 1 and 3600 seconds' % lock_timeout)
    report = params.get('report')
    handle = None
    if not check_mode:
        try:
            handle = lock_exclusive(path + '.lock', lock_timeout)
        except LockTimeout as exc:
            raise EvidenceError('evidence: %s' % exc) from None
    try:
        try:
            text = read_text(path, 'surrogateescape')
            if text is None:
                if not params.get('id'):
                    raise EvidenceError('id is required to create the bundle %s' % path)
                before = None
                bundle = new_bundle(params['id'])
            else:
                before = loads(text, path)
                if params.get('id') and params['id'] != before['id']:
                    raise EvidenceError('id: %r does not match the bundle id %r in %s' % (params['id'], before['id'], path))
                bundle = before
            after, changed = merge(bundle, dict((k, params.get(k)) for k in UPDATES))
            changed = changed or before is None
            report_html = render_html(after) if report else None
        except EvidenceError as exc:
            raise EvidenceError('evidence: %s' % exc) from None
        report_changed = report_html is not None and read_text(report, 'surrogateescape') != report_html
        if not check_mode:
            if changed:
                write_text(path, dumps(after), makedirs=False, prefix='.evidence-')
            if report_changed:
                rdir = os.path.dirname(os.path.abspath(report))
                if not os.path.isdir(rdir):
                    raise EvidenceError('evidence: directory %s of report does not exist' % rdir)
                write_text(report, report_html, makedirs=False, prefix='.evidence-')
    finally:
        if handle is not None:
            handle.close()
    result: Dict[str, Any] = dict(changed=changed or report_changed, path=path, summary=summary(after))
    if params.get('return_bundle'):
        result['bundle'] = after
    if report:
        result['report'] = report
    if diff:
        result['diff'] = dict(before=dumps(before) if before is not None else '', after=dumps(after),
                              before_header=path, after_header=path)
    return result
