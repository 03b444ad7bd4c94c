"""A real Kubernetes control plane for the tests, the molecule scenarios and the lab (test support,
not shipped): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK, built from
their Go modules (tests/cluster/go), with a fault-injecting proxy in front. See README.md here."""
import pathlib

import yaml

from .client import ApiClient, ApiError, Cluster
from .controlplane import ControlPlane, ControlPlaneError
from .faultproxy import FaultProxy, Faults

RBAC_DIR = pathlib.Path(__file__).resolve().parents[2] / 'docs' / 'rbac'

__all__ = ['ApiClient', 'ApiError', 'Cluster', 'ControlPlane', 'ControlPlaneError', 'FaultProxy', 'Faults',
           'start_cluster']


def start_cluster(workdir, log=None):  # type: ignore[no-untyped-def]
    """Start a control plane in `workdir` and its fault proxy; returns (control_plane, proxy, cluster)."""
    cp = ControlPlane(workdir, log=log).start()
    try:
        crt, key = cp.pki.issue('proxy', 'gpufleet-fault-proxy', server=True, client=False)
        proxy = FaultProxy(cp.apiserver_port, cp.ca_path, (str(crt), str(key))).start()
    except BaseException:
        cp.stop()
        raise
    cluster = Cluster(cp, proxy)
    # The collection's namespaces, as production creates them (docs/rbac/gpufleet-*-namespace.yml): the roles'
    # default snapshot store keeps the rollback snapshots in gpufleet-system (snapshot_store), the pause points'
    # approvals are in gpufleet-approvals. Namespaces outlive reset().
    try:
        cluster.apply([yaml.safe_load((RBAC_DIR / name).read_text())
                       for name in ('gpufleet-system-namespace.yml', 'gpufleet-approvals-namespace.yml')], settle=False)
    except BaseException:
        proxy.stop()
        cp.stop()
        raise
    return cp, proxy, cluster
