#!/usr/bin/env python3
"""attune's PreToolUse hook, as hooks.json runs it: `python3 -I -S hooks/pre_tool_use.py`.

The hook itself is hooks/pretool.py (read from cached bytecode; this script is compiled on every
call, so it stays small). If it cannot be imported, or fails outside its own fail-closed skeleton,
the call is denied: Claude Code would let a crashed hook's call through.

Once the answer is written and flushed the process ends with `posix._exit`: the interpreter's
finalization (tearing down every module) is a tenth of a bare `python3 -I -S -c pass` and would
delay every tool call. Nothing is left to finalize: the answer is flushed here, and the hook's
writes (the decision log, the ledger's assumption rows) are closed before `main()` returns.
"""

import sys

try:
    sys.path.insert(0, "/".join(__file__.split("/")[:-2]) or ".")  # the plugin root (no `import os`: it is slow)
    from hooks.pretool import main

    main()
except BaseException as exc:  # fail closed
    name = type(exc).__name__  # an identifier: safe inside a JSON string
    sys.stdout.write('{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", '
                     f'"permissionDecisionReason": "attune\'s tool policy could not start ({name}); denied to be safe"}}}}\n')
try:
    sys.stdout.flush()
    sys.stderr.flush()
finally:
    import posix

    posix._exit(0)
