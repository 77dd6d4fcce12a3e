#!/usr/bin/env bash
# A rootless Podman service for the envlock test suite: an unprivileged user's
# `podman system service` on a socket in that user's own XDG_RUNTIME_DIR, as a
# cluster user without root would run it. Idempotent; needs root to set up.
#
#   bash scripts/podman-rootless.sh start [USER]   # prints: export ENVLOCK_TEST_PODMAN_ROOTLESS_HOST=unix://...
#   bash scripts/podman-rootless.sh stop [USER]    # stops the service
#   bash scripts/podman-rootless.sh remove [USER]  # stops it, removes the user, its storage and ranges
#
# USER defaults to $ENVLOCK_TEST_ROOTLESS_USER, else envlock-rootless. `start` also
# copies $ENVLOCK_TEST_BASE_IMAGE from Docker ($DOCKER_HOST) into the user's storage
# when the user does not have it.
#
# What rootless Podman needs on this kind of machine (each found by trying):
# - subordinate uid/gid ranges for the user (/etc/subuid, /etc/subgid; useradd
#   allocates them where login.defs says so, otherwise a free range is appended);
# - runc: crun fails here as it does for rootful Podman (scripts/engine.sh);
# - explicit default ulimits: Podman otherwise copies the host's hard limits,
#   which an unprivileged runtime may not set;
# - the vfs storage driver when /dev/fuse is not usable by the user (it is 0600
#   root here), since fuse-overlayfs needs it;
# - network "none" for containers: the default rootless network needs slirp4netns,
#   which is not installed. envlock builds and verifies with network "none"; a
#   Docker API client that asks for `NetworkDisabled` instead gets slirp4netns and
#   fails ("slirp4netns": executable file not found in $PATH).
set -euo pipefail

ACTION="${1:-start}"
NAME="${2:-${ENVLOCK_TEST_ROOTLESS_USER:-envlock-rootless}}"
WAIT_S="${ENVLOCK_ENGINE_WAIT_S:-60}"

