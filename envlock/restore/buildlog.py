"""Reading an image build's output: the engine's stream of chunks -> steps, lines, image, error.

The docker SDK's ``api.build(decode=True)`` yields dicts: ``{"stream": text}`` with the builder's
output (``Step 3/9 : RUN ...`` on Docker, ``[1/2] STEP 3/9: RUN ...`` on Podman, tools' output with
ANSI colours), ``{"aux": {"ID": ...}}`` with the image, ``{"error": ..., "errorDetail": ...}`` when
a step fails. This module only reads them: no engine, no files, no terminal; so it is tested on
streams recorded from real builds (``tests/fixtures/buildlogs/``), and the engine writes the log
file and drives the progress display from what ``BuildLog.feed`` returns.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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

    def fail(self, message: str) -> str:
        """Record that the build failed with ``message`` (a chunk's or the client's); returns the
        text for the log file."""
        self.error = message
        self.tail.append(message)
        return message + "\n"

    def summary(self) -> str | None:
        """The one-line failure message, or None while nothing failed."""
        if self.error is None:
            return None
        where = f" at step {shorten(str(self.step))}" if self.step else ""
        cause = next((t for t in reversed(self.tail) if t.startswith(_CAUSE_PREFIXES)), self.error)
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
