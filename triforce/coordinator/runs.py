"""What a sequence's run (HierarchyEngine.run, a generator) yields to the batch that drives it, and what it
is sent back: a `Forward` (a tier's step; sent its logits), a `Check` (a chain to verify; sent the
verdict) or a `Wait` (a prompt block another sequence is prefilling; sent nothing). A `SequenceBatch`
(batch.py) runs the same kind of yield of many sequences together.
"""
from __future__ import annotations

import time
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
    seconds: float = 0.0  # its share of a batch's verification, set by the batch (its run's OwnTime counts it)


class OwnTime:
    """The seconds a run spends in its own code (sampling, verification, bookkeeping): not suspended at its
    yields, where its driver runs its forwards and a batch its batchmates', plus each Check's share of the
    batch's verification. Beside batchmates a request's time between its forwards holds theirs; this is
    its own part (mode auto's overhead between forwards: auto.py)."""

    def __init__(self):
        self.seconds, self._since = 0.0, None

    def now(self) -> float:
        """Its own seconds so far, the stretch running now included."""
        return self.seconds + (0.0 if self._since is None else time.perf_counter() - self._since)

    def timed(self, run: Generator):
        """`run`, its own time counted (what it yields, is sent and returns pass through)."""
        sent, error = None, None
        while True:
            self._since = time.perf_counter()
            try:
                item = run.send(sent) if error is None else run.throw(error)
            except StopIteration as done:
                return done.value
            finally:
                self.seconds += time.perf_counter() - self._since
                self._since = None
            sent, error = None, None
            try:
                sent = yield item
            except GeneratorExit:
                run.close()
                raise
            except BaseException as thrown:  # noqa: BLE001 (thrown into the run, as `yield from` would)
                error = thrown
            self.seconds += item.seconds if isinstance(item, Check) else 0.0


Run = Generator[Forward | Check | Wait, object, tuple[list[int], RequestMetrics]]
# tokens, the tier's distribution at each [V], and its model's logits there [V] (before temperature, top-k, top-p)
Produced = Generator[Forward | Check, object, tuple[list[int], list[torch.Tensor], list[torch.Tensor]]]
