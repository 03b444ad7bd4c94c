# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Who approved an AWX workflow's approval node, read from the AWX / Automation Controller API v2.

What it relies on (AWX 9.0 / Ansible Tower 3.6 and later, where ``approved_or_denied_by`` was added;
awx/api/serializers.py, WorkflowJobNodeSerializer and WorkflowApprovalSerializer):

- ``GET /api/v2/workflow_jobs/<id>/workflow_nodes/``: a page ``{count, next, previous, results}``;
  ``next`` is the next page's path (or URL), null on the last page. Each node has ``id``,
  ``identifier``, ``job`` (the id of the job the node spawned, null before it ran), ``do_not_run``
  and ``summary_fields``: ``job`` ``{id, name, status, failed, elapsed, type, timed_out}`` (``type``
  ``workflow_approval`` for an approval) once the node ran, and ``unified_job_template`` ``{id,
  name, unified_job_type}`` (``unified_job_type`` ``workflow_approval`` for an approval node).
- ``GET /api/v2/workflow_approvals/<id>/``: ``id``, ``name``, ``status`` (``pending`` while it waits,
  ``successful`` once approved, ``failed`` once denied or timed out), ``timed_out``, ``finished``
  and ``summary_fields.approved_or_denied_by`` ``{id, username, first_name, last_name}`` (the user
  who approved or denied it; absent while pending and after a timeout).

Pure: `read_approval` makes its requests through the `get` it is given (path or URL -> the decoded
JSON object); `http_error` words a failed request. The module does the HTTP (GET only).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from urllib.parse import urljoin, urlsplit

from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import show

APPROVAL_TYPE = 'workflow_approval'
APPROVED = 'successful'
PAGE_SIZE = 200
MAX_PAGES = 50
MAX_TIMEOUT = 300


class AwxApprovalError(ValueError):
    """Bad input, an answer of another shape than AWX's, or an approval that is not given (the message
    names the field and the value, never the token)."""


class ApprovalNode(NamedTuple):
    """An approval node of the workflow job, as its node list shows it."""
    node_id: int
    identifier: str
    name: str
    approval_id: Optional[int]   # the workflow approval the node spawned; None before the node ran
    do_not_run: bool


class Approval(NamedTuple):
    found: bool
    approval_id: Optional[int]
    approval_name: str
    node_identifier: str
    status: str
    approved_by: str
    approved_at: str
    msg: str

    def as_dict(self) -> Dict[str, Any]:
        return self._asdict()


# Page = the decoded JSON object at a path (or an absolute URL of the same controller).
Getter = Callable[[str], Any]


def check_url(value: Any) -> str:
    """The controller's base URL, without a trailing slash (V(awx.example.com) is taken as https, as
    awx.awx does); AwxApprovalError unless it is an http(s) URL without credentials, query or fragment."""
    if not isinstance(value, str) or not value.strip():
        raise AwxApprovalError('url: %s is not the controller\'s URL (set url, or CONTROLLER_HOST in the '
                               'environment: the Red Hat Ansible Automation Platform credential injects it)'
                               % show(value))
    url = value.strip()
    if '://' not in url:
        url = 'https://' + url
    parts = urlsplit(url)
    if parts.scheme not in ('http', 'https') or not parts.hostname:
        raise AwxApprovalError('url: %s is not an http(s) URL' % show(_shown(url)))
    if '@' in parts.netloc:
        raise AwxApprovalError('url: %s has credentials in it; give the token as token' % show(_shown(url)))
    if parts.query or parts.fragment:
        raise AwxApprovalError('url: %s has a query or a fragment; give the base URL' % show(_shown(url)))
    return url.rstrip('/')


def _shown(url: str) -> str:
    """`url` without its userinfo (for messages)."""
    return re.sub(r'(?i)^([a-z][a-z0-9+.-]*://)[^/?#@]*@', r'\1', url)


def check_workflow_job_id(value: Any) -> int:
    """A positive workflow job id (AWX's awx_workflow_job_id); an int or its digits."""
    if isinstance(value, bool):
        raise AwxApprovalError('workflow_job_id: %s is not a workflow job id' % show(value))
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or value < 1:
        raise AwxApprovalError('workflow_job_id: %s is not a workflow job id (a positive integer)' % show(value))
    return value


