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


def _byte_level_tokenizer():
    """A byte-level BPE tokenizer (GPT-2's alphabet) of single bytes and one merged pair, "ðŁ" (F0 9F, the
    first half of most emoji): characters past ASCII are split across tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from triforce.logprobs import BYTE_LEVEL

    vocab = {"<s>": 0, **{c: 1 + i for i, c in enumerate(BYTE_LEVEL)}}
    vocab["ðŁ"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges=[("ð", "Ł")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")


@pytest.mark.parametrize("kind", ["byte-level", "byte fallback"])
def test_the_bytes_of_a_characters_tokens_join_to_it(kind):
    """OpenAI's `bytes` are there to rebuild characters split across tokens: each such token's text is
    U+FFFD (or nothing), and its bytes were U+FFFD's three (or none); they are the token's own now."""
    from checkpoints import byte_fallback_tokenizer
    from triforce.serve.logprobs import chat_logprobs

    tokenizer = _byte_level_tokenizer() if kind == "byte-level" else byte_fallback_tokenizer(["ok", "caf"])
    text = "ok 😀 café 日本 ok"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) > len(text.split()) + 8  # split characters
    out = chat_logprobs(TokenTexts(tokenizer), [TokenLogprobs(t, -1.0, [(t, -1.0)]) for t in ids])
    entries = out["content"]
    assert any("\ufffd" in e["token"] for e in entries)  # the texts show the split, as vLLM's do
    assert bytes(b for e in entries for b in e["bytes"]).decode("utf-8") == tokenizer.decode(ids).strip() == text
    assert all(e["top_logprobs"][0]["bytes"] == e["bytes"] for e in entries)
    whole = [e for e in entries if "\ufffd" not in e["token"] and e["token"]]  # whole characters: their UTF-8
    assert whole and all(bytes(e["bytes"]) == e["token"].encode() for e in whole)
