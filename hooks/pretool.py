"""attune's PreToolUse hook: the campaign's tool policy (see hooks/policy.py).

hooks/pre_tool_use.py (the script hooks.json runs) only finds the plugin root and calls `main()`
here, so that this code is read from its cached bytecode instead of being compiled on every call.

Reads the hook input (JSON) on stdin and answers with a permissionDecision on stdout. Outside a
campaign directory it prints nothing (Claude Code's own permissions apply). Inside one:
- AskUserQuestion is denied with "take the default", and each question with the default taken is
  recorded in the ledger as an `assumption_recorded` row;
- every other tool call gets allow or deny from the policy.
Every decision goes to <campaign>/hooks.log.jsonl. Any error inside a campaign, or one that keeps
the hook from telling whether this is a campaign session, answers deny: Claude Code would let a
crashed hook's call through.
"""

from hooks import lightos as os  # os without `import os` (see hooks/lightos.py)

EVENT = "PreToolUse"


def _answer(decision, reason):
    return {"hookSpecificOutput": {"hookEventName": EVENT, "permissionDecision": decision,
                                   "permissionDecisionReason": reason}}


def _pick_default(question):
    """The option a user would get by accepting the suggestion: one marked recommended, else the first."""
    options = question.get("options") if isinstance(question, dict) else None
    labels = [o.get("label") for o in options or [] if isinstance(o, dict) and isinstance(o.get("label"), str)]
    for label in labels:
        if "recommended" in label.lower() or "default" in label.lower():
            return label
    return labels[0] if labels else "the default you judge safest (no options were offered)"


def _ask_user(payload, campaign):
    import json

    from attune.core import ledger

    tool_input = payload.get("tool_input") or {}
    questions = tool_input.get("questions") if isinstance(tool_input, dict) else None
    if not isinstance(questions, list) or not questions:
        questions = [{"question": json.dumps(tool_input, default=str)[:500]}]
    taken = []
    started = os.path.isfile(os.path.join(campaign, ledger.LEDGER_NAME)) and os.path.getsize(
        os.path.join(campaign, ledger.LEDGER_NAME)) > 0
    for q in questions:
        text = q.get("question") if isinstance(q, dict) else str(q)
        text = text if isinstance(text, str) and text else json.dumps(q, default=str)[:500]
        default = _pick_default(q)
        taken.append((text, default))
        if started:
            ledger.Ledger(campaign).append("assumption_recorded", {
                "question": text, "default": default, "source": "AskUserQuestion",
                "session_id": payload.get("session_id"), "tool_use_id": payload.get("tool_use_id"),
            })
    listed = "; ".join(f"{q!r} -> {d!r}" for q, d in taken)
    where = "recorded in the ledger as assumptions" if started else "not recorded: the campaign has not started"
    reason = ("No one answers questions during a campaign: take the default and carry on. "
              f"Defaults taken ({where}): {listed}")
    return "deny", reason, listed


def _decide(run):
    payload, campaign = run.payload, run.campaign
    tool = payload.get("tool_name")
    if not isinstance(tool, str) or not tool:
        raise ValueError("the hook input has no tool_name")
    if tool == "AskUserQuestion":
        decision, reason, subject = _ask_user(payload, campaign)
    else:
        from hooks import policy

        pol = policy.Policy.for_campaign(campaign, payload.get("cwd") or None)
        d = pol.decide(tool, payload.get("tool_input"))
        decision, reason, subject = d.decision, d.reason, d.subject
    from hooks import runtime

    runtime.log_decision(campaign, {"event": EVENT, "session_id": payload.get("session_id"), "tool": tool,
                                    "decision": decision, "reason": reason, "subject": subject})
    return _answer(decision, reason)


def _refuse(run, exc):  # fail closed: a crash would let the call through
    return _answer("deny", f"attune's tool policy could not decide ({type(exc).__name__}: {exc}); denied to be safe")


def main():
    from hooks import runtime

    return runtime.run_hook(EVENT, _decide, _refuse, fail_decision="deny")
