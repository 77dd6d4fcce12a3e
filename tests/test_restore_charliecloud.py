"""``restore --target charliecloud``: command construction, the base import, and what reaches
ch-run's argv, the image's environment file and the printed shell command (a fake runner: no
Charliecloud needed). The real restore is in tests/test_pack_integration.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from helpers import LockFactory

from envlock.commands import main
from envlock.errors import EngineUnavailable, UnsafeValue, UsageError
from envlock.lock import save
from envlock.restore import chtarget, ociarchive
from envlock.restore.chtarget import CharliecloudEngine, Completed
from envlock.restore.engine import RunSpec
from envlock.restore.restore import tagged_image

TOOLS = {"ch-image": "/usr/bin/ch-image", "ch-convert": "/usr/bin/ch-convert", "ch-run": "/usr/bin/ch-run",
         "umoci": "/usr/bin/umoci"}
HOSTILE = ["a b", "it's", 'say "hi"', "$(touch pwned)", "`touch pwned`", "x;touch pwned", "*", "~", "a\\b"]


class FakeRunner:
    """Records every argv; answers ``ch-image list`` with ``stored``; makes umoci's rootfs."""

    def __init__(self, stored: Sequence[str] = ()) -> None:
        self.calls: list[list[str]] = []
        self.stored = list(stored)

    def __call__(self, argv: Sequence[str], env: Mapping[str, str],
                 on_line: Callable[[str], None] | None = None) -> Completed:
        argv = list(argv)
        self.calls.append(argv)
        tool = Path(argv[0]).name
        if tool == "ch-image" and argv[1] == "list":
            return Completed(0, "".join(f"{s}\n" for s in self.stored))
        if tool == "umoci":
            (Path(argv[-1]) / "rootfs" / "etc").mkdir(parents=True)
        if tool == "ch-image" and argv[1] == "import":
            meta = Path(argv[2]) / "ch" / "metadata.json"
            self.imported_metadata = json.loads(meta.read_text())
        if tool == "skopeo":  # its policy file lives as long as the call
            self.skopeo_policy = json.loads(Path(argv[2]).read_text())
        return Completed(0, "")


def _engine(tmp_path: Path, runner: FakeRunner | None = None, **kw: object) -> CharliecloudEngine:
    return CharliecloudEngine(tmp_path / "storage", tmp_path / "img", tools=TOOLS,
                              runner=runner or FakeRunner(), environ={"PATH": "/bin", "USER": "u"}, **kw)  # type: ignore[arg-type]


def _oci_archive(path: Path, env: list[str]) -> Path:
    """A minimal OCI archive as skopeo writes it: one manifest, no ref name."""
    import hashlib

    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return "sha256:" + digest

    config = blob(json.dumps({"config": {"Env": env}}).encode())
    manifest = blob(json.dumps({"config": {"digest": config}, "layers": []}).encode())
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": manifest, "size": 1}]}).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [("index.json", index), ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                           *((f"blobs/sha256/{d}", b) for d, b in blobs.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


# -- the base ------------------------------------------------------------------------------------


def test_oci_base_is_unpacked_rootless_and_keeps_its_variables(tmp_path: Path) -> None:
    runner = FakeRunner()
    archive = _oci_archive(tmp_path / "base.oci.tar", ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
                                                       "OPTS=a=b c"])
    _engine(tmp_path, runner).import_oci(archive, "sha256:" + "a" * 64, tmp_path)
    umoci = [c for c in runner.calls if Path(c[0]).name == "umoci"]
    assert len(umoci) == 1 and umoci[0][1:3] == ["unpack", "--rootless"]
    assert umoci[0][4].endswith(f":{ociarchive.OCI_REF}")
    imported = [c for c in runner.calls if c[1:2] == ["import"]]
    assert imported[0][-1] == "sha256:" + "a" * 64
    assert runner.imported_metadata["env"] == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                                               "OPTS": "a=b c"}
    assert not list(tmp_path.glob("envlock-base-*"))  # the unpacked copy is gone


def test_every_umoci_call_is_rootless(tmp_path: Path) -> None:
    """Without --rootless umoci creates device nodes as root: never."""
    source = Path(chtarget.__file__).read_text()
    assert source.count('"umoci", "unpack"') == 1 and '"umoci", "unpack", "--rootless"' in source


@pytest.mark.parametrize("entry", ["A=1\nB=2", "A=x\rB", "A=\0", "NOVALUE", "BAD NAME=1", "A-B=1"])
def test_a_base_variable_that_would_inject_a_line_is_refused(entry: str) -> None:
    with pytest.raises(UnsafeValue):
        chtarget.env_file_entries([entry])


