"""A torch.compile cache carried between processes (``probe/compilecache``, ``replay/compilecache``):
the file's header and digest, its refusal when damaged or made by another torch or Triton, the
loader that runs before a command, what a saved cache becomes, a pack that carries one, and the
``[compile].loaded`` fact that names a cold or warm start. Real torch compiles are in
``test_compilecache_torch.py``."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory, fake_engine_run, make_lock
from hypothesis import example, given, settings
from hypothesis import strategies as st

from envlock.drift.compare import compare
from envlock.errors import CompileCacheRefused, PackDamaged, UsageError
from envlock.lock._seal import canonical_form
from envlock.probe import compilecache, compilestate
from envlock.probe.env import collect_env
from envlock.probe.rules import ENV_NOT_RECORDED, env_allowed
from envlock.replay import compilecache as carried
from envlock.replay.compare import context_of
from envlock.restore import packdir

HEADER = {"torch": "2.13.0+cpu", "triton": None, "artifacts": {"inductor": 2, "aot_autograd": 1}}
PAYLOAD = b"\x00artifacts\xff" * 100


def write_cache(path: Path, payload: bytes = PAYLOAD, **header: Any) -> Path:
    compilecache.write(str(path), {**HEADER, **header}, payload)
    return path


# -- the file ------------------------------------------------------------------------------------


def test_a_cache_reads_back_with_its_header_payload_and_the_files_digest(tmp_path: Path) -> None:
    path = write_cache(tmp_path / "c.cache")
    header, payload, digest = compilecache.read(str(path))
    assert payload == PAYLOAD and digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert header["torch"] == "2.13.0+cpu" and header["payload_bytes"] == len(PAYLOAD)
    assert compilecache.read(str(path), payload=False)[1] is None
    found = carried.read_cache(path)
    assert found.sha256 == digest and found.artifacts == 3
    assert found.describe().startswith(f"{digest[:12]} (3 artifacts, 0.0 MB, made by torch 2.13.0+cpu)")


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "damaged"),           # one bit of the artifacts
    (lambda b: b[:-10], "damaged"),                                # cut short
    (lambda b: b + b"more", "damaged"),                            # bytes after the artifacts
    (lambda b: b"x" + b, "not a compile cache written by envlock"),
    (lambda b: compilecache.MAGIC + b"{not json\n", "not JSON"),
    (lambda b: compilecache.MAGIC + b'{"torch": 2}\n', "no valid torch, artifacts, payload_bytes"),
    (lambda b: compilecache.MAGIC + b"{}", "cut short"),
])
def test_a_damaged_file_is_refused_naming_what_is_wrong(tmp_path: Path, damage: Any, reason: str) -> None:
    path = write_cache(tmp_path / "c.cache")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(compilecache.CacheError, match=reason) as exc:
        compilecache.read(str(path))
    assert exc.value.kind == "invalid"
    with pytest.raises(CompileCacheRefused, match=reason) as refused:
        carried.read_cache(path)
    assert refused.value.exit_code == 2


def test_twin_an_intact_file_beside_damaged_ones_reads(tmp_path: Path) -> None:
    """The damage checks refuse no good file: every payload size, an empty Triton, a header
    with fields a later envlock adds."""
    for n, payload in enumerate([b"", b"x", PAYLOAD * 50]):
        path = write_cache(tmp_path / f"{n}.cache", payload, devices=["NVIDIA H200 (9.0)"], triton="3.7.1")
        assert compilecache.read(str(path))[1] == payload


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CompileCacheRefused, match="not a regular file"):
        carried.read_cache(fifo)
    with pytest.raises(CompileCacheRefused, match="no such file"):
        carried.read_cache(tmp_path / "missing")


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=400), header=st.booleans())
@example(data=b'{"torch": "2", "artifacts": {}, "payload_bytes": 3, "payload_sha256": "' + b"0" * 64 + b'"}\nabc',
         header=True)
@example(data=b"[" * 60_000 + b"\n", header=True)  # nested past the JSON parser's recursion limit
def test_any_bytes_are_a_cache_or_a_one_line_refusal(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                                                     header: bool) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "c.cache"
    path.write_bytes((compilecache.MAGIC if header else b"") + data)
    try:
        compilecache.read(str(path))
    except compilecache.CacheError as exc:
        assert "\n" not in str(exc) and exc.kind == "invalid"


def test_a_write_is_whole_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_cache(tmp_path / "c.cache")
    before = path.read_bytes()

    def fail(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="No space"):
        write_cache(path, b"new artifacts")
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["c.cache"]


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "thesis.tex"
    victim.write_text("precious")
    (tmp_path / "c.cache").symlink_to(victim)
    write_cache(tmp_path / "c.cache")
    assert victim.read_text() == "precious" and not (tmp_path / "c.cache").is_symlink()


# -- versions ------------------------------------------------------------------------------------


def test_another_torch_or_triton_is_refused_naming_both() -> None:
    header = compilecache.check_header({**HEADER, "payload_bytes": 0, "payload_sha256": "0" * 64})
    compilecache.check_versions(header, "2.13.0+cpu", None)  # the same stack
    with pytest.raises(compilecache.CacheError, match=r"made by torch 2.13.0\+cpu \(no Triton\); this environment "
                                                     r"has torch 2.12.1 \(no Triton\)") as exc:
        compilecache.check_versions(header, "2.12.1", None)
    assert exc.value.kind == "version"
    with pytest.raises(compilecache.CacheError, match=r"has torch 2.13.0\+cpu \(Triton 3.7.1\)"):
        compilecache.check_versions(header, "2.13.0+cpu", "3.7.1")


def test_a_lock_of_another_stack_refuses_the_cache_before_anything_runs(tmp_path: Path) -> None:
    cache = carried.read_cache(write_cache(tmp_path / "c.cache"))
    same = make_lock(torch={"version": "2.13.0+cpu"})
    carried.check_against_lock(cache, same, "env.lock")
    with pytest.raises(CompileCacheRefused, match=r"torch 2.12.0 \(Triton 3.1.0\).*\(env.lock\)"):
        other = make_lock(torch={"version": "2.12.0"}, packages=[("triton", "3.1.0")])
        carried.check_against_lock(cache, other, "env.lock")
    with pytest.raises(CompileCacheRefused, match=r"env\.lock has no torch"):
        carried.check_against_lock(cache, make_lock(), "env.lock")


# -- the loader and the collector ----------------------------------------------------------------


def test_the_loader_runs_before_the_command_here_and_in_a_container(tmp_path: Path) -> None:
    cache = carried.read_cache(write_cache(tmp_path / "c.cache"))
    with carried.compile_run(cache, None, container=False) as run:
        wrapped = run.command("/venv/bin/python", ["torchrun", "train.py"])
        d = str(run.directory)
        assert wrapped == ["/venv/bin/python", f"{d}/compilecache.py", "populate", str(cache.path.absolute()),
                           f"{d}/inductor", f"{d}/status.json", "--", "torchrun", "train.py"]
        assert (run.directory / "compilecache.py").read_bytes() == Path(compilecache.__file__).read_bytes()
        assert run.env() == {}
    assert not run.directory.exists()  # removed, whatever the command did
    with carried.compile_run(cache, tmp_path / "out.cache", container=True) as run:
        assert run.command("/opt/venv/bin/python", ["python", "t.py"])[1:6] == [
            "/envlock-compile/compilecache.py", "populate", "/envlock-compile/cache.bin",
            "/envlock-compile/inductor", "/envlock-compile/status.json"]
        assert run.mounts() == [(str(run.directory), "/envlock-compile", False),
                                (str(cache.path.resolve()), "/envlock-compile/cache.bin", True)]
        assert run.env() == {"ENVLOCK_COMPILE_CACHE_OUT": "/envlock-compile/saved.bin"}
    with carried.compile_run(None, None, container=True) as run:
        assert run.command("python", ["python", "t.py"]) == ["python", "t.py"] and run.mounts() == []
        assert run.loaded() is None and run.collect() is None


@pytest.mark.parametrize(("status", "error", "message"), [
    ({"refused": "version", "message": "it was made by torch 2.12.1 (no Triton)"}, CompileCacheRefused,
     "made by torch 2.12.1.*nothing was run"),
    ({"loaded": "a" * 64, "not_started": "trian.py: No such file"}, UsageError, "could not be started"),
    (None, CompileCacheRefused, "did not run"),
    ("[1]", CompileCacheRefused, "no status"),
])
def test_what_the_loader_reports_stops_the_run(tmp_path: Path, status: Any, error: type[Exception],
                                               message: str) -> None:
    cache = carried.read_cache(write_cache(tmp_path / "c.cache"))
    with carried.compile_run(cache, None, container=False) as run:
        if status is not None:
            text = status if isinstance(status, str) else json.dumps(status)
            (run.directory / "status.json").write_text(text)
        with pytest.raises(error, match=message):
            run.loaded()


def test_twin_a_loaded_cache_is_its_digest(tmp_path: Path) -> None:
    cache = carried.read_cache(write_cache(tmp_path / "c.cache"))
    with carried.compile_run(cache, None, container=False) as run:
        (run.directory / "status.json").write_text(json.dumps({"loaded": "b" * 64, "artifacts": {"inductor": 2}}))
        assert run.loaded() == "b" * 64


def test_a_saved_cache_is_checked_and_moved_whole(tmp_path: Path) -> None:
    target = carried.check_save_target(tmp_path / "saved.cache")
    with carried.compile_run(None, target, container=False) as run:
        assert run.collect() is None and "no compile cache was saved" in run.notes[0]
        write_cache(Path(run.env()["ENVLOCK_COMPILE_CACHE_OUT"]))
        found = run.collect()
        assert found is not None and found.path == target
        assert found.sha256 == hashlib.sha256(target.read_bytes()).hexdigest()
        saved = Path(run.env()["ENVLOCK_COMPILE_CACHE_OUT"])
        saved.write_bytes(saved.read_bytes()[:-1])  # a process killed mid-way never renames, but a
        with pytest.raises(CompileCacheRefused, match="damaged"):  # file from elsewhere may be cut
            run.collect()
    assert carried.read_cache(target).sha256 == found.sha256  # the good one stayed
    assert sorted(os.listdir(tmp_path)) == ["saved.cache"]
    with pytest.raises(UsageError, match="is a directory"):
        carried.check_save_target(tmp_path)
    with pytest.raises(UsageError, match="no directory"):
        carried.check_save_target(tmp_path / "none" / "x.cache")


def test_the_loader_is_the_commands_python_else_the_environment_capture_chooses(tmp_path: Path) -> None:
    assert carried.host_python("/p/.venv/bin/python3.11", tmp_path) == "/p/.venv/bin/python3.11"
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    assert carried.host_python("/p/.venv/bin/torchrun", tmp_path) == str(venv / "bin" / "python")
    # A program in another environment is loaded for by that environment's Python.
    other = tmp_path / "elsewhere" / "env"
    (other / "bin").mkdir(parents=True)
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (other / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    assert carried.host_python(str(other / "bin" / "torchrun"), tmp_path) == str(other / "bin" / "python")


# -- [compile].loaded ----------------------------------------------------------------------------


def test_the_probe_names_the_cache_loaded_into_the_directory_in_use(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # What a process that compiled records (``compiled_here``: real compiles in test_compilecache_torch).
    monkeypatch.setattr(compilestate, "compiled_here", lambda: True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("ENVLOCK_COMPILE_CACHE_LOADED", f"{'c' * 64}:{tmp_path / 'inductor'}")
    assert compilestate.collect_compile([])["loaded"] == "c" * 64
    # A process that moved to another cache directory does not run from what was loaded.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "other"))
    assert "loaded" not in compilestate.collect_compile([])
    for garbage in ("", "c" * 64, "zz:" + str(tmp_path / "other"), f"{'C' * 64}:{tmp_path / 'other'}"):
        monkeypatch.setenv("ENVLOCK_COMPILE_CACHE_LOADED", garbage)
        assert "loaded" not in compilestate.collect_compile([])
    # Its variables are envlock's bookkeeping for one run, not the environment.
    assert {compilecache.SAVE_ENV, compilecache.LOADED_ENV, compilecache.OWN_DIR_ENV} <= set(ENV_NOT_RECORDED)
    assert not env_allowed(compilecache.LOADED_ENV) and env_allowed("ENVLOCK_SEED")


def test_the_inductor_directory_envlock_made_is_not_recorded_but_a_users_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader points TORCHINDUCTOR_CACHE_DIR at a fresh temporary directory at every run:
    recorded, it made every replay with ``--compile-cache`` name the variable as a cause. Its
    twin: a directory the user (or the process) chose is a cause, and stays recorded."""
    own = str(tmp_path / "envlock-compile-x" / "inductor")
    monkeypatch.setenv(compilecache.INDUCTOR_DIR_ENV, own)
    monkeypatch.setenv(compilecache.OWN_DIR_ENV, own)
    assert compilecache.INDUCTOR_DIR_ENV not in collect_env()
    # The process (or the user, under torchrun) pointed it elsewhere: theirs.
    monkeypatch.setenv(compilecache.INDUCTOR_DIR_ENV, str(tmp_path / "mine"))
    assert collect_env()[compilecache.INDUCTOR_DIR_ENV] == str(tmp_path / "mine")
    # No directory of envlock's: a user's own cache, as it always was.
    monkeypatch.delenv(compilecache.OWN_DIR_ENV)
    monkeypatch.setenv(compilecache.INDUCTOR_DIR_ENV, own)
    assert collect_env()[compilecache.INDUCTOR_DIR_ENV] == own
    # Only that variable: another one with the same value is the user's.
    monkeypatch.setenv(compilecache.OWN_DIR_ENV, own)
    monkeypatch.setenv("TRITON_CACHE_DIR", own)
    assert collect_env()["TRITON_CACHE_DIR"] == own


