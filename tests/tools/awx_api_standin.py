"""A stand-in for the AWX / Automation Controller API v2, for the tests of gpufleet.upgrade.awx_approval_info.

AWX itself cannot run on the test machine (it needs its PostgreSQL, Redis, receptor and task containers, and
receptor could not be built here: see docs/awx.md "What is tested"), so this small standard-library HTTP server
serves, from a fixture, the two read paths the module uses, in the JSON shape AWX returns them
(awx/api/serializers.py of ansible/awx: WorkflowJobNodeSerializer, WorkflowApprovalSerializer; the list pages of
awx/api/pagination.py):

- GET /api/v2/workflow_jobs/<id>/workflow_nodes/ : {count, next, previous, results}, paginated by `page` and
  `page_size` (capped by the fixture's `max_page_size`, to make pages); `next`/`previous` are paths with the query,
  as AWX gives them. Each node: id, type "workflow_job_node", url, related, summary_fields {job {id, name,
  description, status, failed, elapsed, type, timed_out (approvals)}, unified_job_template {id, name, description,
  unified_job_type}, workflow_job {id, name, description}}, created, modified, job, workflow_job,
  unified_job_template, success_nodes, failure_nodes, always_nodes, all_parents_must_converge, do_not_run,
  identifier.
- GET /api/v2/workflow_approvals/<id>/ : id, type "workflow_approval", url, related, summary_fields
  {workflow_job, workflow_approval_template, unified_job_template, approved_or_denied_by {id, username,
  first_name, last_name} (once approved or denied)}, name, status ("pending", "successful" = approved, "failed" =
  denied or timed out), failed, started, finished, elapsed, can_approve_or_deny, approval_expiration, timed_out.

Like AWX, it answers 401 {"detail": "Authentication credentials were not provided."} without an
`Authorization: Bearer <token>` header carrying the fixture's token, 404 {"detail": "Not found."} for anything
else, and 405 for any method but GET. It records every request (method, path, whether it was authorized) in
`requests`, so a test can check that only GETs were made.

Run alone: python tests/tools/awx_api_standin.py FIXTURE.json [PORT] (the token is the fixture's `token`).
"""
from __future__ import annotations

import copy
import http.server
import json
import re
import sys
import threading
from typing import Any, Dict, List, Optional
from urllib.parse import parse_qs, urlsplit

NODES_RE = re.compile(r'^/api/v2/workflow_jobs/(\d+)/workflow_nodes/$')
APPROVAL_RE = re.compile(r'^/api/v2/workflow_approvals/(\d+)/$')


def job_node(node_id: int, workflow_job_id: int, identifier: str, template: str, job_id: Optional[int] = None,
             status: str = 'successful') -> Dict[str, Any]:
    """A workflow job node that runs a job template (its job `job_id`, or none yet)."""
    return _node(node_id, workflow_job_id, identifier, template, 'job', job_id, status, timed_out=None)


def approval_node(node_id: int, workflow_job_id: int, identifier: str, name: str, approval_id: Optional[int] = None,
                  status: str = 'successful', timed_out: bool = False, do_not_run: bool = False) -> Dict[str, Any]:
    """A workflow job node of an approval (its workflow approval `approval_id`, or none before it ran)."""
    node = _node(node_id, workflow_job_id, identifier, name, 'workflow_approval', approval_id, status, timed_out)
    node['do_not_run'] = do_not_run
    return node


def _node(node_id: int, wj: int, identifier: str, name: str, kind: str, job_id: Optional[int], status: str,
          timed_out: Optional[bool]) -> Dict[str, Any]:
    ujt_id = 100 + node_id
    ujt_path = ('/api/v2/workflow_approval_templates/%d/' if kind == 'workflow_approval' else '/api/v2/job_templates/%d/') % ujt_id
    summary: Dict[str, Any] = {
        'workflow_job': {'id': wj, 'name': 'gpufleet GPU upgrade', 'description': ''},
        'unified_job_template': {'id': ujt_id, 'name': name, 'description': '', 'unified_job_type': kind},
    }
    related = {'credentials': '/api/v2/workflow_job_nodes/%d/credentials/' % node_id,
               'success_nodes': '/api/v2/workflow_job_nodes/%d/success_nodes/' % node_id,
               'failure_nodes': '/api/v2/workflow_job_nodes/%d/failure_nodes/' % node_id,
               'always_nodes': '/api/v2/workflow_job_nodes/%d/always_nodes/' % node_id,
               'unified_job_template': ujt_path, 'workflow_job': '/api/v2/workflow_jobs/%d/' % wj}
    if job_id is not None:
        summary['job'] = {'id': job_id, 'name': name, 'description': '', 'status': status,
                          'failed': status in ('failed', 'error'), 'elapsed': 12.5, 'type': kind}
        if kind == 'workflow_approval':
            summary['job']['timed_out'] = bool(timed_out)
            related['job'] = '/api/v2/workflow_approvals/%d/' % job_id
        else:
            related['job'] = '/api/v2/jobs/%d/' % job_id
    return {'id': node_id, 'type': 'workflow_job_node', 'url': '/api/v2/workflow_job_nodes/%d/' % node_id,
            'related': related, 'summary_fields': summary, 'created': '2026-12-03T06:00:00.000000Z',
            'modified': '2026-12-03T06:00:00.000000Z', 'extra_data': {}, 'inventory': None, 'scm_branch': None,
            'job_type': None, 'job_tags': None, 'skip_tags': None, 'limit': None, 'diff_mode': None,
            'verbosity': None, 'execution_environment': None, 'forks': None, 'job_slice_count': None,
            'timeout': None, 'job': job_id, 'workflow_job': wj, 'unified_job_template': ujt_id,
            'success_nodes': [], 'failure_nodes': [], 'always_nodes': [], 'all_parents_must_converge': False,
            'do_not_run': False, 'identifier': identifier}


