"""Fetch the awx.awx collection for the tests, through PyPI only.

awx.awx is not on PyPI by itself, but the `ansible` community package up to 9.x bundles it.
`pip download` that one wheel (no dependencies: it would otherwise pin an older ansible-core) and
extract only `ansible_collections/awx/awx/` under `.venv/awx-collection/`. Cached between runs.

    python tests/tools/awx_collection.py     # prints the collections path to add to ANSIBLE_COLLECTIONS_PATH
"""
from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
ANSIBLE_PACKAGE = 'ansible==9.13.0'  # bundles awx.awx 23.9.0
AWX_VERSION = '23.9.0'
DEFAULT_DEST = REPO_ROOT / '.venv' / 'awx-collection'
PREFIX = 'ansible_collections/awx/awx/'


def ensure(dest: pathlib.Path = DEFAULT_DEST, timeout: int = 300) -> pathlib.Path:
    """Return a collections path holding awx.awx (downloading it once); raise RuntimeError on failure."""
    manifest = dest / 'ansible_collections' / 'awx' / 'awx' / 'MANIFEST.json'
    if manifest.is_file():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary', ':all:',
               '--disable-pip-version-check', '-q', '-d', tmp, ANSIBLE_PACKAGE]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        wheels = glob.glob(os.path.join(tmp, 'ansible-*.whl'))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError('could not download %s from PyPI to get awx.awx: %s'
                               % (ANSIBLE_PACKAGE, (proc.stderr or proc.stdout).strip()[-2000:]))
        staging = pathlib.Path(tmp) / 'x'
        with zipfile.ZipFile(wheels[0]) as zf:
            members = [m for m in zf.namelist() if m.startswith(PREFIX)]
            if not members:
                raise RuntimeError('%s does not bundle awx.awx' % wheels[0])
            zf.extractall(staging, members)
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(dest))
    version = json.loads(manifest.read_text())['collection_info']['version']
    if version != AWX_VERSION:
        raise RuntimeError('expected awx.awx %s in %s, found %s' % (AWX_VERSION, ANSIBLE_PACKAGE, version))
    return dest


if __name__ == '__main__':
    print(ensure())
