"""Build the test control plane's binaries from their Go modules (tests/cluster/go: go.mod + go.sum)
into a cache outside the work tree, once per machine and module set.

    python -m cluster.build            # build what is missing, print where it is
    python -m cluster.build --print    # only print the directory (non-zero if not built)

The cache is ``$GPUFLEET_CACHE`` (default ``~/.cache/gpufleet``)``/controlplane-<digest>/bin``, where
the digest covers go.mod, go.sum and this file's package list, so a version bump builds anew and an
unchanged set is reused. Nothing is downloaded but Go modules (through the machine's Go module proxy).
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


class BuildError(RuntimeError):
    pass


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get('GPUFLEET_CACHE') or pathlib.Path.home() / '.cache' / 'gpufleet')


def digest() -> str:
    h = hashlib.sha256()
    for name in ('go.mod', 'go.sum'):
        h.update((GO_DIR / name).read_bytes())
    h.update(repr(sorted(PACKAGES.items())).encode())
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
    go = go_binary()
    log('control plane: building %s from Go modules (tests/cluster/go/go.mod) into %s; this takes several '
        'minutes once per machine' % (', '.join(sorted(PACKAGES)), target))
    t0 = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix='bin.', dir=target.parent))
    env = dict(os.environ, GOFLAGS='-mod=readonly')
    try:
        # One `go build` per binary (the main packages' names collide: etcd's is `v3`), sharing Go's
        # build cache, so the common packages compile once.
        for name, pkg in sorted(PACKAGES.items()):
            t1 = time.monotonic()
            cp = subprocess.run([go, 'build', '-trimpath', '-ldflags=-s -w', '-o', str(staging / name), pkg],
                                cwd=GO_DIR, env=env, capture_output=True, text=True, check=False)
            if cp.returncode != 0:
                raise BuildError('go build %s failed (exit %d):\n%s' % (pkg, cp.returncode, cp.stderr[-4000:]))
            log('control plane: built %s in %.0f s' % (name, time.monotonic() - t1))
        (staging / '.complete').write_text('%s\n' % digest())
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    log('control plane: build took %.0f s' % (time.monotonic() - t0))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--print', action='store_true', help='print the binary directory; fail if not built')
    args = parser.parse_args(argv)
    if args.print:
        if not built():
            print('not built: %s' % bin_dir(), file=sys.stderr)
            return 1
        print(bin_dir())
        return 0
    try:
        print(ensure(log=lambda m: print(m, file=sys.stderr, flush=True)))
    except BuildError as exc:
        print('error: %s' % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
