"""gpufleet.upgrade.evidence_repo through ansible-playbook (ansible-runner) with the real git and bare repositories
in tmp_path: clone at the head and at a revision, commit and push as the operator, nothing to commit, a lost push
race retried on the new head (no force), a push a hook refuses, unreachable remotes, a revision that does not
exist, credentials in the URL, a path escaping dest, and check mode writing nothing."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

pytestmark = pytest.mark.slow

TOKEN = 's3cr3t-token'
URL_SECRET = 'hunter2-in-url'
OPERATOR = {'author_name': 'Ada Operator', 'author_email': 'ada@example.com'}
GIT_ENV = {'GIT_AUTHOR_NAME': 'seed', 'GIT_AUTHOR_EMAIL': 'seed@example.com', 'GIT_COMMITTER_NAME': 'seed',
           'GIT_COMMITTER_EMAIL': 'seed@example.com', 'GIT_CONFIG_NOSYSTEM': '1', 'LC_ALL': 'C'}


def git(*args: str, cwd: pathlib.Path | None = None, check: bool = True) -> str:
    env = dict(os.environ, **GIT_ENV)
    return subprocess.run(['git', *args], cwd=cwd, env=env, check=check, capture_output=True, text=True).stdout.strip()


def bare_repo(tmp_path: pathlib.Path, name: str, commits: int = 2) -> tuple[pathlib.Path, list[str]]:
    """A bare repository on branch main with `commits` seed commits (their shas, oldest first)."""
    bare = tmp_path / ('%s.git' % name)
    git('init', '-q', '--bare', '-b', 'main', str(bare))
    work = tmp_path / ('%s-seed' % name)
    git('init', '-q', '-b', 'main', str(work))
    shas = []
    for i in range(commits):
        (work / ('seed-%d.txt' % i)).write_text('seed %d\n' % i)
        git('add', '.', cwd=work)
        git('commit', '-q', '-m', 'seed %d' % i, cwd=work)
        shas.append(git('rev-parse', 'HEAD', cwd=work))
    if commits:
        git('push', '-q', str(bare), 'main', cwd=work)
    return bare, shas


def task(name: str, args: dict, check: bool = False, diff: bool = False) -> dict:
    return {'name': name, 'gpufleet.upgrade.evidence_repo': args, 'register': 'out', 'ignore_errors': True,
            'check_mode': check, 'diff': diff}


def write(name: str, path: pathlib.Path, content: str) -> dict:
    return {'name': name, 'ansible.builtin.copy': {'dest': str(path), 'content': content, 'mode': '0644'}}


def play(tasks: list[dict]) -> list[dict]:
    return [{'name': 'evidence_repo', 'hosts': 'localhost', 'gather_facts': False, 'tasks': tasks}]


def everything(run) -> str:
    return run.stdout + json.dumps(run.events, default=str)


def test_clone_at_head_and_revision_and_refusals(run_playbook, tmp_path):
    bare, (first, head) = bare_repo(tmp_path, 'evidence')
    git('tag', 'v1', first, cwd=bare)
    other = bare_repo(tmp_path, 'other', commits=1)[0]
    d = {k: tmp_path / k for k in ('check', 'head', 'rev', 'tag', 'missing', 'unreachable', 'https', 'userinfo',
                                   'http')}
    remote = str(bare)
    hung = tmp_path / 'hung-bin'
    hung.mkdir()
    (hung / 'git').write_text('#!/bin/sh\nsleep 30\n')
    (hung / 'git').chmod(0o755)
    stuck = dict(task('hung git', {'remote': remote, 'dest': str(tmp_path / 'hung'), 'timeout': 1}),
                 environment={'PATH': '%s:%s' % (hung, os.environ['PATH'])})
    run = run_playbook(play([
        stuck,
        task('check', {'remote': remote, 'dest': str(d['check'])}, check=True, diff=True),
        task('head', {'remote': remote, 'dest': str(d['head'])}),
        task('head again', {'remote': remote, 'dest': str(d['head'])}),
        task('rev', {'remote': 'file://' + remote, 'dest': str(d['rev']), 'revision': first}),
        task('rev to head', {'remote': 'file://' + remote, 'dest': str(d['rev']), 'revision': head}, diff=True),
        task('tag', {'remote': remote, 'dest': str(d['tag']), 'revision': 'v1'}),
        task('missing revision', {'remote': remote, 'dest': str(d['missing']), 'revision': 'f' * 40}),
        task('missing name', {'remote': remote, 'dest': str(d['missing']), 'revision': 'no-such-branch'}),
        task('unreachable', {'remote': str(tmp_path / 'nowhere.git'), 'dest': str(d['unreachable'])}),
        task('https', {'remote': 'https://127.0.0.1:9/x.git', 'dest': str(d['https']), 'token': TOKEN,
                       'timeout': 20}),
        task('userinfo', {'remote': 'https://ada:%s@git.example.com/x.git' % URL_SECRET, 'dest': str(d['userinfo'])}),
        task('http token', {'remote': 'http://127.0.0.1:9/x.git', 'dest': str(d['http']), 'token': TOKEN}),
        task('other remote', {'remote': str(other), 'dest': str(d['head'])}),
    ]))
    assert run.rc == 0, run.stdout[-3000:]

    res = run.result('check')
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['action'] == 'cloned', res
    assert res['revision'] == head and res['diff']['after']['revision'] == head
    assert not d['check'].exists()

    res = run.result('head')
    assert res['_event'] == 'runner_on_ok' and res['changed'] is True and res['revision'] == head, res.get('msg')
    assert git('rev-parse', 'HEAD', cwd=d['head']) == head
    assert git('symbolic-ref', '--short', 'HEAD', cwd=d['head']) == 'main'
    assert (d['head'] / 'seed-1.txt').read_text() == 'seed 1\n'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith('.head-')] == []
    assert run.result('head again')['changed'] is False

    res = run.result('rev')
    assert res['changed'] is True and res['revision'] == first, res.get('msg')
    res = run.result('rev to head')
    assert res['changed'] is True and res['action'] == 'moved' and res['revision'] == head, res.get('msg')
    assert res['diff']['before'] == {'revision': first, 'files': []}
    assert res['diff']['after'] == {'revision': head, 'files': ['seed-1.txt']}
    assert git('rev-parse', 'HEAD', cwd=d['rev']) == head
    assert git('symbolic-ref', '--short', 'HEAD', cwd=d['rev']) == 'main'
    res = run.result('tag')
    assert res['revision'] == first and git('rev-parse', 'HEAD', cwd=d['tag']) == first

    res = run.result('missing revision')
    assert res['_event'] == 'runner_on_failed' and 'revision %s does not exist in %s' % ('f' * 40, remote) in res['msg']
    res = run.result('missing name')
    assert res['_event'] == 'runner_on_failed' and 'revision no-such-branch does not exist' in res['msg']
    assert not d['missing'].exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith('.missing-')] == []

    res = run.result('unreachable')
    assert res['_event'] == 'runner_on_failed' and str(tmp_path / 'nowhere.git') in res['msg'], res
    assert not d['unreachable'].exists()
    res = run.result('https')
    assert res['_event'] == 'runner_on_failed' and 'https://127.0.0.1:9/x.git' in res['msg'], res
    assert not d['https'].exists()

    res = run.result('http token')      # 2026-12-06 review T3-12: a token never goes over http
    assert res['_event'] == 'runner_on_failed', res
    assert res['msg'] == ('token: given for the remote http://127.0.0.1:9/x.git, which is not an https URL; a token is '
                          'sent only over https (use key_file for an ssh remote)')
    assert not d['http'].exists()

    res = run.result('userinfo')
    assert res['_event'] == 'runner_on_failed' and 'remote' in res['msg'], res
    assert 'https://***@git.example.com/x.git' in res['msg'] and 'credentials' in res['msg']
    assert not d['userinfo'].exists()

    res = run.result('hung git')
    assert res['_event'] == 'runner_on_failed' and 'git ls-remote did not finish within 1 s' in res['msg'], res
    assert not (tmp_path / 'hung').exists()

    res = run.result('other remote')
    assert res['_event'] == 'runner_on_failed' and 'is a clone of %s' % remote in res['msg'], res

    seen = everything(run)
    assert TOKEN not in seen and URL_SECRET not in seen
    assert not list(pathlib.Path('/tmp').glob('gpufleet-askpass-*'))


def test_commit_push_race_and_refusal(run_playbook, tmp_path):
    bare, (_first, head) = bare_repo(tmp_path, 'evidence')
    hooked = bare_repo(tmp_path, 'hooked')[0]
    hook = hooked / 'hooks' / 'pre-receive'
    hook.write_text('#!/bin/sh\necho "evidence is frozen" >&2\nexit 1\n')
    hook.chmod(0o755)
    empty = bare_repo(tmp_path, 'empty', commits=0)[0]
    a, b, c, e = tmp_path / 'a', tmp_path / 'b', tmp_path / 'c', tmp_path / 'e'
    hooked_head = git('rev-parse', 'main', cwd=hooked)
    commit = dict(OPERATOR, state='committed', remote=str(bare), commit_message='canary evidence')
    run = run_playbook(play([
        task('clone a', {'remote': str(bare), 'dest': str(a), 'revision': head}),
        task('clone b', {'remote': str(bare), 'dest': str(b), 'revision': head}),
        {'name': 'dirs', 'ansible.builtin.file': {'path': '{{ item }}', 'state': 'directory', 'mode': '0755'},
         'loop': [str(a / 'bundles'), str(b / 'reports')]},
        write('file a', a / 'bundles' / 'a.json', '{"a": 1}\n'),
        write('file b', b / 'reports' / 'b.html', '<p>b</p>\n'),
        task('commit check', dict(commit, dest=str(a), paths=['bundles']), check=True),
        task('commit a', dict(commit, dest=str(a), paths=['bundles']), diff=True),
        task('commit a again', dict(commit, dest=str(a), paths=['bundles'])),
        task('commit b', dict(commit, dest=str(b), paths=['reports/b.html'], author_name='Bob Operator',
                              author_email='bob@example.com')),
        task('escape', dict(commit, dest=str(a), paths=['../b/reports'])),
        task('absent', dict(commit, dest=str(a), paths=['bundles/none.json'])),
        task('clone f', {'remote': str(bare), 'dest': str(tmp_path / 'f')}),
        task('clone g', {'remote': str(bare), 'dest': str(tmp_path / 'g')}),
        write('file f', tmp_path / 'f' / 'seed-0.txt', 'from f\n'),
        write('file g', tmp_path / 'g' / 'seed-0.txt', 'from g\n'),
        task('commit f', dict(commit, dest=str(tmp_path / 'f'), paths=['seed-0.txt'])),
        task('commit g', dict(commit, dest=str(tmp_path / 'g'), paths=['seed-0.txt'])),
        task('clone hooked', {'remote': str(hooked), 'dest': str(c)}),
        write('file c', c / 'c.txt', 'c\n'),
        task('commit hooked', dict(commit, remote=str(hooked), dest=str(c), paths=['c.txt'])),
        task('present dirty', {'remote': str(hooked), 'dest': str(c)}),
        task('clone empty', {'remote': str(empty), 'dest': str(e)}),
        write('file e', e / 'plan.yml', 'plan: 1\n'),
        task('commit empty', dict(commit, remote=str(empty), dest=str(e), paths=['plan.yml'])),
        task('commit what exists', dict(commit, dest=str(a), paths=['bundles/none.json', 'bundles'],
                                        ignore_missing=True)),
        task('authors', {'remote': str(bare), 'dest': str(tmp_path / 'h'),
                         'authors_of': ['bundles/a.json', 'reports/b.html', 'nowhere.txt']}),
    ]))
    assert run.rc == 0, run.stdout[-3000:]

    res = run.result('commit check')
    assert res['changed'] is True and res['files'] == ['bundles/a.json'] and res['pushed'] is False, res
    res = run.result('commit a')
    assert res['_event'] == 'runner_on_ok' and res['pushed'] is True and res['attempts'] == 1, res.get('msg')
    first_push = res['revision']
    assert res['parent'] == head and res['files'] == ['bundles/a.json']
    assert res['diff']['after'] == {'revision': first_push, 'files': ['bundles/a.json']}
    assert git('log', '-1', '--format=%an <%ae>|%cn <%ce>|%s', first_push, cwd=bare) == \
        'Ada Operator <ada@example.com>|Ada Operator <ada@example.com>|canary evidence'
    res = run.result('commit a again')
    assert res['changed'] is False and res['pushed'] is False and res['attempts'] == 0, res

    # b cloned the same revision as a and pushed second: rejected, rebased on a's commit, pushed again
    res = run.result('commit b')
    assert res['_event'] == 'runner_on_ok' and res['pushed'] is True and res['attempts'] == 2, res.get('msg')
    assert res['parent'] == first_push and res['revision'] != first_push
    tip = res['revision']
    assert git('cat-file', '-t', tip, cwd=bare) == 'commit'
    assert subprocess.run(['git', 'merge-base', '--is-ancestor', first_push, tip], cwd=bare, check=False).returncode == 0
    assert git('rev-list', '--merges', '--count', tip, cwd=bare) == '0'
    assert git('log', '--format=%an', tip, cwd=bare).splitlines() == ['Bob Operator', 'Ada Operator', 'seed', 'seed']
    assert git('ls-tree', '-r', '--name-only', tip, cwd=bare).splitlines() == \
        ['bundles/a.json', 'reports/b.html', 'seed-0.txt', 'seed-1.txt']

    # f and g change the same file: g's rebase conflicts, is aborted, and the remote keeps f's commit only
    res = run.result('commit f')
    assert res['pushed'] is True, res.get('msg')
    res = run.result('commit g')
    assert res['_event'] == 'runner_on_failed' and 'conflicts in seed-0.txt' in res['msg'], res
    assert 'remote was left untouched' in res['msg']
    assert git('rev-parse', 'main', cwd=bare) == run.result('commit f')['revision']
    assert git('show', 'main:seed-0.txt', cwd=bare) == 'from f'
    assert git('status', '--porcelain', cwd=tmp_path / 'g') == 'M  seed-0.txt'   # no rebase left half-done

    res = run.result('escape')
    assert res['_event'] == 'runner_on_failed' and '../b/reports' in res['msg'] and 'escapes dest' in res['msg']
    res = run.result('absent')
    assert res['_event'] == 'runner_on_failed' and 'bundles/none.json does not exist' in res['msg']

    res = run.result('commit hooked')
    assert res['_event'] == 'runner_on_failed' and 'refused' in res['msg'] and 'pre-receive hook declined' in res['msg']
    assert git('rev-parse', 'main', cwd=hooked) == hooked_head
    assert git('rev-parse', 'HEAD', cwd=c) == hooked_head      # the local commit is undone, its change staged
    assert git('diff', '--cached', '--name-only', cwd=c) == 'c.txt'

    res = run.result('present dirty')
    assert res['_event'] == 'runner_on_failed' and 'has uncommitted changes (c.txt)' in res['msg'], res

    res = run.result('clone empty')
    assert res['_event'] == 'runner_on_ok' and res['revision'] is None, res.get('msg')
    res = run.result('commit empty')
    assert res['_event'] == 'runner_on_ok' and res['parent'] is None and res['pushed'] is True, res.get('msg')
    assert git('rev-parse', 'main', cwd=empty) == res['revision']

    # ignore_missing: what exists is committed (nothing new here), the missing path is no failure
    res = run.result('commit what exists')
    assert res['_event'] == 'runner_on_ok' and res['changed'] is False and res['files'] == [], res.get('msg')
    # authors_of: who added each file (the approval refuses the operator who wrote the record)
    res = run.result('authors')
    assert res['_event'] == 'runner_on_ok', res.get('msg')
    assert res['authors']['bundles/a.json'] == {'commit': first_push, 'name': 'Ada Operator', 'email': 'ada@example.com'}
    assert res['authors']['reports/b.html']['name'] == 'Bob Operator' and res['authors']['nowhere.txt'] is None


def test_to_head_reads_the_reviewed_revision_and_writes_on_the_head(run_playbook, tmp_path):
    """A relaunched job clones the revision it was given and ends on the branch head when what it only reads (frozen)
    is unchanged there; a frozen path that changed, or a revision outside the branch's history, fails."""
    bare, (first, second) = bare_repo(tmp_path, 'evidence')      # second changed seed-1.txt only
    run = run_playbook(play([
        task('follow', {'remote': str(bare), 'dest': str(tmp_path / 'a'), 'revision': first, 'to_head': True,
                        'frozen': ['seed-0.txt']}),
        task('frozen changed', {'remote': str(bare), 'dest': str(tmp_path / 'b'), 'revision': first, 'to_head': True,
                                'frozen': ['seed-1.txt']}),
    ]))
    assert run.rc == 0, run.stdout[-3000:]
    res = run.result('follow')
    assert res['_event'] == 'runner_on_ok' and res['revision'] == second and res['requested'] == first, res
    assert res['followed'] == ['seed-1.txt'] and git('rev-parse', 'HEAD', cwd=tmp_path / 'a') == second
    res = run.result('frozen changed')
    assert res['_event'] == 'runner_on_failed' and 'seed-1.txt changed on branch main since revision' in res['msg'], res


