"""The canary filters: thin wrappers over _qualification_record whose errors are AnsibleFilterError
naming the filter."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.upgrade.plugins.filter import canary as F

AFTER = {'kernel': '6.8.0-135-generic', 'rke2': 'v1.36.1+rke2r1', 'driver': '580.130.00',
         'gpu_operator': 'v26.3.4', 'dcgm_exporter': '4.4.1-4.6.0-ubuntu22.04'}


def test_filters():
    assert F.FilterModule().filters() == {'canary_measured_nodes': F.canary_measured_nodes}


def test_values():
    assert F.canary_measured_nodes('gpu-01', {'node': 'gpu-01', 'outcome': 'upgraded', 'measured': AFTER}) == [
        {'name': 'gpu-01', 'role': 'canary', 'tuple_after': AFTER, 'measured': True, 'verdict': 'upgraded'}]
    assert F.canary_measured_nodes('gpu-01') == []
    assert F.canary_measured_nodes('gpu-01', {'node': 'gpu-01', 'outcome': 'upgraded'}) == []


def test_errors_name_the_filter():
    with pytest.raises(AnsibleFilterError, match=r"^gpufleet.upgrade.canary_measured_nodes: result.measured.kernel: 6 is "
                                                 r"not a string"):
        F.canary_measured_nodes('gpu-01', {'measured': {'kernel': 6}})
