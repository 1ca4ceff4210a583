"""Prompt lookup (speculation/lookup.py): its index, candidates, weight and mixture."""
import pytest
import torch

from triforce.speculation.lookup import OFFERS_KEPT, RECENT, ContextLookup, fitted_weight


def one_hot(token, vocab=10):
    """A greedy tier's row: all its mass on `token`."""
    row = torch.zeros(vocab)
    row[token] = 1.0
    return row


def naive_candidate(seq, final, n):
    """The token after the latest occurrence, ending before `final`, of seq's last n tokens."""
    key = seq[-n:]
    for start in range(final - n - 1, -1, -1):
        if seq[start:start + n] == key:
            return seq[start + n]
    return None


@pytest.mark.parametrize("n", [1, 2, 3])
def test_candidates_and_weight_match_a_naive_scan(n):
    gen = torch.Generator().manual_seed(n)
    seq = torch.randint(0, 5, (300,), generator=gen).tolist()
    lookup = ContextLookup(n)
    final = 0
    for step in [40, 1, 7, 30, 100, 122]:  # rounds of committed tokens
        final += step
        # what the lookup proposes mid-round: the final tokens plus some speculative ones
        for extra in range(0, 4):
            tail = seq[:final] + seq[final:final + extra]
            assert lookup.candidate(tail) == naive_candidate(tail, lookup.final, n)
            for split in range(max(lookup.final, len(tail) - 5), len(tail) + 1):  # a node's: seq, then its path
                assert lookup.candidate(tail[:split], tail[split:]) == naive_candidate(tail, lookup.final, n)
        lookup.advance(seq, final)
    outcomes = []
    for j in range(n, final):
        c = naive_candidate(seq[:j], j, n)
        if c is not None:
            outcomes.append(c == seq[j])
    assert (lookup.candidates, lookup.right) == (len(outcomes), sum(outcomes)) and len(outcomes) > RECENT
    recent = outcomes[-RECENT:]  # the weight counts the latest candidates only
    assert lookup.weight == pytest.approx((sum(recent) + 1) / (RECENT + 2))


def test_the_mixture_is_a_distribution_with_the_copy_weighted():
    lookup = ContextLookup(2)
    seq = [1, 2, 3, 1, 2, 3, 1, 2]
    lookup.advance(seq, len(seq))  # positions 5..7 each had the right candidate: weight 4/5
    assert lookup.weight == pytest.approx(0.8)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    mixed = lookup.mix(probs, lookup.candidate(seq))  # the last 2 tokens (1, 2) were followed by 3
    torch.testing.assert_close(mixed, torch.tensor([0.02, 0.04, 0.06, 0.08 + 0.8]))
    assert torch.equal(lookup.mix(probs, lookup.candidate([4, 4])), probs)  # no earlier occurrence: the tier's own
    with pytest.raises(ValueError):
        ContextLookup(0)


def test_a_greedy_proposers_children_hold_the_copy_where_the_mixture_would_pick_it_first():
    """The copy is the first child where w > 1/2 (the mixture's argmax, as a greedy chain proposes), else
    the second; the children stay as many and distinct."""
    sure, unsure = ContextLookup(1), ContextLookup(1)
    sure.advance([1, 2, 1, 2, 1, 2], 6)  # every candidate right: w 5/6
    unsure.advance([1, 2, 1, 3, 1, 4], 6)  # every candidate wrong: w 1/4
    assert sure.weight > 0.5 > unsure.weight
    assert sure.greedy_order([5, 6, 7], 9) == [9, 5, 6]
    assert sure.greedy_order([5, 6, 7], 6) == [6, 5, 7]
    assert unsure.greedy_order([5, 6, 7], 9) == [5, 9, 6]
    assert unsure.greedy_order([5, 6, 7], 5) == [5, 6, 7]
    assert unsure.greedy_order([5], 9) == [5] and sure.greedy_order([5], 9) == [9]
    assert sure.greedy_order([5, 6], None) == [5, 6]


