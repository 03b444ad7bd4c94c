# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Used by the workload_suite filter.
"""The workload suite (issue 16, item 1): Job manifests that carry their own expectations.

Each case of the suite is one ``batch/v1`` Job manifest (the collection ships six in
``roles/node_upgrade/files/workloads``; operators add their own in the same form). Its
``metadata.annotations`` predeclare how its run is judged, before any run:

- ``gpufleet.io/expected`` (required): the value a correct run produces, as JSON (``1``,
  ``8589934592``, ``"PASS"``); a bare word that is not JSON is the string itself;
- ``gpufleet.io/tolerance``, ``gpufleet.io/tolerance-percent``: the allowed difference (numbers);
- ``gpufleet.io/result-json-path`` or ``gpufleet.io/result-regex``: where the value is in the log
  (the last JSON line, or the last match: its ``value`` group, else its first group); neither: the
  last log line;
- ``gpufleet.io/result-container``: the container whose log is read (several containers);
- ``gpufleet.io/min-gpus``: run only on nodes with at least this many GPUs (otherwise skipped, and
  said so);
- ``gpufleet.io/optional``: ``"true"`` lets ``skip`` leave the case out by name (a case that is
  not optional cannot be skipped: the suite's meaning would change silently);
- ``gpufleet.io/case``: the case name (default ``metadata.name``);
- ``gpufleet.io/description``: what it proves (shown in the evidence).

``cases(manifests, gpus, skip)`` turns them into ``workload_gate`` cases, with what was skipped and
why. Pure.
"""
from __future__ import annotations

import copy
import json
import math
import re
from typing import Any, Dict, List, Optional

ANNOTATION = 'gpufleet.io/'
KNOWN = ('expected', 'tolerance', 'tolerance-percent', 'result-json-path', 'result-regex', 'result-container',
         'min-gpus', 'optional', 'case', 'description')
_NAME_RE = re.compile(r'^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$')


class SuiteError(ValueError):
    """Bad input: the message names the case, the field and the value."""


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise SuiteError('%s: %r is not a number' % (where, text))
    if math.isnan(value) or value < 0:
        raise SuiteError('%s: %r is not a non-negative number' % (where, text))
    return value


