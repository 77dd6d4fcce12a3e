"""With a real engine: the check inside a restored image runs once per image id. A restore that
finds its image reads the kept check back instead of starting a container; ``run`` starts the
image at once; an image committed over the tag has another id and is checked again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envlock.commands import main
from envlock.restore import inside

from test_restore_integration import (  # isort: skip
    cache_home, capture, no_leftover_containers, purge, small_source)  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration


def test_the_check_runs_once_per_image_id(
        docker_client: Any, base_image: str, wheelhouse: Path, small_source: str, tmp_path: Path,  # noqa: F811
        cache_home: Path, capfd: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    lock = capture(small_source, tmp_path / "env.lock")
    purge(docker_client, str(lock.envlock.fingerprint))
    common = [str(tmp_path / "env.lock"), "--base", base_image, "--wheelhouse", str(wheelhouse),
              "--name", "it-inside"]
    tag = f"envlock/it-inside:{lock.short_id}"
    capfd.readouterr()

    assert main(["restore", *common]) == 0
    out, err = capfd.readouterr()
    assert "built in" in out and "OK: the environment matches the lock" in out, out + err
    assert "verifying: running the probe inside a fresh container" in err

    # A cache hit: the same verdict on stdout, from the check kept for this image id.
    assert main(["restore", *common]) == 0
    out, err = capfd.readouterr()
    assert "cache hit" in out and "OK: the environment matches the lock" in out, out + err
    assert "verified before: the check inside" in err and "verifying:" not in err

    # run starts the proven image without restoring: no plan notes, no cache-hit line, no check.
    ws = tmp_path / "ws"
    ws.mkdir()
    code = main(["run", *common, "--workspace", str(ws), "--gpus", "none", "--", "python", "-c",
                 "import six; print('ran', six.__version__)"])
    out, err = capfd.readouterr()
    assert code == 0 and "ran 1.16.0" in out, out + err
    assert "cache hit" not in err and "inside" not in err, err

    # `docker commit` over the tag: another image id, for which the kept check answers nothing;
    # run finds no proven image under the tag and goes through the restore, and says what the
    # check of the image it found says.
    original = docker_client.images.get(tag).id
    container = docker_client.containers.run(tag, ["sh", "-c", "echo changed > /tmp/mark"], detach=True)
    try:
        container.wait()
        repo, _, name = tag.rpartition(":")
        committed = container.commit(repository=repo, tag=name)
    finally:
        container.remove(force=True)
    assert committed.id != original
    assert inside.find("docker", lock, original) is not None
    assert inside.find("docker", lock, committed.id) is None
    code = main(["run", *common, "--workspace", str(ws), "--gpus", "none", "--", "true"])
    out, err = capfd.readouterr()
    assert code == 0, out + err
    assert "cache hit" in err and f"{common[0]} inside {tag}" in err, err
    # Whichever image the restore found by its context (the committed one inherits the labels),
    # the tag now names an image whose check is kept.
    assert inside.find("docker", lock, docker_client.images.get(tag).id) is not None
    docker_client.images.remove(committed.id, force=True)
    no_leftover_containers(docker_client)
