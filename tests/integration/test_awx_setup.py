"""playbooks/awx_setup.yml and playbooks/vars/awx.yml: syntax with the real awx.awx collection,
every argument against awx.awx's own documentation, the rendered graphs and surveys of the two workflows
(qualify; approve and roll out), the evidence repository's credential type as AWX receives it, and
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


class Unsafe(str):
    """A value Ansible reads as !unsafe (never templated)."""


class _VarsLoader(yaml.SafeLoader):
    pass


_VarsLoader.add_constructor('!unsafe', lambda loader, node: Unsafe(loader.construct_scalar(node)))

REPO = pathlib.Path(__file__).resolve().parents[2]
SETUP = REPO / 'playbooks' / 'awx_setup.yml'
VARS = yaml.load((REPO / 'playbooks' / 'vars' / 'awx.yml').read_text(), Loader=_VarsLoader)  # noqa: S506 (a SafeLoader)
PLAYBOOKS = ['plan', 'preflight', 'canary', 'approve', 'upgrade_check', 'rollout', 'rollback', 'postflight', 'release']
QUALIFY = 'gpufleet GPU upgrade: qualify'
ROLL_OUT = 'gpufleet GPU upgrade: approve and roll out'
AWX_MODULES = ['awx.awx.job_template', 'awx.awx.workflow_job_template', 'awx.awx.project',
               'awx.awx.execution_environment', 'awx.awx.credential_type']
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
    out = subprocess.run(['ansible-doc', '--json', '-t', 'module', *AWX_MODULES],
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
    assert used == set(AWX_MODULES)
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


def _render_workflows(run_playbook):
    """Run the playbook's own node-building task, then the workflow task's and the credential type task's
    expressions over the workflow task's own loop, with no controller: {workflow name: (nodes, survey)}, and the
    credential type's arguments as awx.awx.credential_type receives them."""
    play = _tasks()
    build = copy.deepcopy(next(t for t in play['tasks'] if t['name'] == 'Build the workflow nodes'))
    wf_task = next(t for t in play['tasks'] if 'awx.awx.workflow_job_template' in t)
    wf = wf_task['awx.awx.workflow_job_template']
    ct = next(t for t in play['tasks'] if 'awx.awx.credential_type' in t)['awx.awx.credential_type']
    render = {'name': 'render', 'ansible.builtin.set_fact': {
        'rendered_name': wf['name'], 'rendered_nodes': wf['workflow_nodes'], 'rendered_survey': wf['survey_spec']['spec'],
        'rendered_description': wf['description']},
        'loop': wf_task['loop'], 'loop_control': wf_task['loop_control']}
    render_ct = {'name': 'render credential type', 'ansible.builtin.set_fact': {'rendered_ct': ct}}
    run = run_playbook([{'name': 'render', 'hosts': 'localhost', 'gather_facts': False,
                         'vars_files': [str(REPO / 'playbooks' / 'vars' / 'awx.yml')],
                         'tasks': [build, render, render_ct]}])
    assert run.rc == 0, run.stdout
    flows = {}
    for res in run.result('render')['results']:
        facts = res['ansible_facts']
        flows[facts['rendered_name']] = (facts['rendered_nodes'], facts['rendered_survey'])
    return flows, run.result('render credential type')['ansible_facts']['rendered_ct']


def test_approval_timeout_is_an_input_of_the_setup(run_playbook):
    """The approval node's timeout follows gpufleet_awx_approval_timeout; a negative one is refused before the
    controller is called."""
    play = _tasks()
    build = copy.deepcopy(next(t for t in play['tasks'] if t['name'] == 'Build the workflow nodes'))
    check = copy.deepcopy(next(t for t in play['tasks'] if t['name'] == "The approval node's timeout is not negative"))
    plays = [{'name': 'render', 'hosts': 'localhost', 'gather_facts': False,
              'vars_files': [str(REPO / 'playbooks' / 'vars' / 'awx.yml')], 'tasks': [check, build]}]
    run = run_playbook(plays, extravars={'gpufleet_awx_approval_timeout': 3600})
    assert run.rc == 0, run.stdout
    nodes = run.result('Build the workflow nodes')['results'][-1]['ansible_facts']['__gpufleet_awx_nodes'][ROLL_OUT]
    approval, = [n for n in nodes if n['unified_job_template']['type'] == 'workflow_approval']
    assert approval['unified_job_template']['timeout'] == 3600
    bad = run_playbook(plays, extravars={'gpufleet_awx_approval_timeout': -1})
    assert bad.rc != 0 and 'gpufleet_awx_approval_timeout' in bad.result("The approval node's timeout is not negative")['msg']
    assert not bad.task_results('Build the workflow nodes')


