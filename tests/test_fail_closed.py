"""Fail closed, bounded input: a hostile environment never empties a lock, hangs the probe or
verifies as unchanged.

Every case runs the real probe in another interpreter: a wrapper script that starts this
Python with ``-S`` (no site-packages: the probe sees the crafted directory and the stdlib only)
and the crafted directory on PYTHONPATH. The command runs in-process (``commands.main``), so a
case costs a probe run, not an interpreter start of envlock's.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import make_dist

from envlock.commands import main
from envlock.errors import EXIT_DRIFT, EXIT_ENV, EXIT_OK
from envlock.lock import load

# Far below the probe's own timeout: a case that blocks fails here instead of waiting it out.
PROBE_TIMEOUT = "60"


class Env:
    """A crafted environment: ``site`` on the path of the interpreter ``python`` names."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, *, no_site: bool = True) -> None:
        self.root = root
        self.site = root / "site"
        self.site.mkdir()
        self.python = root / "python"
        flags = "-S " if no_site else ""
        self.python.write_text(
            f'#!/bin/sh\nPYTHONPATH="{self.site}" exec "{sys.executable}" {flags}"$@"\n')
        self.python.chmod(0o755)
        self.lock = root / "env.lock"
        monkeypatch.setenv("ENVLOCK_PROBE_TIMEOUT", PROBE_TIMEOUT)
        monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(root / "cache"))
        monkeypatch.chdir(root)

    def run(self, *args: str) -> tuple[int, str, float]:
        """Exit code, stdout+stderr and seconds of ``envlock ARGS --python PYTHON``."""
        buf = io.StringIO()
        start = time.monotonic()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = main([*args, "--python", str(self.python)])
        return code, buf.getvalue(), time.monotonic() - start

    def capture(self, *extra: str) -> tuple[int, str, float]:
        return self.run("capture", "--no-torch", "--no-cache", "-o", str(self.lock), "--force", *extra)

    def verify(self, *extra: str) -> tuple[int, str, float]:
        return self.run("verify", str(self.lock), "--no-torch", "--no-cache", *extra)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    e = Env(tmp_path, monkeypatch)
    make_dist(e.site, "good", "1.0")
    return e


def _link_to_zero(dist: Path, leaf: str) -> None:
    target = dist / leaf
    if target.exists():
        target.unlink()
    target.symlink_to("/dev/zero")


def _fifo(dist: Path, leaf: str) -> None:
    target = dist / leaf
    if target.exists():
        target.unlink()
    os.mkfifo(target)


def _huge(dist: Path, leaf: str) -> None:
    with open(dist / leaf, "wb") as fh:  # sparse, all NULs: no disk is used, no header found
        fh.truncate(65 << 20)


def _dir_is_zero(dist: Path, leaf: str) -> None:
    import shutil

    shutil.rmtree(dist)
    dist.symlink_to("/dev/zero")


def _replace(make: Callable[[Path], None]) -> Callable[[Path, str], None]:
    def spoil(dist: Path, leaf: str) -> None:
        (dist / leaf).unlink()
        make(dist / leaf)
    return spoil


# (case, how the distribution's file is spoiled, the file, whether x becomes an error entry).
HOSTILE: list[tuple[str, Callable[[Path, str], object], str, bool]] = [
    *((f"{leaf}->/dev/zero", _link_to_zero, leaf, True) for leaf in ("RECORD", "METADATA", "direct_url.json")),
    *((f"{leaf} FIFO", _fifo, leaf, True) for leaf in ("RECORD", "METADATA", "direct_url.json")),
    # INSTALLER is informational (outside the fingerprint): left out, x is still locked.
    ("INSTALLER FIFO", _fifo, "INSTALLER", False),
    ("RECORD of 65 MiB", _huge, "RECORD", True),
    ("METADATA of 65 MiB without a header", _huge, "METADATA", True),
    ("dist-info->/dev/zero", _dir_is_zero, "", True),
    ("RECORD->/dev/null", _replace(lambda p: p.symlink_to("/dev/null")), "RECORD", True),
    ("RECORD is a directory", _replace(lambda p: p.mkdir()), "RECORD", True),
    ("RECORD->dangling", _replace(lambda p: p.symlink_to(p.parent / "nowhere")), "RECORD", True),
    # Not PEP 610 JSON: a source envlock cannot tell, recorded as such.
    ("direct_url.json not UTF-8", lambda d, leaf: (d / leaf).write_bytes(b"\xff{["), "direct_url.json", False),
]


# A few in the unit phase (a device, a FIFO, a directory that is a device), all in the slow one.
_UNIT = {"RECORD->/dev/zero", "METADATA FIFO", "dist-info->/dev/zero"}


@pytest.mark.parametrize("spoil,leaf,error", [
    pytest.param(*h[1:], id=h[0], marks=() if h[0] in _UNIT else pytest.mark.slow) for h in HOSTILE])
