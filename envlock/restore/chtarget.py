"""``envlock restore PACK --target charliecloud [DIR]``: the lock's image without a daemon.

Charliecloud (``ch-image``, ``ch-convert``, ``ch-run``) builds and runs images unprivileged,
as clusters without Docker allow. ``CharliecloudEngine`` is a ``ContainerEngine``, so the
restore is the Docker one (``restore.restore``): the same plan, the same rendered Dockerfile
and context, the same cache key, and the same check inside the image (``verify.verify_image``,
one verdict). What differs is only how each step is carried out:

- the base comes from a file, never a registry: the pack's OCI archive, unpacked with
  ``umoci unpack --rootless`` (without it umoci creates device nodes, and a ``/dev/full`` of
  the host's kind fills a disk), or a rootfs tarball or directory given as ``--base``. It is
  imported into ch-image's storage under the name the Dockerfile builds ``FROM``: the base's
  image id (a pack), or ``sha256:<digest of the rootfs>``. The OCI config's ``Env`` goes into
  the rootfs's ``ch/metadata.json``, so RUN steps see the base's PATH as Docker's do;
- ``ch-image build`` runs RUN steps with the host's ``/tmp``: a private directory is bound
  there, holding the wheels the Dockerfile copies to ``/tmp/envlock-wheels``, so no step reads
  or writes the host's ``/tmp``. ch-image ignores ``USER``, ``LABEL`` and ``.dockerignore``;
  RUN steps use the host's network (a pack needs none);
- the image is converted to a directory (``ch-convert``) at DIR, with ``ch/envlock.json``
  holding the build context's key: that file is the cache (a restore of the same context finds
  DIR and does not rebuild) and the image's id (Charliecloud has none of its own);
- commands run with ``ch-run --unset-env='*' --set-env``: the image's variables only, none of
  the host's, as in a container of an engine. ``ch-run`` runs as the caller and shares the
  host's network.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envlock.errors import (
    BuildFailed,
    CommandNotFound,
    ContainerFailed,
    EngineUnavailable,
    ImageNotFound,
    UnsafeValue,
    UsageError,
)
from envlock.restore import ociarchive, values
from envlock.restore.context import WHEELS_IN_IMAGE
from envlock.restore.engine import ContainerEngine, ImageInfo, RunResult, RunSpec
from envlock.restore.image import LABEL_CONTEXT, LABEL_SHORT_ID
from envlock.restore.progress import Progress

TOOLS = ("ch-image", "ch-convert", "ch-run")
INSTALL_HINT = "install Charliecloud (Debian and Ubuntu: apt-get install charliecloud)"
MARKER = "ch/envlock.json"  # in a directory image envlock made: its id, tag and context key
MAX_JSON = 4 << 20  # a marker larger than this is not one envlock wrote
TAIL = 12
# ch-image announces each instruction as `<line><mark> INSTRUCTION ...`: `.` run, `*` from its
# build cache, a space when ignored (USER, LABEL).
_STEP_RE = re.compile(r"^\s*\d+[.*]?\s+[A-Z]{2,}\b")
# What ch-run's environment file (``/ch/environment``, one ``NAME=VALUE`` a line) can hold.
_NOT_IN_ENV_FILE = ("\n", "\r", "\0")


@dataclass(frozen=True)
class Completed:
    returncode: int
    output: str  # stdout and stderr together, as a terminal shows them


Runner = Callable[[Sequence[str], Mapping[str, str], "Callable[[str], None] | None"], Completed]


def run_tool(argv: Sequence[str], env: Mapping[str, str],
             on_line: Callable[[str], None] | None = None) -> Completed:
    """Run one Charliecloud or umoci command, its output read line by line as it comes."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=dict(env), text=True, errors="replace")
    except OSError as exc:
        raise EngineUnavailable(f"cannot run {argv[0]}: {exc.strerror or exc}", hint=INSTALL_HINT) from None
    lines = []
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line.rstrip("\n"))
    return Completed(proc.returncode, "".join(lines))


def _tail(done: Completed) -> list[str]:
    return [line for line in done.output.strip().splitlines() if line.strip()][-TAIL:]


