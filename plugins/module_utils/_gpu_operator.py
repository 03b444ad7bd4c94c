# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""The NVIDIA GPU Operator's deployment: what it runs, one reviewed cluster change, and each node's
operands moved inside that node's maintenance window (docs/gpu-operator.md).

Pure functions over the objects read from the API (the modules read and write):

- `read_state(...)`: the `ClusterPolicy`, the RKE2 `HelmChart` (or none), the operator's version (its
  Deployment's image tag), the operand DaemonSets (update strategy, current ControllerRevision hash,
  template images) and every operand pod (node, revision, image, Ready, at the current revision).
- `plan_change(values, target)`: the values after the change: the target's values merged in,
  `dcgmExporter.version`, and always `daemonsets.updateStrategy: OnDelete` and
  `driver.upgradePolicy.autoUpgrade: false`, so that the change itself restarts no pod on any node;
  with what those two were (recorded once, on the object, for `restore_values`).
- `reconciled(state, values)`: has the operator rendered the new templates (every operand DaemonSet of
  a changed component carries the image the values name, its generation observed, `OnDelete`), and is
  the ClusterPolicy free of an error condition.
- `node_restarts(state, node)` and `node_settled(state, node, operands)`: the node's operand pods not
  at their DaemonSet's current revision (deleting them brings them back at it), and whether each is
  back Running, Ready and current, the validator included.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.gpufleet.upgrade.plugins.module_utils._merge_patch import merge_patch

__all__ = ['CHART_TOLERATIONS', 'DAEMONSET_TOLERATIONS', 'GpuOperatorError', 'NVIDIADRIVERS_PATH', 'OPERANDS',
           'OPERATOR_ARG_SPEC', 'PAUSED_ANNOTATION', 'BACK_ANNOTATION', 'BACK_LABEL', 'BACK_VALUE', 'back_pod',
           'node_back_settled', 'plan_back', 'plan_forward', 'snapshot_revisions', 'PAUSE_VALUE', 'RESTORE_ANNOTATION', 'drivers_of',
           'image_of', 'merge_values', 'node_paused', 'node_restarts', 'node_settled', 'plan_change',
           'plan_pause', 'plan_resume', 'read_drivers', 'read_state', 'reconciled', 'recorded_restore',
           'restore_values', 'tolerates', 'untolerated', 'values_of', 'plan_drivers', 'drivers_rendered',
           'uses_driver_crd', 'operand_names']

Obj = Dict[str, Any]

# Operand DaemonSet name -> the ClusterPolicy component whose image it runs and the suffix of its
# `nvidia.com/gpu.deploy.<suffix>` node label. DaemonSets the ClusterPolicy owns that are not listed
# are still operands (component None).
OPERANDS: Dict[str, Tuple[str, str]] = {
    'nvidia-driver-daemonset': ('driver', 'driver'),
    'nvidia-container-toolkit-daemonset': ('toolkit', 'container-toolkit'),
    'nvidia-operator-validator': ('validator', 'operator-validator'),
    'nvidia-device-plugin-daemonset': ('devicePlugin', 'device-plugin'),
    'nvidia-device-plugin-mps-control-daemon': ('devicePlugin', 'device-plugin'),
    'nvidia-dcgm': ('dcgm', 'dcgm'),
    'nvidia-dcgm-exporter': ('dcgmExporter', 'dcgm-exporter'),
    'gpu-feature-discovery': ('gfd', 'gpu-feature-discovery'),
    'nvidia-mig-manager': ('migManager', 'mig-manager'),
    'nvidia-node-status-exporter': ('nodeStatusExporter', 'node-status-exporter'),
}
VALIDATOR = 'nvidia-operator-validator'
_DEPLOY_PREFIX = 'nvidia.com/gpu.deploy.'
# What the first change recorded: the update strategy and driver auto-upgrade the operator had, so
# that a rerun never records its own OnDelete as "before" and the end of the rollout can put them back.
RESTORE_ANNOTATION = 'gpufleet.io/gpu-operator-restore'


# The options gpu_operator_info and gpu_operator_update share (doc fragment gpufleet.upgrade.gpu_operator).
OPERATOR_ARG_SPEC: Dict[str, Dict[str, Any]] = {
    'namespace': {'type': 'str', 'default': 'gpu-operator'},
    'cluster_policy': {'type': 'str'},
    'manage': {'type': 'str', 'choices': ['auto', 'helm_chart', 'cluster_policy'], 'default': 'auto'},
    'helm_chart_name': {'type': 'str', 'default': 'gpu-operator'},
    'helm_chart_namespace': {'type': 'str', 'default': 'kube-system'},
}


class GpuOperatorError(Exception):
    """Input or cluster state that stops the change; the message names the field and the value."""


# ---------------------------------------------------------------------- values
def merge_values(base: Any, extra: Any) -> Any:
    """`extra` deep-merged into a copy of `base` (mappings key by key; anything else replaces)."""
    if not isinstance(base, dict) or not isinstance(extra, dict):
        return copy.deepcopy(extra)
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merge_values(out.get(key), value) if isinstance(value, dict) else copy.deepcopy(value)
    return out


