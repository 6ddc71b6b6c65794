"""The broker MCP server: the agent's hands on the cluster, over stdio.

Every tool is a thin call to the campaign's broker over HTTP with the campaign's token; the broker
decides (admission, the gate's layer 1, identical-recipe rule, budget), runs, watches, charges and
records. A refusal comes back as an ordinary result (`admitted: false`, a `code` and a `reason`
that says what to change), never as a crash.

Tools: start_campaign, workload_environment, launch_candidate, launch_calibration, run_status, list_runs, cancel_run, read_run_log,
search_run_log, list_image_dir, read_image_file, search_image, record_assumption, record_stop,
campaign_status; and ttb_best_known_recipe (TrainingThroughputBench's best verified recipe for the
campaign's model and accelerator, read locally: a prior, not a measurement).

Configuration (environment, set by the plugin's .mcp.json or the launcher):
- ``ATTUNE_CAMPAIGN_DIR``: the campaign directory (default: the working directory).
- ``ATTUNE_TTB_ENTRIES``: TrainingThroughputBench entries (default: ttb/entries beside attune's source).
- ``ATTUNE_BROKER_URL`` and ``ATTUNE_BROKER_TOKEN``: a shared broker run by someone else. Without
  them the server starts the campaign's local broker on loopback on first use (the embedded default).

Logs go to stderr only; stdout is the transport. Run: ``python -m mcp_servers.broker_server``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import httpx
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field, ValidationError

from attune.core.campaign_paths import CAMPAIGN_FILE
from broker import wire
from broker.client import BrokerUnavailable, Endpoint, endpoint_for
from broker.wire import CampaignStatus, CandidateChanges, LaunchResult, Value

log = logging.getLogger("attune.broker_server")

A = TypeVar("A", bound=BaseModel)

server = MCPServer(
    name="attune-broker",
    instructions=(
        "The only way to run jobs on the campaign's cluster. Launch one candidate per hypothesis with "
        "launch_candidate, follow it with run_status / read_run_log, read the framework source in the "
        "training image with search_image / read_image_file before using a flag, and record a stop with "
        "evidence when the remaining budget will not find a faster recipe."
    ),
)


# ----------------------------------------------------------------------------------- HTTP


class _Conn:
    endpoint: Endpoint | None = None
    client: httpx.AsyncClient | None = None


_conn = _Conn()


def _campaign_dir() -> Path:
    return Path(os.environ.get("ATTUNE_CAMPAIGN_DIR") or os.getcwd()).resolve()


def _started(d: Path) -> bool:
    from attune.core.ledger import LedgerError
    from attune.core.state import load

    try:
        return load(d)[0].name is not None
    except (LedgerError, OSError):
        return True  # let the broker say what is wrong with the ledger


async def _client() -> httpx.AsyncClient:
    if _conn.client is None:
        if not os.environ.get("ATTUNE_BROKER_URL") and not await anyio.to_thread.run_sync(_started, _campaign_dir()):
            raise ToolError(f"the campaign in {_campaign_dir()} has not started: call start_campaign first (it "
                            "validates campaign.yaml, freezes it and writes the first ledger row)")
        try:
            ep = await anyio.to_thread.run_sync(endpoint_for, _campaign_dir())
        except BrokerUnavailable as exc:
            raise ToolError(f"the broker is unavailable: {exc}") from None
        _conn.endpoint = ep
        _conn.client = httpx.AsyncClient(base_url=ep.url, headers={"Authorization": f"Bearer {ep.token}"},
                                         timeout=120.0)
        log.info("broker at %s%s", ep.url, " (started)" if ep.started else "")
    return _conn.client


async def _call(method: str, path: str, answer: type[A], *, query: BaseModel | None = None,
                body: BaseModel | None = None, ok_codes: tuple[int, ...] = (200, 201)) -> A:
    """One broker request: the query and body from their wire models, the answer read into its own."""
    client = await _client()
    params = query.model_dump(mode="json", exclude_none=True) if query is not None else None
    try:
        r = await client.request(method, path, params=params,
                                 json=body.model_dump(mode="json") if body is not None else None)
    except httpx.HTTPError as exc:
        _conn.client = None  # reconnect (or restart the local broker) on the next call
        raise ToolError(f"the broker did not answer ({type(exc).__name__}: {exc}); try again") from None
    try:
        payload = r.json()
    except ValueError:
        payload = {"error": "bad_response", "reason": r.text[:500]}
    if r.status_code not in ok_codes:
        err = payload if isinstance(payload, dict) else {}
        raise ToolError(f"{err.get('error', r.status_code)}: {err.get('reason', payload)}")
    try:
        return answer.model_validate(payload)
    except ValidationError as exc:
        raise ToolError(f"the broker's answer does not fit {answer.__name__}: {exc}") from None


# ----------------------------------------------------------------------------------- models
# The broker's requests and answers are broker/wire.py's models, shared with the broker itself.


class Started(BaseModel):
    """The campaign is started: its spec frozen and hashed, its first ledger row written."""

    started: bool
    already_started: bool = Field(description="true when the ledger already had its campaign_started row")
    name: str
    campaign_dir: str
    spec_sha256: str
    rows: int
    environment: dict[str, Any] | None = Field(None, description=(
        "the workload's Python environment (local backend): state ready | missing | building | failed, and the fix"))
    next: str = Field(description="what to do next")


class WorkloadEnvironment(BaseModel):
    """The Python environment the campaign's jobs run with (local backend)."""

    state: str = Field(description="ready | missing | building | failed | unchecked")
    python: str | None = None
    source: str | None = Field(None, description="spec (environment.python), attune (attune's own), built")
    packages: list[str] = Field(default_factory=list)
    imports: list[str] = Field(default_factory=list)
    directory: str | None = Field(None, description="where attune builds it")
    reason: str = ""
    fix: str | None = None
    log: str | None = None
    progress: list[str] = Field(default_factory=list, description="the build's latest lines")
    elapsed_s: float | None = None


