# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Do not import from outside gpufleet.upgrade.
"""Render System Upgrade Controller (``upgrade.cattle.io/v1``) Plans for a serialized RKE2 upgrade.

One Plan per node, in the order of the reviewed serialized plan: servers first, then agents (the
RKE2 procedure), ``concurrency: 1``, ``exclusive: true``, ``cordon: true``, a node selector that
matches exactly one hostname, and a fixed ``version`` (which disables channel polling). Never a
Plan that selects a group of nodes, and exclusive Plans never run their Jobs side by side, so the
System Upgrade Controller cannot upgrade two nodes in parallel.

Refuses an RKE2 downgrade and a Kubernetes-minor skip for every node (the rules of ``_rke2``),
whatever else claims it passed (seed 004), and an agent newer than the control plane (Kubernetes
version-skew policy).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _rke2
from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s import K8sError, NotFoundError, path_for
from ansible_collections.gpufleet.upgrade.plugins.module_utils._merge_patch import merge_patch
from ansible_collections.gpufleet.upgrade.plugins.module_utils._rke2 import Rke2Version
from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import poll
from ansible_collections.gpufleet.upgrade.plugins.module_utils._text import DNS_LABEL

PLAN_API_VERSION = 'upgrade.cattle.io/v1'
PLAN_KIND = 'Plan'
HOSTNAME_LABEL = 'kubernetes.io/hostname'
CONTROL_PLANE_LABEL = 'node-role.kubernetes.io/control-plane'
DEFAULT_NAMESPACE = 'system-upgrade'
DEFAULT_SERVICE_ACCOUNT = 'system-upgrade'
DEFAULT_IMAGE = 'rancher/rke2-upgrade'
DEFAULT_NAME_PREFIX = 'gpufleet-rke2'
MANAGED_BY = 'gpufleet.upgrade'
ROLES = ('server', 'agent')
# Plan names become label keys (plan.upgrade.cattle.io/<name>) on the nodes: at most 63 characters.
MAX_NAME = 63


class SucPlanError(Exception):
    """The Plans cannot be rendered; ``problems`` lists every reason (each names the field and value)."""

    def __init__(self, problems: List[str]) -> None:
        self.problems = list(problems)
        super().__init__('; '.join(self.problems))


def parse_rke2_version(value: Any, field_name: str = 'version') -> Rke2Version:
    """Parse an RKE2 release tag (``_rke2.parse``); raise ``SucPlanError`` naming the field and the value."""
    try:
        return _rke2.parse(value)
    except ValueError as exc:
        raise SucPlanError(['%s: %s' % (field_name, exc)])


def check_hop(current: Rke2Version, target: Rke2Version, what: str) -> Optional[str]:
    """The refusal for one node's current → target hop (``_rke2.transition_problems``), or None."""
    problems = _rke2.transition_problems(current, target)
    if not problems:
        return None
    if problems[0] == _rke2.DOWNGRADE:
        return ('%s: %s → %s: %s (restore through the platform recovery procedure instead)'
                % (what, current, target, _rke2.DOWNGRADE))
    return ('%s: %s → %s: %s (skips %s; upgrade one minor at a time)'
            % (what, current, target, '; '.join(problems),
               ', '.join('1.%d' % m for m in range(current.minor + 1, target.minor))))


@dataclass
class NodePlan:
    name: str
    role: str
    current: str
    target: str
    action: str  # 'plan' | 'up_to_date'
    plan_name: Optional[str] = None
    sequence: Optional[int] = None

    def as_dict(self) -> Dict[str, Any]:
        return {'name': self.name, 'role': self.role, 'current_rke2': self.current,
                'target_rke2': self.target, 'action': self.action, 'plan_name': self.plan_name,
                'sequence': self.sequence}


@dataclass
class SucPlanResult:
    plans: List[Dict[str, Any]]
    nodes: List[NodePlan]
    notes: List[str] = field(default_factory=list)


def plan_name(prefix: str, role: str, node: str) -> str:
    """A DNS-1123 label of at most 63 characters, unique per (role, node)."""
    base = re.sub(r'[^a-z0-9-]+', '-', ('%s-%s-%s' % (prefix, role, node)).lower()).strip('-')
    base = re.sub(r'-{2,}', '-', base)
    if len(base) <= MAX_NAME and base == '%s-%s-%s' % (prefix, role, node):
        return base
    # Changed or too long: keep it readable and make it unique with a digest of the real name.
    digest = hashlib.sha256(('%s\0%s\0%s' % (prefix, role, node)).encode('utf-8')).hexdigest()[:8]
    return '%s-%s' % (base[:MAX_NAME - 9].rstrip('-'), digest)


def _drain_spec(drain: Dict[str, Any]) -> Dict[str, Any]:
    spec: Dict[str, Any] = {}
    if drain.get('timeout') is not None:
        spec['timeout'] = '%ds' % int(drain['timeout'])  # IntOrString: a string passes to kubectl drain
    if drain.get('grace_period') is not None:
        spec['gracePeriod'] = int(drain['grace_period'])
    for src, dst in (('delete_emptydir_data', 'deleteEmptydirData'), ('ignore_daemonsets', 'ignoreDaemonSets'),
                     ('force', 'force'), ('disable_eviction', 'disableEviction')):
        if drain.get(src) is not None:
            spec[dst] = bool(drain[src])
    if drain.get('skip_wait_for_delete_timeout') is not None:
        spec['skipWaitForDeleteTimeout'] = int(drain['skip_wait_for_delete_timeout'])
    return spec


