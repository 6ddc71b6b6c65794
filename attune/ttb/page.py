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

import html
import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _cell(key: str, r: dict[str, Any]) -> tuple[str, str]:
    """(sort value, HTML) of one cell."""
    v = r.get(key)
    if key == "gpus":
        return str(r["gpus"]), f"{r['gpus']} ({r['nodes']})"
    if key == "tokens_per_s_per_gpu":
        return f"{v:.6f}", f"{v:,.1f} <small>&plusmn;{r['band']:.1%} band</small>"
    if key == "usd_per_million_tokens":
        return ("" if v is None else f"{v:.9f}"), ("no price" if v is None else f"${v:,.4f}")
    if key == "gain":
        return ("" if v is None else f"{v:.6f}"), ("" if v is None else f"{v:+.1%}")
    if key == "mfu":
        return ("" if v is None else f"{v:.6f}"), ("&ndash;" if v is None else f"{v:.1%}")
    if key == "framework":
        extra = " ".join(_e(x) for x in (r.get("framework_version"), r.get("image")) if x)
        return _e(v), _e(v) + (f"<br><small>{extra}</small>" if extra else "")
    if key == "changes":
        ch = r.get("changes") or {}
        if not ch:
            return "", "none"
        def show(x: Any) -> str:
            return "<i>unset</i>" if x is None else _e(x)

        items = "".join(f"<li><code>{_e(k)}</code> {show(d.get('public'))} &rarr; {show(d.get('entry'))}</li>"
                        for k, d in ch.items())
        return _e(" ".join(ch)), f"<ul>{items}</ul>"
    if key == "gate_passed":
        text = "baseline (no change)" if r.get("shipped_baseline") else "passed (layer 1 + convergence)"
        return text, _e(text)
    if key == "links":
        return "", (f'<a class="recipe" href="{_e(r["recipe"])}">run.sh</a> &middot; '
                    f'<a class="evidence" href="{_e(r["evidence"])}">evidence</a>')
    if key == "model":
        lab = f' <span class="label sim">{_e(SIM_LABEL)}</span>' if r.get("simulated") else ""
        return _e(v), f"{_e(v)}{lab}"
    return _e(v), _e(v)


