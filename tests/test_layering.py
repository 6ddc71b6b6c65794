"""The architecture, enforced: which layer may import which (docs/architecture.md draws it).

Every import in attune/, broker/, gate/, hooks/ and mcp_servers/ (at module level or inside a function)
is read from the source with `ast` and mapped to its layer. A layer may import only the layers below
it; the layer graph has no cycle; the stdlib-only core imports nothing outside the standard library;
the hooks import the standard library, the core and the plugin's stdlib-only bootstrap, nothing else.

Side products (TrainingThroughputBench, the gate's evaluation harness, the simulator's fit to the paper)
sit in their own packages above the layers they measure; no runtime layer imports them, except the
edges named one by one in `SIDE_PRODUCT_EDGES`, each with its reason."""

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
    "broker": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "attune.control", "gate",
               "attune.tuners", "broker.backends"},
    "mcp_servers": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "attune.control", "gate",
                    "attune.tuners", "broker.backends", "broker"},
    # side products (feature layer): they import the runtime they measure or publish; see SIDE_PRODUCTS
    "attune.ttb": {"attune.core", "attune.readers", "attune.knowledge", "attune.control", "gate"},
    "gate.evaluation": {"attune.core", "attune.readers", "gate"},
    "attune.sim.paperfit": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim"},
    "attune.app": {"attune.core", "attune.readers", "attune.knowledge", "attune.sim", "attune.control", "gate",
                   "attune.tuners", "broker.backends", "broker", "mcp_servers", "attune.ttb", "gate.evaluation"},
    "attune": set(),  # the package root: its version; any layer may read it
    "attune.__main__": {"attune.app"},  # `python -m attune` runs the CLI
    "hooks": {"attune.core", "mcp_servers.launch"},
    "mcp_servers.launch": {"attune.core"},  # the plugin's bootstrap: stdlib and the core only; the hooks read its records
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# Side products: packages that measure, calibrate or publish the product, never part of a campaign's run.
# TrainingThroughputBench (attune/ttb, the `ttb` extra), the gate's evaluation harness (gate/evaluation:
# `attune gate validate`, `attune gate component`, `python -m gate.evaluation.realcurves`) and the
# simulator's fit to the paper (attune/sim/paperfit, used by benchmarks/fit_sim.py). Only the application
# layer (the CLI that runs them) and other side products may import them.
SIDE_PRODUCTS = frozenset({"attune.ttb", "gate.evaluation", "attune.sim.paperfit"})
RUNTIME = frozenset(ALLOWED) - SIDE_PRODUCTS - {"attune.app", "attune.__main__"}
# (importing module, imported module) -> why this one runtime module may import this one side-product module.
SIDE_PRODUCT_EDGES: dict[tuple[str, str], str] = {
    ("mcp_servers.broker_server", "attune.ttb.lookup"):
        "the `ttb_best_known_recipe` tool reads verified TTB entries as a prior (imported inside the tool)",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    p = module.split(".")
    if module == "attune.__main__":
        return module
    if p[:3] == ["attune", "sim", "paperfit"]:
        return "attune.sim.paperfit"
    if p[0] == "attune":
        return f"attune.{p[1]}" if len(p) > 1 and f"attune.{p[1]}" in ALLOWED else "attune"
    if p[:2] == ["gate", "evaluation"]:
        return "gate.evaluation"
    if p[0] == "broker":
        return "broker.backends" if len(p) > 1 and p[1] == "backends" else "broker"
    if module == "mcp_servers.launch":
        return module
    return p[0]


def _imports(path: Path) -> list[str]:
    return _imports_of_source(path.read_text(), str(path))


def _imports_of_source(text: str, filename: str = "<source>") -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(text, filename)):
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


def _check(mod: str, imports: list[str], siblings: set[str]) -> tuple[set[str], list[str]]:
    """One module's imports against the layers: the layers it reaches and the problems."""
    src = layer_of(mod)
    dsts: set[str] = set()
    problems: list[str] = []
    for imp in imports:
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
        dsts.add(dst)
        if (mod, imp) in SIDE_PRODUCT_EDGES:
            continue
        if dst in SIDE_PRODUCTS and src in RUNTIME:
            problems.append(f"{mod} imports {imp}: the runtime layer {src} may not import the side product {dst}")
        elif dst != "attune" and dst not in ALLOWED.get(src, set()):
            problems.append(f"{mod} imports {imp}: layer {src} may not import layer {dst}")
    return dsts, problems


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    problems: list[str] = []
    siblings = _hook_siblings()
    for path in _sources():
        mod = _module_name(path)
        dsts, found = _check(mod, _imports(path), siblings)
        edges[layer_of(mod)] |= dsts
        problems += found
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


