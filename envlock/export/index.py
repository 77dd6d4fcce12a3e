"""Find the artifact (file name, URL, sha256) behind each ``name==version`` of a lock.

A lock records what is installed, not the file it came from, yet pylock.toml and
``--require-hashes`` need the file's hash. The package index says: its simple API lists every
file of a project with a hash (PEP 691 JSON, or PEP 503 HTML with ``#sha256=`` fragments).
Listings are cached on disk per index and project; a cached listing is used only while it
still names the wanted version, so a new release never hides behind a stale cache and no
expiry time is needed. Files are immutable on an index, so their hashes never go stale.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from envlock.errors import WHEELHOUSE_HINT, IndexUnavailable, UsageError
from envlock.export.redaction import public, redact, shown, shown_reason
from envlock.probe.scrub import scrub_string, url_tokens
from envlock.probe.statcache import cache_dir, read_cache, write_cache

ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
TIMEOUT = 60.0
MAX_PAGE = 64 << 20
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")  # torch's project page on the PyTorch index is a few MB


@dataclass(frozen=True)
class IndexFile:
    """One file of a project as an index lists it."""

    filename: str
    url: str
    sha256: str | None  # hex; None when the index gives no hash (it is then computed)
    size: int | None = None
    yanked: bool = False

    @property
    def version(self) -> Version | None:
        try:
            if self.filename.endswith(".whl"):
                return parse_wheel_filename(self.filename)[1]
            if self.filename.endswith((".tar.gz", ".zip")):
                return parse_sdist_filename(self.filename)[1]
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            return None
        return None


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in: what a credential is for."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """urllib copies every header of a request onto its redirect, ``Authorization`` included,
    whatever host the ``Location`` names. A redirect to another scheme, host or port loses it
    (as pip and requests do), so an index's credentials reach that index only."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) != _origin(req.full_url):
            for name in ("Authorization", "Proxy-Authorization", "Cookie"):
                new.remove_header(name)
                new.remove_header(name.capitalize())
        return new


_OPENER = urllib.request.build_opener(_SameOriginRedirects)


def cache_root() -> Path:
    return Path(cache_dir())


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[tuple[dict[str, str | None], str]] = []
        self._open: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open, self._text = dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.rows.append((self._open, "".join(self._text).strip()))
            self._open = None


def parse_html(text: str, page_url: str) -> list[IndexFile]:
    """PEP 503: one anchor per file, the hash (if any) in the URL fragment."""
    parser = _Anchors()
    parser.feed(text)
    out = []
    for attrs, label in parser.rows:
        href = attrs.get("href")
        if not href:
            continue
        url, fragment = urldefrag(urljoin(page_url, href))
        name = label or url.rsplit("/", 1)[-1]
        algo, _, value = fragment.partition("=")
        sha = value.lower() if algo == "sha256" and _HEX64.fullmatch(value) else None
        out.append(IndexFile(name, url, sha, None, "data-yanked" in attrs))
    return out


def parse_json(data: Any, page_url: str) -> list[IndexFile]:
    """PEP 691: ``files`` with ``filename``, ``url`` and a ``hashes`` table."""
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise ValueError("no 'files' list")
    out = []
    for row in data["files"]:
        if not isinstance(row, dict) or not isinstance(row.get("filename"), str):
            continue
        hashes = row.get("hashes")
        sha = hashes.get("sha256") if isinstance(hashes, dict) else None
        sha = sha if isinstance(sha, str) and _HEX64.fullmatch(sha) else None
        size = row.get("size") if isinstance(row.get("size"), int) else None
        url = urldefrag(urljoin(page_url, str(row.get("url", ""))))[0]
        out.append(IndexFile(row["filename"], url, sha.lower() if sha else None, size,
                             bool(row.get("yanked"))))
    return out


