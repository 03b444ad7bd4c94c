# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Rollback snapshots kept in the cluster: one Secret per node and target (snapshot_store).

The node_upgrade role writes a node's rollback snapshot (node_snapshot's document) to a file on the
controller and records its digest on the Node. In AWX each job runs in a fresh container, so a
relaunched rollout or a rollback from another controller finds no file: the snapshot is also kept in
a Secret, from which any later job fetches it back, verified against the digest the Node records.

- `secret_name(node, target)`: ``gpufleet-snapshot-<node>--<target slug>-<hash>``, a DNS-1123
  subdomain of at most 253 characters. The slug is lossy (case, ``+``, ``=``, ``,``), so the name
  always ends in 10 hex digits of the SHA-256 of the exact node and target: two targets never share
  a Secret. A long node or target is cut before the hash.
- `desired(...)`: the Secret (Opaque; labels managed-by, node when a valid label value, target
  slug; annotations digest, node, target; the file under ``snapshot.json``).
- `plan_store(existing, desired)`: create, replace (the merge patch) or unchanged; refuses a Secret
  the collection did not create.
- `stored_content(secret, ...)`: the content of a Secret once its digest checks out against the
  digest the Node records (`FetchError` naming node, target, Secret and both digests otherwise).
- `local_digest(text)`: the digest of a local snapshot file, None when it is not a valid one.
- `retired(secrets, node, key, name)`: the node's snapshot Secrets of other targets.

The digest is node_snapshot's RV(sha256): the SHA-256 of the canonical JSON of the document's
``snapshot`` (`_snapshot.digest`), the value the role records on the Node, not of the file bytes.
Pure: no I/O (the module reads and writes).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any, Dict, List, NamedTuple, Optional

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _snapshot as sn
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _text
from ansible_collections.gpufleet.upgrade.plugins.module_utils._upgrade_state import StateError, target_key

DEFAULT_NAMESPACE = 'gpufleet-system'
DATA_KEY = 'snapshot.json'
MANAGED_BY = 'app.kubernetes.io/managed-by'
MANAGER = 'gpufleet.upgrade'
LABEL_NODE = 'gpufleet.io/node'
LABEL_TARGET = 'gpufleet.io/snapshot-target'
ANN_SHA = 'gpufleet.io/snapshot-sha256'
ANN_NODE = 'gpufleet.io/node'
ANN_TARGET = 'gpufleet.io/snapshot-target'
ANN_SIZE = 'gpufleet.io/snapshot-size'
PREFIX = 'gpufleet-snapshot-'
# A Secret holds at most 1 MiB (its data base64-encoded in etcd's object, a little less of content).
MAX_CONTENT = 1000 * 1000
_HASH_LEN = 10
_SHA = re.compile(r'^[0-9a-fA-F]{64}$')
_LABEL_VALUE = re.compile(r'^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$')


class StoreError(ValueError):
    """Bad input or a Secret the module may not use (the message names the field or the object)."""


class FetchError(StoreError):
    """No stored snapshot with the expected digest (the message names node, target, Secret, digests)."""


class Plan(NamedTuple):
    action: str                      # 'create', 'replace' or 'unchanged'
    patch: Optional[Dict[str, Any]]  # the merge patch of a replace


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

def check_node(node: Any) -> str:
    if not isinstance(node, str) or not node or '/' in node or node in ('.', '..'):
        raise StoreError('node: %r is not a node name' % (node,))
    return node


def check_target(target: Any) -> str:
    """The target's canonical key (StoreError naming the field when it is not a target)."""
    try:
        return target_key(target)
    except StateError as e:
        raise StoreError(str(e))


def check_namespace(namespace: Any) -> str:
    return _text.check_namespace(namespace, StoreError)


def check_sha256(value: Any, field: str = 'sha256') -> str:
    if not isinstance(value, str) or not _SHA.match(value):
        raise StoreError('%s: %r is not a SHA-256 digest (64 hex digits)' % (field, value))
    return value.lower()


# --------------------------------------------------------------------------------------------
# Names and labels
# --------------------------------------------------------------------------------------------

def _hash(*parts: str) -> str:
    return hashlib.sha256('\0'.join(parts).encode('utf-8')).hexdigest()[:_HASH_LEN]


def _dns_slug(text: str) -> str:
    """`text` lowercased, runs of anything but [a-z0-9] as one '-', no '-' at either end."""
    return re.sub(r'[^a-z0-9]+', '-', text.lower()).strip('-')


