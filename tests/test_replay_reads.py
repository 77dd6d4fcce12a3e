"""What a replay names from the trace of what the run read (``probe.trace``, ``replay.reads``):
a variable the script reads, a config file committed or not, a module outside the workspace, a
checkpoint under ``$TORCH_HOME``, a file a child Python process read, process-wide numeric state;
and what it must not name (the run's own temporary files, what another process writes into a
shared directory). Real recorded processes on this host, started by ``envlock record``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envlock.commands import main
from envlock.probe import trace
from envlock.probe.rules import without_trace_hook
from envlock.replay.compare import compare_records
from envlock.replay.reads import MAX_HASHED, hash_files
from envlock.replay.record import load
from envlock.replay.report import replay_text

SCRIPT = """
import json, os, subprocess, sys, tempfile
import envlock
import extmod
hp = json.load(open(os.path.join("config", "hparams.json")))
local = json.load(open("local.json")) if os.path.exists("local.json") else {}
lr = float(os.environ.get("LR", hp["lr"]))
# The run's own scratch file, in the temporary directory, under a fresh name each run.
fd, scratch = tempfile.mkstemp()
os.write(fd, b"scratch"); os.close(fd)
open(scratch).read(); os.unlink(scratch)
child = subprocess.run([sys.executable, "-c", "print(len(open('child.txt').read()))"],
                       capture_output=True, text=True, check=True).stdout
x = 1.0
for step in range(2):
    x = x - lr * x * extmod.SCALE + local.get("shift", 0.0) + int(child)
    envlock.record(step, loss=x)
"""


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=root,
                   check=True, stdout=subprocess.DEVNULL)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with a committed config, an untracked local override, a module on PYTHONPATH
    outside the workspace, and a file a child process reads."""
    root = tmp_path / "proj"
    (root / "config").mkdir(parents=True)
    (root / "train.py").write_text(SCRIPT)
    (root / "config" / "hparams.json").write_text(json.dumps({"lr": 0.1}))
    (root / "child.txt").write_text("four")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "x")
    (root / "local.json").write_text(json.dumps({"shift": 0.0}))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "extmod.py").write_text("SCALE = 0.5\n")
    monkeypatch.chdir(root)
    monkeypatch.delenv("LR", raising=False)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    repo = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, str(outside)]))
    return root


def _record(*extra: str) -> None:
    assert main(["record", "run.record", *extra, "--", sys.executable, "train.py"]) == 0


def _replay(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, dict[str, Any]]:
    capsys.readouterr()
    code = main(["replay", "run.record", *args])
    text = capsys.readouterr().out
    capsys.readouterr()
    assert main(["replay", "run.record", "--json", *args]) == code
    return code, text, json.loads(capsys.readouterr().out)


def test_the_record_holds_what_the_run_read_and_nothing_of_its_own(project: Path) -> None:
    _record()
    reads = load("run.record").reads
    assert reads is not None and reads.processes == 2  # the script and its child python
    # The config files (committed and not) and the child's file, relative to the workspace; the
    # module outside it by its absolute path. train.py is [code]'s, the stdlib and envlock's
    # own files, bytecode caches and the run's scratch file are no input.
    assert set(reads.files) == {"config/hparams.json", "local.json", "child.txt",
                                str(project.parent / "outside" / "extmod.py")}
    assert reads.variables.get("LR") is None and "LR" in (reads.unset or [])
    assert not reads.untraced
    # The start-up hook on PYTHONPATH is envlock's, not the run's: not in what is recorded.
    rec = load("run.record")
    assert "probe/startup" not in str(rec.context.get("env.PYTHONPATH", ""))
    assert all("probe/startup" not in v for v in reads.variables.values())


