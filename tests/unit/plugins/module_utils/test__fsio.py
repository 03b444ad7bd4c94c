# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unit tests for _fsio: read-if-exists, the atomic write, the lock."""
from __future__ import annotations

import fcntl
import os
import stat

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _fsio


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_read_text_of_a_missing_file_is_none(tmp_path):
    assert _fsio.read_text(str(tmp_path / 'nope')) is None
    (tmp_path / 'f').write_bytes(b'a\r\nb\n')
    assert _fsio.read_text(str(tmp_path / 'f')) == 'a\nb\n'


def test_read_text_errors(tmp_path):
    (tmp_path / 'bad').write_bytes(b'\xff')
    with pytest.raises(UnicodeDecodeError):
        _fsio.read_text(str(tmp_path / 'bad'))
    assert _fsio.read_text(str(tmp_path / 'bad'), 'surrogateescape') == '\udcff'
    with pytest.raises(IsADirectoryError):
        _fsio.read_text(str(tmp_path))


def test_write_text_sets_the_mode_and_leaves_no_temporary_file(tmp_path):
    path = str(tmp_path / 'sub' / 'f')
    _fsio.write_text(path, 'x', 0o600)
    assert _fsio.read_text(path) == 'x' and _mode(path) == 0o600
    _fsio.write_text(path, b'y', 0o644)
    assert _fsio.read_text(path) == 'y' and _mode(path) == 0o644
    assert os.listdir(str(tmp_path / 'sub')) == ['f']


def test_write_text_without_mode_keeps_the_existing_mode_or_takes_the_umask(tmp_path):
    path = str(tmp_path / 'f')
    old = os.umask(0o027)
    try:
        _fsio.write_text(path, 'new')
        assert _mode(path) == 0o640
        os.chmod(path, 0o604)
        _fsio.write_text(path, 'again')
        assert _mode(path) == 0o604 and _fsio.read_text(path) == 'again'
    finally:
        os.umask(old)


def test_write_text_none_removes_and_a_missing_directory_raises_without_makedirs(tmp_path):
    path = str(tmp_path / 'f')
    _fsio.write_text(path, 'x')
    _fsio.write_text(path, None)
    assert not os.path.lexists(path)
    _fsio.write_text(path, None)   # already gone: nothing to do
    with pytest.raises(FileNotFoundError):
        _fsio.write_text(str(tmp_path / 'missing' / 'f'), 'x', makedirs=False)


def test_a_failed_write_keeps_the_old_content_and_removes_the_temporary_file(tmp_path, monkeypatch):
    path = str(tmp_path / 'f')
    _fsio.write_text(path, 'old')

    def boom(src, dst):
        raise OSError('disk full')
    monkeypatch.setattr(os, 'replace', boom)
    with pytest.raises(OSError, match='disk full'):
        _fsio.write_text(path, 'new')
    assert _fsio.read_text(path) == 'old' and os.listdir(str(tmp_path)) == ['f']


def test_lock_exclusive_times_out_while_another_holds_it(tmp_path):
    path = str(tmp_path / 'b.lock')
    held = _fsio.lock_exclusive(path, 1)
    try:
        other = open(path, 'a')
        with pytest.raises(OSError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        other.close()
        with pytest.raises(_fsio.LockTimeout, match=r'b\.lock is locked by another task for more than 0\.2s'):
            _fsio.lock_exclusive(path, 0.2, interval=0.05)
    finally:
        held.close()
    _fsio.lock_exclusive(path, 0).close()