def _expected(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _case(manifest: Any, index: int, gpus: Optional[int]) -> Dict[str, Any]:
    where = 'manifests[%d]' % index
    if not isinstance(manifest, dict) or manifest.get('kind') != 'Job' or manifest.get('apiVersion') != 'batch/v1':
        raise SuiteError('%s: not a batch/v1 Job manifest' % where)
    meta = manifest.get('metadata') if isinstance(manifest.get('metadata'), dict) else {}
    ann = meta.get('annotations') if isinstance(meta.get('annotations'), dict) else {}
    ours = dict((k[len(ANNOTATION):], v) for k, v in ann.items() if isinstance(k, str) and k.startswith(ANNOTATION))
    name = ours.get('case') or meta.get('name')
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SuiteError('%s: the case name %r (gpufleet.io/case or metadata.name) is not a lowercase DNS label of at '
                         'most 40 characters' % (where, name))
    where = '%s (%s)' % (where, name)
    unknown = sorted(k for k in ours if k not in KNOWN)
    if unknown:
        raise SuiteError('%s: unknown annotation(s) %s' % (where, ', '.join(ANNOTATION + k for k in unknown)))
    for key, value in ours.items():
        if not isinstance(value, str):
            raise SuiteError('%s: annotation %s%s: %r is not a string' % (where, ANNOTATION, key, value))
    if 'expected' not in ours:
        raise SuiteError('%s: annotation gpufleet.io/expected is missing (the value a correct run produces)' % where)
    if 'result-json-path' in ours and 'result-regex' in ours:
        raise SuiteError('%s: give gpufleet.io/result-json-path or gpufleet.io/result-regex, not both' % where)
    result: Dict[str, Any] = {}
    if 'result-json-path' in ours:
        result['json_path'] = ours['result-json-path']
    if 'result-regex' in ours:
        try:
            re.compile(ours['result-regex'])
        except re.error as exc:
            raise SuiteError('%s: annotation gpufleet.io/result-regex: %r does not compile: %s'
                             % (where, ours['result-regex'], exc))
        result['regex'] = ours['result-regex']
    if 'result-container' in ours:
        result['container'] = ours['result-container']
    case: Dict[str, Any] = {'name': name, 'manifest': manifest, 'expected': _expected(ours['expected']),
                            'result': result}
    for key, field in (('tolerance', 'tolerance'), ('tolerance-percent', 'tolerance_percent')):
        if key in ours:
            case[field] = _number(ours[key], '%s: annotation %s%s' % (where, ANNOTATION, key))
    optional = ours.get('optional', 'false')
    if optional not in ('true', 'false'):
        raise SuiteError('%s: annotation gpufleet.io/optional: %r is not "true" or "false"' % (where, optional))
    min_gpus = None
    if 'min-gpus' in ours:
        if not re.match(r'^[0-9]+$', ours['min-gpus']) or int(ours['min-gpus']) < 1:
            raise SuiteError('%s: annotation gpufleet.io/min-gpus: %r is not a whole number >= 1'
                             % (where, ours['min-gpus']))
        min_gpus = int(ours['min-gpus'])
    return {'case': case, 'optional': optional == 'true', 'min_gpus': min_gpus,
            'description': ours.get('description', '')}


def _normalized(image: str) -> str:
    """An image reference with its registry spelled out, as a container runtime resolves it:
    `rancher/rke2-upgrade` is `docker.io/rancher/rke2-upgrade`, `busybox` is `docker.io/library/busybox`."""
    first, _sep, rest = image.partition("/")
    if rest and ('.' in first or ':' in first or first == 'localhost'):
        return image
    return 'docker.io/' + (image if rest else 'library/' + image)


def mirrored(image: Any, mirror: Any, field: str = 'image') -> str:
    """`image` with the longest matching prefix of `mirror` ({'nvcr.io/': 'registry.example:5000/nvcr/'})
    replaced, matched against the image as written and with its registry spelled out (docker.io); an
    image no prefix matches is returned as written. SuiteError names the field for bad input."""
    if not isinstance(image, str) or not image:
        raise SuiteError('%s: %r is not an image reference' % (field, image))
    rules = check_mirror(mirror)
    for candidate in (image, _normalized(image)):
        hits = [k for k in rules if candidate.startswith(k)]
        if hits:
            best = max(hits, key=len)
            return rules[best] + candidate[len(best):]
    return image


def check_mirror(mirror: Any) -> Dict[str, str]:
    """The image mirror map checked: prefix -> replacement prefix, both non-empty strings."""
    if mirror is None:
        return {}
    if not isinstance(mirror, dict):
        raise SuiteError('image_mirror: %r is not a mapping of image prefixes to mirror prefixes' % (mirror,))
    for key, value in mirror.items():
        if not isinstance(key, str) or not key or not isinstance(value, str) or not value:
            raise SuiteError('image_mirror: %r: %r is not a non-empty prefix mapped to a non-empty prefix' % (key, value))
    return dict(mirror)


def _mirror_manifest(manifest: Dict[str, Any], mirror: Dict[str, str], where: str) -> Dict[str, Any]:
    """A copy of the Job manifest with every container's and init container's image mirrored."""
    out = copy.deepcopy(manifest)
    spec = ((out.get('spec') or {}).get('template') or {}).get('spec') or {}
    for kind in ('initContainers', 'containers'):
        for i, container in enumerate(spec.get(kind) or []):
            if isinstance(container, dict) and 'image' in container:
                container['image'] = mirrored(container['image'], mirror, '%s: %s[%d].image' % (where, kind, i))
    return out


def cases(manifests: Any, gpus: Any = None, skip: Any = None, image_mirror: Any = None) -> Dict[str, Any]:
    """The workload_gate cases of the suite ``manifests`` for a node with ``gpus`` GPUs (None: unknown,
    no case is skipped for it), leaving out the optional cases named in ``skip``, with every image
    rewritten by ``image_mirror`` (an air-gapped site's registry; see mirrored()).

    {'cases': [workload_gate case], 'skipped': [{'name', 'reason'}], 'names': [run case names]}.
    SuiteError names the case and the annotation for anything that does not parse, a repeated name,
    a name in ``skip`` that is no case, and a case in ``skip`` that is not optional."""
    if not isinstance(manifests, list):
        raise SuiteError('manifests: %r is not a list of Job manifests' % (manifests,))
    if not manifests:
        raise SuiteError('manifests: the suite is empty (no *.yml Job manifest in its directory)')
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        raise SuiteError('gpus: %r is not a whole number of GPUs' % (gpus,))
    skip = list(skip or [])
    if not all(isinstance(s, str) for s in skip):
        raise SuiteError('skip: %r is not a list of case names' % (skip,))
    mirror = check_mirror(image_mirror)
    parsed = [_case(m, i, gpus) for i, m in enumerate(manifests)]
    if mirror:
        for p in parsed:
            p['case']['manifest'] = _mirror_manifest(p['case']['manifest'], mirror, p['case']['name'])
    names = [p['case']['name'] for p in parsed]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SuiteError('manifests: case name(s) %s repeat' % ', '.join(dupes))
    unknown = sorted(set(skip) - set(names))
    if unknown:
        raise SuiteError('skip: %s is no case of the suite (cases: %s)' % (', '.join(unknown), ', '.join(names)))
    out: List[Dict[str, Any]] = []
    skipped: List[Dict[str, str]] = []
    for p in parsed:
        name = p['case']['name']
        if name in skip:
            if not p['optional']:
                raise SuiteError('skip: %s is not optional (gpufleet.io/optional: "true"); a required case cannot be '
                                 'skipped' % name)
            skipped.append({'name': name, 'reason': 'skipped by name (optional)'})
        elif p['min_gpus'] is not None and gpus is not None and gpus < p['min_gpus']:
            skipped.append({'name': name, 'reason': 'needs %d GPUs, the node has %d' % (p['min_gpus'], gpus)})
        else:
            out.append(p['case'])
    return {'cases': out, 'skipped': skipped, 'names': [c['name'] for c in out]}
