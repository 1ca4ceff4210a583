"""Growing trees (coordinator/trees.py): shapes respected, each node's proposer row is its path's, the
positional acceptance counted from walks, and cost measurements that leave the caches as they were; trees
shaped by confidence (coordinator/confident_trees.py) as they grow."""
import math

import pytest
import torch

from triforce.cache.full import FullKVCache
from triforce.cache.streaming import StreamingKVCache
from triforce.coordinator import confident_trees as ct
from triforce.coordinator.request_rows import RequestRows
from triforce.coordinator.speed_model import check_sizes
from triforce.coordinator.tiers import Tier
from triforce.coordinator.trees import (FIRST_DECISIONS, PRIOR, PRIOR_WEIGHT, CheckAbove, FixedShape, TreeShaper,
                                        grow_tree, measure_costs, rank_of, tree_step)
from triforce.models.loader import load_model
from triforce.sampling_params import SamplingParams
from triforce.speculation.sampling import probabilities
from triforce.speculation.tree import children_of
from triforce.speculation.tree_shape import pick_size, yields
from triforce.step import Step

SHAPE = [-1, -1, 0, 0, 1, 2]  # two under the root, two under the first, one under each of those


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir("trees-model", seed=9, num_layers=2, scale=20))


def tier(model, streaming=False):
    cfg = model.config
    # a window over the whole text: a tree's siblings count against a sliding window, a chain's do not
    cache = (StreamingKVCache(cfg, 2, 64, 32, model.rope, model.dtype, "cpu") if streaming
             else FullKVCache(cfg, 200, model.dtype, "cpu"))
    return Tier("draft", model, cache)


def forward_now(tier):
    """grow_tree's `forward`: runs the step on `tier` at once (a generator that yields nothing)."""
    def forward(step):
        return tier.forward(step)
        yield

    return forward


def run_now(generator):
    """The value of a generator that yields nothing."""
    with pytest.raises(StopIteration) as done:
        next(generator)
    return done.value.value


def probs(logits):
    return probabilities(logits, 1.0)


def request(seq, temperature=1.0, rules=None, lookup=None, **params):
    """grow_tree's request: SamplingParams(temperature, **params), seed 0."""
    return RequestRows(SamplingParams(temperature=temperature, **params), seq, torch.Generator().manual_seed(0),
                       rules, lookup)


