"""The pure decisions of evidence_repo: redaction, remotes, inputs, push classification and retries, the askpass
helper and git's environment, and what git prints."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence_repo as er

SHA = '3f1c2a9b0d4e5f60718293a4b5c6d7e8f9012345'

# git 2.39's stderr for the pushes it refuses.
FETCH_FIRST = """To /tmp/evidence.git
 ! [rejected]        HEAD -> main (fetch first)
error: failed to push some refs to '/tmp/evidence.git'
hint: Updates were rejected because the remote contains work that you do
hint: not have locally. This is usually caused by another repository pushing
hint: to the same ref. You may want to first integrate the remote changes
hint: (e.g., 'git pull ...') before pushing again.
hint: See the 'Note about fast-forwards' in 'git push --help' for details."""
NON_FF = """To /tmp/evidence.git
 ! [rejected]        HEAD -> main (non-fast-forward)
error: failed to push some refs to '/tmp/evidence.git'
hint: Updates were rejected because a pushed branch tip is behind its remote"""
STALE = """To /tmp/evidence.git
 ! [rejected]        HEAD -> main (stale info)
error: failed to push some refs to '/tmp/evidence.git'"""
HOOK = """remote: evidence is frozen
To /tmp/hooked.git
 ! [remote rejected] HEAD -> main (pre-receive hook declined)
error: failed to push some refs to '/tmp/hooked.git'"""
PERMISSION = """remote: Permission to gpu/evidence.git denied to ada.
fatal: unable to access 'https://git.example.com/gpu/evidence.git/': The requested URL returned error: 403"""
UNREACHABLE = """fatal: unable to access 'https://127.0.0.1:9/x.git/': Failed to connect to 127.0.0.1 port 9 after 0 ms: \
Couldn't connect to server"""


# --------------------------------------------------------------------------------------------
# Redaction and remotes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('text, secrets, expected', [
    ('fatal: https://ada:hunter2@git.example.com/x.git', [], 'fatal: https://***@git.example.com/x.git'),
    ('token s3cr3t in s3cr3t', ['s3cr3t'], 'token *** in ***'),
    ('no secret here', [None, ''], 'no secret here'),
    ('ssh://git@host/x and http://u@p/y', [], 'ssh://***@host/x and http://***@p/y'),
    ('abcdef and abc', ['abc', 'abcdef'], '*** and ***'),
    ('https://host/x.git', [], 'https://host/x.git'),
])
def test_redact(text, secrets, expected):
    assert er.redact(text, secrets) == expected


def test_redact_takes_anything():
    assert er.redact(ValueError('https://a:b@h/x'), ['b']) == 'https://***@h/x'


@pytest.mark.parametrize('remote, kind', [
    ('https://git.example.com/gpu/evidence.git', 'https'),
    ('http://git.example.com/x', 'http'),
    ('ssh://git@git.example.com/gpu/evidence.git', 'ssh'),
    ('git@git.example.com:gpu/evidence.git', 'ssh'),
    ('host:evidence.git', 'ssh'),
    ('file:///srv/evidence.git', 'file'),
    ('/srv/evidence.git', 'file'),
    ('./evidence.git', 'file'),
    ('evidence.git', 'file'),
])
def test_remote_kind(remote, kind):
    assert er.remote_kind(remote) == kind


@pytest.mark.parametrize('remote', ['https://git.example.com/x.git', 'ssh://git@host/x.git', 'git@host:x.git',
                                    '/srv/evidence.git', 'file:///srv/evidence.git'])
def test_check_remote_accepts(remote):
    assert er.check_remote(remote) == remote


@pytest.mark.parametrize('remote, shown', [
    ('https://ada:hunter2@git.example.com/x.git', 'https://***@git.example.com/x.git'),
    ('https://ghp_tokenvalue@git.example.com/x.git', 'https://***@git.example.com/x.git'),
    ('ssh://git:hunter2@host/x.git', 'ssh://***@host/x.git'),
])
def test_check_remote_refuses_credentials_without_echoing_them(remote, shown):
    with pytest.raises(er.RepoError) as info:
        er.check_remote(remote)
    msg = str(info.value)
    assert msg.startswith('remote: %s embeds credentials' % shown)
    assert 'hunter2' not in msg and 'ghp_tokenvalue' not in msg and 'ada' not in msg


