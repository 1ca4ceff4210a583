"""What one request's forwards really take, for `--mode auto`'s plans (planning.py).

The cost table (costs.py) times a tier's forwards back to back, once per machine, model, context and batch
size. A request scales them by what its own forwards took: per tier (the machine may be busier or quieter
than when the table was measured), and per mode (a tier interleaved with others in a speculative mode runs
slower than one stepping alone, as `ar` runs the target and the table measures it: Qwen2.5-Coder-1.5B at
32K, about 10% in `triforce` mode), so a mode that ran is planned at what its own forwards took, one that
has not at what the tier's took lately. Idle, a mode's scales fade towards the tier's, and an idle tier's
towards the table's (`fade`). A request that found a tier far off the table has its entry measured again
by the next (`remeasure`).

Beside the forwards themselves: what passes from the end of one forward to the next past the modelled
cost of its rows (sampling, prompt lookup, verification, bookkeeping) is each tier's overhead in its role
(it proposes: "bottom", as `ar`'s target does too; it checks the tier below: "check"), as each mode runs
it (a mode not run yet: as any did), added to that tier's forwards; a chain of gamma pays its bottom
tier's gamma times, which one speed factor per mode would spread over every gamma alike. That time is
each sequence's own, so a batch pays it once per member and forward, not once per call: measured alone as
the wall time between forwards, beside batchmates (whose forwards that time holds) as the run's own time
(runs.OwnTime), and charged to every sequence's forwards. Charged per call, as it was until 2026-12-06,
a batch of 8 at 8K and 0.6 on the AMX Xeon (`benchmarks/batch_timeline.py`,
`benchmarks/results/issue12/amx7/timeline_b8_emma_t06.json`) was priced 0.38 s of it in `triforce`,
0.24 s in `draft` and 0.09 s in `ar`, where 2.67 s, 1.54 s and 0.31 s passed outside its model calls and
in verification (decodes of about 15 s; `benchmarks/batch_accounting.py`); per sequence, at the
overheads its kind had measured alone, 3.04 s, 1.95 s and 0.73 s: about 2.5% of the decode over in each
mode, where per call it was 15%, 8% and 1.5% under, and mode auto took `triforce` for the faster mode
there. And what a batchmate's prompt chunk adds to a target call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .costs import CostTable, interpolate
from .speed_model import mode_stack, stack_mode, tier_kind

SMOOTHING = 0.2  # weight of each observed forward in a tier's cost scale, overhead and chunk cost
REMEASURE_BEYOND = 1.5  # a request whose forwards took this many times the table's (or 1 / this) has it...
REMEASURE_FORWARDS = 20  # ...measured again by the next request, after at least this many of them


def role_at(level: int) -> str:
    """A tier's role at `level` of its stack (0: the bottom): it proposes, or it checks the tier below."""
    return "check" if level else "bottom"


