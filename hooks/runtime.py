"""What every attune hook shares: finding the campaign, reading its policy, logging decisions.

A session belongs to a campaign when its project directory (`CLAUDE_PROJECT_DIR`, else the
hook input's `cwd`), or one of that directory's parents, holds a `campaign.yaml`. An explicit
`ATTUNE_CAMPAIGN_DIR` in the environment names the campaign directly (the unattended launcher
sets it). Outside a campaign every hook does nothing.

`policy.yaml` (optional, in the campaign directory) extends the PreToolUse allow-list. It is read
without a YAML library, so it must use this subset (or be a JSON object):

    # comments after '#'
    commands: [nvidia-smi, git]        # extra commands the shell policy runs (names only)
    read_paths:                        # extra directories the agent may read and search
      - /opt/Megatron-LM               #   relative paths are taken from the campaign directory
    write_paths: [scratch]             # extra directories the agent may edit or write
    tools: [NotebookRead]              # extra tool names (exact) the agent may call

Each key takes a list of strings (a single string counts as a list of one); plain, 'single'
or "double" quoted items; no other keys. A policy can only add to the allow-list: the protected
paths (ledger, spec, policy, correctness lists, the plugin itself, ...) stay closed.

Every decision is appended, one JSON object per line, to `<campaign>/hooks.log.jsonl`.
Standard library only.
"""

from __future__ import annotations

import sys
import time

from attune.core.campaign_paths import (  # stdlib only, no imports of its own
    CAMPAIGN_FILE,
    HOOKS_LOG,
    POLICY_FILE,
)
from attune.core.errors import HookError
from hooks import lightos as os  # os without `import os` (see hooks/lightos.py)

TYPE_CHECKING = False  # no typing import at run time: hooks start on every tool call
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

HOOK_LOG = HOOKS_LOG
POLICY_KEYS = ("commands", "read_paths", "write_paths", "tools")

PLUGIN_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


class PolicyFileError(HookError):
    """policy.yaml is not in the accepted subset."""


def project_dir(payload: dict[str, Any]) -> str:
    env = os.environ.get("CLAUDE_PROJECT_DIR")
    if env:
        return env
    cwd = payload.get("cwd")
    if isinstance(cwd, str) and cwd:
        return cwd
    return os.getcwd()


def outside_by_env() -> bool:
    """True when the environment alone shows this is no campaign's session (the fast path:
    Claude Code sets CLAUDE_PROJECT_DIR for hooks, so most sessions need not even parse their input)."""
    return (not os.environ.get("ATTUNE_CAMPAIGN_DIR") and bool(os.environ.get("CLAUDE_PROJECT_DIR"))
            and find_campaign({}) is None)


def read_event(raw: str, limit: int | None = None) -> tuple[dict[str, Any], str] | None:
    """Parse a hook's input and find its campaign; None when the hook has nothing to do here.

    Raises on a malformed payload, an input over `limit` characters or a Python older than 3.11, so
    that the calling hook fails closed.
    """
    if outside_by_env():
        return None
    if limit is not None and len(raw) > limit:
        raise ValueError(f"the hook input is over {limit} characters")
    from hooks import hookjson as json

    payload = json.loads(raw or "{}")
    if not isinstance(payload, dict):
        raise ValueError("the hook input is not a JSON object")
    campaign = find_campaign(payload)
    if campaign is None:
        return None
    if sys.version_info < (3, 11):  # noqa: UP036 - hooks run on whatever python3 the user has
        raise RuntimeError(f"attune's hooks need Python 3.11 or newer, python3 here is {sys.version.split()[0]}")
    return payload, campaign


def find_campaign(payload: dict[str, Any]) -> str | None:
    """The campaign directory of this session, or None when the session is not a campaign's."""
    explicit = os.environ.get("ATTUNE_CAMPAIGN_DIR")
    if explicit:
        return os.path.realpath(explicit)
    d = os.path.realpath(project_dir(payload))
    while True:
        if os.path.isfile(os.path.join(d, CAMPAIGN_FILE)):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


# ---------------------------------------------------------------- the hooks' fail-closed skeleton

