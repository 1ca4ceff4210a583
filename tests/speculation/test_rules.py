"""A request's rules that read a row's history: bad words against a naive reference over random
histories, all rules applied together by RowRules in chains and trees, and the settings checked."""
import random

import pytest
import torch

from triforce.config import ConfigError
from triforce.sampling_params import SamplingParams
from triforce.speculation.rules import BadWords, RowRules, RulesContradict, check_obeyed
from triforce.speculation.sampling import probabilities

BAD = ((3,), (4, 5), (5, 5), (1, 2, 3), (2, 3, 4, 1))


def naive_banned(generated: list[int], bad=BAD) -> set[int]:
    """vLLM's rule: a sequence's last token where the generated tokens end with the rest of it."""
    return {s[-1] for s in bad if len(generated) >= len(s) - 1
            and (len(s) == 1 or generated[len(generated) - len(s) + 1:] == list(s[:-1]))}


def test_bad_words_ban_what_the_naive_rule_bans_after_random_histories():
    """Histories split between the sequence (prompt, then generated) and a row's path at every point;
    the prompt's tokens never count."""
    rng = random.Random(0)
    rule = BadWords(BAD, prompt_length=4)
    for _ in range(500):
        seq = [rng.randrange(6) for _ in range(4 + rng.randrange(6))]
        path = [rng.randrange(6) for _ in range(rng.randrange(5))]
        end = rng.randrange(4, len(seq) + 1)
        assert set(rule.banned(seq, end, path)) == naive_banned(seq[4:end] + path)


def test_rows_follow_their_own_paths_and_chain_prefixes():
    """RowRules.apply (a tree's rows, each after its path) and apply_chain (row i after seq[:start + i])
    ban each row's own tokens: bad words', and the ones outside a constraint-free request's rules stay."""
    params = SamplingParams(max_tokens=8, bad_words_ids=BAD)
    prompt = [5, 4, 1, 2]
    rules = RowRules.of(params, prompt, (), None)
    seq = prompt + [4, 1, 2]
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    paths = [[], [3], [3, 4], [5]]
    got = rules.apply(logits, seq, paths)
    for row, path in enumerate(paths):
        banned = naive_banned(seq[4:] + path)
        assert torch.isneginf(got[row, sorted(banned)]).all()
        kept = [t for t in range(6) if t not in banned]
        assert torch.equal(got[row, kept], logits[row, kept])
    chain = rules.apply_chain(logits[:3], seq + [3, 4], len(seq))  # rows after seq, then 3, then 3 4
    for row, path in enumerate([[], [3], [3, 4]]):
        assert torch.equal(chain[row], rules.apply(logits[row:row + 1], seq, [path])[0])
    assert RowRules.of(SamplingParams(), prompt, (), None) is None


def test_allowed_token_ids_keep_only_theirs_in_every_setting():
    logits = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    for temperature in (0.0, 0.7):
        probs = probabilities(logits, temperature, top_p=0.9, allowed=(1, 4, 6))
        assert probs[:, [0, 2, 3, 5, 7]].sum() == 0 and torch.allclose(probs.sum(-1), torch.ones(3))
    lacking = logits.clone()
    lacking[1, [1, 4, 6]] = float("-inf")  # a reduced-vocabulary draft's row without any allowed token
    probs = probabilities(lacking, 1.0, allowed=(1, 4, 6))
    assert torch.allclose(probs[1, [1, 4, 6]], torch.full((3,), 1 / 3))
    assert probabilities(lacking, 0.0, allowed=(1, 4, 6))[1, 1] == 1  # greedy: the first allowed


