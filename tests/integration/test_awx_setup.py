"""playbooks/awx_setup.yml and playbooks/vars/awx.yml: syntax with the real awx.awx collection,
every argument against awx.awx's own documentation, the rendered workflow graph and surveys, and
the survey ↔ playbook input contract."""
from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess

import pytest
import yaml

from tools import awx_collection

REPO = pathlib.Path(__file__).resolve().parents[2]
SETUP = REPO / 'playbooks' / 'awx_setup.yml'
VARS = yaml.safe_load((REPO / 'playbooks' / 'vars' / 'awx.yml').read_text())
PLAYBOOKS = ['plan', 'preflight', 'canary', 'upgrade_check', 'rollout', 'rollback', 'postflight', 'release']
SURVEY_KEYS = {'variable', 'question_name', 'question_description', 'type', 'required', 'default', 'min', 'max',
               'choices', 'new_question'}
SURVEY_TYPES = {'text', 'textarea', 'password', 'integer', 'float', 'multiplechoice', 'multiselect'}


@pytest.fixture(scope='module')
def awx_env():
    path = awx_collection.ensure()
    env = dict(os.environ)
    env['ANSIBLE_COLLECTIONS_PATH'] = os.pathsep.join([os.environ['ANSIBLE_COLLECTIONS_PATH'], str(path)])
    env['ANSIBLE_NOCOLOR'] = '1'
    return env


@pytest.fixture(scope='module')
def awx_docs(awx_env):
    out = subprocess.run(['ansible-doc', '--json', '-t', 'module', 'awx.awx.job_template',
                          'awx.awx.workflow_job_template', 'awx.awx.project', 'awx.awx.execution_environment'],
                         env=awx_env, capture_output=True, text=True, timeout=120, check=True)
    return {k: v['doc'] for k, v in json.loads(out.stdout).items()}


def _option_names(options):
    names = set()
    for name, spec in options.items():
        names.add(name)
        names.update(spec.get('aliases') or [])
    return names


def _tasks():
    plays = yaml.safe_load(SETUP.read_text())
    assert len(plays) == 1
    return plays[0]


