# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Controller side only.
"""A module's work done inside Ansible's worker by its action plugin (evidence, gpu_gate), with the module's
arguments exactly as the module would receive and check them.

The task's arguments go through Ansible's module encoding (what a module process would read: a date becomes
its ISO text, and so on), then through the module's argument spec. A validation error reads as the module's
would (AnsibleModule reports the first one)."""
from __future__ import annotations

import json
import typing as t

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.json import Direction, get_module_encoder
from ansible.module_utils.errors import UnsupportedError


class ArgumentError(ValueError):
    """The task's arguments fail the module's argument spec; the message is the module's."""


def module_params(args: t.Mapping[str, t.Any], argument_spec: t.Dict[str, t.Any], module: str) -> t.Dict[str, t.Any]:
    """The validated parameters (defaults filled in, types coerced) of the task arguments `args` for the module
    named `module` with `argument_spec`; raises ArgumentError."""
    encoded = json.loads(json.dumps(dict(args), cls=get_module_encoder('legacy', Direction.CONTROLLER_TO_MODULE)))
    validation = ArgumentSpecValidator(argument_spec).validate(encoded)
    if validation.errors.errors:
        msg = validation.errors.msg
        if isinstance(validation.errors.errors[0], UnsupportedError):
            msg = 'Unsupported parameters for (%s) module: %s' % (module, msg)
        raise ArgumentError(msg)
    return validation.validated_parameters
