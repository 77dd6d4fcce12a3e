"""Reading, sealing and writing ``env.lock``.

Reading uses ``tomllib`` (fast, strict); writing uses ``tomlkit`` for the document and its
comments, with the long ``[[packages]]`` array emitted directly (tomlkit spends ~0.25 ms per
table, a quarter of a second for a 1,000-package lock, at the start of every training job).
Every write is atomic: a temp file in the same directory, fsync, ``os.replace``.

Two hashes seal a lock, both over canonical JSON (sorted keys, no whitespace, UTF-8):

* ``fingerprint`` covers what identifies the environment (``model.FINGERPRINT_EXCLUDE`` lists
  the host- and time-specific values left out), so one stack captured on two hosts shares it,
  and the short id quoted in papers is derived from it;
* ``integrity`` covers everything else too, so no hand edit anywhere goes unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envlock import __version__
from envlock.errors import EnvlockError, LockInvalid, LockTampered, UsageError
from envlock.model import FINGERPRINT_EXCLUDE, SCHEMA_VERSION, Lock

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

MAX_LOCK_BYTES = 16 * 1024 * 1024
HEADER = """\
env.lock - a replayable environment, written by envlock {version}.
  envlock verify {name}     does the environment in front of you match it?
  envlock show {name}       summary (--format markdown for a paper or pull request)
  envlock restore {name}    rebuild it as a container