def _optional_version(value: Optional[str], field: str, problems: List[str]) -> Optional[Rke2Version]:
    """The RKE2 version `value` of `field`, or None when it is not given; a malformed one adds its
    problems to `problems` (and gives None)."""
    if value is None:
        return None
    try:
        return parse_rke2_version(value, field)
    except SucPlanError as exc:
        problems.extend(exc.problems)
        return None


TOLERATION_KEYS = ('key', 'operator', 'value', 'effect', 'tolerationSeconds')
TOLERATION_OPERATORS = ('Exists', 'Equal')
TOLERATION_EFFECTS = ('NoSchedule', 'PreferNoSchedule', 'NoExecute')


def taint_tolerations(taints: Any, field: str = 'tolerate_taints') -> List[Dict[str, Any]]:
    """Tolerations of taints given as node_gate's allowed_taints are (`key` or `key=value`, any effect)."""
    if taints is None:
        return []
    if not isinstance(taints, list):
        raise SucPlanError(['%s: %r is not a list of taint keys' % (field, taints)])
    out = []
    for i, t in enumerate(taints):
        if not isinstance(t, str) or not t.strip() or t.startswith('='):
            raise SucPlanError(['%s[%d]: %r is not a taint key or key=value' % (field, i, t)])
        key, eq, value = t.partition('=')
        out.append({'key': key, 'operator': 'Equal', 'value': value} if eq else {'key': key, 'operator': 'Exists'})
    return out


def validate_tolerations(tolerations: Any, problems: List[str]) -> List[Dict[str, Any]]:
    """Pod tolerations as Kubernetes takes them; each problem names the entry and the field."""
    if tolerations is None:
        return []
    if not isinstance(tolerations, list):
        problems.append('tolerations: %r is not a list of tolerations' % (tolerations,))
        return []
    out = []
    for i, t in enumerate(tolerations):
        where = 'tolerations[%d]' % i
        if not isinstance(t, dict):
            problems.append('%s: %r is not a toleration' % (where, t))
            continue
        unknown = sorted(k for k in t if k not in TOLERATION_KEYS)
        if unknown:
            problems.append('%s: unknown field(s) %s' % (where, ', '.join(unknown)))
        op = t.get('operator', 'Equal')
        if op not in TOLERATION_OPERATORS:
            problems.append('%s: operator %r is not Exists or Equal' % (where, op))
        if t.get('effect') not in (None, '') + TOLERATION_EFFECTS:
            problems.append('%s: effect %r is not one of %s' % (where, t.get('effect'), ', '.join(TOLERATION_EFFECTS)))
        if op == 'Exists' and t.get('value'):
            problems.append('%s: operator Exists takes no value (got %r)' % (where, t.get('value')))
        if not t.get('key') and op != 'Exists':
            problems.append('%s: a toleration without a key needs operator Exists' % where)
        out.append(dict((k, v) for k, v in t.items() if v is not None))
    return out


