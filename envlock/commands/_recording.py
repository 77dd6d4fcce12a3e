"""What ``run --record/--replay``, ``record`` and ``replay`` share: the journal the command
writes through ``ENVLOCK_RECORD``, turning it into a record or a verdict afterwards, and the
restore options a container record keeps for its replay."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, cast, get_args

from envlock.commands._output import err, out, say
from envlock.errors import EXIT_DRIFT, EXIT_ENV, EXIT_OK, EnvlockError, UsageError
from envlock.text.terminal import plural

if TYPE_CHECKING:
    from envlock.replay.compare import ReplayComparison
    from envlock.replay.compilecache import CacheFile, CompileRun
    from envlock.replay.record import Record, RestoreOption, RestoreOptions, StopSignal

JOURNAL = "journal.jsonl"


@dataclass(frozen=True)
class Plan:
    """What a recorded or replayed run declares: outputs, inputs, and the original record."""

    record_path: str | None
    original: Any  # envlock.replay.record.Record | None
    outputs: list[str]
    inputs: list[str]
    git: dict[str, Any] | None = None  # the workspace's git state before the command ran
    report: str | None = None  # ``--report``: the page of the replay, written after the verdict


def plan(args: argparse.Namespace, *, replay_path: str | None, base: Path,
         command: Sequence[str], lock_path: str | None = None) -> Plan:
    """Read the options (and the original record, for a replay) before anything runs, so that
    what would stop the record from being written is exit 2 at once rather than after a
    training run: a bad record or ``--input``, a data path that is not there, a record path
    that cannot be written, a word of ``command`` or a path the record cannot hold. (In a
    replay a missing input is drift, found when it ends.) The workspace's git state is read
    here too, before the command can write to it, without the record, the lock (``lock_path``,
    or the original record's) and the declared outputs."""
    from envlock.replay.make import check_specs, workspace_git
    from envlock.replay.record import check_declared, check_target, load, recorded_command

    original = load(replay_path) if replay_path else None
    outputs = list(args.output or ([o.path for o in original.outputs] if original else []))
    inputs = list(args.input or ([i.name for i in original.inputs] if original else []))
    check_specs(inputs)
    check_declared(outputs, inputs)
    recorded_command(command)
    if original is None:
        from envlock.probe.inputs import HF_PREFIX

        absent = [s for s in inputs if not s.startswith(HF_PREFIX) and not (base / s).exists()]
        if absent:
            raise UsageError(f"--input {absent[0]}: no such file or directory in {base}")
    target = replay_path or getattr(args, "record", None) or getattr(args, "rec", None)
    if original is None and target is not None:
        check_target(target)
    if original is not None and original.record.lock and lock_path is None and replay_path:
        lock_path = os.path.join(os.path.dirname(os.path.abspath(replay_path)), original.record.lock)
    report = getattr(args, "report", None)
    if report is not None:
        if original is None:
            raise UsageError("--report writes a replay's page: give it with --replay",
                             hint="a record's own page: envlock show REC --format html -o FILE.html")
        check_report(report)
    own = [os.path.abspath(p) for p in (target, lock_path, report) if p]
    git = workspace_git(base, [*own, *outputs])
    return Plan(target, original, outputs, inputs, git, report)


def check_report(path: str) -> None:
    """Refuse, before anything runs, a ``--report`` that could not be written: the extra that
    draws its plots missing (exit 2 naming it, not after a training run), a missing
    directory, a directory as the file."""
    from envlock.report.plot import require

    require()
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--report {path} is a directory; give a file name such as {target / 'replay.html'}")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write --report {path}: directory {parent} does not exist")


