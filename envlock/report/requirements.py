"""The text of ``verify --requirements``: one line per requirement, then the verdict."""

from __future__ import annotations

from envlock.drift.requirements import RequirementsResult
from envlock.text.terminal import safe

_MARK = {"ok": "ok          ", "fail": "FAIL        ", "unchecked": "cannot check"}


def requirements_text(result: RequirementsResult, name: str, short_id: str) -> str:
    """The text of ``verify --requirements``: each requirement's verdict, and whether they were
    declared or derived, so a user knows what was judged."""
    lines = [f"{safe(name)} (id {safe(short_id)}): this host against the lock's [requires] only"]
    if result.derived:
        lines.append("  (the lock has no [requires] table, written by envlock since it existed: "
                     "judged by what its torch build implies; recapture or `envlock fmt "
                     "--require` to declare them)")
    if not result.checks:
        lines.append("  the lock declares no requirement a host could fail")
    for check in result.checks:
        lines.append(f"  {_MARK[check.verdict]}  {safe(check.requirement)}: {safe(check.message)}")
    met, failed, unchecked = (result.count(v) for v in ("ok", "fail", "unchecked"))
    told = f"{met} met, {failed} failed, {unchecked} cannot be checked on this host"
    if result.ok:
        verdict = f"OK: {told}" + (" (--strict: all were checked)" if result.strict else "")
    else:
        why = "failed" if failed else "cannot be checked here (--strict)"
        verdict = f"NOT MET: {told}; a requirement {why}"
    lines.append(verdict)
    return "\n".join(lines) + "\n"
