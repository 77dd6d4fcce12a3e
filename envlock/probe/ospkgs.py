"""Installed OS packages (dpkg, apk, rpm) and the Python distributions they own.

Stdlib only, Python >= 3.8, part of the probe package but importing none of it: restore also
runs this file alone (``ospkgs.py --check``) inside system-Python builds. The databases are
read as files, not through ``dpkg-query``/``apk``: the file is the database those tools read,
its format is stable, and reading it needs neither the tool inside a slim image nor a
subprocess at the start of every training job (``benchmarks/ospkgs.py`` compares). Only rpm has no stable on-disk format (a
BerkeleyDB or SQLite file), so rpm is asked through ``run``, the probe's subprocess runner
(argv, timeout, own process group): once for the packages, and once, for all of them together,
for the owners of the shared libraries a process loaded.

Each package is one string ``name:arch=version``: apt's own spelling of an exact pin, and short
enough that a lock with 800 OS packages stays readable.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

Runner = Callable[[List[str], float], Tuple[Optional[int], bytes, str]]

DPKG_STATUS = "var/lib/dpkg/status"
DPKG_INFO = "var/lib/dpkg/info"
APK_INSTALLED = "lib/apk/db/installed"
RPM_TIMEOUT = 20.0
RPM_QUERYFORMAT = "%{NAME}\\t%|EPOCH?{%{EPOCH}:}:{}|%{VERSION}-%{RELEASE}\\t%{ARCH}\\n"
# ``rpm -qf`` with this format prints, for each file asked about, every file of the package that
# owns it with the package's name: each line names the file it is about, so the answer does not
# depend on the order of the output or on which files no package owns (rpm prints a sentence
# for those, and exits 1). A file's owner is a lookup of the database's file index, not a scan.
RPM_FILES_QUERYFORMAT = "[%{FILENAMES}\\t%{NAME}\\n]"
RPM_OWNERS_TIMEOUT = 10.0

# What a lock accepts for each part; anything else in a database is dropped, not trusted.
_NAME = r"[A-Za-z0-9][A-Za-z0-9+._-]{0,127}"
_VERSION = r"[A-Za-z0-9][A-Za-z0-9.+~:_^-]{0,127}"
_ARCH = r"[a-z0-9][a-z0-9_-]{0,31}"
# Patterns are strings that ``re`` compiles (and keeps) on first use: a probe that finds the
# parsed database in its cache needs none of them.
_NAME_RE = "^%s$" % _NAME
_VERSION_RE = "^%s$" % _VERSION
_ARCH_RE = "^%s$" % _ARCH
# A whole pin as spec() writes it (the parts cannot hold ":" or "=" before the version).
SPEC_PATTERN = "%s:%s=%s" % (_NAME, _ARCH, _VERSION)
# Where an OS package manager puts Python distributions (never /usr/local, where pip goes).
_SYSTEM_SITE_RE = r"^/usr/(lib|lib64|share)/python3[0-9.]*/(dist|site)-packages$"


def spec(name: str, arch: str, version: str) -> Optional[str]:
    """``name:arch=version``, or None when a part is not inert text."""
    if re.match(_NAME_RE, name) and re.match(_ARCH_RE, arch) and re.match(_VERSION_RE, version):
        return "%s:%s=%s" % (name, arch, version)
    return None


_DPKG_FIELD_RE = r"(?m)^(Package|Status|Version|Architecture|Source): *([^\n]*)$"


# dpkg's package states (the third word of Status) in which the package's files are there.
_DPKG_PRESENT = frozenset(("installed", "triggers-awaited", "triggers-pending", "half-configured",
                           "unpacked", "half-installed"))


def parse_dpkg_status(text: str) -> List[Dict[str, str]]:
    """Installed packages of a dpkg status file: name, version, arch (and source if it differs).

    Every stanza whose files are on disk, whatever is wanted of it (``hold`` and ``deinstall``
    are wishes): installed, waiting on triggers, or caught mid-install by the capture (dpkg -l
    ``iU``, ``iF``, ``iH``: unpacked, half-configured, half-installed), which is the version
    being installed, not a removed package. Not those whose files are gone: a removed package
    keeps a stanza (``deinstall ok config-files``), and ``not-installed``. One regex pass over
    the whole file: fields start a line, and continuation lines start with a space and never
    match.
    """
    out: List[Dict[str, str]] = []
    fields: Dict[str, str] = {}

    def flush() -> None:
        name, version = fields.get("Package"), fields.get("Version")
        status = fields.get("Status", "").split()
        if len(status) != 3 or status[2] not in _DPKG_PRESENT or not name or not version:
            return
        pkg = {"name": name.strip(), "version": version.strip(),
               "arch": (fields.get("Architecture") or "all").strip()}
        source = fields.get("Source", "").split(" ")[0]
        if source and source != pkg["name"]:
            pkg["source"] = source
        out.append(pkg)

    for key, value in re.findall(_DPKG_FIELD_RE, text):
        if key == "Package":
            flush()
            fields = {}
        fields.setdefault(key, value)
    flush()
    return out


def parse_apk_installed(text: str) -> Tuple[List[Dict[str, str]], Dict[str, str]]:
    """(packages, {path: package name}) of Alpine's ``/lib/apk/db/installed``.

    The database lists each package's directories (``F:``) and files (``R:``); the path map is
    what tells which package owns a ``*.dist-info`` directory or a shared library, with no
    second read.
    """
    out: List[Dict[str, str]] = []
    dirs: Dict[str, str] = {}
    for stanza in text.split("\n\n"):
        fields: Dict[str, str] = {}
        owned: List[str] = []
        directory = ""
        for line in stanza.split("\n"):
            if len(line) < 2 or line[1] != ":":
                continue
            key, value = line[0], line[2:]
            if key == "F":
                directory = value
                if value.endswith((".dist-info", ".egg-info")):
                    owned.append("/" + value)
            elif key == "R":
                if directory and (value.endswith(".so") or ".so." in value):
                    owned.append("/%s/%s" % (directory, value))
            elif key in "PVAo" and key not in fields:
                fields[key] = value.strip()
        name, version = fields.get("P"), fields.get("V")
        if not name or not version:
            continue
        pkg = {"name": name, "version": version, "arch": fields.get("A") or "noarch"}
        if fields.get("o") and fields["o"] != name:
            pkg["source"] = fields["o"]
        out.append(pkg)
        for path in owned:
            dirs[path] = name
    return out, dirs


def parse_rpm_query(text: str) -> List[Dict[str, str]]:
    """Output of ``rpm -qa --qf RPM_QUERYFORMAT``: one ``name<TAB>version<TAB>arch`` per line."""
    out: List[Dict[str, str]] = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            continue
        if parts[0] == "gpg-pubkey":
            continue  # imported signing keys, not software
        out.append({"name": parts[0], "version": parts[1], "arch": parts[2] or "noarch"})
    return out


def parse_rpm_files(text: str, wanted: Set[str]) -> Dict[str, str]:
    """{path: package} of the ``wanted`` paths among the lines of ``rpm -qf --queryformat
    RPM_FILES_QUERYFORMAT`` (``path<TAB>package``; the path may itself hold a tab)."""
    found: Dict[str, str] = {}
    for line in text.split("\n"):
        path, sep, name = line.rpartition("\t")
        if sep and path in wanted and re.match(_NAME_RE, name):
            found.setdefault(path, name)
    return found


def rpm_owners(run: Runner, wanted: Set[str]) -> Dict[str, str]:
    """{path: package} of the wanted files, from one ``rpm -qf`` for all of them ({} when rpm
    cannot answer within ``RPM_OWNERS_TIMEOUT``: the libraries are then hashed instead)."""
    if not wanted:
        return {}
    rc, out, _ = run(["rpm", "-qf", "--queryformat", RPM_FILES_QUERYFORMAT, "--", *sorted(wanted)],
                     RPM_OWNERS_TIMEOUT)
    if rc is None:  # not found, not started or timed out; exit 1 only says some had no owner
        return {}
    return parse_rpm_files(out.decode("utf-8", "surrogateescape"), wanted)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


class Database:
    """The OS packages of one root, and (for dpkg and apk) who owns which directory."""

    def __init__(self, manager: str, packages: List[Dict[str, str]], root: str,
                 apk_dirs: Optional[Dict[str, str]] = None,
                 specs: Optional[List[str]] = None, run: Optional[Runner] = None) -> None:
        self.manager = manager
        self.packages = packages
        self.root = root
        self.apk_dirs = apk_dirs
        self.run = run  # rpm: how the owners of files are asked
        self._specs = specs  # what specs() returned when the database was read (a cache)
        # Who lists which path among dpkg's file lists (the probe's cache may stand in).
        self.dpkg_owners: Callable[[str, Set[str], Tuple[bytes, str]], Dict[str, str]] = \
            lambda info_dir, wanted, kind: dpkg_owners(info_dir, wanted, kind=kind)

    def specs(self) -> List[str]:
        if self._specs is None:
            found = (spec(p["name"], p["arch"], p["version"]) for p in self.packages)
            self._specs = sorted(set(s for s in found if s))
        return list(self._specs)

    def document(self) -> Dict[str, object]:
        return {"manager": self.manager, "packages": self.specs()}

    def owners(self, dirs: Iterable[str]) -> Dict[str, Tuple[str, str]]:
        """{directory: (package, version)} for the given dist-info/egg-info directories."""
        found = self._listing(set(dirs), DISTRIBUTIONS)
        if not found:
            return {}
        versions = dict((p["name"], p["version"]) for p in self.packages)
        versions.update(("%s:%s" % (p["name"], p["arch"]), p["version"]) for p in self.packages)
        out = {}
        for d, owner in found.items():
            bare = owner.split(":", 1)[0]
            version = versions.get(owner) or versions.get(bare)
            if version and re.match(_NAME_RE, bare) and re.match(_VERSION_RE, version):
                out[d] = (bare, version)
        return out

    def file_owners(self, paths: Iterable[str]) -> Dict[str, str]:
        """{path: package} for the given files (shared libraries): dpkg's file lists, apk's
        database, rpm's answer to one ``rpm -qf`` for all of them."""
        wanted = set(paths)
        if self.manager == "rpm":
            return rpm_owners(self.run, wanted) if self.run is not None else {}
        return {p: owner.split(":", 1)[0] for p, owner in self._listing(wanted, LIBRARIES).items()
                if re.match(_NAME_RE, owner.split(":", 1)[0])}

    def _listing(self, wanted: Set[str], kind: Tuple[bytes, str]) -> Dict[str, str]:
        """{path: the package (dpkg: its list's name) that lists it} of the wanted paths."""
        if not wanted:
            return {}
        if self.manager == "apk":
            names = self.apk_dirs or {}
            return {p: names[p] for p in wanted if p in names}
        if self.manager == "dpkg":
            return self.dpkg_owners(os.path.join(self.root, DPKG_INFO), wanted, kind)
        return {}


