"""Mode auto on a fixed script of plans, whatever the measured costs: exactness tests that must see every
switch of tiers (a planner that measures could keep a tiny model on plain decoding on a busy machine)."""
import math

from triforce.coordinator.costs import CostTable
from triforce.coordinator.planning import AutoPlanner
from triforce.coordinator.speed_model import Plan


class ScriptedPlanner(AutoPlanner):
    """Cycles through fixed (stack, gammas) plans; chains end early below `stop`."""

    def __init__(self, tiers, budget, script):
        super().__init__(tiers, budget, table=CostTable(None))
        self.script, self.calls, self.stop = script, 0, 0.0
        self.draft_upside = math.inf  # an idle draft is always worth watching, unless a test says otherwise
        self.watch = None  # (which idle drafts: None, every one)

    def plan(self, context, generated, busy=False, measure=True):
        stack, gammas = self.script[self.calls % len(self.script)]
        self.calls += 1
        plan = Plan(stack, gammas, 0.0, self.stop, self.draft_upside, self.watch)
        self.decisions.append({"at_token": generated, "mode": plan.mode})
        return plan


def follow_script(engine, budget, script):
    """Puts `engine` (mode auto) on `script`; returns it."""
    engine.planner = ScriptedPlanner({t.name: t for t in engine.ladder}, budget, script)
    return engine
