"""The lock as typed, frozen data.

The probe emits plain JSON; these models are the single gate every value passes before it is
written, compared or rendered into a Dockerfile. ``extra="forbid"`` everywhere: an unknown key
in a lock is far more likely a typo or a lock from a newer envlock than something to ignore.
Fields that only make sense on the host that captured (paths, kernel, UUIDs) are kept for the
reader but excluded from the fingerprint (see ``FINGERPRINT_EXCLUDE``).
"""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

# The seal's rules and the pin spelling are pydantic-free, so a lock can be read without these
# models (lockdata); re-exported here where they were always imported from.
from envlock.lockcore import FINGERPRINT_EXCLUDE as FINGERPRINT_EXCLUDE
from envlock.lockcore import SCHEMA_VERSION as SCHEMA_VERSION
from envlock.lockcore import os_versions, short_id
from envlock.lockcore import split_os_spec as split_os_spec
from envlock.probe.rules import canonicalize_name
from envlock.valuechecks import check_clean, check_env, check_name, check_url

DistName = Annotated[str, AfterValidator(check_name)]
# Versions are kept exactly as installed (local labels such as +cu121 included). Legacy,
# non-PEP 440 versions exist in the wild, so the model only enforces an inert character set;
# restore applies the strict PEP 440 check before a version reaches a Dockerfile.
Version = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$", max_length=128)]
Sha256Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
HexSha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Url = Annotated[str, StringConstraints(max_length=4096), AfterValidator(check_url)]
CleanStr = Annotated[str, AfterValidator(check_clean)]
Scalar = str | int | float | bool


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Meta(_Model):
    """``[envlock]``: what wrote the file and the hashes that seal it."""

    schema_version: int = SCHEMA_VERSION
    tool_version: str
    created_at: datetime = Field(strict=False)
    fingerprint: Sha256Digest | None = None
    integrity: Sha256Digest | None = None
    note: CleanStr | None = Field(default=None, max_length=4096)


ImageSource = Literal["env", "containerenv", "mountinfo", "cgroup", "dockerenv", "cli", "engine", "none"]


class Image(_Model):
    """``[image]``: the container the environment runs in, with where each value came from."""

    in_container: bool = False
    source: ImageSource = "none"
    reference: str | None = Field(default=None, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
    digest: Sha256Digest | None = None
    id: Sha256Digest | None = None
    engine: str | None = Field(default=None, max_length=64)
    container_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{12,64}$")


class Platform(_Model):
    os: str
    machine: str
    os_id: str | None = None
    os_version_id: str | None = None
    os_pretty_name: str | None = None
    libc: str | None = None
    libc_version: str | None = None
    kernel: str | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None


class PythonInfo(_Model):
    version: str = Field(pattern=r"^\d+\.\d+\.\d+([a-z]+\d+)?\+?$")
    implementation: str
    soabi: str | None = None
    platform_tag: str | None = None
    prefix_kind: Literal["venv", "conda", "system"] = "system"
    executable: str | None = None
    prefix: str | None = None


BuildText = Annotated[str, StringConstraints(max_length=4096)]


class TorchBuild(_Model):
    """``[torch.build]``: how this torch was built, parsed from ``torch.__config__``.

    Readable fields, so that a diff of two builds names the BLAS or oneDNN that changed instead
    of showing two hashes. ``options`` holds the remaining ``Build settings`` (USE_*, flags).
    """

    compiler: BuildText | None = None
    cxx_standard: BuildText | None = None
    build_type: BuildText | None = None
    blas: BuildText | None = None
    lapack: BuildText | None = None
    mkl_version: BuildText | None = None
    onednn_version: BuildText | None = None
    openmp_version: BuildText | None = None
    parallel_backend: BuildText | None = None
    cuda_runtime: BuildText | None = None
    cudnn_version: BuildText | None = None
    magma_version: BuildText | None = None
    hip_runtime: BuildText | None = None
    miopen_version: BuildText | None = None
    cuda_arch_flags: list[Annotated[str, StringConstraints(max_length=128)]] | None = None
    options: dict[Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")], BuildText] = Field(
        default_factory=dict)


class TorchInfo(_Model):
    """``[torch]``: the stack as loaded, not as ldconfig or pip would describe it.

    ``cpu_capability`` is the ISA torch's dispatcher picked on the capturing host (AVX2,
    AVX512...): a host fact, kept for the reader and out of the fingerprint.
    ``config_sha256`` hashes ``torch.__config__.show()`` without that host line.
    """

    version: Version
    git_version: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    hip: str | None = None
    debug: bool | None = None
    cxx11_abi: bool | None = None
    arch_list: list[str] = Field(default_factory=list)
    config_sha256: HexSha256 | None = None
    cpu_capability: str | None = Field(default=None, max_length=64)
    mkl: bool | None = None
    mkldnn: bool | None = None
    openmp: bool | None = None
    cuda_available: bool | None = None
    device_count: int | None = None
    build: TorchBuild | None = None


class GpuDevice(_Model):
    index: int
    name: str
    compute_capability: str | None = Field(default=None, pattern=r"^\d+\.\d+$")
    memory_total_mib: int | None = None
    mig_mode: bool | None = None
    uuid_sha256: HexSha256 | None = None


class GpuInfo(_Model):
    """``[gpu]``: from NVML when available, else torch.cuda. UUIDs are only kept hashed."""

    source: Literal["nvml", "torch"]
    driver: str | None = None
    cuda_driver: str | None = None
    devices: list[GpuDevice] = Field(default_factory=list)


class Determinism(_Model):
    """``[determinism]``: every knob that changes numerics, read from the live process.

    ``None`` means the knob does not exist in this torch (or torch was not captured), which is
    different from ``False``.
    """

    torch_loaded: bool = False
    deterministic_algorithms: bool | None = None
    deterministic_warn_only: bool | None = None
    cudnn_enabled: bool | None = None
    cudnn_deterministic: bool | None = None
    cudnn_benchmark: bool | None = None
    cuda_matmul_allow_tf32: bool | None = None
    cudnn_allow_tf32: bool | None = None
    float32_matmul_precision: str | None = None
    fp32_precision: str | None = None
    cuda_matmul_fp32_precision: str | None = None
    cudnn_conv_fp32_precision: str | None = None
    cudnn_rnn_fp32_precision: str | None = None
    mkldnn_fp32_precision: str | None = None
    cuda_fp32_precision: str | None = None
    mkldnn_matmul_fp32_precision: str | None = None
    mkldnn_conv_fp32_precision: str | None = None
    mkldnn_rnn_fp32_precision: str | None = None
    mkldnn_enabled: bool | None = None
    cuda_matmul_allow_fp16_reduced_precision_reduction: bool | None = None
    cuda_matmul_allow_bf16_reduced_precision_reduction: bool | None = None
    sdpa_flash: bool | None = None
    sdpa_mem_efficient: bool | None = None
    sdpa_math: bool | None = None
    sdpa_cudnn: bool | None = None
    fill_uninitialized_memory: bool | None = None
    num_threads: int | None = None
    num_interop_threads: int | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env, "determinism.env")

    # Knobs set after the library that reads them had started (CUBLAS_WORKSPACE_CONFIG after
    # CUDA init, OMP_NUM_THREADS after torch import): recorded, but not in effect in the process.
    late: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.]+$", max_length=128)]] = Field(
        default_factory=list)
    # Recorded variables the process set, changed or removed after it started (seed_everything,
    # deterministic(), training code): process state, which a shell verify reports, not compares.
    process_env: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.]+$", max_length=128)]] = Field(
        default_factory=list)


