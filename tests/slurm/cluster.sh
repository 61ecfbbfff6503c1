#!/usr/bin/env bash
# A real Slurm cluster on this machine, for the tests: munged, slurmctld and one or two slurmd
# (Debian's munge, slurmctld, slurmd and slurm-client; scripts/setup installs them), all with
# their configuration, keys, state, logs and sockets in one folder and on ports nobody listens to.
#
#   tests/slurm/cluster.sh start DIR [NODES]   start (NODES 1 or 2, default 1) and wait until
#                                              sinfo shows every node idle; prints SLURM_CONF=...
#   tests/slurm/cluster.sh stop DIR            stop everything started in DIR (also half-started)
#   tests/slurm/cluster.sh check               exit 77 with a message where it cannot run
#
# Clients find the cluster through SLURM_CONF=DIR/slurm.conf. The nodes are node1 (and node2),
# each with this machine's cores and most of its memory (two nodes share the cores), in one
# partition "test". Needs root (slurmd starts jobs as their user) and no systemd or cgroups:
# processes are tracked by process group, and tasks are not bound to cores (task/none: the two
# nodes' tasks would all be bound to the same first cores); xtrain takes its thread count from
# --cpus-per-task (SLURM_CPUS_PER_TASK) then.
# A second slurmd on the same host has what a second machine would have of its own: the folders
# of Slurm's PMIx plugin (named after the job and step only; its own mpi.conf moves them) and
# /dev/shm (a mount namespace with a tmpfs there: Open MPI names its shared-memory segments after
# the host and the rank on the node).
set -uo pipefail

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

check() {
  local c
  for c in munged slurmctld slurmd sbatch scontrol sinfo squeue scancel; do
    command -v "$c" > /dev/null || {
      echo "SKIP: no $c (scripts/setup installs munge, slurmctld, slurmd and slurm-client)"
      exit 77
    }
  done
  [ "$(id -u)" = 0 ] || {
    echo "SKIP: starting a Slurm node (slurmd) needs root"
    exit 77
  }
}

# A TCP port on 127.0.0.1 that nothing listens to and not in TAKEN (a list of ports), from
# 20000-32767 (below Linux's ephemeral ports).
free_port() {
  local p taken=" ${1:-} "
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 12768))
    [[ "$taken" == *" $p "* ]] && continue
    (echo > "/dev/tcp/127.0.0.1/$p") 2> /dev/null || {
      echo "$p"
      return
    }
  done
  die "no free port found"
}

start() {
  local dir=$1 nodes=${2:-1}
  [ "$nodes" = 1 ] || [ "$nodes" = 2 ] || die "NODES is 1 or 2, not $nodes"
  mkdir -p "$dir" || die "cannot create $dir"
  dir=$(cd "$dir" && pwd)
  mkdir -p "$dir"/{munge,state,log,spool/node1,spool/node2,node2/tmp}
  chmod 700 "$dir/munge"

  # munge: a fresh key, a socket in DIR (clients and daemons are told where)
  head -c 1024 /dev/urandom > "$dir/munge/munge.key"
  chmod 600 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" ||
    die "munged did not start: $(tail -3 "$dir/log/munged.log" 2> /dev/null)"

  # the node as slurmd sees it (a node configured with more CPUs or memory would be drained)
  local host cpus mem ports
  host=$(hostname)
  cpus=$(slurmd -C | tr ' ' '\n' | sed -n 's/^CPUs=//p')
  mem=$(slurmd -C | tr ' ' '\n' | sed -n 's/^RealMemory=//p')
  [ -n "$cpus" ] && [ -n "$mem" ] || die "slurmd -C did not describe this machine"
  mem=$((mem * 3 / 4))  # MiB
  ports=$(free_port)
  {
    echo "# written by tests/slurm/cluster.sh"
    echo "ClusterName=xtraintest"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$ports"
    # cred_expire: also how long a requeued job waits before it may start again (default 120 s)
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$dir/munge/socket,cred_expire=10"
    echo "CredType=cred/munge"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd.%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd.%n.log"
    echo "ProctrackType=proctrack/pgid"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core_Memory"
    echo "MpiDefault=none"
    # pending jobs looked at every second (defaults 60 and 30 s): a requeued job starts at once
    echo "SchedulerParameters=sched_interval=1,bf_interval=1"
    echo "ReturnToService=2"
    echo "MinJobAge=600"  # finished jobs stay visible to scontrol for the checks
    echo "KillWait=10"
    local n port
    for ((n = 1; n <= nodes; ++n)); do
      port=$(free_port "$ports")
      ports="$ports $port"
      echo "NodeName=node$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$cpus RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } > "$dir/slurm.conf"
  export SLURM_CONF=$dir/slurm.conf
  # node2 reads the same slurm.conf from a folder of its own, beside an mpi.conf that moves the
  # PMIx plugin's per-step folders (DIR/node2/tmp/spmix_appdir_<uid>_<job>.<step>) off node1's
  cp "$dir/slurm.conf" "$dir/node2/slurm.conf"
  echo "PMIxCliTmpDirBase=$dir/node2/tmp" > "$dir/node2/mpi.conf"

  slurmctld -f "$SLURM_CONF" || die "slurmctld did not start: $(tail -5 "$dir/log/slurmctld.log" 2> /dev/null)"
  slurmd -f "$SLURM_CONF" -N node1 || die "slurmd node1 did not start: $(tail -5 "$dir/log/slurmd.node1.log" 2> /dev/null)"
  if [ "$nodes" = 2 ]; then
    unshare --mount --propagation private \
      sh -c 'mount -t tmpfs -o size=50% xtrain-node2-shm /dev/shm && exec slurmd -f "$0" -N node2' "$dir/node2/slurm.conf" ||
      die "slurmd node2 did not start in a mount namespace of its own: $(tail -5 "$dir/log/slurmd.node2.log" 2> /dev/null)"
  fi

  local state
  for _ in $(seq 1 120); do
    state=$(sinfo -h -N -o '%t' 2> /dev/null | sort -u | tr '\n' ' ')
    if [ "$state" = "idle " ] && [ "$(sinfo -h -N -o '%N' | wc -l)" = "$nodes" ]; then
      echo "SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.5
  done
  die "the nodes did not become idle in 60 s (sinfo: ${state:-nothing}): $(tail -5 "$dir/log/slurmctld.log")"
}

# Kills the process in PIDFILE (TERM, then KILL after 10 s) and waits until it is gone; only if
# it is a daemon of the cluster in DIR (a stale file may name another process by now).
stop_pidfile() {
  local file=$1 dir=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file" 2> /dev/null)
  [ -n "$pid" ] && kill -0 "$pid" 2> /dev/null || return 0
  case "$(cat "/proc/$pid/comm" 2> /dev/null)" in munged | slurmctld | slurmd) ;; *) return 0 ;; esac
  { tr '\0' '\n' < "/proc/$pid/cmdline"; } 2> /dev/null | grep -qF "$dir/" || return 0
  kill "$pid" 2> /dev/null
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2> /dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2> /dev/null
}

