import itertools

import pytest
import torch
from scipy.stats import chisquare

from triforce.sampling_params import SamplingParams
from triforce.speculation.sampling import ROW_CHUNK, probabilities, row_argmax, sample, sample_distinct

ALPHA = 1e-3


def test_greedy_is_one_hot_on_first_argmax_without_nan():
    logits = torch.tensor([[1.0, 3.0, 3.0, -1.0], [float("-inf"), 0.0, 0.0, 0.0]])
    probs = probabilities(logits, 0.0)
    assert probs.tolist() == [[0, 1, 0, 0], [0, 1, 0, 0]]
    assert sample(probs[0], None, greedy=True) == 1


def test_row_argmax_is_torchs_argmax_on_wide_rows_with_ties_nan_and_infinities():
    """The chunked argmax (the path a real vocabulary takes) against torch's: the first index of the largest,
    a NaN counting as the largest, on rows whose ties and specials sit in one chunk, in different chunks and
    at chunk edges; and widths that are no whole number of chunks."""
    gen = torch.Generator().manual_seed(0)
    width = 6 * ROW_CHUNK
    rows = torch.randint(-3, 4, (40, width), generator=gen).float()  # many ties of the largest
    edge = ROW_CHUNK - 1
    rows[1, [edge, edge + 1]] = 9.0  # a tie across a chunk edge: the first wins
    rows[2, [3 * ROW_CHUNK + 5, ROW_CHUNK + 7]] = float("nan")  # the first NaN, in a later chunk than a tie
    rows[3, 2 * ROW_CHUNK + 1] = float("inf")
    rows[4, [width - 1, 5]] = torch.tensor([float("inf"), float("nan")])
    rows[5] = float("-inf")
    rows[6, :] = 0.0
    rows[7, width - 1] = 4.0  # the last entry
    expected = rows.argmax(dim=-1)
    assert row_argmax(rows).tolist() == expected.tolist()
    assert row_argmax(rows[9]).item() == rows[9].argmax().item()  # one row
    assert row_argmax(rows.view(4, 10, width)).tolist() == expected.view(4, 10).tolist()
    assert expected[1] == edge and expected[2] == ROW_CHUNK + 7  # the cases above are what they say
    odd = rows[:, :width - 3]  # not a whole number of chunks: torch's own
    assert row_argmax(odd).tolist() == odd.argmax(dim=-1).tolist()
    strided = rows.t().contiguous().t()  # the chunked path over rows that are not contiguous
    assert not strided.is_contiguous() and row_argmax(strided).tolist() == expected.tolist()
    assert row_argmax(rows.bfloat16()).tolist() == rows.bfloat16().argmax(dim=-1).tolist()
    assert row_argmax(torch.empty(0, width)).shape == (0,) and row_argmax(torch.tensor(3.0)) == 0
    greedy = probabilities(rows[:8], 0.0)
    assert greedy[[2, 3, 4]].isnan().all()  # NaN or +inf logits: an overflowed row stays NaN
    assert greedy[[0, 1, 5, 6, 7]].argmax(dim=-1).tolist() == expected[[0, 1, 5, 6, 7]].tolist()
    assert (greedy[[0, 1, 5, 6, 7]].sum(dim=-1) == 1.0).all()


def test_a_temperature_too_small_to_divide_by_is_raised_as_vllm_raises_it(caplog, monkeypatch):
    """1e-40 made every logit infinite and the distribution NaN (a 200 answer drawn from NaN weights). vLLM's
    SamplingParams raises a temperature above 0 and below 0.01 to 0.01, with a warning, and samples; only 0
    is greedy. Here 1e-6 was greedy and 0.005 sampled at 0.005: another distribution than vLLM's."""
    import logging

    import triforce.sampling_params as sampling_params

    monkeypatch.setattr(sampling_params, "_RAISED", set())  # (said once per value in a process)
    for temperature in (1e-40, 1e-6, 0.005):
        with caplog.at_level(logging.WARNING, logger="triforce"):
            params = SamplingParams(temperature=temperature)
        assert params.temperature == 0.01 and not params.greedy and "raised to 0.01" in caplog.text
        caplog.clear()
    assert SamplingParams(temperature=0).greedy and SamplingParams(temperature=0.01).temperature == 0.01
    with caplog.at_level(logging.WARNING, logger="triforce"):
        SamplingParams(temperature=0.005)
    assert "raised" not in caplog.text  # once per value: a server's every request said it
    logits = torch.tensor([[1.0, 3.0, 2.9, -1.0]])  # (the rows' own function: below 1e-5, greedy)
    assert probabilities(logits, 1e-40).tolist() == [[0, 1, 0, 0]]
    assert probabilities(logits, 1e-4)[0, 1] == 1.0 and not probabilities(logits, 1e-4).isnan().any()


