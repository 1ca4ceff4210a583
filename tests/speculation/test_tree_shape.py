"""Sequoia's dynamic program (speculation/tree_shape.py) against brute force over every ordered tree."""
import functools

import pytest

from triforce.speculation.tree import children_of
from triforce.speculation.tree_shape import best_tree, pick_size


@functools.cache
def ordered_trees(slots: int) -> tuple:
    """Every ordered tree of `slots` slots (its root included), as nested tuples of child subtrees."""
    if slots == 1:
        return ((),)
    out = []
    for first in range(1, slots):  # the first child's subtree, then the root with the other children
        for child in ordered_trees(first):
            for rest in ordered_trees(slots - first):
                out.append((child,) + rest)
    return tuple(out)


def score(tree, acceptance, depth_left):
    if depth_left < 0 or len(tree) > len(acceptance) and tree:
        return float("-inf")
    return 1.0 + sum(a * score(child, acceptance, depth_left - 1) for a, child in zip(acceptance, tree))


def depth_of(tree):
    return 0 if not tree else 1 + max(depth_of(c) for c in tree)


def value_of(parents, acceptance):
    """Expected tokens per check of a tree given as parents, computed from the definition."""
    reach = []
    for node, parent in enumerate(parents):
        rank = [i for i, p in enumerate(parents) if p == parent].index(node)
        reach.append((1.0 if parent < 0 else reach[parent]) * acceptance[rank])
    return 1.0 + sum(reach)


@pytest.mark.parametrize("acceptance", [[0.6], [0.5, 0.2, 0.1], [0.3, 0.25, 0.2, 0.15], [0.9, 0.05]])
@pytest.mark.parametrize("nodes", [0, 1, 3, 6])
@pytest.mark.parametrize("max_depth", [None, 2])
def test_dynamic_program_finds_the_best_tree(acceptance, nodes, max_depth):
    bound = nodes if max_depth is None else max_depth
    best = max(score(t, acceptance, bound) for n in range(1, nodes + 2) for t in ordered_trees(n)
               if depth_of(t) <= bound)
    shape = best_tree(acceptance, nodes, max_depth)
    assert shape.expected_tokens == pytest.approx(best)
    assert len(shape.parents) <= nodes
    assert value_of(shape.parents, acceptance) == pytest.approx(shape.expected_tokens)
    assert all(-1 <= p < i for i, p in enumerate(shape.parents))
    levels = [0] * len(shape.parents)
    for i, p in enumerate(shape.parents):
        levels[i] = 0 if p < 0 else levels[p] + 1
    assert levels == sorted(levels) and shape.depth == (max(levels) + 1 if levels else 0) <= bound
    assert all(len(c) <= len(acceptance) for c in children_of(shape.parents))


def test_one_rank_gives_a_chain():
    shape = best_tree([0.7], 5)
    assert shape.parents == [-1, 0, 1, 2, 3]
    assert shape.expected_tokens == pytest.approx(sum(0.7 ** i for i in range(6)))


def test_a_shape_is_the_callers_own_though_the_search_is_memoized():
    acceptance = [0.6, 0.2, 0.1]
    first = best_tree(acceptance, 8)
    want = list(first.parents)
    first.parents.clear()
    again = best_tree(acceptance, 8)
    assert again.parents == want and again.parents is not first.parents


def test_the_size_follows_the_cost_of_a_check():
    acceptance = [0.5, 0.2, 0.1]
    cheap_levels = {1: 0.01, 16: 0.01}
    flat = pick_size(acceptance, {1: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}, cheap_levels)
    steep = pick_size(acceptance, {1: 1.0, 4: 2.0, 8: 4.0, 16: 8.0}, cheap_levels)
    assert len(flat.parents) == 15  # a check of 16 costs what one does: the largest tree
    assert steep.parents == best_tree(acceptance, 3).parents  # cost doubling with size: the smallest offered


def test_bad_acceptance_is_refused():
    with pytest.raises(ValueError, match="acceptance"):
        best_tree([0.8, 0.5], 4)


def test_costly_levels_favour_wide_shallow_trees():
    """When every proposer forward costs as much as a check, depth is expensive: the best tree of 7 nodes
    under a cheap proposer is deeper than under a costly one."""
    acceptance, check = [0.6, 0.2, 0.1], {1: 1.0, 8: 1.0}
    cheap = pick_size(acceptance, check, {1: 0.001, 8: 0.001})
    costly = pick_size(acceptance, check, {1: 1.0, 8: 1.0})
    assert len(cheap.parents) == len(costly.parents) == 7
    assert costly.depth < cheap.depth
