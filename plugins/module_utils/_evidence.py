# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Used by the evidence and
# qualification_record modules.
"""Evidence bundle: one JSON document on the controller that gates and actions add to.

Shape (``schema: gpufleet.upgrade/evidence/v1``)::

    id, created, updated                        # RFC 3339 UTC
    tuple: {before: {kernel, rke2, driver, gpu_operator, dcgm_exporter}, after: {...}}
    nodes: {<name>: {name, role, uid, machine_id, system_uuid, pci_ids, batch, tuple_before, tuple_after,
                     measured, verdict, phases, failed_phase, started, finished, duration_s, rolled_back,
                     message, artifacts: [{kind, name, version, sha256, digest}]}}
    artifacts: [{kind, name, version, sha256, digest, path}]     # keyed by (kind, name)
    batches: [{index, kind, nodes, started, finished}]             # keyed by index
    gates: [{id, name, kind, category, node, batch, critical, passed, started, finished,
             duration_s, inputs, result, problems}]                # keyed by id
    actions: [{id, name, node, batch, started, finished, duration_s, ok, result}]
    omitted: [{key, nodes, reason, blocks}]                        # keyed by key

Every list entry has a key, and adding an entry with the same key replaces it, so re-running a
task does not duplicate evidence (the evidence module is idempotent).

A node's ``measured: true`` says that its ``tuple_after`` is what was measured on the node after
activation (the canary role records it from node_upgrade's result), not the declared target copied
in when the bundle was opened. It belongs to the value written with it: an update that writes
another ``tuple_after`` without ``measured: true`` (or ``measured: false``) drops the flag, so a
declared copy is never passed off as a measurement; writing the same value again (a re-opened
bundle with the target that was measured) keeps it. A measured ``tuple_after`` lists only the
components that could be measured (it may be empty).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import html
import json
import math
import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._kube_time import parse_time
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import text_field

SCHEMA = 'gpufleet.upgrade/evidence/v1'
TUPLE_KEYS = ('kernel', 'rke2', 'driver', 'gpu_operator', 'dcgm_exporter')
ROLES = ('canary', 'control', 'batch', 'other')
# A rollout's outcome for one node (the rollout playbook records it after each node it touched).
VERDICTS = ('upgraded', 'failed', 'skipped')
CATEGORIES = ('allocation', 'monitoring', 'rollback', 'compatibility', 'health', 'other')
# What a gate of each kind proves, for the qualification record (seed 004: allocation, monitoring, rollback).
KIND_CATEGORY = {
    'node': 'allocation', 'workload': 'allocation', 'allocation': 'allocation',
    'metric': 'monitoring', 'gpu': 'monitoring', 'monitoring': 'monitoring',
    'rollback': 'rollback', 'cuda': 'compatibility', 'upgrade_check': 'compatibility',
}
_SHA256 = re.compile(r'^[0-9a-f]{64}$')
_DIGEST = re.compile(r'^sha256:[0-9a-f]{64}$')
_BOOL_WORDS = {'true': True, 'yes': True, 'false': False, 'no': False}
_ID = re.compile(r'^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$')


class EvidenceError(ValueError):
    """Bad input or a bad bundle file: the message names the field and the value."""


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.timezone.utc)


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).replace(microsecond=0).isoformat().replace('+00:00', 'Z')


def parse_rfc3339(value: Any, field: str) -> datetime.datetime:
    """An RFC 3339 time (or an aware datetime) as an aware UTC datetime; EvidenceError names the field."""
    try:
        return parse_time(value if isinstance(value, datetime.datetime) else
                          (str(value) if value is not None else ''), field)
    except ValueError as exc:
        raise EvidenceError(str(exc)) from None


def _norm_time(value: Any, field: str) -> Optional[str]:
    if value in (None, ''):
        return None
    moment = parse_rfc3339(value, field)
    return moment.astimezone(datetime.timezone.utc).isoformat().replace('+00:00', 'Z')


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, 'rb') as handle:
            for block in iter(lambda: handle.read(1 << 20), b''):
                digest.update(block)
    except OSError as exc:
        raise EvidenceError('artifacts: cannot read %r: %s' % (path, exc.strerror or exc))
    return digest.hexdigest()


def new_bundle(bundle_id: str, now: Optional[datetime.datetime] = None) -> Dict[str, Any]:
    if not isinstance(bundle_id, str) or not _ID.match(bundle_id):
        raise EvidenceError('id: %r must be lowercase letters and digits with . or - inside' % (bundle_id,))
    stamp = rfc3339(now or utcnow())
    return {'schema': SCHEMA, 'id': bundle_id, 'created': stamp, 'updated': stamp,
            'tuple': {'before': None, 'after': None}, 'nodes': {}, 'artifacts': [], 'batches': [],
            'gates': [], 'actions': [], 'omitted': []}


def loads(text: str, source: str = 'bundle') -> Dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise EvidenceError('%s: not JSON: %s' % (source, exc))
    if not isinstance(doc, dict) or doc.get('schema') != SCHEMA:
        raise EvidenceError('%s: not an evidence bundle (schema must be %r)' % (source, SCHEMA))
    for key, kind in (('nodes', dict), ('artifacts', list), ('batches', list), ('gates', list),
                      ('actions', list), ('omitted', list), ('tuple', dict)):
        if not isinstance(doc.get(key), kind):
            raise EvidenceError('%s: field %s must be a %s' % (source, key, kind.__name__))
    try:
        _check_stored(doc)
    except EvidenceError as exc:
        raise EvidenceError('%s: %s' % (source, exc)) from None
    return doc


def _stored(raw: Any) -> Any:
    """A stored entry as its checker takes it: without duration_s, which the checker computes."""
    return dict((k, v) for k, v in raw.items() if k != 'duration_s') if isinstance(raw, dict) else raw


def _check_stored(doc: Dict[str, Any]) -> None:
    """Every entry of a bundle read from a file checked with the checker that merge uses for it (people
    edit the bundle in the evidence repository), and replaced by the checker's entry as merge writes it (so an
    unedited bundle reads back the same), so that every reader finds every field of its shape: a node keeps
    its stored duration_s (a number of seconds) and its measured flag only when true, as merge keeps them; an
    artifact's file is not read (its path is kept)."""
    if not isinstance(doc.get('id'), str) or not _ID.match(doc['id']):
        raise EvidenceError('id: %r must be lowercase letters and digits with . or - inside' % (doc.get('id'),))
    for key in ('created', 'updated'):
        # new_bundle writes both and merge keeps them; the report shows them.
        if not isinstance(doc.get(key), str):
            raise EvidenceError('%s: %r is not an RFC 3339 time (every bundle has one)' % (key, doc.get(key)))
        parse_rfc3339(doc[key], key)
    unknown = sorted(str(k) for k in doc['tuple'] if k not in ('before', 'after'))
    if unknown:
        raise EvidenceError('tuple: unknown key(s) %s (use before, after)' % ', '.join(unknown))
    for side in ('before', 'after'):
        doc['tuple'][side] = _tuple(doc['tuple'].get(side), 'tuple.' + side)
    for i, (key, raw) in enumerate(doc['nodes'].items()):
        entry = node_entry(_stored(raw), i)
        if entry['name'] != key:
            raise EvidenceError('nodes[%d].name: %r is not its key %r' % (i, entry['name'], key))
        duration = raw.get('duration_s')
        if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                     or not math.isfinite(duration) or duration < 0):
            raise EvidenceError('nodes[%d].duration_s: %r is not a number of seconds' % (i, duration))
        node = dict(raw)
        node.update((k, v) for k, v in entry.items() if k not in ('measured', 'duration_s'))
        if entry.get('measured') is True:
            node['measured'] = True
        else:
            node.pop('measured', None)
        doc['nodes'][key] = node
    for i, raw in enumerate(doc['artifacts']):
        artifact = artifact_entry(dict(raw, path=None) if isinstance(raw, dict) else raw, i)
        path = _str(raw, 'path', 'artifacts[%d]' % i)
        if path is not None:
            artifact['path'] = path
        doc['artifacts'][i] = artifact
    for name, checker in (('batches', batch_entry), ('gates', gate_entry), ('actions', action_entry),
                          ('omitted', omitted_entry)):
        doc[name] = [checker(_stored(raw), i) for i, raw in enumerate(doc[name])]