MAX_INPUT_CHARS = 16 * 1024 * 1024  # a hook's input (a Write's content included); more is refused


class HookRun:
    """One hook invocation: its input and campaign (once known), and what runs after the answer is written."""

    def __init__(self, event: str) -> None:
        self.event = event
        self.payload: dict[str, Any] = {}
        self.campaign: str | None = None
        self.after: Callable[[], None] | None = None  # e.g. ending a headless session once the answer is out


def run_hook(event: str, decide: Callable[[HookRun], dict[str, Any] | None],
             refuse: Callable[[HookRun, BaseException], dict[str, Any]], fail_decision: str | None = None,
             stdin: Any = None, stdout: Any = None) -> int:
    """What every attune hook does, in one place, failing closed.

    Reads the hook's input from stdin (at most MAX_INPUT_CHARS characters), finds its campaign
    (`read_event`; outside a campaign the hook prints nothing), calls `decide(run)` for
    the answer (None: print nothing). Any exception, from reading to deciding, is answered by
    `refuse(run, exc)` (a deny or a block with the reason) and, inside a campaign, logged with
    `fail_decision`. The answer is written as one JSON line; the exit status is always 0 (Claude Code
    reads the decision from the JSON, and lets a crashed hook's call through)."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    run = HookRun(event)
    out: dict[str, Any] | None
    try:
        raw = stdin.read(MAX_INPUT_CHARS + 1)
        found = read_event(raw, MAX_INPUT_CHARS)
        if found is None:  # not in a campaign, or switched off: do nothing
            return 0
        run.payload, run.campaign = found
        out = decide(run)
    except BaseException as exc:  # fail closed
        run.after = None
        out = refuse(run, exc)
        if run.campaign is not None and fail_decision is not None:
            try:  # noqa: SIM105 - no contextlib import in a hook
                log_decision(run.campaign, {"event": event, "decision": fail_decision, "error": repr(exc)})
            except BaseException:
                pass
    if out is not None:
        from hooks import hookjson

        stdout.write(hookjson.dumps(out) + "\n")
        stdout.flush()
    if run.after is not None:
        run.after()
    return 0


# ---------------------------------------------------------------- policy.yaml


def parse_policy(text: str, name: str = POLICY_FILE) -> dict[str, list[str]]:
    """policy.yaml (YAML in the core's strict subset, or a JSON object, which is YAML too): each key one of
    POLICY_KEYS, its value a string or a list of strings; raises PolicyFileError naming the line or key."""
    from attune.core import yamlsubset

    try:
        data = yamlsubset.loads(text)
    except yamlsubset.YamlSubsetError as exc:
        raise PolicyFileError(f"{name} {exc}") from None  # "policy.yaml line 3: ..."
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolicyFileError(f"{name}: expected 'key: value' lines (or a JSON object)")
    out: dict[str, list[str]] = {}
    for key, val in data.items():
        where = f"{name}: {key}"
        if key not in POLICY_KEYS:
            raise PolicyFileError(f"{where}: unknown key {key!r}; expected one of {', '.join(POLICY_KEYS)}")
        vals = [] if val is None else [val] if isinstance(val, str) else val
        if not isinstance(vals, list) or not all(isinstance(v, str) and v for v in vals):
            raise PolicyFileError(f"{where}: expected a list of non-empty strings (quote a value that reads as "
                                  "a number, a boolean or null)")
        out[key] = list(vals)
    return out


def load_policy(campaign: str) -> dict[str, list[str]]:
    path = os.path.join(campaign, POLICY_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    return parse_policy(text, path)


# ---------------------------------------------------------------- decision log


def log_decision(campaign: str, record: dict[str, Any]) -> None:
    """Append one decision to the campaign's hook log (a single O_APPEND write: no interleaving)."""
    from hooks import hookjson as json

    t = time.time()
    rec = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z", **record}
    data = (json.dumps(rec, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    fd = os.open(os.path.join(campaign, HOOK_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def clip(text: Any, limit: int = 500) -> str:
    from hooks import hookjson as json

    s = text if isinstance(text, str) else json.dumps(text, default=str)
    return s if len(s) <= limit else s[:limit] + "..."
