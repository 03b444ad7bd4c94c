"""tests/tools/lab.py: a playbook run's bound follows the fleet, and a run past it says how far it got instead
of a verdict on nodes it never reached (issue 36 item 8)."""
from __future__ import annotations

from tools.lab import Lab


def lab(tmp_path, nodes):
    return Lab(tmp_path / 'lab', nodes=nodes, fault='none', stuck=[], quiet=True)


def test_the_bound_follows_the_fleet_and_the_environment_sets_another(tmp_path, monkeypatch):
    monkeypatch.delenv('LAB_PLAY_TIMEOUT', raising=False)
    assert lab(tmp_path, 4).play_timeout() == 480
    assert lab(tmp_path, 40).play_timeout() == 2100      # make lab: the old fixed 900 s cut it at batch 9
    monkeypatch.setenv('LAB_PLAY_TIMEOUT', '7200')
    assert lab(tmp_path, 40).play_timeout() == 7200


def test_a_run_past_its_bound_says_its_last_task_and_how_many_nodes_finished_one(tmp_path, monkeypatch):
    monkeypatch.delenv('LAB_PLAY_TIMEOUT', raising=False)
    subject = lab(tmp_path, 4)
    subject.runs['rollout'] = {'status': 'timeout', 'events': [
        {'event': 'playbook_on_task_start', 'host': None, 'task': 'Drain | Cordon'},
        {'event': 'runner_on_ok', 'host': 'gpu-01', 'task': 'Drain | Cordon'},
        {'event': 'runner_on_ok', 'host': 'localhost', 'task': 'Plan | Read'},
        {'event': 'runner_on_failed', 'host': 'gpu-02', 'task': 'Drain | Cordon'},
        {'event': 'playbook_on_task_start', 'host': None, 'task': 'Install | The driver'},
        {'event': 'runner_on_ok', 'host': 'gpu-01', 'task': 'Install | The driver'}]}
    assert subject.how_far('rollout') == (
        'ran past its bound of 480 s (slow, not wrong: LAB_PLAY_TIMEOUT=<seconds> raises it); last task started: '
        'Install | The driver; 1 of 4 nodes had finished a task')
