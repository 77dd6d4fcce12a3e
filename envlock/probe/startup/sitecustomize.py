"""envlock's start-up hook for a recorded run: trace this Python process, then hand on.

``envlock record`` (and ``run --record``) prepend this directory to ``PYTHONPATH`` with
``ENVLOCK_TRACE`` set, so that every Python process of the run (the command, a ``subprocess``
running python, spawned DataLoader workers, torchrun's ranks) traces what it reads
(``envlock/probe/trace.py``, loaded by its path: the interpreter need not import envlock).
Without ``ENVLOCK_TRACE`` it does nothing. Then the ``sitecustomize`` this one stands in front
of, if any, is found further along ``sys.path`` and run, so that an environment's own start-up
code still runs.

Stdlib only, Python 3.8 syntax; it never raises.
"""

import os
import sys


def _trace() -> None:
    if not os.environ.get("ENVLOCK_TRACE"):
        return
    try:
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(os.path.dirname(here), "trace.py")
        spec = importlib.util.spec_from_file_location("_envlock_trace", path)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["_envlock_trace"] = module  # the name ``trace.active`` finds it by
        spec.loader.exec_module(module)
        module.start()
    except Exception:
        pass


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` under this name."""
    try:
        import importlib.machinery
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception:
        import traceback

        traceback.print_exc()


_trace()
_chain()
