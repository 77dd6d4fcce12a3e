"""Where packages come from, as pip and uv are configured here: index, extra indexes, find-links.

``export``, ``bundle`` and ``pack`` fetch what the user's installer would fetch, so they read
the same settings, each as its installer documents them:

- **pip**: ``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``, ``PIP_FIND_LINKS`` (whitespace-separated)
  over its configuration files, which pip reads itself (its ``Configuration``, what ``pip config
  list`` prints: no second reader of pip.conf), the command's own section (``download``, then
  ``install``) over ``global``.
- **uv**: ``UV_DEFAULT_INDEX``/``UV_INDEX_URL``, ``UV_INDEX``/``UV_EXTRA_INDEX_URL``
  (space-separated, ``name=url`` allowed), ``UV_FIND_LINKS`` (comma-separated) over its files:
  ``UV_CONFIG_FILE`` alone when set; otherwise the nearest ``uv.toml``, or ``pyproject.toml``
  with a ``[tool.uv]`` table, from the working directory up (``uv.toml`` wins in one
  directory), then the user's ``uv.toml`` (``$XDG_CONFIG_HOME/uv``), then the system's (the
  first of ``$XDG_CONFIG_DIRS/uv``, ``/etc/uv``); ``UV_NO_CONFIG`` turns discovery off. A string
  setting comes from the first file that has it, lists are concatenated in that order.
  ``[[index]]`` tables count (``default = true`` is the index, ``format = "flat"`` a find-links
  location, ``explicit`` ones are used only when named, so never here), and the ``[pip]`` table
  (uv's pip interface, the one a restore uses) before the top level.

Between the two installers, variables come before files (uv's, then pip's, in each), since a
variable is set for this shell and a file for every use. URLs keep their credentials here:
they are used for fetching (``index.SimpleIndex`` sends them to their own host only) and every
writer shows them through ``redaction.public``.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envlock import _files
from envlock.errors import UsageError
from envlock.probe.scrub import scrub_index_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

MAX_CONFIG_BYTES = 4 << 20  # a pyproject.toml is a few KB; a larger file is not configuration
_UV_NAMED = re.compile(r"^[A-Za-z0-9_.-]+=(?=\S)")


@dataclass(frozen=True)
class InstallerConfig:
    """The merged settings; ``index_url`` None leaves the installer's built-in default."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def local_find_links(self) -> tuple[Path, ...]:
        """The find-links entries that are directories on this machine."""
        return tuple(p for p in (local_dir(e) for e in self.find_links) if p is not None)

    def remote_find_links(self) -> tuple[str, ...]:
        """The find-links entries that are pages to fetch (http(s), or a ``file:`` page)."""
        return tuple(e for e in self.find_links if local_dir(e) is None and "://" in e)


def local_dir(entry: str) -> Path | None:
    """``entry`` as a directory on this machine (a path or a ``file://`` URL), else None."""
    path = entry[len("file://"):] if entry.startswith("file://") else entry
    if "://" in path or not path:
        return None
    try:
        return Path(path) if Path(path).is_dir() else None
    except OSError:
        return None


# -- pip ------------------------------------------------------------------------------------------


def pip_config_items() -> dict[str, str]:
    """``section.key`` -> value from every configuration file pip reads, read by pip's own
    ``Configuration`` (what ``pip config list`` prints; in-process, since a second interpreter
    started only to print it costs more than the rest of a bundle). Nothing when pip is not
    installed beside envlock; a file pip cannot parse is pip's error, said in one line."""
    try:
        module = importlib.import_module("pip._internal.configuration")
        exceptions = importlib.import_module("pip._internal.exceptions")
        configuration = module.Configuration(isolated=False)  # pip has no public API for it
    except (ImportError, AttributeError):
        return {}
    try:
        configuration.load()
        items = list(configuration.items())
    except exceptions.ConfigurationError as exc:
        said = " ".join(scrub_index_text(str(exc)).split())  # configparser quotes the line, over lines
        raise UsageError(f"pip's configuration cannot be read: {said}",
                         hint="fix the file, or set PIP_CONFIG_FILE=/dev/null to ignore pip's configuration") from None
    return {str(k): v for k, v in items if isinstance(v, str)}


def _pip_files(items: Mapping[str, str]) -> tuple[str | None, list[str], list[str]]:
    sections: dict[str, dict[str, str]] = {}
    for key, value in items.items():
        section, _, name = key.rpartition(".")
        if not section.startswith(":"):  # pip's ":env:" pseudo-section: the variables, read as such
            sections.setdefault(section, {})[name] = value
    order = [sections.get(s, {}) for s in ("download", "install", "global")]
    index = next((s["index-url"].strip() for s in order if s.get("index-url", "").strip()), None)
    extras = next((s["extra-index-url"].split() for s in order if "extra-index-url" in s), [])
    links = next((s["find-links"].split() for s in order if "find-links" in s), [])
    return index, extras, links


# -- uv -------------------------------------------------------------------------------------------


def _strings(value: object, key: str, path: Path) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise UsageError(f"{path}: uv setting {key!r} must be a string or a list of strings",
                     hint="fix the file, or set UV_NO_CONFIG=1 to ignore uv's configuration files")


def _one(value: object, key: str, path: Path) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{path}: uv setting {key!r} must be a string",
                         hint="fix the file, or set UV_NO_CONFIG=1 to ignore uv's configuration files")
    return value


@dataclass(frozen=True)
class _UvFile:
    index_url: str | None
    extras: tuple[str, ...]
    links: tuple[str, ...]


