"""Model shapes and the feasible parallel layouts of a model on a GPU count.

Standard library plus PyYAML only: the skill's helper script `skills/attune/scripts/layouts.py`
imports this module with a bare `python3`, and the simulator reuses it.

The GPUs factor as world = TP x PP x CP x DP. In a MoE model the expert layers split the same
TP x CP x DP ranks of each pipeline stage a second way: ETP x EP x EDP = TP x CP x DP.
Feasibility rules (read from Megatron-LM's argument validation, summarised in
`../shared/reference/megatron.md`):

- attention heads and query groups divisible by TP; the expert FFN width divisible by ETP;
- transformer layers split across PP stages: evenly, or with lighter first/last stages
  (`--decoder-first/last-pipeline-num-layers`) and an even split of the rest;
- virtual stages (VP > 1) need PP >= 2 (PP > 2 unless `--overlap-p2p-comm`) and every stage's
  layer count divisible by VP;
- `seq_length % (2 x CP) == 0` when CP > 1;
- routed experts divisible by EP;
- global batch divisible by micro-batch x DP (when a global batch is given).

Placement flags such as "TP inside a node" filter the list; they are not correctness rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from attune.core.errors import KnowledgeError

MODELS_PATH = Path(__file__).resolve().parents[2] / "skills" / "attune" / "catalog" / "models.yaml"
VOCAB_DIVISOR = 128  # Megatron's --make-vocab-size-divisible-by default


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: the catalog is large


def load_yaml(text: str) -> Any:
    """yaml.safe_load, with the C loader when PyYAML has one."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader


class LayoutError(KnowledgeError, ValueError):
    """Bad input to the layout or memory helpers; the message names the field."""


# --------------------------------------------------------------------------- model shapes