# Processes of the cluster in DIR, this script and its callers aside: its daemons (DIR in their
# command line), slurmstepd (it keeps its node's log in DIR open; its command line and
# environment are overwritten by its title) and the jobs' processes (their environment has
# SLURM_CONF=DIR/slurm.conf or DIR/node2/slurm.conf).
ours() {
  local dir=$1 pid p skip=" "
  p=$$
  while [ -n "$p" ] && [ "$p" != 0 ]; do  # this script and its ancestors
    skip="$skip$p "
    p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2> /dev/null)
  done
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [[ "$skip" == *" $pid "* ]] && continue
    # a child of this script (a command substitution, a pipeline) is not the cluster's either
    [ "$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2> /dev/null)" = $$ ] && continue
    if { tr '\0' '\n' < "/proc/$pid/cmdline"; } 2> /dev/null | grep -qF "$dir/" ||
      { tr '\0' '\n' < "/proc/$pid/environ"; } 2> /dev/null | grep -qxF -e "SLURM_CONF=$dir/slurm.conf" -e "SLURM_CONF=$dir/node2/slurm.conf" ||
      find "/proc/$pid/fd" -maxdepth 1 -lname "$dir/*" 2> /dev/null | grep -q .; then
      echo "$pid"
    fi
  done
}

stop() {
  local dir=$1 pid f
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ]; then
    export SLURM_CONF=$dir/slurm.conf
    # jobs first, and wait until Slurm has ended them (KillWait is 10 s), then the daemons
    if scancel --full --quiet --partition=test 2> /dev/null; then
      for _ in $(seq 1 60); do
        [ -z "$(squeue -h -o %i 2> /dev/null)" ] && break
        sleep 0.5
      done
    fi
  fi
  for f in "$dir"/slurmd.*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do stop_pidfile "$f" "$dir"; done
  # whatever is left (slurmstepd, a job's processes): this cluster's only
  for pid in $(ours "$dir"); do kill -9 "$pid" 2> /dev/null; done
  sleep 0.2
  local left
  left=$(ours "$dir")
  if [ -n "$left" ]; then
    echo "cluster.sh: still running after stop:" >&2
    for pid in $left; do ps -o pid=,args= -p "$pid" >&2; done
    return 1
  fi
  return 0
}

case "${1:-}" in
  check) check ;;
  start)
    [ $# -ge 2 ] || die "usage: cluster.sh start DIR [NODES]"
    start "$2" "${3:-1}"
    ;;
  stop)
    [ $# -ge 2 ] || die "usage: cluster.sh stop DIR"
    stop "$2"
    ;;
  *)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