def _uv_table(table: Mapping[str, Any], path: Path, where: str) -> _UvFile:
    index = _one(table["index-url"], where + "index-url", path) if "index-url" in table else None
    extras = _strings(table.get("extra-index-url", []), where + "extra-index-url", path)
    links = _strings(table.get("find-links", []), where + "find-links", path)
    entries = table.get("index", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{path}: uv setting {where}index must be an array of tables ([[index]])",
                         hint="fix the file, or set UV_NO_CONFIG=1 to ignore uv's configuration files")
    for entry in entries:
        url = _one(entry.get("url"), where + "index.url", path)
        if entry.get("explicit") is True:
            continue  # used only by the packages that name it: not a place to look
        if entry.get("format") == "flat":
            links.append(url)
        elif entry.get("default") is True:
            index = index or url
        else:
            extras.append(url)
    return _UvFile(index, tuple(extras), tuple(links))


def parse_uv(text: str, path: Path, *, pyproject: bool = False) -> _UvFile | None:
    """The settings of one uv configuration file; None for a pyproject.toml without [tool.uv].
    Anything that is not what uv accepts is a UsageError naming the file (exit 2)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}",
                         hint="fix the file, or set UV_NO_CONFIG=1 to ignore uv's configuration files") from None
    except RecursionError:
        raise UsageError(f"{path} is not valid TOML: nested too deeply") from None
    if pyproject:
        tool = doc.get("tool")
        table = tool.get("uv") if isinstance(tool, dict) else None
        if table is None:
            return None
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [tool.uv] must be a table")
        doc = table
    pip = doc.get("pip", {})
    if not isinstance(pip, dict):
        raise UsageError(f"{path}: uv setting 'pip' must be a table")
    first, top = _uv_table(pip, path, "pip."), _uv_table(doc, path, "")
    return _UvFile(first.index_url or top.index_url, first.extras + top.extras, first.links + top.links)


def _read_text(path: Path) -> str:
    return _files.read_text(path, limit=MAX_CONFIG_BYTES, what="a uv configuration file", error=UsageError)


def uv_config_files(cwd: Path, environ: Mapping[str, str]) -> list[tuple[Path, bool]]:
    """(file, is pyproject) in uv's precedence order, the first the strongest."""
    if environ.get("UV_CONFIG_FILE"):
        return [(Path(environ["UV_CONFIG_FILE"]), False)]
    if environ.get("UV_NO_CONFIG", "").lower() in ("1", "true", "yes", "on"):
        return []
    found: list[tuple[Path, bool]] = []
    for directory in (cwd, *cwd.parents):
        if (directory / "uv.toml").is_file():
            found.append((directory / "uv.toml", False))
            break
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and _has_tool_uv(pyproject):
            found.append((pyproject, True))
            break
    home = environ.get("HOME", "")
    user = Path(environ.get("XDG_CONFIG_HOME") or (Path(home) / ".config" if home else "")) / "uv" / "uv.toml"
    if (environ.get("XDG_CONFIG_HOME") or home) and user.is_file():
        found.append((user, False))
    system = [Path(d) / "uv" / "uv.toml" for d in environ.get("XDG_CONFIG_DIRS", "").split(":") if d]
    for candidate in [*system, Path("/etc/uv/uv.toml")]:
        if candidate.is_file():
            found.append((candidate, False))
            break
    return found


def _has_tool_uv(pyproject: Path) -> bool:
    """Whether a pyproject.toml on the way up is uv configuration. One that is not TOML at all
    is passed over, as uv's discovery passes over it with a warning: it is some project's
    file, not the user's uv settings; a ``[tool.uv]`` table of the wrong shape is an error."""
    try:
        doc = tomllib.loads(_read_text(pyproject))
    except (tomllib.TOMLDecodeError, RecursionError, UsageError):
        return False
    tool = doc.get("tool")
    return isinstance(tool, dict) and "uv" in tool


def _uv_env_list(value: str, sep: str | None) -> list[str]:
    items = value.split(sep) if sep else value.split()
    return [_UV_NAMED.sub("", item.strip()) for item in items if item.strip()]


# -- both -----------------------------------------------------------------------------------------


def read(cwd: Path | None = None, environ: Mapping[str, str] | None = None,
         pip_items: Mapping[str, str] | None = None) -> InstallerConfig:
    """pip's and uv's settings merged as the module docstring says. ``pip_items``: pip's file
    settings when the caller has them (tests), else pip is asked."""
    env = os.environ if environ is None else environ
    here = Path.cwd() if cwd is None else cwd
    uv_files = [f for f in (parse_uv(_read_text(p), p, pyproject=pp) for p, pp in uv_config_files(here, env)) if f]
    pip_index, pip_extras, pip_links = _pip_files(pip_config_items() if pip_items is None else pip_items)

    def env_index() -> str | None:
        for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
            if env.get(var, "").strip():
                return _UV_NAMED.sub("", env[var].strip()) if var.startswith("UV_") else env[var].strip()
        return None

    index = env_index() or next((f.index_url for f in uv_files if f.index_url), None) or pip_index
    extras = [*_uv_env_list(env.get("UV_INDEX", ""), None), *_uv_env_list(env.get("UV_EXTRA_INDEX_URL", ""), None),
              *env.get("PIP_EXTRA_INDEX_URL", "").split(), *(u for f in uv_files for u in f.extras), *pip_extras]
    links = [*_uv_env_list(env.get("UV_FIND_LINKS", ""), ","), *env.get("PIP_FIND_LINKS", "").split(),
             *(u for f in uv_files for u in f.links), *pip_links]
    return InstallerConfig(index, tuple(x for x in dict.fromkeys(extras) if x != index),
                           tuple(dict.fromkeys(links)))
