"""Sample GPUUpgradeQualification records and gate tuples (seed 004) for tests and the lab."""
from __future__ import annotations

import copy
import datetime
import typing as t

import yaml

# The record exactly as seed 004 prints it.
SEED_TEXT = """\
apiVersion: kube-dc.io/v1alpha1
kind: GPUUpgradeQualification
id: v100-kernel-canary-1
state: qualified
approvedBy: platform-review
sourceRevision: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
hardware:
  - 10de:1db6/10de:124a
target:
  kernel: 6.8.0-135-generic
  rke2: v1.36.1+rke2r1
  driver: 580.130.00
  gpuOperator: v26.3.4
  dcgmExporter: 4.4.1-4.6.0-ubuntu22.04
canary:
  completedAt: 2026-07-14T12:00:00Z
  allocationPassed: true
  monitoringPassed: true
  rollbackPassed: true
  evidence: change-record-42
"""

SEED_COMPLETED_AT = datetime.datetime(2026, 7, 14, 12, 0, 0, tzinfo=datetime.timezone.utc)
# One day after the seed's canary: inside the default 720h window.
NOW = SEED_COMPLETED_AT + datetime.timedelta(days=1)

PCI_IDS = ['10de:1db6/10de:124a']

# The seed's gate invocation (module-side snake_case keys).
CURRENT = {
    'kernel': '6.8.0-134-generic',
    'rke2': 'v1.35.3+rke2r3',
    'driver': '580.126.20',
    'gpu_operator': 'v26.3.3',
    'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04',
}
TARGET = {
    'kernel': '6.8.0-135-generic',
    'rke2': 'v1.36.1+rke2r1',
    'driver': '580.130.00',
    'gpu_operator': 'v26.3.4',
    'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04',
}

SEED = yaml.safe_load(SEED_TEXT.replace('completedAt: 2026-07-14T12:00:00Z', "completedAt: '2026-07-14T12:00:00Z'"))


def seed_dict(**top: t.Any) -> t.Dict[str, t.Any]:
    """A deep copy of the seed record with top-level fields replaced."""
    data = copy.deepcopy(SEED)
    data.update(top)
    return data


def with_target(data: t.Dict[str, t.Any], **values: t.Any) -> t.Dict[str, t.Any]:
    data['target'].update(values)
    return data


def with_canary(data: t.Dict[str, t.Any], **values: t.Any) -> t.Dict[str, t.Any]:
    data['canary'].update(values)
    return data


def text(data: t.Any) -> str:
    """Plain YAML for a record dict (no validation: tests build broken records with it)."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=4096)


def timestamp(value: datetime.datetime) -> str:
    return value.astimezone(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


# The record's names of the tuple's components (the plan's target uses the module-side names).
TUPLE_NAMES = {'kernel': 'kernel', 'rke2': 'rke2', 'driver': 'driver', 'gpu_operator': 'gpuOperator',
               'dcgm_exporter': 'dcgmExporter'}


def write_approved(directory: t.Any, plan: dict, target: dict, prefix: str, approver: str = 'test-approver') -> None:
    """What canary.yml and the approval leave for a test that runs rollout.yml only: one approved
    qualification record of `target` (module-side names) per combination of `plan`, in `directory`
    (a pathlib.Path, the lab's qualification directory), id and evidence named by `prefix`."""
    from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    for c in plan['combinations']:
        slug = c['key']['pci_ids'].replace(':', '').replace('/', '-').replace(',', '-')
        record = {'apiVersion': 'kube-dc.io/v1alpha1', 'kind': 'GPUUpgradeQualification', 'id': '%s-%s' % (prefix, slug),
                  'state': 'qualified', 'approvedBy': approver, 'sourceRevision': 'a' * 40,
                  'hardware': c['key']['pci_ids'].split(','),
                  'target': {TUPLE_NAMES[k]: v for k, v in target.items()},
                  'canary': {'completedAt': now, 'allocationPassed': True, 'monitoringPassed': True,
                             'rollbackPassed': True, 'evidence': '%s-test' % prefix}}
        (directory / (slug + '.yaml')).write_text(q.dump_record(record))
