#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: snapshot_store
short_description: Keep a node's rollback snapshot in the cluster, or fetch it back to the controller
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - The node_upgrade role writes each node's rollback snapshot (M(gpufleet.upgrade.node_snapshot)) to a file on the
    controller and records its digest on the Node. In AWX every job runs in a fresh container, so a relaunched
    rollout, or the rollback template on another controller, would find no file. This module keeps the snapshot in
    a Secret, one per node and target, from which any later job fetches it back.
  - O(state=stored) reads the snapshot file O(path) on the host the task runs on, checks that it is a valid
    node_snapshot document, and keeps it in the Secret O(namespace)/C(gpufleet-snapshot-<node>--<target>-<hash>)
    (type Opaque; labels C(app.kubernetes.io/managed-by=gpufleet.upgrade), C(gpufleet.io/node) when the node name is
    a valid label value, C(gpufleet.io/snapshot-target); annotation C(gpufleet.io/snapshot-sha256); the file under
    the data key C(snapshot.json)). It creates the Secret, replaces its content when it differs (a merge patch
    guarded by the resourceVersion), or leaves it unchanged. A Secret of that name that gpufleet.upgrade did not
    create is refused. With O(retire_other_targets), the node's snapshot Secrets of other targets are deleted
    afterwards, so a node keeps the snapshot of its latest target only.
  - O(state=fetched) makes O(path) hold the snapshot whose digest is O(sha256) (the digest the Node records); when
    the file is there with that digest nothing is read or written; otherwise the Secret's content is verified (its
    digest and the Secret's annotation both equal O(sha256)) and written to O(path) atomically (mode 0600). A
    missing Secret or a digest mismatch fails, naming the node, the target, the Secret and both digests, and writes
    nothing.
  - The digest is node_snapshot's RV(gpufleet.upgrade.node_snapshot#module:sha256), the SHA-256 of the canonical
    JSON of the document's C(snapshot), as recorded on the Node, not the digest of the file's bytes.
  - The snapshot's content is never returned or shown in a diff.
extends_documentation_fragment:
  - gpufleet.upgrade.k8s_auth_options
  - gpufleet.upgrade.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports what would be created, replaced, retired or fetched and writes nothing (no Secret and no file).
  diff_mode:
    support: full
    details:
      - Shows the Secret's labels, annotations and data keys before and after (O(state=stored)), or the file's
        digest before and after (O(state=fetched)); never the content.
  idempotent:
    support: full
    description: Storing the same snapshot again, or fetching one the file already holds, changes nothing.