@dataclass(frozen=True)
class ModelDims:
    """The shape facts the layout and memory helpers need."""

    name: str
    layers: int
    hidden: int
    heads: int
    query_groups: int | None = None  # defaults to heads (plain multi-head attention)
    head_dim: int | None = None  # defaults to hidden / heads
    ffn: int | None = None  # dense MLP width; None when no layer is dense
    vocab: int = 0
    experts: int = 0
    topk: int = 0
    moe_ffn: int | None = None
    shared_expert_ffn: int = 0
    dense_layers: int | None = None  # leading dense layers of a MoE model
    gated_mlp: bool = True
    tied_embeddings: bool = False
    linear_bias: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    norm: str = "rmsnorm"
    position_embeddings: int = 0
    seq_length: int | None = None
    mtp_layers: int = 0
    dp_only: bool = False  # the framework has data parallelism only (tinygpt)
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise LayoutError(f"model {self.name!r}: {f} must be a positive integer, got {v!r}")
        for f in ("query_groups", "head_dim", "ffn", "moe_ffn", "seq_length"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise LayoutError(f"model {self.name!r}: {f} must be a positive integer or null, got {v!r}")
        for f in ("vocab", "experts", "topk", "shared_expert_ffn", "position_embeddings", "mtp_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise LayoutError(f"model {self.name!r}: {f} must be a non-negative integer, got {v!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise LayoutError(f"model {self.name!r}: norm must be 'rmsnorm' or 'layernorm', got {self.norm!r}")
        if self.query_groups is not None and self.heads % self.query_groups:
            raise LayoutError(
                f"model {self.name!r}: heads ({self.heads}) must be divisible by query_groups ({self.query_groups})"
            )
        if self.experts:
            if not self.moe_ffn:
                raise LayoutError(f"model {self.name!r}: a MoE model (experts > 0) needs moe_ffn")
            if not 1 <= self.topk <= self.experts:
                raise LayoutError(f"model {self.name!r}: topk must be between 1 and experts ({self.experts})")
            if self.n_dense_layers > self.layers:
                raise LayoutError(f"model {self.name!r}: dense_layers exceeds layers")
        if self.n_dense_layers and not self.ffn:
            raise LayoutError(f"model {self.name!r}: dense layers need ffn")

    # ---- derived shape
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def groups(self) -> int:
        return self.query_groups or self.heads

    @property
    def kv_channels(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        return self.heads * self.kv_channels

    @property
    def kv_width(self) -> int:
        return self.groups * self.kv_channels

    @property
    def n_dense_layers(self) -> int:
        if not self.experts:
            return self.layers
        return self.dense_layers or 0

    def layer_kinds(self) -> list[str]:
        """'dense' or 'moe' for each transformer layer, first to last."""
        d = self.n_dense_layers
        return ["dense"] * d + ["moe"] * (self.layers - d)

    # ---- parameter counts (weights only; biases, norms and routers included)
    def _norm(self, width: int) -> int:
        return width * (2 if self.norm == "layernorm" else 1)

    def attention_params(self) -> int:
        h, q, kv = self.hidden, self.q_width, self.kv_width
        n = h * (q + 2 * kv) + q * h
        if self.linear_bias or self.qkv_bias:
            n += q + 2 * kv
        if self.linear_bias:
            n += h
        if self.qk_norm:
            n += 2 * self._norm(self.kv_channels)
        if self.attention_sinks:
            n += self.heads
        return n

    def _mlp_params(self, width: int) -> int:
        h = self.hidden
        n = (3 if self.gated_mlp else 2) * h * width
        if self.linear_bias:
            n += (2 * width if self.gated_mlp else width) + h
        return n

    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.ffn) if self.ffn else 0

    def expert_params(self) -> int:
        """All routed experts of one MoE layer (what EP x ETP shards)."""
        return self.experts * self._mlp_params(self.moe_ffn) if self.experts and self.moe_ffn else 0

    def moe_replicated_params(self) -> int:
        """Router and shared expert of one MoE layer (sharded like the dense part)."""
        if not self.experts:
            return 0
        n = self.hidden * self.experts + (self.experts if self.linear_bias else 0)
        if self.shared_expert_ffn:
            n += self._mlp_params(self.shared_expert_ffn)
        return n

    def layer_norm_params(self) -> int:
        return 2 * self._norm(self.hidden)

    def layer_params(self, kind: str) -> tuple[int, int]:
        """(non-expert, expert) parameters of one layer of the given kind."""
        base = self.attention_params() + self.layer_norm_params()
        if kind == "dense":
            return base + self.dense_mlp_params(), 0
        return base + self.moe_replicated_params(), self.expert_params()

    def padded_vocab(self, tp: int = 1, divisor: int = VOCAB_DIVISOR) -> int:
        m = divisor * tp
        return -(-self.vocab // m) * m if self.vocab else 0

    def embedding_params(self, tp: int = 1, padded: bool = False) -> int:
        v = self.padded_vocab(tp) if padded else self.vocab
        return v * self.hidden + self.position_embeddings * self.hidden

    def output_params(self, tp: int = 1, padded: bool = False) -> int:
        v = self.padded_vocab(tp) if padded else self.vocab
        return 0 if self.tied_embeddings else v * self.hidden

    def total_params(self) -> int:
        n = sum(sum(self.layer_params(k)) for k in self.layer_kinds())
        return n + self.embedding_params() + self.output_params() + self._norm(self.hidden)

    def active_params(self) -> int:
        n = 0
        for k in self.layer_kinds():
            dense, experts = self.layer_params(k)
            n += dense + (experts * self.topk // self.experts if experts else 0)
        return n + self.embedding_params() + self.output_params() + self._norm(self.hidden)

    def summary(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "aliases"}
        d["total_params"] = self.total_params()
        d["active_params"] = self.active_params()
        return d


_MODEL_FIELDS = {f.name for f in fields(ModelDims)}


def model_from_mapping(data: Mapping[str, Any], where: str = "model") -> ModelDims:
    """Build ModelDims from a mapping (a models.yaml entry), naming any bad field."""
    if not isinstance(data, Mapping):
        raise LayoutError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    unknown = sorted(set(data) - _MODEL_FIELDS)
    if unknown:
        raise LayoutError(f"{where}: unknown field(s) {unknown}; known: {sorted(_MODEL_FIELDS)}")
    if "name" not in data:
        raise LayoutError(f"{where}: name is required")
    kw = dict(data)
    kw["aliases"] = tuple(str(a) for a in kw.get("aliases") or ())
    try:
        return ModelDims(**kw)
    except TypeError as exc:  # a missing required field
        raise LayoutError(f"{where}: {exc}") from None


def file_identity(p: Path) -> tuple[str, int, int, int, int] | None:
    """(path, device, inode, size, mtime in ns): a file read before and unchanged since has the same
    identity, so what was parsed from it can be used again. None: it cannot be stat'ed."""
    try:
        st = p.stat()
    except OSError:
        return None
    return (str(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


_MODELS_CACHE: dict[tuple[str, int, int, int, int], dict[str, ModelDims]] = {}


def load_models(path: Path | str | None = None) -> dict[str, ModelDims]:
    """All models of a models.yaml, keyed by lower-case name (aliases resolve through find_model).
    Parsed once per file identity (`file_identity`): an unchanged file is not read again."""
    p = Path(path) if path else MODELS_PATH
    ident = file_identity(p)
    if ident is not None and ident in _MODELS_CACHE:
        return dict(_MODELS_CACHE[ident])  # the values are frozen; the mapping is the caller's own
    try:
        doc = load_yaml(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LayoutError(f"{p}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise LayoutError(f"{p}: invalid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise LayoutError(f"{p}: expected a mapping with a 'models' list")
    out: dict[str, ModelDims] = {}
    for i, entry in enumerate(doc["models"]):
        m = model_from_mapping(entry, f"{p.name}: models[{i}]")
        key = m.name.lower()
        if key in out:
            raise LayoutError(f"{p.name}: models[{i}]: duplicate name {m.name!r}")
        out[key] = m
    if ident is not None:
        _MODELS_CACHE[ident] = dict(out)
    return out


def find_model(name: str, models: Mapping[str, ModelDims] | None = None) -> ModelDims:
    models = models if models is not None else load_models()
    key = name.strip().lower()
    for m in models.values():
        if key == m.name.lower() or key in (a.lower() for a in m.aliases):
            return m
    raise LayoutError(f"unknown model {name!r}; known: {sorted(m.name for m in models.values())}")


# --------------------------------------------------------------------------- pipeline splits


@dataclass(frozen=True)
class PipelineSplit:
    """Transformer layers per pipeline stage.

    kind: "even" (layers / PP each), "accounted" (the embedding and the loss each count as one
    layer, so the first and last stages hold one transformer layer fewer:
    `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`), or
    "uneven" (explicit first/last stage counts, the rest split evenly).
    """

    pp: int
    per_stage: tuple[int, ...]
    kind: str = "even"

    @property
    def even(self) -> bool:
        return self.kind == "even"

    @property
    def first(self) -> int:
        return self.per_stage[0]

    @property
    def last(self) -> int:
        return self.per_stage[-1]

    @property
    def middle(self) -> int | None:
        return self.per_stage[1] if self.pp > 2 else None

    def flags(self) -> list[str]:
        if self.kind == "accounted":
            return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        if self.kind == "uneven":
            return [
                f"--decoder-first-pipeline-num-layers={self.first}",
                f"--decoder-last-pipeline-num-layers={self.last}",
            ]
        return []

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "first": self.first, "middle": self.middle, "last": self.last,
                "flags": self.flags()}

    def stage_layers(self) -> list[range]:
        """Layer indices of each stage."""
        out, start = [], 0
        for n in self.per_stage:
            out.append(range(start, start + n))
            start += n
        return out


def even_split(layers: int, pp: int, vp: int = 1) -> PipelineSplit | None:
    if layers % (pp * vp):
        return None
    return PipelineSplit(pp, (layers // pp,) * pp)


def accounted_split(layers: int, pp: int, vp: int = 1) -> PipelineSplit | None:
    """The embedding and the loss each take one layer's slot in the first and last stage."""
    if pp < 2 or (layers + 2) % (pp * vp) or (layers + 2) // (pp * vp) < 2:
        return None  # every virtual chunk of an end stage must keep a transformer layer
    per = (layers + 2) // pp
    return PipelineSplit(pp, (per - 1,) + (per,) * (pp - 2) + (per - 1,), "accounted")


def uneven_split(layers: int, pp: int, vp: int = 1) -> PipelineSplit | None:
    """The most balanced split with explicit first/last stages, each stage's count divisible by vp.

    Balanced means: the heaviest stage as light as possible, then first and last as equal as
    possible, then the end stages no heavier than the middle ones (they also hold the embedding
    and the loss). None when no such split exists.
    """
    if pp < 2:
        return None
    best: tuple[tuple[int, int, int], PipelineSplit] | None = None
    middles = [0] if pp == 2 else range(vp, layers + 1, vp)
    for m in middles:
        rest = layers - (pp - 2) * m
        if rest < 2 * vp:
            break
        for f in range(vp, rest, vp):
            last = rest - f
            if last < vp or last % vp:
                continue
            heaviest = max(f, last, m)
            key = (heaviest, abs(f - last), int(max(f, last) > m and pp > 2))
            if best is None or key < best[0]:
                best = (key, PipelineSplit(pp, (f,) + (m,) * (pp - 2) + (last,), "uneven"))
    return best[1] if best else None


def pipeline_split(
    layers: int,
    pp: int,
    vp: int = 1,
    *,
    first: int | None = None,
    last: int | None = None,
    account_embedding_loss: bool = False,
) -> PipelineSplit | None:
    """The split of `layers` over PP stages of VP chunks, or None when there is none.

    With first/last given (either or both), Megatron's uneven split; with account_embedding_loss,
    the accounted split; otherwise even when possible, else accounted, else the most balanced
    uneven split.
    """
    if pp < 1 or vp < 1:
        raise LayoutError("pp and vp must be positive")
    if first is not None or last is not None:
        if pp < 2:
            raise LayoutError("first/last stage layer counts need PP >= 2")
        if account_embedding_loss:
            raise LayoutError("give either first/last stage layer counts or embedding/loss accounting, not both")
        inner = pp - (first is not None) - (last is not None)
        rest = layers - (first or 0) - (last or 0)
        if inner == 0:
            if rest != 0:
                return None
            m = 0
        elif rest <= 0 or rest % inner:
            return None
        else:
            m = rest // inner
        per = tuple(
            [first if first is not None else m] + [m] * (pp - 2) + [last if last is not None else m]
        )
        if any(n <= 0 or n % vp for n in per):
            return None
        return PipelineSplit(pp, per, "uneven")
    if account_embedding_loss:
        return accounted_split(layers, pp, vp)
    if pp == 1:
        return PipelineSplit(1, (layers,)) if vp == 1 else None
    return even_split(layers, pp, vp) or accounted_split(layers, pp, vp) or uneven_split(layers, pp, vp)


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """One parallel layout. For a dense model ep/etp/edp are None."""

    tp: int
    pp: int
    cp: int
    dp: int
    vp: int = 1
    ep: int | None = None
    etp: int | None = None
    edp: int | None = None
    split: PipelineSplit | None = None

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def key(self) -> tuple[int, ...]:
        return (self.tp, self.pp, self.vp, self.cp, self.ep or 0, self.etp or 0, self.dp, self.edp or 0)


@dataclass
class LayoutOptions:
    gpus: int
    gpus_per_node: int
    seq_length: int | None = None
    global_batch: int | None = None
    micro_batch: int = 1
    tp_within_node: bool = True
    ep_within_node: bool = False
    allow_uneven: bool = True
    max_vp: int | None = None
    allowed: dict[str, set[int]] = field(default_factory=dict)  # e.g. {"tp": {1, 2}}

    def check(self) -> None:
        for name in ("gpus", "gpus_per_node", "micro_batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise LayoutError(f"{name} must be a positive integer, got {v!r}")
        for name in ("seq_length", "global_batch", "max_vp"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise LayoutError(f"{name} must be a positive integer, got {v!r}")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise LayoutError(
                f"gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node}) across nodes"
            )
        bad = sorted(set(self.allowed) - {"tp", "pp", "vp", "cp", "ep", "etp", "dp", "edp"})
        if bad:
            raise LayoutError(f"unknown degree filter(s) {bad}")


def divisors(n: int) -> list[int]:
    small, large = [], []
    for i in range(1, math.isqrt(n) + 1):
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
    return small + large[::-1]


def _ok(opts: LayoutOptions, name: str, value: int | None) -> bool:
    allowed = opts.allowed.get(name)
    return allowed is None or value in allowed


def _group_in_node(size: int, gpn: int) -> bool:
    """A group of `size` consecutive ranks never straddles a node boundary."""
    return size <= gpn and gpn % size == 0


@dataclass(frozen=True)
class LayoutReport:
    layout: Layout
    num_microbatches: int | None
    notes: tuple[str, ...]
    tp_in_node: bool
    ep_in_node: bool | None

    def as_dict(self) -> dict[str, Any]:
        lay = self.layout
        return {
            "tp": lay.tp,
            "pp": lay.pp,
            "vp": lay.vp,
            "cp": lay.cp,
            "dp": lay.dp,
            "ep": lay.ep,
            "etp": lay.etp,
            "edp": lay.edp,
            "split": lay.split.as_dict() if lay.split else None,
            "num_microbatches": self.num_microbatches,
            "tp_in_node": self.tp_in_node,
            "ep_in_node": self.ep_in_node,
            "notes": list(self.notes),
        }


def _tp_ok(model: ModelDims, opts: LayoutOptions, tp: int) -> bool:
    if not _ok(opts, "tp", tp) or model.heads % tp or model.groups % tp:
        return False
    return not (model.dp_only and tp > 1)


def _pp_ok(model: ModelDims, opts: LayoutOptions, pp: int) -> bool:
    return _ok(opts, "pp", pp) and pp <= model.layers and not (model.dp_only and pp > 1)


def _cp_ok(model: ModelDims, opts: LayoutOptions, cp: int, seq: int | None) -> bool:
    """CP is allowed, the model is not data-parallel only, and the sequence splits in 2 x CP chunks."""
    if not _ok(opts, "cp", cp) or (model.dp_only and cp > 1):
        return False
    return not (cp > 1 and seq is not None and seq % (2 * cp))


def _layout_notes(pp: int, cp: int, vp: int, mb: int | None, seq: int | None) -> list[str]:
    notes: list[str] = []
    if vp > 1 and pp == 2:
        notes.append("VP at PP 2 needs --overlap-p2p-comm")
    if vp > 1 and mb is not None and mb % pp:
        notes.append(f"{mb} microbatches not divisible by PP {pp}: some Megatron versions refuse VP")
    if cp > 1 and seq is None:
        notes.append("sequence length unknown: check seq_length % (2 x CP) == 0")
    return notes


def _microbatches(opts: LayoutOptions, dp: int) -> tuple[bool, int | None]:
    """(feasible?, microbatches per step): the global batch must split into micro batches over DP."""
    if opts.global_batch is None:
        return True, None
    per_step = opts.micro_batch * dp
    if opts.global_batch % per_step:
        return False, None
    return True, opts.global_batch // per_step


def _expert_layouts(model: ModelDims, opts: LayoutOptions, tp: int, pp: int, cp: int, dp: int, vp: int,
                    split: PipelineSplit) -> Iterable[tuple[Layout, bool]]:
    """Every (layout, expert group within a node?) of the expert degrees ETP x EP over TP x CP x DP."""
    dense_ranks = tp * cp * dp
    for etp in divisors(dense_ranks):
        if not _ok(opts, "etp", etp) or model.moe_ffn % etp:
            continue
        for ep in divisors(model.experts):
            if not _ok(opts, "ep", ep) or dense_ranks % (etp * ep):
                continue
            edp = dense_ranks // (etp * ep)
            if not _ok(opts, "edp", edp):
                continue
            ep_in_node = _group_in_node(etp * ep, opts.gpus_per_node)
            if opts.ep_within_node and not ep_in_node:
                continue
            yield Layout(tp, pp, cp, dp, vp, ep, etp, edp, split), ep_in_node


def enumerate_layouts(model: ModelDims, opts: LayoutOptions) -> list[LayoutReport]:
    """Every feasible layout of `model` on opts.gpus GPUs, sorted by (TP, PP, VP, CP, EP, ETP)."""
    opts.check()
    n, gpn = opts.gpus, opts.gpus_per_node
    seq = opts.seq_length or model.seq_length
    out: list[LayoutReport] = []
    for tp in divisors(n):
        if not _tp_ok(model, opts, tp):
            continue
        tp_in_node = _group_in_node(tp, gpn)
        if opts.tp_within_node and not tp_in_node:
            continue
        for pp in divisors(n // tp):
            if not _pp_ok(model, opts, pp):
                continue
            for cp in divisors(n // (tp * pp)):
                if not _cp_ok(model, opts, cp, seq):
                    continue
                dp = n // (tp * pp * cp)
                if not _ok(opts, "dp", dp):
                    continue
                feasible, mb = _microbatches(opts, dp)
                if not feasible:
                    continue
                for vp in _vp_options(model.layers, pp, opts):
                    split = pipeline_split(model.layers, pp, vp)
                    if split is None or (not split.even and not opts.allow_uneven):
                        continue
                    notes = _layout_notes(pp, cp, vp, mb, seq)
                    if not model.is_moe:
                        out.append(
                            LayoutReport(Layout(tp, pp, cp, dp, vp, split=split), mb, tuple(notes), tp_in_node, None)
                        )
                        continue
                    if model.is_moe and tp > 1:
                        notes.append("MoE with TP > 1 needs --sequence-parallel")
                    for lay, ep_in_node in _expert_layouts(model, opts, tp, pp, cp, dp, vp, split):
                        out.append(LayoutReport(lay, mb, tuple(notes), tp_in_node, ep_in_node))
    out.sort(key=lambda r: r.layout.key())
    return out


def _vp_options(layers: int, pp: int, opts: LayoutOptions) -> Iterable[int]:
    # every VP up to one layer (or slot, with embedding/loss accounting) per virtual stage;
    # pipeline_split decides which of them split
    candidates = [1] if pp == 1 else list(range(1, (layers + 2) // pp + 1))
    for vp in candidates:
        if opts.max_vp is not None and vp > opts.max_vp:
            continue
        if _ok(opts, "vp", vp):
            yield vp


def layout_from_degrees(
    model: ModelDims,
    gpus: int,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    vp: int = 1,
    ep: int | None = None,
    etp: int | None = None,
    first: int | None = None,
    last: int | None = None,
    account_embedding_loss: bool = False,
) -> Layout:
    """Validate explicit degrees against the feasibility rules and derive DP and EDP."""
    for name, v in (("gpus", gpus), ("tp", tp), ("pp", pp), ("cp", cp), ("vp", vp)):
        if not isinstance(v, int) or v <= 0:
            raise LayoutError(f"{name} must be a positive integer, got {v!r}")
    if gpus % (tp * pp * cp):
        raise LayoutError(f"gpus ({gpus}) must be divisible by TP x PP x CP ({tp}x{pp}x{cp})")
    dp = gpus // (tp * pp * cp)
    if model.dp_only and (tp, pp, cp) != (1, 1, 1):
        raise LayoutError(f"model {model.name!r} runs data parallelism only: TP, PP and CP must be 1")
    if model.heads % tp or model.groups % tp:
        raise LayoutError(
            f"TP {tp} must divide the attention heads ({model.heads}) and query groups ({model.groups})"
        )
    if vp > 1 and pp < 2:
        raise LayoutError("virtual stages (VP > 1) need PP >= 2")
    split = pipeline_split(
        model.layers, pp, vp, first=first, last=last, account_embedding_loss=account_embedding_loss
    )
    if split is None:
        raise LayoutError(
            f"{model.layers} layers cannot be split over PP {pp} x VP {vp}"
            + (f" with first={first} last={last}" if first or last else "")
        )
    if not model.is_moe:
        if ep not in (None, 1) or etp not in (None, 1):
            raise LayoutError(f"model {model.name!r} has no experts: EP and ETP must be 1 or unset")
        return Layout(tp, pp, cp, dp, vp, split=split)
    ep = ep or 1
    etp = etp or 1
    if model.experts % ep:
        raise LayoutError(f"EP {ep} must divide the routed experts ({model.experts})")
    if model.moe_ffn % etp:
        raise LayoutError(f"ETP {etp} must divide the expert FFN width ({model.moe_ffn})")
    ranks = tp * cp * dp
    if ranks % (ep * etp):
        raise LayoutError(f"ETP x EP ({etp}x{ep}) must divide TP x CP x DP ({tp}x{cp}x{dp} = {ranks})")
    return Layout(tp, pp, cp, dp, vp, ep, etp, ranks // (ep * etp), split)


def layout_dict(layout: Layout) -> dict[str, Any]:
    d = {k: v for k, v in asdict(layout).items() if k != "split"}
    d["split"] = layout.split.as_dict() if layout.split else None
    return d
