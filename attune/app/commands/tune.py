"""`attune tune campaign.yaml --tuner claude|heuristic|tpe|tpe-prefilter|random`: a whole campaign.

Starts (or resumes) the campaign in the directory holding campaign.yaml: calibration, the search
(a built-in tuner, or headless Claude Code with the plugin), the stop, shipping, the report. Rerun
the same command after any interruption: it carries on from the ledger. Exit 0 only when a recipe
shipped with valid measurements; 1 when the campaign ended failed (no valid calibration, every
re-measurement of a recipe failed) or could not finish, with the reason on stderr; 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from attune.core.campaign_paths import CAMPAIGN_FILE
from attune.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from attune.core.output import add_json_flag, emit_json
from attune.tuners.registry import TRANSPORTS, TUNE_CHOICES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="run (or resume) a whole campaign: calibrate, search, ship, report")
    p.add_argument("campaign", help="campaign.yaml (or the campaign directory holding it)")
    p.add_argument("--tuner", default="claude",
                   choices=TUNE_CHOICES,
                   help="who searches: headless Claude Code with the plugin (default) or a built-in tuner")
    p.add_argument("--seed", type=int, default=0, help="the built-in tuner's seed")
    p.add_argument("--max-passes", type=int, default=3, help="heuristic: passes over the levers at most")
    p.add_argument("--claude", default=os.environ.get("ATTUNE_CLAUDE", "claude"),
                   help="the Claude Code CLI (default: $ATTUNE_CLAUDE or claude on PATH)")
    p.add_argument("--claude-args", default="", help="extra arguments for claude, one shell-quoted string")
    p.add_argument("--max-attempts", type=int, default=20, help="claude: sessions (start + resumes) at most")
    p.add_argument("--transport", default="auto", choices=TRANSPORTS,
                   help="how to reach the broker: auto (in this process for a built-in tuner on a simulated "
                        "cluster with budget.concurrency 1, else HTTP), http, or in-process")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_json_flag(p)
    p.set_defaults(func=run)


def campaign_dir(path: str) -> Path:
    p = Path(path)
    d = p if p.is_dir() else p.parent
    if not (d / CAMPAIGN_FILE).is_file():
        raise FileNotFoundError(f"no campaign.yaml at {p}")
    if p.is_file() and p.name != CAMPAIGN_FILE:
        raise FileNotFoundError(f"{p}: the campaign file must be named campaign.yaml (its directory is the campaign)")
    return d


def _fail(args: argparse.Namespace, code: int, message: str) -> int:
    """The command ends without a result: the reason on stderr, and under --json as the document too."""
    if getattr(args, "json", False):
        emit_json({"outcome": "failed" if code == EXIT_FAILED else "usage", "failed": message, "exit_code": code})
    print(f"attune tune: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from attune.app.campaign_runner import CampaignRunner, RunnerError
    from attune.control.campaign import CampaignError
    from attune.control.spec import SpecError
    from attune.tuners.factory import TunerSetupError

    try:
        d = campaign_dir(args.campaign)
    except FileNotFoundError as exc:
        return _fail(args, EXIT_USAGE, f"error: {exc}")
    runner = CampaignRunner(d, args.tuner, seed=args.seed, max_passes=args.max_passes, claude=args.claude,
                            claude_args=shlex.split(args.claude_args), max_attempts=args.max_attempts,
                            transport=args.transport,
                            say=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)))
    from broker.client import BrokerUnavailable, stops_the_broker_it_starts

    try:
        with stops_the_broker_it_starts(d):  # never leave behind a broker this command started
            result = runner.run()
    except (SpecError, CampaignError, TunerSetupError) as exc:
        return _fail(args, EXIT_USAGE, f"error: {exc}")
    except (RunnerError, BrokerUnavailable) as exc:
        return _fail(args, EXIT_FAILED, str(exc))
    except KeyboardInterrupt:
        print("attune tune: interrupted; rerun the same command to resume from the ledger", file=sys.stderr)
        return 130
    if args.json:
        emit_json(result.as_dict())
    else:
        from attune.app import report

        for k, v in report.headline_lines(report.build(d)):
            print(f"{k:>24}: {v}")
        print(f"report: {result.report_html}")
    if result.failed:
        print(f"attune tune: the campaign FAILED: {result.failed}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
