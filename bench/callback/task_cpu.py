# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Bench only (bench/rollout_scale.py --profile; not shipped): the controller CPU of each task of a playbook.

An aggregate callback in ansible-playbook's main process. At the start it moves that process into a new
cgroup (cgroup v1 cpuacct, else a cgroup v2 leaf), so the workers and module processes it forks are
counted there while they run; at each task start it reads the cgroup's CPU and gives the difference to
the task before. Under the linear strategy the tasks do not overlap, so each task gets the CPU of its
workers, their module processes and the main process's own work between two task starts. The CPU of
node-side runs (GPUFLEET_TASK_CPU_NODE_LOG, the lab's node-cpu.log: one line of seconds per run,
plus GPUFLEET_TASK_CPU_WRAPPER seconds each) is subtracted when it is logged, as the bench does for
the whole play. Writes one JSON document to GPUFLEET_TASK_CPU_OUT at the end: the tasks in order,
each with its CPU, the main process's share, whether it is delegated and the hosts that ran or skipped it, and
the cgroup it used (removed at the end); or {'error': ...}
when no cgroup could be made (not root, no cpuacct).
"""
from __future__ import annotations

import collections
import json
import os
import resource
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = '''
name: task_cpu
type: aggregate
short_description: The controller CPU of each task (bench only)
description: The controller CPU of each task, from a cgroup around ansible-playbook (bench/rollout_scale.py --profile).
'''

V1_ROOT = '/sys/fs/cgroup/cpuacct'
V2_ROOT = '/sys/fs/cgroup'


def _main_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'task_cpu'
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.out = os.environ.get('GPUFLEET_TASK_CPU_OUT', '')
        self.node_log = os.environ.get('GPUFLEET_TASK_CPU_NODE_LOG', '')
        self.wrapper = float(os.environ.get('GPUFLEET_TASK_CPU_WRAPPER', '0') or 0)
        self.node_offset = 0
        self.node_cpu = 0.0
        self.error = ''
        self.cgroup, self.usage, self.scale = self._enter()
        # Before the first play: counted, never listed.
        self.current: tuple = ('(start)', '', '')
        self.rows: dict[tuple, dict] = {self.current: {'cpu': 0.0, 'main': 0.0, 'status': collections.Counter()}}
        self.order: list[tuple] = []
        self.play = ''
        self.last = self._read()
        self.last_main = _main_cpu()

    def _enter(self) -> tuple[str, str, float]:
        name = 'gpufleet-task-cpu-%d' % os.getpid()
        for root, usage, scale in ((V1_ROOT, 'cpuacct.usage', 1e-9), (V2_ROOT, 'cpu.stat', 1e-6)):
            if not os.path.isfile(os.path.join(root, usage)) and not (root == V2_ROOT and os.path.isfile(
                    os.path.join(root, 'cgroup.controllers'))):
                continue
            path = os.path.join(root, name)
            try:
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, 'cgroup.procs'), 'w', encoding='ascii') as f:
                    f.write(str(os.getpid()))
                return path, os.path.join(path, usage), scale
            except OSError as exc:
                self.error = '%s: %s' % (path, exc)
        self.error = self.error or 'no cgroup v1 cpuacct or v2 hierarchy under /sys/fs/cgroup'
        return '', '', 0.0

    def _read(self) -> float:
        if not self.usage:
            return 0.0
        with open(self.usage, encoding='ascii') as f:
            text = f.read()
        if self.usage.endswith('cpu.stat'):
            text = dict(line.split() for line in text.splitlines() if line.strip()).get('usage_usec', '0')
        total = int(text) * self.scale
        if self.node_log and os.path.exists(self.node_log):
            with open(self.node_log, encoding='ascii') as f:
                f.seek(self.node_offset)
                chunk = f.read()
            done = chunk[:chunk.rfind('\n') + 1]
            self.node_offset += len(done)
            self.node_cpu += sum(float(x) + self.wrapper for x in done.split())
        return total - self.node_cpu

    def _row(self, key: tuple) -> dict:
        if key not in self.rows:
            self.rows[key] = {'cpu': 0.0, 'main': 0.0, 'status': collections.Counter()}
            self.order.append(key)
        return self.rows[key]

    def _switch(self, key: tuple) -> None:
        now, main = self._read(), _main_cpu()
        row = self._row(self.current)
        row['cpu'] += now - self.last
        row['main'] += main - self.last_main
        self.last, self.last_main = now, main
        self.current = key
        self._row(key)

    def _count(self, status: str) -> None:
        self._row(self.current)['status'][status] += 1

    def v2_playbook_on_play_start(self, play) -> None:
        self.play = play.get_name()
        self._switch((self.play, '(play start)', ''))

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._switch((self.play, task.get_name(), task.action))
        self.rows[self.current]['delegated'] = bool(task.delegate_to)

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self._switch((self.play, task.get_name(), task.action))

    def v2_runner_on_ok(self, result, **kwargs) -> None:
        self._count('ok')

    def v2_runner_on_failed(self, result, ignore_errors=False, **kwargs) -> None:
        self._count('failed')

    def v2_runner_on_skipped(self, result, **kwargs) -> None:
        self._count('skipped')

    def v2_runner_on_unreachable(self, result, **kwargs) -> None:
        self._count('unreachable')

    def v2_playbook_on_stats(self, stats) -> None:
        self._switch(('(end)', '', ''))
        doc = {'error': self.error} if self.error else {'cgroup': self.cgroup, 'tasks': [
            {'play': k[0], 'task': k[1], 'action': k[2], 'cpu': round(self.rows[k]['cpu'], 4),
             'main': round(self.rows[k]['main'], 4), 'status': dict(self.rows[k]['status']),
             'delegated': self.rows[k].get('delegated', False)}
            for k in self.order if k[1] and k[1] != '(play start)' or self.rows[k]['cpu'] > 0.05]}
        if self.out:
            with open(self.out, 'w', encoding='utf-8') as f:
                json.dump(doc, f, indent=1)
        if self.cgroup:
            self._leave()

    def _leave(self) -> None:
        """Back to the parent cgroup, with any process still in ours (a worker still exiting on a loaded machine),
        then the cgroup goes; retried for up to 5 s (a process may be between its exit and its reaping)."""
        parent = os.path.join(os.path.dirname(self.cgroup), 'cgroup.procs')
        deadline = time.monotonic() + 5.0
        while True:
            try:
                with open(os.path.join(self.cgroup, 'cgroup.procs'), encoding='ascii') as f:
                    pids = f.read().split() or [str(os.getpid())]
                for pid in pids:
                    try:
                        with open(parent, 'w', encoding='ascii') as f:
                            f.write(pid)
                    except OSError:
                        pass    # it exited meanwhile
                os.rmdir(self.cgroup)
                return
            except OSError:
                if time.monotonic() > deadline:
                    return      # best effort: the test of the profile names the cgroup left behind
                time.sleep(0.05)
