#!/usr/bin/env bash
# Set up (idempotent) and run attune's checks: ruff, then the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
