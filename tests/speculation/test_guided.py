"""Structured outputs' masks (speculation/guided.py): a Guide, which moves one matcher between the rows'
histories, masks every history as a fresh matcher does; constraints compile from each kind, and bad ones
are refused by name."""
import random

import pytest
import torch
from llguidance import LLMatcher
from transformers import AutoTokenizer

from checkpoints import CHARS, write_char_tokenizer
from triforce.config import ConfigError
from triforce.sampling_params import SamplingParams, StructuredOutputs
from triforce.speculation.guided import Grammars, grammar_text

VOCAB = 96
EOS = 2


@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chars")
    write_char_tokenizer(folder, VOCAB)
    return Grammars(AutoTokenizer.from_pretrained(folder), VOCAB, [EOS])


def ids(text: str) -> list[int]:
    return [3 + CHARS.index(c) for c in text]


def fresh_mask(grammars, spec, history) -> torch.Tensor | None:
    """The reference: a new matcher that consumes the history, then its mask."""
    matcher = LLMatcher(grammars._ll_tokenizer(), grammars.check(spec), log_level=0)
    if matcher.try_consume_tokens(list(history)) < len(history):
        return None
    return torch.tensor(list(matcher.compute_logit_bias()[:VOCAB])) > 0


SPEC = StructuredOutputs(regex=r"(ab|[c-k][a-z]*)( [a-z0-9]+)*\.")


def test_a_guide_masks_every_history_as_a_fresh_matcher_does(grammars):
    """Histories as the tiers ask for them: a path grows by allowed tokens, falls back to a shorter
    prefix (a rejection), branches, asks again for one it asked before, and tries a refused token."""
    guide = grammars.guide(SPEC)
    rng = random.Random(0)
    history: list[int] = []
    for _ in range(300):
        mask = guide.allowed(history)
        expected = fresh_mask(grammars, SPEC, history)
        assert mask is not None and expected is not None and torch.equal(mask, expected)
        allowed = mask.nonzero().flatten().tolist()
        move = rng.random()
        if move < 0.1:  # a token the constraint refuses: no mask, and the matcher stays usable
            refused = rng.choice([t for t in range(3, VOCAB) if t not in allowed])
            assert guide.allowed(history + [refused]) is None
        if move < 0.25 and history:
            del history[rng.randrange(len(history)):]
        elif allowed and allowed != [EOS]:
            history.append(rng.choice([t for t in allowed if t != EOS]))
        else:
            history = []


def test_rows_outside_the_constraint_get_minus_infinity(grammars):
    guide = grammars.guide(StructuredOutputs(choice=["cab", "cd"]))
    logits = torch.randn(4, VOCAB)
    histories = [[], ids("c"), ids("ca"), ids("x")]  # the last refused: its row stays as it is
    out = guide.apply(logits, histories)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == ids("c")
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == ids("ad")
    assert torch.isfinite(out[2]).nonzero().flatten().tolist() == ids("b")
    assert torch.equal(out[3], logits[3]) and torch.isfinite(logits).all()  # a new tensor
    done = guide.allowed(ids("cd"))
    assert done.nonzero().flatten().tolist() == [EOS]  # complete: only end-of-sequence


def test_a_row_without_an_allowed_token_proposes_uniformly_among_them(grammars):
    """A reduced-vocabulary draft's row gives tokens it lacks -inf: where it lacks all the constraint
    allows, the row is uniform over them (its softmax would be NaN), and other rows are as masked."""
    guide = grammars.guide(StructuredOutputs(choice=["cab", "cd"]))
    logits = torch.full((2, VOCAB), float("-inf"))
    logits[:, ids("x")] = 3.0  # only a token the constraint refuses after "c"
    logits[1, ids("d")] = 1.0
    out = guide.apply(logits, [ids("c"), ids("c")])
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == ids("ad") and (out[0][ids("ad")] == 0).all()
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == ids("d") and out[1][ids("d")] == 1.0


def test_the_token_a_constraint_forces(grammars):
    """One allowed token is forced: a literal's next one, end-of-sequence after a complete text, and
    end-of-sequence again after that (nothing there is output); none where several are allowed."""
    guide = grammars.guide(StructuredOutputs(choice=["cab", "cd"]))
    assert guide.forced([]) == ids("c")[0] and guide.forced(ids("c")) is None
    assert guide.forced(ids("ca")) == ids("b")[0]
    assert guide.forced(ids("cd")) == EOS and guide.forced(ids("cd") + [EOS, EOS]) == EOS
    assert guide.forced(ids("x")) is None and guide.allowed(ids("x")) is None  # refused


