"""The lock as typed, frozen data.

The probe emits plain JSON; these models are the single gate every value passes before it is
written, compared or rendered into a Dockerfile. ``extra="forbid"`` everywhere: an unknown key
in a lock is far more likely a typo or a lock from a newer envlock than something to ignore.
Fields that only make sense on the host that captured (paths, kernel, UUIDs) are kept for the
reader but excluded from the fingerprint. Each field declares its policy beside its type
(``Annotated[type, Policy(...)]``, see ``_policy``): how a comparison counts a change, whether the
fingerprint covers it, and a table's comment in the written file.
"""

# No `from __future__ import annotations` here: pydantic would then evaluate every field's
# annotation from its string again when it builds the models, on every run of every command.
from datetime import datetime
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from envlock.lock._policy import (
    BREAKING,
    CUSTOM,
    HOST,
    INFO,
    NOT_COMPARED,
    PROCESS,
    PROCESS_INFO,
    WARNING,
    Policy,
)
from envlock.lock._seal import short_id
from envlock.lock._text import SCHEMA_VERSION as SCHEMA_VERSION
from envlock.lock._values import check_clean, check_env, check_name, check_url, split_os_spec
from envlock.probe.rules import UNREADABLE_ERROR_MAX, UNREADABLE_ITEM, canonicalize_name

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

    schema_version: Annotated[int, NOT_COMPARED] = SCHEMA_VERSION
    tool_version: Annotated[str, NOT_COMPARED]
    created_at: Annotated[datetime, NOT_COMPARED] = Field(strict=False)
    fingerprint: Annotated[Sha256Digest | None, NOT_COMPARED] = None
    integrity: Annotated[Sha256Digest | None, NOT_COMPARED] = None
    note: Annotated[CleanStr | None, NOT_COMPARED] = Field(default=None, max_length=4096)


ImageSource = Literal["env", "containerenv", "mountinfo", "cgroup", "dockerenv", "cli", "engine", "none"]


