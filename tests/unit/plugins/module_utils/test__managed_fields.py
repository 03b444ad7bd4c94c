"""Who set a field, from metadata.managedFields (issue 37 items 2 and 4)."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _managed_fields as M

PATH = ('spec', 'unschedulable')


def entry(manager, fields, operation='Update', time='2026-12-06T10:00:00Z', **extra):
    return dict({'manager': manager, 'operation': operation, 'time': time, 'fieldsType': 'FieldsV1',
                 'fieldsV1': fields}, **extra)


def obj(*entries):
    return {'metadata': {'name': 'n', 'managedFields': list(entries)}, 'spec': {'unschedulable': True}}


def test_the_owner_of_a_field_with_its_operation_and_time():
    o = obj(entry('kubelet', {'f:status': {'f:conditions': {}}}, subresource='status'),
            entry('kube-controller-manager', {'f:spec': {'f:taints': {}}}),
            entry('gpufleet.upgrade', {'f:metadata': {'f:annotations': {}}, 'f:spec': {'f:unschedulable': {}}}))
    assert M.owners(o, PATH) == [{'manager': 'gpufleet.upgrade', 'operation': 'Update', 'time': '2026-12-06T10:00:00Z'}]
    assert M.owned_only_by(o, PATH, M.FIELD_MANAGER) is True
    assert M.owned_only_by(o, PATH, 'kubectl-cordon') is False
    assert M.describe(M.owners(o, PATH)) == 'gpufleet.upgrade (Update, 2026-12-06T10:00:00Z)'


@pytest.mark.parametrize('o', [
    {'metadata': {}},
    {'metadata': {'managedFields': None}},
    {'metadata': {'managedFields': 'garbage'}},
    {},
    obj(entry('x', {'f:spec': {'f:taints': {}}})),
    obj(entry('x', {'f:spec': None})),
    obj(entry('kubelet', {'f:spec': {'f:unschedulable': {}}}, subresource='status')),   # a subresource's
    obj('not an entry'),
], ids=['no-fields', 'null', 'not-a-list', 'no-metadata', 'another-field', 'null-spec', 'status', 'bad-entry'])
def test_no_owner(o):
    assert M.owners(o, PATH) == []
    assert M.owned_only_by(o, PATH, M.FIELD_MANAGER) is False


def test_co_owned_is_not_owned_only_by_one():
    o = obj(entry('gpufleet.upgrade', {'f:spec': {'f:unschedulable': {}}}),
            entry('ops', {'f:spec': {'f:unschedulable': {}}}, operation='Apply', time=None))
    assert M.owned_only_by(o, PATH, M.FIELD_MANAGER) is False
    assert M.describe(M.owners(o, PATH)) == 'gpufleet.upgrade (Update, 2026-12-06T10:00:00Z), ops (Apply)'
    assert M.describe([{'manager': None}]) == '(no manager)'
