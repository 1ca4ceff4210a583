"""Frozen, validated settings of the engine (EngineConfig), and what every setting's check shares. The CLI and
the Python API both map their arguments onto these; a request's own are sampling_params.py's."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .errors import UserError

PREFILL_CHUNK = 512  # prompt tokens per prefill forward: also the unit of the prefix stores and the workers' blocks

MODES = ("auto", "triforce", "retrieval", "draft", "ar")
RETRIEVAL_POLICIES = ("static", "dynamic")
# A proposing tier's weights: its model's own, an int8 copy, or whichever a forward runs faster on this machine
RETRIEVAL_WEIGHTS = ("auto", "target", "int8")  # the retrieval tier's (its model: the target)
DRAFT_WEIGHTS = ("auto", "draft", "int8")  # the draft tier's
OWN_WEIGHTS = {"retrieval": "target", "draft": "draft"}  # per tier, the setting that names its model's own
TREE_SHAPES = ("sequoia", "confidence")  # coordinator/trees.py, coordinator/confident_trees.py
MAX_TREE = 64  # nodes per speculation tree
MODES_WITH_DRAFT = ("auto", "triforce", "draft")  # auto runs without one too (then without the draft tier)
MODES_WITH_RETRIEVAL = ("auto", "triforce", "retrieval")
PROPOSAL_TREE = {"draft": "tree1", "triforce": "tree1", "retrieval": "tree2"}  # the tree setting of each mode's bottom tier
# The settings of one tier, and the fixed modes that run without it (mode auto may run any)
DRAFT_TIER = ("gamma1", "sinks", "window", "draft_weights")
RETRIEVAL_TIER = ("gamma2", "budget", "chunk_size", "retrieval_policy", "full_layers", "refresh_every",
                  "refresh_threshold", "refresh_window", "retrieval_weights")
IGNORED_BY = {"ar": DRAFT_TIER + RETRIEVAL_TIER, "retrieval": DRAFT_TIER, "draft": RETRIEVAL_TIER}
MAX_ROUNDS = 16  # tier-2 checks per target check (rounds2)
GAMMA2 = 6  # the paper's
MAX_LOOKUP = 16  # tokens a prompt lookup matches
DEFAULT_LOOKUP = 3  # the prompt lookup's n when none is given (docs/draft.md, Prompt lookup)
PREFIX_CACHE_GB = 1.0  # default bound of the recent prompts' target KV kept for reuse (cache/prefixes.py)


def runs_tier(mode: str, tier: str, draft: bool = True) -> bool:
    """Whether `mode` runs the proposing `tier`, "retrieval" or "draft" (the draft tier: given a draft model)."""
    return mode in MODES_WITH_RETRIEVAL if tier == "retrieval" else draft and mode in MODES_WITH_DRAFT


def sets_tier(name: str, value) -> bool:
    """Whether a draft or retrieval tier's setting at `value` asks something of the tier (a mode without the
    tier would ignore it): away from its default, and not a tier's own weights (what modes without the tier
    run anyway: "target" in mode ar, say)."""
    return value != getattr(EngineConfig, name) and not (name.endswith("_weights") and value != "int8")


class ConfigError(UserError):
    """A setting outside its valid range; the message names the setting."""


def is_integer(value) -> bool:
    """An integer: Python's or numpy's (not a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def shown(value) -> str:
    """`value` for an error message: its repr, cut to 200 characters; an integer past what Python prints
    (4,300 digits: formatting the message raised ValueError) by its size."""
    try:
        text = repr(value)
    except ValueError:  # an integer past what Python prints, alone or inside a list
        if isinstance(value, numbers.Integral):
            return f"an integer of about {int(abs(int(value)).bit_length() * math.log10(2)):,} digits"
        return f"a {type(value).__name__} holding an integer too long to print"
    return text if len(text) <= 200 else text[:200] + "..."


def check_prefix_cache(prefix_cache_gb, prefix_caching: bool) -> None:
    """The prefix store's bound (GB of recent prompts' target KV kept for reuse) and vLLM's switch for it:
    a number >= 0, and not both a bound and the switch off (one of the two would be ignored)."""
    if not is_number(prefix_cache_gb) or not 0 <= prefix_cache_gb < float("inf"):
        raise ConfigError(f"prefix_cache_gb must be a number >= 0 (got {shown(prefix_cache_gb)})")
    if not prefix_caching and prefix_cache_gb not in (0, PREFIX_CACHE_GB):
        raise ConfigError(f"enable_prefix_caching=False keeps no prompts for reuse, and prefix_cache_gb "
                          f"{prefix_cache_gb:g} bounds the store that keeps them: give one of the two")


def is_number(value) -> bool:
    """A finite real number: Python's or numpy's (not a bool, not a string, not an integer past a float's
    range, on which math.isfinite raised OverflowError)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class EngineConfig:
    """How the hierarchy is built. Defaults: the paper's gamma2, chunk size and sinks; gamma1, the budget,
    the retrieval policy and full_layers were picked by `triforce bench` on SmolLM2 (docs/defaults.md)."""
    mode: str = "auto"  # auto: the tiers and gammas a cost model picks per request (coordinator/auto.py)
    gamma1: int = 4  # tier-1 (draft) proposals per tier-2 check (docs/defaults.md)
    gamma2: int = GAMMA2  # tier-2 tokens per tier-3 (target) check: the least (it takes all of tier 2's rounds)
    # mode triforce: n > 0, the target checks what n tier-2 checks made (gamma2 unused; every sequence of a
    # batch then makes the same forwards, none waiting on a batchmate's extra rounds: docs/batches.md); 0: gamma2
    rounds2: int = 0
    budget: int = 2048  # tokens the retrieval cache holds
    chunk_size: int = 8
    retrieval_policy: str = "static"
    full_layers: int = 2  # first layers that keep their whole cache in the retrieval tier
    refresh_every: int = 512  # static policy: rebuild after this many new tokens
    refresh_threshold: float = 0.6  # static policy: rebuild when tier-2 acceptance falls below this...
    refresh_window: int = 32  # ...over this many recent tier-1 proposals
    # "int8": the retrieval tier reads an int8 copy of the target's layer matrices and output head
    # (models/quantized.py: half the bytes per forward, on a CPU); "target": the target's own weights; "auto":
    # the int8 copy where a forward of it is measured faster on this machine (coordinator/proposer_weights.py).
    # Exact either way: the target checks.
    retrieval_weights: str = "auto"
    # Proposals of the bottom tier as a token tree of up to this many nodes; 0: a chain of gamma; "auto": the
    # size with the most expected tokens per second for the forward costs measured on this machine.
    tree1: int | str = 0  # the draft's, to tier 2 (or to the target in `draft` mode)
    tree2: int | str = 0  # tier 2's to the target, in `retrieval` mode
    # How trees are shaped: "sequoia", before each check from positional acceptance rates; "confidence", as
    # they grow, by the proposer's confidence at each node and what a node costs (a chain of the mode's gamma,
    # then the nodes that pay; up to tree1 / tree2 nodes, "auto": MAX_TREE).
    tree_shape: str = "sequoia"
    sinks: int = 16  # draft tier: attention-sink tokens
    window: int = 256  # draft tier: recent tokens
    draft_weights: str = "auto"  # draft tier: "draft", "int8" or "auto", as retrieval_weights
    # mode auto: also a second draft tier, the target's own weights (the retrieval tier's: its own or the int8
    # twin) over a streaming cache of sinks + window ("draft@self"), which the planner picks between the
    # draft model's and it by their measured costs and acceptance (coordinator/planning.py)
    auto_self_draft: bool = False
    prefill_chunk: int = PREFILL_CHUNK
    # Prompt lookup (speculation/lookup.py): n > 0 mixes, into the bottom tier's proposals (chains and trees),
    # the token that followed the latest earlier occurrence of the last n tokens; 0: off; None: DEFAULT_LOOKUP.
    lookup: int | None = None
    # HierarchyEngine._produce: P > 0 ends the bottom tier's chain early after a proposal whose model gave its
    # top token less than probability P; 0: chains of gamma always; None: in mode auto the planner's choice
    # (AutoPlanner._stop_below: on for the draft's chains where checks grow steeply with their tokens), 0 in
    # the fixed modes.
    stop_below: float | None = None

    def __post_init__(self):
        for name in ("gamma1", "gamma2", "rounds2", "budget", "chunk_size", "full_layers", "refresh_every",
                     "refresh_window", "sinks", "window", "prefill_chunk", "lookup"):
            value = getattr(self, name)
            if not (is_integer(value) or (name == "lookup" and value is None)):
                raise ConfigError(f"{name} must be an integer (got {value!r})")
        for name in ("refresh_threshold", "stop_below"):
            value = getattr(self, name)
            if not (is_number(value) or (name == "stop_below" and value is None)):
                raise ConfigError(f"{name} must be a number (got {value!r})")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)} (got {self.mode!r})")
        if not isinstance(self.auto_self_draft, bool):
            raise ConfigError(f"auto_self_draft must be True or False (got {self.auto_self_draft!r})")
        if self.gamma1 < 1 or self.gamma2 < 1:
            raise ConfigError(f"gamma1 and gamma2 must be >= 1 (got {self.gamma1}, {self.gamma2})")
        if self.gamma1 + self.gamma2 > 128:
            raise ConfigError(f"gamma1 + gamma2 must be <= 128 (got {self.gamma1 + self.gamma2})")
        for name in ("tree1", "tree2"):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().isdecimal():
                object.__setattr__(self, name, value := int(value))
            if value != "auto" and not (is_integer(value) and 0 <= value <= MAX_TREE):
                raise ConfigError(f"{name} must be 'auto' or a node count in [0, {MAX_TREE}] (got {value!r})")
            if value != "auto":
                object.__setattr__(self, name, int(value))  # (numpy's integers: the checks below ask for an int)
        if not 0 <= self.rounds2 <= MAX_ROUNDS:
            raise ConfigError(f"rounds2 must be in [0, {MAX_ROUNDS}] (got {self.rounds2})")
        proposal = max(self.gamma1, MAX_TREE if self.tree1 == "auto" else self.tree1)
        if self.mode == "triforce" and self.rounds2 * (proposal + 1) > 256:
            raise ConfigError(f"rounds2 x (the draft's largest proposal + 1) must be <= 256: a target check holds "
                              f"up to that many tokens (got rounds2 {self.rounds2}, proposals of up to {proposal})")
        if self.mode == "triforce" and self.rounds2 and self.gamma2 != GAMMA2:
            raise ConfigError(f"gamma2 {self.gamma2} is unused while rounds2 ({self.rounds2}) sets what a target "
                              "check holds: the tokens of that many tier-2 checks; set rounds2 to 0 for a target "
                              "check of at least gamma2 tokens")
        if self.tree_shape not in TREE_SHAPES:
            raise ConfigError(f"tree_shape must be one of {', '.join(TREE_SHAPES)} (got {self.tree_shape!r})")
        if (self.tree1 or self.tree2) and self.mode == "auto":
            raise ConfigError("tree1 and tree2 take a fixed mode (triforce, retrieval or draft); mode auto plans "
                              "chains (trees did not beat chains that take every token; docs/trees.md)")
        if isinstance(self.tree1, int) and self.tree1 > self.window and self.mode in ("draft", "triforce"):
            raise ConfigError(f"tree1 ({self.tree1} nodes) must fit the draft's streaming window ({self.window} "
                              "tokens): a tree's nodes attend to each other there")
        if self.tree2 and self.mode == "triforce":
            raise ConfigError("tree2 (tier 2's tree to the target) runs in `retrieval` mode only; in `triforce` "
                              "mode tier 2 hands the target a chain of at least gamma2 tokens (the target accepts most of them, so "
                              "siblings would cost more rows than they add; docs/trees.md)")
        if self.chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1 (got {self.chunk_size})")
        if self.budget < 2 * self.chunk_size or self.budget % self.chunk_size:
            raise ConfigError(f"budget ({self.budget}) must be a multiple of the chunk size ({self.chunk_size}), "
                              "at least two chunks: the first chunk (the attention sink) and the latest are "
                              "always kept")
        if self.retrieval_policy not in RETRIEVAL_POLICIES:
            raise ConfigError(f"retrieval_policy must be one of {RETRIEVAL_POLICIES} "
                              f"(got {self.retrieval_policy!r})")
        for name, kinds in (("retrieval_weights", RETRIEVAL_WEIGHTS), ("draft_weights", DRAFT_WEIGHTS)):
            if getattr(self, name) not in kinds:
                raise ConfigError(f"{name} must be one of {kinds} (got {getattr(self, name)!r})")
        if self.lookup is not None and not 0 <= self.lookup <= MAX_LOOKUP:
            raise ConfigError(f"lookup must be an n-gram length in [0, {MAX_LOOKUP}] (0: off; got {self.lookup})")
        if self.stop_below is not None and not 0 <= self.stop_below < 1:
            raise ConfigError(f"stop_below must be a probability in [0, 1) (0: off; got {self.stop_below!r})")
        if self.stop_below and self.proposal_tree:
            raise ConfigError("stop_below ends chains early; this mode's proposals are a tree, which the tree's "
                              "own shape bounds: leave one of them at 0")
        for name, lowest in (("full_layers", 0), ("sinks", 0), ("window", 1), ("prefill_chunk", 1),
                             ("refresh_every", 1), ("refresh_window", 1)):
            if getattr(self, name) < lowest:
                raise ConfigError(f"{name} must be >= {lowest} (got {getattr(self, name)})")
        if not 0 <= self.refresh_threshold <= 1:
            raise ConfigError(f"refresh_threshold must be in [0, 1] (got {self.refresh_threshold})")

    def refuse_unused(self, draft=None) -> None:
        """A ConfigError for settings of a tier this mode does not run, which it would ignore without a word:
        a draft model given (`draft`: its name), tree1 or tree2, rounds2, a tree shape without a tree, stop_below
        or lookup without a proposer, a setting of the draft or retrieval tier set away from its default. LLM
        asks it of the settings it is given (the CLI's flags among them); the bench, whose runs share one
        config across modes, asks instead that some mode of its runs takes each (launch/bench_plan.py:
        check_tier_settings)."""
        if draft is not None and self.mode not in MODES_WITH_DRAFT:
            raise ConfigError(f"draft {draft} runs a tier that mode {self.mode} does not run: it takes mode "
                              f"{', '.join(MODES_WITH_DRAFT)}")
        if self.auto_self_draft and self.mode != "auto":
            raise ConfigError(f"auto_self_draft adds a draft tier for mode auto to choose; mode {self.mode} does not "
                              "choose (--draft self runs the target as the draft in any mode with one)")
        if self.rounds2 and self.mode != "triforce":
            raise ConfigError(f"rounds2 sets how many tier-2 checks a target check holds in mode triforce; mode "
                              f"{self.mode} does not take it (auto checks by tokens)")
        for name in ("tree1", "tree2"):
            if getattr(self, name) and PROPOSAL_TREE.get(self.mode) != name:
                takes = " or ".join(mode for mode, tree in PROPOSAL_TREE.items() if tree == name)
                raise ConfigError(f"{name} shapes a tier that mode {self.mode} does not run: it takes mode {takes}")
        if self.tree_shape != TREE_SHAPES[0] and not self.proposal_tree:
            tree = PROPOSAL_TREE.get(self.mode)
            raise ConfigError(f"tree_shape {self.tree_shape!r} shapes token trees, and mode {self.mode} proposes "
                              + (f"chains unless {tree} is set" if tree else "no trees (modes triforce, retrieval "
                                 "and draft do, with tree1 or tree2)"))
        for name in ("stop_below", "lookup"):
            if getattr(self, name) and self.mode == "ar":
                raise ConfigError(f"{name} shapes a proposer's chains, and mode ar runs the target alone")
        for name in IGNORED_BY.get(self.mode, ()):
            if sets_tier(name, getattr(self, name)):
                tier = "draft" if name in DRAFT_TIER else "retrieval"
                raise ConfigError(f"{name} sets the {tier} tier, which mode {self.mode} does not run: leave it out, "
                                  f"or run a mode with that tier")

    @property
    def proposal_tree(self) -> int | str:
        """The tree setting of this mode's bottom tier (0: it proposes chains)."""
        name = PROPOSAL_TREE.get(self.mode)
        return 0 if name is None else getattr(self, name)

    @property
    def lookup_n(self) -> int:
        """The prompt lookup's n-gram length in effect (0: off)."""
        return DEFAULT_LOOKUP if self.lookup is None else self.lookup


def __getattr__(name: str):
    """SamplingParams and StructuredOutputs lived here until 69cb54a moved them to sampling_params.py:
    `from triforce.config import SamplingParams` in code outside still finds them."""
    if name in ("SamplingParams", "StructuredOutputs"):
        from . import sampling_params

        return getattr(sampling_params, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
