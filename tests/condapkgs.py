"""Hand-built conda packages, a local channel of them, and a prefix installed from it.

What conda, mamba and pixi install is a directory of archives (``.tar.bz2``, or ``.conda``: a
zip of two zstd tarballs) whose ``info/index.json`` names the package and ``info/paths.json``
lists its files with their sha256, and for a file holding the build prefix, the placeholder
to replace and how (``text``, or ``binary``: padded with NULs inside a C string). This module
builds a few such packages the way conda-build lays them out, so the tests exercise every
kind of file the real ones hold without a network or a conda binary:

* ``libfoo``: a shared library (compiled with gcc) with the prefix in a C string (binary
  placeholder), its ``.so`` symlink, and ``bin/foo-config``, a script with the prefix as text;
* ``footool``: a binary linking libfoo through ``$ORIGIN/../lib`` that prints the prefix the
  library holds (depends on libfoo);
* ``python``: this interpreter's CPython (binary, libpython, the standard library without
  site-packages and tests), its runtime path set to ``$ORIGIN/../lib`` with patchelf and its
  ``_sysconfigdata`` holding the old prefix as a text placeholder: without a ``python``
  record, noarch python packages do not link;
* ``foopy``: a noarch python package with an entry point (``foopy``), depending on python;
* ``foodata``: a noarch generic package of one data file.

The channel is indexed with py-rattler's ``index_fs`` and the prefix installed with its
``solve`` and ``install``: both are set up by ``scripts/test.sh``, as are gcc and patchelf; a
missing one fails the tests that need them.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# As long as conda-build's: a prefix shorter than the placeholder fits in a binary file.
PLACEHOLDER = "/opt/envlock-test-build/_h_env_" + "placehold_" * 16
SUBDIR = "linux-64"
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"

LIBFOO_C = """
const char *foo_prefix(void) { return "%s/share/foo"; }
"""
FOOTOOL_C = """
#include <stdio.h>
const char *foo_prefix(void);
int main(void) { printf("footool %s\\n", foo_prefix()); return 0; }
"""
FOOPY = """
import sys


def main() -> int:
    print("foopy", sys.prefix)
    return 0
