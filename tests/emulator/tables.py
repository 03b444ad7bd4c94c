"""Server-side printing (`meta.k8s.io/v1 Table`) for `kubectl get`, with the columns the API server
prints for the kinds a GPU-fleet operator looks at; other kinds get NAME and AGE."""
from __future__ import annotations

import datetime
from typing import Any, Callable

from .resources import ResourceType


def human_age(ts: str | None, now: datetime.datetime | None = None) -> str:
    """k8s.io/apimachinery duration.HumanDuration, as AGE columns print it."""
    if not ts:
        return '<unknown>'
    try:
        then = datetime.datetime.strptime(ts, '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return '<unknown>'
    now = now or datetime.datetime.now(datetime.timezone.utc)
    secs = int((now - then).total_seconds())
    if secs < -1:
        return '<invalid>'
    secs = max(secs, 0)
    if secs < 120:
        return '%ds' % secs
    mins = secs // 60
    if mins < 10:
        return '%dm%ds' % (mins, secs % 60) if secs % 60 else '%dm' % mins
    if mins < 180:
        return '%dm' % mins
    hours = mins // 60
    if hours < 8:
        return '%dh%dm' % (hours, mins % 60) if mins % 60 else '%dh' % hours
    if hours < 48:
        return '%dh' % hours
    if hours < 24 * 8:
        return '%dd%dh' % (hours // 24, hours % 24) if hours % 24 else '%dd' % (hours // 24)
    if hours < 24 * 365 * 2:
        return '%dd' % (hours // 24)
    return '%dy' % (hours // 24 // 365)


def _cond(obj: dict, ctype: str) -> str | None:
    for c in (obj.get('status') or {}).get('conditions') or []:
        if c.get('type') == ctype:
            return c.get('status')
    return None


def _node_row(o: dict) -> list[Any]:
    ready = _cond(o, 'Ready')
    status = 'Ready' if ready == 'True' else 'NotReady' if ready == 'False' else 'Unknown'
    if (o.get('spec') or {}).get('unschedulable'):
        status += ',SchedulingDisabled'
    labels = o['metadata'].get('labels') or {}
    roles = sorted(k.split('/', 1)[1] for k in labels if k.startswith('node-role.kubernetes.io/'))
    info = (o.get('status') or {}).get('nodeInfo') or {}
    addrs = {a.get('type'): a.get('address') for a in (o.get('status') or {}).get('addresses') or []}
    return [o['metadata']['name'], status, ','.join(roles) or '<none>', human_age(o['metadata'].get(
        'creationTimestamp')), info.get('kubeletVersion', ''), addrs.get('InternalIP', '<none>'),
        addrs.get('ExternalIP', '<none>'), info.get('osImage', '<unknown>'), info.get('kernelVersion', '<unknown>'),
        info.get('containerRuntimeVersion', '<unknown>')]


def _pod_row(o: dict) -> list[Any]:
    spec, status = o.get('spec') or {}, o.get('status') or {}
    statuses = status.get('containerStatuses') or []
    total = len(spec.get('containers') or [])
    ready = sum(1 for c in statuses if c.get('ready'))
    restarts = sum(int(c.get('restartCount') or 0) for c in statuses)
    reason = status.get('reason') or status.get('phase') or 'Pending'
    if reason == 'Succeeded':
        reason = 'Completed'
    elif reason == 'Failed':
        reason = 'Error'
    for c in statuses:
        waiting = (c.get('state') or {}).get('waiting')
        if waiting and waiting.get('reason'):
            reason = waiting['reason']
    if o['metadata'].get('deletionTimestamp'):
        reason = 'Terminating'
    return [o['metadata']['name'], '%d/%d' % (ready, total), reason, restarts,
            human_age(o['metadata'].get('creationTimestamp')), status.get('podIP') or '<none>',
            spec.get('nodeName') or '<none>', '<none>', '<none>']


def _job_row(o: dict) -> list[Any]:
    spec, status = o.get('spec') or {}, o.get('status') or {}
    state = 'Running'
    if _cond(o, 'Complete') == 'True':
        state = 'Complete'
    elif _cond(o, 'Failed') == 'True':
        state = 'Failed'
    elif spec.get('suspend'):
        state = 'Suspended'
    duration = ''
    if status.get('startTime'):
        end = status.get('completionTime')
        now = None
        if end:
            now = datetime.datetime.strptime(end, '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.timezone.utc)
        duration = human_age(status['startTime'], now)
    return [o['metadata']['name'], state, '%d/%d' % (status.get('succeeded') or 0, spec.get('completions') or 1),
            duration, human_age(o['metadata'].get('creationTimestamp'))]


def _pdb_row(o: dict) -> list[Any]:
    spec, status = o.get('spec') or {}, o.get('status') or {}
    return [o['metadata']['name'], str(spec.get('minAvailable', 'N/A')), str(spec.get('maxUnavailable', 'N/A')),
            status.get('disruptionsAllowed', 0), human_age(o['metadata'].get('creationTimestamp'))]


def _vmi_row(o: dict) -> list[Any]:
    status = o.get('status') or {}
    return [o['metadata']['name'], human_age(o['metadata'].get('creationTimestamp')), status.get('phase', ''),
            ((status.get('interfaces') or [{}])[0]).get('ipAddress', ''), status.get('nodeName', ''),
            _cond(o, 'Ready') or 'False']


def _vm_row(o: dict) -> list[Any]:
    status = o.get('status') or {}
    return [o['metadata']['name'], human_age(o['metadata'].get('creationTimestamp')),
            status.get('printableStatus', ''), str(bool(status.get('ready'))).lower().capitalize()]


def _default_row(o: dict) -> list[Any]:
    return [o['metadata']['name'], human_age(o['metadata'].get('creationTimestamp'))]


def _cols(*spec: str) -> list[dict[str, Any]]:
    out = []
    for s in spec:
        name, _sep, rest = s.partition(':')
        ctype, _sep, prio = rest.partition(':')
        out.append({'name': name, 'type': ctype or 'string', 'format': 'name' if name == 'Name' else '',
                    'description': '', 'priority': int(prio or 0)})
    return out


PRINTERS: dict[tuple[str, str], tuple[list[dict[str, Any]], Callable[[dict], list[Any]]]] = {
    ('', 'Node'): (_cols('Name', 'Status', 'Roles', 'Age', 'Version', 'Internal-IP::1', 'External-IP::1',
                         'OS-Image::1', 'Kernel-Version::1', 'Container-Runtime::1'), _node_row),
    ('', 'Pod'): (_cols('Name', 'Ready', 'Status', 'Restarts:integer', 'Age', 'IP::1', 'Node::1',
                        'Nominated Node::1', 'Readiness Gates::1'), _pod_row),
    ('batch', 'Job'): (_cols('Name', 'Status', 'Completions', 'Duration', 'Age'), _job_row),
    ('policy', 'PodDisruptionBudget'): (_cols('Name', 'Min Available', 'Max Unavailable',
                                              'Allowed Disruptions:integer', 'Age'), _pdb_row),
    ('kubevirt.io', 'VirtualMachineInstance'): (_cols('Name', 'Age', 'Phase', 'IP', 'NodeName', 'Ready'), _vmi_row),
    ('kubevirt.io', 'VirtualMachine'): (_cols('Name', 'Age', 'Status', 'Ready'), _vm_row),
}


def wants_table(accept: str) -> bool:
    return 'as=Table' in (accept or '')


def table(rt: ResourceType, objs: list[dict], list_meta: dict | None = None) -> dict:
    columns, row = PRINTERS.get((rt.group, rt.kind), (_cols('Name', 'Age'), _default_row))
    rows = []
    for o in objs:
        meta = {k: v for k, v in o['metadata'].items() if k != 'managedFields'}
        rows.append({'cells': row(o), 'object': {'kind': 'PartialObjectMetadata', 'apiVersion': 'meta.k8s.io/v1',
                                                 'metadata': meta}})
    return {'kind': 'Table', 'apiVersion': 'meta.k8s.io/v1', 'metadata': dict(list_meta or {}),
            'columnDefinitions': columns, 'rows': rows}
