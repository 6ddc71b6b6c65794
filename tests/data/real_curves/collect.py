"""Collect real loss curves from Megatron-LM's functional tests (golden values) into curves.json.

Megatron-LM keeps, for each functional test case, the `lm loss` per step its CI measured on each
machine type (`tests/functional_tests/test_cases/<family>/<case>/golden_values_<env>.json`) next to
the case's arguments (`model_config.yaml`). These are real GPU runs made by others. From them:

- **environment** curves: one case measured on two machine types (same model, same recipe);
- **layout** pairs: two cases whose arguments differ only in arguments the `megatron` correctness
  list classifies as structural (parallel layout, overlap, recompute), measured on the same
  machine type: same objective;
- **objective** pairs: two cases whose arguments differ in at least one argument that certainly
  changes the loss (`OBJECTIVE_CORE`: model shape, learning rate and schedule, batch, data, seed)
  and in nothing the list does not classify (same machine type), or two cases of different model
  families (GPT, BERT, T5, ...): a different objective.

Run-control arguments (logging, checkpoints, evaluation cadence) are ignored; cases that resume
from a checkpoint, and pairs that differ in an unclassified argument or in the microbatch size
(whose effect on the loss depends on the loss reduction), are left out.

Usage (needs a local clone; the tests read only curves.json):
    python tests/data/real_curves/collect.py /path/to/Megatron-LM [--commit SHA]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = "tests/functional_tests/test_cases"
FAMILIES = ("gpt", "moe", "bert", "t5", "mixtral", "hybrid")
RUN_CONTROL_PREFIXES = ("log", "save", "load", "tensorboard", "ckpt", "dist-ckpt", "eval", "exit", "timing",
                        "wandb", "async-save", "use-persistent-ckpt-worker", "data-cache-path",
                        "use-checkpoint-args", "no-load", "non-persistent", "test-mode", "profile",
                        "record-memory", "check-weight-hash", "straggler", "rerun", "result-rejected",
                        "inprocess", "enable-ft", "heartbeat", "num-workers", "no-mmap-bin-files",
                        "use-tp-pp-dp-mapping", "manual-gc", "deterministic-mode", "train-iters")
SKIP_IN_NAME = ("resume", "frozen", "reruns", "inference", "release", "memory_speed", "ckpt", "export")
MAX_STEPS = 100
# Numeric arguments whose change certainly changes the loss curve (model shape, optimisation, data).
# The list classifies more arguments numeric (loss reductions such as --calculate-per-token-loss,
# test switches) whose effect can be nil on a given model; a pair differing only in those is left out.
OBJECTIVE_CORE = {"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "swiglu",
                  "untie_embeddings_and_output_weights", "seq_length", "max_position_embeddings", "lr", "min_lr",
                  "lr_decay_style", "lr_warmup_fraction", "lr_warmup_iters", "global_batch_size", "data_path",
                  "vocab_file", "tokenizer_type", "num_experts", "moe_router_topk", "init_method_std",
                  "position_embedding_type", "normalization", "seed", "qk_layernorm", "num_query_groups",
                  "group_query_attention", "kv_channels", "moe_ffn_hidden_size", "apply_layernorm_1p",
                  "vocab_size", "split", "mock_data"}
MAX_PAIRS = 40  # per kind, chosen deterministically (sorted by case names)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def flag_dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def load_cases(repo: Path, commit: str) -> dict[str, dict]:
    files = git(repo, "ls-tree", "-r", "--name-only", commit, ROOT).splitlines()
    by_case: dict[str, dict] = {}
    for f in files:
        parts = f.split("/")
        if len(parts) != 6 or parts[3] not in FAMILIES or any(s in parts[4] for s in SKIP_IN_NAME):
            continue
        case = f"{parts[3]}/{parts[4]}"
        entry = by_case.setdefault(case, {"config": None, "golden": {}})
        if parts[5] == "model_config.yaml":
            entry["config"] = f
        elif parts[5].startswith("golden_values_") and parts[5].endswith(".json") and "_2nd" not in parts[5]:
            env = parts[5][len("golden_values_"):-len(".json")]
            entry["golden"][env] = f
    out = {}
    for case, entry in sorted(by_case.items()):
        if not entry["config"] or not entry["golden"]:
            continue
        try:
            cfg = yaml.safe_load(git(repo, "show", f"{commit}:{entry['config']}"))
        except yaml.YAMLError:
            continue
        args = {k: v for k, v in (cfg.get("MODEL_ARGS") or {}).items()
                if not any(k.lstrip("-").startswith(p) for p in RUN_CONTROL_PREFIXES)}
        curves = {}
        for env, path in sorted(entry["golden"].items()):
            try:
                doc = json.loads(git(repo, "show", f"{commit}:{path}"))
            except (json.JSONDecodeError, subprocess.CalledProcessError):
                continue
            lm = doc.get("lm loss") if isinstance(doc, dict) else None
            vals = (lm or {}).get("values") if isinstance(lm, dict) else None
            if isinstance(vals, list):  # older files (2024): a list from start_step every step_interval
                start, every = int(lm.get("start_step") or 0), int(lm.get("step_interval") or 1)
                vals = {str(start + i * every): v for i, v in enumerate(vals)}
            if not isinstance(vals, dict):
                continue
            curve = {}
            for k, v in vals.items():
                if str(k).isdigit() and int(k) <= MAX_STEPS:
                    curve[int(k)] = v if isinstance(v, (int, float)) else None
            if len(curve) >= 5:
                curves[env] = {"path": path, "step_interval": lm.get("step_interval"),
                               "lm_loss": {str(s): curve[s] for s in sorted(curve)}}
        if curves:
            out[case] = {"config": entry["config"], "args": args, "env_vars": cfg.get("ENV_VARS") or {},
                         "curves": curves}
    return out


def classify(a: dict, b: dict, klass: dict[str, str]) -> tuple[str, list[str]]:
    """'layout', 'objective' or 'ambiguous', with the differing flags."""
    keys = sorted(k for k in set(a) | set(b) if str(a.get(k)) != str(b.get(k)))
    if not keys:
        return "identical", []
    classes = {k: klass.get(flag_dest(k), "unlisted") for k in keys}
    if any(flag_dest(k) == "micro_batch_size" for k in keys) or "unlisted" in classes.values():
        return "ambiguous", keys
    if all(c == "structural" for c in classes.values()):
        return "layout", keys
    if any(flag_dest(k) in OBJECTIVE_CORE for k in keys):
        return "objective", keys
    return "ambiguous", keys


def _spread(rows: list[dict], n: int = MAX_PAIRS) -> list[dict]:
    """At most n rows, evenly spaced over the sorted list, each baseline case used at most 3 times."""
    used: dict[str, int] = {}
    picked = []
    for r in rows:
        if used.get(r["baseline"], 0) < 3:
            picked.append(r)
            used[r["baseline"]] = used.get(r["baseline"], 0) + 1
    if len(picked) <= n:
        return picked
    step = len(picked) / n
    return [picked[int(i * step)] for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", type=Path, default=HERE, help="folder for curves.json and PROVENANCE.md")
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE.parents[2]))
    from gate.lists import load_list

    commit = git(ns.repo, "rev-parse", ns.commit).strip()
    cases = load_cases(ns.repo, commit)
    klass = {k: e.klass for k, e in load_list("megatron").clist.args.items()}
    layout, objective = [], []
    names = sorted(cases)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            fa, fb = a.split("/")[0], b.split("/")[0]
            if {fa, fb} <= {"gpt", "moe", "mixtral"} or fa == fb:
                kind, diff = classify(cases[a]["args"], cases[b]["args"], klass)
            else:  # different model families (GPT against BERT or T5, ...): another objective
                kind, diff = "objective", [f"model family {fa} vs {fb}"]
            if kind not in ("layout", "objective"):
                continue
            if a.split("/")[0] != b.split("/")[0] and kind == "layout":
                continue
            # one machine type per pair: one on which the baseline case was also measured elsewhere
            # (its other machine types give the noise envelope)
            envs = [e for e in sorted(set(cases[a]["curves"]) & set(cases[b]["curves"]))
                    if len(cases[a]["curves"]) > 1]
            if not envs or (kind == "objective" and len(diff) > 4 and a.split("/")[0] == b.split("/")[0]):
                continue
            row = {"baseline": a, "candidate": b, "env": envs[0], "differs_in": diff}
            (layout if kind == "layout" else objective).append(row)
    layout = _spread(layout)
    cross = [r for r in objective if r["baseline"].split("/")[0] != r["candidate"].split("/")[0]]
    same = [r for r in objective if r not in cross]
    objective = _spread(same, MAX_PAIRS - 8) + _spread(cross, 8)
    keep = {c for r in layout + objective for c in (r["baseline"], r["candidate"])}
    doc = {
        "source": {"repo": "NVIDIA/Megatron-LM", "commit": commit, "root": ROOT,
                   "what": "lm loss per step (first 100 steps) from golden_values_<env>.json"},
        "cases": {c: cases[c] for c in sorted(keep)},
        "layout_pairs": layout,
        "objective_pairs": objective,
    }
    (ns.out / "curves.json").write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
    lines = ["# Provenance of curves.json", "",
             f"Repository: NVIDIA/Megatron-LM (https://github.com/NVIDIA/Megatron-LM), commit `{commit}`.",
             f"Made by `python tests/data/real_curves/collect.py <clone> --commit {commit[:12]}` (its docstring says how cases and pairs",
             "are chosen). Each curve is the `lm loss` values (steps 1-100) of one golden-values file; each",
             "case's arguments come from its `model_config.yaml`. Megatron-LM is Apache-2.0 licensed.", "",
             "| case | file |", "|---|---|"]
    for c in sorted(keep):
        lines.append(f"| {c} | `{cases[c]['config']}` |")
        for env in sorted(cases[c]["curves"]):
            lines.append(f"| {c} | `{cases[c]['curves'][env]['path']}` |")
    (ns.out / "PROVENANCE.md").write_text("\n".join(lines) + "\n")
    print(f"{len(keep)} cases, {len(layout)} layout pairs, {len(objective)} objective pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