# ----------------------------------------------------------------------------------- tools


def _load_spec_or_fail() -> Any:
    from attune.control.spec import SpecError, load_spec

    d = _campaign_dir()
    if not (d / CAMPAIGN_FILE).is_file():
        raise ToolError(f"no campaign.yaml in {d}: open Claude Code in a campaign directory (one holding campaign.yaml)")
    try:
        return load_spec(d / CAMPAIGN_FILE)
    except SpecError as exc:
        raise ToolError(str(exc)) from None


@server.tool()
async def start_campaign() -> Started:
    """Start the campaign of this directory, as `attune init` does: validate campaign.yaml, freeze and
    hash it, write the ledger's first row. Call it once, first; calling it again is harmless (it says the
    campaign already started). A spec with problems comes back as an error listing every problem with
    its field path (fix campaign.yaml, then call it again). Also says whether the workload's Python
    environment is ready (see workload_environment)."""
    from attune.control import campaign as campaign_mod
    from attune.control import workenv
    from attune.control.spec import SpecError
    from attune.core.ledger import LedgerError
    from attune.core.state import load

    d = _campaign_dir()
    _load_spec_or_fail()
    try:
        before, _ = await anyio.to_thread.run_sync(load, d)
        spec, state = await anyio.to_thread.run_sync(campaign_mod.start, d)
    except SpecError as exc:
        raise ToolError(str(exc)) from None
    except (campaign_mod.CampaignError, LedgerError) as exc:
        raise ToolError(f"the campaign cannot start: {exc}") from None
    env = await anyio.to_thread.run_sync(workenv.status, spec, d)
    if env.state in ("missing", "failed"):
        nxt = f"the workload's environment is not ready ({env.reason}); {env.fix}"
    elif env.state == "building":
        nxt = "the workload's environment is building: follow it with workload_environment, then calibrate"
    else:
        nxt = "calibrate the baseline: launch_calibration until campaign_status shows the band"
    return Started(started=True, already_started=before.name is not None, name=spec.name, campaign_dir=str(d),
                   spec_sha256=str(state.spec_sha256), rows=state.last_seq + 1,
                   environment=None if env.state == "unchecked" else env.as_dict(), next=nxt)


