"""bench/rollout_scale.py reads a batch's window from rollout.yml's task names: they must still be there."""
from __future__ import annotations

import ast
import pathlib

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]


def constant(name: str):
    tree = ast.parse((REPO / 'bench' / 'rollout_scale.py').read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError('%s not found in bench/rollout_scale.py' % name)


def test_a_batch_window_starts_at_the_batch_plays_first_pre_task():
    plays = yaml.safe_load((REPO / 'playbooks' / 'rollout.yml').read_text())
    batch = [p for p in plays if 'serial' in p]
    assert len(batch) == 1
    # Every request of a batch (its pause point's read, each node's stop switch read) falls in its window.
    assert batch[0]['pre_tasks'][0]['name'] == constant('BATCH_START')[0]
    # The last batch's window ends where the play after the batch play (the release) starts.
    assert plays[plays.index(batch[0]) + 1]['tasks'][0]['name'] == constant('RELEASE_START')
