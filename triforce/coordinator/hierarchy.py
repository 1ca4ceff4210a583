"""Which tiers each mode stacks, cheapest first, and how their caches are sized.

| mode      | tiers                                                       | gammas           | tree (if > 0) |
|-----------|-------------------------------------------------------------|------------------|---------------|
| triforce  | draft + StreamingKVCache, target + RetrievalKVCache, target | gamma1, gamma2   | tree1         |
|           |                                                             | (or rounds2)     |               |
| retrieval | target + RetrievalKVCache, target                           | gamma2           | tree2         |
| draft     | draft + StreamingKVCache, target (the paper's naive policy) | gamma1           | tree1         |
| ar        | target + FullKVCache (plain decoding, the baseline)         |                  |               |
| auto      | any of the above, picked and re-picked by a cost model; the | picked           |               |
|           | retrieval budget too, among auto_budgets                    |                  |               |

A tree replaces the bottom tier's chain of gamma tokens: the bottom tier grows a tree of up to that many
nodes and the tier above checks it in one forward.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..cache.full import QUERY_ROWS
from ..cache.retrieval import RetrievalKVCache, selects_chunks
from ..cache.streaming import VIEW_ROWS, StreamingKVCache
from ..config import MAX_TREE, MODES_WITH_RETRIEVAL, ConfigError, EngineConfig, runs_tier
from ..models.config import ModelConfig
from ..models.cuda_graphs import MAX_TOKENS as GRAPH_TOKENS
from ..models.cuda_graphs import forwards_bytes
from ..models.llama import LlamaModel
from .auto import AutoEngine
from .batchmates import Batchmates
from .confident_trees import ConfidenceShaper
from .engine import FORCED_LAG, HierarchyEngine
from .planning import MAX_GAMMA, AutoPlanner
from .priors import Priors
from .speed_model import SELF_DRAFT_TIER, retrieval_name
from .tiers import RetrievalTier, Tier
from .trees import TreeShaper
from .verifier import LocalVerifier, Verifier

if TYPE_CHECKING:
    from ..cache.prefixes import PrefixStore

AUTO_BUDGET_FACTORS = (1, 2, 4)


def auto_budgets(cfg: EngineConfig) -> list[int]:
    """The budgets mode auto chooses among, a retrieval tier for each (planning.py scores each once the
    context is twice it): the configured one and AUTO_BUDGET_FACTORS times it. A quarter of the context
    paid best at 8K and at 32K (SmolLM2 + yarn:4 on the AMX Xeon, docs/cli.md: Longer contexts)."""
    return [cfg.budget * factor for factor in AUTO_BUDGET_FACTORS]


def speculation_slack(cfg: EngineConfig) -> int:
    """Most tokens any cache may hold beyond the committed sequence during one target check (and those a
    structured output's constraint forced, which the tiers above the bottom take without a forward)."""
    if cfg.mode == "auto":  # gammas up to MAX_GAMMA, or the user's where larger (the planner prefers them)
        return max(MAX_GAMMA, cfg.gamma1) + max(MAX_GAMMA, cfg.gamma2) + 4 + FORCED_LAG
    tree1, tree2 = (MAX_TREE if t == "auto" else t for t in (cfg.tree1, cfg.tree2))
    tier2 = cfg.gamma2
    if cfg.mode == "triforce" and cfg.rounds2:  # each tier-2 check makes up to a proposal's tokens + 1 (the
        # config keeps it within 256, so the slack within the RoPE table's margin)
        tier2 = cfg.rounds2 * (max(cfg.gamma1, tree1) + 1)
    return cfg.gamma1 + tier2 + tree1 + tree2 + 4 + FORCED_LAG


def check_draft_window(cfg: EngineConfig, draft: ModelConfig) -> None:
    """The draft sees distances up to sinks + window + the tokens of one forward; prefill chunks no longer
    than the window keep that within the positions it was trained on. A ConfigError where they do not fit
    (LLM checks it as it loads, so that no request is taken that every one would fail)."""
    chunk, slack = min(cfg.prefill_chunk, cfg.window), speculation_slack(cfg)
    if cfg.sinks + cfg.window + max(chunk, slack) > draft.max_positions:
        raise ConfigError(f"draft attends over sinks + window = {cfg.sinks + cfg.window} tokens plus "
                          f"{max(chunk, slack)} new ones, past its {draft.max_positions} positions")


# Float32 rows of the vocabulary a request holds at most, per token a check of the tiers above the bottom
# holds: each checker's logits and its distributions, and the proposals' distributions it checks them
# against. Counted (tests/coordinator/test_cache_bytes.py): up to 94 rows for a tiny triforce request's
# 22 tokens of slack, where this gives 142.
ROWS_PER_CHECKED_TOKEN = 3
# And per token of a prompt chunk it scores (prompt_logprobs): the chunk's logits and what scoring them
# holds beside (logprobs.py: token_logprobs, a row at a time; over the whole chunk, before 2026-12-05,
# logsumexp's temporary of its size, two before torch 2.x), counted as three.
ROWS_PER_SCORED_TOKEN = 3


def cache_bytes(cfg: EngineConfig, target: ModelConfig, draft: ModelConfig | None, tokens: int,
                itemsize: int, remote: bool = False, scored_rows: int = 0, rows_here: bool = True,
                graphs: bool = False) -> int:
    """What one request holds for `tokens` (prompt + new tokens) in the tiers its mode stacks: the target's
    full KV cache, its chunk means and its queries of a forward's last QUERY_ROWS rows (what a retrieval
    rebuild scores with; twice in mode auto, whose cost measurement keeps them aside), unless `remote`, where
    a worker group holds them (it checks its own memory); the retrieval tier's buffers and a rebuild's copy
    beside them (retrieval_bytes, rebuild_bytes); the draft's sinks, its recent tokens' double buffer and the
    fused layer loop's copy of sinks and window; and its rows of the vocabulary (row_bytes; `scored_rows`: the
    rows of a prompt chunk it scores), or where they are kept elsewhere (`rows_here` False: a GPU's go to the
    host) those of a forward in flight; with `graphs` (the target's forwards as CUDA graphs), its static
    forwards' buffers (graph_bytes). Small per-request state beside these is left out: positions, RoPE
    angles."""
    slack = speculation_slack(cfg)
    per_token = target.kv_bytes_per_token(itemsize)
    capacity = tokens + slack
    total = row_bytes(cfg, target, draft, scored_rows, kept=rows_here)
    if graphs:
        total += graph_bytes(cfg, target, capacity, itemsize)
    if not remote:
        queries = target.num_layers * target.num_heads * min(QUERY_ROWS, capacity) * target.head_dim * itemsize
        total += per_token * capacity + queries * (2 if cfg.mode == "auto" else 1)
        budgets = auto_budgets(cfg) if cfg.mode == "auto" else [cfg.budget]
        if cfg.mode in MODES_WITH_RETRIEVAL and (
                cfg.retrieval_policy == "dynamic" or any(selects_chunks(capacity, b, cfg.chunk_size) for b in budgets)):
            total += per_token // 2 * (capacity // cfg.chunk_size)  # mean keys of every chunk
    total += retrieval_bytes(cfg, target, capacity, itemsize, remote)
    total += rebuild_bytes(cfg, target, capacity, itemsize, remote)
    drafts = [draft] if runs_tier(cfg.mode, "draft", draft is not None) else []
    for model in drafts + ([target] if cfg.auto_self_draft and cfg.mode == "auto" else []):  # (SELF_DRAFT_TIER)
        # a double buffer of recent tokens, and the fused loop's copy of sinks and window (bfloat16 CPUs)
        total += model.kv_bytes_per_token(itemsize) * (cfg.sinks + 2 * (cfg.window + slack)
                                                       + cfg.sinks + cfg.window + VIEW_ROWS)
    return total


def graph_sizes(cfg: EngineConfig, prefill_chunk: int | None = None) -> list[int]:
    """The token counts of the target's StaticForwards a request may make (models/cuda_graphs.py: one per count
    of up to GRAPH_TOKENS over its full cache), each as large as it may be: every size a step or a check may
    take, and the prompt's prefill chunks of up to GRAPH_TOKENS (its last, of any size up to the chunk's; and
    every one, where the chunk is that small; a scored prompt's too) where they pass those. `prefill_chunk`:
    the chunk the target prefills in, if not cfg's (a worker group's block)."""
    prefill_chunk = prefill_chunk or cfg.prefill_chunk
    checks = min(speculation_slack(cfg) + 1, GRAPH_TOKENS)
    chunk = min(prefill_chunk, GRAPH_TOKENS)
    prompt = [] if chunk <= checks else [chunk] * (1 if prefill_chunk > GRAPH_TOKENS else 2)
    return list(range(1, checks + 1)) + prompt


def graph_bytes(cfg: EngineConfig, target: ModelConfig, capacity: int, itemsize: int) -> int:
    """The buffers of the StaticForwards of graph_sizes over a request's full cache of `capacity` (the
    graphs' own memory pool is left out)."""
    return forwards_bytes(target, capacity, graph_sizes(cfg), itemsize)


def retrieval_bytes(cfg: EngineConfig, target: ModelConfig, capacity: int, itemsize: int, remote: bool) -> int:
    """The static retrieval caches' buffers for a target cache of `capacity` tokens: per layer, the chunks
    chosen (the budget and a chunk) or every token, with room for tokens until the next rebuild. A layer
    kept whole (the `full_layers`, and every layer while the context does not pass the budget and a chunk:
    cache/retrieval.py, selects_chunks) is read in place beside a full cache in this process, and copied from
    a worker group (`remote`). Mode auto runs one of its budgets' caches and releases the others while idle,
    but measuring an idle one's cost builds it beside the running one: the two largest. The dynamic policy
    reads the full cache in place (this process only)."""
    room = cfg.refresh_every + speculation_slack(cfg)
    sizes = [copied + per_token * room for copied, per_token in _retrieved(cfg, target, capacity, itemsize, remote)]
    return sum(sorted(sizes)[-2:])


def rebuild_bytes(cfg: EngineConfig, target: ModelConfig, capacity: int, itemsize: int, remote: bool) -> int:
    """What a static rebuild holds beside the buffers it fills: the KV it retrieved (from a worker group every
    layer's, in this process the chunks gathered), one rebuild at a time."""
    return max((copied for copied, _ in _retrieved(cfg, target, capacity, itemsize, remote)), default=0)


def _retrieved(cfg: EngineConfig, target: ModelConfig, capacity: int, itemsize: int,
               remote: bool) -> list[tuple[int, int]]:
    """Per budget of the static policy (mode auto's each; none in modes without a retrieval tier): the bytes
    a rebuild copies, and the bytes a token takes in the layers it copies into (each keeps room for tokens
    until the next rebuild on top)."""
    if cfg.retrieval_policy != "static" or cfg.mode not in MODES_WITH_RETRIEVAL:
        return []
    per_layer = target.kv_bytes_per_token(itemsize) // target.num_layers
    whole = min(cfg.full_layers, target.num_layers)
    out = []
    for budget in (auto_budgets(cfg) if cfg.mode == "auto" else [cfg.budget]):
        kept = whole if selects_chunks(capacity, budget, cfg.chunk_size) else target.num_layers  # every token
        chosen = target.num_layers - kept  # layers of the budget's chunks
        copied = chosen * (budget + cfg.chunk_size) + (kept * capacity if remote else 0)
        out.append((per_layer * copied, per_layer * (chosen + (kept if remote else 0))))
    return out


def row_bytes(cfg: EngineConfig, target: ModelConfig, draft: ModelConfig | None, scored_rows: int = 0,
              kept: bool = True) -> int:
    """The float32 rows of the vocabulary a request holds at most: while its tiers check each other
    (ROWS_PER_CHECKED_TOKEN per token of a check, for each checking tier, and a plain step's few), or
    before, while the target scores a prompt chunk of `scored_rows` tokens (ROWS_PER_SCORED_TOKEN each).
    kept False: only a forward's rows in flight where the tiers keep theirs elsewhere (a GPU's logits go
    to the host, tiers.py): its float32 logits and the model's output they were cast from."""
    checkers = {"ar": 0, "draft": 1, "retrieval": 1}.get(cfg.mode, 2 if draft is not None else 1)
    if not kept:
        return 8 * target.vocab_size * max(speculation_slack(cfg) + 1, scored_rows)
    rows = ROWS_PER_CHECKED_TOKEN * checkers * (speculation_slack(cfg) + 1) + 4
    return 4 * target.vocab_size * max(rows, ROWS_PER_SCORED_TOKEN * scored_rows)


def build_engine(cfg: EngineConfig, target: LlamaModel, draft: LlamaModel | None, max_length: int,
                 verifier: Verifier | None = None, batchmates: Batchmates | None = None,
                 prefixes: PrefixStore | None = None, retrieval_model: LlamaModel | None = None) -> HierarchyEngine:
    """max_length: prompt + max_new_tokens. `verifier` defaults to an in-process one, which reuses the
    prompt blocks `prefixes` holds. `batchmates`: the requests run together with this one (mode auto plans
    for the batch). `retrieval_model`: the retrieval tier's weights (default the target's; an int8 twin,
    models/quantized.py), which with cfg.auto_self_draft mode auto's second draft tier runs too
    (SELF_DRAFT_TIER: the target's own weights over a streaming cache, beside the draft model's)."""
    slack = speculation_slack(cfg)
    retrieval_model = target if retrieval_model is None else retrieval_model
    for tier, model in (("retrieval", retrieval_model), ("draft", draft)):
        setting = f"{tier}_weights"
        if runs_tier(cfg.mode, tier, draft is not None) and getattr(cfg, setting) != "auto" and \
                (getattr(cfg, setting) == "int8") != (getattr(model, "quantized", None) == "int8"):
            raise ValueError(f"{setting} {getattr(cfg, setting)!r} does not match the model given for that tier "
                             "(int8 weights need its int8 twin, models/quantized.py, which LLM makes)")
    if verifier is None:
        verifier = LocalVerifier(target, max_length + slack, cfg.prefill_chunk, prefixes)

    def draft_tier(model: LlamaModel | None = draft, name: str = "draft") -> Tier:
        if model is None:
            raise ValueError(f"mode {cfg.mode!r} needs a draft model")
        check_draft_window(cfg, model.config)
        # Its keys are rotated at their positions in the text: the table covers them all before the first
        # forward (it does not grow beneath a forward, nor under a CUDA graph that holds its address).
        chunk = min(cfg.prefill_chunk, cfg.window)
        model.rope.reach(max_length + slack)
        cache = StreamingKVCache(model.config, cfg.sinks, cfg.window, slack, model.rope, model.dtype, model.device)
        return Tier(name, model, cache, chunk)

    def retrieval_tier(budget: int = cfg.budget) -> Tier:
        cache = RetrievalKVCache(verifier.kv_source(), budget, cfg.chunk_size, cfg.retrieval_policy,
                                 cfg.full_layers, cfg.refresh_every, max_speculative=slack)
        return RetrievalTier(retrieval_model, cache, cfg.refresh_threshold, cfg.refresh_window,
                             retrieval_name(budget, cfg.budget))

    def shaper(nodes: int | str, gamma: int, cap: int = MAX_TREE) -> TreeShaper | ConfidenceShaper | None:
        """The bottom tier's tree policy (None: chains of gamma); an auto size holds at most `cap` nodes."""
        if not nodes:
            return None
        if cfg.tree_shape == "confidence":
            return ConfidenceShaper(min(cap, MAX_TREE) if nodes == "auto" else nodes, spine=gamma)
        return TreeShaper(nodes, cap)

    if cfg.mode == "auto":
        ladder = [draft_tier()] if draft is not None else []
        ladder += [draft_tier(retrieval_model, SELF_DRAFT_TIER)] if cfg.auto_self_draft else []
        ladder += [retrieval_tier(budget) for budget in auto_budgets(cfg)] + [verifier]
        return AutoEngine(ladder, AutoPlanner({t.name: t for t in ladder}, cfg.budget, priors=Priors.default(),
                                              batchmates=batchmates, fixed_stop=cfg.stop_below,
                                              preferred_gammas=(cfg.gamma1, cfg.gamma2)), cfg.lookup_n)
    stop_below = cfg.stop_below or 0.0  # the fixed modes' (None: 0)
    if cfg.mode == "ar":
        return HierarchyEngine([verifier], [])
    if cfg.mode == "draft":
        return HierarchyEngine([draft_tier(), verifier], [cfg.gamma1], shaper(cfg.tree1, cfg.gamma1, cfg.window),
                               cfg.lookup_n, stop_below)
    if cfg.mode == "retrieval":
        return HierarchyEngine([retrieval_tier(), verifier], [cfg.gamma2], shaper(cfg.tree2, cfg.gamma2),
                               cfg.lookup_n, stop_below)
    return HierarchyEngine([draft_tier(), retrieval_tier(), verifier], [cfg.gamma1, cfg.gamma2],
                           shaper(cfg.tree1, cfg.gamma1, cfg.window), cfg.lookup_n, stop_below, cfg.rounds2)
