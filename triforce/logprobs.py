"""Log-probabilities of generated tokens, as OpenAI's `logprobs` and vLLM's `SamplingParams.logprobs` give them.

They are the target model's (of generated tokens; with `prompt_logprobs`, of the prompt's too, from the
target's prefill): log softmax of its logits at the position where the token was chosen, before
temperature, top-k and top-p (vLLM's default, "raw" logprobs), so that they say how likely the model
found a token whatever the request sampled with, and greedy requests get real numbers. Every mode
computes them from the target's own rows (the top tier's check of the accepted tokens, or `ar`'s
step), never a draft's or the retrieval tier's, so they are the same in every mode up to the rounding
of the forward that produced the row.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial

import torch

from .detokenize import DECODE_CONTEXT

BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback (Llama 2's, Mistral's)


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's, Qwen's, SmolLM2's): the printable character each byte is written
    as in the vocabulary -> that byte. Printable bytes stand for themselves, the others for 256, 257, ... in
    their order."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


BYTE_LEVEL = _byte_level_alphabet()


@dataclass(frozen=True)
class Logprob:
    """vLLM's: a token's log-probability, its rank there (1: the most likely) and its text where it stands,
    a special token's name (as vLLM's, whatever skip_special_tokens says; None without a tokenizer or with
    SamplingParams.detokenize false)."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(eq=False)
class TokenLogprobs(Mapping):
    """One position's entry: the token chosen there, its log-probability and rank, and the k most likely.
    As a mapping it is vLLM's dict {token id: Logprob}: the chosen token first, then the k most likely (and
    equal to that dict, as a mapping compares)."""
    token: int
    logprob: float
    top: list[tuple[int, float]]  # the k most likely tokens there, most likely first (k = SamplingParams.logprobs)
    rank: int = 1  # the chosen token's among the vocabulary (1: the most likely)
    # a token's text at this position (`name_tokens`), read when the dict view is first built: the server,
    # which reads `top`, never decodes them this way
    text_of: Callable[[int], str] | None = field(default=None, repr=False)

    @cached_property
    def _entries(self) -> dict[int, Logprob]:
        """The dict view, built once (an entry is not changed after it is made)."""
        text_of = self.text_of or (lambda token: None)
        entries = {self.token: Logprob(self.logprob, self.rank, text_of(self.token))}
        for rank, (token, logprob) in enumerate(self.top, 1):
            if token not in entries:
                entries[token] = Logprob(logprob, rank, text_of(token))
        return entries

    def __getstate__(self) -> dict:
        """Pickled (or copied) with its tokens' texts decoded, not with the tokenizer that decodes them."""
        return {**self.__dict__, "_entries": self._entries, "text_of": None}

    def __getitem__(self, token: int) -> Logprob:
        return self._entries[token]

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def token_logprobs(logits: list[torch.Tensor] | torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprobs]:
    """logits: the target's row [V] at each of `tokens` (a list, or [n, V]); k: how many of the most likely
    to list beside each."""
    if not tokens:
        return []
    rows = torch.stack(logits) if isinstance(logits, list) else logits  # [n, V]
    # [n]: log softmax is each logit less this. Row by row: over [n, V] torch sums a row in another order than
    # over [1, V] (random rows of 49,152 logits: 32 of 200 [7, V] tensors differed in the last bits), and a
    # check's log-probabilities are then not those of plain decoding's one-token steps (benchmarks/api_fuzz.py);
    # no slower: 28 ms against 50 for a 512-row chunk of 49,152 logits scored whole (2-core Zen 4, one timing)
    norm = torch.stack([torch.logsumexp(row.float(), dim=-1) for row in rows])
    picked = rows.gather(1, torch.tensor(tokens)[:, None])  # [n, 1]
    chosen = (picked[:, 0].float() - norm).tolist()
    ranks = (rows >= picked).sum(dim=-1).tolist()  # how many are as likely or more, itself too (vLLM's rank)
    if not k:
        return [TokenLogprobs(token, value, [], rank) for token, value, rank in zip(tokens, chosen, ranks)]
    top_values, top_ids = rows.topk(min(k, rows.shape[-1]), dim=-1)
    top_values = (top_values.float() - norm[:, None]).tolist()
    return [TokenLogprobs(token, value, list(zip(ids, values)), rank)
            for token, value, ids, values, rank in zip(tokens, chosen, top_ids.tolist(), top_values, ranks)]


class TokenTexts:
    """Each token's text where it stands (its decoding after up to DECODE_CONTEXT tokens, less theirs), cached;
    special tokens by their names."""

    def __init__(self, tokenizer):
        self.tokenizer, self.known, self.decoded = tokenizer, {}, {}

    def __call__(self, token: int, before: tuple[int, ...] = ()) -> str:
        if self.tokenizer is None:
            return f"token_id:{token}"
        key = (before, token)
        text = self.known.get(key)
        if text is None:
            head, whole = self._decode(before), self._decode(before + (token,))
            text = whole[len(head):] if whole.startswith(head) else self._decode((token,))
            self.known[key] = text
        return text

    def bytes_of(self, token: int, text: str) -> bytes:
        """OpenAI's `bytes` of a token whose text, where it stands, is `text`: its UTF-8, or where the token holds
        part of a character (its text U+FFFD, or nothing: the character's first bytes showed it) the token's
        own bytes (a byte-level BPE piece's, a byte fallback token's), so that the bytes of a character's
        tokens join to it (each was U+FFFD's three, or none)."""
        if (text and "\ufffd" not in text) or self.tokenizer is None:
            return text.encode("utf-8")
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if not isinstance(piece, str) or not piece:
            return text.encode("utf-8")
        byte = BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            raw = bytes([int(byte.group(1), 16)])
        elif all(c in BYTE_LEVEL for c in piece):
            raw = bytes(BYTE_LEVEL[c] for c in piece)
        else:
            return text.encode("utf-8")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: its own bytes
            return raw
        return text.encode("utf-8")  # whole characters: the text where it stands says them

    def _decode(self, tokens: tuple[int, ...]) -> str:
        if not tokens:
            return ""
        text = self.decoded.get(tokens)
        if text is None:
            text = self.decoded[tokens] = self.tokenizer.decode(
                list(tokens), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text

    def contexts(self, before: list[int], tokens: list[int]) -> list[tuple[int, ...]]:
        """What each of `tokens`, following `before`, is decoded after."""
        window = list(before)[-DECODE_CONTEXT:]
        out = []
        for token in tokens:
            out.append(tuple(window))
            window = (window + [token])[-DECODE_CONTEXT:]
        return out


def name_tokens(texts: TokenTexts, before: list[int], tokens: list[int], entries: list[TokenLogprobs | None]) -> None:
    """Gives each entry, that of tokens[i] (which follow `before`), its tokens' texts where they stand, as
    vLLM's Logprob.decoded_token (None entries: a prompt's first token)."""
    for entry, context in zip(entries, texts.contexts(before, tokens)):
        if entry is not None:
            entry.text_of = partial(texts, before=context)
