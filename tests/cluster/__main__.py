"""`make cluster`: run the test control plane in the foreground (Ctrl-C stops it).

    python -m cluster --kubeconfig .cluster/kubeconfig [--workdir .cluster/state] [--fleet file.yml]

Writes a kubeconfig for the modules (an administrator token through the fault proxy) to
--kubeconfig, the setup identity's (a system:masters client certificate) beside it as
`admin.kubeconfig`, and optionally applies the objects of a YAML file (a fleet).
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import signal
import sys
import threading

import yaml

from . import start_cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m cluster', description=__doc__.splitlines()[0])
    parser.add_argument('--kubeconfig', default='.cluster/kubeconfig')
    parser.add_argument('--workdir', default=None, help='state directory (default: beside the kubeconfig)')
    parser.add_argument('--fleet', default=None, help='a YAML file of objects to apply at start')
    args = parser.parse_args(argv)
    kubeconfig = pathlib.Path(args.kubeconfig).resolve()
    workdir = pathlib.Path(args.workdir).resolve() if args.workdir else kubeconfig.parent / 'state'
    if workdir.exists():
        shutil.rmtree(workdir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    cp, proxy, cluster = start_cluster(workdir, log=lambda m: print(m, flush=True))
    try:
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cluster.kubeconfig, kubeconfig)
        kubeconfig.chmod(0o600)
        shutil.copyfile(cluster.admin_kubeconfig, kubeconfig.parent / 'admin.kubeconfig')
        if args.fleet:
            docs = [d for d in yaml.safe_load_all(pathlib.Path(args.fleet).read_text()) if d]
            cluster.apply(docs)
            print('applied %d objects from %s' % (len(docs), args.fleet), flush=True)
        print('kubeconfig: %s (admin: %s); Ctrl-C stops the control plane' % (
            kubeconfig, kubeconfig.parent / 'admin.kubeconfig'), flush=True)
        stop.wait()
    finally:
        proxy.stop()
        cp.stop()
        print('control plane stopped', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