@pytest.mark.parametrize('remote', [None, '', '  ', 3, 'https://h/x\n'])
def test_check_remote_refuses_non_urls(remote):
    with pytest.raises(er.RepoError, match='^remote: '):
        er.check_remote(remote)


@pytest.mark.parametrize('a, b, same', [
    ('/srv/evidence.git', 'file:///srv/evidence.git', True),
    ('/srv/evidence.git/', '/srv/evidence', True),
    ('https://h/gpu/evidence.git', 'https://h/gpu/evidence', True),
    ('https://h/gpu/evidence.git', 'https://h/gpu/other.git', False),
    ('/srv/a.git', '/srv/b.git', False),
])
def test_same_remote(a, b, same):
    assert er.same_remote(a, b) is same


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('value, expected', [
    (None, None), (SHA, SHA), (SHA.upper(), SHA), ('main', 'main'), ('release/2026-12', 'release/2026-12'),
    ('v1.2.3', 'v1.2.3'),
])
def test_check_revision_accepts(value, expected):
    assert er.check_revision(value) == expected


@pytest.mark.parametrize('value, why', [
    ('3f1c2a9', 'abbreviated'), ('a..b', 'neither'), ('-rf', 'neither'), ('x y', 'neither'), ('x~1', 'neither'),
    ('HEAD^', 'neither'), ('a.lock', 'neither'), ('', 'neither'), (5, 'neither'), ('x:y', 'neither'),
])
def test_check_revision_refuses(value, why):
    with pytest.raises(er.RepoError, match='^revision: .*%s' % why):
        er.check_revision(value)


@pytest.mark.parametrize('value', ['main', 'evidence/2026', 'gpu-rollout'])
def test_check_branch_accepts(value):
    assert er.check_branch(value) == value


@pytest.mark.parametrize('value', ['', '/main', 'main/', 'ma..in', 'a b', '.hidden', 'x/.y', 'a@{1}', None, '@'])
def test_check_branch_refuses(value):
    with pytest.raises(er.RepoError, match='^branch: .* is not a valid branch or tag name'):
        er.check_branch(value)


def test_check_paths_normalises_and_dedups():
    assert er.check_paths(['bundles/a.json', './bundles/a.json', 'reports/', 'plan.yml']) == \
        ['bundles/a.json', 'reports', 'plan.yml']


@pytest.mark.parametrize('paths, msg', [
    (['ok', '../other/x'], r'^paths\[1\]: "\.\./other/x" escapes dest'),
    (['a/../../x'], r'^paths\[0\]: "a/\.\./\.\./x" escapes dest'),
    (['a/..'], r'escapes dest'),
    (['/etc/passwd'], r'^paths\[0\]: "/etc/passwd" is absolute'),
    (['~/x'], r'is absolute'),
    (['.git/config'], r'inside \.git'),
    ([''], r'^paths\[0\]: "" is not a path'),
    ([3], r'^paths\[0\]: 3 is not a path'),
    ([], r'^paths: give at least one path'),
    (None, r'^paths: give at least one path'),
])
def test_check_paths_refuses(paths, msg):
    with pytest.raises(er.RepoError, match=msg):
        er.check_paths(paths)


def test_check_author():
    er.check_author('Ada Operator', 'ada@example.com')
    with pytest.raises(er.RepoError, match='^author_name: "" '):
        er.check_author('', 'ada@example.com')
    with pytest.raises(er.RepoError, match='^author_name: .*awx_user_name'):
        er.check_author('Ada <x>', 'ada@example.com')
    with pytest.raises(er.RepoError, match='^author_email: "ada" is not an e-mail'):
        er.check_author('Ada', 'ada')
    with pytest.raises(er.RepoError, match='^author_email: None'):
        er.check_author('Ada', None)


@pytest.mark.parametrize('value, ok', [(1, True), (100, True), (0, False), (101, False), (True, False), ('5', False)])
def test_check_count(value, ok):
    if ok:
        assert er.check_count(value, 'push_retries', 1, 100) == value
    else:
        with pytest.raises(er.RepoError, match='^push_retries: .* must be an integer from 1 to 100'):
            er.check_count(value, 'push_retries', 1, 100)


