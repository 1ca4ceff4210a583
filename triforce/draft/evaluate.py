"""Held-out evaluation of a draft against its target: how often they agree and how often speculative
sampling would accept the draft's token.

Both models read the whole sequence here (the draft sees more context than its StreamingLLM cache gives
it in the engine), so these figures bound tier-1 acceptance from above on text like the held-out one.
"""
from __future__ import annotations

import time

import torch
from tqdm import tqdm

from ..cache.full import FullKVCache
from ..models.llama import LlamaModel
from ..speculation.sampling import probabilities


def _logits(model: LlamaModel, row: torch.Tensor) -> torch.Tensor:
    cache = FullKVCache(model.config, row.numel(), model.dtype, model.device)
    return model(row.to(model.device), cache, logits_for="all").cpu()


def evaluate(draft: LlamaModel, target: LlamaModel, sequences: torch.Tensor, temperature: float = 0.6) -> dict:
    """-> {"top1_agreement", "expected_acceptance", "temperature", "tokens"} over every position."""
    agree = accept = 0.0
    count = 0
    for row in tqdm(sequences, desc="evaluate draft", unit="seq"):
        p, q = _logits(target, row), _logits(draft, row)
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
        pt = probabilities(p, temperature)
        qt = probabilities(q, temperature)
        accept += torch.minimum(pt, qt).sum().item()  # P(accept) of one speculative-sampling draw
        count += row.numel()
    return {"top1_agreement": agree / count, "expected_acceptance": accept / count,
            "temperature": temperature, "tokens": count}


def evaluate_genres(draft: LlamaModel, target: LlamaModel, genres: dict[str, torch.Tensor],
                    temperature: float = 0.6) -> dict[str, dict]:
    """`evaluate` on each genre's held-out sequences, reported separately."""
    return {name: evaluate(draft, target, sequences, temperature) for name, sequences in genres.items()
            if sequences.shape[0]}


def decode_ms_per_token(draft: LlamaModel, steps: int = 64) -> float:
    """Milliseconds for one single-token draft step (after a 256-token prefill)."""
    cache = FullKVCache(draft.config, 256 + steps + 1, draft.dtype, draft.device)
    draft(torch.zeros(256, dtype=torch.long, device=draft.device), cache, logits_for="none")
    token = torch.zeros(1, dtype=torch.long, device=draft.device)
    start = time.perf_counter()
    for _ in range(steps):
        draft(token, cache)
    return (time.perf_counter() - start) / steps * 1000