def test_a_hostile_file_is_that_distributions_error_and_verify_fails(
        env: Env, spoil: Callable[[Path, str], None], leaf: str, error: bool) -> None:
    dist = make_dist(env.site, "x", "1.0", direct_url={"url": "https://example.invalid/x.whl",
                                                       "archive_info": {}})
    spoil(dist, leaf)
    code, out, seconds = env.capture()
    assert code == EXIT_OK, out
    assert seconds < float(PROBE_TIMEOUT) / 2, "bounded: no read waited for the probe's timeout"
    lock = load(env.lock)
    # Never an empty section: the good distribution is there whatever happened to x.
    assert "good" in {p.name for p in lock.packages}
    if error:
        assert [(u.section, u.item) for u in lock.unreadable] == [("packages", "x-1.0.dist-info")]
        assert "x" not in {p.name for p in lock.packages}
        assert "could not be captured" in out
        # --strict writes nothing and says why (exit 3).
        env.lock.unlink()
        code, out, _ = env.capture("--strict")
        assert code == EXIT_ENV and "--strict" in out and not env.lock.exists(), out
        assert env.capture()[0] == EXIT_OK
    else:
        assert not lock.unreadable and "x" in {p.name for p in lock.packages}
    # An added distribution never verifies as unchanged beside an unreadable one.
    make_dist(env.site, "added", "2.0")
    code, out, seconds = env.verify()
    assert code == EXIT_DRIFT, out
    assert seconds < float(PROBE_TIMEOUT) / 2
    assert "added" in out
    if error:
        assert "x-1.0.dist-info" in out


def test_an_unreadable_distribution_fails_verify_on_its_own(env: Env) -> None:
    """Nothing added, nothing changed: the lock cannot vouch for x, so verify still fails."""
    _fifo(make_dist(env.site, "x", "1.0"), "RECORD")
    assert env.capture()[0] == EXIT_OK
    code, out, _ = env.verify()
    assert code == EXIT_DRIFT, out
    assert "packages x-1.0.dist-info could not be captured in the lock nor here" in out
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert main(["show", str(env.lock)]) == EXIT_OK
    assert "1 (verify fails): packages x-1.0.dist-info" in shown.getvalue()


# -- --deep: a RECORD entry that leads to a device or a FIFO is a finding, never a hang ------


@pytest.mark.parametrize("entry", ["../../dev/zero", pytest.param("x/pipe.py", marks=pytest.mark.slow),
                                   pytest.param("x/zero.py", marks=pytest.mark.slow)])
def test_deep_reads_only_regular_files(env: Env, entry: str) -> None:
    dist = make_dist(env.site, "x", "1.0")
    (env.site / "x").mkdir()
    os.mkfifo(env.site / "x" / "pipe.py")
    (env.site / "x" / "zero.py").symlink_to("/dev/zero")
    # Hashes to match once read; the stat cache is off (--no-cache) so every file is read.
    record = dist / "RECORD"
    depth = "/".join([".."] * len(env.site.parts))
    target = f"{depth}/dev/zero" if entry.startswith("../") else entry
    record.write_text(record.read_text() + f"{target},sha256=AAAA,1\n")
    code, out, seconds = env.capture("--deep")
    assert code == EXIT_OK, out
    assert seconds < float(PROBE_TIMEOUT) / 2
    x = load(env.lock).package("x")
    assert x is not None and x.files_changed
    assert any(c.startswith("unreadable ") and "not a regular file" in c for c in x.files_changed), x.files_changed
    code, out, seconds = env.verify("--deep")
    assert code == EXIT_DRIFT, out
    assert seconds < float(PROBE_TIMEOUT) / 2
    assert "unreadable" in out


# -- one bad package: its own error entry, never the whole capture's exit 3 ------------------


def _metadata(site: Path, dirname: str, head: bytes) -> None:
    dist = site / dirname
    dist.mkdir()
    (dist / "METADATA").write_bytes(b"Metadata-Version: 2.1\n" + head + b"\n\nbody\n")


BAD_PACKAGES = {
    "long_version-1.dist-info": b"Name: long-version\nVersion: " + b"1" * 300,
    "shell-1.dist-info": b"Name: shell\nVersion: 1.0 beta$(id)",
    "latin-1.dist-info": b"Name: caf\xe9\nVersion: 1.0",
    "newline-1.dist-info": b"Name: nl\nVersion: 1.0\\n[envlock]",
    "backtick-1.dist-info": b"Name: `id`\nVersion: 1.0",
}


def test_a_package_no_lock_may_carry_is_its_own_error_entry(env: Env) -> None:
    for dirname, head in BAD_PACKAGES.items():
        _metadata(env.site, dirname, head)
    code, out, _ = env.capture()
    assert code == EXIT_OK, out
    lock = load(env.lock)
    assert [p.name for p in lock.packages] == ["good"]
    assert len(lock.unreadable) == len(BAD_PACKAGES), lock.unreadable
    assert all(u.section == "packages" and "a value no lock may carry" in u.error for u in lock.unreadable)
    items = {u.item for u in lock.unreadable}
    assert {"long-version", "shell", "caf_", "nl", "_id_"} == items
    text = env.lock.read_text(encoding="utf-8")
    assert "$(id)" not in text and "`id`" not in text and "1" * 300 not in text
    code, out, _ = env.verify()
    assert code == EXIT_DRIFT, out
    assert "shell" in out
    # --strict refuses (exit 3) rather than write a lock that can never verify.
    assert env.capture("--strict")[0] == EXIT_ENV


