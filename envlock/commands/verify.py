"""``envlock verify``: does this environment match the lock? With ``--fleet``: every node's."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from envlock._version import __version__
from envlock.check.local import check
from envlock.commands._lockpath import lock_arg
from envlock.commands._output import err, out
from envlock.errors import EXIT_DRIFT, EXIT_OK, EnvlockError, ProbeTimeout, UsageError
from envlock.probing.target import choose, recorded_prefix_hint

if TYPE_CHECKING:
    from envlock.drift.result import Difference
    from envlock.lock import Header
    from envlock.probing.target import Target
    from envlock.replay.compare import ReplayComparison


def run(args: argparse.Namespace) -> int:
    args.lock = lock_arg(args.lock)
    if args.requirements:
        return _requirements(args)
    if args.fleet_node:
        return _node(args)
    if args.fleet:
        return _fleet(args)
    if args.nodes is not None or args.timeout is not None:
        raise UsageError("--nodes and --timeout go with --fleet")
    return _verify(args)


def _verify(args: argparse.Namespace, *, node: bool = False) -> int:
    target = choose(args.python)
    warning = target.warning
    if warning and not node:  # a node's goes into its verdict, to be shown in its row
        err(f"envlock: warning: {warning}\n")
    # A plain verify may be answered by the one before it (``check/kept``): nothing changed.
    plain = not node and not args.deep and not args.record and not args.no_cache
    key = document = own = None
    head: Header | None = None
    here = False
    chosen = target
    if plain:
        from envlock.check import kept as answers
        from envlock.check.local import probe_wanted, started_probe
        from envlock.commands import is_program
        from envlock.lock import read_text

        torch_option = False if args.no_torch else None
        here = answers.probe_here(target.python, target.prefix, program=is_program())
        lock_text = None
        ran_with: bool | None = None  # the torch choice the probe here ran with, if it ran
        if here:
            # This interpreter is the one to probe: the probe runs here, before the one in
            # another interpreter that judges a miss, and the lock is named by its text, whose
            # header was read when the answer was kept (``check/kept``).
            lock_text = read_text(args.lock)  # refused as load() refuses it, before anything starts
            key = _kept_key(args, chosen, {"text": answers.text_digest(lock_text)}, here)
            found = answers.find(key)
            if found is not None and found.lock is not None:
                ran_with = probe_wanted(found.lock.tables, torch_option)[0]
                own = _own_document(args, ran_with)
                if own is not None and _kept_inputs(args, chosen, found.lock.prefix, own) == found.inputs:
                    out(found.output)
                    return EXIT_OK
        from envlock.lock import header  # not before: a kept answer found by the text needs none

        head = header(args.lock, text=lock_text)  # refused as load() refuses it, before anything starts
        wanted, want_canary = probe_wanted(head.tables, torch_option)
        if here and not want_canary:
            if ran_with != wanted:
                own = _own_document(args, wanted)
        else:
            here, own = False, None
            key = _kept_key(args, chosen, {"fingerprint": head.envlock.fingerprint,
                                           "integrity": head.envlock.integrity}, here)
            found = answers.find(key)
            if found is not None:
                with started_probe(args.lock, head.tables, python=target.python,
                                   torch=torch_option, deep=False, cache=not args.no_cache) as probe:
                    document = probe.result()
                if _kept_inputs(args, chosen, head.python.prefix, document) == found.inputs:
                    out(found.output)
                    return EXIT_OK
    result = check(args.lock, python=target.python, torch=False if args.no_torch else None,
                   in_process=False, strict=args.strict, deep=args.deep, cache=not args.no_cache,
                   limit=None if args.all else 10, document=document)
    cmp, expected, current, report = result.comparison, result.expected, result.current, result.deep
    # The report's modules only here: a kept answer prints what they wrote last time.
    from envlock.report.render import comparison_json, comparison_payload, verify_text
    from envlock.report.verify import deep_summary, torch_facts_line

    target = target.probed(current.python.prefix)
    captured_from = None if args.python else recorded_prefix_hint(expected.python.prefix, target)
    extra = dict(lock=str(args.lock), id=expected.short_id,
                 environment={"prefix": target.prefix, "reason": target.reason},
                 captured_from=captured_from, torch_facts=current.probe.torch_facts, deep=report)
    inputs = record_inputs(args.record) if args.record else None
    if node:
        from envlock.check.protocol import node_line

        # Only what decides a node's row travels: nodes differ by kernel or CPU model (info).
        kept = cmp._replace(differences=tuple(d for d in cmp.differences if d.severity != "info")
                            + _input_differences(inputs))
        out(node_line("verdict", result=comparison_payload(kept, **extra, warning=warning)))
    elif args.json:
        text = comparison_json(cmp, **extra)
        if inputs is not None:
            doc = json.loads(text)
            doc["record_inputs"] = inputs.to_dict()["inputs"]
            text = json.dumps(doc, indent=2) + "\n"
        out(text)
    else:
        text = (verify_text(cmp, expected, str(args.lock), show_info=args.all,
                            environment=target.describe(), captured_from=captured_from)
                + deep_summary(report) + torch_facts_line(current))
        out(text)
        if inputs is not None:
            from envlock.replay.report import inputs_text

            out(inputs_text(inputs, args.record))
    if key is not None and head is not None and cmp.ok and result.document is not None:
        from envlock.check import kept as answers
        from envlock.lock import Header

        judged = Header.of(expected)
        # Kept under the key of the lock that was judged: a file replaced between the header's
        # read and the models' is another lock, and its answer is not this key's.
        # The probe here ran before the judged one started: what it read is never newer than
        # what was judged. Without its document (no torch facts kept yet) nothing is kept.
        document = own if here else result.document
        if judged.envlock == head.envlock and document is not None:
            answers.keep(key, inputs=_kept_inputs(args, chosen, judged.python.prefix, document),
                         output=text,
                         lock=answers.KeptLock(frozenset(head.tables), head.python.prefix) if here else None)
    return EXIT_OK if cmp.ok and (inputs is None or inputs.same) else EXIT_DRIFT


def _own_document(args: argparse.Namespace, want_torch: bool) -> dict[str, Any] | None:
    """The probe's document of this interpreter, collected in this process (``check/kept``)."""
    from envlock.probing.capture import run_probe_as_fresh

    return run_probe_as_fresh(torch=want_torch, git_exclude=[args.lock])


