# shellcheck shell=bash
# A real Slurm cluster of four nodes (n1..n4) on this machine, for the fleet preflight's and the
# Slurm export's integration tests. Sourced by scripts/test.sh:
#
#   slurm_setup DIR   install munge + Slurm once (apt, cached by dpkg), then start munged,
#                     slurmctld and one slurmd per node into DIR (config, state, logs, pid files),
#                     on free ports, and export ENVLOCK_TEST_SLURM_CONF
#   slurm_stop DIR    stop every daemon slurm_setup started, by its pid file
#
# Debian's slurmd runs several instances on one host, one per `-N NODENAME`. Every node has the
# same hostname, so jobs tell nodes apart by SLURMD_NODENAME. The TaskProlog gives a node its own
# environment when a test asks for one: it prints the file ENVLOCK_TEST_NODE_ENV_DIR/NODENAME
# (lines `export NAME=value`), which Slurm applies to the task, as a real cluster's node
# configuration (a module default, a stale venv on one node's filesystem) would.

_slurm_log() { echo "[slurm.sh] $*"; }

_slurm_free_ports() {  # _slurm_free_ports N: N distinct TCP ports free on 127.0.0.1 right now
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

slurm_stop() {  # slurm_stop DIR
    local dir="$1" f pid i
    [[ -n "$dir" && -d "$dir" ]] || return 0
    for f in "$dir"/slurm/run/slurmd-*.pid "$dir"/slurm/run/slurmctld.pid "$dir"/munge/run/munged.pid; do
        [[ -f "$f" ]] || continue
        pid="$(cat "$f" 2>/dev/null)"
        [[ "$pid" =~ ^[0-9]+$ ]] || continue
        kill "$pid" 2>/dev/null || true
        for i in $(seq 50); do [[ -d "/proc/$pid" ]] || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$f"
    done
}

slurm_setup() {  # slurm_setup DIR
    local dir="$1" host ctld_port d_port n1 n2 n3 n4 i
    if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
            || ! command -v srun >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
        _engine_apt_install slurmctld slurmd slurm-client munge
    fi
    if [[ ! -f /etc/munge/munge.key ]]; then
        _slurm_log "no /etc/munge/munge.key; creating one"
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge: /etc/munge/munge.key
    fi
    slurm_stop "$dir"
    rm -rf "$dir"
    local M="$dir/munge" S="$dir/slurm"
    mkdir -p "$M"/{etc,lib,log,run} "$S"/{etc,state,spool,log,run}
    cp /etc/munge/munge.key "$M/etc/"
    chown -R munge: "$M"
    chmod 700 "$M/etc" "$M/lib" "$M/log"
    chmod 600 "$M/etc/munge.key"
    runuser -u munge -- munged --key-file="$M/etc/munge.key" --socket="$M/run/munge.socket.2" \
        --pid-file="$M/run/munged.pid" --log-file="$M/log/munged.log" --seed-file="$M/lib/munged.seed"
    host="$(hostname)"
    read -r ctld_port d_port n1 n2 n3 n4 <<<"$(_slurm_free_ports 6)"
    cat >"$S/etc/task-prolog.sh" <<'EOF'
#!/bin/sh
# The test cluster's per-node environment: ENVLOCK_TEST_NODE_ENV_DIR/NODENAME, when a test gives one.
if [ -n "${ENVLOCK_TEST_NODE_ENV_DIR:-}" ] && [ -f "$ENVLOCK_TEST_NODE_ENV_DIR/$SLURMD_NODENAME" ]; then
    cat "$ENVLOCK_TEST_NODE_ENV_DIR/$SLURMD_NODENAME"
fi
exit 0
EOF
    chmod 755 "$S/etc/task-prolog.sh"
    cat >"$S/etc/slurm.conf" <<EOF
ClusterName=envlock-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$M/run/munge.socket.2
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
TaskProlog=$S/etc/task-prolog.sh
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$n1 CPUs=1 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$n2 CPUs=1 RealMemory=1000 State=UNKNOWN
NodeName=n3 NodeHostname=$host NodeAddr=127.0.0.1 Port=$n3 CPUs=1 RealMemory=1000 State=UNKNOWN
NodeName=n4 NodeHostname=$host NodeAddr=127.0.0.1 Port=$n4 CPUs=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$S/etc/slurm.conf"
    slurmctld -f "$SLURM_CONF"
    for i in n1 n2 n3 n4; do slurmd -f "$SLURM_CONF" -N "$i"; done
    # Nodes come up idle within a second or two; a bounded wait for all four.
    for i in $(seq 100); do
        if [[ "$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)" == 4 ]]; then break; fi
        sleep 0.2
    done
    if [[ "$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)" != 4 ]]; then
        _slurm_log "the four nodes did not come up idle; sinfo:"
        sinfo -N 2>&1 | sed 's/^/[slurm.sh]   /'
        tail -n 20 "$S/log/slurmctld.log" | sed 's/^/[slurm.sh]   /'
        return 1
    fi
    export ENVLOCK_TEST_SLURM_CONF="$SLURM_CONF"
}
