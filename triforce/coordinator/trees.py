"""Token trees in the hierarchy: the bottom tier grows a tree, the tier above checks it in one forward.

`grow_tree` runs the proposer level by level (one forward per level, each node seeing its ancestors
through the step's mask) and samples each node's children without replacement from the proposer's
distribution there (speculation/tree.py), as many as a `Growth` decides at each level. `TreeShaper`
decides a shape before each tree (`FixedShape`): Sequoia's best tree for the acceptance measured so far
in this run (speculation/tree_shape.py), re-decided every `every` checks; confident_trees.py decides
while the tree grows.
"""
from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Protocol

import torch

from ..config import MAX_TREE
from ..speculation.sampling import row_argmax
from ..speculation.tree import children_of, sample_children
from ..speculation.tree_shape import best_tree, pick_size
from ..step import Step, ancestor_mask
from .costs import CostTable, interpolate
from .request_rows import RequestRows
from .speed_model import check_sizes
from .tiers import Tier

RANKS = 8  # children per node the shaper considers
# Before any check: a guess of how often the k-th child is the accepted one (a draft that the tier above
# accepts about half the time), worth PRIOR_WEIGHT observed visits.
PRIOR = [0.5, 0.15, 0.07, 0.04, 0.02, 0.01, 0.01, 0.01]
PRIOR_WEIGHT = 2.0
FIRST_DECISIONS = (4, 8, 16)  # checks after which a shape is decided again, before every `every`


def grow_tree(tier: Tier, forward: Callable[[Step], Generator], growth: "Growth", request: RequestRows):
    """The tree `tier` proposes after `request.seq`, shaped as `growth` decides level by level (a node gets
    fewer children where fewer tokens have probability). `forward(step)` runs a step on `tier` (a generator
    that yields what the engine's forwards yield and returns the logits). A node's row is the request's
    (request_rows.py: its rules for the node's path, its sampling settings) mixed with the prompt lookup's
    copy for its path unless the request bans it there, as a chain's tokens are; greedy, the children are
    the proposer's best by its ruled logits, the first what its processed row picks, the copy among them,
    and none the request bans. Returns (tokens, parents, proposer rows [N + 1, V] per slot: the root, then
    each node; zero for the last level's nodes, which are never forwarded)."""
    seq, greedy = request.seq, request.greedy
    logits = [request.ruled((yield from forward(Step.chain(seq[tier.length:], tier.length)))[-1:], [[]])[0]]
    rows = [request.probs(logits[0][None])[0]]
    position = len(seq)
    tokens: list[int] = []
    parents: list[int] = []
    paths: list[list[int]] = [[]]  # per slot: the tokens from below seq's end down to it
    frontier = [0]  # slots (0: the root, i + 1: node i) forwarded, whose children come next
    while frontier:
        level: list[int] = []
        for slot, k in zip(frontier, growth.children(frontier, [logits[s] for s in frontier], parents)):
            if not k:
                continue
            choice = int(row_argmax(rows[slot])) if greedy else None  # what its processed row picks (logit_bias)
            copy = request.copy(paths[slot], logits[slot])
            rows[slot] = request.mixed(rows[slot], copy, paths[slot])
            if greedy:  # ranked by the proposer's logits (its one-hot row would allow a single child)
                drawn = sample_children(logits[slot], k, None, True)  # (a banned one could only be rejected)
                drawn = [choice] + [t for t in drawn if t != choice and logits[slot][t] > float("-inf")
                                    and not request.bans(t, paths[slot], logits[slot])][:k - 1]
                drawn = drawn if copy is None else request.lookup.greedy_order(drawn, copy)
            else:
                drawn = sample_children(rows[slot], k, request.generator, False)
            for token in drawn:
                tokens.append(token)
                parents.append(slot - 1)
                paths.append(paths[slot] + [token])
                level.append(len(tokens))
        frontier = level if level and growth.forward_level(level, parents) else []
        if frontier:  # forward the whole level (the cache then holds a prefix of the nodes)
            nodes = [s - 1 for s in level]
            mask = ancestor_mask(parents)[nodes]  # [n, nodes so far]: each sees its ancestors
            step = Step(torch.tensor([tokens[i] for i in nodes]), position + mask.sum(1) - 1, tier.length, None, mask)
            level_logits = request.ruled((yield from forward(step)), [paths[s] for s in level])
            logits.extend(level_logits)
            rows.extend(request.probs(level_logits))
    rows += [torch.zeros_like(rows[0])] * (len(tokens) + 1 - len(rows))
    return tokens, parents, torch.stack(rows)


