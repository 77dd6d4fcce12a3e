"""Deep verify and the torch facts cache, side by side (issue 11); run by ``run.py``.

* ``envlock verify --deep`` against ``find SITE -type f -print0 | xargs -0 sha256sum`` (one
  process, what a user would type) over the benchmark venv's site-packages, warm page cache:
  warm (files unchanged since the last check are taken on their stat; the target) and
  ``--no-cache`` (every file read again), with the bytes, GB/s, and the floor hashlib sets on
  this machine for a full re-hash (single-core sha256 throughput x cores).
* warm ``envlock verify`` (torch facts cached) and ``--no-cache`` (torch imported) against
  ``python -c "import torch"``; ``verify --no-torch`` and ``show`` against ``uv pip freeze``;
  ``verify --no-torch`` against ``pip install --dry-run --no-index --no-deps -r PINS`` of the
  venv's own pins with its own pip (the Python peer that checks an environment against pins, as
  verify does; issue 28) and, as information, ``uv pip sync --dry-run --offline`` of the same
  pins (issue 17); cold ``capture --no-cache`` against ``import torch``.

Stdlib only, like ``run.py``; the commands and the measuring loop are ``run.py``'s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HASHLIB_PROBE = ("import hashlib, time; b = bytes(256 << 20); best = 0.0\n"
                 "for _ in range(5):\n"
                 "    t = time.perf_counter(); hashlib.sha256(b).digest()\n"
                 "    best = max(best, len(b) / (time.perf_counter() - t))\n"
                 "print(best)")


def uv_binary(venv: Path) -> str | None:
    """uv from the benchmark venv (run.py installs it there), else beside this interpreter,
    else on PATH."""
    for here in (venv / "bin" / "uv", Path(sys.executable).with_name("uv")):
        if here.exists():
            return str(here)
    return shutil.which("uv")


def site_packages(py: str, env: dict[str, str]) -> str:
    return subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def write_pins(uv: str, py: str, env: dict[str, str], cwd: Path, out: Path) -> None:
    """The venv's pins, as ``uv pip freeze`` writes them, into ``out`` (once per run).

    A direct reference (``name @ file:///...``) becomes ``name==version``: run.py installs
    envlock from a temporary copy of the checkout that is gone by now, and ``uv pip sync``
    fails on a source path that no longer exists ("Distribution not found") instead of
    checking anything. A plain pin is what a requirements file of a released envlock holds;
    uv takes the installed distribution as satisfying it.
    """
    def run_uv(*args: str) -> str:
        return subprocess.run([uv, "pip", *args, "--python", py], env=env, cwd=cwd,
                              capture_output=True, text=True, check=True).stdout

    def canon(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    versions = {canon(d["name"]): d["version"] for d in json.loads(run_uv("list", "--format", "json"))}
    pins = []
    for line in run_uv("freeze").splitlines():
        name, ref, _ = line.partition(" @ ")
        pins.append(f"{name.strip()}=={versions[canon(name)]}" if ref else line)
    out.write_text("\n".join(pins) + "\n")


def uv_sync_command(run: Any, uv: str, py: str, env: dict[str, str], project: Path,
                    pins: Path) -> Any:
    """``uv pip sync --dry-run --offline`` of the venv against its own pins (``write_pins``
    writes them to ``pins`` first): uv reads the installed distributions, resolves the pins
    and reports what it would install or remove.

    Nothing else is needed offline: every pin is already installed, so uv fetches nothing (no
    ``--no-index`` or ``--find-links``); it uses its own cache only for the interpreter's
    facts, as a user's uv does. The check must say "Would make no changes": ``--dry-run``
    exits 0 even when it would change the venv, and a sync that would change something does
    other work than verify, so then it is not timed.
    """
    argv = [uv, "pip", "sync", "--dry-run", "--offline", "--python", py, str(pins)]
    cmd = run.Command("uv_sync", "uv pip sync --dry-run --offline (the venv's pins)", argv,
                      env, project)
    try:
        write_pins(uv, py, env, project, pins)
    except (subprocess.CalledProcessError, KeyError, ValueError) as exc:
        cmd.error = f"writing the pins failed: {exc}"
        return cmd
    proc = subprocess.run(argv, env=env, cwd=project, capture_output=True, text=True,
                          check=False)
    said = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "Would make no changes" not in said:
        cmd.error = f"exit {proc.returncode}: " + " | ".join(said.splitlines()[-3:])
    return cmd


def pip_dry_run_command(run: Any, py: str, env: dict[str, str], project: Path, pins: Path) -> Any:
    """``pip install --dry-run --no-index --no-deps -r PINS`` with the venv's own pip: the
    Python peer of verify --no-torch (issue 28), checking the installed distributions against
    the same pins (``write_pins`` wrote them for uv). pip reads every installed distribution
    and reports "Requirement already satisfied" for each pin; a pin it would install (a line
    "Would install") is other work than a check, so then it is not timed."""
    argv = [py, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", "-r", str(pins)]
    cmd = run.Command("pip_dry_run", "pip install --dry-run --no-index --no-deps -r PINS", argv,
                      env, project)
    if not pins.is_file():
        cmd.error = "no pins were written (uv is needed to write them)"
        return cmd
    try:
        proc = subprocess.run(argv, env=env, cwd=project, capture_output=True, text=True, check=False)
    except OSError as exc:
        cmd.error = f"cannot run pip: {exc}"
        return cmd
    said = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "Would install" in said:
        cmd.error = f"exit {proc.returncode}: " + " | ".join(said.splitlines()[-3:])
    return cmd


def venv_commands(run: Any, venv: Path, tmp: Path, project: Path, env: dict[str, str],
                  ref: Path) -> list[Any]:
    """Commands for run.py's venv group (all interleaved with import torch and friends)."""
    py, el = str(venv / "bin" / "python"), str(venv / "bin" / "envlock")
    cmds = [
        run.Command("verify_no_cache", "envlock verify --no-cache", [el, "verify", "--no-cache", str(ref)],
                    env, project, ok_rc=(0, 1)),
        run.Command("verify_no_torch", "envlock verify --no-torch", [el, "verify", "--no-torch", str(ref)],
                    env, project, ok_rc=(0, 1)),
        run.Command("show_venv", "envlock show (the venv's lock)", [el, "show", str(ref)], env, project),
        run.Command("capture_cold", "envlock capture --no-cache",
                    [el, "capture", "--no-cache", "-o", str(tmp / "cold.lock")], env, project),
    ]
    uv = uv_binary(venv)
    if uv:
        cmds.append(run.Command("uv_freeze", "uv pip freeze", [uv, "pip", "freeze", "--python", py],
                                env, project))
        cmds.append(uv_sync_command(run, uv, py, env, project, tmp / "pins.txt"))
    cmds.append(pip_dry_run_command(run, py, env, project, tmp / "pins.txt"))
    return cmds


def bench_deep(run: Any, venv: Path, project: Path, env: dict[str, str], ref: Path,
               repeats: int) -> dict[str, Any]:
    """``verify --deep`` twice over: warm (the stat cache filled by an earlier run, as for a
    user who runs it a second time) and ``--no-cache`` (every file read again)."""
    py, el = str(venv / "bin" / "python"), str(venv / "bin" / "envlock")
    site = site_packages(py, env)
    warm_argv = [el, "verify", "--deep", str(ref)]
    # --no-torch: --no-cache would also re-import torch, which is not what this line measures.
    full_argv = [el, "verify", "--deep", "--no-cache", "--no-torch", str(ref)]
    run._run_json([*warm_argv, "--json"], env, project)  # fills the stat cache
    sha = run.Command("sha256sum", "find site-packages -type f -print0 | xargs -0 sha256sum",
                      ["sh", "-c", 'find "$1" -type f -print0 | xargs -0 sha256sum > /dev/null', "sh", site],
                      env, project)
    deep = run.Command("verify_deep", "envlock verify --deep (warm)", warm_argv, env, project,
                       ok_rc=(0, 1))
    full = run.Command("verify_deep_full", "envlock verify --deep --no-cache --no-torch",
                       full_argv, env, project, ok_rc=(0, 1))
    run.measure([sha, deep, full], repeats)
    warm = run._run_json([*warm_argv, "--json"], env, project)["deep"]
    report = run._run_json([*full_argv, "--json"], env, project)["deep"]
    rate = float(subprocess.run([py, "-c", HASHLIB_PROBE], env=env, capture_output=True, text=True,
                                check=True).stdout)
    all_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(site) for f in fs
                    if not os.path.islink(os.path.join(d, f)))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"commands": {"sha256sum": sha, "verify_deep": deep, "verify_deep_full": full},
            "files": report["files"], "bytes": report["bytes"], "site_bytes": all_bytes,
            "hashlib_gb_s_per_core": rate / 1e9, "cpus": cpus, "workers": report["workers"],
            "in_probe_s": report["seconds"], "warm_in_probe_s": warm["seconds"],
            "warm_hashed_files": warm.get("hashed_files"), "warm_cached_files": warm.get("cached_files")}


