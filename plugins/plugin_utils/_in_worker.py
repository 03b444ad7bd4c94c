# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Controller side only.
"""A module's work done inside Ansible's worker by its action plugin (evidence, gpu_gate, and the Kubernetes
modules delegated to the controller), with the module's arguments exactly as the module would receive and
check them.

The task's arguments go through Ansible's module encoding (what a module process would read: a date becomes
its ISO text, and so on), then through the module's argument spec. A validation error reads as the module's
would (AnsibleModule reports the first one).

`WorkerK8sModule` runs a Kubernetes module's own code (its `run(module)`) in the worker: the same argument
spec, checks, requests, messages and result as the module process, without a Python start-up per call (a
rollout records a node's phases some thirty times). `K8sInWorker` is the action plugin that chooses: in the
worker when the module would run on this machine as this user (a local connection without become, the
controller's Python able to import what the module needs), the module process otherwise."""
from __future__ import annotations

import importlib
import json
import os
import typing as t

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.json import Direction, get_module_encoder
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.upgrade.plugins.module_utils._k8s_module import K8sModule, k8s_argument_spec

display = Display()


class ArgumentError(ValueError):
    """The task's arguments fail the module's argument spec; the message is the module's."""


def module_params(args: t.Mapping[str, t.Any], argument_spec: t.Dict[str, t.Any], module: str) -> t.Dict[str, t.Any]:
    """The validated parameters (defaults filled in, types coerced) of the task arguments `args` for the module
    named `module` with `argument_spec`; raises ArgumentError."""
    return checked_params(args, argument_spec, module)[0]


def checked_params(args: t.Mapping[str, t.Any], argument_spec: t.Dict[str, t.Any], module: str,
                   **checks: t.Any) -> t.Tuple[t.Dict[str, t.Any], t.Set[str]]:
    """(validated parameters, the values of its no_log options) as `module_params`; `checks` are
    AnsibleModule's (mutually_exclusive, required_if, ...)."""
    encoded = json.loads(json.dumps(dict(args), cls=get_module_encoder('legacy', Direction.CONTROLLER_TO_MODULE)))
    validation = ArgumentSpecValidator(argument_spec, **checks).validate(encoded)
    if validation.errors.errors:
        msg = validation.errors.msg
        if isinstance(validation.errors.errors[0], UnsupportedError):
            msg = 'Unsupported parameters for (%s) module: %s' % (module, msg)
        raise ArgumentError(msg)
    return validation.validated_parameters, set(validation._no_log_values)


class WorkerExit(BaseException):
    """exit_json or fail_json of a module run in the worker; `result` is the module's result. A BaseException,
    as the SystemExit of a module process is, so that K8sModule.errors() lets it pass."""

    def __init__(self, result: t.Dict[str, t.Any]) -> None:
        super().__init__(result.get('msg', ''))
        self.result = result