"""
# What the standard library copy leaves out: the tests, GUI and packaging tools, and caches.
_STDLIB_SKIP = ("site-packages", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip",
                "lib2to3", "__pycache__", "config-" + PY)


@dataclass(frozen=True)
class Built:
    """One package archive in the channel."""

    name: str
    version: str
    build: str
    path: Path


@dataclass(frozen=True)
class Channel:
    """A local channel and the prefix installed from it."""

    dir: Path
    prefix: Path
    packages: tuple[Built, ...]

    @property
    def url(self) -> str:
        return self.dir.as_uri()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tar(entries: Sequence[tuple[str, bytes | str, int]]) -> bytes:
    """An uncompressed tar of (path, bytes or a symlink's target as str, mode)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data, mode in sorted(entries):
            info = tarfile.TarInfo(path)
            info.mtime = 1_700_000_000
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def build_package(channel: Path, name: str, version: str, files: dict[str, bytes | str], *,
                  build: str = "h0_0", depends: tuple[str, ...] = (), noarch: str | None = None,
                  placeholders: dict[str, str] | None = None, link: dict[str, object] | None = None,
                  fmt: str = ".tar.bz2", executable: tuple[str, ...] = ()) -> Built:
    """One package in ``channel/<subdir>/``. ``files``: path -> content (bytes) or a symlink's
    target (str); ``placeholders``: path -> ``text`` or ``binary`` for the files holding
    ``PLACEHOLDER``; ``executable``: paths installed with mode 0755."""
    placeholders = placeholders or {}
    subdir = "noarch" if noarch else SUBDIR
    index = {"name": name, "version": version, "build": build, "build_number": 0,
             "depends": list(depends), "license": "MIT", "subdir": subdir, "timestamp": 1_700_000_000_000}
    if noarch:
        index["noarch"] = noarch
    else:
        index.update(platform="linux", arch="x86_64")
    paths = []
    for path, data in sorted(files.items()):
        if isinstance(data, str):
            paths.append({"_path": path, "path_type": "softlink",
                          "sha256": _sha256(data.encode()), "size_in_bytes": len(data)})
            continue
        entry: dict[str, object] = {"_path": path, "path_type": "hardlink", "sha256": _sha256(data),
                                    "size_in_bytes": len(data)}
        if path in placeholders:
            entry.update(file_mode=placeholders[path], prefix_placeholder=PLACEHOLDER)
        paths.append(entry)
    info: dict[str, bytes] = {
        "info/index.json": json.dumps(index, indent=2).encode(),
        "info/paths.json": json.dumps({"paths": paths, "paths_version": 1}, indent=2).encode(),
        "info/files": "".join(p + "\n" for p in sorted(files)).encode(),
    }
    if placeholders:
        info["info/has_prefix"] = "".join(
            f'{PLACEHOLDER} {mode} {path}\n' for path, mode in sorted(placeholders.items())).encode()
    if link:
        info["info/link.json"] = json.dumps(link).encode()
    pkg: list[tuple[str, bytes | str, int]] = [(p, d, 0o755 if p in executable else 0o644) for p, d in files.items()]
    meta: list[tuple[str, bytes | str, int]] = [(p, d, 0o644) for p, d in info.items()]
    stem = f"{name}-{version}-{build}"
    out = channel / subdir / (stem + fmt)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == ".tar.bz2":
        out.write_bytes(bz2.compress(_tar(meta + pkg), compresslevel=1))
    else:
        import zstandard

        level = zstandard.ZstdCompressor(level=1)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
            zf.writestr(f"info-{stem}.tar.zst", level.compress(_tar(meta)))
            zf.writestr(f"pkg-{stem}.tar.zst", level.compress(_tar(pkg)))
    return Built(name, version, build, out)


def _gcc(work: Path, source: str, out: str, *args: str) -> bytes:
    (work / "src.c").write_text(source)
    subprocess.run(["gcc", "-O1", "-o", str(work / out), str(work / "src.c"), *args],
                   check=True, capture_output=True, timeout=120)
    return (work / out).read_bytes()


def _python_files(work: Path) -> tuple[dict[str, bytes | str], dict[str, str]]:
    """This CPython as a conda package's files: bin/pythonX.Y (runtime path ``$ORIGIN/../lib``
    set with patchelf), libpython when it is a shared build, the standard library without
    site-packages; its ``_sysconfigdata`` holds the old prefix as a text placeholder."""
    base = sys.base_prefix
    exe = os.path.realpath(os.path.join(base, "bin", "python" + PY))
    files: dict[str, bytes | str] = {}
    shutil.copy(exe, work / "python")
    subprocess.run(["patchelf", "--set-rpath", "$ORIGIN/../lib", str(work / "python")],
                   check=True, capture_output=True, timeout=60)
    files[f"bin/python{PY}"] = (work / "python").read_bytes()
    files["bin/python3"] = f"python{PY}"
    files["bin/python"] = f"python{PY}"
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        ldlib = str(sysconfig.get_config_var("LDLIBRARY"))
        real = os.path.realpath(os.path.join(str(sysconfig.get_config_var("LIBDIR")), ldlib))
        files["lib/" + os.path.basename(real)] = Path(real).read_bytes()
        if os.path.basename(real) != ldlib:
            files["lib/" + ldlib] = os.path.basename(real)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    placeholders = {}
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _STDLIB_SKIP]
        for fname in names:
            full = Path(root) / fname
            if full.is_symlink() or fname.endswith((".pyc", ".pyo")):
                continue
            rel = f"lib/python{PY}/" + full.relative_to(stdlib).as_posix()
            data = full.read_bytes()
            if fname.startswith("_sysconfigdata") and base.encode() in data:
                data = data.replace(base.encode(), PLACEHOLDER.encode())
                placeholders[rel] = "text"
            files[rel] = data
    return files, placeholders