def dumps(bundle: Dict[str, Any]) -> str:
    return json.dumps(bundle, indent=2, sort_keys=True, ensure_ascii=False) + '\n'


# --------------------------------------------------------------------------------------------
# Entry validation
# --------------------------------------------------------------------------------------------

def _tuple(value: Any, field: str) -> Optional[Dict[str, str]]:
    if value in (None, {}):
        return None
    if not isinstance(value, dict):
        raise EvidenceError('%s: %r is not a dict' % (field, value))
    unknown = sorted(k for k in value if k not in TUPLE_KEYS)
    if unknown:
        raise EvidenceError('%s: unknown key(s) %s (use %s)' % (field, ', '.join(unknown), ', '.join(TUPLE_KEYS)))
    out = {}
    for k in TUPLE_KEYS:
        v = value.get(k)
        if v is None:
            continue
        if not isinstance(v, str) or not v.strip():
            raise EvidenceError('%s.%s: %r must be a non-blank string' % (field, k, v))
        out[k] = v.strip()
    return out


def _str(entry: Dict[str, Any], key: str, field: str, required: bool = False) -> Optional[str]:
    return text_field(entry, key, field, required, EvidenceError, numbers=True)


def _bool(entry: Dict[str, Any], key: str, field: str, default: Optional[bool]) -> Optional[bool]:
    v = entry.get(key)
    if v is None:
        if default is None and key == 'passed':
            raise EvidenceError('%s.%s is required (true or false)' % (field, key))
        return default
    if isinstance(v, str) and v.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[v.strip().lower()]
    if not isinstance(v, bool):
        raise EvidenceError('%s.%s: %r is not a boolean' % (field, key, v))
    return v


