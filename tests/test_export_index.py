"""The simple-API reader (PEP 691 JSON, PEP 503 HTML) and the choice of files for a lock."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from export_index import layout, serve
from helpers import LockFactory
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from envlock.errors import IndexUnavailable
from envlock.export.artifacts import lock_tags, pick
from envlock.export.index import IndexFile, SimpleIndex, parse_html, parse_json
from envlock.export.redaction import redact, shown

WHEEL = "demo-1.0-py3-none-any.whl"
BODY = b"not really a wheel, but bytes with a hash"
SHA = hashlib.sha256(BODY).hexdigest()


class _Pep691(BaseHTTPRequestHandler):
    """Answers JSON only to clients that ask for it (content negotiation, like PyPI)."""

    seen: list[str] = []  # noqa: RUF012 (shared by the handler instances on purpose)
    auth: list[str | None] = []  # noqa: RUF012

    def do_GET(self) -> None:
        accept = self.headers.get("Accept", "")
        self.seen.append(accept)
        self.auth.append(self.headers.get("Authorization"))
        if self.path == "/simple/demo/" and "vnd.pypi.simple.v1+json" in accept:
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": "demo", "files": [
                {"filename": WHEEL, "url": f"../../files/{WHEEL}", "hashes": {"sha256": SHA.upper()},
                 "size": len(BODY)},
                {"filename": "demo-1.0.tar.gz", "url": "/files/demo-1.0.tar.gz", "hashes": {},
                 "yanked": "broken"},
                {"filename": "demo-2.0-py3-none-any.whl", "url": "x", "hashes": {"sha256": "0" * 64}},
            ]}).encode()
            ctype = "application/vnd.pypi.simple.v1+json"
        elif self.path == f"/files/{WHEEL}":
            body, ctype = BODY, "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def json_index() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pep691)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def test_pep691_json_is_asked_for_and_read(json_index: str, tmp_path: Path) -> None:
    ix = SimpleIndex(json_index, cache=tmp_path)
    files = ix.files("demo", Version("1.0"))
    assert [(f.filename, f.sha256, f.size) for f in files] == [(WHEEL, SHA, len(BODY))]
    assert files[0].url == json_index.rsplit("/", 1)[0] + f"/files/{WHEEL}"
    assert "application/vnd.pypi.simple.v1+json" in _Pep691.seen[-1]
    assert ix.files("nothing-here", Version("1.0")) == []  # 404: not on this index


def test_credentials_go_in_a_header_to_the_index_host_only(json_index: str) -> None:
    import base64

    ix = SimpleIndex(json_index.replace("http://", "http://bob:p%40ss@"), cache=None)
    assert "bob" not in ix.url and "p%40ss" not in ix.url
    _Pep691.auth.clear()
    assert ix.files("demo", Version("1.0"))
    assert _Pep691.auth == ["Basic " + base64.b64encode(b"bob:p@ss").decode()]
    other = IndexFile(WHEEL, json_index.replace("127.0.0.1", "localhost").rsplit("/", 1)[0] + f"/files/{WHEEL}", None)
    _Pep691.auth.clear()
    assert ix._hash_download(other).sha256 == SHA
    assert _Pep691.auth == [None]  # another host never sees them


def test_html_without_hashes_is_hashed_by_download(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / WHEEL).write_bytes(BODY)
    root = layout(wh, tmp_path / "root", hashes=False)
    with serve(root) as url:
        files = SimpleIndex(f"{url}/simple", cache=None).files("demo", Version("1.0"))
    assert [(f.filename, f.sha256, f.size) for f in files] == [(WHEEL, SHA, len(BODY))]


def test_parse_html_reads_fragments_and_yanked() -> None:
    page = ('<a href="/f/demo-1.0-py3-none-any.whl#sha256=' + "A" * 64 + '" data-requires-python="&gt;=3.8">'
            'demo-1.0-py3-none-any.whl</a><a href="demo-1.0.tar.gz#md5=00" data-yanked="">demo-1.0.tar.gz</a>'
            '<a>no href</a>')
    rows = parse_html(page, "https://h.example/simple/demo/")
    assert rows == [
        IndexFile("demo-1.0-py3-none-any.whl", "https://h.example/f/demo-1.0-py3-none-any.whl", "a" * 64),
        IndexFile("demo-1.0.tar.gz", "https://h.example/simple/demo/demo-1.0.tar.gz", None, None, True),
    ]


def test_redact_drops_credentials_only() -> None:
    assert redact("https://u:tok@h.example:8443/simple") == "https://h.example:8443/simple"
    assert redact("https://h.example/simple") == "https://h.example/simple"


def test_files_fit_the_locks_platform(restore_lock: LockFactory) -> None:
    lock = restore_lock()  # cpython 3.11, Linux x86_64, glibc 2.36
    tags = lock_tags(lock)
    names = [
        "n-1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "n-1-cp311-cp311-manylinux_2_39_x86_64.whl",  # needs a newer glibc
        "n-1-cp312-cp312-manylinux_2_17_x86_64.whl",
        "n-1-cp311-cp311-manylinux_2_17_aarch64.whl",
        "n-1-cp311-cp311-musllinux_1_2_x86_64.whl",
        "n-1-py3-none-any.whl",
        "n-1.tar.gz",
    ]
    files = [IndexFile(n, "u", "0" * 64) for n in names]
    assert pick(files, tags) == [names[0], names[5]]
    assert pick([files[-1]], tags) == ["n-1.tar.gz"]  # no wheel: the sdist
    mac = restore_lock(platform={"os": "Darwin", "machine": "arm64"})
    assert lock_tags(mac) is None and pick(files, None) == names[:-1]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_parse_html_never_raises(page: str) -> None:
    for row in parse_html(page, "https://h.example/simple/x/"):
        assert row.sha256 is None or len(row.sha256) == 64


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=20)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["files", "meta", "name"]), json_values | st.lists(
    st.dictionaries(st.sampled_from(["filename", "url", "hashes", "size", "yanked"]), json_values),
    max_size=3)))
def test_fuzz_parse_json_rejects_or_reads(doc: dict[str, object]) -> None:
    try:
        rows = parse_json(doc, "https://h.example/simple/x/")
    except ValueError:
        assert not isinstance(doc.get("files"), list)
        return
    assert all(isinstance(r.filename, str) for r in rows)


class _Recorder(_Pep691):
    """Serves ``_Pep691``'s JSON page and wheel at ``/simple/demo/``; ``/redirect/...`` answers 302
    to ``target`` + the rest of the path. Every request's Authorization header is recorded."""

    target = ""
    base = ""
    hits: list[tuple[str, str | None]]

    def do_GET(self) -> None:
        self.hits.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/redirect/"):
            self.send_response(302)
            self.send_header("Location", self.target + self.path.removeprefix("/redirect"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()


@pytest.fixture
def two_hosts() -> Iterator[tuple[type[_Recorder], type[_Recorder]]]:
    """Two indexes on 127.0.0.1, two ports: two origins, as two hosts would be. Each server
    thread stops with the test (shutdown), a request times out after 10 s at most."""
    handlers: list[type[_Recorder]] = [type(f"Host{i}", (_Recorder,), {"hits": [], "timeout": 10})
                                       for i in (0, 1)]
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), h) for h in handlers]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for h, s in zip(handlers, servers, strict=True):
        h.base = f"http://127.0.0.1:{s.server_address[1]}"
    for t in threads:
        t.start()
    try:
        yield handlers[0], handlers[1]
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_credentials_are_dropped_on_a_redirect_to_another_host(
        two_hosts: tuple[type[_Recorder], type[_Recorder]]) -> None:
    """Issue 18 item 2: urllib copied ``Authorization`` onto a 302 to another host."""
    a, b = two_hosts
    a.target = b.base
    url = a.base.replace("http://", "http://alice:PW@") + "/redirect/simple"
    assert SimpleIndex(url).files("demo", Version("1.0"))
    assert [p for p, _ in a.hits] == ["/redirect/simple/demo/"] and a.hits[0][1] is not None
    assert b.hits and all(auth is None for _, auth in b.hits), b.hits


