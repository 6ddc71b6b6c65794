"""The TTB protocol as code: the pinned workload and measurement, and the campaign template per model.

`ttb-v1` is the benchmark: rows of exactly 8,192 tokens of SFT conversations (the Tulu 3 SFT
mixture) rendered with the model's own chat template and tokenizer, global batch 128, BF16, runs
of 14 optimizer steps scored by aggregate tokens/s/GPU over steps 4-13, every row checked against
its hash, and a recipe admitted only if it passed the model's correctness gate.

`ttb-v1-local` applies the same rules at the scale of this repository's CPU example (tinygpt on two
CPU ranks): 128-token rows of the committed sample conversations, byte-level tokenizer, global batch
16, FP32. Its entries show that the pipeline works end to end; they are not comparable with
`ttb-v1` and are never ranked with it.

A campaign is a TTB campaign when its workload matches a protocol exactly and its baseline reads the
protocol's rows (`--data-path` names the protocol's data id).
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from attune.control.spec import CampaignSpec
from attune.core.campaign_paths import CAMPAIGN_FILE


class Protocol(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    seq_length: int
    global_batch: int
    precision: str
    steps_per_run: int = 14
    window: tuple[int, int] = (4, 13)
    data_id: str
    dataset: str
    comparable: bool
    description: str


TTB_V1 = Protocol(
    id="ttb-v1", seq_length=8192, global_batch=128, precision="bf16", data_id="ttb-v1-tulu3-sft",
    dataset="Tulu 3 SFT mixture (allenai/tulu-3-sft-mixture), rendered with the model's chat template",
    comparable=True,
    description="8,192-token rows of SFT conversations, global batch 128, BF16, tokens/s/GPU over steps 4-13 of 14",
)
TTB_V1_LOCAL = Protocol(
    id="ttb-v1-local", seq_length=128, global_batch=16, precision="fp32", data_id="ttb-v1-local-sft",
    dataset="attune's committed sample of SFT conversations, byte-level tokenizer",
    comparable=False,
    description="the ttb-v1 rules at CPU-example scale (128-token rows, global batch 16, FP32): a pipeline check, "
                "not comparable with ttb-v1",
)
PROTOCOLS: dict[str, Protocol] = {p.id: p for p in (TTB_V1, TTB_V1_LOCAL)}
DATA_ARGS = ("--data-path", "--train-data-path")
PUBLIC_RECIPE = "public-recipe.yaml"
# Structural changes a model's public recipe needs to run the protocol's workload at all, by model and
# accelerator: each is listed in the entry's diff from the public recipe.
FIT_CHANGES: dict[tuple[str, str], tuple[dict[str, Any], str]] = {
    ("mixtral-8x22b", "H100"): ({"--context-parallel-size": 2},
                                "context parallelism 2: the public recipe's layout runs out of memory at 8,192 tokens"),
}


def data_path(spec: CampaignSpec) -> str | None:
    for flag in DATA_ARGS:
        v = spec.baseline.args.get(flag)
        if isinstance(v, str) and v:
            return v
    return None


def problems(spec: CampaignSpec, protocol: Protocol) -> list[str]:
    """Why the campaign does not follow `protocol` (empty when it does)."""
    w = spec.workload
    out = []
    for name, got, want in (("workload.seq_length", w.seq_length, protocol.seq_length),
                            ("workload.global_batch", w.global_batch, protocol.global_batch),
                            ("workload.precision", w.precision, protocol.precision),
                            ("workload.steps_per_run", w.steps_per_run, protocol.steps_per_run),
                            ("workload.window", tuple(w.window), tuple(protocol.window))):
        if got != want:
            out.append(f"{name} is {got!r}, {protocol.id} pins {want!r}")
    dp = data_path(spec)
    if dp is None or protocol.data_id not in dp:
        out.append(f"baseline --data-path is {dp!r}: it does not read the {protocol.id} rows ({protocol.data_id})")
    return out


def match(spec: CampaignSpec) -> tuple[Protocol | None, dict[str, list[str]]]:
    """The protocol the campaign follows, or None with each protocol's problems."""
    found = {pid: problems(spec, p) for pid, p in PROTOCOLS.items()}
    for pid, probs in found.items():
        if not probs:
            return PROTOCOLS[pid], {}
    return None, found


