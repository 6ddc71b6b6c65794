"""Path containment is defined once (attune.core.containment.inside) and used by the hooks, the launch
path, the broker's file windows and the MCP servers."""

from __future__ import annotations

import ast
import re
from pathlib import Path, PurePosixPath

import pytest

from attune.core import containment
from attune.core.containment import inside

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("path", "root", "expected"), [
    ("/a/b", "/a/b", True),
    ("/a/b/c", "/a/b", True),
    ("/a/b/c", "/a/b/", True),
    ("/a/bc", "/a/b", False),
    ("/a", "/a/b", False),
    ("/x/y", "/", True),
    ("/", "/", True),
    ("/a/b-evil/x", "/a/b", False),
])
def test_inside_compares_whole_components(path: str, root: str, expected: bool) -> None:
    assert inside(path, root) is expected
    assert inside(PurePosixPath(path), PurePosixPath(root)) is expected


def test_inside_refuses_what_is_not_a_path() -> None:
    with pytest.raises(TypeError, match="str or os.PathLike"):
        inside(b"/a", "/a")


def test_containment_imports_nothing() -> None:
    tree = ast.parse(Path(containment.__file__).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


# The spellings of a hand-made containment check: none is left outside attune/core/containment.py.
_HAND_MADE = re.compile(r"is_relative_to\(|(not )?in \w+\.parents\b|\.startswith\(\w+ \+ os\.sep\)|rstrip\(os\.sep\)")


@pytest.mark.parametrize("rel", ["hooks/policy.py", "broker/files.py", "attune/control/rungen.py",
                                 "mcp_servers/traces_server.py", "mcp_servers/metrics_server.py",
                                 "mcp_servers/gate_server.py", "attune/ttb/paths.py", "attune/ttb/verify.py"])
def test_one_containment_check(rel: str) -> None:
    src = (ROOT / rel).read_text()
    assert "from attune.core.containment import inside" in src
    assert not _HAND_MADE.search(src), _HAND_MADE.search(src)


def test_no_hand_made_check_is_left() -> None:
    hits = []
    for d in ("attune", "hooks", "broker", "mcp_servers", "gate"):
        for p in (ROOT / d).rglob("*.py"):
            if p.name != "containment.py" and _HAND_MADE.search(p.read_text()):
                hits.append(str(p.relative_to(ROOT)))
    assert not hits, hits


def test_hooks_resolve_then_ask_the_shared_function(tmp_path: Path) -> None:
    """A link out of a write root is outside once resolved: the policy answers with the shared check."""
    from hooks import policy

    camp = tmp_path / "camp"
    (camp / "notes").mkdir(parents=True)
    (camp / "campaign.yaml").write_text("name: x\n")
    (tmp_path / "outside").mkdir()
    (camp / "notes" / "link").symlink_to(tmp_path / "outside")
    pol = policy.Policy.for_campaign(str(camp))
    assert pol.decide("Write", {"file_path": str(camp / "notes" / "a.md"), "content": "x"}).decision == "allow"
    assert pol.decide("Write", {"file_path": str(camp / "notes" / "link" / "a.md"), "content": "x"}).decision == "deny"
