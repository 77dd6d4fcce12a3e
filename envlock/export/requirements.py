"""``export --to requirements``: exact pins with hashes for ``pip install --require-hashes -r``.

pip reads one index per file (plus extras), so the PyTorch index that serves ``+cuXXX`` builds
goes in an ``--extra-index-url`` line; hashes keep pip from taking any other file from it. The
main index is written only when the lock or ``--index-url`` names one: otherwise it is left to
the installer's own configuration, as the user's pip or uv would pick it.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from envlock.errors import UsageError
from envlock.export.artifacts import Resolved, default_index
from envlock.export.redaction import public
from envlock.lock import Lock
from envlock.probe.rules import REDACTED
from envlock.text.escape import comment
from envlock.text.terminal import safe


def _hashes(r: Resolved) -> list[str]:
    return [f"    --hash=sha256:{a.sha256}" for a in r.artifacts]


def _find_links(wheelhouse: Path, relative_to: Path | None) -> str:
    """The wheelhouse as pip reads it from the file: relative to the file's directory when the
    file is written somewhere (pip and uv resolve it from there, so the pair can move together),
    quoted as pip splits option lines (shlex)."""
    path = str(wheelhouse)
    if relative_to is not None:
        path = os.path.relpath(wheelhouse, relative_to)
    if any(c in path for c in "\r\n\0"):
        raise UsageError(f"--wheelhouse {safe(path)}: a path with a line break cannot be written "
                         "into a requirements file")
    return shlex.quote(path)


def render(lock: Lock, resolved: list[Resolved], *, main_index: str | None = None,
           wheelhouse: Path | None = None, relative_to: Path | None = None,
           filename: str = "requirements.txt") -> str:
    """``relative_to``: the directory the file goes to (None: stdout); ``filename`` its name,
    for the install line of the header."""
    head = [f"# pip requirements exported from envlock {lock.short_id} ({lock.envlock.fingerprint})",
            f"# python {lock.python.version} on {comment(lock.platform.os)} {comment(lock.platform.machine)}",
            f"# install: pip install --require-hashes -r {comment(shlex.quote(filename))}"]
    opts: list[str] = []
    if wheelhouse is not None:
        opts += ["--no-index", f"--find-links {_find_links(wheelhouse, relative_to)}"]
    else:
        if main_index:
            opts.append(f"--index-url {public(main_index)}")
        # Resolved indexes are already public (artifacts.py); the main one is compared as such.
        extras = dict.fromkeys(r.index for r in resolved if r.kind == "index" and r.index)
        if extras:
            main = public(main_index or default_index()).rstrip("/")
            opts += [f"--extra-index-url {public(extra)}" for extra in extras if extra.rstrip("/") != main]
        for link in dict.fromkeys(r.index for r in resolved if r.kind == "links" and r.index):
            # A configured find-links location the files were found at: a directory as pip
            # reads it from this file, a page's URL without its credentials.
            shown = public(link) if "://" in link else _find_links(Path(link), relative_to)
            opts.append(f"--find-links {shown}")
    if any(REDACTED in line for line in opts):
        head.append(f"# {REDACTED}: a credential of the index URL, never written here; "
                    "give pip yours (keyring, netrc or PIP_INDEX_URL)")
    body: list[str] = []
    unhashed: list[str] = []
    for r in resolved:
        pkg = r.package
        if r.kind in ("index", "links", "wheelhouse"):
            body.append(f"{pkg.name}=={pkg.version} \\\n" + " \\\n".join(_hashes(r)))
        elif r.kind == "archive":
            target = r.artifacts[0].url or f"file://{r.artifacts[0].path}"
            body.append(f"{pkg.name} @ {target} \\\n" + " \\\n".join(_hashes(r)))
        elif r.kind == "vcs":
            body.append(f"{pkg.name} @ {pkg.vcs}+{pkg.url}@{pkg.commit}")
            unhashed.append(pkg.name)
        else:
            body.append(f"-e {r.path}" if pkg.source == "editable" else f"{pkg.name} @ file://{r.path}")
            unhashed.append(pkg.name)
    if unhashed:
        head.append("# not installable with --require-hashes (no artifact hash exists): "
                    + ", ".join(unhashed))
    return "\n".join([*head, *opts, *body]) + "\n"