class Seeds(_Model):
    seed: int | None = None
    seed_source: Literal["envlock", "env"] | None = None
    python_hash_seed: str | None = None
    hash_randomization: bool = True
    torch_initial_seed: int | None = None


class GitInfo(_Model):
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{40,64}$")
    branch: str | None = None
    dirty: bool | None = None
    untracked: int | None = None
    diff_sha256: HexSha256 | None = None
    remote: Url | None = None


PackageSource = Literal["index", "url", "vcs", "editable", "local", "system", "unknown"]
# An OS package name, as dpkg, apk and rpm spell them.
OsPackageName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9+._-]{0,127}$")]
OsPackageVersion = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+~:_^-]{0,127}$")]


class Package(_Model):
    """One installed distribution, exactly as found on the interpreter's path."""

    name: DistName
    version: Version
    source: PackageSource = "index"
    installer: str | None = None
    requested: bool | None = None
    url: Url | None = None
    vcs: str | None = Field(default=None, pattern=r"^(git|hg|svn|bzr)$")
    commit: str | None = Field(default=None, pattern=r"^[0-9A-Za-z._/-]{1,128}$")
    requested_revision: CleanStr | None = None
    archive_hash: str | None = Field(default=None, pattern=r"^[a-z0-9]+[=:][0-9a-fA-F]+$")
    hashes: list[Sha256Digest] = Field(default_factory=list)
    record_sha256: HexSha256 | None = None
    # source = "system": the OS package that installed this distribution (apt's python3-torch).
    os_package: OsPackageName | None = None
    os_package_version: OsPackageVersion | None = None

    # `capture --deep` only: the files as they were on disk (deep.files_digest), and those that
    # differed from RECORD then ("modified path", "missing path", "added path").
    files_sha256: HexSha256 | None = None
    files_changed: list[Annotated[str, StringConstraints(max_length=4096)]] | None = None


# ``name:arch=version``: apt's spelling of an exact pin; one string per package keeps a lock
# with hundreds of OS packages short and its diffs one line per change.
OsPackageSpec = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9][A-Za-z0-9+._-]{0,127}:[a-z0-9][a-z0-9_-]{0,31}=[A-Za-z0-9][A-Za-z0-9.+~:_^-]{0,127}$")]