class Image(_Model):
    """``[image]``: the container the environment runs in, with where each value came from."""

    in_container: Annotated[bool, Policy("custom", fingerprint=False)] = False
    source: Annotated[ImageSource, NOT_COMPARED] = "none"
    reference: Annotated[str | None, NOT_COMPARED] = Field(default=None, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
    # Where the stack ran, not what it is: a restored image is new by construction and holds the
    # same stack (its OS packages, python and packages are in the lock), so it keeps the lock's
    # id. verify still compares the identity (breaking).
    digest: Annotated[Sha256Digest | None, Policy("custom", fingerprint=False)] = None
    id: Annotated[Sha256Digest | None, Policy("custom", fingerprint=False)] = None
    engine: Annotated[str | None, NOT_COMPARED] = Field(default=None, max_length=64)
    container_id: Annotated[str | None, NOT_COMPARED] = Field(default=None, pattern=r"^[0-9a-f]{12,64}$")


class Platform(_Model):
    os: Annotated[str, BREAKING]
    machine: Annotated[str, BREAKING]
    os_id: Annotated[str | None, WARNING] = None
    os_version_id: Annotated[str | None, WARNING] = None
    os_pretty_name: Annotated[str | None, HOST] = None
    libc: Annotated[str | None, WARNING] = None
    libc_version: Annotated[str | None, WARNING] = None
    kernel: Annotated[str | None, HOST] = None
    cpu_model: Annotated[str | None, HOST] = None
    cpu_count: Annotated[int | None, HOST] = None


class PythonInfo(_Model):
    version: Annotated[str, CUSTOM] = Field(pattern=r"^\d+\.\d+\.\d+([a-z]+\d+)?\+?$")
    implementation: Annotated[str, BREAKING]
    soabi: Annotated[str | None, BREAKING] = None
    platform_tag: Annotated[str | None, WARNING] = None
    prefix_kind: Annotated[Literal["venv", "conda", "system"], INFO] = "system"
    executable: Annotated[str | None, HOST] = None
    prefix: Annotated[str | None, HOST] = None


BuildText = Annotated[str, StringConstraints(max_length=4096)]


class TorchBuild(_Model):
    """``[torch.build]``: how this torch was built, parsed from ``torch.__config__``.

    Readable fields, so that a diff of two builds names the BLAS or oneDNN that changed instead
    of showing two hashes. ``options`` holds the remaining ``Build settings`` (USE_*, flags).
    """

    compiler: Annotated[BuildText | None, WARNING] = None
    cxx_standard: Annotated[BuildText | None, WARNING] = None
    build_type: Annotated[BuildText | None, WARNING] = None
    blas: Annotated[BuildText | None, WARNING] = None
    lapack: Annotated[BuildText | None, WARNING] = None
    mkl_version: Annotated[BuildText | None, WARNING] = None
    onednn_version: Annotated[BuildText | None, WARNING] = None
    openmp_version: Annotated[BuildText | None, WARNING] = None
    parallel_backend: Annotated[BuildText | None, WARNING] = None
    cuda_runtime: Annotated[BuildText | None, WARNING] = None
    cudnn_version: Annotated[BuildText | None, WARNING] = None
    magma_version: Annotated[BuildText | None, WARNING] = None
    hip_runtime: Annotated[BuildText | None, WARNING] = None
    miopen_version: Annotated[BuildText | None, WARNING] = None
    cuda_arch_flags: Annotated[list[Annotated[str, StringConstraints(max_length=128)]] | None, WARNING] = None
    options: Annotated[dict[Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")], BuildText], WARNING] = Field(
        default_factory=dict)


LibraryVersion = Annotated[str, StringConstraints(pattern=r"^[0-9][0-9A-Za-z.+-]{0,63}$")]


class CudaLibrary(_Model):
    """``[torch.cuda_libraries.NAME]``: a CUDA library torch uses, as built and as loaded.

    ``built``: the version torch reports it was compiled against (CUDA, cuDNN, NCCL), else the
    one its wheel pins, directly or through the ``cuda-toolkit`` extras it asks for (cuBLAS,
    cuFFT, cuRAND, cuSOLVER, cuSPARSE, cuSPARSELt, NVRTC); ``loaded``: what the library mapped
    into the process says of itself. A cuDNN 8 from ``LD_LIBRARY_PATH`` under a torch built for
    cuDNN 9 shows here as both.
    """

    built: Annotated[LibraryVersion | None, CUSTOM] = None
    loaded: Annotated[LibraryVersion | None, CUSTOM] = None


CudaLibraryName = Literal["cudart", "cudnn", "cublas", "nccl", "cufft", "curand", "cusolver",
                          "cusparse", "cusparselt", "nvrtc"]


class TorchInfo(_Model):
    """``[torch]``: the stack as loaded, not as ldconfig or pip would describe it.

    ``cpu_capability`` is the ISA torch's dispatcher picked on the capturing host (AVX2,
    AVX512...): a host fact, kept for the reader and out of the fingerprint.
    ``config_sha256`` hashes ``torch.__config__.show()`` without that host line.
    """

    version: Annotated[Version, BREAKING]
    git_version: Annotated[str | None, BREAKING] = None
    cuda: Annotated[str | None, BREAKING] = None
    cudnn: Annotated[str | None, BREAKING] = None
    nccl: Annotated[str | None, BREAKING] = None
    hip: Annotated[str | None, BREAKING] = None
    debug: Annotated[bool | None, BREAKING] = None
    cxx11_abi: Annotated[bool | None, BREAKING] = None
    arch_list: Annotated[list[str], WARNING] = Field(default_factory=list)
    config_sha256: Annotated[HexSha256 | None, CUSTOM] = None
    cpu_capability: Annotated[str | None, HOST] = Field(default=None, max_length=64)
    mkl: Annotated[bool | None, WARNING] = None
    mkldnn: Annotated[bool | None, WARNING] = None
    openmp: Annotated[bool | None, WARNING] = None
    cuda_available: Annotated[bool | None, Policy("warning", fingerprint=False)] = None
    device_count: Annotated[int | None, HOST] = None
    build: Annotated[TorchBuild | None, CUSTOM] = None
    # None, not an empty table, when absent: a default that dumps as {} would enter the canonical
    # form of every lock written before it existed and break their seals.
    cuda_libraries: Annotated[dict[CudaLibraryName, CudaLibrary] | None, CUSTOM] = None


class GpuDevice(_Model):
    index: Annotated[int, NOT_COMPARED]  # devices are paired by position
    name: Annotated[str, WARNING]
    compute_capability: Annotated[str | None, WARNING] = Field(default=None, pattern=r"^\d+\.\d+$")
    memory_total_mib: Annotated[int | None, WARNING] = None
    mig_mode: Annotated[bool | None, WARNING] = None
    uuid_sha256: Annotated[HexSha256 | None, NOT_COMPARED] = None  # the card, not the stack
    # What the torch build has for this GPU (``rules.kernels_for``): "native" cubins, "ptx" only
    # (JIT-compiled by the driver: other code, slow first start) or "none" (cannot run). Derived
    # from compute_capability and [torch].arch_list, which the fingerprint already covers.
    torch_kernels: Annotated[Literal["native", "ptx", "none"] | None, Policy("custom", fingerprint=False)] = None


class GpuInfo(_Model):
    """``[gpu]``: from NVML when available, else torch.cuda. UUIDs are only kept hashed."""

    source: Annotated[Literal["nvml", "torch"], INFO]
    driver: Annotated[str | None, WARNING] = None
    cuda_driver: Annotated[str | None, WARNING] = None
    devices: Annotated[list[GpuDevice], CUSTOM] = Field(default_factory=list)


class Determinism(_Model):
    """``[determinism]``: every knob that changes numerics, read from the live process.

    ``None`` means the knob does not exist in this torch (or torch was not captured), which is
    different from ``False``.
    """

    torch_loaded: Annotated[bool, PROCESS_INFO] = False
    deterministic_algorithms: Annotated[bool | None, PROCESS] = None
    deterministic_warn_only: Annotated[bool | None, PROCESS] = None
    cudnn_enabled: Annotated[bool | None, PROCESS] = None
    cudnn_deterministic: Annotated[bool | None, PROCESS] = None
    cudnn_benchmark: Annotated[bool | None, PROCESS] = None
    cuda_matmul_allow_tf32: Annotated[bool | None, PROCESS] = None
    cudnn_allow_tf32: Annotated[bool | None, PROCESS] = None
    float32_matmul_precision: Annotated[str | None, PROCESS] = None
    fp32_precision: Annotated[str | None, PROCESS] = None
    cuda_matmul_fp32_precision: Annotated[str | None, PROCESS] = None
    cudnn_conv_fp32_precision: Annotated[str | None, PROCESS] = None
    cudnn_rnn_fp32_precision: Annotated[str | None, PROCESS] = None
    mkldnn_fp32_precision: Annotated[str | None, PROCESS] = None
    cuda_fp32_precision: Annotated[str | None, PROCESS] = None
    mkldnn_matmul_fp32_precision: Annotated[str | None, PROCESS] = None
    mkldnn_conv_fp32_precision: Annotated[str | None, PROCESS] = None
    mkldnn_rnn_fp32_precision: Annotated[str | None, PROCESS] = None
    mkldnn_enabled: Annotated[bool | None, PROCESS] = None
    cuda_matmul_allow_fp16_reduced_precision_reduction: Annotated[bool | None, PROCESS] = None
    cuda_matmul_allow_bf16_reduced_precision_reduction: Annotated[bool | None, PROCESS] = None
    sdpa_flash: Annotated[bool | None, PROCESS] = None
    sdpa_mem_efficient: Annotated[bool | None, PROCESS] = None
    sdpa_math: Annotated[bool | None, PROCESS] = None
    sdpa_cudnn: Annotated[bool | None, PROCESS] = None
    fill_uninitialized_memory: Annotated[bool | None, PROCESS] = None
    num_threads: Annotated[int | None, Policy("warning", fingerprint=False)] = None
    num_interop_threads: Annotated[int | None, Policy("warning", fingerprint=False)] = None
    env: Annotated[dict[str, str], CUSTOM] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env, "determinism.env")

    # Knobs set after the library that reads them had started (CUBLAS_WORKSPACE_CONFIG after
    # CUDA init, OMP_NUM_THREADS after torch import): recorded, but not in effect in the process.
    late: Annotated[list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.]+$", max_length=128)]], Policy("warning", fingerprint=False)] = Field(
        default_factory=list)
    # Recorded variables the process set, changed or removed after it started (seed_everything,
    # deterministic(), training code): process state, which a shell verify reports, not compares.
    process_env: Annotated[list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.]+$", max_length=128)]], HOST] = Field(
        default_factory=list)


