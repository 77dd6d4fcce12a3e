"""The git state of the working directory: commit, branch, dirty, a digest of the diff, remote.

All git commands start together when the capture starts and are collected at its end, so they
overlap with the torch import. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .files import sha256
from .procs import Proc
from .scrub import strip_url


def _git_env() -> Dict[str, str]:
    env = dict(os.environ)
    # No pager, no prompt for credentials, no index.lock taken by a read-only status.
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C",
                "GIT_PAGER": "cat", "GIT_ASKPASS": "true", "SSH_ASKPASS": "true"})
    return env


def repo_root(path: str) -> Optional[str]:
    """The nearest directory holding ``.git`` (a directory, or a file for worktrees)."""
    path = os.path.abspath(path)
    while True:
        if os.path.exists(os.path.join(path, ".git")):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _git_pathspec(cwd: str, exclude: Sequence[str], exclude_globs: Sequence[str] = ()) -> List[str]:
    """Pathspecs that leave the lock being written out of the git state.

    Without them a lock committed to the repository makes the next capture see itself as
    untracked or modified, and every lock of an unchanged environment differs in [git]. A path
    outside the repository would make git fail, so only paths in the same one are named.
    ``exclude_globs``: patterns from the repository's root (``**/__pycache__/**``).
    """
    if not exclude and not exclude_globs:
        return []
    root = repo_root(cwd)
    if root is None:
        return []
    spec = [":(exclude,literal)" + os.path.abspath(p) for p in exclude
            if repo_root(os.path.dirname(os.path.abspath(p))) == root]
    spec += [":(exclude,glob,top)" + g for g in exclude_globs]
    return ["--", ":/", *spec] if spec else []


class GitJob:
    """All git commands for the capture, started together."""

    def __init__(self, cwd: str, timeout: float, exclude: Sequence[str] = (),
                 exclude_globs: Sequence[str] = ()) -> None:
        env = _git_env()
        git = os.environ.get("ENVLOCK_GIT", "git")
        self.cwd, self.timeout, self.env, self.git = cwd, timeout, env, git
        spec = _git_pathspec(cwd, exclude, exclude_globs)
        self.rev = Proc([git, "rev-parse", "HEAD", "--abbrev-ref", "HEAD"], timeout, cwd, env)
        self.status = Proc([git, "status", "--porcelain=v1", "-z", "--untracked-files=all", *spec],
                            timeout, cwd, env)
        self.diff = Proc([git, "diff", "HEAD", "--no-color", "--no-ext-diff", "--binary", *spec],
                          timeout, cwd, env)
        self.remote = Proc([git, "config", "--get", "remote.origin.url"], timeout, cwd, env)

    def _unborn_branch(self) -> Optional[str]:
        """The branch of a repository whose HEAD names a branch with no commit yet ("" when
        it has no usable name); None when that is not why ``rev-parse HEAD`` failed."""
        rc, out, _ = Proc([self.git, "symbolic-ref", "-q", "--short", "HEAD"], self.timeout,
                          self.cwd, self.env).result()
        if rc != 0:
            return None
        rc, _, _ = Proc([self.git, "rev-parse", "-q", "--verify", "HEAD"], self.timeout,
                        self.cwd, self.env).result()
        if rc == 0:
            return None  # HEAD resolves: the failure was something else
        return out.decode("utf-8", "replace").strip()

    def collect(self) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
        rc, out, err = self.rev.result()
        if rc != 0:
            # Make sure the siblings do not outlive a failed or hung git.
            for job in (self.status, self.diff, self.remote):
                job.result()
            if rc is None:
                return None, err
            if "not a git repository" in err.lower():
                return None, "not a git repository"
            unborn = self._unborn_branch()
            if unborn is None:
                return None, "git rev-parse failed: %s" % (err or "exit %s" % rc)
            # A repository with no commit yet (``git init``, nothing committed): no commit to
            # record, which is a fact about it, not a failure; its files are all untracked.
            info: Dict[str, Any] = {"branch": unborn} if unborn else {}
        else:
            lines = out.decode("utf-8", "replace").split()
            info = {"commit": lines[0] if lines else None}
            if len(lines) > 1 and lines[1] != "HEAD":
                info["branch"] = lines[1]
        rc, out, err = self.status.result()
        untracked: List[str] = []
        if rc == 0:
            dirty = False
            for entry in out.decode("utf-8", "surrogateescape").split("\0"):
                if not entry:
                    continue
                if entry.startswith("??"):
                    untracked.append(entry[3:])
                else:
                    dirty = True
            info["dirty"] = dirty
            info["untracked"] = len(untracked)
        rc, out, err = self.diff.result()
        if rc == 0:
            h = sha256(out)
            for path in sorted(untracked):
                h.update(b"\0untracked\0" + path.encode("utf-8", "surrogateescape"))
            info["diff_sha256"] = h.hexdigest()
        rc, out, err = self.remote.result()
        if rc == 0 and out.strip():
            info["remote"] = strip_url(out.decode("utf-8", "replace").strip())
        return info, None