def test_a_final_position_is_offered_as_the_lookup_proposed_it_then():
    """`offered` mixes a final position's row with the candidate it had and the weight a proposer there
    mixed with (the weight after the previous `advance`: what an idle proposer's evidence needs,
    coordinator/auto.py); the latest OFFERS_KEPT positions are remembered, older ones come back unchanged."""
    gen = torch.Generator().manual_seed(7)
    seq = torch.randint(0, 3, (3 * OFFERS_KEPT,), generator=gen).tolist()
    lookup, final, outcomes = ContextLookup(2), 0, []
    weights = {}  # position -> the weight its round proposed with, counted naively
    for step in [500, 1, 700, 33, len(seq) - 1234]:
        then = (sum(outcomes[-RECENT:]) + 1) / (len(outcomes[-RECENT:]) + 2)
        for j in range(max(final, 2), final + step):
            c = naive_candidate(seq[:j], j, 2)
            if c is not None:
                weights[j] = then
                outcomes.append(c == seq[j])
        final += step
        lookup.advance(seq, final)
    probs = torch.full((3,), 1 / 3)
    for j in range(len(seq) - OFFERS_KEPT, len(seq)):
        expected = probs * (1 - weights[j])
        expected[naive_candidate(seq[:j], j, 2)] += weights[j]
        torch.testing.assert_close(lookup.offered(j, probs), expected)
    assert torch.equal(lookup.offered(100, probs), probs)  # long forgotten


def test_the_weight_counts_where_the_copy_and_the_tiers_own_choice_parted():
    """Where the proposing tier's own choice at a final position is known (`chose`, on the path that became
    final), a candidate counts only where exactly one of the two was right: a tier that is right where its
    copy is wrong pulls the weight down though the copies are mostly right; where both were right or both
    wrong it says nothing. The prompt's positions (no choice) leave the candidate to count alone."""
    prompt = [1, 2] * 5  # candidates at positions 3-9, all right: weight (7 + 1) / (7 + 2)
    plain, weighed, weak = ContextLookup(1), ContextLookup(1), ContextLookup(1)
    for lookup in (plain, weighed, weak):
        lookup.advance(prompt, len(prompt))
        assert lookup.weight == pytest.approx(8 / 9)
    # the text goes on: the candidates at positions 10-17 are 1, 2, 1, 2 (wrong: 3), none, 3, 1, 3
    seq = prompt + [1, 2, 1, 3, 1, 3, 1, 3]
    for j in range(len(prompt), len(seq)):
        weighed.chose(seq[:j], [], one_hot(seq[j]), None)  # a greedy tier right everywhere
        weak.chose(seq[:j], [], one_hot(9), None)  # and one wrong everywhere
    for lookup in (plain, weighed, weak):
        lookup.advance(seq, len(seq))
        assert (lookup.candidates, lookup.right) == (14, 13)  # the metrics count every candidate
    assert plain.weight == pytest.approx((13 + 1) / (14 + 2))
    # right everywhere: only position 13, where the copy was wrong, settled anything (against the copy)
    assert weighed.weight == pytest.approx((7 + 0 + 1) / (8 + 2))
    # wrong everywhere: each right copy beat it; at 13 both were wrong (not counted)
    assert weak.weight == pytest.approx((7 + 6 + 1) / (13 + 2))
    assert weighed.choices == {} and weak.choices == {}  # settled choices are dropped


@pytest.mark.parametrize("order", ["kept", "rejected", "rejected-then-kept", "kept-then-sibling"])
def test_a_choice_counts_only_on_the_path_that_became_final(order):
    """A choice for a position past the final tokens, made after speculative ones (a chain's deeper rows, a
    tree's nodes), counts where those tokens became final as they were, whichever order the rows came in;
    once the tier proposes, a position without its row on the final path says nothing."""
    base = [1, 2] * 5  # 7 right candidates
    lookup = ContextLookup(1)
    lookup.advance(base, len(base))
    paths = {"kept": [[1]], "rejected": [[4]], "rejected-then-kept": [[4], [1]], "kept-then-sibling": [[1], [4]]}
    for path in paths[order]:
        lookup.chose(base, path, one_hot(3), None)  # the tier's choice at position 11 after base, then path
    final = base + [1, 2]  # candidates at 10 and 11 (1, then 2): both right, the tier wrong at 11
    lookup.advance(final, len(final))
    # 10 had no row: nothing; 11 counts the copy's win where the tier's row there is on the final path
    counted = 7 + (order != "rejected")
    assert lookup.weight == pytest.approx((counted + 1) / (counted + 2))