Hand edits break the seal (verify exits 2); after a deliberate edit run `envlock fmt {name}`."""

_SECTION_COMMENTS = {
    "image": "Container the environment ran in; `source` says where each value came from.",
    "torch": "The torch stack as loaded in the process (cuDNN from the library, not ldconfig).",
    "gpu": "From NVML (or torch.cuda); device UUIDs are stored only as sha256.",
    "determinism": "Live flags of the captured process; `env` holds variables that change numerics.",
    "env": "Allow-listed variables only; secret-looking names are redacted, URLs lose credentials.",
    "git": "Working tree of the capture (informational, outside the fingerprint).",
    "canary": "sha256 of fixed, seeded kernels' outputs: numeric drift that versions miss.",
    "probe": "What the probe could not collect, and why.",
}


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def fingerprint(lock: Lock) -> str:
    data = lock.model_dump(mode="json", exclude=FINGERPRINT_EXCLUDE, exclude_none=True)
    return "sha256:" + hashlib.sha256(canonical_json(data)).hexdigest()


def integrity(lock: Lock) -> str:
    data = lock.model_dump(mode="json", exclude_none=True)
    data["envlock"].pop("fingerprint", None)
    data["envlock"].pop("integrity", None)
    return "sha256:" + hashlib.sha256(canonical_json(data)).hexdigest()


def seal(lock: Lock) -> Lock:
    """Return ``lock`` with both hashes recomputed for its current content."""
    meta = lock.envlock.model_copy(update={"fingerprint": None, "integrity": None})
    bare = lock.model_copy(update={"envlock": meta})
    meta = meta.model_copy(update={"fingerprint": fingerprint(bare), "integrity": integrity(bare)})
    return lock.model_copy(update={"envlock": meta})


def check_seal(lock: Lock, name: str = "env.lock") -> None:
    """Raise LockTampered when the content no longer matches the hashes written with it."""
    meta = lock.envlock
    if meta.fingerprint is None or meta.integrity is None:
        raise LockTampered(
            f"{name} is not sealed (no fingerprint)", hint=f"run `envlock fmt {name}` to seal it"
        )
    resealed = seal(lock).envlock
    if resealed.fingerprint != meta.fingerprint or resealed.integrity != meta.integrity:
        raise LockTampered(
            f"{name} was edited after capture: its fingerprint does not match its content",
            hint=f"if the edit was deliberate, run `envlock fmt {name}` to re-seal it",
        )


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(document)"
    extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{loc}: {msg}{extra}"


def parse(text: str, name: str = "env.lock", *, verify_seal: bool = True) -> Lock:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LockInvalid(f"{name} is not valid TOML: {exc}") from None
    return from_dict(data, name, verify_seal=verify_seal)


def from_dict(data: dict[str, Any], name: str = "env.lock", *, verify_seal: bool = True) -> Lock:
    meta = data.get("envlock")
    if not isinstance(meta, dict):
        raise LockInvalid(f"{name} is not an env.lock: it has no [envlock] table")
    version = meta.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise LockInvalid(
            f"{name} uses lock schema {version}; this envlock ({__version__}) reads up to "
            f"{SCHEMA_VERSION}",
            hint="upgrade envlock",
        )
    try:
        lock = Lock.model_validate(data)
    except ValidationError as exc:
        raise LockInvalid(f"{name} does not match the lock schema: {_first_error(exc)}") from None
    if verify_seal:
        check_seal(lock, name)
    return lock


def read_text(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_LOCK_BYTES:
            raise LockInvalid(
                f"{p} is {size / 1e6:.1f} MB; a lock is at most {MAX_LOCK_BYTES // (1 << 20)} MiB"
            )
        raw = p.read_bytes()
    except FileNotFoundError:
        raise LockInvalid(f"{p} not found", hint="create one with `envlock capture`") from None
    except IsADirectoryError:
        raise LockInvalid(f"{p} is a directory, not a lock file") from None
    except PermissionError:
        raise LockInvalid(f"{p} cannot be read: permission denied") from None
    if b"\0" in raw[:8192]:
        raise LockInvalid(f"{p} is a binary file, not an env.lock")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LockInvalid(f"{p} is not UTF-8 text (byte {exc.start})") from None


def load(path: str | os.PathLike[str], *, verify_seal: bool = True) -> Lock:
    """Read, validate and (by default) check the seal of a lock file."""
    return parse(read_text(path), str(path), verify_seal=verify_seal)


# -- writing -----------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    # JSON's string escapes (\" \\ \n \uXXXX ...) are all valid in TOML basic strings, and so
    # are its arrays of scalars; bool and int spell the same.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, float) and value != value:  # NaN has no place in a lock
        raise ValueError("NaN cannot be written to a lock")
    return json.dumps(value, ensure_ascii=False)


def _toml_key(key: str) -> str:
    if key and all(c.isalnum() or c in "-_" for c in key) and key.isascii():
        return key
    return json.dumps(key, ensure_ascii=False)


def _array_of_tables(name: str, rows: list[dict[str, Any]]) -> str:
    out = []
    for row in rows:
        out.append(f"\n[[{name}]]\n")
        out.extend(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in row.items())
    return "".join(out)


def _os_packages_table(table: dict[str, Any]) -> str:
    # One pin per line: tomlkit would write hundreds of them on a single line, and a diff of two
    # locks should show one line per changed OS package.
    specs = table.get("packages", [])
    out = [f"\n# {len(specs)} OS packages installed by {table['manager']}, as name:arch=version.\n",
           "[os_packages]\n", f"manager = {_toml_value(table['manager'])}\n", "packages = ["]
    out.extend(f"\n    {_toml_value(s)}," for s in specs)
    out.append("\n]\n" if specs else "]\n")
    return "".join(out)


def dumps(lock: Lock, name: str = "env.lock") -> str:
    """Render a lock as TOML: stable order (model field order, packages by name)."""
    import tomlkit  # imported early by capture(), in parallel with the probe

    data = lock.model_dump(mode="json", exclude_none=True)
    data["envlock"]["created_at"] = lock.envlock.created_at  # a native TOML datetime
    doc = tomlkit.document()
    for line in HEADER.format(version=lock.envlock.tool_version, name=name).splitlines():
        doc.add(tomlkit.comment(line))
    doc.add(tomlkit.nl())
    tail = []
    for key, value in data.items():
        if key in ("os_packages", "packages", "duplicates"):
            if value:
                tail.append((key, value))
            continue
        if value in ({}, []) and key not in ("determinism", "seeds"):
            continue
        table = tomlkit.table()
        if key in _SECTION_COMMENTS:
            table.add(tomlkit.comment(_SECTION_COMMENTS[key]))
        for k, v in value.items():
            if isinstance(v, list) and v and isinstance(v[0], dict):
                aot = tomlkit.aot()
                for row in v:
                    aot.append(tomlkit.item(row))
                table.add(k, aot)
            elif isinstance(v, dict):
                if not v:
                    continue
                sub = tomlkit.table()
                for sk, sv in v.items():
                    sub.add(sk, sv)
                table.add(k, sub)
            elif v != []:
                table.add(k, v)
        doc.add(key, table)
    text = tomlkit.dumps(doc)
    for key, rows in tail:
        if key == "os_packages":
            text += _os_packages_table(rows)
            continue
        if key == "packages":
            text += f"\n# {len(rows)} distributions, sorted by name. record_sha256 names the exact build.\n"
        else:
            text += "\n# Distributions shadowed by another of the same name earlier on sys.path.\n"
        text += _array_of_tables(key, rows)
    return text


def looks_like_lock(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(65536)
    except OSError:
        return False
    return b"[envlock]" in head


def atomic_write(path: Path, text: str) -> None:
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def save(lock: Lock, path: str | os.PathLike[str], *, force: bool = False, reseal: bool = True) -> Path:
    """Seal and write ``lock`` atomically.

    An existing file that is not an env.lock is never overwritten without ``force``: one typo
    in ``-o`` must not cost a researcher their training script.
    """
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{p} is a directory; give a file name such as {p / 'env.lock'}")
    if p.exists() and not force and not looks_like_lock(p):
        raise UsageError(
            f"refusing to overwrite {p}: it is not an env.lock", hint="pass --force to replace it"
        )
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write {p}: directory {parent} does not exist")
    # reseal=False is for a lock that was sealed a moment ago (capture): hashing twice costs
    # ~25 ms on a 5,000-package environment.
    sealed = seal(lock) if reseal or lock.envlock.fingerprint is None else lock
    try:
        atomic_write(p, dumps(sealed, p.name))
    except OSError as exc:
        raise EnvlockError(f"cannot write {p}: {exc.strerror or exc}") from None
    return p
