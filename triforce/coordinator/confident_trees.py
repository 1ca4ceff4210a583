"""Trees shaped as they grow by the proposer's confidence at each node (EAGLE-2's dynamic trees, arXiv
2406.16858, kept exact), beside Sequoia's fixed shapes (trees.py).

Sequoia's shape comes from positional acceptance rates averaged over every node, so it spends the same
siblings under a node where the draft is sure as where it is not, and on this machine its trees lost to a
chain of 4 (docs/trees.md). Here a node's children are decided once the node has been forwarded,
from its *confidence* there (the proposer's top probability at temperature 1, in one of the buckets of
CONFIDENCE_EDGES) and its *value*: the probability that the check accepts it, estimated as the product
along its path of `rate(bucket, rank)`, how often a child of that rank under a parent of that confidence
was the accepted one in this run's checks (from a prior worth PRIOR_WEIGHT checks).

The tree always holds the *spine*, the chain of first children the mode would propose without trees
(gamma of them), so it accepts at least what that chain would. Beyond it, a level's candidates (a node
and the rank of its next child) are taken in order of value while each one raises the round's expected
tokens per second, alone or with a chain below it (at the rate first children below the root were
accepted), against the costs measured on this machine: the checker's time for the tokens it adds, and
the proposer's for widening the levels below; up to `nodes` in all. A level past the spine is forwarded
while chains below its nodes would pay for the forwards; at most MAX_DEPTH levels (or the spine's).

Exact: a node's child count is decided from its own logits, its path, and the rest of the tree above and
beside it, never from the children drawn below it, and siblings are drawn without replacement in rank
order as in every tree (speculation/tree.py); tree verification is exact for any such tree.

Measured on the 2-core AMX Xeon (docs/trees.md): 0.94x the chain of 4 at greedy and 1.02x at 0.6,
so chains stay the default and this shape is an option.
"""
from __future__ import annotations

from bisect import bisect_right

import torch

from ..speculation.sampling import top_probability
from ..speculation.tree import children_of
from .costs import interpolate
from .trees import rank_of

CONFIDENCE_EDGES = (0.2, 0.4, 0.6, 0.8)  # the buckets of a node's top probability
RANKS = 4  # children per node at most
MAX_DEPTH = 8  # levels of proposals at most
PRIOR_WEIGHT = 4.0  # checks' worth of the prior below
SIBLING_PRIOR = 0.3  # before any check, a second child is accepted this share of what the first leaves...
SIBLING_DECAY = 0.5  # ...and each later one this share of the one before
DEEP_PRIOR = 0.6  # before any check, a first child below the root is accepted this often


def bucket(logits: torch.Tensor) -> int:
    """The confidence bucket of a node whose proposer logits are `logits` [V]."""
    return bisect_right(CONFIDENCE_EDGES, top_probability(logits))


def prior(b: int, rank: int) -> float:
    """A calibrated proposer's rates: a first child accepted at the middle of its parent's bucket."""
    edges = (0.0, *CONFIDENCE_EDGES, 1.0)
    first = (edges[b] + edges[b + 1]) / 2
    return first if rank == 0 else (1 - first) * SIBLING_PRIOR * SIBLING_DECAY ** (rank - 1)


class ConfidenceShaper:
    """Grows each tree by confidence (the module docstring) up to `nodes` proposals, from the checker's and
    the proposer's forward costs by tokens (`costs`, set before the first tree: trees.measure_costs)."""

    needs_costs = True

    def __init__(self, nodes: int, spine: int = 0):
        if not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"a tree needs at least one node (got {nodes!r})")
        self.nodes = self.largest = nodes
        self.spine = min(spine, nodes)  # first children down to this depth are always grown (a chain)
        self.costs: tuple[dict[int, float], dict[int, float]] | None = None
        buckets = range(len(CONFIDENCE_EDGES) + 1)
        self.accepted = [[PRIOR_WEIGHT * prior(b, k) for k in range(RANKS)] for b in buckets]
        self.offered = [[PRIOR_WEIGHT] * RANKS for _ in buckets]
        self.deep = [PRIOR_WEIGHT * DEEP_PRIOR, PRIOR_WEIGHT]  # first children below the root: accepted, offered
        self._last: ConfidentGrowth | None = None

    def rate(self, b: int, rank: int) -> float:
        """How often a child of `rank` under a node of bucket `b` was the accepted one; never more than
        a lower rank's (children are drawn in rank order, so a later one is no likelier)."""
        return min(self.accepted[b][k] / self.offered[b][k] for k in range(rank + 1))

    def deep_rate(self) -> float:
        """How often a first child was the accepted one under a node below the root (the root follows a
        rejection, where the proposer is least sure): for nodes whose bucket is not known yet."""
        return self.deep[0] / self.deep[1]

    def growth(self) -> ConfidentGrowth:
        if self.costs is None:
            raise RuntimeError("a confidence-shaped tree needs measured costs first")
        self._last = ConfidentGrowth(self)
        return self._last

    def observe(self, parents: list[int], path: list[int]) -> None:
        """One check's walk over the last tree grown: at every reached node that had children, which rank
        was accepted, counted under the node's bucket."""
        children = children_of(parents)
        for depth, slot in enumerate([0] + [p + 1 for p in path]):
            kids, b = children[slot], self._last.buckets.get(slot)
            taken = path[depth] if depth < len(path) else None
            for rank in range(min(len(kids), RANKS)) if b is not None else ():
                self.offered[b][rank] += 1
                self.accepted[b][rank] += kids[rank] == taken
            if depth and kids:
                self.deep[1] += 1
                self.deep[0] += kids[0] == taken