def build_channel(root: Path) -> tuple[Path, tuple[Built, ...]]:
    """The five packages (see the module) in ``root/channel``, indexed."""
    channel, work = root / "channel", root / "work"
    work.mkdir(parents=True, exist_ok=True)
    libfoo = _gcc(work, LIBFOO_C % PLACEHOLDER, "libfoo.so.1", "-shared", "-fPIC", "-Wl,-soname,libfoo.so.1")
    footool = _gcc(work, FOOTOOL_C, "footool", str(work / "libfoo.so.1"), "-Wl,-rpath,$ORIGIN/../lib")
    py_files, py_placeholders = _python_files(work)
    built = (
        build_package(channel, "libfoo", "1.0", {
            "lib/libfoo.so.1": libfoo, "lib/libfoo.so": "libfoo.so.1",
            "bin/foo-config": f"#!/bin/sh\necho {PLACEHOLDER}\n".encode(),
            "share/foo/README": b"foo\n"},
            placeholders={"lib/libfoo.so.1": "binary", "bin/foo-config": "text"},
            executable=("bin/foo-config",)),
        build_package(channel, "footool", "1.0", {"bin/footool": footool},
                      depends=("libfoo 1.0.*",), fmt=".conda", executable=("bin/footool",)),
        build_package(channel, "python", sys.version.split()[0], py_files, build="h0_0_cpython",
                      placeholders=py_placeholders, fmt=".conda",
                      executable=(f"bin/python{PY}",)),
        build_package(channel, "foopy", "0.1", {
            "site-packages/foopy/__init__.py": FOOPY.encode(),
            "site-packages/foopy-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: foopy\nVersion: 0.1\n",
            "site-packages/foopy-0.1.dist-info/INSTALLER": b"conda\n",
            "site-packages/foopy-0.1.dist-info/RECORD": b"foopy/__init__.py,,\n"},
            build="pyh0_0", depends=("python >=3.8", "libfoo"), noarch="python",
            link={"noarch": {"type": "python", "entry_points": ["foopy = foopy:main"]},
                  "package_metadata_version": 1}),
        build_package(channel, "foodata", "2024.1", {"share/foodata/table.csv": b"a,b\n1,2\n"},
                      build="0", noarch="generic", fmt=".conda"),
    )
    index_channel(channel)
    return channel, built


def index_channel(channel: Path) -> None:
    """repodata.json of every subdir of ``channel`` (noarch included: ``target_platform``
    would skip it)."""
    import asyncio

    from rattler.index import index_fs

    asyncio.run(index_fs(channel, write_zst=False, write_shards=False))


def install_prefix(channel: Path, prefix: Path, cache: Path,
                   specs: tuple[str, ...] = ("footool", "foopy", "foodata", "python")) -> None:
    """``specs`` solved against ``channel`` and installed into ``prefix`` (absolute) by rattler."""
    import asyncio

    from rattler import Channel as RChannel
    from rattler import MatchSpec, Subdir, VirtualPackage, install, solve

    async def run() -> None:
        records = await solve([RChannel(channel.as_uri())], list(specs),
                              platforms=[Subdir(SUBDIR), Subdir("noarch")],
                              virtual_packages=VirtualPackage.detect())
        await install(records, target_prefix=str(prefix.resolve()), cache_dir=cache,
                      show_progress=False, requested_specs=[MatchSpec(s)._match_spec for s in specs])

    asyncio.run(run())


def make_channel(root: Path) -> Channel:
    """The channel and a prefix installed from it, under ``root``."""
    channel, built = build_channel(root)
    prefix = (root / "env").resolve()
    install_prefix(channel, prefix, root / "pkgs")
    return Channel(channel, prefix, built)
