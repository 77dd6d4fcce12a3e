"""scripts/engine.sh's choice of what earlier test runs left (``_engine_stale_images``).

A machine whose disk outlives a run filled up with the images runs built under new tags: the
choice must take every one of those and never a setup image, a fresh fixture cache or, in
Podman's storage (the machine's own), anybody else's image. The unit tests give it a stand-in
CLI with a fixed listing; the integration test asks the real engine, tagging images only (the
removal itself would take images that other tests of this run still use).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

ENGINE_SH = Path(__file__).resolve().parents[1] / "scripts" / "engine.sh"


def stale(cli: str, ours: str, env: dict[str, str] | None = None) -> list[str]:
    """What ``_engine_stale_images CLI OURS`` prints, one reference per line."""
    script = f'source "{ENGINE_SH}"; _engine_stale_images "$1" "$2"'
    out = subprocess.run(["bash", "-c", script, "bash", cli, ours], check=True, capture_output=True,
                         text=True, env={**os.environ, **(env or {})}, timeout=120).stdout
    return out.split()


@pytest.fixture
def fake_cli(tmp_path: Path) -> Iterator[Path]:
    """A `docker`-like CLI: `images` prints LISTING, `image inspect` the creation time of the
    image id given (ids starting with "old" are ten days old)."""
    now = datetime.now(timezone.utc)
    old, new = (now - timedelta(days=10)).isoformat(), (now - timedelta(hours=1)).isoformat()
    cli = tmp_path / "cli"
    cli.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
            images) cat "{tmp_path / 'listing'}" ;;
            image) for id; do :; done
                   case "$id" in old*) echo "{old}" ;; *) echo "{new}" ;; esac ;;
        esac
        """))
    cli.chmod(0o755)
    yield cli


def listing(tmp_path: Path, lines: list[str]) -> None:
    (tmp_path / "listing").write_text("".join(f"{line}\n" for line in lines))


def test_the_private_engine_loses_every_image_but_the_setups_and_fresh_fixtures(
        fake_cli: Path, tmp_path: Path) -> None:
    listing(tmp_path, [
        "a1 envlock/scenario-a:69e777de8a10",       # a restore's output: gone
        "a2 envlock/torch-layer:136dbc36f9bfa4f3",  # a layer keyed by envlock's version: gone
        "a3 bench-runstart-src:small",              # a benchmark's source: gone
        "d1 <none>:<none>",                         # dangling: gone, by id
        "k1 envlock-test/bookworm-python:1",        # the setup's base: kept
        "old9 envlock-test/ngc-style:1",            # the setup's, however old: kept
        "f1 envlock-test/src-torch:af9a56f6eb10",   # a fixture's cache, fresh: kept
        "old1 envlock-test/src-small:9001b88667b4",  # ... ten days old: gone
    ])
    assert stale(str(fake_cli), ".") == [
        "envlock/scenario-a:69e777de8a10", "envlock/torch-layer:136dbc36f9bfa4f3",
        "bench-runstart-src:small", "d1", "envlock-test/src-small:9001b88667b4"]


def test_twin_podman_keeps_images_that_are_not_envlocks(fake_cli: Path, tmp_path: Path) -> None:
    """Podman's storage is the machine's: only envlock's names (in either spelling) go."""
    listing(tmp_path, [
        "a1 localhost/envlock/torch-layer:2987f71941615c6e",
        "a2 docker.io/envlock/it-podman:15916a5bdd0b",
        "u1 docker.io/library/debian:bookworm",          # a user's: kept
        "u2 localhost/my-envlock/model:1",               # a look-alike: kept
        "u3 registry.example/envlock/other:2",           # another registry's envlock: kept
        "k1 localhost/envlock-test/bookworm-python:1",
        "f1 docker.io/envlock-test/src-small-podman:d6c09ffe3a18",
    ])
    assert stale(str(fake_cli), "^envlock/") == [
        "localhost/envlock/torch-layer:2987f71941615c6e", "docker.io/envlock/it-podman:15916a5bdd0b"]


def test_the_age_of_a_fixtures_cache_is_a_knob(fake_cli: Path, tmp_path: Path) -> None:
    listing(tmp_path, ["f1 envlock-test/src-torch:af9a56f6eb10", "k1 envlock-test/bookworm-python:1"])
    assert stale(str(fake_cli), ".", {"ENVLOCK_TEST_IMAGE_MAX_AGE_H": "0"}) == [
        "envlock-test/src-torch:af9a56f6eb10"]


def test_an_engine_that_does_not_answer_leaves_nothing_to_remove(tmp_path: Path) -> None:
    cli = tmp_path / "cli"
    cli.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    cli.chmod(0o755)
    assert stale(str(cli), ".") == []


@pytest.mark.integration
def test_the_real_engine_lists_what_a_run_left_and_not_the_setup(docker_client: object) -> None:
    base = os.environ["ENVLOCK_TEST_BASE_IMAGE"]
    key = uuid.uuid4().hex[:12]
    left, cache = f"envlock/prune-probe:{key}", f"envlock-test/prune-probe:{key}"
    for ref in (left, cache):
        subprocess.run(["docker", "tag", base, ref], check=True, timeout=60)
    try:
        found = stale("docker", ".")
        assert left in found and cache not in found and base not in found
        assert cache in stale("docker", ".", {"ENVLOCK_TEST_IMAGE_MAX_AGE_H": "0"})
    finally:
        subprocess.run(["docker", "rmi", left, cache], check=False, capture_output=True, timeout=60)
