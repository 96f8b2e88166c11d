#!/usr/bin/env bash
# Start and stop a real Slurm cluster (with slurmdbd accounting) on this one machine, for tests.
#
#   tools/local_slurm.sh install        apt-get install the daemons if missing (needs root)
#   tools/local_slurm.sh up DIR         start munged, mariadb, slurmdbd, slurmctld and one slurmd
#                                       per node, nodes n1..nN (N=$LOCAL_SLURM_NODES, default 3);
#                                       all state lives under DIR; prints only
#                                       `export SLURM_CONF=DIR/etc/slurm.conf` on stdout
#   tools/local_slurm.sh down DIR       cancel all jobs and stop every daemon of DIR
#   tools/local_slurm.sh status DIR     say which daemons (one slurmd per node) of DIR are alive
#   tools/local_slurm.sh lose-node DIR NODE     as if NODE crashed: SIGKILL its slurmd and every
#                                       job process on it, and tell slurmctld it is DOWN
#   tools/local_slurm.sh restore-node DIR NODE  start NODE's slurmd again and resume the node
#
#   LOCAL_SLURM_NODES=1 tools/local_slurm.sh up DIR    a single-node cluster
#
# Every node is this machine: each slurmd listens on its own port of 127.0.0.1 (NodeAddr)
# and declares 4 CPUs and 1/N of the machine's memory. Node names do not resolve (nothing
# is added to /etc/hosts), as on clusters whose node names are not host names; find a
# node's address with `scontrol show node NAME` (NodeAddr).
#
# Every client (sbatch, squeue, sacct, submitit) needs SLURM_CONF in its environment:
#   eval "$(tools/local_slurm.sh up /tmp/slurm)"
#
# Must run as root (SlurmUser=root, mariadb runs as root). Daemons are only ever
# signalled through the pid files under DIR, so other clusters on the host are safe.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
CLUSTER_NAME=local
DB_NAME=slurm_acct_db
UP_TIMEOUT=120    # seconds to wait for each daemon to answer
DRAIN_TIMEOUT=60  # seconds `down` waits for the queue to empty
NODE_CPUS=4       # CPUs each node declares (more than this machine's cores)

# Slurm and mariadb live in sbin; make sure we find them even from a user PATH.
export PATH="${PATH}:/usr/sbin:/sbin"

# Keep stdout clean for the one `export` line: everything else goes to stderr.
exec 3>&1 1>&2

log() { printf '[local_slurm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# ---------------------------------------------------------------- helpers

# Set all per-DIR paths (fails if DIR does not exist); DIR is made absolute so the
# printed SLURM_CONF works from any working directory.
set_paths() {
    local dir="$1"
    [[ "${dir}" =~ [[:space:]] ]] && die "DIR must not contain whitespace: '${dir}'"
    [[ -d "${dir}" ]] || return 1
    D="$(cd "${dir}" && pwd -P)"
    # Unix socket paths are limited to 108 bytes; slurmstepd sockets live in the spool dir.
    (( ${#D} <= 70 )) || die "DIR path too long for unix sockets (${#D} > 70 chars): ${D}"
    ETC="${D}/etc"
    STATE="${D}/state"
    SPOOL="${D}/spool"
    LOG="${D}/log"
    RUN="${D}/run"
    MUNGE="${D}/munge"
    MYSQL="${D}/mysql"
    SLURM_CONF_FILE="${ETC}/slurm.conf"
    DBD_CONF="${ETC}/slurmdbd.conf"
    MY_CNF="${ETC}/my.cnf"
    MUNGE_SOCKET="${MUNGE}/munge.socket.2"
    MUNGE_KEY="${MUNGE}/munge.key"
    MYSQL_SOCKET="${MYSQL}/mysqld.sock"
    export SLURM_CONF="${SLURM_CONF_FILE}"
}

# Daemons: a process name, as seen in /proc/PID/comm, or slurmd:NODE for the slurmd
# of one node; and their pid files.
pidfile_of() {
    case "$1" in
        munged) echo "${RUN}/munged.pid" ;;
        mariadbd) echo "${RUN}/mariadbd.pid" ;;
        slurmdbd) echo "${RUN}/slurmdbd.pid" ;;
        slurmctld) echo "${RUN}/slurmctld.pid" ;;
        slurmd:?*) echo "${RUN}/slurmd-${1#slurmd:}.pid" ;;
        *) die "unknown daemon $1" ;;
    esac
}

