"""bench/callback/task_cpu.py, the task profile of bench/rollout_scale.py --profile, on a real
ansible-playbook run (ansible-runner): each task is listed in order with the hosts that ran or skipped it
and whether it is delegated, the node-side CPU the lab logs is taken out of the task it ran in, and the
cgroup it made is gone afterwards. Where no cgroup can be made (not root, no hierarchy) the profile says
so and the playbook runs as usual."""
from __future__ import annotations

import json
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
V1 = pathlib.Path('/sys/fs/cgroup/cpuacct')
# What the accounting wrapper writes for a node-side run (its CPU seconds), here a made-up 5 s: the task that
# logs it is counted 5 s (plus the wrapper's 0.5 s start-up) less than the same task logging elsewhere.
LOG_5S = ['sh', '-c', 'echo 5.0 >> "$0"']


def cgroups_usable() -> bool:
    return os.geteuid() == 0 and (V1 / 'cpuacct.usage').is_file() and os.access(V1, os.W_OK)


def profile(run_playbook, tmp_path: pathlib.Path, tasks: list[dict]) -> tuple[dict, pathlib.Path]:
    out, node_log = tmp_path / 'task-cpu.json', tmp_path / 'node-cpu.log'
    node_log.write_text('')
    run = run_playbook([{'name': 'Profiled', 'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}],
                       envvars={'ANSIBLE_CALLBACK_PLUGINS': str(REPO / 'bench' / 'callback'),
                                'ANSIBLE_CALLBACKS_ENABLED': 'task_cpu', 'GPUFLEET_TASK_CPU_OUT': str(out),
                                'GPUFLEET_TASK_CPU_NODE_LOG': str(node_log), 'GPUFLEET_TASK_CPU_WRAPPER': '0.5'})
    assert run.rc == 0, run.stdout
    return json.loads(out.read_text()), node_log


def test_each_task_in_order_with_its_hosts_and_the_node_side_cpu_taken_out(run_playbook, tmp_path):
    doc, node_log = profile(run_playbook, tmp_path, [
        {'name': 'Logs 5 s node-side', 'ansible.builtin.command': {'argv': LOG_5S + [str(tmp_path / 'node-cpu.log')]}},
        {'name': 'Skipped', 'ansible.builtin.ping': None, 'when': False},
        {'name': 'Delegated', 'ansible.builtin.ping': None, 'delegate_to': 'localhost'},
        {'name': 'Logs elsewhere', 'ansible.builtin.command': {'argv': LOG_5S + [str(tmp_path / 'elsewhere.log')]}},
    ])
    assert node_log.read_text() == '5.0\n'
    if not cgroups_usable():
        assert set(doc) == {'error'} and doc['error'], doc
        return
    tasks = [t for t in doc['tasks'] if t['play'] == 'Profiled']
    assert [(t['task'], t['action'], t['status'], t['delegated']) for t in tasks] == [
        ('Logs 5 s node-side', 'ansible.builtin.command', {'ok': 1}, False),
        ('Skipped', 'ansible.builtin.ping', {'skipped': 1}, False),
        ('Delegated', 'ansible.builtin.ping', {'ok': 1}, True),
        ('Logs elsewhere', 'ansible.builtin.command', {'ok': 1}, False)]
    by_name = {t['task']: t for t in tasks}
    # The same task twice: the one whose run is logged node-side is counted without the 5.5 s it logged.
    assert 4.5 < by_name['Logs elsewhere']['cpu'] - by_name['Logs 5 s node-side']['cpu'] < 6.5, tasks
    assert by_name['Logs 5 s node-side']['cpu'] < 0 < by_name['Logs elsewhere']['cpu']
    assert all(t['cpu'] > 0 for t in tasks if t['task'] != 'Logs 5 s node-side')
    assert all(t['main'] >= 0 for t in tasks)
    assert doc['cgroup'].startswith(str(V1) + '/gpufleet-task-cpu-')
    assert not pathlib.Path(doc['cgroup']).exists(), 'the profile left its cgroup behind'
