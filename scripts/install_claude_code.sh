#!/usr/bin/env bash
# Install the real Claude Code CLI, pinned, for the end-to-end tests (tests/e2e), and print its path.
# usage: bash scripts/install_claude_code.sh [DEST]   (default: ~/.cache/attune/claude-code-<version>)
# The tests find it there (or through ATTUNE_CLAUDE=<path to the claude binary>).
set -euo pipefail
VERSION=${CLAUDE_CODE_VERSION:-2.1.332}
DEST=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/attune/claude-code-$VERSION}
BIN="$DEST/node_modules/.bin/claude"
if ! "$BIN" --version >/dev/null 2>&1; then
  mkdir -p "$DEST"
  npm install --prefix "$DEST" --no-audit --no-fund --loglevel=error "@anthropic-ai/claude-code@$VERSION" >&2
  # The package's postinstall copies the native binary; run it by hand where install scripts are off.
  "$BIN" --version >/dev/null 2>&1 || node "$DEST/node_modules/@anthropic-ai/claude-code/install.cjs" >&2
fi
"$BIN" --version >&2
echo "$BIN"