def render_plans(nodes: List[Dict[str, Any]], target_rke2: str, current_rke2: Optional[str] = None,
                 control_plane_rke2: Optional[str] = None, namespace: str = DEFAULT_NAMESPACE,
                 service_account: str = DEFAULT_SERVICE_ACCOUNT, image: str = DEFAULT_IMAGE,
                 name_prefix: str = DEFAULT_NAME_PREFIX, drain: Optional[Dict[str, Any]] = None,
                 server_plan: Optional[str] = None, cordon: bool = True,
                 tolerations: Optional[List[Dict[str, Any]]] = None) -> SucPlanResult:
    """Render one Plan per node to upgrade, in order; raise ``SucPlanError`` with every problem.

    ``nodes``: the serialized plan, in order: ``[{name, role: server|agent, current_rke2?, role_label?,
    role_value?}]`` (``assign_roles`` sets role and the server label with its value from the Node;
    without them a server's Plan selects ``node-role.kubernetes.io/control-plane=true``);
    a node without ``current_rke2`` takes ``current_rke2``. ``control_plane_rke2``: the control
    plane's version when no server is in ``nodes`` (agents may not be newer). ``server_plan``: the
    server Plan agents wait for in their ``prepare`` step when no server is in ``nodes``.
    ``cordon``: the Plans' ``spec.cordon``. The System Upgrade Controller UNCORDONS a node when its
    Job completes if the Plan cordons or drains; a caller that cordoned and drained the node itself
    (the rollout) and must keep it cordoned until its gates pass sets ``cordon=False``.
    ``tolerations``: added to every Plan's (its Job pod's): the taints the node carries besides the
    cordon (a canary's isolation taint) would otherwise keep the upgrade Job from being scheduled.
    """
    problems: List[str] = []
    notes: List[str] = []
    extra_tolerations = validate_tolerations(tolerations, problems)

    target = parse_rke2_version(target_rke2, 'target_rke2')
    default_current = _optional_version(current_rke2, 'current_rke2', problems)
    control_plane = _optional_version(control_plane_rke2, 'control_plane_rke2', problems)

    for fname, value in (('namespace', namespace), ('name_prefix', name_prefix)):
        if not isinstance(value, str) or not DNS_LABEL.match(value) or len(value) > 40:
            problems.append('%s: %r is not a DNS-1123 label of at most 40 characters' % (fname, value))
    if server_plan is not None and (not isinstance(server_plan, str) or not DNS_LABEL.match(server_plan)):
        problems.append('server_plan: %r is not a DNS-1123 label' % (server_plan,))
    if not isinstance(image, str) or not image or ':' in image.rsplit('/', 1)[-1] or '@' in image:
        problems.append('image: %r must be an image name without a tag (the Plan version is the tag)' % (image,))
    if not isinstance(nodes, list) or not nodes:
        problems.append('nodes: %r must be a non-empty list of {name, role, current_rke2}' % (nodes,))
        raise SucPlanError(problems)

    seen: Dict[str, int] = {}
    parsed: List[Tuple[int, str, str, Optional[Rke2Version]]] = []
    role_labels: Dict[str, Tuple[str, str]] = {}
    first_agent: Optional[Tuple[int, str]] = None
    for i, node in enumerate(nodes):
        where = 'nodes[%d]' % i
        if not isinstance(node, dict):
            problems.append('%s: %r is not a mapping with name and role' % (where, node))
            continue
        name = node.get('name')
        role = node.get('role')
        if not isinstance(name, str) or not name.strip():
            problems.append('%s.name: %r must be a node name' % (where, name))
            continue
        if name in seen:
            problems.append('%s.name: node %r appears twice (also nodes[%d]); each node gets exactly one Plan'
                            % (where, name, seen[name]))
            continue
        seen[name] = i
        if role is None:
            problems.append('%s.role: not given for node %r; give it, or read it from the Node (read_cluster)'
                            % (where, name))
            continue
        if role not in ROLES:
            problems.append('%s.role: %r for node %r must be one of %s' % (where, role, name, ', '.join(ROLES)))
            continue
        if role == 'agent' and first_agent is None:
            first_agent = (i, name)
        if role == 'server' and first_agent is not None:
            problems.append('%s: server %r comes after agent %r (nodes[%d]); RKE2 upgrades every server '
                            'before any agent' % (where, name, first_agent[1], first_agent[0]))
        cur: Optional[Rke2Version] = default_current
        if node.get('current_rke2') is not None:
            try:
                cur = parse_rke2_version(node['current_rke2'], '%s.current_rke2' % where)
            except SucPlanError as exc:
                problems.extend(exc.problems)
                continue
        elif cur is None:
            problems.append('%s.current_rke2: node %r has no current RKE2 version and current_rke2 is not '
                            'set; a downgrade or minor skip cannot be ruled out' % (where, name))
            continue
        refusal = check_hop(cur, target, 'node %r' % name)
        if refusal:
            problems.append(refusal)
        parsed.append((i, name, role, cur))
        if role == 'server' and node.get('role_label'):
            # Read from the Node (read_cluster): the label that makes it a server, with its value.
            role_labels[name] = (str(node['role_label']), str(node.get('role_value') or 'true'))

    servers_in_plan = [p for p in parsed if p[2] == 'server']
    agents_to_upgrade = [p for p in parsed if p[2] == 'agent' and p[3] is not None and p[3] < target]
    if agents_to_upgrade and not servers_in_plan:
        if control_plane is None:
            notes.append('no server node in this plan and control_plane_rke2 not given: make sure the '
                         'control plane already runs %s or newer before applying the agent Plans' % (target,))
        elif control_plane < target:
            problems.append('control_plane_rke2: the control plane runs %s, older than target %s; agents '
                            'may not be newer than the control plane: upgrade the servers first'
                            % (control_plane, target))
    if problems:
        raise SucPlanError(problems)

    plans: List[Dict[str, Any]] = []
    out_nodes: List[NodePlan] = []
    last_server_plan: Optional[str] = None
    for _i, name, role, cur in parsed:
        if cur is None:  # unreachable: nodes without a version were refused above
            raise SucPlanError(['node %r: no current RKE2 version' % name])
        if cur == target:
            out_nodes.append(NodePlan(name, role, str(cur), str(target), 'up_to_date'))
            continue
        pname = plan_name(name_prefix, role, name)
        seq = len(plans) + 1
        spec: Dict[str, Any] = {
            'concurrency': 1,
            'cordon': bool(cordon),
            # Jobs of exclusive Plans never run alongside each other: even if every Plan of the set is
            # applied at once, the controller upgrades one node at a time.
            'exclusive': True,
            'nodeSelector': {'matchExpressions': [
                {'key': HOSTNAME_LABEL, 'operator': 'In', 'values': [name]},
                # The role is part of the selector: a server by the label its Node carries (control-plane
                # unless read otherwise), an agent by having no control-plane label.
                ({'key': role_labels.get(name, (CONTROL_PLANE_LABEL, 'true'))[0], 'operator': 'In',
                  'values': [role_labels.get(name, (CONTROL_PLANE_LABEL, 'true'))[1]]} if role == 'server'
                 else {'key': CONTROL_PLANE_LABEL, 'operator': 'DoesNotExist'}),
            ]},
            'serviceAccountName': service_account,
            'upgrade': {'image': image},
            'version': str(target),
        }
        if role == 'server':
            spec['tolerations'] = [{'key': 'CriticalAddonsOnly', 'operator': 'Equal', 'value': 'true',
                                    'effect': 'NoExecute'}]
        if extra_tolerations:
            spec['tolerations'] = list(spec.get('tolerations') or []) + [dict(t) for t in extra_tolerations]
        if role != 'server':
            wait_for = last_server_plan or server_plan
            if wait_for:
                spec['prepare'] = {'image': image, 'args': ['prepare', wait_for]}
        if drain:
            spec['drain'] = _drain_spec(drain)
        plans.append({
            'apiVersion': PLAN_API_VERSION,
            'kind': PLAN_KIND,
            'metadata': {
                'name': pname,
                'namespace': namespace,
                'labels': {'app.kubernetes.io/managed-by': MANAGED_BY, 'gpufleet.io/rke2-upgrade': role},
                'annotations': {'gpufleet.io/node': name, 'gpufleet.io/sequence': str(seq),
                                'gpufleet.io/from-rke2': str(cur), 'gpufleet.io/to-rke2': str(target)},
            },
            'spec': spec,
        })
        out_nodes.append(NodePlan(name, role, str(cur), str(target), 'plan', pname, seq))
        if role == 'server':
            last_server_plan = pname
    agents_planned = [n for n in out_nodes if n.role == 'agent' and n.action == 'plan']
    if agents_planned and not last_server_plan and not server_plan:
        notes.append('agent Plans have no prepare step: no server Plan in this set and server_plan not given')
    if not plans:
        notes.append('every node already runs %s: no Plan to apply' % (target,))
    return SucPlanResult(plans=plans, nodes=out_nodes, notes=notes)


