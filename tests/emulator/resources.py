"""The resource types the emulator serves (discovery, URLs, kinds) and how to register more."""
from __future__ import annotations

import dataclasses
from typing import Iterable

VERBS_ALL = ('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')


@dataclasses.dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    status: bool = True              # has a status subresource (spec and status written separately)
    categories: tuple[str, ...] = ()
    index_fields: tuple[str, ...] = ()  # field paths kept in an index for fast field selectors

    @property
    def api_version(self) -> str:
        return '%s/%s' % (self.group, self.version) if self.group else self.version

    @property
    def group_version(self) -> tuple[str, str]:
        return (self.group, self.version)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return self.kind + 'List'

    def base_path(self, namespace: str | None = None) -> str:
        root = '/apis/%s/%s' % (self.group, self.version) if self.group else '/api/%s' % self.version
        if self.namespaced and namespace:
            return '%s/namespaces/%s/%s' % (root, namespace, self.plural)
        return '%s/%s' % (root, self.plural)

    def discovery(self) -> list[dict]:
        """APIResource entries (the resource and its subresources) for an APIResourceList."""
        entries = [{
            'name': self.plural, 'singularName': self.singular, 'namespaced': self.namespaced,
            'kind': self.kind, 'verbs': list(VERBS_ALL), 'shortNames': list(self.short_names),
            'categories': list(self.categories), 'storageVersionHash': '',
        }]
        if self.status:
            entries.append({'name': self.plural + '/status', 'singularName': '', 'namespaced': self.namespaced,
                            'kind': self.kind, 'verbs': ['get', 'patch', 'update']})
        if self.group == '' and self.plural == 'pods':
            entries.append({'name': 'pods/eviction', 'singularName': '', 'namespaced': True,
                            'group': 'policy', 'version': 'v1', 'kind': 'Eviction', 'verbs': ['create']})
            entries.append({'name': 'pods/log', 'singularName': '', 'namespaced': True,
                            'kind': 'Pod', 'verbs': ['get']})
        return entries


def _r(api_version: str, plural: str, kind: str, namespaced: bool = True, short: Iterable[str] = (),
       status: bool = True, categories: Iterable[str] = (), index: Iterable[str] = ()) -> ResourceType:
    group, dummy, version = api_version.rpartition('/')
    return ResourceType(group, version, plural, kind, namespaced, tuple(short), status, tuple(categories),
                        tuple(index))


BUILTIN_RESOURCES: tuple[ResourceType, ...] = (
    _r('v1', 'namespaces', 'Namespace', False, ('ns',)),
    _r('v1', 'nodes', 'Node', False, ('no',)),
    _r('v1', 'pods', 'Pod', True, ('po',), categories=('all',), index=('spec.nodeName',)),
    _r('v1', 'configmaps', 'ConfigMap', True, ('cm',), status=False),
    _r('v1', 'secrets', 'Secret', True, (), status=False),
    _r('v1', 'services', 'Service', True, ('svc',), categories=('all',)),
    _r('v1', 'serviceaccounts', 'ServiceAccount', True, ('sa',), status=False),
    _r('v1', 'events', 'Event', True, ('ev',), status=False),
    _r('v1', 'resourcequotas', 'ResourceQuota', True, ('quota',)),
    _r('v1', 'persistentvolumeclaims', 'PersistentVolumeClaim', True, ('pvc',)),
    _r('apps/v1', 'daemonsets', 'DaemonSet', True, ('ds',), categories=('all',)),
    _r('apps/v1', 'replicasets', 'ReplicaSet', True, ('rs',), categories=('all',)),
    _r('apps/v1', 'deployments', 'Deployment', True, ('deploy',), categories=('all',)),
    _r('apps/v1', 'statefulsets', 'StatefulSet', True, ('sts',), categories=('all',)),
    _r('batch/v1', 'jobs', 'Job', True, (), categories=('all',)),
    _r('batch/v1', 'cronjobs', 'CronJob', True, ('cj',), categories=('all',)),
    _r('policy/v1', 'poddisruptionbudgets', 'PodDisruptionBudget', True, ('pdb',)),
    _r('node.k8s.io/v1', 'runtimeclasses', 'RuntimeClass', False, (), status=False),
    _r('coordination.k8s.io/v1', 'leases', 'Lease', True, (), status=False),
    _r('kubevirt.io/v1', 'virtualmachineinstances', 'VirtualMachineInstance', True, ('vmi', 'vmis')),
    _r('kubevirt.io/v1', 'virtualmachines', 'VirtualMachine', True, ('vm', 'vms')),
    _r('kubevirt.io/v1', 'virtualmachineinstancemigrations', 'VirtualMachineInstanceMigration', True,
       ('vmim',)),
    _r('resource.k8s.io/v1', 'resourceclaims', 'ResourceClaim', True),
    _r('resource.k8s.io/v1', 'resourceclaimtemplates', 'ResourceClaimTemplate', True, status=False),
    _r('resource.k8s.io/v1', 'resourceslices', 'ResourceSlice', False, status=False,
       index=('spec.nodeName',)),
    _r('resource.k8s.io/v1', 'deviceclasses', 'DeviceClass', False, status=False),
    _r('upgrade.cattle.io/v1', 'plans', 'Plan', True),
    _r('nvidia.com/v1', 'clusterpolicies', 'ClusterPolicy', False),
)


class Registry:
    """Resource types by URL coordinates and by apiVersion/kind."""

    def __init__(self, types: Iterable[ResourceType] = BUILTIN_RESOURCES) -> None:
        self._by_plural: dict[tuple[str, str, str], ResourceType] = {}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        for rt in types:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._by_plural[(rt.group, rt.version, rt.plural)] = rt
        self._by_kind[(rt.api_version, rt.kind)] = rt

    def by_plural(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_plural.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType:
        try:
            return self._by_kind[(api_version, kind)]
        except KeyError:
            # Accept a plural or a lowercase kind too (emu.get('v1', 'pods', ...)).
            group, dummy, version = api_version.rpartition('/')
            rt = self._by_plural.get((group, version, kind))
            if rt is None:
                for cand in self._by_kind.values():
                    if cand.api_version == api_version and cand.kind.lower() == kind.lower():
                        return cand
                raise KeyError('the emulator does not serve %s %s; register it with '
                               'emu.register(ResourceType(...))' % (api_version, kind)) from None
            return rt

    def all(self) -> list[ResourceType]:
        return list(self._by_plural.values())

    def group_versions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for rt in self._by_plural.values():
            if rt.group:
                versions = out.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        return out
