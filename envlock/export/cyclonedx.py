"""``export --to cyclonedx``: a CycloneDX 1.6 JSON SBOM via cyclonedx-python-lib.

Security teams read SBOMs, not env.lock. Each distribution is a library component with a purl
(local versions percent-encoded by packageurl: ``pkg:pypi/torch@2.13.0%2Bcu130``); the image,
OS, Python, the torch/CUDA/cuDNN/NCCL stack and the GPUs are components of their own; what
has no CycloneDX field (determinism flags, seeds, numerics variables) is an ``envlock:*``
property. The serial number derives from the fingerprint, so one lock gives one SBOM.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from envlock.errors import MissingExtra
from envlock.export.common import marker
from envlock.lock import Lock, Package

if TYPE_CHECKING:
    from cyclonedx.model.component import Component

    from envlock.export.artifacts import Resolved

_NS = uuid.UUID("5b0c7d3e-0c4b-4f51-9a51-7e6e0c6c6b10")  # envlock's namespace for serial numbers


def _lib() -> Any:
    try:
        import cyclonedx.model.bom as bom_mod
    except ModuleNotFoundError:
        raise MissingExtra("--to cyclonedx needs cyclonedx-python-lib",
                           hint="pip install 'envlock-ml[sbom]'") from None
    return bom_mod


def _props(pairs: Iterable[tuple[str, Any]]) -> list[Any]:
    from cyclonedx.model import Property

    return [Property(name=f"envlock:{k}", value=str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in pairs if v not in (None, "", [])]


def _hashes(shas: Iterable[str]) -> list[Any]:
    from cyclonedx.model import HashAlgorithm, HashType

    return [HashType(alg=HashAlgorithm.SHA_256, content=h) for h in dict.fromkeys(shas)]


def _package(pkg: Package, resolved: Resolved | None) -> Component:
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    qualifiers: dict[str, str] = {}
    if pkg.source == "vcs" and pkg.url and pkg.vcs and pkg.commit:
        qualifiers["vcs_url"] = f"{pkg.vcs}+{pkg.url}@{pkg.commit}"
    elif pkg.source == "url" and pkg.url:
        qualifiers["download_url"] = pkg.url
    if resolved and resolved.index and resolved.kind == "index":  # a find-links place is no repository
        qualifiers["repository_url"] = resolved.index
    shas = [h.split(":", 1)[1] for h in pkg.hashes]
    if pkg.archive_hash and pkg.archive_hash.startswith(("sha256=", "sha256:")):
        shas.append(pkg.archive_hash[7:].lower())
    if resolved:
        shas += [a.sha256 for a in resolved.artifacts]
    purl = PackageURL(type="pypi", name=pkg.name, version=pkg.version, qualifiers=qualifiers or None)
    return Component(
        name=pkg.name, version=pkg.version, type=ComponentType.LIBRARY, purl=purl,
        bom_ref=f"pypi:{pkg.name}", hashes=_hashes(shas),
        properties=_props([("source", pkg.source), ("installer", pkg.installer),
                           ("record_sha256", pkg.record_sha256)]))


# purl types of the OS package managers (purl-spec): deb, apk, rpm.
_OS_PURL_TYPE = {"dpkg": "deb", "apk": "apk", "rpm": "rpm"}


def _os_packages(lock: Lock) -> list[Component]:
    """The image's OS packages (``[os_packages]``): an SBOM of a container lists what the
    package manager installed, not only the Python distributions."""
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    from envlock.lock import split_os_spec

    table = lock.os_packages
    if table is None:
        return []
    kind = _OS_PURL_TYPE[table.manager]
    distro = lock.platform.os_id or None
    qualifiers = {"distro": f"{distro}-{lock.platform.os_version_id}"} \
        if distro and lock.platform.os_version_id else {}
    out = []
    for spec in table.packages:
        name, arch, version = split_os_spec(spec)
        purl = PackageURL(type=kind, namespace=distro, name=name, version=version,
                          qualifiers={**qualifiers, **({"arch": arch} if arch else {})} or None)
        out.append(Component(name=name, version=version, type=ComponentType.LIBRARY, purl=purl,
                             bom_ref=f"{kind}:{name}:{arch}",
                             properties=_props([("os_package.manager", table.manager),
                                                ("os_package.arch", arch)])))
    return out


def _stack(lock: Lock) -> list[Component]:
    """Image, OS, Python, CUDA/cuDNN/NCCL as loaded, driver and GPUs."""
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    out: list[Component] = []
    img = lock.image
    if img.digest or img.id:
        pin = img.digest or img.id or ""
        ref = img.reference or "image"
        repo = ref.split("@", 1)[0].rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref.split("@", 1)[0]
        purl = (PackageURL(type="oci", name=repo.rsplit("/", 1)[-1], version=pin,
                           qualifiers={"repository_url": repo}) if img.digest else None)
        out.append(Component(name=repo, version=pin, type=ComponentType.CONTAINER, bom_ref="image",
                             purl=purl, hashes=_hashes([pin.split(":", 1)[1]]),
                             properties=_props([("image.source", img.source), ("image.engine", img.engine)])))
    plat = lock.platform
    out.append(Component(name=plat.os_id or plat.os, version=plat.os_version_id, bom_ref="os",
                         type=ComponentType.OPERATING_SYSTEM, description=plat.os_pretty_name,
                         properties=_props([("machine", plat.machine), ("libc", plat.libc),
                                            ("libc_version", plat.libc_version)])))
    py = lock.python
    out.append(Component(name=py.implementation, version=py.version, bom_ref="python",
                         type=ComponentType.PLATFORM,
                         properties=_props([("soabi", py.soabi), ("prefix_kind", py.prefix_kind)])))
    if lock.torch:
        t = lock.torch
        for name, version in (("cuda-runtime", t.cuda), ("cudnn", t.cudnn), ("nccl", t.nccl), ("hip", t.hip)):
            if version:
                out.append(Component(name=name, version=version, bom_ref=f"torch-stack:{name}",
                                     type=ComponentType.LIBRARY,
                                     description=f"{name} as loaded by torch {t.version}"))
    if lock.gpu:
        g = lock.gpu
        if g.driver:
            out.append(Component(name="nvidia-driver", version=g.driver, bom_ref="gpu-driver",
                                 type=ComponentType.DEVICE_DRIVER,
                                 properties=_props([("cuda_driver", g.cuda_driver), ("gpu.source", g.source)])))
        for dev in g.devices:
            out.append(Component(name=dev.name, bom_ref=f"gpu:{dev.index}", type=ComponentType.DEVICE,
                                 properties=_props([("compute_capability", dev.compute_capability),
                                                    ("memory_total_mib", dev.memory_total_mib),
                                                    ("mig_mode", dev.mig_mode)])))
    return out


def _lock_properties(lock: Lock) -> list[Any]:
    d, s = lock.determinism, lock.seeds
    knobs = [(f"determinism.{k}", v) for k, v in d.model_dump(exclude={"env", "late"}).items()
             if v is not None]
    return _props([("id", lock.short_id), ("fingerprint", lock.envlock.fingerprint), *knobs,
                   *((f"env.{k}", v) for k, v in d.env.items()),
                   ("seed", s.seed), ("python_hash_seed", s.python_hash_seed),
                   ("git.commit", lock.git.commit if lock.git else None)]) \
        + _props([("export", marker("cyclonedx", lock))])  # envlock:export, proof of authorship


def render(lock: Lock, resolved: list[Resolved] | None = None) -> str:
    bom_mod = _lib()
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6

    from envlock._version import __version__

    by_name = {r.package.name: r for r in resolved or ()}
    root = Component(name=f"envlock-{lock.short_id}", version=lock.short_id, bom_ref="environment",
                     type=ComponentType.APPLICATION,
                     description="the environment recorded by env.lock (envlock)")
    tool = Component(name="envlock", version=__version__, type=ComponentType.APPLICATION)
    meta = bom_mod.BomMetaData(component=root, timestamp=lock.envlock.created_at,
                               properties=_lock_properties(lock))
    meta.tools.components.add(tool)
    stack = _stack(lock)
    pkgs = [_package(p, by_name.get(p.name)) for p in lock.packages] + _os_packages(lock)
    bom = bom_mod.Bom(metadata=meta, components=[*stack, *pkgs],
                      serial_number=uuid.uuid5(_NS, lock.envlock.fingerprint or lock.short_id))
    bom.register_dependency(root, [*stack, *pkgs])
    text: str = JsonV1Dot6(bom).output_as_string(indent=2)
    return text + "\n"