@pytest.mark.parametrize("spec,good,bad", [
    (StructuredOutputs(choice=["a.b", "(c)"]), ["a.b", "(c)"], ["axb", "c", "a.b."]),
    (StructuredOutputs(json={"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"],
                             "additionalProperties": False}), ['{"k": 12}', '{"k":-3}'], ['{"k": "x"}', '{}', '[1]']),
    (StructuredOutputs(json_object=True), ['{"x": [1, {"y": null}]}', "{}"], ["[]", "12", '"s"']),
    # objects that list their properties take no others unless they say so, nested ones too (vLLM's xgrammar,
    # OpenAI's strict); one that lists none is any object
    (StructuredOutputs(json={"type": "object", "properties": {"k": {"type": "integer"}, "v": {"type": "array", "items": {
        "properties": {"n": {"type": "integer"}}}}, "o": {"type": "object"}, "e": {
            "type": "object", "properties": {"a": {}}, "additionalProperties": True}}, "required": ["k"]}),
     ['{"k": 1}', '{"k": 1, "v": [{"n": 2}, {}]}', '{"k": 1, "o": {"z": 1}}', '{"k": 1, "e": {"a": 1, "b": 2}}'],
     ['{"k": 1, "x": 2}', '{"k": 1, "v": [{"n": 2, "m": 3}]}', '{"k": "1"}']),
    # a schema that merges objects is kept whole as written: closing one side would refuse the other's keys
    (StructuredOutputs(json={"$defs": {"Base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
                             "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"b": {"type": "integer"}}}]}),
     ['{"a": 1, "b": 2}', '{"a": 1}'], ['{"a": "x"}']),
    (StructuredOutputs(json={"type": "object", "properties": {"kind": {"type": "string"}}, "anyOf": [
        {"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {"type": "integer"}}}]}),
     ['{"kind": "x", "a": 1}', '{"kind": "x", "b": 2}'], ['{"kind": 1}']),
    # one that requires a key it does not list stays open (closed, no text would fit it)
    (StructuredOutputs(json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}),
     ['{"a": 1, "b": 2}'], ['{"a": 1}']),
    (StructuredOutputs(regex=r"[a-c]+[0-9]?"), ["abc", "cab7"], ["d", "a77"]),
    (StructuredOutputs(grammar='start: "x" num\nnum: /[0-9]+/'), ["x1", "x42"], ["x", "y1"]),
])
def test_each_kind_of_constraint_accepts_its_texts_and_no_others(grammars, spec, good, bad):
    matcher = LLMatcher(grammars._ll_tokenizer(), grammar_text(spec), log_level=0)
    for text, fits in [(t, True) for t in good] + [(t, False) for t in bad]:
        matcher.reset()
        tokens = ids(text)
        complete = matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()
        assert complete == fits, text


def test_bad_constraints_are_refused_by_name(grammars):
    with pytest.raises(ConfigError, match="^structured_outputs regex"):
        grammars.check(StructuredOutputs(regex="(ab"))
    with pytest.raises(ConfigError, match="^structured_outputs grammar"):
        grammars.check(StructuredOutputs(grammar="start: undefined_rule"))
    for fields in [{}, dict(regex="a", choice=["b"]), dict(json="[1]"), dict(json="{not json"), dict(choice=[]),
                   dict(choice="ab"), dict(regex="")]:
        with pytest.raises(ConfigError, match="^structured_outputs"):
            StructuredOutputs(**fields)
    with pytest.raises(ConfigError, match="^min_tokens"):
        SamplingParams(min_tokens=2, structured_outputs=StructuredOutputs(regex="a+"))
    with pytest.raises(ConfigError, match="^structured_outputs need the model's tokenizer"):
        Grammars(None, VOCAB, [EOS]).check(StructuredOutputs(regex="a"))
    with pytest.raises(ConfigError, match="^structured_outputs json"):  # a RecursionError: a server's 500
        StructuredOutputs(json="[" * 100000 + "]" * 100000)


def test_a_matcher_that_fails_as_a_request_runs_fails_that_request_alone(grammars):
    """llguidance's matcher may enter its error state as it goes (past its limits): a RuntimeError ended
    every request of the batch's step; the history is now a dead end, which fails the request (a 400)
    only where an output reaches it, and the guide goes on with a fresh matcher."""
    from triforce.errors import RequestFailed

    guide = grammars.guide(SPEC)
    healthy = guide.matcher

    class Failing:
        def __getattr__(self, name):
            return getattr(healthy, name)

        def is_error(self):
            return True

        def get_error(self):
            return "lexer too complex\n<state>...</state>"

    guide.matcher = Failing()
    assert guide.allowed([]) is None and guide.forced([]) is None
    with pytest.raises(RequestFailed, match=r"\(lexer too complex\)$"):
        guide.output_refuses([], ids("a")[0])
    assert torch.equal(guide.allowed(ids("ab")), fresh_mask(grammars, SPEC, ids("ab")))
    assert not guide.output_refuses(ids("ab"), ids(".")[0]) and guide.output_refuses(ids("ab"), ids("x")[0])


def test_a_history_no_token_continues_is_a_dead_end_and_the_guide_goes_on(grammars):
    """(abé|ac) where no token spells é: llguidance allows b after a, and finds only as it masks the row
    after ab that nothing continues it (its error state, for good). That history is a dead end (no mask,
    output_refuses fails), and the other branch masks as a fresh matcher does."""
    from triforce.speculation.guided import MatcherFailed

    spec = StructuredOutputs(regex="(ab\u00e9|ac)")
    guide = grammars.guide(spec)
    assert guide.allowed(ids("a")).nonzero().flatten().tolist() == ids("bc")
    assert guide.allowed(ids("ab")) is None and guide.forced(ids("ab")) is None
    with pytest.raises(MatcherFailed, match="continues the 2 generated tokens"):
        guide.output_refuses(ids("ab"), EOS)
    for history in (ids("a"), ids("ac"), [], ids("ac")):
        assert torch.equal(guide.allowed(history), fresh_mask(grammars, spec, history))
        assert guide.output_refuses(history, ids("z")[0])  # (a letter none of them allows, and no dead end)
    assert guide.forced(ids("ac")) == EOS
    with pytest.raises(ConfigError, match="^structured_outputs regex: no text it allows can be written"):
        grammars.check(StructuredOutputs(regex="[a&&b]"))


def test_a_tokenizer_llguidance_cannot_read_is_a_clear_error(tmp_path):
    from checkpoints import write_tiny_tokenizer

    write_tiny_tokenizer(tmp_path, VOCAB)  # word-level, no decoder
    with pytest.raises(ConfigError, match="cannot read this model's tokenizer"):
        Grammars(AutoTokenizer.from_pretrained(tmp_path), VOCAB, [EOS]).check(StructuredOutputs(regex="a"))


def test_a_constrained_request_ends_at_end_of_sequence_even_with_ignore_eos():
    spec = StructuredOutputs(regex="a+")
    assert SamplingParams(ignore_eos=True).end_ids([EOS]) == frozenset()
    assert SamplingParams(ignore_eos=True, structured_outputs=spec).end_ids([EOS]) == {EOS}
    # a dict of the fields is taken too; the schema is kept as text, so the params stay hashable
    params = SamplingParams(structured_outputs={"json": {"type": "object"}})
    assert params.structured_outputs == StructuredOutputs(json='{"type": "object"}') and hash(params)


def test_a_grammar_is_checked_outside_the_lock(grammars, monkeypatch):
    """A server checks a new request's constraint in one thread while its scheduler thread starts another
    constrained request: a large schema's check held the lock for seconds, and the scheduler, every stream
    of the batch with it, waited on it."""
    import threading

    import llguidance

    real, free = llguidance.LLMatcher.validate_grammar_with_warnings, []

    def validating(grammar, tokenizer):
        taker = threading.Thread(target=lambda: free.append(grammars._lock.acquire(timeout=5) and
                                                            (grammars._lock.release() or True)))
        taker.start()
        taker.join()
        return real(grammar, tokenizer)

    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar_with_warnings", staticmethod(validating))
    spec = StructuredOutputs(regex="[a-c]+x")
    assert grammars.check(spec) and free == [True]
    assert grammars.check(spec) and free == [True]  # kept: checked once