class Growth(Protocol):
    """How one tree grows: asked, level by level, how many children each reached node gets and whether a
    level is worth the proposer's forward. Exact whatever it answers from what it is shown (the nodes, their
    proposer logits, the tree so far): a node's child count never depends on the children drawn below it."""

    def children(self, slots: list[int], logits: list[torch.Tensor], parents: list[int]) -> list[int]: ...

    def forward_level(self, slots: list[int], parents: list[int]) -> bool: ...


def node_paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Per node of a tree (parents before children): the tokens from the root down to it, itself included."""
    paths: list[list[int]] = []
    for token, parent in zip(tokens, parents):
        paths.append((paths[parent] if parent >= 0 else []) + [token])
    return paths


def rank_of(node: int, parents: list[int]) -> int:
    """Which child of its parent node `node` is (0: the first drawn)."""
    return parents[:node].count(parents[node])


class FixedShape:
    """Growth along a shape decided before the tree (parents, level order; siblings in rank order)."""

    def __init__(self, shape: list[int]):
        self.kids = children_of(shape)
        self.place = {0: 0}  # tree slot -> shape slot

    def _shape_slot(self, slot: int, parents: list[int]) -> int:
        if slot not in self.place:
            node = slot - 1
            self.place[slot] = self.kids[self._shape_slot(parents[node] + 1, parents)][rank_of(node, parents)] + 1
        return self.place[slot]

    def children(self, slots, logits, parents):
        return [len(self.kids[self._shape_slot(s, parents)]) for s in slots]

    def forward_level(self, slots, parents):
        return any(self.children(slots, [], parents))


def tree_step(seq: list[int], start: int, tokens: list[int], parents: list[int]) -> Step:
    """The checking tier's forward: the tokens of `seq` it has not seen since `start` (a chain ending in
    the root's token), then the tree hanging below that last token."""
    catch_up = seq[start:]
    c = len(catch_up)
    chain = list(range(-1, c - 1))
    return Step.tree(catch_up + tokens, chain + [c - 1 if p < 0 else c + p for p in parents], start)


class RankRates:
    """How often the k-th child of a reached node was the accepted one, from a prior worth PRIOR_WEIGHT
    visits: per rank, the visits where it was accepted and the visits to nodes that had a child of it."""

    def __init__(self):
        self.accepted = [PRIOR_WEIGHT * p for p in PRIOR]
        self.offered = [PRIOR_WEIGHT] * RANKS

    def visit(self, kids: list[int], taken: int | None) -> None:
        """A reached node with children `kids` (nodes, in rank order), of which `taken` (or none) was accepted."""
        for rank in range(min(len(kids), RANKS)):
            self.offered[rank] += 1
            self.accepted[rank] += kids[rank] == taken

    def rates(self) -> list[float]:
        """Each rank's rate, capped at what the lower ranks leave (the DP needs a sum <= 1; each rate is
        counted over its own visits, so their sum can pass 1). Scaling them all down instead cut a greedy
        run's first-child rate from 0.88 to 0.67 under the prior's rates of ranks it never tried."""
        rates, left = [], 1.0
        for a, o in zip(self.accepted, self.offered):
            rates.append(min(a / o, left))
            left -= rates[-1]
        return rates