class ConfidentGrowth:
    """One tree's growth (trees.Growth): each node's value, its bucket once forwarded, and the round's
    proposer seconds so far. A candidate is weighed with what a chain below it would add (at the rate
    first children below the root were accepted), against what that chain would cost."""

    def __init__(self, shaper: ConfidenceShaper):
        self.shaper = shaper
        self.check, self.level = shaper.costs
        self.value = {0: 1.0}  # slot -> the chance the check reaches it (the root: 1)
        self.buckets: dict[int, int] = {}
        self.child_value: dict[tuple[int, int], float] = {}  # (parent slot, rank) -> the child's value
        self.seconds = interpolate(self.level, 1)  # the proposer's forwards so far: the root's, then levels

    def _value(self, slot: int, parents: list[int]) -> float:
        if slot not in self.value:
            node = slot - 1
            self.value[slot] = self.child_value[(parents[node] + 1, rank_of(node, parents))]
        return self.value[slot]

    def _round(self, parents: list[int]) -> tuple[float, float]:
        """Expected tokens and seconds of the round as the tree stands."""
        tokens = 1 + sum(self._value(s, parents) for s in range(1, len(parents) + 1))
        return tokens, self.seconds + interpolate(self.check, 1 + len(parents))

    def _chain(self, h: int) -> float:
        """Expected tokens a chain of h proposals adds below a node the check accepts."""
        a = self.shaper.deep_rate()
        return sum(a ** j for j in range(1, h + 1))

    def _extra_check(self, n: int, more: int) -> float:
        return interpolate(self.check, 1 + n + more) - interpolate(self.check, 1 + n)

    def children(self, slots, logits, parents):
        shaper, n = self.shaper, len(parents)
        for slot, row in zip(slots, logits):
            self.buckets[slot] = bucket(row)
        tokens, seconds = self._round(parents)
        depth = _depth(slots[0], parents) + 1  # the children's
        counts = [0] * len(slots)

        def take(i: int, value: float) -> None:
            nonlocal n, tokens, seconds
            self.child_value[(slots[i], counts[i])] = value
            counts[i], n = counts[i] + 1, n + 1
            tokens, seconds = tokens + value, seconds + self._extra_check(n - 1, 1)

        for i, s in enumerate(slots):  # the spine's next node, whatever it costs
            if depth <= shaper.spine and n < shaper.nodes and self._on_spine(s, parents):
                take(i, self._value(s, parents) * shaper.rate(self.buckets[s], 0))
        candidates = sorted(((self._value(s, parents) * shaper.rate(self.buckets[s], k), i, k)
                             for i, s in enumerate(slots) for k in range(RANKS)), key=lambda c: (-c[0], c[1], c[2]))
        room = shaper.nodes - max(0, shaper.spine - depth)  # the spine's deeper nodes keep their places
        for value, i, k in candidates:
            if n >= room or counts[i] != k:
                continue  # full, or not the node's next rank (taken already, or one before it was not)
            if n and not self._pays(tokens, seconds, value, n, sum(counts), min(MAX_DEPTH - depth, room - n - 1)):
                break  # the best one left does not pay, nor does any after it
            take(i, value)
        return counts

    def _pays(self, tokens: float, seconds: float, value: float, n: int, width: int, below: int) -> bool:
        """Whether a node of `value` raises the round's tokens per second, alone or with a chain of up to
        `below` proposals under it (their checks, and the forwards they would take: a level's first node
        costs its whole forward, a later one what it widens it by)."""
        level = self.level
        widen = interpolate(level, width + 1) - interpolate(level, width) if width else interpolate(level, 1)
        for h in range(max(below, 0) + 1):
            promise, cost = value * (1 + self._chain(h)), self._extra_check(n, 1 + h) + h * widen
            if (tokens + promise) * seconds >= tokens * (seconds + cost):
                return True
        return False

    def _on_spine(self, slot: int, parents: list[int]) -> bool:
        """Whether every node on the path to `slot` is its parent's first child."""
        while slot:
            if rank_of(slot - 1, parents):
                return False
            slot = parents[slot - 1] + 1
        return True

    def forward_level(self, slots, parents):
        depth, n = _depth(slots[0], parents), len(parents)
        go = n < self.shaper.nodes and (depth < self.shaper.spine or self._deeper_pays(slots, parents, depth))
        if go:
            self.seconds += interpolate(self.level, len(slots))
        return go

    def _deeper_pays(self, slots: list[int], parents: list[int], depth: int) -> bool:
        """Whether forwarding this level pays: with a chain of h more levels below each of its nodes, for
        some h (their forwards and checks)."""
        tokens, seconds = self._round(parents)
        reached = sum(self._value(s, parents) for s in slots)
        for h in range(1, min(MAX_DEPTH - depth, (self.shaper.nodes - len(parents)) // len(slots)) + 1):
            gain = reached * self._chain(h)
            cost = h * interpolate(self.level, len(slots)) + self._extra_check(len(parents), h * len(slots))
            if (tokens + gain) * seconds >= tokens * (seconds + cost):
                return True
        return False


def _depth(slot: int, parents: list[int]) -> int:
    depth = 0
    while slot:
        slot, depth = parents[slot - 1] + 1, depth + 1
    return depth
