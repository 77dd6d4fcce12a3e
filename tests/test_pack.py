"""``envlock pack`` and what reads a pack back, without an engine: wheels found and rebuilt,
checksums, the README's escaping, the venv target's refusals."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory
from hypothesis import example, given, settings
from hypothesis import strategies as st

from envlock.errors import (
    ArtifactsMissing,
    HashMismatch,
    HostIncompatible,
    NotRestorable,
    PackDamaged,
    UsageError,
)
from envlock.export.pack import PackOptions, pack
from envlock.export.packreadme import readme
from envlock.export.rebuild import find_dist_info, rebuild
from envlock.probe.packages import record_sha256
from envlock.restore import context as ctx
from envlock.restore import packdir
from envlock.restore.image import Options
from envlock.restore.wheelhouse import read_local_wheels, wheel_record_sha256
from envlock.text.terminal import safe

from test_restore_run_bundle import make_wheel  # isort: skip


def _b64(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install_fake(site: Path, name: str, version: str) -> Path:
    """A distribution as pip leaves it: its files, a dist-info with the installer's own files,
    a console script outside site-packages and bytecode without a hash in RECORD."""
    module = name.replace("-", "_")
    dist = site / f"{module}-{version}.dist-info"
    (site / module).mkdir(parents=True)
    dist.mkdir()
    files = {
        f"{module}/__init__.py": f"VALUE = {version!r}\n".encode(),
        f"{module}/data.txt": b"weights, commas, and \"quotes\"\n",
        f"{dist.name}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist.name}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist.name}/entry_points.txt": f"[console_scripts]\n{name} = {module}:main\n".encode(),
        f"{dist.name}/INSTALLER": b"pip\n",
        f"{dist.name}/REQUESTED": b"",
        f"{dist.name}/direct_url.json": b'{"url": "file:///src/demo", "dir_info": {}}',
    }
    for rel, data in files.items():
        (site / rel).write_bytes(data)
    lines = [f"{rel},{_b64(data)},{len(data)}" for rel, data in files.items()]
    lines += [f"../../../bin/{name},sha256=abc,12", f"{module}/__pycache__/__init__.cpython-311.pyc,,",
              f"{dist.name}/RECORD,,"]
    (dist / "RECORD").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dist


LOCAL = {"name": "h20-demo", "version": "0.3.1", "source": "local", "url": "file:///src/demo"}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    site.mkdir()
    install_fake(site, "h20-demo", "0.3.1")
    return site


def local_lock(restore_lock: LockFactory, site: Path, **extra: Any) -> Any:
    digest = record_sha256(str(site / "h20_demo-0.3.1.dist-info" / "RECORD"))
    return restore_lock(packages=[("six", "1.16.0"), {**LOCAL, "record_sha256": digest, **extra}])


# -- the rebuilt wheel ----------------------------------------------------------------------------


def test_a_wheel_rebuilt_from_installed_files_gives_the_locks_record_sha256(
        restore_lock: LockFactory, site: Path, tmp_path: Path) -> None:
    lock = local_lock(restore_lock, site)
    pkg = lock.package("h20-demo")
    dist_info = find_dist_info([tmp_path, site], "H20_Demo", "0.3.1")
    assert dist_info == site / "h20_demo-0.3.1.dist-info"
    built = rebuild(pkg, dist_info, tmp_path)
    assert built.path.name == "h20_demo-0.3.1-py3-none-any.whl"
    assert wheel_record_sha256(built.path) == pkg.record_sha256
    assert built.left_out == ("../../../bin/h20-demo",)
    import zipfile

    names = zipfile.ZipFile(built.path).namelist()
    # The installer's own files and bytecode are not the wheel's; a new installer writes them.
    assert not [n for n in names if n.endswith(("INSTALLER", "REQUESTED", "direct_url.json", ".pyc"))]
    assert names[-1] == "h20_demo-0.3.1.dist-info/RECORD"
    # The same files make the same bytes: a pack of the same environment has the same SHA256SUMS.
    again = tmp_path / "again"
    again.mkdir()
    assert rebuild(pkg, dist_info, again).path.read_bytes() == built.path.read_bytes()


def test_an_edited_installed_file_is_never_packed_as_the_locks_build(
        restore_lock: LockFactory, site: Path, tmp_path: Path) -> None:
    lock = local_lock(restore_lock, site)
    (site / "h20_demo" / "data.txt").write_bytes(b"edited after install\n")
    with pytest.raises(HashMismatch, match="not the lock's build") as exc:
        rebuild(lock.package("h20-demo"), site / "h20_demo-0.3.1.dist-info", tmp_path)
    assert exc.value.exit_code == 3
    assert not list(tmp_path.glob("*.whl")) and not list(tmp_path.glob(".*tmp"))


# -- pack without an engine -------------------------------------------------------------------------


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No pip or uv configuration or cache of this machine takes part, nor envlock's own cache: a
    test's stand-in for envlock's wheel written into the user's cache replaced, in place, the
    wheel a restore's build context had linked from it."""
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "envlock-cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    for var in ("PIP_FIND_LINKS", "UV_FIND_LINKS", "UV_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)


