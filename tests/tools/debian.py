"""Find (and, as root, install) the Debian packages that tests run for real.

`make test` installs them first (`make system-deps`); this is the fallback when pytest runs
alone. A test that cannot get its package skips with a loud reason, never silently.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import warnings

_LOCK = threading.Lock()
_UPDATED = {'done': False}


def ensure_binary(package: str, binary: str, timeout: float = 900) -> tuple[str | None, str]:
    """Return (path of `binary`, '') or (None, why it cannot be had)."""
    found = shutil.which(binary)
    if found:
        return found, ''
    if os.geteuid() != 0 or not shutil.which('apt-get'):
        reason = ('Debian package %r is not installed and this is not root with apt-get: install it '
                  '(apt-get install --no-install-recommends %s) or run `make test` as root' % (package, package))
        warnings.warn(reason)
        return None, reason
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    with _LOCK:
        try:
            if not _UPDATED['done']:
                subprocess.run(['apt-get', '-o', 'DPkg::Lock::Timeout=600', 'update', '-qq'], env=env,
                               check=True, timeout=timeout, capture_output=True)
                _UPDATED['done'] = True
            subprocess.run(['apt-get', '-o', 'DPkg::Lock::Timeout=600', 'install', '-y', '-qq',
                            '--no-install-recommends', package], env=env, check=True, timeout=timeout,
                           capture_output=True)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            detail = getattr(exc, 'stderr', b'') or b''
            reason = 'cannot install Debian package %r: %s %s' % (
                package, exc, detail.decode('utf-8', 'replace')[-400:] if isinstance(detail, bytes) else detail)
            warnings.warn(reason)
            return None, reason
    found = shutil.which(binary)
    if not found:
        reason = 'Debian package %r installed but %r is not on PATH' % (package, binary)
        warnings.warn(reason)
        return None, reason
    return found, ''
