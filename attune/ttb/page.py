"""`attune ttb build ENTRIES --out DIR`: the leaderboard as a static, self-contained page and a JSON index.

Entries are verified first (`verify.verify_entry`); an entry that does not verify is listed under
"not verified" with its failing items and never ranked. Verified entries are ranked on separate
boards, one per protocol and kind (measured, or "simulated, not a measurement"), so a simulated
entry never stands in the same ranking as a measured one. On each board the fastest entry per model
and accelerator leads; the others are its history (superseded, or never the fastest).

`OUT/index.json`, `OUT/index.html` (inline CSS and JS, no network), and `OUT/entries/<id>/` (a copy
of each entry: the recipe script and the evidence the rows link to).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from attune.ttb.entry import SIM_LABEL, Entry, PriceTable, load_entry, usd_per_million
from attune.ttb.verify import EntryReport, copy_listed, verify_entry

INDEX_SCHEMA = "ttb-index-v1"


@dataclass
class Listed:
    entry: Entry
    path: Path
    report: EntryReport


def board_of(e: Entry) -> str:
    return f"{e.protocol}{' (simulated)' if e.simulated else ''}"


def summarize(e: Entry, prices: PriceTable) -> dict[str, Any]:
    price = prices.per_gpu_hour.get(e.hardware.accelerator)
    return {
        "id": e.id, "board": board_of(e), "protocol": e.protocol, "simulated": e.simulated, "label": e.label,
        "model": e.model, "accelerator": e.hardware.accelerator, "gpus": e.hardware.gpus, "nodes": e.hardware.nodes,
        "framework": e.software.framework, "framework_version": e.software.framework_version,
        "image": e.software.image, "tokens_per_s_per_gpu": e.throughput.tokens_per_s_per_gpu,
        "band": e.throughput.band, "gain": e.throughput.gain, "mfu": e.throughput.mfu,
        "price_per_gpu_hour": price, "usd_per_million_tokens": usd_per_million(e.throughput.tokens_per_s_per_gpu, price),
        "changes": e.recipe.diff_from_public_recipe, "public_recipe": e.recipe.public_recipe,
        "gate_passed": e.gate.passed, "shipped_baseline": e.gate.shipped_baseline,
        "submitted": e.submitted, "campaign": e.campaign,
        "recipe": f"entries/{e.id}/{e.recipe.script}", "evidence": f"entries/{e.id}/entry.json",
    }


def rank(listed: list[Listed]) -> tuple[list[Listed], list[tuple[Listed, str]]]:
    """The leaders (fastest verified per board, model, accelerator) and the history with why each is not."""
    groups: dict[tuple[str, str, str], list[Listed]] = {}
    for x in listed:
        e = x.entry
        groups.setdefault((board_of(e), e.model, e.hardware.accelerator), []).append(x)
    leaders, history = [], []
    for _, xs in sorted(groups.items()):
        best = max(xs, key=lambda x: (x.entry.throughput.tokens_per_s_per_gpu, x.entry.submitted))
        leaders.append(best)
        by_time = sorted(xs, key=lambda x: x.entry.submitted)
        for x in by_time:
            if x is best:
                continue
            # superseded: it led when it was submitted and a faster entry came later
            earlier = [y for y in by_time if y.entry.submitted <= x.entry.submitted and y is not x]
            led = all(y.entry.throughput.tokens_per_s_per_gpu <= x.entry.throughput.tokens_per_s_per_gpu
                      for y in earlier)
            why = (f"superseded by {best.entry.id}" if led
                   else f"slower than {best.entry.id} when submitted")
            history.append((x, why))
    leaders.sort(key=lambda x: (board_of(x.entry), -x.entry.throughput.tokens_per_s_per_gpu))
    return leaders, history


def build(paths: list[Path], out: str | Path, prices: PriceTable, *, now: datetime | None = None) -> dict[str, Any]:
    out_dir = Path(out)
    if out_dir.exists() and any(out_dir.iterdir()):
        try:
            previous = json.loads((out_dir / "index.json").read_text(encoding="utf-8")).get("schema")
        except (OSError, ValueError, AttributeError):
            previous = None
        if previous != INDEX_SCHEMA:
            raise ValueError(f"--out {out_dir}: exists and is not an earlier leaderboard build; refusing to replace it")
    listed, refused = [], []
    for p in paths:
        e = load_entry(p)
        rep = verify_entry(p, entry=e)
        (listed if rep.ok else refused).append(Listed(e, p, rep))
    ids = [x.entry.id for x in listed + refused]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"entry id(s) given twice: {', '.join(dup)}")
    leaders, history = rank(listed)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "entries").mkdir(parents=True)
    for x in listed:
        copy_listed(x.path, tmp / "entries" / x.entry.id, list(x.entry.files))  # only what it lists
    index = {
        "schema": INDEX_SCHEMA,
        "generated": (now or datetime.now(UTC)).isoformat(timespec="seconds"),
        "price_table": prices.model_dump(),
        "boards": sorted({board_of(x.entry) for x in listed}),
        "leaderboard": [summarize(x.entry, prices) for x in leaders],
        "history": [{**summarize(x.entry, prices), "why": why} for x, why in history],
        "not_verified": [{"id": x.entry.id, "path": str(x.path), "failed": [i.as_dict() for i in x.report.failed]}
                         for x in refused],
    }
    _rank_numbers(index["leaderboard"])
    (tmp / "index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    (tmp / "index.html").write_text(to_html(index), encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return index


def _rank_numbers(rows: list[dict[str, Any]]) -> None:
    counter: dict[str, int] = {}
    for r in rows:
        counter[r["board"]] = counter.get(r["board"], 0) + 1
        r["rank"] = counter[r["board"]]


# ---------------------------------------------------------------------------------- HTML

COLUMNS: list[tuple[str, str, str]] = [
    # key, header, sort type
    ("rank", "#", "num"),
    ("model", "Model", "text"),
    ("accelerator", "Accelerator", "text"),
    ("gpus", "GPUs (nodes)", "num"),
    ("tokens_per_s_per_gpu", "Tokens/s/GPU", "num"),
    ("usd_per_million_tokens", "$ / M tokens", "num"),
    ("gain", "Gain over baseline", "num"),
    ("mfu", "MFU", "num"),
    ("framework", "Framework", "text"),
    ("changes", "Changes from the public recipe", "text"),
    ("gate_passed", "Gate", "text"),
    ("links", "Recipe / evidence", "none"),
]


def _href(path: str) -> str:
    """A link into the built site: a relative path, each segment percent-encoded, so no entry field
    can make it another scheme (`javascript:`) or leave the page's folder."""
    return "/".join(quote(seg, safe="") for seg in path.split("/") if seg not in ("", ".", ".."))


