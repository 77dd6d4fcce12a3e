"""The probe's command line and start-up: one flag table that envlock writes the arguments
from and the probe reads them with, and a probe run that loads nothing of envlock's own."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import pytest

from envlock.probe import collect, flags
from envlock.probing.process import probe_args

_IMAGES = [None, "", "reg/x:1@sha256:" + "a" * 64, "-odd=name"]
_CWDS = [None, "/work/project", "-dash"]
_EXCLUDES: list[tuple[str, ...]] = [(), ("env.lock",), ("/abs/a.lock", "-b.lock", "c d.lock")]


def _read(argv: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = vars(collect.parser().parse_args(argv))
    return parsed


@pytest.mark.parametrize("torch,canary,deep,cache,progress",
                         list(itertools.product([True, False], repeat=5)))
def test_every_command_line_envlock_writes_reads_back_the_same(
        torch: bool, canary: bool, deep: bool, cache: bool, progress: bool) -> None:
    """``probe_args`` and the probe's parser come from one table: every combination envlock
    can write parses, through the probe's own parser, to the options it meant."""
    import os

    for image, cwd, exclude in itertools.product(_IMAGES, _CWDS, _EXCLUDES):
        argv = probe_args(torch=torch, canary=canary, image=image, cwd=cwd, deep=deep,
                          cache=cache, progress=progress, git_exclude=exclude)
        assert _read(argv) == {
            "no_torch": not torch, "canary": canary, "image": image or None, "cwd": cwd or None,
            "indent": None, "deep": deep, "progress": deep and progress, "no_cache": not cache,
            "git_exclude": [os.path.abspath(p) for p in exclude]}, argv


def test_the_parser_has_every_flag_of_the_table_and_no_other() -> None:
    parser = collect.parser()
    declared = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(declared) == {f.dest for f in flags.FLAGS}
    for flag in flags.FLAGS:
        assert declared[flag.dest].option_strings == [flag.name]
        assert declared[flag.dest].help == flag.help
        assert _read([])[flag.dest] == flag.default()
    assert _read(["--indent", "2"])["indent"] == 2


def test_the_table_refuses_an_option_it_does_not_declare() -> None:
    with pytest.raises(ValueError, match="no_such"):
        flags.command_line({"no_such": True})
    with pytest.raises(TypeError):
        flags.command_line({"git_exclude": "a.lock"})


def test_the_probe_program_reads_its_arguments(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    assert collect.main(["--no-torch", "--no-cache", "--cwd", str(tmp_path), "--indent", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("\n\x1eenvlock-probe-document\n")
    out = out.split("\n", 2)[2]
    assert out.startswith("{\n ") and '"torch": "skipped (--no-torch)"' in out
    assert not (tmp_path / "cache").exists()
    with pytest.raises(SystemExit):
        collect.main(["--no-such-flag"])
    assert "unrecognized arguments" in capsys.readouterr().err
    assert sys.modules.get("envlock.probe.collect") is collect


def test_the_probe_program_loads_nothing_of_envlock_and_no_torch_unasked(tmp_path: Any) -> None:
    """The probe runs in the environment being probed: it must not load envlock's own modules
    (it runs where envlock is not installed) nor the libraries envlock's side uses, and it
    imports torch only when asked. ``-X importtime`` lists every module a run imports; ``-S``
    keeps out what the site-packages' own start-up files import."""
    import subprocess

    from helpers import REPO

    env = {"PATH": "/usr/bin:/bin", "ENVLOCK_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-S", "-X", "importtime", str(REPO / "envlock" / "probe"), "--no-torch"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
                         check=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert {"_envlock_probe.git", "_envlock_probe.flags", "json"} <= loaded
    assert not {m for m in loaded if m.split(".")[0] in
                {"envlock", "pydantic", "tomlkit", "docker", "rich", "torch"}}
    assert '"packages"' in out.stdout