def _get(values: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = values
    for part in dotted.split('.'):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _set(values: Obj, dotted: str, value: Any) -> None:
    parts = dotted.split('.')
    cur = values
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = cur[part] = {}
        cur = nxt
    cur[parts[-1]] = value


def values_of(helm_chart: Optional[Obj], cluster_policy: Optional[Obj]) -> Obj:
    """The values the change works on: the HelmChart's `valuesContent` (YAML) when the operator is a
    HelmChart, else the ClusterPolicy's spec (the same tree for the keys the chart puts there)."""
    if helm_chart is not None:
        import yaml  # only on the controller: the modules run there
        text = ((helm_chart.get('spec') or {}).get('valuesContent')) or ''
        try:
            values = yaml.safe_load(text) if text.strip() else {}
        except yaml.YAMLError as exc:
            raise GpuOperatorError("HelmChart %s/%s: spec.valuesContent does not parse as YAML: %s" % (
                _ns(helm_chart), _name(helm_chart), str(exc).splitlines()[0]))
        if not isinstance(values, dict):
            raise GpuOperatorError('HelmChart %s/%s: spec.valuesContent is %s, not a mapping of values' % (
                _ns(helm_chart), _name(helm_chart), type(values).__name__))
        return values
    if cluster_policy is None:
        raise GpuOperatorError('no ClusterPolicy and no HelmChart: the GPU Operator is not deployed')
    return copy.deepcopy(cluster_policy.get('spec') or {})


SAFE_SETTINGS = (('daemonsets.updateStrategy', 'OnDelete'), ('driver.upgradePolicy.autoUpgrade', False))
# The chart's own `daemonsets.tolerations` (values.yaml), what the operands tolerate where the values set none.
CHART_TOLERATIONS = ({'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'},)
# What the DaemonSet controller adds to every DaemonSet pod (pkg/controller/daemon/util): a node tainted
# with only these still runs the pods.
DAEMONSET_TOLERATIONS = (
    {'key': 'node.kubernetes.io/not-ready', 'operator': 'Exists', 'effect': 'NoExecute'},
    {'key': 'node.kubernetes.io/unreachable', 'operator': 'Exists', 'effect': 'NoExecute'},
    {'key': 'node.kubernetes.io/disk-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': 'node.kubernetes.io/memory-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': 'node.kubernetes.io/pid-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'},
)


def tolerates(tolerations: Sequence[Obj], taint: Obj) -> bool:
    """Whether `tolerations` tolerate `taint`, as the scheduler decides (an empty effect matches every
    effect; operator Exists with no key matches every taint; Equal, the default, compares the value)."""
    for tol in tolerations or []:
        if tol.get('effect') and tol.get('effect') != taint.get('effect'):
            continue
        if (tol.get('operator') or 'Equal') == 'Exists':
            if not tol.get('key') or tol.get('key') == taint.get('key'):
                return True
        elif tol.get('key') == taint.get('key') and (tol.get('value') or '') == (taint.get('value') or ''):
            return True
    return False


def untolerated(node: Obj, daemonsets: Sequence[Obj], operands: Sequence[str]) -> List[str]:
    """For each of `operands` (DaemonSet names), the node's NoSchedule/NoExecute taints its pod template
    does not tolerate: a pod of it deleted from the node (or paused off it) would not come back."""
    taints = [t for t in ((node.get('spec') or {}).get('taints') or [])
              if t.get('effect') in ('NoSchedule', 'NoExecute')]
    out = []
    for ds in sorted(daemonsets, key=_name):
        if _name(ds) not in operands:
            continue
        tols = list(((((ds.get('spec') or {}).get('template') or {}).get('spec') or {}).get('tolerations')) or [])
        tols += list(DAEMONSET_TOLERATIONS)
        for t in taints:
            if not tolerates(tols, t):
                out.append('%s does not tolerate the taint %s%s:%s of %s' % (
                    _name(ds), t.get('key'), '=%s' % t['value'] if t.get('value') else '', t.get('effect'),
                    _name(node)))
    return out


def recorded_restore(obj: Optional[Obj]) -> Optional[Obj]:
    """What the first change recorded on `obj` (RESTORE_ANNOTATION), or None."""
    ann = ((obj or {}).get('metadata') or {}).get('annotations') or {}
    raw = ann.get(RESTORE_ANNOTATION)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        raise GpuOperatorError('annotation %s of %s is not JSON: %r' % (RESTORE_ANNOTATION, _name(obj or {}), raw))
    return data if isinstance(data, dict) else None


def plan_change(values: Obj, target: Mapping[str, Any], recorded: Optional[Obj] = None) -> Tuple[Obj, Obj]:
    """(values after the change, what to record for the restore).

    `target`: `values` (merged in), `dcgm_exporter_version` (dcgmExporter.version), `driver_version`
    (driver.version: the operator-managed driver, install method `operator`). The safe settings
    always win over `target['values']` (an update strategy other than OnDelete there is refused).
    `recorded`: what an earlier run recorded (kept as it is)."""
    extra = target.get('values') or {}
    if not isinstance(extra, dict):
        raise GpuOperatorError('values: expected a mapping of chart values, got %s' % type(extra).__name__)
    for key, safe in SAFE_SETTINGS:
        given = _get(extra, key)
        if given is not None and given != safe:
            raise GpuOperatorError('values.%s: %r would let the change restart operands on every node at once; the '
                                   'change sets %r and the end of the rollout restores what it was' % (key, given, safe))
    after = merge_values(values, extra)
    dcgm = target.get('dcgm_exporter_version')
    if dcgm:
        _set(after, 'dcgmExporter.version', str(dcgm))
    driver = target.get('driver_version')
    if driver:
        _set(after, 'driver.version', str(driver))
    extra_tolerations = target.get('tolerations') or []
    if extra_tolerations:
        current = _get(after, 'daemonsets.tolerations')
        _set(after, 'daemonsets.tolerations', _merged_tolerations(
            current if isinstance(current, list) else list(CHART_TOLERATIONS), extra_tolerations))
    restore = dict(recorded) if recorded else settings_of(values)
    for key, safe in SAFE_SETTINGS:
        _set(after, key, safe)
    return after, restore


def settings_of(values: Mapping[str, Any]) -> Obj:
    """What the change records to restore: the update strategy (the operator's default, RollingUpdate,
    when unset) and the driver auto-upgrade (None when unset: the restore removes the key again)."""
    return {'daemonsets.updateStrategy': _get(values, 'daemonsets.updateStrategy') or 'RollingUpdate',
            'driver.upgradePolicy.autoUpgrade': _get(values, 'driver.upgradePolicy.autoUpgrade')}


def _unset(values: Obj, dotted: str) -> None:
    parts = dotted.split('.')
    cur: Any = values
    for part in parts[:-1]:
        cur = cur.get(part) if isinstance(cur, dict) else None
    if isinstance(cur, dict):
        cur.pop(parts[-1], None)


def restore_values(values: Obj, recorded: Mapping[str, Any]) -> Obj:
    """The values with the recorded update strategy and driver auto-upgrade put back (a setting
    recorded as None, unset before the change, is removed: the chart's default applies again)."""
    out = copy.deepcopy(values)
    for key in (k for k, _v in SAFE_SETTINGS):
        if key in recorded:
            if recorded[key] is None:
                _unset(out, key)
            else:
                _set(out, key, recorded[key])
    return out


def image_of(component: Any) -> Optional[str]:
    """The image a component's values name (`repository/image:version`, or `@sha256:...`), None
    when they name no version (the operator then uses its own default)."""
    if not isinstance(component, dict) or not component.get('image') or not component.get('version'):
        return None
    version = str(component['version'])
    repo = str(component.get('repository') or '').rstrip('/')
    name = '%s/%s' % (repo, component['image']) if repo else str(component['image'])
    return '%s@%s' % (name, version) if version.startswith('sha256:') else '%s:%s' % (name, version)


def _tag(image: str) -> str:
    last = image.rsplit('/', 1)[-1]
    if '@' in last:
        return last.split('@', 1)[1]
    return last.split(':', 1)[1] if ':' in last else ''


# ---------------------------------------------------------------------- state
def _name(obj: Obj) -> str:
    return str((obj.get('metadata') or {}).get('name') or '')


def _ns(obj: Obj) -> str:
    return str((obj.get('metadata') or {}).get('namespace') or '')


def _owned_by(obj: Obj, kind: str, uid: Optional[str] = None) -> bool:
    return any(r.get('kind') == kind and (uid is None or r.get('uid') == uid)
               for r in (obj.get('metadata') or {}).get('ownerReferences') or [])


def _current_hash(ds: Obj, revisions: Sequence[Obj]) -> Optional[str]:
    uid = (ds.get('metadata') or {}).get('uid')
    own = [r for r in revisions if _owned_by(r, 'DaemonSet', uid)]
    if not own:
        return None
    latest = max(own, key=lambda r: int(r.get('revision') or 0))
    labels = (latest.get('metadata') or {}).get('labels') or {}
    return labels.get('controller-revision-hash') or _name(latest)[len(_name(ds)) + 1:] or None


def _driver_owner(ds: Obj) -> Optional[str]:
    """The NVIDIADriver that renders `ds` (a per-pool driver DaemonSet), or None."""
    return next((str(r.get('name')) for r in (ds.get('metadata') or {}).get('ownerReferences') or []
                 if r.get('kind') == 'NVIDIADriver'), None)


def _pool_driver_label(ds: Obj) -> str:
    """The deploy-label suffix a per-pool driver DaemonSet selects (`driver`, or `vgpu-manager` for a vGPU
    host manager): the `nvidia.com/gpu.deploy.*` key of its pod template's node selector."""
    selector = ((((ds.get('spec') or {}).get('template') or {}).get('spec') or {}).get('nodeSelector')) or {}
    return next((k[len(_DEPLOY_PREFIX):] for k in sorted(selector) if k.startswith(_DEPLOY_PREFIX)), 'driver')


def _ready(pod: Obj) -> bool:
    conds = {c.get('type'): c.get('status') for c in (pod.get('status') or {}).get('conditions') or []}
    return (pod.get('status') or {}).get('phase') == 'Running' and conds.get('Ready') == 'True' \
        and not (pod.get('metadata') or {}).get('deletionTimestamp')


def _condition(obj: Obj, ctype: str) -> Optional[Obj]:
    return next((c for c in (obj.get('status') or {}).get('conditions') or [] if c.get('type') == ctype), None)


def read_state(cluster_policy: Optional[Obj], daemonsets: Sequence[Obj], revisions: Sequence[Obj],
               pods: Sequence[Obj], helm_chart: Optional[Obj] = None, deployment: Optional[Obj] = None) -> Obj:
    """The operator's deployment as one plain dict (the `gpu_operator` result of gpu_operator_info)."""
    cp = cluster_policy or {}
    cp_uid = (cp.get('metadata') or {}).get('uid')
    spec = cp.get('spec') or {}
    operands: List[Obj] = []
    current: Dict[str, Optional[str]] = {}
    for ds in sorted(daemonsets, key=_name):
        name = _name(ds)
        pool_driver = _driver_owner(ds)
        if not (_owned_by(ds, 'ClusterPolicy', cp_uid) or name in OPERANDS or pool_driver):
            continue
        component, label = OPERANDS.get(name, (None, None))
        if pool_driver:
            component, label = 'driver', _pool_driver_label(ds)
        status = ds.get('status') or {}
        containers = (((ds.get('spec') or {}).get('template') or {}).get('spec') or {}).get('containers') or []
        current[name] = _current_hash(ds, revisions)
        operands.append({
            'name': name, 'component': component, 'deploy_label': _DEPLOY_PREFIX + label if label else None,
            'nvidia_driver': pool_driver,
            'update_strategy': (((ds.get('spec') or {}).get('updateStrategy') or {}).get('type')) or 'RollingUpdate',
            'image': containers[0].get('image') if containers else None,
            'revision': current[name],
            'generation': (ds.get('metadata') or {}).get('generation'),
            'observed_generation': status.get('observedGeneration'),
            'desired': status.get('desiredNumberScheduled', 0), 'ready': status.get('numberReady', 0),
            'unavailable': status.get('numberUnavailable', 0),
        })
    nodes: Dict[str, List[Obj]] = {}
    for pod in sorted(pods, key=_name):
        labels = (pod.get('metadata') or {}).get('labels') or {}
        owner = next((r.get('name') for r in (pod.get('metadata') or {}).get('ownerReferences') or []
                      if r.get('kind') == 'DaemonSet' and r.get('name') in current), None)
        back = owner is None and labels.get(BACK_LABEL) in current   # a rollback's pod (plan_back)
        if back:
            owner = labels[BACK_LABEL]
        node = (pod.get('spec') or {}).get('nodeName')
        if not owner or not node:
            continue
        containers = (pod.get('spec') or {}).get('containers') or []
        revision = labels.get('controller-revision-hash')
        nodes.setdefault(node, []).append({
            'operand': owner, 'pod': _name(pod), 'revision': revision,
            'image': containers[0].get('image') if containers else None,
            'phase': (pod.get('status') or {}).get('phase'), 'ready': _ready(pod),
            'current': not back and revision is not None and revision == current.get(owner), 'back': back,
        })
    version = None
    if deployment is not None:
        containers = (((deployment.get('spec') or {}).get('template') or {}).get('spec') or {}).get('containers') or []
        version = _tag(containers[0].get('image') or '') if containers else None
    chart = None
    if helm_chart is not None:
        hspec = helm_chart.get('spec') or {}
        failed = _condition(helm_chart, 'Failed')
        chart = {'name': _name(helm_chart), 'namespace': _ns(helm_chart), 'chart': hspec.get('chart'),
                 'version': hspec.get('version'), 'repo': hspec.get('repo'),
                 'failed': bool(failed and failed.get('status') == 'True'),
                 'message': (failed or {}).get('message') or ''}
    error = _condition(cp, 'Error')
    return {
        'version': version, 'chart': chart,
        'cluster_policy': None if cluster_policy is None else {
            'name': _name(cp), 'state': (cp.get('status') or {}).get('state'),
            # Error=True with reason OperandNotReady is the operator saying operands are not all ready
            # (under OnDelete: not all at the current revision), not a failed reconcile.
            'error': (error or {}).get('message') or (error or {}).get('reason') if (
                error and error.get('status') == 'True' and error.get('reason') != 'OperandNotReady') else None,
            'not_ready': (error or {}).get('message') if (
                error and error.get('status') == 'True' and error.get('reason') == 'OperandNotReady') else None,
            'update_strategy': _get(spec, 'daemonsets.updateStrategy') or 'RollingUpdate',
            'driver_enabled': bool(_get(spec, 'driver.enabled')),
            # The driver rendered per node pool from NVIDIADriver objects (driver.useNvidiaDriverCRD).
            'driver_crd': uses_driver_crd(spec),
            'auto_upgrade': _get(spec, 'driver.upgradePolicy.autoUpgrade'),
            'dcgm_exporter_version': _get(spec, 'dcgmExporter.version'),
            'restore': recorded_restore(helm_chart if helm_chart is not None else cluster_policy),
        },
        'operands': operands, 'nodes': nodes,
    }


# ---------------------------------------------------------------------- judging
def expected_images(values: Mapping[str, Any]) -> Dict[str, str]:
    """Component -> the image its values name (components without a version left out)."""
    out = {}
    for component in sorted({pair[0] for pair in OPERANDS.values()}):
        image = image_of(values.get(component))
        if image:
            out[component] = image
    return out


def reconciled(state: Obj, values: Mapping[str, Any]) -> Tuple[bool, List[str]]:
    """(done, what is not yet) for the operator having rendered `values` into its DaemonSets."""
    cp = state.get('cluster_policy')
    if cp is None:
        return False, ['the ClusterPolicy does not exist']
    waiting = []
    if cp.get('error'):
        waiting.append('ClusterPolicy %s reports an error: %s' % (cp['name'], cp['error']))
    want = expected_images(values)
    for op in state['operands']:
        if op['observed_generation'] is None or (op['generation'] or 0) > op['observed_generation']:
            waiting.append('DaemonSet %s: generation %s not yet observed' % (op['name'], op['generation']))
        if op['component'] != 'driver' and op['update_strategy'] != 'OnDelete':
            waiting.append('DaemonSet %s: update strategy %s, not OnDelete' % (op['name'], op['update_strategy']))
        # A per-pool driver DaemonSet runs its NVIDIADriver's image, not the values' (rendered checks it).
        image = None if op.get('nvidia_driver') else want.get(op['component'] or '')
        # The driver's image tag carries the node's OS after the version (`580.126.20-ubuntu22.04`), the operator's own.
        if image and op['image'] != image and not (op['component'] == 'driver' and (op['image'] or '').startswith(image + '-')):
            waiting.append('DaemonSet %s: image %s, not %s' % (op['name'], op['image'], image))
    return not waiting, waiting


DRIVER = 'nvidia-driver-daemonset'


def operand_names(state: Obj, names: Optional[Sequence[str]]) -> Optional[List[str]]:
    """`names` (the modules' `operands`) with the ClusterPolicy's driver DaemonSet's name standing for every driver
    DaemonSet, the ClusterPolicy's or each NVIDIADriver's (per node pool: which one runs on a node is the
    operator's choice). None (every operand) stays None."""
    if names is None:
        return None
    out = set(names)
    if DRIVER in out:
        out |= {op['name'] for op in state['operands'] if op['component'] == 'driver'}
    return sorted(out)


def node_restarts(state: Obj, node: str, operands: Optional[Sequence[str]] = None) -> List[Obj]:
    """The node's operand pods not at their DaemonSet's current revision (in `operands` if given)."""
    return [p for p in state['nodes'].get(node, [])
            if not p['current'] and not p.get('back') and (operands is None or p['operand'] in operands)]


def node_settled(state: Obj, node: str, operands: Sequence[str]) -> Tuple[bool, List[str]]:
    """(settled, what is not yet): each of `operands` (the validator's pod among them, where it runs:
    Ready once it has validated the node) has one pod on `node`, Running, Ready and at its DaemonSet's
    current revision."""
    pods = state['nodes'].get(node, [])
    waiting = []
    for name in operands:
        mine = [p for p in pods if p['operand'] == name]
        if not mine:
            waiting.append('%s: no pod on %s yet' % (name, node))
            continue
        if not any(p['current'] and p['ready'] for p in mine):
            p = mine[0]
            waiting.append('%s: pod %s at revision %s (%s, %s)' % (
                name, p['pod'], p['revision'], p['phase'], 'Ready' if p['ready'] else 'not Ready'))
        elif len(mine) > 1:
            waiting.append('%s: %d pods on %s (an old one is still terminating)' % (name, len(mine), node))
    return not waiting, waiting


# ---------------------------------------------------------------------- reading (the client's requests, GETs only)
CP_PATH = '/apis/nvidia.com/v1/clusterpolicies'


def helm_chart_path(namespace: str, name: Optional[str] = None) -> str:
    base = '/apis/helm.cattle.io/v1/namespaces/%s/helmcharts' % namespace
    return base + ('/' + name if name else '')


def read_objects(client: Any, namespace: str, cluster_policy: Optional[str], helm_chart: Optional[Tuple[str, str]],
                 manage: str = 'auto') -> Obj:
    """Everything `read_state` needs, with GETs only: {'cluster_policy', 'helm_chart', 'daemonsets',
    'revisions', 'pods', 'deployment'}. `helm_chart` (namespace, name) is looked up when `manage` is
    `auto` or `helm_chart` (absent, or no HelmChart API: None; required with `helm_chart`)."""
    policies = client.list_optional(CP_PATH)
    if cluster_policy:
        policies = [p for p in policies if _name(p) == cluster_policy]
        if not policies:
            raise GpuOperatorError("cluster_policy: ClusterPolicy %r does not exist" % cluster_policy)
    elif len(policies) > 1:
        raise GpuOperatorError('cluster_policy: %d ClusterPolicies (%s); name the one to use'
                               % (len(policies), ', '.join(sorted(_name(p) for p in policies))))
    chart = None
    if manage in ('auto', 'helm_chart') and helm_chart:
        try:
            chart = client.get_or_none(helm_chart_path(helm_chart[0], helm_chart[1]))
        except Exception as exc:  # the HelmChart API is not served (not RKE2): a 404 on the group
            if getattr(exc, 'status', None) != 404:
                raise
            chart = None
        if chart is None and manage == 'helm_chart':
            raise GpuOperatorError('helm_chart: HelmChart %s/%s does not exist' % helm_chart)
    ds_path = '/apis/apps/v1/namespaces/%s/daemonsets' % namespace
    policy = policies[0] if policies else None
    return {
        'cluster_policy': policy,
        'helm_chart': chart,
        # The per-pool drivers, read only where the ClusterPolicy hands the driver to them.
        'drivers': read_drivers(client) if uses_driver_crd((policy or {}).get('spec') or {}) else [],
        'daemonsets': client.list_all(ds_path),
        'revisions': client.list_all('/apis/apps/v1/namespaces/%s/controllerrevisions' % namespace),
        'pods': client.list_all('/api/v1/namespaces/%s/pods' % namespace),
        'deployment': client.get_or_none('/apis/apps/v1/namespaces/%s/deployments/gpu-operator' % namespace),
    }


NVIDIADRIVERS_PATH = '/apis/nvidia.com/v1alpha1/nvidiadrivers'


def read_drivers(client: Any) -> List[Obj]:
    """Every NVIDIADriver (cluster-scoped; [] where the CRD is not served)."""
    try:
        return client.list_all(NVIDIADRIVERS_PATH)
    except Exception as exc:  # the NVIDIADriver API is not served: a 404 on the group
        if getattr(exc, 'status', None) != 404:
            raise
        return []


def drivers_of(drivers: Sequence[Obj]) -> List[Obj]:
    """The operator-managed drivers per node pool (NVIDIADriver objects, `driver.nvidiaDriverCRD`):
    name, driver type, version, image, node selector, precompiled/open modules, tolerations, state, by name."""
    out = []
    for drv in sorted(drivers, key=_name):
        spec = drv.get('spec') or {}
        out.append({'name': _name(drv), 'driver_type': spec.get('driverType'), 'version': spec.get('version'),
                    'image': image_of(spec) if spec.get('image') else None,
                    'node_selector': dict(spec.get('nodeSelector') or {}),
                    'use_precompiled': bool(spec.get('usePrecompiled')),
                    'use_open_kernel_modules': bool(spec.get('useOpenKernelModules')),
                    'tolerations': list(spec.get('tolerations') or []),
                    'state': (drv.get('status') or {}).get('state')})
    return out


def uses_driver_crd(values: Mapping[str, Any]) -> bool:
    """Whether the operator's driver is rendered per node pool from NVIDIADriver objects: the ClusterPolicy's
    `driver.useNvidiaDriverCRD` (the chart's `driver.nvidiaDriverCRD.enabled`, which renders it)."""
    return bool(_get(values, 'driver.useNvidiaDriverCRD') or _get(values, 'driver.nvidiaDriverCRD.enabled'))


def _driver_path(name: str) -> str:
    return '%s/%s' % (NVIDIADRIVERS_PATH, name)


def _merged_tolerations(current: Any, extra: Sequence[Any]) -> List[Obj]:
    """A copy of the tolerations `current` with each of `extra` appended unless there (each needs a key)."""
    merged = list(copy.deepcopy(current)) if isinstance(current, list) else []
    for tol in extra:
        if not isinstance(tol, dict) or not tol.get('key'):
            raise GpuOperatorError('tolerations: %r is not a toleration with a key' % (tol,))
        if tol not in merged:
            merged.append(dict(tol))
    return merged


def plan_drivers(drivers: Sequence[Obj], target: Mapping[str, Any]) -> List[Obj]:
    """What the cluster step writes to the per-pool drivers (NVIDIADriver objects): for each one it changes,
    {'name', 'path', 'patch', 'undo', 'before', 'after'} (before/after: its version and tolerations).

    `target`: `driver_version` for the NVIDIADrivers named in `nvidia_drivers` (default: the only one there is;
    several and none named is refused), with `tolerations` added to each (their DaemonSet's pods must come back
    on the canaries); or `restore_drivers` (the way back: the `drivers` of a snapshot, drivers_of): each one's
    version and tolerations set back to the snapshot's, so its DaemonSet's template is the one the nodes still
    run. Their DaemonSets are always OnDelete (the operator renders them so): the change restarts no driver
    pod. Refused, before anything is written: a name that is no NVIDIADriver, a malformed snapshot entry."""
    by_name = {_name(d): d for d in drivers}
    wanted: Dict[str, Obj] = {}
    restore = target.get('restore_drivers')
    if target.get('nvidia_drivers') and not target.get('driver_version'):
        raise GpuOperatorError('nvidia_drivers: %r without driver_version: the NVIDIADrivers take the target driver '
                               '(install method operator); nothing was changed' % (list(target['nvidia_drivers']),))
    if restore is not None:
        if target.get('driver_version'):
            raise GpuOperatorError('restore_nvidia_drivers: the way back sets the snapshot\'s versions; not with '
                                   'driver_version %r' % (target['driver_version'],))
        for entry in restore if isinstance(restore, list) else [restore]:
            if not (isinstance(entry, Mapping) and isinstance(entry.get('name'), str) and entry.get('version')
                    and isinstance(entry.get('tolerations') or [], list)):
                raise GpuOperatorError('restore_nvidia_drivers: %r is not a driver of a gpu_operator_info snapshot '
                                       '(name, version, tolerations); nothing was changed' % (entry,))
            wanted[entry['name']] = {'version': str(entry['version']),
                                     'tolerations': list(entry.get('tolerations') or [])}
    if target.get('driver_version'):
        names = list(target.get('nvidia_drivers') or [])
        if not names:
            if len(by_name) != 1:
                raise GpuOperatorError(
                    'nvidia_drivers: the ClusterPolicy renders the driver from NVIDIADriver objects (%s); name the '
                    'ones that run the target driver; nothing was changed' % (', '.join(sorted(by_name)) or 'none'))
            names = list(by_name)
        for name in names:
            spec = (by_name.get(str(name)) or {}).get('spec') or {}
            wanted[str(name)] = {'version': str(target['driver_version']),
                                 'tolerations': _merged_tolerations(spec.get('tolerations'),
                                                                    target.get('tolerations') or [])}
    unknown = sorted(n for n in wanted if n not in by_name)
    if unknown:
        raise GpuOperatorError('nvidia_drivers: %s not NVIDIADriver objects of the cluster (%s); nothing was changed'
                               % (', '.join(repr(n) for n in unknown), ', '.join(sorted(by_name)) or 'none'))
    out = []
    for name in sorted(wanted):
        spec = by_name[name].get('spec') or {}
        before = {'version': spec.get('version'), 'tolerations': list(spec.get('tolerations') or [])}
        after = wanted[name]
        if before == after:
            continue
        patch: Obj = {'spec': {'version': after['version']}}
        if after['tolerations'] != before['tolerations']:
            patch['spec']['tolerations'] = after['tolerations'] or None   # null in a merge patch removes the key
        out.append({'name': name, 'path': _driver_path(name), 'patch': patch,
                    'undo': {'spec': {'version': spec.get('version'), 'tolerations': spec.get('tolerations')}},
                    'before': before, 'after': after})
    return out


def drivers_rendered(state: Obj, driver_plans: Sequence[Obj]) -> List[str]:
    """What is not yet rendered of `driver_plans`: each changed NVIDIADriver's DaemonSets at its new
    version (the image tag `<version>-<os>`)."""
    waiting = []
    for plan in driver_plans:
        version = plan['after']['version']
        mine = [op for op in state['operands'] if op.get('nvidia_driver') == plan['name']]
        for op in mine:
            tag = _tag(op['image'] or '')
            if tag != version and not tag.startswith(version + '-'):
                waiting.append('DaemonSet %s of NVIDIADriver %s: image %s, not driver %s' % (
                    op['name'], plan['name'], op['image'], version))
    return waiting


def state_of(objs: Obj) -> Obj:
    return read_state(objs['cluster_policy'], objs['daemonsets'], objs['revisions'], objs['pods'],
                      objs['helm_chart'], objs['deployment'])


# ---------------------------------------------------------------------- the steps (the modules' sequences)
def _dump_values(values: Obj) -> str:
    import yaml
    return yaml.safe_dump(values, sort_keys=False, default_flow_style=False)


def _usable(state: Obj, rerun: bool) -> None:
    cp = state.get('cluster_policy')
    if cp is None:
        raise GpuOperatorError('the ClusterPolicy does not exist: the GPU Operator is not deployed (or not yet '
                               'reconciled)')
    if cp.get('error'):
        raise GpuOperatorError('ClusterPolicy %s is in an error state (%s): fix the operator before changing it; '
                               'nothing was changed' % (cp['name'], cp['error']))
    # Under OnDelete the operator reports notReady until every node runs the current revision, so a
    # rerun after this collection's own change cannot wait for `ready`.
    if cp.get('state') != 'ready' and not rerun:
        raise GpuOperatorError('ClusterPolicy %s is %r, not ready: the operator has not reconciled its operands; '
                               'nothing was changed' % (cp['name'], cp.get('state')))


def _without_recorded(values: Any, restore: Mapping[str, Any]) -> Any:
    """A snapshot's values taken before the first change carry the settings that change recorded
    (an explicit ``daemonsets.updateStrategy: RollingUpdate``): they are what the restore puts back
    at the end, so they are left out of the replacement rather than refused. Any other value of a
    safe setting is still refused by plan_change."""
    if not isinstance(values, dict):
        return values
    out = copy.deepcopy(values)
    for key, _safe in SAFE_SETTINGS:
        given = _get(out, key)
        if given is not None and key in restore and given == restore[key]:
            _unset(out, key)
    return out


def plan_cluster(objs: Obj, target: Mapping[str, Any]) -> Obj:
    """What the cluster step writes: {'kind', 'path', 'patch', 'values', 'restore', 'changed',
    'before', 'after'} (before/after: the parts of the object it changes)."""
    chart = objs['helm_chart']
    policy = objs['cluster_policy']
    owner = chart if chart is not None else policy
    recorded = recorded_restore(owner)
    now = state_of(objs)
    _usable(now, rerun=recorded is not None)
    if target.get('driver_version') and not (now['cluster_policy'] or {}).get('driver_enabled'):
        raise GpuOperatorError('driver_version: %r, but ClusterPolicy %s does not enable the driver (driver.enabled is '
                               'not true): the drivers are the hosts\', not the operator\'s (install_method apt); '
                               'nothing was changed' % (target['driver_version'], now['cluster_policy']['name']))
    values = values_of(chart, policy)
    crd = uses_driver_crd((policy or {}).get('spec') or {}) or uses_driver_crd(values)
    drivers: List[Obj] = []
    if crd:
        # The NVIDIADriver objects run the driver, not driver.version: the target driver goes to them.
        drivers = plan_drivers(objs.get('drivers') or [], target)
        target = dict(target, driver_version=None)
    elif target.get('nvidia_drivers') or target.get('restore_drivers'):
        raise GpuOperatorError('nvidia_drivers: %r, but ClusterPolicy %s does not render the driver from NVIDIADriver '
                               'objects (driver.useNvidiaDriverCRD is not true); nothing was changed' % (
                                   target.get('nvidia_drivers') or sorted(
                                       str((d or {}).get('name')) for d in target.get('restore_drivers') or []),
                                   now['cluster_policy']['name']))
    if target.get('replace_values'):
        # The replacement (a snapshot's values) is checked as any target's values; what to restore
        # is what the operator has now (or what an earlier run recorded).
        restore = dict(recorded) if recorded else settings_of(values)
        new_values, _restore = plan_change({}, dict(target, values=_without_recorded(target.get('values'), restore)),
                                           recorded)
    else:
        new_values, restore = plan_change(values, target, recorded)
    ann = {RESTORE_ANNOTATION: json.dumps(restore, sort_keys=True)}
    if chart is not None:
        spec = chart.get('spec') or {}
        version = str(target.get('version') or spec.get('version') or '')
        before = {'version': spec.get('version'), 'values': values}
        after = {'version': version or None, 'values': new_values}
        patch = {'metadata': {'annotations': ann}, 'spec': {'valuesContent': _dump_values(new_values)}}
        if version:
            patch['spec']['version'] = version
        return _with_drivers({
            'kind': 'HelmChart', 'path': helm_chart_path(_ns(chart), _name(chart)), 'patch': patch,
            'values': new_values, 'restore': restore, 'version': version or None,
            'changed': before != after or recorded is None, 'before': before, 'after': after,
            'undo': {'spec': {'valuesContent': spec.get('valuesContent'), 'version': spec.get('version')},
                     'metadata': {'annotations': {RESTORE_ANNOTATION: (
                         json.dumps(recorded, sort_keys=True) if recorded else None)}}}}, drivers)
    if target.get('version'):
        raise GpuOperatorError('version: %r needs the operator\'s HelmChart (the chart version); this operator is '
                               'managed as a ClusterPolicy (change its operator Deployment with its installer)'
                               % target['version'])
    before = {'values': values}
    after = {'values': new_values}
    return _with_drivers({'kind': 'ClusterPolicy', 'path': '%s/%s' % (CP_PATH, _name(policy)),
                          # A merge patch that also removes what the new values leave out (replace_values: a key
                          # the cluster step added, such as daemonsets.tolerations, goes with the way back).
                          'patch': {'metadata': {'annotations': ann}, 'spec': merge_patch(values, new_values) or {}},
                          'values': new_values,
                          'restore': restore, 'version': None, 'changed': before != after or recorded is None,
                          'before': before, 'after': after, 'undo': None}, drivers)


def _with_drivers(plan: Obj, drivers: List[Obj]) -> Obj:
    """`plan` with the per-pool drivers it also changes (`drivers`, from plan_drivers; in the diff as
    `nvidia_drivers`)."""
    plan['drivers'] = drivers
    if drivers:
        plan['changed'] = True
        plan['before'] = dict(plan['before'], nvidia_drivers={d['name']: d['before'] for d in drivers})
        plan['after'] = dict(plan['after'], nvidia_drivers={d['name']: d['after'] for d in drivers})
    return plan


def plan_restore(objs: Obj) -> Obj:
    """What the end of the rollout writes: the recorded update strategy and driver auto-upgrade put
    back, the record removed. Nothing to do (changed False) when nothing was recorded."""
    chart = objs['helm_chart']
    policy = objs['cluster_policy']
    owner = chart if chart is not None else policy
    if owner is None:
        raise GpuOperatorError('no ClusterPolicy and no HelmChart: the GPU Operator is not deployed')
    recorded = recorded_restore(owner)
    values = values_of(chart, policy)
    if recorded is None:
        return {'kind': 'HelmChart' if chart is not None else 'ClusterPolicy', 'path': None, 'patch': None,
                'values': values, 'restore': None, 'changed': False, 'before': {'values': values},
                'after': {'values': values}}
    new_values = restore_values(values, recorded)
    ann = {RESTORE_ANNOTATION: None}
    if chart is not None:
        return {'kind': 'HelmChart', 'path': helm_chart_path(_ns(chart), _name(chart)),
                'patch': {'metadata': {'annotations': ann}, 'spec': {'valuesContent': _dump_values(new_values)}},
                'values': new_values, 'restore': recorded, 'changed': True,
                'before': {'values': values}, 'after': {'values': new_values}}
    spec_patch = copy.deepcopy(new_values)
    for key, value in recorded.items():
        if value is None and key in dict(SAFE_SETTINGS):
            _set(spec_patch, key, None)  # null in a merge patch removes the key
    return {'kind': 'ClusterPolicy', 'path': '%s/%s' % (CP_PATH, _name(policy)),
            'patch': {'metadata': {'annotations': ann}, 'spec': spec_patch}, 'values': new_values,
            'restore': recorded, 'changed': True, 'before': {'values': values}, 'after': {'values': new_values}}


def rendered(objs: Obj, plan: Obj) -> Tuple[bool, List[str]]:
    """(done, waiting) for the cluster step: the HelmChart rendered (when there is one), the
    operator's Deployment at the chart version, the operand DaemonSets at the new templates."""
    waiting: List[str] = []
    chart = objs['helm_chart']
    if plan['kind'] == 'HelmChart' and chart is not None:
        failed = _condition(chart, 'Failed')
        if failed and failed.get('status') == 'True':
            raise GpuOperatorError('HelmChart %s/%s failed: %s' % (_ns(chart), _name(chart),
                                                                   failed.get('message') or failed.get('reason')))
        state = state_of(objs)
        want = _get(plan['values'], 'operator.version') or plan.get('version')
        if want and state['version'] != want:
            waiting.append('operator Deployment at %s, not %s' % (state['version'], want))
        cp = objs['cluster_policy'] or {}
        if _get(cp.get('spec') or {}, 'daemonsets.updateStrategy') != _get(plan['values'], 'daemonsets.updateStrategy'):
            waiting.append('ClusterPolicy not yet rendered from the HelmChart\'s values')
    state = state_of(objs)
    done, more = reconciled(state, plan['values'])
    more += drivers_rendered(state, plan.get('drivers') or [])
    return done and not more and not waiting, waiting + more


# ---------------------------------------------------------------------- pausing a node's operands (host driver reload)
# The value NVIDIA's driver manager (k8s-driver-manager) gives a `nvidia.com/gpu.deploy.<operand>`
# label while it unloads the driver: any value but "true" takes the operand's pod off the node (the
# DaemonSets select `=true`), and the operator honours an existing label's value.
PAUSE_VALUE = 'paused-for-driver-upgrade'
PAUSED_ANNOTATION = 'gpufleet.io/operands-paused'
# The operands whose pods hold /dev/nvidia* (the driver manager's list; not the toolkit, which holds no device).
DEVICE_HOLDERS = ('nvidia-device-plugin-daemonset', 'nvidia-device-plugin-mps-control-daemon', 'nvidia-dcgm',
                  'nvidia-dcgm-exporter', 'gpu-feature-discovery', 'nvidia-mig-manager', 'nvidia-operator-validator',
                  'nvidia-node-status-exporter')


def plan_pause(node: Obj, present: Sequence[str], operands: Optional[Sequence[str]] = None) -> Obj:
    """{'patch', 'labels', 'operands', 'changed'}: the node's deploy labels of `operands` (default
    DEVICE_HOLDERS) that are "true" set to PAUSE_VALUE; what they were, and which of those operands had
    a pod on the node (`present`: what the resume waits for), recorded in PAUSED_ANNOTATION (a rerun
    keeps the first record and adds to it). A label that is not "true" (an operand someone disabled) is
    left alone."""
    names = list(operands) if operands is not None else list(DEVICE_HOLDERS)
    unknown = [n for n in names if n not in OPERANDS]
    if unknown:
        raise GpuOperatorError('operands: %s not operand DaemonSets (known: %s)' % (
            ', '.join(repr(n) for n in unknown), ', '.join(sorted(OPERANDS))))
    labels = (node.get('metadata') or {}).get('labels') or {}
    recorded = _paused_record(node)
    record = {'labels': dict((recorded or {}).get('labels') or {}),
              'operands': list((recorded or {}).get('operands') or [])}
    patch_labels = {}
    for name in names:
        key = 'nvidia.com/gpu.deploy.%s' % OPERANDS[name][1]
        if labels.get(key) == 'true':
            patch_labels[key] = PAUSE_VALUE
            record['labels'].setdefault(key, 'true')
        if name in present and key in record['labels'] and name not in record['operands']:
            record['operands'].append(name)
    record['operands'].sort()
    if not patch_labels:
        return {'patch': None, 'labels': sorted(record['labels']), 'operands': record['operands'], 'changed': False}
    patch = {'metadata': {'labels': patch_labels,
                          'annotations': {PAUSED_ANNOTATION: json.dumps(record, sort_keys=True)}}}
    return {'patch': patch, 'labels': sorted(record['labels']), 'operands': record['operands'], 'changed': True}


def plan_resume(node: Obj) -> Obj:
    """{'patch', 'labels', 'operands', 'changed'}: every label the pause recorded set back to what it
    was, the record removed; a label someone changed since (no longer PAUSE_VALUE) is left as it is.
    `operands`: the paused operands whose pods the resume waits for."""
    recorded = _paused_record(node)
    if recorded is None:
        return {'patch': None, 'labels': [], 'operands': [], 'changed': False}
    labels = (node.get('metadata') or {}).get('labels') or {}
    back = {k: v for k, v in (recorded.get('labels') or {}).items() if labels.get(k) == PAUSE_VALUE}
    return {'patch': {'metadata': {'labels': back, 'annotations': {PAUSED_ANNOTATION: None}}},
            'labels': sorted(back), 'operands': sorted(recorded.get('operands') or []), 'changed': True}


def _node_record(node: Obj, annotation: str, what: str, keys: Tuple[str, ...]) -> Optional[Obj]:
    """The JSON record `annotation` of `node` (None without one); refused unless each of `keys` is a mapping."""
    raw = (((node.get('metadata') or {}).get('annotations')) or {}).get(annotation)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in keys):
        raise GpuOperatorError('annotation %s of node %s is not what %s records: %r' % (annotation, _name(node), what, raw))
    return data


