"""The mean keys of a full cache's complete chunks, kept up to date as the cache grows.

The retrieval cache scores chunks by query . mean key (kernels/retrieval.py). Recomputing every mean at
each static rebuild read the whole prefix as a float32 copy (737 MB at 32K for SmolLM2; gigabytes for a
7B model at 128K); here a chunk is averaged once, when it completes, so a rebuild costs the chunks added
since the last one. A rollback below a chunk's end (the cache keeps only an accepted path) forgets that
chunk's mean, so a mean always describes the keys in the cache.
"""
from __future__ import annotations

import torch

from ..kernels.retrieval import chunk_mean_keys

# Keys averaged at a time: the first means after a prefill cover the whole prompt, and each block's float32
# sums are a chunk_size-th of its keys widened (in one piece, a float32 copy of every layer's keys had been
# 16 GB for an 8B model at 128K, on top of a cache sized to fit).
MEAN_BLOCK_BYTES = 64 << 20


class ChunkMeans:
    def __init__(self, keys: torch.Tensor, chunk_size: int):
        """keys: the cache's [L, Hkv, capacity, D] buffer (read, never written)."""
        layers, hkv, capacity, d = keys.shape
        self.keys, self.chunk_size = keys, chunk_size
        self.means = keys.new_empty(layers, hkv, capacity // chunk_size, d)
        self.count = 0  # leading chunks whose means are current

    def upto(self, length: int) -> torch.Tensor:
        """[L, Hkv, length // chunk_size, D]: the means of the complete chunks among the first `length` keys."""
        complete = length // self.chunk_size
        layers, hkv, _, d = self.keys.shape
        step = max(1, MEAN_BLOCK_BYTES // (layers * hkv * self.chunk_size * d * 4))  # chunks per float32 block
        for first in range(self.count, complete, step):  # the first after a prefill: the whole prompt's
            last = min(first + step, complete)
            self.means[:, :, first:last] = chunk_mean_keys(
                self.keys[:, :, first * self.chunk_size:last * self.chunk_size], self.chunk_size)
        self.count = max(self.count, complete)
        return self.means[:, :, :complete]

    def forget_from(self, length: int) -> None:
        """The keys from position `length` on are no longer the ones averaged."""
        self.count = min(self.count, length // self.chunk_size)
