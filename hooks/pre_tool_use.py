#!/usr/bin/env python3
"""attune's PreToolUse hook, as hooks.json runs it: `python3 -I -S hooks/pre_tool_use.py`.

The hook itself is hooks/pretool.py (read from cached bytecode; this script is compiled on every
call, so it stays small). If even that cannot be imported, the call is denied: Claude Code would let
a crashed hook's call through.
"""

import sys

try:
    sys.path.insert(0, "/".join(__file__.split("/")[:-2]) or ".")  # the plugin root (no `import os`: it is slow)
    from hooks.pretool import main
except BaseException as exc:  # fail closed
    name = type(exc).__name__  # an identifier: safe inside a JSON string
    sys.stdout.write('{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", '
                     f'"permissionDecisionReason": "attune\'s tool policy could not start ({name}); denied to be safe"}}}}\n')
    sys.exit(0)
sys.exit(main())
