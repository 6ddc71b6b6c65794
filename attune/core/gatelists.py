"""Which correctness list a campaign names: the one rule, shared by the control plane, the plugin's
launcher (the gate server's list) and the PreToolUse hook (which write-protects that file).

Standard library only (hooks import it). `gate.lists` in campaign.yaml is either a built-in list name
(`llama31-405b`: the file gate/lists/llama31-405b.yaml of the plugin) when it is a bare name, or a list
file, relative to the campaign directory unless absolute; unset, the model's built-in list.
"""

from __future__ import annotations

BUILTIN_DIR = ("gate", "lists")  # under the plugin's root
LIST_SUFFIXES = (".yaml", ".yml")


def is_builtin_name(lists: str) -> bool:
    """A bare name (no directory, no .yaml/.yml suffix) names a built-in list."""
    return "/" not in lists and not lists.endswith(LIST_SUFFIXES)


def source(lists: str | None, model: str, campaign_dir: str) -> tuple[str, str]:
    """`("builtin", name)` or `("file", absolute-or-campaign-joined path)` for a campaign's `gate.lists`."""
    if not lists:
        return "builtin", model
    if is_builtin_name(lists):
        return "builtin", lists
    if lists.startswith("/"):
        return "file", lists
    return "file", campaign_dir.rstrip("/") + "/" + lists


def list_file(lists: str | None, model: str, campaign_dir: str, plugin_root: str) -> str:
    """The list file a campaign's gate uses (not resolved against symbolic links, not checked to exist)."""
    kind, where = source(lists, model, campaign_dir)
    if kind == "file":
        return where
    return "/".join((plugin_root.rstrip("/"), *BUILTIN_DIR, where + ".yaml"))


def spec_fields(spec: object) -> tuple[str | None, str]:
    """(`gate.lists`, `model`) of a campaign.yaml read with attune.core.yamlsubset; ValueError when they are
    not strings where given."""
    if not isinstance(spec, dict):
        raise ValueError("campaign.yaml: expected a mapping of fields")
    gate = spec.get("gate")
    lists = gate.get("lists") if isinstance(gate, dict) else None
    model = spec.get("model")
    if lists is not None and not isinstance(lists, str):
        raise ValueError(f"campaign.yaml: gate.lists: expected a string, got {lists!r}")
    if gate is not None and not isinstance(gate, dict):
        raise ValueError("campaign.yaml: gate: expected a mapping")
    return lists, model if isinstance(model, str) else ""
