"""The architecture, enforced: which layer may import which (docs/architecture.md draws it).

Every import in attune/, broker/, gate/, hooks/ and mcp_servers/ (at module level or inside a function)
is read from the source with `ast` and mapped to its layer. A layer may import only the layers below
it; the layer graph has no cycle; the stdlib-only core imports nothing outside the standard library;
the hooks import the standard library, the core and the plugin's stdlib-only bootstrap, nothing else."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("attune", "broker", "gate", "hooks", "mcp_servers")

# layer -> the layers it may import (besides itself). Lower layers first.
ALLOWED: dict[str, set[str]] = {
    "attune.core": set(),
    "attune.readers": {"attune.core"},
    "attune.knowledge": {"attune.core", "attune.readers"},
    "attune.sim": {"attune.core", "attune.readers", "attune.knowledge"},
    "gate": {"attune.core", "attune.readers"},
    "attune.control": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "gate"},
    "attune.tuners": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "attune.control"},
    "broker.backends": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "attune.control"},
    "attune.ttb": {"attune.core", "attune.readers", "attune.knowledge", "attune.control", "gate"},
    "broker": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "attune.control", "gate",
               "attune.tuners", "broker.backends", "attune.ttb"},
    "mcp_servers": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "attune.control", "gate",
                    "attune.tuners", "broker.backends", "attune.ttb", "broker"},
    "attune.app": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "attune.control", "gate",
                   "attune.tuners", "broker.backends", "attune.ttb", "broker", "mcp_servers"},
    "attune": set(),  # the package root: its version; any layer may read it
    "attune.__main__": {"attune.app"},  # `python -m attune` runs the CLI
    "hooks": {"attune.core", "mcp_servers.launch"},
    "mcp_servers.launch": {"attune.core"},  # the plugin's bootstrap: stdlib and the core only; the hooks read its records
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    p = module.split(".")
    if module == "attune.__main__":
        return module
    if p[0] == "attune":
        return f"attune.{p[1]}" if len(p) > 1 and f"attune.{p[1]}" in ALLOWED else "attune"
    if p[0] == "broker":
        return "broker.backends" if len(p) > 1 and p[1] == "backends" else "broker"
    if module == "mcp_servers.launch":
        return module
    return p[0]


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import mod` imports pkg.mod when mod is a module of ours
            for a in node.names:
                full = f"{node.module}.{a.name}"
                is_mod = (ROOT / Path(*full.split("."))).with_suffix(".py").exists() or \
                    (ROOT / Path(*full.split(".")) / "__init__.py").exists()
                out.append(full if is_mod else node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append(".relative")
    return out


def _hook_siblings() -> set[str]:
    return {p.stem for p in (ROOT / "hooks").glob("*.py")}


def _sources() -> list[Path]:
    return sorted(p for top in OURS for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    problems: list[str] = []
    siblings = _hook_siblings()
    for path in _sources():
        mod = _module_name(path)
        src = layer_of(mod)
        for imp in _imports(path):
            top = imp.split(".")[0]
            if imp == ".relative":
                problems.append(f"{mod}: a relative import (write the absolute module path)")
                continue
            if src == "hooks" and top in siblings:
                continue  # the hooks import each other from their own folder
            if top not in OURS:
                if src in ("attune.core", "hooks", "mcp_servers.launch") and top not in STDLIB:
                    problems.append(f"{mod} imports {imp}: layer {src} may import only the standard library")
                continue
            dst = layer_of(imp)
            if dst == src:
                continue
            edges[src].add(dst)
            if dst != "attune" and dst not in ALLOWED.get(src, set()):
                problems.append(f"{mod} imports {imp}: layer {src} may not import layer {dst}")
    return edges, problems


def test_every_import_follows_the_layers() -> None:
    _, problems = _graph()
    assert not problems, "\n".join(problems)


def test_the_layer_graph_has_no_cycle() -> None:
    edges, _ = _graph()
    seen: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if seen.get(n) == 1:
            pytest.fail("import cycle between layers: " + " -> ".join(path + [n]))
        if seen.get(n) == 2:
            return
        seen[n] = 1
        for m in sorted(edges.get(n, ())):
            visit(m, path + [n])
        seen[n] = 2

    for n in sorted(edges):
        visit(n, [])


def test_every_module_belongs_to_a_known_layer() -> None:
    unknown = sorted({_module_name(p) for p in _sources() if layer_of(_module_name(p)) not in ALLOWED})
    assert not unknown, f"modules outside every layer (add them to a layer): {unknown}"


def test_the_checker_sees_a_violation() -> None:
    """The rule can fail: a core module importing the control plane, or a third-party package, is caught."""
    assert "attune.control" not in ALLOWED["attune.core"]
    assert layer_of("attune.control.plane") == "attune.control" and layer_of("attune.core.ledger") == "attune.core"
    assert layer_of("broker.backends.sim") == "broker.backends" and layer_of("hooks.stop") == "hooks"
    assert "yaml" not in STDLIB and "json" in STDLIB
