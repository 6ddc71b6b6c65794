#!/usr/bin/env python3
"""attune's Stop hook: a campaign session ends only when the campaign is done.

Claude Code overrides a Stop hook after a cap of consecutive blocks (`CLAUDE_CODE_STOP_HOOK_BLOCK_CAP`,
8 by default) and would end a headless run with success. The hook counts its blocks
(`attune.core.session_end`); at the one Claude Code will override, it records why the session ended
(`session_end.json`, and the hook log) and fails the run like a failed campaign (below).

Inside a campaign directory it folds the ledger and blocks the stop while anything in
`CampaignState.stop_blockers()` is open: the budget is not spent and no stop with evidence is
recorded (with the codes and missing items of the last stop the search rules refused), runs are
still in flight, or the shipping step has not run. The block's reason lists exactly what is
missing, each item with its code; the hint is chosen by code, never by matching the prose. Outside
a campaign it does nothing. Any error blocks too (fail closed); Claude Code itself ends a session
after several consecutive blocks (`attune tune` raises that cap).

A campaign that ended failed (no valid evidence: a `campaign_failed` ledger row, which the control
plane also writes when a workload environment only a person can fix refuses calibration), or a plugin whose
Python environment could not be built (nothing can run), lets the session end, but as a failure: the
hook says FAILED and why (`systemMessage`), and in a headless session (`claude -p`), where Claude
Code offers a hook no other way to fail the run, it writes the reason to that process's stderr and
ends it with SIGTERM, so the run exits non-zero instead of reporting success on nothing.
"""

import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
EVENT = "Stop"


RULE_HINTS = {  # the search rules' stop refusals (attune.control.search_rules), by code
    "calibration_incomplete": "finish the baseline's calibration runs (campaign_status shows how many are missing)",
    "levers_not_run": "name in record_stop's levers_tested only levers that a finished search run changed",
    "rule4_lever_values": "try a second value of each listed lever (or its feasible limit) before ruling it out",
    "rule4_layout_unprobed": "probe each listed parallel degree (layouts.py lists the feasible values)",
    "rule5_oom_not_retried": "retry each listed out-of-memory layout with the memory savings added back "
                             "(full recompute first)",
    "rule6_winners_not_retested": "re-test the listed flags that won on earlier layouts on the final layout",
}


def _hint(codes):
    steps = []
    if "not_started" in codes:
        steps.append("start the campaign with the broker's start_campaign tool (it validates campaign.yaml, "
                     "freezes it and writes the first ledger row; a bad spec comes back field by field)")
    rules = [RULE_HINTS[c] for c in codes if c in RULE_HINTS]
    if "no_stop" in codes:
        if rules:
            steps.append("the search rules refused the last stop, so keep searching: " + "; ".join(rules)
                         + "; then record the stop again")
        else:
            steps.append("keep searching through the broker's tools, or, if the search is done, record a stop "
                         "with evidence (the broker's record_stop: the levers tested and the last diagnosis)")
    if "in_flight" in codes:
        steps.append("wait for the runs in flight to finish (run_status), or cancel_run search runs that no longer "
                     "matter (check and re-measurement runs are the control plane's: wait for them)")
    if "not_shipped" in codes:
        steps.append("wait for the shipping step, which the control plane runs after the stop (the gate checks the "
                     "best candidates, fastest first, and one ships; campaign_status shows its progress)")
    return "; ".join(steps)


def _provisioning_failure():
    """The plugin's own environment could not be built (recorded by mcp_servers/launch.py), or None."""
    if os.environ.get("ATTUNE_PYTHON"):  # the servers run on that interpreter: no environment is built
        return None
    try:
        from mcp_servers import launch

        failed = launch.recorded_failure()
    except Exception:
        return None
    if not failed:
        return None
    return ("attune's MCP servers could not start: building their Python environment failed at "
            f"{failed.get('step')}: {failed.get('detail')}" + (f" (log {failed['log']})" if failed.get("log") else "")
            + ". " + str(failed.get("fix") or ""))


