"""The torch stack as loaded: versions, build, determinism flags and seeds of this process.

Torch is passed in, never imported here (``want_torch`` decides whether to import it), so the
flags read are the live ones of whichever process runs the probe. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .env import process_set_env
from .files import sha256
from .rules import numerics_variable, quiet, read_knobs
from .scrub import env_value


def _cudnn_str(v: Optional[int]) -> Optional[str]:
    if not v:
        return None
    if v >= 90000:  # cuDNN 9 encodes major*10000 + minor*100 + patch
        return "%d.%d.%d" % (v // 10000, (v % 10000) // 100, v % 100)
    return "%d.%d.%d" % (v // 1000, (v % 1000) // 100, v % 100)


def collect_torch(torch: Any) -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "version": str(torch.__version__),
        "git_version": quiet(lambda: torch.version.git_version),
        "cuda": quiet(lambda: torch.version.cuda),
        "hip": quiet(lambda: torch.version.hip),
        "debug": quiet(lambda: bool(torch.version.debug)),
        "cxx11_abi": quiet(lambda: bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "mkl": quiet(lambda: bool(torch.backends.mkl.is_available())),
        "mkldnn": quiet(lambda: bool(torch.backends.mkldnn.is_available())),
        "openmp": quiet(lambda: bool(torch.backends.openmp.is_available())),
    }
    info["cudnn"] = quiet(lambda: _cudnn_str(torch.backends.cudnn.version()))
    if info["cuda"]:
        info["nccl"] = quiet(lambda: ".".join(str(x) for x in torch.cuda.nccl.version()))
    info["cuda_available"] = quiet(lambda: bool(torch.cuda.is_available()))
    info["device_count"] = quiet(lambda: int(torch.cuda.device_count())) if info["cuda_available"] else 0
    info["arch_list"] = quiet(lambda: list(torch.cuda.get_arch_list())) or []
    config = quiet(lambda: torch.__config__.show())
    parallel = quiet(lambda: torch.__config__.parallel_info())
    build = parse_torch_config(config if isinstance(config, str) else "",
                               parallel if isinstance(parallel, str) else "")
    capability = quiet(lambda: str(torch.backends.cpu.get_cpu_capability())) or build.pop("cpu_capability", None)
    build.pop("cpu_capability", None)
    info["cpu_capability"] = capability
    if build:
        info["build"] = build
    if isinstance(config, str) and config:
        info["config_sha256"] = sha256(config_identity(config).encode("utf-8")).hexdigest()
    return {k: v for k, v in info.items() if v is not None}


# torch.__config__.show() mixes how torch was built with what it found on this host: the "CPU
# capability usage" line is the ISA the dispatcher picked here (AVX2 on one machine, AVX512 on
# the next). Host facts stay out of the build's identity, or one stack gets two fingerprints.
# Patterns are plain strings, compiled by ``re`` on first use: only a live torch import reads
# them, and compiling all at import cost every run.
_HOST_LINE = r"(?i)^\s*-?\s*CPU capability usage\s*:"
_CONFIG_LINES = (
    # (field, pattern on one "  - ..." line); the first group is the value.
    ("compiler", r"^((?:GCC|gcc|clang|Clang|Apple clang|MSVC|Intel|icx|icpx)\s+\S+)$"),
    ("cxx_standard", r"^C\+\+ Version:\s*(\S+)$"),
    ("mkl_version", r"Math Kernel Library Version\s+([0-9][0-9.]*)"),
    ("onednn_version", r"^Intel\(R\) (?:MKL-DNN|oneDNN)\s+v?([0-9][0-9A-Za-z.]*)"),
    ("openmp_version", r"^OpenMP\s+(\d+)"),
    ("cpu_capability", r"^CPU capability usage:\s*(.+)$"),
    ("cuda_runtime", r"^(?:Built with )?CUDA Runtime\s+(\S+)$"),
    ("cudnn_version", r"^CuDNN\s+(\S+)"),
    ("magma_version", r"^Magma\s+(\S+)$"),
    ("hip_runtime", r"^HIP Runtime\s+(\S+)$"),
    ("miopen_version", r"^MIOpen\s+(\S+)$"),
)
# "Build settings: K=V, K=V, ..." where a value (CXX_FLAGS) may itself hold commas.
_SETTING_SPLIT = r",\s*(?=[A-Z][A-Z0-9_]*=)"
_SETTING_KEY = r"^[A-Z][A-Z0-9_]{0,63}$"
_SETTING_FIELDS = {"BLAS_INFO": "blas", "LAPACK_INFO": "lapack", "BUILD_TYPE": "build_type"}
# Already recorded as torch.version / torch.git_version.
_SETTING_SKIP = ("TORCH_VERSION", "COMMIT_SHA")
_MAX_VALUE = 4096


def config_identity(config: str) -> str:
    """torch.__config__.show() without the lines that describe the host rather than the build."""
    return "".join(line for line in config.splitlines(True) if not re.match(_HOST_LINE, line))


def parse_torch_config(config: str, parallel: str = "") -> Dict[str, Any]:
    """Readable build facts from ``torch.__config__.show()`` and ``.parallel_info()``.

    Both are free text whose wording changes between torch versions, so every line is matched
    on its own and anything unrecognised is ignored rather than guessed at.
    """
    build: Dict[str, Any] = {}
    options: Dict[str, str] = {}
    for raw in config.splitlines():
        line = raw.strip()
        if line.startswith("- "):
            line = line[2:].strip()
        if line.startswith("NVCC architecture flags:"):
            flags = [f.strip() for f in line.split(":", 1)[1].split(";")]
            arch = [f for f in flags if f and f != "-gencode" and len(f) <= 128]
            if arch:
                build["cuda_arch_flags"] = arch
            continue
        if line.startswith("Build settings:"):
            for item in re.split(_SETTING_SPLIT, line.split(":", 1)[1].strip().rstrip(",")):
                key, sep, value = item.partition("=")
                key, value = key.strip(), value.strip().rstrip(",").strip()
                if not sep or not re.match(_SETTING_KEY, key) or key in _SETTING_SKIP:
                    continue
                value = value[:_MAX_VALUE]
                if key in _SETTING_FIELDS:
                    if value:
                        build[_SETTING_FIELDS[key]] = value
                else:
                    options[key] = value
            continue
        for field, pattern in _CONFIG_LINES:
            match = re.search(pattern, line)
            if match and field not in build:
                value = match.group(1).strip()[:_MAX_VALUE]
                if value:
                    build[field] = value
                break
    for raw in parallel.splitlines():
        key, sep, value = raw.strip().partition(":")
        if sep and key.strip() == "ATen parallel backend" and value.strip():
            build["parallel_backend"] = value.strip()[:_MAX_VALUE]
    if options:
        build["options"] = dict(sorted(options.items()))
    return build


def collect_determinism(torch: Any) -> Dict[str, Any]:
    det: Dict[str, Any] = {"torch_loaded": torch is not None}
    if torch is not None:
        # Every knob of the one table (rules.KNOBS), read live; one this torch lacks is left out.
        det.update(read_knobs(torch))
    det["env"] = {k: env_value(k, v) for k, v in sorted(os.environ.items()) if numerics_variable(k)}
    # Knobs that envlock.runtime set in *this* process after they could take effect. It writes
    # _ENVLOCK_LATE=<pid>:NAME,NAME: an environment variable, so the probe needs nothing of
    # envlock to read it, tagged with the pid because children inherit the environment but not
    # the lateness (a child that starts with CUBLAS_WORKSPACE_CONFIG set has it in effect). The
    # leading underscore keeps it out of the [env] allow-list.
    pid, _, names = os.environ.get("_ENVLOCK_LATE", "").partition(":")
    if pid == str(os.getpid()):
        late = sorted(set(n for n in names.split(",") if re.fullmatch(r"^[A-Za-z0-9_.]{1,128}$", n)))
        if late:
            det["late"] = late
    changed = process_set_env()
    if changed:
        det["process_env"] = changed
    return det


def collect_seeds(torch: Any) -> Dict[str, Any]:
    seeds: Dict[str, Any] = {"hash_randomization": bool(sys.flags.hash_randomization)}
    if "PYTHONHASHSEED" in os.environ:
        seeds["python_hash_seed"] = os.environ["PYTHONHASHSEED"]
    raw = os.environ.get("ENVLOCK_SEED")
    if raw is not None:
        try:
            seeds["seed"] = int(raw)
            seeds["seed_source"] = "envlock" if os.environ.get("ENVLOCK_SEED_SOURCE") != "env" else "env"
        except ValueError:
            pass
        if torch is not None and "seed" in seeds:
            value = quiet(lambda: int(torch.initial_seed()))
            if value is not None:
                seeds["torch_initial_seed"] = value
    return seeds


def want_torch(mode: str) -> Tuple[Any, Optional[str]]:
    if mode == "no":
        return None, "skipped (--no-torch)"
    if "torch" in sys.modules:
        return sys.modules["torch"], None
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed"
    try:
        import torch

        return torch, None
    except Exception as exc:
        return None, "import torch failed: %s: %s" % (type(exc).__name__, exc)


# -- the CUDA libraries torch loaded, against those it was built with ---------------------------

# torch's wheel pins the CUDA libraries it was released with: directly (``nvidia-nccl-cu13==
# 2.29.7``, ``nvidia-cublas-cu12==12.8.4.1`` in CUDA 12 wheels) or, since the CUDA 13 wheels,
# through NVIDIA's metapackage (``cuda-toolkit[cublas,cudart,...]==13.0.3``, whose own METADATA
# pins ``nvidia-cublas==13.1.1.3.*; ... extra == 'cublas'``). For cuBLAS and the other math
# libraries that pin is the only "built with" there is: torch reports none of their versions.
_REQUIRES_RE = (r"(?m)^Requires-Dist:[ \t]*([A-Za-z0-9][A-Za-z0-9._-]{0,127})[ \t]*"
                r"(?:\[([A-Za-z0-9._, \t-]{0,1024})\])?[ \t]*==[ \t]*([0-9][0-9.]{0,63}?)(?:\.\*)?"
                r"[ \t]*(?:;([^\n]{0,2048}))?[ \t]*$")
_EXTRA_RE = r"""\bextra\s*==\s*['"]([A-Za-z0-9._-]{1,64})['"]"""
_TOOLKIT = "cuda-toolkit"
# The wheel (``nvidia-<name>``, with or without its ``-cuNN`` suffix) of each library.
_PIN_NAMES = {"cuda-runtime": "cudart", "cublas": "cublas", "cudnn": "cudnn", "nccl": "nccl",
              "cufft": "cufft", "curand": "curand", "cusolver": "cusolver",
              "cusparse": "cusparse", "cusparselt": "cusparselt", "cuda-nvrtc": "nvrtc"}


def _requirements(metadata: str) -> List[Tuple[str, List[str], str, str]]:
    """(canonical name, extras, version, marker) of each ``Requires-Dist: NAME[EXTRAS]==V``."""
    out = []
    for m in re.finditer(_REQUIRES_RE, metadata):
        name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
        extras = [e.strip().lower() for e in (m.group(2) or "").split(",") if e.strip()]
        out.append((name, extras, m.group(3).rstrip("."), m.group(4) or ""))
    return out


def _library_of(name: str) -> Optional[str]:
    if not name.startswith("nvidia-"):
        return None
    return _PIN_NAMES.get(re.sub(r"-cu\d+$", "", name[len("nvidia-"):]))


def _release(version: str) -> Tuple[int, ...]:
    """A version's release numbers without trailing zeros: 13.0.3 and 13.0.3.0 are one."""
    parts = [int(x) for x in version.split(".") if x.isdigit()]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def torch_pins(metadata: str, toolkit: str = "") -> Dict[str, str]:
    """{library: version} of the CUDA libraries torch's METADATA pins with ``==``, directly or
    through the extras it asks of ``cuda-toolkit`` (``toolkit``: the installed cuda-toolkit's
    METADATA, used only when its version is the one torch pins)."""
    pins: Dict[str, str] = {}
    extras: Set[str] = set()
    wanted = None
    for name, asked, version, _ in _requirements(metadata):
        library = _library_of(name)
        if library is not None:
            pins.setdefault(library, version)
        elif name == _TOOLKIT:
            wanted, extras = version, set(asked)
    found = re.search(r"(?m)^Version:[ \t]*([0-9][0-9.]{0,63})[ \t]*$", toolkit)
    if wanted is None or found is None or _release(found.group(1)) != _release(wanted):
        return pins
    for name, _, version, marker in _requirements(toolkit):
        library = _library_of(name)
        extra = re.search(_EXTRA_RE, marker)
        if library is not None and extra is not None and extra.group(1).lower() in extras:
            pins.setdefault(library, version)
    return pins


def _loaded(paths: List[str], stem: str) -> Optional[str]:
    """The mapped file whose name is ``stem`` followed by nothing or a version (libcudart.so.13)."""
    for path in paths:
        leaf = path.rsplit("/", 1)[-1]
        if leaf == stem or leaf.startswith(stem + "."):
            return path
    return None


def _ask(path: Optional[str], call: Callable[[Any, Any], Optional[str]]) -> Optional[str]:
    """``call(ctypes, library)`` on a library this process has already loaded (RTLD_NOLOAD: never
    loads one, so a capture cannot change what the process runs)."""
    if path is None:
        return None

    def run() -> Optional[str]:
        import ctypes

        return call(ctypes, ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY))
    return quiet(run)  # type: ignore[no-any-return]


