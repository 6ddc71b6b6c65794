"""attune's MCP servers, defined once.

The plugin's `.mcp.json` (a static file Claude Code reads; tests/test_plugin_servers.py checks it
against `mcp_json()`), the launcher that starts a server by name (mcp_servers/launch.py), its
recorded tool schemas (mcp_servers/tool_schemas.json), the PreToolUse policy that allows only these
servers' tools (hooks/policy.py) and `attune tune`'s allowed tools (attune/app/headless.py) all read
this list. Imports nothing: the hooks and the standard-library-only launcher load it.
"""

PLUGIN = "attune"  # the plugin's name (.claude-plugin/plugin.json): Claude Code prefixes its tools with it
SERVERS = ("broker", "metrics", "traces", "gate")  # in .mcp.json's order
TOOL_PREFIX = f"mcp__plugin_{PLUGIN}_"  # a tool's full name: TOOL_PREFIX + server + "__" + tool


def module(server: str) -> str:
    """The Python module that implements `server`."""
    if server not in SERVERS:
        raise KeyError(f"unknown server {server!r}; expected one of {', '.join(SERVERS)}")
    return f"mcp_servers.{server}_server"


def tool_prefix(server: str) -> str:
    """The prefix of every tool of `server` as Claude Code names it, e.g. mcp__plugin_attune_broker."""
    return TOOL_PREFIX + server


def mcp_json() -> dict[str, object]:
    """What the plugin's .mcp.json holds: each server started through the launcher."""
    return {"mcpServers": {s: {"command": "python3", "args": ["${CLAUDE_PLUGIN_ROOT}/mcp_servers/launch.py", s]}
                           for s in SERVERS}}
