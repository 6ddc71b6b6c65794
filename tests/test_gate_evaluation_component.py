"""Component tests on tinygpt: the 2x rule, routing identity, and agreement with the lists' records."""

from __future__ import annotations

import math

import pytest

from gate.evaluation import component
from gate.lists import load_list

torch = pytest.importorskip("torch")
pytest.importorskip("examples.tinygpt.model")

SMALL = dict(num_layers=2, hidden_size=64, seq_length=64, rows=4, microbatches=4)


def test_judge_rule():
    assert component.judge(1e-7, 1.9e-7)[0] is True
    assert component.judge(1e-7, 2.1e-7)[0] is False
    assert component.judge(1e-7, 1e-7, routing_identical=False)[0] is False
    assert component.judge(0.0, 0.0)[0] is True  # both exact: floored, ratio 1
    assert component.judge(1e-7, math.nan)[0] is False


def test_relative_error():
    a = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    b = [torch.tensor([1.0, 2.0]), torch.tensor([4.0])]
    assert component.relative_error(a, a) == 0.0
    assert component.relative_error(a, b) == pytest.approx(1 / math.sqrt(21))


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_impl_swap_passes_and_the_list_records_it(impl):
    r = component.optimizer_impl_test(impl, component.TinyShapes(**SMALL))
    assert r.passed, r.reason
    assert 0 < r.default_error < 1e-4 and r.ratio <= 2.0
    entry = load_list("tinygpt").clist.args["optimizer_impl"]
    assert entry.component_test == "passed" and impl in entry.values


def test_optimizer_impl_swap_keeps_routing_on_the_moe_model():
    r = component.optimizer_impl_test("foreach", component.TinyShapes(**SMALL, num_experts=4))
    assert r.model == "tinygpt-moe"
    assert r.routing_identical is True and r.routing_total > 0 and r.routing_mismatches == 0
    assert r.passed
    assert load_list("tinygpt-moe").clist.args["optimizer_impl"].component_test == "passed"


def test_bf16_gradient_accumulation_control_fails():
    r = component.grad_reduce_bf16_control(component.TinyShapes(**SMALL))
    assert r.control and not r.passed
    assert r.ratio > 100, r  # BF16 accumulation is orders of magnitude off the FP32 path
    assert load_list("tinygpt").clist.args["grad_reduce_in_bf16"].klass == "numeric"


def test_routing_comparison_detects_a_changed_router():
    shapes = component.TinyShapes(**SMALL, num_experts=4)
    model, data = component._build(shapes)
    tokens, _ = component._batch(data, 0, shapes.rows)
    a = component._routing(model, tokens)
    with torch.no_grad():
        model.layers[0].mlp.router.weight.mul_(-1.0)
    b = component._routing(model, tokens)
    same, mismatches, total = component._routing_compare(a, b)
    assert not same and 0 < mismatches <= total


@pytest.mark.slow
def test_torch_compile_outcome_matches_the_list():
    """Slow on CPU (about a minute): torch.compile's recorded status on tinygpt is what the test finds."""
    r = component.torch_compile_test()
    recorded = load_list("tinygpt").clist.args["torch_compile"].component_test
    assert recorded == ("passed" if r.passed else "failed"), r
