"""pip's and uv's configuration (index, extra indexes, find-links) as export, bundle and pack
read it; credentials used for fetching, never written.

Indexes are real: a wheelhouse laid out as PEP 503 and served by ``python -m http.server`` on
127.0.0.1 (``export_index.serve``). No configuration or cache of this machine takes part
(``installer_clean``, conftest).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from export_index import layout, serve
from helpers import LockFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock.commands import main
from envlock.errors import UsageError
from envlock.export import config as cfg
from envlock.lock import Lock

from test_restore_run_bundle import make_wheel  # isort: skip

SECRET = "S3cr3tPw-zq91"
CREDS = f"r20user:{SECRET}@"


@pytest.fixture
def house(tmp_path: Path) -> Path:
    d = tmp_path / "house"
    d.mkdir()
    make_wheel(d, "alpha", "1.0")
    make_wheel(d, "beta", "2.0")
    return d


@pytest.fixture
def index(house: Path, tmp_path: Path) -> Iterator[str]:
    """``URL/simple/`` lists alpha and beta; ``URL/main/`` alpha only, ``URL/extra/`` beta only."""
    root = layout(house, tmp_path / "www")
    layout(house, root, simple="main", only=("alpha",))
    layout(house, root, simple="extra", only=("beta",))
    with serve(root) as url:
        yield url


def _lock(restore_lock: LockFactory, tmp_path: Path) -> tuple[Lock, Path]:
    lock = restore_lock(packages=[("alpha", "1.0"), ("beta", "2.0")])
    path = tmp_path / "env.lock"
    lock.save(path)
    return lock, path


def _export(path: Path, to: str, out: Path) -> int:
    return main(["export", str(path), "--to", to, "-o", str(out), "--no-cache"])


# -- reading the settings -------------------------------------------------------------------------


def test_variables_beat_files_and_uv_files_follow_uvs_precedence(installer_clean: Path, tmp_path: Path) -> None:
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "uv"
    user.mkdir(parents=True)
    (user / "uv.toml").write_text('index-url = "https://user.example/simple"\n'
                                  'extra-index-url = ["https://user-extra.example/simple"]\n')
    (installer_clean / "pyproject.toml").write_text('[tool.uv]\nindex-url = "https://pyproject.example/simple"\n')
    got = cfg.read(installer_clean, dict(os.environ), pip_items={})
    assert got.index_url == "https://pyproject.example/simple"
    assert got.extra_index_urls == ("https://user-extra.example/simple",)
    # uv.toml beats pyproject.toml in the same directory; project lists come first.
    (installer_clean / "uv.toml").write_text('extra-index-url = ["https://project-extra.example/simple"]\n'
                                   '[[index]]\nurl = "https://default.example/simple"\ndefault = true\n'
                                   '[[index]]\nurl = "https://named.example/simple"\nexplicit = true\n'
                                   '[[index]]\nurl = "https://flat.example/links.html"\nformat = "flat"\n'
                                   '[pip]\nfind-links = ["/nonexistent/links"]\n')
    got = cfg.read(installer_clean, dict(os.environ), pip_items={})
    assert got.index_url == "https://default.example/simple"
    assert got.extra_index_urls == ("https://project-extra.example/simple", "https://user-extra.example/simple")
    assert got.find_links == ("/nonexistent/links", "https://flat.example/links.html")
    # A variable beats every file; UV_INDEX takes name=url entries.
    env = {**os.environ, "UV_DEFAULT_INDEX": "https://env.example/simple",
           "UV_INDEX": "torch=https://torch.example/whl other=https://other.example/simple",
           "UV_FIND_LINKS": "/a,/b"}
    got = cfg.read(installer_clean, env, pip_items={"global.index-url": "https://pip.example/simple"})
    assert got.index_url == "https://env.example/simple"
    assert got.extra_index_urls[:2] == ("https://torch.example/whl", "https://other.example/simple")
    assert got.find_links[:2] == ("/a", "/b")
    # UV_CONFIG_FILE alone; UV_NO_CONFIG none at all, and pip's files then decide.
    alone = tmp_path / "alone.toml"
    alone.write_text('index-url = "https://alone.example/simple"\n')
    assert cfg.read(installer_clean, {**os.environ, "UV_CONFIG_FILE": str(alone)}, pip_items={}).extra_index_urls == ()
    items = {"global.index-url": "https://pip.example/simple", "download.index-url": "https://dl.example/simple",
             "global.extra-index-url": "https://a.example/simple\nhttps://b.example/simple",
             ":env:.index-url": "https://ignored.example"}
    got = cfg.read(installer_clean, {**os.environ, "UV_NO_CONFIG": "1"}, pip_items=items)
    assert got.index_url == "https://dl.example/simple"
    assert got.extra_index_urls == ("https://a.example/simple", "https://b.example/simple")


@pytest.mark.parametrize("text", ['[project]\nname = "x"\n', "[project\nnot toml at all"])
def test_a_pyproject_without_tool_uv_is_passed_over(installer_clean: Path, text: str) -> None:
    (installer_clean / "pyproject.toml").write_text(text)
    (installer_clean.parent / "uv.toml").write_text('index-url = "https://parent.example/simple"\n')
    assert cfg.read(installer_clean, dict(os.environ), pip_items={}).index_url == "https://parent.example/simple"


def test_pips_own_reading_of_pip_conf_is_used(installer_clean: Path) -> None:
    conf = Path(os.environ["XDG_CONFIG_HOME"]) / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[global]\nindex-url = https://conf.example/simple\nfind-links =\n    /x/one\n    /x/two\n")
    got = cfg.read(installer_clean)
    assert got.index_url == "https://conf.example/simple"
    assert got.find_links == ("/x/one", "/x/two")


def test_a_pip_conf_pip_cannot_parse_is_one_line_without_its_secrets(
        installer_clean: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = Path(os.environ["XDG_CONFIG_HOME"]) / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"index-url = https://{CREDS}conf.example/simple\n[global\n")  # no section header
    lock = installer_clean / "env.lock"
    from helpers import make_lock

    make_lock(packages=[("alpha", "1.0")]).save(lock)
    code = main(["export", str(lock), "--to", "requirements"])
    err = capsys.readouterr().err
    assert code == 2 and "pip's configuration cannot be read" in err and "conf.example" in err
    assert "Traceback" not in err and SECRET not in err and len(err.strip().splitlines()) <= 2


HOSTILE = ['index-url = ["a"]', "extra-index-url = 3", "[[index]]\nurl = 5", "index = 1", "pip = 1",
           "a = [" * 2000, "\x00", 'index-url = "unterminated', "[tool.uv]\nx=1\n[tool.uv]\n"]


@pytest.mark.parametrize("text", HOSTILE)
def test_a_broken_uv_toml_is_one_line_naming_the_file(installer_clean: Path, text: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (installer_clean / "uv.toml").write_text(text)
    with pytest.raises(UsageError, match=r"uv\.toml"):
        cfg.read(installer_clean, pip_items={})
    lock = installer_clean / "env.lock"
    from helpers import make_lock

    make_lock(packages=[("alpha", "1.0")]).save(lock)
    assert main(["export", str(lock), "--to", "requirements"]) == 2
    err = capsys.readouterr().err
    assert "uv.toml" in err and "Traceback" not in err


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=300),
                 st.builds(lambda k, v: f"{k} = {v}\n",
                           st.sampled_from(["index-url", "extra-index-url", "find-links", "index", "pip",
                                            "[[index]]\nurl", "[pip]\nindex-url"]),
                           st.sampled_from(['"x"', "1", "[1]", '["a", 2]', "{url = 1}", "[{url = 'u'}]",
                                            "true", '"""a\nb"""', "[[]]"]))))
def test_fuzz_uv_toml_reads_or_refuses_in_one_line(text: str) -> None:
    try:
        got = cfg.parse_uv(text, Path("uv.toml"))
    except UsageError as exc:
        assert "\n" not in exc.message.strip() or "TOML" in exc.message
        return
    assert got is not None and all(isinstance(u, str) for u in (*got.extras, *got.links))


# -- each source honoured -------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["PIP_INDEX_URL", "UV_DEFAULT_INDEX", "uv.toml", "pyproject", "pip.conf",
                                    "UV_CONFIG_FILE"])
def test_export_finds_hashes_on_the_configured_index(source: str, installer_clean: Path, index: str, tmp_path: Path,
                                                     restore_lock: LockFactory,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    url = index + "/simple/"
    if source in ("PIP_INDEX_URL", "UV_DEFAULT_INDEX"):
        monkeypatch.setenv(source, url)
    elif source == "uv.toml":
        (installer_clean / "uv.toml").write_text(f'index-url = "{url}"\n')
    elif source == "pyproject":
        (installer_clean / "pyproject.toml").write_text(f'[project]\nname = "p"\n[[tool.uv.index]]\nurl = "{url}"\ndefault = true\n')
    elif source == "UV_CONFIG_FILE":
        (tmp_path / "elsewhere.toml").write_text(f'[pip]\nindex-url = "{url}"\n')
        monkeypatch.setenv("UV_CONFIG_FILE", str(tmp_path / "elsewhere.toml"))
    else:
        conf = Path(os.environ["XDG_CONFIG_HOME"]) / "pip" / "pip.conf"
        conf.parent.mkdir(parents=True)
        conf.write_text(f"[global]\nindex-url = {url}\n")
    _, path = _lock(restore_lock, tmp_path)
    assert _export(path, "requirements", tmp_path / "requirements.txt") == 0
    text = (tmp_path / "requirements.txt").read_text()
    assert text.count("--hash=sha256:") == 2


@pytest.mark.parametrize("how", ["PIP_FIND_LINKS", "UV_FIND_LINKS", "uv.toml", "flat page"])
def test_configured_find_links_are_used_before_an_index_that_does_not_answer(
        how: str, installer_clean: Path, house: Path, index: str, tmp_path: Path, restore_lock: LockFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")  # nothing listens on port 9
    location = f"{index}/files/" if how == "flat page" else str(house)
    if how in ("PIP_FIND_LINKS", "UV_FIND_LINKS"):
        monkeypatch.setenv(how, location)
    elif how == "uv.toml":
        (installer_clean / "uv.toml").write_text(f'find-links = ["{location}"]\n')
    else:
        (installer_clean / "uv.toml").write_text(f'[[index]]\nurl = "{location}"\nformat = "flat"\n')
    _, path = _lock(restore_lock, tmp_path)
    assert _export(path, "requirements", tmp_path / "requirements.txt") == 0
    text = (tmp_path / "requirements.txt").read_text()
    assert text.count("--hash=sha256:") == 2
    assert "--find-links" in text and "127.0.0.1:9" not in text
    assert _export(path, "pylock", tmp_path / "pylock.toml") == 0
    assert "alpha-1.0-py3-none-any.whl" in (tmp_path / "pylock.toml").read_text()


def test_an_index_that_does_not_answer_is_still_named_when_nothing_else_has_the_file(
        installer_clean: Path, tmp_path: Path, restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", f"http://{CREDS}127.0.0.1:9/simple/")
    _, path = _lock(restore_lock, tmp_path)
    assert _export(path, "requirements", tmp_path / "requirements.txt") == 3
    err = capsys.readouterr().err
    assert "127.0.0.1:9" in err and SECRET not in err


def test_bundle_takes_the_configured_indexes_and_downloads_in_parallel(
        installer_clean: Path, index: str, tmp_path: Path, restore_lock: LockFactory) -> None:
    from envlock.export.bundle import bundle

    lock, _ = _lock(restore_lock, tmp_path)
    (installer_clean / "uv.toml").write_text(f'index-url = "http://127.0.0.1:9/simple/"\n'
                                   f'extra-index-url = ["{index}/extra/", "{index}/simple/"]\n')
    result = bundle(lock, tmp_path / "out")
    assert sorted(f[0] for f in result.files) == ["alpha", "beta"]
    assert dict(result.origins) == {"alpha": "index", "beta": "index"}


# -- credentials: used, never written -------------------------------------------------------------


def _written(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*"))
                     if p.is_file() and not p.name.endswith((".whl", ".tar")))


@pytest.mark.parametrize("creds", ["", CREDS], ids=["plain", "credentials"])
def test_export_outputs_never_carry_the_index_credentials(
        creds: str, installer_clean: Path, index: str, tmp_path: Path, restore_lock: LockFactory,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    host = index.replace("http://", f"http://{creds}")
    monkeypatch.setenv("UV_DEFAULT_INDEX", f"{host}/main/")
    monkeypatch.setenv("UV_INDEX", f"{host}/extra/")
    monkeypatch.setenv("PIP_FIND_LINKS", f"{host}/nolinks/")  # a page that is not there
    _, path = _lock(restore_lock, tmp_path)
    (tmp_path / "out").mkdir()
    for to, name in [("requirements", "requirements.txt"), ("pylock", "pylock.toml")]:
        assert _export(path, to, tmp_path / "out" / name) == 0, capsys.readouterr().err
    assert main(["export", str(path), "--to", "cyclonedx", "--hashes", "-o",
                 str(tmp_path / "out" / "sbom.json"), "--no-cache"]) == 0
    text = _written(tmp_path / "out") + capsys.readouterr().err
    assert SECRET not in text and "r20user" not in text
    if not creds:  # the over-redaction twin: an ordinary URL reads as given
        assert f"--extra-index-url {index}/extra\n" in text
        assert f'url = "{index}/files/alpha-1.0-py3-none-any.whl"' in text


@pytest.mark.parametrize("creds", ["", CREDS], ids=["plain", "credentials"])
def test_bundle_and_pack_never_write_the_index_credentials(
        creds: str, installer_clean: Path, index: str, tmp_path: Path, restore_lock: LockFactory,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    host = index.replace("http://", f"http://{creds}")
    (installer_clean / "uv.toml").write_text(f'index-url = "{host}/simple/"\n')
    lock = restore_lock(packages=[("alpha", "1.0"), ("beta", "2.0"), ("gamma", "3.0")])
    path = tmp_path / "env.lock"
    lock.save(path)
    # gamma is on no index: the one-line error names where it looked.
    assert main(["bundle", str(path), "-o", str(tmp_path / "b0")]) == 3
    err = capsys.readouterr().err
    assert SECRET not in err and "gamma==3.0" in err
    if not creds:
        assert f"{index}/simple/" in err
    two = restore_lock(packages=[("alpha", "1.0"), ("beta", "2.0")])
    two.save(path)
    assert main(["bundle", str(path), "-o", str(tmp_path / "b")]) == 0
    assert main(["pack", str(path), "-o", str(tmp_path / "p"), "--no-image"]) == 0
    out = capsys.readouterr()
    text = _written(tmp_path / "b") + _written(tmp_path / "p") + out.out + out.err
    assert SECRET not in text and "r20user" not in text
    assert json.loads((tmp_path / "p" / "pack.json").read_text())["wheels"] == 2


def test_the_configured_index_is_tried_when_the_locks_own_index_is_gone(
        installer_clean: Path, index: str, tmp_path: Path, restore_lock: LockFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    lock = restore_lock(packages=[("alpha", "1.0"), ("beta", "2.0")],
                        env={"PIP_INDEX_URL": "http://127.0.0.1:9/simple/"})
    assert lock.env.get("PIP_INDEX_URL") == "http://127.0.0.1:9/simple/"
    path = tmp_path / "env.lock"
    lock.save(path)
    monkeypatch.setenv("UV_DEFAULT_INDEX", f"{index}/simple/")
    assert _export(path, "requirements", tmp_path / "requirements.txt") == 0
    assert (tmp_path / "requirements.txt").read_text().count("--hash=sha256:") == 2