def test_several_greedy_outputs_are_said_to_be_alike_once(caplog, monkeypatch):
    """vLLM's default temperature is 1.0 and this project's SamplingParams() is greedy: code written for vLLM
    that asks for n samples without a temperature got n identical outputs without a word."""
    import logging

    import triforce.sampling_params as sampling_params

    monkeypatch.setattr(sampling_params, "_SAID_GREEDY_N", [])
    with caplog.at_level(logging.WARNING, logger="triforce"):
        SamplingParams(n=4, temperature=0.8)
        SamplingParams(n=1)
        assert not caplog.text
        SamplingParams(n=4, top_p=0.9)
        assert "n = 4 at temperature 0 gives 4 outputs alike" in caplog.text and "vLLM's default" in caplog.text
        caplog.clear()
        SamplingParams(n=3)
    assert not caplog.text  # once: a server's every request said it


def test_temperature_scales_logits():
    logits = torch.randn(3, 10)
    torch.testing.assert_close(probabilities(logits, 0.5), torch.softmax(logits / 0.5, -1))


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0, 2.0]])
    probs = probabilities(logits, 1.0, top_k=2)
    expected = torch.softmax(torch.tensor([5.0, 4.0]), 0)
    assert probs[0, [1, 3]].tolist() == pytest.approx(expected.tolist())
    assert probs[0, [0, 2, 4]].sum() == 0


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    base = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = base.log().unsqueeze(0)
    for top_p, kept in [(0.5, 1), (0.51, 2), (0.8, 2), (0.81, 3), (1.0, 4)]:
        probs = probabilities(logits, 1.0, top_p=top_p)[0]
        assert int((probs > 0).sum()) == kept, top_p
        torch.testing.assert_close(probs[:kept], base[:kept] / base[:kept].sum())


def test_top_p_ranks_a_rows_largest_first_and_drops_what_a_sort_of_the_whole_row_drops():
    """top_p_dropped ranks each row's 64 largest logits, then its 4,096 largest, and sorts the whole row only
    where those do not reach top_p: rows settled at each stage drop the tokens a sort of the whole row drops
    (a token may part only where its rank's cumulative probability is a rounding away from top_p), and
    ties, NaN rows, 1-D logits and vocabularies narrower than the candidates go through."""
    from triforce.speculation.sampling import TOP_P_CANDIDATES, top_p_dropped

    g = torch.Generator().manual_seed(0)
    vocab = 8192
    peaked = torch.randn(3, vocab, generator=g) * 0.5
    peaked[:, :3] += 14.0  # three tokens hold nearly all the mass: settled among the first 64
    spread = torch.randn(3, vocab, generator=g) * 0.5
    spread[:, :1000] += 8.0  # a thousand hold most of it: settled among the first 4,096
    flat = torch.randn(3, vocab, generator=g) * 0.05  # the whole row needed: sorted
    rows = torch.cat([peaked, spread, flat])
    for top_p in (0.3, 0.9, 0.99):
        probs = torch.softmax(rows, -1)
        reach = [int((probs.topk(k, -1).values.sum(-1) >= top_p).sum()) for k in TOP_P_CANDIDATES]
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = torch.zeros_like(probs).scatter(-1, order, sorted_probs.cumsum(-1) - sorted_probs)
        want = before >= top_p
        got = top_p_dropped(rows, top_p)
        assert bool(((got == want) | ((before - top_p).abs() < 1e-5)).all()), top_p
        assert int((~got).sum(-1).min()) >= 1  # the first is always kept
        if top_p == 0.9:
            assert reach == [3, 6]  # each stage settled some rows, and the sort the rest
    ties = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]]).log_softmax(-1)
    assert int((~top_p_dropped(ties, 0.5)).sum()) == 2  # one of the tied tokens, as a sort keeps one
    nan = torch.full((1, 100), float("nan"))
    assert not top_p_dropped(nan, 0.9).any()  # nothing dropped: the row stays NaN, as a sort leaves it
    assert top_p_dropped(torch.tensor([3.0, 0.0, -1.0]), 0.5).tolist() == [False, True, True]


