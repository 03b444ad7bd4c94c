"""The filters over the gate's core: values, and errors that name the filter."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.filter import pci_id, rke2_version


def test_rke2_version():
    assert rke2_version.rke2_version('v1.36.1+rke2r1') == {'minor': 36, 'patch': 1, 'rev': 1, 'kubernetes': 'v1.36.1'}
    assert rke2_version.rke2_version('1.35.3+rke2r3') == {'minor': 35, 'patch': 3, 'rev': 3, 'kubernetes': 'v1.35.3'}
    assert rke2_version.FilterModule().filters() == {'rke2_version': rke2_version.rke2_version}


@pytest.mark.parametrize('value,message', [
    ('v1.36.1-rc1+rke2r1', '"v1.36.1-rc1+rke2r1" is not a valid RKE2 version: pre-release versions are not allowed'),
    ('v2.0.0+rke2r1', '"v2.0.0+rke2r1" is not a valid RKE2 version: the major version must be 1'),
    ('latest', '"latest" is not a valid RKE2 version: expected v1.MINOR.PATCH+rke2rREV'),
    (None, 'None is not an RKE2 version string (expected v1.MINOR.PATCH+rke2rREV)'),
])
def test_rke2_version_errors_name_the_filter(value, message):
    with pytest.raises(AnsibleFilterError) as err:
        rke2_version.rke2_version(value)
    assert err.value.message == 'gpufleet.upgrade.rke2_version: ' + message


def test_pci_id():
    assert pci_id.pci_id(' 10DE:1DB6/10de:124A\n') == '10de:1db6/10de:124a'
    assert pci_id.FilterModule().filters() == {'pci_id': pci_id.pci_id}


@pytest.mark.parametrize('value,shown', [('10de:1db6', '"10de:1db6"'), ('', '""'), (42, '42')])
def test_pci_id_errors_name_the_filter(value, shown):
    with pytest.raises(AnsibleFilterError) as err:
        pci_id.pci_id(value)
    assert err.value.message == ('gpufleet.upgrade.pci_id: PCI id %s is malformed: expected '
                                 'vendor:device/subvendor:subdevice in hex, e.g. 10de:1db6/10de:124a' % shown)
