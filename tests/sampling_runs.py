"""Thousands of seeded requests for a statistical test, run a few hundred at a time in one SequenceBatch:
a request's output is what it gives alone (tests/coordinator/test_batch.py), and the batch shares the
per-forward overhead that dominates tiny models' runs (a chi-square case ran about twice as fast)."""
from collections.abc import Callable, Iterable

from triforce.coordinator.batch import SequenceBatch
from triforce.coordinator.engine import Run

TOGETHER = 250  # requests per batch


def outputs(make_run: Callable[[int], Run], seeds: Iterable[int], together: int = TOGETHER) -> list[list[int]]:
    """The generated tokens of `make_run(seed)` (a HierarchyEngine.run) for each seed, in order."""
    seeds, out = list(seeds), []
    for first in range(0, len(seeds), together):
        batch = SequenceBatch()
        handles = [batch.add(make_run(seed)) for seed in seeds[first:first + together]]
        batch.run()
        out += [handle.result[0] for handle in handles]
    return out