class TreeShaper:
    """The shape the bottom tier grows: Sequoia's best tree for the positional acceptance rates observed so
    far (the k-th child's chance to be the accepted one at a reached node; the root's own, where the
    proposer follows the checker's correction), of at most `nodes` proposals, or with nodes="auto" of the
    size and depth with the most expected tokens per second for the costs in `costs` (measure_costs: the
    checker's and the proposer's seconds per forward by tokens), counting the check above where there is
    one (`above`). Re-decided after FIRST_DECISIONS checks,
    then every `every`: a request's first trees follow the prior, which is far from a greedy run's rates."""

    def __init__(self, nodes: int | str, cap: int = MAX_TREE, every: int = 32):
        """cap: the most nodes an auto size may hold."""
        if nodes != "auto" and (not isinstance(nodes, int) or nodes < 1):
            raise ValueError(f"a tree needs at least one node, or 'auto' (got {nodes!r})")
        self.nodes, self.every = nodes, every
        self.largest = min(cap, MAX_TREE) if nodes == "auto" else nodes  # nodes the largest tree may hold
        self.costs: tuple[dict[int, float], dict[int, float]] | None = None  # set before the first auto shape
        self.above: CheckAbove | None = None  # with costs, where a tier checks the checker's rounds in turn
        self.root, self.below = RankRates(), RankRates()  # the root's children's rates; every other node's
        self._checks = 0
        self._shape: list[int] | None = None

    @property
    def needs_costs(self) -> bool:
        return self.nodes == "auto"

    def growth(self) -> FixedShape:
        """This check's tree: grown along `shape`."""
        return FixedShape(self.shape())

    def shape(self) -> list[int]:
        if self._shape is None or self._checks in FIRST_DECISIONS or self._checks % self.every == 0:
            below, root = self.below.rates(), self.root.rates()
            if self.needs_costs:
                if self.costs is None:
                    raise RuntimeError("an auto-sized tree needs measured costs first")
                above = None if self.above is None else self.above.seconds_per_token
                self._shape = pick_size(below, *self.costs, root=root, above=above).parents
            else:
                self._shape = best_tree(below, self.nodes, root=root).parents
        return self._shape

    def observe(self, parents: list[int], path: list[int]) -> None:
        """One check's walk: every reached node (the root, then each accepted one) and which rank of its
        children, if any, was accepted."""
        self._checks += 1
        children = children_of(parents)
        for depth, slot in enumerate([0] + [p + 1 for p in path]):
            (self.below if depth else self.root).visit(children[slot], path[depth] if depth < len(path) else None)


CHECK_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)  # tokens per check the costs are measured at
LEVEL_SIZES = (1, 2, 4, 8, 16, 32)  # tokens per proposer forward likewise


def measure_costs(checker: Tier, proposer: Tier, max_tokens: int) -> tuple[dict[int, float], dict[int, float]]:
    """Seconds per forward of the checking tier by tokens checked (CHECK_SIZES up to max_tokens) and of the
    proposer by tokens (LEVEL_SIZES: its root forward and its levels), from the cost table (costs.py:
    measured on this machine once per tier and context)."""
    table = CostTable.default()
    return (table.seconds(checker, tuple(n for n in CHECK_SIZES if n <= max_tokens)),
            table.seconds(proposer, tuple(n for n in LEVEL_SIZES if n <= max_tokens)))


@dataclass(frozen=True)
class CheckAbove:
    """The check above a tree's checker (`triforce` mode: the target's, above the retrieval tier), which
    takes every token of the checker's rounds once they hold `gamma` (or of `rounds` rounds: engine.py's
    `_check_chain`), at `seconds` per forward by tokens. A round that yields more makes those checks hold
    more, so fewer of them per token (speed_model.check_sizes): at greedy over 8K, the deep trees whose
    rounds often yield gamma alone made target checks of 6.9 tokens where chains of 4 made 8.6, 33 checks
    against 27 (the tree's own rate had not counted them; docs/trees.md)."""
    seconds: dict[int, float]
    gamma: int
    rounds: int = 0

    def seconds_per_token(self, round_seconds: float, round_yields: dict[int, float]) -> float:
        """Seconds per token the check above yields, counting every token it is shown as accepted (its
        acceptance scales every tree's alike), when a round takes `round_seconds` and yields k tokens with
        probability round_yields[k]."""
        if self.rounds:
            sizes = {0: 1.0}
            for _ in range(self.rounds):
                sizes = _summed(sizes, round_yields)
        else:
            sizes = check_sizes(round_yields, self.gamma)
        held = sum(n * p for n, p in sizes.items())
        rounds = held / sum(k * p for k, p in round_yields.items())  # (Wald: rounds x tokens per round)
        check = sum(p * interpolate(self.seconds, n + 1) for n, p in sizes.items())  # (+ the last token seen)
        return (rounds * round_seconds + check) / (held + 1)


def _summed(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """The distribution of the sum of two independent counts."""
    out: dict[int, float] = {}
    for i, p in a.items():
        for j, q in b.items():
            out[i + j] = out.get(i + j, 0.0) + p * q
    return out


def measure_above(tier: Tier, gamma: int, rounds: int, largest: int) -> CheckAbove:
    """The check above a tree's checker from the cost table, at the sizes its checks may hold: rounds of
    trees of up to `largest` nodes."""
    most = (rounds or 1) * (largest + 1) + (0 if rounds else gamma)
    return CheckAbove(CostTable.default().seconds(tier, tuple(n for n in CHECK_SIZES if n <= most + 1)), gamma, rounds)
