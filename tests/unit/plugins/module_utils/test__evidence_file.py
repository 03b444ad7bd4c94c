"""One update of the evidence bundle file (shared by the evidence module and its action plugin)."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fsio
from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence import EvidenceError
from ansible_collections.gpufleet.upgrade.plugins.module_utils._evidence_file import ARGUMENT_SPEC, update_bundle

GATE = {'name': 'node', 'kind': 'node', 'node': 'gpu-a', 'passed': True}


def params(path, **kw):
    p = {k: v.get('default') for k, v in ARGUMENT_SPEC.items()}
    p.update(path=str(path), **kw)
    return p


def test_creates_then_adds_idempotently_and_reports(tmp_path):
    path, report = tmp_path / 'b.json', tmp_path / 'r.html'
    first = update_bundle(params(path, id='run-1', gates=[GATE], report=str(report)))
    assert first['changed'] is True and first['summary']['gates'] == 1 and first['report'] == str(report)
    assert json.loads(path.read_text())['id'] == 'run-1' and report.read_text().startswith('<!DOCTYPE html>')
    again = update_bundle(params(path, gates=[GATE], report=str(report)), diff=True)
    assert again['changed'] is False and 'bundle' not in again
    assert again['diff']['before'] == again['diff']['after'] == path.read_text()
    whole = update_bundle(params(path, return_bundle=True))
    assert whole['bundle']['gates'][0]['name'] == 'node'


def test_check_mode_writes_nothing_not_even_the_lock(tmp_path):
    path = tmp_path / 'b.json'
    result = update_bundle(params(path, id='run-1', gates=[GATE]), check_mode=True, diff=True)
    assert result['changed'] is True and result['diff']['before'] == ''
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('kw, message', [
    ({'path': '/nonexistent-dir/b.json', 'id': 'x'}, 'evidence: directory /nonexistent-dir of path does not exist'),
    ({'lock_timeout': 0}, 'evidence: lock_timeout 0 must be between 1 and 3600 seconds'),
    ({}, 'evidence: id is required to create the bundle '),
    ({'id': 'x', 'gates': [{'name': 'g'}]}, 'evidence: gates[0] (g).passed is required (true or false)'),
])
def test_bad_input_names_the_field_and_writes_nothing(tmp_path, kw, message):
    p = params(tmp_path / 'b.json')
    p.update(kw)
    with pytest.raises(EvidenceError) as exc:
        update_bundle(p)
    assert str(exc.value).startswith(message)
    assert not (tmp_path / 'b.json').exists()


def test_another_id_and_a_held_lock_and_an_unreadable_file_are_errors(tmp_path):
    path = tmp_path / 'b.json'
    update_bundle(params(path, id='run-1'))
    before = path.read_text()
    with pytest.raises(EvidenceError, match=r"^evidence: id: 'other' does not match the bundle id 'run-1'"):
        update_bundle(params(path, id='other', gates=[GATE]))
    held = _fsio.lock_exclusive(str(path) + '.lock', 1)
    try:
        with pytest.raises(EvidenceError, match=r'^evidence: .*b\.json\.lock is locked by another task for more than 1s'):
            update_bundle(params(path, gates=[GATE], lock_timeout=1))
    finally:
        held.close()
    path.unlink()
    path.mkdir()      # a directory where the bundle should be: the OSError is reported, not raised
    with pytest.raises(EvidenceError, match=r'^evidence: \[Errno 21\] Is a directory'):
        update_bundle(params(path, gates=[GATE]))
    path.rmdir()
    path.write_text(before)
    assert update_bundle(params(path))['changed'] is False