class Seeds(_Model):
    seed: Annotated[int | None, PROCESS] = None
    seed_source: Annotated[Literal["envlock", "env"] | None, PROCESS_INFO] = None
    python_hash_seed: Annotated[str | None, BREAKING] = None
    hash_randomization: Annotated[bool, BREAKING] = True
    torch_initial_seed: Annotated[int | None, PROCESS] = None


class GitInfo(_Model):
    commit: Annotated[str | None, INFO] = Field(default=None, pattern=r"^[0-9a-f]{40,64}$")
    branch: Annotated[str | None, INFO] = None
    dirty: Annotated[bool | None, INFO] = None
    untracked: Annotated[int | None, INFO] = None
    diff_sha256: Annotated[HexSha256 | None, INFO] = None
    remote: Annotated[Url | None, INFO] = None


# "conda": a distribution conda installed (INSTALLER says conda); its archive is the conda
# package that [conda] records, not a wheel of an index.
PackageSource = Literal["index", "url", "vcs", "editable", "local", "system", "conda", "unknown"]
# An OS package name, as dpkg, apk and rpm spell them.
OsPackageName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9+._-]{0,127}$")]
OsPackageVersion = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+~:_^-]{0,127}$")]


class Package(_Model):
    """One installed distribution, exactly as found on the interpreter's path."""

    name: Annotated[DistName, CUSTOM]
    version: Annotated[Version, CUSTOM]
    source: Annotated[PackageSource, CUSTOM] = "index"
    installer: Annotated[str | None, Policy("custom", fingerprint=False)] = None
    requested: Annotated[bool | None, Policy("custom", fingerprint=False)] = None
    url: Annotated[Url | None, CUSTOM] = None
    vcs: Annotated[str | None, CUSTOM] = Field(default=None, pattern=r"^(git|hg|svn|bzr)$")
    commit: Annotated[str | None, CUSTOM] = Field(default=None, pattern=r"^[0-9A-Za-z._/-]{1,128}$")
    requested_revision: Annotated[CleanStr | None, CUSTOM] = None
    archive_hash: Annotated[str | None, CUSTOM] = Field(default=None, pattern=r"^[a-z0-9]+[=:][0-9a-fA-F]+$")
    hashes: Annotated[list[Sha256Digest], CUSTOM] = Field(default_factory=list)
    record_sha256: Annotated[HexSha256 | None, CUSTOM] = None
    # source = "system": the OS package that installed this distribution (apt's python3-torch).
    os_package: Annotated[OsPackageName | None, CUSTOM] = None
    os_package_version: Annotated[OsPackageVersion | None, CUSTOM] = None

    # `capture --deep` only: the files as they were on disk (deep.files_digest), and those that
    # differed from RECORD then ("modified path", "missing path", "added path").
    files_sha256: Annotated[HexSha256 | None, Policy("custom", fingerprint=False)] = None
    files_changed: Annotated[list[Annotated[str, StringConstraints(max_length=4096)]] | None, CUSTOM] = None


