"""``envlock pack``: the lock, its wheels, its .debs and its base image in one artifact."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from envlock.commands._lockpath import lock_arg
from envlock.commands._output import say
from envlock.errors import EXIT_OK
from envlock.text.terminal import plural


def run(args: argparse.Namespace) -> int:
    from envlock.export.pack import PackOptions, pack
    from envlock.lock import load

    args.lock = lock_arg(args.lock)
    lock = load(args.lock)
    options = PackOptions(wheelhouses=tuple(Path(w) for w in args.wheelhouse or ()), python=args.python,
                          base=args.base, download=not args.no_download, index_url=args.index_url,
                          allow_http=args.allow_http, skip_local=args.skip_local,
                          image=not args.no_image, oci=not args.no_oci,
                          compile_cache=Path(args.compile_cache) if args.compile_cache else None)
    with contextlib.ExitStack() as stack:
        engine = None
        if options.image:
            from envlock.restore.endpoint import connect

            engine = stack.enter_context(connect(args.engine))
        result = pack(lock, Path(args.lock), Path(args.output), options, engine=engine, say=say)
    for note in result.notes:
        say(f"note: {note}")
    rebuilt = [r.name for r in result.wheels if r.origin == "rebuilt"]
    extra = f", {len(rebuilt)} rebuilt from installed files ({', '.join(rebuilt)})" if rebuilt else ""
    image = f", base image {result.base['id'][7:19]}" if result.base else ", no base image"
    if result.compile_cache is not None:
        image += f", compile cache {result.compile_cache.sha256[:12]}"
    how = (f"restore offline with: envlock restore {result.directory}" if result.base else
           f"restore offline with: envlock restore {result.directory} --target venv DIR (a container "
           "restore needs its base image: see the note above)")
    if result.conda_packages:
        extra += f", {plural(result.conda_packages, 'conda archive')}"
        how = f"restore offline with: envlock restore {result.directory} --target prefix DIR"
    sys.stdout.write(f"packed {lock.short_id} into {result.directory}: {plural(len(result.wheels), 'wheel')}{extra}"
                     f"{image}, {plural(len(result.debs), 'deb')}, {result.size / 1e6:.0f} MB in "
                     f"{result.seconds:.1f}s; {how}\n")
    return EXIT_OK
