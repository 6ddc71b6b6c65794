"""Path containment, defined once: is a resolved path its root or below it?

The PreToolUse hook (hooks/policy.py), the launch path's path rule (attune/control/rungen.py), the broker's
file windows (broker/files.py) and the MCP servers' run directories all ask this one question. The
caller resolves both paths first (symbolic links followed, no `..` left: `os.path.realpath`,
`Path.resolve`, or the hooks' `lightos.path.realpath`), because how to resolve differs between them
(the hooks must start fast); the comparison does not. Imports nothing: the hooks load it on every
tool call.
"""

SEP = "/"  # POSIX only, like the rest of attune


def inside(path: object, root: object) -> bool:
    """True when `path` is `root` or lies below it, comparing whole components (`/a/bc` is not inside
    `/a/b`). Both are resolved absolute paths (str or os.PathLike); `root` may end with a separator."""
    p = path.__fspath__() if hasattr(path, "__fspath__") else path
    r = root.__fspath__() if hasattr(root, "__fspath__") else root
    if not isinstance(p, str) or not isinstance(r, str):
        raise TypeError(f"inside() takes str or os.PathLike paths, got {type(p).__name__} and {type(r).__name__}")
    if p == r:
        return True
    return p.startswith(r.rstrip(SEP) + SEP)
