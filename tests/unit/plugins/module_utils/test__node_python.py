"""_node_python: the Python each GPU node runs the collection's node-side modules with is 3.9 or later, else one
message naming the node, its interpreter and version, the requirement and ansible_python_interpreter (issue 39
item 1); and every playbook reads it on its nodes first, before anything changes."""
from __future__ import annotations

import pathlib

import pytest
import yaml

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _node_python as np

REPO = pathlib.Path(__file__).resolve().parents[4]
HOW = 'set ansible_python_interpreter for the host'


def facts(version_info, executable='/usr/bin/python3', item=None, **extra):
    """What ansible.builtin.setup (gather_subset !all,!min,python) registers."""
    res = {'changed': False, 'ansible_facts': {'ansible_python': {
        'version': dict(zip(('major', 'minor', 'micro', 'releaselevel', 'serial'), version_info)),
        'version_info': list(version_info), 'executable': executable, 'type': 'cpython'}}}
    if item is not None:
        res['item'] = item
    res.update(extra)
    return res


@pytest.mark.parametrize('version', [(3, 9), (3, 9, 0), (3, 12, 1, 'final', 0), [3, 13, 0], '3.9.18', '3.10',
                                     {'major': 3, 'minor': 11, 'micro': 7}, (4, 0), [3, 9, 'final']])
def test_a_supported_python_is_no_problem(version):
    assert np.problem(version, 'gpu-01', '/usr/bin/python3') is None


@pytest.mark.parametrize('version, shown', [((3, 8, 18, 'final', 0), '3.8.18'), ((3, 6, 8), '3.6.8'), ((2, 7, 18), '2.7.18'),
                                            ('3.8', '3.8'), ({'major': 3, 'minor': 7, 'micro': 16}, '3.7.16'), ((3, 8), '3.8')])
def test_an_older_python_is_refused_naming_node_interpreter_version_and_requirement(version, shown):
    msg = np.problem(version, 'gpu-07', '/usr/libexec/platform-python')
    assert msg == ("gpu-07: Python %s (/usr/libexec/platform-python) is older than the Python 3.9 the collection's "
                   "node-side modules need on every GPU node; set ansible_python_interpreter for the host (its "
                   "host_vars, or the group_vars of the GPU nodes) to a Python 3.9 or later installed on the node, "
                   "e.g. ansible_python_interpreter=/usr/bin/python3.11." % shown)


def test_the_minimum_is_3_9_and_can_be_given():
    assert np.MINIMUM == (3, 9)
    assert np.problem((3, 9), 'n', 'p') is None and np.problem((3, 8, 99), 'n', 'p') is not None
    assert np.problem((3, 10), 'n', 'p', minimum=(3, 11)).startswith('n: Python 3.10 (p) is older than the Python 3.11 ')
    assert 'the interpreter Ansible found' in np.problem((3, 8), 'n')


@pytest.mark.parametrize('bad', [None, 3.9, 'three', '3', [3], [True, 9], ['3', 'x'], {'major': 3}, object()])
def test_what_is_not_a_version_is_refused(bad):
    with pytest.raises(np.NodePythonError, match='Python version: .* is not a version'):
        np.problem(bad, 'gpu-01')


def test_setup_facts():
    assert np.setup_problem(facts((3, 12, 1, 'final', 0)), 'gpu-01') is None
    msg = np.setup_problem(facts((3, 8, 18, 'final', 0), '/opt/py38/bin/python'), 'gpu-02', '/usr/bin/python3')
    # the path the module really ran with (sys.executable) over the configured one
    assert msg.startswith('gpu-02: Python 3.8.18 (/opt/py38/bin/python) is older than the Python 3.9 ')
    # facts as a setup without the ansible_ prefix would give them
    assert np.setup_problem({'ansible_facts': {'python': {'version_info': [3, 6, 8], 'executable': '/x'}}}, 'n') \
        .startswith('n: Python 3.6.8 (/x) is older')


def test_an_interpreter_ansible_itself_refuses_is_named_with_its_version():
    # ansible-core 2.21 on a Python 3.8 target: setup fails before it reads anything, its message has the version
    res = {'failed': True, 'msg': 'Ansible requires Python 3.9 or newer on the target. Current version: 3.8.18 '
                                  '(default, May  9 2026, 07:33:04) [GCC 12.2.0]'}
    assert np.setup_problem(res, 'gpu-03', '/usr/bin/python3.8') == np.problem((3, 8, 18), 'gpu-03', '/usr/bin/python3.8')
    # discovered (ansible_python_interpreter unset or auto): the discovered path
    res['ansible_facts'] = {'discovered_interpreter_python': '/usr/bin/python3'}
    assert '(/usr/bin/python3)' in np.setup_problem(res, 'gpu-03', 'auto_silent')


@pytest.mark.parametrize('res, reason', [
    # Python 2.7 and 3.6 cannot even compile ansible-core's module wrapper
    ({'failed': True, 'rc': 1, 'msg': 'Module result deserialization failed: No start of json char found',
      'module_stderr': '  File "/root/.ansible/tmp/AnsiballZ_setup.py", line 3\n    from __future__ import annotations\n'
                       '    ^\nSyntaxError: future feature annotations is not defined\n'},
     'SyntaxError: future feature annotations is not defined'),
    ({'failed': True, 'rc': 127, 'msg': "The module interpreter '/nonexistent/python3' was not found.",
      'module_stderr': '/bin/sh: 1: /nonexistent/python3: not found\n'}, '/bin/sh: 1: /nonexistent/python3: not found'),
    ({'failed': True, 'msg': 'MODULE FAILURE.\nSee stdout/stderr for the exact error'}, 'MODULE FAILURE'),
    ({'failed': True}, 'no reason given'),
])
def test_a_setup_that_could_not_run_is_refused_with_what_ansible_said(res, reason):
    msg = np.setup_problem(res, 'gpu-04', '/usr/bin/python')
    want = ("gpu-04: Ansible could not run a Python module with /usr/bin/python (%s); the collection's node-side "
            "modules need Python 3.9 or later on every GPU node; " % reason)
    want += HOW + (" (its host_vars, or the group_vars of the GPU nodes) to a Python 3.9 or later installed on the "
                   "node, e.g. ansible_python_interpreter=/usr/bin/python3.11.")
    assert msg == want
    assert 'the interpreter Ansible found' in np.setup_problem(res, 'gpu-04')


