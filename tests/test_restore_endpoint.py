"""One engine per command: the endpoint is resolved once, as the docker CLI resolves it
(``restore.endpoint``), and a command-line client that builds is told it.

The contexts here are written where and as ``docker context create`` writes them
(``contexts/meta/<sha256 of the name>/meta.json`` beside ``config.json``); the one test marked
integration has the real docker CLI create them and resolve the same endpoint.
"""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
import socket
import subprocess
import tempfile
import warnings
from pathlib import Path

import pytest
from helpers import unavailable

from envlock.errors import EXIT_ENV, EngineUnavailable
from envlock.restore import clibuild, endpoint

A = "unix:///run/engine-a.sock"
B = "unix:///run/engine-b.sock"


def _context(config: Path, name: str, host: str, *, tls: bool = False) -> None:
    """A context in the CLI's store, as ``docker context create NAME --docker host=HOST`` writes it."""
    key = hashlib.sha256(name.encode()).hexdigest()
    meta = config / "contexts" / "meta" / key / "meta.json"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"Name": name, "Metadata": {},
                                "Endpoints": {"docker": {"Host": host, "SkipTLSVerify": False}}}))
    if tls:
        certs = config / "contexts" / "tls" / key / "docker"
        certs.mkdir(parents=True)
        for part in ("ca", "cert", "key"):
            (certs / f"{part}.pem").write_text("-----BEGIN CERTIFICATE-----\n")


def _current(config: Path, name: str) -> None:
    config.mkdir(parents=True, exist_ok=True)
    (config / "config.json").write_text(json.dumps({"auths": {}, "currentContext": name}))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A docker configuration directory with contexts ctx-a and ctx-b, ctx-a the current one."""
    where = tmp_path / "docker-config"
    _context(where, "ctx-a", A)
    _context(where, "ctx-b", B)
    _current(where, "ctx-a")
    return where


def test_docker_host_first_then_docker_context_then_the_current_context(config: Path) -> None:
    """docker/cli's order (``resolveContextName``): the variable that names a host wins over one
    that names a context, which wins over config.json's ``currentContext``; the default context
    is the default socket."""
    base = {"DOCKER_CONFIG": str(config)}
    assert endpoint.docker_endpoint(base).url == A
    assert endpoint.docker_endpoint({**base, "DOCKER_CONTEXT": "ctx-b"}).url == B
    assert endpoint.docker_endpoint({**base, "DOCKER_CONTEXT": "ctx-b", "DOCKER_HOST": "tcp://h:2375"}).url \
        == "tcp://h:2375"
    assert endpoint.docker_endpoint({**base, "DOCKER_CONTEXT": "default"}).url == endpoint.DEFAULT_DOCKER_SOCKET
    _current(config, "default")
    assert endpoint.docker_endpoint(base).url == endpoint.DEFAULT_DOCKER_SOCKET
    (config / "config.json").unlink()  # no config.json: the store beside it is still read
    assert endpoint.docker_endpoint({**base, "DOCKER_CONTEXT": "ctx-b"}).url == B
    assert endpoint.docker_endpoint(base).url == endpoint.DEFAULT_DOCKER_SOCKET


def test_the_sdk_connects_to_the_context_docker_context_names(config: Path) -> None:
    """The SDK's own lookup reads config.json alone; the endpoint gives it the context's host."""
    where = endpoint.docker_endpoint({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "ctx-b"})
    assert (where.url, where.base_url) == (B, B)


def test_the_client_is_told_the_endpoint_and_no_context_that_disagrees(
        config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command-line client sees DOCKER_HOST of the resolved endpoint and no DOCKER_CONTEXT,
    whichever way the endpoint was found: it builds on the engine envlock tags images on."""
    for environ, want in (({"DOCKER_CONTEXT": "ctx-b"}, B), ({}, A), ({"DOCKER_HOST": "tcp://h:2375"}, "tcp://h:2375")):
        full = {"DOCKER_CONFIG": str(config), "HOME": "/home/u", **environ}
        told = endpoint.docker_endpoint(full).cli_env
        client = clibuild.Client(("docker", "build"), (("DOCKER_BUILDKIT", "1"), *told), "buildkit")
        seen = client.environ({**full, "DOCKER_CONTEXT": environ.get("DOCKER_CONTEXT", "ctx-a")})
        assert seen["DOCKER_HOST"] == want and "DOCKER_CONTEXT" not in seen
        assert seen["DOCKER_BUILDKIT"] == "1" and seen["HOME"] == "/home/u"
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("DOCKER_CONTEXT", "ctx-b")
    for spec in (None, "docker", B):
        named = dict(endpoint.resolve(spec).cli_env)
        assert (named["DOCKER_HOST"], named["DOCKER_CONTEXT"]) == (B, None), spec


def test_a_context_with_tls_gives_the_client_its_certificates(config: Path) -> None:
    _context(config, "secure", "tcp://h:2376", tls=True)
    where = endpoint.docker_endpoint({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "secure"})
    certs = config / "contexts" / "tls" / hashlib.sha256(b"secure").hexdigest() / "docker"
    assert where.tls and (where.tls.ca_cert, where.tls.verify) == (str(certs / "ca.pem"), True)
    assert dict(where.cli_env) == {"DOCKER_HOST": "tcp://h:2376", "DOCKER_CONTEXT": None,
                                   "DOCKER_CERT_PATH": str(certs), "DOCKER_TLS_VERIFY": "1"}
    # Without TLS files, stale TLS variables of the shell do not reach the client.
    plain = endpoint.docker_endpoint({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "ctx-b"})
    assert dict(plain.cli_env)["DOCKER_CERT_PATH"] is None and dict(plain.cli_env)["DOCKER_TLS_VERIFY"] is None