def test_top_p_cuts_a_row_alike_alone_and_beside_other_rows(two_threads):
    """A check's target rows are processed several at a time, a step's one at a time: a row's cut must not
    depend on the rows beside it. Its normaliser, summed over the rows' [n, V], rounded by n with two
    threads (7.420346 alone, 7.4203458 in a batch of 11), and a cut at a top-p that a rank's cumulative
    probability meets exactly moved by a token (2 of 32 such cuts here)."""
    from triforce.speculation.sampling import top_p_dropped

    g = torch.Generator().manual_seed(0)
    rows = torch.randn(11, 49152, generator=g) * torch.rand(11, 1, generator=g) * 6
    rows[:, :50] += torch.rand(11, 1, generator=g) * 10  # heads of a few tokens, tails of thousands
    rows = rows / 0.7
    for i in range(len(rows)):
        cumulative = rows[i].softmax(-1).sort(descending=True).values.cumsum(-1)
        for rank in (40, 100, 300, 1000, 2000, 3000, 4000):  # the stages' and the sort's rows alike
            top_p = float(cumulative[rank])
            if top_p < 1:
                alone = top_p_dropped(rows[i:i + 1], top_p)[0]
                assert torch.equal(alone, top_p_dropped(rows, top_p)[i]), (i, rank)


def test_min_p_keeps_the_tokens_at_least_min_p_times_the_most_likely_after_the_temperature():
    base = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = base.log().unsqueeze(0)
    for min_p, kept in [(0.0, 4), (0.1, 3), (0.29, 3), (0.31, 2), (0.59, 2), (0.61, 1), (1.0, 1)]:
        probs = probabilities(logits, 1.0, min_p=min_p)[0]
        assert int((probs > 0).sum()) == kept, min_p
        torch.testing.assert_close(probs[:kept], base[:kept] / base[:kept].sum())
    # at temperature 2 the ratios are square roots: 0.15 / 0.5 -> 0.55, so min_p 0.5 keeps three
    assert int((probabilities(logits, 2.0, min_p=0.5)[0] > 0).sum()) == 3
    # then top-k, on what min_p kept
    assert int((probabilities(logits, 1.0, top_k=3, min_p=0.5)[0] > 0).sum()) == 2


def test_seeded_sampling_is_reproducible():
    probs = torch.softmax(torch.randn(50), 0)
    draws = [[sample(probs, g, False) for _ in range(20)] for g in (torch.Generator().manual_seed(7),
                                                                     torch.Generator().manual_seed(7))]
    assert draws[0] == draws[1]


def test_sample_follows_the_distribution_and_never_draws_a_zero():
    probs = torch.tensor([0.0, 0.35, 0.0, 0.05, 0.4, 0.0, 0.2, 0.0])
    g = torch.Generator().manual_seed(3)
    counts = torch.bincount(torch.tensor([sample(probs, g, False) for _ in range(8000)]), minlength=8)
    assert counts[probs == 0].sum() == 0
    support = probs > 0
    assert chisquare(counts[support].numpy(), (probs[support] * 8000).numpy()).pvalue > ALPHA


