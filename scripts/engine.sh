#!/usr/bin/env bash
# Make sure a container engine is reachable for the envlock test suite.
#
# Docker (mandatory): reuse a working $DOCKER_HOST, otherwise install docker.io
# with apt if dockerd is missing and start a private dockerd on
# unix:///run/envlock-docker.sock (its own data root, exec root and pid file,
# so it never collides with a system Docker).
#
# BuildKit client: restore builds through a docker client that builds with
# BuildKit (envlock/restore/clibuild.py): one with the buildx plugin, or a 20.10
# to 22.x client, which has it built in. When no docker on PATH is either,
# Debian's docker.io (whose client is 20.10) is installed.
#
# Podman (optional): install podman + runc if missing, write a containers.conf
# that works on this kind of machine (runc runtime, explicit ulimits) and start
# `podman system service` on unix:///run/envlock-podman.sock.
#
# Usage:
#   source scripts/engine.sh          # then call engine_setup; exports the vars
#   bash scripts/engine.sh            # sets up, prints `export ...` lines
#   eval "$(bash scripts/engine.sh)"  # set up and import the vars in a shell
#
# Exports: DOCKER_HOST, and when Podman works ENVLOCK_TEST_PODMAN_HOST and
# CONTAINERS_CONF. Set ENVLOCK_TEST_NO_PODMAN=1 to skip Podman entirely.

ENGINE_DOCKER_SOCK=/run/envlock-docker.sock
ENGINE_DOCKER_HOST="unix://${ENGINE_DOCKER_SOCK}"
ENGINE_DOCKER_DATA=/var/lib/envlock-docker
ENGINE_DOCKER_EXEC=/run/envlock-docker
ENGINE_DOCKER_PID=/run/envlock-docker.pid
ENGINE_DOCKER_LOG=/var/log/envlock-dockerd.log

ENGINE_PODMAN_SOCK=/run/envlock-podman.sock
ENGINE_PODMAN_HOST="unix://${ENGINE_PODMAN_SOCK}"
ENGINE_PODMAN_PID=/run/envlock-podman.pid
ENGINE_PODMAN_LOG=/var/log/envlock-podman.log
ENGINE_PODMAN_CONF_DIR=/etc/envlock-test
ENGINE_PODMAN_CONF="${ENGINE_PODMAN_CONF_DIR}/containers.conf"

ENGINE_WAIT_S="${ENVLOCK_ENGINE_WAIT_S:-60}"

_engine_log() { echo "[engine.sh] $*" >&2; }

# Installing packages and starting daemons needs root (CI runs as root).
_engine_sudo() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        _engine_log "need root for: $*"
        return 1
    fi
}
_engine_need_root() {
    if [[ "$(id -u)" -ne 0 ]]; then
        _engine_log "$1 needs root; run as root or start the engine yourself and set DOCKER_HOST"
        return 1
    fi
}

ENGINE_APT_LOG=/var/log/envlock-apt.log
_ENGINE_APT_UPDATED=0
_engine_apt() {  # quiet apt-get; full output in $ENGINE_APT_LOG, tail on failure
    if ! _engine_sudo env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 \
            apt-get -y -q "$@" >>"$ENGINE_APT_LOG" 2>&1; then
        _engine_log "apt-get $* failed; last lines of $ENGINE_APT_LOG:"
        tail -n 30 "$ENGINE_APT_LOG" >&2 || true
        return 1
    fi
}
_engine_apt_install() {
    if [[ "$_ENGINE_APT_UPDATED" -eq 0 ]]; then
        _engine_log "apt-get update"
        _engine_apt update || return 1
        _ENGINE_APT_UPDATED=1
    fi
    _engine_log "apt-get install $* (log: $ENGINE_APT_LOG)"
    _engine_apt install --no-install-recommends "$@"
}

# True when the docker API answers on $1 (a DOCKER_HOST value).
_engine_docker_ok() {
    DOCKER_HOST="$1" timeout 20 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1
}

# True when $1 is a live (not zombie) process whose command name is $2.
_engine_pid_alive() {
    local pid="$1" name="$2" state
    [[ "$pid" =~ ^[0-9]+$ && -d "/proc/$pid" ]] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]] || return 1
    state="$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$pid/stat" 2>/dev/null)"
    [[ -n "$state" && "$state" != "Z" && "$state" != "X" ]]
}