def _template_vars(names):
    return {q['variable'] for jt in VARS['gpufleet_awx_job_templates'] if jt['name'] in names for q in jt['survey']}


def test_rendered_workflow_graphs_and_surveys(run_playbook, awx_docs):
    flows = _render_workflows(run_playbook)[0]
    assert list(flows) == [QUALIFY, ROLL_OUT] == [w['name'] for w in VARS['gpufleet_awx_workflows']]
    sub = awx_docs['awx.awx.workflow_job_template']['options']['workflow_nodes']['suboptions']
    ujt = _option_names(sub['unified_job_template']['suboptions'])
    jt_names = {jt['name'] for jt in VARS['gpufleet_awx_job_templates']}
    graphs = {}
    for name, (nodes, survey) in flows.items():
        by_id = {n['identifier']: n for n in nodes}
        assert len(by_id) == len(nodes), name
        graphs[name] = by_id
        for node in nodes:
            # every rendered key is an awx.awx workflow_nodes suboption; every node runs a job template but the
            # approval node (awx.awx's workflow_approval, checked below)
            assert set(node) <= _option_names(sub), node
            assert set(node['unified_job_template']) <= ujt, node
            if node['unified_job_template']['type'] == 'workflow_approval':
                continue
            assert node['unified_job_template']['type'] == 'job_template', node
            assert node['unified_job_template']['name'] in jt_names, node
            assert node['unified_job_template']['organization'] == {'name': 'Default'}
            for kind in ('success_nodes', 'failure_nodes', 'always_nodes'):
                for ref in node.get('related', {}).get(kind, []):
                    assert ref['identifier'] in by_id, (name, ref)
        # the workflow survey asks every variable of its templates exactly once, and nothing else but its own questions
        used = {n['unified_job_template']['name'] for n in nodes if n['unified_job_template']['type'] == 'job_template'}
        own = {q['variable'] for q in next(w for w in VARS['gpufleet_awx_workflows'] if w['name'] == name)['survey']}
        asked = [q['variable'] for q in survey]
        assert len(asked) == len(set(asked)), (name, asked)
        assert set(asked) == _template_vars(used) | own, name
        for q in survey:
            assert set(q) <= SURVEY_KEYS and q['type'] in SURVEY_TYPES, q

    def succ(flow, i, kind='success_nodes'):
        return [x['identifier'] for x in graphs[flow][i].get('related', {}).get(kind, [])]

    def template(flow, i):
        return graphs[flow][i]['unified_job_template']['name']

    def kind(flow, i):
        return graphs[flow][i]['unified_job_template']['type']

    q = QUALIFY
    # the qualify workflow has no approval node: its jobs run unattended
    assert {kind(q, i) for i in graphs[q]} == {'job_template'}
    assert list(graphs[q]) == ['plan', 'preflight', 'canary', 'rollback']
    assert [template(q, i) for i in graphs[q]] == [
        'gpufleet plan', 'gpufleet preflight', 'gpufleet canary', 'gpufleet rollback']
    # preflight blocks: on its failure nothing follows (issue 17, item 3)
    assert succ(q, 'plan') == ['preflight'] and succ(q, 'preflight') == ['canary']
    assert succ(q, 'preflight', 'failure_nodes') == [] and succ(q, 'preflight', 'always_nodes') == []
    assert succ(q, 'plan', 'failure_nodes') == [] and succ(q, 'plan', 'always_nodes') == []
    # the qualify workflow ends with the canary: nothing after it but the rollback of a failed canary
    assert succ(q, 'canary') == [] and succ(q, 'canary', 'always_nodes') == []
    assert succ(q, 'canary', 'failure_nodes') == ['rollback']
    assert graphs[q]['rollback'].get('related', {}) == {}

    r = ROLL_OUT
    assert list(graphs[r]) == ['approval', 'approve', 'upgrade_check', 'rollout', 'postflight', 'rollback']
    assert [template(r, i) for i in graphs[r]][1:] == [
        'gpufleet approve', 'gpufleet upgrade_check', 'gpufleet rollout', 'gpufleet postflight', 'gpufleet rollback']
    # the first node, and the only root, is the AWX approval node: the workflow waits there for an approver
    assert [i for i in graphs[r] if kind(r, i) == 'workflow_approval'] == ['approval']
    children = {ref for i in graphs[r] for k in ('success_nodes', 'failure_nodes', 'always_nodes') for ref in succ(r, i, k)}
    assert [i for i in graphs[r] if i not in children] == ['approval']
    approval = graphs[r]['approval']['unified_job_template']
    assert approval['name'] == 'gpufleet: a second operator approves the canary' and approval['description'], approval
    # no organization for an approval template: awx.awx would look it up as a job template of that organization
    assert 'organization' not in approval
    # its timeout is awx_setup.yml's input, 24 h unless set; the setup documents it
    assert approval['timeout'] == 86400
    spec = _documented_inputs(SETUP)['gpufleet_awx_approval_timeout']
    assert spec['type'] == 'int' and spec['default'] == 86400 and spec['description'], spec
    # approved, the approve job runs (and records that approver); denied or timed out (a failure), nothing follows
    assert succ(r, 'approval') == ['approve']
    assert succ(r, 'approval', 'failure_nodes') == [] and succ(r, 'approval', 'always_nodes') == []
    # the approve job reads that approver by the node's name only when there are several: one here, so approve.yml's
    # approval_name stays empty by default
    approve = (REPO / 'playbooks' / 'approve.yml').read_text()
    assert "approval_name: \"{{ gpufleet_awx_approval_name | default(omit, true) }}\"" in approve
    # a refused approval or a failed gate ends the workflow with nothing changed
    assert succ(r, 'approve') == ['upgrade_check']
    assert succ(r, 'approve', 'failure_nodes') == [] and succ(r, 'approve', 'always_nodes') == []
    assert succ(r, 'upgrade_check') == ['rollout']
    assert succ(r, 'upgrade_check', 'failure_nodes') == [] and succ(r, 'upgrade_check', 'always_nodes') == []
    assert succ(r, 'rollout') == ['postflight'] and succ(r, 'rollout', 'failure_nodes') == ['rollback']
    assert graphs[r]['postflight'].get('related', {}) == {} and graphs[r]['rollback'].get('related', {}) == {}

    # the approve-and-roll-out survey asks, required, for the exact commit the qualify workflow ended on
    survey = {q['variable']: q for q in flows[r][1]}
    rev = survey['gpufleet_qualified_revision']
    assert rev['required'] is True and rev['type'] == 'text' and rev['min'] == rev['max'] == 40, rev
    assert 'gpufleet_qualified_revision' not in {q['variable'] for q in flows[q][1]}
    # the rollout's forks stay (a batch's nodes run at once)
    assert next(jt for jt in VARS['gpufleet_awx_job_templates'] if jt['name'] == 'gpufleet rollout')['forks'] == 50
    # every template but release is a node of a workflow
    in_flows = {template(f, i) for f in graphs for i in graphs[f] if kind(f, i) == 'job_template'}
    assert in_flows == {jt['name'] for jt in VARS['gpufleet_awx_job_templates']} - {'gpufleet release'}


