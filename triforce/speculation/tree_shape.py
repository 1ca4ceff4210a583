"""Sequoia's tree shape (arXiv 2402.12374): the speculation tree that yields the most tokens per check.

Terms. Under Sequoia's *positional acceptance* assumption, when a check reaches a node, its k-th child
(k = 0, 1, ... in sampling order) is the one accepted with probability `acceptance[k]`, whatever the
node (the children are tried in order and at most one is accepted, so sum(acceptance) <= 1). A tree's
*expected tokens* per check is then 1 (the recovered or bonus token) plus, over its proposed nodes, the
probability that the check reaches and accepts each: the product of acceptance[rank] along its path.

`best_tree` finds, by dynamic programming over (nodes, depth), the tree of at most N proposed nodes and
at most `max_depth` levels that maximises it. A subtree of n nodes (its root counted) is worth
    value(n, depth) = 1 + max over n_0 + n_1 + ... = n - 1 of sum_k acceptance[k] * value(n_k, depth - 1),
where children are used in rank order (a k-th child needs a (k-1)-th). `pick_size` chooses N for the
machine at hand: the tree whose expected tokens per second is highest, given the verifier's measured
forward time per number of tokens checked and the proposer's per number of tokens it runs (at the root,
then once per level).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

NEG = float("-inf")


@dataclass(frozen=True)
class TreeShape:
    parents: list[int]  # level order: parents[i] < i, -1 under the root; siblings in rank order
    expected_tokens: float  # per check, the recovered or bonus token included
    depth: int  # levels of proposed nodes (0 for no proposal)


def best_tree(acceptance: Sequence[float], nodes: int, max_depth: int | None = None) -> TreeShape:
    """The tree of at most `nodes` proposed nodes and `max_depth` levels (default: no bound) that
    maximises the expected tokens per check."""
    shape = _best_tree(tuple(acceptance), nodes, max_depth)
    return TreeShape(list(shape.parents), shape.expected_tokens, shape.depth)


@functools.lru_cache(maxsize=256)
def _best_tree(acceptance: tuple[float, ...], nodes: int, max_depth: int | None) -> TreeShape:
    """Memoized: every request's first tree comes from the same prior acceptance (0.8 ms of Python for
    6 nodes in a chi-square test's profile, about 5% of a request there on the tiny models)."""
    value, split = _tables(acceptance, nodes, max_depth)
    depth = len(value) - 1
    slots = max(range(1, nodes + 2), key=lambda n: (value[depth][n], -n))
    return _shape(value, split, depth, slots)


def _tables(acceptance: Sequence[float], nodes: int, max_depth: int | None):
    """The dynamic program's tables for subtrees of up to nodes + 1 slots (the root slot included).
    value[d][n]: the best subtree of n slots and at most d levels below its root (-inf: none);
    split[d][k][m]: the slots given to child k when m slots go to children k, k + 1, ... of such a subtree."""
    if nodes < 0 or any(not 0 <= a <= 1 for a in acceptance) or sum(acceptance) > 1 + 1e-6:
        raise ValueError("acceptance rates are probabilities summing to at most 1; nodes >= 0")
    depth_bound = nodes if max_depth is None else min(max_depth, nodes)
    ranks, size = len(acceptance), nodes + 1
    value = [[NEG] * (size + 1) for _ in range(depth_bound + 1)]
    split = [[[0] * (size + 1) for _ in range(ranks + 1)] for _ in range(depth_bound + 1)]
    for d in range(depth_bound + 1):
        value[d][1] = 1.0
        if d == 0:
            continue
        below = value[d - 1]
        spread = [[NEG] * (size + 1) for _ in range(ranks + 1)]  # best of m slots among children k..
        for k in range(ranks, -1, -1):
            spread[k][0] = 0.0
            if k == ranks:
                continue
            for m in range(1, size):
                best, arg = NEG, 0
                for j in range(1, m + 1):  # child k's subtree takes j slots, later children the rest
                    if below[j] == NEG or spread[k + 1][m - j] == NEG:
                        continue
                    v = acceptance[k] * below[j] + spread[k + 1][m - j]
                    if v > best:
                        best, arg = v, j
                spread[k][m], split[d][k][m] = best, arg
        for n in range(2, size + 1):
            value[d][n] = 1.0 + spread[0][n - 1] if spread[0][n - 1] != NEG else NEG
        if value[d] == value[d - 1]:  # a level more adds nothing, nor will any after it (same recurrence):
            return value[:d], split[:d]  # the bound stops here (64 nodes: 12 levels of 64; 0.155 -> 0.028 s, Zen 3)
    return value, split


def _shape(value, split, depth: int, slots: int) -> TreeShape:
    parents, levels = _level_order(_build(split, depth, slots))
    return TreeShape(parents, value[depth][slots], levels)


def _build(split, d: int, n: int) -> list:
    """The subtree of n slots with d levels below: a list of child subtrees (each such a list)."""
    children, k, m = [], 0, n - 1
    while m > 0:
        j = split[d][k][m]
        children.append(_build(split, d - 1, j))
        k, m = k + 1, m - j
    return children


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
              max_depth: int = 8) -> TreeShape:
    """The tree of at least one node with the most expected tokens per second. check_seconds: the verifier's
    measured time per forward by tokens (the root's token plus the proposed nodes); proposer_seconds: the
    proposer's by tokens, for its forward at the root and one per level but the last (a width between
    measured ones costs the next measured one). Sizes come from check_seconds' keys. (No proposal at all
    is the choice of a mode, not of a tree: an empty tree would also stop the acceptance from being learnt.)"""
    if not any(n > 1 for n in check_seconds) or not proposer_seconds:
        raise ValueError("no measured check size with a proposal, or no proposer cost, to choose from")
    value, split = _tables(acceptance, max(check_seconds) - 1, max_depth)
    shapes = [_shape(value, split, d, n) for n in sorted(check_seconds) if n > 1
              for d in range(1, len(value)) if value[d][n] != NEG]

    def rate(shape: TreeShape) -> float:
        widths = _level_widths(shape.parents)[:-1]  # the last level is never forwarded
        seconds = check_seconds[len(shape.parents) + 1] + sum(_at(proposer_seconds, w) for w in [1] + widths)
        return shape.expected_tokens / seconds

    return max(shapes, key=rate)


def _level_widths(parents: list[int]) -> list[int]:
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return [depth.count(d) for d in range(max(depth) + 1)] if depth else []


def _at(table: dict[int, float], n: int) -> float:
    """The measured cost at n tokens, or at the next measured size (the largest past the end)."""
    return table[min((k for k in table if k >= n), default=max(table))]