# --------------------------------------------------------------------------------------------
# Push
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize('stderr, kind', [
    (FETCH_FIRST, er.NON_FAST_FORWARD),
    (NON_FF, er.NON_FAST_FORWARD),
    (STALE, er.NON_FAST_FORWARD),        # the push's lease: the remote is no longer at the head it was made on
    (HOOK, er.REFUSED),
    (PERMISSION, er.REFUSED),
    ('remote: error: GH006: Protected branch update failed for refs/heads/main.', er.REFUSED),
    (UNREACHABLE, er.OTHER),
    ('', er.OTHER),
])
def test_classify_push(stderr, kind):
    assert er.classify_push(stderr) == kind


def test_a_push_takes_only_on_the_head_the_commits_are_on():
    """The lease names the head the job's commits are on (empty: the branch must not exist yet); HEAD always
    descends from it, so the push is a fast-forward or nothing."""
    assert er.push_args('main', SHA) == ['push', '-q', '--force-with-lease=refs/heads/main:' + SHA, 'origin',
                                         'HEAD:refs/heads/main']
    assert er.push_args('evidence/x', None) == ['push', '-q', '--force-with-lease=refs/heads/evidence/x:', 'origin',
                                                'HEAD:refs/heads/evidence/x']


def test_a_retried_push_rebases_only_the_commits_after_the_start():
    """2026-12-06 review T3-7: never a bare `git rebase <new head>`, which replays what a force-push took out."""
    new = 'a' * 40
    assert er.rebase_args(SHA, new) == ['rebase', '-q', '--onto', new, SHA]
    assert er.rebase_args(None, new) == ['rebase', '-q', '--onto', new, '--root']


def test_the_rewritten_message_names_the_branch_the_start_and_the_new_head():
    new = 'a' * 40
    msg = er.rewritten('/srv/evidence.git', 'main', SHA, new)
    assert msg.startswith('push to /srv/evidence.git: the branch main was rewritten since revision %s (its head is '
                          'now %s): ' % (SHA, new))
    assert 'Nothing was pushed' in msg and 'state=present' in msg
    assert '(it no longer exists)' in er.rewritten('/srv/evidence.git', 'main', SHA, None)


@pytest.mark.parametrize('kind, attempt, retries, retry', [
    (er.NON_FAST_FORWARD, 1, 5, True),
    (er.NON_FAST_FORWARD, 4, 5, True),
    (er.NON_FAST_FORWARD, 5, 5, False),
    (er.NON_FAST_FORWARD, 1, 1, False),
    (er.REFUSED, 1, 5, False),
    (er.OTHER, 1, 5, False),
])
def test_should_retry(kind, attempt, retries, retry):
    assert er.should_retry(kind, attempt, retries) is retry


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

def test_askpass_script_echoes_the_environment(tmp_path):
    script = tmp_path / 'askpass.sh'
    script.write_text(er.askpass_script())
    script.chmod(0o700)
    assert 's3cr3t' not in er.askpass_script()
    env = dict(os.environ, **er.git_env(10, str(script), 's3cr3t', 'ada', remote='https://git.example.com/ev.git'))

    def ask(prompt: str) -> str:
        return subprocess.run([str(script), prompt], env=env, capture_output=True, text=True, check=True).stdout

    assert ask("Username for 'https://git.example.com': ") == 'ada\n'
    assert ask("Password for 'https://ada@git.example.com': ") == 's3cr3t\n'


def test_git_env_with_token():
    env = er.git_env(30, '/tmp/x/askpass.sh', 's3cr3t', 'ada', remote='https://git.example.com/ev.git')
    assert env['GIT_TERMINAL_PROMPT'] == '0' and env['LC_ALL'] == 'C'
    assert env['GIT_ASKPASS'] == '/tmp/x/askpass.sh'
    assert env[er.ENV_TOKEN] == 's3cr3t' and env[er.ENV_USERNAME] == 'ada'
    ssh = shlex.split(env['GIT_SSH_COMMAND'])
    assert 'BatchMode=yes' in ssh and 'ConnectTimeout=30' in ssh and '-i' not in ssh


