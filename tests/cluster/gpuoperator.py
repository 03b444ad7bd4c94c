"""NVIDIA's GPU Operator, built from its Go module (tests/cluster/gpu-operator), run against the test
control plane.

The operator runs as a process on this machine, not as a pod (KWOK runs no containers), inside a small
root (chroot) laid out as NVIDIA's image lays it out: its state manifests under /opt/gpu-operator
(the module's `assets/`, and `manifests/` beneath it), the node's /etc/os-release under /host-etc (the
operator pod mounts the host's /etc there), a kubeconfig with its credentials inline. Nothing
outside the control plane's work directory is touched. It reconciles the real `ClusterPolicy` CRD
(applied from the module's deployments/gpu-operator/crds in place of the control plane's schema-less
stand-in, which `stop()` puts back) into its operand DaemonSets; the real kube-controller-manager
runs them and KWOK plays their pods (Running and Ready, no containers). What does not run: no
container of any operand (no driver is loaded, the validator validates nothing, the toolkit
configures no runtime), no Helm (RKE2's helm-controller is not part of this control plane: a
`HelmChart` is rendered into the ClusterPolicy by `HelmChartStandIn` below), no NFD (GPU nodes carry
the labels NFD would give them: `feature.node.kubernetes.io/pci-10de.present=true`).

    with GpuOperator(cluster) as op:
        cluster.apply([fixtures.gpu_node('gpu-1'), fixtures.operator_cluster_policy()])
        op.wait_ready()

The operator's own version is the image of the `gpu-operator` Deployment (what `fleet_info` and the
node gate read): `deployment()` builds it, pinned to no node (KWOK runs its pod on the first node).
"""
from __future__ import annotations

import base64
import copy
import os
import pathlib
import shutil
import signal
import subprocess
import time
from typing import Any

import yaml

from . import build
from .background import Background
from .controlplane import _die_with_parent

NAMESPACE = 'gpu-operator'
STAND_IN_CRDS = pathlib.Path(__file__).resolve().parent / 'crds' / 'nvidia-clusterpolicy.yaml'


def _userns_chroot() -> list[str]:
    """The command that chroots without root: a user namespace in which this user is root (util-linux
    unshare, coreutils chroot; both exec in place, so the pid is the operator's)."""
    chroot = shutil.which('chroot') or '/usr/sbin/chroot'
    return [shutil.which('unshare') or 'unshare', '--user', '--map-root-user', '--', chroot]