@server.tool()
async def workload_environment(
    build: Annotated[bool, Field(description="start building it when it is missing (a few minutes, once)")] = False,
) -> WorkloadEnvironment:
    """The Python environment the campaign's jobs run with on the local backend, and whether it is ready.
    A launch is refused (code environment) until it is. With build=true, attune builds the environment
    the spec lists (environment.packages, e.g. PyTorch CPU) into its data directory in the background;
    call again to follow its progress until state is ready."""
    from attune.control import workenv

    spec = _load_spec_or_fail()
    d = _campaign_dir()
    fn = workenv.start_build if build else workenv.status
    st = await anyio.to_thread.run_sync(fn, spec, d)
    return WorkloadEnvironment.model_validate(st.as_dict())



@server.tool()
async def launch_candidate(
    changes: CandidateChanges,
    hypothesis: Annotated[str, Field(description="the bottleneck this candidate should shrink, and the mechanism")],
    lever: Annotated[str, Field(description="the lever (or coupled set of parallelism degrees) it changes")],
    expected_gain: Annotated[float, Field(description="expected relative throughput gain, e.g. 0.05 for 5%")],
    code_locations: Annotated[dict[str, str], Field(description=(
        "for every flag new to the recipe: where the running image implements it (path:line), read with "
        "search_image/read_image_file"))] | None = None,
    profile: Annotated[bool, Field(description="trace extra steps after the measured window (costs more)")] = False,
    base: Annotated[str, Field(description="apply the changes to: leader (default), baseline, or a run id")] = "leader",
) -> LaunchResult:
    """Launch one search candidate: `changes` applied to the leader's recipe (or `base`).

    Call it once per hypothesis, changing one lever (or one coupled set of parallelism degrees).
    The control plane checks the change against the correctness gate, refuses a recipe that already
    ran, and admits it only if its expected cost fits the remaining budget. A refusal is an ordinary
    result with `admitted: false`, a `code` and a `reason` saying what to change. When admitted, follow
    the run with run_status and read_run_log.
    """
    req = wire.LaunchRequest(kind="search", changes=changes.model_dump(), hypothesis=hypothesis, lever=lever,
                             expected_gain=expected_gain, code_locations=code_locations or {}, profile=profile,
                             base=base)
    return LaunchResult.of(await _call("POST", "/v1/runs", wire.LaunchAnswer, body=req, ok_codes=(201, 409)))


@server.tool()
async def launch_calibration() -> LaunchResult:
    """Launch one calibration run of the unchanged baseline.

    Call it at the start of a campaign until campaign_status shows the calibration complete (at least
    five good baseline runs set the mean and the noise band, and with them the budget). Refused once
    enough calibration runs are done or in flight.
    """
    req = wire.LaunchRequest(kind="calibration")
    return LaunchResult.of(await _call("POST", "/v1/runs", wire.LaunchAnswer, body=req, ok_codes=(201, 409)))


@server.tool()
async def run_status(run_id: str) -> wire.RunInfo:
    """One run's state: queued, running (with log progress), or finished with its outcome, throughput,
    validity, verdict against the leader and its charge. Poll it while a run is in flight."""
    return await _call("GET", f"/v1/runs/{run_id}", wire.RunInfo)


@server.tool()
async def list_runs(
    status: Annotated[wire.RunStatusFilter | None, Field(description="only runs in this state")] = None,
    offset: wire.Offset = 0,
    limit: wire.RunsLimit = 20,
) -> wire.RunList:
    """The campaign's runs, oldest first, a page at a time (compact rows; run_status for details)."""
    return await _call("GET", "/v1/runs", wire.RunList,
                       query=wire.ListRunsQuery(status=status, offset=offset, limit=limit))


@server.tool()
async def cancel_run(run_id: str) -> wire.CancelAnswer:
    """Stop a run of this campaign now (its whole process tree). It is charged for the time it held its
    GPUs. Use it when a run is clearly wasted (e.g. far slower than the leader after a few steps)."""
    return await _call("POST", f"/v1/runs/{run_id}/cancel", wire.CancelAnswer, body=wire.CancelRequest())