def test_credential_type_reaches_awx_unrendered(run_playbook, awx_docs):
    ct_vars = VARS['gpufleet_awx_credential_type']
    ct = _render_workflows(run_playbook)[1]
    assert ct['name'] == 'gpufleet evidence repository' and ct['kind'] == 'cloud'
    assert ct['kind'] in awx_docs['awx.awx.credential_type']['options']['kind']['choices']
    fields = {f['id']: f for f in ct['inputs']['fields']}
    assert list(fields) == ['url', 'token', 'branch']
    assert all(f['type'] == 'string' for f in fields.values())
    assert fields['token'].get('secret') is True
    assert not fields['url'].get('secret') and not fields['branch'].get('secret')
    assert fields['branch'].get('default') == 'main'
    assert ct['inputs']['required'] == ['url']
    # AWX's own templates, literally: Ansible rendered none of them (it would have failed on the undefined names,
    # or produced empty strings)
    want = {'gpufleet_evidence_repo': '{{ url }}', 'gpufleet_evidence_token': '{{ token }}',
            'gpufleet_evidence_branch': '{{ branch }}'}
    assert ct['injectors'] == {'extra_vars': want}
    # ... because the vars file marks them !unsafe
    for key, value in ct_vars['injectors']['extra_vars'].items():
        assert isinstance(value, Unsafe) and value == want[key], key
    # the injected names are the playbooks' own inputs
    checkout = (REPO / 'playbooks' / 'tasks' / 'evidence_checkout.yml').read_text()
    for name in want:
        assert name in checkout, name