def find_tools(*, umoci: bool) -> dict[str, str]:
    """Path of each tool the target needs; a one-line error naming the first one missing."""
    found = {}
    for tool in (*TOOLS, *(("umoci",) if umoci else ())):
        path = shutil.which(tool)
        if path is None:
            if tool == "umoci":
                raise EngineUnavailable("umoci not found on PATH: --target charliecloud unpacks the "
                                        "pack's OCI archive of the base with it",
                                        hint="install umoci (apt-get install umoci), or pass "
                                             "--base ROOTFS.tar|DIR")
            raise EngineUnavailable(f"{tool} not found on PATH: --target charliecloud needs "
                                    "Charliecloud's ch-image, ch-convert and ch-run", hint=INSTALL_HINT)
        found[tool] = path
    return found


def tool_env(storage: Path, tools: Mapping[str, str], environ: Mapping[str, str] | None = None
             ) -> dict[str, str]:
    """The environment ch-image and friends need, from this process's."""
    env = dict(os.environ if environ is None else environ)
    # ch-run refuses to start without $USER (a batch job or a container may not set it).
    env["USER"] = env.get("USER") or pwd.getpwuid(os.getuid()).pw_name
    # ch-image is `#!/usr/bin/env python3` and imports the system's `lark`: the python3 beside
    # it (or the system's) must come first, not an activated venv's.
    first = [str(Path(tools.get("ch-image", "/usr/bin/ch-image")).parent), "/usr/bin"]
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p not in first]
    env["PATH"] = os.pathsep.join(dict.fromkeys(first + rest))
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    env["CH_IMAGE_STORAGE"] = str(storage)
    # ch-image sets up its build cache (a git repository) in new storage even when builds do not
    # use it, and git refuses to commit without an identity; the user's own wins.
    for var, value in (("GIT_AUTHOR_NAME", "envlock"), ("GIT_AUTHOR_EMAIL", "envlock@localhost"),
                       ("GIT_COMMITTER_NAME", "envlock"), ("GIT_COMMITTER_EMAIL", "envlock@localhost")):
        env.setdefault(var, value)
    return env


def instruction_count(dockerfile: str) -> int:
    """How many instructions ch-image will announce: lines that start with one (a continued
    LABEL's next lines are indented)."""
    return sum(1 for line in dockerfile.splitlines() if re.match(r"[A-Z]{2,}\s", line))


def private_dir(path: Path) -> Path:
    """``path``, created mode 700, refused when someone else could write it (or what holds it)."""
    from envlock.probe.statcache import refusal

    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    why = refusal(directory=str(path))
    if why:
        raise UsageError(f"refusing to use {path} for Charliecloud: {why}",
                         hint="make it yours and private (chmod 700)")
    return path


# -- the base: a file, imported under the name the Dockerfile builds FROM -----------------------