_engine_wait_for() {  # _engine_wait_for SECONDS CMD...
    local deadline=$((SECONDS + $1))
    shift
    while (( SECONDS < deadline )); do
        if "$@"; then return 0; fi
        sleep 0.5
    done
    "$@"
}

engine_docker() {
    local t0=$SECONDS
    if [[ -n "${DOCKER_HOST:-}" ]] && _engine_docker_ok "$DOCKER_HOST"; then
        _engine_log "docker: using running engine at DOCKER_HOST=$DOCKER_HOST"
        export DOCKER_HOST
        return 0
    fi
    if _engine_docker_ok "$ENGINE_DOCKER_HOST"; then
        _engine_log "docker: private dockerd already running at $ENGINE_DOCKER_HOST"
        export DOCKER_HOST="$ENGINE_DOCKER_HOST"
        return 0
    fi
    if ! command -v dockerd >/dev/null 2>&1 && [[ ! -x /usr/sbin/dockerd ]]; then
        local ta=$SECONDS
        _engine_apt_install docker.io
        _engine_log "docker: apt install took $((SECONDS - ta)) s"
    fi
    if ! command -v docker >/dev/null 2>&1; then
        _engine_log "docker: no docker client found after install"
        return 1
    fi
    local dockerd_bin
    dockerd_bin="$(command -v dockerd || echo /usr/sbin/dockerd)"

    # A dockerd from an earlier run may still be starting or be wedged.
    local pid=""
    [[ -f "$ENGINE_DOCKER_PID" ]] && pid="$(cat "$ENGINE_DOCKER_PID" 2>/dev/null || true)"
    if _engine_pid_alive "$pid" dockerd; then
        _engine_log "docker: dockerd pid $pid is alive but not answering; waiting up to ${ENGINE_WAIT_S}s"
        if _engine_wait_for "$ENGINE_WAIT_S" _engine_docker_ok "$ENGINE_DOCKER_HOST"; then
            export DOCKER_HOST="$ENGINE_DOCKER_HOST"
            return 0
        fi
        _engine_log "docker: dockerd pid $pid is wedged; stopping it"
        _engine_sudo kill "$pid" || true
        _engine_wait_for 20 bash -c "! test -d /proc/$pid" || _engine_sudo kill -9 "$pid" || true
    fi
    # Stale leftovers of a dead dockerd.
    if [[ -e "$ENGINE_DOCKER_PID" ]]; then
        _engine_log "docker: removing stale pid file $ENGINE_DOCKER_PID"
        _engine_sudo rm -f "$ENGINE_DOCKER_PID"
    fi
    if [[ -e "$ENGINE_DOCKER_SOCK" ]]; then
        _engine_log "docker: removing stale socket $ENGINE_DOCKER_SOCK"
        _engine_sudo rm -f "$ENGINE_DOCKER_SOCK"
    fi

    _engine_need_root "starting dockerd" || return 1
    _engine_log "docker: starting dockerd on $ENGINE_DOCKER_HOST (log: $ENGINE_DOCKER_LOG)"
    mkdir -p "$ENGINE_DOCKER_DATA" "$ENGINE_DOCKER_EXEC"
    # setsid + nohup: dockerd outlives this script and its process group.
    setsid nohup "$dockerd_bin" \
        --host "$ENGINE_DOCKER_HOST" \
        --data-root "$ENGINE_DOCKER_DATA" \
        --exec-root "$ENGINE_DOCKER_EXEC" \
        --pidfile "$ENGINE_DOCKER_PID" \
        </dev/null >>"$ENGINE_DOCKER_LOG" 2>&1 &
    if ! _engine_wait_for "$ENGINE_WAIT_S" _engine_docker_ok "$ENGINE_DOCKER_HOST"; then
        _engine_log "docker: dockerd did not answer within ${ENGINE_WAIT_S}s; last log lines:"
        tail -n 30 "$ENGINE_DOCKER_LOG" >&2 || true
        return 1
    fi
    export DOCKER_HOST="$ENGINE_DOCKER_HOST"
    _engine_log "docker: up in $((SECONDS - t0)) s (storage driver: $(docker info --format '{{.Driver}}' 2>/dev/null))"
}

# --- a docker client that builds with BuildKit ---------------------------