def _render_template_credentials(run_playbook, extravars):
    """The job template task's `credentials` as awx.awx.job_template receives them, over the task's own loop:
    {playbook: credentials}."""
    jt_task = next(t for t in _tasks()['tasks'] if 'awx.awx.job_template' in t)
    render = {'name': 'render credentials', 'ansible.builtin.set_fact': {
        'rendered_playbook': '{{ item.playbook }}', 'rendered_credentials': jt_task['awx.awx.job_template']['credentials']},
        'loop': jt_task['loop'], 'loop_control': jt_task['loop_control']}
    run = run_playbook([{'name': 'render', 'hosts': 'localhost', 'gather_facts': False,
                         'vars_files': [str(REPO / 'playbooks' / 'vars' / 'awx.yml')], 'tasks': [render]}],
                       extravars=extravars)
    assert run.rc == 0, run.stdout
    return {r['ansible_facts']['rendered_playbook']: r['ansible_facts']['rendered_credentials']
            for r in run.result('render credentials')['results']}


def test_the_approve_template_carries_the_controller_credential(run_playbook):
    """Issue 17: the approve job reads who approved the workflow's approval node from the AWX API, through a
    credential of AWX's built-in type "Red Hat Ansible Automation Platform" attached to its template only."""
    common = ['gpu-nodes ssh', 'gpu evidence repository']
    got = _render_template_credentials(run_playbook, {'gpufleet_awx_credentials': common,
                                                      'gpufleet_awx_controller_credential': 'gpu controller approvals'})
    assert set(got) == {jt['playbook'] for jt in VARS['gpufleet_awx_job_templates']}
    assert got.pop('playbooks/approve.yml') == common + ['gpu controller approvals']
    assert all(creds == common for creds in got.values()), got
    # without it (the default), every template carries the common credentials only
    plain = _render_template_credentials(run_playbook, {'gpufleet_awx_credentials': common})
    assert all(creds == common for creds in plain.values()), plain
    # the setup documents the input, and the approve playbook reads what that credential injects
    spec = _documented_inputs(SETUP)
    assert spec['gpufleet_awx_controller_credential']['default'] == ''
    approve = (REPO / 'playbooks' / 'approve.yml').read_text()
    assert 'gpufleet.upgrade.awx_approval_info' in approve and 'CONTROLLER_HOST' in approve


def test_unsafe_marking_is_what_keeps_the_injectors_literal(run_playbook, tmp_path):
    """The check above can fail: the same injectors without !unsafe are rendered by Ansible."""
    plain = (REPO / 'playbooks' / 'vars' / 'awx.yml').read_text().replace("!unsafe '{{ url }}'", "'{{ url }}'")
    (tmp_path / 'awx.yml').write_text(plain)
    run = run_playbook([{'name': 'render', 'hosts': 'localhost', 'gather_facts': False,
                         'vars_files': [str(tmp_path / 'awx.yml')], 'vars': {'url': 'rendered'},
                         'tasks': [{'name': 'render', 'ansible.builtin.set_fact': {
                             'inj': '{{ gpufleet_awx_credential_type.injectors }}'}}]}])
    assert run.rc == 0, run.stdout
    inj = run.result('render')['ansible_facts']['inj']['extra_vars']
    assert inj['gpufleet_evidence_repo'] == 'rendered' and inj['gpufleet_evidence_token'] == '{{ token }}'


def test_setup_validates_its_inputs_before_calling_the_controller(run_playbook, awx_env):
    env = {'ANSIBLE_COLLECTIONS_PATH': awx_env['ANSIBLE_COLLECTIONS_PATH']}
    run = run_playbook(str(SETUP), extravars={'gpufleet_awx_inventory': 'GPU fleet'}, envvars=env)
    assert run.rc != 0
    res = run.result('Check the inputs')
    assert res['_event'] == 'runner_on_failed'
    assert 'gpufleet_awx_project_scm_url' in res['msg'] and 'gpufleet_awx_ee_image' in res['msg']
    assert not run.task_results('Execution environment')


EVIDENCE_CHECKOUT = 'tasks/evidence_checkout.yml'


