"""The lock as callers hold it: the data of ``_model`` and the method that writes it.

``lock.save(path)`` is how training code writes a lock (``envlock.capture().save("env.lock")``).
The writer seals with the models' policies, so it imports the models; the method that calls the
writer therefore sits one layer above both, on a subclass that adds no field. The models stay
data that the seal, the writer and the reader build on, and no module of the package imports
one that imports it back.
"""

from __future__ import annotations

import os
from pathlib import Path

from envlock.lock._model import LockData
from envlock.lock._write import save


class Lock(LockData):
    """The whole ``env.lock``."""

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Seal (fingerprint) and write atomically; returns the path written."""
        return save(self, path)