# True when the docker client $1 builds with BuildKit on $DOCKER_HOST, as
# clibuild.docker_client decides: buildx whose builder is the engine's own,
# or a client of 20.10 to 22.x.
_engine_buildkit_ok() {
    local docker="$1" version major minor
    if timeout 20 "$docker" buildx inspect 2>/dev/null | grep -Eq '^Driver:[[:space:]]*docker[[:space:]]*$'; then
        return 0
    fi
    version="$(timeout 20 "$docker" --version 2>/dev/null | grep -Eo '[0-9]+\.[0-9]+' | head -n 1)"
    [[ -n "$version" ]] || return 1
    major="${version%%.*}"
    minor="${version#*.}"
    (( major > 20 || (major == 20 && minor >= 10) )) && (( major < 23 ))
}

_engine_find_buildkit() {  # logs and succeeds when a docker on PATH builds with BuildKit
    local docker
    for docker in $(type -a -P docker 2>/dev/null); do
        if _engine_buildkit_ok "$docker"; then
            _engine_log "docker: $docker builds with BuildKit"
            return 0
        fi
    done
    return 1
}

engine_buildkit_client() {
    _engine_find_buildkit && return 0
    _engine_log "docker: no docker client on PATH builds with BuildKit; installing docker.io"
    _engine_apt_install docker.io && _engine_find_buildkit && return 0
    _engine_log "docker: still no docker client that builds with BuildKit (restore tests with ENVLOCK_BUILDER=cli will fail)"
    return 1
}

# --- Podman ---------------------------------------------------------------

_engine_write_podman_conf() {
    # crun (Debian's default runtime) fails here; runc works. Default ulimits
    # must be explicit: podman otherwise copies the host's hard limits, which
    # the runtime may then fail to apply inside the container.
    local tmp
    tmp="$(mktemp)"
    cat >"$tmp" <<'EOF'
# Written by scripts/engine.sh for the envlock test suite.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
EOF
    _engine_sudo mkdir -p "$ENGINE_PODMAN_CONF_DIR"
    if ! cmp -s "$tmp" "$ENGINE_PODMAN_CONF" 2>/dev/null; then
        _engine_sudo cp "$tmp" "$ENGINE_PODMAN_CONF"
        _engine_sudo chmod 0644 "$ENGINE_PODMAN_CONF"
    fi
    rm -f "$tmp"
}

_engine_podman_ok() {
    timeout 20 curl -fsS --unix-socket "$ENGINE_PODMAN_SOCK" http://d/_ping >/dev/null 2>&1
}

_engine_podman_try() {
    if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
        local ta=$SECONDS
        _engine_apt_install podman runc || { _engine_log "podman: apt install failed"; return 1; }
        _engine_log "podman: apt install took $((SECONDS - ta)) s"
    fi
    _engine_write_podman_conf
    export CONTAINERS_CONF="$ENGINE_PODMAN_CONF"

    local pid=""
    [[ -f "$ENGINE_PODMAN_PID" ]] && pid="$(cat "$ENGINE_PODMAN_PID" 2>/dev/null || true)"
    if _engine_podman_ok; then
        _engine_log "podman: service already running at $ENGINE_PODMAN_HOST"
    else
        if _engine_pid_alive "$pid" podman; then
            _engine_log "podman: service pid $pid not answering; restarting it"
            _engine_sudo kill "$pid" || true
            sleep 1
        fi
        _engine_need_root "starting podman system service" || return 1
        rm -f "$ENGINE_PODMAN_SOCK" "$ENGINE_PODMAN_PID"
        _engine_log "podman: starting service on $ENGINE_PODMAN_HOST (log: $ENGINE_PODMAN_LOG)"
        # setsid does not fork here (a background job is no group leader), so
        # $! is podman's own pid.
        CONTAINERS_CONF="$ENGINE_PODMAN_CONF" setsid nohup \
            podman system service --time=0 "$ENGINE_PODMAN_HOST" \
            </dev/null >>"$ENGINE_PODMAN_LOG" 2>&1 &
        echo $! >"$ENGINE_PODMAN_PID"
        if ! _engine_wait_for "$ENGINE_WAIT_S" _engine_podman_ok; then
            _engine_log "podman: service did not answer within ${ENGINE_WAIT_S}s; last log lines:"
            tail -n 20 "$ENGINE_PODMAN_LOG" >&2 || true
            return 1
        fi
    fi
    return 0
}

engine_podman() {
    if [[ "${ENVLOCK_TEST_NO_PODMAN:-0}" == "1" ]]; then
        _engine_log "podman: disabled by ENVLOCK_TEST_NO_PODMAN=1"
        unset ENVLOCK_TEST_PODMAN_HOST
        return 0
    fi
    local t0=$SECONDS
    if _engine_podman_try; then
        export ENVLOCK_TEST_PODMAN_HOST="$ENGINE_PODMAN_HOST"
        _engine_log "podman: up in $((SECONDS - t0)) s"
    else
        _engine_log "podman: NOT available; Podman tests will be skipped (Docker is enough)"
        unset ENVLOCK_TEST_PODMAN_HOST
    fi
    return 0
}

