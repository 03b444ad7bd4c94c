# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise. Runs on GPU nodes (Python >= 3.9).
"""Files: read one if it exists, write one atomically, hold an exclusive lock on one.

``write_text`` writes a temporary file in the destination's directory, flushes and fsyncs it,
sets its mode and renames it over the destination, so a reader sees the old content or the new,
never a part; on any error the temporary file is removed. The mode is the one given, else the
existing file's, else ``0o666`` less the umask (what a new file gets).
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from typing import IO, Optional, Union

from ansible_collections.gpufleet.upgrade.plugins.module_utils._poll import poll

__all__ = ['LockTimeout', 'lock_exclusive', 'read_text', 'write_text']


class LockTimeout(Exception):
    """The lock file stayed locked by someone else for the whole timeout."""


def read_text(path: str, errors: str = 'strict') -> Optional[str]:
    """The file's UTF-8 text (universal newlines), or None when it does not exist (other errors go
    through)."""
    try:
        with open(path, 'r', encoding='utf-8', errors=errors) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _mode_for(path: str, mode: Optional[int]) -> int:
    if mode is not None:
        return mode
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text(path: str, text: Optional[Union[str, bytes]], mode: Optional[int] = None,
               makedirs: bool = True, prefix: str = '.gpufleet-') -> None:
    """Atomically replace `path` with `text` (str as UTF-8, or bytes), or remove `path` when
    `text` is None. `makedirs` creates the directory first; without it a missing directory raises."""
    if text is None:
        if os.path.lexists(path):
            os.unlink(path)
        return
    data = text.encode('utf-8', 'surrogateescape') if isinstance(text, str) else text
    directory = os.path.dirname(os.path.abspath(path))
    if makedirs:
        os.makedirs(directory, exist_ok=True)
    final_mode = _mode_for(path, mode)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    try:
        with os.fdopen(fd, 'wb') as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, final_mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def lock_exclusive(path: str, timeout: float, interval: float = 0.1) -> IO[str]:
    """Open `path` (created if missing) and take an exclusive flock on it, trying every `interval`
    seconds for up to `timeout`; returns the open handle (closing it releases the lock). Raises
    LockTimeout when someone else held it all along."""
    handle = open(path, 'a')

    def take() -> bool:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False
    if poll(take, timeout, interval).done:
        return handle
    handle.close()
    raise LockTimeout('%s is locked by another task for more than %ss' % (path, timeout))
