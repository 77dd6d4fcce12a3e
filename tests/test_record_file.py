"""Writing a replay record: what the command line may leave in it (credentials are scrubbed
with the lock's rules, ordinary words stay), what is refused before the command runs rather
than after it (a record path that cannot be written, a word or path the record cannot hold, a
metric name at the ``envlock.record`` call that passes it), and the file written with the
lock's atomic write."""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers import REPO, make_lock

from envlock.commands import main
from envlock.errors import LockInvalid
from envlock.replay.record import Meta, Record, dumps, load, loads, save

# Token shapes the lock's scrub knows (probe/scrub.py): a Hugging Face token, a URL's password.
HF_TOKEN = "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF"
PASSWORD = "s3cr3t-Passw0rd"
URL = f"https://alice:{PASSWORD}@data.example.org/shards/train-000.tar"
# A value only the environment says is a secret (its variable's name does).
SECRET_VALUE = "q9Zr4LmX2vT8wKp1"
# Prints its arguments into argv.json: the command must get every word as typed.
ECHO = "import json, sys; json.dump(sys.argv[1:], open('argv.json', 'w'))"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path


def _argv(here: Path) -> list[str]:
    return list(json.loads((here / "argv.json").read_text()))


# -- credentials on the command line (issue: a record is meant to be shared) ----------------------


def test_a_token_a_url_password_and_a_secret_value_stay_out_of_the_record(
        here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", SECRET_VALUE)
    words = ["--token", HF_TOKEN, "--data", URL, f"--wandb-key={SECRET_VALUE}"]
    assert main(["record", "run.record", "--", sys.executable, "-c", ECHO, *words]) == 0
    assert _argv(here) == words  # the command itself ran with them
    text = (here / "run.record").read_text()
    for secret in (HF_TOKEN, PASSWORD, SECRET_VALUE):
        assert secret not in text
    assert load(here / "run.record").record.command[3:] == [
        "--token", "<redacted>", "--data", "https://data.example.org/shards/train-000.tar",
        "--wandb-key=<redacted>"]


def test_ordinary_words_of_the_command_are_recorded_as_typed(here: Path) -> None:
    # The over-redaction twin: paths, options with values, an e-mail-like word, a URL without
    # credentials, a long hex digest and a run name that merely starts like a token.
    words = ["--lr=0.1", "--data", "/scratch/experiments/run-1/data", "--out=./ckpt", "-k", "key=value",
             "https://data.example.org/shards/train-000.tar", "bob@example.org", "a" * 64,
             "sk-learn-baseline-2024", "--seed", "42"]
    assert main(["record", "run.record", "--", sys.executable, "-c", ECHO, *words]) == 0
    assert load(here / "run.record").record.command[3:] == words


def test_a_record_whose_command_lost_a_credential_is_not_replayed_as_recorded(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "run.record", "--", sys.executable, "-c", ECHO, "--token", HF_TOKEN]) == 0
    (here / "argv.json").unlink()
    capsys.readouterr()
    assert main(["replay", "run.record"]) == 2
    assert "had a credential removed when it was recorded" in capsys.readouterr().err
    assert not (here / "argv.json").exists()
    # Given again, with the credential, it runs (and is compared as usual).
    assert main(["replay", "run.record", "--", sys.executable, "-c", ECHO, "--token", HF_TOKEN]) == 0
    assert _argv(here) == ["--token", HF_TOKEN]


def test_a_record_that_carries_a_credential_is_refused_as_a_lock_would_be() -> None:
    meta = Meta(tool_version="0.1.0", created_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
                where="host", command=["python", "train.py", "--token", "TOKEN"], exit_code=0)
    text = dumps(Record(record=meta)).replace('"TOKEN"', json.dumps(HF_TOKEN))
    with pytest.raises(LockInvalid, match=r"record\.command\.3: .*credentials"):
        loads(text)


# -- refused before the command runs, not after it -------------------------------------------------


