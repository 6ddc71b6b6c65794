"""The best known recipe for a model and accelerator: a prior for a campaign's search, never a result.

Only entries that verify count. Measured ttb-v1 entries come first; simulated ones only when asked,
and then labelled. The answer says plainly that the recipe must still be measured on the campaign's
own cluster and pass its own gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attune.ttb.entry import ENTRY_FILE, EntryError, load_entry
from attune.ttb.verify import verify_entry

PRIOR_NOTE = ("a prior from TrainingThroughputBench: try it as a candidate, but it counts only after this campaign "
              "measures it on its own cluster and its gate passes it")
MAX_ENTRIES = 500


def best(entries_dir: str | Path, model: str, accelerator: str, *, include_simulated: bool = False) -> dict[str, Any]:
    root = Path(entries_dir)
    found: list[tuple[float, bool, Any, Path]] = []
    skipped: list[str] = []
    dirs = sorted(p for p in root.iterdir() if (p / ENTRY_FILE).is_file())[:MAX_ENTRIES] if root.is_dir() else []
    for d in dirs:
        try:
            e = load_entry(d)
        except EntryError as exc:
            skipped.append(str(exc))
            continue
        if e.model != model or e.hardware.accelerator.lower() != accelerator.lower():
            continue
        if e.simulated and not include_simulated:
            continue
        rep = verify_entry(d, entry=e)
        if not rep.ok:
            skipped.append(f"{e.id}: does not verify ({', '.join(i.item for i in rep.failed)})")
            continue
        found.append((e.throughput.tokens_per_s_per_gpu, not e.simulated and e.protocol == "ttb-v1", e, d))
    if not found:
        return {"found": False, "model": model, "accelerator": accelerator, "skipped": skipped,
                "reason": f"no verified TTB entry for {model} on {accelerator}"
                          + ("" if include_simulated else " (simulated entries not included)")}
    found.sort(key=lambda x: (x[1], x[0]), reverse=True)  # measured ttb-v1 first, then fastest
    _, _, e, d = found[0]
    return {
        "found": True, "model": model, "accelerator": accelerator, "note": PRIOR_NOTE, "skipped": skipped,
        "entry": {
            "id": e.id, "protocol": e.protocol, "simulated": e.simulated, "label": e.label,
            "gpus": e.hardware.gpus, "gpus_per_node": e.hardware.gpus_per_node,
            "tokens_per_s_per_gpu": e.throughput.tokens_per_s_per_gpu, "band": e.throughput.band,
            "usd_per_million_tokens": e.cost.usd_per_million_tokens, "framework": e.software.framework,
            "changes_from_campaign_baseline": e.recipe.changes_from_campaign_baseline,
            "diff_from_public_recipe": e.recipe.diff_from_public_recipe, "args": e.recipe.args, "env": e.recipe.env,
            "recipe_script": str(d / e.recipe.script),
        },
    }
