"""The campaign spec (`campaign.yaml`): a pydantic model, its JSON Schema, and its loader.

A campaign tunes one model on one cluster at a fixed GPU count, from a working baseline
recipe, under a GPU-hour budget. Everything the search may not change (the workload's
shape, the measurement window, the band, the gate's list) is pinned here; the spec is
frozen and hashed when the campaign starts.

`load_spec(path)` returns a validated `CampaignSpec` or raises `SpecError`, whose
`problems` list names every problem with its field path and what was expected.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attune.core import yamlsubset
from attune.core.campaign_paths import CAMPAIGN_FILE
from attune.core.errors import ControlError
from attune.core.recipe import ArgValue
from attune.readers.bounded import BoundedSafeLoader, InputError, check_strings, read_bytes, read_text

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "campaign.schema.json"

Backend = Literal["local", "slurm", "sim", "ray"]
Framework = Literal["megatron-lm", "megatron-bridge", "torchtitan"]
Precision = Literal["fp32", "bf16", "fp16", "fp8"]

PositiveInt = Annotated[int, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def is_flag_name(k: object) -> bool:
    """A Megatron-style flag: --name, no spaces."""
    return isinstance(k, str) and k.startswith("--") and len(k) >= 3 and not any(c.isspace() for c in k)


def is_env_name(k: object) -> bool:
    """An environment variable name: a letter or underscore, then letters, digits, underscores."""
    return (
        isinstance(k, str) and bool(k) and (k[0].isalpha() or k[0] == "_") and k.replace("_", "a").isalnum()
        and k.isascii()
    )


def check_flag_names(v: dict[str, ArgValue]) -> dict[str, ArgValue]:
    bad = [k for k in v if not is_flag_name(k)]
    if bad:
        raise ValueError(f"argument names must look like --flag-name, got {bad}")
    return v


def check_env_names(v: dict[str, str]) -> dict[str, str]:
    bad = [k for k in v if not is_env_name(k)]
    if bad:
        raise ValueError(f"environment variable names must be identifiers, got {bad}")
    return v


# runtime_env fields a campaign may give its Ray jobs (an allowlist: anything else is refused).
RAY_RUNTIME_ENV_FIELDS = ("env_vars", "working_dir", "py_modules", "pip", "uv", "conda", "image_uri", "py_executable")


class RayRuntimeEnv(_Strict):
    """The Ray runtime environment of every job of the campaign (fixed: no candidate changes it)."""

    env_vars: dict[str, str] = Field(
        default_factory=dict, description="environment variables set for the job on the cluster (RAY_* refused)"
    )
    working_dir: str | None = Field(
        None, min_length=1,
        description="code the job runs in: a remote URI (s3://, gs://, https://...zip) or a directory on the "
        "broker's machine that Ray uploads; the job then starts there instead of control.workdir",
    )
    py_modules: list[str] = Field(default_factory=list, description="Python modules (URIs or local dirs) Ray ships")
    pip: list[str] | None = Field(None, description="pip requirements Ray installs for the job")
    uv: list[str] | None = Field(None, description="uv requirements Ray installs for the job")
    conda: str | None = Field(None, min_length=1, description="name of a conda environment present on the nodes")
    image_uri: str | None = Field(None, min_length=1, description="container image the job runs in (Ray's image_uri)")
    py_executable: str | None = Field(None, min_length=1, description="the Python workers of the job use")

    @field_validator("env_vars")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        check_env_names(v)
        bad = [k for k in v if k.startswith(("RAY_", "ATTUNE_RAY_"))]
        if bad:
            raise ValueError(f"RAY_* and ATTUNE_RAY_* variables belong to Ray and the backend, got {bad}")
        return v

    def as_ray(self) -> dict[str, Any]:
        """The runtime_env dict the Jobs API takes (unset fields left out)."""
        return {k: v for k, v in self.model_dump().items() if v not in (None, [], {})}


class RayCluster(_Strict):
    """The Ray backend: which cluster (its Jobs API), what each job asks for, its runtime environment."""

    address: str = Field(
        "http://127.0.0.1:8265", pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="the cluster's dashboard (Jobs API) address, http(s)://host:port",
    )
    gpu_request: Literal["gpus", "none"] = Field(
        "gpus", description="gpus: each job asks for gpus_per_node GPUs; none: CPU ranks (a CPU-only cluster)"
    )
    cpus_per_job: float | None = Field(
        None, gt=0, description="CPUs each job asks for; default with gpu_request none: its ranks, else 1"
    )
    memory_gb: float | None = Field(None, gt=0, description="memory each job reserves (Ray's logical memory)")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each job asks for, e.g. accelerator_type:H100: 0.001"
    )
    label_selector: dict[str, str] = Field(
        default_factory=dict, description="node labels each job's node must match (Ray label selector syntax)"
    )
    runtime_env: RayRuntimeEnv = Field(default_factory=RayRuntimeEnv)
    placement_strategy: Literal["STRICT_SPREAD", "SPREAD", "PACK"] = Field(
        "STRICT_SPREAD", description="multi-node jobs: how their per-node bundles are placed (STRICT_SPREAD: one a node)"
    )
    submission_id_prefix: str = Field(
        "attune", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$", description="submission ids: <prefix>-<campaign>-<run>"
    )
    request_timeout_s: float = Field(30.0, gt=0, description="timeout of every request to the Jobs API")
    stop_timeout_s: float = Field(60.0, gt=0, description="how long a cancel waits for Ray to report the job stopped")

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, n in v.items() if not k or k in ("CPU", "GPU", "memory") or n <= 0]
        if bad:
            raise ValueError(f"custom resources need a name other than CPU/GPU/memory and a positive amount, got {bad}")
        return v


class Cluster(_Strict):
    """Where the jobs run. `settings` holds the backend's own options (slots, partition, ...); the ray
    backend's are the typed `ray` section instead."""

    backend: Backend = Field(description="which broker backend runs the jobs")
    gpus: PositiveInt = Field(description="GPUs (on the local CPU backend: ranks) every job uses; pinned")
    gpus_per_node: PositiveInt = Field(description="GPUs per node")
    accelerator: str = Field(min_length=1, description="accelerator kind, e.g. cpu, H100, H200, B200")
    price_per_gpu_hour: NonNegFloat = Field(0.0, description="price of one GPU-hour, for cost per million tokens")
    settings: dict[str, Any] = Field(default_factory=dict, description="backend-specific settings")
    ray: RayCluster | None = Field(None, description="the ray backend's settings (cluster.backend: ray)")

    @model_validator(mode="after")
    def _ray_section(self) -> Cluster:
        if self.ray is not None and self.backend != "ray":
            raise ValueError(f"the ray section is for cluster.backend: ray, not {self.backend}")
        if self.backend == "ray" and self.settings:
            raise ValueError("the ray backend takes its settings from cluster.ray, not cluster.settings")
        return self

    def backend_settings(self) -> dict[str, Any]:
        """What the backend is constructed with: `settings`, or the `ray` section for the ray backend."""
        if self.backend == "ray":
            return (self.ray or RayCluster()).model_dump()
        return dict(self.settings)

    @model_validator(mode="after")
    def _gpus_fill_nodes(self) -> Cluster:
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(
                f"gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node}) across nodes"
            )
        return self

    @property
    def nodes(self) -> int:
        return max(1, -(-self.gpus // self.gpus_per_node))


class Recipe(_Strict):
    """A runnable training job: command, Megatron-style arguments, environment, image."""

    command: list[str] = Field(
        min_length=1,
        description="argv prefix; may use {gpus}, {gpus_per_node}, {nodes}, {run_dir} placeholders",
    )
    args: dict[str, ArgValue] = Field(
        default_factory=dict,
        description="flag -> value; a bare flag is true, false or null means not given",
    )
    env: dict[str, str] = Field(default_factory=dict, description="environment variables of the job")
    image: str | None = Field(None, description="container image, where the backend has one")

    @field_validator("args")
    @classmethod
    def _flags_are_flags(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        return check_flag_names(v)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env_names(v)


class Workload(_Strict):
    """The fixed-shape workload, identical across candidates."""

    seq_length: PositiveInt = Field(description="tokens per row (every row is packed to exactly this)")
    global_batch: PositiveInt = Field(description="rows per optimizer step")
    precision: Precision = Field(description="training precision")
    steps_per_run: PositiveInt = Field(14, description="optimizer steps per measured run")
    window: tuple[int, int] = Field(
        (4, 13), description="measured window [first, last] in steps counted from 0, inclusive"
    )
    tokens_per_step: PositiveInt | None = Field(
        None, description="global_batch x seq_length; computed when omitted, checked when given"
    )
    flops_per_token: float | None = Field(None, gt=0, description="model FLOPs per token, for MFU")
    max_step_time_spread: float = Field(
        0.10,
        ge=0,
        description="largest coefficient of variation of the window's step times for a valid measurement",
    )

    @model_validator(mode="after")
    def _check(self) -> Workload:
        first, last = self.window
        if first < 0 or last < first:
            raise ValueError(f"window must be [first, last] with 0 <= first <= last, got [{first}, {last}]")
        if last >= self.steps_per_run:
            raise ValueError(
                f"window [{first}, {last}] lies outside the run's steps 0..{self.steps_per_run - 1}"
            )
        expected = self.global_batch * self.seq_length
        if self.tokens_per_step is not None and self.tokens_per_step != expected:
            raise ValueError(
                f"tokens_per_step {self.tokens_per_step} != global_batch x seq_length = {expected}"
            )
        return self

    @property
    def tokens(self) -> int:
        return self.tokens_per_step or self.global_batch * self.seq_length


class Budget(_Strict):
    """GPU-hours. Without `gpu_hours`, calibration sets it to `default_multiple` x one baseline run."""

    gpu_hours: float | None = Field(None, gt=0, description="total GPU-hours; default: 30 x one baseline run")
    default_multiple: float = Field(30.0, gt=0, description="budget = this x the calibration run cost")
    check_reserve_runs: int = Field(3, ge=0, description="correctness checks the reserve must pay for")
    reserve_gpu_hours: float | None = Field(
        None, ge=0, description=(
            "explicit check reserve (check runs are paid from it alone; search never uses it); default: "
            "(check_reserve_runs + gate.replicate_check_runs, + 1 for the baseline's reference check run where no "
            "calibration run ran as it) x one gate.convergence_steps-step check run")
    )
    concurrency: PositiveInt = Field(3, description="jobs in flight at once")
    infra_reserve_gpu_hours: NonNegFloat = Field(0.0, description=(
        "pays for infrastructure failures (not retries) while it covers the whole charge; once spent, "
        "infrastructure failures are charged to the budget"))
    overrun_factor: float = Field(2.0, ge=1.0, description=(
        "the monitor stops a run once it has used this many times its expected cost, or its expected cost "
        "plus its share of what the budget has left, whichever is lower (outcome overrun)"))
    overrun_grace_s: NonNegFloat = Field(30.0, description=(
        "the least wall-clock time, on the campaign's GPUs, that the overrun factor's arm allows a run above its "
        "expected cost (start-up jitter does not scale with the recipe); the budget's arm still applies"))

    @model_validator(mode="after")
    def _reserve_fits(self) -> Budget:
        if self.gpu_hours is not None and self.reserve_gpu_hours is not None and self.reserve_gpu_hours >= self.gpu_hours:
            raise ValueError(
                f"reserve_gpu_hours ({self.reserve_gpu_hours}) must be below gpu_hours ({self.gpu_hours})"
            )
        return self


class Calibration(_Strict):
    runs: int = Field(5, ge=5, description="baseline runs that set the mean and the band (at least 5)")


class Band(_Strict):
    floor: float = Field(0.03, ge=0, lt=1, description="lowest band, as a fraction")
    k_sigma: float = Field(3.0, gt=0, description="band = max(floor, k_sigma x relative sigma)")


class Gate(_Strict):
    lists: str | None = Field(None, description="correctness list file; default gate/lists/<model>.yaml")
    list_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="pinned SHA-256 of the list; a changed list is refused"
    )
    convergence_steps: int = Field(20, ge=5, description="steps of each correctness check run")
    replicate_check_runs: int | None = Field(None, ge=0, le=10, description=(
        "check runs of the baseline besides its reference run, paid from the reserve: the noise envelope of "
        "the convergence check (with the reference, 2 give 3 pairs of same-objective runs); default: none "
        "where the calibration runs (replicates of the baseline already) cover at least half of the check's "
        "judged steps, else 2 (attune.control.shipping.replicate_check_runs)"))


# Environment variables a candidate may change (glob patterns); the gate classifies them further.
DEFAULT_ENV_ALLOWLIST = (
    "NCCL_*",
    "TORCH_NCCL_*",
    "NVTE_*",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS",
)


class StackFixes(_Strict):
    """Fixed arguments and environment every job of the campaign gets; no candidate may change them."""

    args: dict[str, ArgValue] = Field(
        default_factory=dict, description="flag -> value added to every job (placeholders allowed)"
    )
    env: dict[str, str] = Field(default_factory=dict, description="environment variables added to every job")
    notes: str | None = Field(None, description="why each fix exists, for people")

    @field_validator("args")
    @classmethod
    def _flags(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        return check_flag_names(v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env_names(v)


class ControlSettings(_Strict):
    """How the control plane and its broker run jobs: time-outs, the run generator's allowlist, fixes."""

    workdir: str | None = Field(
        None, description="jobs' working directory, relative to the campaign directory; default: attune's source root"
    )
    env_allowlist: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ENV_ALLOWLIST),
        description="environment variables (glob patterns) a candidate may set or unset",
    )
    stack_fixes: StackFixes = Field(default_factory=StackFixes)
    hang_timeout_s: float = Field(1800.0, gt=0, description="a running job with no log progress this long is a hang")
    poll_interval_s: float = Field(5.0, gt=0, description="how often the broker checks running jobs")
    time_limit_s: float | None = Field(None, gt=0, description="wall-clock limit of one job, where the backend has one")
    expected_run_gpu_hours: float | None = Field(
        None, gt=0, description="expected cost of one run until runs have finished (then their mean is used)"
    )
    profile_args: dict[str, ArgValue] = Field(
        default_factory=lambda: {"--profile": True}, description="arguments a profiled run adds"
    )
    profile_extra_steps: int = Field(3, ge=0, description="steps a profiled run adds after the window (for its cost)")
    image_roots: dict[str, str] = Field(
        default_factory=dict,
        description="local backend: name -> directory (relative to workdir) the agent may read as the training image",
    )

    @field_validator("profile_args")
    @classmethod
    def _profile_flags(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        return check_flag_names(v)

    @field_validator("env_allowlist")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if not p or any(c.isspace() for c in p)]
        if bad:
            raise ValueError(f"allowlist entries must be non-empty names or glob patterns, got {bad}")
        return v


class Environment(_Strict):
    """The Python environment the jobs run with (the local backend; on Slurm the job's image is its environment).

    The command's leading `python` / `python3` runs with this interpreter. Before a launch the
    control plane checks that it can import `imports`, and refuses the launch (code `environment`,
    with the fix) when it cannot: nothing is admitted or charged for a job that could not start."""

    python: str | None = Field(None, min_length=1, description=(
        "the interpreter (a path, relative to the campaign directory, or a name on PATH); default: attune's own "
        "interpreter when it has `imports`, else the environment attune builds from `packages`"))
    packages: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list, description=(
        "pip requirements of the workload, pinned (e.g. torch==2.13.0): what attune installs when it builds the "
        "environment (the broker's workload_environment tool, or attune tune)"))
    imports: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]] = Field(
        default_factory=list, description="modules every job imports; checked before each launch")