def test_cold_against_warm_is_named_and_is_process_state() -> None:
    cold = make_lock(compile={"caches": []})
    warm = make_lock(compile={"caches": [], "loaded": "d" * 64})
    d = next(x for x in compare(cold, warm).differences if x.path == "compile.loaded")
    assert d.severity == "warning"
    assert d.describe() == f"compile cache loaded before compiling: none (compiled cold) -> compile cache {'d' * 12}"
    reported = compare(warm, cold, process_state="report")
    assert reported.ok and [p.path for p in reported.process] == ["compile.loaded"]
    assert context_of(canonical_form(warm))["compile.loaded"] == "d" * 64
    assert "compile.loaded" not in context_of(canonical_form(cold))
    assert compare(warm, warm).differences == ()


# -- a pack that carries one ---------------------------------------------------------------------


def _lock_file(restore_lock: LockFactory, tmp_path: Path, torch: str = "2.13.0+cpu") -> tuple[Any, Path]:
    lock = restore_lock(torch={"version": torch}, packages=[("six", "1.16.0")])
    path = tmp_path / "env.lock"
    lock.save(path)
    return lock, path


def test_pack_carries_the_cache_under_its_checksums_and_run_finds_it(
        restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_restore_run_bundle import make_wheel

    from envlock.export.pack import PackOptions, pack

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "six", "1.16.0")
    lock, lock_path = _lock_file(restore_lock, tmp_path)
    cache = write_cache(tmp_path / "c.cache")
    result = pack(lock, lock_path, tmp_path / "pack", PackOptions(wheelhouses=(house,), download=False, image=False,
                                                                 compile_cache=cache), engine=None)
    root = tmp_path / "pack"
    assert result.compile_cache is not None
    assert (root / packdir.COMPILE_CACHE).read_bytes() == cache.read_bytes()
    sums = {rel: digest for digest, rel in (line.split("  ", 1) for line in
                                            (root / "SHA256SUMS").read_text().splitlines())}
    assert sums[packdir.COMPILE_CACHE] == hashlib.sha256(cache.read_bytes()).hexdigest()
    opened = packdir.open_pack(root, tmp_path / "work")
    entry = opened.manifest["compile_cache"]
    assert entry["torch"] == "2.13.0+cpu" and entry["artifacts"] == {"aot_autograd": 1, "inductor": 2}
    assert opened.compile_cache is not None
    found = carried.pack_cache(opened.compile_cache, entry["sha256"])
    assert found.sha256 == result.compile_cache.sha256
    # A pack without one says so.
    plain = pack(lock, lock_path, tmp_path / "plain", PackOptions(wheelhouses=(house,), download=False,
                                                                 image=False), engine=None)
    assert plain.compile_cache is None and packdir.open_pack(tmp_path / "plain", tmp_path / "w").compile_cache is None


