"""Unload planner: cgroup to unit, holder scan on a /proc tree, the plan for each situation."""
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _unload


@pytest.mark.parametrize('text, unit', [
    ('0::/system.slice/nvidia-persistenced.service\n', 'nvidia-persistenced.service'),
    ('12:pids:/system.slice/dcgm-exporter.service\n1:name=systemd:/system.slice/dcgm-exporter.service\n',
     'dcgm-exporter.service'),
    ('0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope\n', None),
    ('0::/user.slice/user-1000.slice/session-3.scope\n', None),
    ('', None),
])
def test_unit_of(text, unit):
    assert _unload.unit_of(text) == unit


def holder(pid, unit=None):
    return {'pid': pid, 'comm': 'p%d' % pid, 'cmdline': None, 'unit': unit, 'devices': ['/dev/nvidia0']}


def test_plan_order_skips_modules_not_loaded():
    plan = _unload.plan_unload(['nvidia', 'ext4', 'nvidia_fs', 'nvidia_vgpu_vfio', 'gdrdrv'], {}, [], False)
    assert plan['unload_modules'] == ['nvidia_fs', 'nvidia_vgpu_vfio', 'gdrdrv', 'nvidia']


def test_plan_splits_holders_by_service_being_stopped():
    holders = [holder(1, 'nvidia-persistenced.service'), holder(2, 'containerd.service'), holder(3)]
    states = {'nvidia-persistenced': 'active', 'dcgm': 'inactive', 'site-agent': 'failed'}
    plan = _unload.plan_unload(['nvidia'], states, holders, kill_holders=False)
    assert plan['stop_services'] == ['nvidia-persistenced']
    assert [h['pid'] for h in plan['released_by_stop']] == [1]
    assert [h['pid'] for h in plan['blocking']] == [2, 3]
    assert plan['kill'] == []
    plan = _unload.plan_unload(['nvidia'], states, holders, kill_holders=True)
    assert [h['pid'] for h in plan['kill']] == [2, 3] and plan['blocking'] == []


def test_find_holders_reads_fd_links(tmp_path):
    proc = tmp_path / 'proc'
    for pid, targets in ((10, ['/dev/nvidia0', '/dev/null', '/dev/nvidiactl', '/dev/nvidia0']),
                         (11, ['/dev/null']), (12, ['/dev/nvidia-caps/nvidia-cap2'])):
        (proc / str(pid) / 'fd').mkdir(parents=True)
        for i, t in enumerate(targets):
            os.symlink(t, proc / str(pid) / 'fd' / str(i))
        (proc / str(pid) / 'comm').write_text('c%d\n' % pid)
    (proc / 'self').mkdir()
    (proc / '13').mkdir()  # a process without readable fds (gone or not ours)
    holders = _unload.find_holders(str(proc), exclude_pids=[12])
    assert holders == [{'pid': 10, 'comm': 'c10', 'cmdline': None, 'unit': None,
                        'devices': ['/dev/nvidia0', '/dev/nvidiactl']}]


def test_find_holders_on_the_real_proc_excludes_itself():
    holders = _unload.find_holders('/proc', exclude_pids=[os.getpid()])
    assert all(h['pid'] != os.getpid() for h in holders)
    assert all(d.startswith('/dev/nvidia') for h in holders for d in h['devices'])
