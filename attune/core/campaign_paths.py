"""The names of a campaign directory's files, defined once.

Standard library only. A campaign directory holds:

    campaign.yaml            the spec (frozen and hashed when the campaign starts)
    policy.yaml              the session's policy extensions (optional)
    ledger.jsonl             the append-only ledger (ledger.torn: a torn tail set aside)
    .control.lock            the control plane's lock
    runs/<run-id>/log.txt    each run's log (job.json: its resolved job; traces/: its profiler traces)
    notes/                   the agent's notes (notes/summary.md: the campaign's summary)
    shipped/                 the shipped recipe (job.json, run.sh, evidence.json)
    report.md, report.html   the campaign's report
    audit.jsonl              the broker's audit log of the campaign's requests
    hooks.log.jsonl          the hooks' decisions
    session.json             the Claude Code session id (the launcher's)
    session_end.json         why the last session ended with the campaign unfinished (the Stop hook's)
    .stop_blocks.json        the Stop hook's count of consecutive blocks
    .broker/                 the broker's endpoint.json, token, locks and log

Backends keep their own private files in a run's directory under names they define.

The names import nothing at all (pathlib is imported on the first call of a path helper), so the
hooks, which keep their start-up to the bare interpreter, can take the names from here.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers read it so)
if TYPE_CHECKING:
    from pathlib import Path

CAMPAIGN_FILE = "campaign.yaml"
POLICY_FILE = "policy.yaml"
LEDGER_FILE = "ledger.jsonl"
LEDGER_TORN_FILE = "ledger.torn"
CONTROL_LOCK = ".control.lock"
RUNS_DIR = "runs"
RUN_LOG = "log.txt"
RUN_JOB = "job.json"
RUN_TRACES_DIR = "traces"
RUN_KILL_FILE = "broker_kill.json"  # why the broker stopped a run (hang, cancelled, pruned)
NOTES_DIR = "notes"
SUMMARY_FILE = "summary.md"  # in NOTES_DIR
SHIPPED_DIR = "shipped"
SHIPPED_EVIDENCE = "evidence.json"  # in SHIPPED_DIR, beside RUN_JOB and run.sh
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
AUDIT_FILE = "audit.jsonl"
HOOKS_LOG = "hooks.log.jsonl"
SESSION_FILE = "session.json"
BROKER_DIR = ".broker"
BROKER_TOKEN = "token"  # in BROKER_DIR
BROKER_ENDPOINT = "endpoint.json"  # in BROKER_DIR
BROKER_SERVE_LOCK = "serve.lock"  # in BROKER_DIR
BROKER_START_LOCK = "start.lock"  # in BROKER_DIR
BROKER_LOG = "broker.log"  # in BROKER_DIR
STOP_BLOCKS_FILE = ".stop_blocks.json"  # the Stop hook's count of consecutive blocks in the session
SESSION_END_FILE = "session_end.json"  # why the last agent session ended without finishing the campaign

# The campaign files no tool may write (the PreToolUse hook's policy and the sandbox's settings).
PROTECTED_IN_CAMPAIGN = (
    CAMPAIGN_FILE, POLICY_FILE, LEDGER_FILE, LEDGER_TORN_FILE, HOOKS_LOG, AUDIT_FILE, RUNS_DIR, SHIPPED_DIR,
    BROKER_DIR,  # the broker's endpoint, token and state
    CONTROL_LOCK,
    SESSION_FILE,  # the launcher's record of the session it resumes
    STOP_BLOCKS_FILE,  # the Stop hook's block count: the agent must not reset it
    SESSION_END_FILE,
    ".claude",
    ".mcp.json",  # a project MCP server would run programs in the next session
    "CLAUDE.md",  # project instructions for the next session
    "CLAUDE.local.md",
)


def _dir(campaign: Path | str) -> Path:
    from pathlib import Path

    return Path(campaign)


def campaign_file(campaign: Path | str) -> Path:
    return _dir(campaign) / CAMPAIGN_FILE


def ledger_file(campaign: Path | str) -> Path:
    return _dir(campaign) / LEDGER_FILE


def runs_dir(campaign: Path | str) -> Path:
    return _dir(campaign) / RUNS_DIR


def run_dir(campaign: Path | str, run_id: str) -> Path:
    return _dir(campaign) / RUNS_DIR / run_id


def run_log(campaign: Path | str, run_id: str) -> Path:
    return run_dir(campaign, run_id) / RUN_LOG


def run_job(campaign: Path | str, run_id: str) -> Path:
    return run_dir(campaign, run_id) / RUN_JOB


def summary_file(campaign: Path | str) -> Path:
    return _dir(campaign) / NOTES_DIR / SUMMARY_FILE


def shipped_dir(campaign: Path | str) -> Path:
    return _dir(campaign) / SHIPPED_DIR


def broker_dir(campaign: Path | str) -> Path:
    return _dir(campaign) / BROKER_DIR


def broker_token_file(campaign: Path | str) -> Path:
    return _dir(campaign) / BROKER_DIR / BROKER_TOKEN


def broker_endpoint_file(campaign: Path | str) -> Path:
    return _dir(campaign) / BROKER_DIR / BROKER_ENDPOINT