# Directories a merged-/usr system links from / into /usr: a file mapped from /usr/lib/x/libc.so.6
# is listed by its package as /lib/x/libc.so.6 on Debian 12 (and as /usr/lib/... on newer ones).
_MERGED_DIRS = ("/lib/", "/lib32/", "/lib64/", "/libx32/", "/bin/", "/sbin/")


def merged_usr_spellings(path: str) -> Tuple[str, ...]:
    """``path`` and, under a merged-/usr directory, its other spelling (first: ``path``)."""
    for top in _MERGED_DIRS:
        if path.startswith("/usr" + top):
            return path, path[len("/usr"):]
        if path.startswith(top):
            return path, "/usr" + path
    return (path,)


def _one_file(path: str) -> str:
    """The spelling two names of one file under merged /usr share."""
    return min(merged_usr_spellings(path), key=len)


# What dpkg_owners looks for: (a byte string every list that can hold one contains, the word in
# the names of the lists read first). Python distributions are almost always in python3-* lists,
# shared libraries in lib* ones.
DISTRIBUTIONS = (b"-info\n", "python")
LIBRARIES = (b".so", "lib")


def dpkg_owners(info_dir: str, wanted: Set[str],
                reads: Optional[List[Tuple[str, Optional[os.stat_result]]]] = None,
                kind: Tuple[bytes, str] = DISTRIBUTIONS) -> Dict[str, str]:
    """Scan dpkg's ``*.list`` file lists for the wanted paths (``kind``: DISTRIBUTIONS for
    dist-info directories, LIBRARIES for shared objects).

    A Debian system holds hundreds of lists; the likely owners are read first and the scan
    stops once all are found. Each list is searched for whole lines with bytes.find (memmem),
    never split into lines. ``reads`` receives each list read, in order, with its stat taken
    before the read (None when it could not be read): everything the answer depends on besides
    the directory's listing.
    """
    try:
        names = [n for n in os.listdir(info_dir) if n.endswith(".list")]
    except OSError:
        return {}
    hint, first = kind
    names.sort(key=lambda n: (0 if first in n else 1, n))
    targets = dict((b"\n" + p.encode("utf-8", "surrogateescape") + b"\n", p) for p in wanted)
    # Both spellings of a merged-/usr file may be wanted, and only one is listed: the scan is
    # done when every file is found under one of them.
    files = set(_one_file(p) for p in wanted)
    found: Dict[str, str] = {}
    for fname in names:
        try:
            with open(os.path.join(info_dir, fname), "rb") as fh:
                if reads is not None:
                    reads.append((fname, os.fstat(fh.fileno())))
                data = b"\n" + fh.read() + b"\n"
        except OSError:
            if reads is not None:
                reads.append((fname, None))
            continue
        if hint not in data:
            continue
        for needle, path in targets.items():
            if path not in found and needle in data:
                found[path] = fname[:-5]
        if len(set(_one_file(p) for p in found)) == len(files):
            break
    return found


