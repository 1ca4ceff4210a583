"""OpenAI's `logprobs` objects, from a choice's TokenLogprobs (triforce/logprobs.py: the target's, before
temperature, top-k and top-p, as vLLM gives them).

/v1/completions (`logprobs`: k) answers {tokens, token_logprobs, top_logprobs, text_offset}, each top
entry a map of the k most likely tokens' texts, and the chosen one's, to their log-probabilities; with
`echo` the prompt's tokens come first, the first of them with null entries (nothing precedes it);
/v1/chat/completions (`logprobs`: true, `top_logprobs`: k) answers {content: [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}]}. A token's text is what it adds where it stands, after the
few tokens before it (a generated token's first ones are the prompt's, as the text is decoded after the
prompt: a SentencePiece word marker is a space only after other text, detokenize.py; a piece of a
character that several tokens spell reads U+FFFD), special tokens by their names, so that the token
texts join to the text where it has none; `text_offset` counts their lengths, as vLLM does. A model without a tokenizer names
tokens `token_id:N`, as vLLM does. The list covers the tokens of `token_ids` (with a stop string, up to
the one that completed it). A stream sends each token's entry with the chunk that carries its text, or
in its last chunk.
"""
from __future__ import annotations

from dataclasses import replace

from ..detokenize import DECODE_CONTEXT as CONTEXT
from ..logprobs import TokenLogprobs, TokenTexts


LOWEST_LOGPROB = -9999.0  # what a log-probability this low, or not a number, is served as (vLLM's clamp)


def shown(logprob: float) -> float:
    """A log-probability as JSON can carry it, clamped as vLLM's server clamps it: a row that overflowed (a
    float16 target scoring a prompt: such rows are not checked, as sampled ones are) gave NaN or -inf, which
    the server's JSON refused (a 500) or streamed as invalid JSON. (LLM's outputs keep them, as vLLM's.)"""
    return logprob if logprob >= LOWEST_LOGPROB else LOWEST_LOGPROB  # (NaN compares False)


def completion_logprobs(texts: TokenTexts, tokens: list[int], items: list[TokenLogprobs | None],
                        offset: int = 0, before: list[int] = ()) -> dict:
    """A completion choice's `logprobs` for `tokens` (which follow `before`), items[i] the entry of
    tokens[i] (None: the prompt's first); `offset`: where the first token's text begins in the choice's."""
    contexts = texts.contexts(list(before), tokens)
    pieces = [texts(token, context) for token, context in zip(tokens, contexts)]
    offsets = []
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": pieces, "token_logprobs": [None if item is None else shown(item.logprob) for item in items],
            "top_logprobs": [None if item is None else
                             {**{texts(t, context): shown(lp) for t, lp in item.top}, piece: shown(item.logprob)}
                             for item, piece, context in zip(items, pieces, contexts)],
            "text_offset": offsets}


def chat_logprobs(texts: TokenTexts, items: list[TokenLogprobs], before: list[int] = ()) -> dict:
    """A chat choice's `logprobs` for the entries `items`, whose tokens follow `before`."""
    def entry(token: int, logprob: float, context: tuple[int, ...]) -> dict:
        text = texts(token, context)
        return {"token": text, "logprob": shown(logprob), "bytes": list(texts.bytes_of(token, text))}

    contexts = texts.contexts(list(before), [item.token for item in items])
    return {"content": [{**entry(item.token, item.logprob, context),
                         "top_logprobs": [entry(t, lp, context) for t, lp in item.top]}
                        for item, context in zip(items, contexts)], "refusal": None}


def choice_logprobs(kind: str, texts: TokenTexts, items: list[TokenLogprobs] | None, before: list[int] = (),
                    offset: int = 0) -> dict | None:
    """The `logprobs` of generated tokens' entries `items`, which follow the tokens `before` (the prompt, then
    the tokens generated before them; None: the request asked for none)."""
    if items is None:
        return None
    if kind == "chat":
        return chat_logprobs(texts, items, before)
    return completion_logprobs(texts, [item.token for item in items], items, offset, before)


def echoed_logprobs(texts: TokenTexts, output, prompt: list[int], k: int | None = None) -> dict | None:
    """A completion choice's `logprobs` with `echo`: the prompt's entries (each its `k` most likely, where
    the prompt was scored for more, for `prompt_logprobs`), then the generated tokens'."""
    if output.logprobs is None:
        return None
    items = [item if item is None or k is None else replace(item, top=item.top[:k]) for item in output.prompt_logprobs]
    head = completion_logprobs(texts, prompt, items)
    offset = sum(len(piece) for piece in head["tokens"])
    tail = completion_logprobs(texts, output.token_ids, output.logprobs, offset, prompt)
    return {name: head[name] + tail[name] for name in head}


def prompt_logprobs(texts: TokenTexts, prompt: list[int], items: list[TokenLogprobs | None], k: int) -> list:
    """vLLM's `prompt_logprobs` field: per prompt token, null for the first (nothing precedes it), else
    {token id: {logprob, rank, decoded_token}}, the prompt's token first, then its `k` most likely."""
    out = []
    for token, item, context in zip(prompt, items, texts.contexts([], prompt)):
        if item is None:
            out.append(None)
            continue
        entries = {str(token): {"logprob": shown(item.logprob), "rank": item.rank,
                                "decoded_token": texts(token, context)}}
        for rank, (other, logprob) in enumerate(item.top[:k], 1):
            entries.setdefault(str(other), {"logprob": shown(logprob), "rank": rank,
                                            "decoded_token": texts(other, context)})
        out.append(entries)
    return out


class StreamedLogprobs:
    """What one streamed choice has sent: each chunk carries the entries of the tokens generated since
    the last (Request.new_logprobs), its last chunk those of tokens whose text came to nothing (an EOS).
    With `echo`, a first chunk carries the prompt's (`prompt`)."""

    def __init__(self, kind: str, texts: TokenTexts, prompt: list[int] = ()):
        self.kind, self.texts = kind, texts
        self.before = list(prompt)[-CONTEXT:]  # the last tokens before the next entry's: the prompt's, then sent ones
        self.sent = self.offset = 0

    def prompt(self, tokens: list[int], items: list[TokenLogprobs | None]) -> dict:
        """The echo chunk's `logprobs`: the prompt's entries."""
        out = completion_logprobs(self.texts, tokens, items)
        self.offset = sum(len(piece) for piece in out["tokens"])
        return out

    def take(self, new: list[TokenLogprobs] | None) -> dict | None:
        """The `logprobs` of a chunk with the entries `new` (None: the request asked for none)."""
        if new is None:
            return None
        out = choice_logprobs(self.kind, self.texts, new, self.before, self.offset)
        self.sent += len(new)
        self.before = (self.before + [item.token for item in new])[-CONTEXT:]
        if self.kind == "completion":
            self.offset += sum(len(piece) for piece in out["tokens"])
        return out

    def rest(self, items: list[TokenLogprobs] | None) -> dict | None:
        """The last chunk's: of a choice's entries (RequestOutput.logprobs), those not yet sent, if any."""
        return None if items is None or len(items) == self.sent else self.take(items[self.sent:])
