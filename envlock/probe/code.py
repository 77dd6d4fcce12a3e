"""The code a process ran from its workspace: the sha256 of each file of its loaded modules
that lies in the workspace (the script, the modules it imported from the project), or in the
git repository the workspace is part of: a researcher who runs ``python ../train.py`` from
``experiments/`` ran the project's script, keyed ``../train.py``.

A replay that diverges because ``train.py`` was edited (another learning rate) has the same
packages, threads and flags as its original: only the code says why. The files are read from
the process's own ``sys.modules``, so what is hashed is what the process imported, not what a
directory listing guesses; a module of an installed distribution (under ``sys.prefix``, a
``site-packages`` or ``dist-packages`` directory, as a project's own ``.venv`` inside the
workspace is) is the environment's, which the lock describes, and is left out.

Bounded: at most ``MAX_FILES`` files of at most ``MAX_FILE_BYTES`` each (the process's main
script first, then by path); the others are counted in ``left_out``. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Mapping, Optional

from .files import open_regular, sha256
from .git import repo_root

MAX_FILES = 256
MAX_FILE_BYTES = 64 << 20
_CHUNK = 1 << 20
_INSTALLED = ("site-packages", "dist-packages")


def _installed_roots() -> List[str]:
    """The interpreter's prefixes, as given and as real paths (a module's ``__file__`` is
    usually spelled like the first: compared as a string, it is skipped without a ``stat``)."""
    roots = {getattr(sys, name, "") for name in ("prefix", "base_prefix", "exec_prefix",
                                                 "base_exec_prefix")}
    both = {os.path.join(os.path.abspath(r), "") for r in roots if r}
    both |= {os.path.join(os.path.realpath(r), "") for r in roots if r}
    return sorted(both)


def _file_of(module: Any) -> Optional[str]:
    path = getattr(module, "__file__", None)
    return path if isinstance(path, str) and path and os.path.isabs(path) else None


def _digest(path: str) -> Optional[str]:
    """The sha256 of a regular file of at most ``MAX_FILE_BYTES``; None for anything else."""
    try:
        fd = open_regular(path)
    except OSError:
        return None
    h = sha256()
    read = 0
    with os.fdopen(fd, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            read += len(chunk)
            if read > MAX_FILE_BYTES:
                return None
            h.update(chunk)
    return h.hexdigest()


def workspace_files(workspace: str, modules: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """``{"files": {path relative to the workspace: sha256}, "left_out": n}`` of the modules
    loaded from ``workspace``, or from the git repository holding it (``modules``:
    ``sys.modules`` by default).

    A path is compared by its real path, so a workspace reached through a link still holds its
    files; a file that cannot be read or is too large is counted in ``left_out``. A file of the
    repository outside the workspace is keyed from the workspace (``../train.py``), so the keys
    of the workspace's own files are the same with or without a repository.
    """
    modules = sys.modules if modules is None else modules
    workspace_root = os.path.realpath(workspace)
    repo = repo_root(workspace_root)
    # The repository, when the workspace lies in one; else the workspace alone.
    root = os.path.join(repo if repo is not None else workspace_root, "")
    # An environment inside the workspace (a conda prefix, a venv: ``.venv/``) is installed
    # code; one that holds the workspace (``/usr/local`` and ``/usr/local/src/proj``) says
    # nothing about the workspace's own files.
    installed = [r for r in _installed_roots() if not root.startswith(r)]
    main = _file_of(modules.get("__main__"))
    found: Dict[str, str] = {}
    for module in list(modules.values()):
        path = _file_of(module)
        # Most modules of a training process are torch's, numpy's and the standard library's:
        # the string test skips them before ``realpath`` stats every directory of their path.
        if path is None or path.startswith(tuple(installed)):
            continue
        real = os.path.realpath(path)
        if not real.startswith(root) or any(real.startswith(r) for r in installed) \
                or any(part in _INSTALLED for part in real[len(root):].split(os.sep)):
            continue
        found[real] = os.path.relpath(real, workspace_root).replace(os.sep, "/")
    first = os.path.realpath(main) if main else None
    order = sorted(found, key=lambda p: (p != first, found[p]))
    files: Dict[str, str] = {}
    left_out = max(0, len(order) - MAX_FILES)
    for real in order[:MAX_FILES]:
        digest = _digest(real)
        if digest is None:
            left_out += 1
        else:
            files[found[real]] = digest
    return {"files": files, "left_out": left_out}
