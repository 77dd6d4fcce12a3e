"""What a replay's verdict names as the cause of a divergence, beyond threads and flags: the
code the command ran (an edited script or module, another commit, another command line), the
packages of the environment, the loader's variables, and a cause on one rank of several. Real
processes and a real git repository on this host; no torch (the torch runs are the corpus's,
``test_divergence_corpus.py``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_replay_record import meta, rec

from envlock.commands import main
from envlock.probe import code as probe_code
from envlock.probe.collect import collect
from envlock.probe.rules import env_allowed, rank_journal
from envlock.replay.compare import ENV_MARK, compare_records, context_of
from envlock.replay.make import make_record, read_journal
from envlock.replay.record import Code, RankContext, Record, load, rank_contexts, rank_entry
from envlock.replay.report import replay_text
from envlock.runtime import recorder

FIXTURES = Path(__file__).parent / "fixtures"

SCRIPT = """
import os, envlock
from lib import model
lr = 0.1
x = 1.0
for step in range(3):
    x = model.step(x, lr) + float(os.environ.get("BUMP", "0"))
    envlock.record(step, loss=x)
open("out.txt", "w").write(repr(x))
"""
MODEL = "def step(x, lr):\n    return x - lr * x * 0.5\n"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=root,
                   check=True, stdout=subprocess.DEVNULL)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A researcher's project: a git repository with a script and a module of its own."""
    root = tmp_path / "proj"
    (root / "lib").mkdir(parents=True)
    (root / "train.py").write_text(SCRIPT)
    (root / "lib" / "__init__.py").write_text("")
    (root / "lib" / "model.py").write_text(MODEL)
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "x")
    monkeypatch.chdir(root)
    monkeypatch.delenv("BUMP", raising=False)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    # A new user's machine writes bytecode caches into the project.
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    repo = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return root


def _replay(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["replay", "run.record", *args])
    return code, capsys.readouterr().out


# -- the code the command ran ------------------------------------------------------------------