def _pack(lock: Any, tmp_path: Path, out: Path, house: Path, site: Path,
          monkeypatch: pytest.MonkeyPatch) -> Any:
    lock_path = tmp_path / "env.lock"
    lock.save(lock_path)
    monkeypatch.setenv("PYTHONPATH", str(site))  # the "environment" is this interpreter + site
    return pack(lock, lock_path, out, PackOptions(wheelhouses=(house,), python=sys.executable,
                                                  download=False, image=False), engine=None)


def test_pack_takes_wheels_from_disk_rebuilds_the_local_one_and_checks_back(
        restore_lock: LockFactory, site: Path, tmp_path: Path, isolated: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "six", "1.16.0")
    lock = local_lock(restore_lock, site)
    result = _pack(lock, tmp_path, tmp_path / "pack", house, site, monkeypatch)
    root = tmp_path / "pack"
    assert {(r.name, r.origin) for r in result.wheels} == {("six", "wheelhouse"), ("h20-demo", "rebuilt")}
    assert (root / "env.lock").read_bytes() == (tmp_path / "env.lock").read_bytes()
    assert read_local_wheels(root / "wheels") == {"h20-demo"}
    manifest = json.loads((root / "pack.json").read_text())
    assert manifest["rebuilt"] == ["h20-demo"] and manifest["base"] is None
    sums = (root / "SHA256SUMS").read_text().splitlines()
    assert {line.split("  ")[1] for line in sums} >= {"env.lock", "pack.json", "README.md",
                                                      "wheels/envlock-bundle.json",
                                                      "wheels/h20_demo-0.3.1-py3-none-any.whl"}
    opened = packdir.open_pack(root, tmp_path / "work")
    assert opened.lock == root / "env.lock" and opened.base_id is None

    # A restore from the pack installs the local package by name from its proven wheel; without
    # the pack's word it stays "installed from a local directory" and is refused.
    from envlock.restore.wheelhouse import select

    wheels_for = select(root / "wheels", lock.packages)
    plan = ctx.plan(lock, Options(wheelhouse=root / "wheels", local_wheels=frozenset({"h20-demo"}),
                                      base="img@sha256:" + "ab" * 32), wheels_for=wheels_for)
    assert "h20-demo" in plan.from_wheel
    assert any(r.line == "h20-demo==0.3.1" for layer in plan.layers for r in layer.requirements)
    with pytest.raises(NotRestorable, match="local"):
        ctx.plan(lock, Options(wheelhouse=root / "wheels", base="img@sha256:" + "ab" * 32),
                 wheels_for=wheels_for)


def test_a_damaged_or_crafted_pack_is_refused_naming_the_file(
        restore_lock: LockFactory, site: Path, tmp_path: Path, isolated: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "six", "1.16.0")
    _pack(local_lock(restore_lock, site), tmp_path, tmp_path / "p.tar", house, site, monkeypatch)
    assert (tmp_path / "p.tar").is_file() and not list(tmp_path.glob(".p.tar*"))
    opened = packdir.open_pack(tmp_path / "p.tar", tmp_path / "work")
    wheel = opened.root / "wheels" / "six-1.16.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes() + b"x")
    with pytest.raises(PackDamaged, match=r"damaged: wheels/six-1.16.0-py3-none-any.whl \(changed\)") as exc:
        packdir.check_sums(opened.root)
    assert exc.value.exit_code == 2
    # A tar holding a link (or a path out of it) is not a pack.
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("wheels/x.whl")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/shadow"
        tar.addfile(info)
    with pytest.raises(UsageError, match="not a pack") as exc2:
        packdir.open_pack(evil, tmp_path / "work")
    assert exc2.value.exit_code == 2


