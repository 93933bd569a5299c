#!/usr/bin/env bash
# A throwaway single-node SLURM cluster, for the tests and for trying train.sbatch by hand.
#
#   scripts/slurm/cluster.sh install      # apt-get slurm-wlm + munge when missing (root; fast when present)
#   scripts/slurm/cluster.sh start DIR    # munged, slurmctld, slurmd; every file under DIR (DIR
#                                         # and its parents must be o+x: munged's rule for its socket)
#   scripts/slurm/cluster.sh stop DIR     # cancel its jobs, stop the daemons
#
# After `start`, use the cluster with `export SLURM_CONF=DIR/slurm.conf`. Nothing outside DIR
# is written: munged gets its own key and socket there, so a system munge or SLURM is left alone.
# Ports: SLURMCTLD_PORT and SLURMD_PORT (default 6817 and 6818). The daemons run as the
# calling user; that must be root (slurmd starts job steps as the job's user).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

PACKAGES=(slurm-wlm munge)
BINARIES=(munged slurmctld slurmd sbatch scontrol squeue scancel srun)

die() {
	echo "cluster.sh: $*" >&2
	exit 1
}

installed() {
	local b
	for b in "${BINARIES[@]}"; do
		command -v "$b" >/dev/null 2>&1 || return 1
	done
}

install() {
	installed && return 0
	[[ $(id -u) == 0 ]] || die "SLURM is not installed and installing it needs root: apt-get install ${PACKAGES[*]}"
	command -v apt-get >/dev/null || die "SLURM is not installed and there is no apt-get: install ${PACKAGES[*]} by hand"
	echo "cluster.sh: installing ${PACKAGES[*]} with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	# Package lists may be absent on a fresh machine (container images delete them).
	apt-get update -q >/dev/null
	# The packages' own service start fails without systemd; only the binaries are used here.
	apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null
	installed || die "apt-get installed ${PACKAGES[*]} but some of ${BINARIES[*]} are still missing"
}

write_conf() {
	local dir=$1 host cpus mem_mb
	host=$(hostname -s)
	cpus=$(nproc)
	# 90% of the memory, in MB: slurmd drains a node that has less than it claims.
	mem_mb=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
	cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm/cluster.sh: one node, every path under $dir.
ClusterName=fwk-test
SlurmctldHost=$host
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (>= 5) also sets how long a requeued job waits before it may start again:
# cred_expire + 1 s (default 120 s).
AuthInfo=socket=$dir/munge/munge.sock,cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
# Test pending jobs every second (default 60): a requeued job starts as soon as it may.
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
JobRequeue=1
ReturnToService=2
# Finished jobs stay visible to scontrol for this many seconds.
MinJobAge=600
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
	local dir=$1 host state
	installed || die "SLURM is not installed: run '$0 install' (as root) or 'make slurm'"
	[[ $(id -u) == 0 ]] || die "starting slurmd needs root"
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	# munged refuses a socket in a directory that not everyone may enter.
	chmod 755 "$dir"
	mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
	chmod 755 "$dir/munge"
	if [[ ! -f $dir/munge/munge.key ]]; then # this cluster's own key, made from scratch
		if command -v mungekey >/dev/null; then
			mungekey --create --keyfile="$dir/munge/munge.key"
		else # munge < 0.5.14
			(umask 077 && dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none)
		fi
	fi
	munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
		--pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
	write_conf "$dir"
	export SLURM_CONF=$dir/slurm.conf
	host=$(hostname -s)
	slurmctld -c -f "$SLURM_CONF" # -c: a fresh cluster, no state to recover
	slurmd -f "$SLURM_CONF" -N "$host"
	for _ in $(seq 150); do
		state=$(scontrol show node "$host" 2>/dev/null | sed -n 's/.*State=\([A-Z+_]*\).*/\1/p')
		if [[ $state == IDLE* ]]; then
			echo "SLURM_CONF=$SLURM_CONF"
			return 0
		fi
		sleep 0.2
	done
	echo "cluster.sh: node $host did not become idle (state: ${state:-none}); logs:" >&2
	tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" "$dir/munge/munged.log" >&2 || true
	stop "$dir"
	exit 1
}

stop_daemons() {
	# SIGTERM to all of them at once (slurmd takes a few seconds), SIGKILL after 10 s.
	local pidfile pids=() pid
	for pidfile in "$@"; do
		[[ -f $pidfile ]] && pid=$(cat "$pidfile") && kill "$pid" 2>/dev/null && pids+=("$pid")
	done
	for _ in $(seq 100); do
		for pid in "${pids[@]}"; do
			kill -0 "$pid" 2>/dev/null && sleep 0.1 && continue 2
		done
		return 0
	done
	for pid in "${pids[@]}"; do
		kill -KILL "$pid" 2>/dev/null || true
	done
}

stop() {
	local dir=$1
	[[ -f $dir/slurm.conf ]] || die "no cluster in $dir"
	export SLURM_CONF=$dir/slurm.conf
	# Jobs first, so that no job step outlives the daemons.
	local jobs
	jobs=$(squeue -h -o %A 2>/dev/null || true)
	if [[ -n $jobs ]]; then
		# shellcheck disable=SC2086
		scancel $jobs 2>/dev/null || true
		for _ in $(seq 50); do
			[[ -z $(squeue -h -o %A 2>/dev/null) ]] && break
			sleep 0.2
		done
	fi
	stop_daemons "$dir/slurmd.pid" "$dir/slurmctld.pid"
	stop_daemons "$dir/munge/munged.pid"
}

case "${1:-}" in
install) install ;;
start) start "${2:?usage: $0 start DIR}" ;;
stop) stop "${2:?usage: $0 stop DIR}" ;;
*) die "usage: $0 install | start DIR | stop DIR" ;;
esac
