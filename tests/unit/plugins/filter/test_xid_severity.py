from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.filter.xid_severity import FilterModule, xid_severity


@pytest.mark.parametrize('value, severity', [
    (79, 'critical'), ('48', 'critical'), (119, 'high'), (13, 'medium'), (63, 'low'), (999, 'unknown'),
    ({'code': 95, 'pci': '0000:17:00'}, 'critical'),
])
def test_xid_severity(value, severity):
    assert xid_severity(value) == severity
    assert FilterModule().filters()['xid_severity'] is xid_severity


@pytest.mark.parametrize('value, message', [
    ('seventy-nine', "gpufleet.upgrade.xid_severity: 'seventy-nine' is not an Xid code (a non-negative integer)"),
    (-1, 'gpufleet.upgrade.xid_severity: -1 is not an Xid code (a non-negative integer)'),
    (None, 'gpufleet.upgrade.xid_severity: expected an Xid code or an Xid event, got None'),
    (True, 'gpufleet.upgrade.xid_severity: expected an Xid code or an Xid event, got True'),
    ({'pci': '0000:17:00'}, "gpufleet.upgrade.xid_severity: expected an Xid code or an Xid event, got {'pci': '0000:17:00'}"),
])
def test_xid_severity_rejects_non_codes(value, message):
    with pytest.raises(AnsibleFilterError) as err:
        xid_severity(value)
    assert str(err.value) == message
