"""CycloneDX, in-toto, Apptainer, Kubernetes and Slurm exports, each checked by its consumer:
cyclonedx-python-lib's strict JSON validator, the in-toto Statement v1 rules, kubernetes-validate
(strict, current Kubernetes), bash and shellcheck. Apptainer itself is not packaged for this
machine, so its definition file is checked for the sections and values apptainer reads."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import LockFactory, run_cli

from envlock.lock import save

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.example:5000/lab/train@{DIGEST}"
K8S_VERSION = "1.34.0"


@pytest.fixture
def gpu_lock(restore_lock: LockFactory, tmp_path: Path) -> Path:
    """A CUDA torch lock from a container with a known digest, two GPUs, numerics pinned."""
    lock = restore_lock(
        image={"in_container": True, "source": "env", "reference": "registry.example:5000/lab/train:v1",
               "digest": DIGEST},
        torch={"version": "2.13.0+cu130", "cuda": "13.0", "cudnn": "91200", "nccl": "2.27.7"},
        gpu={"source": "nvml", "driver": "580.65.06", "cuda_driver": "13.0",
             "devices": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                          "memory_total_mib": 81559, "mig_mode": False} for i in range(2)]},
        determinism={"torch_loaded": True, "deterministic_algorithms": True,
                     "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}},
        seeds={"seed": 1234, "seed_source": "envlock", "python_hash_seed": "0"},
        packages=[("torch", "2.13.0+cu130"), ("six", "1.17.0"),
                  {"name": "demo", "version": "0.1", "source": "vcs", "vcs": "git",
                   "url": "https://git.example/demo.git", "commit": "c" * 40},
                  {"name": "nvidia-cudnn-cu13", "version": "9.12.0.46",
                   "hashes": ["sha256:" + "0" * 64]}],
    )
    return save(lock, tmp_path / "env.lock")


def export(lock: Path, fmt: str, *extra: str) -> str:
    r = run_cli("export", str(lock), "--to", fmt, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.slow
def test_cyclonedx_is_valid_1_6_with_purls_and_stack(gpu_lock: Path) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = export(gpu_lock, "cyclonedx")
    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text, all_errors=True)
    assert errors is None, [str(e) for e in errors]
    bom = json.loads(text)
    assert bom["specVersion"] == "1.6"
    by_ref = {c["bom-ref"]: c for c in bom["components"]}
    assert by_ref["pypi:torch"]["purl"] == "pkg:pypi/torch@2.13.0%2Bcu130"
    assert by_ref["pypi:demo"]["purl"] == (
        "pkg:pypi/demo@0.1?vcs_url=git%2Bhttps://git.example/demo.git%40" + "c" * 40)
    assert by_ref["pypi:nvidia-cudnn-cu13"]["hashes"] == [{"alg": "SHA-256", "content": "0" * 64}]
    assert by_ref["image"]["type"] == "container" and by_ref["image"]["version"] == DIGEST
    assert by_ref["torch-stack:cudnn"]["version"] == "91200"
    assert by_ref["gpu-driver"]["version"] == "580.65.06"
    assert [by_ref[f"gpu:{i}"]["type"] for i in (0, 1)] == ["device", "device"]
    props = {p["name"]: p["value"] for p in bom["metadata"]["properties"]}
    assert props["envlock:determinism.deterministic_algorithms"] == "true"
    assert props["envlock:env.CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    # One lock, one SBOM: nothing random in it.
    assert export(gpu_lock, "cyclonedx") == text


def test_intoto_statement_binds_the_lock_file_and_image(gpu_lock: Path) -> None:
    st = json.loads(export(gpu_lock, "intoto"))
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"].startswith("https://")
    lock_sha = hashlib.sha256(gpu_lock.read_bytes()).hexdigest()
    assert st["subject"] == [{"name": "env.lock", "digest": {"sha256": lock_sha}},
                             {"name": "registry.example:5000/lab/train", "digest": {"sha256": "ab" * 32}}]
    assert st["predicate"]["envlock"]["fingerprint"].startswith("sha256:")
    # Any edit to the lock changes the subject digest (which a signature then covers).
    gpu_lock.write_bytes(gpu_lock.read_bytes() + b"\n")
    assert json.loads(export(gpu_lock, "intoto"))["subject"][0]["digest"]["sha256"] != lock_sha


def _kubernetes_validate(path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent)) or "kubernetes-validate"
    return subprocess.run([exe, "--strict", "-k", K8S_VERSION, str(path)],
                          capture_output=True, text=True, check=False)


@pytest.mark.slow
def test_k8s_job_validates_strictly(gpu_lock: Path, tmp_path: Path) -> None:
    import yaml  # kubernetes-validate's own dependency

    out = tmp_path / "job.yaml"
    export(gpu_lock, "k8s", "--command", "python train.py --epochs 3", "-o", str(out),
           "--workspace-claim", "lab-data")
    r = _kubernetes_validate(out)
    assert r.returncode == 0, r.stdout + r.stderr
    job = yaml.safe_load(out.read_text())
    pod = job["spec"]["template"]["spec"]
    main = pod["containers"][0]
    assert main["image"] == f"registry.example:5000/lab/train@{DIGEST}"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert main["command"] == ["python", "train.py", "--epochs", "3"]
    assert {"name": "CUBLAS_WORKSPACE_CONFIG", "value": ":4096:8"} in main["env"]
    assert {"name": "PYTHONHASHSEED", "value": "0"} in main["env"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["volumes"] == [{"name": "workspace", "persistentVolumeClaim": {"claimName": "lab-data"}}]
    # --gpus overrides; --image must be pinned
    cpu = tmp_path / "cpu.yaml"
    export(gpu_lock, "k8s", "--command", "python -c 'print(1)'", "--gpus", "0", "-o", str(cpu),
           "--image", f"other.example/img@{DIGEST}")
    assert _kubernetes_validate(cpu).returncode == 0
    assert "nvidia.com/gpu" not in cpu.read_text()
    bad = run_cli("export", str(gpu_lock), "--to", "k8s", "--command", "x", "--image", "other:latest")
    assert bad.returncode == 2 and "not pinned by digest" in bad.stderr


@pytest.mark.slow
def test_k8s_validator_rejects_a_broken_job(gpu_lock: Path, tmp_path: Path) -> None:
    """Twin of the test above: the validator really checks (a typo'd field fails)."""
    out = tmp_path / "job.yaml"
    export(gpu_lock, "k8s", "--command", "true", "-o", str(out))
    out.write_text(out.read_text().replace("restartPolicy:", "restartPolicyy:"))
    assert _kubernetes_validate(out).returncode != 0


@pytest.mark.slow
def test_values_cannot_break_out_of_yaml_or_shell(restore_lock: LockFactory, tmp_path: Path) -> None:
    import yaml

    lock = save(restore_lock(image={"in_container": True, "source": "env", "reference": "r.example/x",
                                    "digest": DIGEST}), tmp_path / "env.lock")
    nasty = "python -c 'print(\"a: b\\n- c\")' \"$(id)\" ; rm -rf /"
    job = yaml.safe_load(export(lock, "k8s", "--command", nasty))
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][:2] == ["python", "-c"]
    script = export(lock, "slurm", "--command", nasty)
    assert "'$(id)' ';' rm -rf /\n" in script  # each word quoted: argv of python, never run