def _check_keys(entry: Any, allowed: Tuple[str, ...], field: str) -> None:
    if not isinstance(entry, dict):
        raise EvidenceError('%s: %r is not a dict' % (field, entry))
    unknown = sorted(k for k in entry if k not in allowed and entry[k] is not None)
    if unknown:
        raise EvidenceError('%s: unknown field(s) %s' % (field, ', '.join(unknown)))


def _times(entry: Dict[str, Any], field: str) -> Tuple[Optional[str], Optional[str], Optional[float]]:
    started = _norm_time(entry.get('started'), field + '.started')
    finished = _norm_time(entry.get('finished'), field + '.finished')
    duration = None
    if started and finished:
        duration = (parse_rfc3339(finished, '') - parse_rfc3339(started, '')).total_seconds()
        if duration < 0:
            raise EvidenceError('%s: finished %s is before started %s' % (field, finished, started))
    return started, finished, duration


def node_entry(raw: Any, i: int) -> Dict[str, Any]:
    field = 'nodes[%d]' % i
    _check_keys(raw, ('name', 'role', 'uid', 'machine_id', 'system_uuid', 'pci_ids', 'batch', 'tuple_before',
                      'tuple_after', 'measured', 'labels', 'verdict', 'phases', 'failed_phase', 'started',
                      'finished', 'rolled_back', 'message', 'artifacts'), field)
    name = _str(raw, 'name', field, required=True)
    out = {'name': name}  # type: Dict[str, Any]
    role = _str(raw, 'role', field)
    if role is not None:
        if role not in ROLES:
            raise EvidenceError('%s.role: %r is not one of %s' % (field, role, ', '.join(ROLES)))
        out['role'] = role
    for k in ('uid', 'machine_id', 'system_uuid'):
        v = _str(raw, k, field)
        if v is not None:
            out[k] = v
    if raw.get('pci_ids') is not None:
        ids = raw['pci_ids']
        if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
            raise EvidenceError('%s.pci_ids: %r is not a list of strings' % (field, ids))
        out['pci_ids'] = sorted({x.strip().lower() for x in ids if x.strip()})
    if raw.get('batch') is not None:
        out['batch'] = _int(raw['batch'], field + '.batch')
    for k in ('tuple_before', 'tuple_after'):
        t = _tuple(raw.get(k), field + '.' + k)
        if t is not None:
            out[k] = t
    measured = _bool(raw, 'measured', field, None)
    if measured:
        if raw.get('tuple_after') is None:
            raise EvidenceError('%s.measured: true needs tuple_after, the tuple measured on the node (a dict, '
                                'empty when nothing could be measured)' % field)
        out['tuple_after'] = out.get('tuple_after') or {}
        out['measured'] = True
    elif measured is False:
        out['measured'] = False  # the merge drops the flag
    elif 'tuple_after' in out:
        out['measured'] = None  # a declared tuple_after: the merge keeps the flag only for the measured value
    if raw.get('labels') is not None:
        if not isinstance(raw['labels'], dict):
            raise EvidenceError('%s.labels: %r is not a dict' % (field, raw['labels']))
        out['labels'] = {str(k): str(v) for k, v in raw['labels'].items()}
    verdict = _str(raw, 'verdict', field)
    if verdict is not None:
        if verdict not in VERDICTS:
            raise EvidenceError('%s.verdict: %r is not one of %s' % (field, verdict, ', '.join(VERDICTS)))
        out['verdict'] = verdict
    if raw.get('phases') is not None:
        phases = raw['phases']
        if not isinstance(phases, list) or not all(isinstance(x, str) and x.strip() for x in phases):
            raise EvidenceError('%s.phases: %r is not a list of phase names' % (field, phases))
        out['phases'] = [x.strip() for x in phases]
    for k in ('failed_phase', 'message'):
        v = _str(raw, k, field)
        if v is not None:
            out[k] = v
    if raw.get('started') is not None or raw.get('finished') is not None:
        started, finished, duration = _times(raw, field)
        for k, v in (('started', started), ('finished', finished), ('duration_s', duration)):
            if v is not None:
                out[k] = v
    rolled_back = _bool(raw, 'rolled_back', field, None)
    if rolled_back is not None:
        out['rolled_back'] = rolled_back
    if raw.get('artifacts') is not None:
        # What the node installed and runs (packages with the repository's SHA-256, images with their digest).
        if not isinstance(raw['artifacts'], list):
            raise EvidenceError('%s.artifacts: %r is not a list of artifacts' % (field, raw['artifacts']))
        # No `path`: a node's artifact is not a file on the controller.
        out['artifacts'] = [artifact_entry(a, j, field + '.', ('kind', 'name', 'version', 'sha256', 'digest'))
                            for j, a in enumerate(raw['artifacts'])]
    return out


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool):
        raise EvidenceError('%s: %r is not an integer' % (field, value))
    try:
        num = int(str(value))
    except ValueError:
        raise EvidenceError('%s: %r is not an integer' % (field, value))
    if num < 0:
        raise EvidenceError('%s: %r must not be negative' % (field, value))
    return num


ARTIFACT_KEYS = ('kind', 'name', 'version', 'sha256', 'digest', 'path')


