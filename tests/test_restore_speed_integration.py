"""A lock that differs from a restored one by one small package reuses the torch layer.

The torch lock is restored once (offline, from the test wheelhouse); then the same lock with
six at another version (its record_sha256 taken from that wheel, re-sealed with ``fmt``) is
restored again. The torch layer is an image of its own, found by its key: the second restore
does not build it, does not send the torch wheel (the build log says how much was sent) and
does not copy the venv again (the image's own layers on top of the torch layer are small). On
both build paths: the engine's own client (wheels mounted) and the docker SDK's (a build stage).
Timings go to ``benchmarks/restore.py``, not here.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from envlock.commands import main
from envlock.restore.buildlog import CONTEXT_SENT_RE

from helpers import remove_image  # isort: skip
from lock_edits import with_other_six  # isort: skip
from test_restore_integration import TORCH, build_source_image, capture, purge  # isort: skip

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_one_small_package_changed_reuses_the_torch_layer(
        docker_client: Any, base_image: str, wheelhouse: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], builder: str) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVLOCK_PLAIN_PROGRESS", "1")
    source = build_source_image(docker_client, base_image, wheelhouse, TORCH,
                                {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, "envlock-test/src-torch")
    (tmp_path / "a").mkdir()
    first_lock = capture(source, tmp_path / "a" / "env.lock")
    (tmp_path / "b").mkdir()
    second_path = tmp_path / "b" / "env.lock"
    second_path.write_text(with_other_six((tmp_path / "a" / "env.lock").read_text(), wheelhouse))
    assert main(["fmt", str(second_path)]) == 0
    from envlock.lock import load

    second_lock = load(second_path)
    assert second_lock.short_id != first_lock.short_id
    common = ["--base", base_image, "--wheelhouse", str(wheelhouse), "--name", "it-speed"]
    tags = [f"envlock/it-speed:{first_lock.short_id}", f"envlock/it-speed:{second_lock.short_id}"]
    try:
        for lock in (first_lock, second_lock):
            purge(docker_client, str(lock.envlock.fingerprint))
        _purge_torch_layers(docker_client)
        capfd.readouterr()
        t0 = time.monotonic()
        assert main(["restore", str(tmp_path / "a" / "env.lock"), *common, "--context-dir",
                     str(tmp_path / "ctx-a")]) == 0
        first = time.monotonic() - t0
        t0 = time.monotonic()
        code = main(["restore", str(second_path), *common, "--context-dir", str(tmp_path / "ctx-b")])
        second = time.monotonic() - t0
        out, err = capfd.readouterr()
        assert code == 0, out + err
        # The torch layer was built once, by the first restore, as an image of its own, and its
        # build stage (the torch wheels and a venv, over 1 GB) did not stay behind.
        assert (tmp_path / "ctx-a" / "torch-layer.log").is_file()
        assert docker_client.images.list(filters={"label": "org.envlock.build-stage"}) == []
        assert not (tmp_path / "ctx-b" / "torch-layer.log").exists()
        assert "torch layer: reusing envlock/torch-layer:" in out + err, out + err
        first_log = (tmp_path / "ctx-a" / "build.log").read_text()
        log = (tmp_path / "ctx-b" / "build.log").read_text()
        # Neither image build was sent the torch wheel (190 MB): only the small wheels (and, with
        # mounts, the uv binary: the layers on top of the torch layer install with it).
        torch_mb = max(w.stat().st_size for w in wheelhouse.glob("torch-2.13.0*.whl")) / 1e6
        for text in (first_log, log):
            sent = CONTEXT_SENT_RE.search(text)
            assert sent is not None and float(sent.group(1)) < torch_mb / 3, text[:2000]
        layer_sent = CONTEXT_SENT_RE.search((tmp_path / "ctx-a" / "torch-layer.log").read_text())
        assert layer_sent is not None and float(layer_sent.group(1)) > 100
        # Both images start from the same torch layer image, and no layer they add on top of it
        # comes near the layer's venv (torch, about 1 GB installed): nothing copies it again.
        layer = _torch_layer_image(docker_client)
        layer_history = layer.history()
        layer_layers = layer.attrs["RootFS"]["Layers"]
        venv = max(int(h.get("Size") or 0) for h in layer_history)
        assert venv > 500e6
        for tag in tags:
            image = docker_client.images.get(tag)
            assert image.attrs["RootFS"]["Layers"][:len(layer_layers)] == layer_layers
            history = image.history()
            added = [int(h.get("Size") or 0) for h in history[:len(history) - len(layer_history)]]
            assert max(added) < venv / 4, (tag, added)
        if os.environ.get("ENVLOCK_REPORT_TIMINGS"):
            sys.stderr.write(f"torch lock: first restore {first:.1f}s, one package changed {second:.1f}s\n")
    finally:
        for tag in tags:
            try:
                docker_client.images.remove(tag, force=True)
            except Exception:
                pass
        _purge_torch_layers(docker_client)


def _purge_torch_layers(client: Any) -> None:
    for image in client.images.list(filters={"label": "org.envlock.torch-layer"}):
        if any(t.startswith("envlock/torch-layer:") for t in image.tags):
            remove_image(client, image)


def _torch_layer_image(client: Any) -> Any:
    """The torch layer's image: tagged envlock/torch-layer:<key>, labelled with that key."""
    found = [i for i in client.images.list(filters={"label": "org.envlock.torch-layer"})
             if any(t.startswith("envlock/torch-layer:") for t in i.tags)]
    assert len(found) == 1, [i.tags for i in found]
    return found[0]
