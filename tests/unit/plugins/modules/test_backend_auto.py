"""backend=auto of node_snapshot and driver_pin: the managed system's os-release decides (as
_kernel.kernel_backend does for kernel_packages), not which package tools the node has."""
from __future__ import annotations

import shutil

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _packages as pk
from ansible_collections.gpufleet.upgrade.plugins.modules import driver_pin, node_snapshot
from tools.module_exit import ModuleExit, capture_module_exits

ALL_TOOLS = ('apt-get', 'dpkg-query', 'dnf', 'rpm')
APT_TOOLS = ('apt-get', 'dpkg-query')


class FakeModule:
    def __init__(self, **params):
        self.params = params

    def run_command(self, argv, environ_update=None):
        raise AssertionError('unexpected command %s' % argv)


def rocky_root(tmp_path):
    (tmp_path / 'etc').mkdir()
    (tmp_path / 'etc/os-release').write_text('ID="rocky"\nID_LIKE="rhel centos fedora"\nPRETTY_NAME="Rocky Linux 9.4"\n'
                                             'VERSION_ID="9.4"\n')
    return str(tmp_path)


def tools(monkeypatch, names):
    monkeypatch.setattr(shutil, 'which', lambda name, *a, **kw: '/usr/bin/' + name if name in names else None)


def run_main(monkeypatch, main, args):
    capture_module_exits(monkeypatch)
    monkeypatch.setattr(basic.AnsibleModule, 'run_command',
                        lambda self, argv, **kw: pytest.fail('unexpected command %s' % argv))
    with patch_module_args(args):
        with pytest.raises(ModuleExit) as exc:
            main()
    return exc.value.result


def test_node_snapshot_auto_follows_os_release(tmp_path, monkeypatch):
    tools(monkeypatch, ALL_TOOLS)                         # apt-get exists, but the root is Rocky
    backend = node_snapshot.backend_for(FakeModule(installroot=rocky_root(tmp_path), backend='auto'))
    assert isinstance(backend, pk.DnfBackend)
    ubuntu = tmp_path / 'u'
    (ubuntu / 'etc').mkdir(parents=True)
    (ubuntu / 'etc/os-release').write_text('ID=ubuntu\nID_LIKE=debian\n')
    backend = node_snapshot.backend_for(FakeModule(installroot=str(ubuntu), backend='auto'))
    try:
        assert isinstance(backend, pk.AptBackend)
    finally:
        backend.close()


def test_node_snapshot_auto_without_the_tool_fails_cleanly(tmp_path, monkeypatch):
    tools(monkeypatch, APT_TOOLS)
    result = run_main(monkeypatch, node_snapshot.main, {'path': str(tmp_path / 's.json'), 'installroot': rocky_root(tmp_path)})
    assert result['failed'] is True
    assert result['msg'] == 'the managed system is Rocky Linux 9.4 (RHEL family) but this node has no dnf'
    assert 'exception' not in result


def test_driver_pin_auto_follows_os_release(tmp_path, monkeypatch):
    tools(monkeypatch, ALL_TOOLS)
    params = dict(installroot=rocky_root(tmp_path), backend='auto', preset=None, packages=['nvidia-driver'],
                  branch='580', version='580.126.20', state='pinned', dnf_lock='auto')
    backend, pkgs = driver_pin.build(FakeModule(**params))
    assert isinstance(backend, pk.DnfBackend) and pkgs.names == ('nvidia-driver',)


def test_driver_pin_auto_without_the_tool_fails_cleanly(tmp_path, monkeypatch):
    tools(monkeypatch, APT_TOOLS)
    result = run_main(monkeypatch, driver_pin.main, {'packages': ['nvidia-driver'], 'version': '580.126.20',
                                                     'installroot': rocky_root(tmp_path)})
    assert result['failed'] is True
    assert result['msg'] == 'the managed system is Rocky Linux 9.4 (RHEL family) but this node has no dnf'