def test_an_edited_learning_rate_is_named_as_the_cause(project: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: the replay said "a nondeterministic operation or a changed input"."""
    assert main(["record", "run.record", "--output", "out.txt", "--", sys.executable, "train.py"]) == 0
    r = load(project / "run.record")
    assert r.code is not None and r.code.files == {
        "train.py": sha(project / "train.py"), "lib/__init__.py": sha(project / "lib" / "__init__.py"),
        "lib/model.py": sha(project / "lib" / "model.py")}
    assert r.code.commit and r.code.dirty is False and r.code.untracked == 0
    before = sha(project / "train.py")
    (project / "train.py").write_text(SCRIPT.replace("lr = 0.1", "lr = 0.2"))
    code, out = _replay(capsys)
    assert code == 1 and "DIVERGED" in out
    assert f"    train.py changed: {before} -> {sha(project / 'train.py')}\n" in out
    assert "nondeterministic" not in out and "lib/model.py" not in out
    # The working tree's changes against its commit are named too (the script is tracked).
    assert "the working tree's changes against its commit: " in out
    code, out = _replay(capsys, "--json")
    doc = json.loads(out)
    assert doc["code"][0] == {"what": "file", "name": "train.py", "original": before,
                              "replay": sha(project / "train.py")}


def test_an_edited_module_of_the_project_is_named(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    (project / "lib" / "model.py").write_text(MODEL.replace("0.5", "0.25"))
    code, out = _replay(capsys)
    assert code == 1 and "    lib/model.py changed: " in out and "train.py changed" not in out


def test_another_commit_is_named(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    first = load(project / "run.record").code
    (project / "lib" / "model.py").write_text(MODEL.replace("0.5", "0.75"))
    _git(project, "commit", "-qam", "another model")
    code, out = _replay(capsys)
    assert code == 1 and first is not None and f"    git commit: {first.commit} -> " in out
    assert "    lib/model.py changed: " in out


def test_what_the_original_wrote_is_not_a_change_of_the_code(
        project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay finds the record, the declared outputs and bytecode caches the original wrote;
    none of them is a cause: the one named is the variable the script read (the trace of what
    the run read sees it), and nothing else."""
    assert main(["record", "run.record", "--output", "out.txt", "--", sys.executable, "train.py"]) == 0
    assert (project / "lib" / "__pycache__").is_dir()  # written by the original run
    assert _replay(capsys) == (0, "OK: the replay reproduced run.record (bit-identical; 3 steps compared)\n")
    monkeypatch.setenv("BUMP", "1e-9")
    code, out = _replay(capsys)
    assert code == 1
    assert out.split("(original -> replay):\n")[1] == "    BUMP read by the run: (unset) -> 1e-9\n"
    assert "working tree" not in out and "changed:" not in out


def test_twin_an_untracked_file_added_since_is_a_change_of_the_tree(
        project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["record", "run.record", "--output", "out.txt", "--", sys.executable, "train.py"]) == 0
    (project / "config.yaml").write_text("lr: 0.2\n")
    monkeypatch.setenv("BUMP", "1e-9")
    code, out = _replay(capsys)
    assert code == 1 and "    the working tree's changes against its commit: " in out


def test_another_command_line_is_named(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "train.py").write_text(SCRIPT.replace('float(os.environ.get("BUMP", "0"))',
                                                     'float((__import__("sys").argv[1:] or ["0"])[0])'))
    _git(project, "commit", "-qam", "a bump argument")
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    code, out = _replay(capsys, "--", sys.executable, "train.py", "1e-9")
    assert code == 1
    assert f"    command: {sys.executable} train.py -> {sys.executable} train.py 1e-9\n" in out


def test_a_record_without_code_compares_as_before(project: Path) -> None:
    """A record written before ``[code]`` reads, and a replay of it names no code change."""
    old = load(FIXTURES / "replay-record-v1" / "run.record")
    assert old.code is None and old.ranks is None
    new = old.model_copy(update={"code": Code(commit="a" * 40, files={"train.py": "b" * 64},
                                              files_left_out=0)})
    assert compare_records(old, new).code == ()
    assert compare_records(new, old).code == ()


# -- which files are the workspace's -----------------------------------------------------------


def test_only_the_workspaces_own_files_are_hashed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    venv_module = ws / ".venv" / "lib" / "python3.11" / "site-packages" / "torch" / "__init__.py"
    for path in (ws / "train.py", ws / "src" / "a.py", venv_module, tmp_path / "elsewhere.py"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {path.name}\n")
    modules: dict[str, Any] = {
        "__main__": SimpleNamespace(__file__=str(ws / "train.py")),
        "a": SimpleNamespace(__file__=str(ws / "src" / "a.py")),
        "torch": SimpleNamespace(__file__=str(venv_module)),
        "elsewhere": SimpleNamespace(__file__=str(tmp_path / "elsewhere.py")),
        "builtin": SimpleNamespace(), "namespace": SimpleNamespace(__file__=None),
        "frozen": SimpleNamespace(__file__="<frozen os>"),
    }
    found = probe_code.workspace_files(str(ws), modules)
    assert found == {"files": {"train.py": sha(ws / "train.py"), "src/a.py": sha(ws / "src" / "a.py")},
                     "left_out": 0}
    # Through a link to the workspace, the same files.
    (tmp_path / "link").symlink_to(ws)
    assert probe_code.workspace_files(str(tmp_path / "link"), modules) == found


def test_a_workspace_in_a_git_repository_keeps_the_repositorys_files_it_ran(tmp_path: Path) -> None:
    """``cd experiments && python ../train.py``: the script is the project's, and an edit to it
    must be named, keyed from the workspace; files outside the repository stay out."""
    repo, ws = tmp_path / "proj", tmp_path / "proj" / "experiments"
    (repo / ".git").mkdir(parents=True)
    ws.mkdir()
    for path in (repo / "train.py", repo / "lib" / "util.py", ws / "cfg.py", tmp_path / "elsewhere.py",
                 repo / ".venv" / "lib" / "python3.11" / "site-packages" / "six.py"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {path.name}\n")
    modules: dict[str, Any] = {
        "__main__": SimpleNamespace(__file__=str(ws / ".." / "train.py")),
        "util": SimpleNamespace(__file__=str(repo / "lib" / "util.py")),
        "cfg": SimpleNamespace(__file__=str(ws / "cfg.py")),
        "elsewhere": SimpleNamespace(__file__=str(tmp_path / "elsewhere.py")),
        "six": SimpleNamespace(__file__=str(repo / ".venv" / "lib" / "python3.11" / "site-packages" / "six.py")),
    }
    found = probe_code.workspace_files(str(ws), modules)
    assert found == {"files": {"../train.py": sha(repo / "train.py"), "../lib/util.py": sha(repo / "lib" / "util.py"),
                               "cfg.py": sha(ws / "cfg.py")}, "left_out": 0}
    assert next(iter(found["files"])) == "../train.py"  # the script first
    # Without the repository, the workspace alone: its own files keep the same keys.
    (repo / ".git").rmdir()
    assert probe_code.workspace_files(str(ws), modules) == {"files": {"cfg.py": sha(ws / "cfg.py")}, "left_out": 0}


def test_the_files_are_bounded_and_the_script_is_kept_first(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    modules: dict[str, Any] = {}
    for name in ("a", "b", "c", "z_main"):
        (tmp_path / f"{name}.py").write_text(name)
        modules[name] = SimpleNamespace(__file__=str(tmp_path / f"{name}.py"))
    modules["__main__"] = modules["z_main"]
    monkeypatch.setattr(probe_code, "MAX_FILES", 2)
    found = probe_code.workspace_files(str(tmp_path), modules)
    assert list(found["files"]) == ["z_main.py", "a.py"] and found["left_out"] == 2


def test_the_workspace_variable_stays_out_of_a_lock() -> None:
    assert not env_allowed("ENVLOCK_WORKSPACE")
    assert env_allowed("ENVLOCK_WORKSPACES")  # over-exclusion twin


# -- the environment beyond threads -------------------------------------------------------------


def test_packages_and_the_loaders_variables_are_context() -> None:
    form = {"packages": [{"name": "numpy", "version": "2.4.6"}, {"name": "six", "version": "1.17.0"}],
            "env": {"LD_PRELOAD": "/opt/libfast.so", "LD_LIBRARY_PATH": "/opt/cuda/lib64",
                    "PYTHONPATH": "/src"}}
    assert context_of(form) == {ENV_MARK: "lock", "env.LD_LIBRARY_PATH": "/opt/cuda/lib64", "env.LD_PRELOAD": "/opt/libfast.so",
                                "env.PYTHONPATH": "/src",
                                "packages.numpy": "2.4.6", "packages.six": "1.17.0"}
    # A variable no lock records is no context either (a form handed in from elsewhere).
    assert context_of({"env": {"SOME_SETTING": "1", "NVTE_FUSED_ATTN": "0"}}) == {
        ENV_MARK: "lock", "env.NVTE_FUSED_ATTN": "0"}
    # A key the record cannot hold (a variable's odd name) is left out, not a record refused.
    assert context_of({"env": {"OMP_A B": "1", "OMP_C": "2"}}) == {ENV_MARK: "lock", "env.OMP_C": "2"}


# The variables a lock records beyond threads and BLAS: they select kernels (Transformer
# Engine's attention), precision (accelerate), which GPU is "cuda:0", and which code imports.
LOCKED_VARIABLES = {"NVTE_FUSED_ATTN": ("0", "1"), "ACCELERATE_MIXED_PRECISION": ("bf16", "fp16"),
                    "CUDA_DEVICE_ORDER": ("PCI_BUS_ID", "FASTEST_FIRST")}
HF_TOKEN = "hf_" + "Q7xk2Lm9Pw4Rt8Vb3Nc6Zd1Fg5Hj0Ks7Ae"
WANDB_KEY = "4f9c2d7e1b8a6350c9e2f4a7d1b3e5c8f0a2d4b6"


def test_every_variable_the_lock_records_is_named_by_a_replay(
        project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The record kept fewer variables than the lock: a replay whose only other cause was
    NVTE_FUSED_ATTN or PYTHONPATH said "a nondeterministic operation or a changed input"."""
    path = os.environ["PYTHONPATH"]
    for name, (recorded, _) in LOCKED_VARIABLES.items():
        monkeypatch.setenv(name, recorded)
    monkeypatch.setenv("PYTHONPATH", path + os.pathsep + "x")
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    context = load(project / "run.record").context
    assert {k: context.get(f"env.{k}") for k in LOCKED_VARIABLES} == {
        k: v[0] for k, v in LOCKED_VARIABLES.items()}
    for name, (_, other) in LOCKED_VARIABLES.items():
        monkeypatch.setenv(name, other)
    monkeypatch.setenv("PYTHONPATH", path + os.pathsep + "y")
    monkeypatch.setenv("BUMP", "1")
    code, out = _replay(capsys)
    assert code == 1 and "nondeterministic" not in out
    for name, (recorded, other) in LOCKED_VARIABLES.items():
        assert f"    env.{name}: {recorded} -> {other}\n" in out
    assert f"    env.PYTHONPATH: {path}{os.pathsep}x -> {path}{os.pathsep}y\n" in out


def test_a_secret_variable_never_reaches_the_record_with_its_value(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's context is the lock's [env], scrubbed by the lock's rules: a secret-named
    variable is recorded as redacted (the lock's own rule), never with its value; its
    over-redaction twins, a setting whose name holds "TOKEN" and a path, stay readable."""
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("HF_TOKEN_PATH", str(project / "hf-token"))
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    text = (project / "run.record").read_text()
    assert HF_TOKEN not in text and WANDB_KEY not in text
    context = load(project / "run.record").context
    assert context["env.HF_TOKEN"] == "<redacted>"
    assert context["env.TOKENIZERS_PARALLELISM"] == "false"
    assert context["env.HF_TOKEN_PATH"] == str(project / "hf-token")


# -- ranks ---------------------------------------------------------------------------------------


def _capture_line(rank: int, world: int, env: dict[str, str]) -> str:
    doc = collect(torch="no")
    doc["env"] = env
    return json.dumps({"capture": doc, "world_size": world, "rank": rank}) + "\n"


@pytest.fixture(scope="module")
def captures() -> dict[str, str]:
    """Rank captures with and without a variable (one probe run, its env table replaced)."""
    return {"plain0": _capture_line(0, 2, {}), "plain1": _capture_line(1, 2, {}),
            "omp1": _capture_line(1, 2, {"OMP_NUM_THREADS": "1"}), "omp0": _capture_line(0, 2, {"OMP_NUM_THREADS": "1"})}


def _ranked_record(where: Path, rank0: str, rank1: str | None, loss: float) -> Record:
    where.mkdir()
    journal = where / "journal.jsonl"
    journal.write_text(rank0 + json.dumps({"step": 0, "metrics": {"loss": loss}}) + "\n")
    if rank1 is not None:
        Path(rank_journal(str(journal), 1)).write_text(rank1)
    return make_record(journal, command=["torchrun", "train.py"], exit_code=0, where="host", base=where)


def test_each_ranks_context_is_kept_as_what_differs_from_rank_0(tmp_path: Path, captures: dict[str, str]) -> None:
    r = _ranked_record(tmp_path / "a", captures["plain0"], captures["omp1"], 1.0)
    assert r.ranks == [RankContext(rank=1, context={"env.OMP_NUM_THREADS": "1", "process.rank": 1})]
    r.save(tmp_path / "a.record")
    back = load(tmp_path / "a.record")
    assert (back.ranks, back.context, back.code) == (r.ranks, r.context, r.code)
    assert rank_contexts(back)[1]["env.OMP_NUM_THREADS"] == "1"
    assert "env.OMP_NUM_THREADS" not in rank_contexts(back)[0]
    # A key of rank 0 that rank 1 lacks is kept as absent.
    entry = rank_entry(1, {"a.b": 1}, {"a.b": 1, "c.d": True})
    assert entry == RankContext(rank=1, context={}, absent=["c.d"])


def test_a_cause_on_one_rank_only_is_named_with_its_rank(tmp_path: Path, captures: dict[str, str]) -> None:
    original = _ranked_record(tmp_path / "a", captures["plain0"], captures["plain1"], 1.0)
    replay = _ranked_record(tmp_path / "b", captures["plain0"], captures["omp1"], 1.5)
    cmp = compare_records(original, replay)
    assert [(c.key, c.original, c.replay, c.ranks) for c in cmp.context] == [
        ("env.OMP_NUM_THREADS", None, "1", (1,))]
    assert "    rank 1: env.OMP_NUM_THREADS: (none) -> 1\n" in replay_text(cmp, "run.record")


def test_twin_a_cause_on_every_rank_is_named_once_without_ranks(tmp_path: Path, captures: dict[str, str]) -> None:
    original = _ranked_record(tmp_path / "a", captures["plain0"], captures["plain1"], 1.0)
    replay = _ranked_record(tmp_path / "b", captures["omp0"], captures["omp1"], 1.5)
    cmp = compare_records(original, replay)
    assert [(c.key, c.ranks) for c in cmp.context] == [("env.OMP_NUM_THREADS", ())]
    assert "    env.OMP_NUM_THREADS: (none) -> 1\n" in replay_text(cmp, "run.record")


def test_a_rank_only_one_record_kept_is_not_compared(tmp_path: Path, captures: dict[str, str]) -> None:
    original = _ranked_record(tmp_path / "a", captures["plain0"], captures["omp1"], 1.0)
    replay = _ranked_record(tmp_path / "b", captures["plain0"], None, 1.5)
    assert compare_records(original, replay).context == ()


def test_a_rank_writes_its_capture_beside_the_journal_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import envlock

    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv(recorder.RECORD_ENV, str(journal))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(recorder, "_state", {"path": None, "fh": None, "ranked": None})
    envlock.record(0, loss=1.0)
    envlock.record(1, loss=2.0)
    assert not journal.exists()  # metrics: rank 0 only
    lines = Path(rank_journal(str(journal), 1)).read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["rank"] == 1 and "code" not in json.loads(lines[0])
    ran = read_journal(journal)
    assert ran.steps == [] and ran.ranks[1]["process.rank"] == 1 and ran.ranks[1]["process.world_size"] == 2


def test_a_torn_or_foreign_rank_file_is_left_out_or_refused(tmp_path: Path, captures: dict[str, str]) -> None:
    from envlock.errors import LockInvalid

    journal = tmp_path / "journal.jsonl"
    journal.write_text(captures["plain0"])
    Path(rank_journal(str(journal), 1)).write_text(captures["omp1"][:100])  # killed mid-write
    (tmp_path / "journal.jsonl.rankx").write_text("not a rank")
    assert read_journal(journal).ranks == {}
    Path(rank_journal(str(journal), 2)).write_text('{"step": 0, "metrics": {}}\n')
    with pytest.raises(LockInvalid, match="rank 2 is not a capture"):
        read_journal(journal)


def test_a_record_without_ranks_reads_as_one_process() -> None:
    old = load(FIXTURES / "replay-record-v1" / "run.record")
    assert rank_contexts(old) == {0: dict(old.context)}
    r = rec([1.0], context={"process.rank": 0}, record=meta())
    assert rank_contexts(r) == {0: {"process.rank": 0}}


def test_a_file_name_the_record_cannot_hold_is_counted_not_fatal(tmp_path: Path) -> None:
    """A module whose file name holds a terminal control is left out of ``[code]`` (and counted),
    rather than the record refused after the training run."""
    journal = tmp_path / "journal.jsonl"
    doc = collect(torch="no")
    journal.write_text(json.dumps({"capture": doc, "world_size": 1, "rank": 0, "code": {
        "files": {"train.py": "a" * 64, "odd\x1b[2Jname.py": "b" * 64}, "left_out": 1}}) + "\n")
    r = make_record(journal, command=["python", "train.py"], exit_code=0, where="host", base=tmp_path)
    assert r.code == Code(files={"train.py": "a" * 64}, files_left_out=2)


def test_a_tensor_metric_needs_no_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image restored from a lock without numpy: ``Tensor.numpy()`` raises there, and a
    tensor metric (two gloo ranks' losses, stacked) failed the run."""
    import torch

    def no_numpy(*_: Any) -> Any:
        raise RuntimeError("Numpy is not available")

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)[:, 1:]  # a view, not contiguous
    expected = hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    assert recorder.encode("w", t) == {"sha256": expected, "dtype": "float32", "shape": [2, 2], "mean": 3.0}
    half = recorder.encode("h", torch.ones(3, dtype=torch.bfloat16))
    assert half["sha256"] == hashlib.sha256(b"\x80\x3f" * 3).hexdigest()


def test_a_record_kept_before_every_locked_variable_was_names_none_of_the_others() -> None:
    """A record written before it kept every variable the lock records has no PYTHONPATH nor
    NVTE_* in its context: against a replay that has them they are not compared (no false
    cause), while the numerics variables both kinds of record keep still are; between two
    records that both keep them, they are named."""
    from datetime import datetime, timezone

    from envlock.replay.record import Meta, Record, Step

    def rec(context: dict[str, bool | int | float | str], loss: float) -> Record:
        meta = Meta(tool_version="0", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                    where="host", command=["python", "train.py"], exit_code=0)
        return Record(record=meta, context=context, steps=[Step(step=0, metrics={"loss": loss})])

    older = rec({"env.OMP_NUM_THREADS": "2"}, 0.5)
    newer = rec({ENV_MARK: "lock", "env.OMP_NUM_THREADS": "1", "env.PYTHONPATH": "/src",
                 "env.NVTE_FUSED_ATTN": "0"}, 0.25)
    keys = [c.key for c in compare_records(older, newer).context]
    assert keys == ["env.OMP_NUM_THREADS"]
    both = rec({ENV_MARK: "lock", "env.OMP_NUM_THREADS": "2", "env.PYTHONPATH": "/lib"}, 0.5)
    keys = [c.key for c in compare_records(both, newer).context]
    assert keys == ["env.NVTE_FUSED_ATTN", "env.OMP_NUM_THREADS", "env.PYTHONPATH"]
