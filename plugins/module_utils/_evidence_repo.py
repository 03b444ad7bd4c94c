# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: no compatibility promise.
"""The Git evidence repository of an AWX workflow (evidence_repo): the pure decisions.

In AWX every job runs in a fresh container from a fresh checkout; the only durable store between
the jobs of a workflow is a Git repository. The module clones it at the revision the workflow
passes on, and commits and pushes what a job produced, retrying a push that lost a race on the
new head, never forcing.

- `redact(text, secrets)`: `text` with every secret and the userinfo of every URL replaced by
  ``***`` (for every message and result).
- `check_remote(remote)`: the remote, refused when its URL embeds a password or token.
- `remote_kind(remote)` / `same_remote(a, b)`: what kind of URL (https, ssh, local...) and whether
  two spell the same repository.
- `check_branch`, `check_revision`, `check_paths`, `check_author`: the inputs, each error naming
  the field and the value.
- `classify_push(stderr)`: a refused push as non-fast-forward (retry on the new head), refused (a
  hook, a permission) or other; `should_retry(kind, attempt, retries)`.
- `push_args(branch, base)`, `rebase_args(base, onto)` and `rewritten(...)`: a push takes only while the
  remote is at the head the job's commits are on; a retried push rebases only the job's own commits, and only
  on a head that descends from the one they are on; a rewritten branch (a force-push) is refused, not rebased
  or pushed on (that would put back what the force-push took out).
- `askpass_script()`, `prompt_urls(remote, username)` and `git_env(...)`: how git gets a token (a GIT_ASKPASS
  script that echoes an environment variable, never a command line or the URL, and only to the prompts for
  the https remote's host) and never prompts.
- `porcelain_paths(out)` and `name_list(out)`: what ``git status --porcelain -z`` and
  ``git diff --name-only -z`` list.

Pure: no I/O (the module runs git).
"""
from __future__ import annotations

import os
import posixpath
import re
import shlex
from typing import Any, Dict, Iterable, List, Optional, Tuple
from urllib.parse import quote

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _text

MASK = '***'
ENV_TOKEN = 'GPUFLEET_GIT_TOKEN'
ENV_USERNAME = 'GPUFLEET_GIT_USERNAME'
# The URLs git names when it asks for the username and for the token (askpass_script answers only those).
ENV_FOR_USERNAME = 'GPUFLEET_GIT_USERNAME_FOR'
ENV_FOR_TOKEN = 'GPUFLEET_GIT_TOKEN_FOR'

NON_FAST_FORWARD = 'non-fast-forward'
REFUSED = 'refused'
OTHER = 'other'

_SHA1 = re.compile(r'^[0-9a-fA-F]{40}$')
# scheme://userinfo@ : the userinfo of any URL in a text (user, or user:password).
_USERINFO = re.compile(r'(?i)\b([a-z][a-z0-9+.-]*://)([^/?#@\s]*)@')
_SCHEME = re.compile(r'(?i)^([a-z][a-z0-9+.-]*)://')
# user@host:path (scp-like ssh): no scheme, a ':' before any '/'.
_SCP = re.compile(r'^(?:[^@/:\s]+@)?[^@/:\s]+:(?!//)')
# What git check-ref-format refuses in a component, and the characters it refuses anywhere.
_BAD_REF_CHARS = re.compile(r'[\x00-\x20\x7f~^:?*\[\\]')
# git push's lines for a ref the remote did not take.
# (stale info: the remote is not at the head the push's lease names, push_args.)
_REJECTED = re.compile(r'^\s*!\s*\[rejected\].*\((fetch first|non-fast-forward|stale info)\)', re.M)
_REMOTE_REJECTED = re.compile(r'^\s*!\s*\[remote rejected\]', re.M)
_DENIED = re.compile(r'(?i)permission denied|permission to .* denied|access denied|forbidden|\b403\b|'
                     r'protected branch|hook declined')


class RepoError(ValueError):
    """Bad input or a git failure the module reports (the message names the field or the remote)."""


