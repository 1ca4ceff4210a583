"""The step interface (triforce/step.py): a tree's forward gives each node the logits of its root-to-node
path run as a chain, in every cache policy; keep_path leaves a cache as if only the kept path had run."""
import pytest
import torch

from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import LocalKVSource, RetrievalKVCache
from triforce.cache.streaming import StreamingKVCache
from triforce.models.loader import load_model
from triforce.step import Step, ancestor_mask

PARENTS = [-1, 0, 0, 1, 1, 2, 3, 6]  # two branches under the root, a chain 0-1-3-6-7 the longest path
PROMPT = 80


def path_to(node):
    path = [node]
    while PARENTS[path[-1]] >= 0:
        path.append(PARENTS[path[-1]])
    return path[::-1]


def make_cache(model, policy):
    """A cache of `policy` holding the same 80-token prompt (the retrieval ones select 4 of 20 chunks)."""
    cfg, prompt = model.config, torch.arange(PROMPT) % 90 + 3
    full = FullKVCache(cfg, 200, model.dtype, "cpu")
    if policy == "streaming":
        cache = StreamingKVCache(cfg, 4, 24, 16, model.rope, model.dtype, "cpu")
        model(Step.chain(prompt, 0), cache, logits_for="none")
        return cache
    model(Step.chain(prompt, 0), full, logits_for="none")
    if policy == "full":
        return full
    cache = RetrievalKVCache(LocalKVSource(full), 16, 4, policy, full_layers=0, max_speculative=32)
    cache.sync()
    return cache


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir("step-model", seed=7, num_layers=3, scale=20))


@pytest.mark.parametrize("policy", ["full", "streaming", "static", "dynamic"])
def test_a_tree_forward_equals_its_paths_as_chains(model, policy):
    tokens = torch.tensor([5, 17, 40, 8, 66, 23, 51, 9])
    cache = make_cache(model, policy)
    start = cache.length
    tree_logits = model(Step.tree(tokens, PARENTS, start), cache)
    for node in range(len(PARENTS)):
        alone = make_cache(model, policy)
        chain_logits = model(Step.chain(tokens[path_to(node)], start), alone)
        torch.testing.assert_close(tree_logits[node], chain_logits[-1], atol=1e-4, rtol=1e-4)
    # Keep the path to node 6 (one leaf's ancestors), then continue: as if only that path had run.
    kept = path_to(6)
    cache.keep_path(start, kept)
    assert cache.length == start + len(kept)
    follow = torch.tensor([31, 12])
    after_tree = model(Step.chain(follow, cache.length), cache)
    alone = make_cache(model, policy)  # the same forwards (a streaming window depends on how text is split)
    model(Step.chain(tokens[kept], start), alone)
    after_chain = model(Step.chain(follow, alone.length), alone)
    torch.testing.assert_close(after_tree, after_chain, atol=1e-4, rtol=1e-4)


def test_tree_steps_carry_depth_positions_and_the_ancestor_mask():
    step = Step.tree([1, 2, 3, 4], [-1, 0, 0, 2], start=10)
    assert step.positions.tolist() == [10, 11, 11, 12]
    assert step.mask.tolist() == [[True, False, False, False], [True, True, False, False],
                                  [True, False, True, False], [True, False, True, True]]
    assert step.parent_list() == [-1, 0, 0, 2]
    chain = Step.tree([1, 2, 3], [-1, 0, 1], start=4)  # a chain given as a tree is a chain
    assert chain.is_chain and chain.mask is None and chain.positions.tolist() == [4, 5, 6]
    assert chain.parent_list() == [-1, 0, 1]


@pytest.mark.parametrize("parents", [[0, 0], [-1, 1], [-1, -2], [-1]])
def test_bad_trees_are_refused(parents):
    with pytest.raises(ValueError, match="parents"):
        Step.tree([1, 2], parents, start=0)


def test_a_mask_must_let_every_token_see_itself():
    with pytest.raises(ValueError, match="sees itself"):
        Step(torch.tensor([1, 2]), torch.tensor([0, 1]), 0, None, ~ancestor_mask([-1, 0]))


@pytest.mark.parametrize("policy", ["full", "streaming", "static"])
def test_keep_path_refuses_paths_that_are_not_increasing(model, policy):
    cache = make_cache(model, policy)
    start = cache.length
    model(Step.tree(torch.arange(4) + 3, [-1, 0, 0, 1], start), cache)
    for bad in ([1, 0], [0, 4], [2, 2]):
        with pytest.raises(ValueError, match="kept path"):
            cache.keep_path(start, bad)
