"""Smoke tests of the benchmark tooling: correctness only, never timing.

The scaling figures in benchmarks/README.md are only meaningful if the synthetic
site-packages is something every tool reads the same way, so this checks that envlock's
probe and importlib.metadata see exactly the distributions the generator wrote (names in all
spellings, versions with local labels, sources from direct_url.json), and that each of them
passes envlock's own model. The report code is exercised on made-up timings.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from envlock.lock import Package
from envlock.probe import rules
from envlock.probe.packages import collect_packages

if TYPE_CHECKING:
    from synth import SynthDist  # benchmarks/synth.py, loaded by path below

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> ModuleType:
    """Import a benchmarks/ script by path: benchmarks/ is not an installed package."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


synth = _load("synth")
run = _load("run")

# 251 distributions reach every kind the generator writes, the rare editable (#250) included.
N = 251


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[SynthDist]]:
    site = tmp_path_factory.mktemp("synth") / "site-packages"
    return site, synth.generate(site, N)


def test_generator_writes_what_it_reports(generated: tuple[Path, list[SynthDist]]) -> None:
    site, dists = generated
    assert len(dists) == N
    assert len(list(site.glob("*.dist-info"))) == N
    kinds = {d.direct_url for d in dists}
    assert kinds == {None, "archive", "vcs", "local", "editable"}
    spellings = {d.name.split("0")[0] for d in dists}
    assert spellings == {"synth-pkg-", "Synth_Pkg_", "synth.pkg."}
    sizes = [(p / "METADATA").stat().st_size for p in site.glob("*.dist-info")]
    assert min(sizes) > 2048, "descriptions are meant to be multi-KB, like real METADATA"
    record = next(site.glob("*.dist-info")).joinpath("RECORD").read_text().splitlines()
    assert sum(",sha256=" in line for line in record) >= 20


def test_probe_and_importlib_metadata_see_the_same_distributions(
    generated: tuple[Path, list[SynthDist]], monkeypatch: pytest.MonkeyPatch
) -> None:
    site, dists = generated
    monkeypatch.setattr(sys, "path", [str(site)])
    packages, duplicates = collect_packages()
    found = list(importlib.metadata.distributions(path=[str(site)]))

    expected = {d.canonical: d for d in dists}
    assert duplicates == []
    assert len(packages) == len(found) == N
    assert {p["name"] for p in packages} == set(expected)
    assert {rules.canonicalize_name(d.metadata["Name"]) for d in found} == set(expected)
    source = {None: "index", "archive": "url", "vcs": "vcs", "local": "local",
              "editable": "editable"}
    for pkg in packages:
        want = expected[pkg["name"]]
        assert pkg["version"] == want.version
        assert pkg["requested"] is want.requested
        assert pkg["source"] == source[want.direct_url]
        assert len(pkg["record_sha256"]) == 64
        Package.model_validate(pkg)  # every synthetic distribution is lockable


def test_synth_indices_reads_every_spelling() -> None:
    text = ("Synth_Pkg_00001==1.1.1\nsynth.pkg.00002 @ https://x.invalid/synth_pkg_00002.whl\n"
            "# Editable install with no version control (synth-pkg-00250==1.0)\n"
            "numpy==2.0\n")
    assert synth.synth_indices(text) == {1, 2, 250}


def _cmd(key: str, samples: list[float]) -> object:
    cmd = run.Command(key, key, ["true"], {}, Path("."))
    cmd.wall, cmd.cpu, cmd.rcs = samples, samples, [0] * len(samples)
    return cmd


def test_report_on_made_up_timings() -> None:
    main = {k: _cmd(k, v) for k, v in {
        "python": [0.02], "import_torch": [1.0, 1.2], "collect_env": [2.0],
        "pip_freeze": [0.4], "importlib_list": [0.05], "capture": [1.1],
        "capture_no_torch": [0.1], "verify": [1.2]}.items()}
    synth_res = [run.SynthResult(size, {"capture_no_torch": _cmd("c", [0.1 + size * 1e-4]),
                                        "pip_freeze": _cmd("p", [0.4 + size * 6e-4]),
                                        "importlib_list": _cmd("i", [0.05])},
                                 {"envlock": size, "pip_freeze": size, "importlib_metadata": size},
                                 Path("x.lock"))
                 for size in (0, 100, 5000)]
    scan = {f"/d{n}": {"probe_count": n,
                       "probe.collect_packages": {"median_s": n * 9e-5, "min_s": n * 8e-5},
                       "importlib.metadata name+version": {"median_s": n * 2e-4},
                       "importlib.metadata list": {"median_s": 1e-3}} for n in (100, 5000)}
    load = {"packages": 1000, "bytes": 200_000, "load": {"median_s": 0.03, "min_s": 0.028},
            "stages": {"tomllib.loads": {"median_s": 0.02, "min_s": 0.019}}}
    targets = run.build_targets(main, synth_res, scan, load)
    verdicts = {t.name: t.verdict for t in targets}
    assert verdicts["capture <= 1.15 x import torch"] == "PASS"  # 1.1 / 1.1 (median of two)
    assert verdicts["capture <= 0.8 x collect_env"] == "PASS"
    assert verdicts["capture --no-torch <= 0.5 x pip freeze (bench venv)"] == "PASS"
    assert any(name.startswith("linear") and v == "PASS" for name, v in verdicts.items())
    assert verdicts["load+validate 1000-package lock <= 50 ms"] == "PASS"
    doc = {"mode": "quick", "repeats": 1, "machine": {
        "cpus": 2, "cpu_model": "cpu", "system": "linux", "loadavg_start": [0.1, 0, 0],
        "loadavg_end": [0.2, 0, 0]}, "venv": {"python": "3.11", "torch": "2.13.0",
                                               "numpy": "2", "pip": "23", "distributions": 30}}
    text = run.render(doc, main, synth_res, scan, load, None, targets)
    assert "| target |" in text and "MISMATCH" not in text


