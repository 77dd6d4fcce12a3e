"""The result of comparing two locks: differences, each with a severity, and the verdict.

Kept apart from the rules (``compare``, ``packages``) so that renderers and the deep report can
use the data types without the comparator, and the comparator's sections can share the
collector without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from envlock.text.terminal import plural, safe

Severity = Literal["breaking", "warning", "info"]
ProcessState = Literal["compare", "report"]
SEVERITIES: tuple[Severity, ...] = ("breaking", "warning", "info")
SEVERITY_RANK = {s: rank for rank, s in enumerate(SEVERITIES)}

# `envlock run` sets this in an image whose venv was restored onto another base: the image's
# OS packages are the base's by design (restore does not reinstall a host's apt packages), and
# the comparator (``compare.os_packages_come_from_base``) reads it. Here, the leaf both import,
# so that ``run`` sets it without importing the comparator and the models it is built on.
OS_FROM_BASE_ENV = "ENVLOCK_OS_PACKAGES"

# Where restore writes what it changed on purpose (``expected``, which reads it); here, beside
# the other leaf constant, so that verify's kept answer keys on the file without importing
# ``expected`` and the dataclasses it is built on.
RESTORED_FILE = "/usr/local/share/envlock-restore/restored.json"


def counts_text(counts: Mapping[str, int], *, zeros: bool = True) -> str:
    """How every report counts differences: "1 breaking, 2 warnings, 45 info" (severities
    without a difference left out unless ``zeros``)."""
    return ", ".join(plural(counts.get(s, 0), s) if s == "warning" else f"{counts.get(s, 0)} {s}"
                     for s in SEVERITIES if zeros or counts.get(s))


# NamedTuples: immutable values, equal when their fields are, changed only through
# ``_replace`` (a filter or a re-grading makes a new result); that is all a result needs.
class Difference(NamedTuple):
    """One field that differs: what the comparator found, its severity, and the words a report
    prints, so every report and the JSON say the same thing."""

    category: str
    path: str
    old: Any
    new: Any
    severity: Severity
    message: str = ""

    def describe(self) -> str:
        if self.message:
            return self.message
        if self.old is None:
            return f"added: {self.new}"
        if self.new is None:
            return f"removed (was {self.old})"
        return f"{self.old} -> {self.new}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "path": self.path,
            "old": self.old,
            "new": self.new,
            "severity": self.severity,
            "message": self.describe(),
        }

    @classmethod
    def from_dict(cls, row: Any) -> Difference:
        """A difference another process sent as ``to_dict`` wrote it (a node's verdict line, a
        rank's gathered list); ValueError when ``row`` is not one."""
        try:
            severity = row["severity"]
            if severity not in SEVERITY_RANK:
                raise ValueError(f"not a difference: unknown severity {severity!r}")
            return cls(str(row["category"]), str(row["path"]), row.get("old"), row.get("new"),
                       severity, str(row.get("message") or ""))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a difference: {exc!r}") from None


def difference_lines(differences: Sequence[Difference], *, most: int | None = None,
                     rest: str = "") -> list[str]:
    """One ``severity path: what`` line per difference, escaped for a terminal: the lists of
    ``verify --fleet`` (per node) and ``distributed.check`` (per rank), whose values come from
    another machine's process and may hold anything. With ``most``, the first ``most`` lines and
    one that counts the others (``rest``: where all of them are)."""
    shown = differences if most is None else differences[:most]
    lines = [safe(f"{d.severity:8s} {d.path}: {d.describe()}") for d in shown]
    if len(shown) < len(differences):
        lines.append(f"... and {len(differences) - len(shown)} more" + (f" ({rest})" if rest else ""))
    return lines


class Comparison(NamedTuple):
    """The differences between an expected lock (``old``) and an actual one (``new``).

    ``strict`` makes warnings count as drift too (``verify --strict``); ``ok`` is the one verdict
    every output (text, JSON, exit code) is derived from, so they cannot disagree.
    """

    differences: tuple[Difference, ...] = ()
    # Process state recorded in the lock that this (fresh) process does not have; not drift.
    process: tuple[Difference, ...] = ()
    strict: bool = False

    @property
    def breaking(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.severity == "breaking")

    @property
    def failing(self) -> tuple[Difference, ...]:
        """The differences that make ``ok`` false: breaking ones, and warnings when strict."""
        failing = ("breaking", "warning") if self.strict else ("breaking",)
        return tuple(d for d in self.differences if d.severity in failing)

    @property
    def ok(self) -> bool:
        return not self.failing

    def count(self, severity: Severity) -> int:
        return sum(1 for d in self.differences if d.severity == severity)

    def by_category(self, category: str) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.category == category)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "strict": self.strict,
            "counts": {s: self.count(s) for s in SEVERITIES},
            "differences": [d.to_dict() for d in self.differences],
            "process_state": [d.to_dict() for d in self.process],
        }


class Words(NamedTuple):
    """How messages name the two sides: verify speaks of the lock and this environment, a diff
    of its two files (``diff A B`` must not say "installed" about a file)."""

    old: str = "the lock"
    new: str = "this environment"
    is_diff: bool = False

    def only_new(self, what: str) -> str:
        return f"{what} only in {self.new}" if self.is_diff else f"{what} is installed but not in the lock"

    def only_old(self, what: str) -> str:
        return f"{what} only in {self.old}" if self.is_diff else f"{what} is in the lock but not installed"

    def where_new(self) -> str:
        return f"in {self.new}" if self.is_diff else "here"


class Collector:
    """The differences of one comparison as the comparator's sections add them, with the words
    for its two sides (a lock against this environment, or two locks)."""

    def __init__(self, words: Words | None = None) -> None:
        self.items: list[Difference] = []
        self.words = words or Words()

    def add(self, category: str, path: str, old: Any, new: Any, severity: Severity, message: str = "") -> None:
        self.items.append(Difference(category, path, old, new, severity, message))

    def fields(
        self,
        category: str,
        prefix: str,
        old: Mapping[str, Any],
        new: Mapping[str, Any],
        rules: Mapping[str, Severity],
        default: Severity | None = None,
    ) -> None:
        """Compare two flat dicts; keys without a rule use ``default`` (None: ignored)."""
        for key in sorted(set(old) | set(new)):
            severity = rules.get(key, default)
            if severity is None:
                continue
            a, b = old.get(key), new.get(key)
            if a != b:
                self.add(category, f"{prefix}.{key}", a, b, severity)


def dump(model: Any) -> dict[str, Any]:
    """A model as the plain dict the field comparisons walk (``None`` as an empty table), so a
    table missing on one side compares field by field like any other."""
    return {} if model is None else dict(model.model_dump(mode="json", exclude_none=True))