comm_of() { echo "${1%%:*}"; }

# Nodes named in DIR's slurm.conf (none before the first `up`).
conf_nodes() {
    [[ -r "${SLURM_CONF_FILE}" ]] || return 0
    sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' "${SLURM_CONF_FILE}"
}

# The slurmd daemons of DIR: one per node of its slurm.conf, plus any with a pid file
# (a node dropped from the config while its slurmd still ran is stopped all the same).
slurmd_daemons() {
    local file
    {
        conf_nodes
        for file in "${RUN}"/slurmd-*.pid; do
            [[ -e "${file}" ]] || continue
            file="${file##*/slurmd-}"
            echo "${file%.pid}"
        done
    } | awk '!seen[$0]++ { print "slurmd:" $0 }'
}

# Every daemon of DIR, slurmds last.
all_daemons() {
    printf '%s\n' munged mariadbd slurmdbd slurmctld
    slurmd_daemons
}

# Whether pid $1 is a running (not zombie) process named $2. Checking the name
# guards against a stale pid file whose pid was reused by something else.
is_running() {
    local pid="$1" name="$2" comm line state
    read -r comm 2>/dev/null <"/proc/${pid}/comm" || return 1
    [[ "${comm}" == "${name}" ]] || return 1
    read -r line 2>/dev/null <"/proc/${pid}/stat" || return 1
    # The field after the ")" that closes comm is the state; Z/X: exited, not reaped.
    read -r state _ <<<"${line##*) }"
    [[ "${state}" != [ZX] ]]
}