def test_a_wheel_that_exists_nowhere_is_named_with_why(
        restore_lock: LockFactory, site: Path, tmp_path: Path, isolated: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "six", "1.16.0")
    lock = restore_lock(packages=[("six", "1.16.0"), ("idna", "3.10")])
    with pytest.raises(ArtifactsMissing, match=r"idna==3.10 \(not installed in the environment"):
        _pack(lock, tmp_path, tmp_path / "pack", house, site, monkeypatch)
    editable = restore_lock(packages=[{"name": "mine", "version": "1.0", "source": "editable",
                                       "url": "file:///src/mine"}])
    with pytest.raises(NotRestorable, match="editable"):
        _pack(editable, tmp_path, tmp_path / "pack2", house, site, monkeypatch)


def test_pack_refuses_a_directory_that_is_not_empty(restore_lock: LockFactory, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    lock = restore_lock()
    lock.save(tmp_path / "env.lock")
    with pytest.raises(UsageError, match="not empty"):
        pack(lock, tmp_path / "env.lock", out, PackOptions(image=False, download=False), engine=None)
    assert (out / "thesis.tex").read_text() == "precious"


# -- SHA256SUMS: a parser, fuzzed ----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=300))
@example(text="0" * 64 + "  a\x1b]0;owned\x07\tb\n")  # a file name that retitles the terminal
@example(text="not a line\u2028second\n")
def test_any_sha256sums_text_is_a_one_line_refusal_or_checked(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("sums")
    (root / "a").write_bytes(b"a")
    (root / "SHA256SUMS").write_text(text, encoding="utf-8")
    try:
        packdir.check_sums(root)
    except PackDamaged as exc:
        # The CLI prints the message as it is: one line, nothing a terminal would act on.
        assert exc.message and safe(exc.message) == exc.message, exc.message


# -- a pack proves all of itself ------------------------------------------------------------------------


@pytest.fixture
def made_pack(restore_lock: LockFactory, site: Path, tmp_path: Path, isolated: None,
              monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pack directory written by ``pack`` itself (no engine, no network)."""
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "six", "1.16.0")
    _pack(local_lock(restore_lock, site), tmp_path, tmp_path / "pack", house, site, monkeypatch)
    return tmp_path / "pack"


def _sums_lines(root: Path) -> list[str]:
    return (root / "SHA256SUMS").read_text(encoding="utf-8").splitlines(keepends=True)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _uv_wheel(directory: Path, marker: bytes, version: str = "0.9.1") -> Path:
    """A uv wheel whose binary is an x86-64 ELF header followed by ``marker``."""
    import zipfile

    from test_restore_layers import ELF_X86_64

    wheel = directory / f"uv-{version}-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"uv-{version}.data/scripts/uv", ELF_X86_64 + marker)
        zf.writestr(f"uv-{version}.dist-info/RECORD", "")
    return wheel


def _reseal(root: Path) -> None:
    """SHA256SUMS written again over what the pack now holds, as ``pack`` writes it last."""
    from envlock.export.pack import sums_text

    (root / "SHA256SUMS").write_text(sums_text(root), encoding="utf-8")


def _tamper(root: Path, how: str, tmp_path: Path) -> str:
    """Damage the pack at ``root`` one way; the text the refusal must contain."""
    sums = root / "SHA256SUMS"
    lines = _sums_lines(root)
    manifest_line = next(line for line in lines if line.endswith("  pack.json\n"))
    if how == "empty":
        sums.write_bytes(b"")
        return "is empty"
    if how == "shortened":  # a line left out: the file it vouched for is no longer checked
        sums.write_text("".join(line for line in lines if line != manifest_line), encoding="utf-8")
        return "does not list: pack.json"
    if how == "cut mid-line":
        sums.write_bytes(sums.read_bytes()[:-7])
        return "cut short"
    if how == "extra file":
        _uv_wheel(root / "wheels", b"unlisted")
        return "does not list: wheels/uv-0.9.1-py3-none-manylinux_2_17_x86_64.whl"
    if how == "missing file":
        (root / "README.md").unlink()
        return "not there: README.md"
    if how == "symlink":
        (root / "wheels" / "link.whl").symlink_to(root / "wheels" / "six-1.16.0-py3-none-any.whl")
        return "holds a link, wheels/link.whl"
    if how == "fifo":
        os.mkfifo(root / "wheels" / "pipe")
        return "wheels/pipe, which is not a plain file"
    if how == "dot-dot":
        (tmp_path / "outside").write_bytes(b"x")
        sums.write_text("".join(lines) + f"{_digest(b'x')}  wheels/../../outside\n", encoding="utf-8")
        return f"line {len(lines) + 1}: not a path inside the pack: wheels/../../outside"
    if how == "absolute":
        sums.write_text("".join(lines) + f"{_digest(b'x')}  /etc/hostname\n", encoding="utf-8")
        return "not a path inside the pack: /etc/hostname"
    if how == "duplicate line":
        sums.write_text("".join(lines) + manifest_line, encoding="utf-8")
        return "pack.json is listed twice"
    if how == "malformed line":  # sha256sum's binary-mode marker, which pack never writes
        sums.write_text("".join(lines).replace("  pack.json", " *pack.json"), encoding="utf-8")
        return "not a checksum line"
    if how == "uppercase digest":
        sums.write_text("".join(lines).replace(manifest_line, manifest_line[:64].upper() + manifest_line[64:]),
                        encoding="utf-8")
        return "not a checksum line"
    if how == "swapped pack.json":  # another base image named; SHA256SUMS left as it was
        manifest = json.loads((root / "pack.json").read_text())
        manifest["base"] = {"id": "sha256:" + "66" * 32, "display": "evil/base:1", "origin": "lock"}
        manifest["docker_archive"] = "image/base.docker.tar"
        (root / "pack.json").write_text(json.dumps(manifest), encoding="utf-8")
        return "pack.json (changed)"
    raise AssertionError(how)


TAMPERS = ["empty", "shortened", "cut mid-line", "extra file", "missing file", "symlink", "fifo", "dot-dot",
           "absolute", "duplicate line", "malformed line", "uppercase digest", "swapped pack.json"]


@pytest.mark.parametrize("how", TAMPERS)
def test_a_pack_that_is_not_exactly_its_sha256sums_is_refused_before_anything_is_read(
        made_pack: Path, tmp_path: Path, how: str) -> None:
    packdir.open_pack(made_pack, tmp_path / "work")  # the intact pack opens
    expected = _tamper(made_pack, how, tmp_path)
    with pytest.raises(PackDamaged) as exc:
        packdir.open_pack(made_pack, tmp_path / "work")
    assert expected in exc.value.message and exc.value.exit_code == 2
    assert safe(exc.value.message) == exc.value.message


def test_twin_sha256sums_in_another_order_is_the_same_pack(made_pack: Path, tmp_path: Path) -> None:
    """Order means nothing: the lines reversed list the same files."""
    listing = packdir.open_pack(made_pack, tmp_path / "work").sums
    assert len(listing) == len(_sums_lines(made_pack)) > 3
    (made_pack / "SHA256SUMS").write_text("".join(reversed(_sums_lines(made_pack))), encoding="utf-8")
    opened = packdir.open_pack(made_pack, tmp_path / "work")
    assert opened.sums == listing


def test_a_venv_made_inside_the_pack_is_named_in_a_bounded_refusal(made_pack: Path, tmp_path: Path) -> None:
    venv = made_pack / "venv" / "lib"
    venv.mkdir(parents=True)
    for i in range(25):
        (venv / f"m{i:02d}.py").write_text("")
    with pytest.raises(PackDamaged, match=r"does not list: venv/lib/m00\.py, .* and 15 more") as exc:
        packdir.check_sums(made_pack)
    assert "beside the pack" in (exc.value.hint or "")


def test_uv_runs_only_from_a_wheel_the_packs_sha256sums_lists(
        made_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A uv wheel dropped into a pack's wheels/ is refused with the pack; one the pack lists
    gives its binary, cached by the wheel's sha256; one swapped after the check is refused."""
    from envlock.restore import uvbin

    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    monkeypatch.setattr(uvbin, "from_host", lambda: None)
    cache = tmp_path / "uv-cache"
    wheel = _uv_wheel(made_pack / "wheels", b"listed")
    with pytest.raises(PackDamaged, match=r"does not list: wheels/uv-0\.9\.1"):
        packdir.open_pack(made_pack, tmp_path / "work")
    _reseal(made_pack)
    opened = packdir.open_pack(made_pack, tmp_path / "work")
    digest = _digest(wheel.read_bytes())
    assert opened.checked_wheels[wheel] == digest
    found = uvbin.find(opened.checked_wheels, cache)
    assert found == cache / digest / "uv" and found.read_bytes().endswith(b"listed")
    # Swapped between the check and the unpack: the bytes read are hashed, and refused.
    cache_two = tmp_path / "uv-cache-2"
    _uv_wheel(made_pack / "wheels", b"swapped")
    with pytest.raises(PackDamaged, match="changed after the pack was checked") as exc:
        uvbin.find(opened.checked_wheels, cache_two)
    assert exc.value.exit_code == 2 and not (cache_two / digest).exists()
    # The command's options carry the pack's checked wheels, and nothing else, to uvbin.
    from argparse import Namespace

    from envlock.commands.restore import pack_options

    opts = pack_options(Namespace(wheelhouse=None, base=None), opened, Options())
    assert opts.checked_wheels == opened.checked_wheels and opts.wheelhouse == made_pack / "wheels"


def test_two_uv_wheels_of_one_name_are_two_binaries(
        made_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is keyed by the wheel's sha256: a second pack whose uv wheel has the first
    one's name but other bytes gets its own binary, not the first one's."""
    from envlock.restore import uvbin

    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    monkeypatch.setattr(uvbin, "from_host", lambda: None)
    cache = tmp_path / "uv-cache"
    first = _uv_wheel(made_pack / "wheels", b"first")
    _reseal(made_pack)
    one = uvbin.find(packdir.open_pack(made_pack, tmp_path / "work").checked_wheels, cache)
    assert one is not None and one.read_bytes().endswith(b"first")
    second = _uv_wheel(made_pack / "wheels", b"second")
    assert second == first  # the same file name
    _reseal(made_pack)
    two = uvbin.find(packdir.open_pack(made_pack, tmp_path / "work").checked_wheels, cache)
    assert two is not None and two != one and two.read_bytes().endswith(b"second")
    assert one.read_bytes().endswith(b"first")  # each binary stays its own wheel's


# -- SHA256SUMS bytes, garbled ----------------------------------------------------------------------------


def _garble(rng: random.Random, data: bytes) -> bytes:
    """``data`` changed by a few random edits: a byte flipped, inserted or removed, a span
    repeated, the end cut off, lines swapped."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            out[at:at] = bytes([rng.choice([0, 9, 10, 13, 32, 42, 46, 47, 0x80, 0xC3, 0xFF, rng.randrange(256)])])
        elif op == 2 and out:
            del out[min(at, len(out) - 1)]
        elif op == 3:
            end = min(len(out), at + rng.randint(1, 80))
            out[at:at] = out[at:end]
        elif op == 4:
            del out[at:]
        else:
            lines = bytes(out).split(b"\n")
            rng.shuffle(lines)
            out = bytearray(b"\n".join(lines))
    return bytes(out)


def test_garbled_sha256sums_bytes_give_the_same_listing_or_a_pack_damaged_refusal(
        made_pack: Path, tmp_path: Path) -> None:
    """Seeded and bounded: 400 garblings of a real SHA256SUMS. The parser answers each with
    ``PackDamaged`` (one printable line) or a listing, and the whole check passes only where
    the listing is the pack's own (lines reordered): never another exception, never a pass
    that vouches for less or other than the pack."""
    original = (made_pack / "SHA256SUMS").read_bytes()
    listing = packdir.parse_sums(original, "SHA256SUMS")
    rng = random.Random(36)
    outcomes = {"refused": 0, "same": 0}
    for _ in range(400):
        data = _garble(rng, original)
        try:
            parsed = packdir.parse_sums(data, "SHA256SUMS")
        except PackDamaged as exc:
            assert exc.message and safe(exc.message) == exc.message and exc.exit_code == 2
            outcomes["refused"] += 1
            continue
        (made_pack / "SHA256SUMS").write_bytes(data)
        try:
            assert packdir.check_sums(made_pack) == listing == parsed
            outcomes["same"] += 1
        except PackDamaged as exc:
            assert safe(exc.message) == exc.message and exc.exit_code == 2
            outcomes["refused"] += 1
    assert outcomes["refused"] > 300 and sum(outcomes.values()) == 400


# -- the README: every lock value escaped ----------------------------------------------------------------


def _readme(lock: Any, rebuilt: list[str] | None = None) -> str:
    return readme(lock, 2, rebuilt or [], base={"id": "sha256:" + "ab" * 32, "display": "lab/base:1"},
                  oci=False, debs=[], missing_debs=[], skipped=[], size=5_000_000, pack_seconds=3.0)


def test_the_readme_keeps_lock_values_inert(restore_lock: LockFactory) -> None:
    evil = "[click](https://evil.example) <img src=x onerror=alert(1)> @maintainer `code` | cell"
    lock = restore_lock(envlock={"note": evil},
                        platform={"os": "Linux", "machine": "x86_64", "os_pretty_name": "# Not a heading <b>",
                                  "cpu_model": "CPU | injected | row", "cpu_count": 2})
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").enable("table").render(_readme(lock))
    assert "<img" not in rendered and "<b>" not in rendered and "<a " not in rendered
    assert "<code>@maintainer</code>" in rendered  # GitHub looks for mentions outside code only
    assert rendered.count("<h1>") == 1  # the OS name opened no heading
    cpu_row = next(row for row in rendered.split("<tr>") if "CPU" in row)
    assert cpu_row.count("<td>") == 2  # the cell did not split the row


def test_the_readme_keeps_ordinary_values_verbatim(restore_lock: LockFactory) -> None:
    """The over-escaping twin: ordinary values read as written."""
    lock = restore_lock(envlock={"note": "ResNet-50 on ImageNet, seed 0"},
                        platform={"os": "Linux", "machine": "x86_64", "os_pretty_name": "Debian GNU/Linux 12 (bookworm)",
                                  "cpu_model": "AMD EPYC 7763", "cpu_count": 64})
    text = _readme(lock, ["h20-demo"])
    assert "ResNet-50 on ImageNet, seed 0" in text
    assert "| Operating system | Debian GNU/Linux 12 (bookworm) |" in text
    assert "| CPU | AMD EPYC 7763 (64 logical CPUs) |" in text
    assert "`h20-demo`" in text and "docker load -i image/base.docker.tar" in text
    assert "python3.11 -m venv ../venv" in text and "--target venv ../venv" in text


# -- the venv target's refusals -------------------------------------------------------------------------


def test_the_venv_target_refuses_another_python_minor_in_one_line(
        restore_lock: LockFactory, tmp_path: Path) -> None:
    from envlock.restore.venvtarget import host_python

    lock = restore_lock(python={"version": "3.9.18", "implementation": "cpython", "prefix_kind": "venv",
                                "prefix": "/opt/venv"})
    with pytest.raises(HostIncompatible, match=r"the lock needs cpython 3\.9, but .* is cpython 3\.") as exc:
        host_python(lock, sys.executable)
    assert exc.value.exit_code == 3 and exc.value.hint and "--python" in exc.value.hint
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
    same = restore_lock(python={"version": mine, "implementation": "cpython", "prefix_kind": "venv",
                                "prefix": "/opt/venv"})
    assert host_python(same, sys.executable) == sys.executable


def test_restore_target_option_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from envlock.commands import main

    assert main(["restore", str(tmp_path / "env.lock"), "--target", "venv"]) == 2
    assert "expected `image`, `venv DIR`, `prefix DIR` or `charliecloud [DIR]`" in capsys.readouterr().err
    assert main(["restore", str(tmp_path / "env.lock"), "--target", "chroot", "x"]) == 2


def test_engine_build_without_network_asks_for_network_none() -> None:
    from envlock.restore.dockerengine import DockerEngine

    seen: dict[str, Any] = {}

    class API:
        def build(self, **kw: Any) -> Any:
            seen.update(kw)
            return iter(())

    engine = DockerEngine.__new__(DockerEngine)
    engine.api = API()
    list(engine.build_stream(Path("."), tag="t:1", labels={}, network=False))
    assert seen["network_mode"] == "none"
    seen.clear()
    list(engine.build_stream(Path("."), tag="t:1", labels={}))
    assert "network_mode" not in seen


def test_the_tar_reader_takes_only_files_and_directories(tmp_path: Path) -> None:
    archive = tmp_path / "p.tar"
    with tarfile.open(archive, "w") as tar:
        data = b"x"
        info = tarfile.TarInfo("../escape.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UsageError, match="not a pack"):
        packdir.open_pack(archive, tmp_path / "work")
    assert not (tmp_path / "escape.txt").exists()


# -- the .debs of a system-Python lock ---------------------------------------------------------------


def test_debs_of_the_os_pins_are_downloaded_and_the_unreachable_ones_named(
        restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """apt-get (a stand-in on PATH) downloads what its sources still offer; the rest is listed,
    never silently dropped."""
    from envlock.export.pack import collect_debs

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text("#!/bin/sh\n[ \"$1\" = download ] || exit 2\nshift; [ \"$1\" = -q ] && shift\n"
                    "for pin in \"$@\"; do case \"$pin\" in libfoo*) exit 100;; esac; done\n"
                    "for pin in \"$@\"; do n=${pin%%=*}; v=${pin#*=}; touch \"${n%%:*}_${v}_amd64.deb\"; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    lock = restore_lock(image={"reference": "a/b", "digest": "sha256:" + "ab" * 32},
                        python={"version": "3.11.2", "implementation": "cpython", "prefix_kind": "system",
                                "executable": "/usr/bin/python3"},
                        os_packages={"manager": "dpkg", "packages": [
                            "libc6:amd64=2.36-9+deb12u14", "python3-six:all=1.16.0-4", "libfoo:i386=1:2.0-1"]},
                        packages=[{"name": "six", "version": "1.16.0", "source": "system",
                                   "os_package": "python3-six", "os_package_version": "1.16.0-4"}])
    debs, missing = collect_debs(lock, tmp_path / "debs", lambda s: None)
    assert debs == ["libc6_2.36-9+deb12u14_amd64.deb", "python3-six_1.16.0-4_amd64.deb"]
    assert missing == ["libfoo:i386=1:2.0-1"]
    # A venv lock's OS packages are its base image's: nothing to download.
    venv_lock = restore_lock(os_packages={"manager": "dpkg", "packages": ["libc6:amd64=2.36-9+deb12u14"]})
    assert collect_debs(venv_lock, tmp_path / "none", lambda s: None) == ([], [])


@pytest.mark.parametrize("source", ["local", "editable"])
def test_bundle_and_pack_put_envlocks_own_wheel_in_without_skip_local(
        source: str, restore_lock: LockFactory, tmp_path: Path, isolated: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """envlock installed from a checkout or editable (training code imports it) is bundled and
    packed as restore builds it: a wheel of the running envlock, not a refusal."""
    from envlock.export.bundle import bundle
    from envlock.restore import ownwheel
    from envlock.restore.wheelhouse import read_manifest

    built: list[Path] = []

    def fake_own_wheel(dest: Path, *, offline: bool = False) -> Path:  # the real one: test_replay.py (slow)
        built.append(make_wheel(dest, "envlock-ml", "0.1.0"))
        return built[-1]

    monkeypatch.setattr(ownwheel, "own_wheel", fake_own_wheel)
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house, "six", "1.16.0")
    lock = restore_lock(packages=[("six", "1.16.0"), {"name": "envlock-ml", "version": "0.1.0",
                                                      "source": source, "url": "file:///src/envlock"}])
    result = bundle(lock, tmp_path / "bundle", source=house)
    assert result.own == "envlock_ml-0.1.0-py3-none-any.whl" and result.skipped == ()
    assert (tmp_path / "bundle" / result.own).is_file() and "envlock-ml" in read_manifest(tmp_path / "bundle")

    packed = _pack(lock, tmp_path, tmp_path / "pack", house, tmp_path, monkeypatch)
    assert {(r.name, r.origin) for r in packed.wheels} == {("six", "wheelhouse"), ("envlock-ml", "envlock")}
    assert (tmp_path / "pack" / "wheels" / "envlock_ml-0.1.0-py3-none-any.whl").is_file()
    assert any("a wheel of the envlock that packs" in n for n in packed.notes)
    # Another local package is still refused without --skip-local.
    other = restore_lock(packages=[{"name": "mine", "version": "0.1", "source": "editable", "url": "file:///x"},
                                   {"name": "envlock-ml", "version": "0.1.0", "source": source,
                                    "url": "file:///src/envlock"}])
    with pytest.raises(NotRestorable, match="mine"):
        bundle(other, tmp_path / "bundle2", source=house)
