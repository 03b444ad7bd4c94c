"""`ControlPlane`: a real Kubernetes control plane for tests, the molecule scenarios and the lab.

Processes, all on 127.0.0.1 and free ports, built from their Go modules by `cluster.build`:
etcd, kube-apiserver (HTTPS with its own CA, client-certificate, static-token and service-account
token authentication, Node,RBAC authorization, NodeRestriction admission as an RKE2 server adds it,
an audit log), kube-controller-manager (each controller under its own service account, as RKE2
runs it), kube-scheduler, and KWOK as every node's kubelet (`kwok/*.yaml`). The CRDs the
collection reads (KubeVirt, the system-upgrade-controller's Plan, NVIDIA's ClusterPolicy) are
applied from `crds/`.

    with ControlPlane(workdir) as cp:
        cp.admin_kubeconfig   # system:masters client certificate, straight to the API server
        cp.token_kubeconfig('gpufleet-admin')   # a static-token user (for the fault proxy)

Start-up and tear-down are bounded; `stop()` leaves no process behind (each component runs in its
own process group, SIGTERM then SIGKILL).
"""
from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import yaml

from . import build
from .pki import Pki

HERE = pathlib.Path(__file__).resolve().parent
KUBERNETES_VERSION = build.KUBERNETES_VERSION
SERVICE_CIDR = '10.43.0.0/16'
TESTED_GROUP = 'gpufleet:tested'
# Where the API server finds a node's kubelet (KWOK's HTTPS server, which serves pod logs): every
# node has this address (KWOK's node stage and Cluster.apply add it) and the KWOK port as its
# daemonEndpoints.kubeletEndpoint.Port.
KUBELET_ADDRESS_TYPE = 'ExternalIP'
KUBELET_ADDRESS = '127.0.0.1'

# Static-token users: name -> groups. `gpufleet-admin` is what tests hand to modules by default;
# the named roles of docs/rbac are exercised through service accounts (see Cluster.sa_kubeconfig).
TOKEN_USERS = {
    'gpufleet-admin': ('system:masters', TESTED_GROUP),
    'gpufleet-nobody': (TESTED_GROUP,),
}

AUDIT_POLICY = {
    'apiVersion': 'audit.k8s.io/v1', 'kind': 'Policy', 'omitStages': ['RequestReceived'],
    'rules': [
        {'level': 'Request', 'userGroups': [TESTED_GROUP, 'system:serviceaccounts:gpufleet-system']},
        {'level': 'None'},
    ],
}


# Starts on new ports after a component lost its port to another process (ControlPlane.start).
PORT_ATTEMPTS = 3