# ``name:arch=version``: apt's spelling of an exact pin; one string per package keeps a lock
# with hundreds of OS packages short and its diffs one line per change.
OsPackageSpec = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9][A-Za-z0-9+._-]{0,127}:[a-z0-9][a-z0-9_-]{0,31}=[A-Za-z0-9][A-Za-z0-9.+~:_^-]{0,127}$")]


class OsPackages(_Model):
    """``[os_packages]``: what the image's package manager installed, one pin per package."""

    manager: Annotated[Literal["dpkg", "apk", "rpm"], CUSTOM]
    packages: Annotated[list[OsPackageSpec], CUSTOM] = Field(default_factory=list)

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

    name: Annotated[DistName, CUSTOM]
    version: Annotated[Version, CUSTOM]
    active_version: Annotated[Version, CUSTOM]
    path_index: Annotated[int, CUSTOM]


HexMd5 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
# A conda subdir as channels name them: linux-64, osx-arm64, noarch.
CondaSubdir = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+(-[a-z0-9_]+)?$", max_length=32)]
# A conda archive's file name: name-version-build.conda or .tar.bz2.
CondaFileName = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.(conda|tar\.bz2)$", max_length=255)]


class CondaPackage(_Model):
    """One ``conda-meta/*.json`` record: the archive it was installed from (url, hashes, size)
    and the specs it was asked for and depends on, so the environment can be exported, packed
    and installed again without a solver. A rebuild with the same version and build string is
    told apart by ``sha256``."""

    name: Annotated[str, CUSTOM]
    version: Annotated[str, CUSTOM]
    build: Annotated[str | None, CUSTOM] = None
    channel: Annotated[CleanStr | None, CUSTOM] = None
    # Added later: left out (None) in a lock written before, which keeps its seal.
    build_number: Annotated[int | None, CUSTOM] = None
    subdir: Annotated[CondaSubdir | None, CUSTOM] = None
    fn: Annotated[CondaFileName | None, CUSTOM] = None
    # Where the archive was fetched from, not what it is (its sha256 says that): a prefix
    # restored from a pack or a mirror keeps the lock's id.
    url: Annotated[Url | None, Policy("custom", fingerprint=False)] = None
    md5: Annotated[HexMd5 | None, CUSTOM] = None
    sha256: Annotated[HexSha256 | None, CUSTOM] = None
    size: Annotated[int | None, CUSTOM] = Field(default=None, ge=0)
    depends: Annotated[list[Annotated[CleanStr, StringConstraints(max_length=512)]] | None, CUSTOM] = None
    constrains: Annotated[list[Annotated[CleanStr, StringConstraints(max_length=512)]] | None, CUSTOM] = None
    noarch: Annotated[Literal["python", "generic"] | None, CUSTOM] = None
    # What the user asked for (conda's requested_spec, rattler's requested_specs); empty for a
    # package installed only as a dependency.
    requested_specs: Annotated[list[Annotated[CleanStr, StringConstraints(max_length=512)]] | None,
                               Policy("custom", fingerprint=False)] = None