def test_an_unreachable_node_is_named_not_judged():
    res = {'unreachable': True, 'msg': 'Failed to connect to the host via ssh: timed out'}
    assert np.setup_problem(res, 'gpu-05') == 'gpu-05: unreachable, its Python is not known (Failed to connect to the host via ssh: timed out)'


def test_setup_result_not_a_result():
    with pytest.raises(np.NodePythonError, match='setup result of gpu-01: .* is not a task result'):
        np.setup_problem(['nope'], 'gpu-01')


def test_problems_of_a_looped_setup_one_per_node_in_order():
    registered = {'results': [
        facts((3, 12, 1, 'final', 0), item='gpu-01'),
        facts((3, 8, 18, 'final', 0), '/usr/bin/python3.8', item='gpu-02'),
        {'item': 'gpu-03', 'failed': True, 'module_stderr': 'SyntaxError: invalid syntax'},
        {'item': 'gpu-04', 'skipped': True},
    ]}
    out = np.problems(registered, {'gpu-03': '/usr/bin/python2', 'gpu-02': 7})
    assert [m.split(':')[0] for m in out] == ['gpu-02', 'gpu-03']
    assert out[0].startswith('gpu-02: Python 3.8.18 (/usr/bin/python3.8) is older')
    assert out[1].startswith('gpu-03: Ansible could not run a Python module with /usr/bin/python2 (SyntaxError: invalid syntax)')
    assert np.problems({'results': [facts((3, 9, 0), item='a')]}) == []
    assert np.problems(facts((3, 6, 8), item='b'))[0].startswith('b: Python 3.6.8')      # one result, not looped
    for bad in ('gpu-01', 3, None):
        with pytest.raises(np.NodePythonError, match='are not a list of task results'):
            np.problems(bad)
    with pytest.raises(np.NodePythonError, match='is not a task result'):
        np.problems([None])


# ---------------------------------------------------------------------------- the playbooks' side

NODE_PYTHON = 'tasks/node_python.yml'
# What acts on the nodes, reads them or changes something: none of it may run before the check.
ACTS = ('gpufleet.upgrade.gpu_info', 'gpufleet.upgrade.plan_lease', 'gpufleet.upgrade.evidence')


def _steps(playbook: str):
    """(play index, play, kind, task or role) in the order Ansible runs them; blocks flattened."""
    plays = yaml.safe_load((REPO / 'playbooks' / playbook).read_text())

    def flat(tasks):
        for task in tasks or []:
            if 'block' in task:
                yield from flat(task['block'])
            else:
                yield task

    for i, play in enumerate(plays):
        for task in flat(play.get('pre_tasks')):
            yield i, play, 'task', task
        for role in play.get('roles') or []:
            yield i, play, 'role', role
        for section in ('tasks', 'post_tasks'):
            for task in flat(play.get(section)):
                yield i, play, 'task', task


def _acts(kind, task) -> bool:
    if kind == 'role' or 'ansible.builtin.include_role' in task:
        return True
    if any(m in task for m in ACTS):
        return True
    return 'tasks/gpu_operator_cluster.yml' in str(task.get('ansible.builtin.include_tasks', ''))


@pytest.mark.parametrize('playbook', ['plan.yml', 'preflight.yml', 'canary.yml', 'rollout.yml', 'rollback.yml'])
def test_each_playbook_checks_the_nodes_python_before_anything_acts_on_them(playbook):
    steps = list(_steps(playbook))
    checks = [n for n, (_i, _p, kind, task) in enumerate(steps)
              if kind == 'task' and task.get('ansible.builtin.import_tasks') == NODE_PYTHON]
    first_act = next(n for n, (_i, _p, kind, task) in enumerate(steps) if _acts(kind, task))
    assert checks and checks[0] < first_act, (playbook, steps[first_act][3])
    i, play, _kind, _task = steps[checks[0]]
    # in a play on the nodes (delegated from a localhost play with `connection: local`, setup would read the
    # controller's Python), the nodes every later node play acts on; one refused node stops them all
    plays = yaml.safe_load((REPO / 'playbooks' / playbook).read_text())
    # (the evidence plays run on localhost or on nothing)
    node_plays = [p for p in plays[i:] if p['hosts'] != 'localhost' and 'gpufleet_evidence_repo' not in p['hosts']]
    assert play['hosts'] != 'localhost' and play.get('connection') != 'local'
    assert all(p['hosts'] == play['hosts'] for p in node_plays), playbook
    assert play.get('any_errors_fatal') or 'serial' not in play


def test_the_check_stops_every_node_and_the_play():
    tasks = yaml.safe_load((REPO / 'playbooks' / NODE_PYTHON).read_text())
    setup, check = tasks
    assert setup['ansible.builtin.setup'] == {'gather_subset': ['!all', '!min', 'python']}
    assert setup['failed_when'] is False and 'delegate_to' not in setup
    assert check['any_errors_fatal'] is True
    assert 'gpufleet.upgrade.node_python(hostvars, inventory_hostname)' in str(check['vars'])
