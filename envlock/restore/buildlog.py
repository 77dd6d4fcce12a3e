"""Reading an image build's output: the engine's stream of chunks -> steps, lines, image, error.

The docker SDK's ``api.build(decode=True)`` yields dicts: ``{"stream": text}`` with the builder's
output (``Step 3/9 : RUN ...`` on Docker, ``[1/2] STEP 3/9: RUN ...`` on Podman, tools' output with
ANSI colours), ``{"aux": {"ID": ...}}`` with the image, ``{"error": ..., "errorDetail": ...}`` when
a step fails. A command-line client's output (``clibuild``) comes as ``{"stream": line}``:
Podman's reads like its API stream; BuildKit's plain progress numbers each vertex and prefixes
its lines (``#7 [2/5] RUN ...``, ``#7 0.512 <output>``, ``#7 DONE 1.2s``). This module only
reads them: no engine, no files, no terminal; so it is tested on streams recorded from real
builds (``tests/fixtures/buildlogs/``), and the engine writes the log file and drives the
progress display from what ``BuildLog.feed`` returns.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envlock.errors import BuildFailed

LOG_TAIL_LINES = 15
# Podman numbers the steps of each stage of a multi-stage build apart: "[2/2] STEP 3/7: ...".
_STEP_RE = re.compile(r"^(?:\[\d+/\d+\] )?(?:Step|STEP) (\d+)/(\d+) ?: ?(.*)$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Engine chatter between steps: nothing a user needs to see in a failure report.
_NOISE_RE = re.compile(r"^\s*(--->|-->|Removing intermediate container|Running in|Using cache)")
_BUILT_RE = re.compile(r"^Successfully built ([0-9a-f]{12,64})\s*$")
# The image a step ends with: " ---> 1a2b3c4d5e6f" (Docker), "--> 1a2b3c4d5e6" (Podman).
_IMAGE_RE = re.compile(r"^\s*-{2,3}> ([0-9a-f]{11,64})\s*$")
# pip and most tools say what went wrong in their last such line; the engine's own message only
# says that the command failed.
_CAUSE_PREFIXES = ("ERROR", "error:", "envlock:")
# ... but not buildx's own last line, which only says that a step failed.
_NOT_A_CAUSE_RE = re.compile(r"^ERROR: failed to (solve|build)\b")
# BuildKit's plain progress: a vertex's line, a step (``[stage 2/5]`` or ``[2/5]``; ``[internal]``
# is not one), a line of a step's output (after the seconds since it started), the image.
_BK_LINE_RE = re.compile(r"^#\d+ (.*)$")
_BK_STEP_RE = re.compile(r"^\[(?:[^\]\s]+ )?(\d+)/(\d+)\] (.*)$")
_BK_OUTPUT_RE = re.compile(r"^\d+\.\d+ (.*)$")
_BK_IMAGE_RE = re.compile(r"^writing image (sha256:[0-9a-f]{64})")
# The summary BuildKit prints after a failed step repeats its last lines between these.
_BK_SUMMARY_RE = re.compile(r"^(-{6}| > \[.*\]:?)$")
# The first line of a build that is sent some of its context (``context_sent``), in the build
# log of either builder; the number is megabytes.
CONTEXT_SENT_RE = re.compile(r"^envlock: sending a build context of ([0-9]+\.[0-9]) MB$", re.MULTILINE)


def context_sent(size: int) -> str:
    """The line a build starts with when it is sent ``size`` bytes of its context: the SDK's
    builder (a tar) and a command-line client (the files linked) say it in the same words, so
    the log and the speed test read one line whichever built."""
    return f"envlock: sending a build context of {size / 1e6:.1f} MB\n"


@dataclass(frozen=True)
class Step:
    """A build step starting: ``number`` of ``total``, and its instruction."""

    number: int
    total: int
    text: str

    def __str__(self) -> str:
        return f"{self.number}/{self.total}: {self.text}"


# What a chunk tells a progress display: a step started, or a line of output.
Event = Step | str


@dataclass(frozen=True)
class Fed:
    """What one chunk adds: text for the build log file and events for the progress display."""

    log: str
    events: tuple[Event, ...]


def shorten(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class BuildLog:
    """Everything a build said so far that matters: the current step, the image, the error, and
    the last lines worth showing when it fails."""

    step: Step | None = None
    image_id: str | None = None
    error: str | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    # The images this build committed, oldest first (short ids): not a FROM's base, not a step
    # the builder took from its cache. What an interrupted build leaves behind.
    committed: list[str] = field(default_factory=list)
    _not_ours: bool = False  # the next image line names an image that was there before
    _bk_failed: bool = False  # BuildKit said a step failed: what follows repeats its lines

    def feed(self, chunk: Mapping[str, Any]) -> Fed:
        """Read one chunk. After an error chunk the build is over: ``error`` is set."""
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail")
            message = detail.get("message") if isinstance(detail, Mapping) else None
            # Podman ends its message with a newline; the summary is one line.
            return Fed(self.fail(str(chunk.get("error") or message or "build failed").rstrip()), ())
        aux = chunk.get("aux")
        if isinstance(aux, Mapping) and aux.get("ID"):
            self.image_id = str(aux["ID"])
        text = chunk.get("stream") or chunk.get("status") or ""
        if not isinstance(text, str) or not text:
            return Fed("", ())
        text = _ANSI_RE.sub("", text)
        return Fed(text if text.endswith("\n") else text + "\n", tuple(self._lines(text)))

    def _lines(self, text: str) -> Iterable[Event]:
        for raw_line in text.splitlines():
            line = raw_line.rstrip()
            if not line:
                continue
            buildkit = _BK_LINE_RE.match(line)
            if buildkit:
                yield from self._buildkit(buildkit.group(1))
                continue
            if _BK_SUMMARY_RE.match(line):
                continue
            m = _STEP_RE.match(line)
            if m:
                self.step = Step(int(m.group(1)), int(m.group(2)), m.group(3))
                # Docker names the base after a FROM (its ONBUILD triggers commit after it).
                self._not_ours = m.group(3).upper().startswith("FROM ")
                yield self.step
                continue
            if "Using cache" in line and _NOISE_RE.match(line):
                self._not_ours = True
            image = _IMAGE_RE.match(line)
            if image:
                if not self._not_ours:
                    self.committed.append(image.group(1))
                self._not_ours = False
            built = _BUILT_RE.match(line)
            if built and self.image_id is None:
                self.image_id = built.group(1)
            if not _NOISE_RE.match(line):
                self.tail.append(line)
            yield line

    def _buildkit(self, text: str) -> Iterable[Event]:
        """One BuildKit vertex line (its ``#N `` cut off): a step once (BuildKit names it again
        when its output resumes), a line of output, or BuildKit's own status, which is the log's
        alone. BuildKit commits no image per step: nothing goes to ``committed``."""
        step = _BK_STEP_RE.match(text)
        if step:
            current = Step(int(step.group(1)), int(step.group(2)), step.group(3))
            if current != self.step:
                self.step = current
                yield current
            return
        output = _BK_OUTPUT_RE.match(text)
        if output:
            said = output.group(1).rstrip()
            if said:
                if not self._bk_failed:
                    self.tail.append(said)
                yield said
            return
        image = _BK_IMAGE_RE.match(text)
        if image:
            self.image_id = image.group(1)
        if text.startswith("ERROR"):
            self._bk_failed = True

    def fail(self, message: str) -> str:
        """Record that the build failed with ``message`` (a chunk's or the client's); returns the
        text for the log file."""
        self.error = message
        if not self.tail or self.tail[-1] != message:
            self.tail.append(message)
        return message + "\n"

    def raise_failure(self, log_path: str) -> None:
        """Raise the build's failure (``BuildFailed``: its summary, step, tail and log file), if
        it failed: the one way every builder reports one."""
        failure = self.summary()
        if failure is not None:
            raise BuildFailed(failure, step=str(self.step) if self.step else None,
                              log_tail=list(self.tail), log_path=log_path, hint=f"full build log: {log_path}")

    def summary(self) -> str | None:
        """The one-line failure message, or None while nothing failed."""
        if self.error is None:
            return None
        where = f" at step {shorten(str(self.step))}" if self.step else ""
        cause = next((t for t in reversed(self.tail)
                      if t.startswith(_CAUSE_PREFIXES) and not _NOT_A_CAUSE_RE.match(t)), self.error)
        return f"image build failed{where}: {cause}"


def parse(chunks: Iterable[Mapping[str, Any]]) -> tuple[BuildLog, list[Event]]:
    """A whole stream read as the engine reads it (stopping at the first error)."""
    log = BuildLog()
    events: list[Event] = []
    for chunk in chunks:
        events.extend(log.feed(chunk).events)
        if log.error is not None:
            break
    return log, events