def test_pack_refuses_a_cache_the_lock_would_not_use_before_collecting(
        restore_lock: LockFactory, tmp_path: Path) -> None:
    from envlock.export.pack import PackOptions, pack

    lock, lock_path = _lock_file(restore_lock, tmp_path, torch="2.12.0")
    with pytest.raises(CompileCacheRefused, match=r"this environment has torch 2\.12\.0") as exc:
        pack(lock, lock_path, tmp_path / "pack", PackOptions(download=False, image=False,
                                                             compile_cache=write_cache(tmp_path / "c.cache")),
             engine=None)
    assert exc.value.exit_code == 2 and not (tmp_path / "pack").exists()


def _pack_dir(tmp_path: Path, entry: Any) -> Path:
    root = tmp_path / "p"
    root.mkdir()
    (root / "pack.json").write_text(json.dumps({"envlock_pack": 1, "compile_cache": entry}))
    return root


def _seal(root: Path) -> None:
    """SHA256SUMS over the pack's files, as ``pack`` writes it last."""
    from envlock.export.pack import sums_text

    (root / "SHA256SUMS").write_text(sums_text(root))


@pytest.mark.parametrize("rel", ["../c.cache", "/etc/passwd", "compile/../../c.cache", "link/c.cache"])
def test_a_compile_cache_named_outside_the_pack_is_refused(tmp_path: Path, rel: str) -> None:
    write_cache(tmp_path / "c.cache")
    root = _pack_dir(tmp_path, {"path": rel, "sha256": "0" * 64})
    _seal(root)
    if not rel.startswith("link/"):  # a path that leads out by its own text
        opened = packdir.open_pack(root, tmp_path / "work")
        with pytest.raises(UsageError, match="compile cache outside the pack") as exc:
            _ = opened.compile_cache
        assert exc.value.exit_code == 2
    # A link inside the pack that leads out of it: the pack's check refuses it before the
    # manifest is read, and the manifest's path rule refuses what it leads to too.
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(PackDamaged, match="holds a link, link") as damaged:
        packdir.open_pack(root, tmp_path / "work")
    assert damaged.value.exit_code == 2
    with pytest.raises(UsageError, match="compile cache outside the pack"):
        _ = packdir.Pack(root, json.loads((root / "pack.json").read_text())).compile_cache