def chroot_method() -> str | None:
    """How this process can run the operator in its own root: 'chroot' as root (unless
    GPUFLEET_OPERATOR_USERNS=1 asks for the other way, to test it), 'userns' where an unprivileged user
    namespace may chroot (_userns_chroot), None where neither works."""
    if os.geteuid() == 0 and os.environ.get('GPUFLEET_OPERATOR_USERNS') != '1':
        return 'chroot'
    try:
        ok = subprocess.run(_userns_chroot() + ['/', 'true'], env={'PATH': '/usr/bin:/bin'},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return 'userns' if ok else None


class GpuOperator:
    def __init__(self, cluster: Any, namespace: str = NAMESPACE, log=None) -> None:
        self.cluster = cluster
        self.cp = cluster.cp
        self.namespace = namespace
        self.log = log or (lambda msg: None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.root = self.cp.dir / 'gpu-operator-root'
        self.log_path = self.cp.dir / 'logs' / 'gpu-operator.log'

    def __enter__(self) -> 'GpuOperator':
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60) -> 'GpuOperator':
        bin_dir = build.ensure_operator(log=self.log)
        source = build.operator_source()
        self._apply_crds(sorted((source / 'deployments' / 'gpu-operator' / 'crds').glob('*.yaml')))
        self.cluster._ensure_namespace(self.namespace)
        self._lay_out_root(bin_dir, source)
        logf = open(self.log_path, 'ab')  # noqa: SIM115 - owned by the process
        root = str(self.root)

        def enter_root() -> None:  # in the child, before exec (as root)
            _die_with_parent()
            os.chroot(root)
            os.chdir('/')

        argv = ['/usr/bin/gpu-operator', '--kubeconfig=/kubeconfig',
                '--metrics-bind-address=127.0.0.1:0', '--health-probe-bind-address=127.0.0.1:0']
        how = chroot_method()
        if how is None:
            raise RuntimeError('the GPU Operator runs in a chroot of its own (its paths are fixed): run as root, or where '
                               'unprivileged user namespaces are allowed (unshare --user --map-root-user)')
        if how == 'userns':
            # stop() ends it; the parent-death signal set before does not survive the namespace's new credentials.
            argv = _userns_chroot() + [root] + argv
        self.proc = subprocess.Popen(
            argv, env={'OPERATOR_NAMESPACE': self.namespace, 'PATH': '/usr/bin'}, stdout=logf,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=enter_root if how == 'chroot' else _die_with_parent)
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError('gpu-operator exited with %s:\n%s' % (self.proc.returncode, self.log_tail()))
            if 'Starting workers' in self.log_path.read_text(errors='replace'):
                self.log('gpu-operator: running (%s)' % self.log_path)
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError('gpu-operator did not start its controllers within %.0f s:\n%s' % (timeout, self.log_tail()))

    def stop(self, timeout: float = 10) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None
        # Back to the control plane's stand-in CRDs (schema-less), which the other tests write freely.
        self._apply_crds([STAND_IN_CRDS])

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors='replace')[-size:]
        except OSError:
            return ''

    # ------------------------------------------------------------------ setup
    def _lay_out_root(self, bin_dir: pathlib.Path, source: pathlib.Path) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        for sub in ('usr/bin', 'opt', 'host-etc', 'tmp', 'etc'):
            (self.root / sub).mkdir(parents=True)
        shutil.copytree(source / 'assets', self.root / 'opt' / 'gpu-operator')
        shutil.copytree(source / 'manifests', self.root / 'opt' / 'gpu-operator' / 'manifests')
        for p in self.root.rglob('*'):  # the module cache is read-only
            p.chmod(p.stat().st_mode | 0o200)
        shutil.copy2(bin_dir / 'gpu-operator', self.root / 'usr' / 'bin' / 'gpu-operator')
        (self.root / 'host-etc' / 'os-release').write_text(
            'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nPRETTY_NAME="Ubuntu 24.04.3 LTS"\n')
        crt, key = self.cp.pki.issue('gpu-operator', 'system:serviceaccount:%s:gpu-operator' % self.namespace,
                                     ('system:masters',))
        config = {
            'apiVersion': 'v1', 'kind': 'Config',
            'clusters': [{'name': 'test', 'cluster': {
                'server': self.cp.url,
                'certificate-authority-data': base64.b64encode(pathlib.Path(self.cp.ca_path).read_bytes()).decode()}}],
            'users': [{'name': 'gpu-operator', 'user': {
                'client-certificate-data': base64.b64encode(pathlib.Path(crt).read_bytes()).decode(),
                'client-key-data': base64.b64encode(pathlib.Path(key).read_bytes()).decode()}}],
            'contexts': [{'name': 'test', 'context': {'cluster': 'test', 'user': 'gpu-operator'}}],
            'current-context': 'test',
        }
        kc = self.root / 'kubeconfig'
        kc.write_text(yaml.safe_dump(config))
        kc.chmod(0o600)

    def _apply_crds(self, paths: list[pathlib.Path]) -> None:
        api = self.cluster.api
        for path in paths:
            for doc in yaml.safe_load_all(path.read_text()):
                if not doc or doc.get('kind') != 'CustomResourceDefinition':
                    continue
                name = doc['metadata']['name']
                current = api.request('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/' + name,
                                      ok404=True)
                if current:
                    doc = copy.deepcopy(doc)
                    doc['metadata']['resourceVersion'] = current['metadata']['resourceVersion']
                    api.request('PUT', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/' + name, body=doc)
                else:
                    api.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', body=doc)

                def established(name: str = name) -> bool:
                    obj = api.request('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/' + name)
                    conds = {c['type']: c['status'] for c in (obj.get('status') or {}).get('conditions') or []}
                    return conds.get('Established') == 'True'

                self.cluster.wait_for(established, timeout=30, message='CRD %s established' % name)
                # A changed schema makes the API server re-initialize the resource's storage: until then a
                # list answers 429 ("storage is (re)initializing"), which the next test's reset would meet.
                version = next(v['name'] for v in doc['spec']['versions'] if v.get('storage'))
                path = '/apis/%s/%s/%s' % (doc['spec']['group'], version, doc['spec']['names']['plural'])
                self.cluster.wait_for(lambda path=path: self._lists(path), timeout=30,
                                      message='%s served again' % path)
        self.cluster._discover()

    def _lists(self, path: str) -> bool:
        from .client import ApiError
        try:
            self.cluster.api.request('GET', path, query={'limit': 1})
        except ApiError as exc:
            if exc.status in (404, 429, 503):
                return False
            raise
        return True

    # ------------------------------------------------------------------ waiting
    def wait_ready(self, timeout: float = 90, name: str = 'cluster-policy') -> dict:
        """Until the ClusterPolicy reports `ready` (every operand DaemonSet available)."""
        def ready() -> Any:
            cp = self.cluster.get('nvidia.com/v1', 'ClusterPolicy', name)
            return cp if cp and (cp.get('status') or {}).get('state') == 'ready' else None

        return self.cluster.wait_for(ready, timeout=timeout, interval=0.5,
                                     message='ClusterPolicy %s ready (operator log: %s)' % (name, self.log_path))

    def operand_pods(self, node: str | None = None) -> list[dict]:
        pods = [p for p in self.cluster.list('v1', 'Pod', namespace=self.namespace)
                if any(r.get('kind') == 'DaemonSet' for r in p['metadata'].get('ownerReferences') or [])]
        return [p for p in pods if node is None or p['spec'].get('nodeName') == node]


def deployment(version: str, namespace: str = NAMESPACE, repository: str = 'nvcr.io/nvidia') -> dict:
    """The operator's Deployment as the chart makes it (its pod is what reports the operator's version)."""
    labels = {'app': 'gpu-operator', 'app.kubernetes.io/component': 'gpu-operator'}
    return {'apiVersion': 'apps/v1', 'kind': 'Deployment',
            'metadata': {'name': 'gpu-operator', 'namespace': namespace, 'labels': dict(labels)},
            'spec': {'replicas': 1, 'selector': {'matchLabels': {'app': 'gpu-operator'}},
                     'template': {'metadata': {'labels': dict(labels)},
                                  'spec': {'containers': [{'name': 'gpu-operator',
                                                           'image': '%s/gpu-operator:%s' % (repository, version)}]}}}}


# The ClusterPolicy keys the chart's templates/clusterpolicy.yaml copies from the values (the rest of
# the values configure the operator's Deployment, NFD and the chart itself).
CLUSTER_POLICY_KEYS = ('operator', 'daemonsets', 'validator', 'mig', 'psp', 'cdi', 'sandboxWorkloads', 'driver',
                       'toolkit', 'devicePlugin', 'dcgm', 'dcgmExporter', 'gfd', 'migManager', 'nodeStatusExporter',
                       'gds', 'gdrcopy', 'vgpuManager', 'vgpuDeviceManager', 'vfioManager', 'sandboxDevicePlugin',
                       'kataManager', 'ccManager', 'hostPaths')


class HelmChartStandIn(Background):
    """RKE2's helm-controller for one `HelmChart` of the GPU Operator (helm.cattle.io/v1, schema-less
    CRD in crds/): when the HelmChart's `spec.version` or `spec.valuesContent` changes, it "upgrades the
    release" as the chart would render it: the ClusterPolicy's spec from the values' keys above (the
    validator's version defaulting to the chart version, as the chart's appVersion does) and the
    operator Deployment's image tag to the chart version (`operator.version` wins). A version in
    `missing_versions` fails as a chart the repository does not have: the HelmChart's status gets a
    Failed condition (what helm-controller's job reports) and nothing is rendered. The real
    helm-controller runs `helm upgrade` in a Job; KWOK runs no containers."""

    label = 'helm-controller stand-in'
    raise_errors = False
    join_timeout = 10.0

    def __init__(self, cluster: Any, name: str = 'gpu-operator', namespace: str = 'kube-system',
                 policy: str = 'cluster-policy', operator_namespace: str = NAMESPACE,
                 missing_versions: tuple[str, ...] = ()) -> None:
        super().__init__(0.2)
        self.cluster, self.name, self.namespace = cluster, name, namespace
        self.policy, self.operator_namespace = policy, operator_namespace
        self.missing = set(missing_versions)
        self.rendered: list[str] = []
        self._seen: tuple | None = None

    def step(self) -> None:
        try:
            self.sync()
        except Exception:  # noqa: BLE001 - a transient API error: the next pass retries
            pass

    def sync(self) -> None:
        chart = self.cluster.get('helm.cattle.io/v1', 'HelmChart', self.name, self.namespace)
        if not chart:
            return
        spec = chart.get('spec') or {}
        key = (spec.get('version'), spec.get('valuesContent'))
        if key == self._seen:
            return
        self._seen = key
        version = str(spec.get('version') or '')
        if version in self.missing:
            self._status(chart, 'Failed', 'True', 'Error: chart "gpu-operator" version "%s" not found in %s'
                         % (version, spec.get('repo') or 'the repository'))
            return
        values = yaml.safe_load(spec.get('valuesContent') or '') or {}
        policy = self.cluster.get('nvidia.com/v1', 'ClusterPolicy', self.policy)
        if policy is not None:
            new_spec = {k: copy.deepcopy(values[k]) for k in CLUSTER_POLICY_KEYS if k in values}
            new_spec.setdefault('validator', {}).setdefault('version', version)
            body = copy.deepcopy(policy)
            body['spec'] = new_spec
            self.cluster.api.request('PUT', '/apis/nvidia.com/v1/clusterpolicies/%s' % self.policy, body=body)
        dep = self.cluster.get('apps/v1', 'Deployment', 'gpu-operator', self.operator_namespace)
        if dep is not None:
            tag = (values.get('operator') or {}).get('version') or version
            c = dep['spec']['template']['spec']['containers'][0]
            c['image'] = c['image'].rsplit(':', 1)[0] + ':' + tag
            self.cluster.api.request('PUT', '/apis/apps/v1/namespaces/%s/deployments/gpu-operator'
                                     % self.operator_namespace, body=dep)
        self.rendered.append(version)
        self._status(chart, 'Failed', 'False', '')

    def _status(self, chart: dict, ctype: str, status: str, message: str) -> None:
        body = {'status': {'conditions': [{'type': ctype, 'status': status, 'reason': 'Error' if status == 'True'
                                           else 'Succeeded', 'message': message}]}}
        self.cluster.api.request('PATCH', '/apis/helm.cattle.io/v1/namespaces/%s/helmcharts/%s/status'
                                 % (self.namespace, self.name), body=body,
                                 content_type='application/merge-patch+json', ok404=True)
