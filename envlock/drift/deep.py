"""``verify --deep``'s findings as differences, on envlock's side of the probe.

The hashing itself is ``envlock/probe/deep.py`` (stdlib, run by the probe in the checked
interpreter); this module turns its report into differences and lines up a ``--deep`` lock with
a plain capture. The line that says what was hashed is the report's (``report/verify.py``), and
the progress bar drawn while it runs is the probe runner's (``probing/progress.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envlock.text.terminal import agree, plural

if TYPE_CHECKING:
    from envlock.drift.result import Comparison, Difference
    from envlock.lock import Lock

DEFAULT_FILES_SHOWN = 10
# Rarer kinds first, so a page of edits does not hide the one missing file.
_KINDS = {"missing": "missing", "added": "added (not in RECORD)", "unreadable": "unreadable",
          "modified": "modified"}
_DEEP_FIELDS = ("files_sha256", "files_changed")


def differences(report: dict[str, Any], limit: int | None = DEFAULT_FILES_SHOWN) -> list[Difference]:
    """One breaking difference per file found (``limit`` per distribution, None for all)."""
    from envlock.drift.result import Difference

    out: list[Difference] = []
    for name, kinds in sorted(report.get("dists", {}).items()):
        files = [(kind, rel) for kind in _KINDS for rel in kinds.get(kind, [])]
        shown = files if limit is None else files[:limit]
        for kind, rel in shown:
            out.append(Difference("files", f"files.{name}.{rel}", None, kind, "breaking",
                                  f"{name}: {_KINDS[kind]}: {rel}"))
        if len(shown) < len(files):
            rest = len(files) - len(shown)
            out.append(Difference("files", f"files.{name}", None, f"{rest} more", "breaking",
                                  f"{name}: {plural(rest, 'more file')} {agree(rest, 'differs', 'differ')} from RECORD (--all lists them)"))
    return out


def merge(cmp: Comparison, report: dict[str, Any] | None,
          limit: int | None = DEFAULT_FILES_SHOWN) -> Comparison:
    """``cmp`` plus the deep findings, most severe first as ``compare`` orders them."""
    from envlock.drift.result import SEVERITY_RANK, Comparison

    if not report:
        return cmp
    items = [*cmp.differences, *differences(report, limit)]
    return Comparison(tuple(sorted(items, key=lambda d: SEVERITY_RANK[d.severity])), cmp.process,
                      strict=cmp.strict)


def align(expected: Lock, current: Lock) -> tuple[Lock, Lock]:
    """Drop the per-file fields from whichever side lacks them.

    A ``--deep`` lock verified without ``--deep`` (or the reverse) has nothing to compare
    file-wise, which is not drift; when both sides have them, ``compare`` sees them as any
    other package field.
    """
    def deep(lock: Lock) -> bool:
        return any(p.files_sha256 is not None for p in lock.packages)

    def strip(lock: Lock) -> Lock:
        bare = {f: None for f in _DEEP_FIELDS}
        return lock.model_copy(update={"packages": [p.model_copy(update=bare) for p in lock.packages]})

    if deep(expected) and not deep(current):
        return strip(expected), current
    if deep(current) and not deep(expected):
        return expected, strip(current)
    return expected, current
