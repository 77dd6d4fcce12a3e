"""Which environment a command-line ``capture`` or ``verify`` looks at.

envlock is usually installed the way CLI tools are (pipx, ``uv tool install``, a tool venv), so
the interpreter it runs in is rarely the environment the user means. Without ``--python`` the
choice follows what uv and pip-audit users expect, first match wins:

1. ``VIRTUAL_ENV`` (an activated venv);
2. ``CONDA_PREFIX`` (an activated conda env), except conda's *base* environment when a
   project ``.venv`` is found (many shells activate base at login; it is rarely the project);
3. a ``.venv`` (with ``pyvenv.cfg``) in the working directory or one of its parents;
4. the interpreter envlock runs in, with a warning when that is envlock's own tool venv (a
   pipx or ``uv tool`` venv: locking it records envlock's dependencies, not the project's).

The choice is explained in one line ("./.venv (VIRTUAL_ENV)") that capture and verify print.
Only paths are inspected here; the probe runs later, in the chosen interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import NamedTuple

from envlock.probing.process import PREFIX_INTERPRETERS, resolve_python

# Files that pipx and uv leave in the venvs they make for tools.
_TOOL_VENV_MARKERS = ("pipx_metadata.json", "uv-receipt.toml")


class Target(NamedTuple):
    """The interpreter to probe, the environment directory it belongs to, and why."""

    python: str
    prefix: str
    reason: str
    warning: str | None = None

    def describe(self, cwd: str | os.PathLike[str] | None = None) -> str:
        return f"{display_path(self.prefix, cwd)} ({self.reason})"

    def probed(self, prefix: str | None) -> Target:
        """This target named by the prefix its interpreter reported. ``--python python3`` may
        be a launcher (a pyenv shim, a wrapper script) whose directory is not the environment."""
        if self.reason != "--python" or not prefix:
            return self
        return self._replace(prefix=prefix)


def display_path(path: str, cwd: str | os.PathLike[str] | None = None) -> str:
    """``./.venv`` under the working directory, ``~/…`` under home, else the absolute path."""
    here = PurePosixPath(os.fspath(cwd) if cwd is not None else os.getcwd())
    p = PurePosixPath(path)
    # From "/" every path is "relative": "./tmp/proj/.venv" reads like a typo.
    if here != PurePosixPath(here.anchor) and p.is_relative_to(here):
        rel = p.relative_to(here)
        return "." if str(rel) == "." else f"./{rel}"
    home = os.path.expanduser("~")
    if home not in ("", "/") and p.is_relative_to(home):
        return f"~/{p.relative_to(home)}"
    return str(p)


def prefix_interpreter(prefix: str | os.PathLike[str]) -> str | None:
    """The Python of the environment at ``prefix`` (a venv's or conda's), or None."""
    for sub in PREFIX_INTERPRETERS:
        candidate = os.path.join(prefix, sub)
        if os.path.exists(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_dot_venv(start: str) -> str | None:
    """The nearest ``.venv`` that is a virtual environment, from ``start`` (absolute) up to the
    root."""
    directory = start
    while True:
        candidate = os.path.join(directory, ".venv")
        if os.path.isfile(os.path.join(candidate, "pyvenv.cfg")) and prefix_interpreter(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def same_path(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name the same file once links are resolved: a venv's ``bin/python``
    is a link, and the environment it names is what matters."""
    return os.path.realpath(a) == os.path.realpath(b)


def is_tool_venv(prefix: str) -> bool:
    """A venv made by pipx or ``uv tool`` (each leaves a receipt file in it)."""
    return any(os.path.isfile(os.path.join(prefix, marker)) for marker in _TOOL_VENV_MARKERS)


def _own(reason: str, notes: list[str]) -> Target:
    prefix = sys.prefix
    warning = None
    if is_tool_venv(prefix):
        warning = (f"locking envlock's own tool environment {display_path(prefix)}, not a project's: "
                   "activate the project's environment, run from its directory (.venv), "
                   "or pass --python")
    if notes:
        warning = "; ".join([*notes, *([warning] if warning else [])])
    return Target(sys.executable, prefix, reason, warning)


def _given(python: str) -> Target:
    exe = resolve_python(python)
    given = os.path.expanduser(python)
    prefix = given if os.path.isdir(given) else os.path.dirname(os.path.dirname(exe))
    return Target(exe, os.path.abspath(prefix), "--python")


def choose(python: str | None = None, *, cwd: str | os.PathLike[str] | None = None,
           environ: Mapping[str, str] | None = None) -> Target:
    """The environment to probe; ``python`` (``--python``) overrides every rule."""
    env = os.environ if environ is None else environ
    here = os.path.abspath(cwd) if cwd is not None else os.getcwd()
    if python:
        return _given(python)
    notes: list[str] = []
    venv = env.get("VIRTUAL_ENV")
    if venv:
        exe = prefix_interpreter(venv)
        if exe:
            return Target(exe, venv, "VIRTUAL_ENV")
        notes.append(f"VIRTUAL_ENV={venv} has no python; ignored")
    dot_venv = find_dot_venv(here)
    conda = env.get("CONDA_PREFIX")
    if conda:
        exe = prefix_interpreter(conda)
        # base is the installation itself (it holds condabin/); named envs live in envs/NAME.
        is_base = env.get("CONDA_DEFAULT_ENV") == "base" or os.path.isdir(os.path.join(conda, "condabin"))
        if exe and not (is_base and dot_venv is not None):
            return Target(exe, conda, "CONDA_PREFIX")
        if not exe:
            notes.append(f"CONDA_PREFIX={conda} has no python; ignored")
    if dot_venv is not None:
        exe = prefix_interpreter(dot_venv)
        assert exe is not None  # find_dot_venv checked it
        where = "the working directory" if os.path.dirname(dot_venv) == here else "a parent directory"
        return Target(exe, dot_venv, f".venv in {where}")
    return _own("the interpreter envlock runs in", notes)


def lock_environment(recorded: str | None) -> Target | None:
    """The environment a lock was captured from (its ``[python].prefix``), when it exists on
    this machine with an interpreter; None for another machine's or a container's path."""
    if not recorded or not os.path.isdir(recorded):
        return None
    exe = prefix_interpreter(recorded)
    return Target(exe, recorded, "the lock's own environment") if exe else None


def recorded_prefix_hint(recorded: str | None, target: Target) -> str | None:
    """The lock's own environment, when it exists on this machine and was not the one chosen.

    A lock captured with ``--python X`` and verified without it would otherwise compare two
    unrelated environments and list every package as drift.
    """
    own = lock_environment(recorded)
    return None if own is None or same_path(own.prefix, target.prefix) else own.prefix


def for_lock(python: str | None, recorded: str | None) -> Target:
    """The environment a lock describes, to read its installed files (pack and bundle rebuild
    wheels from them): ``--python``, else the lock's own environment when it is on this machine
    (a lock captured with ``--python p/bin/python`` names ``p``), else chosen as capture
    chooses, with a warning that the lock's own is not here."""
    if python:
        return choose(python)
    own = lock_environment(recorded)
    if own is not None:
        return own
    chosen = choose()
    if recorded:
        missing = f"the lock's own environment {recorded} is not on this machine"
        chosen = chosen._replace(warning="; ".join(w for w in (missing, chosen.warning) if w))
    return chosen