def test_the_fitted_weight_is_the_posterior_mode():
    """fitted_weight against the log-density (a Beta(2, 2) prior; a right copy the tier gave q: (1 - w) q + w;
    a missed copy: 1 - w) maximised over a fine grid, on random evidence; with every q 0 it is the count."""
    gen = torch.Generator().manual_seed(3)
    grid = torch.linspace(1e-6, 1 - 1e-6, 200_001, dtype=torch.float64)
    for trial in range(20):
        n = int(torch.randint(1, RECENT + 1, (1,), generator=gen))
        points = [None if float(torch.rand(1, generator=gen)) < 0.4 else float(torch.rand(1, generator=gen)) ** 2
                  for _ in range(n)]
        density = torch.log(grid) + torch.log1p(-grid)
        for q in points:
            density += torch.log1p(-grid) if q is None else torch.log((1 - grid) * q + grid)
        assert fitted_weight(points) == pytest.approx(float(grid[density.argmax()]), abs=1e-4)
    assert fitted_weight([0.0, 0.0, None]) == pytest.approx(3 / 5)
    assert fitted_weight([]) == 0.5


def test_a_sampled_tier_owes_a_copy_it_already_favoured_little_and_each_missed_copy_lowers_the_weight():
    """Sampled rows (not one-hot): a right copy to which the tier gave 0.9 of its mass lifts the weight far
    less than one it gave 0.1, and a copy that missed pulls the weight down even where the tier's own
    choice missed too (a one-hot row there says nothing: the count's rule)."""
    prompt = [1, 2] * 5  # 7 right candidates: weight 8/9
    seq = prompt + [1, 2, 1, 2]  # right candidates at 10-13
    lookups = {name: ContextLookup(1) for name in ("favoured", "unfavoured")}
    for name, lookup in lookups.items():
        lookup.advance(prompt, len(prompt))
        for j in range(len(prompt), len(seq)):
            row = torch.full((10,), 0.1 / 9)
            row[seq[j]] = 0.9
            if name == "unfavoured":
                row = row.flip(0)  # the copy gets 0.1 / 9, another token 0.9
            lookup.chose(seq[:j], [], row, seq[j])
        lookup.advance(seq, len(seq))
    assert 8 / 9 < lookups["favoured"].weight < lookups["unfavoured"].weight < 12 / 13
    missed = prompt + [3]  # the copy (1) missed at 10, and so did the tier's own choice (5)
    sampled, greedy = ContextLookup(1), ContextLookup(1)
    for lookup, row in ((sampled, torch.full((10,), 0.02)), (greedy, one_hot(5))):
        row[5] = 1 - row[:5].sum() - row[6:].sum()
        lookup.advance(prompt, len(prompt))
        lookup.chose(prompt, [], row, 1)
        lookup.advance(missed, len(missed))
    assert greedy.weight == pytest.approx(8 / 9)
    assert sampled.weight == pytest.approx(8 / 10)


def test_a_round_no_tier_proposed_in_counts_the_copies_alone_as_the_prompt_does():
    """A proposing round's position without the tier's row (a check's bonus token) says nothing; a later
    round in which no tier proposed (mode auto running `ar`) counts its copies alone, as the prompt's are
    counted: the weight follows the text there, where it had stayed at the last proposing round's (and an
    idle draft's evidence is mixed at that weight: coordinator/auto.py)."""
    prompt = [1, 2] * 5  # 7 right candidates: weight 8/9
    lookup = ContextLookup(1)
    lookup.advance(prompt, len(prompt))
    lookup.chose(prompt, [], one_hot(1), None)  # the tier's row at 10: right with the copy (nothing)
    lookup.advance(prompt + [1, 2], len(prompt) + 2)  # 11: the bonus token, no row
    assert lookup.weight == pytest.approx(8 / 9)
    lookup.advance(prompt + [1, 2, 1, 2], len(prompt) + 4)  # 12 and 13, no tier proposing: both copies right
    assert lookup.weight == pytest.approx((9 + 1) / (9 + 2))


def test_a_sampled_row_without_the_copy_mixed_in_says_nothing():
    """Where no copy was mixed into the tier's row (the request banned it, or the n-gram recurs only in the
    tokens the round adds), a greedy row still settles the count (its choice against the candidate); a
    sampled row's mass on the candidate is unknown, and taking it as 0 had counted the copy's hit as the
    strongest evidence for a high weight."""
    prompt = [1, 2] * 5  # weight 8/9
    sampled_row = torch.full((10,), 0.05)
    sampled_row[5] = 0.55  # its argmax is not the candidate (1)
    for row, expected in ((one_hot(5), 9 / 10), (sampled_row, 8 / 9)):
        lookup = ContextLookup(1)
        lookup.advance(prompt, len(prompt))
        lookup.chose(prompt, [], row, None)
        lookup.advance(prompt + [1], len(prompt) + 1)  # the candidate was right
        assert lookup.weight == pytest.approx(expected)