@server.tool()
async def read_run_log(
    run_id: str,
    tail: Annotated[wire.MaxLines, Field(description="the last N lines (default 50)")] = 50,
    offset_line: Annotated[wire.LineNumber | None, Field(description="instead of the tail: a page from this line")] = None,
    max_lines: wire.MaxLines = 200,
) -> wire.LinesPage:
    """Read a run's training log: its last `tail` lines, or a page from `offset_line` (follow next_line)."""
    q = wire.LogQuery(offset_line=offset_line, max_lines=max_lines) if offset_line else wire.LogQuery(tail=tail)
    return await _call("GET", f"/v1/runs/{run_id}/log", wire.LinesPage, query=q)


@server.tool()
async def search_run_log(
    run_id: str,
    pattern: Annotated[str, Field(description="a regular expression (Python syntax)")],
    max_results: wire.MaxResults = 50,
    ignore_case: bool = False,
) -> wire.SearchAnswer:
    """Find lines in a run's log (errors, warnings, memory reports) without reading all of it."""
    return await _call("GET", f"/v1/runs/{run_id}/log/search", wire.SearchAnswer,
                       query=wire.LogSearchQuery(pattern=pattern, max_results=max_results, ignore_case=ignore_case))


@server.tool()
async def list_image_dir(
    path: Annotated[str, Field(description="a directory in the training image ('' for the top)")] = "",
    offset: wire.Offset = 0,
    limit: wire.EntriesLimit = 200,
) -> wire.DirPage:
    """List a directory of the training image (the framework's source as the jobs run it)."""
    return await _call("GET", "/v1/image/list", wire.DirPage,
                       query=wire.ImageListQuery(path=path, offset=offset, limit=limit))


@server.tool()
async def read_image_file(
    path: str,
    offset_line: wire.LineNumber = 1,
    max_lines: wire.MaxLines = 200,
) -> wire.LinesPage:
    """Read a file of the training image, a page at a time (follow next_line). Read a flag's
    implementation (what it asserts, what it overrides) before it enters a candidate."""
    return await _call("GET", "/v1/image/read", wire.LinesPage,
                       query=wire.ImageReadQuery(path=path, offset_line=offset_line, max_lines=max_lines))


@server.tool()
async def search_image(
    pattern: Annotated[str, Field(description="a regular expression, e.g. an argument name")],
    path: Annotated[str, Field(description="limit the search to this directory or file")] = "",
    glob: Annotated[str | None, Field(description="only files whose name matches, e.g. *.py")] = None,
    max_results: wire.MaxResults = 50,
    ignore_case: bool = False,
) -> wire.SearchAnswer:
    """Search the training image's files (the framework source) for a pattern: where a flag is defined
    and used. Results are capped; narrow `path` or `glob` when truncated."""
    return await _call("GET", "/v1/image/search", wire.SearchAnswer, query=wire.ImageSearchQuery(
        pattern=pattern, path=path, glob=glob, max_results=max_results, ignore_case=ignore_case))


@server.tool()
async def record_assumption(
    question: Annotated[str, Field(description="what you would have asked the user")],
    default: Annotated[str, Field(description="the default you take instead")],
    context: str | None = None,
) -> wire.Recorded:
    """Record an assumption in the ledger instead of asking the user (the campaign runs unattended)."""
    return await _call("POST", "/v1/assumptions", wire.Recorded,
                       body=wire.AssumptionRequest(question=question, default=default, context=context))


@server.tool()
async def record_stop(
    levers_tested: Annotated[list[str], Field(min_length=1, description="every lever the campaign measured")],
    diagnosis: Annotated[str, Field(description="the last diagnosis: what limits the leader, and why "
                                                "the remaining budget will not find a faster recipe")],
    leader: Annotated[str | None, Field(description="the leader's run id, as you believe it to be")] = None,
) -> wire.Recorded:
    """Record a stop before the budget is spent, with its evidence: the leader (taken from the ledger),
    the levers tested and the last diagnosis. After it, no further search launches are admitted."""
    return await _call("POST", "/v1/stop", wire.Recorded,
                       body=wire.StopRequest(levers_tested=levers_tested, diagnosis=diagnosis, leader=leader))


