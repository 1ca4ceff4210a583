"""Planners of mode auto on given forward costs instead of measured ones, for tests of what they choose
(tests/coordinator/test_planning.py) and what they learn (tests/coordinator/test_planner_learning.py,
test_priors.py)."""
from triforce.coordinator.batchmates import Batchmates, power_of_two_below
from triforce.coordinator.costs import CostTable
from triforce.coordinator.planning import AutoPlanner
from triforce.coordinator.speed_model import seconds_per_token

FLAT = {n: 1.0 for n in (1, 2, 3, 4, 6, 9)}  # a check costs what one token does (a GPU, AMX tiles)


def draft_rate(costs: dict, gamma: int, alpha: float, row_seconds: float = 0.0) -> float:
    """Tokens/s the model gives `draft` mode at `gamma` and per-token acceptance `alpha`."""
    return 1 / seconds_per_token(("draft", "target"), (gamma,), costs, {"draft": alpha}, row_seconds)


def planner_with(costs: dict, budget: int = 100, priors=None) -> AutoPlanner:
    """A planner whose tiers (by the names in `costs`) cost what `costs` says, in seconds by tokens, starting
    from `priors` (priors.py) where given."""
    planner = AutoPlanner({name: None for name in costs}, budget, table=CostTable(None), priors=priors)
    planner.costs = lambda stacks, measure=True: costs
    planner._keys = {name: name for name in costs}  # (the table's entries: named by their tiers)
    return planner


class FixedBatch(Batchmates):
    """A batch of `n` prefilled requests, as far as a planner can tell."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def size(self, planner):
        return power_of_two_below(self.n)