def bound(deep: dict[str, Any]) -> float | None:
    """The least full-re-hash / sha256sum ratio hashlib allows here: sha256sum's rate over
    (cores x hashlib's single-core rate), scaled by the bytes each side reads."""
    s = deep["commands"]["sha256sum"]
    if not s.median or not deep["site_bytes"]:
        return None
    floor_s: float = deep["bytes"] / (deep["hashlib_gb_s_per_core"] * 1e9 * deep["cpus"])
    return floor_s / float(s.median)


def targets(run: Any, main: dict[str, Any], deep: dict[str, Any] | None) -> list[Any]:
    def cpu(c: Any) -> float | None:
        return statistics.median(c.cpu) if c.cpu else None

    def ratio(name: str, a: str, b: str, limit: float, group: dict[str, Any] = main) -> Any:
        ca, cb = group.get(a), group.get(b)
        if ca is None or cb is None or ca.error or cb.error:
            return run.Target(name, None, limit, "x")
        return run.Target(name, run._ratio(ca.median, cb.median), limit, "x",
                          value_min=run._ratio(ca.min, cb.min), value_cpu=run._ratio(cpu(ca), cpu(cb)))

    out = [
        ratio("warm verify (torch facts cached) <= 0.1 x import torch", "verify", "import_torch", 0.1),
        ratio("capture --no-cache (cold) <= 1.15 x import torch", "capture_cold", "import_torch", 1.15),
        ratio("verify --no-torch <= 5 x uv pip freeze", "verify_no_torch", "uv_freeze", 5.0),
        ratio("verify --no-torch <= 0.5 x pip install --dry-run --no-index --no-deps -r PINS",
              "verify_no_torch", "pip_dry_run", 0.5),
        ratio("(info) verify --no-torch / uv pip sync --dry-run --offline (issue 17: <= 4)",
              "verify_no_torch", "uv_sync", 4.0),
        ratio("show <= 5 x uv pip freeze", "show_venv", "uv_freeze", 5.0),
        ratio("(info) verify --no-cache / import torch", "verify_no_cache", "import_torch", 1.0),
    ]
    for target in out:
        target.judged = not target.name.startswith("(info)")
    if deep:
        out.append(ratio("verify --deep <= 0.2 x sha256sum", "verify_deep", "sha256sum", 0.2,
                         group=deep["commands"]))
        out[-1].detail = "warm: files unchanged since the warm-up run are not read"
        limit = bound(deep)
        out.append(ratio("(info) verify --deep --no-cache (full re-hash) / sha256sum",
                         "verify_deep_full", "sha256sum", limit or 0.0, group=deep["commands"]))
        out[-1].judged = False
        out[-1].detail = "limit: the hashlib bound on this machine"
    return out