class CondaVirtualPackage(_Model):
    """A virtual package (``__glibc``, ``__cuda``, ``__archspec``, ``__linux``, ``__unix``) as the
    capturing host had it: what a solver would have seen, beside ``[requires]``, which says
    what any host needs."""

    name: Annotated[str, HOST] = Field(pattern=r"^__[a-z0-9_]{1,32}$")
    version: Annotated[str, HOST] = Field(pattern=r"^[A-Za-z0-9._+-]{1,64}$")
    build: Annotated[str, HOST] = Field(default="0", pattern=r"^[A-Za-z0-9._+-]{1,64}$")


class Conda(_Model):
    packages: Annotated[list[CondaPackage], CUSTOM] = Field(default_factory=list)
    # Added later: None in a lock written before.
    virtual_packages: Annotated[list[CondaVirtualPackage] | None, HOST] = None


class CanaryResult(_Model):
    """One kernel on one device: the sha256 of its output's dtype, shape and raw bytes."""

    name: Annotated[str, CUSTOM] = Field(pattern=r"^[a-z0-9_]+$", max_length=64)
    device: Annotated[str, CUSTOM] = Field(pattern=r"^[a-z]+(:\d+)?$", max_length=32)
    dtype: Annotated[str, CUSTOM] = Field(pattern=r"^[a-z0-9]+$", max_length=32)
    sha256: Annotated[HexSha256, CUSTOM]


