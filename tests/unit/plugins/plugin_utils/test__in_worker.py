"""The module arguments an action plugin checks in Ansible's worker: encoded as for a module, then validated."""
from __future__ import annotations

import datetime

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._in_worker import ArgumentError, module_params

SPEC = {'path': {'type': 'path', 'required': True}, 'count': {'type': 'int', 'default': 3},
        'items': {'type': 'list', 'elements': 'dict', 'default': []},
        'mode': {'type': 'str', 'choices': ['a', 'b'], 'default': 'a'}}


def test_defaults_coercion_and_the_module_encoding():
    when = datetime.datetime(2026, 12, 5, 7, 0, 0)
    p = module_params({'path': '~/b.json', 'count': '7', 'items': [{'at': when}]}, SPEC, 'ns.coll.mod')
    assert p['count'] == 7 and p['mode'] == 'a' and not p['path'].startswith('~')
    assert p['items'] == [{'at': '2026-12-05T07:00:00'}]       # what a module process would have read


@pytest.mark.parametrize('args, message', [
    ({'path': 'x', 'nope': 1}, 'Unsupported parameters for (ns.coll.mod) module: nope. Supported parameters include: '),
    ({}, 'missing required arguments: path'),
    ({'path': 'x', 'mode': 'c'}, 'value of mode must be one of: a, b, got: c'),
    ({'path': 'x', 'count': 'many'}, "argument 'count' is of type "),
])
def test_errors_read_as_the_modules(args, message):
    with pytest.raises(ArgumentError) as exc:
        module_params(args, SPEC, 'ns.coll.mod')
    assert str(exc.value).startswith(message), str(exc.value)
