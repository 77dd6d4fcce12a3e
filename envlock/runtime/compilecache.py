"""``save_compile_cache()`` and ``load_compile_cache()``: torch.compile's artifacts carried from
the run that compiled to the run that replays it.

The file format, and the loader ``envlock run``/``record``/``replay --compile-cache`` start in the
command's own interpreter, are ``envlock.probe.compilecache`` (stdlib, runnable by path in an
image without envlock). Here is what a training process calls, with envlock's errors:

* ``save_compile_cache(path=None)`` after compiling, or nothing at all under
  ``--save-compile-cache``: the first ``envlock.record()`` call then saves at exit;
* ``load_compile_cache(path)`` before the first compile, for a process started some other way
  (``envlock run`` needs none: it loads the cache before the command starts).

torch and Inductor are imported only by these calls: importing Inductor costs seconds.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from envlock.errors import CompileCacheRefused, UsageError
from envlock.probe import compilecache
from envlock.runtime.common import rank_and_world, torch_module

SAVE_ENV = compilecache.SAVE_ENV
_armed: dict[str, bool] = {"at_exit": False}


def save_compile_cache(path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """Write what this process compiled (``torch.compiler.save_cache_artifacts()``) to ``path``
    (default: ``$ENVLOCK_COMPILE_CACHE_OUT``, which ``--save-compile-cache`` sets), whole or not
    at all, with a header naming the torch and Triton that made it and the torch.compile
    settings it ran under. Returns that header, or None when the process compiled nothing (no
    file is written)."""
    target = os.fspath(path) if path is not None else os.environ.get(SAVE_ENV)
    if not target:
        raise UsageError("save_compile_cache: no path given, and not run with --save-compile-cache "
                         f"({SAVE_ENV} is not set)")
    torch_module(required=True)
    from envlock.probe.compilestate import read_settings

    try:
        return compilecache.save(target, read_settings())
    except compilecache.CacheError as exc:
        raise CompileCacheRefused(f"save_compile_cache: {exc}") from None
    except OSError as exc:
        raise UsageError(f"save_compile_cache: cannot write {target}: {exc.strerror or exc}") from None


def load_compile_cache(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a compile cache into the Inductor cache directory this process uses, before it
    compiles: its compiles then find the saved graphs, kernels and autotuning results. Refused
    (``CompileCacheRefused``, exit code 2) when the file is damaged or was made by another torch
    or Triton, which torch would ignore without a word. Returns its header with ``sha256`` and
    ``loaded`` (the artifacts written, by kind); a capture or record of this process holds the
    sha256 as ``[compile].loaded``."""
    torch_module(required=True)
    target = os.fspath(path)
    try:
        return compilecache.load(target)
    except compilecache.CacheError as exc:
        raise CompileCacheRefused(f"compile cache {target}: {exc}") from None
    except OSError as exc:
        raise CompileCacheRefused(f"compile cache {target}: {exc.strerror or exc}") from None


def arm_save_at_exit() -> None:
    """Under ``--save-compile-cache`` (``$ENVLOCK_COMPILE_CACHE_OUT`` set), save what rank 0
    compiled when the process exits; once per process, from ``envlock.record()``."""
    if _armed["at_exit"] or not os.environ.get(SAVE_ENV):
        return
    _armed["at_exit"] = True
    atexit.register(_save_at_exit)


def _save_at_exit() -> None:
    if "torch" not in sys.modules or rank_and_world()[0] != 0:
        return
    try:
        save_compile_cache()
    except Exception as exc:  # at exit a traceback helps nobody; the run's own result stands
        sys.stderr.write(f"envlock: the compile cache was not saved: {exc}\n")
