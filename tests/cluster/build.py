"""Build the test control plane's binaries from their Go modules (tests/cluster/go: go.mod + go.sum)
into a cache outside the work tree, once per machine and module set.

    python -m cluster.build            # build what is missing, print where it is
    python -m cluster.build --print    # only print the directory (non-zero if not built)
    python -m cluster.build --gpu-operator   # also NVIDIA's GPU Operator (tests/cluster/gpu-operator)

The cache is ``$GPUFLEET_CACHE`` (default ``~/.cache/gpufleet``)``/controlplane-<digest>/bin``, where
the digest covers go.mod, go.sum and this file's package list, so a version bump builds anew and an
unchanged set is reused; the GPU Operator goes to ``gpu-operator-<digest>/bin`` the same way. Nothing
is downloaded but Go modules (through the machine's Go module proxy).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

GO_DIR = pathlib.Path(__file__).resolve().parent / 'go'

# binary name -> Go package (main) in the modules pinned by go.mod.
PACKAGES = {
    'etcd': 'go.etcd.io/etcd/server/v3',
    'kube-apiserver': 'k8s.io/kubernetes/cmd/kube-apiserver',
    'kube-controller-manager': 'k8s.io/kubernetes/cmd/kube-controller-manager',
    'kube-scheduler': 'k8s.io/kubernetes/cmd/kube-scheduler',
    'kwok': 'sigs.k8s.io/kwok/cmd/kwok',
}

# The version a released Kubernetes binary carries (its release build stamps it; a plain `go build`
# leaves v0.0.0-master+$Format:%H$, which clients that parse the server's version, such as the GPU
# Operator, refuse). Must match go.mod's k8s.io/kubernetes.
KUBERNETES_VERSION = 'v1.36.3'
_STAMP = ' '.join('-X k8s.io/component-base/version.%s=%s' % kv for kv in (
    ('gitVersion', KUBERNETES_VERSION), ('gitMajor', KUBERNETES_VERSION[1:].split('.', maxsplit=1)[0]),
    ('gitMinor', KUBERNETES_VERSION.split('.')[1]), ('gitTreeState', 'clean'),
    ('buildDate', '2026-01-01T00:00:00Z')))
LDFLAGS = {name: '-s -w' + (' ' + _STAMP if pkg.startswith('k8s.io/kubernetes/') else '')
           for name, pkg in PACKAGES.items()}


class BuildError(RuntimeError):
    pass


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get('GPUFLEET_CACHE') or pathlib.Path.home() / '.cache' / 'gpufleet')


def digest() -> str:
    h = hashlib.sha256()
    for name in ('go.mod', 'go.sum'):
        h.update((GO_DIR / name).read_bytes())
    h.update(repr(sorted(PACKAGES.items())).encode())
    h.update(repr(sorted(LDFLAGS.items())).encode())
    return h.hexdigest()[:16]


def bin_dir() -> pathlib.Path:
    return cache_root() / ('controlplane-%s' % digest()) / 'bin'


def built(directory: pathlib.Path | None = None) -> bool:
    directory = directory or bin_dir()
    return all(os.access(directory / name, os.X_OK) for name in PACKAGES) and (directory / '.complete').exists()


def go_binary() -> str:
    for candidate in (shutil.which('go'), '/usr/local/go/bin/go'):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BuildError('the Go toolchain (go) is not on PATH nor in /usr/local/go/bin: the test control plane '
                     'is built from Go modules')


def ensure(log=print) -> pathlib.Path:
    """The directory of the built binaries; builds them first when missing (minutes, once)."""
    target = bin_dir()
    if built(target):
        return target
    log('control plane: building %s from Go modules (tests/cluster/go/go.mod) into %s; this takes several '
        'minutes once per machine' % (', '.join(sorted(PACKAGES)), target))
    _build(GO_DIR, {name: (pkg, LDFLAGS[name]) for name, pkg in PACKAGES.items()}, target, digest(),
           {'GOFLAGS': '-mod=readonly'}, 'control plane', log)
    return target


# ---------------------------------------------------------------------- NVIDIA GPU Operator
# A module of its own (tests/cluster/gpu-operator): its Kubernetes libraries are older than the control
# plane's. Built static (CGO_ENABLED=0, as NVIDIA's image builds it) so it runs in the small root
# tests/cluster/gpuoperator.py gives it.
OPERATOR_GO_DIR = pathlib.Path(__file__).resolve().parent / 'gpu-operator'
OPERATOR_MODULE = 'github.com/NVIDIA/gpu-operator'
OPERATOR_PACKAGE = OPERATOR_MODULE + '/cmd/gpu-operator'


def operator_digest() -> str:
    h = hashlib.sha256()
    for name in ('go.mod', 'go.sum'):
        h.update((OPERATOR_GO_DIR / name).read_bytes())
    h.update(OPERATOR_PACKAGE.encode())
    return h.hexdigest()[:16]


def operator_bin_dir() -> pathlib.Path:
    return cache_root() / ('gpu-operator-%s' % operator_digest()) / 'bin'


def operator_source() -> pathlib.Path:
    """The GPU Operator module's source in the Go module cache (assets/, manifests/, the CRDs of
    deployments/gpu-operator/crds): what NVIDIA's image copies to /opt/gpu-operator."""
    cp = subprocess.run([go_binary(), 'list', '-m', '-json', OPERATOR_MODULE], cwd=OPERATOR_GO_DIR,
                        env=dict(os.environ, GOFLAGS='-mod=readonly'), capture_output=True, text=True, check=False)
    if cp.returncode != 0:
        raise BuildError('go list -m %s failed (exit %d):\n%s' % (OPERATOR_MODULE, cp.returncode, cp.stderr[-2000:]))
    import json
    directory = json.loads(cp.stdout).get('Dir')
    if not directory or not pathlib.Path(directory, 'assets').is_dir():
        cp = subprocess.run([go_binary(), 'mod', 'download', OPERATOR_MODULE], cwd=OPERATOR_GO_DIR,
                            env=dict(os.environ, GOFLAGS='-mod=readonly'), capture_output=True, text=True, check=False)
        if cp.returncode != 0:
            raise BuildError('go mod download %s failed:\n%s' % (OPERATOR_MODULE, cp.stderr[-2000:]))
        return operator_source()
    return pathlib.Path(directory)