# --------------------------------------------------------------------------------------------
# Redaction and remotes
# --------------------------------------------------------------------------------------------

def redact(text: Any, secrets: Iterable[Optional[str]] = ()) -> str:
    """`text` (anything, as str) with each non-empty secret and the userinfo of every URL in it
    (``https://user:pass@host`` becomes ``https://***@host``) replaced by ``***``."""
    out = str(text)
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        out = out.replace(secret, MASK)
    return _USERINFO.sub(lambda m: m.group(1) + (MASK + '@' if m.group(2) else ''), out)


def remote_kind(remote: str) -> str:
    """``https``, ``http``, ``ssh``, ``git``, ``file`` (a file:// URL or a local path) or the URL's scheme."""
    m = _SCHEME.match(remote)
    if m:
        scheme = m.group(1).lower()
        return {'git+ssh': 'ssh', 'ssh+git': 'ssh'}.get(scheme, scheme)
    if _SCP.match(remote) and not remote.startswith(('/', '.')):
        return 'ssh'
    return 'file'


def check_remote(remote: Any) -> str:
    """The remote, a non-empty string; refused (naming the URL with its userinfo as ``***``) when it embeds a
    password or a token (any userinfo of an http(s) URL, ``user:password`` of any other): credentials come from
    an AWX credential through `token` or `key_file`."""
    if not isinstance(remote, str) or not remote.strip():
        raise RepoError('remote: %s is not a Git URL or path' % _text.show(remote))
    if any(c in remote for c in '\r\n\x00'):
        raise RepoError('remote: %s contains a control character' % _text.show(redact(remote)))
    m = _USERINFO.match(remote)
    if m and (':' in m.group(2) or remote_kind(remote) in ('http', 'https')):
        raise RepoError('remote: %s embeds credentials in the URL; give them with the token option (https) or '
                        'key_file (ssh) from an AWX credential instead' % redact(remote))
    return remote


def _normal(remote: str) -> str:
    kind = remote_kind(remote)
    text = remote
    if kind == 'file':
        text = remote[len('file://'):] if remote.lower().startswith('file://') else remote
        text = posixpath.normpath(text)
    else:
        text = text.rstrip('/')
    return text[:-4] if text.endswith('.git') else text


def same_remote(a: str, b: str) -> bool:
    """Whether two remotes name the same repository (``file://`` and a path, a trailing ``/`` or ``.git`` aside;
    local paths should be absolute)."""
    return _normal(a) == _normal(b)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

def check_ref_name(value: Any, field: str) -> str:
    """`value` when git would take it as a branch or tag name (git check-ref-format's rules)."""
    if (not isinstance(value, str) or not value or value.startswith(('-', '/')) or value.endswith(('/', '.', '.lock'))
            or '..' in value or '//' in value or '@{' in value or value == '@' or _BAD_REF_CHARS.search(value)
            or any(part.startswith('.') or part.endswith('.lock') for part in value.split('/'))):
        raise RepoError('%s: %s is not a valid branch or tag name' % (field, _text.show(value)))
    return value


def check_branch(value: Any) -> str:
    return check_ref_name(value, 'branch')


def is_sha1(value: Any) -> bool:
    return isinstance(value, str) and bool(_SHA1.match(value))


def check_revision(value: Any) -> Optional[str]:
    """None (the remote branch's head), a full 40-hex commit (lowercased) or a branch or tag name."""
    if value is None:
        return None
    if is_sha1(value):
        return value.lower()
    if isinstance(value, str) and re.match(r'^[0-9a-fA-F]{7,39}$', value):
        raise RepoError('revision: %s is an abbreviated commit; give the full 40-hex commit or a branch or tag name'
                        % _text.show(value))
    try:
        return check_ref_name(value, 'revision')
    except RepoError:
        raise RepoError('revision: %s is neither a full 40-hex commit nor a branch or tag name' % _text.show(value))


