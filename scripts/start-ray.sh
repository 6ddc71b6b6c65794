#!/usr/bin/env bash
# Start a one-machine Ray cluster for development and CI: `ray start --head` on this host, CPU only,
# with bounded CPUs and memory, the dashboard (and so the Jobs API) on 127.0.0.1. Idempotent: a second
# run finds the dashboard answering and returns at once. Needs Ray with its dashboard installed
# (`pip install 'attune[ray]'`; scripts/setup.sh installs it into .venv).
#
#   bash scripts/start-ray.sh                 # start (or find) the cluster, wait until the Jobs API answers
#   bash scripts/start-ray.sh --stop          # stop it (ray stop)
#   RAY_NUM_CPUS=2 RAY_MEMORY_GB=4 RAY_DASHBOARD_PORT=8265 bash scripts/start-ray.sh
#
# A cluster of its own beside another (tests): RAY_TEMP_DIR (Ray's --temp-dir; --stop then ends only the
# processes under it, by pid) and every port: RAY_GCS_PORT, RAY_DASHBOARD_PORT, RAY_NODE_MANAGER_PORT,
# RAY_OBJECT_MANAGER_PORT, RAY_CLIENT_SERVER_PORT, RAY_DASHBOARD_AGENT_GRPC_PORT,
# RAY_DASHBOARD_AGENT_LISTEN_PORT, RAY_METRICS_EXPORT_PORT, RAY_RUNTIME_ENV_AGENT_PORT,
# RAY_MIN_WORKER_PORT and RAY_MAX_WORKER_PORT. `ray start` fails now and then on a loaded machine: it is
# tried RAY_START_TRIES times (3), with a growing pause between tries.
#
# The cluster's jobs run with this venv's bin/ first on PATH, so a recipe's `python` is the Python
# that attune (and PyTorch) are installed in, as it would be in a training image.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${ATTUNE_VENV:-$PWD/.venv}
if [ -z "${RAY:-}" ]; then
  RAY=$VENV/bin/ray
  # A venv layered on another (its Ray installed below): Ray's own CLI through this venv's Python.
  if [ ! -x "$RAY" ] && "$VENV/bin/python" -c "import ray.scripts.scripts" >/dev/null 2>&1; then
    RAY_PY=$VENV/bin/python
  fi
fi
TEMP_DIR=${RAY_TEMP_DIR:-}
TRIES=${RAY_START_TRIES:-3}
PORT=${RAY_DASHBOARD_PORT:-8265}
GCS_PORT=${RAY_GCS_PORT:-6379}
CPUS=${RAY_NUM_CPUS:-2}
MEM_GB=${RAY_MEMORY_GB:-4}
TIMEOUT=${RAY_START_TIMEOUT:-120}
URL="http://127.0.0.1:$PORT"

say() { echo "start-ray: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
answers() { "$VENV/bin/python" - "$URL" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/api/version", timeout=3) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
}

ray_cli() {
  if [ -n "${RAY_PY:-}" ]; then "$RAY_PY" -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; main()' "$@"
  else "$RAY" "$@"; fi
}
[ -n "${RAY_PY:-}" ] || [ -x "$RAY" ] || die "$RAY not found: install Ray first (bash scripts/setup.sh, or pip install 'attune[ray]')"

# The processes of this cluster only: those whose command line names its temp dir (each of Ray's daemons
# does), ended by pid: another cluster on the machine is left alone.
stop_own() {
  local pids=() pid
  for pid in $(grep -lsF -- "$TEMP_DIR" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
    [ "$pid" != "$$" ] && pids+=("$pid")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 2
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

if [ "${1:-}" = "--stop" ]; then
  if [ -n "$TEMP_DIR" ]; then stop_own; else ray_cli stop --force >/dev/null 2>&1 || true; fi
  say "stopped"
  exit 0
fi

if answers; then
  say "ray up: Jobs API at $URL (already running)"
  exit 0
fi

say "ray start --head (CPUs: $CPUS, memory: ${MEM_GB} GiB, dashboard: $URL)"
# A job may wait in the queue (PENDING, never charged) behind others for longer than Ray's default
# 15 minutes before its supervisor starts: let it wait an hour before Ray gives up on it.
export RAY_JOB_START_TIMEOUT_SECONDS=${RAY_JOB_START_TIMEOUT_SECONDS:-3600}
opts=()
[ -n "$TEMP_DIR" ] && opts+=("--temp-dir=$TEMP_DIR")
for pair in node-manager-port:RAY_NODE_MANAGER_PORT object-manager-port:RAY_OBJECT_MANAGER_PORT \
            ray-client-server-port:RAY_CLIENT_SERVER_PORT dashboard-agent-grpc-port:RAY_DASHBOARD_AGENT_GRPC_PORT \
            dashboard-agent-listen-port:RAY_DASHBOARD_AGENT_LISTEN_PORT metrics-export-port:RAY_METRICS_EXPORT_PORT \
            runtime-env-agent-port:RAY_RUNTIME_ENV_AGENT_PORT min-worker-port:RAY_MIN_WORKER_PORT \
            max-worker-port:RAY_MAX_WORKER_PORT; do
  var=${pair#*:}
  [ -n "${!var:-}" ] && opts+=("--${pair%%:*}=${!var}")
done
try=1
until PATH="$VENV/bin:$PATH" ray_cli start --head \
  --port="$GCS_PORT" \
  --num-cpus="$CPUS" --num-gpus=0 \
  --memory=$((MEM_GB * 1024 * 1024 * 1024)) \
  --object-store-memory=$((100 * 1024 * 1024)) \
  --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$PORT" \
  --disable-usage-stats "${opts[@]}" >/dev/null; do
  [ "$try" -lt "$TRIES" ] || die "ray start failed $TRIES times (see ${TEMP_DIR:-/tmp/ray}/session_latest/logs)"
  say "ray start failed (try $try of $TRIES); trying again in $((try * 5))s"
  [ -n "$TEMP_DIR" ] && stop_own  # a half-started cluster of our own
  sleep $((try * 5))
  try=$((try + 1))
done

t0=$(date +%s)
until answers; do
  if [ $(( $(date +%s) - t0 )) -ge "$TIMEOUT" ]; then
    [ -n "$TEMP_DIR" ] && stop_own
    die "the Jobs API at $URL does not answer after ${TIMEOUT}s"
  fi
  sleep 0.5
done
say "ray up: Jobs API at $URL (${SECONDS}s)"
