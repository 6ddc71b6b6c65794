#!/usr/bin/env python3
"""attune's Stop hook: a campaign session ends only when the campaign is done.

Inside a campaign directory it folds the ledger and blocks the stop while anything in
`CampaignState.missing_for_stop()` is open: the budget is not spent and no stop with evidence is
recorded, runs are still in flight, or the shipping step has not run. The block's reason lists
exactly what is missing. Outside a campaign it does nothing. Any error blocks too (fail closed);
Claude Code itself ends a session after several consecutive blocks.
"""

import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
EVENT = "Stop"


def _hint(missing):
    steps = []
    text = " ".join(missing)
    if "not started" in text:
        steps.append("start the campaign (attune init, or the broker's start tool)")
    if "budget is not spent" in text:
        steps.append("keep searching through the broker's tools, or, if the search is done, record a stop "
                     "with evidence (the broker's record_stop: the levers tested and the last diagnosis)")
    if "in flight" in text:
        steps.append("wait for the runs in flight to finish (run_status), or cancel_run search runs that no longer "
                     "matter (check and re-measurement runs are the control plane's: wait for them)")
    if "shipping step" in text:
        steps.append("wait for the shipping step, which the control plane runs after the stop (the gate checks the "
                     "best candidates, fastest first, and one ships; campaign_status shows its progress)")
    return "; ".join(steps)


def main():
    raw = sys.stdin.read()
    campaign = None
    try:
        if HERE in sys.path:
            sys.path.remove(HERE)
        sys.path.insert(0, ROOT)
        from hooks import runtime

        event = runtime.read_event(raw)
        if event is None:  # not in a campaign, or switched off: do nothing
            return 0
        payload, campaign = event
        from attune import state

        st, _ = state.load(campaign)
        missing = st.missing_for_stop()
        record = {"event": EVENT, "session_id": payload.get("session_id"),
                  "stop_hook_active": payload.get("stop_hook_active")}
        if not missing:
            runtime.log_decision(campaign, {**record, "decision": "allow", "reason": "campaign complete"})
            return 0
        reason = ("attune: the campaign is not finished, so this session may not end yet. Missing: "
                  + "; ".join(missing) + ". Next: " + _hint(missing) + ".")
        runtime.log_decision(campaign, {**record, "decision": "block", "reason": reason})
        out = {"decision": "block", "reason": reason}
    except BaseException as exc:  # fail closed
        out = {"decision": "block",
               "reason": f"attune's Stop hook could not check the campaign ({type(exc).__name__}: {exc}); "
                         "the session continues until the campaign state can be read"}
        if campaign is not None:
            try:
                from hooks import runtime

                runtime.log_decision(campaign, {"event": EVENT, "decision": "block", "error": repr(exc)})
            except BaseException:
                pass
    import json

    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
