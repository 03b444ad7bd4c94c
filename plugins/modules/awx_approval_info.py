#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: awx_approval_info
short_description: Read who approved the approval node of the running AWX workflow
version_added: 0.1.0
description:
  - Reads, with GET requests only, the approval node of an AWX / Automation Controller workflow job and returns who
    approved it (RV(approved_by)). A job of a workflow runs as the user who launched the workflow (C(awx_user_name));
    the approval's approver is another user, whom only the API names.
  - Lists the workflow job's nodes (C(/api/v2/workflow_jobs/<workflow_job_id>/workflow_nodes/), every page, following
    C(next) on the same controller only), keeps the approval nodes (C(summary_fields.job.type) or
    C(summary_fields.unified_job_template.unified_job_type) V(workflow_approval)), picks the one named
    O(approval_name) or the only one, and reads its approval (C(/api/v2/workflow_approvals/<id>/)).
  - Succeeds only for an approved approval (C(status) V(successful)) with a user in
    C(summary_fields.approved_or_denied_by.username). A denied, timed-out, pending or not yet reached approval, a
    workflow with several approval nodes and no O(approval_name), and any failed request fail with a message naming
    the URL or the field, never the token.
  - Relies on the AWX API v2 fields above, present since AWX 9.0 / Ansible Tower 3.6 (C(approved_or_denied_by)) in
    AWX and Automation Controller alike.
author:
  - gpufleet.upgrade contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
  - gpufleet.upgrade.attributes.info_module
options:
  url:
    description:
      - The controller's base URL (V(https://awx.example.com)); a bare host name is taken as https.
      - Defaults to the environment's C(CONTROLLER_HOST), else C(TOWER_HOST), which AWX's built-in credential type
        C(Red Hat Ansible Automation Platform) injects into the job.
    type: str
  token:
    description:
      - OAuth2 token of a user who may read the workflow job, sent as C(Authorization Bearer). Never logged.
      - Defaults to the environment's C(CONTROLLER_OAUTH_TOKEN), else C(TOWER_OAUTH_TOKEN) (the credential's C(OAuth
        Token)). A username and password are not used.
    type: str
  validate_certs:
    description:
      - Verify the controller's TLS certificate.
      - Defaults to the environment's C(CONTROLLER_VERIFY_SSL), else C(TOWER_VERIFY_SSL), else V(true).
    type: bool
    default: true
  workflow_job_id:
    description: The workflow job's id; AWX passes it to every job of a workflow as C(awx_workflow_job_id).
    type: int
    required: true
  approval_name:
    description: The approval node to read, by its approval's name or its node identifier, when the workflow has
      several approval nodes.
    type: str
  fail_when_missing:
    description: Fail when the workflow job has no approval node; with V(false) return RV(found) V(false) instead
      (a named O(approval_name) that is not there fails either way).
    type: bool
    default: true
  timeout:
    description: Seconds per request (more than 0, at most 300).
    type: float
    default: 30
notes:
  - Makes GET requests only, to the controller of O(url) only, and writes nothing.
seealso:
  - name: AWX API, workflow approvals
    description: The workflow approval objects the module reads.
    link: https://docs.ansible.com/automation-controller/latest/html/controllerapi/api_ref.html
"""

EXAMPLES = r"""
---
- name: Who approved this workflow's approval node (the job carries the Red Hat Ansible Automation Platform credential)
  gpufleet.upgrade.awx_approval_info:
    workflow_job_id: "{{ awx_workflow_job_id }}"
  register: approval

- name: One of several approval nodes, with an explicit controller
  gpufleet.upgrade.awx_approval_info:
    url: https://awx.example.com
    token: "{{ controller_token }}"
    workflow_job_id: "{{ awx_workflow_job_id }}"
    approval_name: second operator approves the canary
  register: approval
"""

RETURN = r"""
found:
  description: Whether the workflow job has the approval node (V(false) only with O(fail_when_missing=false)).
  returned: success
  type: bool
  sample: true
approved_by:
  description: The username of the user who approved it (C(summary_fields.approved_or_denied_by.username)); empty
    when not RV(found).
  returned: success
  type: str
  sample: bob
status:
  description: The approval's C(status); V(successful) (approved) on success.
  returned: success
  type: str
  sample: successful
approval_id:
  description: The workflow approval's id.
  returned: success
  type: int
  sample: 42
approval_name:
  description: The workflow approval's name.
  returned: success
  type: str
  sample: second operator approves the canary
node_identifier:
  description: The identifier of the approval's workflow node.
  returned: success
  type: str
  sample: approval
approved_at:
  description: When it was approved (the approval's C(finished), as AWX gives it).
  returned: success
  type: str
  sample: '2026-12-03T07:00:00.123456Z'
requests:
  description: The GET requests made (paths on the controller).
  returned: always
  type: list
  elements: str
msg:
  description: What was read, or why it failed.
  returned: always
  type: str
"""

import json
import socket
from urllib.error import URLError

from ansible.module_utils.basic import AnsibleModule, env_fallback

from ansible_collections.gpufleet.upgrade.plugins.module_utils._awx_approval import (
    AwxApprovalError, check_timeout, check_token, check_url, http_error, read_approval)
from ansible_collections.gpufleet.upgrade.plugins.module_utils._http import http_get


def _detail(body):
    try:
        data = json.loads(body.decode('utf-8', 'replace'))
    except ValueError:
        return None
    return data.get('detail') if isinstance(data, dict) else None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type='str', fallback=(env_fallback, ['CONTROLLER_HOST', 'TOWER_HOST'])),
            token=dict(type='str', no_log=True, fallback=(env_fallback, ['CONTROLLER_OAUTH_TOKEN', 'TOWER_OAUTH_TOKEN'])),
            validate_certs=dict(type='bool', default=True, fallback=(env_fallback, ['CONTROLLER_VERIFY_SSL', 'TOWER_VERIFY_SSL'])),
            workflow_job_id=dict(type='int', required=True),
            approval_name=dict(type='str'),
            fail_when_missing=dict(type='bool', default=True),
            timeout=dict(type='float', default=30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    requests = []
    try:
        approval = _read(p, requests)
    except AwxApprovalError as exc:
        module.fail_json(msg='awx_approval_info: %s' % exc, requests=requests)
    else:
        module.exit_json(changed=False, requests=requests, **approval.as_dict())


def _read(p, requests):
    """The approval the parameters `p` name, read with GET requests (their paths appended to `requests`)."""
    base = check_url(p['url'])
    headers = {'Authorization': 'Bearer %s' % check_token(p['token']), 'Accept': 'application/json'}
    timeout = check_timeout(p['timeout'])

    def get(path):
        url = base + path
        requests.append(path)
        try:
            status, body = http_get(url, headers, timeout, validate_certs=p['validate_certs'], follow_redirects='none')
        except (socket.timeout, TimeoutError):
            raise AwxApprovalError('GET %s did not answer within %gs' % (url, timeout)) from None
        except URLError as exc:
            raise AwxApprovalError('GET %s failed: %s' % (url, exc.reason)) from None
        except (OSError, ValueError) as exc:
            raise AwxApprovalError('GET %s failed: %s' % (url, exc)) from None
        if not 200 <= status < 300:   # an error, or a redirect (not followed: the token stays with this host)
            raise AwxApprovalError(http_error(status, url, _detail(body)))
        try:
            return json.loads(body.decode('utf-8'))
        except ValueError:
            raise AwxApprovalError('GET %s: the answer is not JSON' % url) from None

    return read_approval(get, base, p['workflow_job_id'], p['approval_name'], p['fail_when_missing'])


if __name__ == '__main__':
    main()