# Print the pid of daemon $1 if its pid file names a live process with that name.
live_pid() {
    local name="$1" file pid=""
    file="$(pidfile_of "${name}")"
    [[ -s "${file}" ]] || return 1
    read -r pid <"${file}" || true
    [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
    is_running "${pid}" "$(comm_of "${name}")" || return 1
    echo "${pid}"
}

alive() { live_pid "$1" >/dev/null; }

# Run a command until it succeeds or the timeout (seconds) passes.
wait_for() {
    local what="$1" timeout="$2"
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${timeout}s waiting for ${what}"
            return 1
        fi
        sleep 0.2
    done
}

# Fail with the end of a daemon's log (or several), which is where the reason is.
fail_with_log() {
    local what="$1" logfile
    shift
    for logfile in "$@"; do
        log "---- last lines of ${logfile}"
        tail -n 30 "${logfile}" >&2 2>/dev/null || true
    done
    die "${what} did not start"
}

# TCP ports in use on this host (any state), from /proc so no extra tools are needed.
used_ports() {
    local f _sl local_addr _rest
    for f in /proc/net/tcp /proc/net/tcp6; do
        [[ -r "${f}" ]] || continue
        while read -r _sl local_addr _rest; do
            [[ "${local_addr}" == *:* ]] || continue
            echo $((16#${local_addr##*:}))
        done <"${f}"
    done
}

# Pick N distinct free ports below the ephemeral range, so an outgoing connection
# cannot grab one of them between now and the daemon binding it.
free_ports() {
    local n="$1" low high used port picked=()
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range
    high=$((low > 20000 ? low - 1 : 32767))
    used=" $(used_ports | tr '\n' ' ') "
    while ((${#picked[@]} < n)); do
        port=$((15000 + (RANDOM * 32768 + RANDOM) % (high - 15000)))
        [[ "${used}" == *" ${port} "* ]] && continue
        [[ " ${picked[*]-} " == *" ${port} "* ]] && continue
        picked+=("${port}")
    done
    echo "${picked[@]}"
}

# Start a daemon detached from this script: stdin/stdout/stderr and fd 3 must not
# be inherited, or a caller reading our output (subprocess.run) would never see EOF.
spawn() {
    local logfile="$1"
    shift
    "$@" </dev/null >>"${logfile}" 2>&1 3>&-
}

# Send SIGTERM to daemons by their pid files, wait for all of them to exit, and
# SIGKILL any that are still there after the timeout.
stop_daemons() {
    local timeout="$1" name pid pids=() comms=()
    shift
    for name in "$@"; do
        if pid="$(live_pid "${name}")"; then
            log "stopping ${name} (pid ${pid})"
            kill -TERM "${pid}" 2>/dev/null || true
            pids+=("${pid}")
            comms+=("$(comm_of "${name}")")
        else
            log "${name}: not running"
        fi
    done
    local i deadline=$((SECONDS + timeout))
    for i in "${!pids[@]}"; do
        while is_running "${pids[i]}" "${comms[i]}"; do
            if ((SECONDS >= deadline)); then
                log "${comms[i]} (pid ${pids[i]}) ignored SIGTERM for ${timeout}s, sending SIGKILL"
                kill -KILL "${pids[i]}" 2>/dev/null || true
                sleep 0.5
                break
            fi
            sleep 0.1
        done
    done
    for name in "$@"; do rm -f "$(pidfile_of "${name}")"; done
}

# ---------------------------------------------------------------- install

cmd_install() {
    local missing=() pkg
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("${pkg}")
    done
    if ((${#missing[@]} == 0)); then
        log "all packages already installed"
        return 0
    fi
    ((EUID == 0)) || die "installing ${missing[*]} needs root"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The postinstall scripts try to start services; without an init system they
    # cannot, which is harmless: `up` starts private instances.
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# ---------------------------------------------------------------- config files

# Nodes n1..nN, one slurmd each, each on its own port (the rest of the arguments).
write_slurm_conf() {
    local host="$1" ctld_port="$2" dbd_port="$3" n_nodes="$4" mem node_mem
    shift 4
    local ports=("$@") i nodes
    # Real memory of this machine; slurmd -C prints e.g. "... RealMemory=24105".
    mem="$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)"
    [[ -n "${mem}" ]] || mem=8192
    # The nodes share the machine: together they declare no more memory than it has.
    node_mem=$((mem / n_nodes))
    ((node_mem >= 1)) || node_mem=1
    if ((n_nodes == 1)); then nodes=n1; else nodes="n[1-${n_nodes}]"; fi
    cat >"${SLURM_CONF_FILE}" <<EOF
ClusterName=${CLUSTER_NAME}
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=10: a requeued job may restart after ~12 s instead of ~2 min.
AuthInfo=socket=${MUNGE_SOCKET},cred_expire=10
StateSaveLocation=${STATE}
# One slurmd per node on this host (slurmd -N NODE): %n is the node name.
SlurmdSpoolDir=${SPOOL}/slurmd-%n
SlurmctldPidFile=$(pidfile_of slurmctld)
SlurmdPidFile=${RUN}/slurmd-%n.pid
SlurmctldLogFile=${LOG}/slurmctld.log
SlurmdLogFile=${LOG}/slurmd-%n.log
MpiDefault=none
# No cgroups needed: works in containers without a delegated cgroup tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
# CR_LLN: each job on the least loaded node, so array tasks spread over the nodes as on a
# busy cluster (by default Slurm fills one node first).
SelectTypeParameters=CR_Core_Memory,CR_LLN
# Without a per-CPU default every job takes all memory and array tasks run one by one.
DefMemPerCPU=512
ReturnToService=2
JobRequeue=1
# --signal needs nothing here; KillWait (default 30 s) is the grace after SIGTERM.
MailProg=/bin/true
# Keep finished jobs visible to squeue/scontrol for an hour, as tests poll them.
MinJobAge=3600
# Schedule every 2 s instead of the defaults (60 s main loop, 30 s backfill).
SchedulerParameters=sched_interval=2,bf_interval=2
# A dependency that can never be satisfied cancels the job instead of pending forever.
DependencyParameters=kill_invalid_depend
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=${dbd_port}
# Connections to slurmdbd take their munge socket from here, not from AuthInfo.
AccountingStoragePass=${MUNGE_SOCKET}
# Each node declares ${NODE_CPUS} CPUs, more than this machine's cores, so multi-task jobs and
# several array tasks run at once; config_overrides makes slurmd accept the declared
# hardware instead of draining a node whose CPUs differ from what it detects.
# Every node is this machine (NodeAddr=127.0.0.1, a port each); the node names are not
# host names and do not resolve.
SlurmdParameters=config_overrides
EOF
    for ((i = 1; i <= n_nodes; i++)); do
        echo "NodeName=n${i} NodeHostname=${host} NodeAddr=127.0.0.1 Port=${ports[i - 1]} CPUs=${NODE_CPUS} Boards=1 SocketsPerBoard=1 CoresPerSocket=${NODE_CPUS} ThreadsPerCore=1 RealMemory=${node_mem} State=UNKNOWN"
    done >>"${SLURM_CONF_FILE}"
    echo "PartitionName=debug Nodes=${nodes} Default=YES MaxTime=INFINITE State=UP" >>"${SLURM_CONF_FILE}"
}

write_slurmdbd_conf() {
    local dbd_port="$1" mysql_port="$2" password="$3"
    # slurmdbd refuses a config readable by others (it holds the DB password).
    (
        umask 077
        cat >"${DBD_CONF}" <<EOF
AuthType=auth/munge
AuthInfo=socket=${MUNGE_SOCKET}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=${dbd_port}
SlurmUser=root
LogFile=${LOG}/slurmdbd.log
PidFile=$(pidfile_of slurmdbd)
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=${mysql_port}
StorageUser=slurm
StoragePass=${password}
StorageLoc=${DB_NAME}
EOF
    )
    chmod 600 "${DBD_CONF}"
}

write_my_cnf() {
    local mysql_port="$1"
    # Small, unsafe-but-fast InnoDB settings: this database is throwaway test state.
    # slurmdbd logs "Database settings not recommended values" for them; harmless.
    cat >"${MY_CNF}" <<EOF
[mysqld]
user=root
datadir=${MYSQL}/data
tmpdir=${MYSQL}/tmp
socket=${MYSQL_SOCKET}
pid-file=$(pidfile_of mariadbd)
log-error=${LOG}/mariadb.log
port=${mysql_port}
bind-address=127.0.0.1
skip-name-resolve
skip-log-bin
innodb_buffer_pool_size=64M
innodb_log_file_size=16M
innodb_flush_log_at_trx_commit=0
innodb_doublewrite=0
innodb_use_native_aio=0
innodb_lock_wait_timeout=900
max_connections=50

[client]
socket=${MYSQL_SOCKET}
user=root
EOF
}

# ---------------------------------------------------------------- daemons

start_munged() {
    mkdir -p "${MUNGE}"
    # munged refuses a socket directory that others cannot traverse (700).
    chmod 711 "${MUNGE}"
    if [[ ! -s "${MUNGE_KEY}" ]]; then
        mungekey -c -k "${MUNGE_KEY}"
    fi
    chmod 600 "${MUNGE_KEY}"
    log "starting munged"
    # --force: munged insists that everyone can reach its socket, but DIR may sit
    # under a private (700) temp dir; every client here runs as root anyway.
    spawn "${LOG}/munged.out" munged --force \
        --socket="${MUNGE_SOCKET}" \
        --key-file="${MUNGE_KEY}" \
        --log-file="${LOG}/munged.log" \
        --pid-file="$(pidfile_of munged)" \
        --seed-file="${MUNGE}/munged.seed" ||
        fail_with_log munged "${LOG}/munged.log"
    wait_for "munged" 20 test -S "${MUNGE_SOCKET}" || fail_with_log munged "${LOG}/munged.log"
}

# shellcheck disable=SC2120  # called with arguments through wait_for
mysql_root() { mariadb --defaults-file="${MY_CNF}" "$@"; }

start_mariadb() {
    local password="$1"
    mkdir -p "${MYSQL}/data" "${MYSQL}/tmp"
    if [[ ! -d "${MYSQL}/data/mysql" ]]; then
        log "initialising mariadb data dir"
        mariadb-install-db --defaults-file="${MY_CNF}" --skip-test-db \
            --auth-root-authentication-method=socket >>"${LOG}/mariadb-install.log" 2>&1 3>&- ||
            fail_with_log "mariadb-install-db" "${LOG}/mariadb-install.log"
    fi
    log "starting mariadb"
    # mariadbd does not daemonize itself; setsid -f detaches it and it writes its pid file.
    spawn "${LOG}/mariadb.out" setsid -f mariadbd --defaults-file="${MY_CNF}"
    wait_for "mariadb" "${UP_TIMEOUT}" mysql_root -e 'SELECT 1' ||
        fail_with_log mariadb "${LOG}/mariadb.log"
    # Root logs in over the unix socket; slurmdbd gets a password user over TCP.
    # shellcheck disable=SC2119
    mysql_root <<EOF
CREATE OR REPLACE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '${password}';
CREATE OR REPLACE USER 'slurm'@'localhost' IDENTIFIED BY '${password}';
GRANT ALL ON \`${DB_NAME}\`.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON \`${DB_NAME}\`.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
}

start_slurmdbd() {
    log "starting slurmdbd"
    # slurmdbd finds slurmdbd.conf next to $SLURM_CONF.
    spawn "${LOG}/slurmdbd.out" slurmdbd || fail_with_log slurmdbd "${LOG}/slurmdbd.log"
    wait_for "slurmdbd" "${UP_TIMEOUT}" sacctmgr -n -P list cluster ||
        fail_with_log slurmdbd "${LOG}/slurmdbd.log"
}

register_cluster() {
    # No AccountingStorageEnforce, so no association is required to submit; the
    # cluster must exist for slurmctld to store its jobs.
    if [[ -z "$(sacctmgr -n -P list cluster format=cluster where cluster="${CLUSTER_NAME}")" ]]; then
        log "registering cluster ${CLUSTER_NAME}"
        sacctmgr -i add cluster "${CLUSTER_NAME}" >&2
    fi
}

start_slurmctld() {
    log "starting slurmctld"
    spawn "${LOG}/slurmctld.out" slurmctld -f "${SLURM_CONF_FILE}" ||
        fail_with_log slurmctld "${LOG}/slurmctld.log"
    wait_for "slurmctld" "${UP_TIMEOUT}" scontrol ping ||
        fail_with_log slurmctld "${LOG}/slurmctld.log"
}

start_slurmds() {
    local node
    for node in $(conf_nodes); do
        log "starting slurmd of node ${node}"
        mkdir -p "${SPOOL}/slurmd-${node}"
        spawn "${LOG}/slurmd-${node}.out" slurmd -f "${SLURM_CONF_FILE}" -N "${node}" ||
            fail_with_log "slurmd of node ${node}" "${LOG}/slurmd-${node}.log"
    done
}

# Every node of slurm.conf is up: idle on a fresh cluster; jobs recovered from an
# earlier run may keep some busy. A node that does not respond is listed as "idle*".
nodes_ready() {
    local want have
    want="$(conf_nodes | sort | tr '\n' ' ')"
    have="$(sinfo -h -N -o '%N %T' 2>/dev/null |
        awk '$2 ~ /^(idle|mixed|allocated|completing)$/ { print $1 }' | sort -u | tr '\n' ' ')"
    [[ -n "${want}" && "${have}" == "${want}" ]]
}

all_alive() {
    local d
    for d in $(all_daemons); do alive "${d}" || return 1; done
}

any_alive() {
    local d
    for d in $(all_daemons); do alive "${d}" && return 0; done
    return 1
}

# Node count asked for through LOCAL_SLURM_NODES (default 3).
wanted_nodes() {
    local n="${LOCAL_SLURM_NODES:-3}"
    if [[ ! "${n}" =~ ^[0-9]{1,4}$ ]] || ((10#${n} < 1)); then
        die "LOCAL_SLURM_NODES must be a whole number of at least 1, not '${n}'"
    fi
    echo $((10#${n}))
}

print_export() { printf 'export SLURM_CONF=%q\n' "${SLURM_CONF_FILE}" >&3; }

# ---------------------------------------------------------------- commands

cmd_up() {
    ((EUID == 0)) || die "up needs root (the cluster runs as SlurmUser=root)"
    local d
    for d in munged mungekey mariadbd mariadb-install-db slurmdbd slurmctld slurmd sacctmgr sinfo; do
        command -v "${d}" >/dev/null || die "${d} not found; run: $0 install"
    done
    local n_nodes
    n_nodes="$(wanted_nodes)"
    mkdir -p "$1"
    set_paths "$1"

    if all_alive && nodes_ready && [[ "$(conf_nodes | wc -l)" -eq "${n_nodes}" ]]; then
        log "already up in ${D}"
        print_export
        return 0
    fi
    # Half-running from an earlier attempt (or with another node count): stop the
    # rest and start cleanly.
    if any_alive; then
        log "some daemons of ${D} are running but the cluster is not healthy (or has another node count); restarting"
        stop_all
    fi

    mkdir -p "${ETC}" "${STATE}" "${SPOOL}" "${LOG}" "${RUN}" "${MUNGE}" "${MYSQL}"
    local host ctld_port dbd_port mysql_port slurmd_ports password node logs=()
    host="$(hostname -s)"
    # New ports on every start, so a stale cluster elsewhere never clashes with this one.
    read -r ctld_port dbd_port mysql_port slurmd_ports <<<"$(free_ports $((3 + n_nodes)))"
    password="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"

    write_my_cnf "${mysql_port}"
    write_slurmdbd_conf "${dbd_port}" "${mysql_port}" "${password}"
    # shellcheck disable=SC2086  # slurmd_ports is a list of numbers
    write_slurm_conf "${host}" "${ctld_port}" "${dbd_port}" "${n_nodes}" ${slurmd_ports}

    start_munged
    start_mariadb "${password}"
    start_slurmdbd
    register_cluster
    start_slurmctld
    start_slurmds

    if ! wait_for "all ${n_nodes} nodes to be idle" "${UP_TIMEOUT}" nodes_ready; then
        sinfo -N >&2 2>/dev/null || true
        for node in $(conf_nodes); do logs+=("${LOG}/slurmd-${node}.log"); done
        fail_with_log "some slurmd" "${logs[@]}"
    fi
    wait_for "sacct" "${UP_TIMEOUT}" sacct -n -X ||
        fail_with_log slurmdbd "${LOG}/slurmdbd.log"
    log "up in ${D}: ${n_nodes} node(s) $(conf_nodes | tr '\n' ' ')(slurmctld :${ctld_port}, slurmd :${slurmd_ports// /,}, slurmdbd :${dbd_port}, mariadb 127.0.0.1:${mysql_port})"
    print_export
}

# Pids of this DIR's slurmstepd processes: they inherit SLURM_CONF from slurmd, so
# steps of another cluster on the same host are left alone.
stepd_pids() {
    local dir comm
    for dir in /proc/[0-9]*; do
        read -r comm 2>/dev/null <"${dir}/comm" || continue
        [[ "${comm}" == slurmstepd ]] || continue
        tr '\0' '\n' 2>/dev/null <"${dir}/environ" | grep -qxF "SLURM_CONF=${SLURM_CONF_FILE}" &&
            echo "${dir#/proc/}"
    done
    return 0
}

# All descendants of the given pids, from a parent map built out of /proc/*/stat.
descendants() {
    local -A kids=()
    local stat line ppid pid queue=("$@")
    for stat in /proc/[0-9]*/stat; do
        read -r line 2>/dev/null <"${stat}" || continue
        pid="${stat#/proc/}"
        pid="${pid%/stat}"
        # Fields after the ")" that closes comm: state, ppid, ...
        read -r _ ppid _ <<<"${line##*) }"
        kids[${ppid}]+=" ${pid}"
    done
    while ((${#queue[@]})); do
        pid="${queue[0]}"
        queue=("${queue[@]:1}")
        for ppid in ${kids[${pid}]-}; do
            echo "${ppid}"
            queue+=("${ppid}")
        done
    done
}

# SIGKILL what the job steps run (not slurmstepd itself, which then reports the
# job finished). Needed because a cancel sends SIGTERM and waits KillWait (30 s)
# before SIGKILL, and jobs that ignore SIGTERM (submitit does) would hold us up.
kill_job_processes() {
    local stepds victims
    mapfile -t stepds < <(stepd_pids)
    ((${#stepds[@]})) || return 0
    mapfile -t victims < <(descendants "${stepds[@]}")
    ((${#victims[@]})) || return 0
    log "killing job processes: ${victims[*]}"
    kill -KILL "${victims[@]}" 2>/dev/null || true
}

# Cancel every job and wait (bounded) for the queue to drain, so no job steps are
# left running once slurmd is gone.
drain_jobs() {
    local ids
    ids="$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')" || return 0
    [[ -n "${ids// /}" ]] || return 0
    log "cancelling jobs: ${ids}"
    # shellcheck disable=SC2086  # ids is a list of numbers
    scancel ${ids} 2>/dev/null || true
    local start=${SECONDS} killed=0
    while [[ -n "$(squeue -h -o %A 2>/dev/null)" ]]; do
        if ((SECONDS - start >= DRAIN_TIMEOUT)); then
            log "queue not empty after ${DRAIN_TIMEOUT}s; stopping anyway"
            return 0
        fi
        # Give well-behaved jobs a moment to exit on SIGTERM, then force it.
        if ((killed == 0 && SECONDS - start >= 2)); then
            kill_job_processes
            killed=1
        fi
        sleep 0.2
    done
}

stop_all() {
    # slurmctld flushes job records to slurmdbd on exit, and slurmdbd needs mariadb
    # until it has stopped; munged is not needed by anyone once slurmdbd is gone.
    # shellcheck disable=SC2046  # daemon names have no spaces
    stop_daemons 20 $(slurmd_daemons) slurmctld
    stop_daemons 20 slurmdbd
    stop_daemons 60 mariadbd munged
    # Steps left over when the queue did not drain (or slurmd died) would run on.
    kill_job_processes
    local pid
    for pid in $(stepd_pids); do kill -KILL "${pid}" 2>/dev/null || true; done
}

cmd_down() {
    if ! set_paths "$1"; then
        log "no such directory $1; nothing to stop"
        return 0
    fi
    if alive slurmctld && alive munged; then
        drain_jobs
    fi
    stop_all
    log "down in ${D}"
}

cmd_status() {
    set_paths "$1" || die "no such directory $1"
    local d pid rc=0 name state states
    for d in $(all_daemons); do
        # slurmd:n1 is shown as "slurmd n1".
        if pid="$(live_pid "${d}")"; then
            printf '%-12s running (pid %s)\n' "${d/:/ }" "${pid}" >&3
        else
            printf '%-12s stopped\n' "${d/:/ }" >&3
            rc=1
        fi
    done
    if ((rc == 0)); then
        if states="$(sinfo -h -N -o '%N %T' 2>/dev/null)"; then
            while read -r name state; do
                printf '%-12s %s\n' "node ${name}" "${state}" >&3
            done <<<"${states}"
        else
            printf '%-12s unreachable\n' nodes >&3
        fi
    fi
    return "${rc}"
}

# Pids of what runs on NODE for this cluster's jobs: the tasks (SLURMD_NODENAME=NODE in
# their environment), their descendants, and the slurmstepd processes above them.
node_processes() {
    local node="$1" dir pid ppid comm line tasks=()
    for dir in /proc/[0-9]*; do
        tr '\0' '\n' 2>/dev/null <"${dir}/environ" |
            grep -qxF "SLURMD_NODENAME=${node}" || continue
        tr '\0' '\n' 2>/dev/null <"${dir}/environ" |
            grep -qxF "SLURM_CONF=${SLURM_CONF_FILE}" || continue
        pid="${dir#/proc/}"
        tasks+=("${pid}")
        read -r line 2>/dev/null <"${dir}/stat" || continue
        read -r _ ppid _ <<<"${line##*) }"
        read -r comm 2>/dev/null <"/proc/${ppid}/comm" || continue
        [[ "${comm}" == slurmstepd ]] && echo "${ppid}"
    done
    ((${#tasks[@]})) || return 0
    printf '%s\n' "${tasks[@]}"
    descendants "${tasks[@]}"
}

cmd_lose_node() {
    set_paths "$1" || die "no such directory $1"
    local node="$2" pid victims
    conf_nodes | grep -qxF "${node}" || die "no node ${node} in ${SLURM_CONF_FILE}"
    pid="$(live_pid "slurmd:${node}")" || die "slurmd of ${node} is not running"
    kill -KILL "${pid}"
    mapfile -t victims < <(node_processes "${node}" | sort -u)
    if ((${#victims[@]})); then
        log "killing what ran on ${node}: ${victims[*]}"
        kill -KILL "${victims[@]}" 2>/dev/null || true
    fi
    rm -f "$(pidfile_of "slurmd:${node}")"
    # Without this slurmctld notices only after SlurmdTimeout (minutes).
    scontrol update NodeName="${node}" State=DOWN Reason="lost (local_slurm.sh lose-node)"
    log "node ${node} lost"
}

cmd_restore_node() {
    set_paths "$1" || die "no such directory $1"
    local node="$2"
    conf_nodes | grep -qxF "${node}" || die "no node ${node} in ${SLURM_CONF_FILE}"
    if ! alive "slurmd:${node}"; then
        log "starting slurmd of node ${node}"
        spawn "${LOG}/slurmd-${node}.out" slurmd -f "${SLURM_CONF_FILE}" -N "${node}" ||
            fail_with_log "slurmd of node ${node}" "${LOG}/slurmd-${node}.log"
    fi
    scontrol update NodeName="${node}" State=RESUME 2>/dev/null || true  # already back: fine
    wait_for "node ${node}" "${UP_TIMEOUT}" node_idle "${node}" ||
        fail_with_log "node ${node}" "${LOG}/slurmd-${node}.log"
    log "node ${node} restored"
}

node_idle() {
    [[ "$(sinfo -h -N -n "$1" -o '%T' 2>/dev/null)" =~ ^(idle|mixed|allocated)$ ]]
}

main() {
    (($# >= 1)) || usage
    local cmd="$1"
    shift
    case "${cmd}" in
        install) (($# == 0)) || usage; cmd_install ;;
        up) (($# == 1)) || usage; cmd_up "$1" ;;
        down) (($# == 1)) || usage; cmd_down "$1" ;;
        status) (($# == 1)) || usage; cmd_status "$1" ;;
        lose-node) (($# == 2)) || usage; cmd_lose_node "$1" "$2" ;;
        restore-node) (($# == 2)) || usage; cmd_restore_node "$1" "$2" ;;
        *) usage ;;
    esac
}

main "$@"
