"""driver_unload with recorded command outputs, declared in test_driver_unload.yaml.

In the spirit of community.general's test_gio_mime.yaml: each case gives the module input, the
host (programs on PATH, loaded modules, processes and the /dev/nvidia* files they hold, built as a
fake /proc tree), the commands the module must run in order with their recorded rc/stdout/stderr
(and what each does to the host: processes that exit, modules that unload), and the expected
result. No kernel module is unloaded and no real process is signalled.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any

import pytest
import yaml
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _unload
from ansible_collections.gpufleet.upgrade.plugins.modules import driver_unload
from tools.module_exit import ModuleExit, capture_module_exits

CASES = yaml.safe_load((pathlib.Path(__file__).with_suffix('.yaml')).read_text())


class FakeHost:
    """A /proc tree and the recorded commands of one case."""

    def __init__(self, root: pathlib.Path, host: dict[str, Any], calls: list[dict[str, Any]]) -> None:
        self.root = root
        self.proc = root / 'proc'
        self.proc.mkdir(parents=True)
        self.bins = set(host.get('bins', []))
        self.modules = list(host.get('modules', []))
        self.signals = {int(k): v for k, v in (host.get('on_signal') or {}).items()}
        self.expected = calls
        self.ran: list[list[str]] = []
        self.signalled: list[tuple[int, str]] = []
        self._write_modules()
        for p in host.get('processes', []):
            self._add_process(p)

    def _write_modules(self) -> None:
        lines = ['%s 1048576 0 - Live 0x0000000000000000 (POE)' % m for m in self.modules]
        (self.proc / 'modules').write_text(''.join(line + '\n' for line in lines))

    def _add_process(self, p: dict[str, Any]) -> None:
        d = self.proc / str(p['pid'])
        (d / 'fd').mkdir(parents=True)
        targets = ['/dev/null', 'socket:[4242]'] + list(p.get('devices', []))
        for i, target in enumerate(targets):
            os.symlink(target, d / 'fd' / str(i))
        (d / 'comm').write_text(p.get('comm', 'proc') + '\n')
        (d / 'cmdline').write_text('\0'.join(p.get('cmdline', p.get('comm', 'proc')).split()) + '\0')
        unit = p.get('unit')
        (d / 'cgroup').write_text('0::/%s\n' % ('system.slice/' + unit if unit else 'user.slice/user-0.slice/session-1.scope'))

    def exit(self, pid: int) -> None:
        shutil.rmtree(self.proc / str(pid), ignore_errors=True)

    def get_bin_path(self, name: str, required: bool = False, opt_dirs: Any = None) -> Any:
        return '/usr/bin/' + name if name in self.bins else None

    def run_command(self, args: Any, check_rc: bool = False, **kwargs: Any) -> tuple[int, str, str]:
        argv = [str(a) for a in args]
        self.ran.append(argv)
        n = len(self.ran)
        assert n <= len(self.expected), 'unexpected command #%d: %r' % (n, argv)
        want = self.expected[n - 1]
        assert argv == want['command'], 'command #%d: got %r, recorded %r' % (n, argv, want['command'])
        then = want.get('then') or {}
        for pid in then.get('exit', []):
            self.exit(pid)
        for mod in then.get('unload', []):
            self.modules.remove(mod)
            self._write_modules()
        return int(want.get('rc', 0)), want.get('out', ''), want.get('err', '')

    def kill(self, pid: int, sig: int) -> None:
        name = 'SIGTERM' if sig == 15 else 'SIGKILL' if sig == 9 else str(sig)
        self.signalled.append((pid, name))
        behaviour = self.signals.get(pid, 'exit')
        if sig == 9 or behaviour == 'exit':
            self.exit(pid)


def run_case(case: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], FakeHost]:
    host = FakeHost(tmp_path, case.get('host') or {}, (case.get('mocks') or {}).get('run_command') or [])
    args = dict(case.get('input') or {})
    args.setdefault('proc_root', str(host.proc))
    if case.get('check_mode'):
        args['_ansible_check_mode'] = True
    if case.get('diff'):
        args['_ansible_diff'] = True

    capture_module_exits(monkeypatch)
    monkeypatch.setattr(basic.AnsibleModule, 'run_command', lambda self, *a, **kw: host.run_command(*a, **kw))
    monkeypatch.setattr(basic.AnsibleModule, 'get_bin_path', lambda self, *a, **kw: host.get_bin_path(*a, **kw))
    monkeypatch.setattr(_unload, 'send_signal', host.kill)
    with patch_module_args(args):
        with pytest.raises(ModuleExit) as exc:
            driver_unload.main()
    return exc.value.result, host


@pytest.mark.parametrize('case', CASES, ids=[c['id'] for c in CASES])
def test_driver_unload(case, tmp_path, monkeypatch):
    result, host = run_case(case, tmp_path, monkeypatch)
    expected = case['output']
    for key, value in expected.items():
        if key == 'msg_contains':
            assert value in result.get('msg', ''), result.get('msg')
        elif key == 'holders_pids':
            assert [h['pid'] for h in result['holders']] == value
        elif key == 'plan_holders':
            assert {k: [h['pid'] for h in result['plan'][k]] for k in value} == value
        elif key == 'signals':
            assert [[p, s] for p, s in host.signalled] == value
        else:
            assert result.get(key) == value, '%s: %s' % (key, json.dumps(result, indent=1, default=str))
    assert len(host.ran) == len(host.expected), 'recorded but not run: %r' % host.expected[len(host.ran):]
    if 'signals' not in expected:
        assert host.signalled == [], 'a process was signalled without kill_holders'
