#!/usr/bin/env bash
# Write a local marketplace directory holding only the attune plugin: the tracked files of this
# checkout that the plugin needs (no .venv, no build outputs, no tests), as they are in the working tree.
# usage: bash scripts/plugin_marketplace.sh DEST   then: claude plugin marketplace add DEST
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:?usage: bash scripts/plugin_marketplace.sh DEST}
if [ -e "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
  echo "plugin_marketplace.sh: $DEST exists and is not empty" >&2
  exit 2
fi
mkdir -p "$DEST"
git ls-files -z -- .claude-plugin .mcp.json hooks skills mcp_servers attune broker gate examples \
  pyproject.toml README.md LICENSE docs \
  | while IFS= read -r -d '' f; do
      [ -f "$f" ] || continue
      mkdir -p "$DEST/$(dirname "$f")"
      cp -p "$f" "$DEST/$f"
    done
echo "$DEST"
