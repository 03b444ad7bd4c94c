"""A command runner that replays recorded command outputs (unit tests only).

Each expected call is `{'argv': [...], 'rc': 0, 'out': '', 'err': ''}`; calls must come in the
recorded order with exactly the recorded argv, so a test fails on any unexpected command.
`which` answers from a set of program names that "exist" on the recorded host.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpuhost import CommandResult, Runner


class RecordedRunner(Runner):
    def __init__(self, calls: Iterable[dict[str, Any]], programs: Iterable[str] = ()) -> None:
        self.expected = list(calls)
        self.programs = set(programs)
        self.calls: list[list[str]] = []

    def which(self, name: str) -> Optional[str]:
        return '/usr/bin/' + name if name in self.programs else None

    def run(self, argv: Sequence[str], timeout: Optional[int] = None) -> CommandResult:
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        n = len(self.calls)
        assert n <= len(self.expected), 'unexpected command #%d: %r (recorded: %d)' % (n, argv, len(self.expected))
        want = self.expected[n - 1]
        assert argv == [str(a) for a in want['argv']], 'command #%d: got %r, recorded %r' % (n, argv, want['argv'])
        return CommandResult(int(want.get('rc', 0)), want.get('out', ''), want.get('err', ''))

    def assert_done(self) -> None:
        assert len(self.calls) == len(self.expected), 'commands run: %r; recorded but not run: %r' % (
            self.calls, self.expected[len(self.calls):])
