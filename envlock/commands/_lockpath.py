"""The lock a reading command works on: the one named, else the nearest ``env.lock`` upward."""

from __future__ import annotations

import os

from envlock.commands._output import err
from envlock.errors import LockInvalid


def lock_arg(given: str | None) -> str:
    """``given``, or the ``env.lock`` found from here up to the repository root, named by its
    path relative to the working directory (said on stderr, so the reader knows which)."""
    from envlock.lock import LOCK_NAME, find_lock, project_root, search_top

    if given is not None:
        return given
    found = find_lock()
    if found is None:
        root = project_root()
        where = os.path.relpath(root / LOCK_NAME)
        top = search_top()
        # The repository root by its path from here; outside a repository the search went to /.
        extent = os.path.relpath(top) if top == root else str(top)
        # Capture where the project's lock belongs, not into this subdirectory: a second lock
        # here would shadow the project's from now on.
        raise LockInvalid(f"{LOCK_NAME} not found here or in a parent directory (up to {extent})",
                          hint=f"create it with `envlock capture -o {where}`"
                               if where != LOCK_NAME else "create one with `envlock capture`")
    shown = os.path.relpath(found)
    if shown != LOCK_NAME:
        err(f"envlock: reading {shown}\n")
    return shown


def optional_lock_arg(given: str | None) -> str | None:
    """``given``, or the nearest ``env.lock`` upward when there is one (said as ``lock_arg``
    says it), else None: for a command whose lock is optional (``record``)."""
    from envlock.lock import find_lock

    if given is not None or find_lock() is None:
        return given
    return lock_arg(None)