def test_git_env_with_key_file_and_no_token():
    env = er.git_env(60, key_file='/run/keys/evidence key')
    ssh = shlex.split(env['GIT_SSH_COMMAND'])
    assert ssh[ssh.index('-i') + 1] == '/run/keys/evidence key'
    assert 'IdentitiesOnly=yes' in ssh and 'BatchMode=yes' in ssh
    assert er.ENV_TOKEN not in env and 'GIT_ASKPASS' not in env and env['GIT_TERMINAL_PROMPT'] == '0'


def test_git_env_token_needs_askpass():
    with pytest.raises(ValueError):
        er.git_env(60, None, 's3cr3t')


def test_author_env_is_author_and_committer():
    assert er.author_env('Ada', 'ada@example.com') == {
        'GIT_AUTHOR_NAME': 'Ada', 'GIT_AUTHOR_EMAIL': 'ada@example.com',
        'GIT_COMMITTER_NAME': 'Ada', 'GIT_COMMITTER_EMAIL': 'ada@example.com'}


def test_no_credential_helper_on_the_command_line():
    assert er.GIT_OPTIONS[:2] == ['-c', 'credential.helper=']


# --------------------------------------------------------------------------------------------
# Output of git
# --------------------------------------------------------------------------------------------

def test_porcelain_paths():
    out = ' M bundles/a.json\0?? reports/b html\0R  new.txt\0old.txt\0A  c.txt\0'
    assert er.porcelain_paths(out) == ['bundles/a.json', 'reports/b html', 'new.txt', 'c.txt']
    assert er.porcelain_paths('') == []


def test_name_list():
    assert er.name_list('a\0b c\0') == ['a', 'b c']
    assert er.name_list('') == []


def test_ls_remote_refs_and_resolve_name():
    out = ('%s\tHEAD\n%s\trefs/heads/main\n%s\trefs/tags/v1\n%s\trefs/tags/v1^{}\n%s\trefs/tags/light\nnoise\n'
           % (SHA, SHA, 'a' * 40, 'b' * 40, 'c' * 40))
    refs = er.ls_remote_refs(out)
    assert refs['refs/heads/main'] == SHA and 'noise' not in refs
    assert er.resolve_name(refs, 'main') == SHA
    assert er.resolve_name(refs, 'v1') == 'b' * 40          # an annotated tag: its commit
    assert er.resolve_name(refs, 'light') == 'c' * 40
    assert er.resolve_name(refs, 'refs/heads/main') == SHA
    assert er.resolve_name(refs, 'nope') is None


def test_git_takes_the_token_from_the_askpass_helper_without_a_terminal(tmp_path):
    """git's own credential prompt (what an https fetch or push asks) is answered by the helper, with prompts
    on the terminal disabled, and nothing but the helper's path is in the environment's askpass."""
    script = tmp_path / 'askpass.sh'
    script.write_text(er.askpass_script())
    script.chmod(0o700)
    env = dict(os.environ, **er.git_env(10, str(script), 's3cr3t', 'ada', remote='https://git.example.com/ev.git'))
    out = subprocess.run(['git'] + er.GIT_OPTIONS + ['credential', 'fill'], env=env, capture_output=True, text=True,
                         input='protocol=https\nhost=git.example.com\n\n', timeout=20, check=True).stdout
    assert 'username=ada\n' in out and 'password=s3cr3t\n' in out


@pytest.mark.parametrize('asked', [
    'protocol=https\nhost=evil.example.com\n',             # another host (a redirect, a submodule)
    'protocol=https\nhost=git.example.com.evil.test\n',
    'protocol=https\nhost=git.example.com:8443\n',         # another port
    'protocol=http\nhost=git.example.com\n',               # in clear
])
def test_the_askpass_helper_answers_only_its_remotes_host(tmp_path, asked):
    """2026-12-06 review T3-12: git's own prompts, through the real git; the token goes to no other origin."""
    script = tmp_path / 'askpass.sh'
    script.write_text(er.askpass_script())
    script.chmod(0o700)
    env = dict(os.environ, **er.git_env(10, str(script), 's3cr3t', 'ada', remote='https://git.example.com/ev.git'))
    run = subprocess.run(['git'] + er.GIT_OPTIONS + ['credential', 'fill'], env=env, capture_output=True, text=True,
                         input=asked + '\n', timeout=20, check=False)
    assert 's3cr3t' not in run.stdout and 'password=' not in run.stdout
    assert run.returncode != 0


