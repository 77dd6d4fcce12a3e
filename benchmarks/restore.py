"""Restore speed: ``envlock restore`` of a torch lock next to a hand-written Dockerfile.

Side by side in one run, on the same base image and the same wheels, through the same engine
and the same builder (envlock's: the engine's own command-line client where one reads ``RUN
--mount``, ``envlock/restore/clibuild.py``; the docker SDK's classic builder otherwise), on Docker
and on (rootful) Podman:

  (a) a fresh ``envlock restore --wheelhouse`` of a torch lock: the build, then the check
      inside the image, which a user waits for too;
  (b) a hand-written Dockerfile: ``COPY`` the wheels, ``python3 -m venv /v && /v/bin/pip install
      --no-index --find-links /wh -r requirements.txt`` with the lock's pins;
  (d) right after (a), the restore of the same lock with one small package changed (six 1.17.0
      -> 1.16.0): the torch layer is reused;
  and the sizes of the images (a) and (b) built.

Every cache is purged before each fresh build: this benchmark's images with their untagged
parents (Podman's layer cache), the torch layers, and BuildKit's build cache (``docker builder
prune --all``: on a shared engine, other users' build cache goes too); the base image stays.
With ``--sdk``, (a) and (d) are also run with ``ENVLOCK_BUILDER=sdk`` (the classic builder and
its build stage), for comparison. Usage:

    ENVLOCK_TEST_BASE_IMAGE=... ENVLOCK_TEST_WHEELHOUSE=... DOCKER_HOST=... \\
        [ENVLOCK_TEST_PODMAN_HOST=...] python benchmarks/restore.py [--rounds N] [--sdk] [--no-podman]

The lock is captured the way tests/test_restore_speed_integration.py does it: a source image
with torch 2.13.0+cpu and six from the wheelhouse in /opt/venv, locked with ``capture
--in-image``. Prints a markdown table per engine: medians (every run in brackets), the image
sizes, and the targets: (a)/(b) <= 1.2, size (a)/(b) <= 1.0, (d) <= 15 s. Wall-clock time: on a
shared machine the neighbours' load is in every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import remove_image  # noqa: E402  (shared with the tests' image purges)
from lock_edits import with_other_six  # noqa: E402  (shared with the restore-speed test)

TORCH = ["torch==2.13.0+cpu", "six==1.17.0"]
STARTED = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


def envlock(*args: str, builder: str | None = None) -> tuple[float, str]:
    """Run the envlock of this checkout as a user would; (seconds, its output)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ENVLOCK_PLAIN_PROGRESS": "1"}
    if builder:
        env["ENVLOCK_BUILDER"] = builder
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envlock", *args], capture_output=True, text=True,
                          env=env, check=False)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"envlock {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return seconds, proc.stdout + proc.stderr


