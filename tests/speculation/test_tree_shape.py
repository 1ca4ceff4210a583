"""Sequoia's dynamic program (speculation/tree_shape.py) against brute force over every ordered tree."""
import functools

import pytest

from triforce.speculation.tree import children_of
from triforce.speculation.tree_shape import best_tree, pick_size, yields


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


def score(tree, acceptance, depth_left, root=None):
    """A tree's expected tokens per check from the definition; `root`: its root's children's own rates."""
    rates = acceptance if root is None else root
    if depth_left < 0 or len(tree) > len(rates) and tree:
        return float("-inf")
    return 1.0 + sum(a * score(child, acceptance, depth_left - 1) for a, child in zip(rates, tree))


def depth_of(tree):
    return 0 if not tree else 1 + max(depth_of(c) for c in tree)


def value_of(parents, acceptance, root=None):
    """Expected tokens per check of a tree given as parents, computed from the definition."""
    reach = []
    for node, parent in enumerate(parents):
        rank = [i for i, p in enumerate(parents) if p == parent].index(node)
        rates = acceptance if parent >= 0 or root is None else root
        reach.append((1.0 if parent < 0 else reach[parent]) * rates[rank])
    return 1.0 + sum(reach)


@pytest.mark.parametrize("acceptance", [[0.6], [0.5, 0.2, 0.1], [0.3, 0.25, 0.2, 0.15], [0.9, 0.05]])
@pytest.mark.parametrize("nodes", [0, 1, 3, 6])
@pytest.mark.parametrize("max_depth", [None, 2])
@pytest.mark.parametrize("root", [None, [0.4, 0.3, 0.2]])  # the root's own rates, wider than any level's below
def test_dynamic_program_finds_the_best_tree(acceptance, nodes, max_depth, root):
    bound = nodes if max_depth is None else max_depth
    best = max(score(t, acceptance, bound, root) for n in range(1, nodes + 2) for t in ordered_trees(n)
               if depth_of(t) <= bound)
    shape = best_tree(acceptance, nodes, max_depth, root)
    assert shape.expected_tokens == pytest.approx(best)
    assert len(shape.parents) <= nodes
    assert value_of(shape.parents, acceptance, root) == pytest.approx(shape.expected_tokens)
    assert all(-1 <= p < i for i, p in enumerate(shape.parents))
    levels = [0] * len(shape.parents)
    for i, p in enumerate(shape.parents):
        levels[i] = 0 if p < 0 else levels[p] + 1
    assert levels == sorted(levels) and shape.depth == (max(levels) + 1 if levels else 0) <= bound
    kids = children_of(shape.parents)
    assert len(kids[0]) <= len(root or acceptance) and all(len(c) <= len(acceptance) for c in kids[1:])


def test_an_unsure_root_gets_siblings_above_a_chain():
    """A proposer sure below the root and unsure at it (the root follows the checker's correction): the
    best tree spends its extra nodes on the root's children and is a chain below them."""
    shape = best_tree([0.7, 0.05], 6, root=[0.4, 0.3, 0.2])
    kids = children_of(shape.parents)
    assert len(kids[0]) > 1 and all(len(c) <= 1 for c in kids[1:])
    assert best_tree([0.7, 0.05], 6).parents == [-1, 0, 1, 2, 3, 4]  # with its rates at the root too: a chain


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


@pytest.mark.parametrize("root", [None, [0.3, 0.3, 0.2]])
@pytest.mark.parametrize("nodes", [1, 5, 12])
def test_yields_are_what_a_checks_walk_reaches(nodes, root):
    """A check's yield by probability: it sums to 1 and its mean is the tree's expected tokens."""
    acceptance = [0.6, 0.2, 0.1]
    shape = best_tree(acceptance, nodes, root=root)
    by_length = yields(shape.parents, acceptance, root)
    assert sum(by_length.values()) == pytest.approx(1.0) and min(by_length.values()) > 0
    assert sum(k * p for k, p in by_length.items()) == pytest.approx(shape.expected_tokens)
    assert max(by_length) == shape.depth + 1
