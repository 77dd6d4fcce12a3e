"""``envlock/_files``: the one capped, typed text read (locks, replay records, uv configuration
files) and the one file digest."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envlock._files import file_digest, read_text, sha256_file
from envlock.errors import LockInvalid, UsageError


def _read(path: Path, limit: int = 1 << 20) -> str:
    return read_text(path, limit=limit, what="a thing", error=UsageError, missing_hint="make one")


def test_every_refusal_is_one_line_of_the_callers_type(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text("héllo\n", encoding="utf-8")
    assert _read(good) == "héllo\n"
    with pytest.raises(UsageError, match="not found") as missing:
        _read(tmp_path / "none")
    assert missing.value.hint == "make one"
    with pytest.raises(UsageError, match=r"is not a thing: not a regular file \(a directory\)"):
        _read(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opened without blocking, refused by its type: no read that never returns
    with pytest.raises(UsageError, match=r"not a regular file \(a FIFO\)"):
        _read(fifo)
    with pytest.raises(UsageError, match=r"not a regular file \(a character device\)"):
        _read(Path("/dev/zero"))
    binary = tmp_path / "binary"
    binary.write_bytes(b"PK\x03\x04\0\0")
    with pytest.raises(UsageError, match="is a binary file, not a thing"):
        _read(binary)
    latin = tmp_path / "latin"
    latin.write_bytes(b"ok \xe9\n")
    with pytest.raises(UsageError, match=r"not UTF-8 text \(byte 3\)"):
        _read(latin)
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as fh:
        fh.truncate(50 << 30)  # refused by its size, unread: 50 GB cost nothing
    with pytest.raises(UsageError, match=r"is 53687\.1 MB; a thing is at most 1 MiB"):
        _read(sparse)
    with pytest.raises(LockInvalid):
        read_text(latin, limit=100, what="a lock", error=LockInvalid)


def test_a_fifo_named_as_uv_configuration_is_refused_not_waited_on(tmp_path: Path) -> None:
    """The uv configuration reader had a copy of the read that opened a FIFO and waited for a
    writer forever; it now reads through the one function."""
    fifo = tmp_path / "uv.toml"
    os.mkfifo(fifo)
    code = ("from pathlib import Path; from envlock.errors import UsageError; "
            "from envlock.export.config import read\n"
            f"try: read(cwd=Path({str(tmp_path)!r}), environ={{'UV_CONFIG_FILE': {str(fifo)!r}}}, pip_items={{}})\n"
            "except UsageError as exc: print(exc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, stdin=subprocess.DEVNULL)
    assert out.stdout.strip() == f"{fifo} is not a uv configuration file: not a regular file (a FIFO)", out


def test_the_file_digest_is_hashlibs_in_any_algorithm(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)  # more than one chunk
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_digest(path) == (hashlib.sha256(data).hexdigest(), len(data))
    assert file_digest(path, "md5").hexdigest == hashlib.md5(data).hexdigest()
    assert sha256_file(path) == "sha256:" + hashlib.sha256(data).hexdigest()
