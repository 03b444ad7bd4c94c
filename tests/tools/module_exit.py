"""Run a module's main() in-process in a unit test: exit_json/fail_json raise ModuleExit carrying the
result (a SystemExit, as theirs, so a module's `except Exception` lets it pass)."""
from __future__ import annotations

from typing import Any

from ansible.module_utils import basic


class ModuleExit(SystemExit):
    def __init__(self, result: dict[str, Any], failed: bool) -> None:
        super().__init__(1 if failed else 0)
        self.result = dict(result, failed=failed)


def capture_module_exits(monkeypatch) -> None:
    """Make AnsibleModule.exit_json/fail_json raise ModuleExit for the rest of the test."""
    def exit_json(self, **kw):
        raise ModuleExit(kw, failed=False)

    def fail_json(self, msg, **kw):
        raise ModuleExit(dict(kw, msg=msg), failed=True)
    monkeypatch.setattr(basic.AnsibleModule, 'exit_json', exit_json)
    monkeypatch.setattr(basic.AnsibleModule, 'fail_json', fail_json)
