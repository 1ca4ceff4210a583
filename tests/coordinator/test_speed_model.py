"""`--mode auto`'s cost model (speed_model.py): the tokens a check yields, the seconds per token of a
stack of tiers, and how many tokens a check above a checking tier holds."""
import pytest

import random

from triforce.coordinator.speed_model import (chain_sizes, check_sizes, check_yields, expected_tokens, mode_stack,
                                              seconds_per_token, stack_mode, stop_names)
from triforce.coordinator.costs import dense_costs, interpolate


def test_a_modes_name_gives_back_its_stack():
    """stack_mode names a stack by its kinds' mode and what tells its tiers from others of their kind (a
    retrieval budget, the self draft); mode_stack reads the stack back from that name."""
    drafts, retrievals = ("draft", "draft@self"), ("retrieval", "retrieval@8192")
    stacks = [("target",)] + [(d, "target") for d in drafts] + [(r, "target") for r in retrievals] + \
        [(d, r, "target") for d in drafts for r in retrievals]
    names = [stack_mode(stack) for stack in stacks]
    assert names == ["ar", "draft", "draft@self", "retrieval", "retrieval@8192", "triforce", "triforce@8192",
                     "triforce@self", "triforce@self@8192"]
    assert [mode_stack(name) for name in names] == stacks


def test_expected_tokens_is_the_mean_of_a_chain_check():
    """E(alpha, gamma) against the accepted length's distribution written out: P(a = k) = alpha^k (1 - alpha)
    for k < gamma and alpha^gamma for k = gamma, plus the recovered or bonus token."""
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for gamma in (1, 2, 5):
            mean = sum(k * alpha ** k * (1 - alpha) for k in range(gamma)) + gamma * alpha ** gamma + 1
            assert expected_tokens(alpha, gamma) == pytest.approx(mean)


def test_seconds_per_token_composes_the_levels():
    costs = {"draft": {1: 0.1}, "retrieval": {1: 0.5, 3: 0.7}, "target": {1: 1.0, 3: 1.2, 4: 1.5}}
    alphas = {"draft": 0.5, "retrieval": 0.9}
    assert seconds_per_token(("target",), (), costs, alphas) == 1.0
    assert seconds_per_token(("draft", "target"), (2,), costs, alphas) == pytest.approx((0.2 + 1.2) / 1.75)
    level1 = (2 * 0.1 + 0.7) / 1.75
    # the target's check takes every token of the retrieval tier's rounds (each yields 1, 2 or 3 tokens
    # with probability 1/2, 1/4, 1/4) once they reach 3: it holds 3, 4 or 5 tokens
    sizes = rounds_until(3, {1: 0.5, 2: 0.25, 3: 0.25})
    assert set(sizes) == {3, 4, 5}
    held = sum(n * p for n, p in sizes.items())
    target = {4: 1.5, 5: 1.8, 6: 2.1}  # c(n + 1), past 4 along the 3-4 slope
    level2 = (held * level1 + sum(p * target[n + 1] for n, p in sizes.items())) / sum(
        p * expected_tokens(0.9, n) for n, p in sizes.items())
    assert seconds_per_token(("draft", "retrieval", "target"), (2, 3), costs, alphas) == pytest.approx(level2)
    assert interpolate({1: 1.0, 3: 2.0}, 2) == 1.5 and interpolate({1: 1.0, 3: 2.0}, 5) == 3.0
    # every row a forward returns pays the sampling processing r
    with_rows = seconds_per_token(("draft", "target"), (2,), costs, alphas, row_seconds=0.01)
    assert with_rows == pytest.approx((2 * (0.1 + 0.01) + 1.2 + 3 * 0.01) / 1.75)


def rounds_until(gamma: int, round_yields: dict[int, float]) -> dict[int, float]:
    """Every sequence of rounds, each yielding k tokens with probability round_yields[k], until their sum
    reaches gamma, written out: the sum's distribution."""
    out: dict[int, float] = {}

    def walk(total, p):
        if total >= gamma:
            out[total] = out.get(total, 0.0) + p
            return
        for k, q in round_yields.items():
            walk(total + k, p * q)

    walk(0, 1.0)
    return out


@pytest.mark.parametrize("alpha,gamma1,gamma2", [(0.5, 2, 3), (0.8, 4, 6), (0.3, 1, 5), (1.0, 3, 2), (0.0, 3, 4)])
def test_a_check_above_a_checking_tier_holds_what_its_rounds_overshoot(alpha, gamma1, gamma2):
    """A check of gamma1 proposals yields k tokens with probability alpha^(k-1) (1 - alpha), up to
    gamma1 + 1 (all accepted); the check above takes the rounds' tokens once they reach gamma2."""
    yields = check_yields(alpha, {gamma1: 1.0})
    written = {k: alpha ** (k - 1) * (1 - alpha) for k in range(1, gamma1 + 1)} | {gamma1 + 1: alpha ** gamma1}
    assert yields == pytest.approx(written) and sum(yields.values()) == pytest.approx(1)
    assert sum(k * p for k, p in yields.items()) == pytest.approx(expected_tokens(alpha, gamma1))
    sizes = check_sizes(yields, gamma2)
    assert sizes == pytest.approx(rounds_until(gamma2, yields))
    assert min(sizes) >= gamma2 and max(sizes) <= gamma2 + gamma1


