"""The core's stdlib kit: the strict YAML subset (as PyYAML reads it, or refused), the one gate-list rule,
and what depends on them: the hook write-protects the list the control plane uses, for every spelling,
and the plugin launcher gives the gate server that same list."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from attune.control import plane
from attune.control.spec import SpecError, load_spec
from attune.core import gatelists, yamlsubset
from attune.core.yamlsubset import YamlSubsetError
from hooks.policy import Policy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").rglob("campaign.yaml")) + sorted((ROOT / "examples").rglob("policy.yaml"))

SPELLINGS = [
    "a: 1\nb: two\n",
    "a:\n  b:\n    c: [1, 2.5, x]\n",
    "a: {b: 1, c: [x, y], 'd e': \"f\\tg\"}\n",
    "a: [\n  1,\n  2,  # two\n  {b: c},\n]\n",
    "- a\n- b: 1\n  c: 2\n- - x\n  - y\n-\n  k: v\n",
    "k:\n- 1\n- 2\nz: 3\n",
    "a: 'it''s'  # comment\nb: it's\nc: \"q # not a comment\"\n",
    "---\na: ~\nb: null\nc:\nd: true\ne: no\nf: On\ng: -3\nh: +4\ni: 0\nj: 3.0e-6\nk: -1.5\nl: .inf\n",
    "a: x-y_z.w/v\nurl: http://h:80/p\nflag: --tp-size\n",
    "sha: 31ea7dbd3eb84a394c6d2a55137b0c59a8576bb32c7189b1acba20fe7cd63fa3\nv: 3a\nw: 12abc\n",
    "t: |\n  line one\n    indented\n\n  three\nu: >-\n  folded\n  text\n\n  para\nv: after\n",
    "\"quoted key\": 1\n'single': 2\n",
    "{\"json\": [1, 2, {\"x\": \"y\"}], \"b\": true}\n",
    "nested:\n  - name: a\n    args: {--x: 1}\n  - name: b\n",
    "e: \"\\u00e9\\x41\\n\"\n",
    "",
    "# only a comment\n",
    # multi-line scalars, folded (what yaml.safe_dump writes for a long string)
    "a: plain\n  continued\n\n  new line\nb: 1\n",
    "- one\n  two\n- k: v\n    w\n",
    "a: plain\n  - not an item\nb:\n- x\n  - y\n",  # a leading "- " continues a plain value too
    "a: 'open\n  close'  # c\nb: 'x\n\n  y'\n",
    "a: \"esc\\\n  aped\"\nb: \"two\n    lines\"\n",
]

REFUSED = [
    "a: &x 1\nb: *x\n",  # anchors and aliases
    "a: !!str 1\n",  # tags
    "a: 1\n---\nb: 2\n",  # several documents
    "%YAML 1.1\n---\na: 1\n",  # directives
    "? complex\n: key\n",
    "a: 1\na: 2\n",  # duplicate keys (PyYAML keeps the last silently)
    "a: 1e3\n", "a: 0x1f\n", "a: 1_000\n", "a: 012\n", "a: 1:30\n", "a: 2024-01-01\n",  # looks numeric
    "a: b: c\n",
    "a: plain\n  continued: x\n",  # a multi-line plain value that looks like a key
    "a: 'open\nclose'\n",  # a quoted value's lines not indented under its key
    "a: 'never closes\n  at all\n",
    "a: [1, 2\n",  # never closes
    "a:\n\tb: 1\n",  # tabs
    "a: |+\n  keep\n",
    "a: {b}\n", "a: [b: 1]\n", "a: {b:c}\n",
    "a: \"bad \\q escape\"\n",
    "a: 1\n  b: 2\n",
    "a: <<\n",
]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_reads_as_pyyaml_reads_it(path: Path) -> None:
    text = path.read_text()
    assert yamlsubset.loads(text) == yaml.safe_load(text)


@pytest.mark.parametrize("text", SPELLINGS)
def test_spellings_read_as_pyyaml_reads_them(text: str) -> None:
    ours = yamlsubset.loads(text)
    assert ours == yaml.safe_load(text)
    # types too: True is not 1, 1.0 is not 1
    assert json.dumps(ours, sort_keys=True) == json.dumps(yaml.safe_load(text), sort_keys=True)


@pytest.mark.parametrize("text", REFUSED)
def test_what_it_cannot_read_exactly_is_refused_naming_the_line(text: str) -> None:
    with pytest.raises(YamlSubsetError, match=r"line \d+|end of file|longer"):
        yamlsubset.loads(text)


def test_long_strings_as_yaml_safe_dump_writes_them() -> None:
    """attune writes campaign.yaml with `yaml.safe_dump` (TTB's evidence): long strings fold over lines."""
    words = ["alpha", "it's", 'say "hi"', "x:y", "#hash", "a-b", "q'q", "\\", "\u00e9", "end.", "- x", "k: v"]
    for n in range(60):
        text = " ".join(words[(n * 7 + i) % len(words)] for i in range(5 + n))
        text += "\n\nsecond paragraph" if n % 5 == 0 else ""
        doc = {"notes": text, "list": [text, {"k": text, "j": [text]}], "deep": {"er": {"v": text}}}
        for style in (None, "'", '"'):
            dumped = yaml.safe_dump(doc, default_style=style, width=(20, 40, 80)[n % 3])
            assert yamlsubset.loads(dumped) == yaml.safe_load(dumped) == doc, dumped


def test_the_control_plane_refuses_a_campaign_yaml_the_hooks_cannot_read(tmp_path: Path) -> None:
    src = (ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml").read_text()
    (tmp_path / "campaign.yaml").write_text(src + "notes: &n hello\n")
    with pytest.raises(SpecError, match="YAML subset"):
        load_spec(tmp_path)


# ----------------------------------------------------------------------------------- the gate-list rule

LISTS_SPELLINGS = {
    "block": "gate:\n  lists: {v}\n",
    "block, comment": "gate:  # the gate\n  # the list\n  lists: {v}  # pinned\n",
    "block, quoted": "gate:\n  lists: \"{v}\"\n",
    "block, single-quoted": "gate:\n  lists: '{v}'\n",
    "flow": "gate: {{lists: {v}}}\n",
    "flow, quoted, comment": "gate: {{'lists': \"{v}\"}}  # c\n",
    "flow, multi-line": "gate: {{\n  mode: enforce,\n  lists: {v}\n}}\n",
    "deeper indent": "gate:\n      lists: {v}\n",
}
VALUES = ["lists/custom.yaml", "custom.yml", "sub/dir/x.yaml", "llama31-405b", "tinygpt"]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("spelling", sorted(LISTS_SPELLINGS))
def test_the_hook_protects_the_list_the_control_plane_uses(tmp_path: Path, spelling: str, value: str) -> None:
    camp, root = tmp_path / "camp", tmp_path / "plugin"
    (root / "gate" / "lists").mkdir(parents=True)
    camp.mkdir()
    text = "name: c\nmodel: tinygpt\n" + LISTS_SPELLINGS[spelling].format(v=value)
    (camp / "campaign.yaml").write_text(text)
    data = yaml.safe_load(text)
    assert data["gate"]["lists"] == value  # the control plane's reading
    kind, where = gatelists.source(value, "tinygpt", str(camp))
    target = Path(where) if kind == "file" else root / "gate" / "lists" / f"{where}.yaml"
    pol = Policy.for_campaign(str(camp), plugin_root=str(root))
    for tool in ("Write", "Edit"):
        assert pol.decide(tool, {"file_path": str(target)}).decision == "deny", (tool, target)
    # the effect, not only the verdict: a shell redirect into it is denied as well
    assert pol.decide_bash(f"echo x > {target}").decision == "deny"
    if kind == "file":  # and a neighbouring file the spec does not name stays writable in notes/ only
        assert pol.decide("Write", {"file_path": str(camp / "notes" / "n.md")}).decision == "allow"


def test_the_hook_denies_when_campaign_yaml_is_outside_the_subset(tmp_path: Path) -> None:
    from hooks.runtime import PolicyFileError

    (tmp_path / "campaign.yaml").write_text("gate: !!map {lists: x.yaml}\n")
    policy = Policy.for_campaign(str(tmp_path), plugin_root=str(tmp_path / "plugin"))
    # campaign.yaml is read when a write is decided (most calls write nothing): the write decision fails
    # closed, and the hook's skeleton answers deny on the error.
    with pytest.raises(PolicyFileError, match="campaign.yaml"):
        policy.write_problem(str(tmp_path / "notes" / "x.md"))


@pytest.mark.parametrize("lists", [None, "", "llama31-405b", "x.yaml", "x.yml", "a/b.yaml", "/abs/l.yaml",
                                   "./rel", "dir/name", "name.json"])
def test_the_control_plane_uses_the_one_rule(tmp_path: Path, lists: str | None) -> None:
    class _G:
        pass

    class _S:
        model = "tinygpt"
        gate = _G()

    _S.gate.lists = lists  # type: ignore[attr-defined]
    got = plane.gate_list_source(_S(), tmp_path)  # type: ignore[arg-type]
    kind, where = gatelists.source(lists, "tinygpt", str(tmp_path))
    assert isinstance(got, Path) == (kind == "file")
    assert (Path(got) == Path(where)) if kind == "file" else got == where


# ----------------------------------------------------------------------------------- the launcher


def test_a_builtin_list_name_gives_working_gate_tools_through_the_launcher(tmp_path: Path) -> None:
    """`gate.lists: llama31-405b` (a built-in name): the launcher used to point the gate server at
    <campaign>/llama31-405b and every tool failed; now the real server, started by the real launcher,
    answers with the built-in list."""
    (tmp_path / "campaign.yaml").write_text("name: c\nmodel: llama-3.1-405b\ngate: {lists: llama31-405b}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATTUNE_GATE_MODEL", "ATTUNE_GATE_LIST_SHA256", "PYTHONPATH")}
    env.update({"ATTUNE_PYTHON": sys.executable, "ATTUNE_CAMPAIGN_DIR": str(tmp_path),
                "CLAUDE_PLUGIN_ROOT": str(ROOT), "CLAUDE_PLUGIN_DATA": str(tmp_path / "data")})
    params = StdioServerParameters(command=sys.executable, args=[str(ROOT / "mcp_servers" / "launch.py"), "gate"],
                                   cwd=str(tmp_path), env=env)

    async def go():
        async with Client(params, read_timeout_seconds=60) as client:
            return await client.call_tool("explain_argument", {"name": "--tensor-model-parallel-size"})

    res = anyio.run(go)
    assert not res.is_error, res.content
    text = json.dumps(res.structured_content or [c.model_dump() for c in res.content])
    assert "llama31-405b" in text or "llama" in text.lower()
    assert "ListError" not in text and "no correctness list" not in text


def test_session_start_reads_the_spec_facts_with_the_subset(tmp_path: Path) -> None:
    """The SessionStart hook's facts (model, framework, cluster.accelerator) come from the subset reader,
    so a flow-style cluster and a folded string read as the control plane reads them."""
    from hooks import session_start

    p = tmp_path / "campaign.yaml"
    p.write_text("model: glm-4.5  # the model\nframework: 'megatron-lm'\ncluster: {backend: sim, accelerator: B200}\n"
                 "notes: a long note that yaml.safe_dump\n  folds over lines\n")
    assert session_start._spec_facts(str(p)) == {"model": "glm-4.5", "framework": "megatron-lm", "accelerator": "B200"}
    p.write_text("model: &m x\n")  # outside the subset: no facts, never a guess
    assert session_start._spec_facts(str(p)) == {}
    assert session_start._spec_facts(str(tmp_path / "missing.yaml")) == {}
