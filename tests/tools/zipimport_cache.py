"""The environment that turns on the bytecode cache of tests/tools/zipimport_cache/sitecustomize.py (issue 36) for
the playbooks the tests and the lab run: its directory first on PYTHONPATH and the cache under the venv
(`.venv/zipimport-cache`, gone with the venv). GPUFLEET_ZIPIMPORT_CACHE=off in the environment turns it off."""
from __future__ import annotations

import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def env() -> dict[str, str]:
    setting = os.environ.get('GPUFLEET_ZIPIMPORT_CACHE', '')
    if setting == 'off':
        return {}
    cache = setting or str(pathlib.Path(sys.prefix) / 'zipimport-cache')
    path = [str(HERE / 'zipimport_cache')] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
    return {'PYTHONPATH': os.pathsep.join(path), 'GPUFLEET_ZIPIMPORT_CACHE': cache}
