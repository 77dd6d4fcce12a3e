"""Restore speed: ``envlock restore`` of a torch lock next to hand-written Dockerfiles.

Side by side, on the same base image and the same wheels, through the same engine (the docker
SDK's build, the classic builder every restore uses):

  (a) a fresh ``envlock restore --wheelhouse`` of a torch lock (the build, then the check
      inside the image, which a user waits for too);
  (b) a hand-written Dockerfile: ``python -m venv /v && /v/bin/pip install --no-index
      --find-links /wh -r requirements.txt``, the lock's pins, the same wheels in /wh;
  (c) the same Dockerfile with ``uv pip install`` (the host's uv binary in the context);
  (d) the second restore of the lock with one small package changed (six 1.17.0 -> 1.16.0),
      right after (a): the torch layer is reused.

Every fresh run starts with the images of the previous one removed (tags, their untagged
parents: the classic builder's layer cache); the base image stays. Usage:

    ENVLOCK_TEST_BASE_IMAGE=... ENVLOCK_TEST_WHEELHOUSE=... DOCKER_HOST=... \\
        python benchmarks/restore.py [--rounds N] [--prefix NAME]

The lock is captured the way tests/test_restore_speed_integration.py does it: a source image
with torch 2.13.0+cpu and six from the wheelhouse in /opt/venv, locked with ``capture
--in-image``. Prints a markdown table: medians (and every run) and the ratios of the targets,
(a) <= 0.6 x (b) and (d) <= 15 s. Wall-clock time: on a shared machine the neighbours' load is
in every figure, so compare medians of rounds run back to back.
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

from envlock.restore import uvbin  # noqa: E402

TORCH = ["torch==2.13.0+cpu", "six==1.17.0"]
STARTED = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


def envlock(*args: str) -> tuple[float, str]:
    """Run the envlock of this checkout as a user would; (seconds, its output)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ENVLOCK_PLAIN_PROGRESS": "1"}
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
    """Remove every image of this benchmark but the source image: restored images (by their
    tag), torch layers, hand-written builds; their untagged parents go with them."""
    for image in client.images.list():
        tags = image.tags
        mine = [t for t in tags if t.startswith((f"envlock/{prefix}-", "envlock/torch-layer:",
                                                 f"{prefix}-hand"))]
        if mine:
            # By tag first, or the next "fresh" run would reuse an image another was built on.
            remove_image(client, image)
    # Restore removes its build stages; one a failed build left before its last step would be
    # the builder's cache of the next fresh run, so this benchmark's go too (those that copied
    # uv in since it started: the engine may be shared, others' stages stay).
    for image in client.images.list(filters={"dangling": True}):
        with contextlib.suppress(Exception):
            made = " ".join(str(h.get("CreatedBy", "")) for h in image.history())
            if "/tmp/envlock-uv/uv" in made and image.attrs.get("Created", "") >= STARTED:
                client.images.remove(image.id)


def build(client: Any, context: Path, tag: str) -> float:
    t0 = time.monotonic()
    for chunk in client.api.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True,
                                  pull=False, network_mode="none"):
        if "error" in chunk:
            raise SystemExit(f"build of {tag} failed: {chunk['error']}")
    return time.monotonic() - t0