def test_credentials_survive_a_redirect_on_the_same_index(
        two_hosts: tuple[type[_Recorder], type[_Recorder]]) -> None:
    """Twin: a redirect within the index's own scheme, host and port keeps the credentials
    (an index that moves its pages behind a 302 still works)."""
    import base64

    a, _ = two_hosts
    a.target = a.base
    url = a.base.replace("http://", "http://alice:PW@") + "/redirect/simple"
    assert SimpleIndex(url).files("demo", Version("1.0"))
    want = "Basic " + base64.b64encode(b"alice:PW").decode()
    assert [auth for p, auth in a.hits if p == "/simple/demo/"] == [want]


def test_an_error_never_shows_the_index_credentials() -> None:
    """Twin pair: the message still names the index (scheme, host, port, path) but neither the
    password nor a ``?token=`` query."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    ix = SimpleIndex(f"http://alice:PW-secret@127.0.0.1:{port}/simple?token=tok-secret")
    with pytest.raises(IndexUnavailable) as err:
        ix.files("demo", Version("1.0"))
    text = f"{err.value.message} {err.value.hint}"
    assert "PW-secret" not in text and "tok-secret" not in text and "alice" not in text
    assert f"127.0.0.1:{port}/simple" in text


def test_shown_keeps_what_names_the_index() -> None:
    assert shown("https://u:tok@h.example:8443/simple/?token=x#frag") == "https://h.example:8443/simple/?..."
    assert shown("https://h.example/simple/") == "https://h.example/simple/"


@pytest.mark.parametrize(("target", "kept"), [
    ("https://idx.example/simple/demo/", True),         # same origin
    ("https://idx.example:443/other/", True),           # the default port is the same port
    ("http://idx.example/simple/demo/", False),         # a downgrade to plain http
    ("https://idx.example:8443/simple/demo/", False),   # another port is another origin
    ("https://files.example/demo.whl", False),          # another host
])
def test_redirect_keeps_credentials_only_within_the_origin(target: str, kept: bool) -> None:
    import urllib.request

    from envlock.export.index import _SameOriginRedirects

    req = urllib.request.Request("https://idx.example/simple/demo/",
                                 headers={"Authorization": "Basic eDp5", "Accept": "text/html"})
    new = _SameOriginRedirects().redirect_request(req, None, 302, "Found", {}, target)
    assert new is not None and new.get_header("Accept") == "text/html"
    assert (new.get_header("Authorization") == "Basic eDp5") is kept


def test_a_file_index_is_read_from_each_projects_index_html_as_pip_reads_it(tmp_path: Path) -> None:
    """A ``file://`` mirror (a copied ``simple/`` tree, as a machine's pip.conf may name) is a
    tree of directories: each project's page is its ``index.html``. A project it lacks is
    absent, not an error."""
    house = tmp_path / "house"
    house.mkdir()
    wheel = house / "demo_pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel's bytes")
    root = layout(house, tmp_path / "mirror")
    index = SimpleIndex((root / "simple").as_uri())
    [found] = index.files("demo-pkg", Version("1.0"))
    assert found.filename == wheel.name
    assert found.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert Path(found.url.split("#")[0].removeprefix("file://")).resolve() == wheel.resolve()
    assert index.files("not-there", Version("1.0")) == []


@pytest.mark.parametrize("reason", [
    "redirected to https://alice:s3cretpw@idx.example/simple/six/?token=t0k3nVALUE",
    "`https://alice:s3cretpw@idx.example/simple/?token=t0k3nVALUE` refused",
    "<urlopen error 'https://alice:s3cretpw@idx.example/simple/#t0k3nVALUE'>",
])
def test_an_errors_reason_shows_its_urls_without_credentials(reason: str) -> None:
    """A library's reason can carry the URL it failed on (a redirect's Location): its password
    and query are not in the message, and the URL is found however it is quoted."""
    from envlock.export.redaction import shown_reason

    text = shown_reason(reason)
    assert "s3cretpw" not in text and "t0k3nVALUE" not in text
    assert "idx.example/simple/" in text


@pytest.mark.parametrize("reason", [
    "[Errno 110] Connection timed out",
    "HTTP 404 for https://idx.example/simple/six/ (not found)",
    "git+ssh form a+b://x is a scheme, xhttps://y is not a separate URL",
])
def test_an_errors_reason_without_credentials_reads_as_it_was(reason: str) -> None:
    """The over-redaction twin: a reason with nothing secret in it is not rewritten."""
    from envlock.export.redaction import shown_reason

    assert shown_reason(reason) == reason