def commit_on_top(bare: pathlib.Path, work: pathlib.Path, name: str, content: str, message: str,
                  branch: str = 'main') -> str:
    """Someone else's commit on `branch` of `bare`, pushed as a fast-forward from a clone in `work`; its sha."""
    if not work.exists():
        git('clone', '-q', '-b', branch, str(bare), str(work))
    git('pull', '-q', '--ff-only', 'origin', branch, cwd=work)
    (work / name).write_text(content)
    git('add', name, cwd=work)
    git('commit', '-q', '-m', message, cwd=work)
    git('push', '-q', 'origin', 'HEAD:refs/heads/' + branch, cwd=work)
    return git('rev-parse', 'HEAD', cwd=work)


def test_a_push_after_a_force_push_fails_and_puts_nothing_back(run_playbook, tmp_path):
    """2026-12-06 review T3-7: between the job's clone and its push, someone rewrites the branch to take a commit out
    (a withdrawn approval): with a new commit on the older base (the retried push used to rebase the removed commit
    back on top), by resetting it to the older base (a plain push fast-forwarded over it), or by deleting it. The
    push fails naming the rewrite, the removed commit is not back on the remote, and the job's commit is undone.
    The remotes are file:// URLs (git's own transport, as to a server)."""
    cases = ('replaced', 'reset', 'deleted')
    remotes, seeds, base, approval = {}, {}, {}, {}
    for case in cases:
        remotes[case], (_first, base[case]) = bare_repo(tmp_path, case)
        seeds[case] = tmp_path / ('%s-admin' % case)
        approval[case] = commit_on_top(remotes[case], seeds[case], 'approval.yaml', 'approvedBy: mallory\n',
                                       'approve the canary record')
    # the deleted branch is not the bare repository's current branch (git refuses to delete that one)
    git('push', '-q', 'origin', 'HEAD:refs/heads/evidence', cwd=seeds['deleted'])
    branch = {'replaced': 'main', 'reset': 'main', 'deleted': 'evidence'}
    url = {case: 'file://' + str(remotes[case]) for case in cases}
    jobs = {case: tmp_path / ('%s-job' % case) for case in cases}
    run = run_playbook(play([task('clone %s' % case, {'remote': url[case], 'dest': str(jobs[case]),
                                                      'branch': branch[case], 'revision': approval[case]})
                             for case in cases]))
    assert run.rc == 0, run.stdout[-3000:]
    for case in cases:
        assert run.result('clone %s' % case)['revision'] == approval[case]

    # the approval is withdrawn by rewriting the branch, after the job cloned it
    git('reset', '-q', '--hard', base['replaced'], cwd=seeds['replaced'])
    (seeds['replaced'] / 'REVOKED').write_text('the approval by mallory is withdrawn\n')
    git('add', 'REVOKED', cwd=seeds['replaced'])
    git('commit', '-q', '-m', 'withdraw the approval', cwd=seeds['replaced'])
    git('push', '-q', '--force', 'origin', 'HEAD:refs/heads/main', cwd=seeds['replaced'])
    git('push', '-q', '--force', 'origin', '%s:refs/heads/main' % base['reset'], cwd=seeds['reset'])
    git('push', '-q', 'origin', ':refs/heads/evidence', cwd=seeds['deleted'])
    heads = {case: git('rev-parse', '-q', '--verify', 'refs/heads/' + branch[case], cwd=remotes[case], check=False)
             for case in cases}
    assert heads['reset'] == base['reset'] and heads['replaced'] != approval['replaced']

    tasks = []
    for case in cases:
        tasks.append(write('evidence %s' % case, jobs[case] / 'rollout.json', '{"evidence": 1}\n'))
        tasks.append(task('commit %s' % case, dict(OPERATOR, state='committed', remote=url[case],
                                                   dest=str(jobs[case]), branch=branch[case], paths=['rollout.json'],
                                                   commit_message='rollout evidence')))
    run = run_playbook(play(tasks))
    assert run.rc == 0, run.stdout[-3000:]
    for case in cases:
        res = run.result('commit %s' % case)
        assert res['_event'] == 'runner_on_failed', (case, res)
        now = 'it no longer exists' if case == 'deleted' else 'its head is now %s' % heads[case]
        assert 'the branch %s was rewritten since revision %s (%s)' % (branch[case], approval[case], now) in res['msg']
        assert 'Nothing was pushed' in res['msg']
        # the remote is as the rewrite left it: the approval commit is not back, the job's commit not there
        after = git('rev-parse', '-q', '--verify', 'refs/heads/' + branch[case], cwd=remotes[case], check=False)
        assert after == heads[case], case
        if case != 'deleted':
            assert subprocess.run(['git', 'merge-base', '--is-ancestor', approval[case], after], cwd=remotes[case],
                                  check=False).returncode == 1
            assert 'approval.yaml' not in git('ls-tree', '-r', '--name-only', after, cwd=remotes[case]).split()
        # the job's commit is undone, its change staged (a rerun from a fresh clone commits it again)
        assert git('rev-parse', 'HEAD', cwd=jobs[case]) == approval[case]
        assert git('diff', '--cached', '--name-only', cwd=jobs[case]) == 'rollout.json'