def check_paths(paths: Any) -> List[str]:
    """The paths to commit, relative to dest and normalised; refused naming the first that is not a
    non-empty string, is absolute or escapes dest (a ``..`` component)."""
    if not isinstance(paths, list) or not paths:
        raise RepoError('paths: give at least one path (relative to dest) to commit')
    out: List[str] = []
    for i, path in enumerate(paths):
        if not isinstance(path, str) or not path.strip() or '\x00' in path:
            raise RepoError('paths[%d]: %s is not a path' % (i, _text.show(path)))
        if os.path.isabs(path) or path.startswith('~'):
            raise RepoError('paths[%d]: %s is absolute; give it relative to dest' % (i, _text.show(path)))
        if '..' in re.split(r'[/\\]', path):
            raise RepoError('paths[%d]: %s escapes dest (a .. component)' % (i, _text.show(path)))
        norm = posixpath.normpath(path)
        if norm == '.git' or norm.startswith('.git/'):
            raise RepoError('paths[%d]: %s is inside .git' % (i, _text.show(path)))
        if norm not in out:
            out.append(norm)
    return out


def check_author(name: Any, email: Any) -> None:
    if not isinstance(name, str) or not name.strip() or any(c in name for c in '<>\n'):
        raise RepoError('author_name: %s is not a person\'s name (in AWX, awx_user_name)' % _text.show(name))
    if not isinstance(email, str) or '@' not in email or any(c in email for c in '<> \n'):
        raise RepoError('author_email: %s is not an e-mail address (in AWX, awx_user_email)' % _text.show(email))


