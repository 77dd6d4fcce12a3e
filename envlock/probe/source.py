"""The probe as a unit: its version, its files, and a digest of them.

The package directory is what is shipped and run (``python DIR``): into another venv's
interpreter on the host, and into containers with ``put_archive``. Every ``*.py`` file directly
in it belongs to the probe, so the list of files to ship is the directory itself and cannot
fall out of step with the code. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import time
from typing import List, Optional

from .files import sha256

PROBE_VERSION = 1
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def file_names(directory: Optional[str] = None) -> List[str]:
    """The probe's files, sorted: every ``*.py`` directly in the package directory."""
    directory = directory or PACKAGE_DIR
    return sorted(n for n in os.listdir(directory)
                  if n.endswith(".py") and os.path.isfile(os.path.join(directory, n)))


def digest(directory: Optional[str] = None) -> str:
    """sha256 over the names and bytes of every file of the probe: a probe that reads torch
    differently (a new field, in any of its modules) must not be served the facts an older
    probe cached; PROBE_VERSION alone is not bumped for that."""
    directory = directory or PACKAGE_DIR
    h = sha256()
    try:
        for name in file_names(directory):
            with open(os.path.join(directory, name), "rb") as fh:
                data = fh.read()
            h.update(("%s\0%d\0" % (name, len(data))).encode("utf-8"))
            h.update(data)
    except OSError:
        return "unknown:%s" % time.time()  # unreadable: never reuse
    return h.hexdigest()