# ------------------------------------------------------------------------------- applying
# A Plan whose node finished (``wait_for_plan`` done) is labelled COMPLETE_LABEL=<its version>, and
# the check "no other RKE2 upgrade unfinished" lists only the Plans without that label: the list is
# the Plans in flight, not every node upgraded so far (one list per node would otherwise read N^2/2
# Plans over a pool of N; issue 18). Rewriting a Plan's spec removes the label in the same patch.
COMPLETE_LABEL = 'gpufleet.io/rke2-complete'


UNFINISHED_SELECTOR = 'app.kubernetes.io/managed-by=%s,!%s' % (MANAGED_BY, COMPLETE_LABEL)


def complete_mark(version: str) -> str:
    """The label value for a Plan finished at ``version`` (``+`` is not allowed in a label value)."""
    return version.replace('+', '-')


def plan_path(namespace: str, name: str) -> str:
    return '/apis/upgrade.cattle.io/v1/namespaces/%s/plans/%s' % (namespace, name)


@dataclass
class ApplyResult:
    changed: bool
    applied: List[Dict[str, Any]]
    before: Dict[str, Any]
    after: Dict[str, Any]


def _ours(obj: Dict[str, Any]) -> bool:
    return ((obj.get('metadata') or {}).get('labels') or {}).get('app.kubernetes.io/managed-by') == MANAGED_BY