def _documented_inputs(playbook: pathlib.Path):
    """The argument_spec of the playbook's first task, when that task is ansible.builtin.validate_argument_spec (bad
    input then fails before anything else runs). The one thing allowed before it is the evidence play: a first play
    whose only task imports tasks/evidence_checkout.yml (the clone of the evidence repository, which itself refuses a
    file input outside the repository before anything else ran); the check is then the next play's first task."""
    plays = yaml.safe_load(playbook.read_text())
    for index, play in enumerate(plays[:2]):
        tasks = play.get('pre_tasks', []) + play.get('tasks', [])
        if not tasks:
            return None
        spec = tasks[0].get('ansible.builtin.validate_argument_spec')
        if spec is not None:
            return spec['argument_spec']
        only_checkout = (index == 0 and len(tasks) == 1
                         and tasks[0].get('ansible.builtin.import_tasks') == EVIDENCE_CHECKOUT)
        if not only_checkout:
            return None
    return None


def test_contract_checker_on_awx_setup_itself():
    spec = _documented_inputs(SETUP)
    assert spec is not None and spec['gpufleet_awx_project_scm_url']['required'] is True


def test_contract_checker_allows_only_the_evidence_checkout_first(tmp_path):
    check = {'name': 'Check', 'ansible.builtin.validate_argument_spec': {'argument_spec': {'gpufleet_x': {'type': 'str'}}}}
    evidence = {'name': 'Evidence', 'hosts': 'localhost',
                'tasks': [{'name': 'Clone', 'ansible.builtin.import_tasks': EVIDENCE_CHECKOUT}]}
    cases = {
        'first': ([{'hosts': 'all', 'tasks': [check]}], True),
        'after-evidence': ([evidence, {'hosts': 'all', 'tasks': [check]}], True),
        'in-evidence': ([{'hosts': 'localhost', 'tasks': [check, evidence['tasks'][0]]}], True),
        'after-other-task': ([{'hosts': 'all', 'tasks': [{'name': 'x', 'ansible.builtin.debug': {}}, check]}], False),
        'after-other-play': ([{'hosts': 'all', 'tasks': [{'name': 'x', 'ansible.builtin.debug': {}}]},
                              {'hosts': 'all', 'tasks': [check]}], False),
        'after-evidence-and-more': ([{'hosts': 'localhost', 'tasks': evidence['tasks'] + [{'name': 'x', 'ansible.builtin.debug': {}}]},
                                     {'hosts': 'all', 'tasks': [check]}], False),
        'second-of-play': ([evidence, {'hosts': 'all', 'tasks': [{'name': 'x', 'ansible.builtin.debug': {}}, check]}], False),
    }
    for name, (plays, documented) in cases.items():
        path = tmp_path / ('%s.yml' % name)
        path.write_text(yaml.safe_dump(plays))
        assert (_documented_inputs(path) is not None) is documented, name


# Survey question type -> the argument_spec types it can feed (a survey sends strings and numbers only).
SURVEY_TO_SPEC_TYPES = {'text': {'str', 'raw'}, 'textarea': {'str', 'raw'}, 'password': {'str', 'raw'},
                        'integer': {'int', 'raw'}, 'float': {'float', 'raw'},
                        'multiplechoice': {'str', 'bool', 'raw'}, 'multiselect': {'list'}}


def _survey(name):
    return next(j for j in VARS['gpufleet_awx_job_templates'] if j['playbook'] == 'playbooks/%s.yml' % name)['survey']


# What the evidence repository's credential (attached to every template) gives each job as extra vars.
CREDENTIAL_INPUTS = frozenset(VARS['gpufleet_awx_credential_type']['injectors']['extra_vars'])


def _contract_problems(spec, survey, supplied=frozenset()):
    """Every way the survey and the playbook's argument_spec disagree, as readable strings. `supplied`: the inputs
    a credential of every template injects, so that the survey need not ask them."""
    if spec is None:
        return ['the playbook has no ansible.builtin.validate_argument_spec task documenting its inputs']
    problems = []
    asked = {q['variable']: q for q in survey}
    for var in sorted(set(asked) - set(spec)):
        problems.append('survey variable %s is not documented by the playbook' % var)
    for var in sorted(k for k, v in spec.items() if v.get('required')):
        if var not in asked and var in supplied:
            continue
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
    assert not _contract_problems(_documented_inputs(path), _survey(name), CREDENTIAL_INPUTS), path


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
    # an input the credential injects need not be asked; any other still must
    assert _contract_problems(spec, good[1:], frozenset({'gpufleet_plan_file'})) == []
    assert _contract_problems(spec, good[1:], CREDENTIAL_INPUTS) == [
        'required input gpufleet_plan_file is not asked by the survey']
    assert 'gpufleet_evidence_repo' in CREDENTIAL_INPUTS