class Canary(_Model):
    """``[canary]``: hashes of a fixed seeded set of kernels and the settings they ran under."""

    # Kernels, shapes and inputs of this version; hashes of two versions are not comparable.
    version: Annotated[int, CUSTOM] = 1
    torch: Annotated[Version | None, CUSTOM] = None
    settings: Annotated[dict[str, Scalar], CUSTOM] = Field(default_factory=dict)
    results: Annotated[list[CanaryResult], CUSTOM] = Field(default_factory=list)
    # "kernel[device,dtype]" -> why it could not run (bf16 on an old GPU); absent results
    # are then explained instead of looking like a smaller canary.
    errors: Annotated[dict[str, str], CUSTOM] = Field(default_factory=dict)
    duration_ms: Annotated[float | None, CUSTOM] = None

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


PathText = Annotated[str, StringConstraints(min_length=1, max_length=4096), AfterValidator(check_clean)]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=255), AfterValidator(check_clean)]


class Library(_Model):
    """One shared library mapped into the captured process, and who vouches for its file.

    At most one owner: the distribution whose RECORD lists the file (``file`` is the path
    RECORD gives it), the conda package or the OS package whose file list holds it; a library
    nobody vouches for carries its ``sha256``. Libraries are paired by ``name`` (the soname, or
    the file name when there is none).
    """

    name: Annotated[ShortText, CUSTOM]
    # Where it was mapped from on the capturing host (another venv has another prefix).
    path: Annotated[PathText, Policy("custom", fingerprint=False)]
    distribution: Annotated[DistName | None, CUSTOM] = None
    file: Annotated[PathText | None, CUSTOM] = None
    conda_package: Annotated[ShortText | None, CUSTOM] = None
    os_package: Annotated[OsPackageName | None, CUSTOM] = None
    sha256: Annotated[HexSha256 | None, CUSTOM] = None
    # The file was deleted or replaced after the process mapped it (an upgrade under a running
    # job): nothing on disk vouches for what runs.
    deleted: Annotated[bool | None, CUSTOM] = None


RuntimeWord = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,32}$")]


class Runtime(_Model):
    """A BLAS or OpenMP runtime the process loaded, as threadpoolctl (or the file name) tells."""

    api: Annotated[RuntimeWord, CUSTOM]  # "blas", "openmp"
    implementation: Annotated[RuntimeWord, CUSTOM]  # "openblas", "mkl", "blis", "openmp"
    library: Annotated[ShortText, CUSTOM]
    path: Annotated[PathText, Policy("custom", fingerprint=False)]
    version: Annotated[ShortText | None, CUSTOM] = None
    threading_layer: Annotated[ShortText | None, CUSTOM] = None
    # OpenBLAS's core type, MKL's code path: the kernels picked for this CPU.
    architecture: Annotated[ShortText | None, CUSTOM] = None
    num_threads: Annotated[int | None, CUSTOM] = None


class Native(_Model):
    """``[native]``: native code as loaded in the captured process."""

    libraries: Annotated[list[Library], CUSTOM] = Field(default_factory=list)
    runtimes: Annotated[list[Runtime], CUSTOM] = Field(default_factory=list)
    # "threadpoolctl" when it was importable where the probe ran, else "maps" (file names only).
    runtimes_source: Annotated[Literal["threadpoolctl", "maps"] | None, NOT_COMPARED] = None

    @field_validator("libraries")
    @classmethod
    def _sorted(cls, libraries: list[Library]) -> list[Library]:
        return sorted(libraries, key=lambda lib: (lib.name, lib.path))


class CompileCache(_Model):
    """One compile or autotune cache directory: what it held, digested (bounded)."""

    kind: Annotated[Literal["inductor", "triton"], CUSTOM]
    path: Annotated[PathText, Policy("custom", fingerprint=False)]
    files: Annotated[int, CUSTOM] = 0
    bytes: Annotated[int, CUSTOM] = 0
    # sha256 of the sorted (relative path, size) of its files; ``truncated``: past the bound.
    sha256: Annotated[HexSha256 | None, CUSTOM] = None
    truncated: Annotated[bool | None, CUSTOM] = None


