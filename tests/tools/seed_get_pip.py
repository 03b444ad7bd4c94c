"""Seed ansible-test's get-pip cache so `ansible-test sanity` works without ci-files.testing.ansible.com.

ansible-test bootstraps pip in each sanity venv by downloading get-pip-<ver>.py. This machine
reaches PyPI only, so we write a stand-in that bootstraps pip from ensurepip and then installs
the requested packages from PyPI. Idempotent.
"""
import os
import re
import sys

SHIM = '''import ensurepip, os, subprocess, sys
env = dict(os.environ)  # ensurepip sets PIP_CONFIG_FILE=/dev/null in os.environ; keep pip.conf
args = [a for a in sys.argv[1:] if a not in ('--no-setuptools', '--no-wheel')]
ensurepip.bootstrap(upgrade=True)
subprocess.check_call([sys.executable, '-m', 'pip', 'install', *args], env=env)
'''


def main() -> int:
    try:
        import ansible_test
    except ImportError:
        return 0
    src = os.path.join(os.path.dirname(ansible_test.__file__), '_internal', 'python_requirements.py')
    with open(src, encoding='utf-8') as f:
        versions = set(re.findall(r"pip='(\d+\.\d+(?:\.\d+)?)'", f.read()))
    cache = os.path.expanduser('~/.ansible/test/cache')
    os.makedirs(cache, exist_ok=True)
    for ver in versions | {'24.2', '25.2'}:
        path = os.path.join(cache, 'get_pip_%s.py' % ver.replace('.', '_'))
        if not os.path.exists(path):
            with open(path, 'w', encoding='utf-8') as f:
                f.write(SHIM)
    return 0


if __name__ == '__main__':
    sys.exit(main())
