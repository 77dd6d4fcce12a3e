"""A real package index for export tests: a wheelhouse laid out as PEP 503, over HTTP.

``python -m http.server`` serves static files on 127.0.0.1 (random free port); each project page
lists its files with ``#sha256=`` fragments as PyPI's HTML pages do. Nothing reaches the internet.
"""

from __future__ import annotations

import html
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from envlock._files import file_digest


def sha256(path: Path) -> str:
    return file_digest(path).hexdigest


def layout(wheelhouse: Path, root: Path, *, hashes: bool = True, simple: str = "simple",
           only: tuple[str, ...] = ()) -> Path:
    """``root/<simple>/<name>/index.html`` plus ``root/files`` -> wheelhouse; returns root.

    ``only``: list just these projects (a second index, like PyTorch's, on the same server).
    """
    (root / simple).mkdir(parents=True, exist_ok=True)
    up = "../" * (simple.count("/") + 2)
    files = root / "files"
    if not files.exists():
        files.symlink_to(wheelhouse.resolve(), target_is_directory=True)
    projects: dict[str, list[str]] = {}
    for whl in sorted(wheelhouse.glob("*.whl")):
        name: str = canonicalize_name(parse_wheel_filename(whl.name)[0])
        if only and name not in only:
            continue
        frag = f"#sha256={sha256(whl)}" if hashes else ""
        href = html.escape(f"{up}files/{whl.name.replace('+', '%2B')}{frag}")
        projects.setdefault(name, []).append(f'<a href="{href}">{html.escape(whl.name)}</a><br>')
    for name, rows in projects.items():
        (root / simple / name).mkdir(exist_ok=True)
        (root / simple / name / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "\n".join(rows) + "\n</body></html>\n", encoding="utf-8")
    links = "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(projects))
    (root / simple / "index.html").write_text(f"<html><body>{links}</body></html>\n", encoding="utf-8")
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve ``root`` with ``python -m http.server``; yields ``http://127.0.0.1:PORT``."""
    for _ in range(5):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                 "--directory", str(root), str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(url + "/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            try:
                yield url
            finally:
                proc.terminate()
                proc.wait(10)
            return
    raise RuntimeError("http.server did not start")
