"""Forward costs measured on this machine: seconds per forward of a tier, by tokens per forward.

A cost is measured over the tier's cache as it is (filler tokens, rolled back after), the faster of two
rounds over the sizes asked for together (on a GPU, after two untimed: forward_seconds), and kept in the
process and on disk (`$TRIFORCE_HOME/calibration/costs-3.json`), keyed by machine (CPU model, kernel path and sources,
threads), tier (its name, its model's shape and dtype, whether a worker group runs it, its cache's size),
the context the forward attends over, and the batch: B sequences' forwards run as one call (the weights
read once for all, each sequence's own cache), measured as such a call of B sequences' tiers, n tokens
each.
So a machine calibrates a model once per context and batch size: a later request within
CONTEXT_TOLERANCE of a measured context reuses it. `--mode auto` (planning.py) plans from these costs;
`measure_costs` (trees.py) sizes trees from them.
"""
from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import torch

from ..cache.retrieval import RetrievalKVCache
from ..cache.streaming import StreamingKVCache
from ..models.cuda_graphs import CAPTURE_AT
from ..step import Step
from .calibration import CalibrationFile, finite_numbers
from .tiers import Tier, forward_together, settle

CONTEXT_TOLERANCE = 0.15  # a cost measured at context c serves contexts within 15% of c
ROUNDS = 2  # rounds over the sizes a measurement times (forward_seconds), each size's fastest kept


@functools.cache
def machine_key(device: str) -> str:
    """What makes this machine's forward costs on `device` ('cpu', 'cuda', 'cuda:1', ...) their own: for
    the CPU, its model, kernel path (and the kernels' sources) and threads, also on a machine with a GPU
    beside (a tier on its CPU runs the CPU kernels), and where torch's paths run, its ISA cap (TRIFORCE_CPU_ISA
    caps ATen's and oneDNN's too) and torch's version; for a GPU, its model (that GPU's: the current one's
    named every GPU of a machine with two kinds), torch's and CUDA's versions and whether CUDA graphs
    replay (TRIFORCE_CUDA_GRAPHS=0: small forwards then cost their kernels' launches); else the device
    type. (A stale entry was reused silently: only forwards 1.5x off the table dropped it.)"""
    from ..kernels.build import kernel_sources_digest
    from ..kernels.cpu import cpu_model, isa_level, kernel_path

    device_type = torch.device(device).type
    if device_type == "cuda":
        graphs = "off" if os.environ.get("TRIFORCE_CUDA_GRAPHS", "1") == "0" else "on"
        return (f"cuda:{torch.cuda.get_device_name(torch.device(device))}|torch={torch.__version__}|"
                f"cuda={torch.version.cuda}|graphs={graphs}")
    if device_type != "cpu":
        return device_type
    kernels = f"torch:{isa_level()}:{torch.__version__}" if kernel_path() == "torch" else \
        f"{kernel_path()}@{kernel_sources_digest()}"
    return f"{cpu_model()}|{kernels}|threads={torch.get_num_threads()}"


def model_key(model) -> str:
    """A model's shape, dtype and device type: what its forwards' costs depend on, the values aside."""
    cfg = model.config
    return (f"{cfg.model_type}:{cfg.num_layers}x{cfg.hidden_size}:{cfg.intermediate_size}:"
            f"{cfg.num_heads}/{cfg.num_kv_heads}x{cfg.head_dim}:{cfg.vocab_size}|"  # (head_dim: Qwen3's, Gemma's
            f"{model.dtype}|{model.device.type}")  # is not hidden_size / num_heads)


def tier_key(tier: Tier) -> str:
    """The tier's kind: its role, its model's shape and dtype, where it runs (this process, or a worker
    group of N ranks) and the part of its cache a forward reads."""
    key = f"{tier.name}|{model_key(tier.model)}"
    quantized = getattr(tier.model, "quantized", None)  # (an int8 twin reads half the weights: its own costs)
    if quantized:
        key += f"|{quantized}"
    if tier.placement != "local":
        key += f"|{tier.placement}"
    cache = getattr(tier, "cache", None)
    if isinstance(cache, RetrievalKVCache):
        key += f"|{cache.policy}:{cache.budget}/{cache.chunk_size}:{cache.full_layers}"
    return key