def compile_files(args: argparse.Namespace, lock: Any, lock_name: str | None,
                  pack_cache: CacheFile | None = None) -> tuple[CacheFile | None, Path | None]:
    """The compile cache to load before the command (``--compile-cache``, else the pack's
    unless ``--no-compile-cache``) and where to collect the one it saves, checked before
    anything runs: a cache the lock's torch or Triton would not use is refused (exit 2)."""
    from envlock.replay.compilecache import check_against_lock, check_save_target, read_cache
    from envlock.text.terminal import safe

    given = getattr(args, "compile_cache", None)
    load = read_cache(given) if given else None if getattr(args, "no_compile_cache", False) else pack_cache
    if load is not None and lock is not None:
        check_against_lock(load, lock, lock_name or "the lock")
    if load is not None:
        say(safe(f"loading the compile cache {load.path} {load.describe()} before the command starts"))
    saving = getattr(args, "save_compile_cache", None)
    return load, check_save_target(saving) if saving else None


def compile_report(run: CompileRun, original: Record | None = None) -> None:
    """After the command: what it saved (or why not), and for a replay started cold, that the
    original had loaded a compile cache."""
    from envlock.text.terminal import safe

    saved = run.collect()
    if saved is not None:
        say(safe(f"saved the compile cache {saved.describe()} to {saved.path}"))
    for note in run.notes:
        say(safe(f"note: {note}"))
    was = original.context.get("compile.loaded") if original is not None else None
    if isinstance(was, str) and run.load is None:
        say(f"note: the recorded run had loaded the compile cache {was[:12]}; this replay compiles "
            "cold (give it with --compile-cache FILE)")


def recording_env(journal: str, workspace: str, trace: str | None = None,
                  hook: str | None = None, pythonpath: str | None = None) -> dict[str, str]:
    """The variables a recorded command runs with: where ``envlock.record`` writes, and the
    workspace whose files it hashes (``runtime.recorder``); with ``trace``, the directory its
    processes write their traces to (``probe.trace``), and with ``hook`` the start-up hook's
    directory prepended to ``pythonpath`` (what the command's ``PYTHONPATH`` would otherwise be:
    this process's on the host, the image's or the one given with ``-e`` in a container), so
    that every Python process of the run traces itself from its start."""
    from envlock.probe.trace import HOOK_ENV, TRACE_ENV
    from envlock.runtime.recorder import RECORD_ENV, WORKSPACE_ENV

    env = {RECORD_ENV: journal, WORKSPACE_ENV: workspace}
    if trace is not None:
        env[TRACE_ENV] = trace
    if trace is not None and hook is not None:
        env[HOOK_ENV] = hook
        env["PYTHONPATH"] = hook + (os.pathsep + pythonpath if pythonpath else "")
    return env


def container_hook(journal: Path) -> tuple[tuple[str, str, bool], str]:
    """The start-up hook for a container's run: its files copied into the run's journal
    directory (a private directory the engine can already mount; the installed envlock's own
    directory may be one it cannot reach) and mounted read-only at ``trace.CONTAINER_DIR``. The
    image needs no envlock, as restore's check needs none. (the mount, the hook's directory
    inside)."""
    from envlock.probe.trace import CONTAINER_DIR, container_hook_dir, hook_files

    root = journal / "probe"
    for rel, source in hook_files().items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    return (str(root), CONTAINER_DIR, True), container_hook_dir()


def trace_dir(journal: Path, enabled: bool) -> Path | None:
    """The run's trace directory inside its journal directory, made; None without a trace."""
    if not enabled:
        return None
    from envlock.replay.reads import trace_dir as of

    path = of(journal)
    path.mkdir(mode=0o700)
    return path


