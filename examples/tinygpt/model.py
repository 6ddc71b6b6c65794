"""A small decoder-only transformer (GPT) with optional mixture-of-experts MLPs.

Pre-LayerNorm blocks, learned absolute positions, causal attention through
``scaled_dot_product_attention``, GeLU MLP, output layer tied to the word embedding unless
``untie_embeddings_and_output_weights``. No dropout: the loss is then a deterministic function of
the weights and the rows, which is what lets structural levers keep it bit-for-bit up to float noise.

Activation recomputation (``torch.utils.checkpoint``) follows Megatron's knobs: ``full`` recomputes
whole layers (``uniform``: groups of ``recompute_num_layers`` layers; ``block``: the first
``recompute_num_layers`` layers, one at a time), ``selective`` recomputes only the attention core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    max_position_embeddings: int
    padded_vocab_size: int
    init_method_std: float = 0.02
    untie_embeddings_and_output_weights: bool = False
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    recompute_granularity: str | None = None  # None | "full" | "selective"
    recompute_method: str | None = None  # "uniform" | "block" (full only)
    recompute_num_layers: int | None = None


class MLP(nn.Module):
    def __init__(self, h: int, ffn: int, std: float, out_std: float):
        super().__init__()
        self.fc1 = nn.Linear(h, ffn)
        self.fc2 = nn.Linear(ffn, h)
        nn.init.normal_(self.fc1.weight, std=std)
        nn.init.normal_(self.fc2.weight, std=out_std)
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MoE(nn.Module):
    """Top-k routed experts without capacity limits (dropless), Switch-style load-balancing loss.

    The load-balancing loss is computed over the tokens of the current forward call, i.e. per
    microbatch: E * sum_e f_e * P_e with f_e the fraction of routing slots given to expert e and P_e
    the mean router probability of e. It equals 1 for a perfectly balanced router. Because it is
    not linear in the tokens, changing the microbatch size changes the objective.
    """

    def __init__(self, h: int, ffn: int, num_experts: int, topk: int, std: float, out_std: float):
        super().__init__()
        self.num_experts = num_experts
        self.topk = topk
        self.router = nn.Linear(h, num_experts, bias=False)
        nn.init.normal_(self.router.weight, std=std)
        self.experts = nn.ModuleList(MLP(h, ffn, std, out_std) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x).float()
        probs = torch.softmax(logits, dim=-1)
        top_p, top_i = torch.topk(probs, self.topk, dim=-1)
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        counts = torch.zeros(self.num_experts, device=x.device, dtype=torch.float32)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.nonzero(top_i == e, as_tuple=True)
            counts[e] = tok.numel()
            y = expert(x.index_select(0, tok))
            out = out.index_add(0, tok, (y * top_p[tok, slot].unsqueeze(-1)).to(out.dtype))
        num_tokens = x.shape[0]
        frac = counts / (num_tokens * self.topk)
        lb = self.num_experts * torch.sum(frac * probs.mean(dim=0))
        return out.reshape(shape), lb


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float):
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        nn.init.normal_(self.qkv.weight, std=cfg.init_method_std)
        nn.init.normal_(self.proj.weight, std=out_std)
        nn.init.zeros_(self.qkv.bias)
        nn.init.zeros_(self.proj.bias)
        self.selective = cfg.recompute_granularity == "selective"
        self.leak_next = False  # fault injection (wrong-attention-mask): each position also sees the next one

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.leak_next:
            s = q.shape[-2]
            allowed = torch.ones(s, s, dtype=torch.bool, device=q.device).tril(diagonal=1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.selective and torch.is_grad_enabled():
            o = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            o = self._core(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(b, s, h))


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        out_std = cfg.init_method_std / math.sqrt(2.0 * cfg.num_layers)
        self.ln1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = Attention(cfg, out_std)
        self.ln2 = nn.LayerNorm(cfg.hidden_size)
        if cfg.num_experts:
            self.mlp: nn.Module = MoE(cfg.hidden_size, cfg.moe_ffn_hidden_size or cfg.ffn_hidden_size,
                                      cfg.num_experts, cfg.moe_router_topk, cfg.init_method_std, out_std)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.ffn_hidden_size, cfg.init_method_std, out_std)
        self.moe = bool(cfg.num_experts)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.ln1(x))
        if self.moe:
            y, lb = self.mlp(self.ln2(x))
        else:
            y, lb = self.mlp(self.ln2(x)), torch.zeros((), device=x.device)
        return x + y, lb


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.pos = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        nn.init.normal_(self.embed.weight, std=cfg.init_method_std)
        nn.init.normal_(self.pos.weight, std=cfg.init_method_std)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size)
        self.output: nn.Linear | None = None
        if cfg.untie_embeddings_and_output_weights:
            self.output = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
            nn.init.normal_(self.output.weight, std=cfg.init_method_std)
        self._groups = self._recompute_groups()
        self.zero_positions = False  # fault injection (wrong-position-ids): every position id is 0

    def _recompute_groups(self) -> list[tuple[list[int], bool]]:
        """Consecutive layer groups and whether each group is checkpointed as a whole."""
        n = self.cfg.num_layers
        if self.cfg.recompute_granularity != "full":
            return [([i], False) for i in range(n)]
        k = self.cfg.recompute_num_layers or 1
        if self.cfg.recompute_method == "block":
            return [([i], i < k) for i in range(n)]
        return [(list(range(a, min(a + k, n))), True) for a in range(0, n, k)]

    def _run_layers(self, idx: list[int], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lb = torch.zeros((), device=x.device)
        for i in idx:
            x, l_i = self.layers[i](x)
            lb = lb + l_i
        return x, lb

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns logits [b, s, vocab] and the sum over layers of the load-balancing loss."""
        s = tokens.shape[1]
        pos = torch.arange(s, device=tokens.device)
        if self.zero_positions:
            pos = torch.zeros_like(pos)
        x = self.embed(tokens) + self.pos(pos)[None]
        lb = torch.zeros((), device=x.device)
        for idx, ckpt in self._groups:
            if ckpt and torch.is_grad_enabled():
                x, l_g = checkpoint(self._run_layers, idx, x, use_reentrant=False)
            else:
                x, l_g = self._run_layers(idx, x)
            lb = lb + l_g
        x = self.ln_f(x)
        w = self.output.weight if self.output is not None else self.embed.weight
        return F.linear(x, w), lb

    def inject_fault(self, fault: str | None) -> None:
        """Switch on a model-level fault (validation of the correctness gate only)."""
        self.zero_positions = fault == "wrong-position-ids"
        for layer in self.layers:
            layer.attn.leak_next = fault == "wrong-attention-mask"  # type: ignore[union-attr]

    def num_moe_layers(self) -> int:
        return self.cfg.num_layers if self.cfg.num_experts else 0