def cost_context(tier: Tier) -> int:
    """How many cached tokens a forward of `tier` reads, which is what its cost grows with."""
    cache = getattr(tier, "cache", None)
    if isinstance(cache, StreamingKVCache):
        return cache.sinks + cache.window  # a draft's window is full after its first few hundred tokens
    if isinstance(cache, RetrievalKVCache):
        # As it runs, synced with the target: an idle one holds nothing until its sync (keyed at 0, a
        # machine's first auto request measured it again at its next plan, in the middle of decoding).
        context = max(tier.length, cache.source.length)
        if cache.policy != "static":
            return context
        # its first full_layers layers read the whole context, the others the budget: their mean (keyed at
        # the budget alone, an entry measured at 4K stood for 32K, whose full layers read eight times as much)
        layers = tier.model.config.num_layers
        full = min(cache.full_layers, layers)
        return (full * context + (layers - full) * min(context, cache.budget)) // layers
    return tier.length


class CostTable(CalibrationFile):
    """Seconds per forward by (machine, tier, context, tokens): entries "machine||tier||context" ->
    {tokens: seconds}; `path` None keeps them in memory only."""

    # 2: a draft measured over a full window (before: an empty one); 3: a static retrieval tier keyed by the
    # mean of what its layers read (before: its budget, which entries measured at any context matched)
    filename = "costs-3.json"

    def __init__(self, path: Path | None = None):
        super().__init__(path)
        self._fresh: dict[str, set[str]] = {}  # per entry: the sizes measured here since its last save

    @staticmethod
    def valid(key: str, value) -> bool:
        """Entries "...||context" -> {tokens: seconds > 0}."""
        return key.rpartition("||")[2].isdecimal() and finite_numbers(value, 1e-12) and \
            all(n.isdecimal() for n in value)

    def merged(self, key: str, theirs: dict, ours: dict) -> dict:
        """The file's sizes with those this process measured since its last save over them: the others it
        holds are older reads of the file, which wrote back stale timings over another process's fresh
        ones (an entry measured again after `forget`)."""
        fresh = self._fresh.get(key, ours.keys())
        return {**theirs, **{n: ours[n] for n in fresh if n in ours}}

    def seconds(self, tiers: Tier | list[Tier], sizes: tuple[int, ...], prepare=None,
                batch: int | None = None) -> dict[int, float]:
        """Seconds per forward call of `tiers` (one tier; or the same tier of each sequence of a batch, each
        over its own cache) for each number of tokens per sequence in `sizes`, at the first one's current
        context, for a batch of `batch` sequences (default: as many as `tiers`; an entry the table lacks is
        measured, which takes that many); `prepare()` runs before any measurement (a retrieval cache's sync)."""
        tiers = [tiers] if isinstance(tiers, Tier) else list(tiers)
        batch = batch or len(tiers)
        key = self.entry_key(tiers[0], batch)
        known = self.entries.setdefault(key, {})
        missing = [n for n in sizes if str(n) not in known]
        if missing:
            if len(tiers) != batch:
                raise ValueError(f"measuring a batch of {batch} takes {batch} tiers, not {len(tiers)}")
            if prepare is not None:
                prepare()
            known.update((str(n), seconds) for n, seconds in forward_seconds(tiers, missing).items())
            self._fresh.setdefault(key, set()).update(str(n) for n in missing)
            self.save(key)
            if key not in self._changed:  # saved: the file holds them now (a first save too, which merges none)
                self._fresh.pop(key, None)
        return {n: known[str(n)] for n in sizes}

    def forget(self, key: str, planned: dict[int, float]) -> None:
        """Drops the entry `key` (`entry_key`: the one a plan read), so that the next request measures it
        again: a request found its forwards far from the costs it `planned` with (planning.py: a table
        measured in a slow or quiet spell of the machine would otherwise steer every later request; and
        scaling the entry by what one request saw, as before, once made a spell of that request's a tier's
        cost for good: the draft, priced 10x, never ran to show otherwise). Not if the entry changed since
        (another request forgot or measured it)."""
        entry = self.entries.get(key)
        if entry is None or any(entry.get(str(n)) != seconds for n, seconds in planned.items()):
            return
        self.drop(key)

    def known(self, tier: Tier, sizes: tuple[int, ...], batch: int = 1) -> bool:
        """Whether the table holds every size for `tier` at its context and this batch size (nothing to measure)."""
        entry = self.entries.get(self.entry_key(tier, batch), {})
        return all(str(n) in entry for n in sizes)

    def entry_key(self, tier: Tier, batch: int = 1) -> str:
        """The key of the entry that serves `tier` at its context now, for a batch of `batch`: the one measured
        nearest to the tier's context, if within CONTEXT_TOLERANCE; else a new one's."""
        context = cost_context(tier)
        batched = f"|batch={batch}" if batch > 1 else ""
        prefix = f"{machine_key(str(tier.model.device))}||{tier_key(tier)}{batched}||"
        near = [k for k in self.entries if k.startswith(prefix)
                and abs(int(k[len(prefix):]) - context) <= CONTEXT_TOLERANCE * max(context, 1)]
        return min(near, key=lambda k: abs(int(k[len(prefix):]) - context)) if near else f"{prefix}{context}"


