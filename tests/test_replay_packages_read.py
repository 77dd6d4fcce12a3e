"""A replay names a package difference as a cause only when the run read a file of that
distribution (``[reads].distributions``, ``replay.compare.split_unread``): a plotting library
installed between the record and the replay for something else is said in one line as no
cause, while a package the run imported, one that loaded a native library, or one whose ``.pth``
``site`` executed before any trace began stays a cause; a record written before the list
compares as it did. Real recorded processes (torch on CPU where it matters: ``import torch``
reads every distribution's ``entry_points.txt``), with small distributions made here."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from envlock.commands import main
from envlock.replay.compare import compare_records
from envlock.replay.reads import collect
from envlock.replay.record import Reads, load
from envlock.replay.report import replay_text

REPO = str(Path(__file__).resolve().parents[1])

SCRIPT = """
import builtins, envlock, usedpkg
{imports}
lr = float(open("config/hparams.yaml").read().split(":")[1])
x = 1.0
for step in range(2):
    x = x - lr * x * usedpkg.SCALE * getattr(builtins, "PTH_SCALE", 1.0)
    envlock.record(step, loss=x)
"""
# The distribution is imported by a child Python process only.
CHILD_SCRIPT = """
import subprocess, sys, envlock
scale = float(subprocess.run([sys.executable, "-c", "import usedpkg; print(usedpkg.SCALE)"],
                             capture_output=True, text=True, check=True).stdout)
for step in range(2):
    envlock.record(step, loss=1.0 - scale * step)
