"""FullKVCache: every token's rotated keys and values, preallocated to the request's maximum length."""
from __future__ import annotations

import torch

from ..models.config import ModelConfig
from ..models.rope import RotaryEmbedding
from .base import CacheCapacityError, KVCache


class FullKVCache(KVCache):
    def __init__(self, cfg: ModelConfig, capacity: int, rope: RotaryEmbedding,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # [L, Hkv, capacity, D], rotated
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity, self.rope, self.length = capacity, rope, 0
        self._n = 0
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None  # of the current forward's positions
        # The rotated query of the last token of the latest forward, per layer: [Hq, D]. The retrieval
        # cache scores chunks against it when it rebuilds (TriForce: "the last prompt token's query").
        self.last_query: list[torch.Tensor | None] = [None] * cfg.num_layers

    def begin(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise CacheCapacityError(f"full KV cache holds {self.capacity} tokens; "
                                     f"{self.length} + {n} requested")
        self._n = n
        positions = torch.arange(self.length, self.length + n, device=self.keys.device)
        self._cos_sin = self.rope.cos_sin(positions, self.keys.dtype)

    def append(self, layer, q, k, v):
        start, stop = self.length, self.length + self._n
        q = self.rope.apply(q, *self._cos_sin)
        self.keys[layer, :, start:stop] = self.rope.apply(k, *self._cos_sin)
        self.values[layer, :, start:stop] = v
        self.last_query[layer] = q[:, -1]
        return q, self.keys[layer, :, :stop], self.values[layer, :, :stop]

    def reset(self) -> None:
        self.length = 0
