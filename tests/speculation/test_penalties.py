"""Presence, frequency and repetition penalties against vLLM's rule written out token by token."""
import pytest
import torch

from triforce.config import ConfigError
from triforce.sampling_params import SamplingParams
from penalty_reference import reference_penalized
from triforce.speculation.penalties import MinTokens, Penalties


@pytest.mark.parametrize("presence,frequency,repetition", [(0.7, 0, 1), (0, 0.4, 1), (0, 0, 1.5), (-0.5, 1.2, 0.8),
                                                          (2, 2, 3)])
def test_rows_are_penalized_by_their_own_history(presence, frequency, repetition):
    """Row i follows the shared history and then its own path (a chain's earlier proposals, a tree node's
    ancestors): each row equals the rule applied to exactly that sequence."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 12, (9,), generator=g).tolist()
    history = prompt + [3, 3, 17, 5]  # four generated so far
    paths = [[], [17], [17, 2], [4], [4, 4, 19], [3]]
    logits = torch.randn(len(paths), 20, generator=g) * 3
    penalties = Penalties.of(SamplingParams(presence_penalty=presence, frequency_penalty=frequency,
                                            repetition_penalty=repetition), prompt)
    got = penalties.apply(logits, history, paths)
    for i, path in enumerate(paths):
        expected = reference_penalized(logits[i], prompt, history[len(prompt):] + path, presence, frequency, repetition)
        torch.testing.assert_close(got[i], expected)
    assert not torch.equal(got, logits)


@pytest.mark.parametrize("presence,frequency,repetition", [(0.7, 0.4, 1), (0, 0, 1.5), (-0.5, 1.2, 0.8)])
def test_a_chains_rows_are_its_prefixes(presence, frequency, repetition):
    """apply_chain: row i follows the history and then the chain's first i tokens."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 12, (9,), generator=g).tolist()
    history, chain = prompt + [3, 17], [17, 2, 17, 5, 3]
    logits = torch.randn(len(chain) + 1, 20, generator=g) * 3
    penalties = Penalties.of(SamplingParams(presence_penalty=presence, frequency_penalty=frequency,
                                            repetition_penalty=repetition), prompt)
    got = penalties.apply_chain(logits, history, chain)
    torch.testing.assert_close(got, penalties.apply(logits, history, [chain[:i] for i in range(len(chain) + 1)]))
    for i in range(len(chain) + 1):
        expected = reference_penalized(logits[i], prompt, history[len(prompt):] + chain[:i], presence, frequency,
                                       repetition)
        torch.testing.assert_close(got[i], expected)


def test_a_row_is_the_same_whatever_the_other_rows_hold():
    """A row's penalized logits depend on its own history alone, bit for bit (a check's row equals `ar`'s
    step there), here with a logit bias on a token another row's path holds."""
    prompt, history = [1, 2, 3], [1, 2, 3, 4]
    logits = torch.randn(2, 12, generator=torch.Generator().manual_seed(4))
    penalties = Penalties.of(SamplingParams(repetition_penalty=1.3, logit_bias={7: 100.0, 2: -3.0}), prompt)
    alone = penalties.apply(logits[:1], history, [[]])
    together = penalties.apply(logits, history, [[], [7, 9]])
    assert torch.equal(alone[0], together[0]) and not torch.equal(together[1], logits[1])


def test_the_repetition_penalty_applies_after_the_logit_bias_as_vllms_does():
    """vLLM adds the bias first and penalizes the sum; the engine adds the bias after `apply` (where every
    row is processed), so `apply` plus the bias must equal the rule applied to the biased logits: a bias
    that turns a seen token's logit positive is divided, not multiplied."""
    g = torch.Generator().manual_seed(2)
    prompt, history, paths = [1, 2, 3], [1, 2, 3, 7], [[], [9]]
    logits = torch.randn(2, 12, generator=g)
    logits[:, 7] = -1.0
    bias = ((2, -3.0), (7, 4.0), (11, 1.5))
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, logit_bias=dict(bias))
    got = Penalties.of(params, prompt).apply(logits, history, paths)
    biased = logits.clone()
    for token, value in bias:
        biased[:, token] += value
    for i, path in enumerate(paths):
        expected = reference_penalized(biased[i], prompt, history[3:] + path, 0, 0.5, 2.0)
        torch.testing.assert_close(got[i] + (biased[i] - logits[i]), expected)
    assert got[0, 7] + 4.0 == pytest.approx((-1.0 + 4.0) / 2 - 0.5)


def test_no_penalty_is_none_and_bad_values_are_refused():
    assert Penalties.of(SamplingParams(), [1, 2]) is None
    assert Penalties.of(SamplingParams(presence_penalty=-0.1), [1, 2]) is not None
    for bad in (dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(repetition_penalty=0),
                dict(repetition_penalty=float("nan")), dict(presence_penalty=float("nan"))):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_rows_and_paths_must_match():
    penalties = Penalties.of(SamplingParams(frequency_penalty=1.0), [1])
    with pytest.raises(ValueError, match="3 rows need 3 paths"):
        penalties.apply(torch.zeros(3, 5), [1], [[], []])


def test_min_tokens_bans_the_stop_tokens_in_rows_that_come_too_early():
    """Rows after fewer than min_tokens generated tokens (their lengths count the prompt's 5) lose the stop
    tokens; the others keep every logit; no early row: the same tensor back."""
    rule = MinTokens.of(SamplingParams(min_tokens=3, max_tokens=8), (2, 6), prompt_length=5)
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(5))
    got = rule.apply(logits, [6, 7, 8, 9])  # 1, 2, 3 and 4 generated before each row
    others = [0, 1, 3, 4, 5, 7, 8]
    assert torch.isinf(got[:2, [2, 6]]).all() and torch.equal(got[:2, others], logits[:2, others])
    assert torch.equal(got[2:], logits[2:])
    assert rule.apply(logits, [8, 9, 10, 11]) is logits
    assert MinTokens.of(SamplingParams(min_tokens=3), (), 5) is None and MinTokens.of(SamplingParams(), (2,), 5) is None
    for bad in (dict(min_tokens=-1), dict(min_tokens=9, max_tokens=8), dict(min_tokens=1.5)):
        with pytest.raises(ConfigError, match="min_tokens"):
            SamplingParams(**bad)
    for bad in ([-1], "50256", [1.5]):
        with pytest.raises(ConfigError, match="stop_token_ids"):
            SamplingParams(stop_token_ids=bad)
    with pytest.raises(ConfigError, match="min_tokens"):
        SamplingParams(min_tokens=True)
