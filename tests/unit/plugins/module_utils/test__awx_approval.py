"""Issue 17: who approved the AWX workflow's approval node, read from the AWX API (pure part): the node list's
pages, picking the approval node, the approval's verdict, and the inputs. The AWX-shaped objects come from the
API stand-in's builders (tests/tools/awx_api_standin.py), which mirror AWX's serializers."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _awx_approval as A
from ansible_collections.gpufleet.upgrade.plugins.module_utils._awx_approval import AwxApprovalError
from tools.awx_api_standin import StandIn, approval, approval_node, job_node

BASE = 'https://awx.example.com'
WJ = 5


def fake_get(nodes, approvals, page_size=2):
    """get(path) answering like the stand-in (same pagination), without a socket; records the paths."""
    standin = StandIn({'token': 't', 'max_page_size': page_size, 'workflow_jobs': {str(WJ): nodes},
                       'workflow_approvals': {str(k): v for k, v in approvals.items()}})
    standin.server.server_close()
    seen = []

    def get(path):
        seen.append(path)
        status, body = standin.answer(path)
        if status != 200:
            raise AwxApprovalError(A.http_error(status, BASE + path, body.get('detail')))
        return body
    return get, seen


def workflow(*extra):
    return [job_node(1, WJ, 'plan', 'gpufleet plan', 11), job_node(2, WJ, 'canary', 'gpufleet canary', 12),
            *extra, job_node(9, WJ, 'approve', 'gpufleet approve', 19, status='running')]


def test_reads_the_approver_across_pages():
    nodes = workflow(job_node(3, WJ, 'preflight', 'gpufleet preflight', 13),
                     approval_node(4, WJ, 'approval', 'second operator approves', 42))
    get, seen = fake_get(nodes, {42: approval(42, WJ, 'second operator approves', by='bob')})
    got = A.read_approval(get, BASE, WJ)
    assert got == A.Approval(found=True, approval_id=42, approval_name='second operator approves',
                             node_identifier='approval', status='successful', approved_by='bob',
                             approved_at='2026-12-03T07:00:00.123456Z',
                             msg='workflow approval 42 "second operator approves" approved by "bob"')
    # five nodes, two per page: three pages followed by `next`, then the approval
    assert seen == ['/api/v2/workflow_jobs/5/workflow_nodes/?page_size=200',
                    '/api/v2/workflow_jobs/5/workflow_nodes/?page=2&page_size=2',
                    '/api/v2/workflow_jobs/5/workflow_nodes/?page=3&page_size=2',
                    '/api/v2/workflow_approvals/42/']
    assert got.as_dict()['approved_by'] == 'bob'


def test_an_approval_node_is_known_by_its_template_before_it_ran():
    node = approval_node(4, WJ, 'approval', 'gate', None)
    assert 'job' not in node['summary_fields'] and node['job'] is None
    assert A.approval_node(node) == A.ApprovalNode(4, 'approval', 'gate', None, False)
    assert A.approval_node(job_node(1, WJ, 'plan', 'gpufleet plan', 11)) is None
    # by the job's type alone too
    ran = approval_node(4, WJ, 'approval', 'gate', 42)
    del ran['summary_fields']['unified_job_template']
    assert A.approval_node(ran) == A.ApprovalNode(4, 'approval', 'gate', 42, False)
    with pytest.raises(AwxApprovalError, match=r'workflow node 4: job: "x" is not a workflow approval id'):
        A.approval_node(dict(ran, job='x'))


def test_picking_the_approval_node():
    one, two = A.ApprovalNode(4, 'first', 'canary approval', 42, False), A.ApprovalNode(6, 'second', 'rollout approval', 43, False)
    assert A.pick_approval([one], None, WJ) == one
    assert A.pick_approval([one, two], 'rollout approval', WJ) == two
    assert A.pick_approval([one, two], 'first', WJ) == one   # by node identifier too
    assert A.pick_approval([], None, WJ) is None
    with pytest.raises(AwxApprovalError) as err:
        A.pick_approval([one, two], None, WJ)
    assert str(err.value) == ('workflow job 5 has 2 approval nodes: "canary approval" (node 4, identifier "first"), '
                              '"rollout approval" (node 6, identifier "second"); set approval_name to the one that approves')
    with pytest.raises(AwxApprovalError, match=r'approval_name: "other" is no approval node of workflow job 5 '
                                               r'\(its approval nodes: "canary approval" \(node 4'):
        A.pick_approval([one, two], 'other', WJ)
    with pytest.raises(AwxApprovalError, match=r'approval_name: "other" is no approval node of workflow job 5 '
                                               r'\(its approval nodes: none\)'):
        A.pick_approval([], 'other', WJ)


def test_no_approval_node_fails_or_is_reported_not_found():
    get, seen = fake_get(workflow(), {})
    with pytest.raises(AwxApprovalError, match='^workflow job 5 has no approval node$'):
        A.read_approval(get, BASE, WJ)
    got = A.read_approval(get, BASE, WJ, fail_when_missing=False)
    assert got.found is False and got.approved_by == '' and got.approval_id is None
    assert not any('workflow_approvals' in p for p in seen)


@pytest.mark.parametrize('kwargs, node_kw, msg', [
    (dict(status='failed', by='carol'), {},
     'workflow approval 42 "gate" was denied by "carol"; the approver must approve it in AWX'),
    (dict(status='failed', by=None, timed_out=True), {},
     'workflow approval 42 "gate" timed out, nobody approved it; the approver must approve it in AWX'),
    (dict(status='pending'), {},
     'workflow approval 42 "gate" is not approved yet (status "pending"); the approver must approve it in AWX'),
    (dict(status='canceled'), {},
     'workflow approval 42 "gate" is not approved (status "canceled"); the approver must approve it in AWX'),
])
def test_an_approval_that_is_not_given_fails(kwargs, node_kw, msg):
    get, _seen = fake_get(workflow(approval_node(4, WJ, 'approval', 'gate', 42)), {42: approval(42, WJ, 'gate', **kwargs)})
    with pytest.raises(AwxApprovalError) as err:
        A.read_approval(get, BASE, WJ)
    assert str(err.value) == msg


def test_an_approval_node_not_run_or_off_the_path_fails():
    get, _seen = fake_get(workflow(approval_node(4, WJ, 'approval', 'gate', None)), {})
    with pytest.raises(AwxApprovalError, match=r'approval node "gate" \(node 4, identifier "approval"\) of workflow '
                                               r'job 5 has not run yet'):
        A.read_approval(get, BASE, WJ)
    get, _seen = fake_get(workflow(approval_node(4, WJ, 'approval', 'gate', None, do_not_run=True)), {})
    with pytest.raises(AwxApprovalError, match='is not on the path the workflow took'):
        A.read_approval(get, BASE, WJ)


def test_missing_or_malformed_fields_are_named():
    node = A.ApprovalNode(4, 'approval', 'gate', 42, False)
    no_user = approval(42, WJ, 'gate')
    del no_user['summary_fields']['approved_or_denied_by']
    with pytest.raises(AwxApprovalError, match=r'workflow approval 42 "gate": summary_fields.approved_or_denied_by.'
                                               r'username: None is not a user name'):
        A.judge(no_user, node)
    with pytest.raises(AwxApprovalError, match=r'workflow approval 42: status: None is not an AWX job status'):
        A.judge({'id': 42}, node)
    with pytest.raises(AwxApprovalError, match=r"workflow approval 42: \[\] is not a workflow approval"):
        A.judge([], node)
    with pytest.raises(AwxApprovalError, match=r"/x: results: not a list of the AWX API \(got \{'detail': 'no'\}\)"):
        A.page_results({'detail': 'no'}, '/x')
    with pytest.raises(AwxApprovalError, match=r"/x: results\[0\]: 3 is not a workflow node"):
        A.page_results({'results': [3]}, '/x')
    with pytest.raises(AwxApprovalError, match=r"workflow node: id: None is not a node id"):
        A.approval_node({'summary_fields': {'job': {'type': 'workflow_approval'}}})
    # an approval without `finished` still names its approver
    unfinished = dict(approval(42, WJ, 'gate'), finished=None)
    assert A.judge(unfinished, node).approved_at == ''


def test_next_page_stays_on_the_controller():
    cur = '/api/v2/workflow_jobs/5/workflow_nodes/?page_size=200'
    assert A.next_page(BASE, cur, {'next': None}) is None
    assert A.next_page(BASE, cur, {'next': '/api/v2/workflow_jobs/5/workflow_nodes/?page=2'}) == \
        '/api/v2/workflow_jobs/5/workflow_nodes/?page=2'
    assert A.next_page(BASE, cur, {'next': BASE + '/api/v2/x/?page=2'}) == '/api/v2/x/?page=2'
    # a controller under a path prefix: AWX's `next` carries the prefix
    assert A.next_page(BASE + '/awx', cur, {'next': '/awx/api/v2/x/?page=2'}) == '/api/v2/x/?page=2'
    for bad in ('https://evil.example.com/api/v2/x/', 'http://awx.example.com/api/v2/x/', '//evil.example.com/x'):
        with pytest.raises(AwxApprovalError, match='is not on the controller https://awx.example.com'):
            A.next_page(BASE, cur, {'next': bad})
    with pytest.raises(AwxApprovalError, match=r'next: 3 is not a path'):
        A.next_page(BASE, cur, {'next': 3})


def test_pages_are_bounded():
    def endless(path):
        return {'results': [], 'next': '/api/v2/workflow_jobs/5/workflow_nodes/?page=2'}
    with pytest.raises(AwxApprovalError, match='workflow job 5: more than 50 pages of workflow nodes'):
        A.read_approval(endless, BASE, WJ)


def test_inputs():
    assert A.check_url('https://awx.example.com/') == 'https://awx.example.com'
    assert A.check_url('awx.example.com') == 'https://awx.example.com'
    assert A.check_url(' http://127.0.0.1:8013 ') == 'http://127.0.0.1:8013'
    for value, msg in ((None, 'url: None is not the controller\'s URL'), ('', 'url: "" is not the controller\'s URL'),
                       ('ftp://x', 'url: "ftp://x" is not an http(s) URL'),
                       ('https://u:secret@awx.example.com', 'url: "https://awx.example.com" has credentials in it'),
                       ('https://awx.example.com/?a=1', 'has a query or a fragment')):
        with pytest.raises(AwxApprovalError) as err:
            A.check_url(value)
        assert msg in str(err.value) and 'secret' not in str(err.value)
    assert A.check_workflow_job_id(5) == 5 and A.check_workflow_job_id('17') == 17
    for value in (0, -1, True, 'x', None, 1.5):
        with pytest.raises(AwxApprovalError, match='workflow_job_id: .* is not a workflow job id'):
            A.check_workflow_job_id(value)
    assert A.check_timeout(30) == 30.0
    for value in (0, 301, True, 'x'):
        with pytest.raises(AwxApprovalError, match=r'timeout: .* must be more than 0 and at most 300 seconds'):
            A.check_timeout(value)
    assert A.check_token(' tok ') == 'tok'
    for value in (None, '', '  '):
        with pytest.raises(AwxApprovalError, match='token: none given'):
            A.check_token(value)
    with pytest.raises(AwxApprovalError) as err:
        A.check_token('abc\ndef')
    assert 'abc' not in str(err.value)


def test_http_errors_name_the_url_and_never_the_token():
    assert A.http_error(401, BASE + '/api/v2/x/', 'Authentication credentials were not provided.') == (
        'GET https://awx.example.com/api/v2/x/ answered HTTP 401: the token was refused (expired, revoked or wrong) '
        '("Authentication credentials were not provided.")')
    assert A.http_error(500, BASE + '/api/v2/x/') == 'GET https://awx.example.com/api/v2/x/ answered HTTP 500'
    assert 'may not read it' in A.http_error(403, BASE)