def _table(rows: list[dict[str, Any]], tid: str, cols: list[tuple[str, str, str]]) -> str:
    head = "".join(
        f'<th data-key="{k}" data-type="{t}"{" class=sortable tabindex=0" if t != "none" else ""}>{_e(h)}</th>'
        for k, h, t in cols)
    body = []
    for r in rows:
        cells = []
        for k, _, _ in cols:
            sv, shown = _cell(k, r)
            cells.append(f'<td data-key="{k}" data-value="{sv}">{shown}</td>')
        cls = "sim" if r.get("simulated") else "real"
        body.append(f'<tr class="{cls}" data-id="{_e(r["id"])}" data-model="{_e(r["model"])}" '
                    f'data-accelerator="{_e(r["accelerator"])}">{"".join(cells)}</tr>')
    return f'<table id="{_e(tid)}" class="board"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def to_html(index: dict[str, Any]) -> str:
    boards = []
    for b in index["boards"]:
        rows = [r for r in index["leaderboard"] if r["board"] == b]
        sim = rows and rows[0]["simulated"]
        proto = rows[0]["protocol"] if rows else ""
        note = ""
        if sim:
            note = (f'<p class="label sim">Every row on this board is {SIM_LABEL}: the simulated cluster\'s '
                    f"prediction, ranked only against other simulated entries.</p>")
        if rows and rows[0].get("label") and not rows[0]["simulated"]:
            note += f'<p class="label">{_e(rows[0]["label"])}</p>'
        elif rows and proto != "ttb-v1":
            note += f'<p class="label">{_e(proto)}: not comparable with ttb-v1.</p>'
        boards.append(f'<section class="board-section" data-board="{_e(b)}"><h2>{_e(b)}</h2>{note}'
                      f'{_table(rows, "board-" + _slug(b), COLUMNS)}</section>')
    hist_cols = [c for c in COLUMNS if c[0] != "rank"] + [("why", "Why not listed above", "text")]
    hist = index["history"]
    hist_html = _table(hist, "history", hist_cols) if hist else "<p>No superseded entries yet.</p>"
    refused = "".join(f"<li><code>{_e(x['id'])}</code>: " + "; ".join(
        f"{_e(i['item'])}: {_e(i['detail'])}" for i in x["failed"]) + "</li>" for x in index["not_verified"])
    models = sorted({r["model"] for r in index["leaderboard"] + index["history"]})
    accels = sorted({r["accelerator"] for r in index["leaderboard"] + index["history"]})
    opts = lambda xs: "".join(f'<option value="{_e(x)}">{_e(x)}</option>' for x in xs)  # noqa: E731
    prices = "".join(f"<li>{_e(k)}: ${v:.2f} per GPU-hour</li>" for k, v in index["price_table"]["per_gpu_hour"].items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>TrainingThroughputBench</title>
<style>
body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}}
table{{border-collapse:collapse;margin:.5em 0 1.5em}}
th,td{{border:1px solid #ccc;padding:.3em .5em;vertical-align:top;text-align:left}}
th.sortable{{cursor:pointer;background:#f3f3f3}}
th[aria-sort=ascending]::after{{content:" \\25B2"}} th[aria-sort=descending]::after{{content:" \\25BC"}}
td ul{{margin:0;padding-left:1.1em}}
.label{{color:#8a4b00}} span.label.sim{{background:#fff3d6;border:1px solid #e0b050;padding:0 .3em;font-size:.85em}}
tr.sim td{{background:#fffaf0}}
.controls label{{margin-right:1em}}
</style></head><body>
<h1>TrainingThroughputBench</h1>
<p>The fastest verified training recipe per model and accelerator under a fixed protocol (ttb-v1: 8,192-token rows
of SFT conversations rendered with the model's chat template, global batch 128, BF16, aggregate tokens/s/GPU over
steps 4&ndash;13 of a 14-step run). Every listed recipe passed the correctness gate and was verified again from its
stored evidence when this page was built ({_e(index['generated'])}).</p>
<div class="controls">
<label>Filter <input id="filter" type="search" placeholder="text in any column"></label>
<label>Model <select id="model"><option value="">all</option>{opts(models)}</select></label>
<label>Accelerator <select id="accelerator"><option value="">all</option>{opts(accels)}</select></label>
<label><input id="show-sim" type="checkbox" checked> show simulated entries</label>
</div>
{''.join(boards) or '<p>No verified entries.</p>'}
<h2>History</h2>
{hist_html}
<h2>Not verified</h2>
{f'<ul id="not-verified">{refused}</ul>' if refused else '<p>Every entry verified.</p>'}
<h2>Prices</h2>
<p>Cost per million tokens = price per GPU-hour / (tokens/s/GPU &times; 3600) &times; 10<sup>6</sup>, from the
price table <code>{_e(index['price_table']['name'])}</code> ({_e(index['price_table']['source'])}):</p>
<ul>{prices}</ul>
<script>
(function () {{
  function val(td, type) {{
    var v = td.getAttribute('data-value');
    if (type === 'num') {{ return v === '' ? NaN : parseFloat(v); }}
    return v.toLowerCase();
  }}
  function sortTable(table, key, dir) {{
    var th = table.querySelector('th[data-key="' + key + '"]');
    if (!th) {{ return; }}
    var type = th.getAttribute('data-type');
    var tbody = table.tBodies[0];
    var rows = Array.prototype.slice.call(tbody.rows);
    rows.sort(function (a, b) {{
      var x = val(a.querySelector('td[data-key="' + key + '"]'), type);
      var y = val(b.querySelector('td[data-key="' + key + '"]'), type);
      var xm = (type === 'num' && isNaN(x)), ym = (type === 'num' && isNaN(y));
      if (xm || ym) {{ return xm === ym ? 0 : (xm ? 1 : -1); }}
      var c = x < y ? -1 : (x > y ? 1 : 0);
      return dir === 'asc' ? c : -c;
    }});
    rows.forEach(function (r) {{ tbody.appendChild(r); }});
    Array.prototype.forEach.call(table.querySelectorAll('th'), function (h) {{ h.removeAttribute('aria-sort'); }});
    th.setAttribute('aria-sort', dir === 'asc' ? 'ascending' : 'descending');
  }}
  function applyFilter() {{
    var q = document.getElementById('filter').value.toLowerCase();
    var m = document.getElementById('model').value, a = document.getElementById('accelerator').value;
    var sim = document.getElementById('show-sim').checked;
    Array.prototype.forEach.call(document.querySelectorAll('table.board tbody tr'), function (r) {{
      var show = (!q || r.textContent.toLowerCase().indexOf(q) >= 0) && (!m || r.getAttribute('data-model') === m)
        && (!a || r.getAttribute('data-accelerator') === a) && (sim || !r.classList.contains('sim'));
      r.hidden = !show;
    }});
  }}
  Array.prototype.forEach.call(document.querySelectorAll('th.sortable'), function (th) {{
    function go() {{
      var table = th.closest('table');
      var dir = th.getAttribute('aria-sort') === 'descending' ? 'asc' : 'desc';
      sortTable(table, th.getAttribute('data-key'), dir);
    }}
    th.addEventListener('click', go);
    th.addEventListener('keydown', function (e) {{ if (e.key === 'Enter') {{ go(); }} }});
  }});
  ['filter', 'model', 'accelerator', 'show-sim'].forEach(function (id) {{
    document.getElementById(id).addEventListener('input', applyFilter);
    document.getElementById(id).addEventListener('change', applyFilter);
  }});
  // A shareable view: #sort=KEY&dir=asc|desc&q=TEXT&model=M&accelerator=A&sim=0
  var p = new URLSearchParams(location.hash.slice(1));
  if (p.get('q')) {{ document.getElementById('filter').value = p.get('q'); }}
  if (p.get('model')) {{ document.getElementById('model').value = p.get('model'); }}
  if (p.get('accelerator')) {{ document.getElementById('accelerator').value = p.get('accelerator'); }}
  if (p.get('sim') === '0') {{ document.getElementById('show-sim').checked = false; }}
  if (p.get('sort')) {{
    Array.prototype.forEach.call(document.querySelectorAll('table.board'), function (t) {{
      sortTable(t, p.get('sort'), p.get('dir') === 'asc' ? 'asc' : 'desc');
    }});
  }}
  applyFilter();
}})();
</script>
</body></html>
"""


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s).strip("-")