# --- what earlier runs left ---------------------------------------------------
# Every test run builds images under new tags (restores, packs, scenarios, torch layers keyed by
# envlock's own version) and BuildKit keeps their layers. On a machine whose disk outlives a
# run, they pile up run after run until the disk is full (seen: 38 GB of images and build cache
# in the private dockerd and 24 GB in Podman after a day of runs). engine_prune removes them:
#   private dockerd (only when DOCKER_HOST is ours: its data root holds the suite's images
#     alone): stopped containers, unused volumes, the build cache, and every image but
#     envlock-test/* (the setup's images and the fixtures' content-keyed sources);
#   Podman (its storage is the machine's own): only images named envlock/* or envlock-test/*
#     and dangling ones; containers are left alone.
# envlock-test/* images tagged other than 1 are fixtures' caches, removed once older than
# ENVLOCK_TEST_IMAGE_MAX_AGE_H hours (default 168) so that stale keys do not pile up either.
ENGINE_IMAGE_MAX_AGE_H="${ENVLOCK_TEST_IMAGE_MAX_AGE_H:-168}"

_engine_stale_images() {  # _engine_stale_images CLI NAMESPACE_RE: the references to remove
    local cli="$1" ours="$2" now full ref id created age_h
    now="$(date +%s)"
    "$cli" images --format '{{.ID}} {{.Repository}}:{{.Tag}}' 2>/dev/null | while read -r id full; do
        if [[ "$full" == "<none>:<none>" ]]; then echo "$id"; continue; fi
        ref="${full#localhost/}"  # Podman's spellings of a local name
        ref="${ref#docker.io/}"
        if [[ "$ref" == envlock-test/* ]]; then
            [[ "$ref" == *:1 ]] && continue
            created="$("$cli" image inspect -f '{{.Created}}' "$id" 2>/dev/null)" || continue
            age_h=$(( (now - $(date -d "$created" +%s 2>/dev/null || echo "$now")) / 3600 ))
            if (( age_h >= ENGINE_IMAGE_MAX_AGE_H )); then echo "$full"; fi
        elif [[ "$ref" =~ $ours ]]; then
            echo "$full"
        fi
    done
}

_engine_rmi() {  # _engine_rmi CLI REF...: untag or remove each, unforced (an image in use stays)
    local cli="$1"
    shift
    (( $# )) || return 0
    printf '%s\n' "$@" | xargs -r -n 50 "$cli" rmi >/dev/null 2>&1 || true
}

engine_prune() {
    local refs=()
    if [[ "${DOCKER_HOST:-}" == "$ENGINE_DOCKER_HOST" ]]; then
        docker container prune -f >/dev/null 2>&1 || true
        mapfile -t refs < <(_engine_stale_images docker '.')
        _engine_rmi docker "${refs[@]}"
        docker image prune -f >/dev/null 2>&1 || true
        docker builder prune -af >/dev/null 2>&1 || true
        docker volume prune -f >/dev/null 2>&1 || true
        _engine_log "docker: removed ${#refs[@]} images of earlier runs and the build cache"
    else
        _engine_log "docker: DOCKER_HOST is not the suite's own dockerd; nothing removed from it"
    fi
    if [[ -n "${ENVLOCK_TEST_PODMAN_HOST:-}" ]]; then
        mapfile -t refs < <(_engine_stale_images podman '^envlock/')
        _engine_rmi podman "${refs[@]}"
        podman image prune -f >/dev/null 2>&1 || true
        _engine_log "podman: removed ${#refs[@]} envlock images of earlier runs"
    fi
}

engine_setup() {
    engine_docker || return 1
    engine_buildkit_client || true  # its absence fails the tests that need it, by name
    engine_podman
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    engine_setup
    echo "export DOCKER_HOST=$DOCKER_HOST"
    if [[ -n "${ENVLOCK_TEST_PODMAN_HOST:-}" ]]; then
        echo "export ENVLOCK_TEST_PODMAN_HOST=$ENVLOCK_TEST_PODMAN_HOST"
        echo "export CONTAINERS_CONF=$CONTAINERS_CONF"
    fi
fi