def test_ordinary_base_variables_pass_unchanged() -> None:
    """The twin: spaces, quotes, '=', '$' are data in a JSON metadata file, not refused."""
    entries = ["A=x y", "B='q' \"d\"", "C=k=v", "D=$HOME/bin", "E="]
    assert chtarget.env_file_entries(entries) == {"A": "x y", "B": "'q' \"d\"", "C": "k=v",
                                                  "D": "$HOME/bin", "E": ""}


def test_an_oci_archive_with_a_link_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "bad.oci.tar"
    with tarfile.open(archive, "w") as tar:
        link = tarfile.TarInfo("index.json")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(UsageError, match="not an OCI archive"):
        ociarchive.extract_oci(archive, tmp_path / "layout")


def test_rootfs_digest_follows_content(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=debian\n")
    os.symlink("etc", root / "link")
    first = chtarget.rootfs_digest(root)
    assert first == chtarget.rootfs_digest(root) and first.startswith("sha256:")
    (root / "etc" / "os-release").write_text("ID=ubuntu\n")
    assert chtarget.rootfs_digest(root) != first


# -- tools and their environment ------------------------------------------------------------------


def test_tool_env_puts_the_system_python_first_and_drops_the_callers_python(tmp_path: Path) -> None:
    env = chtarget.tool_env(tmp_path / "s", TOOLS, {"PATH": "/venv/bin:/usr/bin:/bin", "PYTHONPATH": "/x",
                                                    "VIRTUAL_ENV": "/venv", "GIT_AUTHOR_NAME": "Ada"})
    assert env["PATH"].split(":")[:3] == ["/usr/bin", "/venv/bin", "/bin"]
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env
    assert env["CH_IMAGE_STORAGE"] == str(tmp_path / "s") and env["USER"]
    assert env["GIT_AUTHOR_NAME"] == "Ada" and env["GIT_COMMITTER_EMAIL"] == "envlock@localhost"


def test_a_missing_tool_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None if name == "ch-image" else f"/usr/bin/{name}")
    with pytest.raises(EngineUnavailable, match="ch-image not found") as info:
        chtarget.find_tools(umoci=True)
    assert info.value.exit_code == 3 and "apt-get install charliecloud" in (info.value.hint or "")
    monkeypatch.setattr("shutil.which", lambda name: None if name == "umoci" else f"/usr/bin/{name}")
    with pytest.raises(EngineUnavailable, match="umoci not found"):
        chtarget.find_tools(umoci=True)
    assert chtarget.find_tools(umoci=False)["ch-run"] == "/usr/bin/ch-run"


# -- build and run --------------------------------------------------------------------------------


def test_build_binds_a_private_tmp_and_forces_only_when_asked(tmp_path: Path) -> None:
    argv = _engine(tmp_path).build_argv(tmp_path / "context", "envlock/x:abc", tmp_path / "tmp")
    assert argv[:5] == ["ch-image", "--no-cache", "build", "--bind", f"{tmp_path / 'tmp'}:/tmp"]
    assert "--force" not in argv and argv[-1] == str(tmp_path / "context")
    assert argv[argv.index("-t") + 1] == "envlock/x:abc"
    assert "--force" in _engine(tmp_path, force=True).build_argv(tmp_path, "t", tmp_path / "tmp")


def test_build_converts_marks_and_finds_the_image_again(tmp_path: Path) -> None:
    from envlock.restore.progress import QuietProgress

    runner = FakeRunner()
    builds: list[Path] = []

    def convert(argv: Sequence[str], env: Mapping[str, str], on_line: Callable[[str], None] | None = None
                ) -> Completed:
        if Path(argv[0]).name == "ch-convert":
            Path(argv[-1]).mkdir()
        if "build" in argv[1:3]:  # the wheels the Dockerfile copies to /tmp, where RUN looks
            private = Path(argv[argv.index("--bind") + 1].rsplit(":", 1)[0])
            assert (private / "envlock-wheels" / "torch" / "t.whl").read_bytes() == b"w"
            assert private.stat().st_mode & 0o077 == 0
            builds.append(private)
        return runner(argv, env, on_line)

    context = tmp_path / "work" / "context"
    (context / "wheels" / "torch").mkdir(parents=True)
    (tmp_path / "work" / "tmp").mkdir()  # a directory of the user's, beside the context
    (tmp_path / "work" / "tmp" / "keep").write_text("mine")
    (context / "wheels" / "torch" / "t.whl").write_bytes(b"w")
    (context / "Dockerfile").write_text("FROM x\n")
    engine = CharliecloudEngine(tmp_path / "storage", tmp_path / "img", tools=TOOLS, runner=convert)
    labels = {"org.envlock.context": "sha256:" + "c" * 64}
    image_id = engine.build(context, tag="envlock/x:abc", labels=labels, log_path=tmp_path / "build.log",
                            progress=QuietProgress())
    assert image_id == "sha256:" + "c" * 64
    assert len(builds) == 1  # the checks of the private /tmp above ran
    assert [Path(runner.calls[-1][0]).name, *runner.calls[-1][1:]] == ["ch-image", "delete", "envlock/x:abc*"]
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["context", "tmp"]  # no private /tmp left
    assert (tmp_path / "work" / "tmp" / "keep").read_text() == "mine"
    again = CharliecloudEngine(tmp_path / "storage", tmp_path / "img", tools=TOOLS, runner=FakeRunner())
    found = tagged_image(again, "envlock/x:abc", labels)
    assert found is not None and found.id == image_id and found.tags == ("envlock/x:abc",)
    assert tagged_image(again, "envlock/x:abc", {"org.envlock.context": "sha256:" + "d" * 64}) is None
    assert tagged_image(again, "envlock/y:abc", labels) is None
    # The image's variables, which ch-run --set-env reads: a recorded run keeps its PYTHONPATH.
    (tmp_path / "img" / "ch").mkdir(exist_ok=True)
    (tmp_path / "img" / "ch" / "environment").write_text("PATH=/usr/bin\nPYTHONPATH=/opt/lib:/x=1\n")
    info = again.image(image_id)
    assert info is not None and info.env == {"PATH": "/usr/bin", "PYTHONPATH": "/opt/lib:/x=1"}


