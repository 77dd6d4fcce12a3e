"""Run the stdlib probe inside an image and compare what it sees with the lock.

The probe package (its canary included) is copied into a fresh container with ``put_archive`` and
run with the image's own python; nothing of envlock is installed into the image, because an
image holding extra packages would not be the environment in the lock. All validation, TOML and
comparison happen here, on the JSON the probe prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from envlock._compare import as_info
from envlock._comparison import Comparison
from envlock._probeproc import PROBE_PATH, parse_document, probe_args
from envlock.errors import CommandNotFound, InterpreterNotFound, ProbeFailed
from envlock.restore.context import TOOLING
from envlock.restore.engine import ContainerEngine, RunSpec

if TYPE_CHECKING:
    from envlock._comparison import Difference
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


def verify_image(engine: ContainerEngine, lock: Lock, image_id: str, *, python: str,
                 reference: str | None = None,
                 skipped: Sequence[str] = (), from_wheel: Sequence[str] = (),
                 os_packages_restored: bool = True, base_tooling: Sequence[str] = ()
                 ) -> tuple[Lock, Comparison]:
    """(lock captured inside ``image_id``, comparison with ``lock``).

    The image is new by construction, so its identity is an expected change; packages left
    out on purpose (``--skip-local``) are not reported as missing, and the origin of vcs
    packages restored from a wheel of the same version (``from_wheel``) is info, not drift:
    their version and files are still compared.
    """
    from envlock._capture import build_lock
    from envlock._verify import probe_wanted_for

    env = {"ENVLOCK_IMAGE_ID": image_id}
    if reference:
        env["ENVLOCK_IMAGE"] = reference
    want_torch, want_canary = probe_wanted_for(lock)
    doc = probe_in_image(engine, image_id, python=python, torch=want_torch, canary=want_canary,
                         env=env)
    inside = build_lock(doc, note="captured inside the restored image by envlock restore")
    return inside, judge_restored(lock, inside, skipped=skipped, from_wheel=from_wheel,
                                  os_packages_restored=os_packages_restored,
                                  base_tooling=base_tooling)


def judge_restored(lock: Lock, inside: Lock, *, skipped: Sequence[str] = (),
                   from_wheel: Sequence[str] = (), os_packages_restored: bool = True,
                   base_tooling: Sequence[str] = ()) -> Comparison:
    """A restored environment (an image, or a venv on a host) against the lock it restores."""
    from envlock._compare import compare, os_packages_from_base

    # A fresh process: the lock's seeds and flags are replayed by `envlock run` /
    # envlock.apply(), not expected here.
    cmp = compare(lock, inside, expected_image_change=True, process_state="report")
    if skipped:
        gone = {f"packages.{name}" for name in skipped}
        cmp = cmp._replace(differences=tuple(d for d in cmp.differences if d.path not in gone))
    if not os_packages_restored:
        # A venv restore puts the venv on another base: its OS packages are the base's, by
        # design, and reported for the reader only.
        cmp = os_packages_from_base(cmp)
    if from_wheel:
        origin = {f"packages.{name}.{key}" for name in from_wheel for key in ("commit", "vcs", "url", "source")}
        cmp = as_info(cmp, lambda d: d.path in origin,
                      "restored from a wheel of the same version: the vcs source is out of reach offline")
    cmp = base_tooling_info(cmp, base_tooling)
    return cmp._replace(differences=tuple(_restore_severity(d) for d in cmp.differences))


# pip, setuptools and wheel are the installer's tools, not the experiment's code: the restore
# installs them last from the index or the wheelhouse, and Debian's ensurepip ships its own
# rebuilds of them, so another build of them is reported but does not fail the restore
# (``context.TOOLING``).
def base_tooling_info(cmp: Comparison, base_tooling: Sequence[str]) -> Comparison:
    """Offline without their wheel, the base's ensurepip copy was kept on purpose (restore said
    so, as ``bundle`` announces): the installer's tools, not the experiment's code, so info."""
    kept = {f"packages.{name}" for name in base_tooling if name in TOOLING}
    if not kept:
        return cmp
    return as_info(cmp, lambda d: ".".join(d.path.split(".")[:2]) in kept,
                   "the base image's own: no wheel offline")


def _restore_severity(d: Difference) -> Difference:
    """A restore must prove the build: another build of a locked package fails it.

    An ordinary ``verify`` keeps a different ``record_sha256`` a warning (a rebuilt wheel of the
    same version on a colleague's machine is worth a look, rarely different numbers); a restore
    exists to reproduce the lock's exact artifacts, so there it is breaking.
    """
    parts = d.path.split(".")
    if len(parts) == 3 and parts[0] == "packages" and parts[2] == "record_sha256" \
            and parts[1] not in TOOLING and d.severity != "breaking":
        message = (d.message or f"{parts[1]}: different build") + " - the restored image holds another build"
        return d._replace(severity="breaking", message=message)
    return d
