"""GPUs through NVML (nvidia-ml-py when importable, else ctypes), else torch.cuda.

NVML runs in a watchdog thread: a wedged driver must not hang a capture. GPU UUIDs are only
ever stored hashed. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Tuple

from .files import sha256
from .rules import quiet

DEFAULT_NVML_TIMEOUT = 10.0


class NvmlError(RuntimeError):
    """An NVML call failed; the message is NVML's own error string."""


class _CtypesNvml:
    """The handful of NVML calls envlock needs, straight from libnvidia-ml through ctypes.

    Used when nvidia-ml-py is not importable, which is the normal case inside a restored
    container: envlock installs nothing there, but the driver library is mounted by the runtime.
    """

    def __init__(self) -> None:
        import ctypes

        self.ct = ctypes
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._check(self.lib.nvmlInit_v2(), "nvmlInit")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            # NVML's own words ("Driver Not Loaded"), which users can search for; the bare
            # code is kept for the rare build whose table lacks it.
            text = self.lib.nvmlErrorString(rc)
            words = text.decode("utf-8", "replace") if text else "Unknown Error"
            raise NvmlError("%s: %s (NVML error %d)" % (what, words, rc))

    def _string(self, fn: Any, *args: Any) -> str:
        buf = self.ct.create_string_buffer(96)
        self._check(fn(*args, buf, self.ct.c_uint(96)), getattr(fn, "__name__", "nvml"))
        return buf.value.decode("utf-8", "replace")

    def driver(self) -> str:
        return self._string(self.lib.nvmlSystemGetDriverVersion)

    def cuda_driver(self) -> int:
        v = self.ct.c_int()
        self._check(self.lib.nvmlSystemGetCudaDriverVersion_v2(self.ct.byref(v)), "nvmlSystemGetCudaDriverVersion_v2")
        return v.value

    def count(self) -> int:
        n = self.ct.c_uint()
        self._check(self.lib.nvmlDeviceGetCount_v2(self.ct.byref(n)), "nvmlDeviceGetCount_v2")
        return n.value

    def device(self, i: int) -> Dict[str, Any]:
        ct = self.ct
        h = ct.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(ct.c_uint(i), ct.byref(h)), "nvmlDeviceGetHandleByIndex_v2")
        dev: Dict[str, Any] = {"index": i, "name": self._string(self.lib.nvmlDeviceGetName, h)}
        try:
            dev["uuid"] = self._string(self.lib.nvmlDeviceGetUUID, h)
        except RuntimeError:
            pass
        major, minor = ct.c_int(), ct.c_int()
        if self.lib.nvmlDeviceGetCudaComputeCapability(h, ct.byref(major), ct.byref(minor)) == 0:
            dev["compute_capability"] = "%d.%d" % (major.value, minor.value)

        class Memory(ct.Structure):  # type: ignore[name-defined,misc]
            _fields_ = [("total", ct.c_ulonglong), ("free", ct.c_ulonglong),  # noqa: RUF012
                        ("used", ct.c_ulonglong)]

        mem = Memory()
        if self.lib.nvmlDeviceGetMemoryInfo(h, ct.byref(mem)) == 0:
            dev["memory_total_mib"] = int(mem.total // (1 << 20))
        cur, pend = ct.c_uint(), ct.c_uint()
        if self.lib.nvmlDeviceGetMigMode(h, ct.byref(cur), ct.byref(pend)) == 0:
            dev["mig_mode"] = bool(cur.value)
        return dev

    def close(self) -> None:
        self.lib.nvmlShutdown()


class _PyNvml:
    def __init__(self, mod: Any) -> None:
        self.m = mod
        mod.nvmlInit()

    @staticmethod
    def _s(value: Any) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    def driver(self) -> str:
        return self._s(self.m.nvmlSystemGetDriverVersion())

    def cuda_driver(self) -> int:
        return int(self.m.nvmlSystemGetCudaDriverVersion_v2())

    def count(self) -> int:
        return int(self.m.nvmlDeviceGetCount())

    def device(self, i: int) -> Dict[str, Any]:
        m = self.m
        h = m.nvmlDeviceGetHandleByIndex(i)
        dev: Dict[str, Any] = {"index": i, "name": self._s(m.nvmlDeviceGetName(h))}
        for key, fn in (("uuid", lambda: self._s(m.nvmlDeviceGetUUID(h))),
                        ("compute_capability",
                         lambda: "%d.%d" % tuple(m.nvmlDeviceGetCudaComputeCapability(h))),
                        ("memory_total_mib", lambda: int(m.nvmlDeviceGetMemoryInfo(h).total // (1 << 20))),
                        ("mig_mode", lambda: bool(m.nvmlDeviceGetMigMode(h)[0]))):
            try:
                dev[key] = fn()
            except Exception:
                pass
        return dev

    def close(self) -> None:
        self.m.nvmlShutdown()


def _nvml_query() -> Dict[str, Any]:
    try:
        import pynvml  # nvidia-ml-py

        nvml: Any = _PyNvml(pynvml)
    except ImportError:
        nvml = _CtypesNvml()
    try:
        info: Dict[str, Any] = {"source": "nvml", "driver": nvml.driver()}
        try:
            v = nvml.cuda_driver()
            info["cuda_driver"] = "%d.%d" % (v // 1000, (v % 1000) // 10)
        except Exception:
            pass
        info["devices"] = [nvml.device(i) for i in range(nvml.count())]
        return info
    finally:
        try:
            nvml.close()
        except Exception:
            pass


def _hash_uuids(info: Dict[str, Any]) -> Dict[str, Any]:
    for dev in info.get("devices", []):
        uuid = dev.pop("uuid", None)
        if uuid:
            dev["uuid_sha256"] = sha256(uuid.encode("utf-8")).hexdigest()
    return info


def _nvml_words(exc: BaseException) -> str:
    """What went wrong, in NVML's words when NVML answered (ctypes or nvidia-ml-py)."""
    if isinstance(exc, NvmlError):
        return str(exc)
    if type(exc).__name__.startswith("NVMLError"):  # nvidia-ml-py: str() is nvmlErrorString
        return "%s (NVML error %s)" % (exc, getattr(exc, "value", "?"))
    return "%s: %s" % (type(exc).__name__, exc)


# The kernel driver's own file: present wherever an NVIDIA driver is loaded (and passed into a
# container with GPUs); absent on a host that has none.
DRIVER_PROC = "/proc/driver/nvidia/version"


def _library_missing(exc: BaseException) -> bool:
    """NVML's library could not be loaded (ctypes' OSError, nvidia-ml-py's LibraryNotFound)."""
    return isinstance(exc, OSError) or type(exc).__name__ == "NVMLError_LibraryNotFound"


def nvml_timeout_from_env() -> float:
    """Seconds the NVML watchdog waits: ``$ENVLOCK_NVML_TIMEOUT``, else the default."""
    return float(os.environ.get("ENVLOCK_NVML_TIMEOUT", DEFAULT_NVML_TIMEOUT))


def collect_gpu(torch: Any, timeout: float) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """NVML in a watchdog thread (a wedged driver must not hang capture), then torch.cuda."""
    box: Dict[str, Any] = {}

    def work() -> None:
        try:
            box["info"] = _nvml_query()
        except Exception as exc:
            box["error"] = _nvml_words(exc)
            box["no_library"] = _library_missing(exc)

    thread = threading.Thread(target=work, name="envlock-nvml", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        nvml_error = "NVML did not answer within %gs" % timeout
    elif "info" in box:
        return _hash_uuids(box["info"]), None
    elif box.get("no_library") and not os.path.exists(DRIVER_PROC):
        # No NVIDIA driver at all (a CPU host, a container started without GPUs): no GPU is the
        # answer, not an error to print on every show.
        nvml_error = None
    else:
        nvml_error = "NVML unavailable: %s" % box.get("error", "unknown")
    if torch is not None and quiet(lambda: torch.cuda.is_available()):
        devices = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            dev = {"index": i, "name": props.name,
                   "compute_capability": "%d.%d" % (props.major, props.minor),
                   "memory_total_mib": int(props.total_memory // (1 << 20))}
            uuid = quiet(lambda p=props: str(p.uuid))  # type: ignore[misc]
            if uuid:
                dev["uuid"] = uuid
            devices.append(dev)
        return _hash_uuids({"source": "torch", "devices": devices}), None
    return None, nvml_error