def render(deep: dict[str, Any] | None) -> str:
    if not deep:
        return ""
    cmds = deep["commands"]
    d, f, s = cmds["verify_deep"], cmds["verify_deep_full"], cmds["sha256sum"]
    broken = [c for c in (s, d, f) if c.error or not c.wall]
    if broken:
        return "\n### Deep verify\n\nfailed: " + str(broken[0].error or "no run") + "\n"
    gb = deep["bytes"] / 1e9
    floor = deep["bytes"] / (deep["hashlib_gb_s_per_core"] * 1e9 * deep["cpus"])
    lines = [
        "", "### Deep verify vs sha256sum (warm page cache)", "",
        f"envlock checks the {deep['files']:,} files the RECORDs list ({gb:.2f} GB); sha256sum "
        f"hashes every file under site-packages ({deep['site_bytes'] / 1e9:.2f} GB, bytecode "
        f"included). Warm: the stat cache was filled by the warm-up run, so a file is read only "
        f"if its size, mtime, ctime or inode changed (the last warm run re-hashed "
        f"{deep['warm_hashed_files']} and took {deep['warm_cached_files']} on their stat); what "
        f"a user running it a second time sees. `--no-cache` reads every file (`--no-torch` "
        f"beside it, or it would time an `import torch` too). hashlib sha256 here: "
        f"{deep['hashlib_gb_s_per_core']:.2f} GB/s per core x {deep['cpus']} CPUs, so a full "
        f"re-hash needs at least {floor:.2f} s.",
        "", "| command | median | min | CPU (median) | GB/s (median) | / sha256sum |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c, nbytes in ((s, deep["site_bytes"]), (d, deep["bytes"]), (f, deep["bytes"])):
        lines.append(f"| `{c.label}` | {c.median:.2f} s | {c.min:.2f} s | "
                     f"{statistics.median(c.cpu):.2f} s | {nbytes / 1e9 / c.median:.2f} | "
                     f"{c.median / s.median:.2f}x |")
    lines += ["", f"Warm, verify --deep is {d.median / s.median:.2f}x sha256sum (CPU time: "
              f"{statistics.median(d.cpu) / statistics.median(s.cpu):.2f}x); inside the probe the "
              f"check took {deep['warm_in_probe_s']:.2f} s (stat of every file, RECORD parsing, "
              f"the walk for added files). The full re-hash is {f.median / s.median:.2f}x "
              f"sha256sum, {f.median / floor:.1f}x the hashlib floor (the rest: interpreter "
              f"start, RECORD parsing, Python's per-file cost, and the rest of verify); the floor "
              f"itself is {floor / s.median:.2f}x sha256sum, the bound no tool hashing with "
              f"hashlib on {deep['cpus']} CPUs goes below. Inside the probe the full re-hash took "
              f"{deep['in_probe_s']:.2f} s with {deep['workers']} workers.", ""]
    return "\n".join(lines)


def as_json(deep: dict[str, Any] | None) -> dict[str, Any] | None:
    if not deep:
        return None
    out = {k: v for k, v in deep.items() if k != "commands"}
    out["commands"] = {k: c.summary() for k, c in deep["commands"].items()}
    plain: dict[str, Any] = json.loads(json.dumps(out))
    return plain