def _paused_record(node: Obj) -> Optional[Obj]:
    return _node_record(node, PAUSED_ANNOTATION, 'a pause', ('labels',))


def node_paused(state: Obj, node: str, operands: Sequence[str]) -> Tuple[bool, List[str]]:
    """(done, waiting): no pod of `operands` left on `node` (terminating ones included)."""
    left = [p for p in state['nodes'].get(node, []) if p['operand'] in operands and not p.get('back')]
    return not left, ['%s: pod %s still on %s (%s)' % (p['operand'], p['pod'], node, p['phase']) for p in left]


# ---------------------------------------------------------------------- a node's operands back at a snapshot's revisions
# Under OnDelete a DaemonSet recreates a deleted pod at its *current* revision only, so one node cannot
# get its old operands back from the DaemonSet. The way back (rollback of one node, past the canary too):
# the node's deploy label of each operand set to BACK_VALUE (the DaemonSet takes its pod off the node, as
# for a pause), then one pod per operand created from the DaemonSet's own ControllerRevision of the
# snapshot's revision, bound to the node. That pod is the old revision exactly (the old operator's
# template, driver container included). It is controlled by the Node (as a kubelet's mirror pod is), so
# no DaemonSet adopts it and it goes with the Node object. BACK_ANNOTATION on the Node records the labels'
# values before and the revisions; state=node (the node's next window) sets the labels back, deletes
# those pods and waits for the DaemonSets' current pods.
BACK_VALUE = 'rolled-back-by-gpufleet'
BACK_ANNOTATION = 'gpufleet.io/operands-back'
BACK_LABEL = 'gpufleet.io/operand-back'


