"""Run the stdlib probe inside an image and compare what it sees with the lock.

The probe package (its canary included) is copied into a fresh container with ``put_archive`` and
run with the image's own python; nothing of envlock is installed into the image, because an
image holding extra packages would not be the environment in the lock. All validation, TOML and
comparison happen here, on the JSON the probe prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from envlock.errors import CommandNotFound, InterpreterNotFound, ProbeFailed
from envlock.probing.process import PROBE_PATH, parse_document, probe_args
from envlock.restore.engine import ContainerEngine, RunSpec

if TYPE_CHECKING:
    from envlock.drift.expected import Restored
    from envlock.drift.result import Comparison
    from envlock.lock import Lock

PROBE_DIR = "/tmp/envlock-probe"


def probe_files() -> dict[str, bytes]:
    """The probe package, file by file, for ``put_archive``; run as ``python PROBE_DIR``."""
    from envlock.probe.source import file_names

    return {f"{PROBE_DIR}/{name}": (PROBE_PATH / name).read_bytes() for name in file_names()}


def probe_in_image(engine: ContainerEngine, image: str, *, python: str, torch: bool = True,
                   canary: bool = False, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The probe's JSON document from a throwaway container of ``image``."""
    argv = [python, PROBE_DIR, *probe_args(torch=torch, canary=canary)]
    spec = RunSpec(image=image, command=argv, env=dict(env or {}), files=probe_files(), network=False)
    try:
        result = engine.run(spec)
    except CommandNotFound:
        raise InterpreterNotFound(f"{python} not found in {image}") from None
    # A shell's (or crun's) "cannot execute" and "not found".
    if result.exit_code in (126, 127):
        raise InterpreterNotFound(f"{python} not found in {image}")
    if result.exit_code != 0:
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise ProbeFailed(f"the probe failed inside {image} with exit {result.exit_code}: "
                          + (" | ".join(tail) or "no output"))
    return parse_document(result.stdout, f"inside {image}")


def probe_image(engine: ContainerEngine, lock: Lock, image_id: str, *, python: str,
                reference: str | None = None) -> dict[str, Any]:
    """What the probe prints inside a fresh container of ``image_id``, asked what ``lock``
    needs answered (torch, the canary: ``probe_wanted_for``); restore's check, before judging."""
    from envlock.check.local import probe_wanted_for

    env = {"ENVLOCK_IMAGE_ID": image_id}
    if reference:
        env["ENVLOCK_IMAGE"] = reference
    want_torch, want_canary = probe_wanted_for(lock)
    doc = probe_in_image(engine, image_id, python=python, torch=want_torch, canary=want_canary,
                         env=env)
    doc.pop("deep", None)
    return doc


def judge_document(lock: Lock, doc: dict[str, Any], *, restored: Restored) -> tuple[Lock, Comparison]:
    """(lock captured inside the image, its comparison with ``lock``) from the probe's document.

    Judged by ``check/local.judge``, the verdict of every verify, with what the restore changed on
    purpose (``restored``: the image is new, packages left out with ``--skip-local``, vcs
    packages restored from a wheel, envlock itself...) allowed for, as ``envlock verify``
    inside the image allows for it reading the same facts from the image.
    """
    from envlock.check.local import judge
    from envlock.probing.capture import build_lock

    inside = build_lock(doc, note="captured inside the restored image by envlock restore")
    # A fresh container process: the lock's seeds and flags are replayed by `envlock run` /
    # envlock.apply(), not expected here, as a shell `envlock verify` there reports them.
    cmp = judge(lock, inside, None, strict=False, process_state="report", limit=None,
                restored=restored)
    return inside, cmp


def verify_image(engine: ContainerEngine, lock: Lock, image_id: str, *, python: str,
                 restored: Restored, reference: str | None = None) -> tuple[Lock, Comparison]:
    """(lock captured inside ``image_id``, comparison with ``lock``): the probe run in a fresh
    container now, its document judged (``judge_document``)."""
    doc = probe_image(engine, lock, image_id, python=python, reference=reference)
    return judge_document(lock, doc, restored=restored)
