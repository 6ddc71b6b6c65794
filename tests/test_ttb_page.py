"""attune/ttb/page.py's HTML: rendered through Jinja2 with autoescaping, so an entry's fields reach the
page as text, never as markup, and its links stay relative paths inside the built site."""

from __future__ import annotations

import html.parser
from typing import Any

from attune.ttb.page import COLUMNS, to_html

HOSTILE = '<script>alert(1)</script>"\'><img src=x onerror=alert(2)>'
JS_URL = "javascript:alert(3)"


class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text += data


def _row(**over: Any) -> dict[str, Any]:
    row = {"id": HOSTILE, "board": HOSTILE, "protocol": HOSTILE, "simulated": False, "label": HOSTILE,
           "model": HOSTILE, "accelerator": HOSTILE, "gpus": 8, "nodes": 1, "framework": HOSTILE,
           "framework_version": HOSTILE, "image": HOSTILE, "tokens_per_s_per_gpu": 1000.0, "band": 0.01,
           "gain": 0.1, "mfu": None, "price_per_gpu_hour": 2.0, "usd_per_million_tokens": 0.5,
           "changes": {HOSTILE: {"public": HOSTILE, "entry": None}}, "gate_passed": True,
           "shipped_baseline": False, "recipe": JS_URL, "evidence": f"entries/{HOSTILE}/../../{JS_URL}",
           "rank": 1, "why": HOSTILE}
    return {**row, **over}


def test_hostile_entry_fields_are_text_never_markup() -> None:
    index = {"generated": HOSTILE, "boards": [HOSTILE], "leaderboard": [_row()], "history": [_row()],
             "not_verified": [{"id": HOSTILE, "path": HOSTILE, "failed": [{"item": HOSTILE, "detail": HOSTILE}]}],
             "price_table": {"name": HOSTILE, "source": HOSTILE, "per_gpu_hour": {HOSTILE: 2.0}}}
    page = to_html(index)
    parsed = _Page()
    parsed.feed(page)
    # the page's own script only, and no element from an entry's text
    assert [t for t, _ in parsed.tags].count("script") == 1 and "img" not in [t for t, _ in parsed.tags]
    assert "<script>alert" not in page and "<img" not in page
    for _, attrs in parsed.tags:
        assert "onerror" not in attrs
        for name, value in attrs.items():
            assert not (value or "").lower().lstrip().startswith("javascript:"), (name, value)
    # every hostile field is shown, as the text it was
    assert parsed.text.count(HOSTILE) >= 10
    links = [a["href"] for t, a in parsed.tags if t == "a"]
    assert links and all(h and ":" not in h and ".." not in h.split("/") for h in links), links
    # the attribute values round-trip: a quote in a field never closes an attribute
    rows = [a for t, a in parsed.tags if t == "tr" and "data-id" in a]
    assert rows and all(a["data-id"] == HOSTILE and a["data-model"] == HOSTILE for a in rows)
    cells = [a for t, a in parsed.tags if t == "td" and a.get("data-key") == "model"]
    assert cells and all(a["data-value"] == HOSTILE for a in cells)


def test_every_column_renders() -> None:
    index = {"generated": "now", "boards": ["ttb-v1"], "history": [],
             "leaderboard": [_row(board="ttb-v1", protocol="ttb-v1", id="e1", model="m", accelerator="a",
                                  recipe="entries/e1/run.sh", evidence="entries/e1/entry.json", mfu=0.42)],
             "not_verified": [], "price_table": {"name": "p", "source": "s", "per_gpu_hour": {"a": 2.0}}}
    parsed = _Page()
    parsed.feed(to_html(index))
    keys = [a["data-key"] for t, a in parsed.tags if t == "td"]
    assert keys == [k for k, _, _ in COLUMNS]
    assert [a["href"] for t, a in parsed.tags if t == "a"] == ["entries/e1/run.sh", "entries/e1/entry.json"]
    assert "42.0%" in parsed.text and "$0.5000" in parsed.text and "No superseded entries yet." in parsed.text