class SimpleIndex:
    """One simple-API index, read over HTTP(S) or ``file:``, with an on-disk listing cache."""

    def __init__(self, url: str, *, cache: Path | None = None, refresh: bool = False) -> None:
        try:
            parts = urlsplit(url)
            username, password = parts.username, parts.password
            self.url = redact(url).rstrip("/") + "/"
        except ValueError as exc:  # "Invalid IPv6 URL", a port out of range
            raise UsageError(f"index URL {shown(url)!r} is not a valid URL: {exc}") from None
        if parts.scheme not in ("http", "https", "file"):
            raise UsageError(f"index URL {shown(url)!r} is not http(s):// or file://")
        # user:password in the URL becomes a Basic header, sent only to the index's own host;
        # the URL kept (for requests and the cache key) has none. A token in the path or the
        # query is part of the address and stays in ``url``; ``public`` is what outputs show.
        self._auth: tuple[tuple[str, str, int | None], str] | None = None
        if username is not None:
            token = base64.b64encode(f"{unquote(username)}:{unquote(password or '')}".encode())
            self._auth = (_origin(url), "Basic " + token.decode())
        self.public = public(self.url)
        # The index's own credentials, to take out of the file URLs it lists (relative links
        # carry its path token along).
        self._tokens = sorted(set(url_tokens(url, index=True)), key=len, reverse=True)
        self.cache = cache
        self.refresh = refresh

    def public_file(self, url: str) -> str:
        """The URL of a file this index lists, as an output may carry it: ``strip_url`` (a
        presigned ``X-Amz-Signature``, ``X-Goog-Signature`` or SAS ``sig`` goes) and the
        index's own tokens replaced, in any form (``scrub_string``: percent-encoded too). Not
        ``public``: a file's path holds content hashes."""
        return scrub_string(url, self._tokens)

    def _cache_path(self, name: str) -> Path | None:
        if self.cache is None:
            return None
        key = hashlib.sha256(self.url.encode()).hexdigest()[:24]
        return self.cache / "simple" / key / f"{name}.json"

    def _request(self, url: str, accept: str) -> urllib.request.Request:
        headers = {"Accept": accept, "User-Agent": "envlock"}
        if self._auth and _origin(url) == self._auth[0]:
            headers["Authorization"] = self._auth[1]
        return urllib.request.Request(url, headers=headers)

    def _get(self, url: str, accept: str) -> tuple[bytes, str] | None:
        """Body and content type; None for 404 (the project is not on this index)."""
        req = self._request(url, accept)
        try:
            with _OPENER.open(req, timeout=TIMEOUT) as resp:
                body = resp.read(MAX_PAGE + 1)
                ctype = resp.headers.get("Content-Type", "") if hasattr(resp, "headers") else ""
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 410):
                return None
            raise IndexUnavailable(f"{shown(url)} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            if urlsplit(url).scheme == "file" and isinstance(exc, urllib.error.URLError) and \
                    isinstance(exc.reason, FileNotFoundError):
                return None
            reason = getattr(exc, "reason", exc)
            raise IndexUnavailable(f"cannot reach {shown(url)}: {shown_reason(reason)}",
                                   hint=f"pass --index-url, or {WHEELHOUSE_HINT} to work offline") from None
        if len(body) > MAX_PAGE:
            raise IndexUnavailable(f"{shown(url)} is larger than {MAX_PAGE >> 20} MiB")
        return body, ctype or ""

    def _fetch(self, name: str) -> list[IndexFile]:
        page = self.url + name + "/"
        # A file: index is a tree of directories, each page its index.html, as pip reads it
        # (a mirror made with `pip download` + a page generator, or a copied simple/ tree).
        got = self._get(page + "index.html" if urlsplit(page).scheme == "file" else page, ACCEPT)
        if got is None:
            return []
        body, ctype = got
        try:
            if "json" in ctype:
                return parse_json(json.loads(body), page)
            return parse_html(body.decode("utf-8", "replace"), page)
        except ValueError as exc:
            raise IndexUnavailable(f"{shown(page)} is not a simple-API page: {exc}") from None

    def files(self, name: str, version: Version) -> list[IndexFile]:
        """Every file of ``name`` at exactly ``version`` (local label included), hashed."""
        path = self._cache_path(name)
        if path is not None and not self.refresh:
            # Only the caller's own entry, naming this index and project, is trusted: one
            # planted in a shared cache directory (or moved from another index) could give
            # any hash.
            raw = read_cache(str(path), MAX_PAGE, str(self.cache))
            try:
                entry = json.loads(raw) if raw is not None else None
                if isinstance(entry, dict) and entry.get("index") == self.url \
                        and entry.get("project") == name:
                    rows = [IndexFile(**r) for r in entry["files"]]
                    hit = [f for f in rows if f.version == version]
                    if hit and all(f.sha256 for f in hit):
                        return hit
            except (ValueError, TypeError, KeyError, RecursionError):
                pass  # a broken cache entry is refetched and overwritten
        rows = self._fetch(name)
        hit = [f for f in rows if f.version == version and not f.yanked] or \
              [f for f in rows if f.version == version]
        hit = [f if f.sha256 else self._hash_download(f) for f in hit]
        if path is not None and rows:
            done = {f.filename: f for f in hit}
            keep = [done.get(f.filename, f) for f in rows]
            write_cache(str(path), {"index": self.url, "project": name,
                                    "files": [f.__dict__ for f in keep]}, str(self.cache))
        return hit

    def _hash_download(self, f: IndexFile) -> IndexFile:
        """An index without hashes (a plain directory listing): hash the file, streamed."""
        h, size = hashlib.sha256(), 0
        req = self._request(f.url, "*/*")
        try:
            with _OPENER.open(req, timeout=TIMEOUT) as resp:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    h.update(chunk)
                    size += len(chunk)
        except (urllib.error.URLError, OSError) as exc:
            raise IndexUnavailable(f"{shown(f.url)} is listed but cannot be downloaded: "
                                   f"{shown_reason(getattr(exc, 'reason', exc))}") from None
        return IndexFile(f.filename, f.url, h.hexdigest(), size, f.yanked)


    def download(self, f: IndexFile, dest: Path) -> Path:
        """``f`` into ``dest`` under its own name, streamed and checked against the sha256 the
        index listed (a file that is not what the listing promised never lands)."""
        name = Path(f.filename).name
        if not name or name != f.filename or name.startswith("."):
            raise IndexUnavailable(f"{shown(f.url)} lists a file named {f.filename!r}, not a plain file name")
        final = dest / name
        tmp = dest / f".{name}.{os.getpid()}.{threading.get_ident()}.part"
        h = hashlib.sha256()
        try:
            with _OPENER.open(self._request(f.url, "*/*"), timeout=TIMEOUT) as resp, open(tmp, "wb") as out:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    h.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            tmp.unlink(missing_ok=True)
            raise IndexUnavailable(f"cannot download {shown(f.url)}: "
                                   f"{shown_reason(getattr(exc, 'reason', exc))}") from None
        if f.sha256 and h.hexdigest() != f.sha256:
            tmp.unlink(missing_ok=True)
            raise IndexUnavailable(f"{shown(f.url)} does not have the sha256 its index lists")
        os.replace(tmp, final)
        return final


class FlatLinks(SimpleIndex):
    """A find-links location: a local directory of files, or one page of links (pip's and uv's
    ``find-links``, uv's ``format = "flat"`` index). Looked up by file name, as pip does; a
    directory's files are hashed here (never cached: they can change in place)."""

    def __init__(self, location: str, *, cache: Path | None = None, refresh: bool = False) -> None:
        self.directory: Path | None = None
        if "://" not in location:
            self.directory = Path(location)
            location = self.directory.resolve().as_uri()
            cache = None
        super().__init__(location, cache=cache, refresh=refresh)
        if self.directory is None:
            self.url = redact(location)  # a page, as given: its relative links resolve against it
        self.public = public(self.url) if self.directory is None else str(self.directory)
        self._page: list[IndexFile] | None = None
        self._lock = threading.Lock()

    def _all(self) -> list[IndexFile]:
        with self._lock:
            if self._page is None:
                if self.directory is not None:
                    self._page = [IndexFile(p.name, p.resolve().as_uri(), None)
                                  for p in sorted(self.directory.iterdir()) if p.is_file()]
                else:
                    got = self._get(self.url, "text/html")
                    self._page = parse_html(got[0].decode("utf-8", "replace"), self.url) if got else []
            return self._page

    def _fetch(self, name: str) -> list[IndexFile]:
        out = []
        for f in self._all():
            try:
                if f.filename.endswith(".whl"):
                    project = parse_wheel_filename(f.filename)[0]
                elif f.filename.endswith((".tar.gz", ".zip")):
                    project = parse_sdist_filename(f.filename)[0]
                else:
                    continue
            except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
                continue
            if project == canonicalize_name(name):
                out.append(f)
        return out


@dataclass(frozen=True)
class Query:
    """Where to look for one ``name==version``: the first index that has it wins."""

    name: str
    version: str
    indexes: tuple[SimpleIndex, ...]


def resolve(queries: Sequence[Query], *, workers: int = 8,
            errors: dict[str, str] | None = None) -> dict[str, tuple[SimpleIndex, list[IndexFile]]]:
    """name -> (index, files) for every query some index answers; absent names are missing.
    ``errors``: where a name whose indexes did not answer gets the reason, instead of raising."""

    def one(q: Query) -> tuple[str, tuple[SimpleIndex, list[IndexFile]] | None]:
        try:
            return first(q)
        except IndexUnavailable as exc:
            if errors is None:
                raise
            errors[q.name] = exc.message
            return q.name, None

    def first(q: Query) -> tuple[str, tuple[SimpleIndex, list[IndexFile]] | None]:
        want = Version(q.version)
        failed: IndexUnavailable | None = None
        for ix in q.indexes:
            # One place that does not answer (a configured mirror that is down, a find-links
            # page gone) is skipped, as pip skips it; it is the error only when no other has
            # the file.
            try:
                files = ix.files(q.name, want)
            except IndexUnavailable as exc:
                failed = failed or exc
                continue
            if files:
                return q.name, (ix, files)
        if failed is not None:
            raise failed
        return q.name, None

    out: dict[str, tuple[SimpleIndex, list[IndexFile]]] = {}
    if not queries:
        return out
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(queries)))) as pool:
        for name, found in pool.map(one, queries):
            if found is not None:
                out[name] = found
    return out


def names(indexes: Iterable[SimpleIndex]) -> str:
    return ", ".join(shown(ix.url) for ix in indexes)
