#!/usr/bin/env bash
# Single-node Slurm (Debian 12 / Slurm 22.05) for local tests and CI. Run as root.
#   slurm-local.sh up     install if needed, write config, start munged/slurmctld/slurmd, wait until idle
#   slurm-local.sh down   cancel jobs, stop slurmd, slurmctld, munged by their PID files
# Idempotent: "up" on a running cluster only checks it, and starts only the daemons that are
# not running (tests/test_slurm_live.py stops slurmctld and calls "up" to bring it back).
# Based on ../shared/notes/slurm-local.md (tested on Debian 12, Slurm 22.05.8, 2 CPUs, no systemd).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

NODE=localhost                 # static name; slurmd is started with -N localhost
CONF=/etc/slurm/slurm.conf
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid

log() { echo "[slurm-local] $*" >&2; }

# pid from a pid file if that process is alive and has the expected name
alive() {  # alive PIDFILE COMM
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$2" ] && echo "$pid"
}

write_conf() {
  local cpus tmp
  cpus=$(nproc)
  tmp=$(mktemp)
  cat >"$tmp" <<EOF
# Minimal single-node Slurm for local tests/CI: no cgroups, no accounting DB.
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  if cmp -s "$tmp" "$CONF"; then rm -f "$tmp"; return 1; fi
  install -m 0644 "$tmp" "$CONF"; rm -f "$tmp"; return 0
}

up() {
  local t0=$SECONDS changed=0 pid st i
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
     || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    log "installing packages"
    local pkgs="slurmctld slurmd slurm-client munge"
    apt-get install -y --no-install-recommends $pkgs >/dev/null \
      || { apt-get update >/dev/null && apt-get install -y --no-install-recommends $pkgs >/dev/null; }
  fi

  # munge: the Debian postinst creates /etc/munge/munge.key; make sure anyway
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key && chmod 0600 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge
  install -d -o munge -g munge -m 0711 /var/lib/munge
  if ! alive "$MUNGE_PID" munged >/dev/null; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged --force
  fi
  munge -n | unmunge >/dev/null

  install -d -m 0755 /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  write_conf && changed=1

  if ! alive "$CTLD_PID" slurmctld >/dev/null; then
    log "starting slurmctld"; slurmctld; changed=0
  fi
  if ! alive "$SLURMD_PID" slurmd >/dev/null; then
    log "starting slurmd"; slurmd -N "$NODE"
  fi
  if [ "$changed" = 1 ]; then log "config changed: scontrol reconfigure"; scontrol reconfigure; fi

  st=$(wait_node)
  case "$st" in
    drained|draining|down)   # left over from an earlier run (node state is saved): clean slate
      log "resuming $NODE (was $st: $(sinfo -h -N -n "$NODE" -o '%E'))"
      scontrol update nodename="$NODE" state=resume
      st=$(wait_node) ;;
  esac
  log "node $NODE: ${st:-unknown} (after $((SECONDS - t0)) s)"
  case "$st" in idle|mixed|allocated) ;; *) log "node not usable: $(sinfo -h -N -o '%N %T %E' 2>&1)"; exit 1 ;; esac
}

# wait (max 30 s) until the node has registered: a state without the '*' (not responding) suffix
wait_node() {
  local st=""
  for _ in $(seq 1 300); do
    st=$(sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null || true)
    case "$st" in idle|mixed|allocated|completing|drained|draining|down) break ;; esac
    sleep 0.1
  done
  echo "$st"
}

down() {
  local pid
  if alive "$CTLD_PID" slurmctld >/dev/null; then
    squeue -h -o %i 2>/dev/null | xargs -r scancel || true
  fi
  for spec in "$SLURMD_PID slurmd" "$CTLD_PID slurmctld" "$MUNGE_PID munged"; do
    set -- $spec
    if pid=$(alive "$1" "$2"); then
      kill "$pid"
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      log "stopped $2 ($pid)"
    fi
  done
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