@contextlib.contextmanager
def hand_context(base: str, lock_path: Path, house: Path, uv: Path | None) -> Iterator[Path]:
    """The hand-written build's context: requirements.txt (the lock's pins), the wheels the
    restore uses (hard links), and the Dockerfile."""
    from envlock.lock import load
    from envlock.restore.wheelhouse import select

    lock = load(lock_path)
    with tempfile.TemporaryDirectory(prefix="envlock-bench-") as tmp:
        ctx = Path(tmp)
        (ctx / "wh").mkdir()
        pins = [p for p in lock.packages if p.name != "envlock-ml"]
        for files in select(house, pins).values():
            for wheel in files:
                with contextlib.suppress(FileExistsError):
                    try:
                        os.link(wheel, ctx / "wh" / wheel.name)
                    except OSError:
                        shutil.copy2(wheel, ctx / "wh" / wheel.name)
        (ctx / "requirements.txt").write_text("".join(f"{p.name}=={p.version}\n" for p in pins))
        if uv is None:
            install = "/v/bin/pip install --no-index --find-links /wh -r /requirements.txt"
        else:
            shutil.copy2(uv, ctx / "uv")
            install = "/uv pip install --python /v/bin/python --no-index --find-links /wh -r /requirements.txt"
        (ctx / "Dockerfile").write_text(
            f"FROM {base}\nCOPY wh /wh\nCOPY requirements.txt /requirements.txt\n"
            + ("COPY uv /uv\n" if uv else "")
            + f"RUN python3 -m venv /v && {install}\n")
        yield ctx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prefix", default="bench-restore", help="image name prefix (yours alone)")
    args = parser.parse_args()
    import docker

    base = os.environ["ENVLOCK_TEST_BASE_IMAGE"]
    house = Path(os.environ["ENVLOCK_TEST_WHEELHOUSE"])
    client = docker.from_env(timeout=3600)
    uv = uvbin.find(house, Path(tempfile.gettempdir()) / f"{args.prefix}-uv")
    runs: dict[str, list[float]] = {"a": [], "a_build": [], "b": [], "c": [], "d": [], "d_build": []}
    with tempfile.TemporaryDirectory(prefix="envlock-bench-") as tmp:
        work = Path(tmp)
        for d in ("a", "b"):
            (work / d).mkdir()
        src = source_image(client, base, house, args.prefix, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
        envlock("capture", "--in-image", src, "-o", str(work / "a" / "env.lock"))
        (work / "b" / "env.lock").write_text(with_other_six((work / "a" / "env.lock").read_text(), house))
        envlock("fmt", str(work / "b" / "env.lock"))
        common = ["--base", base, "--wheelhouse", str(house), "--name", f"{args.prefix}-torch"]
        try:
            for r in range(args.rounds):
                purge(client, args.prefix)
                for key, lock in (("a", "a"), ("d", "b")):
                    seconds, out = envlock("restore", str(work / lock / "env.lock"), *common,
                                           "--context-dir", str(work / f"ctx-{lock}-{r}"))
                    built = re.search(r"built in ([0-9.]+)s", out)
                    runs[key].append(seconds)
                    runs[f"{key}_build"].append(float(built.group(1)) if built else float("nan"))
                    sys.stderr.write(f"round {r + 1}: ({key}) {seconds:.1f}s\n")
                purge(client, args.prefix)
                for key, tool in (("b", None), ("c", uv)):
                    if key == "c" and uv is None:
                        continue
                    with hand_context(base, work / "a" / "env.lock", house, tool) as ctx:
                        runs[key].append(build(client, ctx, f"{args.prefix}-hand:{key}"))
                    sys.stderr.write(f"round {r + 1}: ({key}) {runs[key][-1]:.1f}s\n")
                    purge(client, args.prefix)
        finally:
            purge(client, args.prefix)
    med = {k: statistics.median(v) if v else float("nan") for k, v in runs.items()}
    table = io.StringIO()
    table.write(f"{args.rounds} round(s), medians (every run in brackets), wall-clock seconds\n\n")
    table.write("| run | seconds | runs |\n|---|---:|---|\n")
    names = {"a": "(a) envlock restore, fresh (build + check inside)", "a_build": "(a) of which the build",
             "b": "(b) hand-written Dockerfile, pip", "c": "(c) hand-written Dockerfile, uv pip",
             "d": "(d) envlock restore, one small package changed", "d_build": "(d) of which the build"}
    for k, label in names.items():
        table.write(f"| {label} | {med[k]:.1f} | {', '.join(f'{x:.1f}' for x in runs[k])} |\n")
    table.write(f"\n(a)/(b) = {med['a'] / med['b']:.2f} (target <= 0.6); build only: "
                f"{med['a_build'] / med['b']:.2f}; (a)/(c) = {med['a'] / med['c']:.2f}; "
                f"(d) = {med['d']:.1f} s (target <= 15 s)\n")
    sys.stdout.write(table.getvalue())


if __name__ == "__main__":
    main()
