"""Sequoia's tree shape (arXiv 2402.12374): the speculation tree that yields the most tokens per check.

Terms. Under Sequoia's *positional acceptance* assumption, when a check reaches a node, its k-th child
(k = 0, 1, ... in sampling order) is the one accepted with probability `acceptance[k]`, whatever the
node (the children are tried in order and at most one is accepted, so sum(acceptance) <= 1). Here the
root may have its own rates (`root`): in a hierarchy the root's token is often the checker's correction
of the proposer, where the proposer is least sure (a greedy run at 8K: the root's first child accepted
0.80 of the time, a first child below it 0.88-1.0). A tree's *expected tokens* per check is then 1 (the
recovered or bonus token) plus, over its proposed nodes, the probability that the check reaches and
accepts each: the product of the rates of its rank along its path.

`best_tree` finds, by dynamic programming over (nodes, depth), the tree of at most N proposed nodes and
at most `max_depth` levels that maximises it. A subtree of n nodes (its root counted) is worth
    value(n, depth) = 1 + max over n_0 + n_1 + ... = n - 1 of sum_k acceptance[k] * value(n_k, depth - 1),
where children are used in rank order (a k-th child needs a (k-1)-th); the root's level is the same sum
over the root's rates. `pick_size` chooses N for the
machine at hand: the tree whose expected tokens per second is highest, given the verifier's measured
forward time per number of tokens checked and the proposer's per number of tokens it runs (at the root,
then once per level).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

NEG = float("-inf")


@dataclass(frozen=True)
class TreeShape:
    parents: list[int]  # level order: parents[i] < i, -1 under the root; siblings in rank order
    expected_tokens: float  # per check, the recovered or bonus token included
    depth: int  # levels of proposed nodes (0 for no proposal)


def best_tree(acceptance: Sequence[float], nodes: int, max_depth: int | None = None,
              root: Sequence[float] | None = None) -> TreeShape:
    """The tree of at most `nodes` proposed nodes and `max_depth` levels (default: no bound) that
    maximises the expected tokens per check; `root`: the root's own rates (default `acceptance`)."""
    shape = _best_tree(tuple(acceptance), nodes, max_depth, tuple(acceptance if root is None else root))
    return TreeShape(list(shape.parents), shape.expected_tokens, shape.depth)


@functools.lru_cache(maxsize=256)
def _best_tree(acceptance: tuple[float, ...], nodes: int, max_depth: int | None, root: tuple[float, ...]) -> TreeShape:
    """Memoized: every request's first tree comes from the same prior acceptance (0.8 ms of Python for
    6 nodes in a chi-square test's profile, about 5% of a request there on the tiny models)."""
    tables = _Tables(acceptance, root, nodes, max_depth)
    depth = len(tables.top) - 1
    slots = max(range(1, nodes + 2), key=lambda n: (tables.top[depth][n], -n))
    return tables.shape(depth, slots)


class _Tables:
    """The dynamic program's tables for trees of up to nodes + 1 slots (the root slot included).
    below[d][n]: the best subtree of n slots and at most d levels under a node below the root (-inf: none);
    top[d][n]: the same for the root, whose children are accepted at the root's rates; top_split[d] and
    below_split[d] (`_level`): how such a subtree's slots go to its children."""

    def __init__(self, acceptance: Sequence[float], root: Sequence[float], nodes: int, max_depth: int | None):
        if nodes < 0 or not acceptance or not root or \
                any(not 0 <= a <= 1 or sum(rates) > 1 + 1e-6 for rates in (acceptance, root) for a in rates):
            raise ValueError("acceptance rates (one or more) are probabilities summing to at most 1; nodes >= 0")
        size = nodes + 1
        leaf = [NEG] * (size + 1)
        leaf[1] = 1.0
        self.below, self.top, self.below_split, self.top_split = [leaf], [leaf], [None], [None]
        for d in range(1, (nodes if max_depth is None else min(max_depth, nodes)) + 1):
            top, top_split = _level(root, self.below[d - 1], size)
            if top == self.top[d - 1]:  # a level more adds nothing, nor will any after it (same recurrence):
                break  # the bound stops here (64 nodes: 12 levels of 64; 0.155 -> 0.028 s, Zen 3)
            self.top.append(top)
            self.top_split.append(top_split)
            below = (top, top_split) if root == acceptance else _level(acceptance, self.below[d - 1], size)
            self.below.append(below[0])
            self.below_split.append(below[1])

    def shape(self, depth: int, slots: int) -> TreeShape:
        parents, levels = _level_order(self._build(self.top_split, depth, slots))
        return TreeShape(parents, self.top[depth][slots], levels)

    def _build(self, split, d: int, n: int) -> list:
        """The subtree of n slots with d levels below, its children's slots from `split[d]`: a list of child
        subtrees (each such a list)."""
        children, k, m = [], 0, n - 1
        while m > 0:
            j = split[d][k][m]
            children.append(self._build(self.below_split, d - 1, j))
            k, m = k + 1, m - j
        return children


