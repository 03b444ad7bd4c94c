"""The orchestration playbooks parse (ansible-playbook --syntax-check, roles and argument specs
loaded) and their roles' argument specs stay in lockstep with their defaults."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
PLAYBOOKS = ['plan', 'preflight', 'canary', 'approve', 'upgrade_check', 'rollout', 'rollback', 'postflight', 'release']
ROLES = ['preflight', 'canary', 'node_upgrade', 'rollback', 'postflight']


@pytest.mark.parametrize('name', PLAYBOOKS)
def test_playbook_syntax(name):
    bindir = pathlib.Path(sys.executable).parent
    env = dict(os.environ, PATH=str(bindir) + os.pathsep + os.environ.get('PATH', ''))
    out = subprocess.run([str(bindir / 'ansible-playbook'), '--syntax-check', '-i', 'localhost,',
                          str(REPO / 'playbooks' / ('%s.yml' % name))], capture_output=True, text=True, env=env,
                         check=False, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'playbook: ' in out.stdout


@pytest.mark.parametrize('role', ROLES)
def test_role_defaults_and_argument_specs_in_lockstep(role):
    base = REPO / 'roles' / role
    defaults = yaml.safe_load((base / 'defaults' / 'main.yml').read_text())
    options = yaml.safe_load((base / 'meta' / 'argument_specs.yml').read_text())['argument_specs']['main']['options']
    assert sorted(defaults) == sorted(options)
    assert all(k.startswith(role + '_') for k in options)
    assert (base / 'tasks' / 'preflight.yml').is_file()
    tasks = (base / 'tasks' / 'main.yml').read_text()
    assert 'ansible.builtin.shell' not in tasks and 'changed_when: true' not in tasks


def test_no_prompts_in_playbooks():
    for name in PLAYBOOKS:
        assert 'vars_prompt' not in (REPO / 'playbooks' / ('%s.yml' % name)).read_text()
