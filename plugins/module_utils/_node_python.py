# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Python a GPU node runs the collection's node-side modules with (gpu_info, kernel_check, kernel_packages,
kernel_boot, driver_*, package_index, node_snapshot...): 3.9 or later (issue 39 item 1).

An older interpreter would fail at the first such module, with a traceback or a SyntaxError, possibly in the
middle of a rollout. Each playbook reads every GPU node's interpreter first (ansible.builtin.setup, its python
facts only; playbooks/tasks/node_python.yml) and refuses, before anything changes, each node this module finds a
problem with, naming the node, its interpreter and version, the requirement and how to name another interpreter.

Controller side only (the filter gpufleet.upgrade.node_python): nothing here runs on a node."""

from __future__ import annotations

import re
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

__all__ = ['MINIMUM', 'NodePythonError', 'version_of', 'problem', 'setup_problem', 'problems']

MINIMUM: Tuple[int, int] = (3, 9)

# What ansible-core's module_utils/basic.py says on a target older than the Python it supports (2.21: 3.9).
_ANSIBLE_MINIMUM = re.compile(r'Current version: (\d+)\.(\d+)(?:\.(\d+))?')
_HOW = ('set ansible_python_interpreter for the host (its host_vars, or the group_vars of the GPU nodes) to a Python '
        '%s or later installed on the node, e.g. ansible_python_interpreter=/usr/bin/python3.11')


class NodePythonError(ValueError):
    """Input that is not a Python version or not a setup result."""


def _dotted(version: Sequence[int]) -> str:
    return '.'.join(str(v) for v in version)


def version_of(version: Any) -> Tuple[int, ...]:
    """(major, minor[, micro]) of a version as Python gives it: sys.version_info or a sequence from it
    (ansible_facts.python.version_info, [3, 8, 18, 'final', 0]), a mapping with major, minor and micro
    (ansible_facts.python.version) or a dotted string ('3.8.18')."""
    if isinstance(version, Mapping):
        parts: List[Any] = [version.get('major'), version.get('minor')]
        if version.get('micro') is not None:
            parts.append(version.get('micro'))
    elif isinstance(version, str):
        parts = list(version.strip().split('.')[:3])
    elif isinstance(version, Sequence):
        parts = list(version[:3])
        # the releaselevel of a two-part sequence ([3, 9, 'final']) is not a micro version
        if len(parts) == 3 and isinstance(parts[2], str) and not parts[2].isdigit():
            parts = parts[:2]
    else:
        raise NodePythonError('Python version: %r is not a version' % (version,))
    out = []
    for p in parts:
        if isinstance(p, bool) or not (isinstance(p, int) or (isinstance(p, str) and p.isdigit())):
            raise NodePythonError('Python version: %r is not a version' % (version,))
        out.append(int(p))
    if len(out) < 2:
        raise NodePythonError('Python version: %r is not a version' % (version,))
    return tuple(out)


def problem(version: Any, node: str = 'the node', interpreter: str = '',
            minimum: Tuple[int, int] = MINIMUM) -> Optional[str]:
    """None when `version` (see version_of) is `minimum` or later; else the message that refuses `node`, naming
    its `interpreter` (the path the module ran with), its version, the requirement and the way out."""
    got = version_of(version)
    if got[:2] >= tuple(minimum):
        return None
    return ('%s: Python %s (%s) is older than the Python %s the collection\'s node-side modules need on every GPU node; '
            % (node, _dotted(got), interpreter or 'the interpreter Ansible found', _dotted(minimum))
            + _HOW % _dotted(minimum) + '.')


def _first_line(text: Any) -> str:
    lines = [ln.strip() for ln in str(text or '').splitlines() if ln.strip()]
    # a traceback's last line says what went wrong (SyntaxError: ...); a message's first line is its summary
    errors = [ln for ln in lines if re.match(r'^[A-Za-z_.]*(Error|Exception)\b', ln)]
    return (errors[-1] if errors else (lines[0] if lines else '')).rstrip('.')


def setup_problem(result: Any, node: str = 'the node', interpreter: str = '',
                  minimum: Tuple[int, int] = MINIMUM) -> Optional[str]:
    """The problem (see problem) with the Python of `node` from the result of ansible.builtin.setup run there
    (gather_subset python, registered with failed_when false). `interpreter` is the host's
    ansible_python_interpreter ('' when Ansible discovers it). A setup that could not run is a problem too: its
    message says what Ansible said (an interpreter too old for Ansible itself, a SyntaxError, no such file)."""
    if not isinstance(result, Mapping):
        raise NodePythonError('setup result of %s: %r is not a task result' % (node, result))
    interpreter = interpreter if isinstance(interpreter, str) else ''
    if interpreter.startswith('auto'):
        interpreter = ''    # auto, auto_silent, auto_legacy...: Ansible discovers it
    facts = result.get('ansible_facts') or {}
    if not isinstance(facts, Mapping):
        facts = {}
    python = facts.get('ansible_python', facts.get('python'))
    discovered = facts.get('discovered_interpreter_python') or ''
    if isinstance(python, Mapping) and python.get('version_info') is not None:
        return problem(python['version_info'], node, str(python.get('executable') or interpreter or discovered),
                       minimum)
    path = str(interpreter or discovered or 'the interpreter Ansible found')
    # what the interpreter printed (a SyntaxError, 'command not found') says more than Ansible's summary of it
    said = _first_line(result.get('module_stderr')) or _first_line(result.get('msg'))
    match = _ANSIBLE_MINIMUM.search(str(result.get('msg') or ''))
    if match:
        # Ansible's own minimum refused it: the version is known, the message is the same as for facts.
        return problem([int(g) for g in match.groups() if g is not None], node, path, minimum)
    if result.get('unreachable'):
        return '%s: unreachable, its Python is not known (%s)' % (node, said or 'no reason given')
    return ('%s: Ansible could not run a Python module with %s (%s); the collection\'s node-side modules need Python %s '
            'or later on every GPU node; ' % (node, path, said or 'no reason given', _dotted(minimum))
            + _HOW % _dotted(minimum) + '.')


def problems(results: Iterable[Any], interpreters: Optional[Mapping[str, Any]] = None,
             minimum: Tuple[int, int] = MINIMUM) -> List[str]:
    """The problems, one a node in the order given, of a looped setup task's `results` (each with its
    `item`, the inventory host it ran on). `interpreters`: host -> its ansible_python_interpreter, if set."""
    if isinstance(results, Mapping):
        results = results.get('results', [results])
    if isinstance(results, (str, bytes)) or not isinstance(results, Iterable):
        raise NodePythonError('setup results: %r are not a list of task results' % (results,))
    interpreters = interpreters or {}
    out = []
    for res in results:
        if not isinstance(res, Mapping):
            raise NodePythonError('setup result: %r is not a task result' % (res,))
        if res.get('skipped'):
            continue
        host = str(res.get('item') or 'the node')
        configured = interpreters.get(host)
        found = setup_problem(res, host, configured if isinstance(configured, str) else '', minimum)
        if found:
            out.append(found)
    return out
