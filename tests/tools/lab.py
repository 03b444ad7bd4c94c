"""`make lab`: the whole procedure on a 40-node GPU pool of a real control plane, with an injected fault.

    python tests/tools/lab.py [--dir .lab] [--fault auto|none|<node>] [--fault-kind xid|temperature|kernel]
                              [--nodes 40] [--stuck <node>] [--metrics auto|off] [--change seed|driver]
                              [--misreport <node>:<nodeInfo field>=<value>]

1. environment: a real Kubernetes control plane (tests/cluster: etcd, kube-apiserver, the controller
   manager, the scheduler, KWOK as the kubelets) started under --dir/cluster and stopped at the end,
   with 40 GPU nodes of two models (two PCI identities), the GPU Operator's workloads (the device
   plugin's and DCGM exporter's DaemonSets), a training ReplicaSet per model with a pod on each node,
   PodDisruptionBudgets; the playbooks run as the ServiceAccount gpufleet-system/gpufleet-upgrade
   bound to the collection's ClusterRoles (docs/rbac), not as an administrator;
   per-node install roots at the source tuple (real dpkg/apt: kernel 6.8.0-134-generic with the
   prebuilt driver set at 580.126.20 and its signed module package, /boot, a real GRUB environment
   block), a stand-in NVML state per node (tests/tools/labenv.py explains how it follows the module
   that the booted kernel loads), a kernel log per node; the System Upgrade Controller stand-in
   (tests/cluster/suc.py) for the lab's lifetime, with an RKE2 server already at the target;
   when Prometheus is installed (the lab installs the Debian package when run as root, otherwise
   says how and runs without the metric gate), a real Prometheus on loopback scraping the lab's
   DCGM exporter stand-in (tests/tools/lab_dcgm.py) every second, and the metric gate
   (gpufleet.upgrade.metric_gate, DCGM presets over a short window) after the GPU and node gates;
2. the seed's example change (`--change seed`, the default): kernel 6.8.0-134-generic ->
   6.8.0-135-generic, RKE2 v1.35.3+rke2r3 -> v1.36.1+rke2r1 (through the SUC), driver
   580.126.20 -> 580.130.00; `--change driver` is the earlier driver-only change (a reload);
   plan.yml (hosts' NVML facts + the API) → canary.yml (2 canaries per model, rollback exercised)
   → the draft qualification record → approval (the lab approves as "lab-approver"; in production a
   second operator does it, e.g. in an AWX approval node) → upgrade_check.yml PASS (collected mode)
   → rollout.yml in the plan's batches of at most 4;
3. the fault: on one node of a later batch the lab's reboot path logs a new Xid 79 after the new
   driver came up; the GPU gate fails, expansion stops, the node stays cordoned and its rollback
   restores 580.126.20 (`--fault-kind temperature`: one GPU of the node runs hot under the new
   driver, which only the metric gate's window sees; the same stop and rollback follow;
   `--fault-kind kernel`: the target kernel does not come up on the node, its one-shot trial boot
   falls back to the saved kernel, the node must be detected on the old kernel, stay cordoned and
   be rolled back to the previous pair);
4. a summary table (each node's measured kernel and driver before and after) and the path of the
   HTML report. Exit 0 when the scenario behaved as designed.

Everything lives under --dir (default .lab/); ansible output is the progress display.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / '.venv' / 'collections'), str(REPO / 'tests')]

import ansible_runner  # noqa: E402
import yaml  # noqa: E402

from cluster import start_cluster  # noqa: E402
from cluster.client import Cluster  # noqa: E402
from cluster.kubelet import PodStatusSync  # noqa: E402
from cluster.logs import PodLogWriter  # noqa: E402
from cluster.suc import SucStandIn  # noqa: E402
from tools import cpu_account, lab_dcgm, labenv, nvml_stub, records, suite_timings, zipimport_cache  # noqa: E402
from tools.debian import ensure_binary  # noqa: E402
from tools.prometheus import PrometheusServer  # noqa: E402

APPROVER = 'lab-approver'
# What the lab's static inventory sets that a platform team's does not (Lab(installed=True), fleet production): the
# credentials come only as K8S_AUTH_*, each node's RKE2 role from its Node, the current tuple from the nodes.
LAB_ONLY_VARS = ('gpufleet_kubeconfig', 'gpufleet_rke2_role', 'gpufleet_current')
# Simulated maintenance time of one node on a real fleet (seconds): drain, install, reboot/reload
# and the gates' observation. The lab does not sleep them; bench/lab_overhead.py compares the
# controller's own time against them.
SIMULATED = {'drain': 600, 'install': 300, 'activate': 300, 'gates': 600}
# The lab's metric gate: the DCGM presets over a short window (a real fleet observes 15 min or more).
METRIC_GATE = {'presets': ['xid', 'ecc', 'row_remap', 'temperature'], 'window': '10s', 'step': '1s',
               'min_samples': 5, 'temperature_max': 85}
FAULT_KINDS = {'xid': 'Xid 79', 'temperature': 'GPU %d at %d C under load' % (lab_dcgm.HOT_GPU, lab_dcgm.HOT_C),
               'kernel': 'kernel %s does not come up' % labenv.TARGET_KERNEL,
               'operand': 'its new DCGM exporter (GPU Operator %s) does not start' % labenv.TARGET_GPU_OPERATOR}
# The System Upgrade Controller stand-in: a node's RKE2 Job completes after SUC_DELAY; it polls the
# API every SUC_INTERVAL (a few list requests each time: kept low on a shared 2-core machine).
SUC_DELAY, SUC_INTERVAL = 0.2, 0.5
SERVER = 'rke2-server-1'     # the RKE2 control plane node, already at the target (servers first)


def log(msg: str) -> None:
    print('lab: ' + msg, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, lab: pathlib.Path, nodes: int, fault: str, stuck: list[str], quiet: bool,
                 lab_vars: dict[str, Any] | None = None, fault_kind: str = 'xid', metrics: str = 'auto',
                 account_node_cpu: bool = False, change: str = 'seed', suc: bool = True,
                 misreport: dict[str, dict[str, str]] | None = None, gpu_operator: bool = False,
                 pause_before: list[int] | None = None, workload_suite: bool = False,
                 install_method: str = 'apt', driver_pools: bool = False, fleet: str = 'lab',
                 installed: bool = False) -> None:
        """`change`: labenv.CHANGES key (the target); `suc`: run the System Upgrade Controller
        stand-in for the lab's lifetime (a test that brings its own passes False); `misreport`:
        {node: {status.nodeInfo field: value}} the node's kubelet reports after each boot instead
        of the truth (a test of the measured tuple); `gpu_operator`: NVIDIA's real GPU Operator
        (tests/cluster/gpuoperator.py, as root) runs the operands from an RKE2 HelmChart, the target moves
        it to labenv.TARGET_GPU_OPERATOR and the playbooks run with gpufleet_gpu_operator_managed;
        `install_method` operator (with gpu_operator): the operator's driver container is the driver (the lab's
        hook plays it loading its module: tests/tools/lab_node.py operator); `driver_pools` (with it): the driver
        rendered per node pool from an NVIDIADriver (labenv.DRIVER_POOL) instead of the ClusterPolicy.
        `fleet` (labenv.FLEETS): `lab`, every node alike, the playbooks run from this checkout with a static inventory;
        `production`, the fleet shaped like a real one (drift, GPU nodes that are RKE2 servers; its node count and the
        change `production`) and run as a platform team runs it (issue 39): the collection built and installed
        read-only, its playbooks started by FQCN from the lab's directory with relative paths, the hosts from the
        collection's dynamic inventory (gpu_nodes, named by InternalIP), Kubernetes credentials only as K8S_AUTH_*,
        no evidence repository. `installed` (implied by `production`): run as installed, with the lab's static
        inventory (its hosts' names, credentials only as K8S_AUTH_*)."""
        self.fleet = fleet
        self.installed_mode = installed or fleet == 'production'
        self.shape = labenv.FLEETS[fleet]
        if fleet == 'production':
            nodes, change = self.shape['nodes'], 'production'
        self.installed: pathlib.Path | None = None   # the installed collection (fleet production)
        self.dir = lab
        self.install_method = install_method
        self.driver_pools = driver_pools
        self.change = change
        self.target = labenv.CHANGES[change]
        self.gpu_operator = gpu_operator
        self.operator: Any = None
        self.helm: Any = None
        if gpu_operator:
            self.target = dict(self.target, gpu_operator=labenv.TARGET_GPU_OPERATOR)
        self.suc_enabled = suc
        self.suc: SucStandIn | None = None
        self.misreport = misreport or {}
        self.before: dict[str, dict[str, Any]] = {}
        # bench/lab_overhead.py: log the CPU of node-side modules and of the lab's hook apart.
        self.node_cpu_log = (lab / 'node-cpu.log').resolve() if account_node_cpu else None
        self.names = labenv.node_names(nodes)
        self.fault = fault
        self.fault_kind = fault_kind
        self.metrics = metrics
        self.dcgm: lab_dcgm.DcgmStandIn | None = None
        self.prom: PrometheusServer | None = None
        self.metrics_note = ''
        self._prom_waited = False
        self.stuck = stuck
        self.quiet = quiet
        self.lab_vars = lab_vars or {}
        # Pause points of the plan (gpufleet_pause_before); approve_pauses() gives their approvals.
        self.pause_before = list(pause_before or [])
        # The shipped workload suite on the canaries (their Jobs scheduled for real, KWOK runs them, the pod
        # log writer gives each the output a healthy GPU prints: WORKLOAD_OUTPUTS).
        self.workload_suite = workload_suite
        self.log_writer: Any = None
        self.status_sync: Any = None
        self.cluster: Cluster | None = None
        self._cp: Any = None
        self._proxy: Any = None
        self.timings: list[dict[str, Any]] = []
        self.runs: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ environment
    def prepare(self) -> None:
        with suite_timings.Phase('fleet set-up', nodes=len(self.names)):
            self._prepare()

    def _prepare(self) -> None:
        for sub in ('nodes', 'snapshots', 'evidence', 'runner', 'qualification', 'prometheus'):
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        for f in ('plan.json', 'report.html', 'lab.json'):
            (self.dir / f).unlink(missing_ok=True)
        (self.dir / 'snapshots').mkdir(parents=True)
        (self.dir / 'evidence').mkdir()
        (self.dir / 'qualification').mkdir()
        self.launch_prometheus()   # starts up (about 5 s) while the install roots are built
        t0 = time.monotonic()
        self.lib_dir = nvml_stub.build()
        labenv.make_roots(self.dir, self.names, shape=self.shape)
        labenv.write_node_files(self.dir, self.names, shape=self.shape)
        log('%d install roots (kernel %s, driver %s from %s, real dpkg, GRUB environment block) and NVML states '
            'ready in %.1fs under %s' % (len(self.names), labenv.KERNEL, labenv.SOURCE_DRIVER, labenv.DRIVER_PRESET,
                                         time.monotonic() - t0, self.dir))
        self.start_cluster()
        log('Kubernetes control plane %s (real: etcd, kube-apiserver, controller manager, scheduler, KWOK '
            'kubelets): %d GPU nodes (%s), device plugin and DCGM exporter DaemonSets, training ReplicaSets, PDBs; '
            'the playbooks run as the ServiceAccount %s/%s'
            % (self.cluster.cp.url, len(self.names), ' + '.join('%s %s' % (m['product'], m['pci']) for m in labenv.MODELS),
               *labenv.OPERATOR_SA))
        self.write_conf()
        if self.workload_suite:
            cases = write_workload_suite(self.dir / 'workloads')
            self.log_writer = PodLogWriter(self.cluster, interval=0.25).__enter__()
            log('workload suite: the shipped cases %s run on the canaries (3 times each), and device-query once on '
                'every node upgraded so far at the end of each observation window; their Jobs are scheduled '
                'for real and KWOK runs them; each pod\'s log is what the case prints on a healthy GPU (the lab\'s '
                'stand-in for the CUDA binaries, WORKLOAD_OUTPUTS): the real cases need GPUs' % ', '.join(cases))
        if self.installed_mode:
            self.install_collection()
        if self.fleet == 'production':
            self.inventory = self.dynamic_inventory()
        else:
            self.inventory = labenv.inventory(self.dir, self.names, self.lib_dir, self.role_vars())
            if self.installed_mode:
                for key in LAB_ONLY_VARS:
                    self.inventory['all']['vars'].pop(key, None)
        self.before = {r['node']: r for r in self.node_view()}
        moved = [(k, v) for k, v in self.target.items() if labenv.CURRENT[k] != v]
        log('the change: %s' % ', '.join('%s %s -> %s' % (k, labenv.CURRENT[k], v) for k, v in moved))
        if self.node_cpu_log:
            self.account_node_cpu()

    def start_cluster(self) -> None:
        """The lab's own control plane under <lab>/cluster (bounded start; stop() stops it), its pool and
        the operator's identity."""
        t0 = time.monotonic()
        work = self.dir / 'cluster'
        shutil.rmtree(work, ignore_errors=True)
        self._cp, self._proxy, self.cluster = start_cluster(work, log=log)
        if self.gpu_operator:
            from cluster.gpuoperator import GpuOperator, HelmChartStandIn
            self.operator = GpuOperator(self.cluster, log=log).start()
            self.helm = HelmChartStandIn(self.cluster).__enter__()
            log('NVIDIA GPU Operator (built from its Go module) running; RKE2 helm-controller stand-in for its HelmChart')
        labenv.apply_pool(self.cluster, self.names, operator=self.operator,
                          operator_driver=self.install_method == 'operator', driver_pools=self.driver_pools,
                          shape=self.shape)
        self.kubeconfig = labenv.operator_kubeconfig(self.cluster, self.dir / 'kubeconfig', gpu_operator=self.gpu_operator)
        # KWOK does not play the kubelet's pod status sync: a pod the node lifecycle controller marks not Ready
        # as a rebooted node comes back would stay so for ever; a real kubelet sets it Ready again.
        self.status_sync = PodStatusSync(self.cluster).__enter__()
        log('control plane up with the pool in %.1fs' % (time.monotonic() - t0))
        if self.suc_enabled:
            # The RKE2 server runs the target already (servers first); the stand-in plays SUC's
            # controller on the real API: each agent Plan's Job is placed by the scheduler on the
            # (cordoned) node, KWOK completes it, the node's kubelet then reports the Plan's version.
            self.cluster.apply([labenv.control_plane_node(SERVER, self.target['rke2'])], settle=False)
            # The controller's own Deployment (what preflight's suc_info finds ready: its pod placed by the scheduler
            # on a control-plane node, run by KWOK); the stand-in below does its work.
            self.cluster.apply(labenv.suc_controller_objects(), settle=False)
            self.suc = SucStandIn(self.cluster, delay=SUC_DELAY, interval=SUC_INTERVAL).__enter__()
            log('System Upgrade Controller stand-in running (tests/cluster/suc.py; Plans in system-upgrade); '
                'RKE2 server %s at %s' % (SERVER, self.target['rke2']))

    def install_collection(self) -> None:
        """fleet production: the collection as a platform team gets it, `ansible-galaxy collection build` of this
        checkout and `ansible-galaxy collection install` of the tarball into <lab>/collections, then made read-only
        (every directory and file without write permission; root may still write, so the lab also compares the tree
        after the run: `installed_changes`)."""
        base = self.dir / 'collections'
        shutil.rmtree(base, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(('ANSIBLE_', 'K8S_AUTH_'))}
        env['ANSIBLE_COLLECTIONS_PATH'] = str(base)
        galaxy = str(pathlib.Path(sys.executable).parent / 'ansible-galaxy')
        subprocess.run([galaxy, 'collection', 'build', '--output-path', str(self.dir / 'dist'), '--force', str(REPO)],
                       check=True, capture_output=True, text=True, timeout=300, env=env)
        tarball = next((self.dir / 'dist').glob('gpufleet-upgrade-*.tar.gz'))
        subprocess.run([galaxy, 'collection', 'install', '--offline', '--force', '-p', str(base), str(tarball)],
                       check=True, capture_output=True, text=True, timeout=300, env=env)
        root = base / 'ansible_collections' / 'gpufleet' / 'upgrade'
        for path in [root, *root.rglob('*')]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~0o222)
        self.installed = base
        self._installed_tree = self.installed_tree()
        log('collection: %s built and installed read-only into %s; the playbooks run by FQCN from %s'
            % (tarball.name, base, self.dir))

    def installed_tree(self) -> dict[str, tuple[int, int]]:
        root = self.installed / 'ansible_collections' / 'gpufleet' / 'upgrade'
        return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
                for p in sorted(root.rglob('*')) if not p.is_symlink()}

    def installed_changes(self) -> list[str]:
        """What changed inside the installed collection since it was installed (fleet production; empty: nothing)."""
        if self.installed is None:
            return []
        now = self.installed_tree()
        return sorted(k for k in set(now) | set(self._installed_tree) if now.get(k) != self._installed_tree.get(k))

    def k8s_auth_env(self) -> dict[str, str]:
        """fleet production: the playbooks' Kubernetes credentials as an AWX credential or a CI job gives them, only
        K8S_AUTH_* (host, token, CA) from the rollout identity's kubeconfig; no kubeconfig reaches the playbooks."""
        conf = yaml.safe_load(pathlib.Path(self.kubeconfig).read_text())
        cluster = conf['clusters'][0]['cluster']
        user = conf['users'][0]['user']
        ca = cluster.get('certificate-authority')
        if not ca:
            ca_path = self.dir / 'k8s-ca.crt'
            ca_path.write_bytes(base64.b64decode(cluster['certificate-authority-data']))
            ca = str(ca_path)
        token = user.get('token') or pathlib.Path(user['tokenFile']).read_text().strip()
        return {'K8S_AUTH_HOST': cluster['server'], 'K8S_AUTH_API_KEY': token, 'K8S_AUTH_SSL_CA_CERT': ca}

    def dynamic_inventory(self) -> str:
        """fleet production: an inventory directory whose hosts come from the collection's gpu_nodes plugin (named by
        their InternalIP, so no host is named as its Node), the lab's per-node paths composed from each host's
        gpufleet_node_name, and group_vars/all.yml with what every host shares."""
        inv = self.dir / 'inventory'
        shutil.rmtree(inv, ignore_errors=True)
        (inv / 'group_vars').mkdir(parents=True)
        nodes = str((self.dir / 'nodes').resolve())

        def at(suffix: str) -> str:
            return "%s ~ '/' ~ gpufleet_node_name ~ %s" % (json.dumps(nodes), json.dumps(suffix))
        env = nvml_stub.env(self.lib_dir, 'STATE')
        node_env = '{%s}' % ', '.join('%s: %s' % (json.dumps(k), at('/nvml.state') if v == 'STATE' else json.dumps(v))
                                      for k, v in env.items())
        # No node_selector: the default pool (GPU Nodes by their labels or their GPU capacity, with or without GFD).
        config = {'plugin': 'gpufleet.upgrade.gpu_nodes',
                  'hostname': ['InternalIP'], 'ansible_host': ['InternalIP'], 'strict': True,
                  'compose': {'gpufleet_installroot': at('/root'), 'gpufleet_proc_path': at('/proc'),
                              'gpufleet_kernel_log': at('/kern.log'), 'gpufleet_node_environment': node_env},
                  'keyed_groups': [{'key': "gpufleet_node.labels['gpufleet.io/model']", 'prefix': 'model'}]}
        (inv / 'lab.gpu_nodes.yml').write_text(yaml.safe_dump(config, sort_keys=False))
        all_vars = labenv.inventory(self.dir, self.names, self.lib_dir, self.role_vars())['all']['vars']
        for key in LAB_ONLY_VARS:
            all_vars.pop(key, None)
        (inv / 'group_vars' / 'all.yml').write_text(yaml.safe_dump(all_vars, sort_keys=False))
        return str(inv)

    def node_cpu(self) -> float:
        """CPU seconds logged by node-side modules and the lab hook so far (0 without accounting)."""
        return _node_cpu_total(self.node_cpu_log)

    def account_node_cpu(self) -> None:
        """Node hosts' interpreter and the lab hook go through tests/tools/cpu_account.py."""
        account = [sys.executable, str(REPO / 'tests' / 'tools' / 'cpu_account.py'), str(self.node_cpu_log)]
        wrapper = self.dir.resolve() / 'node-python'
        wrapper.write_text('#!/bin/sh\nexec %s "$@"\n' % ' '.join(shlex.quote(a) for a in account + [sys.executable]))
        wrapper.chmod(0o755)
        all_vars = self.inventory['all']['vars']
        all_vars['ansible_python_interpreter'] = str(wrapper)      # localhost keeps its own interpreter
        all_vars['gpufleet_lab_hook'] = account + list(all_vars['gpufleet_lab_hook'])

    def launch_prometheus(self) -> None:
        """Prometheus (Debian package) on loopback scraping the DCGM stand-in, data under <lab>/prometheus."""
        if self.metrics == 'off':
            self.metrics_note = ('metric gate: OFF (--metrics off); the GPU and node gates decide, and the canary cannot '
                                 'prove monitoringPassed (no DCGM series read from Prometheus), so its record is not '
                                 'qualified and upgrade_check refuses the rollout')
            return
        binary, reason = ensure_binary('prometheus', 'prometheus')
        if binary is None:
            self.metrics_note = ('metric gate: OFF, Prometheus is not available (%s); the GPU and node gates decide, '
                                 'and the canary cannot prove monitoringPassed, so upgrade_check refuses the rollout'
                                 % reason)
            return
        work = self.dir / 'prometheus'
        work.mkdir(parents=True)
        self.dcgm = lab_dcgm.DcgmStandIn(self.dir, self.names).start()
        self.prom = PrometheusServer(binary, work, self.dcgm, job='lab-dcgm', start_timeout=90)
        self.prom.launch()

    def wait_prometheus(self) -> None:
        """Once: before the first playbook that can run a gate (tests that drive Lab step by step get it too)."""
        if self._prom_waited:
            return
        self._prom_waited = True
        if self.prom is None:
            log(self.metrics_note)
            return
        t0 = time.monotonic()
        try:
            self.prom.wait_ready()
        except RuntimeError as exc:
            raise LabError('Prometheus did not start: %s' % exc) from exc
        self.metrics_note = ('metric gate: ON, Prometheus %s (%s) scrapes the DCGM stand-in %s every %s; presets %s '
                             'over %s, at least %d samples, temperature at most %g C'
                             % (self.prom.url, self.prom.binary, self.dcgm.target, '1s',
                                ', '.join(METRIC_GATE['presets']), METRIC_GATE['window'], METRIC_GATE['min_samples'],
                                METRIC_GATE['temperature_max']))
        log('%s (waited %.1fs for it)' % (self.metrics_note, time.monotonic() - t0))

    def write_conf(self) -> None:
        conf = {
            # The lab's reboot hook plays the kubelet: the setup identity, straight to the API server.
            'kubeconfig': self.cluster.admin_kubeconfig, 'api': self.cluster.cp.url,
            'target_driver': self.target['driver'], 'target_kernel': self.target['kernel'],
            'misreport': self.misreport,
            'fault': self.fault if self.fault not in ('auto', 'none') else None,
            'fault_kind': self.fault_kind,
            'stuck': self.stuck,
            'prometheus': self.prom.url if self.prom else None}
        tmp = self.dir / 'lab.json.tmp'
        tmp.write_text(json.dumps(conf, indent=1))
        os.replace(tmp, self.dir / 'lab.json')   # the DCGM stand-in reads it at every scrape

    def role_vars(self) -> dict[str, Any]:
        # fleet production: every path relative, resolved against the directory the playbooks start from (the lab's).
        here = (lambda p: p) if self.installed_mode else (lambda p: str(self.dir / p))
        v = {
            'gpufleet_plan_file': here('plan.json'),
            'gpufleet_qualification_dir': here('qualification'),
            'gpufleet_evidence': here('evidence/rollout.json'),
            'gpufleet_record_id': {'driver': 'lab-driver-580-130', 'production': 'lab-production-k135-driver-580-130'}.get(
                self.change, 'lab-seed-k135-rke2-136-driver-580-130'),
            'gpufleet_target': self.target,
            'gpufleet_source_revision': self.revision(),
            'gpufleet_canaries_per_combination': 2 if len(self.names) >= 20 else 1,
            'gpufleet_batch_size': 4,
            'gpufleet_max_unavailable': 8,
            # 40 nodes: 4 isolated canaries + a batch of 4 leave 80 % of the GPUs in service.
            'gpufleet_failure_allowance': {'gpus': '75%' if len(self.names) >= 20 else '25%'},
            # The lab reboot path and quick simulated waits (real fleets keep the defaults).
            # (gpufleet_* settings are shared by node_upgrade and the rollback it runs.)
            'gpufleet_activation': 'lab', 'gpufleet_ready_interval': 1, 'gpufleet_reboot_timeout': 30,
            # Each canary's timed rollback must fit in it (the lab's emulated reboots take seconds).
            'gpufleet_maintenance_window': '30m',
            'gpufleet_node_gate_timeout': 10, 'gpufleet_node_gate_interval': 0.5,
            'node_upgrade_drain_timeout': 60, 'node_upgrade_drain_retry_interval': 0.2,
            # The SUC stand-in completes a node's RKE2 Job in SUC_DELAY: poll the Plan often.
            'node_upgrade_rke2_interval': 0.5, 'node_upgrade_rke2_timeout': 120,
            # A short observation window after each batch (a real fleet's is hours: the default is 15m); at
            # its end every node upgraded so far is re-gated (8 s: enough scrapes for the metric gate's 5 samples).
            'gpufleet_observation_window': '8s',
            'gpufleet_drain_policy': labenv.LAB_DRAIN_POLICY,
        }
        if self.pause_before:
            v['gpufleet_pause_before'] = self.pause_before
        v['gpufleet_canary_workload_suite'] = self.workload_suite
        if self.workload_suite:
            v.update({'gpufleet_workload_suite_dir': str(self.dir / 'workloads'),
                      'gpufleet_workload_namespace': labenv.WORKLOAD_NAMESPACE,
                      # KWOK runs a pod in about a second: read the Jobs more often than a real fleet would
                      'gpufleet_workload_interval': 0.5,
                      # Every window (after the canaries, after each batch) re-runs the device query on every node
                      # upgraded so far, declared in the plan (a real fleet names the cases it can afford on nodes
                      # in service, or none).
                      'gpufleet_observation': {'workloads': {'cases': ['device-query'], 'repeat': 1}}})
        if self.prom is not None:
            v['node_upgrade_metric_gate'] = dict(METRIC_GATE, url=self.prom.url)
        if self.gpu_operator:
            # FAULT_KIND=operand: the faulty node's exporter never starts; its operands step fails at this bound.
            v.update({'gpufleet_gpu_operator_managed': True,
                      'gpufleet_gpu_operator_timeout': 20 if self.fault_kind == 'operand' else 120})
        if self.install_method != 'apt':
            v['gpufleet_install_method'] = self.install_method
        if self.installed_mode:
            v['gpufleet_snapshot_dir'] = 'snapshots'
        if self.fleet == 'production':
            # The drift among the nodes (kernel ABI, RKE2 patch) is planned as parts with their own canary; a part of
            # one node is its own canary, acknowledged.
            v.update({'gpufleet_source_drift': 'split', 'gpufleet_single_node_pool_acknowledged': True,
                      'gpufleet_canaries_per_combination': 1, 'gpufleet_batch_size': 2, 'gpufleet_max_unavailable': 6,
                      'gpufleet_failure_allowance': {'gpus': '25%'},
                      # Each workload case once per canary (the default is 3): four canaries, and the suite's time.
                      'gpufleet_workload_repeat': 1})
        v.update(self.lab_vars)
        return v

    @staticmethod
    def revision() -> str:
        out = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=REPO, capture_output=True, text=True, check=False)
        rev = out.stdout.strip()
        return rev if re.fullmatch(r'[0-9a-f]{40}', rev) else '0' * 40

    # ------------------------------------------------------------------ playbooks
    def play(self, name: str, playbook: str, extravars: dict[str, Any] | None = None,
             cancel_on: Any = None, hook: Any = None, envvars: dict[str, str] | None = None,
             collection: pathlib.Path | None = None) -> str:
        """Run a playbook; `hook(event)` sees each event as ansible-runner reads it (the controller runs
        on meanwhile: a test changes the cluster at a point of the run well before what it affects).
        `cancel_on(event) -> bool` kills the controller once true: ansible-playbook and every process
        it started (workers, running modules) get SIGKILL at once, as in a crash, so the kill lands
        at that event rather than at ansible-runner's next poll of its cancel callback (up to
        pexpect_timeout, 5 s, later); the run's status is then 'canceled'. `envvars` add to (or
        replace) the controller's environment (for example ANSIBLE_FORKS). `collection`: run the playbook
        from that checkout of the collection (<dir>/ansible_collections/gpufleet/upgrade), as an AWX job runs
        it from its own project checkout, instead of this repository."""
        pdd = self.dir / 'runner' / name
        shutil.rmtree(pdd, ignore_errors=True)
        (pdd / 'project').mkdir(parents=True)
        failures: list[dict] = []
        events: list[dict] = []
        cancelled = [False]
        killed_at = [0.0]

        def on_event(event: dict) -> bool:
            data = event.get('event_data', {})
            events.append({'event': event.get('event'), 'host': data.get('host'), 'task': data.get('task'),
                           'changed': (data.get('res') or {}).get('changed'), 'created': event.get('created'),
                           'msg': (data.get('res') or {}).get('msg'),
                           'delegated': bool((data.get('res') or {}).get('_ansible_delegated_vars'))})
            if hook is not None:
                hook(event)
            if cancel_on is not None and not cancelled[0] and cancel_on(event):
                cancelled[0] = True
                _kill_controller(event.get('pid'))
                killed_at[0] = time.monotonic()
            if event.get('event') == 'runner_on_failed' and not data.get('ignore_errors'):
                failures.append({'host': data.get('host'), 'task': data.get('task'),
                                 'msg': (data.get('res') or {}).get('msg')})
            return True

        env = {k: os.environ[k] for k in ('PATH', 'HOME', 'LANG', 'TMPDIR') if k in os.environ}
        env['PATH'] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get('PATH', '')
        installed = self.installed if collection is None else None
        env.update({
            'ANSIBLE_COLLECTIONS_PATH': str(installed or (collection.parents[2] if collection else REPO / '.venv' / 'collections')),
            'ANSIBLE_RETRY_FILES_ENABLED': '0', 'ANSIBLE_FORKS': '8', 'ANSIBLE_PIPELINING': '1',
            'ANSIBLE_DISPLAY_SKIPPED_HOSTS': 'false', 'ANSIBLE_DEPRECATION_WARNINGS': 'false',
            'ANSIBLE_LOCALHOST_WARNING': 'false', 'ANSIBLE_INVENTORY_UNPARSED_WARNING': 'false',
            'ANSIBLE_CALLBACK_RESULT_FORMAT': 'yaml',
            'ANSIBLE_PYTHON_INTERPRETER': sys.executable,
        })
        env.update(zipimport_cache.env())      # module processes keep their compiled module_utils (issue 36)
        if installed is not None:
            env.update(self.k8s_auth_env())
        env.update(envvars or {})
        if playbook != 'plan.yml':   # plan.yml runs no gate: Prometheus starts meanwhile
            self.wait_prometheus()
        log('== %s (%s)' % (name, playbook))
        t0, c0, n0 = time.monotonic(), _children_cpu(), self.node_cpu()
        # fleet production: by FQCN from the installed collection, in the lab's directory (relative paths land there).
        where = ({'playbook': 'gpufleet.upgrade.' + playbook.rsplit('.', 1)[0], 'project_dir': str(self.dir.resolve())}
                 if installed is not None else {'playbook': str((collection or REPO) / 'playbooks' / playbook)})
        result = ansible_runner.run(
            private_data_dir=str(pdd), inventory=self.inventory, **where,
            extravars=extravars or {}, envvars=env, quiet=self.quiet, event_handler=on_event,
            timeout=self.play_timeout(),
            cancel_callback=lambda: cancelled[0])
        self.timings.append({'step': name, 'wall': time.monotonic() - t0, 'cpu': _children_cpu() - c0})
        suite_timings.append('lab', {'phase': name, 'playbook': playbook, 'nodes': len(self.names),
                                     'wall': self.timings[-1]['wall'], 'cpu': self.timings[-1]['cpu']})
        if self.node_cpu_log:
            self.timings[-1]['node_cpu'] = self.node_cpu() - n0
        if killed_at[0]:
            self.timings[-1]['killed_at'] = killed_at[0] - t0
        self.runs[name] = {'status': result.status, 'rc': result.rc, 'failures': failures, 'events': events}
        if result.status == 'timeout':
            log('== %s: %s' % (name, self.how_far(name)))
        log('== %s: %s in %.1fs%s' % (name, result.status, time.monotonic() - t0,
                                      ' (killed at %.1fs)' % (killed_at[0] - t0) if killed_at[0] else ''))
        return result.status

    def play_timeout(self) -> int:
        """The bound of one playbook run: `LAB_PLAY_TIMEOUT` seconds where set, else one that follows the
        fleet (300 s plus 45 s a node: 2,100 s for the 40-node lab, more than twice what a loaded 2-core machine
        took). A run past it is reported as slow, with how far it got (`how_far`), never as a wrong verdict."""
        return int(os.environ.get('LAB_PLAY_TIMEOUT') or 300 + 45 * len(self.names))

    def how_far(self, name: str) -> str:
        """What a playbook run that ran past its bound had done: its last task and the hosts that finished a task."""
        events = self.runs[name]['events']
        tasks = [e for e in events if e['event'] == 'playbook_on_task_start']
        done = sorted({e['host'] for e in events if e['event'] == 'runner_on_ok' and e['host'] in self.names})
        return ('ran past its bound of %d s (slow, not wrong: LAB_PLAY_TIMEOUT=<seconds> raises it); last task '
                'started: %s; %d of %d nodes had finished a task' % (
                    self.play_timeout(), tasks[-1]['task'] if tasks else '-', len(done), len(self.names)))

    def pods_not_ready(self) -> list[str]:
        """The pool's pods that are not Ready (what a failed step waited for, to read in CI's output): namespace,
        name, node, phase, revision, and whether the node lifecycle controller marked it (Ready False while Running)."""
        if self.cluster is None:
            return []
        try:
            pods = self.cluster.list('v1', 'Pod')
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not hide the failure it explains
            return ['(pods not read: %s)' % exc]
        out = []
        for pod in pods:
            meta, status = pod['metadata'], pod.get('status') or {}
            node = (pod.get('spec') or {}).get('nodeName')
            conds = {c.get('type'): c for c in status.get('conditions') or []}
            if node not in self.names or status.get('phase') in ('Succeeded', 'Failed') or \
                    (conds.get('Ready') or {}).get('status') == 'True':
                continue
            out.append('%s/%s on %s: %s%s, revision %s%s' % (
                meta['namespace'], meta['name'], node, status.get('phase'),
                ' (deleting)' if meta.get('deletionTimestamp') else '',
                (meta.get('labels') or {}).get('controller-revision-hash', '-'),
                ', Ready False since %s' % conds['Ready'].get('lastTransitionTime') if 'Ready' in conds else ''))
        return sorted(out)

    # ------------------------------------------------------------------ steps
    def plan(self) -> dict:
        if self.play('plan', 'plan.yml') != 'successful':
            raise LabError('plan.yml failed: %s' % self.runs['plan']['failures'])
        plan = json.loads((self.dir / 'plan.json').read_text())
        if self.fault == 'auto':
            # A later batch with at least one batch after it (the 40-node lab: the 4th batch).
            later = plan['batches'][max(1, min(3, len(plan['batches']) - 2))]
            self.fault = later[len(later) // 2]
            self.write_conf()
        if self.fault != 'none' and self.fault_kind == 'operand':
            self.inject_operand_fault(self.fault)
        log('plan: %d combinations, canaries %s, %d batches of at most %d; injected fault: %s'
            % (len(plan['combinations']), ', '.join(plan['canaries']), len(plan['batches']), plan['batch_size'],
               '%s on %s after its upgrade' % (FAULT_KINDS[self.fault_kind], self.fault)
               if self.fault != 'none' else 'none'))
        return plan

    def preflight(self) -> None:
        """preflight.yml on the plan (read-only: the live tuple, holders, the System Upgrade Controller and every
        node's RKE2 hop, the target driver's availability per host)."""
        if self.play('preflight', 'preflight.yml', {'gpufleet_plan_file': self.role_vars()['gpufleet_plan_file']}) != 'successful':
            raise LabError('preflight.yml failed: %s' % self.runs['preflight']['failures'])

    def inject_operand_fault(self, node: str) -> None:
        """FAULT_KIND=operand: the API server's admission (a real ValidatingAdmissionPolicy) refuses the DCGM
        exporter pod of the target operator's revision on `node`, as an image that cannot be pulled or a pod
        that cannot start would keep it from becoming Ready: its window's operands step waits and fails.
        Every other pod of it, and that exporter on every other node, is admitted."""
        affinity = 'object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution'
        on_node = ('has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && has(%s) && '
                   '%s.nodeSelectorTerms.exists(t, has(t.matchFields) && t.matchFields.exists(f, '
                   'f.values.exists(v, v == %s)))' % (affinity, affinity, json.dumps(node)))
        new = ('has(object.spec.initContainers) && object.spec.initContainers.exists(c, c.image.endsWith(%s))'
               % json.dumps(':' + self.target['gpu_operator']))
        exporter = "has(object.metadata.labels) && object.metadata.labels.?app.orValue('') == 'nvidia-dcgm-exporter'"
        name = 'gpufleet-lab-operand-fault'
        self.cluster.apply([
            {'apiVersion': 'admissionregistration.k8s.io/v1', 'kind': 'ValidatingAdmissionPolicy',
             'metadata': {'name': name},
             'spec': {'failurePolicy': 'Fail',
                      'matchConstraints': {'resourceRules': [{'apiGroups': [''], 'apiVersions': ['v1'],
                                                              'operations': ['CREATE'], 'resources': ['pods']}]},
                      'validations': [{'expression': '!(%s && %s && %s)' % (exporter, on_node, new),
                                       'message': 'lab fault: the new DCGM exporter of %s does not start' % node}]}},
            {'apiVersion': 'admissionregistration.k8s.io/v1', 'kind': 'ValidatingAdmissionPolicyBinding',
             'metadata': {'name': name},
             'spec': {'policyName': name, 'validationActions': ['Deny'],
                      'matchResources': {'namespaceSelector': {'matchLabels': {
                          'kubernetes.io/metadata.name': 'gpu-operator'}}}}}], settle=False)

    def approve(self) -> None:
        paths = sorted((self.dir / 'qualification').glob('*.yaml'))
        if not paths:
            raise LabError('the canary wrote no qualification record under %s' % (self.dir / 'qualification'))
        for path in paths:
            text = path.read_text()
            if not re.search(r'^state: "?qualified"?$', text, re.M):
                raise LabError('the canary did not qualify the target; see %s' % path)
            text, n = re.subn(r'^approvedBy: .*$', 'approvedBy: "%s"' % APPROVER, text, count=1, flags=re.M)
            if n != 1:
                raise LabError('no approvedBy field in %s' % path)
            path.write_text(text)
        log('approval: the lab approves %s as "%s". In production a second operator reviews the evidence and '
            'approves (an AWX workflow approval node, or a reviewed commit).'
            % (', '.join(p.name for p in paths), APPROVER))

    def approve_without_canary(self, plan: dict) -> None:
        """--without-canary: write one approved qualification record of the target per combination of `plan`
        (tests/tools/records.write_approved, what canary.yml and the approval leave) instead of running canary.yml.
        For tests whose subject is the rollout (a node that fails in it); the canaries are then upgraded by the
        rollout's first batch. Never a way to qualify anything: `make lab` always runs canary.yml."""
        records.write_approved(self.dir / 'qualification', plan, self.target, 'lab-without-canary', approver=APPROVER)
        log('approval: WITHOUT CANARY (--without-canary, a test of the rollout alone): the lab wrote approved records '
            'of the target for %d combination(s); the canaries are upgraded by the rollout\'s first batch'
            % len(plan['combinations']))

    def approve_pauses(self, plan: dict, by: str = APPROVER) -> list[str]:
        """Give the approval of each pause point of `plan` (pause_approval_info's ConfigMaps, as the setup
        identity, which may create them: the rollout's own identity may not). The lab approves itself and says
        so; in production an operator bound to docs/rbac/gpufleet-upgrade-approve.yml creates them."""
        from ansible_collections.gpufleet.upgrade.plugins.module_utils._pause import approval_name
        names = [approval_name(plan['digest'], k) for k in plan.get('pauses') or []]
        self.cluster.apply([{'apiVersion': 'v1', 'kind': 'ConfigMap',
                             'metadata': {'name': n, 'namespace': labenv.APPROVALS_NAMESPACE},
                             'data': {'by': by}} for n in names], settle=False)
        if names:
            log('pause points: the lab approves batch %s itself as "%s" (ConfigMaps %s/%s). In production an '
                'operator approves each one when its batch is due (docs/orchestration.md, "Pause points").'
                % (', '.join(str(k) for k in plan['pauses']), by, labenv.APPROVALS_NAMESPACE, ', '.join(names)))
        return names

    def gate(self) -> None:
        v = self.role_vars()
        status = self.play('upgrade_check', 'upgrade_check.yml', {
            'gpufleet_qualification_dir': v['gpufleet_qualification_dir'], 'gpufleet_plan_file': v['gpufleet_plan_file']})
        if status != 'successful':
            raise LabError('upgrade_check did not PASS: %s' % self.runs['upgrade_check']['failures'])

    # ------------------------------------------------------------------ verdict
    def node_view(self) -> list[dict]:
        """Each node as measured now: host side (labenv.measured: running kernel, loaded driver, NVML's
        driver, installed driver) and what its kubelet reports (nodeInfo kernelVersion, kubeletVersion)."""
        rows = []
        for name in self.names:
            node = self.cluster.get('v1', 'Node', name)
            ann = node['metadata'].get('annotations') or {}
            info = (node.get('status') or {}).get('nodeInfo') or {}
            m = labenv.measured(self.dir, name)
            rows.append({'node': name, 'model': node['metadata']['labels'].get('gpufleet.io/model', '?'),
                         'driver': m['installed'], 'nvml': m['nvml'], 'loaded': m['loaded'], 'kernel': m['kernel'],
                         'node_kernel': info.get('kernelVersion'), 'kubelet': info.get('kubeletVersion'),
                         'cordoned': bool(node['spec'].get('unschedulable')),
                         'state': ann.get('gpufleet.io/upgrade-state') or
                         ('done' if ann.get('gpufleet.io/upgraded-to') else '-'),
                         'canary': (node['metadata']['labels'] or {}).get('gpufleet.io/canary') == 'true'})
        return rows

    def off(self, r: dict, tup: dict, rke2: bool = True) -> list[str]:
        """How node row `r` differs from tuple `tup` as measured (empty: it runs `tup`). With the operator's
        driver container (install method operator) no host driver package is the driver: the loaded module
        and NVML are measured, the installed package is not."""
        got = [('kernel (proc osrelease)', r['kernel'], tup['kernel']),
               ('kernel (nodeInfo.kernelVersion)', r['node_kernel'], tup['kernel']),
               ('driver (proc/driver/nvidia/version)', r['loaded'], tup['driver']),
               ('driver (NVML)', r['nvml'], tup['driver'])]
        if self.install_method != 'operator':
            got.append(('driver (installed)', r['driver'], tup['driver']))
        if rke2:
            got.append(('RKE2 (nodeInfo.kubeletVersion)', r['kubelet'], tup['rke2']))
        return ['%s %s' % (what, have) for what, have, want in got if have != want]

    def operand_view(self) -> dict[str, Any]:
        """With the real GPU Operator: per node, its operand pods not at their DaemonSet's current revision and
        the operator version its validator pod runs (the image tag); the DaemonSets' update strategies. Read as
        gpu_operator_info reads them (_gpu_operator.read_state), from the lab's administrator view."""
        from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpu_operator import read_state
        ns = 'gpu-operator'
        state = read_state(self.cluster.get('nvidia.com/v1', 'ClusterPolicy', 'cluster-policy'),
                           self.cluster.list('apps/v1', 'DaemonSet', ns),
                           self.cluster.list('apps/v1', 'ControllerRevision', ns), self.cluster.list('v1', 'Pod', ns))
        nodes: dict[str, dict[str, Any]] = {}
        for name in self.names:
            pods = state['nodes'].get(name, [])
            validator = next((x['image'] for x in pods if x['operand'] == 'nvidia-operator-validator'), None)
            nodes[name] = {'stale': [x['operand'] for x in pods if not x['current']],
                           'validator': validator.rsplit(':', 1)[-1] if validator else None}
        return {'nodes': nodes, 'strategies': {o['name']: o['update_strategy'] for o in state['operands']},
                'drivers': sorted(o['name'] for o in state['operands'] if o['component'] == 'driver')}

    def operand_problems(self, upgraded: list[str], untouched: list[str], finished: bool) -> list[str]:
        """The operator's side of the verdict: upgraded nodes run the target operator's operands at the current
        revision, untouched nodes still the source's; the update strategy restored only when the rollout finished."""
        view = self.operand_view()
        problems = []
        for name in upgraded:
            n = view['nodes'][name]
            if n['stale'] or n['validator'] != self.target['gpu_operator']:
                problems.append('%s: operands not at the target operator %s (validator %s, not current: %s)' % (
                    name, self.target['gpu_operator'], n['validator'], ', '.join(sorted(n['stale'])) or '-'))
        for name in untouched:
            n = view['nodes'][name]
            if n['validator'] != labenv.CURRENT['gpu_operator']:
                problems.append('%s (never in a window) runs operator %s operands, not %s' % (
                    name, n['validator'], labenv.CURRENT['gpu_operator']))
        want = 'RollingUpdate' if finished else 'OnDelete'
        # The operator renders its driver DaemonSet OnDelete whatever daemonsets.updateStrategy says (its driver
        # manager or upgrade controller restarts driver pods, never the DaemonSet controller).
        wrong = sorted(k for k, v in view['strategies'].items() if v != want and k not in view['drivers'])
        if wrong:
            problems.append('operand DaemonSets not %s %s: %s' % (
                want, 'after the restore' if finished else 'while the rollout is unfinished', ', '.join(wrong)))
        return problems

    def verdict(self, plan: dict, rollout_status: str) -> list[str]:
        rows = {r['node']: r for r in self.node_view()}
        problems = self.metric_verdict(rows)
        changed = self.installed_changes()
        if changed:
            problems.append('the run wrote inside the installed collection: %s' % ', '.join(changed[:10]))
        target, source = self.target, labenv.CURRENT
        if self.fault == 'none':
            if rollout_status != 'successful':
                problems.append('rollout did not complete: %s' % self.runs['rollout']['failures'])
            for r in rows.values():
                off = self.off(r, target)
                if off:
                    problems.append('%s is not measured at the target: %s' % (r['node'], ', '.join(off)))
                if r['cordoned']:
                    problems.append('%s is still cordoned' % r['node'])
            if self.gpu_operator:
                problems += self.operand_problems(list(rows), [], rollout_status == 'successful')
            return problems
        fb = next(i for i, b in enumerate(plan['batches']) if self.fault in b)
        if rollout_status == 'successful':
            problems.append('the rollout completed although %s had a critical fault' % self.fault)
        f = rows[self.fault]
        if not f['cordoned']:
            problems.append('%s (the faulty node) is not cordoned' % self.fault)
        # RKE2 is the rollback boundary: the faulty node keeps the RKE2 it reached.
        off = self.off(f, source, rke2=False)
        if off:
            problems.append('%s: the rollback did not restore kernel %s with driver %s (measured: %s)'
                            % (self.fault, source['kernel'], source['driver'], ', '.join(off)))
        if self.fault_kind == 'kernel':
            log_text = (self.dir / 'nodes' / self.fault / 'kern.log').read_text()
            if 'Linux version %s ' % target['kernel'] in log_text:
                problems.append('%s: kernel %s came up although the fault said it does not' % (self.fault, target['kernel']))
        for i, batch in enumerate(plan['batches']):
            for name in batch:
                r = rows[name]
                if i < fb and (self.off(r, target) or r['cordoned']):
                    problems.append('%s (batch %d, before the fault) is not upgraded and in service: %s'
                                    % (name, i, ', '.join(self.off(r, target)) or 'cordoned'))
                if i > fb and (self.off(r, source) or r['cordoned'] or r['state'] != '-'):
                    problems.append('%s (batch %d, after the fault) was touched: expansion did not stop' % (name, i))
        if self.gpu_operator:
            before = sorted(set(plan['canaries']) | {n for i, b in enumerate(plan['batches']) if i < fb for n in b})
            after = [n for i, b in enumerate(plan['batches']) if i > fb for n in b]
            problems += self.operand_problems(before, after, False)
            # Its rollback took its operands back with the host (gpu_operator_update state=back): the source
            # operator's revisions, from the DaemonSets' own ControllerRevisions.
            back = self.operand_view()['nodes'][self.fault]['validator']
            if back != labenv.CURRENT['gpu_operator']:
                problems.append('%s (the faulty node): its operands were not rolled back (validator %s, not %s)'
                                % (self.fault, back, labenv.CURRENT['gpu_operator']))
        return problems

    def release(self) -> list[str]:
        """Past the rollback boundary (release.yml): every node's previous kernel is no longer protected
        (its protection record gone); the evidence bundle records what each node marked automatic."""
        if self.play('release', 'release.yml') != 'successful':
            return ['release.yml failed: %s' % self.runs['release']['failures']]
        problems = ['%s: the previous kernel is still protected after release.yml' % n for n in self.names
                    if (self.dir / 'nodes' / n / 'root' / 'var/lib/gpufleet/kernel-protect.json').exists()]
        actions = json.loads((self.dir / 'evidence' / 'rollout.json').read_text()).get('actions') or []
        if not any(a.get('name') == 'kernel-release' and a.get('ok') for a in actions):
            problems.append('the evidence bundle records no kernel-release: %s' % [a.get('name') for a in actions])
        return problems

    def gate_verdicts(self) -> dict[str, dict[str, dict]]:
        """node -> gate name -> the latest evidence entry (canary bundles, then the rollout's)."""
        out: dict[str, dict[str, dict]] = {}
        bundles = sorted((self.dir / 'qualification').glob('*.json')) + [self.dir / 'evidence' / 'rollout.json']
        for path in bundles:
            try:
                gates = json.loads(path.read_text()).get('gates') or []
            except (OSError, ValueError):
                continue
            for g in gates:
                if g.get('node'):
                    out.setdefault(g['node'], {})[g['name']] = g
        return out

    def metric_verdict(self, rows: dict[str, dict]) -> list[str]:
        """With Prometheus: every upgraded node has a passed metric gate; a temperature fault fails it."""
        if self.prom is None:
            return []
        verdicts = self.gate_verdicts()
        problems = []
        for name, r in rows.items():
            g = verdicts.get(name, {}).get('metric')
            if r['state'] == 'done' and not (g and g.get('passed')):
                problems.append('%s is upgraded without a passed metric gate: %s' % (name, g))
        if self.fault != 'none' and self.fault_kind == 'temperature':
            g = verdicts.get(self.fault, {}).get('metric')
            if not g or g.get('passed'):
                problems.append('%s: the metric gate did not fail on the hot GPU: %s' % (self.fault, g))
        return problems

    def summary(self, plan: dict) -> None:
        """One row per node: measured kernel and driver before the run and now (`driver after` is the
        loaded module's, with NVML's when it differs), RKE2 as its kubelet reports it, cordoned,
        its upgrade-state, its latest gate verdicts."""
        rows = {r['node']: r for r in self.node_view()}
        verdicts = self.gate_verdicts()
        fmt = '%-6s %-7s %-9s %-18s %-18s %-11s %-22s %-15s %-9s %-12s %-40s %s'
        print('\n' + fmt % ('batch', 'node', 'model', 'kernel-before', 'kernel-after', 'driver-before', 'driver-after',
                            'rke2', 'cordoned', 'state', 'gates', 'note'))
        for i, batch in enumerate(plan['batches']):
            for name in batch:
                r, b = rows[name], self.before.get(name) or {}
                note = 'canary' if r['canary'] else ''
                if name == self.fault:
                    note = 'INJECTED %s -> stopped, rolled back' % FAULT_KINDS[self.fault_kind]
                if r['node_kernel'] != r['kernel']:
                    note = ('%s; kubelet reports kernel %s' % (note, r['node_kernel'])).lstrip('; ')
                cordoned = 'yes' if r['cordoned'] else 'no'
                gates = ','.join('%s:%s' % (g, 'ok' if e.get('passed') else 'FAIL')
                                 for g, e in verdicts.get(name, {}).items()) or '-'
                after = str(r['loaded']) + ('' if r['nvml'] == r['loaded'] else '(nvml:%s)' % r['nvml'])
                print(fmt % (i, name, r['model'].replace('gpu_', ''), b.get('kernel'), r['kernel'], b.get('loaded'),
                             after, r['kubelet'], cordoned, r['state'], gates, note))
        print()
        log(self.metrics_note)
        metric = {n: v['metric'] for n, v in sorted(verdicts.items()) if 'metric' in v}
        if metric:
            failed = {n: g for n, g in metric.items() if not g.get('passed')}
            log('metric gate verdicts: %d nodes passed, %d failed%s'
                % (len(metric) - len(failed), len(failed),
                   ''.join('; %s: %s' % (n, '; '.join(g.get('problems') or [])) for n, g in failed.items())))

    def report(self) -> pathlib.Path | None:
        bundle = self.dir / 'evidence' / 'rollout.json'
        if not bundle.is_file():
            return None
        from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence
        out = self.dir / 'report.html'
        out.write_text(_evidence.render_html(_evidence.loads(bundle.read_text())))
        return out

    def stop(self) -> None:
        """Everything the lab started, bounded (the control plane: SIGTERM, SIGKILL after 15 s)."""
        sync = self.status_sync
        # The stand-ins' threads; their errors are said (the run's verdict is made already).
        for attr in ('status_sync', 'log_writer', 'suc', 'helm'):
            stand_in = getattr(self, attr)
            setattr(self, attr, None)
            if stand_in is not None:
                try:
                    stand_in.__exit__(None, None, None)
                except AssertionError as exc:
                    log(str(exc))
        if sync is not None and sync.synced:
            log('kubelet pod status sync (KWOK has none): %d pods the node lifecycle controller had marked not '
                'Ready set Ready again: %s' % (len(sync.synced), ', '.join(sync.synced[:8])))
        if self.operator is not None:
            operator, self.operator = self.operator, None
            try:
                operator.stop()
            except Exception as exc:  # the control plane stops next anyway
                log('gpu-operator stop: %s' % exc)
        if self.cluster is not None:
            self.cluster.stop_informers()
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None
        if self._cp is not None:
            self._cp.stop()
            self._cp = None
        if self.prom is not None:
            self.prom.stop()
        if self.dcgm is not None:
            self.dcgm.stop()


class LabError(Exception):
    pass


def _process_tree(root: int) -> list[int]:
    """`root` and its descendants (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path('/proc').glob('[0-9]*/stat'):
        try:
            fields = stat.read_text().rsplit(')', 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _kill_controller(pid: Any) -> None:
    """Kill the controller as a crash would: the ansible-playbook process `pid` (from a runner
    event), its forks and the modules they run. ansible-core puts each worker in its own process
    group, so killing the playbook's group alone (what ansible-runner's cancel does) would leave the
    running module alive, finishing its phase after the "kill". Never our own process group."""
    try:
        pid = int(pid)
        os.kill(pid, signal.SIGSTOP)        # no new worker while the tree is read
    except (TypeError, ValueError, OSError):
        return
    own = os.getpgrp()
    # Stop the whole tree, re-reading it until nothing new appears: a worker still running could
    # otherwise fork a module (ansible puts it in a group of its own) after one read of the tree,
    # and that module would finish its phase after the "kill".
    tree: list[int] = []
    while True:
        new = [p for p in _process_tree(pid) if p not in tree]
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signal.SIGSTOP)
            except OSError:
                pass
        tree += new
    groups = set()
    for p in tree:
        try:
            groups.add(os.getpgid(p))
        except OSError:
            pass
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    for g in groups - {own}:
        try:
            os.killpg(g, signal.SIGKILL)
        except OSError:
            pass


def _node_cpu_total(path: pathlib.Path | None) -> float:
    return cpu_account.total(str(path)) if path else 0.0


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


# What each case of the shipped workload suite (roles/node_upgrade/files/workloads) prints on a healthy GPU:
# the lab's stand-in for the CUDA binaries. A new shipped case needs its line here (write_workload_suite says so).
WORKLOAD_OUTPUTS = {
    'device-query': ('deviceQuery Starting...\n CUDA Device Query (Runtime API) version (CUDART static linking)\n'
                     'Detected 1 CUDA Capable device(s)\nDevice 0: "NVIDIA H100 80GB HBM3"\nResult = PASS'),
    'compute-checksum': '{"checksum": 8589934592.0}',
    'model-infer': '{"p99_ms": 4.1, "p50_ms": 3.7}',
    'checkpoint-io': '{"checksum": 549755289600.0, "same": true}',
    'partition-discovery': 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-lab)\n{"devices": 1, "mig": false}',
    'nccl-allreduce': '{"allreduce": 2.0, "world": 2}',
}
SHIPPED_WORKLOADS = REPO / 'roles' / 'node_upgrade' / 'files' / 'workloads'


def write_workload_suite(dest: pathlib.Path) -> list[str]:
    """The shipped suite, each manifest as shipped plus one pod-template annotation (gpufleet.test/logs: its
    WORKLOAD_OUTPUTS line), written to `dest`; the case names."""
    import yaml
    from cluster.logs import LOGS_ANNOTATION
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    names = []
    for path in sorted(SHIPPED_WORKLOADS.glob('*.yml')):
        doc = yaml.safe_load(path.read_text())
        name = (doc['metadata'].get('annotations') or {}).get('gpufleet.io/case') or doc['metadata']['name']
        if name not in WORKLOAD_OUTPUTS:
            raise LabError('the shipped workload case %s (%s) has no stand-in output in WORKLOAD_OUTPUTS' % (name, path))
        meta = doc['spec']['template'].setdefault('metadata', {})
        meta.setdefault('annotations', {})[LOGS_ANNOTATION] = WORKLOAD_OUTPUTS[name]
        (dest / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
        names.append(name)
    return names


def _pauses(value: str, nodes: int) -> list[int]:
    """--pause-before: batch numbers, comma-separated; 'auto' is batch 3 (after the first batch past the
    canaries) for a pool of 12 nodes or more (smaller pools may have fewer batches), none below."""
    if value == 'auto':
        return [3] if nodes >= 12 else []
    try:
        return [int(v) for v in value.split(',') if v.strip()]
    except ValueError:
        raise SystemExit('--pause-before %r: expected batch numbers such as 3 or 3,6, "auto" or ""' % value)


def run(args: argparse.Namespace) -> int:
    misreport: dict[str, dict[str, str]] = {}
    for item in args.misreport:
        m = re.fullmatch(r'([^:=]+):([A-Za-z_]+)=(.+)', item)
        if not m:
            raise SystemExit('--misreport %r: expected <node>:<nodeInfo field>=<value>, e.g. gpu-02:kernelVersion=6.8.0-1-generic'
                             % item)
        misreport.setdefault(m.group(1), {})[m.group(2)] = m.group(3)
    if args.without_canary and args.gpu_operator:
        raise SystemExit('--without-canary cannot run with --gpu-operator: canary.yml makes the operator\'s cluster '
                         'step, which the rollout needs')
    nodes = labenv.FLEETS[args.fleet].get('nodes', args.nodes)
    lab = Lab(args.dir.resolve(), nodes, args.fault, args.stuck, args.quiet, fault_kind=args.fault_kind,
              metrics=args.metrics, account_node_cpu=args.account_node_cpu, change=args.change, misreport=misreport,
              gpu_operator=args.gpu_operator, pause_before=_pauses(args.pause_before, nodes),
              workload_suite=True, install_method=args.install_method, driver_pools=args.driver_pools,
              fleet=args.fleet)
    lab.dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # SIGTERM (a CI job cancelled) ends the run as Ctrl-C does: through the `finally` below, which
    # stops the control plane and Prometheus.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        lab.prepare()
        if lab.fault != 'none' and lab.fault_kind == 'kernel' and lab.target['kernel'] == labenv.KERNEL:
            raise LabError('--fault-kind kernel needs a change of the kernel (--change %s keeps %s)'
                           % (lab.change, labenv.KERNEL))
        if lab.install_method == 'operator' and (not lab.gpu_operator or lab.target['kernel'] != labenv.KERNEL):
            raise LabError('--install-method operator needs the real GPU Operator (--gpu-operator) and a change that '
                           'keeps the kernel (--change driver)')
        if lab.driver_pools and lab.install_method != 'operator':
            raise LabError('--driver-pools needs --install-method operator (the operator\'s driver container is the driver)')
        if lab.fault != 'none' and lab.fault_kind == 'operand' and not lab.gpu_operator:
            raise LabError('--fault-kind operand needs the real GPU Operator (--gpu-operator, GPU_OPERATOR=1)')
        if lab.fault != 'none' and lab.fault_kind == 'temperature' and lab.prom is None:
            raise LabError('--fault-kind temperature needs Prometheus (only the metric gate sees it): %s'
                           % lab.metrics_note)
        plan = lab.plan()
        if args.preflight:
            lab.preflight()
        if args.without_canary:
            lab.approve_without_canary(plan)
        else:
            if lab.play('canary', 'canary.yml') != 'successful':
                raise LabError('canary.yml failed: %s' % lab.runs['canary']['failures'])
            lab.approve()
        lab.approve_pauses(plan)
        lab.gate()
        rollout = lab.play('rollout', 'rollout.yml')
        if rollout == 'timeout':
            raise LabError('rollout.yml %s' % lab.how_far('rollout'))
        problems = lab.verdict(plan, rollout)
        if lab.fault == 'none' and rollout == 'successful':
            problems += lab.release()
        lab.summary(plan)
        report = lab.report()
        print()
        # The last failure of each node is the one that stopped it (the role's and the rollout's stop
        # repeat the failed gate's message).
        last = {f['host']: f for f in lab.runs.get('rollout', {}).get('failures', [])}
        for f in last.values():
            log('rollout stopped at %s: %s' % (f['host'], f['msg']))
        log('HTML report: %s' % report)
        log('canary reports: %s' % ', '.join(str(p) for p in sorted((lab.dir / 'qualification').glob('*.html'))))
        (lab.dir / 'timings.json').write_text(json.dumps({'steps': lab.timings, 'simulated_per_node': SIMULATED,
                                                          'batches': plan['batches'], 'fault': lab.fault,
                                                          'fault_kind': lab.fault_kind,
                                                          'metric_gate': lab.prom is not None}, indent=1))
        if problems:
            for p in problems:
                log('NOT AS DESIGNED: ' + p)
            for line in lab.pods_not_ready()[:40]:
                log('not Ready: ' + line)
            return 1
        if lab.fault == 'none':
            what = 'the whole rollout completed'
        else:
            what = ('the fault on %s stopped expansion, the node stays cordoned and its rollback restored kernel %s '
                    'with driver %s (injected: %s)'
                    % (lab.fault, labenv.KERNEL, labenv.SOURCE_DRIVER, FAULT_KINDS[lab.fault_kind]))
        log('OK in %.0fs: %s' % (time.monotonic() - t0, what))
        return 0
    except LabError as exc:
        log('FAILED: %s' % exc)
        for line in lab.pods_not_ready()[:40]:
            log('not Ready: ' + line)
        return 1
    finally:
        lab.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
    parser.add_argument('--dir', type=pathlib.Path, default=REPO / '.lab')
    parser.add_argument('--fault', default=os.environ.get('FAULT', 'auto'),
                        help='auto (a node of a later batch), none, or a node name')
    parser.add_argument('--fault-kind', choices=sorted(FAULT_KINDS), default=os.environ.get('FAULT_KIND', 'xid'),
                        help='xid: a new Xid 79 in the kernel log (the GPU gate sees it); temperature: a GPU runs '
                             'hot under load with the new driver (only the metric gate sees it; needs Prometheus); '
                             'kernel: the target kernel does not come up (the trial boot falls back to the saved one); '
                             'operand: the node\'s new DCGM exporter does not start (needs --gpu-operator)')
    parser.add_argument('--change', choices=sorted(labenv.CHANGES), default=os.environ.get('CHANGE', 'seed'),
                        help='seed: kernel, RKE2 and driver (the seed\'s example change); driver: the driver alone')
    parser.add_argument('--misreport', action='append', default=[], metavar='NODE:FIELD=VALUE',
                        help='the node\'s kubelet reports this status.nodeInfo field after each boot instead of the truth '
                             '(FIELD dcgm_exporter: the image tag of the node\'s dcgm-exporter pod after its activation)')
    parser.add_argument('--metrics', choices=('auto', 'off'), default=os.environ.get('METRICS', 'auto'),
                        help='auto: run the metric gate when Prometheus is available; off: without it')
    parser.add_argument('--install-method', choices=('apt', 'operator'), default=os.environ.get('INSTALL_METHOD', 'apt'),
                        help='apt: host driver packages (the default); operator: the GPU Operator\'s driver container '
                             '(needs --gpu-operator and --change driver)')
    parser.add_argument('--driver-pools', action='store_true', default=os.environ.get('DRIVER_POOLS', '') == '1',
                        help='with --install-method operator: the driver rendered per node pool from an NVIDIADriver '
                             'object (driver.useNvidiaDriverCRD) instead of the ClusterPolicy\'s driver.version')
    parser.add_argument('--gpu-operator', action='store_true', default=os.environ.get('GPU_OPERATOR', '') == '1',
                        help='NVIDIA\'s real GPU Operator runs the operands (built from its Go module; as root): the '
                             'target moves it to %s, canary.yml makes the cluster step, each node moves its own '
                             'operands' % labenv.TARGET_GPU_OPERATOR)
    parser.add_argument('--nodes', type=int, default=40)
    parser.add_argument('--no-preflight', dest='preflight', action='store_false',
                        help='skip preflight.yml after the plan (the tests of other steps: test_lab.py\'s production and '
                             'FQDN runs run it)')
    parser.add_argument('--fleet', choices=sorted(labenv.FLEETS), default=os.environ.get('FLEET', 'lab'),
                        help='lab: 40 nodes alike, the playbooks from this checkout; production: a fleet shaped like a '
                             'real one (kernel ABI and RKE2 patch drift split at plan time, two GPU nodes that are RKE2 '
                             'servers) run from the built collection installed read-only, with the dynamic inventory, '
                             'K8S_AUTH_* credentials and no evidence repository (docs/lab.md)')
    parser.add_argument('--pause-before', default=os.environ.get('PAUSE_BEFORE', 'auto'),
                        help='pause points of the plan: batch numbers that wait for an approval (the lab approves '
                             'them itself); auto: batch 3 with 12 nodes or more; "" for none')
    parser.add_argument('--stuck', action='append', default=[], help='a node that does not come back Ready')
    parser.add_argument('--without-canary', action='store_true',
                        help='tests of the rollout alone: approved qualification records of the target are written '
                             'instead of running canary.yml (not with --gpu-operator); `make lab` never sets it')
    parser.add_argument('--quiet', action='store_true', help='no ansible output')
    parser.add_argument('--account-node-cpu', action='store_true',
                        help='log the CPU of node-side modules and the lab hook apart (bench/lab_overhead.py)')
    return run(parser.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