def snapshot_revisions(snapshot: Optional[Mapping[str, Any]], node: str) -> Dict[str, str]:
    """operand DaemonSet -> the revision its pod on `node` ran in a gpu_operator_info snapshot
    (`gpu_operator`); {} when the snapshot has none for the node."""
    out: Dict[str, str] = {}
    for pod in ((snapshot or {}).get('nodes') or {}).get(node) or []:
        if pod.get('operand') and pod.get('revision') and not pod.get('back'):
            out.setdefault(pod['operand'], pod['revision'])
    return out


def _back_record(node: Obj) -> Optional[Obj]:
    return _node_record(node, BACK_ANNOTATION, 'a rollback of its operands', ('labels', 'operands'))


def back_pod_name(operand: str, node: str) -> str:
    return ('%s-back-%s' % (operand, node))[:253].rstrip('-.')


def back_pod(ds: Obj, controller_revision: Obj, node: Obj, revision: str) -> Obj:
    """The pod that runs `ds`'s `revision` (its ControllerRevision's template) on `node`."""
    data = controller_revision.get('data') or {}
    template = copy.deepcopy(((data.get('spec') or {}).get('template')) or {})
    template.pop('$patch', None)
    if not template.get('spec'):
        raise GpuOperatorError('ControllerRevision %s holds no pod template' % _name(controller_revision))
    meta = template.get('metadata') or {}
    spec = template['spec']
    spec.pop('$patch', None)
    selector = {k: v for k, v in (spec.get('nodeSelector') or {}).items() if not k.startswith(_DEPLOY_PREFIX)}
    if selector:
        spec['nodeSelector'] = selector
    else:
        spec.pop('nodeSelector', None)
    spec['nodeName'] = _name(node)
    tolerations = list(spec.get('tolerations') or [])
    for tol in DAEMONSET_TOLERATIONS:
        if tol not in tolerations:
            tolerations.append(dict(tol))
    spec['tolerations'] = tolerations
    labels = dict(meta.get('labels') or {})
    labels.update({'controller-revision-hash': revision, BACK_LABEL: _name(ds)})
    node_meta = node.get('metadata') or {}
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': back_pod_name(_name(ds), _name(node)), 'namespace': _ns(ds), 'labels': labels,
                         'annotations': dict(meta.get('annotations') or {}),
                         'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Node', 'name': _name(node),
                                              'uid': node_meta.get('uid'), 'controller': True}]},
            'spec': spec}


