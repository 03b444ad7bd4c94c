# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""What the host modules that drive a package backend share: how commands run (``module_runner``)
and how an error ends the task (``HostTask``).

    with HostTask(module, 'driver_pin', (pk.PackageError,), report_commands=True) as task:
        task.backend = ...           # an apt or dnf backend, once made
        ...
        module.exit_json(**result)

On leaving the block the backend is closed. An error of ``errors`` ends the task with
``fail_json(msg=str(error))`` (and the backend's ``commands`` so far with ``report_commands``);
an OSError or a SubprocessError with ``fail_json(msg='<name>: <error>')``; anything else goes
through (``exit_json``/``fail_json`` exits included).
"""
from __future__ import annotations

import subprocess
from typing import Any, Optional, Sequence, Tuple, Type

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk

__all__ = ['HostTask', 'module_runner']


class HostTask:
    """The error handling and the backend's lifetime around a host module's work."""

    def __init__(self, module: Any, name: str, errors: Sequence[Type[BaseException]] = (),
                 report_commands: bool = False) -> None:
        self.module = module
        self.name = name
        self.errors: Tuple[Type[BaseException], ...] = tuple(errors)
        self.report_commands = report_commands
        self.backend: Optional[Any] = None

    def __enter__(self) -> 'HostTask':
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        backend, self.backend = self.backend, None
        commands = list(backend.runner.commands) if backend is not None else []
        if backend is not None:
            backend.close()
        if exc is None:
            return False
        if self.errors and isinstance(exc, self.errors):
            extra = {'commands': commands} if self.report_commands else {}
            self.module.fail_json(msg=str(exc), **extra)
        if isinstance(exc, (OSError, subprocess.SubprocessError)):
            self.module.fail_json(msg='%s: %s' % (self.name, exc))
        return False


def module_runner(module: Any, installroot: Optional[str] = None) -> pk.Runner:
    """A package Runner whose commands go through the module's run_command (under `installroot`)."""
    def run(argv: Any, env: Any) -> Tuple[int, str, str]:
        rc, out, err = module.run_command(argv, environ_update=env)
        return rc, out, err
    return pk.Runner(run, installroot)
