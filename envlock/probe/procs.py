"""Subprocesses: argv only, no shell, always a timeout, started early so they overlap.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Dict, List, Optional, Tuple


class Proc:
    """A subprocess started now and collected later, so slow tools overlap with torch import."""

    def __init__(self, argv: List[str], timeout: float, cwd: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None) -> None:
        self.argv = argv
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.error: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
        try:
            # Own process group: a hung tool's children (a credential helper, a pager) are
            # killed with it and cannot keep our pipes open past the timeout.
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=os.name == "posix",
            )
        except FileNotFoundError:
            self.error = "%s not found" % argv[0]
        except OSError as exc:
            self.error = "%s could not start: %s" % (argv[0], exc)

    def _kill(self) -> None:
        assert self.proc is not None
        try:
            if os.name == "posix":
                os.killpg(self.proc.pid, 9)
            else:
                self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.communicate(timeout=1)
        except Exception:
            pass

    def result(self) -> Tuple[Optional[int], bytes, str]:
        """Return (returncode, stdout, error); returncode None means it did not finish."""
        if self.proc is None:
            return None, b"", self.error or "not started"
        remaining = max(0.05, self.deadline - time.monotonic())
        try:
            out, err = self.proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            self._kill()
            return None, b"", "%s timed out after %gs" % (" ".join(self.argv[:2]), self.timeout)
        msg = err.decode("utf-8", "replace").strip().splitlines()
        return self.proc.returncode, out, (msg[-1] if msg else "")


def run_tool(argv: List[str], timeout: float) -> Tuple[Optional[int], bytes, str]:
    env = dict(os.environ, LC_ALL="C")
    return Proc(argv, timeout, env=env).result()


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, owned by someone else
    return True
