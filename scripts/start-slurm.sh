#!/usr/bin/env bash
# Install (if needed) and start a one-machine Slurm cluster: munge + slurmctld + slurmd on this host,
# one partition `debug` with this machine as its only node. Idempotent: a second run finds everything
# up and returns within a second. Needs root and Debian/Ubuntu (apt-get).
#
#   bash scripts/start-slurm.sh            # install, configure, start, wait until the node is idle
#   SLURM_START_TIMEOUT=60 bash scripts/start-slurm.sh
#
# The generated /etc/slurm/slurm.conf carries a marker line; a slurm.conf without it belongs to
# someone else and is never overwritten (the script then only starts the daemons).
set -euo pipefail

TIMEOUT=${SLURM_START_TIMEOUT:-60}
MARKER="# written by attune scripts/start-slurm.sh"
CONF=/etc/slurm/slurm.conf
t0=$(date +%s)

say() { echo "start-slurm: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
elapsed() { echo $(( $(date +%s) - t0 )); }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts system daemons)"

# --- 1. install -----------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v sbatch >/dev/null; then
  command -v apt-get >/dev/null || die "slurmctld is not installed and apt-get is not available"
  export DEBIAN_FRONTEND=noninteractive
  # apt-get update only when the package lists do not know slurm-wlm yet (a fresh image has none).
  if ! apt-cache show slurm-wlm >/dev/null 2>&1; then
    say "apt-get update"
    apt-get update -q >/dev/null || die "apt-get update failed"
  fi
  say "apt-get install slurm-wlm munge"
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
    || die "apt-get install -y slurm-wlm munge failed"
fi

# --- 2. munge -------------------------------------------------------------------------------------
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
if [ ! -s /etc/munge/munge.key ]; then
  say "creating /etc/munge/munge.key"
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
chmod 700 /etc/munge /var/lib/munge /var/log/munge
chmod 755 /run/munge
chmod 400 /etc/munge/munge.key
if ! (munge -n | unmunge) >/dev/null 2>&1; then
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged --force || die "munged did not start (see /var/log/munge/munged.log)"
  for _ in $(seq 1 50); do (munge -n | unmunge) >/dev/null 2>&1 && break; sleep 0.1; done
  (munge -n | unmunge) >/dev/null 2>&1 || die "munge does not answer (see /var/log/munge/munged.log)"
fi

# --- 3. slurm.conf --------------------------------------------------------------------------------
host=$(hostname -s 2>/dev/null || uname -n)
# The node line as slurmd itself detects this machine (CPUs, sockets, cores, threads, memory), so the
# node never registers with less than configured (which would drain it).
node_line=$(slurmd -C | head -n1)
case "$node_line" in NodeName=*) ;; *) die "slurmd -C did not describe this node: $node_line" ;; esac
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
new_conf=$(cat <<EOF
$MARKER
# A one-machine cluster for development and CI; see docs/slurm.md.
ClusterName=attune
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
# Cores are the consumable resource; memory is not, so jobs without --mem can share the node.
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
# Short kill grace (SIGTERM -> SIGKILL) so cancellations finish quickly; finished jobs stay visible
# to scontrol for MinJobAge seconds.
KillWait=5
MinJobAge=300
InactiveLimit=0
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
conf_changed=0
if [ -f "$CONF" ] && ! grep -qxF "$MARKER" "$CONF"; then
  say "$CONF was not written by this script: leaving it as it is"
elif [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$new_conf" ]; then
  say "writing $CONF"
  printf '%s\n' "$new_conf" >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
  conf_changed=1
fi

# --- 4. daemons -----------------------------------------------------------------------------------
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [ "$conf_changed" = 1 ] && { pid_alive /run/slurmctld.pid || pid_alive /run/slurmd.pid; }; then
  say "configuration changed: restarting slurmctld and slurmd"
  scontrol shutdown >/dev/null 2>&1 || true
  for _ in $(seq 1 100); do
    pid_alive /run/slurmctld.pid || pid_alive /run/slurmd.pid || break
    sleep 0.1
  done
  if pid_alive /run/slurmctld.pid || pid_alive /run/slurmd.pid; then
    die "slurmctld/slurmd did not stop after 'scontrol shutdown'; stop them and run this again"
  fi
fi
if ! pid_alive /run/slurmctld.pid; then
  say "starting slurmctld"
  /usr/sbin/slurmctld || die "slurmctld did not start (see /var/log/slurm/slurmctld.log)"
fi
if ! pid_alive /run/slurmd.pid; then
  say "starting slurmd"
  /usr/sbin/slurmd || die "slurmd did not start (see /var/log/slurm/slurmd.log)"
fi

# --- 5. wait until the node takes jobs -----------------------------------------------------------
state=""
while :; do
  state=$(sinfo -h -n "$host" -o '%T' 2>/dev/null | head -n1 || true)
  case "$state" in
    idle | mixed | allocated | completing) break ;;
    down* | drain* | fail*)
      # ReturnToService=2 brings a node back once it registers; a node left down (or drained by a
      # test) is resumed here so that this script always ends with a usable cluster.
      scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
  esac
  if [ "$(elapsed)" -ge "$TIMEOUT" ]; then
    die "node $host not idle after ${TIMEOUT}s (sinfo state: '${state:-none}'); see /var/log/slurm/slurmctld.log and slurmd.log"
  fi
  sleep 0.5
done
say "slurm up: node $host $state, partition debug (${SECONDS}s)"
