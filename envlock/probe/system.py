"""The machine and the interpreter: OS, kernel, libc, CPU; Python version, ABI, prefix kind.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig
from typing import Any, Dict, FrozenSet, Optional

from .files import read_text


def collect_platform() -> Dict[str, Any]:
    uname = platform.uname()
    info: Dict[str, Any] = {"os": uname.system or sys.platform, "machine": uname.machine}
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
    info["kernel"] = uname.release
    libc = None
    try:
        # confstr asks the C library this process runs on; platform.libc_ver() guesses from
        # marker strings in the interpreter binary, which a static or musl build lacks.
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
    return {
        "version": platform.python_version(),
        "implementation": sys.implementation.name,
        "soabi": sysconfig.get_config_var("SOABI"),
        "platform_tag": sysconfig.get_platform(),
        "prefix_kind": prefix_kind(),
        "executable": sys.executable or None,
        "prefix": sys.prefix,
    }


def cpu_flags() -> Optional[FrozenSet[str]]:
    """The CPU's features as /proc/cpuinfo spells them (x86 ``flags``, Arm ``Features``), or
    None where they cannot be read."""
    text = read_text("/proc/cpuinfo", 1 << 16)
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")) and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return None