def template(base: dict[str, Any], protocol: Protocol = TTB_V1, data: str | None = None) -> dict[str, Any]:
    """A TTB campaign from a model's campaign (a parsed campaign.yaml): the same model, cluster, recipe,
    gate and search space, with the workload, the measurement and the data pinned to the protocol."""
    out = copy.deepcopy(base)
    out["name"] = f"{base['name']}-{protocol.id}"
    wl = dict(out.get("workload") or {})
    wl.pop("tokens_per_step", None)
    wl.update(seq_length=protocol.seq_length, global_batch=protocol.global_batch, precision=protocol.precision,
              steps_per_run=protocol.steps_per_run, window=list(protocol.window))
    out["workload"] = wl
    bl = dict(out["baseline"])
    args = dict(bl.get("args") or {})
    args["--seq-length"] = protocol.seq_length
    if "--max-position-embeddings" in args:
        args["--max-position-embeddings"] = max(int(args["--max-position-embeddings"] or 0), protocol.seq_length)
    args["--global-batch-size"] = protocol.global_batch
    if protocol.precision == "bf16":
        args["--bf16"] = True
        args.pop("--fp16", None)
    for flag in DATA_ARGS:
        args.pop(flag, None)
    args["--data-path"] = data or f"{protocol.data_id}/{base['model']}"
    fit = FIT_CHANGES.get((str(base["model"]), str((base.get("cluster") or {}).get("accelerator")))) \
        if protocol.seq_length != (base.get("workload") or {}).get("seq_length") else None
    if fit:
        args.update(fit[0])
    bl["args"] = args
    out["baseline"] = bl
    out.pop("notes", None)
    out["notes"] = f"TrainingThroughputBench {protocol.id}: {protocol.description}." + (
        f" Changed to fit the workload: {fit[1]}." if fit else "")
    return out


def gate_list_for(model_list: dict[str, Any], protocol: Protocol) -> dict[str, Any]:
    """The model's correctness list with the workload pins (sequence length) set to the protocol's:
    every other entry, and so every classification of a lever, is the model's own."""
    out = copy.deepcopy(model_list)
    args = out.get("args") or {}
    seq = args.get("seq_length")
    if isinstance(seq, dict) and seq.get("class") == "frozen":
        seq["value"] = protocol.seq_length
        seq["why"] = f"pinned by the {protocol.id} protocol"
    return out


def write_campaign(base_campaign: str | Path, out_dir: str | Path, protocol: Protocol = TTB_V1,
                   data: str | None = None) -> Path:
    """Write a TTB campaign directory (campaign.yaml and its gate-list.yaml) from a model's campaign."""
    import yaml

    from gate.lists import list_path

    base_path = Path(base_campaign)
    if base_path.is_dir():
        base_path = base_path / CAMPAIGN_FILE
    base = yaml.safe_load(base_path.read_text(encoding="utf-8"))
    if not isinstance(base, dict) or "model" not in base or "baseline" not in base:
        raise ValueError(f"{base_path}: not a campaign spec (model and baseline are required)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lists = (base.get("gate") or {}).get("lists")
    if lists:
        rel = base_path.parent / lists
        src = rel if rel.is_file() else list_path(str(lists))
    else:
        src = list_path(str(base["model"]))
    glist = gate_list_for(yaml.safe_load(Path(src).read_text(encoding="utf-8")), protocol)
    list_text = (f"# {base['model']}'s correctness list with the {protocol.id} workload pins (written by attune ttb "
                 "template)\n" + yaml.safe_dump(glist, sort_keys=False))
    (out / "gate-list.yaml").write_text(list_text, encoding="utf-8")
    # The model's public recipe, as the template's source campaign: an entry's diff is taken against it.
    (out / PUBLIC_RECIPE).write_text(base_path.read_text(encoding="utf-8"), encoding="utf-8")
    spec = template(base, protocol, data)
    gate = dict(spec.get("gate") or {})
    gate.pop("list_sha256", None)
    gate["lists"] = "gate-list.yaml"
    gate["list_sha256"] = hashlib.sha256(list_text.encode("utf-8")).hexdigest()
    spec["gate"] = gate
    (out / CAMPAIGN_FILE).write_text(
        f"# A TrainingThroughputBench ({protocol.id}) campaign for {base['model']}, from {base_path.name} of "
        f"{base.get('name')} (written by attune ttb template)\n" + yaml.safe_dump(spec, sort_keys=False),
        encoding="utf-8")
    return out
