"""A node's server platform (issue 39 item 9): label, else instance type, else the machine's DMI identity, else
`unknown` - one decision, `_platform.node_platform`; the DMI fields read on the node (`read_dmi`)."""
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _platform as P

SMC = {'sys_vendor': 'Supermicro', 'product_name': 'SYS-821GE-TNHR', 'board_vendor': 'Supermicro',
       'board_name': 'X13DEG-OAD'}


def dmi_tree(root, **fields):
    base = root / 'class' / 'dmi' / 'id'
    base.mkdir(parents=True)
    for name, text in fields.items():
        (base / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(root)


@pytest.mark.parametrize('labels,dmi,platform', [
    ({'gpufleet.io/platform': 'dgx-h100', 'node.kubernetes.io/instance-type': 'p5.48xlarge'}, SMC, 'dgx-h100'),
    ({'node.kubernetes.io/instance-type': 'p5.48xlarge'}, SMC, 'p5.48xlarge'),
    ({}, SMC, 'Supermicro SYS-821GE-TNHR'),
    ({'gpufleet.io/platform': ' ', 'node.kubernetes.io/instance-type': ''}, SMC, 'Supermicro SYS-821GE-TNHR'),
    ({}, None, 'unknown'),
    ({}, {}, 'unknown'),
    (None, None, 'unknown'),
    ({'gpufleet.io/platform': 'dgx-h100'}, None, 'dgx-h100'),
])
def test_node_platform_is_label_then_instance_type_then_dmi_then_unknown(labels, dmi, platform):
    assert P.node_platform(labels, dmi) == platform


@pytest.mark.parametrize('dmi,platform', [
    (SMC, 'Supermicro SYS-821GE-TNHR'),
    # the product name already says the vendor: not repeated
    ({'sys_vendor': 'Supermicro', 'product_name': 'supermicro SYS-821GE'}, 'supermicro SYS-821GE'),
    ({'sys_vendor': 'Dell Inc.', 'product_name': 'PowerEdge XE9680'}, 'Dell Inc. PowerEdge XE9680'),
    ({'sys_vendor': 'HPE', 'product_name': 'ProLiant  XD670\tGen11 '}, 'HPE ProLiant XD670 Gen11'),
    # a whitebox board: the system fields are placeholders, the board names the machine
    ({'sys_vendor': 'To Be Filled By O.E.M.', 'product_name': 'To Be Filled By O.E.M.',
      'board_vendor': 'ASRockRack', 'board_name': 'ROMED8-2T'}, 'ASRockRack ROMED8-2T'),
    ({'sys_vendor': 'Default string', 'product_name': 'SYS-4029GP-TRT'}, 'SYS-4029GP-TRT'),
    ({'sys_vendor': 'Supermicro', 'product_name': 'System Product Name', 'board_vendor': None,
      'board_name': 'X11DPG-OT-CPU'}, 'X11DPG-OT-CPU'),
    ({'sys_vendor': 'Supermicro', 'product_name': None, 'board_vendor': None, 'board_name': None}, None),
    ({'product_name': 'Default string', 'board_name': 'Default string'}, None),
    ({'product_name': 7}, None),
    ('Supermicro SYS-821GE', None),
    (None, None),
])
def test_dmi_platform_names_the_machine_or_nothing(dmi, platform):
    assert P.dmi_platform(dmi) == platform


def test_distinct_dmi_identities_are_distinct_platforms_not_unknown():
    """The bug: on bare metal without labels every node was `unknown`, two server platforms one combination."""
    a = P.node_platform({'kubernetes.io/hostname': 'gpu-01'}, SMC)
    b = P.node_platform({'kubernetes.io/hostname': 'gpu-02'}, {'sys_vendor': 'Dell Inc.', 'product_name': 'PowerEdge XE9680'})
    assert a != b and 'unknown' not in (a, b)


def test_read_dmi_from_a_sysfs_tree(tmp_path):
    root = dmi_tree(tmp_path, sys_vendor='Supermicro\n', product_name='SYS-821GE-TNHR\n', board_vendor='Supermicro\n',
                    board_name='X13DEG-OAD\n')
    assert P.read_dmi(root) == SMC
    assert P.node_platform({}, P.read_dmi(root)) == 'Supermicro SYS-821GE-TNHR'


def test_read_dmi_unreadable_fields_are_none(tmp_path):
    root = dmi_tree(tmp_path, sys_vendor='\n', product_name=b'SYS-\xff821GE\n')
    (tmp_path / 'class' / 'dmi' / 'id' / 'board_name').mkdir()          # not a file
    got = P.read_dmi(root)
    assert got == {'sys_vendor': None, 'product_name': 'SYS-\ufffd821GE', 'board_vendor': None, 'board_name': None}
    assert P.read_dmi(str(tmp_path / 'no-such-sys')) == dict.fromkeys(P.DMI_FIELDS)


@pytest.mark.skipif(os.geteuid() == 0, reason='root reads a mode 000 file')
def test_read_dmi_a_file_without_read_permission_is_none(tmp_path):
    root = dmi_tree(tmp_path, product_name='SYS-821GE-TNHR\n')
    path = tmp_path / 'class' / 'dmi' / 'id' / 'product_name'
    path.chmod(0)
    try:
        assert P.read_dmi(root)['product_name'] is None
    finally:
        path.chmod(0o644)