class WorkerK8sModule(K8sModule):
    """A K8sModule whose parameters come from the task's arguments and whose exit_json and fail_json raise
    WorkerExit with the result, its no_log values masked as AnsibleModule masks them. Nothing process-wide
    is read or set (AnsibleModule.__init__ is not called: no stdin, no locale, no syslog line)."""

    # pylint: disable-next=super-init-not-called
    def __init__(self, name: str, argument_spec: t.Mapping[str, t.Dict[str, t.Any]], args: t.Mapping[str, t.Any],
                 check_mode: bool = False, diff: bool = False, invocation: bool = False, count_requests: bool = False,
                 supports_check_mode: bool = True, **checks: t.Any) -> None:
        self.module_name = name
        self.invocation = invocation
        self.count_requests = count_requests
        self._client = None
        self.check_mode = check_mode
        self._diff = diff
        self.no_log_values: t.Set[str] = set()
        self.params: t.Dict[str, t.Any] = {}
        self.warnings: t.List[str] = []
        if check_mode and not supports_check_mode:
            self.exit_json(skipped=True, msg='remote module (%s) does not support check mode' % name)
        try:
            self.params, self.no_log_values = checked_params(args, k8s_argument_spec(argument_spec),
                                                             'gpufleet.upgrade.%s' % name, **checks)
        except ArgumentError as exc:
            self.fail_json(msg=str(exc))
        self.mask_url_credentials()

    def warn(self, warning: str) -> None:  # pylint: disable=arguments-differ
        self.warnings.append(warning)

    def exit_json(self, **kwargs: t.Any) -> t.NoReturn:
        raise WorkerExit(self._masked(kwargs))

    def fail_json(self, msg: str, **kwargs: t.Any) -> t.NoReturn:  # pylint: disable=arguments-differ
        trace = kwargs.pop('exception', None)
        if trace:
            display.vvv('%s: %s' % (self.module_name, trace))
        kwargs.update(failed=True, msg=msg)
        raise WorkerExit(self._masked(kwargs))

    def _masked(self, result: t.Dict[str, t.Any]) -> t.Dict[str, t.Any]:
        if self.warnings:
            result['warnings'] = list(self.warnings)
        if self.invocation and self.params:
            result.setdefault('invocation', {'module_args': self.params})
        return t.cast(t.Dict[str, t.Any], remove_values(result, self.no_log_values))


class K8sInWorker(ActionBase):
    """The action plugin of a Kubernetes module (a subclass sets NAME, the module's short name) whose file has
    OPTIONS (its own options), run(module) and, where it has them, CHECKS (K8sModule's keywords): in the worker
    when it runs here (see the module docstring), the module process otherwise."""

    TRANSFERS_FILES = False
    NAME = ''

    def load(self) -> t.Any:
        """The module's file, imported on the controller (ImportError: its libraries are missing here)."""
        return importlib.import_module('ansible_collections.gpufleet.upgrade.plugins.modules.%s' % self.NAME)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        fqcn = 'gpufleet.upgrade.%s' % self.NAME
        loaded = None
        if runs_here(self):
            try:
                loaded = self.load()
            except ImportError as exc:      # urllib3 or PyYAML missing in the controller's Python
                display.vvv('%s runs as a module process: %s' % (fqcn, exc))
        if loaded is None:
            result.update(self._execute_module(module_name=fqcn, module_args=self._task.args, task_vars=task_vars))
            return result
        environment: t.Dict[str, t.Any] = {}
        self._compute_environment_string(environment)     # what the module process would see
        os.environ.update({str(k): str(v) for k, v in environment.items()})    # this worker runs one task
        outcome: t.Dict[str, t.Any] = {'failed': True, 'msg': '%s ended without a result' % fqcn}
        try:
            loaded.run(WorkerK8sModule(self.NAME, loaded.OPTIONS, self._task.args,
                                       check_mode=bool(self._task.check_mode), diff=bool(self._task.diff),
                                       invocation=inject_invocation(task_vars), **getattr(loaded, 'CHECKS', {})))
        except WorkerExit as done:
            outcome = done.result
        for warning in outcome.pop('warnings', []) if isinstance(outcome.get('warnings'), list) else []:
            display.warning(warning)
        result.update(outcome)
        return result


def inject_invocation(task_vars: t.Optional[t.Dict[str, t.Any]]) -> bool:
    """Whether a module's result carries its arguments (masked): ansible-core 2.21's INJECT_INVOCATION; before
    it, every module result did."""
    try:
        return bool(C.config.get_config_value('INJECT_INVOCATION', variables=task_vars or {}))
    except AnsibleError:        # ansible-core before 2.21: no such setting
        return True


def runs_here(action: ActionBase) -> bool:
    """The task's module would run on this machine as this user: a local connection without become."""
    # pylint: disable=protected-access
    return getattr(action._connection, 'transport', None) == 'local' and not action._play_context.become
