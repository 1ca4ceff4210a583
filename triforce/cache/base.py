"""The protocol every KV cache policy follows.

A forward over a step of n new tokens (triforce/step.py) is `begin(step)`, then `append(layer, q, k, v)`
once per layer, then `end()`. `append` takes the layer's projections of the new tokens (q: [Hq, n, D],
k and v: [Hkv, n, D]), q and k already rotated at the step's positions (the model rotates every row of a
forward at once: models/llama.py), stores k and v, and returns (keys, values) to attend over, [Hkv, S, D]
with the n new tokens last and the entries of earlier forwards in the order they were absorbed just
before them, so that a step's mask over the last m keys means the same in every policy. `length` counts
the entries the cache has absorbed (visible or evicted); only the cache's own methods change it: `end`,
`rollback(n)` (forget the last n), `truncate(length)`, `keep_path(start, path)` (keep an accepted
root-to-leaf path of a speculation tree, drop the rest) and `reset`. `sync` is the hook a derived cache
(retrieval) uses to refresh itself from its source after the target has committed tokens; the others
ignore it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..errors import UserError
from ..step import Step, check_path


class CacheCapacityError(UserError):
    """More tokens than the cache was sized for (prompt + max_new_tokens + speculation slack)."""


class LayerBuffers(NamedTuple):
    """Where a forward's n new tokens go in each layer, for the fused layer loop (kernels/decoder.py):
    the rotated keys and values into keys[l] and values[l] ([Hkv, capacity, D]) at offsets[l], and
    attention reads those buffers up to offsets[l] + n. last_query ([L, Hq, R, D]), where the cache keeps
    each layer's rotated queries of the last R new tokens (the last min(n, R))."""
    keys: list[torch.Tensor] | tuple[torch.Tensor, ...]
    values: list[torch.Tensor] | tuple[torch.Tensor, ...]
    offsets: list[int]
    last_query: torch.Tensor | None


class KVCache:
    length: int = 0
    _n: int = 0  # tokens of the forward in progress

    def begin(self, step: Step) -> None:
        raise NotImplementedError

    def append(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        raise NotImplementedError

    def layer_buffers(self) -> LayerBuffers | None:
        """After begin(step), instead of `append` for every layer: the buffers the forward writes into, for
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

    def keep_path(self, start: int, path: Sequence[int]) -> None:
        """Keep the first `start` entries, then entries start + path[0], start + path[1], ... (an accepted
        root-to-leaf path of a speculation tree: increasing indices), and forget the rest; the length
        becomes start + len(path). A chain's accepted prefix is path = 0..a-1, which is truncate(start + a)."""
        if start < 0:
            raise ValueError(f"keep_path from {start}")
        check_path(path, self.length - start)
        self.rollback(self.length - start - len(path))  # first: it refuses what the policy cannot undo
        moves = [(start + p, start + k) for k, p in enumerate(path) if p != k]
        if moves:  # the dropped entries' slots still hold their data: rollback only shortened the cache
            src, dst = zip(*moves)
            with torch.inference_mode():  # stores a forward (re)allocated are inference tensors
                self._move(list(src), list(dst))

    def _move(self, src: list[int], dst: list[int]) -> None:
        """Copy the entries at sequence indices src[i] to dst[i] (dst[i] < src[i], both increasing)."""
        raise NotImplementedError

    def truncate(self, length: int) -> None:
        """Forget everything past `length` tokens (no-op when the cache is already that short)."""
        if length < self.length:
            self.rollback(self.length - length)

    def sync(self) -> None:
        """Called after the target tier commits tokens; only caches derived from another need it."""

    @property
    def settled(self) -> bool:
        """Whether the cache holds the keys and values its length says (a streaming cache that skipped to a
        long prompt's last window holds that window once its forward has run): only then may filler tokens
        be run over it and rolled back (a cost measurement: coordinator/costs.py)."""
        return True

    def skippable(self, end: int) -> int:
        """How many of the next tokens a prefill up to `end` may leave out (skip), because the cache would
        evict them unread; 0 for caches that keep every token."""
        return 0

    def before_skip(self, end: int) -> int | None:
        """Of a prefill up to `end`, at most how many of the next tokens to run before the cache may skip
        (a streaming cache's sinks, where tokens past them would be evicted unread); None: no bound."""
        return None

    def skip(self, n: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} keeps every token")


def move_slots(tensors: Sequence[torch.Tensor], src: list[int], dst: list[int], dim: int) -> None:
    """Copy slots src -> dst along `dim` of each tensor (the source slots are gathered before writing)."""
    for t in tensors:
        t.index_copy_(dim, torch.tensor(dst, device=t.device), t.index_select(dim, torch.tensor(src, device=t.device)))
