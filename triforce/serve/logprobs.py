"""OpenAI's `logprobs` objects, from a choice's TokenLogprobs (triforce/logprobs.py: the target's, before
temperature, top-k and top-p, as vLLM gives them).

/v1/completions (`logprobs`: k) answers {tokens, token_logprobs, top_logprobs, text_offset}, each top
entry a map of the k most likely tokens' texts, and the chosen one's, to their log-probabilities;
/v1/chat/completions (`logprobs`: true, `top_logprobs`: k) answers {content: [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}]}. A token's text is its own decoding (a piece of a character
that several tokens spell reads U+FFFD); a model without a tokenizer names tokens `token_id:N`, as
vLLM does. The list covers every generated token the usage counts: with a stop string, also those of
the round in which the stop string appeared (the text ends before it). A stream sends each token's entry
with the chunk that carries its text, or in its last chunk.
"""
from __future__ import annotations

from ..logprobs import TokenLogprobs


class TokenTexts:
    """Each token's text, decoded once."""

    def __init__(self, tokenizer):
        self.tokenizer, self.known = tokenizer, {}

    def __call__(self, token: int) -> str:
        text = self.known.get(token)
        if text is None:
            text = f"token_id:{token}" if self.tokenizer is None else self.tokenizer.decode([token])
            self.known[token] = text
        return text


def completion_logprobs(texts: TokenTexts, items: list[TokenLogprobs], offset: int = 0) -> dict:
    """A completion choice's `logprobs`; `offset`: where the first token's text begins in the choice's text."""
    tokens = [texts(item.token) for item in items]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [item.logprob for item in items],
            "top_logprobs": [{**{texts(t): lp for t, lp in item.top}, texts(item.token): item.logprob}
                             for item in items],
            "text_offset": offsets}


def chat_logprobs(texts: TokenTexts, items: list[TokenLogprobs]) -> dict:
    """A chat choice's `logprobs`."""
    def entry(token: int, logprob: float) -> dict:
        text = texts(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**entry(item.token, item.logprob), "top_logprobs": [entry(t, lp) for t, lp in item.top]}
                        for item in items], "refusal": None}


def choice_logprobs(kind: str, texts: TokenTexts, items: list[TokenLogprobs] | None, offset: int = 0) -> dict | None:
    if items is None:
        return None
    return completion_logprobs(texts, items, offset) if kind == "completion" else chat_logprobs(texts, items)


class StreamedLogprobs:
    """What one streamed choice has sent: each chunk carries the entries of the tokens generated since
    the last (Request.new_logprobs), its last chunk those of tokens whose text came to nothing (an EOS)."""

    def __init__(self, kind: str, texts: TokenTexts):
        self.kind, self.texts, self.sent, self.offset = kind, texts, 0, 0

    def take(self, new: list[TokenLogprobs] | None) -> dict | None:
        """The `logprobs` of a chunk with the entries `new` (None: the request asked for none)."""
        if new is None:
            return None
        out = choice_logprobs(self.kind, self.texts, new, self.offset)
        self.sent += len(new)
        self.offset += sum(len(self.texts(item.token)) for item in new)
        return out

    def rest(self, items: list[TokenLogprobs] | None) -> dict | None:
        """The last chunk's: of a choice's entries (RequestOutput.logprobs), those not yet sent, if any."""
        return None if items is None or len(items) == self.sent else self.take(items[self.sent:])
