#!/usr/bin/env bash
# A real SLURM on this machine, one node or several, to try the cluster path (hydra/launcher=slurm) locally.
#
#   scripts/local-slurm.sh up     install slurm-wlm + munge when missing (Debian, as root), start munged,
#                                 slurmctld and slurmd on loopback; partition `debug` = this machine's
#                                 cores and memory (as `slurmd -C` reports them)
#   scripts/local-slurm.sh up --nodes N
#                                 N nodes node-1 .. node-N, one slurmd each (Port 6818 .. 6817+N), each in a
#                                 UTS namespace of its own: its jobs see node-k as their host name (and every
#                                 node-k resolves, to 127.0.0.1). Each node has all the machine's CPUs and
#                                 1/N of its memory. --nodes 1 is plain `up`.
#   scripts/local-slurm.sh kill NODE
#                                 NODE (of up --nodes N) dies as if its power went: its slurmd and every process in
#                                 its namespace (the jobs it runs) SIGKILLed. slurmctld finds out as on a real cluster:
#                                 the node stops answering pings and is down after SlurmdTimeout (30 s here)
#   scripts/local-slurm.sh down   stop what `up` started; nothing is left running
#   scripts/local-slurm.sh status what runs, and the partition
#
# Config, state and logs live in $LOCAL_SLURM_DIR (default /tmp/local-slurm); `up` starts afresh there and keeps the
# last cluster's folder, logs and all, as $LOCAL_SLURM_DIR.previous. SLURM's commands find the
# config through /etc/slurm/slurm.conf, which `up` links there unless a slurm.conf of your own exists
# (then export SLURM_CONF=$LOCAL_SLURM_DIR/slurm.conf yourself). Accounting is off: `sacct` has nothing.
set -euo pipefail

DIR=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
CONF=$DIR/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
PARTITION=debug
NODES=1  # up --nodes N

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

read_nodes() {  # up's options: [--nodes N]
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) [ $# -ge 2 ] || die "--nodes wants a number"; NODES=$2; shift 2 ;;
            --nodes=*) NODES=${1#--nodes=}; shift ;;
            *) die "usage: $0 up [--nodes N]" ;;
        esac
    done
    [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "--nodes wants a whole number from 1, not '$NODES'"
}

node_names() { seq -f 'node-%g' "$1"; }  # of a cluster of $1 > 1 nodes

node_lines() {  # slurm.conf's NodeName= lines
    local machine memory name port=6817
    machine=$(slurmd -C | head -1)  # NodeName=... CPUs=... RealMemory=...: this machine as slurmd sees it
    if [ "$NODES" = 1 ]; then echo "$machine NodeAddr=127.0.0.1 State=UNKNOWN"; return; fi
    # Every node gets all the machine's CPUs (its topology as slurmd -C reports it), so N nodes oversubscribe the
    # cores: fine for a test cluster, and an --exclusive job on each node runs at once. Memory is split N ways.
    memory=$(($(sed -E 's/.*RealMemory=([0-9]+).*/\1/' <<<"$machine") / NODES))
    machine=$(sed -E "s/^NodeName=[^ ]+ //; s/RealMemory=[0-9]+/RealMemory=$memory/" <<<"$machine")
    for name in $(node_names "$NODES"); do
        port=$((port + 1))
        echo "NodeName=$name NodeAddr=127.0.0.1 Port=$port $machine State=UNKNOWN"
    done
}

