"""What the cost model leaves out, per mode (mode auto; planning.py's docstring): the speed a mode really
reached over the rounds it ran, against what the model predicted for those rounds at the acceptance their
own checks saw. A mode's later predictions are scaled by that factor.

The factor pools a mode's stretches: tokens over the tokens its model would have made in their time (the
stretches' ratios averaged harmonically, by tokens), from a start worth START_TOKENS tokens (1, or what
earlier requests of the kind measured: priors.py). A stretch is 8 rounds, and what it reaches is noisy:
SmolLM2 at 4K of *Emma* and 0.6 on the Zen 4 (`python benchmarks/auto_why.py --seeds 0 1 2 3
--stretches`), `draft` mode's stretches ran at 0.73-1.41 of the model, 1.14 on average (its chains stop
early where the draft is unsure, which the model left out then; since priced: speed_model.py), `triforce`'s at 0.84-1.04. Each stretch had
moved the factor halfway to its own ratio: the draft's ended one request at 0.89 after a stretch at
0.73, the next request started from that, and `triforce`, 0.78x `draft` there over 8 seeds
(benchmarks/results/issue14/lookup/fit/), ran most of it. The running
mode's evidence fades by RUNNING_KEPT per plan (the text and context move slowly); an idle mode's as the
planner's acceptance evidence does, by the tokens committed (alone: back towards the start, so a mode a
slow spell made look poor is tried again; in a batch it holds)."""
from __future__ import annotations

START_TOKENS = 16.0  # what a mode's starting factor is worth, in tokens of its stretches
RUNNING_KEPT = 0.95  # of the running mode's evidence, at each plan
START_RANGE = (0.25, 4.0)  # a start from earlier requests is taken within this (a file's 1e-12 locked a mode out)


class RealizedSpeed(dict):
    """Per mode: tokens/s reached / tokens/s predicted. `measured`: the modes this request measured itself
    (the others' factors came from earlier requests: priors.py)."""

    def __init__(self):
        super().__init__()
        self.measured: set[str] = set()
        self._start: dict[str, float] = {}  # per mode: the factor it starts from (`recall`; else 1)
        self._evidence: dict[str, tuple[float, float]] = {}  # per mode: tokens, and tokens / ratio
        self._together: bool | None = None  # whether the evidence was seen beside batchmates (`fade`)

    def recall(self, factors: dict[str, float]) -> None:
        """Earlier requests' factors: where each mode starts."""
        low, high = START_RANGE
        self._start.update({mode: min(max(x, low), high) for mode, x in factors.items()})
        for mode in factors:
            self._settle(mode)

    def observe(self, mode: str, ratio: float, tokens: float) -> None:
        """`mode` ran at `ratio` of its prediction over its last stretch, of `tokens` tokens."""
        made, modelled = self._evidence.get(mode, (0.0, 0.0))
        self._evidence[mode] = (made + tokens, modelled + tokens / ratio)
        self.measured.add(mode)
        self._settle(mode)

    def fade(self, running: str | None, kept: float | None, together: bool = False) -> None:
        """At each plan: the running mode's evidence keeps RUNNING_KEPT, each idle mode's `kept` (None: all
        of it). Evidence seen alone and beside batchmates (`together`: the factors then carry what the model
        leaves out of a batch's rounds) is not pooled: where that changed, each mode
        starts again."""
        if together != self._together:
            if self._together is not None:
                self._evidence.clear()
                for mode in self:
                    self._settle(mode)
            self._together = together
        for mode, (made, modelled) in self._evidence.items():
            keep = RUNNING_KEPT if mode == running else kept
            if keep is not None:
                self._evidence[mode] = (made * keep, modelled * keep)
                self._settle(mode)

    def _settle(self, mode: str) -> None:
        made, modelled = self._evidence.get(mode, (0.0, 0.0))
        start = self._start.get(mode, 1.0)
        self[mode] = (START_TOKENS + made) / (START_TOKENS / start + modelled)

    def factor(self, mode: str, together: bool) -> float:
        """How a mode's speed compares with its prediction: measured where it ran; else, for a speculative
        mode, the mean of the speculative modes that ran (verification's overhead is the best guess at its
        own, and favours no mode untried); with none run, 1 alone, but run `together` with batchmates
        `ar`'s where that is below 1 (what slows a batch's round of plain decoding beyond the model slows a
        speculative one too: at batch 2 on the AVX2 EPYC, its overhead between forwards unmeasured then,
        `ar` ran at 0.82 of its model, and an untried mode kept at 1 was tried on that margin alone; alone
        `ar`'s factor is its own, and taking it moved 8K greedy there from `draft` to a 0.81x
        detour); for `ar`, which verifies nothing, 1."""
        if mode in self:
            return self[mode]
        seen = [x for m, x in self.items() if m != "ar"]
        if mode == "ar" or not (seen or together):
            return 1.0
        return sum(seen) / len(seen) if seen else min(1.0, self.get("ar", 1.0))

    def own(self) -> dict[str, float]:
        """The factors this request measured and still holds evidence for, worth at least its start (what
        it passes on to later requests; a mode that ran early and idled since has faded back to where it
        started, and passed on as measured it would skip the drift back towards 1: priors.py)."""
        return {mode: self[mode] for mode in self.measured if self._evidence.get(mode, (0.0, 0.0))[0] >= START_TOKENS}