def check_count(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RepoError('%s: %s must be an integer from %d to %d' % (field, _text.show(value), low, high))
    return value


# --------------------------------------------------------------------------------------------
# Push
# --------------------------------------------------------------------------------------------

def push_args(branch: str, base: Optional[str]) -> List[str]:
    """git push of HEAD to `branch` that takes only while the remote branch is at `base`, the head the job's
    commits are on (None: the branch does not exist yet). HEAD always descends from `base`, so the update is a
    fast-forward and nothing is ever forced; the lease only refuses a remote that moved anywhere else, back to an
    older commit included (a force-push that took commits out, which a plain push would fast-forward over and
    so put them back)."""
    return ['push', '-q', '--force-with-lease=refs/heads/%s:%s' % (branch, base or ''), 'origin',
            'HEAD:refs/heads/' + branch]


def classify_push(stderr: str) -> str:
    """Why git push refused: `NON_FAST_FORWARD` (``! [rejected] ... (fetch first)``, ``(non-fast-forward)`` or
    ``(stale info)``: the remote moved, retry on its new head), `REFUSED` (``! [remote rejected]``, a
    hook declined, a permission denied: retrying cannot help) or `OTHER`."""
    if _REMOTE_REJECTED.search(stderr) or _DENIED.search(stderr):
        return REFUSED
    if _REJECTED.search(stderr):
        return NON_FAST_FORWARD
    return OTHER


def should_retry(kind: str, attempt: int, retries: int) -> bool:
    """Whether push attempt `attempt` (1-based), refused as `kind`, is followed by a rebase and another:
    only a non-fast-forward, and at most `retries` attempts in all."""
    return kind == NON_FAST_FORWARD and attempt < retries


def rebase_args(base: Optional[str], onto: str) -> List[str]:
    """The rebase that moves the job's own commits, those after `base` (the head they were made or last rebased
    on; None: the unborn branch of an empty repository, every commit is the job's), onto the remote's new head
    `onto`. Never ``git rebase <onto>`` alone: that replays every commit of HEAD that `onto` lacks, those a
    force-push took out of the branch included."""
    if base is None:
        return ['rebase', '-q', '--onto', onto, '--root']
    return ['rebase', '-q', '--onto', onto, base]


def rewritten(shown: str, branch: str, since: str, head: Optional[str]) -> str:
    """Why a push is given up when the remote branch's head (None: the branch is gone) does not descend from
    `since`, the revision the job's commits are on: the branch was rewritten (a force-push, a deletion), and
    pushing on top of it would bring back the commits the rewrite took out."""
    now = 'its head is now %s' % head if head else 'it no longer exists'
    return ('push to %s: the branch %s was rewritten since revision %s (%s): commits this job built on were taken out '
            'of it (a force-push or a deletion), and rebasing or pushing on top would put them back. Nothing was pushed '
            'and the job\'s commit is undone (its changes staged); find out why the branch was rewritten, then clone it '
            'again (state=present) and run the job again' % (shown, branch, since, now))


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

def askpass_script() -> str:
    """A GIT_ASKPASS helper that answers only the prompts for the remote (git names the URL it asks for:
    ``Username for 'https://host'``, ``Password for 'https://user@host'``, `prompt_urls`): the username and
    the token, both from the environment, so the token is never on a command line or in a file. Any other
    prompt (another host, http) gets nothing and fails."""
    return ('#!/bin/sh\n'
            'case "$1" in\n'
            '  "Username for \'$%s\'"*) printf \'%%s\\n\' "$%s" ;;\n'
            '  "Password for \'$%s\'"*) printf \'%%s\\n\' "$%s" ;;\n'
            '  *) echo "evidence_repo askpass: no credential for this prompt" >&2; exit 1 ;;\n'
            'esac\n' % (ENV_FOR_USERNAME, ENV_USERNAME, ENV_FOR_TOKEN, ENV_TOKEN))


def prompt_urls(remote: str, username: str) -> Tuple[str, str]:
    """The URLs git names in its username and password prompts for the https `remote` (scheme and host as
    written, the username percent-encoded as git does); RepoError for a remote that is not https: a token is
    never sent in clear."""
    m = re.match(r'^([a-zA-Z][a-zA-Z0-9+.-]*)://([^/?#@]+)(?:[/?#]|$)', remote)
    if remote_kind(remote) != 'https' or not m:
        raise RepoError('token: given for the remote %s, which is not an https URL; a token is sent only over https '
                        '(use key_file for an ssh remote)' % redact(remote))
    base = '%s://' % m.group(1)
    return base + m.group(2), '%s%s@%s' % (base, quote(username, safe=''), m.group(2))


def git_env(timeout: int, askpass: Optional[str] = None, token: Optional[str] = None, username: str = 'git',
            key_file: Optional[str] = None, remote: Optional[str] = None) -> Dict[str, str]:
    """The environment git runs with: never a prompt (GIT_TERMINAL_PROMPT=0, ssh BatchMode), C locale (the
    messages `classify_push` reads), the token through the `askpass` script for the https `remote` only
    (`prompt_urls`), the ssh key with IdentitiesOnly."""
    env = {'GIT_TERMINAL_PROMPT': '0', 'LC_ALL': 'C', 'LANGUAGE': 'C', 'GCM_INTERACTIVE': 'never',
           'GIT_CONFIG_NOSYSTEM': '1'}
    ssh = ['ssh', '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=%d' % max(1, timeout)]
    if key_file:
        ssh += ['-i', key_file, '-o', 'IdentitiesOnly=yes']
    env['GIT_SSH_COMMAND'] = ' '.join(shlex.quote(a) for a in ssh)
    if token:
        if not askpass:
            raise ValueError('a token needs the askpass script')
        for_username, for_token = prompt_urls(remote or '', username)
        env.update({'GIT_ASKPASS': askpass, ENV_TOKEN: token, ENV_USERNAME: username,
                    ENV_FOR_USERNAME: for_username, ENV_FOR_TOKEN: for_token})
    elif askpass:
        env['GIT_ASKPASS'] = askpass
    return env


def author_env(name: str, email: str) -> Dict[str, str]:
    """Author and committer: the job's operator."""
    return {'GIT_AUTHOR_NAME': name, 'GIT_AUTHOR_EMAIL': email, 'GIT_COMMITTER_NAME': name,
            'GIT_COMMITTER_EMAIL': email}


# Options on every git command line: no credential helper stores or offers anything, no pager; no redirect is
# followed (an https remote that redirects elsewhere would get the token) and the credential prompt names the host
# only (what askpass_script matches).
GIT_OPTIONS = ['-c', 'credential.helper=', '-c', 'core.pager=cat', '-c', 'advice.detachedHead=false',
               '-c', 'http.followRedirects=false', '-c', 'credential.useHttpPath=false']


# --------------------------------------------------------------------------------------------
# Output of git
# --------------------------------------------------------------------------------------------

def name_list(out: str) -> List[str]:
    """The paths of ``git diff --name-only -z`` (or any NUL-separated list)."""
    return [p for p in out.split('\0') if p]


def porcelain_paths(out: str) -> List[str]:
    """The paths ``git status --porcelain -z`` lists (a rename's new path only)."""
    entries = out.split('\0')
    paths: List[str] = []
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.append(entry[3:])
        if entry[0] in 'RC':
            i += 1      # the rename's source follows
    return paths


def ls_remote_refs(out: str) -> Dict[str, str]:
    """``git ls-remote`` output as {ref: sha} (a peeled tag ``refs/tags/x^{}`` kept as its own key)."""
    refs = {}
    for line in out.splitlines():
        parts = line.split('\t')
        if len(parts) == 2 and is_sha1(parts[0]):
            refs[parts[1]] = parts[0].lower()
    return refs


def resolve_name(refs: Dict[str, str], name: str) -> Optional[str]:
    """The commit a branch or tag name (or a full ref) names on the remote, None when it has none."""
    for ref in (name, 'refs/heads/' + name, 'refs/tags/' + name):
        if ref.startswith('refs/') and ref in refs:
            return refs.get(ref + '^{}', refs[ref])
    return None


# --------------------------------------------------------------------------------------------
# The playbooks' side: where a job's files are, and who may approve
# --------------------------------------------------------------------------------------------

def user_path(path: Any, workdir: str, field: str) -> str:
    """A controller-side path the operator gave (`field`), as an absolute path: `~` expanded, a relative
    path joined to `workdir`, the directory ansible-playbook was started from. Never the playbook's
    directory: a collection's playbooks lie inside the installed collection, which may be read-only
    and is replaced by the next install. Empty gives empty."""
    if path is None or path == '':
        return ''
    if not isinstance(path, str):
        raise RepoError('%s: %s is not a path' % (field, _text.show(path)))
    path = os.path.expanduser(path)
    if os.path.isabs(path):
        return os.path.normpath(path)
    if not workdir or not os.path.isabs(workdir):
        raise RepoError('%s: %s is relative and there is no absolute working directory to resolve it against (%s)'
                        % (field, _text.show(path), _text.show(workdir)))
    return os.path.normpath(os.path.join(workdir, path))


def repo_path(path: Any, root: Any, field: str, workdir: str = '') -> str:
    """A job's file input (`field`, e.g. gpufleet_plan_file) as the job reads and writes it: without an
    evidence repository (`root` empty) the path as given, a relative one resolved against `workdir` when
    given (user_path); else inside the clone `root`: a path relative to the repository; an absolute one,
    or one that escapes it, is refused naming the field."""
    if path is None or path == '':
        return ''
    if not isinstance(path, str):
        raise RepoError('%s: %s is not a path' % (field, _text.show(path)))
    if not root:
        return user_path(path, workdir, field) if workdir else path
    if os.path.isabs(path) or path.startswith('~'):
        raise RepoError('%s: %s is absolute; with gpufleet_evidence_repo the job\'s files are paths inside the '
                        'evidence repository (for example plans/gpu-upgrade-plan.json)' % (field, _text.show(path)))
    if '..' in re.split(r'[/\\]', path):
        raise RepoError('%s: %s escapes the evidence repository (a .. component)' % (field, _text.show(path)))
    norm = posixpath.normpath(path)
    if norm == '.git' or norm.startswith('.git/'):
        raise RepoError('%s: %s is inside .git' % (field, _text.show(path)))
    return posixpath.join(str(root), norm)


def repo_relative(paths: Any, root: Any) -> List[str]:
    """The given paths that lie inside the clone `root`, relative to it (what the job commits); empty
    paths and paths outside it are left out."""
    if not root:
        return []
    base = posixpath.normpath(str(root))
    out: List[str] = []
    for path in paths or []:
        if not isinstance(path, str) or not path:
            continue
        norm = posixpath.normpath(path)
        if norm.startswith(base + '/'):
            rel = norm[len(base) + 1:]
            if rel not in out:
                out.append(rel)
    return out


def _identity(value: Any) -> List[str]:
    """The ways an operator is named: the name and the e-mail address, lowercased."""
    if isinstance(value, dict):
        return [str(value.get(k)).strip().lower() for k in ('name', 'email') if value.get(k)]
    return [str(value).strip().lower()] if value not in (None, '') else []


def self_approvals(approvals: Any, authors: Any) -> List[str]:
    """Records approved by the operator who ran their canary (seed 004: a second operator approves).
    `approvals`: record path -> approvedBy; `authors`: record path -> the author of the commit that added
    the record (evidence_repo authors_of: the canary job's operator), or None. One line per refused record;
    a record whose author is unknown is refused too (nobody can tell the approver is a second operator)."""
    if not isinstance(approvals, dict) or not isinstance(authors, dict):
        raise RepoError('approvals and authors: %s, %s are not mappings of record path'
                        % (_text.show(approvals), _text.show(authors)))
    problems = []
    for path in sorted(approvals):
        approver = approvals[path]
        author = authors.get(path)
        if not author:
            problems.append('%s: no commit of the evidence repository added it, so who ran its canary is unknown; '
                            'commit the canary\'s record from the canary job' % path)
            continue
        if not _identity(approver):
            problems.append('%s: approvedBy is empty' % path)
        elif set(_identity(approver)) & set(_identity(author)):
            problems.append('%s: approved by %s, who ran its canary (commit %s by %s <%s>); a second operator must '
                            'approve' % (path, _text.show(approver), str(author.get('commit', ''))[:12],
                                         author.get('name'), author.get('email')))
    return problems


def approval_problems(infos: Any, approver: Any, authors: Any) -> List[str]:
    """Why the approver may not approve the records (empty: every record may be approved). `infos`: record
    path -> qualification_info's result ({record, problems}); `authors`: record path -> who added it (the
    canary's operator). A record is approvable when it loads, is ``qualified``, has no problem but its empty
    approvedBy (or is approved by this approver already), and the approver is not the canary's operator."""
    if not isinstance(infos, dict) or not infos:
        raise RepoError('records: %s is not a non-empty mapping of record path' % _text.show(infos))
    if not isinstance(approver, str) or not approver.strip() or any(c in approver for c in '"\n\\'):
        return ['approver: %s is not an operator\'s name (gpufleet_approver, in AWX awx_user_name)' % _text.show(approver)]
    problems: List[str] = []
    for path in sorted(infos):
        info = infos[path] if isinstance(infos[path], dict) else {}
        record = info.get('record')
        if not isinstance(record, dict):
            problems.append('%s: the record does not load (%s)' % (path, info.get('msg') or 'no record'))
            continue
        if record.get('state') != 'qualified':
            problems.append('%s: state is %s, not qualified: a failed canary is not approved'
                            % (path, _text.show(record.get('state'))))
        others = [p for p in info.get('problems') or [] if p != 'approvedBy is required']
        if others:
            problems.append('%s: %s' % (path, '; '.join(others)))
        given = str(record.get('approvedBy') or '').strip()
        if given and given != approver.strip():
            problems.append('%s: already approved by %s' % (path, _text.show(given)))
    problems.extend(self_approvals(dict((p, approver.strip()) for p in infos), authors))
    return problems
