"""The build-log parser on streams recorded from real builds (``tests/fixtures/buildlogs/``).

The streams were recorded with envlock's own engine (``fixtures/buildlogs/record.py``), on Docker
and on Podman (``podman-*``): one build that succeeds, one where pip fails and says why, one where
a command fails silently. The parser reads them exactly as ``DockerEngine.build`` does, with
nothing faked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.restore.buildlog import LOG_TAIL_LINES, BuildLog, Step, parse

FIXTURES = Path(__file__).parent / "fixtures" / "buildlogs"
ANSI = re.compile(r"\x1b\[")
NOISE = ("--->", "Running in", "Removing intermediate container", "Using cache")


def recorded(case: str) -> list[dict[str, Any]]:
    lines = (FIXTURES / f"{case}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_a_successful_build_gives_every_step_and_the_final_image() -> None:
    chunks = recorded("ok")
    log, events = parse(chunks)
    steps = [e for e in events if isinstance(e, Step)]
    assert [(s.number, s.total) for s in steps] == [(n, 11) for n in range(1, 12)]
    assert steps[0].text.startswith("FROM ") and steps[-1].text == "LABEL org.envlock.fixture=ok"
    # The last image the engine announced is the build's result, not the first stage's.
    first, *_, final = [c["aux"]["ID"] for c in chunks if "aux" in c]
    assert log.image_id == final and final != first
    built = next(c["stream"] for c in chunks if c.get("stream", "").startswith("Successfully built"))
    assert final.removeprefix("sha256:").startswith(built.split()[-1])
    assert log.error is None and log.summary() is None
    assert "coloured line" in log.tail and "second line" in log.tail
    assert not any(ANSI.search(line) or line.lstrip().startswith(NOISE) for line in log.tail)


def test_the_log_file_gets_every_line_without_colour() -> None:
    chunks = recorded("ok")
    log = BuildLog()
    text = "".join(log.feed(c).log for c in chunks)
    assert "\x1b" not in text and any("\x1b[32mcoloured" in str(c.get("stream")) for c in chunks)
    assert "coloured line\nsecond line\n" in text
    assert "Successfully tagged envlock-fixture/buildlog:ok\n" in text
    assert text.count("Removing intermediate container") == 7  # noise stays in the file


@pytest.mark.parametrize("engine", ["", "podman-"])
def test_a_failing_pip_is_reported_with_its_own_error_line_and_step(engine: str) -> None:
    chunks = recorded(f"{engine}pip-fails")
    log, events = parse(chunks)
    assert log.step is not None and (log.step.number, log.step.total) == (4, 6)
    assert str(log.step).startswith('4/6: RUN ["env", "PIP_BREAK_SYSTEM_PACKAGES=1"')
    assert [e.number for e in events if isinstance(e, Step)] == [1, 2, 3, 4]  # step 5 never ran
    assert log.image_id is None
    summary = log.summary()
    assert summary is not None
    assert summary.startswith('image build failed at step 4/6: RUN ["env", "PIP_BREAK_SYSTEM_PACKAGES=1", ')
    assert summary.endswith("...: ERROR: No matching distribution found for six==9.9.9")
    assert log.error == chunks[-1]["error"].rstrip() and list(log.tail)[-1] == log.error
    assert "before the install" in log.tail


def test_a_silent_failure_is_reported_with_the_engines_message() -> None:
    log, _ = parse(recorded("command-fails"))
    engine_says = "The command 'sh -c echo working; exit 3' returned a non-zero code: 3"
    assert log.error == engine_says
    assert log.summary() == f'image build failed at step 2/3: RUN ["sh", "-c", "echo working; exit 3"]: {engine_says}'
    assert list(log.tail) == ["working", engine_says]


def test_podman_numbers_the_steps_of_each_stage_and_ends_its_messages_with_a_newline() -> None:
    log, events = parse(recorded("podman-ok"))
    steps = [(s.number, s.total) for s in events if isinstance(s, Step)]
    assert steps == [(n, 4) for n in range(1, 5)] + [(n, 7) for n in range(1, 8)]
    assert log.image_id is not None and log.image_id.startswith("sha256:4ac98032648")
    assert log.error is None and "coloured line" in log.tail
    assert not any(line.startswith(("-->", "[1/2] STEP", "[2/2] STEP")) for line in log.tail)
    failed, _ = parse(recorded("podman-command-fails"))
    engine_says = 'building at STEP "RUN sh -c echo working; exit 3": while running runtime: exit status 3'
    assert failed.summary() == f'image build failed at step 2/3: RUN ["sh", "-c", "echo working; exit 3"]: {engine_says}'
    assert list(failed.tail) == ["working", engine_says]


@pytest.mark.parametrize("engine", ["", "podman-"])
def test_the_images_a_build_committed_are_known_and_none_it_found(engine: str) -> None:
    """What an interrupted build must take away: the images its steps committed, never the
    base a FROM names nor a step the builder found in its cache."""
    chunks = recorded(f"{engine}ok")
    log, _ = parse(chunks)
    ids = [m.group(1) for c in chunks for m in [re.match(r"^\s*-{2,3}> ([0-9a-f]+)\s*$", str(c.get("stream")))]
           if m]
    base_and_cached = {"211db7b59d4d", "c3842c9424c1"} if not engine else {"7ff9264e240"}
    assert base_and_cached <= set(ids)
    assert log.committed == [i for i in ids if i not in base_and_cached]
    # Docker names the FROM's base again in the second stage: it is still not this build's.
    assert ids.count("211db7b59d4d") == (0 if engine else 2) and len(log.committed) == 8
    assert log.committed[-1] == ("9c8635f51dce" if not engine else "4ac98032648")


def test_reading_stops_at_the_first_error_as_the_engine_does() -> None:
    chunks = recorded("command-fails")
    log, _ = parse([*chunks, {"stream": "Step 3/3 : RUN after\n"}, {"error": "second"}])
    assert log.error == chunks[-1]["error"] and log.step is not None and log.step.number == 2


def test_a_client_error_ends_the_build_like_an_error_chunk() -> None:
    log, _ = parse(recorded("ok")[:10])
    assert log.fail("Cannot connect to the engine") == "Cannot connect to the engine\n"
    assert log.summary() == ('image build failed at step 3/11: RUN ["python3", "-c", "import sys; '
                             'print(sys.version_info[:2])"]: Cannot connect to the engine')


@pytest.mark.parametrize("engine", ["buildkit-", "podman-cli-"])
def test_a_command_line_clients_build_gives_its_steps_and_output(engine: str) -> None:
    """``clibuild`` feeds the client's lines as chunks: BuildKit's vertices (``#5 [2/3] RUN``,
    timed output lines, its own status) and ``podman build``'s text read like the API streams."""
    log, events = parse(recorded(f"{engine}ok"))
    steps = [e for e in events if isinstance(e, Step)]
    assert steps and steps[0].text.startswith("FROM ")
    assert len(steps) == len(set(steps))  # a step BuildKit names again is one step
    assert log.error is None and log.summary() is None
    assert "coloured line" in log.tail and "second line" in log.tail
    lines = [e for e in events if isinstance(e, str)]
    assert "coloured line" in lines and not any(line.startswith("#") for line in lines)
    if engine == "buildkit-":
        # No step image: BuildKit commits none (nothing for an interrupted build to remove).
        assert log.committed == [] and not any("sha256:" in line or "DONE" in line for line in lines)
    else:  # Podman commits each step (its layer cache), as through its API
        assert len(log.committed) >= 5


