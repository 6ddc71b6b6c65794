"""A TTB entry: one directory per entry, described by `entry.json` (versioned schema).

    <entry>/entry.json            this model (schema `ttb-entry-v1`)
    <entry>/recipe/run.sh         the recipe as a runnable script (from the campaign's shipped/)
    <entry>/recipe/job.json       the resolved job
    <entry>/evidence/...          campaign.yaml, ledger.jsonl, shipped evidence, measurement and check
                                  run logs, curves and resolved arguments

Every file the entry relies on is listed in `files` with its SHA-256, so `attune ttb verify` can
tell an edited file from the one that was submitted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attune.core.errors import TTBError
from attune.core.recipe import ArgValue

SCHEMA_VERSION = "ttb-entry-v1"
ENTRY_FILE = "entry.json"
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "ttb-entry.schema.json"
SIM_LABEL = "simulated, not a measurement"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hardware(_Strict):
    accelerator: str = Field(min_length=1, description="accelerator kind, e.g. H100, B200, cpu")
    gpus: int = Field(gt=0, description="GPUs (CPU ranks on the local backend)")
    gpus_per_node: int = Field(gt=0)
    nodes: int = Field(gt=0)
    backend: Literal["local", "slurm", "sim", "ray"] = Field(description="where the campaign ran")


class Software(_Strict):
    framework: str = Field(description="training framework")
    framework_version: str | None = Field(None, description="the framework's version where the logs state it")
    image: str | None = Field(None, description="container image")
    attune_version: str


class Recipe(_Strict):
    command: list[str]
    args: dict[str, ArgValue] = Field(description="the shipped recipe's arguments (stack fixes included)")
    env: dict[str, str]
    changes_from_campaign_baseline: dict[str, Any] = Field(description="args/env the campaign changed")
    diff_from_public_recipe: dict[str, Any] = Field(
        description="flag -> {public, entry} for every argument that differs from the model's public recipe")
    public_recipe: str | None = Field(None, description="where the model's public recipe comes from")
    script: str = Field(description="the runnable script, relative to the entry directory")


class Throughput(_Strict):
    tokens_per_s_per_gpu: float = Field(gt=0, description="mean of the shipped recipe's re-measurements")
    runs: list[str] = Field(min_length=1, description="re-measurement run ids (their logs are in evidence/)")
    values: list[float] = Field(min_length=1)
    baseline_tokens_per_s_per_gpu: float | None = None
    gain: float | None = Field(None, description="over the campaign's baseline, fraction")
    calibration_mean: float
    calibration_rel_sigma: float
    band: float = Field(description="the campaign's noise band max(floor, k sigma), fraction")
    calibration_runs: list[str]
    mfu: float | None = Field(None, description="model FLOPs utilisation, where FLOPs per token and peak are known")


class Cost(_Strict):
    price_per_gpu_hour: float | None = Field(description="from the leaderboard's price table, per accelerator")
    usd_per_million_tokens: float | None
    price_table: str = Field(description="which table and row")


class Gate(_Strict):
    list_sha256: str | None
    candidate_check_run: str | None
    baseline_check_run: str | None
    layer1: dict[str, Any] | None
    convergence: dict[str, Any] | None
    passed: bool
    shipped_baseline: bool = Field(description="no candidate passed or none beat the band: the baseline ships")


class LedgerHead(_Strict):
    rows: int
    last_hash: str
    authenticated: bool = Field(False, description="an HMAC over the head, where the ledger has a key")
    mac: str | None = None
    source_last_hash: str | None = Field(
        None, description="the campaign's own ledger head, before submit made its paths relative (attune.ttb.paths) "
        "and rebuilt the chain; the same as last_hash when the ledger held no machine path")


class Entry(_Strict):
    schema_version: Literal["ttb-entry-v1"] = SCHEMA_VERSION
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    submitted: str = Field(description="UTC time of submission")
    protocol: str = Field(description="ttb-v1, or ttb-v1-local (CPU-example scale, never ranked with ttb-v1)")
    simulated: bool = Field(description=f"true: the simulated cluster; labelled '{SIM_LABEL}'")
    label: str | None = Field(None, description="shown next to the entry on the page")
    model: str
    campaign: str
    hardware: Hardware
    software: Software
    recipe: Recipe
    throughput: Throughput
    cost: Cost
    gate: Gate
    ledger: LedgerHead
    supersedes: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(description="path in the entry -> SHA-256, every evidence file")


class EntryError(TTBError, ValueError):
    """An entry that cannot be read (names the file and the field)."""


def load_entry(directory: str | Path) -> Entry:
    p = Path(directory) / ENTRY_FILE
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EntryError(f"{p}: no such file") from None
    except (OSError, ValueError) as exc:
        raise EntryError(f"{p}: cannot read: {exc}") from None
    try:
        return Entry.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        raise EntryError(f"{p}: {loc}: {e['msg']}") from None


def json_schema() -> dict[str, Any]:
    s = Entry.model_json_schema()
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    s["$id"] = "urn:attune:schema:ttb-entry"
    return s


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------------- price table


class PriceTable(_Strict):
    name: str
    currency: Literal["USD"] = "USD"
    source: str = Field(description="where the prices come from, for people")
    per_gpu_hour: dict[str, float] = Field(description="accelerator -> price of one GPU-hour")


DEFAULT_PRICES = Path(__file__).resolve().parents[2] / "ttb" / "prices.yaml"


def load_prices(path: str | Path | None = None) -> PriceTable:
    p = Path(path) if path else DEFAULT_PRICES
    try:
        return PriceTable.model_validate(yaml.safe_load(p.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as exc:
        raise EntryError(f"{p}: cannot read the price table: {exc}") from None
    except ValidationError as exc:
        e = exc.errors()[0]
        raise EntryError(f"{p}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}") from None


def usd_per_million(tokens_per_s_per_gpu: float, price_per_gpu_hour: float | None) -> float | None:
    """Cost of a million tokens: one GPU makes tokens_per_s_per_gpu x 3600 tokens an hour."""
    if price_per_gpu_hour is None or tokens_per_s_per_gpu <= 0:
        return None
    return price_per_gpu_hour / (tokens_per_s_per_gpu * 3600.0) * 1e6
