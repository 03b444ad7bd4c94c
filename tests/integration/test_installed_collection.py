"""The collection as a platform team runs it (issue 39 item 1; review H5): built with `ansible-galaxy collection
build`, installed with `ansible-galaxy collection install` into a directory of its own, its playbooks started by
FQCN from the operator's working directory with relative paths. Every relative path lands in that working
directory and nothing is written inside the installed collection (a collection's modules run with its
playbooks/ directory as their working directory, so a path handed on as given would land there)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from tools import records
from tools.records import CURRENT, PCI_IDS, TARGET

from ansible_collections.gpufleet.upgrade.plugins.module_utils._plan import digest_of

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent


def _tree(root: pathlib.Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob('*'))}


def _env(collections: pathlib.Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(('ANSIBLE_', 'K8S_AUTH_'))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR='1', ANSIBLE_RETRY_FILES_ENABLED='0')
    return env


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
    """The built collection installed into a directory of its own, as `ansible-galaxy collection install` puts it."""
    base = tmp_path_factory.mktemp('installed')
    env = _env(base / 'collections')  # not the checkout's link, which would count as installed already
    subprocess.run([str(BIN / 'ansible-galaxy'), 'collection', 'build', '--output-path', str(base / 'dist'), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=300, env=env)
    tarball = next((base / 'dist').glob('gpufleet-upgrade-*.tar.gz'))
    subprocess.run([str(BIN / 'ansible-galaxy'), 'collection', 'install', '--offline', '-p', str(base / 'collections'),
                    str(tarball)], check=True, capture_output=True, text=True, timeout=300, env=env)
    root = base / 'collections' / 'ansible_collections' / 'gpufleet' / 'upgrade'
    assert (root / 'playbooks' / 'upgrade_check.yml').is_file() and not (root / 'tests' / 'tools').exists()
    return base / 'collections', root


def test_relative_paths_resolve_in_the_working_directory_not_in_the_installed_collection(installed, tmp_path):
    collections, root = installed
    work = tmp_path / 'ops'  # the operator's working directory, outside the collection
    (work / 'qualification').mkdir(parents=True)
    content = {'target': dict(TARGET), 'combinations': [
        {'id': 'c1', 'key': {'pci_ids': ','.join(PCI_IDS)}, 'source_tuples': [dict(CURRENT)]}]}
    plan = dict(content, digest=digest_of(content))
    (work / 'plan.json').write_text(json.dumps(plan))
    records.write_approved(work / 'qualification', plan, TARGET, 'installed')
    (work / 'inventory.yml').write_text(yaml.safe_dump({'all': {'hosts': {'localhost': {
        'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable}}}}))
    before = _tree(root)
    env = _env(collections)
    run = subprocess.run([str(BIN / 'ansible-playbook'), 'gpufleet.upgrade.upgrade_check', '-i', 'inventory.yml',
                          '-e', 'gpufleet_plan_file=plan.json', '-e', 'gpufleet_qualification_dir=qualification',
                          '-e', 'gpufleet_evidence=rollout.json', '-e', 'gpufleet_max_canary_age=720h'],
                         cwd=str(work), env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert 'PASS' in run.stdout
    # The gate's evidence went to the working directory...
    bundle = json.loads((work / 'rollout.json').read_text())
    assert bundle, bundle
    # ...and nothing was written inside the installed collection.
    assert _tree(root) == before
    assert not list(root.rglob('plan.json')) and not list(root.rglob('rollout.json'))