def test_one_draw_from_a_wide_row_follows_it_never_draws_a_zero_and_is_the_flat_sums_token():
    """A row of whole chunks takes one_draw's two levels: its mass in a few chunks (zeros between, at chunk
    edges, weights not summing to 1) drawn as often as it should be, no zero ever; the same uniform as the
    flat cumulative sum's (one float64 draw each) gives the same token; an output's row with NaN or
    infinity is an error, a proposer's is drawn from by the flat sum."""
    from triforce.speculation.sampling import NonFiniteLogits, one_draw

    width = 6 * ROW_CHUNK
    probs = torch.zeros(width)
    support = [0, ROW_CHUNK - 1, ROW_CHUNK, 2 * ROW_CHUNK + 5, 5 * ROW_CHUNK + 70, width - 1]
    probs[support] = torch.tensor([0.3, 0.05, 0.45, 0.2, 0.6, 0.1])
    g = torch.Generator().manual_seed(3)
    drawn = torch.tensor([sample(probs, g, False) for _ in range(8000)])
    counts = torch.bincount(drawn, minlength=width)
    assert counts.sum() == counts[support].sum()  # never a token of probability 0
    weights = probs[support].double().numpy()
    expected = weights / weights.sum() * 8000
    assert chisquare(counts[support].numpy(), expected).pvalue > ALPHA
    row = torch.softmax(3 * torch.randn(width, generator=torch.Generator().manual_seed(1)), 0)
    for seed in range(200):  # the flat sum's token for the same uniform (a width of no whole chunks)
        flat = sample_distinct(torch.cat([row, torch.zeros(1)]), 1, torch.Generator().manual_seed(seed))
        assert one_draw(row, torch.Generator().manual_seed(seed)) == flat[0]
    bad = probs.clone()
    bad[7] = float("nan")
    with pytest.raises(NonFiniteLogits):
        sample(bad, g, False)
    assert one_draw(bad, g, proposal=True) is None and sample(bad, g, False, proposal=True) in range(width)
    assert one_draw(torch.zeros(width), g) is None


def test_distinct_draws_follow_sampling_without_replacement():
    """Three draws from five tokens (zeros between them, weights not summing to 1): every ordered triple as
    often as drawing one at a time and renormalising over the tokens left, whichever of the tokens
    around a draw were drawn before it."""
    probs = torch.tensor([0.1, 0.0, 0.4, 0.25, 0.0, 0.15, 0.3, 0.0]) * 3
    g = torch.Generator().manual_seed(5)
    trials = 12000
    counts: dict[tuple, int] = {}
    for _ in range(trials):
        triple = tuple(sample_distinct(probs, 3, g))
        counts[triple] = counts.get(triple, 0) + 1
    expected = {}
    for triple in itertools.permutations(torch.nonzero(probs).flatten().tolist(), 3):
        p, left = 1.0, float(probs.sum())
        for token in triple:
            p *= float(probs[token]) / left
            left -= float(probs[token])
        expected[triple] = p
    assert set(counts) <= set(expected)
    outcomes = list(expected)
    total = sum(expected.values())  # 1 up to rounding
    assert chisquare([counts.get(o, 0) for o in outcomes], [expected[o] * trials / total for o in outcomes]).pvalue > ALPHA
    assert sorted(sample_distinct(probs, 9, g)) == [0, 2, 3, 5, 6]  # only five tokens have mass


def test_distinct_draws_after_a_token_that_holds_almost_all_the_mass():
    """Top-k keeps one token of probability ~1 and three of ~1e-20, which a float64 cumulative sum that
    includes the big one gives no width: once it is drawn, the tiny ones are still drawn by their own
    weights, and a token of probability 0 never is."""
    logits = torch.full((1, 32), -10.0)
    logits[0, [7, 3, 9, 20]] = torch.tensor([46.0, 0.0, 0.3, 0.6])
    row = probabilities(logits, 1.0, top_k=4)[0]
    g = torch.Generator().manual_seed(0)
    seconds = torch.zeros(32)
    for _ in range(3000):
        first, second, *rest = sample_distinct(row, 6, g)
        assert first == 7 and sorted([second, *rest]) == [3, 9, 20]
        seconds[second] += 1
    tail = row.double()[[3, 9, 20]]
    assert chisquare(seconds[[3, 9, 20]].numpy(), (tail / tail.sum() * 3000).numpy()).pvalue > ALPHA


