"""A tier is a model reading one KV cache policy. The engine sees only this small interface:
`length`, `forward(step) -> logits`, `truncate(length)`, `keep_path(start, path)`, `sync()`,
`prefill_steps(tokens)`, `scoring_steps(tokens)` (the target's, for a prompt's log-probabilities); the
engine builds every forward's `Step` (tokens, positions, mask).
`forward_together` runs the forwards of several sequences' tiers of one kind as one model call.

The target tier sits behind the `Verifier` seam (verifier.py) and offers the same interface, so the
engine never knows whether the target runs in this process or across a tensor-parallel worker group.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence

import torch

from ..cache.base import KVCache
from ..cache.retrieval import RetrievalKVCache
from ..config import PREFILL_CHUNK
from ..models.llama import LlamaModel
from ..step import Step
from .runs import Wait


PROMPT_ROWS = ("none", "prompt")  # what forwards of prompt chunks ask for (Tier.forward)


class Tier:
    """A model + cache policy that computes its own KV (the draft tier; the local target)."""

    placement = "local"  # where its forwards run, for the forward costs measured on this machine (costs.py)
    shared_prefill = 0  # prompt tokens of other sequences that its last forward's call ran too

    def __init__(self, name: str, model: LlamaModel, cache: KVCache, prefill_chunk: int = PREFILL_CHUNK):
        self.name, self.model, self.cache, self.prefill_chunk = name, model, cache, prefill_chunk
        self.seconds = 0.0

    @property
    def length(self) -> int:
        return self.cache.length

    def prefill_steps(self, tokens: list[int], progress=None) -> Iterator[Step]:
        """The forwards (logits unused) that bring this tier's cache through `tokens`: chunks of prefill_chunk
        tokens (bounded attention memory), each built when the one before has run. Tokens the cache would
        evict unread are skipped (a streaming cache keeps its sinks and the last window only)."""
        end, fed = self.length + len(tokens), 0
        while fed < len(tokens):
            skip = min(self.cache.skippable(end), len(tokens) - fed)
            if skip:
                self.cache.skip(skip)
            else:
                size = min(self.prefill_chunk, self.cache.before_skip(end) or self.prefill_chunk)
                step = Step.chain(tokens[fed:fed + size], self.length, self.model.device)
                yield step
                skip = step.n
            fed += skip
            if progress is not None:
                progress.update(skip)

    @property
    def scoring_chunk(self) -> int:
        """Tokens per forward of `scoring_steps`."""
        return self.prefill_chunk

    def scoring_steps(self, tokens: list[int], progress=None) -> Iterator[Step]:
        """Forwards through `tokens` whose logits are read (a prompt's log-probabilities): chunks of
        scoring_chunk, every token run (none skipped or restored)."""
        for fed in range(0, len(tokens), self.scoring_chunk):
            step = Step.chain(tokens[fed:fed + self.scoring_chunk], self.length, self.model.device)
            yield step
            if progress is not None:
                progress.update(step.n)

    def prefill(self, tokens: list[int], progress=None) -> None:
        """Alone, outside any batch: nobody else prefills, so a claim waited on is stale."""
        for step in self.prefill_steps(tokens, progress):
            if isinstance(step, Wait):
                step.stale()
            else:
                self.forward(step, "none")

    def forward(self, step: Step, logits_for: str = "all") -> torch.Tensor | None:
        """Appends the step's tokens (step.start must be `length`); returns their next-token logits [n, V]
        as float32 on the CPU (logits_for as LlamaModel.forward takes it, or "prompt": all rows of a prompt
        chunk being scored, which `charge_call` counts as prompt tokens as it does "none")."""
        return self.forward_many([self], [step], [logits_for])[0]

    @staticmethod
    def forward_many(tiers: Sequence["Tier"], steps: Sequence[Step], logits_for: Sequence[str]) -> list:
        """The forwards of several sequences' tiers of this class and model as one call (forward_together):
        one model call in this process. Every tier is charged the call's time (charge_call)."""
        start = time.perf_counter()
        wants = ["all" if want == "prompt" else want for want in logits_for]
        logits = tiers[0].model.forward_batch(steps, [t.cache for t in tiers], wants)
        logits = [None if x is None else x.cpu() for x in logits]
        elapsed = time.perf_counter() - start
        charge_call(tiers, steps, logits_for, elapsed)
        return logits

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)

    def query_state(self):
        """What a retrieval choice reads of this tier's last forward (a full cache's last query), to put back
        with `restore_query_state` after forwards rolled back whole (a cost measurement's filler tokens,
        whose last row a rebuild would otherwise score chunks with); None where the tier keeps none."""
        return None

    def restore_query_state(self, state) -> None:
        """Puts back what `query_state` returned."""

    def keep_path(self, start: int, path: list[int]) -> None:
        """Keeps entries [0, start) and then start + path[i] (an accepted tree path), drops the rest."""
        self.cache.keep_path(start, path)

    def sync(self) -> None:
        self.cache.sync()

    def release(self) -> None:
        """Mode auto leaves this tier idle: it frees what it can rebuild when it runs again (a retrieval
        cache); a tier that would have to compute its cache again keeps it."""

    def observe(self, proposed: int, accepted: int) -> None:
        """Told how many of this tier's proposals the tier above accepted (used by adaptive tiers)."""

    @property
    def rebuilds(self) -> int:
        """Retrieval cache rebuilds so far (0 for tiers without one)."""
        return 0


