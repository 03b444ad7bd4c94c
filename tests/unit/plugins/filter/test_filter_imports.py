"""Every Ansible worker that evaluates one of the collection's filters outside the rollout's batch play
imports every filter file of the collection (Jinja's plugin loader, for an FQCN filter). Loading them must
not bring in the Kubernetes HTTP client (urllib3, through _k8s): docs/scale.md, issue 18."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

FILTERS = pathlib.Path(__file__).resolve().parents[4] / 'plugins' / 'filter'


def test_loading_every_filter_imports_no_http_client():
    names = sorted(p.stem for p in FILTERS.glob('*.py'))
    assert 'rollout' in names and len(names) > 5
    code = ('import importlib, json, sys\n'
            'for name in %r:\n'
            '    importlib.import_module("ansible_collections.gpufleet.upgrade.plugins.filter." + name)\n'
            'print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "urllib3" or m.endswith("._k8s"))))\n'
            % (names,))
    out = subprocess.run([sys.executable, '-c', code], check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert json.loads(out.stdout) == []
