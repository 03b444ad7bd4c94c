# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unit tests for _host_module: how a host module's errors end the task, and its runner."""
from __future__ import annotations

import subprocess

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import HostTask, module_runner


class Exited(SystemExit):
    pass


class FakeModule:
    def __init__(self):
        self.failed = None
        self.ran = []

    def fail_json(self, **kw):
        self.failed = kw
        raise Exited(1)

    def exit_json(self, **kw):
        raise Exited(0)

    def run_command(self, argv, environ_update=None):
        self.ran.append((argv, environ_update))
        return 0, 'out', ''


class FakeBackend:
    def __init__(self):
        self.closed = False
        self.runner = type('R', (), {'commands': [['apt-get', 'install', 'x']]})()

    def close(self):
        self.closed = True


class UserError(Exception):
    pass


def test_a_listed_error_fails_with_its_message_and_the_commands_and_closes_the_backend():
    m, b = FakeModule(), FakeBackend()
    with pytest.raises(Exited):
        with HostTask(m, 'driver_pin', (UserError,), report_commands=True) as task:
            task.backend = b
            raise UserError('version 1 is not offered')
    assert m.failed == {'msg': 'version 1 is not offered', 'commands': [['apt-get', 'install', 'x']]}
    assert b.closed


def test_without_report_commands_only_the_message_and_before_a_backend_no_commands():
    m = FakeModule()
    with pytest.raises(Exited):
        with HostTask(m, 'kernel_check', (UserError,)):
            raise UserError('no kernel')
    assert m.failed == {'msg': 'no kernel'}
    m = FakeModule()
    with pytest.raises(Exited):
        with HostTask(m, 'driver_pin', (UserError,), report_commands=True):
            raise UserError('bad preset')
    assert m.failed == {'msg': 'bad preset', 'commands': []}


@pytest.mark.parametrize('error', [OSError(13, 'Permission denied'), subprocess.TimeoutExpired(['x'], 5)])
def test_os_and_subprocess_errors_are_prefixed_with_the_module_name(error):
    m, b = FakeModule(), FakeBackend()
    with pytest.raises(Exited):
        with HostTask(m, 'node_snapshot', (UserError,)) as task:
            task.backend = b
            raise error
    assert m.failed == {'msg': 'node_snapshot: %s' % error} and b.closed


def test_exit_and_other_errors_go_through_after_closing():
    m, b = FakeModule(), FakeBackend()
    with pytest.raises(Exited):
        with HostTask(m, 'kernel_boot', (UserError,)) as task:
            task.backend = b
            m.exit_json(changed=False)
    assert m.failed is None and b.closed
    with pytest.raises(KeyError):
        with HostTask(m, 'kernel_boot', (UserError,)):
            raise KeyError('a defect')
    assert m.failed is None


def test_module_runner_runs_through_the_module():
    m = FakeModule()
    runner = module_runner(m, None)
    assert runner(['dpkg-query', '-W']).stdout == 'out'
    assert m.ran == [(['dpkg-query', '-W'], {})] and runner.commands == [['dpkg-query', '-W']]
