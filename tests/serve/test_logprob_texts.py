"""serve/logprobs.py's token texts: each token's text where it stands, so that a part's texts join to its
text, also for a SentencePiece-style tokenizer whose word marker is a space only after other text."""
import pytest

from checkpoints import metaspace_tokenizer
from triforce.logprobs import TokenLogprobs
from triforce.serve.logprobs import StreamedLogprobs, TokenTexts, completion_logprobs, echoed_logprobs


@pytest.fixture(scope="module")
def metaspace():
    return metaspace_tokenizer(["It", "is", "a", "truth", "universally", "acknowledged"])


def entries(tokens):
    return [TokenLogprobs(t, -0.5 * i, [(t, -0.5 * i)]) for i, t in enumerate(tokens)]


def test_texts_where_they_stand_join_to_the_text_and_name_special_tokens(metaspace):
    ids = metaspace("It is a truth universally acknowledged").input_ids
    texts = TokenTexts(metaspace)
    out = completion_logprobs(texts, ids, entries(ids))
    assert "".join(out["tokens"]) == metaspace.decode(ids) == "It is a truth universally acknowledged"
    assert out["tokens"][:2] == ["It", " is"]  # each alone would read "It", "is": the space is lost
    assert out["text_offset"] == [0, 2, 5, 7, 13, 25]
    assert completion_logprobs(texts, [1], entries([1]))["tokens"] == ["</s>"]
    assert completion_logprobs(TokenTexts(None), [5], entries([5]))["tokens"] == ["token_id:5"]


def test_a_stream_and_an_echo_give_the_texts_of_the_whole(metaspace):
    prompt, generated = metaspace("It is a").input_ids, metaspace("truth universally acknowledged").input_ids
    texts = TokenTexts(metaspace)
    whole = completion_logprobs(texts, generated, entries(generated), before=prompt)
    assert whole["tokens"][0] == " truth"  # after the prompt, as the text is decoded (detokenize.py)
    stream = StreamedLogprobs("completion", texts, prompt)
    chunks = [stream.take(entries(generated)[:1]), stream.take(entries(generated)[1:])]
    for field in ("tokens", "text_offset", "token_logprobs"):
        assert chunks[0][field] + chunks[1][field] == whole[field]

    class Output:
        token_ids, logprobs = generated, entries(generated)
        prompt_logprobs = [None] + entries(prompt)[1:]

    echoed = echoed_logprobs(texts, Output, prompt)
    assert "".join(echoed["tokens"]) == "It is a truth universally acknowledged"  # the whole, as decoded
    assert echoed["token_logprobs"][0] is None and echoed["top_logprobs"][0] is None
    assert echoed["text_offset"][len(prompt)] == len("It is a")


def test_an_echoed_prompt_of_token_ids_keeps_the_special_tokens_its_logprobs_name(metaspace):
    """vLLM echoes a prompt of token ids decoded with its special tokens: left out, the text lacked the
    "</s>" the echoed log-probabilities name, and every text offset after it pointed past its token."""
    from types import SimpleNamespace

    from triforce.serve.fields import echoed_text

    prompt, generated = [1] + metaspace("It is a").input_ids, metaspace("truth").input_ids  # "</s>" first

    class Output:
        token_ids, logprobs = generated, entries(generated)
        prompt_logprobs = [None] + entries(prompt)[1:]

    echoed = echoed_logprobs(TokenTexts(metaspace), Output, prompt)
    text = echoed_text(prompt, prompt, SimpleNamespace(tokenizer=metaspace))
    assert text.startswith("</s>") and text == "".join(echoed["tokens"][:len(prompt)])
    assert echoed["text_offset"][len(prompt)] == len(text)


def test_log_probabilities_json_cannot_carry_are_served_as_vllm_clamps_them(metaspace):
    """A row that overflowed (prompt scoring does not check its rows, as sampling does) gave NaN and -inf,
    which the server's JSON refused with a 500, or streamed as invalid JSON: vLLM's server reports -9999
    (LLM's outputs keep them, as vLLM's do)."""
    import json

    from triforce.serve.logprobs import chat_logprobs, prompt_logprobs

    ids = metaspace("It is a").input_ids
    items = [TokenLogprobs(t, v, [(t, v), (ids[0], -0.25)]) for t, v in zip(ids, [float("nan"), float("-inf"), -1.5])]
    texts = TokenTexts(metaspace)
    for served in (completion_logprobs(texts, ids, items), chat_logprobs(texts, items),
                   prompt_logprobs(texts, ids, [None] + items[1:], 1)):
        json.dumps(served, allow_nan=False)  # every value finite
    out = completion_logprobs(texts, ids, items)
    assert out["token_logprobs"] == [-9999.0, -9999.0, -1.5] and out["top_logprobs"][2][" a"] == -1.5
