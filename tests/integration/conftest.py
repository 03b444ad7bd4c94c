"""Integration fixtures: drive playbooks through ansible-runner and read its events."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
from typing import Any, Callable

import pytest
import yaml

from tools import zipimport_cache

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class PlaybookRun:
    rc: int
    status: str
    events: list[dict[str, Any]]
    stdout: str

    def task_results(self, task: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        """`res` of every runner_on_ok/failed/skipped event, optionally for one task name."""
        out = []
        for ev in self.events:
            if not ev.get('event', '').startswith('runner_on_'):
                continue
            if event and ev['event'] != event:
                continue
            data = ev.get('event_data', {})
            if task is not None and data.get('task') != task:
                continue
            res = dict(data.get('res') or {})
            res['_event'] = ev['event']
            res['_host'] = data.get('host')
            out.append(res)
        return out

    def result(self, task: str) -> dict[str, Any]:
        found = self.task_results(task)
        assert found, 'task %r did not run; tasks seen: %s' % (
            task, sorted({e.get('event_data', {}).get('task') for e in self.events if e.get('event_data', {}).get('task')}))
        return found[-1]


@pytest.fixture
def run_playbook(tmp_path: pathlib.Path) -> Callable[..., PlaybookRun]:
    """Run a playbook (a path, or a list of plays to write) with ansible-runner.

    Uses a localhost inventory with the venv's interpreter unless `inventory` is given.
    """
    import ansible_runner

    counter = {'n': 0}

    def _run(playbook: str | os.PathLike[str] | list[dict[str, Any]], extravars: dict[str, Any] | None = None,
             inventory: str | dict[str, Any] | None = None, envvars: dict[str, str] | None = None,
             cmdline: str | None = None, timeout: int = 600) -> PlaybookRun:
        counter['n'] += 1
        pdd = tmp_path / ('runner-%d' % counter['n'])
        (pdd / 'project').mkdir(parents=True)
        if isinstance(playbook, list):
            pb = pdd / 'project' / 'site.yml'
            pb.write_text(yaml.safe_dump(playbook, sort_keys=False))
            playbook_path = str(pb)
        else:
            playbook_path = str(pathlib.Path(playbook).resolve())
        if inventory is None:
            inventory = {'all': {'hosts': {'localhost': {
                'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable}}}}
        env = {
            'ANSIBLE_COLLECTIONS_PATH': os.environ['ANSIBLE_COLLECTIONS_PATH'],
            'ANSIBLE_NOCOLOR': '1',
            'ANSIBLE_RETRY_FILES_ENABLED': '0',
            'ANSIBLE_PYTHON_INTERPRETER': sys.executable,
            'PATH': os.environ['PATH'],
        }
        env.update(zipimport_cache.env())      # module processes keep their compiled module_utils (issue 36)
        env.update(envvars or {})
        events: list[dict[str, Any]] = []
        r = ansible_runner.run(
            private_data_dir=str(pdd), playbook=playbook_path, inventory=inventory,
            extravars=extravars or {}, envvars=env, quiet=True, cmdline=cmdline,
            event_handler=lambda ev: events.append(ev) or True, timeout=timeout,
        )
        stdout = r.stdout.read() if r.stdout else ''
        return PlaybookRun(rc=r.rc, status=r.status, events=events, stdout=stdout)

    return _run
