#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: evidence_repo
short_description: Clone the Git evidence repository at a revision, or commit and push what a job produced
version_added: 0.1.0
author:
  - gpufleet.upgrade maintainers (@gpufleet)
description:
  - In AWX every job of a workflow runs in a fresh container from a fresh checkout; the only durable store between
    the jobs is a Git evidence repository (plan file, evidence bundles, HTML reports, C(GPUUpgradeQualification)
    records). The job that produces an artifact commits and pushes it; later jobs clone the repository at the
    revision the workflow passes on (C(set_stats)).
  - O(state=present) makes O(dest) a clone of O(remote) whose local branch O(branch) is at O(revision) (C(git checkout
    -B)), or at the remote branch's head without O(revision). A new clone is made beside O(dest) and renamed into
    place only once the revision checks out, so a failed run leaves nothing behind. An existing clone of the same
    remote is fetched and moved; a clone of another remote, a clone with uncommitted changes, or a directory that is
    not a clone is refused. When the remote branch does not exist yet (an empty repository), the clone is left on
    the unborn O(branch) and the first commit creates it.
  - O(state=committed) adds O(paths) in O(dest), commits them with the job's operator as author and committer on
    the revision the work tree is on (the one O(state=present) checked out, or the job's own last push), and pushes
    the commit to O(branch). The push takes only while the remote branch is at that revision (C(git push
    --force-with-lease=refs/heads/<branch>:<revision> origin HEAD:refs/heads/<branch>)); the commit descends from
    it, so the update is a fast-forward or nothing, and nothing is ever force-pushed. When the push loses a race
    (others pushed first), the job's own commit, and only it (C(git rebase --onto <new head> <revision>)), is
    rebased on the new head and pushed again, up to O(push_retries) attempts. A rebase conflict, or a push refused
    for another reason (a hook, a permission), fails at once and leaves the remote untouched; the local commit is
    undone (its changes stay staged), so a rerun tries again. Nothing to commit is no change and no push.
  - A remote branch whose head does not descend from the revision the commit is on was rewritten since the job
    cloned it (a force-push or a deletion took commits out of it, for example a withdrawn approval or a record
    taken out). The task then fails with C(the branch <branch> was rewritten since revision <revision> (its head is
    now <head>)), naming both, and pushes nothing, since rebasing or pushing on top of the new head would put the
    removed commits back. The local commit is undone; a rerun in the same O(dest) fails the same way, so clone the
    branch again (O(state=present)) once the rewrite is understood. Protect the evidence branch against
    force-pushes and deletions on the Git server.
  - Credentials come from an AWX credential. An https token (O(token)) reaches git through a GIT_ASKPASS helper in
    a private temporary directory that echoes an environment variable, never on a command line or in the URL, and
    is removed afterwards. The helper answers only git's prompts for the remote's own scheme and host (any other
    prompt gets nothing), git follows no HTTP redirect (C(http.followRedirects=false)), and a token with a remote
    that is not C(https://) is refused; an ssh key (O(key_file)) through C(GIT_SSH_COMMAND) with C(IdentitiesOnly=yes). git never
    prompts (C(GIT_TERMINAL_PROMPT=0), ssh C(BatchMode=yes)). A remote URL that embeds credentials is refused, and
    every message and result has the token and any URL userinfo replaced by C(***).
  - Runs on the controller (or wherever the task runs) with the C(git) binary; every git command is bounded by
    O(timeout).
extends_documentation_fragment:
  - gpufleet.upgrade.attributes
attributes:
  check_mode:
    support: full
    details:
      - O(state=present) asks the remote (C(git ls-remote)) and reports whether it would clone or move and to which
        revision; it clones and fetches nothing. O(state=committed) reports the paths that would be committed and
        neither commits nor pushes.
  diff_mode:
    support: full
    details:
      - The revision before and after, and with O(state=committed) the list of files committed; never their content.
  idempotent:
    support: full
    description: A clone already at the revision, or paths with nothing to commit, change nothing.
options:
  remote:
    description:
      - The Git URL of the evidence repository (C(https://), C(ssh://), scp-like C(user@host:path), C(file://) or a
        local path).
      - A URL with credentials in it (C(https://user:secret@host/...)) is refused; use O(token) or O(key_file).
    type: str
    required: true
  dest:
    description: The work tree (the clone).
    type: path
    required: true
  branch:
    description: The branch the work tree is on and commits are pushed to.
    type: str
    default: main
  state:
    description: Clone or move the work tree (V(present)), or commit and push O(paths) (V(committed)).
    type: str
    choices: [present, committed]
    default: present
  revision:
    description:
      - With O(state=present), the commit the work tree ends on - a full 40-hex commit, or a branch or tag name of
        the remote. Without it, the head of the remote's O(branch).
      - A revision the remote does not have fails and leaves O(dest) as it was.
    type: str
  paths:
    description:
      - With O(state=committed), the files or directories to commit, relative to O(dest). An absolute path, one with
        a C(..) component or one that does not exist is refused.
    type: list
    elements: str
  ignore_missing:
    description:
      - With O(state=committed), leave out the O(paths) that do not exist instead of failing (a job commits what it
        wrote; a stage that stopped early wrote less).
    type: bool
    default: false
  to_head:
    description:
      - With O(state=present) and O(revision), end on the head of O(branch) when O(revision) is in its history and
        none of the O(frozen) paths changed between them (RV(requested) is O(revision), RV(followed) the files later
        commits changed). A relaunched job reads what was reviewed at O(revision) and writes on top of what an
        earlier run of it committed, so its push does not conflict. A revision outside the branch's history, or a
        frozen path that changed, fails.
    type: bool
    default: false
  frozen:
    description: With O(to_head), the paths (relative to O(dest)) that must be the same at the head as at O(revision).
    type: list
    elements: str
  authors_of:
    description:
      - With O(state=present), paths of the work tree whose first author to report in RV(authors) - who added each
        file (for example the operator whose canary job wrote a qualification record, so that the approval can
        refuse that same operator).
    type: list
    elements: str
  commit_message:
    description: The commit message (required with O(state=committed)).
    type: str
  author_name:
    description: The job's operator, author and committer of the commit (in AWX, C(awx_user_name)).
    type: str
  author_email:
    description: The operator's e-mail address (in AWX, C(awx_user_email)).
    type: str
  token:
    description:
      - An https token or password (from an AWX credential), given to git through a GIT_ASKPASS helper; never logged.
      - Only with an C(https://) O(remote), and only to its host.
    type: str
  username:
    description: The username git gives with O(token).
    type: str
    default: git
  key_file:
    description: An ssh private key for an ssh remote (C(GIT_SSH_COMMAND) with C(-i) and C(IdentitiesOnly=yes)).
    type: path
  push_retries:
    description:
      - How many push attempts in all, each after a rebase on the remote's new head, when others pushed first.
      - A rewritten branch (its head does not descend from the revision the commit is on) is not retried.
    type: int
    default: 5
  timeout:
    description: The longest any one git command may run, in seconds.
    type: int
    default: 60
notes:
  - Needs C(git) on the host the task runs on.
  - Pass RV(revision) on with C(ansible.builtin.set_stats) so later jobs of the workflow clone the same commit.
seealso:
  - module: gpufleet.upgrade.evidence
  - module: gpufleet.upgrade.qualification_record
"""

EXAMPLES = r"""
---
- name: Clone the evidence repository at the revision the workflow passed on
  gpufleet.upgrade.evidence_repo:
    remote: https://git.example.com/gpu/evidence.git
    dest: "{{ playbook_dir }}/evidence"
    revision: "{{ evidence_revision | default(omit) }}"
    token: "{{ lookup('ansible.builtin.env', 'EVIDENCE_TOKEN') }}"

- name: Commit and push the canary bundle as the job's operator
  gpufleet.upgrade.evidence_repo:
    state: committed
    remote: https://git.example.com/gpu/evidence.git
    dest: "{{ playbook_dir }}/evidence"
    paths: [bundles/canary-1.json, reports/canary-1.html]
    commit_message: "canary-1 evidence (AWX job {{ awx_job_id | default('local') }})"
    author_name: "{{ awx_user_name }}"
    author_email: "{{ awx_user_email }}"
    token: "{{ lookup('ansible.builtin.env', 'EVIDENCE_TOKEN') }}"
  register: pushed

- name: Hand the revision to the next job of the workflow
  ansible.builtin.set_stats:
    data:
      evidence_revision: "{{ pushed.revision }}"
"""

RETURN = r"""
revision:
  description:
    - The commit the work tree is on (O(state=present)) or the commit pushed (O(state=committed)); V(null) on the
      unborn branch of an empty repository. In check mode, the revision it would be on.
  returned: success
  type: str
  sample: 3f1c2a9b0d4e5f60718293a4b5c6d7e8f9012345
branch:
  description: The local branch of the work tree.
  returned: success
  type: str
  sample: main
action:
  description:
    - What was done (or would be, in check mode) - V(cloned), V(moved) or V(unchanged) with O(state=present);
      V(pushed) or V(unchanged) with O(state=committed).
  returned: success
  type: str
  sample: cloned
remote:
  description: The remote, with any URL userinfo as C(***).
  returned: success
  type: str
parent:
  description: The parent of the pushed commit (the remote branch's head it was pushed on); V(null) for a first commit.
  returned: when O(state=committed)
  type: str
attempts:
  description: The push attempts made (0 when there was nothing to commit).
  returned: when O(state=committed)
  type: int
  sample: 1
requested:
  description: With O(to_head), the revision asked for (RV(revision) is the branch head the work tree ended on).
  returned: with O(to_head), not in check mode
  type: str
followed:
  description: With O(to_head), the files the commits between RV(requested) and the branch head changed.
  returned: with O(to_head), not in check mode
  type: list
  elements: str
authors:
  description:
    - Per path of O(authors_of), the commit that added it with its author's C(name) and C(email); V(null) for a path
      the history does not have.
  returned: with O(authors_of), not in check mode
  type: dict
  sample: {qualification/10de2330-10de16c1.yaml: {commit: 3f1c..., name: alice, email: alice@example.com}}
files:
  description: The paths committed (in check mode, those that would be).
  returned: when O(state=committed)
  type: list
  elements: str
  sample: [bundles/canary-1.json]
pushed:
  description: Whether a commit was pushed.
  returned: when O(state=committed)
  type: bool
"""

import contextlib
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _evidence_repo as er
from ansible_collections.gpufleet.upgrade.plugins.module_utils._gpuhost import _bounded
from ansible_collections.gpufleet.upgrade.plugins.module_utils._host_module import HostTask


class Git:
    """git commands through the module's run_command, with the module's environment, each bounded by `timeout`
    seconds (coreutils timeout, as the host modules bound theirs)."""

    def __init__(self, module, binary, env, timeout, secrets):
        self.module = module
        self.binary = binary
        self.env = env
        self.timeout = timeout
        self.secrets = secrets

    def run(self, args, cwd=None, extra_env=None):
        env = dict(self.env, **(extra_env or {}))
        argv = _bounded([self.binary] + er.GIT_OPTIONS + list(args), self.timeout, self.module.get_bin_path)
        rc, out, err = self.module.run_command(argv, cwd=cwd, environ_update=env, check_rc=False)
        if rc in (124, 137) and argv[0] != self.binary:
            raise er.RepoError('git %s did not finish within %d s (timeout)' % (args[0], self.timeout))
        return rc, out, er.redact(err, self.secrets).strip()

    def check(self, args, cwd=None, what=None, extra_env=None):
        rc, out, err = self.run(args, cwd, extra_env)
        if rc != 0:
            raise er.RepoError('%s failed (git %s, rc %d): %s' % (what or 'git ' + args[0], args[0], rc, err))
        return out

    def value(self, args, cwd):
        """The first line of a command's output, None when it fails (an unborn HEAD, a missing key)."""
        rc, out, _err = self.run(args, cwd)
        return (out.strip() or None) if rc == 0 else None


@contextlib.contextmanager
def askpass(token, parent=None):
    """The GIT_ASKPASS helper in a private temporary directory (0700) under `parent` (the module's temporary
    directory, which allows executables where /tmp may not), removed afterwards; None without a token."""
    if not token:
        yield None
        return
    directory = tempfile.mkdtemp(prefix='gpufleet-askpass-', dir=parent)
    try:
        os.chmod(directory, 0o700)
        path = os.path.join(directory, 'askpass.sh')
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, 'w') as handle:
            handle.write(er.askpass_script())
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _remote_refs(git, remote, shown):
    rc, out, err = git.run(['ls-remote', '--', remote])
    if rc != 0:
        raise er.RepoError('remote: cannot reach %s: %s' % (shown, err or 'git ls-remote rc %d' % rc))
    return er.ls_remote_refs(out)


def _clone_state(git, dest, remote, shown, clean):
    """None when `dest` is absent or an empty directory, else (head, branch) of the clone of `remote` it holds."""
    if not os.path.lexists(dest) or (os.path.isdir(dest) and not os.path.islink(dest) and not os.listdir(dest)):
        return None
    if not os.path.isdir(dest):
        raise er.RepoError('dest: %s exists and is not a directory' % dest)
    if not os.path.exists(os.path.join(dest, '.git')):
        raise er.RepoError('dest: %s exists and is not a Git clone (no .git); give an empty or new directory' % dest)
    origin = git.value(['config', '--get', 'remote.origin.url'], dest)
    if origin is None or not er.same_remote(_local(origin), remote):
        other = er.redact(origin or 'no remote origin')
        raise er.RepoError('dest: %s is a clone of %s, not of %s' % (dest, other, shown))
    if clean:
        status = git.check(['status', '--porcelain', '-z', '--untracked-files=all'], dest, 'git status of dest')
        dirty = er.porcelain_paths(status)
        if dirty:
            raise er.RepoError('dest: %s has uncommitted changes (%s); commit them (state=committed) or use a fresh '
                               'dest' % (dest, ', '.join(dirty[:10]) + (' ...' if len(dirty) > 10 else '')))
    head = git.value(['rev-parse', '-q', '--verify', 'HEAD^{commit}'], dest)
    branch = git.value(['symbolic-ref', '-q', '--short', 'HEAD'], dest)
    return head, branch


def _local(remote):
    """A local-path remote as an absolute path (git records it so in the clone)."""
    if er.remote_kind(remote) == 'file' and not remote.lower().startswith('file://'):
        return os.path.abspath(remote)
    return remote


def _verify(git, cwd, revision, shown):
    rc, _out, _err = git.run(['cat-file', '-e', '%s^{commit}' % revision], cwd)
    if rc != 0:
        raise er.RepoError('revision %s does not exist in %s' % (revision, shown))


def _makedirs(path):
    """Create `path`'s missing directories; the topmost one created (to remove on failure), or None."""
    top, probe = None, path
    while not os.path.exists(probe):
        top, probe = probe, os.path.dirname(probe)
    if top is not None:
        os.makedirs(path)
    return top


def present(module, git, p, remote, shown):
    dest, branch, revision = p['dest'], p['branch'], p['revision']
    refs = _remote_refs(git, remote, shown)
    head_ref = refs.get('refs/heads/' + branch)
    if revision is None:
        want = head_ref
    elif er.is_sha1(revision):
        want = revision
    else:
        want = er.resolve_name(refs, revision)
        if want is None:
            raise er.RepoError('revision %s does not exist in %s (no such branch or tag)' % (revision, shown))
    state = _clone_state(git, dest, remote, shown, clean=True)
    result = {'branch': branch, 'remote': shown}
    if state is None:
        result.update(changed=True, action='cloned', revision=want)
        if not module.check_mode:
            _clone(git, dest, remote, branch, want, shown)
            result['revision'] = git.value(['rev-parse', '-q', '--verify', 'HEAD^{commit}'], dest)
            if p['to_head'] and want is not None:
                result.update(follow_head(git, dest, branch, want, head_ref, p['frozen'] or [], shown))
        result.update(_diff(module, dest, None, result['revision']))
        return result
    head, current = state
    if want is None:
        if current == branch and head is None:
            result.update(changed=False, action='unchanged', revision=None)
            return result
        raise er.RepoError('branch: %s does not exist in %s; give a revision to start it from, or a fresh dest'
                           % (branch, shown))
    if not module.check_mode:
        git.check(['fetch', '--prune', '--tags', 'origin'], dest, 'fetching %s' % shown)
        _verify(git, dest, want, shown)
        if revision is not None and not er.is_sha1(revision):
            want = git.check(['rev-parse', '%s^{commit}' % want], dest).strip()
    moved = head != want or current != branch
    files = None
    if moved and head is not None:
        _refuse_unpushed(git, dest, head, current, shown)
    if moved and not module.check_mode:
        if head is not None:
            files = er.name_list(git.check(['diff', '--name-only', '-z', head, want], dest))
        git.check(['checkout', '-q', '-B', branch, want], dest, 'checking out %s' % want)
    result.update(changed=moved, action='moved' if moved else 'unchanged', revision=want)
    if p['to_head'] and not module.check_mode:
        followed = follow_head(git, dest, branch, want, head_ref, p['frozen'] or [], shown)
        result.update(followed)
        if followed['revision'] != want:
            result.update(changed=head != followed['revision'], action='moved')
    result.update(_diff(module, dest, head, result['revision'], files))
    return result


def follow_head(git, dest, branch, want, head_ref, frozen, shown):
    """With to_head: move the work tree from `want` to the branch's head when `want` is in its history and
    none of the `frozen` paths changed since (what the job reads is what was reviewed at `want`; what it
    writes goes on top of what later jobs, or an earlier run of this one, committed)."""
    out = {'requested': want, 'followed': []}
    if head_ref is None or head_ref == want:
        out['revision'] = want
        return out
    rc, _o, _e = git.run(['merge-base', '--is-ancestor', want, head_ref], dest)
    if rc != 0:
        raise er.RepoError('revision %s is not in the history of branch %s of %s (head %s): refusing to write on '
                           'top of another history' % (want, branch, shown, head_ref))
    paths = er.check_paths(frozen) if frozen else []
    if paths:
        changed = er.name_list(git.check(['diff', '--name-only', '-z', want, head_ref, '--'] + paths, dest))
        if changed:
            raise er.RepoError('%s changed on branch %s since revision %s (head %s); what this job reads must be '
                               'what was reviewed at that revision: nothing was written'
                               % (', '.join(changed), branch, want, head_ref))
    out['followed'] = er.name_list(git.check(['diff', '--name-only', '-z', want, head_ref], dest))
    git.check(['checkout', '-q', '-B', branch, head_ref], dest, 'checking out %s' % head_ref)
    out['revision'] = head_ref
    return out


def authors(git, dest, paths):
    """Per path: the commit that added it and its author (the operator whose job wrote it), None when the
    work tree's history does not have the path."""
    out = {}
    for path in er.check_paths(paths):
        log = git.check(['log', '--diff-filter=A', '--format=%H%x00%an%x00%ae', '--', path], dest).strip()
        first = log.splitlines()[-1].split('\x00') if log else None
        out[path] = {'commit': first[0], 'name': first[1], 'email': first[2]} if first and len(first) == 3 else None
    return out


def _refuse_unpushed(git, dest, head, current, shown):
    """Moving the work tree would leave commits behind that no branch of the remote has: refused."""
    rc, out, _err = git.run(['rev-list', '--count', head, '--not', '--remotes=origin'], dest)
    if rc == 0 and out.strip() not in ('', '0'):
        raise er.RepoError('dest: %s has %s local commit(s) on %s that %s does not have; push them (state=committed) '
                           'or use a fresh dest' % (dest, out.strip(), current or 'a detached HEAD', shown))


def _clone(git, dest, remote, branch, want, shown):
    parent = os.path.dirname(os.path.abspath(dest))
    created = _makedirs(parent)
    tmp = tempfile.mkdtemp(prefix='.%s-' % os.path.basename(os.path.abspath(dest)), dir=parent)
    try:
        git.check(['clone', '-q', '--no-checkout', '--origin', 'origin', '--', remote, tmp], None,
                  'cloning %s' % shown)
        if want is None:
            git.check(['symbolic-ref', 'HEAD', 'refs/heads/' + branch], tmp)
        else:
            _verify(git, tmp, want, shown)
            git.check(['checkout', '-q', '-B', branch, want], tmp, 'checking out %s' % want)
        if os.path.isdir(dest):
            os.rmdir(dest)          # the empty directory the clone replaces
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def _diff(module, dest, before, after, files=None):
    if not module._diff:
        return {}
    b, a = {'revision': before}, {'revision': after}
    if files is not None:
        b['files'], a['files'] = [], list(files)
    return {'diff': {'before': b, 'after': a, 'before_header': dest, 'after_header': dest}}


def _check_paths(dest, paths, ignore_missing=False):
    """The paths to commit (those that exist, with ignore_missing); RepoError for a missing or escaping one."""
    real = os.path.realpath(dest)
    kept = []
    for i, path in enumerate(paths):
        full = os.path.join(dest, path)
        if not os.path.lexists(full):
            if ignore_missing:
                continue
            raise er.RepoError('paths[%d]: %s does not exist in dest %s' % (i, path, dest))
        kept.append(path)
        if os.path.commonpath([real, os.path.realpath(full)]) != real:
            raise er.RepoError('paths[%d]: %s escapes dest %s (through a symbolic link)' % (i, path, dest))
    return kept


def _undo_commit(git, dest):
    """Take the unpushed commit back, its changes staged, so that a rerun commits and pushes them again."""
    if git.value(['rev-parse', '-q', '--verify', 'HEAD^'], dest):
        git.run(['reset', '-q', '--soft', 'HEAD^'], dest)
    else:
        git.run(['update-ref', '-d', 'HEAD'], dest)


def _push(git, dest, branch, shown, retries, author, start):
    """Push HEAD to `branch`; when others pushed first, rebase the job's own commits (those after `start`, the
    revision the work tree was on before them; None: the unborn branch of an empty repository) on their head and
    push again, up to `retries` attempts in all (never forced). Each push takes only while the remote is at the
    head the commits are on (er.push_args), so a branch reset to an older commit is not fast-forwarded over. A
    head that does not descend from the one the commits are on (the branch was rewritten: a force-push or a
    deletion took commits out) is refused: rebasing on it, or pushing on it, would put the removed commits back.
    The attempts made; RepoError when the push is refused, the branch was rewritten or the rebase conflicts."""
    base = start
    attempts = 0
    while True:
        attempts += 1
        rc, _out, err = git.run(er.push_args(branch, base), dest)
        if rc == 0:
            return attempts
        kind = er.classify_push(err)
        if not er.should_retry(kind, attempts, retries):
            if kind == er.NON_FAST_FORWARD:
                raise er.RepoError('push to %s (branch %s) was rejected as non-fast-forward %d times (others kept '
                                   'pushing; push_retries %d); nothing was forced: %s'
                                   % (shown, branch, attempts, retries, err))
            raise er.RepoError('push to %s (branch %s) was %s: %s'
                               % (shown, branch, 'refused' if kind == er.REFUSED else 'not done', err))
        head = _fetch_head(git, dest, branch, shown, base)
        if base is not None:
            rc, _out, err = git.run(['merge-base', '--is-ancestor', base, head], dest)
            if rc == 1:
                raise er.RepoError(er.rewritten(shown, branch, base, head))
            if rc != 0:
                raise er.RepoError('push to %s (branch %s): cannot tell whether its head %s descends from revision %s '
                                   '(git merge-base rc %d): %s' % (shown, branch, head, base, rc, err))
        rc, _out, err = git.run(er.rebase_args(base, head), dest, author)
        if rc != 0:
            conflicts = er.name_list(git.run(['diff', '--name-only', '-z', '--diff-filter=U'], dest)[1])
            git.run(['rebase', '--abort'], dest)
            raise er.RepoError('push to %s (branch %s): others pushed meanwhile and rebasing the commit on their head '
                               'conflicts in %s; the remote was left untouched'
                               % (shown, branch, ', '.join(conflicts) or err))
        base = head


def _fetch_head(git, dest, branch, shown, base):
    """The remote branch's head after a rejected push (fetched into origin/<branch>); a branch deleted since
    `base` is a rewrite."""
    rc, _out, err = git.run(['fetch', '-q', 'origin', '+refs/heads/%s:refs/remotes/origin/%s' % (branch, branch)],
                            dest)
    if rc != 0:
        listed, out, _err = git.run(['ls-remote', 'origin', 'refs/heads/' + branch], dest)
        if listed == 0 and not er.ls_remote_refs(out).get('refs/heads/' + branch) and base is not None:
            raise er.RepoError(er.rewritten(shown, branch, base, None))
        raise er.RepoError('fetching %s after a rejected push failed (git fetch, rc %d): %s' % (shown, rc, err))
    return git.check(['rev-parse', '--verify', 'refs/remotes/origin/%s^{commit}' % branch], dest).strip()


def committed(module, git, p, remote, shown):
    dest, branch = p['dest'], p['branch']
    if not p['commit_message'] or not p['commit_message'].strip():
        raise er.RepoError('commit_message: give the commit message (state=committed)')
    er.check_author(p['author_name'], p['author_email'])
    paths = er.check_paths(p['paths'])
    retries = er.check_count(p['push_retries'], 'push_retries', 1, 100)
    state = _clone_state(git, dest, remote, shown, clean=False)
    if state is None:
        raise er.RepoError('dest: %s is not a clone of %s; run state=present first' % (dest, shown))
    head, current = state
    if current != branch:
        raise er.RepoError('branch: dest %s is on %s, not on branch %s' % (dest, current or 'a detached HEAD', branch))
    paths = _check_paths(dest, paths, p['ignore_missing'])
    result = {'branch': branch, 'remote': shown, 'parent': head, 'attempts': 0, 'pushed': False}
    if not paths:
        result.update(changed=False, action='unchanged', revision=head, files=[])
        return result
    if module.check_mode:
        out = git.check(['status', '--porcelain', '-z', '--untracked-files=all', '--'] + paths, dest)
        files = er.porcelain_paths(out)
        result.update(changed=bool(files), action='pushed' if files else 'unchanged', revision=head, files=files)
        result.update(_diff(module, dest, head, head, files))
        return result
    git.check(['add', '-A', '--'] + paths, dest, 'git add')
    files = er.name_list(git.check(['diff', '--cached', '--name-only', '-z', '--'] + paths, dest))
    if not files:
        result.update(changed=False, action='unchanged', revision=head, files=[])
        return result
    author = er.author_env(p['author_name'], p['author_email'])
    git.check(['commit', '-q', '--no-verify', '-m', p['commit_message'], '--'] + paths, dest, 'git commit', author)
    try:
        attempts = _push(git, dest, branch, shown, retries, author, head)
    except er.RepoError:
        _undo_commit(git, dest)
        raise
    revision = git.check(['rev-parse', 'HEAD'], dest).strip()
    parent = git.value(['rev-parse', '-q', '--verify', 'HEAD^'], dest)
    result.update(changed=True, action='pushed', revision=revision, parent=parent, attempts=attempts, files=files,
                  pushed=True)
    result.update(_diff(module, dest, head, revision, files))
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            remote=dict(type='str', required=True),
            dest=dict(type='path', required=True),
            branch=dict(type='str', default='main'),
            state=dict(type='str', default='present', choices=['present', 'committed']),
            revision=dict(type='str'),
            paths=dict(type='list', elements='str'),
            ignore_missing=dict(type='bool', default=False),
            authors_of=dict(type='list', elements='str'),
            to_head=dict(type='bool', default=False),
            frozen=dict(type='list', elements='str'),
            commit_message=dict(type='str'),
            author_name=dict(type='str'),
            author_email=dict(type='str'),
            token=dict(type='str', no_log=True),
            username=dict(type='str', default='git'),
            key_file=dict(type='path'),
            push_retries=dict(type='int', default=5),
            timeout=dict(type='int', default=60),
        ),
        required_if=[('state', 'committed', ('paths', 'commit_message', 'author_name', 'author_email'))],
        supports_check_mode=True,
    )
    p = module.params
    secrets = [p['token']]
    with HostTask(module, 'evidence_repo'):
        try:
            remote = _local(er.check_remote(p['remote']))
            shown = er.redact(remote, secrets)
            er.check_branch(p['branch'])
            p['revision'] = er.check_revision(p['revision'])
            timeout = er.check_count(p['timeout'], 'timeout', 1, 3600)
            if p['key_file'] and not os.path.isfile(p['key_file']):
                raise er.RepoError('key_file: %s is not a file' % p['key_file'])
            binary = module.get_bin_path('git')
            if not binary:
                raise er.RepoError('evidence_repo: git is not installed on this host')
            if p['token']:
                er.prompt_urls(remote, p['username'])     # a token only for an https remote
            with askpass(p['token'], module.tmpdir if p['token'] else None) as helper:
                env = er.git_env(timeout, helper, p['token'], p['username'], p['key_file'], remote=remote)
                git = Git(module, binary, env, timeout, secrets)
                if p['state'] == 'present':
                    result = present(module, git, p, remote, shown)
                    if p['authors_of'] and not module.check_mode:
                        result['authors'] = authors(git, p['dest'], p['authors_of'])
                else:
                    result = committed(module, git, p, remote, shown)
        except er.RepoError as exc:
            module.fail_json(msg=er.redact(exc, secrets))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
