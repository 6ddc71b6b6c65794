"""The broker's wire format is defined once (broker/wire.py): the service validates requests and builds
answers with it, the MCP server sends and reads the same models, and a real campaign's answers carry
no field the models do not declare."""

from __future__ import annotations

import ast
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.testclient import TestClient

from attune.control.plane import LaunchRequest
from broker import service, wire
from broker.campaigns import CampaignHandle
from tests._broker_helpers import make_campaign, search, wait_for
from tests.test_launch import CALIBRATED_BUDGET, calibrate

ROOT = Path(__file__).resolve().parents[1]


def undeclared(model: BaseModel, where: str = "") -> list[str]:
    """Every field of an answer (nested answers included) that its model does not declare."""
    out = [f"{where}{type(model).__name__}.{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for v in items:
            if isinstance(v, BaseModel):
                out += undeclared(v, f"{where}{name}/")
    return out


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    d = make_campaign(tmp_path_factory.mktemp("wire"), "wire-a", budget=CALIBRATED_BUDGET)
    calibrate(CampaignHandle(d))
    broker = service.build_broker([d])
    token = service.load_or_create_token(d)
    with TestClient(broker.app(), headers={"Authorization": f"Bearer {token}"}) as tc:
        yield tc, d


def test_every_answer_of_a_real_campaign_fits_its_model(client: tuple[TestClient, Path]) -> None:
    tc, _ = client
    r = tc.post("/v1/runs", json=search({"--fake-step-ms": 10}))
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    wait_for(lambda: tc.get(f"/v1/runs/{run_id}").json()["status"] == "finished", timeout_s=60)
    refused = tc.post("/v1/runs", json=search({"--fake-step-ms": 10}))  # the same recipe again
    assert refused.status_code == 409
    answers: list[tuple[type[BaseModel], Any]] = [
        (wire.Health, tc.get("/v1/health")),
        (wire.LaunchAnswer, r),
        (wire.LaunchAnswer, refused),
        (wire.CampaignSummary, tc.get("/v1/campaign")),
        (wire.RunList, tc.get("/v1/runs", params={"limit": 3})),
        (wire.RunInfo, tc.get(f"/v1/runs/{run_id}")),
        (wire.LinesPage, tc.get(f"/v1/runs/{run_id}/log", params={"tail": 5})),
        (wire.LinesPage, tc.get(f"/v1/runs/{run_id}/log", params={"offset_line": 1, "max_lines": 3})),
        (wire.SearchAnswer, tc.get(f"/v1/runs/{run_id}/log/search", params={"pattern": "iteration"})),
        (wire.DirPage, tc.get(f"/v1/runs/{run_id}/files")),
        (wire.LinesPage, tc.get(f"/v1/runs/{run_id}/files/log.txt")),
        (wire.DirPage, tc.get("/v1/image/list")),
        (wire.LinesPage, tc.get("/v1/image/read", params={"path": "fake_trainer.py", "max_lines": 3})),
        (wire.SearchAnswer, tc.get("/v1/image/search", params={"pattern": "def ", "max_results": 2})),
        (wire.CancelAnswer, tc.post(f"/v1/runs/{run_id}/cancel", json={})),
        (wire.Recorded, tc.post("/v1/assumptions", json={"question": "q?", "default": "d"})),
        (wire.Recorded, tc.post("/v1/diagnoses", json={"run_id": run_id, "diagnosis": "compute bound"})),
        (wire.StopRefused, tc.post("/v1/stop", json={"levers_tested": ["never-run"], "diagnosis": "x"})),
        (wire.Recorded, tc.post("/v1/stop", json={"levers_tested": ["step"], "diagnosis": "x"})),
        (wire.ErrorAnswer, tc.get("/v1/nowhere")),
        (wire.ErrorAnswer, tc.post("/v1/stop", json={"levers_tested": ["step"], "diagnosis": "again"})),
    ]
    for model, res in answers:
        assert res.status_code < 500, (model.__name__, res.text)
        parsed = model.model_validate(res.json())
        assert undeclared(parsed) == [], (model.__name__, res.request.url)
    again = answers[-1][1]  # a second stop: refused by code, which the tuner plane matches (never the prose)
    assert again.status_code == 409 and again.json()["error"] == "stop_already_recorded"
    summary = wire.CampaignSummary.model_validate(answers[3][1].json())
    status = wire.CampaignStatus.of(summary)  # the MCP tool's view of the same answer
    assert status.name == "wire-a" and status.calibration.band is not None and status.stop_recorded is False


def test_bad_queries_and_bodies_are_refused_naming_the_field(client: tuple[TestClient, Path]) -> None:
    tc, _ = client
    r = tc.get("/v1/runs", params={"limit": 0})
    assert r.status_code == 400 and r.json()["error"] == "bad_request" and "limit" in r.json()["reason"]
    r = tc.get("/v1/runs", params={"status": "nonsense"})
    assert r.status_code == 400 and "status" in r.json()["reason"]
    r = tc.get("/v1/image/read")
    assert r.status_code == 400 and "path" in r.json()["reason"]
    r = tc.post("/v1/assumptions", json={"question": "q", "default": "d", "sneaky": 1})
    assert r.status_code == 422 and "sneaky" in r.json()["reason"]
    r = tc.post("/v1/stop", json={"diagnosis": "x"})
    assert r.status_code == 422 and "levers_tested" in r.json()["reason"]
    r = tc.post("/v1/runs", json={"kind": "nonsense"})
    assert r.status_code == 422 and "kind" in r.json()["reason"]


def test_a_broken_answer_is_the_brokers_fault_not_the_requests() -> None:
    with pytest.raises(service._WireError, match="RunInfo"):
        service.answer(wire.RunInfo, {"run_id": "r1"})  # no kind


def test_handlers_have_one_typed_signature() -> None:
    for route in service.ROUTES:
        hints = typing.get_type_hints(route.handler, globalns=vars(service))
        assert hints == {"c": service.Call, "return": service.Reply}, route.name


def test_the_run_fields_are_all_declared() -> None:
    """RunInfo declares every field of a run the broker shows (a new RunState field must be added)."""
    from attune.core.state import RunState

    # the fields the broker leaves out of a run's summary (broker/campaigns.py run_summary)
    shown = set(RunState.__dataclass_fields__) - {"code_locations", "admitted_seq", "admitted_ts", "finished_seq"}
    assert shown <= set(wire.RunInfo.model_fields)


def test_the_launch_request_is_the_control_planes() -> None:
    assert wire.LaunchRequest is LaunchRequest


def test_the_mcp_server_speaks_only_wire_models() -> None:
    """No hand-built request dict and no copy of a wire model in the MCP server."""
    src = (ROOT / "mcp_servers" / "broker_server.py").read_text()
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_call":
            for kw in node.keywords:
                if kw.arg in ("body", "query", "params"):
                    assert not isinstance(kw.value, ast.Dict), ast.unparse(node)
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert not classes & set(wire.__all__), classes & set(wire.__all__)
