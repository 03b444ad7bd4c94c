"""PCI ids: trimming, case folding, validation, comma-separated items, duplicates."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _pci

MALFORMED = '%s is malformed: expected vendor:device/subvendor:subdevice in hex, e.g. 10de:1db6/10de:124a'


@pytest.mark.parametrize('text,normal', [
    ('10de:1db6/10de:124a', '10de:1db6/10de:124a'),
    ('10DE:1DB6/10DE:124A', '10de:1db6/10de:124a'),
    ('  10de:2330/10de:16C1\n', '10de:2330/10de:16c1'),
])
def test_normalize(text, normal):
    assert _pci.normalize(text) == normal
    assert _pci.is_valid(text)


@pytest.mark.parametrize('text', ['10de:1db6', '10de:1db6/10de', '10de:1db6/10de:124a/x', '10de1db6/10de124a',
                                  '10de:1db6/10de:12 4a', 'g0de:1db6/10de:124a', '10de:1db6/10de:124a,', '',
                                  '１０de:1db6/10de:124a'])
def test_normalize_refuses(text):
    with pytest.raises(ValueError) as err:
        _pci.normalize(text)
    assert str(err.value) == 'PCI id ' + MALFORMED % _pci.show(text)
    assert not _pci.is_valid(text)


def test_normalize_refuses_non_strings():
    with pytest.raises(ValueError) as err:
        _pci.normalize(0x10de)
    assert str(err.value) == 'PCI id ' + MALFORMED % '4318'


def test_split_items():
    assert _pci.split_items(['a,b', 'c']) == ['a', 'b', 'c']
    assert _pci.split_items('a, b') == ['a', ' b']
    assert _pci.split_items(None) == [None]
    assert _pci.split_items([]) == []


def test_normalize_all_sorted_unique_with_problems():
    ids, problems = _pci.normalize_all(['10de:2330/10de:16c1, 10DE:1DB6/10de:124a', '10de:1db6/10de:124a', 'x'],
                                       prefix='record ')
    assert ids == ['10de:1db6/10de:124a', '10de:2330/10de:16c1']
    assert problems == ['record PCI id "10de:1db6/10de:124a" is listed more than once',
                        'record PCI id ' + MALFORMED % '"x"']


def test_duplicates_reported_once():
    ids, problems = _pci.normalize_all(['10de:1db6/10de:124a'] * 3)
    assert ids == ['10de:1db6/10de:124a']
    assert problems == ['PCI id "10de:1db6/10de:124a" is listed more than once']