def env_file_entries(env: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` entries of an OCI config, as ch-image's metadata holds them.

    ch-image writes them one a line into the image's ``ch/environment``: a newline inside a
    value would add a variable of the base's choosing, so such a value is refused."""
    out: dict[str, str] = {}
    for entry in env:
        name, sep, value = str(entry).partition("=")
        if not sep or any(c in entry for c in _NOT_IN_ENV_FILE):
            raise UnsafeValue(f"refusing the base image's variable {str(entry)[:60]!r}: not one "
                              "NAME=VALUE line")
        out[values.env_name(name)] = value
    return out


def metadata(env: Mapping[str, str]) -> str:
    """ch-image's ``ch/metadata.json`` for an imported base: its variables, the rest default."""
    return json.dumps({"arch": "amd64", "arg": {}, "cwd": "/", "env": dict(env), "history": [],
                       "labels": {}, "shell": ["/bin/sh", "-c"], "volumes": []},
                      indent=2, sort_keys=True) + "\n"


def rootfs_digest(path: Path) -> str:
    """``sha256:`` of a rootfs tarball's bytes, or of a directory's tree (names, modes, link
    targets and contents): the name its import is known by, bound to its content."""
    from envlock._files import sha256_file

    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            full = os.path.join(root, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, path)
            h.update(f"{rel}\0{st.st_mode:o}\0".encode("utf-8", "surrogateescape"))
            if os.path.islink(full):
                h.update(os.readlink(full).encode("utf-8", "surrogateescape"))
            elif os.path.isfile(full):
                h.update(sha256_file(Path(full)).encode())
            h.update(b"\0")
    return "sha256:" + h.hexdigest()


# -- the engine --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Marker:
    """``ch/envlock.json`` of a directory image envlock built."""

    id: str
    tag: str
    labels: Mapping[str, str]


def read_marker(directory: Path) -> Marker | None:
    path = directory / MARKER
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_JSON:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
        return Marker(str(doc["id"]), str(doc["tag"]), {str(k): str(v) for k, v in doc["labels"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _link_tree(src: Path, dest: Path) -> None:
    """``dest`` as a copy of ``src`` made of hard links (a copy where links cannot be made)."""
    shutil.copytree(src, dest, copy_function=_link_or_copy)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class CharliecloudEngine(ContainerEngine):
    """restore's engine interface on Charliecloud: storage in envlock's cache, the image at DIR."""

    name = "charliecloud"

    def __init__(self, storage: Path, dest: Path, *, tools: Mapping[str, str],
                 runner: Runner = run_tool, force: bool = False,
                 environ: Mapping[str, str] | None = None) -> None:
        self.storage = storage
        self.dest = Path(dest).absolute()
        self.tools = dict(tools)
        self.runner = runner
        self.force = force  # ch-image build --force: RUN apt-get needs its workarounds
        self.env = tool_env(storage, tools, environ)
        self._marker = read_marker(self.dest)
        if os.path.lexists(self.dest) and (self.dest.is_symlink() or self._marker is None) \
                and not (self.dest.is_dir() and not any(self.dest.iterdir())):
            raise UsageError(f"refusing to write a Charliecloud image to {self.dest}: it exists and "
                             "is not an image envlock restored there",
                             hint="give another directory, or remove it")

    def _tool(self, name: str) -> str:
        return self.tools.get(name, name)

    def _call(self, argv: Sequence[str], on_line: Callable[[str], None] | None = None) -> Completed:
        return self.runner([self._tool(argv[0]), *argv[1:]], self.env, on_line)

    # images

    def stored(self) -> set[str]:
        """The names ch-image's storage holds (``ch-image list``: read locally, no registry)."""
        done = self._call(["ch-image", "list"])
        if done.returncode != 0:
            raise EngineUnavailable(f"ch-image list failed: {' | '.join(_tail(done)[-2:]) or 'no output'}",
                                    hint=f"storage: {self.storage}")
        return {line.strip() for line in done.output.splitlines() if line.strip()}

    def image(self, ref: str) -> ImageInfo | None:
        marker = self._marker
        if marker is not None and ref in (marker.id, marker.tag, str(self.dest)):
            return ImageInfo(id=marker.id, tags=(marker.tag,), labels=dict(marker.labels), env=self._image_env())
        if ref in self.stored():
            return ImageInfo(id=ref, tags=(ref,))
        return None

    def _image_env(self) -> dict[str, str]:
        """The directory image's variables, which ``ch-run --set-env`` reads from its
        ``ch/environment`` (one ``NAME=VALUE`` a line)."""
        try:
            text = (self.dest / "ch" / "environment").read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            return {}
        return {name: value for name, sep, value in (line.partition("=") for line in text.splitlines()) if sep}

    def pull(self, ref: str) -> ImageInfo:
        raise ImageNotFound(f"{ref} is not in Charliecloud's storage, and envlock pulls nothing for it",
                            hint="restore a pack (`envlock pack`), or pass --base ROOTFS.tar|DIR")

    def tag(self, image_id: str, ref: str) -> None:
        return None  # the directory image's tag is its marker's

    def import_rootfs(self, rootfs: Path, name: str) -> None:
        done = self._call(["ch-image", "import", str(rootfs), name])
        if done.returncode != 0:
            raise BuildFailed(f"ch-image import of {rootfs.name} failed (exit {done.returncode})",
                              log_tail=_tail(done))

    def oci_from_docker_archive(self, archive: Path, work: Path) -> Path:
        """An OCI archive of a pack's docker-archive (a pack made where skopeo was missing),
        converted with skopeo: the file is local and the pack's checksums proved it."""
        skopeo = shutil.which("skopeo")
        if skopeo is None:
            raise EngineUnavailable("the pack has no OCI archive of its base, and skopeo, which would "
                                    "convert its docker-archive, is not installed",
                                    hint="install skopeo (apt-get install skopeo), or pass --base ROOTFS.tar|DIR")
        out = Path(tempfile.mkdtemp(prefix="envlock-oci-", dir=work))

        def run(argv: Sequence[str]) -> tuple[int, str]:
            done = self.runner(argv, self.env, None)
            return done.returncode, done.output

        code, output = ociarchive.to_oci(skopeo, archive, out / "base.oci.tar", run)
        if code != 0:
            shutil.rmtree(out, ignore_errors=True)
            raise BuildFailed(f"skopeo could not convert {archive.name} (exit {code})",
                              log_tail=_tail(Completed(code, output)))
        return out / "base.oci.tar"

    def import_oci(self, archive: Path, name: str, work: Path) -> None:
        """The pack's OCI archive as the ch-image ``name``: unpacked rootless, then imported."""
        with tempfile.TemporaryDirectory(prefix="envlock-base-", dir=work) as tmp:
            layout, bundle = Path(tmp) / "oci", Path(tmp) / "bundle"
            env = env_file_entries(ociarchive.extract_oci(archive, layout))
            # --rootless, always: as root, umoci would otherwise create the image's device nodes.
            done = self._call(["umoci", "unpack", "--rootless", "--image",
                               f"{layout}:{ociarchive.OCI_REF}", str(bundle)])
            if done.returncode != 0:
                raise BuildFailed(f"umoci unpack of {archive.name} failed (exit {done.returncode})",
                                  log_tail=_tail(done))
            rootfs = bundle / "rootfs"
            (rootfs / "ch").mkdir(exist_ok=True)
            (rootfs / "ch" / "metadata.json").write_text(metadata(env), encoding="utf-8")
            self.import_rootfs(rootfs, name)

    def build_argv(self, context: Path, tag: str, private_tmp: Path, *, dockerfile: str = "Dockerfile",
                   buildargs: Mapping[str, str] | None = None) -> list[str]:
        # --no-cache: ch-image's build cache keys a COPY by its files' metadata, and envlock
        # writes the context afresh, so it would not hit; it would cost a git commit of every
        # layer (time, a copy of the image in storage, a git identity). The directory image's
        # marker is the cache of an identical context.
        return ["ch-image", "--no-cache", "build", "--bind", f"{private_tmp}:/tmp",
                *(["--force"] if self.force else []),
                *(f"--build-arg={k}={v}" for k, v in (buildargs or {}).items()),
                "-t", tag, "-f", str(context / dockerfile), str(context)]

    def build(self, context: Path, *, tag: str, labels: Mapping[str, str], log_path: Path,
              progress: Progress, network: bool = True, files: Sequence[str] | None = None,
              dockerfile: str = "Dockerfile", buildargs: Mapping[str, str] | None = None) -> str:
        # `network` cannot be honoured: ch-image's RUN uses the host's (a pack needs none).
        # `files` (what an engine is sent) means nothing here: ch-image reads the context in place.
        image_id = labels.get(LABEL_CONTEXT)
        if not image_id:
            raise BuildFailed("a Charliecloud build needs the build context's key")
        # A new directory (mode 700) beside the context: --context-dir may be the user's own.
        private_tmp = Path(tempfile.mkdtemp(prefix="envlock-tmp-", dir=context.parent))
        if (context / "wheels").is_dir():
            _link_tree(context / "wheels", private_tmp / Path(WHEELS_IN_IMAGE).name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        total = instruction_count((context / dockerfile).read_text(encoding="utf-8"))
        steps = 0
        try:
            with open(log_path, "w", encoding="utf-8") as log:
                def line(text: str) -> None:
                    nonlocal steps
                    log.write(text + "\n")
                    if _STEP_RE.match(text) and steps < total:
                        steps += 1
                        progress.step(steps, total, text.strip())
                    else:
                        progress.line(text)

                try:
                    done = self._call(self.build_argv(context, tag, private_tmp, dockerfile=dockerfile,
                                                      buildargs=buildargs), line)
                finally:
                    progress.close()
            if done.returncode != 0:
                raise BuildFailed(f"ch-image build failed (exit {done.returncode})", log_tail=_tail(done),
                                  log_path=str(log_path), hint=f"full build log: {log_path}")
            self._convert(tag, image_id, labels)
        finally:
            shutil.rmtree(private_tmp, ignore_errors=True)
            # The directory image is the result; the storage keeps the base and the build cache.
            self._call(["ch-image", "delete", f"{tag}*"])
        return image_id

    def _convert(self, tag: str, image_id: str, labels: Mapping[str, str]) -> None:
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.dest.with_name(f".{self.dest.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            done = self._call(["ch-convert", "-i", "ch-image", tag, str(tmp)])
            if done.returncode != 0:
                raise BuildFailed(f"ch-convert of {tag} failed (exit {done.returncode})", log_tail=_tail(done))
            short_id = tag.rpartition(":")[2]
            marker = Marker(image_id, tag, {**labels, LABEL_SHORT_ID: short_id})
            (tmp / "ch").mkdir(exist_ok=True)
            (tmp / MARKER).write_text(json.dumps({"id": marker.id, "tag": marker.tag,
                                                  "labels": dict(marker.labels)}, indent=2) + "\n",
                                      encoding="utf-8")
            if os.path.lexists(self.dest):  # an image envlock restored here (checked when opened)
                shutil.rmtree(self.dest)
            os.replace(tmp, self.dest)
            self._marker = marker
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # containers

    def run_argv(self, spec: RunSpec, private_tmp: Path | None) -> list[str]:
        """``ch-run`` of ``spec`` in the directory image: the image's variables, then the spec's."""
        if spec.gpus:
            raise ContainerFailed("ch-run has no GPU option: inject the host's driver into the image "
                                  "with ch-fromhost --nvidia first")
        argv = ["ch-run", "--unset-env=*", "--set-env"]
        for name, value in spec.env.items():
            values.env_name(name)
            if any(c in value for c in _NOT_IN_ENV_FILE):
                raise UnsafeValue(f"refusing the value of {name}: it holds a line break")
            argv.append(f"--set-env={name}={value}")
        if private_tmp is not None:
            argv += ["-b", f"{private_tmp}:/tmp"]
        for host, inside, _read_only in spec.mounts:  # ch-run binds read-write only
            argv += ["-b", f"{host}:{values.abs_path(inside, what='mount point')}"]
        if spec.workdir:
            argv += ["-c", spec.workdir]
        return [*argv, str(self.dest), "--", *spec.command]

    def run(self, spec: RunSpec, *, on_stdout: Callable[[bytes], None] | None = None,
            on_stderr: Callable[[bytes], None] | None = None) -> RunResult:
        marker = self._marker
        if marker is None or spec.image not in (marker.id, marker.tag, str(self.dest)):
            raise ImageNotFound(f"no Charliecloud image {spec.image} at {self.dest}")
        with tempfile.TemporaryDirectory(prefix="envlock-chrun-") as tmp:
            private_tmp = None
            if spec.files:
                # A /tmp of its own, holding the files: the host's /tmp is not the image's.
                private_tmp = Path(tmp)
                for path, data in spec.files.items():
                    rel = Path(path).relative_to("/tmp") if path.startswith("/tmp/") else None
                    if rel is None or ".." in rel.parts:
                        raise ContainerFailed(f"cannot put {path} into a Charliecloud run: only /tmp/...")
                    (private_tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    (private_tmp / rel).write_bytes(data)
            argv = self.run_argv(spec, private_tmp)
            proc = subprocess.run([self._tool(argv[0]), *argv[1:]], capture_output=True, env=self.env,
                                  stdin=subprocess.DEVNULL, check=False)
        if proc.returncode != 0 and b"can't execve" in proc.stderr:
            raise CommandNotFound(f"cannot start {spec.command[0]} in {self.dest}: "
                                  + proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1][:300])
        if on_stdout and proc.stdout:
            on_stdout(proc.stdout)
        if on_stderr and proc.stderr:
            on_stderr(proc.stderr)
        return RunResult(proc.returncode, proc.stdout, proc.stderr)

    def remove_stale(self) -> int:
        return 0  # ch-run leaves no container behind


def run_command(directory: Path, command: Sequence[str] = ("python", "train.py")) -> str:
    """The shell command that runs ``command`` in the restored image as restore verified it:
    the image's variables, the working directory mounted at /workspace."""
    argv = ["ch-run", "--unset-env=*", "--set-env", "-b", "$PWD:/workspace", "-c", "/workspace",
            str(directory), "--", *command]
    # "$PWD" is the one word the shell must expand; everything else is quoted as data.
    return " ".join('"$PWD":/workspace' if a == "$PWD:/workspace" else shlex.quote(a) for a in argv)