def approval(approval_id: int, workflow_job_id: int, name: str, status: str = 'successful',
             by: Optional[str] = 'bob', timed_out: bool = False) -> Dict[str, Any]:
    """A workflow approval: status "successful" (approved by `by`), "failed" (denied by `by`, or timed out with no
    one), or "pending"."""
    summary: Dict[str, Any] = {
        'workflow_job_template': {'id': 7, 'name': 'gpufleet GPU upgrade', 'description': ''},
        'workflow_job': {'id': workflow_job_id, 'name': 'gpufleet GPU upgrade', 'description': ''},
        'workflow_approval_template': {'id': 8, 'name': name, 'description': '', 'timeout': 0},
        'unified_job_template': {'id': 8, 'name': name, 'description': '', 'unified_job_type': 'workflow_approval'},
        'created_by': {'id': 1, 'username': 'alice', 'first_name': '', 'last_name': ''},
        'user_capabilities': {'delete': False, 'start': False},
        'source_workflow_job': {'id': workflow_job_id, 'name': 'gpufleet GPU upgrade', 'description': '',
                                'status': 'running', 'failed': False, 'elapsed': 0.0},
    }
    related = {'created_by': '/api/v2/users/1/', 'unified_job_template': '/api/v2/workflow_approval_templates/8/',
               'source_workflow_job': '/api/v2/workflow_jobs/%d/' % workflow_job_id,
               'workflow_approval_template': '/api/v2/workflow_approval_templates/8/',
               'approve': '/api/v2/workflow_approvals/%d/approve/' % approval_id,
               'deny': '/api/v2/workflow_approvals/%d/deny/' % approval_id}
    done = status != 'pending'
    if by and done and not timed_out:
        summary['approved_or_denied_by'] = {'id': 2, 'username': by, 'first_name': '', 'last_name': ''}
        related['approved_or_denied_by'] = '/api/v2/users/2/'
    return {'id': approval_id, 'type': 'workflow_approval', 'url': '/api/v2/workflow_approvals/%d/' % approval_id,
            'related': related, 'summary_fields': summary, 'created': '2026-12-03T06:50:00.000000Z',
            'modified': '2026-12-03T07:00:00.000000Z', 'name': name, 'description': '',
            'unified_job_template': 8, 'launch_type': 'workflow', 'status': status, 'failed': status == 'failed',
            'started': '2026-12-03T06:50:00.000000Z', 'finished': '2026-12-03T07:00:00.123456Z' if done else None,
            'canceled_on': None, 'elapsed': 600.1 if done else 0.0, 'job_explanation': '', 'work_unit_id': None,
            'can_approve_or_deny': status == 'pending', 'approval_expiration': None, 'timed_out': timed_out}


class StandIn:
    """The server, on 127.0.0.1 and a free port, in a thread. `fixture`: {token, max_page_size (optional),
    workflow_jobs: {id: [nodes]}, workflow_approvals: {id: approval}} (ids as strings or ints)."""

    def __init__(self, fixture: Dict[str, Any], port: int = 0) -> None:
        self.fixture = copy.deepcopy(fixture)
        self.requests: List[Dict[str, Any]] = []
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                return

            def _answer(self, status: int, body: Dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                if status == 405:
                    self.send_header('Allow', 'GET, HEAD, OPTIONS')
                self.end_headers()
                self.wfile.write(data)

            def _any(self) -> None:
                header = self.headers.get('Authorization') or ''
                authorized = header == 'Bearer %s' % standin.fixture['token']
                standin.requests.append({'method': self.command, 'path': self.path, 'authorized': authorized})
                if not authorized:
                    return self._answer(401, {'detail': 'Authentication credentials were not provided.'})
                if self.command != 'GET':
                    return self._answer(405, {'detail': 'Method "%s" not allowed.' % self.command})
                status, body = standin.answer(self.path)
                return self._answer(status, body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.server = http.server.ThreadingHTTPServer(('127.0.0.1', port), Handler)
        self.url = 'http://127.0.0.1:%d' % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, raw_path: str) -> tuple:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        match = NODES_RE.match(parts.path)
        if match:
            nodes = self.fixture.get('workflow_jobs', {}).get(match.group(1))
            if nodes is None:
                nodes = self.fixture.get('workflow_jobs', {}).get(int(match.group(1)))
            if nodes is None:
                return 404, {'detail': 'Not found.'}
            size = min(int(query.get('page_size', ['25'])[0]), int(self.fixture.get('max_page_size', 200)))
            page = int(query.get('page', ['1'])[0])
            start = (page - 1) * size
            if page < 1 or (start >= len(nodes) and page != 1):
                return 404, {'detail': 'Invalid page.'}

            def link(n: int) -> Optional[str]:
                return '%s?page=%d&page_size=%d' % (parts.path, n, size)
            return 200, {'count': len(nodes), 'next': link(page + 1) if start + size < len(nodes) else None,
                         'previous': link(page - 1) if page > 1 else None, 'results': nodes[start:start + size]}
        match = APPROVAL_RE.match(parts.path)
        if match:
            approvals = self.fixture.get('workflow_approvals', {})
            found = approvals.get(match.group(1), approvals.get(int(match.group(1))))
            if found is None:
                return 404, {'detail': 'Not found.'}
            return 200, found
        return 404, {'detail': 'Not found.'}

    def __enter__(self) -> 'StandIn':
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == '__main__':
    with open(sys.argv[1]) as handle:
        loaded = json.load(handle)
    with StandIn(loaded, int(sys.argv[2]) if len(sys.argv) > 2 else 0) as running:
        print(running.url, flush=True)
        running.thread.join()
