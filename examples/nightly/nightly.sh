#!/bin/sh
# attune nightly: tune tonight's campaign, or resume last night's if it did not finish.
#
#   ATTUNE=/opt/attune/.venv/bin/attune TEMPLATE=/data/campaigns/llama/campaign.yaml \
#   CAMPAIGNS=/data/campaigns/llama/nightly TUNER=claude sh nightly.sh
#
# Each night gets its own campaign directory (a campaign's spec is frozen once it starts).
# An unfinished campaign (no shipped recipe and re-measurement yet) is resumed first: the same
# `attune tune` command carries on from its ledger. A lock keeps two nights from overlapping.
# A night whose campaign ends failed exits non-zero with the reason on stderr.
set -eu
ATTUNE="${ATTUNE:-attune}"
TUNER="${TUNER:-claude}"
: "${TEMPLATE:?set TEMPLATE to the campaign.yaml to tune every night}"
: "${CAMPAIGNS:?set CAMPAIGNS to the directory that holds one campaign per night}"
mkdir -p "$CAMPAIGNS"
exec 9>"$CAMPAIGNS/.nightly.lock"
if ! flock -n 9; then
    echo "attune nightly: another run holds $CAMPAIGNS/.nightly.lock; nothing to do" >&2
    exit 0
fi
# The newest campaign that is not done yet, else a new one for tonight.
target=""
for d in $(ls -1d "$CAMPAIGNS"/20* 2>/dev/null | sort -r); do
    if [ -f "$d/ledger.jsonl" ] && [ ! -f "$d/report.html" ]; then
        target="$d"
        break
    fi
done
if [ -z "$target" ]; then
    target="$CAMPAIGNS/$(date +%Y-%m-%d)"
    mkdir -p "$target"
    [ -f "$target/campaign.yaml" ] || cp "$TEMPLATE" "$target/campaign.yaml"
fi
echo "attune nightly: $(date -Is) tuning $target with $TUNER" >&2
rc=0
"$ATTUNE" tune "$target/campaign.yaml" --tuner "$TUNER" --json > "$target/tune.json" || rc=$?
if [ "$rc" -ne 0 ]; then
    # A failed campaign (no valid calibration, every re-measurement failed) is final: report it and
    # exit non-zero so the scheduler marks the night failed. Its report.html says why.
    echo "attune nightly: $(date -Is) FAILED (attune tune exit $rc): $target" >&2
    echo "attune nightly: $(head -c 600 "$target/tune.json" 2>/dev/null)" >&2
    exit "$rc"
fi
echo "attune nightly: $(date -Is) done: $(cat "$target/tune.json" | head -c 400)" >&2
