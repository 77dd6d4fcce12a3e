"""Which ``env.lock`` a command reads when none is named: the nearest one upward.

As git finds ``.git`` and uv finds ``uv.lock``, a command run in a subdirectory of a project
reads the project's lock: the working directory, then each parent, up to the repository root
(a directory holding ``.git``) or the filesystem root, whichever comes first.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCK_NAME = "env.lock"


def _upward(start: Path) -> list[Path]:
    """``start`` and its parents, up to and including the first that holds ``.git``."""
    out: list[Path] = []
    for d in [start, *start.parents]:
        out.append(d)
        if os.path.lexists(d / ".git"):
            break
    return out


def find_lock(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest ``env.lock`` at or above ``start`` (default: the working directory)."""
    for d in _upward(Path(os.path.abspath(start or os.getcwd()))):
        if (d / LOCK_NAME).is_file():
            return d / LOCK_NAME
    return None


def project_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The repository root above ``start`` (a directory holding ``.git``), else ``start``."""
    here = Path(os.path.abspath(start or os.getcwd()))
    top = _upward(here)[-1]
    return top if os.path.lexists(top / ".git") else here


def search_top(start: str | os.PathLike[str] | None = None) -> Path:
    """The last directory ``find_lock`` looks in: the repository root, else the filesystem
    root (what a "not found" names as the extent of the search)."""
    return _upward(Path(os.path.abspath(start or os.getcwd())))[-1]