def plan_back(node: Obj, objs: Obj, revisions: Mapping[str, str]) -> Obj:
    """{'patch', 'pods', 'operands', 'labels', 'changed'}: what takes `node`'s operands back to
    `revisions` (operand DaemonSet -> revision, from snapshot_revisions). An operand whose pod on the
    node already runs that revision, or whose DaemonSet's current revision it is, is left alone (the
    DaemonSet runs it). Refused, before anything changes: an operand that is not an operand DaemonSet,
    a revision its DaemonSet no longer keeps (revisionHistoryLimit), a node whose deploy label of it is
    neither "true" nor already ours."""
    if not isinstance(revisions, Mapping):
        raise GpuOperatorError('revisions: expected a mapping of operand DaemonSet to revision, got %r' % (revisions,))
    state = state_of(objs)
    by_name = {_name(ds): ds for ds in objs['daemonsets']}
    current = {op['name']: op['revision'] for op in state['operands']}
    deploy_labels = {op['name']: op['deploy_label'] for op in state['operands']}
    node_name = _name(node)
    pods = state['nodes'].get(node_name, [])
    labels = (node.get('metadata') or {}).get('labels') or {}
    recorded = _back_record(node) or {'labels': {}, 'operands': {}}
    record = {'labels': dict(recorded['labels']), 'operands': dict(recorded['operands'])}
    patch_labels: Dict[str, str] = {}
    creates: List[Obj] = []
    for name in sorted(revisions):
        rev = revisions[name]
        if not deploy_labels.get(name) or name not in by_name:
            raise GpuOperatorError('revisions: %r is not an operand DaemonSet of the operator (%s); nothing was '
                                   'changed' % (name, ', '.join(sorted(by_name)) or 'none'))
        if not isinstance(rev, str) or not rev:
            raise GpuOperatorError('revisions.%s: %r is not a revision hash' % (name, rev))
        mine = [p for p in pods if p['operand'] == name]
        other = sorted({p['revision'] for p in mine if p.get('back') and p['revision'] != rev})
        if other:
            raise GpuOperatorError('node %s already runs %s at revision %s from an earlier rollback: move it to the '
                                   'current revision (state=node) before another; nothing was changed'
                                   % (node_name, name, ', '.join(str(r) for r in other)))
        if not any(p.get('back') for p in mine) and (
                rev == current.get(name) or any(p['revision'] == rev for p in mine)):
            continue   # the DaemonSet runs that revision (or the node never left it): nothing to take back
        key = deploy_labels[name]
        if labels.get(key) not in ('true', BACK_VALUE):
            raise GpuOperatorError('node %s: label %s is %r (not "true"): someone took %s off the node; nothing '
                                   'was changed' % (node_name, key, labels.get(key), name))
        uid = (by_name[name].get('metadata') or {}).get('uid')
        crs = [r for r in objs['revisions'] if _owned_by(r, 'DaemonSet', uid)
               and (((r.get('metadata') or {}).get('labels') or {}).get('controller-revision-hash') == rev
                    or _name(r) == '%s-%s' % (name, rev))]
        if not crs:
            raise GpuOperatorError('DaemonSet %s no longer keeps revision %s (its revisionHistoryLimit): the node\'s '
                                   'old %s cannot be recreated; nothing was changed' % (name, rev, name))
        if labels.get(key) == 'true':
            patch_labels[key] = BACK_VALUE
        record['labels'].setdefault(key, 'true')   # ours either way: the next window sets it back
        record['operands'][name] = rev
        if not any(p.get('back') and p['revision'] == rev for p in mine):
            creates.append(back_pod(by_name[name], crs[0], node, rev))
    changed = bool(patch_labels) or bool(creates) or record != recorded
    patch = None
    if patch_labels or record != recorded:
        patch = {'metadata': {'labels': patch_labels,
                              'annotations': {BACK_ANNOTATION: json.dumps(record, sort_keys=True)}}}
    return {'patch': patch, 'pods': creates, 'operands': dict(sorted(record['operands'].items())),
            'labels': sorted(record['labels']), 'changed': changed}


