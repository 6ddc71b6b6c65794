"""Claude Code's OS sandbox, configured for a campaign session: the layer under the PreToolUse policy.

The policy (hooks/policy.py) is the first, explainable layer: it reads each shell command and denies
what it cannot show to be read-only. Under it, Claude Code runs every Bash command in its own OS
sandbox (bubblewrap with a socat network proxy on Linux, Seatbelt on macOS). `settings(campaign)`
returns the Claude Code settings (`--settings` JSON) that confine a campaign session:

- writes: only `notes/` (and policy.yaml `write_paths`); every protected name of the campaign
  directory is write-denied whether or not it exists yet, and so is every other entry that exists
  at the top of the campaign when the session starts (Claude Code always lets a sandboxed command
  write its working directory, so the campaign's own top level is closed by naming what is there);
  the plugin (all of it but the skill's lessons file, which `add_lesson.py` appends to), its data,
  the ledger keys and Claude Code's settings are write-denied too;
- reads: no `.broker/` (the broker's endpoint and token), no ledger keys
  (`${XDG_STATE_HOME:-~/.local/state}/attune/`), no plugin data (`${CLAUDE_PLUGIN_DATA}` and
  `${CLAUDE_CONFIG_DIR:-~/.claude}/plugins/data`), and no
  other campaign: the directory holding the campaign is read-denied with the campaign re-allowed
  (or, where that directory also holds the home directory, Python or the plugin, each sibling
  directory holding a campaign.yaml is read-denied);
- network: no domain allowed, no local binding, no Unix sockets;
- `failIfUnavailable`: Claude Code refuses to start without a working sandbox;
  `allowUnsandboxedCommands: false`: a command cannot ask to run outside it.

`unavailable()` says why the sandbox cannot run here (None when it can): the headless launcher
checks it first and refuses to start a campaign session without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from attune.core.campaign_paths import (
    BROKER_DIR,
    CAMPAIGN_FILE,
    NOTES_DIR,
    POLICY_FILE,
    PROTECTED_IN_CAMPAIGN,
)
from attune.core.containment import inside

__all__ = ["PROTECTED_IN_CAMPAIGN", "settings", "settings_json", "unavailable"]

__all__ = ["PROTECTED_IN_CAMPAIGN", "settings", "settings_json", "unavailable"]


def _policy_file(campaign: Path, root: Path) -> dict[str, list[str]]:
    """policy.yaml's extensions, read by the hooks' own reader (hooks/runtime.py of the plugin)."""
    if not (campaign / POLICY_FILE).is_file():
        return {}
    import importlib.util

    spec = importlib.util.spec_from_file_location("_attune_hooks_runtime", root / "hooks" / "runtime.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot read policy.yaml: {root / 'hooks' / 'runtime.py'} is missing")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.load_policy(str(campaign))  # type: ignore[no-any-return]


def _state_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "attune"


def _holds(d: Path, p: Path) -> bool:
    return inside(p, d)


def _other_campaigns(campaign: Path, plugin_root: Path) -> tuple[list[str], list[str]]:
    """(read-denied paths, re-allowed paths) that keep the session out of other campaigns."""
    parent = campaign.parent
    import tempfile

    keep = [Path.home().resolve(), plugin_root, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(),
            Path(tempfile.gettempdir()).resolve()]
    py = shutil.which("python3")
    if py:
        keep.append(Path(py).resolve())
    if parent != Path("/") and not any(_holds(parent, k) for k in keep):
        return [str(parent)], [str(campaign)]
    siblings = []
    try:
        for entry in os.scandir(parent):
            p = Path(entry.path)
            if p != campaign and entry.is_dir(follow_symlinks=False) and (p / CAMPAIGN_FILE).is_file():
                siblings.append(str(p))
    except OSError:
        pass
    return sorted(siblings), []


LESSONS_DIR = Path("skills") / "attune" / "catalog"  # where add_lesson.py appends (a temp file, then a rename)
LESSONS_FILE = "lessons.yaml"


def _deny_around(base: Path, keep: list[Path]) -> set[str]:
    """Every entry under `base` except the kept paths, naming directories that hold a kept path by
    their other entries instead (the sandbox's denyWrite wins over allowWrite, so a denied directory
    would close what it holds)."""
    out: set[str] = set()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return {str(base)}
    for e in entries:
        p = base / e.name
        if p in keep:
            continue
        if e.is_dir(follow_symlinks=False) and any(k != p and inside(k, p) for k in keep):
            out |= _deny_around(p, keep)
        else:
            out.add(str(p))
    return out


def _plugin_writes(root: Path, campaign: Path) -> tuple[list[str], set[str]]:
    """(allowed, denied) writes in the plugin: only the skill's lessons file (and temporary files next
    to it) stays writable, for add_lesson.py, and a campaign kept inside the plugin's tree."""
    keep = [campaign] if campaign != root and inside(campaign, root) else []
    lessons_env = os.environ.get("ATTUNE_LESSONS_FILE")
    if lessons_env:
        return [str(Path(lessons_env).resolve().parent)], _deny_around(root, keep) if keep else {str(root)}
    target = root / LESSONS_DIR
    if not target.is_dir():
        return [], _deny_around(root, keep) if keep else {str(root)}
    return [str(target)], _deny_around(root, [*keep, target / LESSONS_FILE])