def test_no_runtime_layer_may_import_a_side_product() -> None:
    """The table itself: every side product is a layer, and no runtime layer lists one."""
    assert set(ALLOWED) >= SIDE_PRODUCTS
    leaks = {layer: sorted(ALLOWED[layer] & SIDE_PRODUCTS) for layer in RUNTIME if ALLOWED[layer] & SIDE_PRODUCTS}
    assert not leaks, f"runtime layers allowed to import side products: {leaks}"
    for layer in ("attune.core", "attune.readers", "attune.knowledge", "attune.sim", "gate", "attune.control",
                  "attune.tuners", "broker.backends", "broker", "mcp_servers", "hooks", "mcp_servers.launch"):
        assert layer in RUNTIME


@pytest.mark.parametrize(("mod", "source"), [
    ("broker.service", "from gate.evaluation import validate\n"),
    ("gate.judge", "import gate.evaluation.realcurves\n"),
    ("gate.noise", "def f():\n    from gate.evaluation.component import judge\n"),
    ("attune.sim.estimate", "from attune.sim.paperfit.paper import POINTS\n"),
    ("attune.sim.constants", "from attune.sim import paperfit\n"),
    ("attune.control.plane", "from attune.ttb.entry import load_entry\n"),
    ("attune.tuners.heuristic", "from attune.ttb import lookup\n"),
    ("mcp_servers.gate_server", "from attune.ttb.lookup import best\n"),
    ("mcp_servers.broker_server", "from attune.ttb.verify import verify_entry\n"),  # only lookup is named
    ("broker.campaigns", "import attune.ttb.page\n"),
])
def test_the_checker_refuses_a_runtime_import_of_a_side_product(mod: str, source: str) -> None:
    """A synthetic runtime module importing a side product fails the check, naming both."""
    _, problems = _check(mod, _imports_of_source(source), set())
    assert len(problems) == 1 and "side product" in problems[0] and mod in problems[0], problems


@pytest.mark.parametrize(("mod", "source"), [
    ("attune.app.commands.gate", "from gate.evaluation import validate\n"),
    ("gate.evaluation.validate", "from gate import judge, lists\nfrom attune.core.recipe import render_args\n"),
    ("attune.sim.paperfit.fit", "from attune.sim.estimate import estimate\n"),
    ("attune.ttb.verify", "from gate.lists import load_list\n"),
    ("mcp_servers.broker_server", "from attune.ttb.lookup import best\n"),
])
def test_the_checker_lets_side_products_and_their_users_through(mod: str, source: str) -> None:
    _, problems = _check(mod, _imports_of_source(source), set())
    assert not problems, problems


def test_the_side_products_sit_above_what_they_measure() -> None:
    """A side product never reaches up into the application, and the runtime it measures stays below it."""
    _, problems = _check("gate.evaluation.validate", _imports_of_source("from attune.app import cli\n"), set())
    assert problems and "may not import layer attune.app" in problems[0]
    assert layer_of("gate.evaluation") == "gate.evaluation" and layer_of("gate.evaluation.realcurves") == "gate.evaluation"
    assert layer_of("gate.realcurves") == "gate" and layer_of("attune.sim.paperfit.fit") == "attune.sim.paperfit"
    assert layer_of("attune.sim.estimate") == "attune.sim" and layer_of("attune.ttb.lookup") == "attune.ttb"


def test_every_named_side_product_edge_is_still_used() -> None:
    """An exception nobody needs any more is removed, not kept as a hole."""
    used = {(_module_name(p), imp) for p in _sources() for imp in _imports(p)}
    stale = sorted(set(SIDE_PRODUCT_EDGES) - used)
    assert not stale, f"SIDE_PRODUCT_EDGES names imports no module makes: {stale}"