def _desired_patch(existing: Dict[str, Any], plan: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    meta = existing.get('metadata') or {}
    patch: Dict[str, Any] = {}
    for part in ('labels', 'annotations'):
        have = meta.get(part) or {}
        want = {k: v for k, v in plan['metadata'][part].items() if have.get(k) != v}
        if want:
            patch.setdefault('metadata', {})[part] = want
    spec = merge_patch(existing.get('spec') or {}, plan['spec'])
    if spec is not None:
        patch['spec'] = spec
    mark = (meta.get('labels') or {}).get(COMPLETE_LABEL)
    if mark is not None and (spec is not None or mark != complete_mark(plan['spec']['version'])):
        # A Plan rewritten for another version (or someone else's mark) is unfinished again: unmark it.
        patch.setdefault('metadata', {}).setdefault('labels', {})[COMPLETE_LABEL] = None
    return patch or None


def apply_plans(client: Any, plans: List[Dict[str, Any]], check_mode: bool = False) -> ApplyResult:
    """Create or update each Plan, in order; never delete, never touch a Plan gpufleet.upgrade did not make.

    A Plan of the same name without the ``app.kubernetes.io/managed-by: gpufleet.upgrade`` label is
    refused before anything is written (SucPlanError). In check mode only reads are made.
    """
    existing: List[Optional[Dict[str, Any]]] = []
    foreign = []
    for plan in plans:
        meta = plan['metadata']
        obj = client.get_or_none(plan_path(meta['namespace'], meta['name']))
        if obj is not None and not _ours(obj):
            foreign.append('Plan %s/%s exists and is not managed by %s (label app.kubernetes.io/managed-by); '
                           'refusing to change it' % (meta['namespace'], meta['name'], MANAGED_BY))
        existing.append(obj)
    if foreign:
        raise SucPlanError(foreign)

    applied: List[Dict[str, Any]] = []
    before: Dict[str, Any] = {}
    after: Dict[str, Any] = {}
    changed = False
    for plan, obj in zip(plans, existing):
        meta = plan['metadata']
        key = '%s/%s' % (meta['namespace'], meta['name'])
        path = plan_path(meta['namespace'], meta['name'])
        if obj is None:
            action = 'created'
            if not check_mode:
                client.post('/apis/upgrade.cattle.io/v1/namespaces/%s/plans' % meta['namespace'], plan)
            after[key] = {'spec': plan['spec']}
        elif _desired_patch(obj, plan) is None:
            action = 'unchanged'
        else:
            action = 'updated'
            before[key] = {'spec': obj.get('spec')}
            after[key] = {'spec': plan['spec']}
            if not check_mode:
                def compute(fresh: Dict[str, Any], plan: Dict[str, Any] = plan) -> Optional[Dict[str, Any]]:
                    if not _ours(fresh):
                        raise SucPlanError(['Plan %s/%s lost its managed-by label while being updated; refusing to '
                                            'change it' % (plan['metadata']['namespace'], plan['metadata']['name'])])
                    return _desired_patch(fresh, plan)
                client.update(path, compute)
        changed = changed or action != 'unchanged'
        applied.append({'name': meta['name'], 'namespace': meta['namespace'],
                        'node': meta['annotations']['gpufleet.io/node'], 'action': action})
    return ApplyResult(changed=changed, applied=applied, before=before, after=after)


# ------------------------------------------------------------------------------- waiting
# The System Upgrade Controller labels a node plan.upgrade.cattle.io/<plan>=<latestHash> when the
# node's upgrade Job completed, and sets the Plan's Complete condition True once no selected node
# is left (also when the selector matches no node at all: so Complete alone proves nothing about
# the node). A failed Job turns Complete False with reason JobFailed.
PLAN_LABEL_PREFIX = 'plan.upgrade.cattle.io/'
RECOVERY_HINT = ('RKE2 is not downgraded: the node stays cordoned; recover it with the platform recovery '
                 'procedure (Upgrading a Management Cluster) before any rerun')


@dataclass
class PlanProgress:
    """Where one node's Plan stands. ``done``: the node runs the target and the Plan completed for it;
    ``failed``: a reason to stop waiting now (the Job failed, or the Plan completed without the node)."""
    done: bool
    failed: Optional[str]
    summary: str
    kubelet_version: Optional[str] = None
    marked: Optional[str] = None  # the Plan's COMPLETE_LABEL as read

    def as_dict(self) -> Dict[str, Any]:
        return {'done': self.done, 'failed': self.failed, 'summary': self.summary,
                'kubelet_version': self.kubelet_version}


def _condition(obj: Dict[str, Any], ctype: str) -> Dict[str, Any]:
    for cond in ((obj.get('status') or {}).get('conditions') or []):
        if isinstance(cond, dict) and cond.get('type') == ctype:
            return cond
    return {}


def plan_progress(plan: Optional[Dict[str, Any]], node: Optional[Dict[str, Any]], target_rke2: str) -> PlanProgress:
    """Judge one node's Plan from the Plan and Node objects as read now (pure)."""
    target = parse_rke2_version(target_rke2, 'target_rke2')
    if plan is None:
        return PlanProgress(False, 'the Plan does not exist (deleted while waiting?)', 'Plan missing')
    if node is None:
        return PlanProgress(False, 'the Node does not exist', 'Node missing')
    name = (plan.get('metadata') or {}).get('name', '')
    node_name = (node.get('metadata') or {}).get('name', '')
    status = plan.get('status') or {}
    kubelet = ((node.get('status') or {}).get('nodeInfo') or {}).get('kubeletVersion')
    try:
        at_target = kubelet is not None and _rke2.parse(kubelet) == target
    except ValueError:
        at_target = False
    latest_ok = status.get('latestVersion') == str(target).replace('+', '-')
    phash = status.get('latestHash')
    labelled = bool(phash) and ((node.get('metadata') or {}).get('labels') or {}).get(PLAN_LABEL_PREFIX + name) == phash
    complete = _condition(plan, 'Complete')
    marked = ((plan.get('metadata') or {}).get('labels') or {}).get(COMPLETE_LABEL)
    applying = status.get('applying') or []
    summary = ('Plan %s: Complete=%s%s, latestVersion %s, applying %s; node %s kubeletVersion %s'
               % (name, complete.get('status', 'Unknown'),
                  ' (%s%s)' % (complete.get('reason'), ': ' + complete['message'] if complete.get('message') else '')
                  if complete.get('reason') else '', status.get('latestVersion') or '-',
                  ', '.join(applying) if applying else '-', node_name, kubelet or '-'))
    if latest_ok and complete.get('status') == 'False' and complete.get('reason') == 'JobFailed':
        return PlanProgress(False, 'the upgrade Job failed: %s' % (complete.get('message') or 'JobFailed'), summary,
                            kubelet)
    if latest_ok and complete.get('status') == 'True' and at_target and labelled:
        return PlanProgress(True, None, summary, kubelet, marked)
    if latest_ok and complete.get('status') == 'True' and not labelled and not at_target and node_name not in applying:
        return PlanProgress(False, 'the Plan completed without upgrading node %s: its node selector does not match '
                            'the node (were its role labels changed after the Plan was written?)' % node_name,
                            summary, kubelet)
    return PlanProgress(False, None, summary, kubelet)


def wait_for_plan(client: Any, plan: Dict[str, Any], node: str, target_rke2: str, timeout: float, interval: float,
                  clock: Any = None, sleep: Any = None) -> Tuple[PlanProgress, float]:
    """Poll the Plan and the Node until ``plan_progress`` says done or failed, or ``timeout`` seconds
    passed (then failed names the deadline). Returns (progress, seconds waited). Bounded."""
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    if timeout <= 0 or interval <= 0:
        raise SucPlanError(['wait_timeout (%r) and wait_interval (%r) must be positive' % (timeout, interval)])
    meta = plan['metadata']
    polled = poll(lambda: plan_progress(client.get_or_none(plan_path(meta['namespace'], meta['name'])),
                                        client.get_or_none('/api/v1/nodes/%s' % node), target_rke2),
                  timeout, interval, clock, sleep, done=lambda progress: progress.done or progress.failed)
    progress = polled.value
    if not polled.done:
        progress.failed = ('not complete after %gs (wait_timeout): %s' % (timeout, progress.summary))
    return progress, polled.elapsed


def plan_complete(plan: Dict[str, Any]) -> bool:
    """The controller finished the Plan's current version: Complete=True for its spec.version."""
    status = plan.get('status') or {}
    version = (plan.get('spec') or {}).get('version') or ''
    return (_condition(plan, 'Complete').get('status') == 'True'
            and status.get('latestVersion') == version.replace('+', '-'))


def unfinished_plans(existing: List[Dict[str, Any]], writing: List[str]) -> List[str]:
    """Descriptions of gpufleet-managed Plans (other than those named in ``writing``) that are not
    complete: while one is, no other Plan may be written (one RKE2 upgrade at a time)."""
    out = []
    for plan in sorted(existing, key=lambda p: (p.get('metadata') or {}).get('name', '')):
        meta = plan.get('metadata') or {}
        if not _ours(plan) or meta.get('name') in writing or plan_complete(plan):
            continue
        cond = _condition(plan, 'Complete')
        out.append('Plan %s/%s (node %s) is not complete (Complete=%s%s)' % (
            meta.get('namespace'), meta.get('name'), (meta.get('annotations') or {}).get('gpufleet.io/node', '?'),
            cond.get('status', 'Unknown'), ', ' + cond['reason'] if cond.get('reason') else ''))
    return out


@dataclass
class SequenceResult:
    """What ``apply_one_at_a_time`` did. ``applied``: the Plans written so far (merged over the
    steps); ``waited``: one entry a Plan waited for (name, node, done, seconds, kubelet_version,
    summary); ``msg``: why it stopped before every Plan was done (None: all done); ``refused``: it
    stopped before writing anything, ``problems`` saying why; ``error``: the SucPlanError or
    K8sError that stopped it (``applied`` still holds the Plans written before it; ``problems`` the
    error's problems); ``warnings``: a finished Plan that could not be marked complete (it is
    listed, and judged complete, by the next check: only its cost grows)."""
    applied: ApplyResult
    waited: List[Dict[str, Any]] = field(default_factory=list)
    msg: Optional[str] = None
    refused: bool = False
    problems: List[str] = field(default_factory=list)
    error: Optional[Exception] = None
    warnings: List[str] = field(default_factory=list)


def apply_one_at_a_time(client: Any, plans: List[Dict[str, Any]], namespace: str, target_rke2: str,
                        timeout: float, interval: float, clock: Any = None, sleep: Any = None) -> SequenceResult:
    """Write the Plans one at a time, each after the previous one's node runs ``target_rke2``.

    Never two RKE2 upgrades at once: while a gpufleet-managed Plan in ``namespace`` other than
    these is unfinished, nothing is written (``refused``). Then for each Plan in order: create or
    update it (``apply_plans``, which raises SucPlanError for a Plan someone else owns), and wait for
    its node (``wait_for_plan``, ``timeout`` and ``interval`` seconds); the first that does not
    finish stops the sequence (``msg``) and no later Plan is written. A SucPlanError or K8sError
    while writing or waiting for a Plan stops it too (``error``), keeping what was written before."""
    applied = ApplyResult(changed=False, applied=[], before={}, after={})
    out = SequenceResult(applied=applied)
    if not plans:
        return out
    # Plans marked complete are left out of the list (they were complete when marked; a rewrite unmarks).
    busy = unfinished_plans(client.list_all('/apis/upgrade.cattle.io/v1/namespaces/%s/plans' % namespace,
                                            {'labelSelector': UNFINISHED_SELECTOR}),
                            [pl['metadata']['name'] for pl in plans])
    if busy:
        out.refused, out.problems = True, busy
        out.msg = ('refusing to write the RKE2 Plan of %s while another RKE2 upgrade is unfinished: %s. %s.'
                   % (', '.join(pl['metadata']['annotations']['gpufleet.io/node'] for pl in plans), '; '.join(busy),
                      RECOVERY_HINT))
        return out
    for plan in plans:
        node = plan['metadata']['annotations']['gpufleet.io/node']
        try:
            step = apply_plans(client, [plan], check_mode=False)
            applied.changed = applied.changed or step.changed
            applied.applied += step.applied
            applied.before.update(step.before)
            applied.after.update(step.after)
            progress, seconds = wait_for_plan(client, plan, node, target_rke2, timeout, interval, clock=clock,
                                              sleep=sleep)
        except (SucPlanError, K8sError) as exc:
            # The Plans written before this one stay in `applied`: the caller reports them (changed).
            out.error, out.problems = exc, list(getattr(exc, 'problems', None) or [])
            out.msg = 'RKE2 Plan %s for node %s: %s' % (plan['metadata']['name'], node, exc)
            return out
        out.waited.append({'name': plan['metadata']['name'], 'node': node, 'done': progress.done,
                           'seconds': round(seconds, 1), 'kubelet_version': progress.kubelet_version,
                           'summary': progress.summary})
        if not progress.done:
            out.msg = 'RKE2 Plan %s for node %s: %s. %s.' % (
                plan['metadata']['name'], node, progress.failed, RECOVERY_HINT)
            return out
        mark = complete_mark(plan['spec']['version'])
        if progress.marked != mark:
            try:
                client.patch(plan_path(plan['metadata']['namespace'], plan['metadata']['name']),
                             {'metadata': {'labels': {COMPLETE_LABEL: mark}}})
                applied.changed = True
            except K8sError as exc:
                out.warnings.append('RKE2 Plan %s for node %s finished, but labelling it %s=%s failed (%s): the '
                                    'next node lists it again' % (plan['metadata']['name'], node, COMPLETE_LABEL,
                                                                  mark, exc))
    return out


CONTROL_PLANE_SELECTOR = 'node-role.kubernetes.io/control-plane=true'


def read_versions(client: Any, names: List[str],
                  control_plane_selector: str = CONTROL_PLANE_SELECTOR) -> Tuple[Dict[str, str], Optional[str]]:
    """What the cluster runs: each named node's RKE2 (its kubeletVersion) and the control plane's one
    version (None without control plane nodes). Raises SucPlanError naming what is wrong when a node
    does not exist or the control plane nodes run different versions (finish the control plane
    upgrade first)."""
    currents, _roles, running = read_nodes(client, names, control_plane_selector)
    return currents, running


def read_nodes(client: Any, names: List[str], control_plane_selector: str = CONTROL_PLANE_SELECTOR
               ) -> Tuple[Dict[str, str], Dict[str, _rke2.NodeRole], Optional[str]]:
    """``read_versions`` with each named node's RKE2 role as its Node's labels say (``_rke2.node_role``). A control
    plane on mixed versions is refused only where an agent is among ``names``; with servers only it is the normal
    state of a server upgrade, one server at a time (the control plane's version is then None)."""
    currents: Dict[str, str] = {}
    roles: Dict[str, _rke2.NodeRole] = {}
    for name in names:
        try:
            node = client.get(path_for('v1', 'nodes', name))
        except NotFoundError:
            raise SucPlanError(['node %s: not found in the API' % name])
        currents[name] = ((node.get('status') or {}).get('nodeInfo') or {}).get('kubeletVersion') or ''
        roles[name] = _rke2.node_role((node.get('metadata') or {}).get('labels'))
    servers = client.list_all(path_for('v1', 'nodes'), {'labelSelector': control_plane_selector})
    versions = sorted(set(((n.get('status') or {}).get('nodeInfo') or {}).get('kubeletVersion') or '' for n in servers))
    if len(versions) > 1:
        agents = [name for name in names if roles[name].role != 'server']
        if agents:
            raise SucPlanError(['the control plane nodes run different RKE2 versions (%s): finish the control plane '
                                'upgrade before upgrading agents (%s)' % (', '.join(versions), ', '.join(agents))])
        # Servers only: a control plane halfway through its upgrade is what upgrading servers one at a time leaves
        # (the second server sees the first at the target); their hops are checked one by one, no agent needs it.
        return currents, roles, None
    return currents, roles, (versions[0] or None) if versions else None


def assign_roles(nodes: List[Dict[str, Any]], roles: Dict[str, _rke2.NodeRole]) -> List[Dict[str, Any]]:
    """The input nodes with each one's role as read from its Node (``read_nodes``), its server label for the
    Plan's selector. A role given for a node must agree with its Node: else SucPlanError naming both."""
    problems: List[str] = []
    out: List[Dict[str, Any]] = []
    for i, node in enumerate(nodes):
        actual = roles.get(node.get('name'))
        if actual is None:
            out.append(dict(node))
            continue
        problem = _rke2.role_problem(node['name'], node.get('role'), actual, 'nodes[%d].role' % i)
        if problem:
            problems.append(problem)
        out.append(dict(node, role=actual.role, role_label=actual.label, role_value=actual.value))
    if problems:
        raise SucPlanError(problems)
    return out


# ------------------------------------------------------------------------------- preflight
# Before anything is drained: the System Upgrade Controller runs (its Plan CRD is established and its
# Deployment has ready replicas), and every node's RKE2 hop is allowed and its declared role (if any)
# is its Node's. Pure functions over the objects read (suc_info reads them).
PLAN_CRD = 'plans.upgrade.cattle.io'
DEFAULT_CONTROLLER = 'system-upgrade-controller'


def controller_state(crd: Optional[Dict[str, Any]], deployment: Optional[Dict[str, Any]], namespace: str,
                     controller: str) -> Tuple[Dict[str, Any], List[str]]:
    """What the CRD and the controller's Deployment say (read as they are; None when absent) and the
    problems that keep a Plan from being acted on, each naming the object and what is wrong."""
    problems: List[str] = []
    established = _condition(crd or {}, 'Established').get('status') == 'True'
    if crd is None:
        problems.append('CustomResourceDefinition %s not found: the System Upgrade Controller is not installed '
                        '(install it before an RKE2 upgrade)' % PLAN_CRD)
    elif not established:
        problems.append('CustomResourceDefinition %s is not Established' % PLAN_CRD)
    spec = (deployment or {}).get('spec') or {}
    status = (deployment or {}).get('status') or {}
    replicas = int(spec.get('replicas', 1) or 0)
    ready = int(status.get('readyReplicas') or 0)
    where = 'Deployment %s/%s' % (namespace, controller)
    if deployment is None:
        problems.append('%s not found: the System Upgrade Controller does not run there (namespace, controller)'
                        % where)
    elif ready < 1:
        problems.append('%s has %d ready replicas of %d: the System Upgrade Controller is not running'
                        % (where, ready, replicas))
    state = {'crd': PLAN_CRD, 'crd_established': established, 'namespace': namespace, 'deployment': controller,
             'replicas': replicas if deployment is not None else None,
             'ready_replicas': ready if deployment is not None else None,
             'ready': not problems}
    return state, problems


def preflight_nodes(nodes: List[Dict[str, Any]], names: List[str], target_rke2: Optional[str],
                    declared_roles: Optional[Dict[str, Any]] = None) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Per named node (its Node object in ``nodes``): its RKE2 role from its labels, its current RKE2 (the
    kubeletVersion) and, with ``target_rke2``, whether it needs a Plan (``action`` upgrade / up_to_date).
    Problems: a node not found, a kubeletVersion that is no RKE2 version, a downgrade or minor skip to the
    target, a declared role (``declared_roles``, node -> server/agent) that is not the Node's, and agents that would
    move while a server of the cluster (any Node of ``nodes`` with a server role label) runs an older RKE2."""
    problems: List[str] = []
    target = parse_rke2_version(target_rke2, 'target_rke2') if target_rke2 else None
    declared = declared_roles or {}
    if not isinstance(declared, dict):
        raise SucPlanError(['declared_roles: %r is not a mapping of node name to server or agent' % (declared,)])
    by_name = {(n.get('metadata') or {}).get('name'): n for n in nodes}
    rows: List[Dict[str, Any]] = []
    for name in names:
        node = by_name.get(name)
        if node is None:
            problems.append('node %s: not found in the API' % name)
            continue
        role = _rke2.node_role((node.get('metadata') or {}).get('labels'))
        kubelet = ((node.get('status') or {}).get('nodeInfo') or {}).get('kubeletVersion')
        row: Dict[str, Any] = {'name': name, 'role': role.role, 'role_label': role.label, 'current_rke2': kubelet,
                               'target_rke2': str(target) if target else None, 'action': None}
        problem = _rke2.role_problem(name, declared.get(name), role, 'declared_roles[%s]' % name)
        if problem:
            problems.append(problem)
        if target is not None:
            try:
                cur = _rke2.parse(kubelet)
            except ValueError as exc:
                problems.append('node %s: kubeletVersion %s' % (name, exc))
            else:
                refusal = check_hop(cur, target, 'node %s' % name)
                if refusal:
                    problems.append(refusal)
                row['action'] = 'up_to_date' if cur == target else 'upgrade'
        rows.append(row)
    moving_agents = [r['name'] for r in rows if r['role'] == 'agent' and r['action'] == 'upgrade']
    if target is not None and moving_agents:
        behind = []
        for node in nodes:
            meta = node.get('metadata') or {}
            if _rke2.node_role(meta.get('labels')).role != 'server':
                continue
            kubelet = ((node.get('status') or {}).get('nodeInfo') or {}).get('kubeletVersion')
            try:
                if _rke2.parse(kubelet) < target:
                    behind.append('%s (%s)' % (meta.get('name'), kubelet))
            except ValueError:
                continue
        if behind:
            problems.append('agents %s would move RKE2 to %s, but the control plane is not there: servers %s; RKE2 '
                            'upgrades every server before any agent (an agent may not be newer than the control plane): '
                            'upgrade the servers first' % (', '.join(moving_agents[:8]), target, ', '.join(sorted(behind)[:8])))
    return rows, problems
