#!/usr/bin/env bash
# A real one-node SLURM on this machine, to try the cluster path (hydra/launcher=slurm) locally.
#
#   scripts/local-slurm.sh up     install slurm-wlm + munge when missing (Debian, as root), start munged,
#                                 slurmctld and slurmd on loopback; partition `debug` = this machine's
#                                 cores and memory (as `slurmd -C` reports them)
#   scripts/local-slurm.sh down   stop what `up` started; nothing is left running
#   scripts/local-slurm.sh status what runs, and the partition
#
# Config, state and logs live in $LOCAL_SLURM_DIR (default /tmp/local-slurm). SLURM's commands find the
# config through /etc/slurm/slurm.conf, which `up` links there unless a slurm.conf of your own exists
# (then export SLURM_CONF=$LOCAL_SLURM_DIR/slurm.conf yourself). Accounting is off: `sacct` has nothing.
set -euo pipefail

DIR=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
CONF=$DIR/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
PARTITION=debug

die() { echo "local-slurm: $*" >&2; exit 1; }
say() { echo "local-slurm: $*"; }

install_missing() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
    [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are missing and only root can install them (apt-get install slurm-wlm munge)"
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and this is not a Debian/Ubuntu machine (no apt-get)"
    say "installing slurm-wlm and munge (apt-get)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
    local node host
    node=$(slurmd -C | head -1)  # NodeName=... CPUs=... RealMemory=...: this machine as slurmd sees it
    host=$(hostname -s)
    mkdir -p "$DIR/state" "$DIR/spool"
    cat >"$CONF" <<EOF
# written by scripts/local-slurm.sh
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=10
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=${host} Default=YES MaxTime=INFINITE State=UP
EOF
}

link_conf() {
    if [ -L "$ETC_CONF" ] || [ ! -e "$ETC_CONF" ]; then
        mkdir -p "$(dirname "$ETC_CONF")"
        ln -sfn "$CONF" "$ETC_CONF"
    elif ! cmp -s "$ETC_CONF" "$CONF"; then
        say "keeping your $ETC_CONF: export SLURM_CONF=$CONF to use this cluster"
    fi
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
    if munge -n </dev/null >/dev/null 2>&1; then return; fi  # a munged of the machine's already answers
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    [ -s /etc/munge/munge.key ] || /usr/sbin/mungekey --create --force >/dev/null 2>&1 \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown -R munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge 2>/dev/null || true
    chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
    /usr/sbin/munged --force --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log"
    for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && return; sleep 0.1; done
    die "munged did not start (see $DIR/munged.log)"
}

wait_idle() {
    local state=""
    for _ in $(seq 60); do
        state=$(sinfo -h -p "$PARTITION" -o %t 2>/dev/null | head -1 || true)
        case "$state" in idle|mix|alloc) return ;; esac
        sleep 0.5
    done
    die "the node did not come up (state '${state:-none}'; see $DIR/slurmctld.log and $DIR/slurmd.log)"
}

up() {
    install_missing
    if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
        say "already running ($DIR)"; return
    fi
    [ "$(id -u)" = 0 ] || die "run as root: slurmd must start jobs as their users"
    rm -rf "$DIR"  # a fresh cluster: no jobs or node states left from an earlier run
    mkdir -p "$DIR"
    write_conf
    link_conf
    start_munge
    SLURM_CONF=$CONF slurmctld -i
    SLURM_CONF=$CONF slurmd
    SLURM_CONF=$CONF wait_idle
    say "up: partition $PARTITION = $(SLURM_CONF=$CONF sinfo -h -p $PARTITION -o '%c CPUs, %m MB') on $(hostname -s); logs in $DIR"
}

stop_pid() {  # stop the daemon whose pid file this is, and wait for it
    local file=$1 pid
    alive "$file" || return 0
    pid=$(cat "$file")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

down() {
    if [ -f "$CONF" ] && alive "$DIR/slurmctld.pid"; then
        SLURM_CONF=$CONF scancel --full --quiet --partition="$PARTITION" 2>/dev/null || true
    fi
    stop_pid "$DIR/slurmd.pid"
    stop_pid "$DIR/slurmctld.pid"
    stop_pid "$DIR/munged.pid"
    if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then rm -f "$ETC_CONF"; fi
    say "down (logs kept in $DIR)"
}

status() {
    alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" || { say "not running"; exit 1; }
    SLURM_CONF=$CONF sinfo -p "$PARTITION"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) die "usage: $0 up|down|status" ;;
esac