@contextmanager
def journal_dir() -> Iterator[Path]:
    """A private directory for the journal, removed afterwards (mounted into a container)."""
    path = Path(tempfile.mkdtemp(prefix="envlock-record-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def finish(p: Plan, journal: Path, *, command: Sequence[str], exit_code: int,
           where: Literal["container", "host"],
           base: Path, lock: Any, lock_path: str | None, tolerance: tuple[float, float],
           as_json: bool = False, program: str | None = None, restore: RestoreOptions | None = None,
           stderr_tail: Sequence[str] = (), inside: str | None = None,
           stop: KeyboardInterrupt | None = None, pack: tuple[str, str] | None = None) -> int:
    """Write the record (a recording run: the command's exit code) or compare with the
    original (a replay: ``verdict``'s exit code). ``inside``: the workspace's path in the
    container the command ran in (a container's run). ``pack``: the pack the lock came from
    (its path as given, its id): the record names it instead of the lock unpacked in the cache.

    ``stop``: the interrupt (Ctrl-C, SIGTERM, SIGHUP) that stopped the command. A record is
    still written, with what was recorded until then and the signal in ``interrupted`` (or a
    line says why it could not be); a replay says it has no verdict. Then ``stop`` goes on, so
    that envlock exits as interrupted."""
    from envlock.replay.make import make_record, read_inputs

    if stop is not None:
        return _finish_stopped(p, journal, stop, command=command, exit_code=exit_code, where=where,
                               base=base, lock=lock, lock_path=lock_path, program=program,
                               restore=restore, inside=inside, pack=pack)
    if p.original is None:
        assert p.record_path is not None
        rec = _recorded(p, journal, command=command, exit_code=exit_code, where=where, base=base, lock=lock,
                        lock_path=lock_path, program=program, restore=restore, inside=inside, pack=pack)
        err(f"envlock: recorded {_counts(rec)} in {p.record_path}\n")
        return exit_code
    from envlock.replay.compare import Tolerance, compare_records

    replay = make_record(journal, command=command, exit_code=exit_code, where=where, base=base,
                         outputs=p.outputs, inputs=(), lock=lock, program=program, git=p.git,
                         own=_own(p, lock_path), declared=p.inputs, inside=inside)
    cmp = compare_records(p.original, replay, Tolerance(*tolerance), read_inputs(p.inputs, base))
    name = str(p.record_path or "the record")
    code = verdict(cmp, name, as_json=as_json, stderr_tail=stderr_tail)
    if p.report is not None:
        write_report(p.report, cmp, p.original, replay, name, stderr_tail)
    return code


def write_report(path: str, cmp: ReplayComparison, original: Record, replay: Record, name: str,
                 stderr_tail: Sequence[str] = ()) -> None:
    """``--report``: the replay's page, with the original's lock folded in when it is beside
    the record."""
    from envlock.commands._output import deliver
    from envlock.replay.page import lock_beside, replay_page

    lock_text = lock_beside(original, name) if os.path.exists(name) else None
    deliver(replay_page(cmp, original, replay, os.path.basename(name), stderr_tail, lock_text), path)
    say(f"wrote the replay's page to {path}")


def _finish_stopped(p: Plan, journal: Path, stop: KeyboardInterrupt, *, command: Sequence[str],
                    exit_code: int, where: Literal["container", "host"], base: Path, lock: Any,
                    lock_path: str | None, program: str | None, restore: RestoreOptions | None,
                    inside: str | None, pack: tuple[str, str] | None) -> NoReturn:
    """``finish`` for a command a stop signal ended: the record of what ran until then, or
    the reason there is none; the interrupt raised again either way."""
    import signal

    name = signal.Signals(int(getattr(stop, "signum", signal.SIGINT))).name
    if p.original is not None:
        err(f"envlock: the replay was stopped by {name} before its end: no verdict\n")
        raise stop
    try:
        rec = _recorded(p, journal, command=command, exit_code=exit_code, where=where, base=base, lock=lock,
                        lock_path=lock_path, program=program, restore=restore, inside=inside, pack=pack,
                        interrupted=cast("StopSignal", name))
    except (EnvlockError, OSError) as exc:
        from envlock.text.terminal import safe

        err(safe(f"envlock: the run was stopped by {name}, and {p.record_path} could not be written: {exc}") + "\n")
        raise stop from None
    err(f"envlock: the run was stopped by {name}; recorded {_counts(rec)} until then in {p.record_path} "
        "(marked interrupted)\n")
    raise stop


def _counts(rec: Record) -> str:
    return (f"{plural(len(rec.steps), 'step')}, {plural(len(rec.outputs), 'output')} and "
            f"{plural(len(rec.inputs), 'input')}")


def _recorded(p: Plan, journal: Path, *, command: Sequence[str], exit_code: int,
              where: Literal["container", "host"], base: Path, lock: Any, lock_path: str | None,
              program: str | None, restore: RestoreOptions | None, inside: str | None,
              pack: tuple[str, str] | None, interrupted: StopSignal | None = None) -> Record:
    """The record of a recording run, saved at ``p.record_path``: the lock named relative to
    the record, or, for a pack's lock (unpacked in envlock's cache), the pack and its id."""
    from envlock.replay.make import make_record

    assert p.record_path is not None
    where_rec = os.path.dirname(os.path.abspath(p.record_path))

    def beside(path: str) -> str:
        return os.path.relpath(os.path.abspath(path), where_rec)

    rec = make_record(journal, command=command, exit_code=exit_code, where=where, base=base,
                      outputs=p.outputs, inputs=p.inputs, lock=lock,
                      lock_name=beside(lock_path) if lock_path and pack is None else None,
                      pack=(beside(pack[0]), pack[1]) if pack is not None else None,
                      program=program, restore=restore, git=p.git, own=_own(p, lock_path), inside=inside,
                      interrupted=interrupted)
    rec.save(p.record_path)
    return rec


def _own(p: Plan, lock_path: str | None) -> list[str]:
    """The record's and the lock's paths: files of envlock's, never the run's inputs."""
    return [q for q in (p.record_path, lock_path) if q]


def verdict(cmp: ReplayComparison, original: str, *, as_json: bool, stderr_tail: Sequence[str] = ()) -> int:
    """Print a comparison; its exit code: 0 reproduced, 1 diverged or an input drifted, 3 the
    command failed before it recorded a step (it did not run as recorded, which is the
    environment's: a missing module, another interpreter)."""
    from envlock.replay.report import replay_text

    if as_json:
        doc = cmp.to_dict()
        doc["stderr_tail"] = list(stderr_tail) if cmp.failed is not None else []
        out(json.dumps(doc, indent=2) + "\n")
    else:
        out(replay_text(cmp, original, stderr_tail))
    if cmp.failed is not None:
        return EXIT_ENV
    return EXIT_OK if cmp.same else EXIT_DRIFT


# -- the restore options of a container record ---------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _restore_option_names() -> tuple[RestoreOption, ...]:
    from envlock.replay.record import RestoreOption

    return get_args(RestoreOption)


def kept_restore_options(args: argparse.Namespace, record_path: str | None) -> RestoreOptions | None:
    """The restore options this ``run --record`` was given, as its record keeps them: a
    wheelhouse relative to the record (as its lock), and a value the lock's scrubbing rules
    would change (an index URL with a credential) left out and named as withheld, with a note
    now. Checked before the command runs, so that the record can be written after it.
    ``record_path`` None: the options a restore leaves for ``run`` (``remember``), the
    wheelhouse absolute."""
    from pydantic import ValidationError

    from envlock.probe.scrub import scrub_string, secret_values, strip_index_url
    from envlock.replay.record import RestoreOptions

    kept: dict[str, Any] = {}
    withheld: list[RestoreOption] = []
    secrets = secret_values()
    for name in _restore_option_names():
        value = getattr(args, name, None)
        if value is None or value is False:
            continue
        if isinstance(value, str):
            clean = scrub_string(strip_index_url(value) if name == "index_url" else value, secrets)
            if clean != value:
                withheld.append(name)
                continue
            if name == "wheelhouse":
                value = (os.path.abspath(value) if record_path is None else
                         os.path.relpath(os.path.abspath(value), os.path.dirname(os.path.abspath(record_path))))
        kept[name] = value
    if withheld and record_path is None:
        say(f"{', '.join(map(_flag, withheld))} held a credential and is not remembered for `envlock run`: "
            "give it again there")
    elif withheld:
        say(f"{', '.join(map(_flag, withheld))} held a credential and is not kept in {record_path}: "
            "give it again to `run --replay`")
    if not kept and not withheld:
        return None
    try:
        return RestoreOptions(**kept, withheld=withheld or None)
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"])
        raise UsageError(f"{_flag(where)}: a replay record cannot keep this value "
                         f"({exc.errors()[0]['msg']})") from None


def reuse_restore_options(args: argparse.Namespace, original: Record, record_path: str) -> None:
    """The restore options ``original`` was recorded with, for each one not given now, set on
    ``args`` and named in one line; a withheld one (a credential) must be given again."""
    if original.restore is not None:
        _reuse(args, original.restore, f"{record_path} was recorded with",
               os.path.dirname(os.path.abspath(record_path)), again="with --replay")


def _reuse(args: argparse.Namespace, kept: RestoreOptions, source: str, relative_to: str, *, again: str) -> bool:
    """Each option of ``kept`` not given now set on ``args`` (a wheelhouse relative to
    ``relative_to``), named in one line after ``source``; a withheld one must be given again.
    Whether any was set."""
    from envlock.text.terminal import safe

    missing = [n for n in kept.withheld or () if getattr(args, n, None) in (None, False)]
    if missing:
        flags = ", ".join(map(_flag, missing))
        raise UsageError(f"{source} {flags}, which held a credential and is not kept",
                         hint=f"give {flags} again {again}")
    reused: list[str] = []
    for name in _restore_option_names():
        value = getattr(kept, name)
        if value is None or getattr(args, name, None) not in (None, False):
            continue
        if name == "wheelhouse":
            value = os.path.normpath(os.path.join(relative_to, value))
        setattr(args, name, value)
        reused.append(_flag(name) if value is True else f"{_flag(name)} {value}")
    if reused:
        say(safe(f"reusing the restore options {source}: {' '.join(reused)}"))
    return bool(reused)


# -- the restore options a restore leaves for run -------------------------------------------------

# Under restore's cache: one file per lock (its id and where it is), the options of the last
# `envlock restore` of it.
REMEMBERED = "options"


def _remembered(short_id: str, lock_path: str) -> Path:
    """The file for the lock of id ``short_id`` at ``lock_path``. The path is part of the key:
    the same lock in another checkout (or another test's directory) may have been restored
    with another wheelhouse, and must not be given this one's options unasked."""
    import hashlib

    from envlock.restore.restore import cache_dir

    where = hashlib.sha256(os.path.realpath(lock_path).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return cache_dir() / REMEMBERED / f"{short_id}-{where}.json"


def remember_restore_options(args: argparse.Namespace, short_id: str, lock_path: str) -> None:
    """After ``envlock restore`` built or found the lock's image: the options it was given,
    kept for the lock's id (none given: what was kept is forgotten), so that a plain ``envlock
    run`` of the lock finds that image instead of restoring another from the defaults. A
    credential is not kept (``kept_restore_options``). A cache that cannot be written keeps
    nothing: run then needs the options again, as before."""
    import contextlib

    from envlock.lock import atomic_write

    kept = kept_restore_options(args, None)
    path = _remembered(short_id, lock_path)
    with contextlib.suppress(OSError):
        if kept is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, kept.model_dump_json(exclude_none=True) + "\n")


def reuse_remembered_options(args: argparse.Namespace, short_id: str, lock_path: str) -> bool:
    """The options the last ``envlock restore`` of this lock was given, for each one not given
    now, set on ``args`` and said in one line, as ``run --replay`` reuses a record's. A file
    that cannot be read or is not such options is no memory (it is envlock's cache). The models
    are imported only when there is such a file. Whether any option was set."""
    try:
        text = _remembered(short_id, lock_path).read_bytes()
    except OSError:
        return False
    from pydantic import ValidationError

    from envlock.replay.record import RestoreOptions

    try:
        kept = RestoreOptions.model_validate_json(text, strict=False)
    except ValidationError:
        return False
    return _reuse(args, kept, f"`envlock restore` was given for {lock_path}", "/", again="to `envlock run`")