class CampaignSpec(_Strict):
    """A tuning campaign: one model, one cluster, a fixed GPU count, a budget."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="campaign name")
    model: str = Field(min_length=1, description="model name; selects the correctness lists")
    framework: Framework = Field(description="training framework; selects the log format")
    cluster: Cluster
    baseline: Recipe
    workload: Workload
    budget: Budget = Field(default_factory=Budget)
    calibration: Calibration = Field(default_factory=Calibration)
    band: Band = Field(default_factory=Band)
    gate: Gate = Field(default_factory=Gate)
    control: ControlSettings = Field(default_factory=ControlSettings)
    environment: Environment | None = Field(None, description=(
        "the jobs' Python environment on the local backend; unset: attune's own interpreter, unchecked"))
    search_space: dict[str, list[ArgValue]] = Field(
        default_factory=dict, description="flag -> candidate values, for the built-in tuners"
    )
    notes: str | None = Field(None, description="free text for people")

    def metrics_options(self) -> dict[str, Any]:
        """How this campaign's logs are scored: the metrics reader's options, one definition for the control
        plane and the metrics server (`read_metrics(path, **spec.metrics_options(), ...)`)."""
        return {"framework": self.framework, "gpus": self.cluster.gpus, "window": tuple(self.workload.window),
                "seq_length": self.workload.seq_length, "global_batch_size": self.workload.global_batch,
                "max_spread": self.workload.max_step_time_spread, "hang_after_s": self.control.hang_timeout_s}


class SpecError(ControlError):
    """A campaign file that cannot be used. `problems` lists (field path, message)."""

    def __init__(self, path: Path | str, problems: list[tuple[str, str]]) -> None:
        self.path = str(path)
        self.problems = problems
        lines = [f"{path}: {len(problems)} problem(s)"] + [f"  {loc}: {msg}" for loc, msg in problems]
        super().__init__("\n".join(lines))

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "problems": [{"field": f, "message": m} for f, m in self.problems]}


MAX_SPEC_BYTES = 2**20  # a campaign.yaml is a page or two


class _UniqueKeyLoader(BoundedSafeLoader):
    """A safe loader (bounded nesting and aliases) that refuses duplicate keys instead of keeping the
    last one silently."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _describe(err: dict[str, Any]) -> str:
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err["type"] == "missing":
        return "required field is missing"
    if err["type"] == "extra_forbidden":
        return "unknown field (not part of the campaign spec)"
    if "input" in err and err["type"] not in ("model_type", "dict_type"):
        shown = repr(err["input"])
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg += f" (got {shown})"
    return msg