def _shims(bindir: Path, log: Path) -> None:
    """srun and apptainer as the cluster would run them, recording their argv (no cluster here);
    apptainer also records the ``APPTAINERENV_*`` variables it would set in the container."""
    bindir.mkdir()
    srun = bindir / "srun"
    srun.write_text(f'#!/bin/bash\nprintf "%s\\0" srun "$@" >> "{log}"\n'
                    'while [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    app = bindir / "apptainer"
    app.write_text(f'#!/bin/bash\nprintf "%s\\0" apptainer "$@" >> "{log}"\n'
                   f'env -0 | grep -z "^APPTAINERENV_" | sort -z > "{log}.env" || true\n')
    for shim in (srun, app):
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)


def _run_sbatch(script: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """Run the sbatch script through the shims: (argv logged, variables for the container)."""
    log = tmp_path / "argv"
    log.unlink(missing_ok=True)
    if not (tmp_path / "bin").exists():
        _shims(tmp_path / "bin", log)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "ENVLOCK_WORKSPACE": str(tmp_path)}
    subprocess.run(["bash", str(script)], check=True, env=env, cwd=tmp_path)
    argv = log.read_text().split("\0")[:-1]
    items = Path(f"{log}.env").read_text().split("\0")[:-1]
    return argv, dict(i.removeprefix("APPTAINERENV_").split("=", 1) for i in items)


def _shellcheck(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    if shutil.which("shellcheck"):
        sc = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True, text=True,
                            check=False)
        assert sc.returncode == 0, sc.stdout