def _syntax_check(path, env):
    return subprocess.run(['ansible-playbook', '--syntax-check', '-i', 'localhost,', str(path)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_syntax_check_with_real_awx_collection(awx_env, tmp_path):
    ok = _syntax_check(SETUP, awx_env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the check can fail: a misspelt awx.awx module is refused
    (tmp_path / 'vars').mkdir()
    (tmp_path / 'vars' / 'awx.yml').write_text((REPO / 'playbooks' / 'vars' / 'awx.yml').read_text())
    bad = tmp_path / 'awx_setup.yml'
    bad.write_text(SETUP.read_text().replace('awx.awx.job_template:', 'awx.awx.job_templat:'))
    res = _syntax_check(bad, awx_env)
    assert res.returncode != 0 and 'awx.awx.job_templat' in res.stdout + res.stderr


def test_every_awx_argument_is_documented_by_awx_awx(awx_docs):
    play = _tasks()
    used = set()
    for task in play['tasks']:
        mods = [k for k in task if k.startswith('awx.awx.')]
        if not mods:
            continue
        mod = mods[0]
        used.add(mod)
        doc = awx_docs[mod]
        unknown = set(task[mod]) - _option_names(doc['options'])
        assert not unknown, '%s: options not in awx.awx %s: %s' % (task['name'], mod, unknown)
        for key, value in task[mod].items():
            choices = doc['options'].get(key, {}).get('choices')
            if choices and isinstance(value, str) and '{{' not in value:
                assert value in choices, (mod, key, value, choices)
    assert used == {'awx.awx.execution_environment', 'awx.awx.project', 'awx.awx.job_template',
                    'awx.awx.workflow_job_template'}
    # module_defaults for the controller group use documented auth options
    defaults = play['module_defaults']['group/awx.awx.controller']
    assert set(defaults) <= _option_names(awx_docs['awx.awx.job_template']['options'])


def test_job_templates_cover_every_playbook_with_valid_surveys():
    jts = VARS['gpufleet_awx_job_templates']
    assert [jt['playbook'] for jt in jts] == ['playbooks/%s.yml' % p for p in PLAYBOOKS]
    assert len({jt['name'] for jt in jts}) == len(jts)
    for jt in jts:
        variables = [q['variable'] for q in jt['survey']]
        assert len(variables) == len(set(variables)), jt['name']
        for q in jt['survey']:
            assert set(q) <= SURVEY_KEYS and {'variable', 'question_name', 'type', 'required'} <= set(q), q
            assert q['type'] in SURVEY_TYPES and q['variable'].startswith('gpufleet_'), q
            if q['type'] == 'integer' and 'default' in q:
                assert q.get('min', q['default']) <= q['default'] <= q.get('max', q['default']), q
    # surveys sharing a variable ask the same question the same way (the workflow survey merges them)
    seen = {}
    for jt in jts:
        for q in jt['survey']:
            if q['variable'] in seen:
                assert {k: q.get(k) for k in ('type', 'default', 'min', 'max')} == \
                    {k: seen[q['variable']].get(k) for k in ('type', 'default', 'min', 'max')}, q['variable']
            seen[q['variable']] = q


def _render_workflow(run_playbook):
    """Run the playbook's own node-building task and the workflow task's expressions, with no controller."""
    play = _tasks()
    build = copy.deepcopy(next(t for t in play['tasks'] if t['name'] == 'Build the workflow nodes'))
    wf = next(t for t in play['tasks'] if 'awx.awx.workflow_job_template' in t)['awx.awx.workflow_job_template']
    render = {'name': 'render', 'ansible.builtin.set_fact': {
        'rendered_nodes': wf['workflow_nodes'], 'rendered_survey': wf['survey_spec']['spec']}}
    run = run_playbook([{'name': 'render', 'hosts': 'localhost', 'gather_facts': False,
                         'vars_files': [str(REPO / 'playbooks' / 'vars' / 'awx.yml')],
                         'tasks': [build, render]}])
    assert run.rc == 0, run.stdout
    facts = run.result('render')['ansible_facts']
    return facts['rendered_nodes'], facts['rendered_survey']


def test_rendered_workflow_graph_and_survey(run_playbook, awx_docs):
    nodes, survey = _render_workflow(run_playbook)
    by_id = {n['identifier']: n for n in nodes}
    assert list(by_id) == ['plan', 'preflight', 'canary', 'approve', 'upgrade_check', 'rollout', 'postflight', 'rollback']

    def succ(i, kind='success_nodes'):
        return [x['identifier'] for x in by_id[i].get('related', {}).get(kind, [])]
    # preflight blocks: on its failure nothing follows (issue 17, item 3)
    assert succ('plan') == ['preflight'] and succ('preflight') == ['canary']
    assert succ('preflight', 'failure_nodes') == [] and succ('preflight', 'always_nodes') == []
    assert succ('canary') == ['approve'] and succ('canary', 'failure_nodes') == ['rollback']
    assert succ('approve') == ['upgrade_check']
    assert succ('upgrade_check') == ['rollout'] and succ('upgrade_check', 'failure_nodes') == []
    assert succ('rollout') == ['postflight'] and succ('rollout', 'failure_nodes') == ['rollback']
    approve = by_id['approve']['unified_job_template']
    assert approve == {'name': 'gpufleet approve qualification', 'type': 'workflow_approval', 'timeout': 86400,
                       'description': VARS['gpufleet_awx_workflow']['approval']['description']}
    jt_names = {jt['name'] for jt in VARS['gpufleet_awx_job_templates']}
    for ident, node in by_id.items():
        if ident != 'approve':
            assert node['unified_job_template']['type'] == 'job_template'
            assert node['unified_job_template']['name'] in jt_names
            assert node['unified_job_template']['organization'] == {'name': 'Default'}
        for kind in ('success_nodes', 'failure_nodes', 'always_nodes'):
            for ref in node.get('related', {}).get(kind, []):
                assert ref['identifier'] in by_id
    # every rendered key is an awx.awx workflow_nodes suboption
    sub = awx_docs['awx.awx.workflow_job_template']['options']['workflow_nodes']['suboptions']
    ujt = _option_names(sub['unified_job_template']['suboptions'])
    for node in nodes:
        assert set(node) <= _option_names(sub), node
        assert set(node['unified_job_template']) <= ujt, node
    # the workflow survey asks every template variable exactly once
    all_vars = {q['variable'] for jt in VARS['gpufleet_awx_job_templates'] for q in jt['survey']}
    assert sorted(q['variable'] for q in survey) == sorted(all_vars)


def test_setup_validates_its_inputs_before_calling_the_controller(run_playbook, awx_env):
    env = {'ANSIBLE_COLLECTIONS_PATH': awx_env['ANSIBLE_COLLECTIONS_PATH']}
    run = run_playbook(str(SETUP), extravars={'gpufleet_awx_inventory': 'GPU fleet'}, envvars=env)
    assert run.rc != 0
    res = run.result('Check the inputs')
    assert res['_event'] == 'runner_on_failed'
    assert 'gpufleet_awx_project_scm_url' in res['msg'] and 'gpufleet_awx_ee_image' in res['msg']
    assert not run.task_results('Execution environment')


def _documented_inputs(playbook: pathlib.Path):
    """The argument_spec of the first task of the first play, when that task is ansible.builtin.validate_argument_spec
    (bad input then fails before anything else runs)."""
    play = yaml.safe_load(playbook.read_text())[0]
    tasks = play.get('pre_tasks', []) + play.get('tasks', [])
    spec = tasks[0].get('ansible.builtin.validate_argument_spec') if tasks else None
    return spec['argument_spec'] if spec is not None else None


def test_contract_checker_on_awx_setup_itself():
    spec = _documented_inputs(SETUP)
    assert spec is not None and spec['gpufleet_awx_project_scm_url']['required'] is True


# Survey question type -> the argument_spec types it can feed (a survey sends strings and numbers only).
SURVEY_TO_SPEC_TYPES = {'text': {'str', 'raw'}, 'textarea': {'str', 'raw'}, 'password': {'str', 'raw'},
                        'integer': {'int', 'raw'}, 'float': {'float', 'raw'},
                        'multiplechoice': {'str', 'bool', 'raw'}, 'multiselect': {'list'}}


def _survey(name):
    return next(j for j in VARS['gpufleet_awx_job_templates'] if j['playbook'] == 'playbooks/%s.yml' % name)['survey']


def _contract_problems(spec, survey):
    """Every way the survey and the playbook's argument_spec disagree, as readable strings."""
    if spec is None:
        return ['the playbook has no ansible.builtin.validate_argument_spec task documenting its inputs']
    problems = []
    asked = {q['variable']: q for q in survey}
    for var in sorted(set(asked) - set(spec)):
        problems.append('survey variable %s is not documented by the playbook' % var)
    for var in sorted(k for k, v in spec.items() if v.get('required')):
        if var not in asked:
            problems.append('required input %s is not asked by the survey' % var)
        elif not asked[var]['required']:
            problems.append('required input %s is optional in the survey' % var)
    for var, q in asked.items():
        arg = spec.get(var)
        if arg is None:
            continue
        kind = arg.get('type', 'str')
        if kind not in SURVEY_TO_SPEC_TYPES[q['type']]:
            problems.append('%s: survey type %s cannot feed argument type %s' % (var, q['type'], kind))
        if q['type'] == 'multiplechoice':
            want = ['false', 'true'] if kind == 'bool' else [str(c) for c in arg.get('choices', [])]
            if sorted(q.get('choices', [])) != sorted(want):
                problems.append('%s: survey choices %s, playbook %s' % (var, q.get('choices'), want))
        elif arg.get('choices') and sorted(map(str, arg['choices'])) != sorted(q.get('choices', [])):
            problems.append('%s: the playbook restricts it to %s; the survey must offer exactly those' % (var, arg['choices']))
        if 'default' in arg and 'default' in q:
            theirs = arg['default']
            theirs = str(theirs).lower() if isinstance(theirs, bool) else theirs
            if q['default'] != theirs and not (q['default'] == '' and theirs in ('', None)):
                problems.append('%s: survey default %r, playbook default %r' % (var, q['default'], arg['default']))
    return problems


@pytest.mark.parametrize('name', PLAYBOOKS)
def test_survey_variables_are_documented_playbook_inputs(name):
    path = REPO / 'playbooks' / ('%s.yml' % name)
    assert not _contract_problems(_documented_inputs(path), _survey(name)), path


def test_contract_check_can_fail():
    spec = {'gpufleet_plan_file': {'type': 'str', 'required': True},
            'gpufleet_dra': {'type': 'bool', 'default': False},
            'gpufleet_batch_size': {'type': 'raw', 'default': '10%'},
            'gpufleet_mode': {'type': 'str', 'choices': ['a', 'b']},
            'gpufleet_count': {'type': 'int'}}
    good = [{'variable': 'gpufleet_plan_file', 'type': 'text', 'required': True},
            {'variable': 'gpufleet_dra', 'type': 'multiplechoice', 'choices': ['false', 'true'], 'required': True,
             'default': 'false'},
            {'variable': 'gpufleet_batch_size', 'type': 'text', 'required': True, 'default': '10%'},
            {'variable': 'gpufleet_mode', 'type': 'multiplechoice', 'choices': ['a', 'b'], 'required': False},
            {'variable': 'gpufleet_count', 'type': 'integer', 'required': False}]
    assert _contract_problems(spec, good) == []
    assert _contract_problems(None, good) == [
        'the playbook has no ansible.builtin.validate_argument_spec task documenting its inputs']
    bad = copy.deepcopy(good)
    bad[0]['required'] = False
    bad[1]['default'] = 'true'
    bad[2]['default'] = '25%'
    bad[3]['choices'] = ['a']
    bad[4]['type'] = 'text'
    bad.append({'variable': 'gpufleet_unknown', 'type': 'text', 'required': False})
    assert _contract_problems(spec, bad) == [
        'survey variable gpufleet_unknown is not documented by the playbook',
        'required input gpufleet_plan_file is optional in the survey',
        "gpufleet_dra: survey default 'true', playbook default False",
        "gpufleet_batch_size: survey default '25%', playbook default '10%'",
        "gpufleet_mode: survey choices ['a'], playbook ['a', 'b']",
        'gpufleet_count: survey type text cannot feed argument type int',
    ]
    assert _contract_problems(spec, good[1:]) == ['required input gpufleet_plan_file is not asked by the survey']
