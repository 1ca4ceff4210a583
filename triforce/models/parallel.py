"""Tensor-parallel layer types. Each owns its shard of a weight and the collective of its forward, over
an explicit process group, so where ranks communicate is visible in the code that calls them.

Megatron's split, as in gpt-fast's tp.py and nano-vllm's layers: q/k/v and gate/up are split by output
(attention heads, MLP columns) and need no collective; o_proj and down_proj are split by input and end in
an all-reduce; the embedding and output head are split by vocabulary rows (an all-reduce after the
lookup, an all-gather of the logits). With group None every type is its plain single-device twin.

`TensorParallel` says which slice of each weight a rank keeps. Heads are split evenly; when there are
fewer KV heads than ranks, each KV head is replicated on the tp / num_kv_heads ranks whose query heads
use it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from ..kernels.linear import linear, logits_linear
from .config import ModelConfig, ModelLoadError


@dataclass(frozen=True)
class TensorParallel:
    rank: int  # within the group
    size: int
    group: object = None  # torch.distributed ProcessGroup; None when size == 1

    def check(self, cfg: ModelConfig) -> None:
        hq, hkv = cfg.num_heads, cfg.num_kv_heads
        if hq % self.size or not (hkv % self.size == 0 or self.size % hkv == 0):
            raise ModelLoadError(f"tensor-parallel size {self.size} must divide the {hq} attention heads, and "
                                 f"divide or be a multiple of the {hkv} KV heads")
        if cfg.intermediate_size % self.size:
            raise ModelLoadError(f"tensor-parallel size {self.size} must divide the MLP width "
                                 f"{cfg.intermediate_size}")

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        return replace(cfg, num_heads=cfg.num_heads // self.size,
                       num_kv_heads=max(1, cfg.num_kv_heads // self.size),
                       intermediate_size=cfg.intermediate_size // self.size)

    def head_slices(self, cfg: ModelConfig) -> tuple[slice, slice]:
        """The query heads and KV heads this rank holds."""
        q = cfg.num_heads // self.size
        if cfg.num_kv_heads >= self.size:
            kv = cfg.num_kv_heads // self.size
            return slice(self.rank * q, (self.rank + 1) * q), slice(self.rank * kv, (self.rank + 1) * kv)
        kv_head = self.rank * cfg.num_kv_heads // self.size  # replicated: the KV head of our query heads
        return slice(self.rank * q, (self.rank + 1) * q), slice(kv_head, kv_head + 1)

    def rows(self, total: int) -> slice:
        """An even split of `total` rows (vocabulary: the last shard may be shorter)."""
        per = -(-total // self.size)
        return slice(min(self.rank * per, total), min((self.rank + 1) * per, total))


class RowParallelLinear(nn.Linear):
    """y = x W^T with x's features (and W's input columns) split across ranks; partial sums all-reduced."""

    def __init__(self, in_features: int, out_features: int, group=None):
        super().__init__(in_features, out_features, bias=False)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight)
        if self.group is not None:
            dist.all_reduce(y, group=self.group)
        return y


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + n) of the embedding table; other ranks hold the rest."""

    def __init__(self, rows: int, hidden: int, start: int = 0, group=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.start, self.group = start, group

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return self.weight[tokens]
        local = tokens - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = self.weight[local.clamp(0, self.weight.shape[0] - 1)] * mine.unsqueeze(-1).to(self.weight.dtype)
        dist.all_reduce(x, group=self.group)  # exactly one rank contributes each row
        return x


class VocabParallelHead(nn.Module):
    """Logits for vocabulary rows [start, start + n); all-gathered into the whole vocabulary."""

    def __init__(self, hidden: int, rows: int, vocab_size: int, group=None, size: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.vocab_size, self.group, self.size = vocab_size, group, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = logits_linear(x, self.weight)  # [n, rows] float32
        if self.group is None:
            return logits
        per = -(-self.vocab_size // self.size)
        padded = logits.new_zeros(logits.shape[0], per)  # the last shard may be short: pad, gather, cut
        padded[:, : logits.shape[1]] = logits
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]