def test_a_directory_envlock_did_not_make_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "thesis.tex").write_text("x")
    with pytest.raises(UsageError, match="not an image envlock restored"):
        _engine(tmp_path)


def test_storage_lookup_reads_ch_image_list(tmp_path: Path) -> None:
    engine = _engine(tmp_path, FakeRunner(stored=["sha256:" + "a" * 64]))
    assert engine.image("sha256:" + "a" * 64) is not None
    assert engine.image("sha256:" + "b" * 64) is None


def test_run_argv_keeps_only_the_images_variables_and_passes_values_as_data(tmp_path: Path) -> None:
    spec = RunSpec(image="x", command=["python", "/tmp/envlock-probe", "--x"],
                   env={f"V{i}": v for i, v in enumerate(HOSTILE)}, mounts=[("/data set", "/workspace", False)],
                   workdir="/workspace")
    argv = _engine(tmp_path).run_argv(spec, tmp_path / "t")
    assert argv[:3] == ["ch-run", "--unset-env=*", "--set-env"]
    assert [a for a in argv if a.startswith("--set-env=")] == [f"--set-env=V{i}={v}" for i, v in enumerate(HOSTILE)]
    assert argv[argv.index("--") + 1:] == ["python", "/tmp/envlock-probe", "--x"]
    assert f"{tmp_path / 't'}:/tmp" in argv and "/data set:/workspace" in argv