def forward_seconds(tiers: list[Tier], sizes) -> dict[int, float]:
    """Seconds per forward of n filler tokens over each tier's cache, all in one call, for each n in `sizes`:
    ROUNDS rounds, each a forward of every size in turn (each cache rolled back after; a full cache's last
    query too), and per size the fastest; on a GPU after CAPTURE_AT untimed rounds (below). Then no size's
    cost exceeds a larger one's (`monotone`). Rounds, not each size's runs back to back, since this
    machine's speed moves by spells: the 2-core AVX2 EPYC's batch-8 table at 8K, sizes measured one after
    the other, held 293 / 399 / 309 ms for checks of 2 / 3 / 4 tokens a sequence, where a step ran 177 ms
    and `ar`'s steps took about 140, and so priced a check of 4 at 1.75x a step where 3 cost 2.3x.
    A cache that holds fewer tokens than the context its cost is kept for (a draft's window before its
    prefill: auto plans before it prefills the tiers it runs) is first filled with filler tokens, so that
    the forward reads as many keys as it will; measured empty, a draft's step cost about half what it does
    in a request. A forward that fails leaves every cache as it was too (a batch's leader measures its
    batchmates' tiers, which run on if it fails)."""
    lengths, spent = [t.length for t in tiers], [t.seconds for t in tiers]
    best = dict.fromkeys(sizes, float("inf"))
    saved = [t.query_state() for t in tiers]  # a full cache's last query (on a worker group: kept there)
    try:
        for tier, length in zip(tiers, lengths):
            missing = cost_context(tier) - length
            if missing > 0:
                for step in tier.prefill_steps([0] * missing):
                    forward_together([tier], [step], ["none"])
        filled = [t.length for t in tiers]
        # On a GPU a size's first CAPTURE_AT forwards over a cache run before its CUDA graph is captured, and
        # the capture in the last of them: untimed, so that the timed are replays, as requests run them
        untimed = CAPTURE_AT if any(torch.device(t.model.device).type == "cuda" for t in tiers) else 0
        for run in range(untimed + ROUNDS):
            for n in best:
                settle(tiers)  # (the filling forwards' work, queued on a GPU, is not this forward's)
                start = time.perf_counter()
                forward_together(tiers, [Step.chain([0] * n, length) for length in filled], ["all"] * len(tiers))
                if run >= untimed:
                    best[n] = min(best[n], time.perf_counter() - start)
                for tier, length in zip(tiers, filled):
                    tier.truncate(length)
    finally:
        for tier, length, state in zip(tiers, lengths, saved):
            tier.truncate(length)
            if state is not None:  # its last token's query, not the filler's
                tier.restore_query_state(state)
        for tier, seconds in zip(tiers, spent):
            tier.seconds = seconds  # a measurement, not the request's work
    return monotone(best)


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """Each size's cost at most every larger size's: a forward of more tokens does the same work and more,
    and a timing errs long (a busy spell) far more than short, so where a larger forward ran faster it
    bounds the smaller one's cost."""
    out, low = {}, float("inf")
    for n in sorted(costs, reverse=True):
        low = out[n] = min(costs[n], low)
    return {n: out[n] for n in costs}


def dense_costs(costs: dict[str, dict[int, float]], top: int) -> dict[str, dict[int, float]]:
    """Each tier's table with every size 1..top filled in by `interpolate` (which then reads them, as it
    would have computed them, without a sort and two scans per call)."""
    return {name: {**table, **{n: interpolate(table, n) for n in range(1, top + 1)}} for name, table in costs.items()}


def interpolate(costs: dict[int, float], n: int) -> float:
    """Seconds for n tokens from costs measured at some sizes: linear between the nearest two, and past the
    largest (or below the smallest) along the last (first) segment's slope where it rises, else flat: a
    falling last segment, noise on a GPU whose cost is flat, priced 129 tokens at nothing."""
    if n in costs:  # (before the sort: a plan asks this thousands of times, of tables that hold most n)
        return costs[n]
    sizes = sorted(costs)
    below = [s for s in sizes if s < n]
    above = [s for s in sizes if s > n]
    if len(sizes) < 2:
        return costs[sizes[0]]
    if below and above:
        a, b = below[-1], above[0]
        return costs[a] + (costs[b] - costs[a]) * (n - a) / (b - a)
    a, b = (sizes[-2], sizes[-1]) if below else (sizes[0], sizes[1])
    slope = max(0.0, (costs[b] - costs[a]) / (b - a))
    return costs[b] + slope * (n - b) if below else max(costs[a] - slope * (a - n), 0.0)