@pytest.mark.parametrize('remote', ['http://git.example.com/ev.git', 'ssh://git@git.example.com/ev.git',
                                    'git@git.example.com:ev.git', '/srv/ev.git', 'file:///srv/ev.git'])
def test_a_token_is_only_for_an_https_remote(remote):
    with pytest.raises(er.RepoError) as exc:
        er.git_env(10, '/tmp/x/askpass.sh', 's3cr3t', 'ada', remote=remote)
    assert str(exc.value) == ('token: given for the remote %s, which is not an https URL; a token is sent only over '
                              'https (use key_file for an ssh remote)' % er.redact(remote))


def test_prompt_urls_name_the_host_as_git_does():
    assert er.prompt_urls('https://git.example.com:8443/org/ev.git', 'a@b') == (
        'https://git.example.com:8443', 'https://a%40b@git.example.com:8443')


def test_git_follows_no_redirect():
    assert '-c' in er.GIT_OPTIONS and 'http.followRedirects=false' in er.GIT_OPTIONS


# ---------------------------------------------------------------------------- the playbooks' side


def test_repo_path_puts_a_relative_input_under_the_clone_and_refuses_the_rest():
    assert er.repo_path('plans/plan.json', '', 'gpufleet_plan_file') == 'plans/plan.json'       # no repository
    assert er.repo_path('/abs/plan.json', '', 'gpufleet_plan_file') == '/abs/plan.json'
    assert er.repo_path('plans//./plan.json', '/tmp/c/repo', 'gpufleet_plan_file') == '/tmp/c/repo/plans/plan.json'
    assert er.repo_path('', '/tmp/c/repo', 'gpufleet_evidence') == '' and er.repo_path(None, '/r', 'x') == ''
    for bad, why in (('/etc/plan.json', 'is absolute'), ('~/plan.json', 'is absolute'),
                     ('plans/../../x', 'escapes the evidence repository'), ('.git/config', 'is inside .git')):
        with pytest.raises(er.RepoError, match='gpufleet_plan_file: .*' + why):
            er.repo_path(bad, '/r', 'gpufleet_plan_file')
    with pytest.raises(er.RepoError, match='gpufleet_evidence: 3 is not a path'):
        er.repo_path(3, '/r', 'gpufleet_evidence')


def test_without_a_repository_a_relative_input_is_resolved_against_the_working_directory():
    # Review H5: a collection playbook's modules run in the installed collection's playbooks/ directory, so a
    # relative path handed on as given lands inside the collection.
    assert er.repo_path('plan.json', '', 'gpufleet_plan_file', '/home/ops/fleet') == '/home/ops/fleet/plan.json'
    assert er.repo_path('q/../q2', '', 'gpufleet_qualification_dir', '/w') == '/w/q2'
    assert er.repo_path('/abs/plan.json', '', 'gpufleet_plan_file', '/w') == '/abs/plan.json'
    assert er.repo_path('~/plan.json', '', 'gpufleet_plan_file', '/w') == os.path.expanduser('~/plan.json')
    # With a repository the working directory plays no part.
    assert er.repo_path('plans/p.json', '/r', 'gpufleet_plan_file', '/w') == '/r/plans/p.json'


def test_user_path():
    assert er.user_path('snapshots', '/home/ops', 'gpufleet_snapshot_dir') == '/home/ops/snapshots'
    assert er.user_path('', '/home/ops', 'x') == '' and er.user_path(None, '/w', 'x') == ''
    assert er.user_path('/srv/q/', '/w', 'x') == '/srv/q'
    with pytest.raises(er.RepoError, match='gpufleet_snapshot_dir: "snapshots" is relative and there is no absolute '
                                           'working directory'):
        er.user_path('snapshots', '', 'gpufleet_snapshot_dir')
    with pytest.raises(er.RepoError, match='gpufleet_snapshot_dir: 7 is not a path'):
        er.user_path(7, '/w', 'gpufleet_snapshot_dir')


