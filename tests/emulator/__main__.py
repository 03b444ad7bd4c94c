"""`python -m emulator` (run with tests/ on PYTHONPATH; `make emulator` does): a Kubernetes API
emulator in the foreground until interrupted.

    EMULATOR_PORT (default 16443), EMULATOR_KUBECONFIG (default .lab/kubeconfig), or the options.
    --fleet FILE: seed objects from YAML: Kubernetes objects (multi-document, or a List), or
      {generate: {nodes: 50, pods_per_node: 4, gpus: 8}, objects: [...]}.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import signal
import sys
import threading
from typing import Any

import yaml

from . import fixtures
from .emulator import Emulator


def load_fleet(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(objects to apply, generated objects to bulk-load) from a --fleet YAML file."""
    text = pathlib.Path(path).read_text()
    objs: list[dict[str, Any]] = []
    generated: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if isinstance(doc, list):
            objs.extend(doc)
        elif isinstance(doc, dict) and ('generate' in doc or 'objects' in doc) and 'kind' not in doc:
            gen = doc.get('generate') or {}
            if gen:
                allowed = {'nodes', 'pods_per_node', 'gpus', 'prefix', 'gpu_pod_every', 'namespaces'}
                unknown = set(gen) - allowed
                if unknown:
                    raise SystemExit('%s: unknown generate keys %s (allowed: %s)'
                                     % (path, sorted(unknown), sorted(allowed)))
                generated.extend(fixtures.fleet(**gen))
            objs.extend(doc.get('objects') or [])
        elif isinstance(doc, dict):
            objs.append(doc)
        else:
            raise SystemExit('%s: a document must be an object or a list, not %r' % (path, type(doc).__name__))
    return objs, generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m emulator', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, default=int(os.environ.get('EMULATOR_PORT') or 16443))
    parser.add_argument('--kubeconfig', default=os.environ.get('EMULATOR_KUBECONFIG') or '.lab/kubeconfig')
    parser.add_argument('--fleet', help='YAML file of objects to load at start')
    parser.add_argument('--no-simulator', action='store_true', help='pods keep the status they are given')
    args = parser.parse_args(argv)

    objs, generated = load_fleet(args.fleet) if args.fleet else ([], [])
    kubeconfig = os.path.abspath(args.kubeconfig)
    emu = Emulator(port=args.port, kubeconfig_path=kubeconfig, host=args.host, simulate=not args.no_simulator,
                   log_requests=False)
    try:
        emu.start()
    except RuntimeError as exc:
        print('emulator: %s' % exc, file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *args: stop.set())
    signal.signal(signal.SIGINT, lambda *args: stop.set())
    try:
        count = emu.load(generated) + len(objs)
        if objs:
            emu.apply(objs)
        print('Kubernetes API emulator: %s' % emu.url, flush=True)
        print('kubeconfig: %s' % kubeconfig, flush=True)
        if count:
            print('loaded %d objects from %s' % (count, args.fleet), flush=True)
        print('try: kubectl --kubeconfig %s get nodes   (Ctrl-C stops)' % kubeconfig, flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        emu.stop()
    print('emulator stopped', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
