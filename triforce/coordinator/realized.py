"""What the cost model leaves out, per mode (mode auto; planning.py's docstring): the speed a mode really
reached over the rounds it ran, against what the model predicted for those rounds at the acceptance their
own checks saw. A mode's later predictions are scaled by that factor."""
from __future__ import annotations

RATE_SMOOTHING = 0.5  # weight of each stretch of rounds in a mode's realized / predicted speed


class RealizedSpeed(dict):
    """Per mode: tokens/s reached / tokens/s predicted. `measured`: the modes this request measured itself
    (the others' factors came from earlier requests: priors.py)."""

    def __init__(self):
        super().__init__()
        self.measured: set[str] = set()

    def observe(self, mode: str, ratio: float) -> None:
        """`mode` ran at `ratio` of its prediction over its last stretch."""
        old = self.get(mode)
        self[mode] = ratio if old is None else (1 - RATE_SMOOTHING) * old + RATE_SMOOTHING * ratio
        self.measured.add(mode)

    def fade(self, running: str | None, kept: float) -> None:
        """Each idle mode's factor moves back towards 1, keeping `kept` of its distance (alone: in a batch
        the factors carry the unmeasured overhead between forwards, which does not fade, and the planner
        does not call this)."""
        for mode, ratio in self.items():
            if mode != running:
                self[mode] = 1 + (ratio - 1) * kept

    def factor(self, mode: str, together: bool) -> float:
        """How a mode's speed compares with its prediction: measured where it ran; else, for a speculative
        mode, the mean of the speculative modes that ran (verification's overhead is the best guess at its
        own, and favours no mode untried); with none run, 1 alone, but run `together` with batchmates
        `ar`'s where that is below 1 (the unmeasured overhead that slows a batch's round of plain decoding
        slows a speculative one too: at batch 2 on the AVX2 EPYC `ar` ran at 0.82 of its model, and an
        untried mode kept at 1 was tried on that margin alone; alone, where that overhead is measured per
        tier, `ar`'s factor is its own, and taking it moved 8K greedy there from `draft` to a 0.81x
        detour); for `ar`, which verifies nothing, 1."""
        if mode in self:
            return self[mode]
        seen = [x for m, x in self.items() if m != "ar"]
        if mode == "ar" or not (seen or together):
            return 1.0
        return sum(seen) / len(seen) if seen else min(1.0, self.get("ar", 1.0))

    def own(self) -> dict[str, float]:
        """The factors this request measured (what it passes on to later requests)."""
        return {mode: self[mode] for mode in self.measured}