def _fail_headless_session(message):
    """In `claude -p`, end the run non-zero with `message` on its stderr (Linux /proc); else nothing."""
    import contextlib
    import signal

    pid = os.getpid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        except (OSError, ValueError, IndexError):
            return
        if pid <= 1:
            return
        names = [os.path.basename(a) for a in argv[:2]]
        if any(n.startswith("claude") for n in names) and ("-p" in argv or "--print" in argv):
            try:
                with open(f"/proc/{pid}/fd/2", "w", encoding="utf-8") as err:
                    err.write(message + "\n")
            except OSError:
                pass
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
            return


def _decide(run):
    from attune.core import session_end, state
    from hooks import runtime

    payload, campaign = run.payload, run.campaign
    st, _ = state.load(campaign)
    blockers = st.stop_blockers()
    missing = [f"[{b['code']}] " + b["message"] + (": " + "; ".join(b["items"]) if b["items"] else "")
               for b in blockers]
    codes = [b["code"] for b in blockers]
    record = {"event": EVENT, "session_id": payload.get("session_id"),
              "stop_hook_active": payload.get("stop_hook_active")}
    failure = None
    if st.failed is not None:
        failure = f"the campaign {st.name!r} FAILED: {st.failed.get('reason')}"
    elif st.name is None:
        failure = _provisioning_failure()
    if failure is not None:
        runtime.log_decision(campaign, {**record, "decision": "allow", "outcome": "failed", "reason": failure})
        run.after = lambda: _fail_headless_session(f"attune: {failure}")
        return {"systemMessage": f"attune: {failure}"}
    if not missing:
        session_end.reset_blocks(campaign)
        session_end.clear(campaign)
        runtime.log_decision(campaign, {**record, "decision": "allow", "reason": "campaign complete"})
        return None
    reason = ("attune: the campaign is not finished, so this session may not end yet. Missing: "
              + "; ".join(missing) + ". Next: " + _hint(codes) + ".")
    blocks = session_end.count_block(campaign, payload.get("session_id"), bool(payload.get("stop_hook_active")))
    cap = session_end.block_cap()
    if cap > 0 and blocks > cap:
        # Claude Code overrides this block and ends the session: say why, and end a headless run non-zero.
        why = (f"the session ended unfinished: the agent ended its turn {blocks} times in a row while the campaign "
               f"{st.name or '(not started)'!r} was not finished (Claude Code's cap of {cap} consecutive Stop-hook "
               f"blocks, {session_end.CAP_ENV}). Missing: " + "; ".join(missing))
        session_end.record(campaign, why, payload.get("session_id"), blocks)
        runtime.log_decision(campaign, {**record, "decision": "allow", "outcome": "failed", "reason": why,
                                        "codes": codes, "blocks": blocks})
        run.after = lambda: _fail_headless_session(f"attune: {why}")
        return {"systemMessage": f"attune: FAILED: {why}"}
    runtime.log_decision(campaign, {**record, "decision": "block", "reason": reason, "codes": codes,
                                    "blocks": blocks})
    return {"decision": "block", "reason": reason}


def _refuse(run, exc):  # fail closed
    reason = (f"attune's Stop hook could not check the campaign ({type(exc).__name__}: {exc}); "
              "the session continues until the campaign state can be read")
    try:  # these blocks count toward Claude Code's cap too: at the last one the run fails, saying why
        from attune.core import session_end

        payload = run.payload or {}
        if run.campaign is not None:
            blocks = session_end.count_block(run.campaign, payload.get("session_id"),
                                             bool(payload.get("stop_hook_active")))
            cap = session_end.block_cap()
            if cap > 0 and blocks > cap:
                why = f"the session ended unfinished: {reason}"
                session_end.record(run.campaign, why, payload.get("session_id"), blocks)
                run.after = lambda: _fail_headless_session(f"attune: {why}")
                return {"systemMessage": f"attune: FAILED: {why}"}
    except Exception:
        pass
    return {"decision": "block", "reason": reason}


def main():
    if HERE in sys.path:
        sys.path.remove(HERE)
    sys.path.insert(0, ROOT)
    try:
        from hooks import runtime
    except BaseException as exc:  # fail closed even when the skeleton cannot be imported
        name = type(exc).__name__  # an identifier: safe inside a JSON string
        sys.stdout.write('{"decision": "block", "reason": "attune\'s Stop hook could not start (' + name + ')"}\n')
        return 0
    return runtime.run_hook(EVENT, _decide, _refuse, fail_decision="block")


if __name__ == "__main__":
    sys.exit(main())