def artifact_entry(raw: Any, i: int, prefix: str = '', keys: Tuple[str, ...] = ARTIFACT_KEYS) -> Dict[str, Any]:
    field = '%sartifacts[%d]' % (prefix, i)
    _check_keys(raw, keys, field)
    out = {'kind': _str(raw, 'kind', field, required=True), 'name': _str(raw, 'name', field, required=True)}
    for k in ('version', 'path'):
        v = _str(raw, k, field)
        if v is not None:
            out[k] = v
    sha = _str(raw, 'sha256', field)
    if sha is None and out.get('path'):
        sha = sha256_file(out['path'])
    if sha is not None:
        sha = sha.lower()
        if not _SHA256.match(sha):
            raise EvidenceError('%s.sha256: %r is not 64 hex characters' % (field, raw.get('sha256')))
        out['sha256'] = sha
    digest = _str(raw, 'digest', field)
    if digest is not None:
        digest = digest.lower()
        if not _DIGEST.match(digest):
            raise EvidenceError('%s.digest: %r is not sha256:<64 hex>' % (field, raw.get('digest')))
        out['digest'] = digest
    return out


def batch_entry(raw: Any, i: int) -> Dict[str, Any]:
    field = 'batches[%d]' % i
    _check_keys(raw, ('index', 'kind', 'nodes', 'started', 'finished'), field)
    if raw.get('index') is None:
        raise EvidenceError('%s.index is required' % field)
    out = {'index': _int(raw['index'], field + '.index'), 'kind': _str(raw, 'kind', field) or 'batch'}  # type: Dict[str, Any]
    nodes = raw.get('nodes') or []
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise EvidenceError('%s.nodes: %r is not a list of node names' % (field, nodes))
    out['nodes'] = list(nodes)
    out['started'], out['finished'], out['duration_s'] = _times(raw, field)
    return out


def gate_entry(raw: Any, i: int) -> Dict[str, Any]:
    field = 'gates[%d]' % i
    _check_keys(raw, ('id', 'name', 'kind', 'category', 'node', 'batch', 'critical', 'passed', 'started', 'finished',
                      'inputs', 'result', 'problems'), field)
    name = _str(raw, 'name', field, required=True)
    field = 'gates[%d] (%s)' % (i, name)
    kind = _str(raw, 'kind', field) or 'other'
    category = _str(raw, 'category', field) or KIND_CATEGORY.get(kind, 'other')
    if category not in CATEGORIES:
        raise EvidenceError('%s.category: %r is not one of %s' % (field, category, ', '.join(CATEGORIES)))
    node = _str(raw, 'node', field)
    batch = None if raw.get('batch') is None else _int(raw['batch'], field + '.batch')
    out = {'name': name, 'kind': kind, 'category': category, 'node': node, 'batch': batch,
           'critical': _bool(raw, 'critical', field, True), 'passed': _bool(raw, 'passed', field, None)}  # type: Dict[str, Any]
    out['id'] = _str(raw, 'id', field) or '%s@%s#%s' % (name, node or 'fleet', '-' if batch is None else batch)
    out['started'], out['finished'], out['duration_s'] = _times(raw, field)
    for k in ('inputs', 'result'):
        v = raw.get(k)
        if v is not None and not isinstance(v, dict):
            raise EvidenceError('%s.%s: %r is not a dict' % (field, k, v))
        out[k] = copy.deepcopy(v) if v is not None else {}
    problems = raw.get('problems')
    if problems is None and isinstance(out['result'].get('problems'), list):
        problems = out['result']['problems']
    if problems is not None and (not isinstance(problems, list) or not all(isinstance(p, str) for p in problems)):
        raise EvidenceError('%s.problems: %r is not a list of strings' % (field, problems))
    out['problems'] = list(problems or [])
    return out


def action_entry(raw: Any, i: int) -> Dict[str, Any]:
    field = 'actions[%d]' % i
    _check_keys(raw, ('id', 'name', 'node', 'batch', 'started', 'finished', 'ok', 'result'), field)
    name = _str(raw, 'name', field, required=True)
    node = _str(raw, 'node', field)
    batch = None if raw.get('batch') is None else _int(raw['batch'], field + '.batch')
    out = {'name': name, 'node': node, 'batch': batch, 'ok': _bool(raw, 'ok', field, True)}  # type: Dict[str, Any]
    out['id'] = _str(raw, 'id', field) or '%s@%s#%s' % (name, node or 'fleet', '-' if batch is None else batch)
    out['started'], out['finished'], out['duration_s'] = _times(raw, field)
    v = raw.get('result')
    if v is not None and not isinstance(v, dict):
        raise EvidenceError('%s.result: %r is not a dict' % (field, v))
    out['result'] = copy.deepcopy(v) if v is not None else {}
    return out


def omitted_entry(raw: Any, i: int) -> Dict[str, Any]:
    field = 'omitted[%d]' % i
    _check_keys(raw, ('key', 'nodes', 'reason', 'blocks'), field)
    key = raw.get('key')
    if key in (None, '', {}):
        raise EvidenceError('%s.key is required (the combination)' % field)
    if not isinstance(key, (str, dict)):
        raise EvidenceError('%s.key: %r is not a string or dict' % (field, key))
    nodes = raw.get('nodes')
    if isinstance(nodes, list):
        count = len(nodes)
    elif nodes is None:
        count = 0
    else:
        count = _int(nodes, field + '.nodes')
    return {'key': copy.deepcopy(key), 'nodes': count, 'reason': _str(raw, 'reason', field) or '',
            'blocks': _bool(raw, 'blocks', field, True)}


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else json.dumps(key, sort_keys=True)