@server.tool()
async def campaign_status() -> CampaignStatus:
    """The campaign at a glance: budget (charged, in flight, reserve, left for search), calibration and
    band, the leader and its gain, runs in flight, refusals, and what is still missing before it may stop."""
    return CampaignStatus.of(await _call("GET", "/v1/campaign", wire.CampaignSummary))


@server.tool()
async def verify_ledger() -> wire.LedgerVerification:
    """Check the campaign's ledger: its hash chain and every row's MAC, with the campaign's key, which the
    broker holds and you never read. ok=false names the problem: do not launch until it is ok."""
    return await _call("GET", "/v1/ledger/verify", wire.LedgerVerification)


# --- per-run diagnosis (search rule 1's evidence; issue 15) ------------------------------------------


@server.tool()
async def record_diagnosis(
    run_id: Annotated[str, Field(description="the finished run this diagnosis is about")],
    diagnosis: Annotated[str, Field(description=(
        "what bounds this run's step and why (the evidence: metrics, log lines, trace), and what it means for "
        "the next candidate"))],
    bottleneck: Annotated[str | None, Field(description=(
        "the bottleneck in a few words, e.g. 'cross-node expert all-to-all', 'host launches', 'out of memory "
        "on stage 1'"))] = None,
) -> wire.Recorded:
    """Record your diagnosis of one finished run in the ledger. Diagnose every run you read (the report
    shows each run's diagnosis next to its result, and the campaign summary draws on them)."""
    return await _call("POST", "/v1/diagnoses", wire.Recorded,
                       body=wire.DiagnosisRequest(run_id=run_id, diagnosis=diagnosis, bottleneck=bottleneck))


# ----------------------------------------------------------------------------------- TTB prior
# TrainingThroughputBench lookup: kept apart from the broker tools above. It reads verified entries
# on this machine (never the cluster, never the ledger) and only informs the search.


class TTBPrior(BaseModel):
    found: bool
    model: str
    accelerator: str
    note: str = Field(description="how to use the answer: a prior to measure, never a result")
    entry_id: str | None = None
    protocol: str | None = None
    simulated: bool | None = None
    label: str | None = Field(None, description="e.g. 'simulated, not a measurement'")
    gpus: int | None = None
    tokens_per_s_per_gpu: float | None = None
    band: float | None = None
    diff_from_public_recipe: dict[str, Any] = Field(default_factory=dict)
    args: dict[str, Value] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    reason: str | None = None


def _ttb_entries() -> Path:
    env = os.environ.get("ATTUNE_TTB_ENTRIES")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "ttb" / "entries"


@server.tool()
async def ttb_best_known_recipe(
    include_simulated: Annotated[bool, Field(description="also consider simulated entries (labelled)")] = False,
) -> TTBPrior:
    """TrainingThroughputBench's fastest verified recipe for this campaign's model and accelerator, as a
    prior at campaign start. It was measured elsewhere (another cluster, stack or GPU count): try its
    changes as a hypothesis, but only this campaign's own measurement and gate count."""
    from attune.control.spec import SpecError, load_spec
    from attune.ttb.lookup import PRIOR_NOTE, best

    try:
        spec = load_spec(_campaign_dir())
    except SpecError as exc:
        raise ToolError(f"the campaign spec cannot be read: {exc.problems[0][1]}") from None
    model, accel = spec.model, spec.cluster.accelerator
    res = await anyio.to_thread.run_sync(
        lambda: best(_ttb_entries(), model, accel, include_simulated=include_simulated))
    if not res["found"]:
        return TTBPrior(found=False, model=model, accelerator=accel, note=PRIOR_NOTE, reason=res["reason"])
    e = res["entry"]
    return TTBPrior(found=True, model=model, accelerator=accel, note=PRIOR_NOTE, entry_id=e["id"],
                    protocol=e["protocol"], simulated=e["simulated"], label=e["label"], gpus=e["gpus"],
                    tokens_per_s_per_gpu=e["tokens_per_s_per_gpu"], band=e["band"],
                    diff_from_public_recipe=e["diff_from_public_recipe"], args=e["args"], env=e["env"])


# ----------------------------------------------------------------------------------- main


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    server.run("stdio")


if __name__ == "__main__":
    main()