def _refused(here: Path, capsys: pytest.CaptureFixture[str], *args: str, tail: tuple[str, ...] = ()) -> str:
    """Runs ``envlock ARGS -- python -c <touch ran> TAIL``; asserts exit 2 and that nothing ran."""
    marker = here / "ran"
    code = main([*args, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')", *tail])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not marker.exists(), "the command ran before the refusal"
    assert "Traceback" not in err
    return err


def test_a_record_path_that_cannot_be_written_is_refused_before_the_run(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(here, capsys, "record", "no/such/dir/run.record")
    assert "directory no/such/dir does not exist" in err
    (here / "adir").mkdir()
    assert "is a directory" in _refused(here, capsys, "record", "adir")
    # One wrong word must not cost the user a file that is not a record.
    script = here / "train.py"
    script.write_text("print('my training script')\n")
    assert "refusing to overwrite train.py: it is not a replay record" in _refused(here, capsys, "record", "train.py")
    assert script.read_text() == "print('my training script')\n"


def test_run_record_checks_its_record_path_before_the_image_is_built(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_lock().save(here / "env.lock")
    err = _refused(here, capsys, "run", "env.lock", "--record", "missing/run.record", "--engine",
                   "unix:///nonexistent.sock")
    assert "directory missing does not exist" in err


def test_a_long_argument_is_recorded_and_one_the_record_cannot_hold_is_refused_first(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.dumps({"layers": [{"width": 4096, "name": f"block-{i}"} for i in range(200)]})
    assert len(config) > 6000
    assert main(["record", "run.record", "--", sys.executable, "-c", ECHO, config]) == 0
    assert load(here / "run.record").record.command[-1] == config
    err = _refused(here, capsys, "record", "esc.record", tail=("--colour", "\x1b[31m"))
    assert "word 5 of the command (\\x1b[31m) cannot be recorded: it holds a control character" in err
    err = _refused(here, capsys, "record", "out.record", "--output", "model\r.pt")
    assert "--output (model\\r.pt) cannot be recorded" in err
    assert not (here / "esc.record").exists() and not (here / "out.record").exists()


def test_a_metric_name_the_record_refuses_fails_at_the_call(
        here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import envlock

    journal = here / "journal.jsonl"
    monkeypatch.setenv("ENVLOCK_RECORD", str(journal))
    for bad in ("λ", "train loss", "x" * 129, "0loss"):
        with pytest.raises(ValueError, match=re.escape(f"metric name {bad!r} cannot be recorded")):
            envlock.record(0, **{"loss": 1.0, bad: 1.0})
    assert not journal.exists()  # nothing of a refused call was written
    monkeypatch.setenv("RANK", "1")  # every rank refuses it, not only the one that records
    with pytest.raises(ValueError, match="metric name 'a b'"):
        envlock.record(0, **{"a b": 1.0})


def test_a_run_that_passes_a_bad_metric_name_keeps_the_steps_before_it(here: Path) -> None:
    script = ("import envlock\nenvlock.record(0, loss=0.5)\nenvlock.record(1, **{'val loss': 0.4})\n")
    assert main(["record", "run.record", "--", sys.executable, "-c", script]) == 1
    r = load(here / "run.record")
    assert r.record.exit_code == 1 and [s.step for s in r.steps] == [0]


# -- the file, written with the lock's atomic write ----------------------------------------------


def _record() -> Record:
    return Record(record=Meta(tool_version="0.1.0", created_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
                              where="host", command=["python", "train.py"], exit_code=0))


def test_save_does_not_write_through_a_file_planted_at_a_predictable_temp_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    target = tmp_path / "run.record"
    os.symlink(victim, f"{target}.tmp-{os.getpid()}")
    save(_record(), target)
    assert victim.read_text() == "keep me\n"
    assert load(target).record.command == ["python", "train.py"]


def test_save_keeps_an_existing_records_mode_and_updates_a_links_target(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    real = shared / "run.record"
    save(_record(), real)
    real.chmod(0o640)
    link = tmp_path / "run.record"
    link.symlink_to(real)
    save(_record(), link)
    assert link.is_symlink() and (real.stat().st_mode & 0o777) == 0o640
    assert load(real).record.command == ["python", "train.py"]
    assert not [p for p in shared.iterdir() if p.name != "run.record"]  # no temp file left


# -- the schema version, read before the model ---------------------------------------------------


def test_a_record_of_a_newer_schema_asks_for_a_newer_envlock_not_for_a_field(tmp_path: Path) -> None:
    # A newer envlock's record has fields this one does not know: the version is the answer.
    text = dumps(_record()).replace("schema_version = 1", "schema_version = 2")
    text += "\n[future]\nfact = 1\n"
    with pytest.raises(LockInvalid, match=r"run.record uses record schema 2; this envlock \(.*\) reads up to 1") as caught:
        loads(text, "run.record")
    assert caught.value.hint == "upgrade envlock"


def test_a_record_of_a_schema_no_envlock_wrote_is_refused_by_its_number() -> None:
    text = dumps(_record()).replace("schema_version = 1", "schema_version = 0")
    with pytest.raises(LockInvalid, match="record schema 0, which no envlock wrote; this one reads schema 1"):
        loads(text, "run.record")


def test_a_record_of_the_current_schema_reads_through_the_version_registry() -> None:
    from envlock.replay.record import READERS, RECORD_SCHEMA_VERSION, seal

    assert READERS[RECORD_SCHEMA_VERSION] is Record
    assert loads(dumps(seal(_record())), "run.record") == seal(_record())
