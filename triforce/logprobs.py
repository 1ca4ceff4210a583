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

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprobs:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # the k most likely tokens there, most likely first (k = SamplingParams.logprobs)


def token_logprobs(logits: list[torch.Tensor] | torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprobs]:
    """logits: the target's row [V] at each of `tokens` (a list, or [n, V]); k: how many of the most likely
    to list beside each."""
    if not tokens:
        return []
    rows = torch.stack(logits) if isinstance(logits, list) else logits  # [n, V]
    norm = torch.logsumexp(rows.float(), dim=-1)  # [n]: log softmax is each logit less this
    chosen = (rows.gather(1, torch.tensor(tokens)[:, None])[:, 0].float() - norm).tolist()
    if not k:
        return [TokenLogprobs(token, value, []) for token, value in zip(tokens, chosen)]
    top_values, top_ids = rows.topk(min(k, rows.shape[-1]), dim=-1)
    top_values = (top_values.float() - norm[:, None]).tolist()
    return [TokenLogprobs(token, value, list(zip(ids, values)))
            for token, value, ids, values in zip(tokens, chosen, top_ids.tolist(), top_values)]