def test_deep_and_cache_report_on_made_up_timings() -> None:
    deepbench = _load("deepbench")
    main = {k: _cmd(k, v) for k, v in {
        "import_torch": [1.0], "verify": [0.09], "capture_cold": [1.2], "verify_no_torch": [0.2],
        "show_venv": [0.1], "uv_freeze": [0.03], "verify_no_cache": [1.1],
        "uv_sync": [0.06], "pip_dry_run": [0.5]}.items()}
    deep = {"commands": {"sha256sum": _cmd("s", [4.0]), "verify_deep": _cmd("d", [1.0]),
                         "verify_deep_full": _cmd("f", [2.0])},
            "files": 37000, "bytes": 1_000_000_000, "site_bytes": 1_100_000_000,
            "hashlib_gb_s_per_core": 1.45, "cpus": 2, "workers": 2, "in_probe_s": 0.8,
            "warm_in_probe_s": 0.3, "warm_hashed_files": 12, "warm_cached_files": 36988}
    verdicts = {t.name: t.verdict for t in deepbench.targets(run, main, deep)}
    assert verdicts == {
        "warm verify (torch facts cached) <= 0.1 x import torch": "PASS",
        "capture --no-cache (cold) <= 1.15 x import torch": "MISS",
        "verify --no-torch <= 5 x uv pip freeze": "MISS",
        "verify --no-torch <= 0.5 x pip install --dry-run --no-index --no-deps -r PINS": "PASS",
        "(info) verify --no-torch / uv pip sync --dry-run --offline (issue 17: <= 4)": "info",
        "show <= 5 x uv pip freeze": "PASS",
        "(info) verify --no-cache / import torch": "info",
        "verify --deep <= 0.2 x sha256sum": "MISS",
        "(info) verify --deep --no-cache (full re-hash) / sha256sum": "info",
    }
    full = next(t for t in deepbench.targets(run, main, deep) if "full re-hash" in t.name)
    # The bound: 1 GB at 1.45 GB/s on each of 2 cores (0.345 s) over sha256sum's 4 s.
    assert full.value == 0.5 and abs(full.limit - 1 / 2.9 / 4) < 1e-9
    text = deepbench.render(deep)
    assert "0.25x sha256sum" in text and "1.00 GB/s" in text.replace("| 1.00 |", "1.00 GB/s")
    assert "re-hashed 12 and took 36988 on their stat" in text and "full re-hash is 0.50x" in text
    assert deepbench.as_json(deep)["commands"]["verify_deep"]["median_s"] == 1.0


FAKE_UV = """#!/bin/sh
case "$2" in
  freeze) printf 'numpy==2.4.6\\nEnvlock_ML @ file:///gone/src\\n' ;;
  list) printf '[{"name": "numpy", "version": "2.4.6"}, {"name": "envlock-ml", "version": "0.1.0"}]' ;;
  sync) printf 'Resolved 2 packages in 1ms\\n%s\\n' "$FAKE_UV_SAYS" >&2 ;;
esac
"""


@pytest.mark.parametrize(("says", "timed"), [("Would make no changes", True),
                                             ("Would uninstall 1 package", False)])
def test_uv_sync_is_measured_against_the_venvs_pins(tmp_path: Path, says: str,
                                                     timed: bool) -> None:
    """verify --no-torch is measured beside ``uv pip sync --dry-run --offline`` of pins written
    from the venv itself, a direct reference pinned by version (its source is gone), and only
    while uv finds nothing to change: otherwise it would time other work than a check."""
    import os

    deepbench = _load("deepbench")
    venv, tmp = tmp_path / "venv", tmp_path / "run"
    (venv / "bin").mkdir(parents=True)
    tmp.mkdir()
    uv = venv / "bin" / "uv"
    uv.write_text(FAKE_UV)
    uv.chmod(0o755)
    env = {**os.environ, "FAKE_UV_SAYS": says}
    cmds = {c.key: c for c in deepbench.venv_commands(run, venv, tmp, tmp, env, tmp / "ref.lock")}
    sync = cmds["uv_sync"]
    assert {"verify_no_torch", "uv_freeze"} <= set(cmds)
    assert sync.argv == [str(uv), "pip", "sync", "--dry-run", "--offline", "--python",
                         str(venv / "bin" / "python"), str(tmp / "pins.txt")]
    assert (tmp / "pins.txt").read_text() == "numpy==2.4.6\nEnvlock_ML==0.1.0\n"
    assert (sync.error is None) is timed


