"""The campaign summary: `notes/summary.md`, written at the end of a campaign and read by the next one.

The agent writes it (notes/ is the only place its tools may write); when a campaign ends without one
(a built-in tuner, or an agent that did not write it), `write_summary` writes one from the ledger:
the outcome, the leaders in order, the runs that lost or failed and why, each recorded diagnosis,
and the levers of the search space that no run changed.

Its first lines are `key: value` facts (model, framework, accelerator, GPUs) so that the SessionStart
hook, which may import only the standard library, can match a summary to a new campaign on the
same model or stack without a YAML parser (hooks/session_start.py, `prior_summaries`). A configured
history directory (`ATTUNE_HISTORY_DIR`) also receives a copy, `<campaign name>.md`.
"""

from __future__ import annotations

import os
from pathlib import Path

from attune.control.spec import CampaignSpec, load_spec
from attune.core.campaign_paths import CAMPAIGN_FILE, NOTES_DIR, SUMMARY_FILE
from attune.core.state import CampaignState, RunState, load
from attune.core.vocab import RunKind, RunOutcome, Verdict

SUMMARY = Path(NOTES_DIR) / SUMMARY_FILE
HISTORY_ENV = "ATTUNE_HISTORY_DIR"


def _changes(ch: dict[str, object] | None) -> str:
    parts = [f"{k}={'unset' if v is None else v}" for k, v in ((ch or {}).get("args") or {}).items()]  # type: ignore[union-attr]
    parts += [f"{k}={'unset' if v is None else v}" for k, v in ((ch or {}).get("env") or {}).items()]  # type: ignore[union-attr]
    return ", ".join(parts) or "the baseline"


def _outcome_lines(st: CampaignState) -> list[str]:
    """The baseline, what shipped and the leader at the stop."""
    cal = st.calibration
    shipped = (st.shipped or {}).get("run_id")
    gain = st.leader_gain()
    lines = [f"- Baseline: {cal.mean:,.1f} tokens/s/GPU (band {cal.band:.2%})" if cal else
             "- Baseline: not calibrated"]
    lines.append(f"- Shipped: {shipped or 'nothing'}"
                 + (f" ({_changes(st.runs[shipped].changes)})" if shipped in st.runs else ""))
    if gain is not None:
        lines.append(f"- Leader at the stop: {st.leader_run_id}, {gain:+.1%} over the baseline during the search")
    return lines


def _loser_line(r: RunState) -> str:
    why = r.outcome if r.outcome != RunOutcome.OK else (r.verdict or "measured")
    reason = " ".join(str(r.reason or "").split())[:160] if r.outcome != RunOutcome.OK else ""
    return f"- {r.run_id}: {_changes(r.changes)} -> {why}" + (f" ({reason})" if reason else "")


def _diagnosis_lines(st: CampaignState) -> list[str]:
    if not st.diagnoses:
        return []
    return ["", "## Diagnoses", ""] + [
        f"- {rid}: " + (f"{d.get('bottleneck')}: " if d.get("bottleneck") else "")
        + " ".join(str(d.get("text")).split())[:400] for rid, d in st.diagnoses.items()]


def _untried(spec: CampaignSpec, search: list[RunState]) -> list[str]:
    """The search space's levers that no finished search run changed."""
    changed = {k for r in search for k in list(r.changes.get("args") or {}) + list(r.changes.get("env") or {})}
    return [k for k in (spec.search_space or {}) if k not in changed]


def render(spec: CampaignSpec, st: CampaignState) -> str:
    lines = [
        f"# Campaign summary: {spec.name}",
        "",
        f"model: {spec.model}",
        f"framework: {spec.framework}",
        f"accelerator: {spec.cluster.accelerator}",
        f"gpus: {spec.cluster.gpus}",
        "",
    ]
    lines += _outcome_lines(st)
    search = [r for r in st.runs.values() if r.kind == RunKind.SEARCH and r.status == "finished"]
    winners = [r for r in search if r.verdict == Verdict.LEADER]
    lines += ["", "## Winners (in order)", ""]
    lines += [f"- {r.run_id}: {_changes(r.changes)} -> {r.tokens_per_s_per_gpu:,.1f} tokens/s/GPU"
              for r in winners if r.tokens_per_s_per_gpu] or ["- none beat the baseline by more than the band"]
    lines += ["", "## Losers and failures", ""]
    lines += [_loser_line(r) for r in search if r.verdict != Verdict.LEADER]
    lines += _diagnosis_lines(st)
    untried = _untried(spec, search)
    lines += ["", "## Levers left untried", ""] + ([f"- {k}" for k in untried] or ["- none of the search space"])
    if st.stop:
        lines += ["", "## Stop", "", f"- {' '.join(str(st.stop.get('diagnosis')).split())[:600]}"]
    return "\n".join(lines) + "\n"


def write_summary(campaign_dir: Path | str, *, overwrite: bool = False) -> Path:
    """notes/summary.md from the ledger, unless the agent wrote one (then it is kept); copied to the history dir."""
    d = Path(campaign_dir)
    path = d / SUMMARY
    spec = load_spec(d / CAMPAIGN_FILE)
    if overwrite or not path.exists():
        st, _ = load(d)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(render(spec, st), encoding="utf-8")
        tmp.replace(path)
    history = os.environ.get(HISTORY_ENV)
    if history:
        hdir = Path(history)
        hdir.mkdir(parents=True, exist_ok=True)
        text = path.read_text(encoding="utf-8")
        if not text.lstrip().startswith("# Campaign summary") or f"model: {spec.model}" not in text:
            text = f"model: {spec.model}\nframework: {spec.framework}\naccelerator: {spec.cluster.accelerator}\n\n" + text
        (hdir / f"{spec.name}.md").write_text(text, encoding="utf-8")
    return path