def _kept_key(args: argparse.Namespace, target: Target, lock: dict[str, str | None], here: bool) -> str:
    """The name of the answer a plain verify may reuse: what decides its output and is known
    before the probe runs. ``lock`` names the lock: by its two hashes (from its header), or by
    its text (``here``: the probe runs in this process, and its kept answer is found before the
    header is read). ``here`` is part of the name, so that a document of one probe is never
    compared with the other's (``check/kept``)."""
    from envlock.check import kept
    from envlock.drift.result import RESTORED_FILE

    return kept.digest({
        "format": kept.FORMAT, "envlock": __version__, "lock": str(args.lock),
        "probe": "here" if here else "interpreter", **lock,
        "options": {k: getattr(args, k) for k in ("json", "all", "strict", "no_torch", "no_cache", "python")},
        "target": list(target), "here": kept.here(), "restored": kept.file_state(RESTORED_FILE),
        # What the probe, the comparator and the report may read of envlock's own settings.
        "settings": {k: v for k, v in os.environ.items() if k.startswith("ENVLOCK_")},
    })


def _kept_inputs(args: argparse.Namespace, target: Target, prefix: str | None, document: dict[str, Any]) -> str:
    """What the kept answer was derived from once the probe ran: its document (less timings,
    which differ on every run) and the lock's own environment (``prefix``, where it was
    captured) when it exists here."""
    from envlock.check import kept
    from envlock.probing.capture import without_timings

    captured_from = None if args.python else recorded_prefix_hint(prefix, target)
    return kept.digest({"document": without_timings(document), "captured_from": captured_from})