"""


def distribution(site: Path, name: str, version: str, module: str | None = None, *,
                 pth: str | None = None, entry_points: bool = False, program: bool = False) -> None:
    """A distribution as pip leaves one in ``site``: a module (``name.py``), a ``.pth`` file, a
    console script's ``entry_points.txt``, a program in ``../bin``, and a RECORD that lists each
    with its digest and size."""
    site.mkdir(parents=True, exist_ok=True)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    files = [info / "METADATA"]
    if module is not None:
        (site / f"{name}.py").write_text(module)
        files.append(site / f"{name}.py")
    if pth is not None:
        (site / f"{name}.pth").write_text(pth)
        files.append(site / f"{name}.pth")
    if entry_points:
        (info / "entry_points.txt").write_text(f"[console_scripts]\n{name} = {name}:main\n")
        files.append(info / "entry_points.txt")
    if program:
        (site.parent / "bin").mkdir(exist_ok=True)
        (site.parent / "bin" / name).write_bytes(b"\x7fELF")
        (site.parent / "bin" / name).chmod(0o755)
        files.append(site.parent / "bin" / name)
    rows = []
    for path in files:
        data = path.read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{os.path.relpath(path, site)},sha256={digest},{len(data)}")
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,"]) + "\n")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project reading configs/hparams.yaml, importing ``usedpkg`` from a directory of
    distributions on PYTHONPATH outside the workspace."""
    root = tmp_path / "proj"
    (root / "config").mkdir(parents=True)
    (root / "config" / "hparams.yaml").write_text("lr: 0.1\n")
    (root / "train.py").write_text(SCRIPT.format(imports=""))
    distribution(tmp_path / "site", "usedpkg", "1.0", "SCALE = 0.5\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, str(tmp_path / "site")]))
    return root


def _against(capsys: pytest.CaptureFixture[str], python: str = sys.executable) -> tuple[str, dict[str, Any]]:
    """Record the run again as the replay (the original's command, run now), then the verdict
    of ``replay run.record --against again.record``, as text and as ``--json``."""
    assert main(["record", "again.record", "--", python, "train.py"]) == 0
    capsys.readouterr()
    assert main(["replay", "run.record", "--against", "again.record"]) == 1
    text = capsys.readouterr().out
    assert main(["replay", "run.record", "--against", "again.record", "--json"]) == 1
    return text, json.loads(capsys.readouterr().out)


def test_a_package_the_run_never_read_is_no_cause_and_the_config_is(
        project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The researcher's afternoon: the config edited and a plotting library installed (here
    nine distributions with console scripts, whose ``entry_points.txt`` ``import torch`` reads
    as it looks for backends). The config is the cause; the packages are one line."""
    (project / "train.py").write_text(SCRIPT.format(imports="import torch"))
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    read = load("run.record").reads
    assert read is not None and read.distributions is not None and "usedpkg" in read.distributions
    assert "torch" in read.distributions
    (project / "config" / "hparams.yaml").write_text("lr: 0.2\n")
    plotting = ["contourpy", "cycler", "fonttools", "kiwisolver", "matplotlib", "pillow",
                "pyparsing", "python-dateutil", "six"]
    for name in plotting:
        distribution(tmp_path / "site", name.replace("-", "_"), "9.9", f"X = {name!r}\n", entry_points=True)
    text, doc = _against(capsys)
    assert [r["name"] for r in doc["reads"]] == ["config/hparams.yaml"]
    assert not [c for c in doc["context"] if c["key"].startswith("packages.")], doc["context"]
    assert sorted(c["key"] for c in doc["packages_not_read"]) == [f"packages.{n}" for n in sorted(plotting)]
    assert "    config/hparams.yaml changed (sha256 " in text
    assert "  9 packages changed that the run never read (not causes): contourpy, cycler and 7 more\n" in text
    assert "packages.matplotlib" not in text
    # The page says the same: the config under what can explain it, the packages apart.
    from envlock.replay.page import replay_page

    original, again = load("run.record"), load("again.record")
    page = replay_page(compare_records(original, again), original, again, "run.record")
    explain, _, rest = page.partition("Changed, never read by the run (not causes)")
    assert "config/hparams.yaml" in explain and "matplotlib" not in explain
    assert all(f">{n}<" in rest for n in plotting)


def test_a_package_the_run_imported_is_still_a_cause(project: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Its twin: the distribution the script imports is upgraded (another module, another
    version), read in a child Python process: named, beside an unread one that is not."""
    (project / "train.py").write_text(CHILD_SCRIPT)
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    site = tmp_path / "site"
    for path in (*site.glob("usedpkg*"), *site.glob("usedpkg-1.0.dist-info/*")):
        if path.is_file():
            path.unlink()
    (site / "usedpkg-1.0.dist-info").rmdir()
    distribution(site, "usedpkg", "1.1", "SCALE = 0.25\n")
    distribution(site, "unrelated", "1.0", "X = 1\n")
    text, doc = _against(capsys)
    assert {"key": "packages.usedpkg", "original": "1.0", "replay": "1.1", "ranks": []} in doc["context"]
    assert "    packages.usedpkg: 1.0 -> 1.1\n" in text
    assert [c["key"] for c in doc["packages_not_read"]] == ["packages.unrelated"]


def test_a_package_whose_pth_site_ran_is_a_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A distribution only the replay has, nothing of which the script imports or opens: its
    ``.pth`` changes the numbers, and ``site`` executed it before any trace began. In a venv,
    where ``site`` runs the ``.pth`` files of its site-packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # This environment's packages (pydantic, ...) for envlock, as a .pth line naming a directory.
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    distribution(site, "usedpkg", "1.0", "SCALE = 0.5\n")
    root = tmp_path / "proj"
    (root / "config").mkdir(parents=True)
    (root / "config" / "hparams.yaml").write_text("lr: 0.1\n")
    (root / "train.py").write_text(SCRIPT.format(imports=""))
    monkeypatch.chdir(root)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", REPO)
    assert main(["record", "run.record", "--", python, "train.py"]) == 0
    distribution(site, "pthpkg", "1.0", pth="import builtins; builtins.PTH_SCALE = 2.0\n")
    distribution(site, "unrelated", "1.0", "X = 1\n")
    text, doc = _against(capsys, python)
    assert {"key": "packages.pthpkg", "original": None, "replay": "1.0", "ranks": []} in doc["context"]
    assert "    packages.pthpkg: (none) -> 1.0\n" in text
    assert [c["key"] for c in doc["packages_not_read"]] == ["packages.unrelated"]


def test_a_record_without_the_list_compares_as_before(project: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A record written before ``[reads].distributions``: every package difference is a cause,
    and nothing is said of packages not read."""
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    old = load("run.record")
    assert old.reads is not None and old.reads.distributions is not None
    reads = old.reads.model_copy(update={"distributions": None})
    old.model_copy(update={"reads": reads}).save("run.record")
    assert "distributions" not in Path("run.record").read_text()
    (project / "config" / "hparams.yaml").write_text("lr: 0.2\n")
    distribution(tmp_path / "site", "unrelated", "1.0", "X = 1\n")
    text, doc = _against(capsys)
    assert {"key": "packages.unrelated", "original": None, "replay": "1.0", "ranks": []} in doc["context"]
    assert doc["packages_not_read"] == []
    assert "    packages.unrelated: (none) -> 1.0\n" in text and "never read" not in text


def test_a_package_vouching_for_a_loaded_native_library_is_a_cause() -> None:
    """A library a process loaded, named in the context by the distribution that ships it (an
    OpenBLAS that numpy's import mapped, torch's cuBLAS): that distribution's code ran."""
    from test_replay_record import rec

    lib = "/site/numpy.libs/libscipy_openblas64_-ff651d7f.so (distribution scipy-openblas64)"
    a = rec([1.0], reads=Reads(processes=1, distributions=["envlock"]),
            context={"native.libraries.libscipy_openblas64_.so": lib, "packages.scipy-openblas64": "0.3.27",
                     "packages.tqdm": "4.0"})
    b = rec([2.0], reads=Reads(processes=1, distributions=["envlock"]),
            context={"native.libraries.libscipy_openblas64_.so": lib, "packages.scipy-openblas64": "0.3.28",
                     "packages.tqdm": "4.1"})
    cmp = compare_records(a, b)
    assert [c.key for c in cmp.context] == ["packages.scipy-openblas64"]
    assert [c.key for c in cmp.packages_not_read] == ["packages.tqdm"]
    text = replay_text(cmp, "run.record")
    assert "1 package changed that the run never read (not causes): tqdm\n" in text
    # Nothing else differs: the plain verdict no longer claims the packages are the same.
    only = compare_records(rec([1.0], reads=Reads(processes=1, distributions=["envlock"]), context={"packages.tqdm": "4.0"}),
                           rec([2.0], reads=Reads(processes=1, distributions=["envlock"]), context={"packages.tqdm": "4.1"}))
    assert "no difference in code, packages the run read, CPU" in replay_text(only, "run.record")


def _trace(directory: Path, read: list[str], **extra: Any) -> None:
    doc = {"pid": 5, "ppid": 1, "python": True, "executable": sys.executable, "argv": ["train.py"],
           "read": read, "written": [], "env": {}, "spawned": [], "state": None, "stdlib": [], **extra}
    (directory / "5.json").write_text(json.dumps(doc))


def test_which_distributions_a_trace_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of a distribution, even one changed in place (its size no longer RECORD's: kept
    as a file too), counts it as read; its ``entry_points.txt``, which plugin discovery reads for
    every distribution, does not; a program it ships that a process started (not traced: it is
    no Python) does, by its path or found on PATH. A trace that started late, or a container's
    run, cannot say."""
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    site = tmp_path / "lib" / "site"
    distribution(site, "alpha", "1.0", "A = 1\n")
    distribution(site, "beta", "1.0", "B = 1\n")
    distribution(site, "gamma", "1.0", "C = 1\n", entry_points=True)
    distribution(site, "tool", "1.0", program=True)
    distribution(site, "other-tool", "1.0", program=True)
    monkeypatch.setenv("PATH", os.pathsep.join([str(site.parent / "bin"), os.environ["PATH"]]))
    (site / "beta.py").write_text("B = 22\n")
    traces = tmp_path / "journal" / "trace"
    traces.mkdir(parents=True)
    read = [str(site / "alpha.py"), str(site / "beta.py"), str(site / "gamma-1.0.dist-info" / "entry_points.txt")]
    _trace(traces, read, spawned=[str(site.parent / "bin" / "tool"), "other-tool"])
    reads, _ = collect(traces, tmp_path / "proj")
    assert reads.distributions == ["alpha", "beta", "other-tool", "tool"]
    assert list(reads.files) == [str(site / "beta.py")]
    _trace(traces, read, late=True)
    assert collect(traces, tmp_path / "proj")[0].distributions is None
    _trace(traces, read)
    assert collect(traces, tmp_path / "proj", inside="/workspace")[0].distributions is None


def test_a_late_trace_takes_what_was_imported_before_it(tmp_path: Path) -> None:
    """A trace started at the first ``envlock.record`` call, in a process that imported a
    module before: the module's file is read all the same."""
    (tmp_path / "early.py").write_text("X = 1\n")
    code = ("import sys; sys.path[:0] = [{repo!r}, {here!r}]\nimport early\n"
            "from envlock.probe import trace\nt = trace.start({here!r}, late=True)\n"
            "print({early!r} in t.read)").format(repo=REPO, here=str(tmp_path), early=str(tmp_path / "early.py"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True"]


@pytest.mark.parametrize("kind", ["empty RECORD", "egg-info"])
def test_a_package_whose_files_no_record_lists_stays_a_cause(project: Path, tmp_path: Path, kind: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Installed so that no RECORD links its modules to it (a hand-made or legacy ``*.egg-info``,
    a RECORD listing nothing outside its dist-info): whether the run read it cannot be told,
    so its upgrade in place stays a cause, never "never read"."""
    site = tmp_path / "site"

    def install(version: str, scale: str) -> None:
        for old in (*site.glob("legacypkg-*"), site / "legacypkg.py"):
            if old.is_dir():
                for f in old.iterdir():
                    f.unlink()
                old.rmdir()
            elif old.exists():
                old.unlink()
        (site / "legacypkg.py").write_text(f"SCALE = {scale}\n")
        if kind == "egg-info":
            info = site / f"legacypkg-{version}.egg-info"
            info.mkdir()
            (info / "PKG-INFO").write_text(f"Metadata-Version: 1.1\nName: legacypkg\nVersion: {version}\n")
        else:
            info = site / f"legacypkg-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: legacypkg\nVersion: {version}\n")
            (info / "RECORD").write_text("")

    install("1.0", "0.5")
    (project / "train.py").write_text(SCRIPT.format(imports="import legacypkg").replace(
        "usedpkg.SCALE", "usedpkg.SCALE * legacypkg.SCALE"))
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    read = load("run.record").reads
    assert read is not None and read.distributions is not None and "legacypkg" in read.distributions
    install("1.1", "0.25")
    _, doc = _against(capsys)
    assert {"key": "packages.legacypkg", "original": "1.0", "replay": "1.1", "ranks": []} in doc["context"]
    assert not [c for c in doc["packages_not_read"] if c["key"] == "packages.legacypkg"]
