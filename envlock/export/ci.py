"""The report step of the GitHub Action (``action.yml``): verify/diff JSON -> markdown + outputs.

``python -m envlock.export.ci --json R.json --lock env.lock --command verify --fail-on breaking``
writes the markdown report (to ``--report`` and ``$GITHUB_STEP_SUMMARY``), the step outputs
``short-id``, ``drift`` and ``report-path`` (to ``$GITHUB_OUTPUT``; with ``--image``, the PNG of a
record's metric plots shown under the report, ``image-path`` too), and exits 1 when the
differences reach ``--fail-on``. Kept in the package (typed, tested) rather than as shell in
the action, so a workflow can run it the same way outside GitHub.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from envlock.drift.result import counts_text
from envlock.text.escape import github_output, markdown_code, markdown_text

FAIL_ON = ("breaking", "warning", "never")


def drift_level(counts: dict[str, int]) -> str:
    if counts.get("breaking"):
        return "breaking"
    if counts.get("warning"):
        return "warning"
    return "none"


def fails(level: str, fail_on: str) -> bool:
    return (fail_on == "breaking" and level == "breaking") or (fail_on == "warning" and level != "none")


def report(result: dict[str, Any], *, command: str, lock_name: str, summary: str,
           base_name: str | None = None) -> str:
    """The markdown a reviewer reads in the job summary or a PR comment."""
    counts = result.get("counts", {})
    level = drift_level(counts)
    what = (f"`{markdown_code(lock_name, table=False)}` against this environment" if command == "verify"
            else f"`{markdown_code(base_name or '?', table=False)}` → `{markdown_code(lock_name, table=False)}`")
    verdict = {"none": "no drift", "warning": "warnings only", "breaking": "**breaking drift**"}[level]
    out = [f"### envlock {command}: {verdict}", "",
           f"{what}: {counts_text(counts)}.", ""]
    shown = [d for d in result.get("differences", []) if d.get("severity") != "info"]
    if shown:
        out += ["| severity | what | difference |", "|---|---|---|"]
        out += [f"| {markdown_text(d.get('severity'), inline=True)} | `{markdown_code(d.get('path'))}` "
                f"| {markdown_text(d.get('message'), inline=True)} |" for d in shown]
        out.append("")
    return "\n".join(out) + "\n" + summary


# A step's summary holds at most 1 MiB; an image larger than this is named, not embedded.
MAX_IMAGE_BYTES = 512 * 1024


def image_markdown(path: Path) -> str:
    """The metric plots (``show RECORD --format png``) in the summary: embedded as a data URI,
    so the summary needs no upload and no link; a file too large for a summary is named."""
    import base64

    data = path.read_bytes()
    if len(data) > MAX_IMAGE_BYTES:
        return (f"The metric plots ({len(data) // 1024} KiB) are too large for the job summary: "
                f"`{markdown_code(path.name, table=False)}` (output `image-path`).\n")
    return (f"<img alt=\"the replay record's metrics, every metric plotted\" "
            f"src=\"data:image/png;base64,{base64.b64encode(data).decode('ascii')}\">\n")


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m envlock.export.ci")
    p.add_argument("--json", required=True, help="output of `envlock verify|diff --json`")
    p.add_argument("--lock", required=True)
    p.add_argument("--base-lock")
    p.add_argument("--command", choices=("verify", "diff"), default="verify")
    p.add_argument("--fail-on", choices=FAIL_ON, default="breaking")
    p.add_argument("--report", default="envlock-report.md")
    p.add_argument("--image", help="a PNG of a record's metric plots, shown under the report")
    args = p.parse_args(argv)

    from envlock.errors import EXIT_DRIFT, EXIT_OK, EXIT_USAGE, EnvlockError
    from envlock.lock import load
    from envlock.report.render import show_markdown

    try:
        result = json.loads(Path(args.json).read_text(encoding="utf-8"))
        lock = load(args.lock)
    except (OSError, ValueError, EnvlockError) as exc:
        sys.stderr.write(f"envlock: error: cannot build the report: {exc}\n")
        return EXIT_USAGE
    text = report(result, command=args.command, lock_name=Path(args.lock).name,
                  summary=show_markdown(lock, Path(args.lock).name),
                  base_name=Path(args.base_lock).name if args.base_lock else None)
    if args.image:
        try:
            text += "\n" + image_markdown(Path(args.image))
        except OSError as exc:
            sys.stderr.write(f"envlock: error: cannot read the image {args.image}: {exc}\n")
            return EXIT_USAGE
    Path(args.report).write_text(text, encoding="utf-8")
    _append(os.environ.get("GITHUB_STEP_SUMMARY"), text)
    level = drift_level(result.get("counts", {}))
    _append(os.environ.get("GITHUB_OUTPUT"),
            github_output("short-id", lock.short_id) + github_output("drift", level)
            + github_output("report-path", str(Path(args.report).resolve()))
            + (github_output("image-path", str(Path(args.image).resolve())) if args.image else ""))
    return EXIT_DRIFT if fails(level, args.fail_on) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