def node_back_settled(state: Obj, node: str, revisions: Mapping[str, str]) -> Tuple[bool, List[str]]:
    """(done, waiting): for each operand of `revisions`, one pod on `node`, Running, Ready, at that revision."""
    pods = state['nodes'].get(node, [])
    waiting = []
    for name in sorted(revisions):
        mine = [p for p in pods if p['operand'] == name]
        if not any(p['revision'] == revisions[name] and p['ready'] for p in mine):
            seen = ', '.join('%s at %s%s%s' % (p['pod'], p['revision'], ' (ours)' if p.get('back') else '',
                                               ' Ready' if p['ready'] else ' %s, not Ready' % p['phase'])
                             for p in mine) or 'none'
            waiting.append('%s: no Ready pod at revision %s on %s yet (pods: %s)' % (name, revisions[name], node, seen))
        elif len(mine) > 1:
            waiting.append('%s: %d pods on %s (the DaemonSet\'s is still leaving)' % (name, len(mine), node))
    return not waiting, waiting


def plan_forward(node: Obj, state: Obj) -> Obj:
    """{'patch', 'delete', 'operands', 'changed'}: undo plan_back before the node's operands move to the
    current revision: the labels it changed set back (one someone changed since is left), the record
    removed, its pods to delete. Nothing (changed False) when the node has no such record and no such pod."""
    recorded = _back_record(node)
    node_name = _name(node)
    back = [p for p in state['nodes'].get(node_name, []) if p.get('back')]
    if recorded is None and not back:
        return {'patch': None, 'delete': [], 'operands': [], 'changed': False}
    labels = (node.get('metadata') or {}).get('labels') or {}
    patch = None
    if recorded is not None:
        patch = {'metadata': {'labels': {k: v for k, v in recorded['labels'].items() if labels.get(k) == BACK_VALUE},
                              'annotations': {BACK_ANNOTATION: None}}}
    operands = sorted(set((recorded or {}).get('operands') or {}) | {p['operand'] for p in back})
    return {'patch': patch, 'delete': [p['pod'] for p in back], 'operands': operands, 'changed': True}
