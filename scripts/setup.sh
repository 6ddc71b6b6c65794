#!/usr/bin/env bash
# Set up attune from nothing: a virtual environment in .venv with the package, the example
# workload's PyTorch (CPU build, pinned) and the development tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# Pin torch: an unpinned torch pulls a multi-gigabyte CUDA build; 2.13.0 is the CPU build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,examples,ttb]"
# The ray backend's extra (Ray's Jobs API client, and Ray for the one-machine test cluster of scripts/start-ray.sh).
.venv/bin/python -m pip install -q -e ".[ray]"
echo "attune set up in .venv ($(.venv/bin/attune --version))"