log() { echo "[podman-rootless.sh] $*" >&2; }
[[ "$(id -u)" -eq 0 ]] || { log "needs root (it creates a user and its id ranges)"; exit 1; }
[[ "$NAME" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || { log "not a plain user name: $NAME"; exit 2; }

as_user() {  # as_user CMD...: a clean login-less environment of the user, as its own service sees it
    local uid home
    uid="$(id -u "$NAME")"
    home="$(getent passwd "$NAME" | cut -d: -f6)"
    runuser -u "$NAME" -- env -i HOME="$home" USER="$NAME" LOGNAME="$NAME" \
        XDG_RUNTIME_DIR="/run/user/$uid" PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin "$@"
}

free_range() {  # the first 65536-id range above every range in $1 (and above 100000)
    awk -F: 'BEGIN { top = 100000 } NF >= 3 && $2 + $3 > top { top = $2 + $3 } END { print top }' "$1"
}

sock_of() { echo "/run/user/$(id -u "$NAME")/podman/podman.sock"; }

answers() { curl -fsS --max-time 5 --unix-socket "$(sock_of)" http://d/_ping >/dev/null 2>&1; }

kill_owned() {  # kill_owned PIDFILE [GROUP]: the pid in PIDFILE (its process group with GROUP), if the user's
    local pid
    [[ -f "$1" ]] || return 0
    pid="$(cat "$1")"
    if [[ "$pid" =~ ^[0-9]+$ && "$(stat -c %U "/proc/$pid" 2>/dev/null)" == "$NAME" ]]; then
        if [[ "${2:-}" == group ]]; then kill -- "-$pid" 2>/dev/null || true; else kill "$pid" 2>/dev/null || true; fi
    fi
    rm -f "$1"
}

stop_service() {
    # The pid file names the service, which setsid made a process group leader: rootless
    # podman re-executes itself in a user namespace as a child, so the whole group is stopped.
    id "$NAME" >/dev/null 2>&1 || return 0
    kill_owned "/run/user/$(id -u "$NAME")/envlock-podman-service.pid" group
}

start() {
    command -v podman >/dev/null && command -v runc >/dev/null || { log "podman and runc are needed (scripts/engine.sh installs them)"; exit 1; }
    id "$NAME" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$NAME"
    local uid home run conf driver
    uid="$(id -u "$NAME")"
    home="$(getent passwd "$NAME" | cut -d: -f6)"
    for f in /etc/subuid /etc/subgid; do
        touch "$f"
        grep -q "^$NAME:" "$f" || echo "$NAME:$(free_range "$f"):65536" >> "$f"
    done
    run="/run/user/$uid"
    mkdir -p "$run/podman"
    chown -R "$NAME:" "$run"
    chmod 700 "$run"
    conf="$home/.config/containers"
    mkdir -p "$conf"
    driver=vfs
    if [[ -r /dev/fuse && -w /dev/fuse ]] && command -v fuse-overlayfs >/dev/null \
            && as_user test -r /dev/fuse -a -w /dev/fuse; then
        driver=overlay
    fi
    printf '# Written by scripts/podman-rootless.sh.\n[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n\n[engine]\nruntime = "runc"\n' > "$conf/containers.conf"
    printf '# Written by scripts/podman-rootless.sh.\n[storage]\ndriver = "%s"\n' "$driver" > "$conf/storage.conf"
    if [[ "$driver" == overlay ]]; then
        printf '\n[storage.options.overlay]\nmount_program = "%s"\n' "$(command -v fuse-overlayfs)" >> "$conf/storage.conf"
    fi
    chown -R "$NAME:" "$home/.config"
    if ! answers; then
        stop_service
        rm -f "$(sock_of)"
        # The shell writes its own pid and becomes the service (exec): the pid file names
        # podman itself, whatever runuser and setsid do about forking.
        as_user sh -c 'echo $$ > "$1"; exec setsid podman system service --time=0 "$2"' sh \
            "$run/envlock-podman-service.pid" "unix://$(sock_of)" \
            > "$run/envlock-podman-service.log" 2>&1 < /dev/null &
        local deadline=$((SECONDS + WAIT_S))
        until answers; do
            if (( SECONDS >= deadline )); then
                log "the service did not answer within ${WAIT_S}s:"
                tail -n 20 "$run/envlock-podman-service.log" >&2 || true
                exit 1
            fi
            sleep 0.5
        done
    fi
    local base="${ENVLOCK_TEST_BASE_IMAGE:-}"
    if [[ -n "$base" ]] && ! as_user podman image exists "$base" && ! as_user podman image exists "localhost/$base"; then
        local tar="$run/envlock-base.tar"
        docker save "$base" -o "$tar"
        chown "$NAME:" "$tar"
        as_user podman load -q -i "$tar" >&2
        rm -f "$tar"
    fi
    log "rootless podman of $NAME (uid $uid, storage $driver) at unix://$(sock_of)"
    echo "export ENVLOCK_TEST_PODMAN_ROOTLESS_HOST=unix://$(sock_of)"
}

remove() {
    id "$NAME" >/dev/null 2>&1 || return 0
    stop_service
    as_user podman system reset --force >/dev/null 2>&1 || true
    kill_owned "/run/user/$(id -u "$NAME")/libpod/tmp/pause.pid"  # holds the user namespace open
    rm -rf "/run/user/$(id -u "$NAME")"
    userdel --remove "$NAME" 2>/dev/null || true
    for f in /etc/subuid /etc/subgid; do
        [[ -f "$f" ]] && sed -i "/^$NAME:/d" "$f"
    done
}

case "$ACTION" in
    start) start ;;
    stop) stop_service ;;
    remove) remove ;;
    *) log "usage: $0 start|stop|remove [USER]"; exit 2 ;;
esac
