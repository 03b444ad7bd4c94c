# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""Which plan the upgrade gate passed with, and whether the rollout acts on that plan.

`upgrade_check` (the playbook, with ``gpufleet_evidence``; and the rollout's own gate) records each
combination's PASS in the evidence bundle as a gate of kind ``upgrade_check`` whose ``inputs`` hold
the plan file's SHA-256 (``plan_sha256``, of the file's bytes) and path. Before it acts, the
rollout computes the plan file's SHA-256 again and refuses a plan that is not the one every
recorded PASS was given: a plan edited after the gate (another batch order, other nodes, another
target) is not the reviewed plan the PASS permits. A bundle with no such record (a rollout run
without a separate gate) leaves the rollout's own gate, run next on this very file, as the gate;
it records the digest, so a later run with another plan file is refused as well.

Pure: `gate_entries` builds the bundle's gate entries, `verdict` decides.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Sequence

from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import PlanInputError, check_plan, digest_of

KIND = 'upgrade_check'
_SHA256 = re.compile(r'^[0-9a-f]{64}$')


class PlanDigestError(ValueError):
    """Bad input (the message names the field and the value)."""


def _check_sha(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _SHA256.match(value):
        raise PlanDigestError('%s: %r is not a SHA-256 (64 lowercase hex digits)' % (field, value))
    return value


def gate_entries(results: Sequence[Mapping[str, Any]], plan_sha256: str, plan_file: str,
                 started: str = '') -> List[Dict[str, Any]]:
    """The evidence `gates` entries of the gate's PASS for each combination.

    `results`: the gate task's loop results (each with ``item`` the plan's combination and the module's
    ``msg`` and ``qualification``); a result that did not pass is not a PASS to record."""
    _check_sha(plan_sha256, 'plan_sha256')
    if not isinstance(results, (list, tuple)):
        raise PlanDigestError('results: %r is not a list of the gate\'s loop results' % (type(results).__name__,))
    out = []
    for i, res in enumerate(results):
        if not isinstance(res, Mapping) or not isinstance(res.get('item'), Mapping):
            raise PlanDigestError('results[%d]: not a loop result with the combination as its item' % i)
        if res.get('failed') or res.get('skipped'):
            continue
        combination = res['item'].get('id')
        if not isinstance(combination, str) or not combination:
            raise PlanDigestError('results[%d].item.id: %r is not a combination id' % (i, combination))
        qual = res.get('qualification') if isinstance(res.get('qualification'), Mapping) else {}
        entry: Dict[str, Any] = {
            'name': KIND, 'kind': KIND, 'id': '%s@%s' % (KIND, combination), 'passed': True, 'critical': True,
            'inputs': {'plan_sha256': plan_sha256, 'plan_file': plan_file, 'combination': combination},
            'result': {'msg': res.get('msg', ''), 'qualification': dict(qual)}}
        if started:
            entry['started'] = entry['finished'] = started
        out.append(entry)
    return out


def verdict(bundle: Any, plan_sha256: str, plan_file: str) -> Dict[str, Any]:
    """Whether the plan file (`plan_sha256`) is the one every recorded gate PASS of `bundle` was given.

    {'ok': bool, 'msg': str, 'recorded': [{'id', 'plan_sha256'}]}. `bundle` None or {} (no bundle yet):
    ok, with nothing recorded."""
    _check_sha(plan_sha256, 'plan_sha256')
    if bundle is None:
        bundle = {}
    if not isinstance(bundle, Mapping):
        raise PlanDigestError('bundle: %r is not an evidence bundle (a mapping)' % (type(bundle).__name__,))
    gates = bundle.get('gates')
    gates = [] if gates is None else gates
    if not isinstance(gates, list):
        raise PlanDigestError('bundle.gates: %r is not a list' % (type(gates).__name__,))
    recorded = []
    for g in gates:
        if not isinstance(g, Mapping) or g.get('kind') != KIND or not g.get('passed'):
            continue
        sha = (g.get('inputs') or {}).get('plan_sha256') if isinstance(g.get('inputs'), Mapping) else None
        if sha is None:
            continue
        recorded.append({'id': g.get('id'), 'plan_sha256': sha, 'finished': g.get('finished') or ''})
    if not recorded:
        return {'ok': True, 'recorded': [],
                'msg': 'no upgrade_check PASS recorded with a plan digest in the evidence bundle: the rollout\'s own '
                       'gate on %s (sha256 %s) is the gate' % (plan_file, plan_sha256)}
    other = [r for r in recorded if r['plan_sha256'] != plan_sha256]
    if other:
        return {'ok': False, 'recorded': recorded,
                'msg': 'the plan file %s (sha256 %s) is not the plan upgrade_check passed with: %s. Restore the reviewed '
                       'plan, or re-plan, review and run upgrade_check again with a new evidence bundle; nothing was '
                       'changed' % (plan_file, plan_sha256, '; '.join(
                           '%s passed with sha256 %s%s' % (r['id'], r['plan_sha256'],
                                                           ' at %s' % r['finished'] if r['finished'] else '')
                           for r in other))}
    return {'ok': True, 'recorded': recorded,
            'msg': 'the plan file %s (sha256 %s) is the plan upgrade_check passed with (%s)'
                   % (plan_file, plan_sha256, ', '.join(str(r['id']) for r in recorded))}


def workflow_verdict(plan: Any, expected: Any = '') -> Dict[str, Any]:
    """Whether the plan a job read is the plan the workflow's plan job wrote: its content's digest (recomputed,
    _plan.digest_of) equals the digest it carries and, when the workflow passed one on (`expected`, set_stats
    gpufleet_plan_digest), that one. {'ok', 'msg', 'digest'}. A plan that carries no digest is refused (the planner
    always writes one), and so is one whose fields the rollout reads have the wrong shape (_plan.check_plan)."""
    if not isinstance(plan, Mapping):
        raise PlanDigestError('plan: %r is not a plan (a mapping)' % (type(plan).__name__,))
    if expected not in (None, '') and not (isinstance(expected, str) and re.match(r'^sha256:[0-9a-f]{64}$', expected)):
        raise PlanDigestError('gpufleet_plan_digest: %r is not sha256:<64 hex>' % (expected,))
    actual = digest_of(dict(plan))
    carried = plan.get('digest')
    problems = []
    try:
        check_plan(dict(plan))
    except PlanInputError as exc:
        problems.append('its content is not a plan the planner writes: %s' % exc)
    if carried in (None, ''):
        problems.append('it carries no digest (upgrade_plan writes one into every plan; without it an edit cannot be '
                        'told from the plan that was reviewed)')
    elif carried != actual:
        problems.append('its content (%s) is not the digest it carries (%s): it was edited after it was planned'
                        % (actual, carried))
    if expected not in (None, '') and actual != expected:
        problems.append('it is not the plan the workflow passed on (gpufleet_plan_digest %s, this one %s)'
                        % (expected, actual))
    if problems:
        return {'ok': False, 'digest': actual,
                'msg': 'the plan refused: %s; nothing was changed. Re-plan and review it again' % '; '.join(problems)}
    return {'ok': True, 'digest': actual,
            'msg': 'the plan is the one %s (%s)' % ('the workflow passed on' if expected else 'planned', actual)}