FAKE_PYTHON = """#!/bin/sh
printf 'Requirement already satisfied: numpy==2.4.6 in /venv (2.4.6)\\n%s\\n' "$FAKE_PIP_SAYS"
"""


@pytest.mark.parametrize(("says", "timed"), [("", True), ("Would install numpy-2.4.5", False)])
def test_pip_dry_run_is_measured_against_the_same_pins(tmp_path: Path, says: str,
                                                       timed: bool) -> None:
    """verify --no-torch is judged against its Python peer, pip's dry run of the venv's own
    pins with the venv's own pip, and only while pip finds every pin installed."""
    import os

    deepbench = _load("deepbench")
    venv, tmp = tmp_path / "venv", tmp_path / "run"
    (venv / "bin").mkdir(parents=True)
    tmp.mkdir()
    for name, text in (("uv", FAKE_UV), ("python", FAKE_PYTHON)):
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    env = {**os.environ, "FAKE_UV_SAYS": "Would make no changes", "FAKE_PIP_SAYS": says}
    cmds = {c.key: c for c in deepbench.venv_commands(run, venv, tmp, tmp, env, tmp / "ref.lock")}
    pip = cmds["pip_dry_run"]
    assert pip.argv == [str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--no-index",
                        "--no-deps", "-r", str(tmp / "pins.txt")]
    assert (pip.error is None) is timed


def test_training_report_judges_each_tree_on_ratios_from_one_process(tmp_path: Path) -> None:
    """training.py: each ratio is the call's time over the same process's ``import torch``;
    two trees measured side by side get a row and a target each."""
    training = _load("training")
    kids = {k.key: k for tree in ("before", "after")
            for k in training.children(Path("/venv"), tmp_path, tree, tmp_path)}
    for key, kid in kids.items():
        tree = key.split(":")[0]
        cost = 0.2 if tree == "before" else 0.05
        kid.rows = [{"import torch_s": t, "capture_s": cost * t, "record_s": cost * t / 2}
                    for t in (1.0, 1.2, 2.0)]
        kid.wall = [1.5] if key.endswith("import_torch") else [1.2]
        if key.endswith("collect_env"):
            kid.rows = [{"import torch_s": t, "collect_env_s": 0.5 * t} for t in (1.0, 1.2, 2.0)]
    assert kids["after:record"].env["PYTHONPATH"] == str(tmp_path)
    assert kids["after:record"].env["ENVLOCK_CACHE_DIR"] != kids["before:record"].env["ENVLOCK_CACHE_DIR"]
    text, judged = training.render(kids, ["before", "after"])
    verdicts = {t["target"]: t["verdict"] for t in judged}
    assert verdicts["before: capture() <= 0.10 x import torch (warm)"] == "MISS"  # 0.2x
    assert verdicts["after: capture() <= 0.10 x import torch (warm)"] == "PASS"  # 0.05x
    assert verdicts["after: first record() <= 0.10 x import torch (warm)"] == "PASS"
    assert verdicts["after: capture --no-cache <= 1.15 x import torch"] == "PASS"  # 1.2 / 1.5
    assert "| after: record() alone |" in text and "0.200x" in text and "0.050x" in text
    # The peer beside the targets: collect_env at 0.5x import torch; after's capture() is a tenth of it.
    values = {t["target"]: t["value"] for t in judged}
    assert values["after: (info) the peer, torch.utils.collect_env.get_env_info()"] == pytest.approx(0.5)
    assert values["after: (info) capture() / the peer (medians in their own processes)"] == pytest.approx(0.1)


@pytest.mark.parametrize("script", ["run", "biglock", "export", "hashing", "ospkgs",
                                    "profile_capture", "adversarial_secrets", "adversarial_outputs",
                                    "bundle", "restore", "runstart", "training", "tensor_record"])
def test_every_benchmark_explains_itself(script: str) -> None:
    """``--help`` is how a reader finds the knobs; argparse formats help lazily, so a stray
    ``%`` in a help string only breaks when someone asks."""
    import subprocess

    r = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-2000:]


def test_tensor_record_prints_a_ratio_per_dtype(tmp_path: Path) -> None:
    """tensor_record.py, at a small size: one row per dtype with both timings and their ratio,
    and the journal it records into stays in its own temporary directory."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    r = subprocess.run([sys.executable, str(BENCH / "tensor_record.py"), "--mb", "1", "--repeat", "1",
                        "--old-mb", "0"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith(("| float32", "| bfloat16"))]
    assert len(rows) == 2 and all(row.rstrip(" |").endswith("x") for row in rows), r.stdout
    assert list(tmp_path.iterdir()) == []
