"""Environment variables: the allow-listed ones, and which of them this process set itself.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List

from .compilecache import set_by_envlock
from .files import read_bytes
from .rules import env_allowed, recorded_name, without_trace_hook
from .scrub import env_value


def process_set_env() -> List[str]:
    """Recorded variables this process set, changed or removed after it started.

    They are process state (``seed_everything`` exports ENVLOCK_SEED, ``deterministic()`` sets
    CUBLAS_WORKSPACE_CONFIG, training code sets variables itself), not the environment a fresh
    process inherits, so a shell ``verify`` reports rather than compares them. Linux keeps the
    environment a process was started with in /proc/self/environ (setenv never writes there);
    elsewhere nothing is known and every variable counts as environment.
    """
    raw = read_bytes("/proc/self/environ")
    if raw is None:
        return []
    initial: Dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            initial[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    names = set(initial) | set(os.environ)
    return sorted(n for n in names if recorded_name(n) and initial.get(n) != os.environ.get(n)
                  and re.fullmatch(r"[A-Za-z0-9_.]{1,128}", n))


def collect_env() -> Dict[str, str]:
    """``[env]``: the allow-listed variables, less the compile cache directory envlock itself
    set for this run (``compilecache.set_by_envlock``) and the start-up hook it put on
    ``PYTHONPATH`` (``rules.without_trace_hook``)."""
    out = {}
    for name, value in os.environ.items():
        if not env_allowed(name) or set_by_envlock(name, value):
            continue
        if name == "PYTHONPATH":  # less the start-up hook of a traced run
            value = without_trace_hook(value)
            if not value:
                continue
        out[name] = env_value(name, value)
    return dict(sorted(out.items()))