CompileSetting = Annotated[str, StringConstraints(pattern=r"^(inductor|dynamo)\.[a-z0-9_.]{1,100}$")]


class Compile(_Model):
    """``[compile]``: torch.compile's state. ``settings`` are read only where the process had
    imported Inductor's or Dynamo's config (a training process that compiles); a fresh probe's
    follow from torch's version and the TORCHINDUCTOR_*/TORCHDYNAMO_* variables in ``[env]``."""

    triton: Annotated[Version | None, CUSTOM] = None
    settings: Annotated[dict[CompileSetting, Scalar], Policy("custom", process=True)] = Field(
        default_factory=dict)
    caches: Annotated[list[CompileCache], CUSTOM] = Field(default_factory=list)
    # The sha256 of the compile-cache file (``envlock.save_compile_cache``) loaded into the
    # Inductor cache directory this process used, before it compiled: its kernels are the ones
    # that file holds. Set by the process (or by ``run``/``record --compile-cache`` for it).
    loaded: Annotated[HexSha256 | None, Policy("custom", process=True)] = None

    @field_validator("settings")
    @classmethod
    def _clean_settings(cls, settings: dict[str, Scalar]) -> dict[str, Scalar]:
        for value in settings.values():
            if isinstance(value, str):
                check_clean(value)
        return dict(sorted(settings.items()))


MajorMinor = Annotated[str, StringConstraints(pattern=r"^\d{1,4}\.\d{1,4}$")]


class Requires(_Model):
    """``[requires]``: what a host needs to run this environment, declared (derived at capture,
    editable by hand or ``--require``) and judged by ``verify --requirements`` alone, apart from
    what the capturing host had.

    ``derived`` names the keys whose values capture derived from what was built (torch's CUDA
    version and arch list, the wheels' manylinux tags); every other key was declared by hand or
    with ``--require``, which takes the key it sets out of ``derived``. ``cpu_features`` is never
    derived: torch's wheels pick their CPU kernels at run time (``probe/requires.py``).
    """

    # The CUDA version the driver must support (NVML's, as [gpu].cuda_driver records it).
    cuda_driver: Annotated[MajorMinor | None, NOT_COMPARED] = None
    glibc: Annotated[MajorMinor | None, NOT_COMPARED] = None
    # As torch.cuda.get_arch_list() spells them: a GPU needs a cubin for its architecture, or PTX.
    gpu_archs: Annotated[list[Annotated[str, StringConstraints(pattern=r"^(sm|compute)_\d{2,4}[af]?$")]], NOT_COMPARED] = Field(
        default_factory=list)
    # As /proc/cpuinfo spells them.
    cpu_features: Annotated[list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]{1,32}$")]], NOT_COMPARED] = Field(
        default_factory=list)
    # Added later: None (left out) in a lock written before it, which keeps its seal.
    derived: Annotated[list[Annotated[str, StringConstraints(pattern=r"^[a-z_]{1,32}$")]] | None,
                       NOT_COMPARED] = None

    @field_validator("derived")
    @classmethod
    def _keys(cls, derived: list[str] | None) -> list[str] | None:
        """Only the names of the requirements themselves (the model's other fields)."""
        keys = [name for name in cls.model_fields if name != "derived"]
        unknown = [name for name in derived or () if name not in keys]
        if unknown:
            raise ValueError(f"derived names {', '.join(unknown)}: not a key of [requires] "
                             f"({', '.join(keys)})")
        return derived


class Unreadable(_Model):
    """What the probe could not capture (a whole section, or one item of it: a distribution
    whose files are a device, a FIFO, oversized, or hold values no lock may carry), and why.

    The lock then cannot vouch for it, so a comparison counts every entry, on either side, as
    breaking: an unreadable distribution can never be an unnoticed addition.
    """

    section: Annotated[str, CUSTOM] = Field(pattern=r"^[a-z_]{1,32}$")
    item: Annotated[str | None, CUSTOM] = Field(default=None, pattern=UNREADABLE_ITEM)
    error: Annotated[str, CUSTOM] = Field(max_length=UNREADABLE_ERROR_MAX, pattern=r"^[^\x00-\x1f\x7f-\x9f]+$")


