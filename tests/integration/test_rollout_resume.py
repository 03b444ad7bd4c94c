"""Resumability: the controller is killed (the ansible-runner run cancelled) inside a node's
upgrade, then rollout.yml runs again. It resumes from what the Node records, never drains a node
twice, never uncordons a node that was cordoned before the rollout, and ends with the same verdict
as an uninterrupted run.

The pool is the lab's (tests/tools/labenv.py) with 6 nodes; the approved records are written
directly (the canary playbook is covered by test_lab.py), so the test exercises rollout.yml only.
"""
from __future__ import annotations

import datetime
import pathlib
import shutil
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / 'tests')]

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q  # noqa: E402
from tools import labenv  # noqa: E402
from tools.lab import Lab  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('dpkg-deb') and shutil.which('apt-get')),
                                reason='the lab needs gcc (stand-in NVML) and dpkg/apt (install roots)')

TUPLE_NAMES = {'kernel': 'kernel', 'rke2': 'rke2', 'driver': 'driver', 'gpu_operator': 'gpuOperator',
               'dcgm_exporter': 'dcgmExporter'}


def approved_records(lab: Lab, plan: dict) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    for c in plan['combinations']:
        slug = c['key']['pci_ids'].replace(':', '').replace('/', '-').replace(',', '-')
        record = {'apiVersion': 'kube-dc.io/v1alpha1', 'kind': 'GPUUpgradeQualification', 'id': 'resume-' + slug,
                  'state': 'qualified', 'approvedBy': 'test-approver', 'sourceRevision': 'a' * 40,
                  'hardware': c['key']['pci_ids'].split(','),
                  'target': {TUPLE_NAMES[k]: v for k, v in labenv.TARGET.items()},
                  'canary': {'completedAt': now, 'allocationPassed': True, 'monitoringPassed': True,
                             'rollbackPassed': True, 'evidence': 'resume-test'}}
        (lab.dir / 'qualification' / (slug + '.yaml')).write_text(q.dump_record(record))


def drained(run: dict, node: str) -> list[dict]:
    return [e for e in run['events'] if e['host'] == node and (e['task'] or '').startswith('Drain |')
            and e['event'] == 'runner_on_ok']


def test_cancelled_rollout_resumes_without_draining_twice(tmp_path):
    lab = Lab(tmp_path / 'lab', nodes=6, fault='none', stuck=[], quiet=True)
    lab.dir.mkdir()
    try:
        lab.prepare()
        # gpu-06 was cordoned by someone else before the rollout: it must stay cordoned.
        lab.emu.patch('v1', 'Node', 'gpu-06', {'spec': {'unschedulable': True}})
        plan = lab.plan()
        approved_records(lab, plan)
        victim = plan['batches'][0][0]

        def killed_after_drain(event: dict) -> bool:
            data = event.get('event_data', {})
            return (event.get('event') == 'runner_on_ok' and data.get('host') == victim
                    and (data.get('task') or '').startswith('Drain |'))

        first = lab.play('rollout-killed', 'rollout.yml', cancel_on=killed_after_drain)
        assert first == 'canceled', lab.runs['rollout-killed']
        node = lab.emu.get('v1', 'Node', victim)
        assert node['spec'].get('unschedulable') is True
        # Killed somewhere after the drain (ansible-runner polls its cancel callback): mid-upgrade, not done.
        assert node['metadata']['annotations']['gpufleet.io/upgrade-state'] in (
            'drained', 'snapshotted', 'activated')
        assert 'gpufleet.io/upgraded-to' not in node['metadata']['annotations']
        assert len(drained(lab.runs['rollout-killed'], victim)) == 1
        # What is still on the victim after its drain (the DaemonSet pods), and what was evicted so far.
        left_on_victim = {p['metadata']['name'] for p in lab.emu.list('v1', 'Pod', field_selector='spec.nodeName=' + victim)}
        lab.emu.clear_requests()

        second = lab.play('rollout-resumed', 'rollout.yml')
        assert second == 'successful', lab.runs['rollout-resumed']['failures']
        # The victim was not drained again: its Drain task was skipped and no pod of it was evicted.
        assert drained(lab.runs['rollout-resumed'], victim) == []
        evicted = {r['path'].split('/')[-2] for r in lab.emu.requests
                   if r['verb'] == 'POST' and r['path'].endswith('/eviction')}
        assert not evicted & left_on_victim
        assert not [r for r in lab.emu.mutating_requests() if r['path'].endswith('/nodes/' + victim)
                    and (r.get('body') or {}).get('spec', {}).get('unschedulable') is True], 'cordoned again'
        rows = {r['node']: r for r in lab.node_view()}
        assert all(r['driver'] == labenv.TARGET_DRIVER and r['nvml'] == labenv.TARGET_DRIVER for r in rows.values())
        assert rows['gpu-06']['cordoned'] is True, 'a node cordoned before the rollout was uncordoned'
        assert [n for n, r in rows.items() if r['cordoned']] == ['gpu-06']
    finally:
        lab.stop()
