"""``envlock cache list|prune``: what restore keeps in envlock's cache, and taking it away.

Every entry is a copy or a by-product that a restore makes again when it needs it
(``envlock.restore.cachedir``); pruning never touches a restored image, a venv or a pack.
"""

from __future__ import annotations

import argparse
import json
import time

from envlock.commands._output import out
from envlock.errors import EXIT_OK
from envlock.text.terminal import safe


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB" if size >= 1e6 else f"{size / 1e3:,.0f} kB"


def _ago(seconds: float) -> str:
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= length:
            n = int(seconds // length)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "just now"


def run(args: argparse.Namespace) -> int:
    from envlock.restore import cachedir
    from envlock.restore.restore import cache_dir

    root = cache_dir()
    now = time.time()
    if args.action == "list":
        entries = cachedir.entries(root)
        total = sum(e.size for e in entries)
        if args.json:
            out(json.dumps({"root": str(root), "total_bytes": total, "entries": [
                {"kind": e.kind, "path": str(e.path), "bytes": e.size,
                 "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.mtime))}
                for e in entries]}, indent=2) + "\n")
            return EXIT_OK
        if entries:
            out(f"{'KIND':<15} {'SIZE':>12}  {'LAST USED':<16} PATH\n")
        for e in entries:
            out(f"{e.kind:<15} {_mb(e.size):>12}  {_ago(now - e.mtime):<16} {safe(e.path)}\n")
        out(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {_mb(total)}, in {safe(root)}"
            + ("; remove them with `envlock cache prune [--older-than 30d]`\n" if entries else "\n"))
        return EXIT_OK
    removed = cachedir.prune(root, older_than=args.older_than, now=now, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for e in removed:
        out(f"{verb} {e.kind} {safe(e.path)} ({_mb(e.size)}, last used {_ago(now - e.mtime)})\n")
    left = len(cachedir.entries(root)) if not args.dry_run else None
    kept = f"; {left} used more recently stay" if left else ""
    out(f"{verb} {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}, "
        f"{_mb(sum(e.size for e in removed))}, from {safe(root)}{kept}\n")
    return EXIT_OK