def merge(bundle: Dict[str, Any], updates: Dict[str, Any], now: Optional[datetime.datetime] = None
          ) -> Tuple[Dict[str, Any], bool]:
    """Return (new bundle, changed). Entries with an existing key replace it; nodes merge field-wise.

    ``bundle`` is not modified. The new bundle shares the entries it did not replace with ``bundle``
    (entries are replaced whole, never changed in place), and ``changed`` is judged on the entries the
    updates touched: the cost of a call grows with the bundle only by copying its top-level lists and
    its node index, not by copying or serialising every entry (issue 18: a rollout calls this a few
    times per node)."""
    if not isinstance(updates, dict):
        raise EvidenceError('updates: %r is not a mapping of entries' % (updates,))
    for key in ('nodes', 'artifacts', 'batches', 'gates', 'actions', 'omitted'):
        if updates.get(key) is not None and not isinstance(updates[key], list):
            raise EvidenceError('%s: %r is not a list of entries' % (key, updates[key]))
    new = dict(bundle)
    new['tuple'] = dict(bundle['tuple'])
    changed = False
    for side in ('before', 'after'):
        t = _tuple(updates.get('tuple_' + side), 'tuple_' + side)
        if t is not None:
            changed = changed or new['tuple'].get(side) != t
            new['tuple'][side] = t
    if updates.get('nodes'):
        new['nodes'] = dict(bundle['nodes'])
    for i, raw in enumerate(updates.get('nodes') or []):
        entry = node_entry(raw, i)
        old = new['nodes'].get(entry['name']) or {}
        merged = dict(old)
        merged.update(entry)
        if 'measured' in entry and entry['measured'] is not True:
            if entry['measured'] is None and old.get('measured') is True and old.get('tuple_after') == entry['tuple_after']:
                merged['measured'] = True
            else:
                del merged['measured']
        changed = changed or entry['name'] not in new['nodes'] or merged != old
        new['nodes'][entry['name']] = merged

    def upsert(listname: str, entries: List[Dict[str, Any]], keyfn: Any) -> bool:
        if not entries:
            return False
        new[listname] = list(bundle[listname])
        index = {keyfn(e): n for n, e in enumerate(new[listname])}
        touched = False
        for e in entries:
            k = keyfn(e)
            if k in index:
                touched = touched or new[listname][index[k]] != e
                new[listname][index[k]] = e
            else:
                index[k] = len(new[listname])
                new[listname].append(e)
                touched = True
        return touched

    changed = upsert('artifacts', [artifact_entry(r, i) for i, r in enumerate(updates.get('artifacts') or [])],
                     lambda e: (e['kind'], e['name'])) or changed
    if upsert('batches', [batch_entry(r, i) for i, r in enumerate(updates.get('batches') or [])], lambda e: e['index']):
        changed = True
        new['batches'].sort(key=lambda e: e['index'])
    changed = upsert('gates', [gate_entry(r, i) for i, r in enumerate(updates.get('gates') or [])],
                     lambda e: e['id']) or changed
    changed = upsert('actions', [action_entry(r, i) for i, r in enumerate(updates.get('actions') or [])],
                     lambda e: e['id']) or changed
    changed = upsert('omitted', [omitted_entry(r, i) for i, r in enumerate(updates.get('omitted') or [])],
                     lambda e: _key_text(e['key'])) or changed
    if changed:
        new['updated'] = rfc3339(now or utcnow())
    return new, changed


# --------------------------------------------------------------------------------------------
# Summary and verdicts
# --------------------------------------------------------------------------------------------

def _tag(name: str) -> str:
    last = name.rsplit('/', 1)[-1]
    return last.split('@', 1)[0].rsplit(':', 1)[1] if ':' in last.split('@', 1)[0] else ''


def tuple_artifacts_without_digest(bundle: Dict[str, Any]) -> List[str]:
    """Target-tuple components with no digested artifact: the driver (a package with a SHA-256, or a
    driver image with a digest whose tag starts with the version), the GPU Operator and the DCGM
    exporter (an image whose tag is the version, with a digest). The nodes' own artifacts count too."""
    after = bundle['tuple'].get('after') or {}
    artifacts = list(bundle['artifacts']) + [a for n in bundle['nodes'].values() for a in n.get('artifacts') or []]
    missing = []
    driver = after.get('driver')
    if driver:
        ok = any((a['kind'] != 'image' and a.get('sha256') and driver in (a.get('version') or '') + ' ' + a['name'])
                 or (a['kind'] == 'image' and a.get('digest') and _tag(a['name']).startswith(driver))
                 for a in artifacts)
        if not ok:
            missing.append('driver %s' % driver)
    for comp in ('gpu_operator', 'dcgm_exporter'):
        value = after.get(comp)
        if value and not any(a['kind'] == 'image' and a.get('digest') and _tag(a['name']) == value
                             for a in artifacts):
            missing.append('%s %s' % (comp, value))
    return missing


