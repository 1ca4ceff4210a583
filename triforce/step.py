"""The one input of a forward: which tokens, at which positions, seeing which keys.

The engine builds a `Step` and it is passed down unchanged: the model embeds `tokens` and rotates their
queries and keys with `positions`, the cache stores the keys and values (a cache never invents
positions), and attention applies `mask`. A forward attends over keys laid out with the n new tokens
last (every cache policy returns them so); the keys before them are speculative entries of earlier
forwards and, before those, the committed prefix.

- A *chain* (prefill chunks, decode steps, chain speculation): positions start..start+n-1, each token
  sees the whole prefix and the new tokens up to itself. `mask` is None: kernels apply that causal rule
  without reading a mask.
- A *tree* (Sequoia, arXiv 2402.12374): `parents[i]` is the index of token i's parent among the new
  tokens (parents[i] < i: topological order) or -1 for a child of the prefix; a token sits one position
  after its parent and sees the prefix, its ancestors and itself. `mask` [n, n] is that ancestor relation.
- A mask [n, m] with m > n covers the last m keys: the n new ones and the m - n speculative entries just
  before them (a tree grown over several forwards); every key before those m is seen by every token.

A chain is the tree whose parents are i - 1; batches (several sequences per forward) add per-sequence
fields here, not new arguments down the stack.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Step:
    tokens: torch.Tensor  # [n] int64
    positions: torch.Tensor  # [n] int64: each token's position in the sequence (RoPE)
    start: int  # the cache length the step continues from (its first token's slot)
    parents: tuple[int, ...] | None = None  # a tree among the new tokens; None: a chain
    mask: torch.Tensor | None = None  # [n, m] bool over the last m keys; None: causal among the n new

    def __post_init__(self):
        n = self.tokens.shape[0]
        if self.tokens.dim() != 1 or n == 0 or self.positions.shape != (n,):
            raise ValueError(f"a step needs tokens [n > 0] and positions [n] (got {tuple(self.tokens.shape)}, "
                             f"{tuple(self.positions.shape)})")
        if self.mask is not None and (self.mask.dim() != 2 or self.mask.shape[0] != n or self.mask.shape[1] < n
                                      or self.mask.dtype != torch.bool):
            raise ValueError(f"a step's mask is bool [n, m >= n] (n = {n}, got {tuple(self.mask.shape)})")
        if self.mask is not None and self.mask.device.type == "cpu" and \
                not bool(self.mask[:, self.mask.shape[1] - n:].diagonal().all()):  # (a GPU's: checked as made
            # on the CPU, then moved; asked there, a host sync per forward)
            raise ValueError("every token of a step sees itself (the mask's last n columns have a true diagonal)")

    @property
    def n(self) -> int:
        return self.tokens.shape[0]

    @classmethod
    def chain(cls, tokens: Sequence[int] | torch.Tensor, start: int, device=None) -> "Step":
        """Tokens that continue a sequence of `start` tokens, one after another."""
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=device)
        positions = torch.arange(start, start + tokens.shape[0], device=tokens.device)
        return cls(tokens, positions, start)

    @classmethod
    def tree(cls, tokens: Sequence[int], parents: Sequence[int], start: int, device=None) -> "Step":
        """A speculation tree after a sequence of `start` tokens, nodes in topological order."""
        parents = tuple(int(p) for p in parents)
        check_parents(parents, len(tokens))
        if parents == tuple(range(-1, len(tokens) - 1)):
            return cls.chain(tokens, start, device)
        mask = ancestor_mask(parents)
        depth = mask.sum(1) - 1  # ancestors among the new tokens
        return cls(torch.as_tensor(tokens, dtype=torch.long, device=device), (start + depth).to(device), start,
                   parents, mask.to(device))

    @property
    def is_chain(self) -> bool:
        return self.mask is None

    def parent_list(self) -> list[int]:
        """The parents as the worker protocol sends them (a chain's too)."""
        if self.parents is not None:
            return list(self.parents)
        if self.mask is not None:
            raise ValueError("this step's mask reaches past its own tokens: it has no parent list")
        return list(range(-1, self.n - 1))

    def to(self, device) -> "Step":
        if self.tokens.device == torch.device(device):
            return self
        mask = None if self.mask is None else self.mask.to(device)
        return Step(self.tokens.to(device), self.positions.to(device), self.start, self.parents, mask)


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """[n, n] bool: mask[i, j] when node j is node i or one of its ancestors (parents[i] < i)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def check_parents(parents: Sequence[int], n: int) -> None:
    """A tree of n tokens in topological order: one parent each, -1 or an earlier token's index."""
    if len(parents) != n or any(not -1 <= p < i for i, p in enumerate(parents)):
        raise ValueError("a tree's parents are one per token, each -1 or an earlier token's index")


def check_path(path: Sequence[int], available: int) -> None:
    """A kept path: strictly increasing indices below `available` (ancestors precede descendants)."""
    if any(not 0 <= p < available for p in path) or any(a >= b for a, b in zip(path, path[1:])):
        raise ValueError(f"a kept path is increasing indices in [0, {available}), not {list(path)[:8]}")