class ProbeInfo(_Model):
    """``[probe]``: what the probe could not collect, and why."""

    version: Annotated[int, NOT_COMPARED] = 1
    errors: Annotated[dict[str, str], NOT_COMPARED] = Field(default_factory=dict)
    duration_ms: Annotated[float | None, NOT_COMPARED] = None
    # Whether the torch facts came from an import in this run or from the cache of an earlier one.
    torch_facts: Annotated[Literal["live", "cached"] | None, NOT_COMPARED] = None


class LockData(_Model):
    """Every table of ``env.lock``, as data; ``_lock.Lock`` adds the method that writes it."""

    # Every table is compared by a function of its own in drift (the fields inside by their
    # own policies); ``comment`` is the line written under the table's header.
    envlock: Annotated[Meta, NOT_COMPARED]
    requires: Annotated[Requires | None, Policy("ignored", fingerprint=False, comment=(
        "What a host needs: the keys in `derived` come from the build, the others were declared; "
        "edit by hand (then `envlock fmt`) or set with --require; "
        "`envlock verify --requirements` judges a host by it alone."))] = None
    image: Annotated[Image, Policy("custom", comment=(
        "Container the environment ran in; `source` says where each value came from."))] = Field(
        default_factory=Image)
    platform: Annotated[Platform, CUSTOM]
    python: Annotated[PythonInfo, CUSTOM]
    torch: Annotated[TorchInfo | None, Policy("custom", comment=(
        "The torch stack as loaded in the process (cuDNN from the library, not ldconfig)."))] = None
    gpu: Annotated[GpuInfo | None, Policy("custom", comment=(
        "From NVML (or torch.cuda); device UUIDs are stored only as sha256."))] = None
    determinism: Annotated[Determinism, Policy("custom", comment=(
        "Live flags of the captured process; `env` holds variables that change numerics."))] = Field(
        default_factory=Determinism)
    seeds: Annotated[Seeds, CUSTOM] = Field(default_factory=Seeds)
    env: Annotated[dict[str, str], Policy("custom", fingerprint=False, comment=(
        "Allow-listed variables only; secret-looking names are redacted, URLs lose credentials."
    ))] = Field(default_factory=dict)
    git: Annotated[GitInfo | None, Policy("custom", fingerprint=False, comment=(
        "Working tree of the capture (informational, outside the fingerprint)."))] = None
    canary: Annotated[Canary | None, Policy("custom", fingerprint=False, comment=(
        "sha256 of fixed, seeded kernels' outputs: numeric drift that versions miss."))] = None
    native: Annotated[Native | None, Policy("custom", fingerprint=False, comment=(
        "Shared libraries mapped into the captured process and who vouches for each file; "
        "BLAS/OpenMP runtimes."))] = None
    compile: Annotated[Compile | None, Policy("custom", fingerprint=False, comment=(
        "torch.compile: Inductor/Dynamo settings (where the process had them), Triton, caches."))] = None
    conda: Annotated[Conda | None, CUSTOM] = None
    os_packages: Annotated[OsPackages | None, CUSTOM] = None
    packages: Annotated[list[Package], CUSTOM] = Field(default_factory=list)
    duplicates: Annotated[list[Duplicate], CUSTOM] = Field(default_factory=list)
    unreadable: Annotated[list[Unreadable], Policy("custom", comment=(
        "What the probe could not capture: verify fails while any entry is here or now."))] = Field(
        default_factory=list)
    probe: Annotated[ProbeInfo, Policy("ignored", fingerprint=False, comment=(
        "What the probe could not collect, and why."))] = Field(default_factory=ProbeInfo)

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


def os_versions(specs: list[str]) -> dict[str, str]:
    """``name:arch`` -> version of a list of ``name:arch=version`` pins."""
    out = {}
    for spec in specs:
        name, arch, version = split_os_spec(spec)
        out[f"{name}:{arch}"] = version
    return out