def test_an_empty_distribution_draws_nothing_and_sampling_it_is_an_error():
    assert sample_distinct(torch.zeros(5), 3, None) == [] and sample_distinct(torch.zeros(5), 1, None) == []
    with pytest.raises(ValueError, match="no probability mass"):
        sample(torch.zeros(5), None, greedy=False)


def test_a_row_that_is_not_a_distribution_is_an_error_not_a_token():
    """NaN in a row (a model's overflowed logits) counted as mass, and the draw fell through to the last
    token with mass, and greedy took the NaN's index as its argmax: a silent wrong token. Now an error, from
    sampling and from a chain's or a tree's check alike, for the one sequence whose row it is."""
    from triforce.errors import RequestFailed
    from triforce.speculation.sampling import NonFiniteLogits, sample_distinct
    from triforce.speculation.tree import verify_tree
    from triforce.speculation.verify import verify_chain, verify_chains

    assert issubclass(NonFiniteLogits, RequestFailed)  # one line from the CLI, an error result from a server
    bad = torch.tensor([0.2, float("nan"), 0.3, 0.5])
    for row in (bad, torch.tensor([0.5, float("inf"), 0.0, 0.5])):
        with pytest.raises(NonFiniteLogits):
            sample_distinct(row, 1, torch.Generator().manual_seed(0))
    draft = torch.tensor([[0.0, 0.0, 0.0, 1.0]])  # proposes token 3, which the NaN row rejects
    with pytest.raises(NonFiniteLogits):
        verify_chain([3], draft, torch.stack([bad, bad]), torch.Generator().manual_seed(0), False)
    # verified together, the failing sequence's verdict carries its error, and the other's is as alone
    good = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    failed, fine = verify_chains([[3], [3]], [draft, draft], [torch.stack([bad, bad]), good],
                                 [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)], [False, False])
    assert isinstance(failed.failed, NonFiniteLogits) and fine.failed is None
    assert fine == verify_chain([3], draft, good, torch.Generator().manual_seed(1), False)
    # greedy: NaN (or +inf) logits made a one-hot row on the NaN's index, a silent wrong token
    greedy_rows = probabilities(torch.stack([bad.log(), torch.tensor([0.0, float("inf"), 1.0, 2.0]),
                                             torch.tensor([0.0, 3.0, float("-inf"), 1.0])]), 0.0)
    assert greedy_rows[:2].isnan().all() and greedy_rows[2].tolist() == [0, 1, 0, 0]
    with pytest.raises(NonFiniteLogits):
        sample(greedy_rows[0], None, greedy=True)
    assert sample(greedy_rows[0], None, greedy=True, proposal=True) in range(4)  # a proposer's: only checked
    one_hot = torch.nn.functional.one_hot(torch.tensor([3, 3]), 4).float()
    assert verify_chains([[3]], [one_hot[:1]], [greedy_rows[:2]], [None], [True])[0].failed is not None
    with pytest.raises(NonFiniteLogits):
        verify_tree([3], [-1], one_hot, greedy_rows[:2], None, True)
    # A proposer's NaN row (an overflowing float16 draft) is no error: its token is only checked, and
    # rejected (NaN probability), the checker's own row then giving the next token.
    assert sample_distinct(bad, 1, torch.Generator().manual_seed(0), proposal=True)
    target = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    verdict, = verify_chains([[1]], [bad[None]], [target], [torch.Generator().manual_seed(0)], [False])
    assert verdict.accepted == 0 and 0 <= verdict.next_token < 4


def test_a_temperature_past_float32s_range_is_refused():
    """1e39 is infinite in float32: a rule's -inf logits divided by it were NaN."""
    from triforce.config import ConfigError
    from triforce.sampling_params import SamplingParams

    for bad in (1e39, 1e7, -0.5):
        with pytest.raises(ConfigError, match="temperature must be from 0 to"):
            SamplingParams(temperature=bad)
    assert SamplingParams(temperature=1e6).temperature == 1e6