def _requirements(args: argparse.Namespace) -> int:
    """``--requirements``: this host against the lock's [requires] alone (no torch is imported:
    no requirement asks torch, so a CPU-only runner checks a GPU lock in a second)."""
    from envlock.drift.requirements import check as check_requirements
    from envlock.drift.requirements import host_of
    from envlock.lock import load
    from envlock.probe.system import cpu_flags
    from envlock.probing.capture import capture
    from envlock.report.requirements import requirements_text

    other = [flag for flag, on in (("--fleet", args.fleet or args.fleet_node), ("--deep", args.deep),
                                   ("--record", args.record), ("--no-torch", args.no_torch)) if on]
    if other:
        raise UsageError(f"--requirements judges the host alone; it does not go with {other[0]}")
    lock = load(args.lock)  # an invalid or tampered lock is exit 2 before anything runs
    target = choose(args.python)
    if target.warning:
        err(f"envlock: warning: {target.warning}\n")
    current = capture(python=target.python, torch=False, in_process=False, cache=not args.no_cache)
    result = check_requirements(lock, host_of(current, cpu_flags()), strict=args.strict)
    if args.json:
        out(json.dumps({"lock": str(args.lock), "id": lock.short_id, **result.to_dict()},
                       indent=2) + "\n")
    else:
        out(requirements_text(result, str(args.lock), lock.short_id))
    return EXIT_OK if result.ok else EXIT_DRIFT


def _node(args: argparse.Namespace) -> int:
    """One node's part of ``--fleet``: hello first (so a node that hangs later is still named),
    then its verdict or its error as one JSON line. Exit 0 either way: the verdict is in the line,
    and a non-zero exit would only add srun's noise."""
    from envlock.check.protocol import node_line

    out(node_line("hello"))
    try:
        _verify(args, node=True)
    except EnvlockError as exc:
        out(node_line("error", message=exc.message, exit_code=exc.exit_code,
                      timeout=isinstance(exc, ProbeTimeout)))
    return EXIT_OK


def _input_differences(inputs: ReplayComparison | None) -> tuple[Difference, ...]:
    """A node's changed record inputs, as rows of its verdict: each one fails the node."""
    from envlock.drift.result import Difference

    return tuple(Difference("inputs", f"inputs.{d.name}", d.original, d.now, "breaking",
                            f"{d.what} changed: {d.original} -> {d.now}")
                 for d in (inputs.inputs if inputs is not None else ()))


def _node_args(args: argparse.Namespace) -> list[str]:
    """The options every node's verify runs with: those of this command that judge a node.

    ``--record`` goes to every node rather than being refused: a preflight is asked whether
    every node will compute what the record computed, and its inputs are read where the job
    will read them (node-local scratch, a node's own Hugging Face cache, a shared filesystem
    that one node sees stale); a node whose copy differs fails as a node whose packages differ
    would. The record's path is made absolute, as the lock's is: the nodes start in this
    directory, and a record that one node cannot read is that node's error.
    """
    argv = ["--python", args.python] if args.python else []
    argv += [flag for flag, on in (("--no-torch", args.no_torch), ("--strict", args.strict),
                                   ("--deep", args.deep), ("--no-cache", args.no_cache)) if on]
    if args.record:
        argv += ["--record", os.path.abspath(args.record)]
    return argv


def _fleet(args: argparse.Namespace) -> int:
    from envlock.check import srun
    from envlock.check.fleetreport import fleet_text
    from envlock.lock import load

    lock = load(args.lock)  # an invalid or tampered lock is reported here, once, not per node
    if args.record:
        from envlock.replay.record import load as load_record

        load_record(args.record)  # so is an invalid or tampered record
    result = srun.run(str(args.lock), lock.short_id, nodes=args.nodes, timeout=args.timeout,
                      node_args=_node_args(args))
    if args.json:
        out(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    else:
        out(fleet_text(result))
    return result.exit_code


def record_inputs(path: str) -> ReplayComparison:
    """The record's inputs (data paths relative to the current directory, Hugging Face cache
    revisions) read again; a changed one is drift. Read before the probe's verdict is printed,
    so a bad record is exit 2 with nothing else said."""
    from pathlib import Path

    from envlock.replay.make import check_inputs
    from envlock.replay.record import load

    return check_inputs(load(path), Path.cwd())
