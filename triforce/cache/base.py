"""The protocol every KV cache policy follows.

A forward over n new tokens is `begin(n)`, then `append(layer, q, k, v)` once per layer, then `end()`.
`append` takes unrotated projections (q: [Hq, n, D], k and v: [Hkv, n, D]), rotates them with the
positions of the cache's own policy and returns (q, keys, values) to attend over, keys and values
[Hkv, S, D] with the n new tokens last. `length` counts the tokens of the sequence the cache has
absorbed (visible or evicted); only the cache's own methods change it: `end`, `rollback(n)` (forget
the last n), `truncate(length)` and `reset`. `sync` is the hook a derived cache (retrieval) uses to
refresh itself from its source after the target has committed tokens; the others ignore it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..errors import UserError


class CacheCapacityError(UserError):
    """More tokens than the cache was sized for (prompt + max_new_tokens + speculation slack)."""


class LayerBuffers(NamedTuple):
    """Where a forward's n new tokens go in each layer, for the fused layer loop (kernels/decoder.py):
    the rotated keys and values into keys[l] and values[l] ([Hkv, capacity, D]) at offsets[l], and
    attention reads those buffers up to offsets[l] + n. cos, sin: [n, D] of the new positions.
    last_query ([L, Hq, D]), where the cache keeps each layer's rotated query of the last new token."""
    keys: list[torch.Tensor] | tuple[torch.Tensor, ...]
    values: list[torch.Tensor] | tuple[torch.Tensor, ...]
    offsets: list[int]
    cos: torch.Tensor
    sin: torch.Tensor
    last_query: torch.Tensor | None


class KVCache:
    length: int = 0
    _n: int = 0  # tokens of the forward in progress

    def begin(self, n: int) -> None:
        raise NotImplementedError

    def append(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        raise NotImplementedError

    def layer_buffers(self) -> LayerBuffers | None:
        """After begin(n), instead of `append` for every layer: the buffers the forward writes into, for
        policies whose append is exactly that write; None for the others."""
        return None

    def end(self) -> None:
        self.length += self._n
        self._n = 0

    def rollback(self, n: int) -> None:
        self._check_rollback(n, self.length)
        self.length -= n

    @staticmethod
    def _check_rollback(n: int, available: int) -> None:
        if not 0 <= n <= available:
            raise ValueError(f"cannot roll back {n} of {available} tokens")

    def reset(self) -> None:
        raise NotImplementedError

    def truncate(self, length: int) -> None:
        """Forget everything past `length` tokens (no-op when the cache is already that short)."""
        if length < self.length:
            self.rollback(self.length - length)

    def sync(self) -> None:
        """Called after the target tier commits tokens; only caches derived from another need it."""