def test_twin_a_cache_inside_the_pack_is_found_and_its_digest_checked(tmp_path: Path) -> None:
    root = _pack_dir(tmp_path, {"path": "compile/c.cache", "sha256": "0" * 64})
    (root / "compile").mkdir()
    write_cache(root / "compile" / "c.cache")
    _seal(root)
    opened = packdir.open_pack(root, tmp_path / "work")
    assert opened.compile_cache == root / "compile" / "c.cache"
    with pytest.raises(CompileCacheRefused, match="not the one its manifest names"):
        carried.pack_cache(root / "compile" / "c.cache", "0" * 64)
    (root / "compile" / "l.cache").symlink_to(root / "compile" / "c.cache")
    with pytest.raises(CompileCacheRefused, match="not a file in the pack"):
        carried.pack_cache(root / "compile" / "l.cache", "0" * 64)
    for bad in ({"sha256": "0" * 64}, "compile/c.cache"):
        with pytest.raises(UsageError, match="without a path"):
            _ = packdir.Pack(root, {"compile_cache": bad}).compile_cache


# -- the command line: refused before anything runs ----------------------------------------------


MARK = "open('ran', 'w').write('x')"


def test_record_refuses_a_damaged_or_foreign_cache_and_runs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main

    monkeypatch.chdir(tmp_path)
    damaged = write_cache(tmp_path / "damaged.cache")
    damaged.write_bytes(damaged.read_bytes()[:-1])
    assert main(["record", "r.rec", "--compile-cache", str(damaged), "--", sys.executable, "-c", MARK]) == 2
    assert "damaged" in capsys.readouterr().err
    make_lock(torch={"version": "2.12.0"}).save(tmp_path / "env.lock")
    good = write_cache(tmp_path / "good.cache")
    assert main(["record", "r.rec", "--compile-cache", str(good), "--", sys.executable, "-c", MARK]) == 2
    assert "made by torch 2.13.0+cpu (no Triton); this environment has torch 2.12.0" in capsys.readouterr().err
    assert main(["record", "r.rec", "--save-compile-cache", "no/such/x.cache", "--", sys.executable, "-c", MARK]) == 2
    assert not (tmp_path / "ran").exists() and not (tmp_path / "r.rec").exists()