def summary(bundle: Dict[str, Any]) -> Dict[str, Any]:
    gates = bundle['gates']
    failed_critical = [g['id'] for g in gates if g['critical'] and not g['passed']]
    failed_other = [g['id'] for g in gates if not g['critical'] and not g['passed']]
    blocking = [o for o in bundle['omitted'] if o.get('blocks')]
    missing_digests = ['%s %s' % (a['kind'], a['name']) for a in bundle['artifacts']
                       if not a.get('sha256') and not a.get('digest')]
    return {
        'gates': len(gates), 'gates_passed': sum(1 for g in gates if g['passed']),
        'failed_critical': failed_critical, 'failed_noncritical': failed_other,
        'omitted': len(bundle['omitted']), 'omitted_blocking': len(blocking),
        'nodes': len(bundle['nodes']), 'batches': len(bundle['batches']),
        'artifacts_without_digest': missing_digests,
        'tuple_artifacts_without_digest': tuple_artifacts_without_digest(bundle),
        'stop': bool(failed_critical),
    }


def category_results(bundle: Dict[str, Any], nodes: Optional[List[str]] = None) -> Dict[str, Dict[str, Any]]:
    """Per category: gates seen, passed (at least one gate and every critical one passed), failures."""
    out = {}
    for cat in CATEGORIES:
        gates = [g for g in bundle['gates'] if g['category'] == cat
                 and (nodes is None or g['node'] is None or g['node'] in nodes)]
        failed = [g['id'] for g in gates if g['critical'] and not g['passed']]
        out[cat] = {'gates': [g['id'] for g in gates], 'failed': failed, 'passed': bool(gates) and not failed}
    return out


# --------------------------------------------------------------------------------------------
# HTML report: self-contained (inline CSS and SVG, no external assets)
# --------------------------------------------------------------------------------------------