def settings(campaign_dir: Path | str, plugin_root: Path | str | None = None) -> dict[str, Any]:
    """The Claude Code settings that put a campaign session in the OS sandbox (see the module docstring)."""
    campaign = Path(campaign_dir).resolve()
    root = Path(plugin_root or Path(__file__).resolve().parents[2]).resolve()
    extra = _policy_file(campaign, root)
    notes = campaign / NOTES_DIR
    allow_write = [str(notes)] + [str((campaign / p).resolve()) for p in extra.get("write_paths", [])]
    deny_write = {str(campaign / name) for name in PROTECTED_IN_CAMPAIGN}
    try:
        for entry in os.scandir(campaign):
            if entry.name != NOTES_DIR:
                deny_write.add(str(campaign / entry.name))
    except OSError:
        pass
    state = _state_dir()
    from attune.core.ledger import AUTH_ENV, keys_dir

    keys = keys_dir()  # the password database's home: the same place the broker files the keys under
    deny_read = [str(campaign / BROKER_DIR), str(state), str(keys)]
    plugin_allow, plugin_deny = _plugin_writes(root, campaign)
    allow_write += plugin_allow
    deny_write |= plugin_deny
    deny_write.update({str(state), str(keys)})
    data = os.environ.get("CLAUDE_PLUGIN_DATA")
    if data:
        deny_read.append(str(Path(data).resolve()))
        deny_write.add(str(Path(data).resolve()))
    home = Path.home()
    deny_write.update({str(home / ".claude"), str(home / ".claude.json")})
    # Claude Code keeps every plugin's data (attune's venv included) under its config directory.
    config = Path(os.environ.get("CLAUDE_CONFIG_DIR") or home / ".claude")
    deny_read.append(str(config / "plugins" / "data"))
    deny_write.add(str(config))
    others, allow_read = _other_campaigns(campaign, root)
    deny_read += others
    if allow_read:
        allow_read += [str(root)] + [str((campaign / p).resolve()) for p in extra.get("read_paths", [])]
    # a path both allowed and denied for writing would be closed: keep the allowed ones open
    deny_write -= set(allow_write)
    return {
        # The ledger keys are closed to the session: its read-only `attune status|ledger show|ledger verify`
        # check the hash chain without them (AUTH_ENV) and say so; the broker's verify_ledger tool checks the
        # MACs with the key (issue 24: legitimate work is not denied by the sandbox).
        "env": {AUTH_ENV: "chain"},
        "sandbox": {
            "enabled": True,
            "failIfUnavailable": True,
            "allowUnsandboxedCommands": False,
            "autoAllowBashIfSandboxed": False,
            "excludedCommands": [],
            "filesystem": {
                "allowWrite": allow_write,
                "denyWrite": sorted(deny_write),
                "denyRead": deny_read,
                "allowRead": allow_read,
            },
            "network": {"allowedDomains": [], "allowLocalBinding": False, "allowAllUnixSockets": False},
        },
    }


def settings_json(campaign_dir: Path | str, plugin_root: Path | str | None = None) -> str:
    return json.dumps(settings(campaign_dir, plugin_root), separators=(",", ":"))


def unavailable() -> str | None:
    """Why Claude Code's sandbox cannot run on this machine, or None when it can."""
    if sys.platform == "darwin":
        return None if shutil.which("sandbox-exec") else "sandbox-exec (Seatbelt) is missing"
    if not sys.platform.startswith("linux"):
        return f"Claude Code has no command sandbox on {sys.platform}"
    missing = [p for p in ("bwrap", "socat") if not shutil.which(p)]
    if missing:
        return (f"{' and '.join(missing)} not found on PATH (install them: apt-get install -y bubblewrap socat, "
                "or dnf install bubblewrap socat)")
    try:
        p = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-net", "true"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap does not run: {exc}"
    if p.returncode != 0:
        return f"bwrap cannot create a sandbox here (user namespaces off?): {p.stderr.strip()[:200]}"
    return None
