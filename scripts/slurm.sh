#!/usr/bin/env bash
# A one-node SLURM on this machine, for the cluster tests (tests/cluster/) and for trying normfl's SLURM launcher
# by hand. Debian's packages (slurm-wlm 22.05, munge, slurmdbd on MariaDB so that `sacct` answers); no systemd, no
# cgroups; as root. Everything it makes lives in one folder ($NORMFL_SLURM, default /tmp/normfl-slurm): its
# config, daemons' state, logs and sockets; nothing under /etc is touched. Its ports (16817-16820) stay clear of a
# real SLURM's and MariaDB's.
#
#   scripts/slurm.sh install   apt-get the packages
#   scripts/slurm.sh start     start munged, mariadbd, slurmdbd, slurmctld, slurmd; print the line to source
#   scripts/slurm.sh stop      stop exactly the daemons `start` recorded, by PID, newest first
#
# Commands find the cluster by SLURM_CONF: `source <(scripts/slurm.sh env)`, then sinfo, sbatch, sacct as usual.
set -euo pipefail
DIR=${NORMFL_SLURM:-/tmp/normfl-slurm}
PIDS=$DIR/pids                 # "name pid" per daemon this script started, in order
PACKAGES="slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
export SLURM_CONF=$DIR/slurm.conf

fail() {                       # a start that fails half-way stops what it had started
  echo "slurm.sh: $*" >&2
  if [ -n "${STARTING:-}" ]; then stop; fi
  exit 1
}

stop() {                       # newest first, each by the PID recorded at its start; never by name
  [ -f "$PIDS" ] || return 0
  tac "$PIDS" | while read -r name pid; do
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "slurm.sh: $name ($pid) still up after 10 s: SIGKILL" >&2; kill -9 "$pid"; fi
  done
  rm -f "$PIDS"
}

daemon() {                     # daemon NAME COMMAND...: start it in the foreground of a background job; note its PID
  local name=$1; shift
  "$@" > "$DIR/log/$name.out" 2>&1 &
  echo "$name $!" >> "$PIDS"
}

until_ok() {                   # until_ok WHAT SECONDS COMMAND...: wait for COMMAND to succeed
  local what=$1 seconds=$2; shift 2
  local deadline=$((SECONDS + seconds))
  while [ $SECONDS -lt $deadline ]; do "$@" > /dev/null 2>&1 && return 0; sleep 0.2; done
  fail "$what did not come up in $seconds s (logs: $DIR/log)"
}

start() {
  [ "$(id -u)" = 0 ] || fail "needs root (the daemons run as root here)"
  for exe in munged mariadbd slurmdbd slurmctld slurmd; do
    [ -x "/usr/sbin/$exe" ] || fail "/usr/sbin/$exe is missing: scripts/slurm.sh install ($PACKAGES)"
  done
  [ -s "$PIDS" ] && fail "already started ($PIDS): scripts/slurm.sh stop first"
  STARTING=1
  mkdir -p "$DIR"/{log,munge,db,ctld,slurmd}
  chmod 700 "$DIR/munge"
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))   # MB jobs may ask for: 3/4 of the RAM

  # munge: slurm's authentication; its own key and socket here (-f: as root, in a folder of its own under /tmp)
  [ -s "$DIR/munge/key" ] || { head -c 1024 /dev/urandom > "$DIR/munge/key"; chmod 400 "$DIR/munge/key"; }
  daemon munged /usr/sbin/munged -F -f --key-file="$DIR/munge/key" --socket="$DIR/munge/socket" \
    --pid-file="$DIR/munge/pid" --seed-file="$DIR/munge/seed" --log-file="$DIR/log/munged.log"
  until_ok munged 10 test -S "$DIR/munge/socket"

  # MariaDB: the accounting database slurmdbd writes and sacct reads. Only slurmdbd reaches it, on 127.0.0.1,
  # without passwords (--skip-grant-tables), and it lives and dies with this cluster.
  [ -d "$DIR/db/mysql" ] || mariadb-install-db --user=root --datadir="$DIR/db" --skip-test-db \
    > "$DIR/log/db-install.out" 2>&1 || fail "mariadb-install-db failed (log: $DIR/log/db-install.out)"
  daemon mariadbd /usr/sbin/mariadbd --user=root --datadir="$DIR/db" --socket="$DIR/db.sock" --pid-file="$DIR/db.pid" \
    --bind-address=127.0.0.1 --port=16820 --skip-grant-tables --log-error="$DIR/log/mariadbd.log"
  until_ok mariadbd 30 mariadb --socket="$DIR/db.sock" -e 'select 1'
  # each start is a new cluster: its job ids start at 1 again (slurmctld -c), so the old ones' records go
  mariadb --socket="$DIR/db.sock" -e 'DROP DATABASE IF EXISTS slurm_acct_db' || fail "could not empty the database"

  cat > "$DIR/slurm.conf" <<EOF
# written by scripts/slurm.sh: one node, the machine itself
ClusterName=normfl
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/socket
CredType=cred/munge
# no cgroups: processes tracked through /proc, no task binding, no per-job accounting samples
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/slurmd
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# accounting through slurmdbd, so that sacct (which submitit polls) knows every job and how it ended
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=16819
AccountingStoragePass=$DIR/munge/socket
# as a cluster: a job is requeued on request, and one past its limit or cancelled gets SIGTERM, then SIGKILL
# KillWait seconds later
JobRequeue=1
KillWait=30
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=cpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  cat > "$DIR/slurmdbd.conf" <<EOF
# written by scripts/slurm.sh: slurmdbd (read from slurm.conf's folder) on MariaDB above
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/socket
DbdHost=localhost
DbdPort=16819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=16820
StorageUser=root
StorageLoc=slurm_acct_db
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/slurmdbd.pid
EOF
  chmod 600 "$DIR/slurmdbd.conf"

  daemon slurmdbd /usr/sbin/slurmdbd -D
  until_ok slurmdbd 30 sacctmgr -n list cluster
  daemon slurmctld /usr/sbin/slurmctld -D -c -i      # -c: no jobs from an earlier start; the cluster registers itself
  until_ok slurmctld 30 scontrol ping
  daemon slurmd /usr/sbin/slurmd -D -N localhost     # the node's name in slurm.conf, whatever the hostname
  until_ok "the node" 30 bash -c "sinfo -h -o %t | grep -qx idle"
  until_ok sacct 30 bash -c "sacctmgr -n list cluster format=cluster | grep -qw normfl"
  echo "export SLURM_CONF=$SLURM_CONF"
}

case "${1:-}" in
  install) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $PACKAGES > /dev/null ||
             { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $PACKAGES > /dev/null; } ;;
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: scripts/slurm.sh install|start|stop|env" >&2; exit 2 ;;
esac
