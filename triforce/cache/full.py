"""FullKVCache: every token's rotated keys and values, preallocated to the request's maximum length."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..models.config import ModelConfig
from ..step import Step
from .base import CacheCapacityError, KVCache, LayerBuffers, move_slots
from .chunk_means import ChunkMeans

# A forward's last rows whose queries the cache keeps for `last_query`: as many as the fused CPU loop takes
# (kernels/attention.py KERNEL_MAX_ROWS: 128 query rows per KV head), so it never cuts a check short; the
# layer-by-layer path keeps the same window.
QUERY_ROWS = 128


class FullKVCache(KVCache):
    def __init__(self, cfg: ModelConfig, capacity: int, dtype: torch.dtype, device: torch.device | str):
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # [L, Hkv, capacity, D], rotated
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self._layer_keys, self._layer_values = self.keys.unbind(0), self.values.unbind(0)  # views
        self.capacity, self.length = capacity, 0
        self._num_heads = cfg.num_heads  # query heads: the fused loop's query store has a row for each
        self._n = 0
        # The rotated queries of the latest forward's last QUERY_ROWS rows, for `last_query`: each layer's
        # [Hq, rows, D] on the layer-by-layer path; the store [L, Hq, QUERY_ROWS, D] on the fused one (made
        # at its first use: the fused loop runs on CPUs with the bfloat16 kernels only).
        self._layer_queries: list[torch.Tensor] | None = None
        self._queries: torch.Tensor | None = None
        self._forward = (0, 0)  # the latest forward's first position and its row count
        self._moved: dict[int, int] = {}  # since that forward, position -> the slot its entry came from
        self._means: ChunkMeans | None = None  # built by the first chunk_means call

    def begin(self, step: Step) -> None:
        """A forward may write its keys and values itself, at slots length .. length + n - 1 of `keys` and
        `values` (models/cuda_graphs.py), then hand over its queries with `written` before `end`."""
        n = step.n
        if self.length + n > self.capacity:
            raise CacheCapacityError(f"full KV cache holds {self.capacity} tokens; "
                                     f"{self.length} + {n} requested")
        self._n = n
        self._forward, self._moved, self._layer_queries = (self.length, n), {}, [None] * len(self._layer_keys)

    def written(self, queries: Sequence[torch.Tensor]) -> None:
        """Each layer's rotated queries [Hq, n <= QUERY_ROWS, D] of a forward that wrote its keys and values
        itself (kept, not copied: that forward's next run overwrites them, and begins a new forward here)."""
        self._layer_queries = list(queries)

    def append(self, layer, q, k, v):
        # narrow/copy_ on per-layer views: a decode step calls this 30 times, and tensor indexing costs
        # several times more Python-side than these method calls.
        start, n = self.length, self._n
        keys, values = self._layer_keys[layer], self._layer_values[layer]
        keys.narrow(1, start, n).copy_(k)
        values.narrow(1, start, n).copy_(v)
        if self._layer_queries is None:  # the fused loop took the buffers, then left this forward to the layers
            self._layer_queries = [None] * len(self._layer_keys)
        # a copy: q is a view of the rotation of every row of the forward's batch, keys too
        self._layer_queries[layer] = q[:, max(0, n - QUERY_ROWS):].clone()
        return keys.narrow(1, 0, start + n), values.narrow(1, 0, start + n)

    @property
    def last_query(self) -> list[torch.Tensor | None]:
        """Each layer's rotated query [Hq, D] of the cache's last token: TriForce scores chunks against it
        when the retrieval cache (re)builds ("the last prompt token's query"). After a check that is the
        last accepted token's row, not the check's last row (a rejected proposal, gone from the cache),
        wherever the accepted path moved it; the latest forward's last row if that token is not among its
        last QUERY_ROWS rows (not among its rows at all, or a check of more: rounds2 with long chains, where
        the next static rebuild then scores with a nearby rejected proposal's query, a cost to acceptance
        only). None per layer before any forward. (After a prefill that is the second-to-last prompt
        token's: the target prefills all but the last, which the first step feeds.)"""
        first, n = self._forward
        if n == 0:
            return [None] * len(self._layer_keys)
        kept = min(n, QUERY_ROWS)
        row = self._moved.get(self.length - 1, self.length - 1) - first - (n - kept)  # in the kept window
        row = row if 0 <= row < kept else kept - 1
        if self._layer_queries is None:
            return list(self._queries[:, :, row].unbind(0))
        return [q[:, row] for q in self._layer_queries]

    def query_state(self) -> tuple:
        """What `last_query` reads, to put back (`restore_query_state`) after forwards that are rolled back
        whole: a cost measurement's filler tokens, whose last row was otherwise taken for the last token's
        query, from which a retrieval cache built then chose its chunks (costs.forward_seconds). Copies: a
        CUDA graph's forward hands over views of its own buffers (`written`), which the filler's runs overwrite."""
        layer_queries = None if self._layer_queries is None else \
            [None if q is None else q.clone() for q in self._layer_queries]
        return self._forward, dict(self._moved), layer_queries, \
            None if self._queries is None else self._queries.clone()

    def restore_query_state(self, state: tuple) -> None:
        self._forward, self._moved, self._layer_queries, queries = state
        if queries is not None:
            with torch.inference_mode():  # in place (the fused layer loop holds this buffer), which forwards
                self._queries.copy_(queries)  # made under inference mode

    def layer_buffers(self) -> LayerBuffers:
        if self._queries is None:
            shape = (len(self._layer_keys), self._num_heads, QUERY_ROWS, self.keys.shape[-1])
            self._queries = self.keys.new_zeros(shape)
        self._layer_queries = None
        return LayerBuffers(self._layer_keys, self._layer_values, [self.length] * len(self._layer_keys),
                            self._queries)

    def means_bytes(self, chunk_size: int) -> int:
        """What `chunk_means(chunk_size)` would newly allocate: 0 where it holds those means already."""
        if self._means is not None and self._means.chunk_size == chunk_size:
            return 0
        layers, hkv, capacity, d = self.keys.shape
        return layers * hkv * (capacity // chunk_size) * d * self.keys.element_size()

    def chunk_means(self, chunk_size: int) -> torch.Tensor:
        """[L, Hkv, length // chunk_size, D]: mean keys of the complete chunks (the retrieval cache's scores)."""
        if self._means is None or self._means.chunk_size != chunk_size:
            self._means = ChunkMeans(self.keys, chunk_size)
        return self._means.upto(self.length)

    def block_bytes(self, n: int) -> int:
        """Bytes of the keys and values of n tokens."""
        return 2 * self.keys[:, :, :1].numel() * n * self.keys.element_size()

    def read(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the keys and values of positions [start, start + n): [L, Hkv, n, D] each."""
        return self.keys[:, :, start:start + n].clone(), self.values[:, :, start:start + n].clone()

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Sets positions [start, start + n) to keys and values that `read` gave (of the same tokens at the
        same positions); the cache then holds start + n tokens. Only extends a cache: start == length."""
        if start != self.length:
            raise ValueError(f"a write extends the cache at {self.length}, not at {start}")
        n = keys.shape[2]
        self.keys[:, :, start:start + n].copy_(keys)
        self.values[:, :, start:start + n].copy_(values)
        self.length = start + n

    def rollback(self, n: int) -> None:
        super().rollback(n)
        self._forget_from(self.length)

    def _move(self, src: list[int], dst: list[int]) -> None:
        if dst:
            self._forget_from(min(dst))
        self._moved.update({d: self._moved.get(s, s) for s, d in zip(src, dst)})
        move_slots((self.keys, self.values), src, dst, dim=2)

    def _forget_from(self, position: int) -> None:
        if self._means is not None:
            self._means.forget_from(position)

    def reset(self) -> None:
        self.length = 0
        self._forget_from(0)
        self._forward, self._moved, self._layer_queries = (0, 0), {}, None  # no token, no query