def _level(rates: Sequence[float], below: list[float], size: int) -> tuple[list[float], list[list[int]]]:
    """One level of the program: value[n], the best subtree of n slots whose children (accepted at `rates`
    by rank) hang subtrees worth below[j] for j slots, and split[k][m], the slots given to child k when m
    slots go to children k, k + 1, ...: spread_k[m] = max over j of rates[k] below[j] + spread_k+1[m - j],
    the smallest such j (float64 tensors over every (m, j) at once: a 64-node auto decision took 12-13 ms
    in Python loops and 5.5-6 ms so, the same shapes, on the AMX Xeon: benchmarks/tree_shape_time.py)."""
    subtree = torch.tensor(below[1:size], dtype=torch.float64)  # j = 1 .. size - 1 slots for child k
    m = torch.arange(1, size)
    rest = m[:, None] - m[None, :]  # [m, j]: slots left for the later children
    fits = rest >= 0
    rest = rest.clamp(min=0)
    spread = torch.full((size,), NEG, dtype=torch.float64)  # best of m slots among children k.. (m < size)
    spread[0] = 0.0
    finite = subtree > NEG
    splits = []
    for k in range(len(rates) - 1, -1, -1):
        child = torch.where(finite, rates[k] * subtree, NEG)  # (0 x -inf would be nan)
        total = torch.where(fits, child[None, :] + spread[rest], NEG)
        arg = total.argmax(1)  # the first of equal ones
        best = total.gather(1, arg[:, None])[:, 0]
        splits.append(torch.where(best > NEG, arg + 1, 0))
        spread = torch.cat([spread[:1], best])
    split = torch.nn.functional.pad(torch.stack(splits[::-1]), (1, 0)).tolist()  # [k][m]: m = 0 .. size - 1
    ahead = spread.tolist()
    value = [NEG, 1.0] + [1.0 + ahead[n - 1] if ahead[n - 1] != NEG else NEG for n in range(2, size + 1)]
    return value, split


def _level_order(root: list) -> tuple[list[int], int]:
    """Parents in breadth-first order (a proposer grows one level per forward) and the depth."""
    parents, frontier, depth = [], [(-1, root)], 0
    while True:
        nxt = []
        for index, children in frontier:
            for child in children:
                parents.append(index)
                nxt.append((len(parents) - 1, child))
        if not nxt:
            return parents, depth
        frontier, depth = nxt, depth + 1


def pick_size(acceptance: Sequence[float], check_seconds: dict[int, float], proposer_seconds: dict[int, float],
              max_depth: int = 8, root: Sequence[float] | None = None,
              above: Callable[[float, dict[int, float]], float] | None = None) -> TreeShape:
    """The tree of at least one node with the most expected tokens per second. check_seconds: the verifier's
    measured time per forward by tokens (the root's token plus the proposed nodes); proposer_seconds: the
    proposer's by tokens, for its forward at the root and one per level but the last (a width between
    measured ones costs the next measured one). Sizes come from check_seconds' keys. `above`, where a tier
    checks the verifier's rounds in turn: its seconds per token it yields, given a round's seconds and what
    a round yields by probability (`yields`); the tree that minimises it wins. (No proposal at all
    is the choice of a mode, not of a tree: an empty tree would also stop the acceptance from being learnt.)"""
    if not any(n > 1 for n in check_seconds) or not proposer_seconds:
        raise ValueError("no measured check size with a proposal, or no proposer cost, to choose from")
    tables = _Tables(acceptance, acceptance if root is None else root, max(check_seconds) - 1, max_depth)
    shapes = [tables.shape(d, n) for n in sorted(check_seconds) if n > 1  # (a level that adds nothing: its
              for d in range(1, len(tables.top)) if tables.top[d][n] > tables.top[d - 1][n]]  # shallower twin)

    def rate(shape: TreeShape) -> float:
        widths = _level_widths(shape.parents)[:-1]  # the last level is never forwarded
        seconds = check_seconds[len(shape.parents) + 1] + sum(_at(proposer_seconds, w) for w in [1] + widths)
        if above is None:
            return shape.expected_tokens / seconds
        return 1.0 / above(seconds, yields(shape.parents, acceptance, root))

    return max(shapes, key=rate)


def yields(parents: list[int], acceptance: Sequence[float], root: Sequence[float] | None = None) -> dict[int, float]:
    """What a check of the tree `parents` yields (its accepted path and the next token), by probability:
    the path reaches depth d with the summed chance of reaching and accepting each node there."""
    reach, depth, beyond = [], [], [1.0]  # per node; beyond[d]: the chance the path accepts d nodes or more
    kids: dict[int, int] = {}
    for p in parents:
        rank = kids[p] = kids.get(p, -1) + 1
        rates = acceptance if p >= 0 or root is None else root
        reach.append((reach[p] if p >= 0 else 1.0) * (rates[rank] if rank < len(rates) else 0.0))
        depth.append(depth[p] + 1 if p >= 0 else 1)
        beyond += [0.0] * (depth[-1] + 1 - len(beyond))
        beyond[depth[-1]] += reach[-1]
    beyond.append(0.0)
    return {d + 1: beyond[d] - beyond[d + 1] for d in range(len(beyond) - 1) if beyond[d] > beyond[d + 1]}


def _level_widths(parents: list[int]) -> list[int]:
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return [depth.count(d) for d in range(max(depth) + 1)] if depth else []


def _at(table: dict[int, float], n: int) -> float:
    """The measured cost at n tokens, or at the next measured size (the largest past the end)."""
    return table[min((k for k in table if k >= n), default=max(table))]