def source_image(client: Any, base: str, house: Path, prefix: str, *, name: str = "torch",
                 packages: list[str] = TORCH, env: dict[str, str] | None = None) -> str:
    """Base + /opt/venv with ``packages`` from the wheelhouse and the variables ``env``,
    committed as ``PREFIX-src:NAME``: the environment that is locked (runstart.py's too)."""
    tag = f"{prefix}-src:{name}"
    with contextlib.suppress(Exception):
        client.images.get(tag)
        return tag
    script = ("python3 -m venv /opt/venv && /opt/venv/bin/pip install -q --no-index "
              "--disable-pip-version-check --find-links /wheels " + " ".join(packages))
    container = client.containers.run(base, ["sh", "-c", script], detach=True, network_disabled=True,
                                      volumes={str(house): {"bind": "/wheels", "mode": "ro"}})
    try:
        if container.wait()["StatusCode"] != 0:
            raise SystemExit(container.logs().decode()[-2000:])
        repo, _, tag_part = tag.rpartition(":")
        container.commit(repository=repo, tag=tag_part,
                         changes=[*(f"ENV {k}={v}" for k, v in (env or {}).items()), "ENV PATH=/opt/venv/bin:"
                                  "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    finally:
        container.remove(force=True)
    return tag


def purge(client: Any, prefix: str) -> None:
    """Remove every image of this benchmark but the source image (restored images by their tag,
    torch layers, hand-written builds; their untagged parents go with them) and the builder's
    cache: the next build is a fresh one."""
    for image in client.images.list():
        # Podman lists local names under localhost/, and builds through its Docker API under the
        # default registry's domain: the name without its domain.
        names = [re.sub(r"^(localhost|[^/]*[.:][^/]*)/", "", t) for t in image.tags]
        if [t for t in names if t.startswith((f"envlock/{prefix}-", "envlock/torch-layer:", f"{prefix}-hand"))]:
            # By tag first, or the next "fresh" run would reuse an image another was built on.
            remove_image(client, image)
    # The classic builder's stages that a failed build left before its last step (restore
    # removes the others): those of this benchmark, which copied uv in since it started.
    for image in client.images.list(filters={"dangling": True}):
        with contextlib.suppress(Exception):
            made = " ".join(str(h.get("CreatedBy", "")) for h in image.history())
            if "/tmp/envlock-uv/uv" in made and image.attrs.get("Created", "") >= STARTED:
                client.images.remove(image.id)
    with contextlib.suppress(Exception):  # BuildKit's cache (Podman keeps none but its images)
        client.api.prune_builds(all=True)


@contextlib.contextmanager
def hand_context(base: str, lock_path: Path, house: Path) -> Iterator[Path]:
    """The hand-written build's context: requirements.txt (the lock's pins), the wheels the
    restore uses (hard links), and the Dockerfile."""
    from envlock.lock import load
    from envlock.restore.wheelhouse import select

    lock = load(lock_path)
    with tempfile.TemporaryDirectory(prefix="envlock-bench-") as tmp:
        ctx = Path(tmp) / "context"
        (ctx / "wh").mkdir(parents=True)
        pins = [p for p in lock.packages if p.name != "envlock-ml"]
        for files in select(house, pins).values():
            for wheel in files:
                with contextlib.suppress(FileExistsError):
                    try:
                        os.link(wheel, ctx / "wh" / wheel.name)
                    except OSError:
                        shutil.copy2(wheel, ctx / "wh" / wheel.name)
        (ctx / "requirements.txt").write_text("".join(f"{p.name}=={p.version}\n" for p in pins))
        (ctx / "Dockerfile").write_text(
            f"FROM {base}\nCOPY wh /wh\nCOPY requirements.txt /requirements.txt\n"
            "RUN python3 -m venv /v && /v/bin/pip install --no-index --find-links /wh -r /requirements.txt\n")
        yield ctx


def hand_build(url: str, ctx: Path, tag: str) -> tuple[float, int]:
    """Build the hand-written context with the builder envlock uses on this engine; (seconds, size)."""
    from envlock.restore.endpoint import connect
    from envlock.restore.progress import QuietProgress

    with connect(url) as engine, open(os.devnull, "w") as quiet:
        t0 = time.monotonic()
        image_id = engine.build(ctx, tag=tag, labels={}, log_path=ctx.parent / "build.log",
                                progress=QuietProgress(quiet), network=False)
        seconds = time.monotonic() - t0
        info = engine.image(image_id)
    return seconds, int(info.size or 0) if info else 0


def size_of(client: Any, tag: str) -> int:
    for ref in (tag, f"localhost/{tag}"):
        with contextlib.suppress(Exception):
            return int(client.images.get(ref).attrs.get("Size") or 0)
    return 0


def podman_base(client: Any, base: str) -> str:
    for ref in (base, f"localhost/{base}"):
        with contextlib.suppress(Exception):
            client.images.get(ref)
            return ref
    raise SystemExit(f"the base image {base} is not in Podman (scripts/test.sh imports it)")


def run_engine(name: str, url: str, client: Any, base: str, house: Path, work: Path, prefix: str,
               rounds: int, sdk: bool) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {}
    builders = [None, "sdk"] if sdk else [None]
    for r in range(rounds):
        for builder in builders:
            suffix = "" if builder is None else "_sdk"
            purge(client, prefix)
            for key, lock in (("a", "a"), ("d", "b")):
                tag_name = f"{prefix}-torch{suffix.replace('_', '-')}"
                seconds, out = envlock("restore", str(work / lock / "env.lock"), "--engine", url, "--base", base,
                                       "--wheelhouse", str(house), "--name", tag_name, "--context-dir",
                                       str(work / f"ctx-{name}-{lock}{suffix}-{r}"), builder=builder)
                built = re.search(r"built in ([0-9.]+)s", out)
                runs.setdefault(key + suffix, []).append(seconds)
                runs.setdefault(f"{key}{suffix}_build", []).append(float(built.group(1)) if built else float("nan"))
                image = re.search(r"^image (\S+) \(", out, re.M)
                if key == "a" and image:
                    runs.setdefault(f"size_a{suffix}", []).append(size_of(client, image.group(1)) / 1e6)
                how = re.search(r"building \S+ from \S+ with (.*?) \(context", out)
                sys.stderr.write(f"{name} round {r + 1}: ({key}{suffix}) {seconds:.1f}s"
                                 f" [{how.group(1) if how else '?'}]\n")
        purge(client, prefix)
        with hand_context(base, work / "a" / "env.lock", house) as ctx:
            seconds, size = hand_build(url, ctx, f"{prefix}-hand:b")
        runs.setdefault("b", []).append(seconds)
        runs.setdefault("size_b", []).append(size / 1e6)
        sys.stderr.write(f"{name} round {r + 1}: (b) {seconds:.1f}s\n")
        purge(client, prefix)
    return runs


def table(name: str, runs: dict[str, list[float]], rounds: int) -> str:
    med = {k: statistics.median(v) if v else float("nan") for k, v in runs.items()}
    names = {"a": "(a) envlock restore, fresh (build + check inside)", "a_build": "(a) of which the build",
             "b": "(b) hand-written Dockerfile, pip", "d": "(d) envlock restore, one small package changed",
             "d_build": "(d) of which the build", "size_a": "image size (a), MB", "size_b": "image size (b), MB",
             "a_sdk": "(a) with ENVLOCK_BUILDER=sdk", "a_sdk_build": "(a) sdk, of which the build",
             "d_sdk": "(d) with ENVLOCK_BUILDER=sdk", "d_sdk_build": "(d) sdk, of which the build",
             "size_a_sdk": "image size (a) sdk, MB"}
    out = io.StringIO()
    out.write(f"\n### {name}: {rounds} round(s), medians (every run in brackets), wall-clock seconds\n\n")
    out.write("| run | median | runs |\n|---|---:|---|\n")
    for key, label in names.items():
        if key in runs:
            out.write(f"| {label} | {med[key]:.1f} | {', '.join(f'{x:.1f}' for x in runs[key])} |\n")
    ratio, size, changed = med["a"] / med["b"], med["size_a"] / med["size_b"], med["d"]
    out.write(f"\n(a)/(b) = {ratio:.2f} (target <= 1.2: {'PASS' if ratio <= 1.2 else 'FAIL'}); "
              f"size (a)/(b) = {size:.2f} (target <= 1.0: {'PASS' if size <= 1.0 else 'FAIL'}); "
              f"(d) = {changed:.1f} s (target <= 15 s: {'PASS' if changed <= 15 else 'FAIL'})")
    if "a_sdk" in med:
        out.write(f"; with the SDK: (a)/(b) = {med['a_sdk'] / med['b']:.2f}, (d) = {med['d_sdk']:.1f} s")
    out.write("\n")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--prefix", default="bench-restore", help="image name prefix (yours alone)")
    parser.add_argument("--sdk", action="store_true", help="also time the docker SDK's classic builder")
    parser.add_argument("--no-podman", action="store_true")
    args = parser.parse_args()
    import docker

    base = os.environ["ENVLOCK_TEST_BASE_IMAGE"]
    house = Path(os.environ["ENVLOCK_TEST_WHEELHOUSE"])
    engines = [("Docker", os.environ["DOCKER_HOST"], docker.from_env(timeout=3600), base)]
    podman_url = os.environ.get("ENVLOCK_TEST_PODMAN_HOST")
    if podman_url and not args.no_podman:
        client = docker.DockerClient(base_url=podman_url, timeout=3600)
        engines.append(("Podman (rootful)", podman_url, client, podman_base(client, base)))
    report = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="envlock-bench-") as tmp:
        work = Path(tmp)
        for d in ("a", "b"):
            (work / d).mkdir()
        src = source_image(engines[0][2], base, house, args.prefix, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
        envlock("capture", "--in-image", src, "-o", str(work / "a" / "env.lock"))
        (work / "b" / "env.lock").write_text(with_other_six((work / "a" / "env.lock").read_text(), house))
        envlock("fmt", str(work / "b" / "env.lock"))
        for name, url, client, engine_base in engines:
            try:
                runs = run_engine(name, url, client, engine_base, house, work, args.prefix, args.rounds, args.sdk)
            finally:
                purge(client, args.prefix)
            report.write(table(name, runs, args.rounds))
            sys.stderr.write(table(name, runs, args.rounds))
    sys.stdout.write(report.getvalue())


if __name__ == "__main__":
    main()