class RetrievalTier(Tier):
    """The target's weights over a RetrievalKVCache built from the target's full cache.

    Its prefill is a sync from that cache (no forward of its own). With the static policy it asks for a
    rebuild when the target's acceptance of its proposals over the last `window` drops below `threshold`:
    a sign that the chunks chosen no longer serve the current queries. (Not the draft's acceptance by
    this tier: a weak draft says nothing about the cache.)
    """

    def __init__(self, model: LlamaModel, cache: RetrievalKVCache, threshold: float, window: int,
                 name: str = "retrieval"):
        super().__init__(name, model, cache)
        self.threshold, self.recent = threshold, deque(maxlen=window)
        self._rebuild_pending = False

    def prefill_steps(self, tokens: list[int], progress=None) -> Iterator[Step]:
        self.cache.sync()
        yield from ()

    def observe(self, proposed: int, accepted: int) -> None:
        self.recent.extend([1] * accepted + [0] * (proposed - accepted))
        full = len(self.recent) == self.recent.maxlen
        if self.cache.policy == "static" and full and sum(self.recent) < self.threshold * len(self.recent):
            self._rebuild_pending = True

    @property
    def rebuilds(self) -> int:
        return self.cache.rebuilds

    def release(self) -> None:
        """Empties the cache, which its next sync rebuilds from the target's (a fresh choice of chunks)."""
        self.cache.reset()
        self.recent.clear()
        self._rebuild_pending = False

    def sync(self) -> None:
        built = self.cache.rebuilds
        self.cache.sync()
        if self._rebuild_pending:
            if self.cache.rebuilds == built:  # (the sync's own refresh has just chosen afresh)
                self.cache.rebuild()
            self.recent.clear()
            self._rebuild_pending = False


def settle(tiers: Sequence[Tier]) -> None:
    """Waits for the GPU work the tiers' forwards queued (nothing on a CPU, whose forwards end with their
    work): a clock read after forwards whose logits nobody read (a prefill's) stopped before their work did."""
    for device in {t.model.device for t in tiers if t.model is not None}:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)


def charge_call(tiers: Sequence[Tier], steps: Sequence[Step], logits_for: Sequence[str], seconds: float) -> None:
    """Each tier of one call is charged its time, and told how many prompt tokens of the others' (forwards
    whose logits nobody reads: prefill chunks) it ran beside, which a cost observed then includes."""
    prompt = sum(s.n for s, lf in zip(steps, logits_for) if lf in PROMPT_ROWS)
    for tier, step, want in zip(tiers, steps, logits_for):
        tier.seconds += seconds
        tier.shared_prefill = prompt - (step.n if want in PROMPT_ROWS else 0)


def forward_in_calls(tiers: Sequence[Tier], steps: Sequence[Step], logits_for: Sequence[str],
                     calls: list[list[int]]) -> list:
    """forward_together of the forwards in each of `calls` (lists of indices that partition them), charged
    as one call (charge_call): each tier the seconds of all, and the prompt rows of the others' it waited
    for, as when they share a call (mode auto learns what a batchmate's prefill costs a decode step)."""
    if len(calls) == 1:
        return forward_together(tiers, steps, logits_for)
    spent, out = [t.seconds for t in tiers], [None] * len(tiers)
    start = time.perf_counter()
    for call in calls:
        logits = forward_together([tiers[i] for i in call], [steps[i] for i in call], [logits_for[i] for i in call])
        for i, x in zip(call, logits):
            out[i] = x
    elapsed = time.perf_counter() - start
    for tier, seconds in zip(tiers, spent):
        tier.seconds = seconds
    charge_call(tiers, steps, logits_for, elapsed)
    return out


def forward_together(tiers: Sequence[Tier], steps: Sequence[Step], logits_for: Sequence[str]) -> list:
    """One forward for each of several sequences at the same kind of tier (tiers[i], each with its own cache,
    takes steps[i]): one call for all where the tiers are of one class and run one model (in this process,
    or in one worker group: the class's `forward_many`), each tier's own forward otherwise."""
    kind = type(tiers[0])
    if not all(type(t) is kind and t.model is tiers[0].model for t in tiers):
        return [t.forward(s, lf) for t, s, lf in zip(tiers, steps, logits_for)]
    return kind.forward_many(tiers, steps, logits_for)
