"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2) as a plain module, over one sequence or a batch.

A forward takes a `Step` (triforce/step.py: tokens, positions, the mask among speculative tokens) and
passes it down unchanged. The model knows nothing of cache policy: it rotates every row's query and key at
the step's positions (cos and sin once per forward, one call per layer for all sequences), and every
layer hands q, k, v to the cache, which stores the keys and values and returns those to attend over,
with the new tokens last; attention applies the step's mask (see kernels/attention.py). q, k, v
share one fused projection and gate/up another, so a decode step reads each weight matrix in one pass.
`forward_batch` runs several sequences' steps, each over its own cache, through the weights together.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..kernels.attention import attention
from ..kernels.cpu import cpu_kernels
from ..kernels.decoder import FusedLayers
from ..kernels.fused import rms_norm, rope, silu_mul
from ..kernels.linear import linear
from ..step import Step
from .config import ModelConfig
from .cuda_graphs import ForwardGraphs
from .parallel import RowParallelLinear, TensorParallel, VocabParallelEmbedding, VocabParallelHead
from .rope import RotaryEmbedding
from .vocab import ReducedVocabulary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class DecoderLayer(nn.Module):
    """cfg: this rank's share of the layer (its heads and MLP columns; all of them without TP)."""

    def __init__(self, cfg: ModelConfig, index: int, group=None):
        super().__init__()
        self.index = index
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        qkv_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.qkv_proj = nn.Linear(cfg.hidden_size, qkv_out, bias=cfg.attention_bias)
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, group)
        self.post_attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, group)

    def forward(self, x: torch.Tensor, caches, masks, rows: list[int], cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        """x: [n, hidden] -> [n, hidden], the rows of len(caches) sequences one after another (rows[i] each);
        masks: their steps' [rows[i], m] over the last m keys (None: a chain); cos, sin: [n, d], each row's
        position's. Every weight is read once for all rows, and every row's query and key are rotated in
        one call; each sequence attends over its own cache."""
        n = x.shape[0]
        d, hq, hkv = self.head_dim, self.num_heads, self.num_kv_heads
        qkv = linear(self.input_norm(x), self.qkv_proj.weight, self.qkv_proj.bias)  # [n, (hq + 2 hkv) d]
        heads = qkv.view(n, hq + 2 * hkv, d).transpose(0, 1)  # [h, n, d]
        q, k = rope(heads[:hq + hkv], cos, sin).split((hq, hkv))  # rotated at the rows' positions
        v = heads[hq + hkv:]
        parts = []
        for cache, mask, q_s, k_s, v_s in zip(caches, masks, q.split(rows, 1), k.split(rows, 1), v.split(rows, 1)):
            keys, values = cache.append(self.index, q_s, k_s, v_s)  # [hkv, S, d] each, the new tokens last
            parts.append(attention(q_s, keys, values, self.scale, mask))  # [hq, rows, d]
        attn = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
        x = x + self.o_proj(attn.transpose(0, 1).reshape(n, hq * d))  # all-reduce across TP ranks
        gate_up = linear(self.post_attention_norm(x), self.gate_up_proj.weight)
        return x + self.down_proj(silu_mul(gate_up))  # all-reduce across TP ranks


class LlamaModel(nn.Module):
    """With `tp`, this rank's shard: `config` then counts this rank's heads and MLP columns (so caches
    built from it hold this rank's KV heads), while the vocabulary stays whole at the edges."""

    quantized: str | None = None  # "int8": a proposing tier's copy, int8 matrices and head (models/quantized.py)
    twin_of: "LlamaModel | None" = None  # that copy's model (not a submodule: its tensors are not the copy's)

    def __init__(self, cfg: ModelConfig, tp: TensorParallel | None = None):
        super().__init__()
        self.config, self.tp = cfg, tp
        group, rows = (None, slice(0, cfg.vocab_size)) if tp is None else (tp.group, tp.rows(cfg.vocab_size))
        n_rows = rows.stop - rows.start
        self.embed_tokens = VocabParallelEmbedding(n_rows, cfg.hidden_size, rows.start, group)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, group) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = VocabParallelHead(cfg.hidden_size, n_rows, cfg.vocab_size, group, tp.size if tp else 1)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope: RotaryEmbedding | None = None  # built by `finalize` once weights sit on their device
        self.fused_layers: FusedLayers | None = None  # likewise: the layer loop in one kernel call
        self.forward_graphs: ForwardGraphs | None = None  # likewise: small forwards as CUDA graphs
        self.vocab: ReducedVocabulary | None = None  # a draft over part of its target's vocabulary

    @property
    def output_vocab_size(self) -> int:
        """Size of the vocabulary the logits span (the target's, for a reduced-vocabulary draft)."""
        return self.config.vocab_size if self.vocab is None else self.vocab.target_vocab_size

    def finalize(self) -> "LlamaModel":
        if self.device.type == "cpu":
            # The CPU kernels built (a fresh install: a minute or more) or loaded now, with the weights, not in
            # the first forward: a float32 model's server answered /health, then its first request waited on
            # the build past its client's timeout (bfloat16 ones load them here already, for FusedLayers)
            cpu_kernels()
        self.rope = RotaryEmbedding(self.config, self.embed_tokens.weight.device)
        self.fused_layers = FusedLayers(self)
        self.forward_graphs = ForwardGraphs.for_model(self)
        return self.eval().requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token across all layers, in this model's dtype."""
        return self.config.kv_bytes_per_token(self.dtype.itemsize)

    @torch.inference_mode()
    def forward(self, step: Step | torch.Tensor, cache, logits_for: str = "all") -> torch.Tensor | None:
        """step: the forward's tokens, positions and mask; a tensor of token ids [n] is shorthand for the
        chain that continues the cache (Step.chain(ids, cache.length)). Returns float32 logits [n, V]
        ('all'), [1, V] ('last') or None ('none', for prefill); V is `output_vocab_size`."""
        if not isinstance(step, Step):
            step = Step.chain(step, cache.length)
        return self.forward_batch([step], [cache], logits_for)[0]

    @torch.inference_mode()
    def forward_batch(self, steps: Sequence[Step], caches: Sequence,
                      logits_for: str | Sequence[str] = "all") -> list[torch.Tensor | None]:
        """One forward of several sequences, steps[i] over caches[i]: their tokens pass every weight matrix
        together (each matrix is read once for the batch), each attends over its own cache. Returns each
        sequence's logits as `forward` does; `logits_for` is one choice for all or one per sequence. A
        sequence's logits are its own alone: its rows see nothing of the others'."""
        if len(steps) != len(caches) or not steps:
            raise ValueError("a batch needs one cache per step, and at least one step")
        for step, cache in zip(steps, caches):  # (a step elsewhere wrote its keys at the cache's next slot, rotated
            if step.start != cache.length:  # at its own positions: wrong attention from then on, silently)
                raise ValueError(f"a step from {step.start}, but its cache holds {cache.length} tokens")
        wants = [logits_for] * len(steps) if isinstance(logits_for, str) else list(logits_for)
        if any(want not in ("all", "last", "none") for want in wants):
            raise ValueError(f"logits_for is 'all', 'last' or 'none' (got {logits_for!r})")
        if self.forward_graphs is not None:
            graphed = self.forward_graphs(steps, caches, wants)
            if graphed is not None:
                return graphed
        steps = [step.to(self.device) for step in steps]
        rows = [step.n for step in steps]
        tokens = steps[0].tokens if len(steps) == 1 else torch.cat([step.tokens for step in steps])
        x = self.embed_tokens(tokens if self.vocab is None else self.vocab.encode(tokens))  # [n, hidden]
        # Every row's rotation, once per forward (caches store keys rotated at their positions); the table
        # first reaches them, which a streaming cache's begin reads to turn its sinks (their last: start + n - 1;
        # a step that ended on the table's last row grew it, under a CUDA graph that holds its address)
        self.rope.reach(max(step.start + step.n for step in steps) - 1)
        for cache, step in zip(caches, steps):
            cache.begin(step)
        masks = [step.mask for step in steps]
        positions = steps[0].positions if len(steps) == 1 else torch.cat([step.positions for step in steps])
        cos, sin = self.rope.cos_sin(positions, self.dtype)
        fused = None if self.fused_layers is None else self.fused_layers(x, caches, masks, rows, cos, sin)
        if fused is None:
            for layer in self.layers:
                x = layer(x, caches, masks, rows, cos, sin)
        else:
            x = fused
        for cache in caches:
            cache.end()
        picked = _logit_rows(rows, wants)  # (rows of x, count) per sequence
        if all(count == 0 for _, count in picked):
            return [None] * len(steps)
        if not all(count == r for (_, count), r in zip(picked, rows)):
            x = x[torch.cat([index for index, _ in picked]).to(x.device)]
        logits = self.lm_head(self.norm(x)).float()  # all-gather of vocabulary shards across TP ranks
        if self.vocab is not None:
            logits = self.vocab.expand_logits(logits)
        parts = logits.split([count for _, count in picked])
        return [None if want == "none" else part for part, want in zip(parts, wants)]


def _logit_rows(rows: list[int], wants: list[str]) -> list[tuple[torch.Tensor, int]]:
    """Which rows of a batch's hidden states each sequence wants logits for ('all', 'last' or 'none')."""
    picked, start = [], 0
    for r, want in zip(rows, wants):
        first = {"all": start, "last": start + r - 1, "none": start + r}[want]
        picked.append((torch.arange(first, start + r), start + r - first))
        start += r
    return picked