def check_timeout(value: Any) -> float:
    """Seconds per request, more than 0 and at most MAX_TIMEOUT."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT:
        raise AwxApprovalError('timeout: %s must be more than 0 and at most %d seconds' % (show(value), MAX_TIMEOUT))
    return float(value)


def check_token(value: Any) -> str:
    """The OAuth2 token; never shown, only said missing."""
    if not isinstance(value, str) or not value.strip():
        raise AwxApprovalError('token: none given (set token, or CONTROLLER_OAUTH_TOKEN in the environment: the Red '
                               'Hat Ansible Automation Platform credential injects it when its OAuth Token is set; a '
                               'username and password are not used)')
    if any(c in value for c in '\r\n'):
        raise AwxApprovalError('token: has a line break in it')
    return value.strip()


def nodes_path(workflow_job_id: int) -> str:
    return '/api/v2/workflow_jobs/%d/workflow_nodes/?page_size=%d' % (check_workflow_job_id(workflow_job_id), PAGE_SIZE)


def approval_path(approval_id: int) -> str:
    return '/api/v2/workflow_approvals/%d/' % approval_id


def next_page(base_url: str, current: str, page: Dict[str, Any]) -> Optional[str]:
    """The next page's path (relative to `base_url`), or None on the last page. A `next` on another scheme,
    host or port is refused: the token goes to the controller only."""
    following = page.get('next')
    if following in (None, ''):
        return None
    if not isinstance(following, str):
        raise AwxApprovalError('%s: next: %s is not a path' % (current, show(following)))
    absolute = urljoin(base_url + current, following)
    base, there = urlsplit(base_url), urlsplit(absolute)
    if (there.scheme, there.netloc) != (base.scheme, base.netloc):
        raise AwxApprovalError('%s: next: %s is not on the controller %s' % (current, show(_shown(following)), base_url))
    base_path = base.path.rstrip('/')
    path = there.path + ('?' + there.query if there.query else '')
    if base_path and path.startswith(base_path + '/'):
        path = path[len(base_path):]
    return path


def page_results(page: Any, where: str) -> List[Dict[str, Any]]:
    """The `results` of a list page, each a mapping."""
    if not isinstance(page, dict) or not isinstance(page.get('results'), list):
        raise AwxApprovalError('%s: results: not a list of the AWX API (got %s)' % (where, show(page)))
    for index, item in enumerate(page['results']):
        if not isinstance(item, dict):
            raise AwxApprovalError('%s: results[%d]: %s is not a workflow node' % (where, index, show(item)))
    return page['results']


def _mapping(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def approval_node(node: Dict[str, Any]) -> Optional[ApprovalNode]:
    """The node as an ApprovalNode when it is an approval node (its job's ``type``, or its template's
    ``unified_job_type``, is ``workflow_approval``), else None."""
    summary = _mapping(node.get('summary_fields'))
    job = _mapping(summary.get('job'))
    template = _mapping(summary.get('unified_job_template'))
    if job.get('type') != APPROVAL_TYPE and template.get('unified_job_type') != APPROVAL_TYPE:
        return None
    node_id = node.get('id')
    if isinstance(node_id, bool) or not isinstance(node_id, int):
        raise AwxApprovalError('workflow node: id: %s is not a node id' % show(node_id))
    approval_id = node.get('job') if node.get('job') is not None else job.get('id')
    if approval_id is not None and (isinstance(approval_id, bool) or not isinstance(approval_id, int)):
        raise AwxApprovalError('workflow node %d: job: %s is not a workflow approval id' % (node_id, show(approval_id)))
    name = job.get('name') or template.get('name') or ''
    return ApprovalNode(node_id=node_id, identifier=str(node.get('identifier') or ''), name=str(name),
                        approval_id=approval_id, do_not_run=node.get('do_not_run') is True)


def _label(node: ApprovalNode) -> str:
    return '%s (node %d%s)' % (show(node.name), node.node_id,
                               ', identifier %s' % show(node.identifier) if node.identifier else '')


def pick_approval(nodes: List[ApprovalNode], approval_name: Optional[str], workflow_job_id: int) -> Optional[ApprovalNode]:
    """The approval node to read: the one whose name (or node identifier) is `approval_name`, else the only one.
    None when the workflow has no approval node and no name was asked; AwxApprovalError when the asked one is
    not there or when several are and none was named."""
    where = 'workflow job %d' % workflow_job_id
    if approval_name:
        named = [n for n in nodes if approval_name in (n.name, n.identifier)]
        if not named:
            raise AwxApprovalError('approval_name: %s is no approval node of %s (its approval nodes: %s)'
                                   % (show(approval_name), where, ', '.join(_label(n) for n in nodes) or 'none'))
        nodes = named
    if not nodes:
        return None
    if len(nodes) > 1:
        raise AwxApprovalError('%s has %d approval nodes%s: %s; set approval_name to the one that approves'
                               % (where, len(nodes), ' named %s' % show(approval_name) if approval_name else '',
                                  ', '.join(_label(n) for n in nodes)))
    return nodes[0]


def judge(approval: Any, node: ApprovalNode) -> Approval:
    """The approval, read; AwxApprovalError unless it is approved (status ``successful``) by a named user."""
    where = 'workflow approval %s' % node.approval_id
    if not isinstance(approval, dict):
        raise AwxApprovalError('%s: %s is not a workflow approval of the AWX API' % (where, show(approval)))
    status = approval.get('status')
    if not isinstance(status, str) or not status:
        raise AwxApprovalError('%s: status: %s is not an AWX job status' % (where, show(status)))
    name = str(approval.get('name') or node.name)
    by = _mapping(_mapping(approval.get('summary_fields')).get('approved_or_denied_by')).get('username')
    label = '%s %s' % (where, show(name))
    if status != APPROVED:
        if approval.get('timed_out') is True:
            why = 'timed out, nobody approved it'
        elif status == 'failed':
            why = 'was denied by %s' % show(by) if by else 'failed (denied)'
        elif status in ('pending', 'waiting', 'new', 'running'):
            why = 'is not approved yet (status %s)' % show(status)
        else:
            why = 'is not approved (status %s)' % show(status)
        raise AwxApprovalError('%s %s; the approver must approve it in AWX' % (label, why))
    if not isinstance(by, str) or not by.strip():
        raise AwxApprovalError('%s: summary_fields.approved_or_denied_by.username: %s is not a user name (AWX 9.0 or '
                               'later records who approved)' % (label, show(by)))
    finished = approval.get('finished')
    return Approval(found=True, approval_id=node.approval_id, approval_name=name, node_identifier=node.identifier,
                    status=status, approved_by=by.strip(), approved_at=finished if isinstance(finished, str) else '',
                    msg='%s approved by %s' % (label, show(by.strip())))


def read_approval(get: Getter, base_url: str, workflow_job_id: int, approval_name: Optional[str] = None,
                  fail_when_missing: bool = True) -> Approval:
    """Read the workflow job's nodes (every page), pick its approval node, read the approval and judge it.
    `get(path)` returns the decoded JSON object at `path` (relative to `base_url`) or raises."""
    workflow_job_id = check_workflow_job_id(workflow_job_id)
    path: Optional[str] = nodes_path(workflow_job_id)
    nodes: List[ApprovalNode] = []
    pages = 0
    while path is not None:
        pages += 1
        if pages > MAX_PAGES:
            raise AwxApprovalError('workflow job %d: more than %d pages of workflow nodes' % (workflow_job_id, MAX_PAGES))
        page = get(path)
        nodes.extend(n for n in (approval_node(item) for item in page_results(page, path)) if n is not None)
        path = next_page(base_url, path, page)
    node = pick_approval(nodes, approval_name, workflow_job_id)
    if node is None:
        msg = 'workflow job %d has no approval node' % workflow_job_id
        if fail_when_missing:
            raise AwxApprovalError(msg)
        return Approval(found=False, approval_id=None, approval_name='', node_identifier='', status='',
                        approved_by='', approved_at='', msg=msg)
    if node.approval_id is None:
        raise AwxApprovalError('approval node %s of workflow job %d %s; the approver must approve it in AWX'
                               % (_label(node), workflow_job_id,
                                  'is not on the path the workflow took' if node.do_not_run else 'has not run yet'))
    return judge(get(approval_path(node.approval_id)), node)


def http_error(status: int, url: str, detail: Any = None) -> str:
    """A failed request in words: the URL (never the token) and what the status means."""
    hint = {401: 'the token was refused (expired, revoked or wrong)',
            403: 'the token\'s user may not read it (it needs read access to the workflow job)',
            404: 'no such object, or the token\'s user may not see it'}.get(status, '')
    text = 'GET %s answered HTTP %d' % (_shown(url), status)
    if hint:
        text += ': ' + hint
    if isinstance(detail, str) and detail.strip():
        text += ' (%s)' % show(detail.strip(), 200)
    return text