def _cudart_version(ct: Any, lib: Any) -> Optional[str]:
    v = ct.c_int()
    if lib.cudaRuntimeGetVersion(ct.byref(v)) != 0 or v.value <= 0:
        return None
    return "%d.%d" % (v.value // 1000, (v.value % 1000) // 10)


def _properties(function: str) -> Callable[[Any, Any], Optional[str]]:
    """``major.minor.patch`` from a library's ``*GetProperty(libraryPropertyType, int *)``, the
    call cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE and cuSPARSELt share."""
    def ask(ct: Any, lib: Any) -> Optional[str]:
        parts = []
        for kind in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            v = ct.c_int()
            if getattr(lib, function)(kind, ct.byref(v)) != 0 or v.value < 0:
                return None
            parts.append(str(v.value))
        return ".".join(parts)
    return ask


def _nvrtc_version(ct: Any, lib: Any) -> Optional[str]:
    major, minor = ct.c_int(), ct.c_int()
    if lib.nvrtcVersion(ct.byref(major), ct.byref(minor)) != 0 or major.value <= 0:
        return None
    return "%d.%d" % (major.value, minor.value)


def _nccl_version(ct: Any, lib: Any) -> Optional[str]:
    v = ct.c_int()
    if lib.ncclGetVersion(ct.byref(v)) != 0 or v.value <= 0:
        return None
    div = 10000 if v.value >= 10000 else 1000  # NCCL >= 2.9: major * 10000 + minor * 100 + patch
    return "%d.%d.%d" % (v.value // div, (v.value % div) // 100, v.value % 100)


# (library, the file it is loaded from, how it says its version). cuDNN is asked through torch.
_ASKED = (
    ("cudart", "libcudart.so", _cudart_version),
    ("cublas", "libcublas.so", _properties("cublasGetProperty")),
    ("cufft", "libcufft.so", _properties("cufftGetProperty")),
    ("curand", "libcurand.so", _properties("curandGetProperty")),
    ("cusolver", "libcusolver.so", _properties("cusolverGetProperty")),
    ("cusparse", "libcusparse.so", _properties("cusparseGetProperty")),
    ("cusparselt", "libcusparseLt.so", _properties("cusparseLtGetProperty")),
    ("nvrtc", "libnvrtc.so", _nvrtc_version),
    ("nccl", "libnccl.so", _nccl_version),
)


def cuda_libraries(torch: Any, paths: List[str], pins: Dict[str, str]) -> Dict[str, Dict[str, str]]:
    """{library: {built, loaded}} of a CUDA build of torch.

    ``loaded``: what the library mapped into this process says of itself (its own version
    call, through ``RTLD_NOLOAD``; cuDNN's through torch). ``built``: what torch reports it was
    compiled against (the CUDA runtime, cuDNN, NCCL: ``torch.cuda.nccl.version()`` is the
    ``nccl.h`` torch was compiled with, not the library loaded), else the version its wheel
    pins (``pins``: cuBLAS and the other math libraries).
    """
    cuda = quiet(lambda: torch.version.cuda)
    if not cuda:
        return {}
    built = {
        "cudart": str(cuda),
        "cudnn": quiet(lambda: ".".join(str(x) for x in torch._C._cudnn.getCompileVersion())),
        "nccl": quiet(lambda: ".".join(str(x) for x in torch.cuda.nccl.version())),
    }
    loaded = {name: _ask(_loaded(paths, stem), call) for name, stem, call in _ASKED}
    loaded["cudnn"] = quiet(lambda: _cudnn_str(torch.backends.cudnn.version()))
    out: Dict[str, Dict[str, str]] = {}
    for name in sorted(set(loaded) | set(built)):
        entry = {k: str(v) for k, v in (("built", built.get(name) or pins.get(name)),
                                        ("loaded", loaded.get(name))) if v}
        if entry:
            out[name] = entry
    return out
