"""The skill document: frontmatter, size, one-level references, and that what it names exists."""

from __future__ import annotations

import re

import yaml

from attune.core import plugin_servers
from attune.knowledge.catalog import load_catalog
from tests.skill_helpers import SCRIPTS, SKILL

SKILL_MD = SKILL / "SKILL.md"
REFERENCES = sorted((SKILL / "references").glob("*.md"))
def _server_tools() -> dict[str, list[str]]:
    """The tools the four MCP servers really expose, listed through the SDK's own client."""
    import asyncio
    import importlib

    from mcp import Client

    async def listing() -> dict[str, list[str]]:
        out = {}
        for name in plugin_servers.SERVERS:
            module = importlib.import_module(plugin_servers.module(name))
            async with Client(module.server) as client:
                out[name] = [t.name for t in (await client.list_tools()).tools]
        return out

    return asyncio.run(listing())


TOOLS = _server_tools()


def _frontmatter() -> tuple[dict, str]:
    text = SKILL_MD.read_text()
    m = re.match(r"---\n(.*?)\n---\n(.*)", text, re.S)
    assert m, "SKILL.md must start with a --- frontmatter block"
    return yaml.safe_load(m.group(1)), m.group(2)


def test_frontmatter_follows_claude_code() -> None:
    meta, body = _frontmatter()
    assert set(meta) == {"name", "description"}
    assert meta["name"] == "attune" and re.fullmatch(r"[a-z0-9-]{1,64}", meta["name"])
    assert 50 <= len(meta["description"]) <= 1024 and "<" not in meta["description"]
    assert "tune" in meta["description"].lower() and body.strip()


def test_skill_md_is_under_500_lines() -> None:
    assert len(SKILL_MD.read_text().splitlines()) < 500


def test_references_are_linked_and_one_level_deep() -> None:
    text = SKILL_MD.read_text()
    links = set(re.findall(r"\]\((references/[^)]+)\)", text))
    assert links == {f"references/{p.name}" for p in REFERENCES}
    assert {p.stem for p in REFERENCES} >= {"measurement", "search-rules", "profiling", "stopping", "lessons",
                                            "tools", "diagnosis"}
    for p in REFERENCES:
        assert not re.search(r"\]\([^)]*\.md\)", p.read_text()), f"{p.name} links further: keep one level deep"


def test_the_six_rules_are_stated() -> None:
    _, body = _frontmatter()
    rules = re.findall(r"^(\d)\. \*\*", body.split("## The six search rules")[1].split("\n## ")[0], re.M)
    assert rules == ["1", "2", "3", "4", "5", "6"]
    detail = (SKILL / "references" / "search-rules.md").read_text()
    assert re.findall(r"^## (\d)\.", detail, re.M) == ["1", "2", "3", "4", "5", "6"]
    for word in ("TP, PP, EP, CP and DP", "two values", "out of memory", "re-test"):
        assert word.lower() in (body + detail).lower()


def test_every_tool_named_in_the_skill_exists() -> None:
    text = SKILL_MD.read_text() + (SKILL / "references" / "tools.md").read_text()
    known = {t for tools in TOOLS.values() for t in tools}
    # Backticked snake_case names in the tools table that look like tool names must be real tools.
    table = [line for line in text.splitlines() if line.startswith("| broker |") or line.startswith("| metrics |")
             or line.startswith("| traces |") or line.startswith("| gate |")]
    named = {n for line in table for n in re.findall(r"`([a-z_]+)`", line)}
    assert named and named <= known, sorted(named - known)


def test_every_tool_is_documented() -> None:
    text = SKILL_MD.read_text() + (SKILL / "references" / "tools.md").read_text()
    for tools in TOOLS.values():
        for t in tools:
            assert f"`{t}`" in text, t
    assert "mcp__plugin_attune_" in text


def test_named_levers_and_scripts_exist() -> None:
    ids = {lv.id for lv in load_catalog().levers}
    for p in [SKILL_MD, *REFERENCES]:
        for token in re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`", p.read_text()):
            assert token in ids, f"{p.name} names `{token}`, which is not a lever id"
        for script in re.findall(r"scripts/([a-z_]+\.py)", p.read_text()):
            assert (SCRIPTS / script).is_file(), script
