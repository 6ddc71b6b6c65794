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
# The cluster's jobs run with this venv's bin/ first on PATH, so a recipe's `python` is the Python
# that attune (and PyTorch) are installed in, as it would be in a training image.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${ATTUNE_VENV:-$PWD/.venv}
RAY=${RAY:-$VENV/bin/ray}
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

[ -x "$RAY" ] || die "$RAY not found: install Ray first (bash scripts/setup.sh, or pip install 'attune[ray]')"

if [ "${1:-}" = "--stop" ]; then
  "$RAY" stop --force >/dev/null 2>&1 || true
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
PATH="$VENV/bin:$PATH" "$RAY" start --head \
  --port="$GCS_PORT" \
  --num-cpus="$CPUS" --num-gpus=0 \
  --memory=$((MEM_GB * 1024 * 1024 * 1024)) \
  --object-store-memory=$((100 * 1024 * 1024)) \
  --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$PORT" \
  --disable-usage-stats >/dev/null \
  || die "ray start failed (see /tmp/ray/session_latest/logs)"

t0=$(date +%s)
until answers; do
  [ $(( $(date +%s) - t0 )) -lt "$TIMEOUT" ] || die "the Jobs API at $URL does not answer after ${TIMEOUT}s"
  sleep 0.5
done
say "ray up: Jobs API at $URL (${SECONDS}s)"