def load(root: str = "/", run: Optional[Runner] = None) -> Optional[Database]:
    """The package database of ``root``, or None when it has none envlock can read."""
    text = _read(os.path.join(root, DPKG_STATUS))
    if text is not None:
        return Database("dpkg", parse_dpkg_status(text), root)
    text = _read(os.path.join(root, APK_INSTALLED))
    if text is not None:
        packages, dirs = parse_apk_installed(text)
        return Database("apk", packages, root, dirs)
    if run is not None and root == "/" and any(
            os.path.exists(p) for p in ("/var/lib/rpm", "/usr/lib/sysimage/rpm")):
        rc, out, err = run(["rpm", "-qa", "--qf", RPM_QUERYFORMAT], RPM_TIMEOUT)
        if rc != 0:
            raise RuntimeError("rpm -qa failed: %s" % (err or "exit %s" % rc))
        return Database("rpm", parse_rpm_query(out.decode("utf-8", "replace")), root, run=run)
    return None


def is_system_site(directory: str) -> bool:
    """True for the directories an OS package manager installs Python distributions into."""
    return bool(re.match(_SYSTEM_SITE_RE, directory.rstrip("/")))


def mark_system(packages: List[Dict[str, object]], locations: Dict[str, str],
                db: Database) -> int:
    """Give ``source = "system"`` and the owning package to distributions the OS installed.

    ``locations`` maps a distribution name to its dist-info/egg-info path; only those in a
    system site directory are looked up, so a venv capture reads no file list at all.
    """
    candidates: Dict[str, str] = {}
    for name, path in locations.items():
        if is_system_site(os.path.dirname(path)):
            candidates[path] = name
            real = os.path.realpath(path)
            if real != path:
                candidates.setdefault(real, name)
    owners = db.owners(candidates)
    by_name: Dict[str, Tuple[str, str]] = {}
    for path, owner in owners.items():
        by_name.setdefault(candidates[path], owner)
    marked = 0
    for pkg in packages:
        found = by_name.get(str(pkg.get("name")))
        if found is None:
            continue
        pkg["source"] = "system"
        pkg["os_package"], pkg["os_package_version"] = found
        for key in ("url", "vcs", "commit", "requested_revision", "archive_hash"):
            pkg.pop(key, None)
        marked += 1
    return marked