@dataclass
class ForwardTimes:
    """Seconds per forward of a request's tiers as its modes run them (the module docstring)."""
    table: CostTable
    costs: dict[str, dict[int, float]] = field(default_factory=dict)  # the table's per call, at the last plan
    batch: int = 1  # the batch size of the last plan: costs per sequence are per call / batch
    evidence: bool = True  # whether the forwards since the last plan may scale the costs (not where
    # another batch size's costs stood in for the batch's own: planning.AutoPlanner.costs)
    scale: dict[str, float] = field(default_factory=dict)  # per tier: seconds observed / seconds in the table
    mode_scale: dict[str, dict[str, float]] = field(default_factory=dict)  # the same, per mode that ran
    overhead: dict[str, float] = field(default_factory=dict)  # per "tier/role": seconds between forwards
    chunk_seconds: float | None = None  # what a batchmate's prompt chunk adds to a target forward (observed)
    scaled: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)  # per mode, per tier:
    # seconds per forward per sequence of the batch, as the last plan was made with
    keys: dict[str, str] = field(default_factory=dict)  # per tier: the table's entry that `costs` came from
    ran_batch: int = 1  # the batch the last plan's forwards ran in: `batch`, or more where its costs stood in
    _forwards: dict[str, int] = field(default_factory=dict)  # per tier: forwards that fed its cost scale

    def plan_with(self, costs: dict[str, dict[int, float]], batch: int, stacks: list[tuple[str, ...]],
                  evidence: bool = True, keys: dict[str, str] | None = None, ran_batch: int | None = None) -> None:
        """A plan is made from the table's `costs` per call for a batch of `batch` (its entries `keys`), for
        these stacks, its forwards run in a batch of `ran_batch` (default `batch`); `evidence`: whether its
        forwards may scale those costs."""
        self.costs, self.batch, self.evidence = costs, batch, evidence
        self.keys, self.ran_batch = keys or {}, batch if ran_batch is None else ran_batch
        self.scaled = {stack_mode(stack): {name: self._scaled(stack_mode(stack), name) for name in stack}
                       for stack in stacks}

    def per_sequence(self, stack: tuple[str, ...], chunk: float = 0.0, now: bool = False) -> dict[str, dict[int, float]]:
        """Seconds per forward per sequence of the batch of each tier of `stack`, as its mode runs them,
        with each tier's overhead in its role there (every sequence's own: the module docstring), and a
        batchmate's prompt `chunk` on every target call; as the last plan was made with, or with `now`, as
        the forwards since have scaled them."""
        out, mode = {}, stack_mode(stack)
        for level, name in enumerate(stack):
            key = f"{name}/{role_at(level)}"  # (this mode's own where it ran: see observe_overhead)
            extra = self.overhead.get(f"{mode}:{key}", self.overhead.get(key, 0.0)) + \
                (chunk / self.batch if name == "target" else 0.0)
            scaled = self._scaled(mode, name) if now else self.scaled[mode][name]
            out[name] = {n: c + extra for n, c in scaled.items()}
        return out

    def fade(self, running: str | None, kept: float) -> None:
        """At each plan: an idle mode's cost scales fade towards the tiers' own and an idle tier's towards
        the table (a tier that a slow spell made look dear is tried again; a retrieval tier towards the
        target's scale: `_idle_scale`), keeping `kept` of the gap."""
        active = mode_stack(running) if running else ()
        for name, scale in self.scale.items():
            if name not in active:
                idle = self._idle_scale(name)
                self.scale[name] = idle + (scale - idle) * kept
        for mode, by_tier in self.mode_scale.items():
            if mode != running:
                for name, scale in by_tier.items():
                    tier = self.scale.get(name, self._idle_scale(name))
                    by_tier[name] = tier + (scale - tier) * kept

    def observe_cost(self, running: str | None, name: str, tokens: int, seconds: float) -> None:
        """A forward of the request took `seconds` while mode `running` ran: the tier's costs (and that
        mode's) are scaled towards what it really takes now. Not by a forward of a size outside those
        measured, whose cost is a guess (the draft, measured at 1 token, was scaled by its 2-token forwards
        after a chain accepted whole, as if it had slowed down)."""
        measured = self.costs.get(name)
        if measured and min(measured) <= tokens <= max(measured) and seconds > 0 and self.evidence:
            ratio = seconds / max(interpolate(measured, tokens), 1e-9)
            if running is not None:
                own = self.mode_scale.setdefault(running, {})
                own[name] = (1 - SMOOTHING) * own.get(name, self.scale.get(name, self._idle_scale(name))) \
                    + SMOOTHING * ratio
            self.scale[name] = (1 - SMOOTHING) * self.scale.get(name, self._idle_scale(name)) + SMOOTHING * ratio
            self._forwards[name] = self._forwards.get(name, 0) + 1

    def observe_overhead(self, running: str | None, name: str, role: str, seconds: float, rows: int,
                         row_seconds: float) -> None:
        """`seconds` passed from the end of a forward of tier `name` as `role` to the next forward, which
        processed `rows` rows of its logits at `row_seconds` each (modelled apart): the rest is the tier's
        overhead in that role, kept for mode `running` apart ("mode:tier/role") and for any mode
        ("tier/role", which a mode that has not run is planned with). A mode's own: the time after a target
        check in `triforce` holds the retrieval tier's sync and rebuilds, which `draft` mode, whose target
        checks the same way, was charged for (SmolLM2 + yarn:4 at 32K, where `draft` is the best mode)."""
        extra = max(0.0, seconds - rows * row_seconds)
        for key in (f"{name}/{role}",) + ((f"{running}:{name}/{role}",) if running else ()):
            old = self.overhead.get(key)
            self.overhead[key] = extra if old is None else (1 - SMOOTHING) * old + SMOOTHING * extra

    def observe_chunk(self, tokens: int, seconds: float) -> None:
        """A target forward of `tokens` took `seconds` beside a batchmate's prompt chunk: what the chunk
        added, over what the forward alone costs now."""
        alone = self.costs.get("target")
        if alone:
            added = max(0.0, seconds - interpolate(alone, tokens) * self.scale.get("target", 1.0))
            self.chunk_seconds = added if self.chunk_seconds is None else \
                (1 - SMOOTHING) * self.chunk_seconds + SMOOTHING * added

    def remeasure(self) -> None:
        """The request ends: a tier whose forwards took REMEASURE_BEYOND times what the table says (after
        REMEASURE_FORWARDS of them), or less than 1 / that, has its entry measured again by the next request
        (the table is measured once per context, perhaps in a slow spell of a shared machine). Not where the
        forwards ran in a larger batch than the entry's (no batchmate to measure that size with: a lone
        request's costs stood in, and are not wrong for being slower than its batch's forwards); the entry
        the last plan read, wherever the context has moved since."""
        if self.ran_batch != self.batch:
            return
        for name, factor in self.scale.items():
            far = not 1 / REMEASURE_BEYOND < factor < REMEASURE_BEYOND
            if far and self._forwards.get(name, 0) >= REMEASURE_FORWARDS and name in self.keys:
                self.table.forget(self.keys[name], self.costs[name])

    def state(self) -> dict:
        """For a decision's record: the scales, the overheads and the forward costs planned with (ms)."""
        return {"cost_scale": {n: round(x, 3) for n, x in self.scale.items()},
                "mode_cost_scale": {m: {n: round(x, 3) for n, x in by_tier.items()}
                                    for m, by_tier in self.mode_scale.items()},
                "overhead_ms": {k: round(1e3 * x, 3) for k, x in self.overhead.items()},
                "forward_ms": {n: {k: round(1e3 * v * self.scale.get(n, self._idle_scale(n)) / self.batch, 2)
                                   for k, v in c.items()} for n, c in self.costs.items()}}

    def _scaled(self, mode: str, name: str) -> dict[int, float]:
        """Tier `name`'s seconds per forward, per sequence of the batch, as `mode` runs it: the table's scaled
        by what its forwards took while `mode` ran, or, where `mode` has not run, lately in any mode."""
        scale = self.mode_scale.get(mode, {}).get(name, self.scale.get(name, self._idle_scale(name)))
        return {n: c * scale / self.batch for n, c in self.costs[name].items()}

    def _idle_scale(self, name: str) -> float:
        """What a tier that has not run lately is taken to take against the table: the table's (1), but a
        retrieval tier the target's scale (the same weights and kernels over fewer keys: where the target's
        forwards ran at 1.2x the table, one priced at the table looked a sixth cheaper than it was)."""
        return self.scale.get("target", 1.0) if tier_kind(name) == "retrieval" else 1.0


def row_seconds(probs, vocab: int, sample: torch.Tensor | None = None, rows: int = 8) -> float:
    """Seconds per row of `probs` (logits [n, V] -> distributions), the faster of two runs over `rows` rows:
    copies of `sample`, a model's row of logits [1, vocab], where one is given, else random ones; on the CPU.
    Top-p's cost depends on the row: it ranks a model's few likely tokens, and sorts a random row's whole
    vocabulary (speculation/sampling.top_p_dropped), 0.12 against 2.1 ms a row of SmolLM2's at 0.6 and 0.9."""
    if sample is not None:
        logits = sample[-1:].float().cpu().expand(rows, vocab).contiguous()
    else:
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        probs(logits)
        best = min(best, time.perf_counter() - start)
    return best / rows