def test_the_filters_resolve_against_the_process_working_directory(tmp_path, monkeypatch):
    from ansible.errors import AnsibleFilterError
    from ansible_collections.gpufleet.upgrade.plugins.filter import evidence_repo as F
    monkeypatch.chdir(tmp_path)
    assert F.evidence_path('plan.json', '', 'gpufleet_plan_file') == str(tmp_path / 'plan.json')
    assert F.user_path('snapshots', 'gpufleet_snapshot_dir') == str(tmp_path / 'snapshots')
    with pytest.raises(AnsibleFilterError, match='gpufleet.upgrade.user_path: gpufleet_snapshot_dir: 7 is not a path'):
        F.user_path(7, 'gpufleet_snapshot_dir')


def test_repo_relative_keeps_what_is_inside_the_clone():
    paths = ['/r/c/plans/plan.json', '/r/c/qualification', '', None, '/elsewhere/x', '/r/c/plans/plan.json', '/r/cc/x']
    assert er.repo_relative(paths, '/r/c') == ['plans/plan.json', 'qualification']
    assert er.repo_relative(paths, '') == []


ALICE = {'commit': 'a' * 40, 'name': 'alice', 'email': 'alice@example.com'}


def test_self_approvals_refuse_the_canary_operator_by_name_or_address_and_an_unknown_author():
    approvals = {'q/a.yaml': 'bob', 'q/b.yaml': 'Alice', 'q/c.yaml': 'ALICE@example.com', 'q/d.yaml': 'bob', 'q/e.yaml': ''}
    authors = {'q/a.yaml': ALICE, 'q/b.yaml': ALICE, 'q/c.yaml': ALICE, 'q/d.yaml': None, 'q/e.yaml': ALICE}
    problems = er.self_approvals(approvals, authors)
    assert [p.split(':')[0] for p in problems] == ['q/b.yaml', 'q/c.yaml', 'q/d.yaml', 'q/e.yaml']
    assert 'approved by "Alice", who ran its canary (commit aaaaaaaaaaaa by alice <alice@example.com>)' in problems[0]
    assert 'who ran its canary is unknown' in problems[2] and problems[3] == 'q/e.yaml: approvedBy is empty'
    assert er.self_approvals({'q/a.yaml': 'bob'}, {'q/a.yaml': ALICE}) == []
    with pytest.raises(er.RepoError, match='are not mappings'):
        er.self_approvals(['q/a.yaml'], {})


def info(state='qualified', approved='', problems=('approvedBy is required',)):
    return {'record': {'state': state, 'approvedBy': approved}, 'problems': list(problems)}


def test_approval_problems_only_a_second_operator_approves_qualified_records():
    authors = {'q/a.yaml': ALICE, 'q/b.yaml': ALICE}
    assert er.approval_problems({'q/a.yaml': info(), 'q/b.yaml': info()}, 'bob', authors) == []
    # the same approver again (idempotent), another approver, a failed canary, another problem, a record that
    # does not load, the canary's operator
    assert er.approval_problems({'q/a.yaml': info(approved='bob', problems=())}, 'bob', authors) == []
    assert er.approval_problems({'q/a.yaml': info(approved='carol', problems=())}, 'bob', authors) == [
        'q/a.yaml: already approved by "carol"']
    assert er.approval_problems({'q/a.yaml': info(state='failed')}, 'bob', authors) == [
        'q/a.yaml: state is "failed", not qualified: a failed canary is not approved']
    assert er.approval_problems({'q/a.yaml': info(problems=('approvedBy is required', 'canary checks must all pass'))},
                                'bob', authors) == ['q/a.yaml: canary checks must all pass']
    assert er.approval_problems({'q/a.yaml': {'msg': 'not YAML'}}, 'bob', authors)[0] == \
        'q/a.yaml: the record does not load (not YAML)'
    assert 'who ran its canary' in er.approval_problems({'q/a.yaml': info()}, 'alice', authors)[0]
    assert er.approval_problems({'q/a.yaml': info()}, '', authors)[0].startswith('approver: ')
    with pytest.raises(er.RepoError, match='records: '):
        er.approval_problems({}, 'bob', authors)