def test_bad_settings_are_refused():
    assert SamplingParams(allowed_token_ids=["3", 1, 3]).allowed_token_ids == (1, 3)
    assert SamplingParams(bad_words_ids=[[2, 1], (2, 1), [4]]).bad_words_ids == ((2, 1), (4,))
    assert SamplingParams(bad_words="hello").bad_words == ("hello",)
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM's other spelling of off
    assert SamplingParams(max_tokens=None, min_tokens=3).max_tokens is None  # vLLM's: as far as the positions reach
    numpy = pytest.importorskip("numpy")
    given = SamplingParams(max_tokens=numpy.int64(5), temperature=numpy.float32(0.5), seed=numpy.int64(3))
    assert (given.max_tokens, given.temperature, given.seed) == (5, 0.5, 3) and type(given.max_tokens) is int
    for bad, name in ((dict(allowed_token_ids=[]), "allowed_token_ids"),
                      (dict(allowed_token_ids=[-1]), "allowed_token_ids"),
                      (dict(allowed_token_ids="12"), "allowed_token_ids"),
                      (dict(bad_words=["ok", " "]), "bad_words"), (dict(bad_words=[3]), "bad_words"),
                      (dict(bad_words_ids=[[]]), "bad_words_ids"), (dict(bad_words_ids=[3]), "bad_words_ids"),
                      (dict(bad_words_ids=[[1, -2]]), "bad_words_ids"),
                      (dict(allowed_token_ids=[1, 2], bad_words_ids=[[1], [2]]), "bad_words_ids"),
                      (dict(include_stop_str_in_output=1), "include_stop_str_in_output"),
                      (dict(skip_special_tokens="no"), "skip_special_tokens"),
                      (dict(max_tokens=5.5), "max_tokens"), (dict(max_tokens=-1), "max_tokens"),
                      (dict(top_k=2.5), "top_k"), (dict(top_k=-2), "top_k"), (dict(temperature="0.5"), "temperature"),
                      (dict(temperature=float("inf")), "temperature"), (dict(top_p=float("nan")), "top_p"),
                      (dict(seed=1.5), "seed"), (dict(seed="abc"), "seed"), (dict(seed=2**70), "seed"),
                      # each of these was a TypeError or OverflowError from deep inside, or (the last two)
                      # a run drawing from NaN weights or ignoring end-of-sequence it was not asked to
                      (dict(stop=[1]), "stop"), (dict(stop=5), "stop"), (dict(stop=b"END"), "stop"),
                      (dict(stop=[["x"]]), "stop"), (dict(bad_words=5), "bad_words"),
                      (dict(temperature=10**400), "temperature"), (dict(logit_bias={1: 10**400}), "logit_bias"),
                      (dict(structured_outputs={"json": {}, "whitespace_pattern": " "}), "whitespace_pattern"),
                      (dict(structured_outputs={"choice": 5}), "choice"),
                      (dict(repetition_penalty=1e-40), "repetition_penalty"),
                      (dict(ignore_eos="false"), "ignore_eos")):
        with pytest.raises(ConfigError, match=name):
            SamplingParams(**bad)


class StubTokenizer:
    """Encodes by a table: SentencePiece-like words that take a marker after a space."""
    TABLE = {"hello": [7], " hello": [8], "big cat": [3, 4], " big cat": [9, 4], "ab": [1, 2], " ab": [5, 1, 2]}

    def encode(self, text, add_special_tokens=True):
        assert not add_special_tokens
        return self.TABLE[text]


def test_bad_words_are_tokenized_alone_and_after_a_space_as_vllm_does():
    """A word after a space is banned too where it tokenizes to a new first token and as many tokens;
    where the space adds a token (" ab"), the word alone covers it, as in vLLM."""
    from triforce.speculation.rules import bad_word_ids

    assert bad_word_ids(StubTokenizer(), [" hello", "big cat", "ab"]) == ((7,), (8,), (3, 4), (9, 4), (1, 2))


def test_check_obeyed_names_the_rules_where_an_output_token_breaks_one():
    """An output token that a rule refuses is where the rules contradicted each other (the row fell back on
    the last rule's tokens): RulesContradict names the rules in effect; tokens that obey pass."""
    prompt = [1, 2, 3]
    params = SamplingParams(max_tokens=8, bad_words_ids=((7, 8),), min_tokens=2)
    rules = RowRules.of(params, prompt, (0,), None)
    check_obeyed(rules, None, prompt + [7, 9, 8], 3, 6, 3)  # 8 follows 9, not 7; min_tokens met before any 0
    with pytest.raises(RulesContradict, match="^min_tokens and bad_words leave no token to choose after 1 generated "
                                              "token:"):
        check_obeyed(rules, None, prompt + [7, 8], 3, 5, 3)
    with pytest.raises(RulesContradict, match="after 1 generated token"):
        check_obeyed(rules, None, prompt + [5, 0], 3, 5, 3)  # the end id before min_tokens
    with pytest.raises(RulesContradict, match="^allowed_token_ids leave no token to choose after 2 generated tokens"):
        check_obeyed(None, frozenset({5}), prompt + [5, 5, 6], 3, 6, 3)