SAVES = """
import os, sys
from envlock.probe import compilecache
compilecache.write(os.environ["ENVLOCK_COMPILE_CACHE_OUT"], {"torch": "2.13.0+cpu", "triton": None,
                   "artifacts": {"inductor": 1}}, b"compiled")
"""


def test_record_collects_the_cache_the_command_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    assert main(["record", "r.rec", "--save-compile-cache", "out.cache", "--", sys.executable, "-c", SAVES]) == 0
    saved = carried.read_cache(tmp_path / "out.cache")
    assert saved.header["artifacts"] == {"inductor": 1}
    assert f"saved the compile cache {saved.sha256[:12]}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.cache", "r.rec"]
    # A command that saves nothing leaves no file, and says why.
    assert main(["record", "r2.rec", "--save-compile-cache", "none.cache", "--", sys.executable, "-c", "pass"]) == 0
    assert "no compile cache was saved" in capsys.readouterr().err and not (tmp_path / "none.cache").exists()


# -- run: the loader in the image, with a fake engine --------------------------------------------


@pytest.fixture
def image_run(restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``run`` without an engine. The command "runs" in the image as the loader would: with a
    cache to load it writes ``STATUS`` into the mounted directory, and under
    ``--save-compile-cache`` it saves a cache where ``ENVLOCK_COMPILE_CACHE_OUT`` says."""
    lock = restore_lock(torch={"version": "2.13.0+cpu"}, packages=[("six", "1.16.0")])
    lock.save(tmp_path / "env.lock")
    state: dict[str, Any] = {"STATUS": {"loaded": "e" * 64}, "runs": [], "builds": []}

    def run_in_image(*args: Any, **_: Any) -> int:
        opts = args[4]
        state["runs"].append(opts)
        host = {inside: Path(outside) for outside, inside, _ in opts.mounts}
        if "/envlock-compile" in host and opts.command[2:3] == ["populate"]:
            (host["/envlock-compile"] / "status.json").write_text(json.dumps(state["STATUS"]))
        out = opts.env.get("ENVLOCK_COMPILE_CACHE_OUT")
        if out:
            write_cache(host["/envlock-compile"] / Path(out).name)
        return 0

    fake_engine_run(monkeypatch, lock, run_in_image, builds=state["builds"])
    monkeypatch.chdir(tmp_path)
    return state


def test_run_loads_the_cache_in_the_image_and_collects_what_it_saved(
        image_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main

    cache = write_cache(tmp_path / "c.cache")
    assert main(["run", "env.lock", "--compile-cache", "c.cache", "--save-compile-cache", "out.cache",
                 "--", "python", "train.py"]) == 0
    opts = image_run["runs"][-1]
    assert opts.command[:2] == ["/opt/venv/bin/python", "/envlock-compile/compilecache.py"]
    assert opts.command[-3:] == ["--", "python", "train.py"]
    assert (str(cache.resolve()), "/envlock-compile/cache.bin", True) in opts.mounts
    assert carried.read_cache(tmp_path / "out.cache").header["artifacts"] == HEADER["artifacts"]
    err = capsys.readouterr().err
    assert "loading the compile cache c.cache" in err and "saved the compile cache" in err
    # Without either option the command runs as given, with nothing mounted for it.
    assert main(["run", "env.lock", "--", "python", "train.py"]) == 0
    assert image_run["runs"][-1].command == ["python", "train.py"] and image_run["runs"][-1].mounts == []


def test_run_reports_a_cache_the_images_torch_refused(
        image_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main

    write_cache(tmp_path / "c.cache")
    image_run["STATUS"] = {"refused": "version", "message": "it was made by torch 2.13.0+cpu (no Triton); "
                                                            "this environment has torch 2.13.1 (no Triton)"}
    assert main(["run", "env.lock", "--compile-cache", "c.cache", "--record", "r.rec",
                 "--", "python", "train.py"]) == 2
    assert "this environment has torch 2.13.1" in capsys.readouterr().err
    assert not (tmp_path / "r.rec").exists()  # no record of a run that never started
    assert main(["run", "env.lock", "--jupyter", "--compile-cache", "c.cache"]) == 2


def test_run_pack_loads_the_cache_the_pack_carries_unless_told_not_to(
        image_run: dict[str, Any], restore_lock: LockFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from test_restore_run_bundle import make_wheel

    from envlock.commands import main
    from envlock.export.pack import PackOptions, pack
    from envlock.lock import load

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "six", "1.16.0")
    lock = load(tmp_path / "env.lock")
    pack(lock, tmp_path / "env.lock", tmp_path / "pack", PackOptions(
        wheelhouses=(house,), download=False, image=False, compile_cache=write_cache(tmp_path / "c.cache")),
        engine=None)
    assert main(["run", "pack", "--", "python", "train.py"]) == 0
    opts = image_run["runs"][-1]
    packed = (tmp_path / "pack" / packdir.COMPILE_CACHE).resolve()
    assert (str(packed), "/envlock-compile/cache.bin", True) in opts.mounts
    _, options, kw = image_run["builds"][-1]
    assert options.wheelhouse.resolve() == tmp_path / "pack" / "wheels" and kw["network"] is False
    assert "loading the compile cache" in capsys.readouterr().err
    assert main(["run", "pack", "--no-compile-cache", "--", "python", "train.py"]) == 0
    assert image_run["runs"][-1].command == ["python", "train.py"]
    assert main(["run", "pack", "--jupyter"]) == 0  # the cache is not in the way of JupyterLab
    assert image_run["runs"][-1].mounts == []
    assert "the pack's compile cache is loaded before a command after --" in capsys.readouterr().err
    # A pack whose compile cache was swapped after packing is refused: SHA256SUMS names it.
    write_cache(tmp_path / "pack" / packdir.COMPILE_CACHE, b"other artifacts")
    assert main(["run", "pack", "--", "python", "train.py"]) == 2
    assert "compile/torch-compile.cache (changed)" in capsys.readouterr().err


def test_run_pack_holds_the_cache_so_prune_refuses_under_the_running_job(
        image_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """While the command of `run PACK` runs, `envlock cache prune` refuses: it would remove the
    unpacked pack and the compile cache mounted from it under the job."""
    from test_restore_run_bundle import make_wheel

    from envlock.commands import main
    from envlock.export.pack import PackOptions, pack
    from envlock.lock import load
    from envlock.restore import restore as restore_mod

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "six", "1.16.0")
    pack(load(tmp_path / "env.lock"), tmp_path / "env.lock", tmp_path / "pack.tar", PackOptions(
        wheelhouses=(house,), download=False, image=False, compile_cache=write_cache(tmp_path / "c.cache")),
        engine=None)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "envlock-cache"))
    seen: list[int] = []
    from envlock.restore import run as run_mod

    in_image = run_mod.run_in_image  # the fixture's stand-in for the command

    def run_in_image(*args: Any, **kw: Any) -> int:
        seen.append(main(["cache", "prune"]))
        return in_image(*args, **kw)

    monkeypatch.setattr(run_mod, "run_in_image", run_in_image)
    assert main(["run", "pack.tar", "--", "python", "train.py"]) == 0
    assert seen == [3] and "is using the cache" in capsys.readouterr().err
    assert any((restore_mod.cache_dir() / "packs").iterdir())  # the unpacked pack is still there


def test_nothing_of_torch_is_imported_until_a_cache_is_saved_or_loaded(tmp_path: Path) -> None:
    """Importing Inductor takes seconds: a record() call that arranges the save, and the probe's
    [compile] (capture, verify), import none of torch."""
    import subprocess

    code = ("import sys, envlock; from envlock.probe.compilestate import collect_compile; "
            "envlock.record(0, loss=1.0); collect_compile([]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "ENVLOCK_COMPILE_CACHE_OUT": str(tmp_path / "out.cache")}
    env.pop("ENVLOCK_RECORD", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.strip() == "[]" and not (tmp_path / "out.cache").exists()


def test_a_cache_named_with_terminal_controls_is_shown_inert(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main

    monkeypatch.chdir(tmp_path)
    name = "c\x1b]0;owned\x07\u202e.cache"
    cache = write_cache(tmp_path / name)
    cache.write_bytes(cache.read_bytes()[:-1])
    assert main(["record", "r.rec", "--compile-cache", name, "--", sys.executable, "-c", MARK]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err and "damaged" in err


def test_twin_an_ordinary_cache_name_is_shown_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main

    monkeypatch.chdir(tmp_path)
    name = "runs/2026-01-02 résumé (v2).cache"
    (tmp_path / "runs").mkdir()
    cache = write_cache(tmp_path / name)
    cache.write_bytes(cache.read_bytes()[:-1])
    assert main(["record", "r.rec", "--compile-cache", name, "--", sys.executable, "-c", MARK]) == 2
    assert f"compile cache {name}: it is damaged" in capsys.readouterr().err


@settings(max_examples=100, deadline=None)
@given(status=st.binary(max_size=200))
@example(status=b'{"loaded": 5}')
@example(status=b"[" * 60_000)
@example(status=b'{"refused": true, "message": "\\u001b[2J"}')
def test_any_status_the_loader_leaves_is_a_digest_or_a_one_line_error(
        tmp_path_factory: pytest.TempPathFactory, status: bytes) -> None:
    root = tmp_path_factory.mktemp("status")
    cache = carried.read_cache(write_cache(root / "c.cache"))
    with carried.compile_run(cache, None, container=False) as run:
        (run.directory / "status.json").write_bytes(status)
        try:
            found = run.loaded()
        except (CompileCacheRefused, UsageError) as exc:
            assert "\n" not in exc.message and "\x1b" not in exc.message
        else:
            assert found is None or len(found) == 64


def test_a_torch_without_portable_compile_caches_is_told_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    old = types.ModuleType("torch")
    old.__version__ = "2.3.1"  # type: ignore[attr-defined]
    old.compiler = types.SimpleNamespace()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", old)
    with pytest.raises(compilecache.CacheError, match=r"torch 2\.3\.1 has no torch\.compiler\.save_cache_artifacts"):
        compilecache.save(str(tmp_path / "c.cache"))
    with pytest.raises(compilecache.CacheError, match=r"torch 2\.3\.1 has no torch\.compiler\.load_cache_artifacts"):
        compilecache.load(str(write_cache(tmp_path / "d.cache", torch="2.3.1")))
    assert sorted(os.listdir(tmp_path)) == ["d.cache"]


def test_the_benchmarks_report_on_made_up_timings() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "compilecache.py"
    spec = importlib.util.spec_from_file_location("_bench_compilecache", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    text = bench.report({"repeats": 3, "layers": 12, "bytes": 200_000, "median_s": {
        "cold": 40.0, "by hand": 20.0, "envlock": 24.0, "envlock cold": 42.0}})
    assert "| envlock | 24.0 | 0.60x |" in text
    assert "envlock (warm) / by hand (warm): 1.20x; envlock (warm) / envlock cold: 0.57x" in text