PASS_COLOR = '#2e7d32'
FAIL_COLOR = '#c62828'
SOFT_FAIL_COLOR = '#ef6c00'
BATCH_COLOR = '#90caf9'
ACTION_COLOR = '#9e9e9e'

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px;color:#212121;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e0e0e0}
.verdict{display:inline-block;padding:4px 12px;border-radius:4px;color:#fff;font-weight:600}
.ok{background:%s}.stop{background:%s}
table{border-collapse:collapse;font-size:13px;margin:4px 0}
th,td{border:1px solid #e0e0e0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5}td.pass{color:%s;font-weight:600}td.fail{color:%s;font-weight:600}
td.soft{color:%s;font-weight:600}code{font-size:12px}.muted{color:#757575}
svg text{font-family:system-ui,sans-serif;font-size:12px}
""" % (PASS_COLOR, FAIL_COLOR, PASS_COLOR, FAIL_COLOR, SOFT_FAIL_COLOR)


def _e(value: Any) -> str:
    return html.escape('' if value is None else str(value), quote=True)


def _ts(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    return parse_rfc3339(value, 'time').timestamp()


def _gate_color(g: Dict[str, Any]) -> str:
    if g['passed']:
        return PASS_COLOR
    return FAIL_COLOR if g['critical'] else SOFT_FAIL_COLOR


def timeline_svg(bundle: Dict[str, Any], width: int = 1100) -> str:
    """Batches as bands, per node rows of actions (grey) and gates (green pass, red failed critical)."""
    spans = []
    for coll in ('batches', 'gates', 'actions'):
        for e in bundle[coll]:
            for k in ('started', 'finished'):
                t = _ts(e.get(k))
                if t is not None:
                    spans.append(t)
    if not spans:
        return '<p class="muted">No timings recorded: no timeline to draw.</p>'
    t0, t1 = min(spans), max(spans)
    if t1 - t0 < 1:
        t1 = t0 + 1
    label_w, pad, row_h = 230, 16, 22
    plot_w = width - label_w - pad

    def x(t: float) -> float:
        return label_w + (t - t0) / (t1 - t0) * plot_w

    node_batch = {}
    for b in bundle['batches']:
        for n in b['nodes']:
            node_batch.setdefault(n, b['index'])
    for name, n in bundle['nodes'].items():
        if 'batch' in n:
            node_batch.setdefault(name, n['batch'])
    rows = []  # (label, kind, batch index, node)
    batch_ids = sorted({b['index'] for b in bundle['batches']} | set(node_batch.values())
                       | {g['batch'] for g in bundle['gates'] if g['batch'] is not None})
    named = set()
    for bi in batch_ids:
        b = next((bb for bb in bundle['batches'] if bb['index'] == bi), None)
        rows.append(('batch %d%s' % (bi, ' (%s)' % b['kind'] if b and b['kind'] != 'batch' else ''), 'batch', bi, None))
        members = sorted(n for n, idx in node_batch.items() if idx == bi)
        for n in members:
            rows.append(('  ' + n, 'node', bi, n))
            named.add(n)
        if any(e['batch'] == bi and e['node'] is None for e in bundle['gates'] + bundle['actions']):
            # the batch's own gates and actions: its observation window, its pause point, a stop
            rows.append(('  fleet gates', 'fleet', bi, None))
    loose = sorted({g['node'] for g in bundle['gates'] if g['node'] and g['node'] not in named}
                   | {a['node'] for a in bundle['actions'] if a['node'] and a['node'] not in named})
    for n in loose:
        rows.append((n, 'node', None, n))
    if any(g['batch'] is None and g['node'] is None for g in bundle['gates']):
        rows.append(('fleet gates', 'fleet', None, None))
    top = 30
    height = top + row_h * len(rows) + 40
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="Timeline of batches and gates" '
             'width="%d" height="%d" viewBox="0 0 %d %d">' % (width, height, width, height),
             '<rect x="0" y="0" width="%d" height="%d" fill="#fafafa"/>' % (width, height)]
    # Axis with ticks.
    ticks = 6
    for i in range(ticks + 1):
        t = t0 + (t1 - t0) * i / ticks
        xx = x(t)
        parts.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e0e0e0"/>' % (xx, top - 6, xx, height - 30))
        label = datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc).strftime('%H:%M:%S')
        anchor = 'start' if i == 0 else ('end' if i == ticks else 'middle')
        parts.append('<text x="%.1f" y="%d" text-anchor="%s" fill="#616161">%s</text>' % (xx, height - 12, anchor, label))
    parts.append('<text x="8" y="18" fill="#424242" font-weight="600">UTC %s</text>' % _e(
        datetime.datetime.fromtimestamp(t0, tz=datetime.timezone.utc).strftime('%Y-%m-%d')))
    for r, (label, kind, bi, node) in enumerate(rows):
        y = top + r * row_h
        weight = ' font-weight="600"' if kind == 'batch' else ''
        parts.append('<text x="8" y="%d"%s>%s</text>' % (y + 15, weight, _e(label.strip() if kind == 'batch' else label)))
        if kind == 'batch':
            b = next((bb for bb in bundle['batches'] if bb['index'] == bi), None)
            if b and b.get('started'):
                s = _ts(b['started'])
                f = _ts(b.get('finished')) or t1
                parts.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="3" fill="%s"><title>%s</title></rect>' % (
                    x(s), y + 3, max(3.0, x(f) - x(s)), row_h - 6, BATCH_COLOR,
                    _e('batch %d: %s (%s .. %s)' % (bi, ', '.join(b['nodes']), b['started'], b.get('finished') or 'running'))))
            continue
        for a in bundle['actions']:
            on_row = (a['node'] == node and (bi is None or a['batch'] in (None, bi))) if kind == 'node' else (
                a['node'] is None and a['batch'] == bi)
            if on_row and a.get('started'):
                s = _ts(a['started'])
                f = _ts(a.get('finished')) or s
                parts.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" opacity="0.8"><title>%s</title></rect>' % (
                    x(s), y + 7, max(3.0, x(f) - x(s)), row_h - 14, ACTION_COLOR if a['ok'] else FAIL_COLOR,
                    _e('%s %s' % (a['name'], 'ok' if a['ok'] else 'FAILED'))))
        for g in bundle['gates']:
            mine = (g['node'] == node) if kind == 'node' else (g['node'] is None and g['batch'] == bi)
            if not mine or (kind == 'node' and bi is not None and g['batch'] not in (None, bi)):
                continue
            s = _ts(g.get('started')) or _ts(g.get('finished'))
            if s is None:
                continue
            f = _ts(g.get('finished')) or s
            w = max(8.0, x(f) - x(s))
            parts.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="2" fill="%s" stroke="#ffffff"><title>%s</title></rect>' % (
                x(s), y + 3, w, row_h - 6, _gate_color(g),
                _e('%s: %s%s' % (g['name'], 'PASS' if g['passed'] else 'FAIL', '' if g['critical'] else ' (non-critical)'))))
            if w > 60:
                parts.append('<text x="%.1f" y="%d" fill="#ffffff">%s</text>' % (x(s) + 4, y + 15, _e(g['name'][:int(w / 7)])))
    # Legend.
    ly = 18
    lx = label_w
    for color, text in ((BATCH_COLOR, 'batch'), (ACTION_COLOR, 'action'), (PASS_COLOR, 'gate passed'),
                        (FAIL_COLOR, 'critical gate failed'), (SOFT_FAIL_COLOR, 'non-critical gate failed')):
        parts.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>' % (
            lx, ly - 10, color, lx + 16, ly, text))
        lx += 28 + 7 * len(text)
    parts.append('</svg>')
    return '\n'.join(parts)


def _tuple_cell(t: Optional[Dict[str, str]], key: str) -> str:
    return '<code>%s</code>' % _e((t or {}).get(key, '')) if t and t.get(key) else '<span class="muted">-</span>'


def render_html(bundle: Dict[str, Any]) -> str:
    s = summary(bundle)
    verdict = ('<span class="verdict stop">STOP: %d critical gate(s) failed</span>' % len(s['failed_critical'])
               if s['stop'] else '<span class="verdict ok">all critical gates passed (%d/%d gates)</span>' % (
                   s['gates_passed'], s['gates']))
    out = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
           '<title>Upgrade evidence %s</title>' % _e(bundle['id']), '<style>%s</style></head><body>' % _CSS,
           '<h1>Upgrade evidence <code>%s</code></h1>' % _e(bundle['id']),
           '<p class="muted">created %s, updated %s</p>' % (_e(bundle['created']), _e(bundle['updated'])),
           '<p>%s</p>' % verdict]
    before, after = bundle['tuple'].get('before'), bundle['tuple'].get('after')
    out.append('<h2>Tuple</h2><table><tr><th>component</th><th>before</th><th>after</th></tr>')
    for k in TUPLE_KEYS:
        out.append('<tr><td>%s</td><td>%s</td><td>%s</td></tr>' % (k, _tuple_cell(before, k), _tuple_cell(after, k)))
    out.append('</table>')
    out.append('<h2>Timeline</h2>')
    out.append(timeline_svg(bundle))
    out.append('<h2>Gates</h2>')
    if bundle['gates']:
        out.append('<table><tr><th>gate</th><th>node</th><th>batch</th><th>category</th><th>critical</th><th>result</th>'
                   '<th>duration</th><th>problems</th></tr>')
        for g in bundle['gates']:
            cls = 'pass' if g['passed'] else ('fail' if g['critical'] else 'soft')
            out.append('<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td class="%s">%s</td><td>%s</td>'
                       '<td>%s</td></tr>' % (
                           _e(g['name']), _e(g['node'] or 'fleet'), _e('' if g['batch'] is None else g['batch']),
                           _e(g['category']), 'yes' if g['critical'] else 'no', cls, 'PASS' if g['passed'] else 'FAIL',
                           _e('' if g['duration_s'] is None else '%gs' % g['duration_s']),
                           '<br>'.join(_e(p) for p in g['problems'])))
        out.append('</table>')
    else:
        out.append('<p class="muted">No gate recorded.</p>')
    out.append('<h2>Nodes</h2><table><tr><th>node</th><th>role</th><th>batch</th><th>Node UID</th><th>machine-id</th>'
               '<th>system UUID</th><th>PCI ids</th><th>driver before</th><th>driver after</th><th>verdict</th>'
               '<th>phases</th><th>duration</th><th>rolled back</th></tr>')
    for name in sorted(bundle['nodes']):
        n = bundle['nodes'][name]
        verdict = n.get('verdict', '')
        vcls = {'upgraded': 'pass', 'failed': 'fail'}.get(verdict, '')
        phases = ' → '.join(n.get('phases', []))
        if n.get('failed_phase'):
            phases += (' → ' if phases else '') + '%s FAILED' % n['failed_phase']
        out.append('<tr><td>%s</td><td>%s</td><td>%s</td><td><code>%s</code></td><td><code>%s</code></td>'
                   '<td><code>%s</code></td><td><code>%s</code></td><td>%s</td><td>%s</td><td class="%s">%s</td>'
                   '<td>%s</td><td>%s</td><td>%s</td></tr>' % (
                       _e(name), _e(n.get('role', '')), _e(n.get('batch', '')), _e(n.get('uid', '')),
                       _e(n.get('machine_id', '')), _e(n.get('system_uuid', '')), _e(' '.join(n.get('pci_ids', []))),
                       _tuple_cell(n.get('tuple_before'), 'driver'), _tuple_cell(n.get('tuple_after'), 'driver'),
                       vcls, _e(verdict), _e(phases),
                       _e('' if n.get('duration_s') is None else '%gs' % n['duration_s']),
                       _e({True: 'yes', False: 'no'}.get(n.get('rolled_back'), ''))))
    out.append('</table>')
    out.append('<h2>Artifacts</h2><table><tr><th>kind</th><th>name</th><th>version</th><th>digest</th></tr>')
    for a in bundle['artifacts']:
        digest = a.get('digest') or ('sha256:' + a['sha256'] if a.get('sha256') else None)
        out.append('<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>' % (
            _e(a['kind']), _e(a['name']), _e(a.get('version', '')),
            '<code>%s</code>' % _e(digest) if digest else '<span class="fail">missing digest</span>'))
    out.append('</table>')
    if s['tuple_artifacts_without_digest']:
        out.append('<p class="fail">Target tuple without a recorded digest: %s</p>'
                   % _e(', '.join(s['tuple_artifacts_without_digest'])))
    out.append('<h2>Omitted combinations</h2>')
    if bundle['omitted']:
        out.append('<table><tr><th>combination</th><th>nodes</th><th>blocks promotion</th><th>reason</th></tr>')
        for o in bundle['omitted']:
            out.append('<tr><td><code>%s</code></td><td>%d</td><td>%s</td><td>%s</td></tr>' % (
                _e(_key_text(o['key'])), o['nodes'], 'yes' if o['blocks'] else 'no', _e(o['reason'])))
        out.append('</table>')
    else:
        out.append('<p class="muted">None: every combination had a canary.</p>')
    out.append('</body></html>')
    return '\n'.join(out) + '\n'
