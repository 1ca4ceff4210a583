"""What a sequence's run (HierarchyEngine.run, a generator) yields to the batch that drives it, and what it
is sent back: a `Forward` (a tier's step; sent its logits), a `Check` (a chain to verify; sent the
verdict) or a `Wait` (a prompt block another sequence is prefilling; sent nothing). A `SequenceBatch`
(batch.py) runs the same kind of yield of many sequences together.
"""
from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..sampling_params import SamplingParams
from ..step import Step
from .metrics import RequestMetrics

if TYPE_CHECKING:
    from .tiers import Tier


@dataclass(frozen=True)
class Wait:
    """What a tier's prefill yields instead of a step when it cannot go on yet: a block of the prompt that
    another sequence is prefilling right now will be in the prefix store after that sequence's next
    forward (cache/prefixes.py). `owner` is that sequence's tier, which holds the claim while its forward
    of the block waits in the batch; `stale` drops the claim, for a batch in which no forward of `owner`
    waits (its run went away without releasing it)."""
    owner: object
    stale: Callable[[], None]


@dataclass
class Forward:
    """What a sequence's run needs next: tier `level` of its hierarchy runs `step`. It is sent back the
    logits (Tier.forward's, per `logits_for`)."""
    tier: Tier
    level: int  # the tier's place in the engine's ladder, cheapest first (a batch runs the lowest first)
    step: Step
    logits_for: str = "all"


@dataclass
class Check:
    """What a sequence's run needs after the forward of a chain check: its proposals verified against the
    checker's rows. It is sent back (verdict, the checker's distributions [g + 1, V]); a `SequenceBatch`
    verifies every sequence waiting on one together (batch.check_together)."""
    draft_tokens: list[int]
    draft_probs: torch.Tensor  # [g, V]: the proposer's distribution for each proposal
    logits: torch.Tensor  # [g + 1, V]: the checker's, at each proposal and one past the last (penalized)
    params: SamplingParams
    generator: torch.Generator
    # The checker proposes in turn to a tier above: a row of its that is not finite is only checked there
    # (rejected), not an output's, so no error (speculation/sampling.py `sample`)
    proposal: bool = False


Run = Generator[Forward | Check | Wait, object, tuple[list[int], RequestMetrics]]
# tokens, the tier's distribution at each [V], and its model's logits there [V] (before temperature, top-k, top-p)
Produced = Generator[Forward | Check, object, tuple[list[int], list[torch.Tensor], list[torch.Tensor]]]
