"""attune.core.recipe: the canonical form, the one identity key, the degrees' rules and the argv round trip;
and the tuner-side identity agreeing with the control plane's (the identical-recipe rule)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attune.control.rungen import Changes, RunGenerator, parse_changes
from attune.control.spec import parse_spec
from attune.core.recipe import (
    DEGREE_FLAGS,
    ParallelDims,
    Recipe,
    norm_value,
    parse_argv,
    render_args,
)
from attune.tuners.base import recipe_key, split_changes
from attune.tuners.random_search import RandomTuner
from tests._broker_helpers import FAKE_SPEC, deep_update

# ----------------------------------------------------------------------------------------- canonical form


def test_spellings_of_one_value_are_one_recipe():
    a = Recipe({"--tp": 4, "--lr": 0.5, "--flash": True, "--gone": False, "--none": None})
    b = Recipe({"--lr": "0.5", "--tp": "4", "--flash": True})
    assert a.canonical() == b.canonical() == {"args": {"--flash": True, "--lr": "0.5", "--tp": "4"}, "env": {},
                                              "profile": False}
    assert a.key == b.key
    assert norm_value("core_attn  moe_act") == norm_value("core_attn moe_act") == "core_attn moe_act"


def test_different_recipes_have_different_keys():
    base = Recipe({"--tp": 4})
    others = [Recipe({"--tp": 2}), Recipe({"--tp": 4.0}), Recipe({"--tp": "True"}), Recipe({"--tp": 4}, {"X": "1"}),
              Recipe({"--tp": 4}, profile=True), Recipe({"--tp": 4, "--flash": True}), Recipe()]
    keys = {r.key for r in others}
    assert base.key not in keys and len(keys) == len(others)


def test_list_values_are_compared_by_all_their_words():
    """Every word of a list-valued flag counts (a key on the first word alone made these one recipe)."""
    a = Recipe({"--recompute-modules": "core_attn moe_act"})
    b = Recipe({"--recompute-modules": "core_attn layernorm"})
    assert a.key != b.key


def test_baseline_is_folded_in():
    base = Recipe({"--tp": 2, "--flash": True}, {"OMP_NUM_THREADS": "4"})
    same = [base.with_flat({}), base.with_flat({"--tp": "2"}), base.with_flat({"OMP_NUM_THREADS": 4}),
            base.with_changes({"--flash": True}), base.with_flat({"--absent": None, "--also": False, "UNSET": None})]
    assert {r.key for r in same} == {base.key}
    assert base.with_flat({"--flash": None}).key == base.with_flat({"--flash": False}).key != base.key
    assert base.with_flat({"OMP_NUM_THREADS": None}).env == {}


def test_diff_is_the_inverse_of_with_changes():
    base = Recipe({"--tp": 2, "--flash": True, "--pp": 4}, {"A": "1", "B": "2"})
    r = base.with_changes({"--tp": "2", "--flash": None, "--mbs": 3}, {"A": None, "C": "x"})
    args, env = r.diff(base)
    assert args == {"--flash": None, "--mbs": 3} and env == {"A": None, "C": "x"}
    assert base.with_changes(args, env).key == r.key


# ----------------------------------------------------------------------------------------- degrees


def test_degrees_from_flags():
    d = Recipe({"--tensor-model-parallel-size": "2", "--pipeline-model-parallel-size": 4,
                "--context-parallel-size": True}).degrees(64)
    assert (d.tp, d.pp, d.cp, d.ep, d.etp, d.vp, d.dp) == (2, 4, 1, 1, 2, 1, 8)  # ETP follows TP; a bare CP is 1
    assert ParallelDims.from_args({}, 8, etp_default=1).etp == 1
    assert d.flags(("tp", "pp", "cp", "vp")) == {DEGREE_FLAGS["tp"]: 2, DEGREE_FLAGS["pp"]: 4,
                                                  DEGREE_FLAGS["cp"]: 1, DEGREE_FLAGS["vp"]: 1}
    assert list(d.flags()) == list(DEGREE_FLAGS.values())


@pytest.mark.parametrize("dims, facts, needle", [
    (ParallelDims(96, tp=8, pp=8), {}, "world size (96) must be divisible by TP x PP x CP (8x8x1)"),
    (ParallelDims(16, vp=2), {}, "need PP >= 2"),
    (ParallelDims(16, pp=4, vp=2), {"layers": 30, "even_split": True}, "not divisible by PP x VP (4x2)"),
    (ParallelDims(16, pp=8, vp=4), {"layers": 30}, "cannot fill"),
    (ParallelDims(16, tp=4), {"heads": 6}, "TP 4 must divide the attention heads"),
    (ParallelDims(16, tp=4), {"groups": 2}, "TP 4 must divide the query groups"),
    (ParallelDims(16, ep=3, etp=1), {"experts": 128}, "EP 3 must divide the routed experts"),
    (ParallelDims(16, ep=2, etp=3), {"experts": 128, "moe_ffn": 1536 + 1}, "ETP 3 must divide the expert FFN"),
    (ParallelDims(16, tp=2, pp=4, ep=8, etp=2), {"experts": 128}, "must divide TP x CP x DP (2x1x2)"),
    (ParallelDims(16, cp=4), {"seq_length": 4100}, "divisible by 2 x CP (8)"),
    (ParallelDims(16, tp=2), {"global_batch": 100, "micro_batch": 3}, "micro batch x DP (3x8)"),
    (ParallelDims(16, tp=0), {}, "tp must be a positive integer"),
])
def test_each_degree_rule_is_checked(dims: ParallelDims, facts: dict[str, Any], needle: str):
    problems = dims.problems(**facts)
    assert any(needle in p for p in problems), problems


def test_a_valid_layout_has_no_problems():
    d = ParallelDims(128, tp=2, pp=8, cp=1, ep=16, etp=1, vp=2)
    assert d.dp == 8 and d.edp == 1
    assert d.problems(layers=96, heads=96, groups=8, experts=128, moe_ffn=1536, seq_length=4096,
                      global_batch=512, micro_batch=1, even_split=True) == []


# ----------------------------------------------------------------------------------------- argv

_FLAG = st.from_regex(r"--[a-z][a-z0-9\-]{0,20}", fullmatch=True)
_WORD = st.from_regex(r"[A-Za-z0-9_.,:/{}][A-Za-z0-9_.,:/{}\-]{0,12}", fullmatch=True)
_VALUE = st.one_of(
    st.just(True), st.just(False), st.none(),
    st.integers(-10**6, 10**9),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(_WORD, min_size=1, max_size=4).map(" ".join),
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_FLAG, _VALUE, max_size=8))
def test_argv_round_trip(args: dict[str, Any]):
    """Parsing the rendered command line gives the same recipe back (in canonical form)."""
    recipe = Recipe(args)
    prog, back = Recipe.from_argv(["python", "train.py", *recipe.argv()])
    assert prog == ["python", "train.py"]
    assert back.canonical() == recipe.canonical() and back.key == recipe.key
    assert render_args(back.args) == recipe.argv()  # and renders to the same words


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_FLAG, _VALUE, max_size=6), st.dictionaries(_FLAG, _VALUE, max_size=6))
def test_key_equality_is_canonical_equality(a: dict[str, Any], b: dict[str, Any]):
    ra, rb = Recipe(a), Recipe(b)
    assert (ra.key == rb.key) == (ra.canonical() == rb.canonical())
    assert (ra.key == rb.key) == (parse_argv(ra.argv())[1] == parse_argv(rb.argv())[1])


def test_parse_argv_forms():
    prog, args = parse_argv(["torchrun", "x.py", "--a=1", "--b", "--c", "x", "y", "--no-d"])
    assert prog == ["torchrun", "x.py"] and args == {"--a": "1", "--b": True, "--c": "x y", "--no-d": True}


# ----------------------------------------------------------------------------------------- tuner vs control plane

def _spec_with_space() -> tuple[Any, str]:
    """A campaign whose space spells the baseline's value another way, adds a bare flag and a variable
    (null: unset), on a baseline that sets the variable."""
    flag = "--fake-step-ms"
    spec = parse_spec(deep_update(FAKE_SPEC, {
        "baseline": {"env": {"OMP_NUM_THREADS": "1"}},
        "search_space": {flag: ["20", 20, 10], "--fake-variant": [None, True], "OMP_NUM_THREADS": [None, 1, "2"]},
        "control": {"env_allowlist": ["OMP_NUM_THREADS"]}}))
    return spec, flag


def test_tuner_identity_is_the_control_planes():
    """A candidate the tuner thinks new is never refused as identical, and vice versa: over every point
    of a space with spelling variants, the tuner's key is the control plane's recipe key."""
    from attune.tuners.factory import make_tuner

    spec, flag = _spec_with_space()
    gen = RunGenerator(spec)
    tuner = make_tuner(spec, "random", seed=0)
    space = tuner.space
    plane_keys, tuner_keys = {}, {}
    for combo in itertools.product(*space.values()):
        flat = dict(zip(space, combo, strict=True))
        for changes in (flat, tuner.diff(flat)):
            plane = gen.candidate(Changes(), parse_changes(split_changes(changes)), False).recipe_key
            assert tuner.key(changes) == plane
            plane_keys[repr(changes)], tuner_keys[repr(changes)] = plane, tuner.key(changes)
    # the baseline's value in another spelling is the baseline, on both sides
    assert tuner.key({flag: str(spec.baseline.args[flag])}) == gen.candidate(Changes(), Changes(), False).recipe_key
    assert len(set(plane_keys.values())) == len(set(tuner_keys.values()))


def test_random_tuner_never_proposes_a_recipe_the_plane_calls_identical():
    from attune.tuners.factory import make_tuner

    spec, _ = _spec_with_space()
    gen = RunGenerator(spec)
    seen = {gen.candidate(Changes(), Changes(), False).recipe_key}  # the calibrated baseline
    tuner = make_tuner(spec, "random", seed=3)
    proposed = 0
    while (cand := tuner.ask()) is not None:
        key = gen.candidate(Changes(), parse_changes(split_changes(cand.changes)), False).recipe_key
        assert key not in seen, f"identical recipe proposed again: {cand.changes}"
        seen.add(key)
        proposed += 1
    # every distinct recipe of the space ("20" and 20 are one value: 2 x 2 x 3) but the calibrated baseline
    assert proposed == 2 * 2 * 3 - 1


def test_flat_key_without_a_base_folds_nothing_but_spelling():
    assert recipe_key({"--x": 4}) == recipe_key({"--x": "4"}) != recipe_key({})
    base = Recipe({"--x": 4})
    assert recipe_key({"--x": "4"}, base) == recipe_key({}, base)
    assert RandomTuner({"--x": [4, "4", 5]}, {"--x": 4}).key({"--x": "4"}) == recipe_key({}, base)
