"""StreamingKVCache: attention sinks plus a recent window (StreamingLLM, arXiv 2309.17453).

Keys are stored unrotated and rotated at read time with their position *inside the cache*, as
StreamingLLM does: the visible keys are numbered 0..m-1 (sinks first, then the window), and the new
queries take the last positions. So the model never sees a position past sinks + window + n, however
long the text grows.

Visible to a forward over n new tokens: the first `sinks` tokens, the last `window` tokens absorbed
before it, and the n new ones. Rollback after the window has slid is exact because the store keeps
`window + max_rollback` recent tokens: tokens that left the window recently are still there to come
back. A rollback deeper than `max_rollback` raises rather than silently attending to a wrong window.
"""
from __future__ import annotations

import torch

from ..models.config import ModelConfig
from ..models.rope import RotaryEmbedding
from .base import KVCache


class StreamingKVCache(KVCache):
    def __init__(self, cfg: ModelConfig, sinks: int, window: int, max_rollback: int, rope: RotaryEmbedding,
                 dtype: torch.dtype, device: torch.device | str):
        if sinks < 0 or window < 1:
            raise ValueError(f"streaming cache needs sinks >= 0 and window >= 1 (got {sinks}, {window})")
        self.sinks, self.window, self.max_rollback, self.rope = sinks, window, max_rollback, rope
        self._keep = window + max_rollback  # recent tokens that must survive a compaction
        shape = (cfg.num_layers, cfg.num_kv_heads, sinks, cfg.head_dim)
        self.sink_k = torch.zeros(shape, dtype=dtype, device=device)  # [L, Hkv, sinks, D] unrotated
        self.sink_v = torch.zeros(shape, dtype=dtype, device=device)
        self._alloc_recent(2 * self._keep)
        self.length = 0
        self._offset = 0  # sequence index of recent_k[:, :, 0]
        self._n = 0

    def _alloc_recent(self, size: int, keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        like = self.sink_k
        shape = (like.shape[0], like.shape[1], size, like.shape[3])
        new_k = torch.zeros(shape, dtype=like.dtype, device=like.device)  # [L, Hkv, size, D] unrotated
        new_v = torch.zeros_like(new_k)
        if keep is not None:
            n = keep[0].shape[2]
            new_k[:, :, :n], new_v[:, :, :n] = keep
        self.recent_k, self.recent_v = new_k, new_v

    def _recent_index(self, seq_index: int) -> int:
        return max(seq_index, self.sinks) - self._offset

    def begin(self, n: int) -> None:
        stored = self._recent_index(self.length)
        if stored + n > self.recent_k.shape[2]:
            # Compact: keep the last `window + max_rollback` tokens at the front of the store.
            keep_from = max(self.sinks, self.length - self._keep, self._offset)
            a = keep_from - self._offset
            kept = (self.recent_k[:, :, a:stored].clone(), self.recent_v[:, :, a:stored].clone())
            size = max(self.recent_k.shape[2], 2 * (stored - a + n))
            self._alloc_recent(size, kept)
            self._offset = keep_from
        self._n = n
        visible = min(self.length, self.sinks) + min(max(self.length - self.sinks, 0), self.window) + n
        cos, sin = self.rope.cos_sin(torch.arange(visible, device=self.sink_k.device), self.sink_k.dtype)
        self._key_cos_sin = (cos, sin)  # positions 0..visible-1: every visible key, rotated afresh
        self._query_cos_sin = (cos[visible - n:], sin[visible - n:])

    def append(self, layer, q, k, v):
        n, start = self._n, self.length
        to_sink = max(0, min(n, self.sinks - start))
        if to_sink:
            self.sink_k[layer, :, start:start + to_sink] = k[:, :to_sink]
            self.sink_v[layer, :, start:start + to_sink] = v[:, :to_sink]
        if n > to_sink:
            a = self._recent_index(start + to_sink)
            self.recent_k[layer, :, a:a + n - to_sink] = k[:, to_sink:]
            self.recent_v[layer, :, a:a + n - to_sink] = v[:, to_sink:]
        n_sink = min(start + n, self.sinks)
        window_from = self._recent_index(max(self.sinks, start - self.window))
        window_to = self._recent_index(start + n)
        keys = torch.cat((self.sink_k[layer, :, :n_sink], self.recent_k[layer, :, window_from:window_to]), dim=1)
        values = torch.cat((self.sink_v[layer, :, :n_sink], self.recent_v[layer, :, window_from:window_to]), dim=1)
        return self.rope.apply(q, *self._query_cos_sin), self.rope.apply(keys, *self._key_cos_sin), values

    def rollback(self, n: int) -> None:
        self._check_rollback(n, self.length)
        new_length = self.length - n
        if max(self.sinks, new_length - self.window) < self._offset:
            raise ValueError(f"streaming cache cannot roll back {n} tokens: it keeps {self.max_rollback} "
                             "evicted tokens for rollback")
        self.length = new_length

    def reset(self) -> None:
        self.length, self._offset = 0, 0