def test_a_context_that_does_not_exist_is_an_error_as_it_is_to_the_cli(config: Path) -> None:
    with pytest.raises(EngineUnavailable) as exc:
        endpoint.docker_endpoint({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "gone"})
    assert exc.value.exit_code == EXIT_ENV and "'gone'" in str(exc.value) and "DOCKER_CONTEXT" in str(exc.value)
    _current(config, "gone-too")
    with pytest.raises(EngineUnavailable) as exc:
        endpoint.docker_endpoint({"DOCKER_CONFIG": str(config)})
    assert "currentContext" in str(exc.value)


def test_the_store_of_docker_config_is_read_without_a_config_json_unlike_docker_py(
        config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the CLI's store is read here and not through ``docker.context.ContextAPI`` (the
    module's docstring): with no config.json in $DOCKER_CONFIG the CLI still reads its
    ``contexts`` (and fails on a context not there), docker-py reads the store beside
    ``~/.docker/config.json`` or ``./contexts``, and gives no error for a context nowhere. Its
    assertions on docker-py fail once it reads as the CLI does: then its lookup can replace the
    hand-written one."""
    (config / "config.json").unlink()
    home, work = tmp_path / "home", tmp_path / "work"
    elsewhere = "unix:///run/engine-elsewhere.sock"
    for store in (home / ".docker", work):
        _context(store, "ctx-b", elsewhere)
        _context(store, "only-elsewhere", elsewhere)
    for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setenv("DOCKER_CONTEXT", "only-elsewhere")
    with pytest.raises(EngineUnavailable, match="only-elsewhere"):
        endpoint.docker_endpoint()
    monkeypatch.setenv("DOCKER_CONTEXT", "ctx-b")
    assert endpoint.docker_endpoint().url == B
    from docker.context import ContextAPI

    theirs = ContextAPI.get_context("ctx-b").Host
    assert theirs == elsewhere, f"docker-py now finds {theirs!r}: see restore/endpoint's docstring"
    _current(home / ".docker", "ctx-b")  # a config.json in HOME moves docker-py to its store alone
    assert endpoint.docker_endpoint().url == B
    assert ContextAPI.get_context("ctx-b").Host == elsewhere
    # No error for a context nowhere: None, which docker 7.2's from_env takes for the default socket.
    assert ContextAPI.get_context("nowhere") is None


def test_the_sdk_client_of_the_default_context_reads_no_context_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default context's client is made from DOCKER_HOST and its TLS variables alone. docker
    7.2's ``from_env`` also looks a context up, in the store beside the first config.json that
    exists: with $DOCKER_CONFIG holding none it took ``~/.docker``'s ``currentContext`` and
    connected there, while the CLI (and ``url``, and the builds) used the default socket."""
    home = tmp_path / "home"
    with tempfile.TemporaryDirectory() as short:  # a socket path must be under 108 bytes
        decoy = Path(short) / "decoy.sock"
        _context(home / ".docker", "decoy", f"unix://{decoy}")
        _current(home / ".docker", "decoy")
        (tmp_path / "cfg").mkdir()
        for name in ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "cfg"))
        where = endpoint.resolve("docker")
        assert where.url == endpoint.DEFAULT_DOCKER_SOCKET
        import docker

        with socket.socket(socket.AF_UNIX) as listening:
            listening.bind(str(decoy))
            listening.listen(1)
            listening.setblocking(False)
            with warnings.catch_warnings():
                # docker-py leaks the socket of a connect that fails (no engine on the default
                # socket here): collected now, not as an unraisable warning of a later test.
                warnings.simplefilter("ignore", ResourceWarning)
                try:
                    where.client(timeout=0.5).close()
                except docker.errors.DockerException:
                    pass  # what matters is where it went
                gc.collect()
            try:
                listening.accept()[0].close()
                reached = True
            except BlockingIOError:
                reached = False
    assert not reached, "the client connected to ~/.docker's current context, not the default socket"


@pytest.mark.integration
def test_the_docker_cli_resolves_the_same_endpoint(tmp_path: Path) -> None:
    """Against the real docker CLI: contexts it creates, and the host it resolves for each way
    of choosing one (``docker context inspect`` of the current context)."""
    docker = shutil.which("docker")
    if docker is None:
        unavailable("no docker CLI on PATH")
    config = tmp_path / "cfg"
    config.mkdir()
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DOCKER_CONFIG": str(config)}

    def cli(*argv: str, **env: str) -> str:
        done = subprocess.run([docker, *argv], env={**base, **env}, capture_output=True, text=True,
                              timeout=30, check=True)
        return done.stdout.strip()

    cli("context", "create", "ctx-a", "--docker", f"host={A}")
    cli("context", "create", "ctx-b", "--docker", f"host={B}")
    cli("context", "use", "ctx-a")
    for env in ({}, {"DOCKER_CONTEXT": "ctx-b"}, {"DOCKER_CONTEXT": "default"},
                {"DOCKER_CONTEXT": "ctx-b", "DOCKER_HOST": "unix:///run/engine-c.sock"}):
        theirs = cli("context", "inspect", "--format", "{{.Endpoints.docker.Host}}", **env)
        assert endpoint.docker_endpoint({**base, **env}).url == theirs, env
