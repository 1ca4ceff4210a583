"""From logits to the distribution a tier samples from, and drawing from it.

Every tier applies the same processing (temperature, top-k, top-p), so each tier's distribution is
the one plain sampling from that tier's model would use; the target's is the output distribution.
Temperature 0 means greedy: a one-hot distribution on the argmax (first index on ties), so the
speculative-sampling rules reduce to exact greedy matching without any division by zero.
"""
from __future__ import annotations

import torch


def probabilities(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits: [n, V] -> probabilities [n, V] float32."""
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p; the first is always kept.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def top_probability(logits: torch.Tensor) -> float:
    """logits: [V] -> the probability the model gives its most likely token at temperature 1 (its own
    confidence, whatever the request's sampling settings)."""
    logits = logits.float()
    return float(torch.exp(logits.max() - torch.logsumexp(logits, dim=-1)))


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool) -> int:
    """probs: [V]. Greedy takes the argmax without consuming randomness."""
    if greedy:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=generator))