def simulated_seconds_per_token(gammas, costs, alphas, stops, rounds=40000, seed=0):
    """The engine's rounds played out: the bottom tier samples a chain token by token (each a forward of
    costs[0][1]); with `stops` = (q, sure, unsure) each token is one it is sure of with probability q, and
    the chain ends after one it is not; up to gamma1. Each level checks what the level below made (one
    forward of n + 1 tokens: costs[level][n + 1]), accepting each token with probability alphas[level - 1]
    (the bottom tier's: `sure` or `unsure`, by the token) until the first it does not, then adds one token;
    a check above a checking level takes that level's rounds until they reach its gamma. Seconds / tokens."""
    rng = random.Random(seed)

    def produce(level):  # -> (tokens, seconds) of one round of `level`: a token, or a check
        if level == 0:
            return 1, costs[0][1]
        held, seconds, accept = 0, 0, []
        while held < gammas[level - 1]:
            n, s = produce(level - 1)
            held, seconds = held + n, seconds + s
            if level > 1 or not stops:
                accept += [alphas[level - 1]] * n
                continue
            sure = rng.random() < stops[0]
            accept.append(stops[1] if sure else stops[2])
            if not sure:
                break  # the bottom tier was unsure of that token: its chain ends (stop_below)
        accepted = 0
        while accepted < held and rng.random() < accept[accepted]:
            accepted += 1
        return accepted + 1, seconds + costs[level][held + 1]

    top, tokens, seconds = len(gammas), 0, 0.0
    for _ in range(rounds):
        n, s = produce(top)
        tokens, seconds = tokens + n, seconds + s
    return seconds / tokens


@pytest.mark.parametrize("gammas,stops", [((4,), None), ((4,), (0.5, 0.8, 0.3)), ((6,), (0.3, 0.9, 0.5)),
                                          ((3, 5), (0.6, 0.75, 0.35)), ((4, 6), (0.4, 0.7, 0.2))])
def test_the_model_is_what_the_rounds_cost_when_chains_stop_early(gammas, stops):
    """With `stop_below` the bottom tier's chains hold k < gamma tokens with probability q^(k-1) (1 - q)
    (chain_sizes), all sure but the last; the model's seconds per token, chains and take-all checks above
    them included, against the rounds played out (a check's cost grows with its tokens, as on vector CPUs)."""
    assert chain_sizes(5, 0.5) == pytest.approx({1: 0.5, 2: 0.25, 3: 0.125, 4: 0.0625, 5: 0.0625})
    assert chain_sizes(3, 1.0) == {3: 1.0} and chain_sizes(3, 0.0) == {1: 1.0}
    stack = ("draft", "target") if len(gammas) == 1 else ("draft", "retrieval", "target")
    steep = {n: 0.02 + 0.01 * n for n in range(1, 40)}
    table = {"draft": {1: 0.004}, stack[1]: steep, "target": {n: 0.05 + 0.02 * n for n in range(1, 40)}}
    alphas = {"draft": 0.6, "retrieval": 0.85}
    if stops:
        alphas.update(zip(stop_names("draft"), stops))
    model = seconds_per_token(stack, gammas, table, alphas, stops=bool(stops))
    costs = [table[name] for name in stack]
    played = simulated_seconds_per_token(gammas, costs, [alphas[name] for name in stack[:-1]], stops)
    assert model == pytest.approx(played, rel=0.01)
    if stops:  # (full chains are another process: the test tells them apart)
        assert seconds_per_token(stack, gammas, table, alphas) != pytest.approx(played, rel=0.03)


def test_optimism_is_never_below_the_mean_nor_undefined():
    """An acceptance's optimistic value (the mean plus a standard deviation, at most 0.99) rated a tier
    measured at 200 of 200 below its mean (0.99 against 0.997), while less-known tiers got a deviation's
    bonus; and a prior a hair above 1, which a priors file's rounding lets through, raised a math domain
    error at the first plan of every request of that kind."""
    from triforce.coordinator.speed_model import Acceptance

    sure = Acceptance(0.8, successes=200.0, trials=200.0)
    assert sure.mean > 0.99 and sure.optimistic == sure.mean
    unsure = Acceptance(0.6, successes=3.0, trials=5.0)
    assert unsure.mean < unsure.optimistic <= 0.99
    assert Acceptance(1.00000005).optimistic == Acceptance(1.00000005).mean


@pytest.mark.parametrize("table", [{1: 0.05, 4: 0.11, 16: 0.26}, {2: 0.3, 3: 0.2}, {1: 1.0}, {4: 0.5, 8: 0.9, 32: 2.0}])
def test_a_dense_table_prices_every_size_as_its_measured_points_do(table):
    """A plan fills each stack's costs in for sizes 1..top once (dense_costs); the model then reads the
    dense table, and must get what interpolating the measured points gives, past top too."""
    dense = dense_costs({"target": table}, 18)["target"]
    assert set(range(1, 19)) <= set(dense)
    for n in range(1, 40):
        assert interpolate(dense, n) == pytest.approx(interpolate(table, n), rel=1e-12, abs=1e-15)
