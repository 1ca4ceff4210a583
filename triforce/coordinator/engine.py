"""The hierarchy loop: any number of tiers, cheapest first, each checking the one below exactly.

All tiers share one token sequence `seq` (prompt, committed tokens, then speculative ones). A tier's
cache holds KV for a prefix `seq[:tier.length]`; a forward feeds `seq[tier.length:]`, so a tier that
lags (say the draft, after its last proposal was accepted) simply catches up. When a check at position p
keeps `a` of its proposals, `seq` is cut to p + a and the new token appended, and every tier is
truncated to the valid prefix p + a. After each target check, `sync` lets the retrieval cache replace
its speculative KV with the target's.

`_produce(level, n)` returns at least n tokens sampled exactly from tier `level`'s distribution, with
that tier's probabilities at each: tier 0 samples autoregressively; any higher tier repeatedly takes
`gammas[level - 1]` tokens from the tier below and verifies them (speculation/verify.py). The output is
one round of `_produce(top, 1)` after another. Every random draw is made here, with one generator.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from ..config import SamplingParams
from ..speculation.sampling import probabilities, sample
from ..speculation.verify import verify_chain
from ..step import Step
from .metrics import RequestMetrics, TierStats
from .tiers import Tier

PROGRESS_MIN_TOKENS = 2048  # show a prefill progress bar for prompts at least this long


class HierarchyEngine:
    def __init__(self, tiers: list[Tier], gammas: list[int]):
        if len(gammas) != len(tiers) - 1 or any(g < 1 for g in gammas):
            raise ValueError("need one gamma >= 1 per pair of adjacent tiers")
        self.tiers, self.gammas = tiers, gammas

    def generate(self, prompt: list[int], params: SamplingParams, stop_ids: tuple[int, ...] = (),
                 on_tokens: Callable[[list[int]], bool] | None = None,
                 show_progress: bool = False) -> tuple[list[int], RequestMetrics]:
        """Returns (generated token ids, metrics). `on_tokens` sees each round's new tokens and returns
        True to stop (stop strings); generation also stops at a stop id or after max_tokens."""
        if not prompt:
            raise ValueError("empty prompt")
        self.params = params
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, ()))
        self.generator = torch.Generator().manual_seed(seed)
        self.seq = list(prompt)
        self.stats = [TierStats(t.name, self.tiers[i - 1].name) for i, t in enumerate(self.tiers) if i > 0]
        metrics = RequestMetrics(prompt_tokens=len(prompt), tiers=self.stats)

        start = time.perf_counter()
        self._prefill(prompt[:-1], show_progress and len(prompt) >= PROGRESS_MIN_TOKENS)
        metrics.prefill_s = time.perf_counter() - start
        for tier in self.tiers:
            tier.seconds = 0.0

        start = time.perf_counter()
        generated: list[int] = []
        top = len(self.tiers) - 1
        while len(generated) < params.max_tokens:
            new, _ = self._produce(top, 1)
            for tier in self.tiers:
                tier.sync()
            new = new[: params.max_tokens - len(generated)]
            stop_at = None if params.ignore_eos else next((i for i, t in enumerate(new) if t in stop_ids), None)
            if stop_at is not None:
                new = new[: stop_at + 1]
            generated += new
            if stop_at is not None or (on_tokens is not None and on_tokens(new)):
                break
        metrics.decode_s = time.perf_counter() - start
        metrics.generated_tokens = len(generated)
        for stat, tier in zip(self.stats, self.tiers[1:]):
            stat.seconds = tier.seconds
        metrics.retrieval_rebuilds = sum(t.rebuilds for t in self.tiers)
        return generated, metrics

    def _prefill(self, tokens: list[int], show_progress: bool) -> None:
        # The target first: caches derived from it (retrieval) build from its KV.
        for tier in reversed(self.tiers):
            with tqdm(total=len(tokens), desc=f"prefill {tier.name}", unit="tok", file=sys.stderr,
                      disable=not show_progress, leave=False) as bar:
                tier.prefill(tokens, bar)

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        return probabilities(logits, p.temperature, p.top_k, p.top_p)

    def _forward(self, tier: Tier) -> torch.Tensor:
        """The tier catches up with `seq`: its logits for the tokens it has not seen, [n, V]."""
        return tier.forward(Step.chain(self.seq[tier.length:], tier.length))

    def _produce(self, level: int, count: int) -> tuple[list[int], list[torch.Tensor]]:
        tier, seq, greedy = self.tiers[level], self.seq, self.params.greedy
        tokens: list[int] = []
        probs: list[torch.Tensor] = []  # tier `level`'s distribution for each returned token, [V] each
        while len(tokens) < count:
            if level == 0:
                row = self._probs(self._forward(tier)[-1:])[0]
                token = sample(row, self.generator, greedy)
                seq.append(token)
                tokens.append(token)
                probs.append(row)
                continue
            position = len(seq)
            draft_tokens, draft_rows = self._produce(level - 1, self.gammas[level - 1])
            g = len(draft_tokens)
            target_probs = self._probs(self._forward(tier)[-(g + 1):])  # [g+1, V]
            verdict = verify_chain(draft_tokens, torch.stack(draft_rows), target_probs, self.generator, greedy)
            self.stats[level - 1].record(g, verdict.accepted)
            self.tiers[level - 1].observe(g, verdict.accepted)  # how the proposer's tokens fared
            valid = position + verdict.accepted
            del seq[valid:]
            seq.append(verdict.next_token)
            for t in self.tiers:
                t.truncate(valid)
            tokens += draft_tokens[: verdict.accepted] + [verdict.next_token]
            probs += list(target_probs[: verdict.accepted + 1])
        return tokens, probs