@pytest.mark.parametrize("streaming", [False, True])
def test_grown_nodes_carry_their_paths_rows(model, streaming):
    seq = (torch.arange(40) % 90 + 3).tolist()
    proposer = tier(model, streaming)
    proposer.prefill(seq[:-1])
    tokens, parents, rows = run_now(grow_tree(proposer, forward_now(proposer), FixedShape(SHAPE), request(seq)))
    assert parents == SHAPE and len(set(tokens[:2])) == 2  # siblings are distinct
    assert proposer.length == len(seq) + 5  # every level but the last was forwarded
    for node in (0, 2, 3):  # a node's row: the proposer's distribution after its path, run as a chain
        path = [node] if parents[node] < 0 else [parents[node], node]
        alone = tier(model, streaming)
        alone.prefill(seq[:-1])
        logits = alone.forward(Step.chain(seq[-1:] + [tokens[i] for i in path], alone.length))
        torch.testing.assert_close(rows[node + 1], probs(logits[-1:])[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(rows[5 + 1], torch.zeros_like(rows[0]))  # a last-level node: never forwarded


def test_a_greedy_nodes_first_child_is_what_its_processed_row_picks(model):
    """Greedy children are ranked by the proposer's logits, but the first is the token its processed row
    picks: with a logit bias, not the logits' own argmax (the checker's greedy row picks the biased one)."""
    seq = (torch.arange(40) % 90 + 3).tolist()
    proposer = tier(model, False)
    proposer.prefill(seq[:-1])
    plain = run_now(grow_tree(proposer, forward_now(proposer), FixedShape(SHAPE), request(seq, 0.0)))[0]
    boosted = next(t for t in range(3, 90) if t not in plain)
    proposer = tier(model, False)
    proposer.prefill(seq[:-1])
    tokens, parents, _ = run_now(grow_tree(proposer, forward_now(proposer), FixedShape(SHAPE),
                                           request(seq, 0.0, logit_bias={boosted: 100.0})))
    assert tokens[0] == boosted and tokens[1] == plain[0] and parents == SHAPE


@pytest.mark.parametrize("greedy", [True, False])
def test_trees_grow_no_node_a_rule_forbids(model, greedy):
    """Where a rule (structured output, min_tokens, bad words) has banned all but a few tokens, no banned
    token is grown as a child: not a greedy proposer's next-best logits, nor the prompt lookup's copy
    (mixed in, it was proposed w of the time, or first or second among greedy children). Certain to be
    rejected, such nodes took forward rows and subtrees of their own."""
    from triforce.speculation.lookup import ContextLookup

    seq = ([3, 4, 5, 6, 7] * 8)[:39]
    lookup = ContextLookup(2)
    lookup.advance(seq, len(seq))  # every candidate (3 to 7) right so far: the weight nears 1
    allowed = [11, 12]

    class OnlyTwo:  # a rule that reads a row's history (as RowRules): here it bans all but `allowed` after any
        def apply(self, rows, seq, paths):
            banned = torch.full_like(rows, float("-inf"))
            banned[:, allowed] = 0
            return rows + banned

    proposer = tier(model, False)
    proposer.prefill(seq[:-1])
    tokens, parents, _ = run_now(grow_tree(proposer, forward_now(proposer), FixedShape([-1, -1, -1, 0, 0, 1]),
                                           request(seq, 0.0 if greedy else 1.0, OnlyTwo(), lookup)))
    assert set(tokens) <= set(allowed) and parents[:2] == [-1, -1] and len(tokens) < 6


@pytest.mark.parametrize("greedy", [False, True])
def test_grown_nodes_mix_in_the_lookups_copy_for_their_path(model, greedy):
    """With a prompt lookup, each node's row is the proposer's mixed with the copy for its own path (the
    chain's mixture, speculation/lookup.py), and a greedy proposer's first child is the copy where the
    lookup's weight is over 1/2."""
    from triforce.speculation.lookup import ContextLookup

    seq = ([3, 4, 5, 6, 7] * 8)[:39]
    lookup = ContextLookup(2)
    lookup.advance(seq, len(seq))  # a loop: every candidate right, so the weight nears 1
    assert lookup.weight > 0.9
    proposer, plain = tier(model), tier(model)
    for t in (proposer, plain):
        t.prefill(seq[:-1])
    temperature = 0.0 if greedy else 1.0
    tokens, parents, rows = run_now(grow_tree(proposer, forward_now(proposer), FixedShape(SHAPE),
                                              request(seq, temperature, lookup=lookup)))
    _, _, unmixed = run_now(grow_tree(plain, forward_now(plain), FixedShape(SHAPE), request(seq, temperature)))
    root_copy = lookup.candidate(seq)
    assert root_copy == 7  # what followed ..., 5, 6 earlier
    torch.testing.assert_close(rows[0], lookup.mix(unmixed[0].clone(), root_copy))
    copies = 0
    for node in (0, 1, 2, 3):  # every forwarded node: mixed with the copy after its own path
        path = [tokens[node]] if parents[node] < 0 else [tokens[parents[node]], tokens[node]]
        copy = lookup.candidate(seq, path)
        assert copy == lookup.candidate(seq + path)
        if copy is not None:
            copies += 1
            assert rows[node + 1][copy] >= lookup.weight
    assert copies > 0  # some node below the root had a copy to mix
    if greedy:
        assert tokens[0] == root_copy


def test_greedy_children_are_the_proposers_best():
    """A greedy proposer's rows are one-hot; its children are ranked by its logits instead."""
    from triforce.speculation.tree import sample_children
    logits = torch.tensor([0.1, 3.0, -1.0, 2.0])
    assert sample_children(logits, 3, None, greedy=True) == [1, 3, 0]


def test_the_checkers_step_hangs_the_tree_below_the_last_token():
    step = tree_step([5, 6, 7, 8], 2, [10, 11, 12], [-1, -1, 0])
    assert step.tokens.tolist() == [7, 8, 10, 11, 12] and step.parent_list() == [-1, 0, 1, 1, 2]
    assert step.positions.tolist() == [2, 3, 4, 4, 5]


def test_shaper_counts_which_rank_a_walk_accepted():
    """The root's children and every other node's are counted apart (the root follows a correction)."""
    shaper, w = TreeShaper(6), PRIOR_WEIGHT
    shaper.observe(SHAPE, [1])  # the root's second child accepted, then its only child rejected
    assert shaper.root.offered[:3] == [w + 1, w + 1, w] and shaper.below.offered[:2] == [w + 1, w]
    assert shaper.root.accepted[:2] == [w * PRIOR[0], w * PRIOR[1] + 1]
    assert shaper.below.accepted == [w * p for p in PRIOR]
    shaper.observe(SHAPE, [0, 3])  # first child, then its second child, which is a leaf
    assert shaper.root.accepted[0] == w * PRIOR[0] + 1 and shaper.below.accepted[1] == w * PRIOR[1] + 1
    assert sum(shaper.root.rates()) <= 1 + 1e-9 and sum(shaper.below.rates()) <= 1 + 1e-9


def test_a_shape_follows_its_first_checks():
    """Decided again after each of FIRST_DECISIONS checks: where every first child is accepted, the prior's
    bushy tree turns into a chain within a request's first checks (not only after `every`)."""
    shaper = TreeShaper(6)
    shapes = []
    for _ in range(FIRST_DECISIONS[-1]):
        shape = shaper.shape()
        shapes.append(shape)
        kids, path = children_of(shape), []
        while kids[path[-1] + 1 if path else 0]:  # every first child accepted, down to a leaf
            path.append(kids[path[-1] + 1 if path else 0][0])
        shaper.observe(shape, path)
    assert all(s == shapes[0] for s in shapes[:FIRST_DECISIONS[0]]) and shapes[-1] != shapes[0]
    assert len(children_of(shapes[0])[0]) > 1 and len(children_of(shaper.shape())[0]) == 1


def test_auto_sizes_wait_for_measured_costs(model):
    shaper = TreeShaper("auto")
    with pytest.raises(RuntimeError, match="measured costs"):
        shaper.shape()
    shaper.costs = ({1: 1.0, 4: 1.0, 8: 1.0}, {1: 0.001})  # a check of 8 costs what one does: the largest tree
    assert len(shaper.shape()) == 7


def test_the_check_above_holds_what_the_rounds_below_reach():
    """Rounds of 5 tokens against gamma 6: every check above holds two rounds, 10 tokens (and the last
    token it saw); with two rounds per check, the sum of two rounds' yields."""
    seconds = {1: 1.0, 16: 2.5}  # 0.1 s a token past the first
    assert CheckAbove(seconds, 6).seconds_per_token(0.5, {5: 1.0}) == pytest.approx((2 * 0.5 + 2.0) / 11)
    two = CheckAbove(seconds, 6, rounds=2).seconds_per_token(0.5, {3: 0.5, 5: 0.5})
    held = {6: 0.25, 8: 0.5, 10: 0.25}
    check = sum(p * (1.0 + 0.1 * n) for n, p in held.items())
    assert two == pytest.approx((2 * 0.5 + check) / (8 + 1))


def test_a_costly_check_above_grows_trees_that_fill_it():
    """Where the check above costs five of the checker's, the auto size picks a tree whose rounds make
    fuller checks above (fewer of them per token); where it costs nothing, the tree of the tier's own rate."""
    acceptance, check, level = [0.9, 0.05], {1: 1.0, 4: 1.05, 6: 1.1, 8: 1.15, 12: 1.3, 16: 1.4}, {1: 0.1, 16: 0.1}

    def held(above):
        shape = pick_size(acceptance, check, level, above=above and above.seconds_per_token)
        sizes = check_sizes(yields(shape.parents, acceptance), 6)
        return shape.parents, sum(n * p for n, p in sizes.items())

    own = held(None)
    assert held(CheckAbove({1: 0.0, 32: 0.0}, 6)) == own
    assert held(CheckAbove({1: 5.0, 32: 6.0}, 6))[1] > own[1] + 0.3


def test_measuring_costs_leaves_the_caches_as_they_were(model):
    seq = (torch.arange(30) % 90 + 3).tolist()
    checker, proposer = tier(model), tier(model, streaming=True)
    for t in (checker, proposer):
        t.prefill(seq)
    want = [t.forward(Step.chain([4], t.length)) for t in (checker, proposer)]
    for t in (checker, proposer):
        t.truncate(len(seq))
    spent = checker.seconds
    check, level = measure_costs(checker, proposer, 8)
    assert sorted(check) == [1, 2, 3, 4, 5, 6, 8] and sorted(level) == [1, 2, 4, 8] and checker.seconds == spent
    assert checker.length == proposer.length == len(seq)
    for t, w in zip((checker, proposer), want):
        torch.testing.assert_close(t.forward(Step.chain([4], t.length)), w)


def peaked(p: float, vocab: int = 50) -> torch.Tensor:
    """Logits whose top probability at temperature 1 is p."""
    logits = torch.zeros(vocab)
    logits[0] = math.log(p * (vocab - 1) / (1 - p))
    return logits


# The checker's seconds by tokens (1 ms more per token) and the proposer's (flat), as measure_costs gives them
STEEP = ({1: 0.020, 64: 0.020 + 63 * 0.001}, {1: 0.003, 64: 0.003})


def test_unsure_nodes_get_siblings_and_sure_ones_one_child():
    """Before any check (the prior: a calibrated proposer), a node where the proposer is sure gets one child
    (a second would be accepted too rarely to pay for the token it adds to the check), and one where it is
    unsure several."""
    shaper = ct.ConfidenceShaper(8)
    shaper.costs = STEEP
    assert ct.bucket(peaked(0.95)) == len(ct.CONFIDENCE_EDGES) and ct.bucket(peaked(0.1)) == 0
    assert shaper.growth().children([0], [peaked(0.95)], []) == [1]
    assert shaper.growth().children([0], [peaked(0.1)], [])[0] > 1


@pytest.mark.parametrize("check_per_token,want_more", [(1.0, False), (0.0, True)])
def test_confident_trees_grow_a_spine_and_what_pays(model, check_per_token, want_more):
    """The spine (a chain of first children) grows whatever it costs; beyond it, nodes only where they pay
    (none when a check's every token costs a second, many when tokens are free), within the caps."""
    seq = (torch.arange(40) % 90 + 3).tolist()
    proposer = tier(model)
    proposer.prefill(seq[:-1])
    shaper = ct.ConfidenceShaper(12, spine=3)
    shaper.costs = ({1: 0.02, 64: 0.02 + 63 * check_per_token}, {1: 1e-4, 64: 1e-4})
    growth = shaper.growth()
    tokens, parents, rows = run_now(grow_tree(proposer, forward_now(proposer), growth, request(seq)))
    first_child = {parents[i]: i for i in reversed(range(len(parents)))}  # node (-1: the root) -> its first child
    spine = [first_child[-1]]
    while len(spine) < 3 and spine[-1] in first_child:
        spine.append(first_child[spine[-1]])
    assert len(spine) == 3 and all(rank_of(i, parents) == 0 for i in spine)
    assert (len(parents) > 3) == want_more and len(parents) <= 12
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    assert max(depths) <= ct.MAX_DEPTH
    for node in range(len(parents)):  # siblings are distinct
        assert tokens[node] not in [tokens[j] for j in range(node) if parents[j] == parents[node]]
    assert set(growth.buckets) >= {0, 1, 2}  # the spine's forwarded slots were bucketed


def test_confident_shaper_counts_walks_per_bucket():
    shaper = ct.ConfidenceShaper(8)
    shaper.costs = STEEP
    growth = shaper.growth()
    parents = [-1, -1, 0]  # two under the root, one under the first
    growth.buckets.update({0: 0, 1: 4})  # an unsure root, a sure first child
    before = [list(row) for row in shaper.offered], list(shaper.deep)
    shaper.observe(parents, [0, 2])  # the root's first child, then its child (a leaf)
    assert shaper.offered[0][:2] == [before[0][0][0] + 1, before[0][0][1] + 1]
    assert shaper.offered[4][0] == before[0][4][0] + 1 and shaper.deep[1] == before[1][1] + 1
    assert shaper.accepted[0][0] == ct.PRIOR_WEIGHT * ct.prior(0, 0) + 1
    assert shaper.rate(0, 1) <= shaper.rate(0, 0)