@pytest.mark.parametrize("engine", ["buildkit-", "podman-cli-"])
def test_a_client_whose_pip_fails_is_reported_with_pips_error_line(engine: str) -> None:
    """The client's last line is its own failure message (``clibuild`` hands it to ``fail``);
    the cause shown is pip's, once, and BuildKit's summary that repeats the step's last lines
    adds nothing to the tail."""
    chunks = recorded(f"{engine}pip-fails")
    log, _ = parse(chunks)
    last = chunks[-1]["stream"].strip() or chunks[-2]["stream"].strip()
    log.fail(last)
    summary = log.summary()
    assert summary is not None and log.step is not None and log.step.text.startswith('RUN ["env", "PIP_')
    assert summary.endswith(": ERROR: No matching distribution found for six==9.9.9")
    tail = list(log.tail)
    assert tail.count("ERROR: No matching distribution found for six==9.9.9") == 1
    assert tail[-1] == last and "before the install" in tail
    assert not any(line.startswith(("------", " > [")) for line in tail)


def test_buildx_says_only_that_a_step_failed_and_pip_still_says_why() -> None:
    log, _ = parse([{"stream": "#5 [2/2] RUN x\n"}, {"stream": "#5 0.1 ERROR: No matching distribution\n"},
                    {"stream": "#5 ERROR: process did not complete successfully\n"}])
    log.fail("ERROR: failed to solve: process did not complete successfully: exit code: 1")
    assert log.summary() == "image build failed at step 2/2: RUN x: ERROR: No matching distribution"


# -- fuzz ---------------------------------------------------------------------------------------

_text = st.one_of(
    st.text(max_size=80),
    st.builds(lambda n, t, rest: f"{'Step' if n % 2 else 'STEP'} {n}/{t} : {rest}\n",
              st.integers(0, 999), st.integers(0, 999), st.text(max_size=20)),
    st.sampled_from(["\x1b[91mERROR: boom\n\x1b[0m", " ---> Running in abc\n", "error: x",
                     "Successfully built 0123456789ab\n", "\n", ""]),
    # BuildKit's plain progress (``clibuild``): vertices, steps, timed output, its own status.
    st.builds(lambda v, n, t, rest: f"#{v} [{'s ' if v % 2 else ''}{n}/{t}] {rest}\n",
              st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.text(max_size=20)),
    st.builds(lambda v, rest: f"#{v} 0.{v} {rest}\n", st.integers(0, 99), st.text(max_size=30)),
    st.sampled_from(["#5 ERROR: executor failed running [x]: exit code: 1\n", "------\n",
                     " > [2/2] RUN x:\n", "#9 writing image sha256:" + "a" * 64 + " done\n",
                     "#4 CACHED\n", "#5 0.2 \n", "ERROR: failed to solve: x\n"]),
)
_value = st.one_of(_text, st.none(), st.integers(), st.lists(st.integers(), max_size=2),
                   st.dictionaries(st.sampled_from(["ID", "message", "code"]), _text, max_size=2))
_chunk = st.dictionaries(st.sampled_from(["stream", "status", "aux", "error", "errorDetail", "id"]),
                         _value, max_size=3)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(_chunk, max_size=30))
def test_any_stream_is_read_without_crashing_and_keeps_its_promises(chunks: list[dict[str, Any]]) -> None:
    log, events = parse(chunks)
    assert len(log.tail) <= LOG_TAIL_LINES
    assert all(isinstance(e, Step) or (isinstance(e, str) and e and "\x1b[" not in e) for e in events)
    first_error = next((i for i, c in enumerate(chunks) if "error" in c or "errorDetail" in c), None)
    if first_error is None:
        assert log.error is None and log.summary() is None
    else:
        summary = log.summary()
        assert log.error is not None and summary is not None
        assert summary.startswith("image build failed") and list(log.tail)[-1] == log.error
        # Nothing after the error was read.
        assert log.step == parse(chunks[:first_error])[0].step