def secret_name(node: str, target: Dict[str, Any]) -> str:
    """The Secret of `node`'s snapshot for `target` (see the module docstring)."""
    key = check_target(target)
    check_node(node)
    suffix = '-' + _hash(node, key)
    room = 253 - len(PREFIX) - len(suffix) - 2      # '--' between node and target
    n, t = _dns_slug(node) or 'node', _dns_slug(key)
    if len(n) + len(t) > room:
        t = t[:max(room // 2, room - len(n))].rstrip('-')
        n = n[:room - len(t)].rstrip('-')
    return '%s%s--%s%s' % (PREFIX, n, t, suffix)


def target_label(key: str) -> str:
    """The target as a label value (the snapshot file's slug; cut with a hash when over 63)."""
    slug = re.sub(r'[^A-Za-z0-9._-]+', '_', key).strip('._-')
    if len(slug) > 63:
        slug = slug[:63 - _HASH_LEN - 1].rstrip('._-') + '-' + _hash(key)
    return slug


def labels(node: str, key: str) -> Dict[str, str]:
    out = {MANAGED_BY: MANAGER, LABEL_TARGET: target_label(key)}
    if len(node) <= 63 and _LABEL_VALUE.match(node):
        out[LABEL_NODE] = node
    return out


def selector(node: str) -> str:
    """The label selector of the collection's snapshot Secrets (of `node` when its name is a label value)."""
    sel = '%s=%s' % (MANAGED_BY, MANAGER)
    node_label = labels(node, '').get(LABEL_NODE)
    return sel + (',%s=%s' % (LABEL_NODE, node_label) if node_label else '')


# --------------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------------

def document_digest(content: bytes, what: str) -> str:
    """The digest of a snapshot document's bytes (node_snapshot's sha256), once the document checks out."""
    try:
        text = content.decode('utf-8')
    except UnicodeDecodeError:
        raise StoreError('%s is not UTF-8 text: not a node_snapshot document' % what)
    try:
        snap = sn.verify_document(text)
    except sn.SnapshotError as e:
        raise StoreError('%s: %s' % (what, e))
    return sn.digest(snap)


def local_digest(content: Optional[bytes]) -> Optional[str]:
    """The digest of a local snapshot file's bytes, None when missing or not a valid document."""
    if content is None:
        return None
    try:
        return document_digest(content, 'file')
    except StoreError:
        return None


def desired(node: str, target: Dict[str, Any], namespace: str, content: bytes, digest: str) -> Dict[str, Any]:
    """The Secret that keeps `content` (a snapshot document whose digest is `digest`)."""
    key = check_target(target)
    if len(content) > MAX_CONTENT:
        raise StoreError('the snapshot is %d bytes, more than a Secret holds (%d); it cannot be kept in the cluster '
                         '(set the snapshot store to local)' % (len(content), MAX_CONTENT))
    return {
        'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque',
        'metadata': {'name': secret_name(node, target), 'namespace': namespace, 'labels': labels(node, key),
                     'annotations': {ANN_SHA: digest, ANN_NODE: node, ANN_TARGET: key, ANN_SIZE: str(len(content))}},
        'data': {DATA_KEY: base64.b64encode(content).decode('ascii')},
    }


def is_managed(obj: Dict[str, Any]) -> bool:
    return ((obj.get('metadata') or {}).get('labels') or {}).get(MANAGED_BY) == MANAGER


def _where(obj: Dict[str, Any]) -> str:
    meta = obj.get('metadata') or {}
    return 'Secret %s/%s' % (meta.get('namespace'), meta.get('name'))


def plan_store(existing: Optional[Dict[str, Any]], want: Dict[str, Any]) -> Plan:
    """What storing `want` takes, given the Secret read (None: absent)."""
    if existing is None:
        return Plan('create', None)
    if not is_managed(existing):
        raise StoreError('%s exists and is not managed by gpufleet.upgrade (label %s); refusing to change it'
                         % (_where(want), MANAGED_BY))
    if existing.get('type', 'Opaque') != 'Opaque':
        raise StoreError('%s has type %r, not Opaque; refusing to change it' % (_where(want), existing.get('type')))
    meta, wmeta = existing.get('metadata') or {}, want['metadata']
    have_labels, have_ann = meta.get('labels') or {}, meta.get('annotations') or {}
    data = existing.get('data') or {}
    patch: Dict[str, Any] = {}
    lab = {k: v for k, v in wmeta['labels'].items() if have_labels.get(k) != v}
    if LABEL_NODE in have_labels and LABEL_NODE not in wmeta['labels']:
        lab[LABEL_NODE] = None
    ann = {k: v for k, v in wmeta['annotations'].items() if have_ann.get(k) != v}
    if lab or ann:
        patch['metadata'] = {k: v for k, v in (('labels', lab), ('annotations', ann)) if v}
    new_data: Dict[str, Any] = {k: None for k in data if k != DATA_KEY}
    if data.get(DATA_KEY) != want['data'][DATA_KEY]:
        new_data[DATA_KEY] = want['data'][DATA_KEY]
    if new_data:
        patch['data'] = new_data
    return Plan('replace', patch) if patch else Plan('unchanged', None)


def summary(secret: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What a diff shows of a snapshot Secret: its labels and annotations, never the content."""
    if secret is None:
        return None
    meta = secret.get('metadata') or {}
    return {'name': meta.get('name'), 'namespace': meta.get('namespace'), 'labels': dict(meta.get('labels') or {}),
            'annotations': {k: v for k, v in (meta.get('annotations') or {}).items() if k.startswith('gpufleet.io/')},
            'data_keys': sorted((secret.get('data') or {}).keys())}


# --------------------------------------------------------------------------------------------
# Fetch
# --------------------------------------------------------------------------------------------

def stored_content(secret: Optional[Dict[str, Any]], node: str, key: str, namespace: str, name: str,
                   expected: Optional[str]) -> bytes:
    """The snapshot document kept in `secret`, verified: its content's digest and the Secret's
    annotation both equal `expected` (the digest the Node records, also after ``done``). FetchError
    otherwise, also without `expected`: a Secret that only vouches for itself (its content matching its
    own annotation) is anyone's who may write Secrets in the namespace, and restores nothing."""
    where = 'no snapshot of node %s for target %s could be fetched from Secret %s/%s' % (node, key, namespace, name)
    if not expected:
        raise FetchError('%s: the Node records no snapshot digest for this target, and a Secret cannot vouch for itself '
                         '(anyone who may write Secrets in %s could have written it); nothing was fetched'
                         % (where, namespace))
    if secret is None:
        raise FetchError('%s: the Secret does not exist (the Node records sha256 %s; was the snapshot taken with the '
                         'snapshot store local, or the Secret deleted?)' % (where, expected))
    if not is_managed(secret):
        raise FetchError('%s: the Secret is not managed by gpufleet.upgrade (label %s); refusing to trust it'
                         % (where, MANAGED_BY))
    encoded = (secret.get('data') or {}).get(DATA_KEY)
    if not isinstance(encoded, str):
        raise FetchError('%s: the Secret has no %s' % (where, DATA_KEY))
    try:
        content = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise FetchError('%s: its %s is not base64' % (where, DATA_KEY))
    annotated = ((secret.get('metadata') or {}).get('annotations') or {}).get(ANN_SHA)
    try:
        found = document_digest(content, 'its content')
    except StoreError as e:
        raise FetchError('%s: %s (expected sha256 %s)' % (where, e, expected))
    if found != expected:
        raise FetchError('%s: digest mismatch: expected sha256 %s (recorded on the Node), the stored snapshot is %s'
                         % (where, expected, found))
    if annotated != found:
        raise FetchError('%s: digest mismatch: the Secret\'s annotation %s says sha256 %s, its content is %s'
                         % (where, ANN_SHA, annotated, found))
    return content


# --------------------------------------------------------------------------------------------
# Retirement
# --------------------------------------------------------------------------------------------

def retired(secrets: List[Dict[str, Any]], node: str, key: str, keep: str) -> List[str]:
    """Names of `node`'s snapshot Secrets of other targets than `key` (the one named `keep` stays):
    a node keeps the snapshot of its latest target only."""
    out = []
    for s in secrets:
        meta = s.get('metadata') or {}
        ann = meta.get('annotations') or {}
        if (is_managed(s) and meta.get('name') != keep and meta.get('name', '').startswith(PREFIX)
                and ann.get(ANN_NODE) == node and ann.get(ANN_TARGET) != key):
            out.append(meta['name'])
    return sorted(out)
