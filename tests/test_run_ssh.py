"""``envlock run --ssh``: the image's sshd, non-root and key-only on 127.0.0.1, reached with a
real ``ssh`` client.

The base image gets openssh-server from .debs that scripts/test.sh downloads on the host
(``ENVLOCK_TEST_SSH_DEBS``: containers reach no mirror); the torch lock is restored onto it with
``--base``, as a user would put a venv onto a PyTorch-CUDA image that ships sshd.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import unavailable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_restore_integration import TORCH, build_source_image, capture, no_leftover_containers

from envlock.restore import ssh

REPO = Path(__file__).resolve().parents[1]


def test_a_public_key_file_is_checked(tmp_path: Path) -> None:
    key = tmp_path / "k.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFake user@host\n")
    (tmp_path / "k").write_text("private")
    line, private = ssh.public_key(str(key))
    assert line.startswith("ssh-ed25519 ") and private == tmp_path / "k"
    (tmp_path / "bad.pub").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n")
    with pytest.raises(Exception, match="not one OpenSSH public key line"):
        ssh.public_key(str(tmp_path / "bad.pub"))
    with pytest.raises(Exception, match="cannot be read"):
        ssh.public_key(str(tmp_path / "missing.pub"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_fuzz_the_public_key_reader(tmp_path: Path, text: str) -> None:
    """Any file content reaches the key check: one valid line comes back as it is, anything else
    is a usage error (exit 2), and nothing with a line break reaches authorized_keys."""
    from envlock.errors import UsageError

    key = tmp_path / "f.pub"
    key.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        line, _ = ssh.public_key(str(key))
    except UsageError:
        return
    assert "\n" not in line and "\r" not in line and line == line.strip()


def test_sshd_config_is_key_only_and_non_root() -> None:
    assert "PasswordAuthentication no" in ssh.SSHD_CONFIG
    assert "KbdInteractiveAuthentication no" in ssh.SSHD_CONFIG
    assert "PermitRootLogin no" in ssh.SSHD_CONFIG and "AuthenticationMethods publickey" in ssh.SSHD_CONFIG


def test_setenv_leaves_out_what_sshd_quoting_cannot_hold() -> None:
    got = ssh._setenv({"A": ":4096:8", "B": 'x"y', "C": "a b", "PATH": "/x", "D": "$(id)"})
    assert got == 'A=":4096:8" C="a b"'


@pytest.fixture(scope="module")
def ssh_base(docker_client: Any, base_image: str) -> str:
    raw = os.environ.get("ENVLOCK_TEST_SSH_DEBS")
    if not raw or not list(Path(raw).glob("openssh-server_*.deb")):
        unavailable("ENVLOCK_TEST_SSH_DEBS is not set or holds no openssh-server .deb; run scripts/test.sh")
    tag = "envlock-test/ssh-base:1"
    try:
        docker_client.images.get(tag)
        return tag
    except Exception:
        pass
    # ucf's and openssh-server's maintainer scripts need debconf/perl the base lacks; the
    # binaries are unpacked all the same, and sshd is all --ssh uses.
    container = docker_client.containers.run(
        base_image, ["sh", "-c", "dpkg -i /debs/*.deb >/dev/null 2>&1; test -x /usr/sbin/sshd"],
        detach=True, network_disabled=True, volumes={raw: {"bind": "/debs", "mode": "ro"}})
    try:
        assert container.wait()["StatusCode"] == 0, container.logs().decode(errors="replace")
        container.commit(repository="envlock-test/ssh-base", tag="1")
    finally:
        container.remove(force=True)
    return tag


@pytest.mark.integration
def test_run_ssh_key_only_as_a_non_root_user(docker_client: Any, base_image: str, wheelhouse: Path,
                                            ssh_base: str, tmp_path: Path) -> None:
    if shutil.which("ssh") is None:
        pytest.fail("an OpenSSH client is needed on the host for this test")
    source = build_source_image(docker_client, base_image, wheelhouse, TORCH,
                                {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, "envlock-test/src-torch")
    lock = tmp_path / "env.lock"
    capture(source, lock)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "ENVLOCK_PLAIN_PROGRESS": "1"}
    argv = [sys.executable, "-m", "envlock", "run", str(lock), "--base", ssh_base, "--wheelhouse",
            str(wheelhouse), "--name", "it-run-ssh", "--context-dir", str(tmp_path / "work"),
            "--workspace", str(tmp_path), "--ssh", "--ssh-key", str(tmp_path / "key.pub")]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("SSH (Ctrl-C stops the server): "):
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert found.wait(900), "".join(lines[-30:])
        login = next(ln for ln in lines if ln.startswith("SSH ")).split(": ", 1)[1].split()
        assert login[0] == "ssh" and login[-1] == "envlock@127.0.0.1" and "-i" in login
        port = int(login[login.index("-p") + 1])
        base = [*login[:-1], "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", login[-1]]
        out = None
        for _ in range(60):  # bounded wait for sshd to listen
            out = subprocess.run([*base, 'python -c "import torch, os; print(torch.__version__, os.getuid())"'],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode == 0:
                break
            time.sleep(0.5)
        assert out is not None and out.returncode == 0, out.stderr if out else lines
        version, uid = out.stdout.split()
        assert version == "2.13.0+cpu" and uid != "0"
        # Password logins are refused: the server offers the public key method only.
        denied = subprocess.run(["ssh", "-p", str(port), "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no",
                                 "-o", "PreferredAuthentications=password,keyboard-interactive",
                                 "-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no",
                                 "envlock@127.0.0.1", "true"], capture_output=True, text=True, timeout=60)
        assert denied.returncode != 0 and "Permission denied (publickey)" in denied.stderr
        # Bound to 127.0.0.1 only: the published port is the loopback's.
        published = docker_client.containers.list(filters={"label": "org.envlock.owner"})
        bindings = [b for c in published for bs in (c.attrs["HostConfig"]["PortBindings"] or {}).values()
                    for b in bs]
        assert bindings and all(b["HostIp"] == "127.0.0.1" for b in bindings)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)
        reader.join(30)
        assert proc.stderr is not None
        proc.stderr.close()
        for image in docker_client.images.list(name="envlock/it-run-ssh"):
            for tag in image.tags:
                try:
                    docker_client.images.remove(tag, noprune=True)
                except Exception:
                    pass
    assert re.search(r"ssh -p \d+ -i \S+ -o UserKnownHostsFile=", "".join(lines))
    no_leftover_containers(docker_client)