def _num(v: Any, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def _cell(key: str, r: dict[str, Any]) -> dict[str, Any]:
    """One cell: its sort value and what the template shows (text, never markup)."""
    v = r.get(key)
    if key == "gpus":
        return {"key": key, "sort": str(r["gpus"]), "text": f"{r['gpus']} ({r['nodes']})"}
    if key == "tokens_per_s_per_gpu":
        return {"key": key, "sort": f"{v:.6f}", "text": f"{v:,.1f}", "band": f"{r['band']:.1%}"}
    if key == "usd_per_million_tokens":
        return {"key": key, "sort": _num(v, ".9f"), "text": "no price" if v is None else f"${v:,.4f}"}
    if key == "gain":
        return {"key": key, "sort": _num(v, ".6f"), "text": _num(v, "+.1%")}
    if key == "mfu":  # the template shows a dash for none
        return {"key": key, "sort": _num(v, ".6f"), "text": None if v is None else f"{v:.1%}"}
    if key == "framework":
        small = " ".join(str(x) for x in (r.get("framework_version"), r.get("image")) if x)
        return {"key": key, "sort": v, "text": v, "small": small}
    if key == "changes":
        ch = r.get("changes") or {}
        return {"key": key, "sort": " ".join(ch),
                "changes": [(k, d.get("public"), d.get("entry")) for k, d in ch.items()]}
    if key == "gate_passed":
        text = "baseline (no change)" if r.get("shipped_baseline") else "passed (layer 1 + convergence)"
        return {"key": key, "sort": text, "text": text}
    if key == "links":
        return {"key": key, "sort": "", "recipe": _href(r["recipe"]), "evidence": _href(r["evidence"])}
    if key == "model":
        return {"key": key, "sort": v, "text": v, "sim_label": SIM_LABEL if r.get("simulated") else None}
    return {"key": key, "sort": "" if v is None else v, "text": "" if v is None else v}


def _table(rows: list[dict[str, Any]], tid: str, cols: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {"id": tid, "cols": cols, "rows": [
        {"cls": "sim" if r.get("simulated") else "real", "id": r["id"], "model": r["model"],
         "accelerator": r["accelerator"], "cells": [_cell(k, r) for k, _, _ in cols]} for r in rows]}


def _board(index: dict[str, Any], b: str) -> dict[str, Any]:
    rows = [r for r in index["leaderboard"] if r["board"] == b]
    first = rows[0] if rows else {}
    proto = first.get("protocol", "")
    return {"name": b, "simulated": bool(first.get("simulated")),
            "label": first.get("label") if first.get("label") and not first.get("simulated") else None,
            "protocol_note": proto if rows and proto != "ttb-v1" else None,
            "table": _table(rows, "board-" + _slug(b), COLUMNS)}


def _environment() -> Any:
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("attune.ttb", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def to_html(index: dict[str, Any]) -> str:
    """The page, through Jinja2 with autoescaping (templates/leaderboard.html.j2): every entry field
    reaches the page as escaped text; links are relative paths into the site (`_href`)."""
    every = index["leaderboard"] + index["history"]
    hist_cols = [c for c in COLUMNS if c[0] != "rank"] + [("why", "Why not listed above", "text")]
    return _environment().get_template("leaderboard.html.j2").render(
        generated=index["generated"], sim_label=SIM_LABEL,
        models=sorted({r["model"] for r in every}), accelerators=sorted({r["accelerator"] for r in every}),
        boards=[_board(index, b) for b in index["boards"]],
        history=_table(index["history"], "history", hist_cols) if index["history"] else None,
        not_verified=index["not_verified"], price_table=index["price_table"],
        prices=[(k, f"{v:.2f}") for k, v in index["price_table"]["per_gpu_hour"].items()])


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s).strip("-")
