"""Every tier of a request through its prompt, the target first (HierarchyEngine's prefill): chunk by chunk
as each tier's steps make them, with a progress bar on long prompts, the prompt scored by the target where
the request asks (prompt_logprobs), and a stop between two chunks where the request was cancelled.
`TierPrefill` is a part of HierarchyEngine (engine.py), which holds the `tiers`, `ladder`, `params`, `seq`
and `prompt_logprobs` it reads and fills."""
from __future__ import annotations

import sys
from collections.abc import Callable, Generator
from contextlib import closing, nullcontext

from tqdm import tqdm

from ..logprobs import token_logprobs
from .runs import Forward, Wait


class TierPrefill:
    def _prefill(self, tokens: list[int], show_progress: bool,
                 cancelled: Callable[[], bool]) -> Generator[Forward, None, bool]:
        """Every tier through `tokens`; returns False when `cancelled` stopped it between two chunks (the
        caches are then half built and the engine is done). With SamplingParams.prompt_logprobs the target
        scores the prompt as it goes: its rows for every chunk, none restored from a prefix store."""
        # The target first: caches derived from it (retrieval) build from its KV. A request of no new
        # tokens (max_tokens 0: a prompt scored, or stored for reuse) needs only the target's.
        top = len(self.tiers) - 1
        for level in reversed(range(0 if self.params.max_tokens else top, top + 1)):
            tier = self.tiers[level]
            scoring = level == top and self.params.prompt_logprobs is not None
            # No bar object at all unless shown: a disabled tqdm still takes tqdm's global lock twice
            # (0.1 ms a prefill, a tenth of a tiny model's request)
            bar = tqdm(total=len(tokens), desc=f"prefill {tier.name}", unit="tok", file=sys.stderr,
                       leave=False) if show_progress else None
            with closing(bar) if bar is not None else nullcontext(), \
                    closing(tier.scoring_steps(tokens, bar) if scoring else tier.prefill_steps(tokens, bar)) as steps:
                for step in steps:  # closed on the way out: a prefix claim it holds is released
                    if cancelled():
                        return False
                    if isinstance(step, Wait):
                        yield step
                        continue
                    logits = yield Forward(tier, self.ladder.index(tier), step, "prompt" if scoring else "none")
                    if scoring:  # row i of a chunk from `start` chose seq[start + i + 1]
                        chosen = self.seq[step.start + 1:step.start + 1 + step.n]
                        self.prompt_logprobs += token_logprobs(logits, chosen, self.params.prompt_logprobs)
        return True
