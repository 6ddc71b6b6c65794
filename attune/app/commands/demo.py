"""`attune demo`: a whole campaign on the embedded default, start to finish.

tinygpt (examples/tinygpt) trained for real on this machine's CPUs by the local backend, from the
untuned baseline of examples/campaigns/tinygpt-local, searched by the deterministic `heuristic`
tuner through the same control plane as the agent: calibration, search, stop, the correctness gate
on the best candidates, the shipped recipe, its final re-measurement, and the report. Rerun the
same command to resume an interrupted demo.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from attune.core.campaign_paths import CAMPAIGN_FILE
from attune.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from attune.core.output import add_json_flag, emit_json
from attune.core.vocab import RECIPE_FAILURES, RunKind
from attune.tuners.registry import BUILT_IN

ROOT = Path(__file__).resolve().parents[3]
DEMO_CAMPAIGN = ROOT / "examples" / "campaigns" / "tinygpt-local" / CAMPAIGN_FILE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a whole tuning campaign on tinygpt on this machine (about 10 minutes)")
    p.add_argument("--dir", default="attune-demo", help="campaign directory to create or resume (default: ./attune-demo)")
    p.add_argument("--tuner", default="heuristic", choices=BUILT_IN,
                   help="the built-in tuner (default: heuristic)")
    p.add_argument("--max-passes", type=int, default=2, help="heuristic: passes over the levers at most")
    p.add_argument("--seed", type=int, default=0)
    add_json_flag(p)
    p.set_defaults(func=run)


class Display:
    """Progress while the campaign runs: a live panel on a terminal, plain lines otherwise."""

    def __init__(self, runner: Any, quiet: bool) -> None:
        from rich.console import Console

        self.runner = runner
        self.console = Console(stderr=True)
        self.quiet = quiet
        self.lines: list[str] = []
        self.t0 = time.monotonic()
        self.live: Any = None

    def say(self, line: str) -> None:
        self.lines.append(line)
        self.lines = self.lines[-14:]
        if self.quiet:
            return
        if self.live is None:
            # One progress line is one line of output: never hard-wrapped (a log or a pipe keeps it whole).
            self.console.print(f"[{time.monotonic() - self.t0:6.0f}s] {line}", highlight=False, markup=False,
                               soft_wrap=True)

    def render(self) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        from attune.control import shipping

        st = self.runner.watcher.state
        cal = st.calibration
        b = st.budget
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column()
        phase = shipping.status(st)["phase"] if st.name else "starting"
        if cal is None:
            phase = "calibrating"
        t.add_row("phase", f"{phase}   ({time.monotonic() - self.t0:.0f} s)")
        t.add_row("calibration", f"{len(st.calibration_values)}/{st.calibration_runs_required} baseline runs"
                  + (f"; mean {cal.mean:,.1f} tokens/s/GPU, band {cal.band:.1%}" if cal else ""))
        if b.total:
            used = b.charged
            bar = ProgressBar(total=b.total, completed=min(used, b.total), width=30)
            t.add_row("budget", f"{used:.4g} of {b.total:.4g} rank-hours (reserve {b.reserve:.3g})")
            t.add_row("", bar)
        searches = [r for r in st.runs.values() if r.kind == RunKind.SEARCH]
        failed = sum(1 for r in searches if r.outcome in RECIPE_FAILURES)
        t.add_row("launches", f"{len(searches)} ({failed} failed)")
        g = st.leader_gain()
        t.add_row("leader", f"{st.leader_run_id or '-'}" + (f"  {g:+.1%} over the baseline" if g is not None else ""))
        if st.shipped:
            t.add_row("shipped", str(st.shipped.get("run_id")))
        return Panel(Group(t, Text(""), Text("\n".join(self.lines))), title="attune demo: tinygpt on the local backend")

    def __enter__(self) -> Display:
        if not self.quiet and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(get_renderable=self.render, console=self.console, refresh_per_second=2)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None


def prepare(d: Path) -> None:
    if not DEMO_CAMPAIGN.is_file():
        raise FileNotFoundError(f"the demo campaign {DEMO_CAMPAIGN} is missing (run attune demo from a checkout)")
    d.mkdir(parents=True, exist_ok=True)
    target = d / CAMPAIGN_FILE
    if target.exists():
        if target.read_bytes() != DEMO_CAMPAIGN.read_bytes():
            raise FileExistsError(f"{target} is not the demo campaign; choose another --dir")
        return
    shutil.copyfile(DEMO_CAMPAIGN, target)


def run(args: argparse.Namespace) -> int:
    from attune.app import report
    from attune.app.campaign_runner import CampaignRunner, RunnerError

    d = Path(args.dir).resolve()
    try:
        prepare(d)
    except (FileNotFoundError, FileExistsError) as exc:
        print(f"attune demo: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    runner = CampaignRunner(d, args.tuner, seed=args.seed, max_passes=args.max_passes, say=None)
    with Display(runner, quiet=args.json) as display:
        runner.say = display.say
        display.say(f"campaign directory: {d}")
        from broker.client import stops_the_broker_it_starts

        try:
            with stops_the_broker_it_starts(d):
                result = runner.run()
        except RunnerError as exc:
            display.say(f"failed: {exc}")
            print(f"attune demo: {exc}", file=sys.stderr)
            return EXIT_FAILED
        except KeyboardInterrupt:
            print("attune demo: interrupted; rerun the same command to resume", file=sys.stderr)
            return 130
    r = report.build(d)
    if args.json:
        emit_json({**result.as_dict(), "baseline_shipped": r.headline.shipped_run_id == "baseline"})
        return EXIT_OK
    print()
    for k, v in report.headline_lines(r):
        print(f"{k:>24}: {v}")
    if r.headline.shipped_run_id == "baseline":
        print("\nNothing beat the baseline by more than the band: the baseline ships, unchanged.")
    else:
        ch = (r.shipped or {}).get("changes") or {}
        parts = [f"{k}={'unset' if v is None else v}" for k, v in (ch.get("args") or {}).items()] + [
            f"{k}={'unset' if v is None else v}" for k, v in (ch.get("env") or {}).items()]
        print(f"\nShipped {r.headline.shipped_run_id}: {', '.join(parts)} (passed the correctness gate)")
    print(f"campaign took {result.seconds / 60:.1f} minutes")
    print(f"shipped recipe: {d / 'shipped' / 'run.sh'}")
    print(f"report: {result.report_html}")
    return EXIT_OK
