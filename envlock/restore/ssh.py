"""``envlock run LOCK --ssh``: an SSH server in the replay container, for long-running work.

The image's own ``sshd`` (openssh-server, as PyTorch-CUDA images ship it) runs in the
foreground as a non-root user, key-only: the caller's public key is the one authorised key,
password and keyboard-interactive logins are off, root may not log in. It listens on a port of
the container that is published on 127.0.0.1 only, on a free port. The host key is made for
this run and pinned in a ``known_hosts`` file beside it, so the printed ``ssh`` command checks
the server without trusting it on first use.

Everything sshd reads comes from a private directory mounted read-only at ``/envlock-ssh``:
its configuration, the host key, the authorised key, and a ``passwd``/``group`` pair mounted
over the image's, because sshd refuses a user that ``getpwnam`` does not know and the
container runs as the caller's uid, which the image has never heard of. When the caller is
root the server runs as uid 1000: an SSH server as root is what this option must not offer.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from envlock.errors import HostIncompatible, UsageError

SSH_DIR = "/envlock-ssh"
SSH_USER = "envlock"
INNER_PORT = 2222
_KEY_TYPES = ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub")
_PUBKEY_RE = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp\d+|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( [ -~]*)?$")
_SAFE_VALUE = re.compile(r'^[^"\\\n\r\x00$`]*$')

SSHD_CONFIG = f"""Port {INNER_PORT}
HostKey {SSH_DIR}/hostkey
AuthorizedKeysFile {SSH_DIR}/authorized_keys
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers {SSH_USER}
UsePAM no
StrictModes no
PrintMotd no
PidFile /tmp/envlock-sshd.pid
"""

# Runs in the container: the SetEnv line (PATH as the image sets it, and the run's variables)
# goes first, since sshd keeps the first value of a keyword; then sshd in the foreground.
START = (
    f'S=$(command -v sshd || echo /usr/sbin/sshd); [ -x "$S" ] || {{ echo "envlock: this image has '
    f'no sshd: build it FROM a base with openssh-server (envlock run --base REF)" >&2; exit 127; }}; '
    f'printf "SetEnv PATH=\\"%s\\" %s\\n" "$PATH" "$(cat {SSH_DIR}/setenv)" > /tmp/envlock-sshd_config'
    f' && cat {SSH_DIR}/sshd_config >> /tmp/envlock-sshd_config'
    f' && exec "$S" -D -e -f /tmp/envlock-sshd_config'
)


@dataclass(frozen=True)
class SshServer:
    command: list[str]
    user: str  # uid:gid the container runs as
    mounts: list[tuple[str, str, bool]]
    ports: dict[str, tuple[str, int]]
    login: str  # the ssh command to print


def public_key(path: str | None) -> tuple[str, Path | None]:
    """(the public key line, the matching private key file if it is beside it)."""
    if path is None:
        home = Path.home() / ".ssh"
        found = next((home / n for n in _KEY_TYPES if (home / n).is_file()), None)
        if found is None:
            raise UsageError("--ssh: no public key in ~/.ssh (id_ed25519.pub, id_ecdsa.pub, id_rsa.pub)",
                             hint="make one with `ssh-keygen -t ed25519`, or give --ssh-key FILE.pub")
        key_file = found
    else:
        key_file = Path(path)
    try:
        lines = [ln.strip() for ln in key_file.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--ssh-key {key_file}: cannot be read ({exc})") from None
    if len(lines) != 1 or not _PUBKEY_RE.fullmatch(lines[0]):
        raise UsageError(f"--ssh-key {key_file}: not one OpenSSH public key line",
                         hint="give the .pub file, never the private key")
    private = key_file.with_suffix("") if key_file.suffix == ".pub" else None
    return lines[0], private if private is not None and private.is_file() else None


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 now (the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _setenv(env: Mapping[str, str]) -> str:
    """The run's variables for SetEnv; a value sshd's quoting cannot hold is left out."""
    return " ".join(f'{k}="{v}"' for k, v in sorted(env.items())
                    if k not in ("PATH", "HOME") and _SAFE_VALUE.fullmatch(v))


def prepare(directory: Path, env: Mapping[str, str], key: str | None) -> SshServer:
    """Write sshd's files into ``directory`` (private, removed by the caller) and say how to run
    the server and how to log in."""
    if shutil.which("ssh-keygen") is None:
        raise HostIncompatible("--ssh needs ssh-keygen on this host (an OpenSSH client) to make "
                               "the server's host key")
    line, private = public_key(key)
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        uid, gid = 1000, 1000
    host_key = directory / "hostkey"
    made = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "envlock-run",
                           "-f", str(host_key)], capture_output=True, text=True, timeout=60, check=False)
    if made.returncode != 0:
        raise HostIncompatible(f"ssh-keygen failed: {made.stderr.strip()[:200]}")
    (directory / "authorized_keys").write_text(line + "\n", encoding="utf-8")
    (directory / "sshd_config").write_text(SSHD_CONFIG, encoding="utf-8")
    (directory / "setenv").write_text(_setenv(env), encoding="utf-8")
    (directory / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\n"
        f"{SSH_USER}:x:{uid}:{gid}:envlock:/tmp:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", encoding="utf-8")
    (directory / "group").write_text(f"root:x:0:\n{SSH_USER}:x:{gid}:\nnogroup:x:65534:\n",
                                     encoding="utf-8")
    # sshd refuses a host key its own user can read with group or other bits: it belongs to
    # the server's user (root may hand it to uid 1000), readable by nobody else.
    if uid != os.getuid():
        os.chown(host_key, uid, gid)
    os.chmod(host_key, 0o600)
    for name in ("authorized_keys", "sshd_config", "setenv", "passwd", "group"):
        os.chmod(directory / name, 0o644)
    os.chmod(directory, 0o755)
    port = free_port()
    known = directory / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {(directory / 'hostkey.pub').read_text().strip()}\n",
                     encoding="utf-8")
    identity = f" -i {private}" if private is not None else ""
    login = (f"ssh -p {port}{identity} -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes "
             f"{SSH_USER}@127.0.0.1")
    return SshServer(
        command=["/bin/sh", "-c", START], user=f"{uid}:{gid}",
        mounts=[(str(directory), SSH_DIR, True), (str(directory / "passwd"), "/etc/passwd", True),
                (str(directory / "group"), "/etc/group", True)],
        ports={f"{INNER_PORT}/tcp": ("127.0.0.1", port)}, login=login)


def private_directory() -> Path:
    return Path(tempfile.mkdtemp(prefix="envlock-ssh-"))