# -- the probe's channel: start-up output never breaks it; a hostile answer is a clear error --


def test_start_up_output_does_not_break_the_probes_channel(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    env = Env(tmp_path, monkeypatch, no_site=False)
    make_dist(env.site, "good", "1.0")
    # sitecustomize runs at every start-up of an interpreter with site on: prints, unbalanced.
    (env.site / "sitecustomize.py").write_text(
        "import sys\nprint('hello from site [[{\"a\": ')\nsys.stdout.write('no newline {')\n")
    banner = env.root / "banner"
    banner.write_text(f'#!/bin/sh\necho "module load python ["\nexec "{env.python}" "$@"\n')
    banner.chmod(0o755)
    env.python = banner
    code, out, _ = env.capture()
    assert code == EXIT_OK, out
    assert load(env.lock).package("good") is not None
    assert env.verify()[0] == EXIT_OK


def _fake_python(root: Path, body: str) -> Path:
    """A program that answers envlock's version question as a Python would (so the failure
    reported is the probe's answer, not "not a Python") and prints ``body`` as the probe."""
    path = root / "fake-python"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then exec {sys.executable} \"$@\"; fi\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("body,message", [
    # 200,000 nested arrays after the probe's marker: RecursionError in the JSON parser.
    ("printf '\\n\\036envlock-probe-document\\n'; head -c 200000 /dev/zero | tr '\\0' '['\n",
     "nested too deeply"),
    ("head -c 200000 /dev/zero | tr '\\0' '['\n", "printed no JSON document"),
    ("printf '\\n\\036envlock-probe-document\\n[1, 2]'\n", "other than a JSON object"),
])
def test_a_hostile_probe_answer_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 body: str, message: str) -> None:
    env = Env(tmp_path, monkeypatch)
    env.python = _fake_python(tmp_path, body)
    code, out, _ = env.capture()
    assert code == EXIT_ENV, out
    assert message in out and "internal error" not in out and "Traceback" not in out


def test_nesting_inside_a_probe_document_is_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deep nesting inside a well-begun document (under a section) is refused the same way."""
    deep = "[" * 50000 + "]" * 50000
    env = Env(tmp_path, monkeypatch)
    env.python = _fake_python(
        tmp_path, f"printf '\\n\\036envlock-probe-document\\n{{\"platform\": {deep}}}'\n")
    code, out, _ = env.capture()
    assert code == EXIT_ENV, out
    assert "nested too deeply" in out and "internal error" not in out


# -- limits that match: capture never writes a lock that read refuses -----------------------


def test_capture_never_writes_a_lock_larger_than_read_accepts(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """One limit: the reader's. Lowered there alone, the writer follows it (so the real probe
    and a few hundred distributions stand in for 100,000 of them)."""
    from envlock.lock import _text

    for i in range(300):
        make_dist(env.site, f"p{i}", "1.0", files=1)
    monkeypatch.setattr(_text, "MAX_LOCK_BYTES", 64 << 10)
    code, out, _ = env.capture()
    assert code == EXIT_ENV, out
    assert "no command reads a lock over 0.0625 MiB, so none was written" in out
    assert not env.lock.exists()
    code, out, _ = env.run("capture", "--no-torch", "--no-cache", "-o", "-")
    assert code == EXIT_ENV and "[envlock]" not in out
    # Under the limit, what capture writes every reader takes.
    for i in range(250):
        shutil.rmtree(env.site / f"p{i}-1.0.dist-info")
    assert env.capture()[0] == EXIT_OK
    assert env.lock.stat().st_size <= 64 << 10
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["show", str(env.lock)]) == EXIT_OK


@pytest.mark.slow
def test_a_lock_of_100000_distributions_is_refused_at_write_time(tmp_path: Path) -> None:
    """The size that used to be written (18.6 MiB) and then refused by every reader."""
    from helpers import make_lock

    from envlock.errors import LockTooLarge
    from envlock.lock import MAX_LOCK_BYTES, save

    # The rows pip's installs give: an installer, REQUESTED, a RECORD digest.
    lock = make_lock(packages=[{"name": f"package-number-{i}", "version": "1.0.0", "installer": "pip",
                                "requested": True, "record_sha256": f"{i:064x}"} for i in range(100_000)])
    with pytest.raises(LockTooLarge, match=r"would be 1\d\.\d MiB; no command reads a lock over 16 MiB"):
        save(lock, tmp_path / "env.lock")
    assert not (tmp_path / "env.lock").exists()
    assert MAX_LOCK_BYTES == 16 << 20