class OsPackages(_Model):
    """``[os_packages]``: what the image's package manager installed, one pin per package."""

    manager: Literal["dpkg", "apk", "rpm"]
    packages: list[OsPackageSpec] = Field(default_factory=list)

    @field_validator("packages")
    @classmethod
    def _sorted_unique(cls, packages: list[str]) -> list[str]:
        ordered = sorted(set(packages))
        seen: set[tuple[str, str]] = set()
        for spec in ordered:
            name, arch, _ = split_os_spec(spec)
            if (name, arch) in seen:
                raise ValueError(f"OS package {name}:{arch} is listed twice")
            seen.add((name, arch))
        return ordered

    def versions(self) -> dict[str, str]:
        """``name:arch`` -> version."""
        return os_versions(self.packages)


class Duplicate(_Model):
    """A distribution shadowed by another of the same name earlier on the path."""

    name: DistName
    version: Version
    active_version: Version
    path_index: int


class CondaPackage(_Model):
    name: str
    version: str
    build: str | None = None
    channel: CleanStr | None = None


class Conda(_Model):
    packages: list[CondaPackage] = Field(default_factory=list)


class CanaryResult(_Model):
    """One kernel on one device: the sha256 of its output's dtype, shape and raw bytes."""

    name: str = Field(pattern=r"^[a-z0-9_]+$", max_length=64)
    device: str = Field(pattern=r"^[a-z]+(:\d+)?$", max_length=32)
    dtype: str = Field(pattern=r"^[a-z0-9]+$", max_length=32)
    sha256: HexSha256


class Canary(_Model):
    """``[canary]``: hashes of a fixed seeded set of kernels and the settings they ran under."""

    # Kernels, shapes and inputs of this version; hashes of two versions are not comparable.
    version: int = 1
    torch: Version | None = None
    settings: dict[str, Scalar] = Field(default_factory=dict)
    results: list[CanaryResult] = Field(default_factory=list)
    # "kernel[device,dtype]" -> why it could not run (bf16 on an old GPU); absent results
    # are then explained instead of looking like a smaller canary.
    errors: dict[str, str] = Field(default_factory=dict)
    duration_ms: float | None = None

    @field_validator("settings")
    @classmethod
    def _clean_settings(cls, settings: dict[str, Scalar]) -> dict[str, Scalar]:
        # env.NAME entries here are the numerics variables the kernels ran under.
        env = {k[4:]: v for k, v in settings.items() if k.startswith("env.") and isinstance(v, str)}
        check_env(env, "canary.settings.env")
        for value in settings.values():
            if isinstance(value, str):
                check_clean(value)
        return settings


class ProbeInfo(_Model):
    """``[probe]``: what the probe could not collect, and why."""

    version: int = 1
    errors: dict[str, str] = Field(default_factory=dict)
    duration_ms: float | None = None
    # Whether the torch facts came from an import in this run or from the cache of an earlier one.
    torch_facts: Literal["live", "cached"] | None = None


class Lock(_Model):
    """The whole ``env.lock``."""

    envlock: Meta
    image: Image = Field(default_factory=Image)
    platform: Platform
    python: PythonInfo
    torch: TorchInfo | None = None
    gpu: GpuInfo | None = None
    determinism: Determinism = Field(default_factory=Determinism)
    seeds: Seeds = Field(default_factory=Seeds)
    env: dict[str, str] = Field(default_factory=dict)
    git: GitInfo | None = None
    canary: Canary | None = None
    conda: Conda | None = None
    os_packages: OsPackages | None = None
    packages: list[Package] = Field(default_factory=list)
    duplicates: list[Duplicate] = Field(default_factory=list)
    probe: ProbeInfo = Field(default_factory=ProbeInfo)

    @field_validator("packages")
    @classmethod
    def _sorted_unique(cls, packages: list[Package]) -> list[Package]:
        # Sorted here, not by whoever built the list, so every writer produces small diffs.
        ordered = sorted(packages, key=lambda p: p.name)
        for a, b in pairwise(ordered):
            if a.name == b.name:
                raise ValueError(f"{a.name} is listed twice (shadowed copies belong in [[duplicates]])")
        return ordered

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)

    # -- convenience -------------------------------------------------------------------
    def package(self, name: str) -> Package | None:
        """The active distribution called ``name`` (any spelling), or None."""
        wanted = canonicalize_name(name)
        for pkg in self.packages:
            if pkg.name == wanted:
                return pkg
        return None

    @property
    def short_id(self) -> str:
        """12 hex digits of the fingerprint: the id quoted in papers and pull requests."""
        return short_id(self.envlock.fingerprint)

    def save(self, path: Any) -> Any:
        """Seal (fingerprint) and write atomically; returns the path written."""
        # lockwrite, not lockfile: lockfile reads through these models, so importing it from
        # here would make the two modules import each other.
        from envlock.lockwrite import save

        return save(self, path)
