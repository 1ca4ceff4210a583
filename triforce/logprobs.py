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

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class Logprob:
    """vLLM's: a token's log-probability and its rank there (1: the most likely). decoded_token stays None
    here: a token's text is the tokenizer's to give (`tokenizer.decode`)."""
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

    @cached_property
    def _entries(self) -> dict[int, Logprob]:
        """The dict view, built once (an entry is not changed after it is made)."""
        entries = {self.token: Logprob(self.logprob, self.rank)}
        for rank, (token, logprob) in enumerate(self.top, 1):
            entries.setdefault(token, Logprob(logprob, rank))
        return entries

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
    norm = torch.logsumexp(rows.float(), dim=-1)  # [n]: log softmax is each logit less this
    picked = rows.gather(1, torch.tensor(tokens)[:, None])  # [n, 1]
    chosen = (picked[:, 0].float() - norm).tolist()
    ranks = ((rows > picked).sum(dim=-1) + 1).tolist()  # 1 + how many tokens are more likely
    if not k:
        return [TokenLogprobs(token, value, [], rank) for token, value, rank in zip(tokens, chosen, ranks)]
    top_values, top_ids = rows.topk(min(k, rows.shape[-1]), dim=-1)
    top_values = (top_values.float() - norm[:, None]).tolist()
    return [TokenLogprobs(token, value, list(zip(ids, values)), rank)
            for token, value, ids, values, rank in zip(tokens, chosen, top_ids.tolist(), top_values, ranks)]