def ensure_operator(log=print) -> pathlib.Path:
    """The directory holding the built `gpu-operator`; builds it first when missing (minutes, once)."""
    target = operator_bin_dir()
    if (target / '.complete').exists() and os.access(target / 'gpu-operator', os.X_OK):
        return target
    log('gpu-operator: building %s from its Go module (tests/cluster/gpu-operator/go.mod) into %s; this '
        'takes a few minutes once per machine' % (OPERATOR_PACKAGE, target))
    _build(OPERATOR_GO_DIR, {'gpu-operator': (OPERATOR_PACKAGE, '-s -w')}, target, operator_digest(),
           {'GOFLAGS': '-mod=readonly', 'CGO_ENABLED': '0'}, 'gpu-operator', log)
    return target


def _build(go_dir: pathlib.Path, packages: dict[str, tuple[str, str]], target: pathlib.Path, stamp: str,
           env_extra: dict[str, str], what: str, log) -> None:
    go = go_binary()
    t0 = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix='bin.', dir=target.parent))
    env = dict(os.environ, **env_extra)
    try:
        # One `go build` per binary (the main packages' names collide: etcd's is `v3`), sharing Go's
        # build cache, so the common packages compile once.
        for name, (pkg, ldflags) in sorted(packages.items()):
            t1 = time.monotonic()
            cp = subprocess.run([go, 'build', '-trimpath', '-ldflags=' + ldflags, '-o', str(staging / name), pkg],
                                cwd=go_dir, env=env, capture_output=True, text=True, check=False)
            if cp.returncode != 0:
                raise BuildError('go build %s failed (exit %d):\n%s' % (pkg, cp.returncode, cp.stderr[-4000:]))
            log('%s: built %s in %.0f s' % (what, name, time.monotonic() - t1))
        (staging / '.complete').write_text('%s\n' % stamp)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    log('%s: build took %.0f s' % (what, time.monotonic() - t0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--print', action='store_true', help='print the binary directory; fail if not built')
    parser.add_argument('--gpu-operator', action='store_true', help="also build NVIDIA's GPU Operator")
    args = parser.parse_args(argv)
    if args.print:
        if not built():
            print('not built: %s' % bin_dir(), file=sys.stderr)
            return 1
        print(bin_dir())
        return 0
    try:
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)

        print(ensure(log=log))
        if args.gpu_operator:
            print(ensure_operator(log=log))
    except BuildError as exc:
        print('error: %s' % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