def test_slurm_script_runs_apptainer_by_digest(gpu_lock: Path, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    export(gpu_lock, "slurm", "--command", "python train.py --lr 3e-4", "-o", str(script))
    text = script.read_text()
    assert "#SBATCH --gpus=2\n" in text
    _shellcheck(script)
    argv, env = _run_sbatch(script, tmp_path)
    want = ["apptainer", "exec", "--nv", "--cleanenv", "--bind", f"{tmp_path}:/workspace", "--pwd", "/workspace",
            f"docker://registry.example:5000/lab/train@{DIGEST}", "python", "train.py", "--lr", "3e-4"]
    assert argv == ["srun", "--export=ALL", *want, *want]  # srun got apptainer's argv, then apptainer ran
    assert env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0"}


def test_slurm_variables_with_commas_arrive_whole(restore_lock: LockFactory, tmp_path: Path) -> None:
    """Issue 18 item 5: ``--env A=x,LD_PRELOAD=...`` is two variables to srun and Apptainer. The
    script passes APPTAINERENV_* instead (never split); no ``--env`` is written at all. Its twin:
    an honest ``XLA_FLAGS`` with commas arrives whole."""
    hostile = ":4096:8,LD_PRELOAD=/tmp/evil.so"
    honest = "--xla_gpu_deterministic_ops=true,--xla_gpu_autotune_level=0"
    lock = save(restore_lock(
        image={"in_container": True, "source": "env", "reference": "r.example/x", "digest": DIGEST},
        determinism={"torch_loaded": False, "env": {"CUBLAS_WORKSPACE_CONFIG": hostile, "XLA_FLAGS": honest}}),
        tmp_path / "env.lock")
    script = tmp_path / "job.sbatch"
    export(lock, "slurm", "--command", "python train.py", "-o", str(script))
    text = script.read_text()
    assert "--env" not in text and "LD_PRELOAD" not in text.replace(hostile, "")
    _shellcheck(script)
    argv, env = _run_sbatch(script, tmp_path)
    assert env == {"CUBLAS_WORKSPACE_CONFIG": hostile, "XLA_FLAGS": honest}
    assert not [a for a in argv if "LD_PRELOAD" in a or "XLA" in a]


def test_apptainer_definition(gpu_lock: Path) -> None:
    text = export(gpu_lock, "apptainer", "--command", "python train.py")
    lines = text.splitlines()
    assert "Bootstrap: docker" in lines and f"From: registry.example:5000/lab/train@{DIGEST}" in lines
    sections = [ln for ln in lines if ln.startswith("%")]
    assert sections == ["%environment", "%labels", "%runscript"]
    env = text.split("%environment\n")[1].split("\n\n")[0]
    assert env.splitlines() == ["    export CUBLAS_WORKSPACE_CONFIG=:4096:8", "    export PYTHONHASHSEED=0"]
    assert "    exec python train.py \"$@\"" in lines
    assert subprocess.run(["bash", "-n"], input=env, text=True, check=False).returncode == 0


@pytest.mark.slow
def test_cluster_exports_need_a_pinned_image(restore_lock: LockFactory, tmp_path: Path) -> None:
    lock = save(restore_lock(), tmp_path / "env.lock")  # captured outside any container
    for fmt in ("apptainer", "k8s", "slurm"):
        r = run_cli("export", str(lock), "--to", fmt, "--command", "true")
        assert r.returncode == 2 and "no pullable image digest" in r.stderr, (fmt, r.stderr)
    r = run_cli("export", str(lock), "--to", "slurm")
    assert r.returncode == 2 and "--command" in r.stderr


def test_output_file_and_refusals(gpu_lock: Path, tmp_path: Path) -> None:
    r = run_cli("export", str(gpu_lock), "--to", "intoto", "-o", str(gpu_lock))
    assert r.returncode == 2 and "overwrite the lock" in r.stderr
    r = run_cli("export", str(gpu_lock), "--to", "intoto", "-o", str(tmp_path / "no" / "x.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_cli("export", str(tmp_path / "missing.lock"), "--to", "intoto")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    # A directory is a usage error (exit 2), not "cannot write DIR: Is a directory" (exit 3).
    r = run_cli("export", str(gpu_lock), "--to", "intoto", "-o", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr, r.stderr


@pytest.mark.slow
def test_an_existing_file_of_the_user_is_never_replaced(gpu_lock: Path, tmp_path: Path) -> None:
    notes = tmp_path / "job.yaml"
    notes.write_text("my own notes\n")
    image = f"reg.example/x@sha256:{'a' * 64}"
    r = run_cli("export", str(gpu_lock), "--to", "k8s", "--command", "python train.py", "--image", image,
                "-o", str(notes))
    assert r.returncode == 2 and "not written by envlock" in r.stderr, r.stderr
    assert notes.read_text() == "my own notes\n"
    # Its own earlier export is replaced freely; anything else with --force.
    out = tmp_path / "job2.yaml"
    for _ in range(2):
        r = run_cli("export", str(gpu_lock), "--to", "k8s", "--command", "python train.py",
                    "--image", image, "-o", str(out))
        assert r.returncode == 0, r.stderr
    r = run_cli("export", str(gpu_lock), "--to", "k8s", "--command", "python train.py", "--image", image,
                "-o", str(notes), "--force")
    assert r.returncode == 0 and 'kind: "Job"' in notes.read_text(), r.stderr


def test_pylock_needs_no_toml_library(restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """envlock dropped tomlkit; the pylock writer must not reach for it (or any TOML library)."""
    import tomllib
    from packaging.pylock import Pylock

    from envlock.export.artifacts import Artifact, Resolved
    from envlock.export.pylock import render

    monkeypatch.setitem(sys.modules, "tomlkit", None)  # import tomlkit -> ImportError
    lock = restore_lock(packages=[("six", "1.17.0")])
    art = Artifact("six-1.17.0-py2.py3-none-any.whl", "ab" * 32, url="https://files.example/six.whl")
    text = render(lock, [Resolved(lock.packages[0], "index", index="https://i.example/simple", artifacts=(art,))])
    Pylock.from_dict(tomllib.loads(text)).validate()