options:
  state:
    description: Keep the local snapshot in the cluster (V(stored)), or bring the stored one back (V(fetched)).
    type: str
    choices: [stored, fetched]
    default: stored
  node:
    description: Name of the Node the snapshot belongs to.
    type: str
    required: true
  target:
    description:
      - The target tuple of the upgrade (for example C(driver), C(kernel)), as given to
        M(gpufleet.upgrade.upgrade_state); its values are strings without C(,) or C(=).
    type: dict
    required: true
  path:
    description:
      - The snapshot file on the host the task runs on (the node_upgrade role's
        C(node_upgrade_snapshot_dir | gpufleet.upgrade.snapshot_file(node, target))).
    type: path
    required: true
  sha256:
    description:
      - With O(state=fetched), the digest the snapshot must have (RV(gpufleet.upgrade.upgrade_state#module:state.snapshot_sha256)),
        compared with the file's and with the stored content's.
      - Required with O(state=fetched); the Node keeps the digest after V(done), so a rollback after the node finished
        has it too. A Secret is never trusted on its own annotation, since whoever may write Secrets in O(namespace)
        could have written both.
      - Ignored with O(state=stored).
    type: str
  namespace:
    description: Namespace of the snapshot Secrets (it must exist; docs/rbac creates C(gpufleet-system)).
    type: str
    default: gpufleet-system
  retire_other_targets:
    description:
      - With O(state=stored), delete the node's snapshot Secrets of other targets (found by their labels and their
        C(gpufleet.io/node) annotation) once this one is stored. The Secret of a target stays after the node
        finished it (a rollback after C(done) still finds it) until a later target's snapshot is stored.
    type: bool
    default: true
notes:
  - Belongs to the C(gpufleet.upgrade.k8s) action group.
  - Needs the Role C(gpufleet-upgrade-snapshots) of docs/rbac, in O(namespace) (change its C(metadata.namespace) for
    another), bound with a RoleBinding there.
  - A Secret holds at most 1 MiB; a larger snapshot is refused (set the roles' snapshot store to C(local)).
seealso:
  - module: gpufleet.upgrade.node_snapshot
  - module: gpufleet.upgrade.upgrade_state
"""

EXAMPLES = r"""
---
- name: Keep the snapshot just taken in the cluster
  gpufleet.upgrade.snapshot_store:
    state: stored
    node: gpu-07
    target: {driver: 580.130.00}
    path: /runner/project/snapshots/gpu-07--driver_580.130.00.json

- name: Bring back the snapshot the Node records (a relaunched AWX job)
  gpufleet.upgrade.snapshot_store:
    state: fetched
    node: gpu-07
    target: {driver: 580.130.00}
    path: /runner/project/snapshots/gpu-07--driver_580.130.00.json
    sha256: "{{ progress.state.snapshot_sha256 }}"
"""

RETURN = r"""
action:
  description:
    - What was done (or would be, in check mode) - V(created), V(replaced) or V(unchanged) with O(state=stored);
      V(fetched) or V(unchanged) (the file already held the snapshot) with O(state=fetched).
  returned: success
  type: str
  sample: created
secret:
  description: The Secret of the node and target.
  returned: success
  type: dict
  contains:
    name:
      description: The Secret's name.
      type: str
      sample: gpufleet-snapshot-gpu-07--driver-580-130-00-3f1c2a9b0d
    namespace:
      description: Its namespace.
      type: str
      sample: gpufleet-system
sha256:
  description: The snapshot's digest (node_snapshot's RV(gpufleet.upgrade.node_snapshot#module:sha256)).
  returned: success
  type: str
size:
  description: The snapshot document's size in bytes.
  returned: success
  type: int
path:
  description: The snapshot file.
  returned: success
  type: str
retired:
  description: The node's snapshot Secrets of other targets deleted (or that would be, in check mode).
  returned: when O(state=stored)
  type: list
  elements: str
replaced_local:
  description:
    - With O(state=fetched), the digest of the file that was at O(path) and was not the recorded snapshot (V(null)
      when there was none, V(invalid) when it was not a valid snapshot document).
  returned: when O(state=fetched)
  type: str
"""

import os

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fsio
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot_store as ss
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import NotFoundError, path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule


def _read(path):
    try:
        with open(path, 'rb') as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ss.StoreError('path: cannot read %s: %s' % (path, e.strerror or e))


def store(module, node, target, namespace, path):
    content = _read(path)
    if content is None:
        raise ss.StoreError('path: %r does not exist: there is no snapshot to keep' % path)
    digest = ss.document_digest(content, 'path: %s' % path)
    key = ss.check_target(target)
    want = ss.desired(node, target, namespace, content, digest)
    name = want['metadata']['name']
    secret_path = path_for('v1', 'secrets', name, namespace)
    existing = module.client.get_or_none(secret_path)
    plan = ss.plan_store(existing, want)
    after = want if plan.action == 'create' else existing
    if plan.action == 'create' and not module.check_mode:
        after = module.client.post(path_for('v1', 'secrets', namespace=namespace), want)
    elif plan.action == 'replace':
        _patch, after = module.update(secret_path, lambda obj: ss.plan_store(obj, want).patch)
    retired = []
    if module.params['retire_other_targets']:
        others = module.client.list_all(path_for('v1', 'secrets', namespace=namespace),
                                        {'labelSelector': ss.selector(node)})
        retired = ss.retired(others, node, key, name)
        if not module.check_mode:
            for other in retired:
                try:
                    module.client.delete(path_for('v1', 'secrets', other, namespace))
                except NotFoundError:  # gone meanwhile: retired all the same
                    pass
    result = {'changed': plan.action != 'unchanged' or bool(retired),
              'action': {'create': 'created', 'replace': 'replaced'}.get(plan.action, plan.action),
              'secret': {'name': name, 'namespace': namespace}, 'sha256': digest, 'size': len(content),
              'path': path, 'retired': retired}
    result.update(module.diff(ss.summary(existing), ss.summary(after), 'secret/%s/%s' % (namespace, name)))
    return result


def fetch(module, node, target, namespace, path, expected):
    key = ss.check_target(target)
    name = ss.secret_name(node, target)
    local = _read(path)
    have = ss.local_digest(local)
    result = {'secret': {'name': name, 'namespace': namespace}, 'path': path}
    if have is not None and have == expected:
        result.update(changed=False, action='unchanged', sha256=have, size=len(local), replaced_local=None)
        return result
    secret = module.client.get_or_none(path_for('v1', 'secrets', name, namespace))
    content = ss.stored_content(secret, node, key, namespace, name, expected)
    result['sha256'] = expected
    if os.path.isdir(path):
        raise ss.StoreError('path: %s is a directory' % path)
    if not module.check_mode:
        _fsio.write_text(path, content, 0o600, prefix='.snapshot-')
    replaced = None if local is None else (have or 'invalid')
    if replaced:
        module.warn('%s held another snapshot (sha256 %s), not the one node %s records (%s); it was replaced by the '
                    'stored one' % (path, replaced, node, expected))
    result.update(changed=True, action='fetched', size=len(content), replaced_local=replaced)
    result.update(module.diff({'path': path, 'sha256': have}, {'path': path, 'sha256': expected}, path))
    return result


def main() -> None:
    module = K8sModule('snapshot_store', dict(
        state={'type': 'str', 'default': 'stored', 'choices': ['stored', 'fetched']},
        node={'type': 'str', 'required': True},
        target={'type': 'dict', 'required': True},
        path={'type': 'path', 'required': True},
        sha256={'type': 'str'},
        namespace={'type': 'str', 'default': ss.DEFAULT_NAMESPACE},
        retire_other_targets={'type': 'bool', 'default': True},
    ))
    p = module.params
    with module.errors(expected=(ss.StoreError,)):
        node = ss.check_node(p['node'])
        ss.check_target(p['target'])
        namespace = ss.check_namespace(p['namespace'])
        expected = None
        if p['state'] == 'fetched':
            if not p['sha256']:
                raise ss.StoreError('sha256: required with state=fetched (the digest the Node records, upgrade_state\'s '
                                    'state.snapshot_sha256): a Secret that only vouches for itself restores nothing')
            expected = ss.check_sha256(p['sha256'])
    context = 'node %s, Secret %s/%s' % (node, namespace, ss.secret_name(node, p['target']))
    with module.errors(expected=(ss.StoreError,), context=context):
        if p['state'] == 'stored':
            result = store(module, node, p['target'], namespace, p['path'])
        else:
            try:
                result = fetch(module, node, p['target'], namespace, p['path'], expected)
            except ss.FetchError as e:  # its message names node, target, Secret and digests already
                module.fail_json(msg=str(e), secret={'name': ss.secret_name(node, p['target']), 'namespace': namespace})
    module.exit_json(**result)


if __name__ == '__main__':
    main()
