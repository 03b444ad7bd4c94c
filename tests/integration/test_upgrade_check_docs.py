"""What users read and copy first: ansible-doc of the gate's plugins, the example inventory, the
example record."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize('kind,name,expect', [
    ('module', 'upgrade_check', ['max_canary_age', 'gpu_operator', 'serialized canary/upgrade plan']),
    ('module', 'qualification_info', ['fail_on_invalid', 'approvedBy']),
    ('filter', 'rke2_version', ['kubernetes', 'pre-release']),
    ('filter', 'pci_id', ['vendor:device/subvendor:subdevice']),
])
def test_ansible_doc_renders(kind, name, expect):
    out = subprocess.run(['ansible-doc', '-t', kind, 'gpufleet.upgrade.' + name], capture_output=True, text=True, check=False,
                         timeout=120, env=dict(os.environ, ANSIBLE_NOCOLOR='1'))
    assert out.returncode == 0, out.stderr
    assert 'gpufleet.upgrade.' + name in out.stdout
    text = ' '.join(out.stdout.split())
    for word in expect:
        assert word in text
    assert 'WARNING' not in out.stderr and 'ERROR' not in out.stderr


def test_example_inventory_parses():
    out = subprocess.run(['ansible-inventory', '-i', str(REPO / 'inventories' / 'example'), '--list'],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'WARNING' not in out.stderr
    inventory = json.loads(out.stdout)
    assert inventory['controller']['hosts'] == ['jump01.example.net']
    assert inventory['gpu_nodes']['children'] == ['gpu_v100', 'gpu_h100']
    hostvars = inventory['_meta']['hostvars']
    assert hostvars['gpu-v100-01.example.net']['gpufleet_pci_ids'] == ['10de:1db6/10de:124a']
    # The target is the plan's and the record is <qualification dir>/<PCI ids>.yaml: no group sets either
    # (review section 2, claim 7: plan, canary and rollout never read them).
    assert not any('gpufleet_target' in v or 'gpufleet_qualification' in v for v in hostvars.values())


def test_example_record_is_valid():
    record, problems = q.validate_record((REPO / 'docs' / 'examples' / 'v100-kernel-canary-1.yaml').read_bytes())
    assert problems == []
    assert record.id == 'v100-kernel-canary-1'