@pytest.mark.parametrize("change, named", [
    (lambda p: (p / "config" / "hparams.json").write_text(json.dumps({"lr": 0.2})), "config/hparams.json"),
    (lambda p: (p / "local.json").write_text(json.dumps({"shift": 0.001})), "local.json"),
    (lambda p: (p.parent / "outside" / "extmod.py").write_text("SCALE = 0.25\n"), "/outside/extmod.py"),
    (lambda p: (p / "child.txt").write_text("five!"), "child.txt"),
])
def test_a_changed_file_the_run_read_is_named(project: Path, capsys: pytest.CaptureFixture[str],
                                              change: Callable[[Path], object], named: str) -> None:
    _record()
    change(project)
    code, text, doc = _replay(capsys)
    assert code == 1 and "DIVERGED" in text
    files = [r for r in doc["reads"] if r["what"] == "file"]
    assert len(files) == 1 and files[0]["name"].endswith(named), doc["reads"]
    assert files[0]["original"].startswith("sha256 ") and files[0]["replay"] != files[0]["original"]
    assert f"{files[0]['name']} changed (sha256 {files[0]['original'][7:19]} -> " in text
    assert "nondeterministic" not in text


def test_a_variable_the_run_read_is_named(project: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LR", "0.1")
    _record()
    monkeypatch.setenv("LR", "0.2")
    code, text, doc = _replay(capsys)
    assert code == 1
    assert doc["reads"] == [{"what": "variable", "name": "LR", "original": "0.1", "replay": "0.2"}]
    assert "    LR read by the run: 0.1 -> 0.2\n" in text


def test_control_nothing_changed_names_nothing(project: Path, capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    """Another process writing into a shared cache directory and the temporary directory while
    the two runs happen; each run writes a scratch file of its own there: no cause."""
    _record()
    shared = Path(tempfile.gettempdir()) / f"envlock-shared-{os.getpid()}"
    shared.mkdir(exist_ok=True)
    try:
        (shared / "other.bin").write_bytes(os.urandom(64))
        (tmp_path / "cache" / "other.bin").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cache" / "other.bin").write_bytes(os.urandom(64))
        assert main(["record", "again.record", "--", sys.executable, "train.py"]) == 0
    finally:
        for p in shared.iterdir():
            p.unlink()
        shared.rmdir()
    cmp = compare_records(load("run.record"), load("again.record"))
    assert cmp.same and cmp.reads == () and cmp.not_seen == ()


def test_a_record_without_a_trace_replays_and_says_what_was_not_looked_at(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record written before the trace (or with --no-trace) has no [reads]: it reads,
    replays, and the verdict says once that the run's reads were not compared instead of
    claiming that nothing differs."""
    _record("--no-trace")
    rec = load("run.record")
    assert rec.reads is None and "determinism.flush_denormal" not in rec.context
    assert "[reads]" not in Path("run.record").read_text()
    code, text, _ = _replay(capsys)
    assert code == 0 and text.startswith("OK")
    (project / "local.json").write_text(json.dumps({"shift": 0.001}))
    code, text, doc = _replay(capsys)
    assert code == 1 and doc["reads"] == []
    assert doc["not_seen"] == ["what the run read: no trace in the original record"]
    assert "nondeterministic" not in text
    assert text.count("not looked at: what the run read: no trace in the original record") == 1


def test_twin_with_every_read_compared_the_verdict_says_nothing_differs(tmp_path: Path) -> None:
    """Two traced records that diverge with nothing different: the plain verdict, since
    everything the run read was compared."""
    from test_replay_record import rec

    from envlock.replay.record import Reads

    a = rec([1.0], reads=Reads(processes=1))
    b = rec([2.0], reads=Reads(processes=1))
    text = replay_text(compare_records(a, b), "run.record")
    assert "a nondeterministic operation or a changed input" in text and "not looked at" not in text
    # Its twin: the same runs, the original without a trace.
    text = replay_text(compare_records(rec([1.0]), b), "run.record")
    assert "nondeterministic" not in text and "not looked at: what the run read" in text


def test_a_child_that_is_not_python_is_named_as_not_traced(project: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (project / "train.py").write_text(SCRIPT + "subprocess.run(['cat', 'child.txt'], check=True)\n")
    _record()
    reads = load("run.record").reads
    assert reads is not None and reads.untraced == ["cat"]
    (project / "child.txt").write_text("five!")
    _, text, doc = _replay(capsys)
    assert "not looked at: what these programs read, not Python, not traced: cat" in text
    assert doc["not_seen"] == ["what these programs read, not Python, not traced: cat"]


def test_a_secret_variable_is_kept_as_a_digest_never_its_value(project: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "hf_" + "Zq8" * 12
    (project / "train.py").write_text(SCRIPT + "os.environ.get('MYLAB_API_TOKEN'); os.getenv('DATA_SPLIT')\n")
    monkeypatch.setenv("MYLAB_API_TOKEN", secret)
    monkeypatch.setenv("DATA_SPLIT", "train-2024")
    _record()
    text = Path("run.record").read_text()
    assert secret not in text and secret[:12] not in text
    reads = load("run.record").reads
    assert reads is not None and reads.variables["MYLAB_API_TOKEN"].startswith("sha256:")
    assert len(reads.variables["MYLAB_API_TOKEN"]) == len("sha256:") + 16
    # Over-redaction twin: an ordinary value is kept as it is.
    assert reads.variables["DATA_SPLIT"] == "train-2024"


def test_a_file_over_the_cap_is_sampled_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import envlock.replay.reads as reads_module

    big = tmp_path / "big.bin"
    big.write_bytes(b"a" * 4096)
    monkeypatch.setattr(reads_module, "MAX_HASHED", 1024)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    found = hash_files([str(big)])[str(big)]
    assert found.sha256 is None and found.sample_sha256 and found.size == 4096
    assert MAX_HASHED == 256 * 1024 * 1024


def test_the_hook_is_left_out_of_pythonpath() -> None:
    hook = trace.hook_dir()
    assert without_trace_hook(os.pathsep.join([hook, "/src", "/x"]), hook) == os.pathsep.join(["/src", "/x"])
    assert without_trace_hook("/src", hook) == "/src"


TORCH_SCRIPT = """
import json, os, torch, envlock
hp = json.load(open("hp.json"))
torch.set_flush_denormal(hp["flush"])
w = torch.load(os.path.join(os.environ["TORCH_HOME"], "hub", "checkpoints", "backbone.pth"))
envlock.record(0, loss=float(w.sum()) + float(torch.tensor(3e-39) * 2) * 1e38)
"""


def test_a_checkpoint_and_flush_denormal_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(TORCH_SCRIPT)
    (root / "hp.json").write_text(json.dumps({"flush": False}))
    home = tmp_path / "torchhome"
    (home / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(torch.ones(4), home / "hub" / "checkpoints" / "backbone.pth")
    monkeypatch.chdir(root)
    monkeypatch.setenv("TORCH_HOME", str(home))
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    _record()
    rec = load("run.record")
    assert rec.context.get("determinism.flush_denormal") is False
    assert rec.context.get("determinism.default_dtype") == "float32"
    torch.save(torch.full((4,), 2.0), home / "hub" / "checkpoints" / "backbone.pth")
    (root / "hp.json").write_text(json.dumps({"flush": True}))
    code, _, doc = _replay(capsys)
    assert code == 1
    names = {r["name"] for r in doc["reads"]}
    assert names == {"hp.json", str(home / "hub" / "checkpoints" / "backbone.pth")}, names
    assert {"key": "determinism.flush_denormal", "original": False, "replay": True,
            "ranks": []} in doc["context"]


def test_the_hook_defers_every_stat_and_hash_to_the_end_of_the_run(tmp_path: Path) -> None:
    """The audit hook runs on every open of the traced process, so what it does there is its
    cost: it notes the path in a set and nothing more. Every stat, hash and read of a noted
    file waits for the end of the run, once per path however often it was opened (counted
    here on the functions that do them). The wall-clock figure is the benchmark's
    (benchmarks/trace.py), never a test's."""
    code = f"""
import hashlib, os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
paths = [os.path.join({str(tmp_path)!r}, f'f{{i}}.txt') for i in range(3)]
for p in paths:
    open(p, 'w').write('x')
counts = {{}}
def counted(mod, name):
    real = getattr(mod, name)
    def wrapper(*a, **k):
        counts[name] = counts.get(name, 0) + 1
        return real(*a, **k)
    setattr(mod, name, wrapper)
for name in ('stat', 'lstat', 'fstat', 'open', 'scandir', 'listdir'):
    counted(os, name)
for name in ('sha256', 'new', 'file_digest'):
    if hasattr(hashlib, name):
        counted(hashlib, name)
from envlock.probe import trace  # after: an alias it takes at import is a counted one
tracer = trace.start({str(tmp_path)!r})
counts.clear()
for _ in range(200):
    for p in paths:
        with open(p, 'rb') as fh:
            fh.read()
print(sum(counts.values()), sorted(set(tracer.read) & set(paths)) == sorted(paths))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "True"], out


WORKERS = """
import multiprocessing as mp
import envlock

def work(name, out):
    out.put(len(open(name).read()))

if __name__ == "__main__":
    got = []
    for method, name in (("spawn", "spawned.txt"), ("fork", "forked.txt")):
        ctx = mp.get_context(method)
        out = ctx.Queue()
        worker = ctx.Process(target=work, args=(name, out))  # as a DataLoader starts its workers
        worker.start()
        got.append(out.get())
        worker.join()
    envlock.record(0, loss=float(sum(got)))
"""


def test_dataloader_style_workers_are_traced_spawned_and_forked(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes read the data: a spawned one traces itself through the start-up hook,
    a forked one keeps a trace of its own and writes it when multiprocessing ends it (a worker
    killed by a signal, as ``Pool.terminate`` does, writes none)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(WORKERS)
    (root / "spawned.txt").write_text("a")
    (root / "forked.txt").write_text("bb")
    monkeypatch.chdir(root)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    _record()
    reads = load("run.record").reads
    assert reads is not None and {"spawned.txt", "forked.txt"} <= set(reads.files)
    assert reads.processes >= 3


def test_the_start_up_hook_hands_on_to_the_environments_sitecustomize(tmp_path: Path) -> None:
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    (tmp_path / "traces").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([trace.hook_dir(), str(own)]),
           "ENVLOCK_TRACE": str(tmp_path / "traces")}
    out = subprocess.run([sys.executable, "-c", "import os, sys; print(os.environ.get('SITE_RAN'), "
                          "'_envlock_trace' in sys.modules)"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["yes", "True"]
    assert len(list((tmp_path / "traces").glob("*.json"))) == 1
    # Without ENVLOCK_TRACE the hook only hands on.
    del env["ENVLOCK_TRACE"]
    out = subprocess.run([sys.executable, "-c", "import os, sys; print(os.environ.get('SITE_RAN'), "
                          "'_envlock_trace' in sys.modules)"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["yes", "False"]


def test_a_variable_is_read_by_name_not_by_copying_the_environment(tmp_path: Path) -> None:
    """``{**os.environ, ...}``, ``dict(os.environ)``, ``.copy()``, ``.items()`` (a child started
    with one more variable) read no variable by name: every variable of the shell would
    otherwise be a cause. ``[]``, ``.get``, ``getenv`` and ``in`` do."""
    code = f"""
import json, os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from envlock.probe import trace
t = trace.start({str(tmp_path)!r})
os.environ.copy(); dict(os.environ); list(os.environ.items()); list(os.environ.values())
child = {{**os.environ, "EXTRA": "1"}}
{{}}.update(os.environ)
os.environ.get("TRACE_A"); os.getenv("TRACE_B"); "TRACE_C" in os.environ; os.environ["TRACE_D"]
print(json.dumps(t.env))
"""
    env = {**os.environ, "TRACE_B": "b", "TRACE_D": "d", "UNRELATED": "x"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == {"TRACE_A": None, "TRACE_B": "b", "TRACE_C": None, "TRACE_D": "d"}


def test_a_variable_looked_up_in_a_copy_of_the_environment_is_read(tmp_path: Path) -> None:
    """``env = os.environ.copy()`` then ``env.get("LR")`` (a config helper that takes a mapping)
    reads ``LR``: a replay with another ``LR`` diverged naming nothing. A key the run set or
    removed in its copy is its own, not the environment's; the copy still goes whole to a child,
    pickles and deep-copies as a plain dict (a spawned process's arguments), going over it
    (``dict(copy)``, putting a saved environment back with ``os.environ.update``, as
    ``mock.patch.dict`` does) reads none of its variables, and ``os.environb``/``os.getenvb`` are
    lookups by name too."""
    code = f"""
import copy, json, os, pickle, subprocess, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from envlock.probe import trace
t = trace.start({str(tmp_path)!r})
env = os.environ.copy()
env["MINE"] = "b"; env.update(ALSO="c"); env.pop("GONE", None)
assert env.get("LR") == "0.2" and env["MINE"] == "b" and "ABSENT" not in env and env.get("GONE") is None
assert env.get("ALSO") == "c" and env.copy().get("WD") == "1e-4"
assert type(pickle.loads(pickle.dumps(env))) is dict and copy.deepcopy(env) == dict(env)
dict(env); {{**env}}; json.dumps(env); [env[k] for k in env]
subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
saved = os.environ.copy(); os.environ.clear(); os.environ.update(saved)  # a saved environment put back
from unittest import mock
with mock.patch.dict(os.environ, {{"PATCHED": "1"}}):
    pass
os.environb.get(b"BYTES_A"); os.getenvb(b"BYTES_B")
print(json.dumps(t.env))
"""
    env = {**os.environ, "LR": "0.2", "MINE": "a", "GONE": "x", "WD": "1e-4", "BYTES_B": "b"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    found = json.loads(out)
    found.pop("PATH", None)  # the child's program is looked up on the copy's PATH
    assert found == {"LR": "0.2", "ABSENT": None, "WD": "1e-4", "BYTES_A": None, "BYTES_B": "b"}


def test_a_sqlite_database_the_run_read_is_a_read_and_one_it_wrote_is_its_own(tmp_path: Path) -> None:
    """sqlite opens its file in C, with no ``open`` event: a label index or a dataset kept in a
    SQLite file was never seen. The ``sqlite3.connect`` event names it; one whose stat the run
    changed (a tracking store such as MLflow's, written at every run) is the run's own output,
    never a cause; ``:memory:`` is no file."""
    import sqlite3

    for name in ("labels.db", "runs.db"):
        with sqlite3.connect(tmp_path / name) as con:
            con.execute("create table t(x)")
            con.execute("insert into t values (1)")
        con.close()
    code = f"""
import json, os, sqlite3, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from envlock.probe import trace
t = trace.start({str(tmp_path)!r})
os.chdir({str(tmp_path)!r})
con = sqlite3.connect("labels.db"); con.execute("select x from t").fetchall(); con.close()
con = sqlite3.connect("file:runs.db", uri=True); con.execute("insert into t values (2)"); con.commit(); con.close()
sqlite3.connect(":memory:").close()
doc = t.document()
print(json.dumps([doc["read"], doc["written"]]))
"""
    read, written = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                              check=True).stdout)
    assert str(tmp_path / "labels.db") in read and str(tmp_path / "runs.db") not in read
    assert str(tmp_path / "runs.db") in written and not any("memory" in p for p in read + written)


def test_the_launchers_variables_are_no_cause(tmp_path: Path) -> None:
    """torchrun picks a free MASTER_PORT for each run, Slurm a job id: a run reads them, and
    they differ between any two runs; the variables around them are kept."""
    from envlock.replay.reads import collect

    traces = tmp_path / "journal" / "trace"
    traces.mkdir(parents=True)
    env = {"MASTER_PORT": "29517", "MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RUN_ID": "x1",
           "SLURM_JOB_ID": "4242", "LOCAL_RANK": "0", "LR": "0.1", "DATA_ROOT": None}
    (traces / "100.json").write_text(json.dumps({"pid": 100, "ppid": 1, "env": env, "read": [],
                                                 "written": [], "spawned": [], "stdlib": []}))
    reads, _ = collect(traces, tmp_path)
    assert reads.variables == {"LR": "0.1"} and reads.unset == ["DATA_ROOT"]


def test_a_run_traced_only_from_its_first_record_call_says_what_was_not_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the start-up hook (a container's run; here ``python -I``, which ignores
    PYTHONPATH) the trace starts at the first ``envlock.record`` call: a variable read before
    is not in it, and a divergence it caused must not be called "no difference in ... anything
    the run read" but said to be unseen."""
    (tmp_path / "train.py").write_text(
        "import os\nimport envlock\nlr = float(os.environ.get('LR', '0.1'))\n"
        "for step in range(2):\n    envlock.record(step, loss=1.0 - lr * step)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LR", raising=False)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["record", "run.record", "--", sys.executable, "-I", "train.py"]) == 0
    reads = load(tmp_path / "run.record").reads
    assert reads is not None and reads.late == 1 and "LR" not in reads.variables
    monkeypatch.setenv("LR", "0.2")
    capsys.readouterr()
    assert main(["replay", "run.record", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["divergences"] and any("before its first envlock.record() call" in n for n in doc["not_seen"])
    assert main(["replay", "run.record"]) == 1
    out = capsys.readouterr().out
    assert "nondeterministic" not in out and "not looked at: what the run read before its first" in out
    # Its twin, with the hook: the variable is named and nothing is said to be unseen.
    monkeypatch.delenv("LR")
    assert main(["record", "hooked.record", "--", sys.executable, "train.py"]) == 0
    monkeypatch.setenv("LR", "0.2")
    capsys.readouterr()
    assert main(["replay", "hooked.record", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["not_seen"] == [] and [r["name"] for r in doc["reads"]] == ["LR"]


def test_the_compile_caches_kernels_are_no_read_but_a_file_beside_them_is(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's kernels, read back from its cache (gcc, not traced, wrote them), are named by
    their contents in a directory a cold compile fills anew: ``compile.caches.*`` compares
    them, and a replay named each one as a changed read before (a cold cache's path is new
    every time). The cache a process was pointed at, and torch's default one, are left out;
    a file beside them is kept."""
    from envlock.replay.reads import collect

    cache, default = tmp_path / "inductor", tmp_path / "tmp" / "torchinductor_x"
    kernel, other = cache / "ab" / "cabc.main.so", default / "fx" / "graph"
    beside = tmp_path / "weights.bin"
    for path in (kernel, other, beside):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("USER", "x")
    monkeypatch.setenv("LOGNAME", "x")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    import tempfile as tf

    monkeypatch.setattr(tf, "tempdir", None)  # gettempdir() reads TMPDIR again
    traces = tmp_path / "journal" / "trace"
    traces.mkdir(parents=True)
    doc = {"pid": 10, "ppid": 1, "python": True, "executable": sys.executable, "argv": ["train.py"],
           "read": [str(kernel), str(other), str(beside)], "written": [],
           "env": {"TORCHINDUCTOR_CACHE_DIR": str(cache)}, "spawned": [], "state": None, "stdlib": []}
    (traces / "10.json").write_text(json.dumps(doc))
    reads, _ = collect(traces, tmp_path / "project")
    assert list(reads.files) == [str(beside)]


def test_a_containers_reads_map_the_workspace_and_never_hash_a_host_file_for_another(tmp_path: Path) -> None:
    """A container's run names the container's paths: one under its workspace is the
    workspace's file here; the image's environment is proven by the check inside; any other
    file (a dataset mounted only there, a library in the image) exists only in the container,
    and a file of the same path here holds other bytes: never hashed here, counted, and said in
    the verdict instead of "no difference in anything the run read"."""
    from envlock.replay.reads import collect

    base = tmp_path / "project"
    (base / "config").mkdir(parents=True)
    (base / "config" / "hparams.json").write_text("{}")
    traces = tmp_path / "journal" / "trace"
    traces.mkdir(parents=True)
    here = "/etc/hostname" if os.path.exists("/etc/hostname") else sys.executable  # exists on this host too
    doc = {"pid": 7, "ppid": 1, "python": True, "executable": "/usr/bin/python3", "argv": ["train.py"],
           "read": ["/workspace/config/hparams.json", "/usr/lib/python3/dist-packages/numpy/__init__.py",
                    "/opt/venv/lib/python3.11/site-packages/torch/__init__.py", "/envlock-record/journal",
                    here, "/data/shard-000.bin"],
           "written": [], "env": {}, "spawned": [], "state": None, "stdlib": [], "late": True}
    (traces / "7.json").write_text(json.dumps(doc))
    reads, _ = collect(traces, base, inside="/workspace")
    assert list(reads.files) == ["config/hparams.json"] and reads.unhashed == 2 and reads.late == 1
    # Its twin on the host: the same file of this machine is hashed.
    doc.update(read=[here], late=False)
    (traces / "7.json").write_text(json.dumps(doc))
    reads, _ = collect(traces, base)
    assert list(reads.files) == [here] and reads.unhashed is None


def test_the_verdict_says_what_a_containers_run_read_and_no_record_could_compare() -> None:
    from datetime import datetime, timezone

    from envlock.replay.compare import not_seen
    from envlock.replay.record import Meta, Reads, Record, Step

    def rec(reads: Reads) -> Record:
        meta = Meta(tool_version="0", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                    where="container", command=["python", "train.py"], exit_code=0)
        return Record(record=meta, reads=reads, steps=[Step(step=0, metrics={"loss": 0.5})])

    said = not_seen(rec(Reads(processes=1, unhashed=3, late=1)), rec(Reads(processes=1)))
    assert any("3 in the original" in n and "only the container holds" in n for n in said)
    assert any("before its first envlock.record() call" in n for n in said)
    assert not_seen(rec(Reads(processes=1)), rec(Reads(processes=1))) == []


def test_replay_json_is_one_document_when_the_script_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    """A training script prints (progress, a final loss): with ``replay --json`` those lines
    went to envlock's stdout before the document, which then did not parse. They go to stderr;
    without ``--json`` they stay on stdout (the twin)."""
    (tmp_path / "train.py").write_text(
        "import envlock\nfor step in range(2):\n    print('epoch', step)\n    envlock.record(step, loss=0.5)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["record", "run.record", "--", sys.executable, "train.py"]) == 0
    capfd.readouterr()
    assert main(["replay", "run.record", "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["same"] is True and "epoch 1" in err
    assert main(["replay", "run.record"]) == 0
    out, _ = capfd.readouterr()
    assert "epoch 1" in out and "OK: the replay reproduced" in out


def test_the_hook_goes_in_front_of_the_commands_own_pythonpath() -> None:
    """A recorded run's ``PYTHONPATH`` is the hook's directory, then what the command would have
    had (this host's, the image's or one given with ``-e``): never in its place, never with an
    empty entry (the current directory) when there was none, and the probe's rule takes the
    hook out again, so that no record shows it."""
    from envlock.commands._recording import recording_env

    hook = trace.container_hook_dir()
    env = recording_env("/r/journal.jsonl", "/workspace", "/r/trace", hook=hook, pythonpath="/opt/a:/opt/b")
    assert env["PYTHONPATH"] == f"{hook}:/opt/a:/opt/b" and env[trace.HOOK_ENV] == hook
    assert without_trace_hook(env["PYTHONPATH"], hook) == "/opt/a:/opt/b"
    for none in (None, ""):
        assert recording_env("/r/j", "/w", "/r/trace", hook=hook, pythonpath=none)["PYTHONPATH"] == hook
    assert "PYTHONPATH" not in recording_env("/r/j", "/w", None, hook=hook, pythonpath="/opt/a")


def test_a_containers_copy_of_the_hook_traces_a_process_from_its_start(tmp_path: Path) -> None:
    """A container holds no envlock: ``run --record`` mounts a copy of the hook's files, and a
    Python process started with it on ``PYTHONPATH`` traces itself from its first line (a file
    read before any ``envlock.record`` call is in its trace, which is not ``late``), keeps the
    rest of its ``PYTHONPATH`` (a module found there), and hands on to the ``sitecustomize``
    that was there before. Run here from the copy alone, in an interpreter that ignores the
    user's site-packages."""
    from envlock.commands._recording import container_hook

    journal = tmp_path / "journal"
    (journal / "trace").mkdir(parents=True)
    (source, inside, read_only), hook = container_hook(journal)
    assert (inside, read_only, hook) == (trace.CONTAINER_DIR, True, trace.CONTAINER_DIR + "/startup")
    assert sorted(p.relative_to(source).as_posix() for p in Path(source).rglob("*.py")) == [
        "startup/sitecustomize.py", "trace.py"]
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = '1'\n")
    (own / "extra.py").write_text("K = 3\n")
    (tmp_path / "cfg.json").write_text('{"lr": 0.1}')
    script = ("import json, os, extra\njson.load(open('cfg.json'))\nos.environ.get('LR')\n"
              "assert os.environ['CHAINED'] == '1' and extra.K == 3\n")
    env = {"PATH": os.environ.get("PATH", ""), "ENVLOCK_TRACE": str(journal / "trace"),
           "PYTHONPATH": os.pathsep.join([str(Path(source) / "startup"), str(own)])}
    done = subprocess.run([sys.executable, "-s", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (doc,) = [json.loads(p.read_text()) for p in (journal / "trace").glob("*.json")]
    assert doc["late"] is False and str(tmp_path / "cfg.json") in doc["read"]
    assert str(own / "extra.py") in doc["read"] and doc["env"]["LR"] is None
