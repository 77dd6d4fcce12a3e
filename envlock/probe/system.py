"""The machine and the interpreter: OS, kernel, libc, CPU; Python version, ABI, prefix kind.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
import sys

from .files import read_text

TYPE_CHECKING = False  # typing is imported by the type checker only, see rules.py
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

# On Linux the probe reads what ``platform`` and ``sysconfig`` would tell from the same sources
# (os.uname, sys.version, the interpreter's extension suffix) without importing them: together
# they cost ~3 ms of a ~40 ms probe run without torch, and Python 3.8's ``platform.uname()`` also
# starts ``uname -p``. Anything that is not plain Linux CPython goes to the modules themselves;
# a test compares both answers on every interpreter it runs.
_LINUX = sys.platform == "linux" and os.name == "posix" and hasattr(os, "uname")


def _blank(value: str) -> str:
    return "" if value == "unknown" else value  # platform.uname() reports "unknown" as ""


def uname() -> Tuple[str, str, str]:
    """(system, release, machine) as ``platform.uname()`` gives them."""
    if _LINUX:
        u = os.uname()
        if u.sysname == "Linux":
            return _blank(u.sysname), _blank(u.release), _blank(u.machine)
    import platform

    full = platform.uname()
    return full.system, full.release, full.machine


# platform._sys_version's pattern for CPython, as this version's platform has it (3.13 added
# the free-threading words).
_CPYTHON_VERSION = (r"([\w.+]+)\s*%s\(#?([^,]+)(?:,\s*([\w ]*)(?:,\s*([\w :]*))?)?\)\s*\[([^\]]+)\]?"
                    % (r"(?:experimental free-threading build\s+)?" if sys.version_info >= (3, 13) else ""))


def python_version(version: Optional[str] = None) -> str:
    """``platform.python_version()`` (of ``version``, default ``sys.version``), read as
    ``platform`` reads it for CPython: the first word, with ".0" added to a two-part one."""
    text = sys.version if version is None else version
    if sys.implementation.name == "cpython" and "IronPython" not in text and "PyPy" not in text:
        m = re.match(_CPYTHON_VERSION, text, re.ASCII)
        if m:
            parts = m.group(1).split(".")
            if len(parts) == 2:
                parts.append("0")
            return ".".join(parts)
    import platform

    if version is None:
        return platform.python_version()
    return str(platform._sys_version(version)[1])  # type: ignore[attr-defined]


def soabi_and_platform_tag() -> Tuple[Optional[str], str]:
    """``sysconfig.get_config_var("SOABI")`` and ``sysconfig.get_platform()``.

    CPython on Linux names its extension modules ``.{SOABI}.so`` first (both come from the one
    configure value), and get_platform() is ``linux-{machine}`` there.
    """
    if _LINUX and sys.implementation.name == "cpython":
        from importlib.machinery import EXTENSION_SUFFIXES

        m = re.match(r"\.(cpython-[^./]+)\.so\Z", EXTENSION_SUFFIXES[0] if EXTENSION_SUFFIXES else "")
        osname, machine = os.uname().sysname, os.uname().machine
        if m and "_PYTHON_HOST_PLATFORM" not in os.environ and osname == "Linux":
            return m.group(1), "%s-%s" % (osname.lower(), machine.replace(" ", "_").replace("/", "-"))
    import sysconfig

    return sysconfig.get_config_var("SOABI"), sysconfig.get_platform()


def collect_platform() -> Dict[str, Any]:
    system, release, machine = uname()
    info: Dict[str, Any] = {"os": system or sys.platform, "machine": machine}
    text = read_text("/etc/os-release") or read_text("/usr/lib/os-release")
    if text:
        fields = {}
        for line in text.splitlines():
            if "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                fields[key.strip()] = value.strip().strip('"').strip("'")
        info["os_id"] = fields.get("ID")
        info["os_version_id"] = fields.get("VERSION_ID")
        info["os_pretty_name"] = fields.get("PRETTY_NAME")
    info["kernel"] = release
    libc = None
    try:
        # confstr is a syscall-free lookup; platform.libc_ver() scans the interpreter binary.
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        pass
    if libc:
        name, _, version = libc.partition(" ")
        info["libc"], info["libc_version"] = name, version
    elif sys.platform.startswith("linux"):
        import glob

        musl = glob.glob("/lib/ld-musl-*.so.1")
        if musl:
            info["libc"] = "musl"
    cpuinfo = read_text("/proc/cpuinfo", 1 << 16)
    if cpuinfo:
        for line in cpuinfo.splitlines():
            if line.startswith(("model name", "Model", "cpu model", "Processor")):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    elif sys.platform == "darwin":
        import platform

        info["cpu_model"] = platform.processor() or None
    try:
        info["cpu_count"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cpu_count"] = os.cpu_count()
    return {k: v for k, v in info.items() if v is not None}


def prefix_kind() -> str:
    if os.path.isdir(os.path.join(sys.prefix, "conda-meta")):
        return "conda"
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return "venv"
    return "system"


def collect_python() -> Dict[str, Any]:
    soabi, platform_tag = soabi_and_platform_tag()
    return {
        "version": python_version(),
        "implementation": sys.implementation.name,
        "soabi": soabi,
        "platform_tag": platform_tag,
        "prefix_kind": prefix_kind(),
        "executable": sys.executable or None,
        "prefix": sys.prefix,
    }
