"""attune's Claude Code hooks (standard library only; see docs/plugin.md)."""
