"""CLI subcommands. Each module defines `register(subparsers)`; see `attune.app.cli`."""