@pytest.mark.parametrize("env", [{"A": "x\nB=y"}, {"A": "x\ry"}, {"BAD NAME": "1"}])
def test_run_argv_refuses_what_would_become_another_variable(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(UnsafeValue):
        _engine(tmp_path).run_argv(RunSpec(image="x", command=["true"], env=env), None)


@pytest.mark.parametrize("name", [*HOSTILE[:-2], "new\nline"])
def test_the_printed_ch_run_command_runs_as_data_in_a_shell(tmp_path: Path, name: str) -> None:
    """The command restore prints for the user's shell: a hostile image path stays one word."""
    directory = tmp_path / name / "img"
    command = chtarget.run_command(directory)
    assert command.startswith("ch-run ")
    shown = subprocess.run(["bash", "-c", "printf '%s\\n' " + command[len("ch-run "):]], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert shown.split("\n")[:-1] == ["--unset-env=*", "--set-env", "-b", f"{tmp_path}:/workspace", "-c",
                                      "/workspace", *str(directory).split("\n"), "--", "python", "train.py"]
    assert not (tmp_path / "pwned").exists()


# -- the command line ------------------------------------------------------------------------------


def _lock_file(tmp_path: Path, restore_lock: LockFactory, **python: str) -> Path:
    py = {"version": "3.11.2", "implementation": "cpython", "prefix_kind": "venv", "prefix": "/opt/venv",
          "soabi": "cpython-311-x86_64-linux-gnu", **python}
    path = tmp_path / "env.lock"
    save(restore_lock(python=py), path)
    return path


def test_target_charliecloud_without_a_base_file_is_a_usage_error(tmp_path: Path, restore_lock: LockFactory,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    lock = _lock_file(tmp_path, restore_lock)
    assert main(["restore", str(lock), "--target", "charliecloud"]) == 2
    assert "imports its base from a file" in capsys.readouterr().err


def test_target_charliecloud_takes_at_most_one_directory(tmp_path: Path, restore_lock: LockFactory,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    lock = _lock_file(tmp_path, restore_lock)
    assert main(["restore", str(lock), "--target", "charliecloud", "a", "b"]) == 2
    assert "charliecloud [DIR]" in capsys.readouterr().err


def test_a_venv_under_tmp_is_refused_before_anything_runs(tmp_path: Path, restore_lock: LockFactory,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    lock = _lock_file(tmp_path, restore_lock, prefix="/tmp/project/.venv")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    assert main(["restore", str(lock), "--target", "charliecloud", "--base", str(rootfs)]) == 2
    err = capsys.readouterr().err
    assert "shares /tmp with the host" in err and "--venv /opt/venv" in err


def test_missing_charliecloud_exits_3_in_one_line(tmp_path: Path, restore_lock: LockFactory,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    lock = _lock_file(tmp_path, restore_lock)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert main(["restore", str(lock), "--target", "charliecloud", "--base", str(rootfs)]) == 3
    err = capsys.readouterr().err
    assert "ch-image not found" in err and "Traceback" not in err


def test_a_base_that_is_not_a_file_is_a_usage_error(tmp_path: Path, restore_lock: LockFactory,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    lock = _lock_file(tmp_path, restore_lock)
    assert main(["restore", str(lock), "--target", "charliecloud", "--base", "debian:12"]) == 2
    assert "takes the base as a file" in capsys.readouterr().err


def test_build_output_becomes_steps_of_the_dockerfiles_instructions(tmp_path: Path) -> None:
    from envlock.restore.progress import PlainProgress

    output = ["  4* FROM sha256:aa AS envlock-build", "warning: not supported, ignored: USER instruction",
              "  5  USER (unsupported)", " 11. RUN [\"python3\", \"-m\", \"venv\", \"/opt/venv\"]",
              "Successfully installed six-1.16.0", "  2 files copied"]

    def runner(argv: Sequence[str], env: Mapping[str, str], on_line: Callable[[str], None] | None = None
               ) -> Completed:
        if Path(argv[0]).name == "ch-image" and "build" in argv[1:3] and on_line:
            for text in output:
                on_line(text)
        if Path(argv[0]).name == "ch-convert":
            Path(argv[-1]).mkdir()
        return Completed(0, "")

    context = tmp_path / "w" / "context"
    context.mkdir(parents=True)
    (context / "Dockerfile").write_text('FROM x AS b\nUSER root\n\n# c\nRUN ["true"]\nLABEL "a"="b" \\\n'
                                        '      "c"="d"\nUSER 1000:1000\n')
    assert chtarget.instruction_count((context / "Dockerfile").read_text()) == 5
    stream = io.StringIO()
    CharliecloudEngine(tmp_path / "s", tmp_path / "img", tools=TOOLS, runner=runner).build(
        context, tag="envlock/x:abc", labels={"org.envlock.context": "sha256:" + "e" * 64},
        log_path=tmp_path / "build.log", progress=PlainProgress(stream))
    shown = stream.getvalue().splitlines()
    assert shown[0] == "[1/5] 4* FROM sha256:aa AS envlock-build"
    assert "[3/5] 11. RUN [\"python3\", \"-m\", \"venv\", \"/opt/venv\"]" in shown
    # ch-image's own lines are in the log, not in envlock's progress.
    assert not any("Successfully installed six-1.16.0" in line for line in shown)
    assert (tmp_path / "build.log").read_text().splitlines() == output


def test_a_pack_without_an_oci_archive_is_converted_with_skopeo(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    runner = FakeRunner()
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    archive = tmp_path / "base.docker.tar"
    out = _engine(tmp_path, runner).oci_from_docker_archive(archive, tmp_path)
    (argv,) = runner.calls
    assert argv[0] == "/usr/bin/skopeo" and argv[3:5] == ["copy", "--quiet"]
    assert argv[-2:] == [f"docker-archive:{archive}", f"oci-archive:{out}"]
    assert runner.skopeo_policy == {"default": [{"type": "insecureAcceptAnything"}]}
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(EngineUnavailable, match="skopeo"):
        _engine(tmp_path, runner).oci_from_docker_archive(archive, tmp_path)


@pytest.mark.parametrize("rel", ["/etc/passwd", "../outside.tar", "image/../../x"])
def test_a_pack_manifest_cannot_point_the_oci_archive_outside_the_pack(tmp_path: Path, rel: str) -> None:
    from envlock.restore.packdir import Pack

    with pytest.raises(UsageError, match="outside the pack"):
        _ = Pack(tmp_path, {"oci_archive": rel}).oci_archive
    assert Pack(tmp_path, {"oci_archive": "image/base.oci.tar"}).oci_archive == tmp_path / "image/base.oci.tar"
