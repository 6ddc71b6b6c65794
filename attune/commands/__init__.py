"""CLI subcommands. Each module defines `register(subparsers)`; see `attune.cli`."""