def main(argv: Optional[List[str]] = None) -> int:
    """``python ospkgs.py --check SPEC_FILE``: which pinned packages apt cannot install.

    Runs inside a restore build, after ``apt-get update``: every ``name:arch=version`` of the
    file must be installed already or be offered by the image's sources. Prints one line naming
    each missing pin and exits 100, so the build fails with that line as its cause.
    """
    import subprocess
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "--check":
        sys.stderr.write("usage: ospkgs.py --check SPEC_FILE\n")
        return 2
    wanted = [line.strip() for line in (_read(args[1]) or "").splitlines()
              if line.strip() and not line.startswith("#")]
    db = load("/")
    have = set(db.specs()) if db else set()
    names = sorted(set(s.split(":", 1)[0] for s in wanted if s not in have))
    offered = set()
    for i in range(0, len(names), 200):
        proc = subprocess.run(["apt-cache", "madison", *names[i:i + 200]],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=300)
        for line in proc.stdout.decode("utf-8", "replace").splitlines():
            cols = [c.strip() for c in line.split("|")]
            if len(cols) >= 2:
                offered.add("%s=%s" % (cols[0], cols[1]))
    missing = [s for s in wanted if s not in have
               and "%s=%s" % (s.split(":", 1)[0], s.split("=", 1)[1]) not in offered]
    if missing:
        sys.stdout.write("envlock: OS package versions no longer available: %s\n" % ", ".join(missing))
        sys.stdout.flush()
        return 100
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
