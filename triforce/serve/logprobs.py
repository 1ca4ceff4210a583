"""OpenAI's `logprobs` objects, from a choice's TokenLogprobs (triforce/logprobs.py: the target's, before
temperature, top-k and top-p, as vLLM gives them).

/v1/completions (`logprobs`: k) answers {tokens, token_logprobs, top_logprobs, text_offset}, each top
entry a map of the k most likely tokens' texts, and the chosen one's, to their log-probabilities; with
`echo` the prompt's tokens come first, the first of them with null entries (nothing precedes it);
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


def completion_logprobs(texts: TokenTexts, tokens: list[int], items: list[TokenLogprobs | None],
                        offset: int = 0) -> dict:
    """A completion choice's `logprobs` for `tokens`, items[i] the entry of tokens[i] (None: the prompt's
    first); `offset`: where the first token's text begins in the choice's text."""
    pieces = [texts(token) for token in tokens]
    offsets = []
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": pieces, "token_logprobs": [None if item is None else item.logprob for item in items],
            "top_logprobs": [None if item is None else
                             {**{texts(t): lp for t, lp in item.top}, piece: item.logprob}
                             for item, piece in zip(items, pieces)],
            "text_offset": offsets}


def chat_logprobs(texts: TokenTexts, items: list[TokenLogprobs]) -> dict:
    """A chat choice's `logprobs`."""
    def entry(token: int, logprob: float) -> dict:
        text = texts(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**entry(item.token, item.logprob), "top_logprobs": [entry(t, lp) for t, lp in item.top]}
                        for item in items], "refusal": None}


def choice_logprobs(kind: str, texts: TokenTexts, items: list[TokenLogprobs] | None,
                    offset: int = 0) -> dict | None:
    """The `logprobs` of generated tokens' entries `items` (None: the request asked for none)."""
    if items is None:
        return None
    if kind == "chat":
        return chat_logprobs(texts, items)
    return completion_logprobs(texts, [item.token for item in items], items, offset)


def echoed_logprobs(texts: TokenTexts, output, prompt: list[int]) -> dict | None:
    """A completion choice's `logprobs` with `echo`: the prompt's entries, then the generated tokens'."""
    if output.logprobs is None:
        return None
    return completion_logprobs(texts, prompt + output.token_ids, output.prompt_logprobs + output.logprobs)


class StreamedLogprobs:
    """What one streamed choice has sent: each chunk carries the entries of the tokens generated since
    the last (Request.new_logprobs), its last chunk those of tokens whose text came to nothing (an EOS).
    With `echo`, a first chunk carries the prompt's (`prompt`)."""

    def __init__(self, kind: str, texts: TokenTexts):
        self.kind, self.texts, self.sent, self.offset = kind, texts, 0, 0

    def prompt(self, tokens: list[int], items: list[TokenLogprobs | None] | None) -> dict | None:
        """The echo chunk's: the prompt's entries (None: not asked for)."""
        self.offset = sum(len(self.texts(token)) for token in tokens)
        return None if items is None else completion_logprobs(self.texts, tokens, items)

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