write_conf() {
    local host nodes spool=$DIR/spool slurmd_files=$DIR/slurmd
    host=$(hostname -s)
    nodes=$host
    if [ "$NODES" -gt 1 ]; then  # one slurmd per node: %n is the node's name
        nodes="node-[1-$NODES]" spool=$DIR/spool/%n slurmd_files=$DIR/slurmd-%n
    fi
    mkdir -p "$DIR/state" "$DIR/spool"
    cat >"$CONF" <<EOF
# written by scripts/local-slurm.sh
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$slurmd_files.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$slurmd_files.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=1
SlurmdTimeout=30
KillWait=10
$(node_lines)
PartitionName=$PARTITION Nodes=$nodes Default=YES MaxTime=INFINITE State=UP
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

running_nodes() { cat "$DIR/nodes" 2>/dev/null || echo 1; }  # how many nodes the last `up` started

cluster_alive() {  # slurmctld and every slurmd of the last `up`
    local name n
    alive "$DIR/slurmctld.pid" || return 1
    n=$(running_nodes)
    [ "$n" = 1 ] && { alive "$DIR/slurmd.pid"; return; }
    for name in $(node_names "$n"); do alive "$DIR/slurmd-$name.pid" || return 1; done
}

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

wait_idle() {  # until all nodes have registered with slurmctld
    local states=""
    for _ in $(seq 60); do
        states=$(sinfo -h -N -p "$PARTITION" -o %t 2>/dev/null || true)
        [ "$(grep -cxE 'idle|mix|alloc' <<<"$states")" -ge "$NODES" ] && return
        sleep 0.5
    done
    die "not all $NODES node(s) came up (states: ${states//$'\n'/ }; see $DIR/slurmctld.log and $DIR/slurmd*.log)"
}

start_slurmd() {
    local name
    if [ "$NODES" = 1 ]; then SLURM_CONF=$CONF slurmd; return; fi
    unshare --uts --mount true 2>/dev/null || die "unshare --uts --mount fails here: nodes need their own host names"
    { cat /etc/hosts; echo "127.0.0.1 $(node_names "$NODES" | tr '\n' ' ')"; } >"$DIR/hosts"
    for name in $(node_names "$NODES"); do
        mkdir -p "$DIR/spool/$name"
        # The jobs a slurmd starts share its namespaces: in the UTS one they see the node's name as host name, in
        # the mount one (private, this slurmd's alone) an /etc/hosts where every node's name resolves.
        # shellcheck disable=SC2016  # $1 and $2 are sh -c's arguments
        SLURM_CONF=$CONF unshare --uts --mount sh -c \
            'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -N "$1"' sh "$name" "$DIR/hosts"
    done
}

up() {
    local shape='%c CPUs, %m MB'
    install_missing
    if cluster_alive; then
        [ "$(running_nodes)" = "$NODES" ] || die "already running with $(running_nodes) node(s): $0 down first"
        say "already running ($DIR)"; return
    fi
    [ "$(id -u)" = 0 ] || die "run as root: slurmd must start jobs as their users"
    stop_daemons  # those of a cluster half up, before their pid files go
    # a fresh cluster, no jobs or node states left from an earlier run; that run's logs kept in $DIR.previous
    if [ -d "$DIR" ]; then rm -rf "$DIR.previous" && mv "$DIR" "$DIR.previous"; fi
    mkdir -p "$DIR"
    echo "$NODES" >"$DIR/nodes"
    write_conf
    link_conf
    start_munge
    SLURM_CONF=$CONF slurmctld -i
    start_slurmd
    SLURM_CONF=$CONF wait_idle
    [ "$NODES" = 1 ] || shape="%D nodes %N, each $shape"
    say "up: partition $PARTITION = $(SLURM_CONF=$CONF sinfo -h -p $PARTITION -o "$shape") on $(hostname -s); logs in $DIR"
}

stop_pid() {  # stop the daemon whose pid file this is, and wait for it
    local file=$1 pid
    alive "$file" || return 0
    pid=$(cat "$file")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

stop_daemons() {
    local file
    for file in "$DIR"/slurmd*.pid; do stop_pid "$file"; done  # slurmd.pid, or slurmd-node-k.pid per node
    stop_pid "$DIR/slurmctld.pid"
    stop_pid "$DIR/munged.pid"
}

down() {
    if [ -f "$CONF" ] && alive "$DIR/slurmctld.pid"; then
        SLURM_CONF=$CONF scancel --full --quiet --partition="$PARTITION" 2>/dev/null || true
    fi
    stop_daemons
    if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then rm -f "$ETC_CONF"; fi
    say "down (logs kept in $DIR; the next up moves them to $DIR.previous)"
}

kill_node() {  # NODE: its slurmd and everything in its UTS namespace, SIGKILLed
    local name=${1:-} pid ns proc killed=0
    [ -n "$name" ] || die "usage: $0 kill NODE"
    alive "$DIR/slurmd-$name.pid" || die "no slurmd of node '$name' runs (up --nodes N starts node-1 .. node-N)"
    pid=$(cat "$DIR/slurmd-$name.pid")
    ns=$(readlink "/proc/$pid/ns/uts")
    [ "$ns" != "$(readlink /proc/$$/ns/uts)" ] || die "$name shares this machine's namespace: only up --nodes N's nodes die alone"
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/ns/uts" 2>/dev/null)" = "$ns" ] || continue
        kill -9 "${proc#/proc/}" 2>/dev/null && killed=$((killed + 1))
    done
    say "killed $name: $killed processes (its slurmd and its jobs)"
}

status() {
    cluster_alive || { say "not running"; exit 1; }
    SLURM_CONF=$CONF sinfo -p "$PARTITION"
}

case "${1:-}" in
    up) shift; read_nodes "$@"; up ;;
    down) down ;;
    kill) kill_node "${2:-}" ;;
    status) status ;;
    *) die "usage: $0 up [--nodes N]|kill NODE|down|status" ;;
esac