def test_others_pushed_first_only_the_jobs_commit_is_rebased_and_pushed(run_playbook, tmp_path):
    """The ordinary race: another job pushed fast-forward commits after this job's clone. The push is rebased on
    their head and pushed again, and only the job's own commit is new on top: nothing else is replayed."""
    bare, (_first, head) = bare_repo(tmp_path, 'evidence')
    job = tmp_path / 'job'
    run = run_playbook(play([task('clone', {'remote': 'file://' + str(bare), 'dest': str(job), 'revision': head})]))
    assert run.rc == 0 and run.result('clone')['revision'] == head, run.stdout[-3000:]
    other = tmp_path / 'other'
    commit_on_top(bare, other, 'plan.json', '{}\n', 'plan')
    theirs = commit_on_top(bare, other, 'bundle.json', '{}\n', 'bundle')
    (job / 'rollout.json').write_text('{"evidence": 1}\n')
    run = run_playbook(play([task('commit', dict(OPERATOR, state='committed', remote='file://' + str(bare), dest=str(job),
                                                 paths=['rollout.json'], commit_message='rollout evidence'))]))
    assert run.rc == 0, run.stdout[-3000:]
    res = run.result('commit')
    assert res['_event'] == 'runner_on_ok' and res['pushed'] is True and res['attempts'] == 2, res.get('msg')
    assert res['parent'] == theirs and git('rev-parse', 'main', cwd=bare) == res['revision']
    # exactly one commit on top of theirs, the job's, with the job's file only
    assert git('rev-list', '%s..main' % theirs, cwd=bare).splitlines() == [res['revision']]
    assert git('show', '--format=%an|%s', '--name-only', res['revision'], cwd=bare).splitlines() == \
        ['Ada Operator|rollout evidence', '', 'rollout.json']
    assert git('rev-list', '--count', 'main', cwd=bare) == '5'
