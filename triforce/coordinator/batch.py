"""Many sequences through their hierarchies at once: the forward of every sequence at one tier as one call.

Each sequence is a `HierarchyEngine.run` generator (engine.py) that yields the forwards it needs and is
sent their logits; its decisions (what to propose, what to accept, every random draw) are its own. A
`SequenceBatch` repeatedly picks the cheapest tier that some sequence waits on and runs the forward of
every sequence waiting there in one model call (tiers.forward_together), so the weights are read once
for all of them. Sequences that need a cheaper tier first (a draft that must propose again after a
short acceptance) run it while the others wait at the dearer tier, which then checks them all together:
ragged acceptance costs waiting, never a wrong token. Each sequence waits a bounded number of cheaper
forwards per check, so none starves.

After the forward of a chain check a run yields a `Check`; the batch verifies every sequence waiting on
one in one call (`check_together`, `verify_chains`: the accept decisions and next-token distributions of
all of them computed together), and each sequence's draws still come from its own generator.

A run that yields a `Wait` (its prompt's next block is being prefilled by another sequence, for the
prefix store: cache/prefixes.py) is asked again after the step's forwards.

Sequences join (`add`) and leave (when their run returns, or raises: a RequestFailed, that request's own
fault, or any error in its own code between the batch's forwards, its caches' rebuild say, ends it alone;
an error in a forward the batch runs for many ends the step) between steps: continuous batching. A run's
output does not depend on its companions: its rows see only its own cache (LlamaModel.forward_batch),
and its random draws come from its own generator. (In mode auto a batch runs one plan, so which tiers a
seeded request's draws go through, and so its sample, may depend on the batch; its distribution does
not, and greedy output is the same. On a CPU, a call of more rows than the linear kernel takes, in pieces
too, pieced_max_rows, goes through torch's product, whose rounding depends on the row count: there a
greedy output can part from its solo one at a near-tie; docs/batches.md.)
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.linear import kernel_max_rows
from ..speculation.sampling import processed
from ..speculation.verify import ChainVerdict, verify_chains
from .runs import Check, Forward, Run, Wait
from .tiers import PROMPT_ROWS, forward_in_calls


@dataclass(eq=False)
class Sequence:
    """A run in the batch: `waiting` is the forward, check or wait it asked for; `result` its return value
    once done (raising the error that ended it instead, where one did)."""
    run: Run
    waiting: Forward | Check | Wait | None = None
    returned: tuple | None = None
    error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.waiting is None

    @property
    def result(self) -> tuple | None:
        if self.error is not None:
            raise self.error
        return self.returned


class SequenceBatch:
    def __init__(self, calls: Callable[[list, list[str]], list[list[int]]] | None = None):
        """`calls`: which of a group's forwards run as one model call (default: `prompt_chunks_apart`)."""
        self.active: list[Sequence] = []
        self.calls = prompt_chunks_apart if calls is None else calls

    def add(self, run: Run) -> Sequence:
        """Starts `run` (it runs up to its first forward) and returns its handle."""
        seq = Sequence(run)
        self._advance(seq, None, first=True)
        if not seq.done:
            self.active.append(seq)
        return seq

    def step(self) -> list[Sequence]:
        """Runs one forward for every sequence waiting at the cheapest tier any waits at; returns the
        sequences that finished."""
        if not self.active:
            return []
        waits = [s for s in self.active if isinstance(s.waiting, Wait)]
        ready = [s for s in self.active if not isinstance(s.waiting, Wait)]  # forwards (checks ran last step)
        holders = {id(s.waiting.tier) for s in ready}
        for s in waits:
            if id(s.waiting.owner) not in holders:  # the block's claim has no forward here: its owner is gone
                s.waiting.stale()
        level = min((s.waiting.level for s in ready), default=None)
        groups: dict[tuple, list[Sequence]] = defaultdict(list)
        for s in ready:
            if s.waiting.level == level:
                groups[type(s.waiting.tier), id(s.waiting.tier.model)].append(s)
        for group in groups.values():
            asks = [s.waiting for s in group]
            tiers, steps, wants = [a.tier for a in asks], [a.step for a in asks], [a.logits_for for a in asks]
            logits = forward_in_calls(tiers, steps, wants, self.calls(tiers, wants))
            for s, out in zip(group, logits):
                self._advance(s, out)
        while checks := [s for s in self.active if isinstance(s.waiting, Check)]:
            began = time.perf_counter()
            results = check_together([s.waiting for s in checks])
            share = (time.perf_counter() - began) / len(checks)  # (each run's own time: runs.OwnTime)
            for s, result in zip(checks, results):
                s.waiting.seconds = share
                self._advance(s, result)
        for s in waits:  # after the forwards: the blocks waited on may be stored now
            self._advance(s, None)
        finished = [s for s in self.active if s.done]
        self.active = [s for s in self.active if not s.done]
        return finished

    def run(self) -> None:
        """Steps until every sequence has finished."""
        while self.active:
            self.step()

    @staticmethod
    def _advance(seq: Sequence, logits, first: bool = False) -> None:
        try:
            seq.waiting = next(seq.run) if first else seq.run.send(logits)
        except StopIteration as done:
            seq.waiting, seq.returned = None, done.value
        except Exception as error:  # noqa: BLE001 (raised in this run's own code: it alone ends; the others
            # went on before, and a server failed them all, finished ones too, with a 500)
            seq.waiting, seq.error = None, error


def prompt_chunks_apart(tiers: list, logits_for: list[str]) -> list[list[int]]:
    """Which of a group's forwards run as one model call: all, except that on a CPU whose kernels take the
    few rows of decode steps and checks, each prompt chunk (a prefill, a catch-up) runs alone. Its rows
    would take the call past the kernels' rows into torch's product, whose rounding depends on how many
    rows it multiplies: beside a chunk the others rounded otherwise than alone, in bfloat16 enough to change
    a greedy answer when a long prompt arrived, and the chunk otherwise than in its prompt alone. A chunk
    costs far more than reading the weights once more. On a GPU, where mixing them is what fills the
    device, and for a worker group, which prefills a chunk in a request of its own, they stay together."""
    tier = tiers[0]
    apart = [i for i, want in enumerate(logits_for) if want in PROMPT_ROWS]
    if not apart or len(tiers) == 1 or tier.placement != "local" or tier.model.device.type != "cpu" \
            or kernel_max_rows() == 0:
        return [list(range(len(tiers)))]
    rest = [i for i in range(len(tiers)) if i not in apart]
    return ([rest] if rest else []) + [[i] for i in apart]


def check_together(checks: list[Check]) -> list[tuple[ChainVerdict, torch.Tensor]]:
    """Verifies many sequences' chains in one `verify_chains`: (verdict, the checker's distributions
    [g + 1, V]) for each."""
    target = [processed(c.logits, c.params) for c in checks]
    verdicts = verify_chains([c.draft_tokens for c in checks], [c.draft_probs for c in checks], target,
                             [c.generator for c in checks], [c.params.greedy for c in checks],
                             [c.proposal for c in checks])
    return list(zip(verdicts, target))