def problems_from_validation(exc: ValidationError) -> list[tuple[str, str]]:
    return [(_loc(tuple(e["loc"])), _describe(dict(e))) for e in exc.errors()]


def parse_spec(data: Any, source: str = "<campaign>") -> CampaignSpec:
    if not isinstance(data, dict):
        raise SpecError(source, [("(top level)", f"expected a mapping of fields, got {type(data).__name__}")])
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, problems_from_validation(exc)) from None


_PARSED: dict[str, Any] = {}  # a spec's text -> its checked YAML data (parsed once per content)
_PARSED_MAX = 8


def load_spec(path: Path | str) -> CampaignSpec:
    """Read and validate a campaign.yaml (or a campaign directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / CAMPAIGN_FILE
    if not os.path.lexists(p):
        raise SpecError(p, [("(file)", "no such file")])
    try:
        text = read_text(p, "campaign spec", MAX_SPEC_BYTES)
    except InputError as exc:
        raise SpecError(p, [("(file)", str(exc).replace(f"campaign spec {p}: ", ""))]) from None
    if text in _PARSED:  # the same bytes parse to the same data: parse them once (a campaign reads its spec often)
        return parse_spec(copy.deepcopy(_PARSED[text]), str(p))
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        check_strings(data, "the spec")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(yaml)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(p, [(where, f"invalid YAML: {problem}")]) from None
    except RecursionError:
        raise SpecError(p, [("(yaml)", "invalid YAML: nested too deeply")]) from None
    except InputError as exc:
        raise SpecError(p, [("(yaml)", str(exc))]) from None
    _same_in_the_subset(p, text, data)
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.pop(next(iter(_PARSED)))
    _PARSED[text] = copy.deepcopy(data)
    return parse_spec(data, str(p))


def _same_in_the_subset(path: Path, text: str, data: Any) -> None:
    """The hooks and the plugin's launcher read campaign.yaml with the core's strict YAML subset (they
    have no YAML library): a spec they would read otherwise, or not at all, is refused here, so the list
    file the gate uses is the one the hook write-protects."""
    try:
        same = yamlsubset.loads(text) == data
    except yamlsubset.YamlSubsetError as exc:
        raise SpecError(path, [("(yaml)", f"outside the YAML subset attune's hooks read: {exc}")]) from None
    if not same:
        raise SpecError(path, [("(yaml)", "attune's hooks would read this YAML differently; write it plainly")])


def spec_sha256(path: Path | str) -> str:
    """SHA-256 of the spec file's bytes, pinned in the ledger when the campaign starts."""
    p = Path(path)
    if p.is_dir():
        p = p / CAMPAIGN_FILE
    return hashlib.sha256(read_bytes(p, "campaign spec", MAX_SPEC_BYTES)).hexdigest()


def json_schema() -> dict[str, Any]:
    schema = CampaignSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "urn:attune:schema:campaign"
    return schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
