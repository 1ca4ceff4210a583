"""Thousands of seeded requests for a statistical test, run a few hundred at a time in one SequenceBatch:
a request's output is what it gives alone (tests/coordinator/test_batch.py), and the batch shares the
per-forward overhead that dominates tiny models' runs (a chi-square case ran about twice as fast).

On a CPU whose kernels take decode steps, a batch runs each prompt chunk in a model call of its own
(batch.prompt_chunks_apart: so that its rows round as they do alone, which greedy output needs). Here the rows of
every prompt chunk of a step share one call instead: in float32 rounding moves no distribution these
tests check (in bfloat16 a call's rows rounded by how many it held, enough to move top-k's cut at a
near-tie: benchmarks/distribution_fuzz.py runs those requests `as_alone`), and a few hundred prefills of
one short prompt in one call took a quarter off a chi-square case's time (500 runs of the triforce + tree case of test_selection_sampling on the 2-core EPYC: 8.1 s -> 5.9 s).
"""
from collections.abc import Callable, Iterable

from triforce.coordinator.batch import SequenceBatch
from triforce.coordinator.runs import Run

TOGETHER = 250  # requests per batch
# bfloat16 runs that must round as alone: requests per batch whose calls stay within the kernels' 192 rows
# (a few dozen rows each at most), with each prompt chunk in a call of its own (SequenceBatch's default)
AS_ALONE = 4


def _one_call(tiers: list, logits_for: list[str]) -> list[list[int]]:
    return [list(range(len(tiers)))]


def outputs(make_run: Callable[[int], Run], seeds: Iterable[int]) -> list[list[int]]:
    """The generated tokens of `make_run(seed)` (a HierarchyEngine.run) for each seed, in order."""
    return [tokens for tokens, _ in results(make_run, seeds)]


def results(make_run: Callable[[int], Run], seeds: Iterable[int], as_alone: bool = False) -> list[tuple]:
    """(generated tokens, metrics) of `make_run(seed)` for each seed, in order, TOGETHER to a batch with every
    prompt chunk of a step in one call; `as_alone`: AS_ALONE to a batch, each prompt chunk in a call of its
    own, so that every request rounds as it does alone (bfloat16)."""
    seeds, out = list(seeds), []
    together = AS_ALONE if as_alone else TOGETHER
    for first in range(0, len(seeds), together):
        batch = SequenceBatch() if as_alone else SequenceBatch(calls=_one_call)
        handles = [batch.add(make_run(seed)) for seed in seeds[first:first + together]]
        batch.run()
        out += [handle.result for handle in handles]
    return out