class ControlPlaneError(RuntimeError):
    pass


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies (Linux), so a killed
    test run or lab leaves no control-plane process behind."""
    try:
        import ctypes
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


class ControlPlane:
    def __init__(self, workdir: str | os.PathLike[str], log=None, start_timeout: float = 120.0) -> None:
        self.dir = pathlib.Path(workdir)
        self.log = log or (lambda msg: None)
        self.start_timeout = start_timeout
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tokens: dict[str, str] = {}
        self.bin: pathlib.Path | None = None
        self.etcd_port = self.apiserver_port = self.kwok_port = 0

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> 'ControlPlane':
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return 'https://127.0.0.1:%d' % self.apiserver_port

    @property
    def ca_path(self) -> str:
        return str(self.pki.ca_path)

    def start(self) -> 'ControlPlane':
        t0 = time.monotonic()
        self.bin = build.ensure(log=self.log)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / 'logs').mkdir(exist_ok=True)
        self.pki = Pki(self.dir / 'pki')
        fresh = not (self.dir / 'etcd').exists()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_etcd()
                self._start_apiserver()
                self._wait_ready()
                self._start_controllers()
                self._apply_crds()
                self._wait_controllers()
                break
            except ControlPlaneError as exc:
                self.stop()
                # free_port() only finds a port free: another process can bind it before the component does
                # (seen under load). Start again on new ports; anything else is the component's own failure.
                if attempt == PORT_ATTEMPTS or 'address already in use' not in str(exc):
                    raise
                self.log('control plane: a port was taken before its component bound it; again on new ports '
                         '(attempt %d of %d)' % (attempt + 1, PORT_ATTEMPTS))
                if fresh:
                    shutil.rmtree(self.dir / 'etcd', ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        self.log('control plane: up at %s in %.1f s (Kubernetes %s)' % (
            self.url, time.monotonic() - t0, KUBERNETES_VERSION))
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every component (reverse order): SIGTERM to its process group, SIGKILL at the deadline."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(5)
        self.procs.clear()

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        assert self.bin is not None
        logf = open(self.dir / 'logs' / ('%s.log' % name), 'ab')  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen([str(self.bin / args[0]), *args[1:]], stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.dir, start_new_session=True,
                                preexec_fn=_die_with_parent)
        logf.close()
        self.procs[name] = proc
        return proc

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.dir / 'logs' / ('%s.log' % name)).read_text(errors='replace')[-3000:]
                raise ControlPlaneError('%s exited with %s:\n%s' % (name, proc.returncode, tail))

    # ------------------------------------------------------------------ components
    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        self._spawn('etcd', [
            'etcd', '--name', 'test', '--data-dir', str(self.dir / 'etcd'),
            '--listen-client-urls', 'http://127.0.0.1:%d' % self.etcd_port,
            '--advertise-client-urls', 'http://127.0.0.1:%d' % self.etcd_port,
            '--listen-peer-urls', 'http://127.0.0.1:%d' % peer,
            '--initial-advertise-peer-urls', 'http://127.0.0.1:%d' % peer,
            '--initial-cluster', 'test=http://127.0.0.1:%d' % peer,
            '--listen-metrics-urls', 'http://127.0.0.1:%d' % free_port(),
            '--unsafe-no-fsync', '--quota-backend-bytes', str(8 * 1024 ** 3), '--log-level', 'warn',
        ])

    def _start_apiserver(self) -> None:
        self.apiserver_port = free_port()
        crt, key = self.pki.issue('apiserver', 'kube-apiserver', server=True, client=False)
        kcrt, kkey = self.pki.issue('apiserver-kubelet-client', 'kube-apiserver-kubelet-client',
                                    ('system:masters',))
        sa_key, sa_pub = self.pki.service_account_keys()
        self.tokens = {user: secrets.token_hex(16) for user in TOKEN_USERS}
        lines = ['%s,%s,%s,"%s"' % (tok, user, user, ','.join(TOKEN_USERS[user])) for user, tok in self.tokens.items()]
        tokens = self.dir / 'tokens.csv'
        tokens.write_text('\n'.join(lines) + '\n')
        tokens.chmod(0o600)
        policy = self.dir / 'audit-policy.yaml'
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log = self.dir / 'audit.log'
        self._spawn('kube-apiserver', [
            'kube-apiserver',
            '--etcd-servers', 'http://127.0.0.1:%d' % self.etcd_port,
            '--bind-address', '127.0.0.1', '--advertise-address', '127.0.0.1',
            '--secure-port', str(self.apiserver_port),
            '--tls-cert-file', str(crt), '--tls-private-key-file', str(key),
            '--client-ca-file', str(self.pki.ca_path), '--token-auth-file', str(tokens),
            '--kubelet-client-certificate', str(kcrt), '--kubelet-client-key', str(kkey),
            # The API server reaches a node's kubelet (KWOK's server: pod logs) at the node's
            # ExternalIP, which is always 127.0.0.1 here (see KUBELET_ADDRESS); the fixtures'
            # InternalIPs and host names are never contacted. KWOK's serving certificate is verified.
            '--kubelet-preferred-address-types', KUBELET_ADDRESS_TYPE,
            '--kubelet-certificate-authority', str(self.pki.ca_path),
            '--authorization-mode', 'Node,RBAC', '--enable-admission-plugins', 'NodeRestriction',
            '--anonymous-auth=false',
            '--service-account-issuer', 'https://kubernetes.default.svc.cluster.local',
            '--service-account-key-file', str(sa_pub), '--service-account-signing-key-file', str(sa_key),
            '--api-audiences', 'https://kubernetes.default.svc.cluster.local',
            '--service-cluster-ip-range', SERVICE_CIDR, '--allow-privileged=true',
            '--audit-policy-file', str(policy), '--audit-log-path', str(self.audit_log),
            '--audit-log-format', 'json', '--audit-log-mode', 'blocking', '--audit-log-maxsize', '0',
            # GPUFLEET_CP_PROFILING=1: /debug/pprof for a profile of the API server (docs/development.md, issue 36).
            '--profiling=%s' % ('true' if os.environ.get('GPUFLEET_CP_PROFILING') else 'false'),
            '--shutdown-delay-duration', '0s', '--endpoint-reconciler-type', 'none',
            '--max-requests-inflight', '800', '--max-mutating-requests-inflight', '400',
        ])

    def _component_kubeconfig(self, name: str, user: str, groups: tuple[str, ...] = ()) -> pathlib.Path:
        crt, key = self.pki.issue(name, user, groups)
        user_entry = {'client-certificate': str(crt), 'client-key': str(key)}
        return self.write_kubeconfig(self.dir / ('%s.kubeconfig' % name), user_entry)

    def write_kubeconfig(self, path: pathlib.Path, user: dict[str, Any], server: str | None = None,
                         namespace: str = 'default') -> pathlib.Path:
        config = {
            'apiVersion': 'v1', 'kind': 'Config', 'preferences': {},
            'clusters': [{'name': 'test', 'cluster': {'server': server or self.url,
                                                      'certificate-authority': str(self.pki.ca_path)}}],
            'users': [{'name': 'test', 'user': user}],
            'contexts': [{'name': 'test', 'context': {'cluster': 'test', 'user': 'test', 'namespace': namespace}}],
            'current-context': 'test',
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def _start_controllers(self) -> None:
        self.admin_kubeconfig = str(self._component_kubeconfig('admin', 'gpufleet-test-setup', ('system:masters',)))
        kcm = self._component_kubeconfig('kube-controller-manager', 'system:kube-controller-manager')
        sched = self._component_kubeconfig('kube-scheduler', 'system:kube-scheduler')
        # KWOK is every node's kubelet at once: one identity cannot be system:node:<name> for all of
        # them, so it runs as an administrator (the Node authorizer then has nothing to check).
        kwok = self._component_kubeconfig('kwok', 'kwok', ('system:masters',))
        sa_key = self.pki.dir / 'sa.key'
        self._spawn('kube-controller-manager', [
            'kube-controller-manager', '--kubeconfig', str(kcm),
            '--authentication-kubeconfig', str(kcm), '--authorization-kubeconfig', str(kcm),
            '--bind-address', '127.0.0.1', '--secure-port', str(free_port()),
            '--leader-elect=false', '--use-service-account-credentials=true',
            '--service-account-private-key-file', str(sa_key), '--root-ca-file', str(self.pki.ca_path),
            '--cluster-signing-cert-file', str(self.pki.ca_path),
            '--cluster-signing-key-file', str(self.pki.dir / 'ca.key'),
            '--service-cluster-ip-range', SERVICE_CIDR, '--controllers', '*,bootstrapsigner,tokencleaner',
            '--kube-api-qps', '200', '--kube-api-burst', '400', '--concurrent-gc-syncs', '10',
            # Node lifecycle as a real cluster runs it, with eviction of NotReady nodes' pods slowed so
            # it does not fight a test: a node a test takes NotReady keeps its pods for 10 minutes.
            # The controller judges a pod by the node health it recorded at its last pass (every
            # --node-monitor-period): a pod created or updated before its first pass after the node came
            # back is marked not Ready, which a real kubelet would correct and KWOK does not; 1 s (not 5 s)
            # keeps that window short (tests/tools/lab_node.py boot waits it out).
            '--node-monitor-period', '1s',
            '--node-monitor-grace-period', '60s', '--node-eviction-rate', '0.01',
            '--secondary-node-eviction-rate', '0.001', '--unhealthy-zone-threshold', '1',
            '--profiling=false',
        ])
        self._spawn('kube-scheduler', [
            'kube-scheduler', '--kubeconfig', str(sched),
            '--authentication-kubeconfig', str(sched), '--authorization-kubeconfig', str(sched),
            '--bind-address', '127.0.0.1', '--secure-port', str(free_port()), '--leader-elect=false',
            '--profiling=false',
        ])
        # KWOK's server is every node's kubelet endpoint (pod logs from its Logs objects), on
        # 127.0.0.1 with a serving certificate of our CA; --node-port puts the port into the nodes'
        # daemonEndpoints.
        self.kwok_port = free_port()
        kwok_crt, kwok_key = self.pki.issue('kwok-serving', 'kwok-kubelet', server=True, client=False)
        self._spawn('kwok', [
            'kwok', '--kubeconfig', str(kwok), '--config', str(self._kwok_config()),
            '--manage-all-nodes=true', '--cidr', '10.244.0.1/16', '--node-ip', KUBELET_ADDRESS,
            '--server-address', '%s:%d' % (KUBELET_ADDRESS, self.kwok_port), '--node-port', str(self.kwok_port),
            '--tls-cert-file', str(kwok_crt), '--tls-private-key-file', str(kwok_key),
        ])

    def _kwok_config(self) -> pathlib.Path:
        """KWOK's configuration and stages (tests/cluster/kwok/, one document a file) as the one
        multi-document file `kwok --config` reads."""
        path = self.dir / 'kwok.yaml'
        docs = [p.read_text() for p in sorted((HERE / 'kwok').glob('*.yaml'))]
        path.write_text('---\n'.join(d if d.endswith('\n') else d + '\n' for d in docs))
        return path

    # ------------------------------------------------------------------ readiness
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_path))
        crt, key = self.pki.dir / 'admin.crt', self.pki.dir / 'admin.key'
        if crt.exists():
            ctx.load_cert_chain(str(crt), str(key))
        return ctx

    def _get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path)
        if token:
            req.add_header('Authorization', 'Bearer ' + token)
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=5) as resp:  # noqa: S310 - loopback
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _until(self, what: str, fn, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last: Any = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                value = fn()
            except (OSError, ValueError) as exc:
                value, last = None, exc
            if value:
                return value
            time.sleep(0.2)
        raise ControlPlaneError('control plane: timed out waiting for %s (last error: %s)' % (what, last))

    def _wait_ready(self) -> None:
        token = self.tokens['gpufleet-admin']
        self._until('kube-apiserver /readyz', lambda: self._get('/readyz', token)[0] == 200)

    def _wait_controllers(self) -> None:
        token = self.tokens['gpufleet-admin']

        def published() -> bool:
            # kube-root-ca.crt appears once the controller manager runs; the default service account
            # once its token controller does.
            code = self._get('/api/v1/namespaces/default/configmaps/kube-root-ca.crt', token)[0]
            code2 = self._get('/api/v1/namespaces/default/serviceaccounts/default', token)[0]
            return code == 200 and code2 == 200

        self._until('kube-controller-manager (kube-root-ca.crt, default service account)', published)

    def _apply_crds(self) -> None:
        from .client import ApiClient
        api = ApiClient(self.url, self.ca_path, cert=(str(self.pki.dir / 'admin.crt'), str(self.pki.dir / 'admin.key')))
        names = []
        for path in sorted((HERE / 'crds').glob('*.yaml')):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    api.request('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', body=doc)
                    names.append(doc['metadata']['name'])

        def established() -> bool:
            for name in names:
                crd = api.request('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/' + name)
                conds = {c['type']: c['status'] for c in (crd.get('status') or {}).get('conditions') or []}
                if conds.get('Established') != 'True':
                    return False
            return True

        self._until('CRDs established', established)

    def describe(self) -> dict[str, Any]:
        return {'url': self.url, 'kubernetes': KUBERNETES_VERSION, 'admin_kubeconfig': self.admin_kubeconfig,
                'audit_log': str(self.audit_log), 'pids': {k: p.pid for k, p in self.procs.items()}}


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
