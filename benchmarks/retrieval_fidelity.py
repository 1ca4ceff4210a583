"""How close the retrieval tier's next-token distributions are to the target's, per way of choosing chunks.

    python benchmarks/retrieval_fidelity.py --text ../shared/data/austen-emma.txt --context 16000 \
        [--rope-scaling yarn:4] [--budgets 2048] [--full-layers 2] [--new 128] [--scorers mean quest oracle] [--int8]

SmolLM2 in bfloat16: the target prefills --context tokens of the text (its KV kept under /tmp between runs,
keyed by the arguments that shape it), then the static retrieval cache is built once from the last query, as
`rebuild` does, and both tiers read the next --new tokens of the text in one teacher-forced forward. Per
scorer, budget and full_layers: greedy agreement (the tier's argmax is the target's), the mean acceptance
of exact speculative sampling at temperature 1 and 0.6 (1 - total variation distance), and the share of the
last query's attention mass (softmax over the whole cache, mean over layers past full_layers and query heads)
that the chosen tokens hold. Scorers (chunk scores per KV head, summed over its group's query heads):
- mean: query . chunk mean key, the engine's (kernels/retrieval.py);
- quest: the upper bound sum_d max(q_d min_d, q_d max_d) over the chunk's per-channel key range (Quest,
  arXiv 2406.10774);
- softmax: per query head, a softmax over chunks of query . mean key / sqrt(D), then summed: each head
  weighs the same, where raw scores let a head with larger norms choose for its group;
- oracle: the attention mass each chunk holds for the last query (reads every key: an upper bound for
  one-query static selection, not a policy).
Prints JSON, one row per (scorer, budget, full_layers), then all of them with `rebuild_ms` where asked."""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import time

import torch

from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import LocalKVSource, RetrievalKVCache, retrieval_token_ids
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.quantized import int8_twin
from triforce.models.tokenizer import load_tokenizer
from triforce.step import Step


def chunk_scores(scorer: str, q: torch.Tensor, keys: torch.Tensor, chunk: int, scale: float) -> torch.Tensor:
    """q: [Hq, D] the last query; keys: [Hkv, C * chunk, D]. Returns [Hkv, C] scores (float32)."""
    hkv, s, d = keys.shape
    group = q.shape[0] // hkv
    qg = q.float().reshape(hkv, group, d)
    k = keys.float().reshape(hkv, s // chunk, chunk, d)
    if scorer == "mean":
        return torch.einsum("hd,hcd->hc", qg.sum(1), k.mean(2))
    if scorer == "quest":
        lo, hi = k.amin(2), k.amax(2)  # [Hkv, C, D]
        bound = torch.maximum(qg[:, :, None] * lo[:, None], qg[:, :, None] * hi[:, None])  # [Hkv, G, C, D]
        return bound.sum(-1).sum(1)
    if scorer == "softmax":
        return torch.softmax(torch.einsum("hgd,hcd->hgc", qg, k.mean(2)) * scale, dim=-1).sum(1)
    if scorer == "oracle":
        return token_mass(qg, keys, scale).reshape(hkv, group, s // chunk, chunk).sum(-1).sum(1)
    raise ValueError(scorer)


def token_mass(qg: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """qg: [Hkv, G, D]; keys [Hkv, S, D] -> each token's attention weight [Hkv, G, S]."""
    return torch.softmax(torch.einsum("hgd,hsd->hgs", qg.float(), keys.float()) * scale, dim=-1)


class ScoredSource(LocalKVSource):
    """The target's cache, chunks chosen by `scorer` (the engine's retrieve_from_full with another score)."""

    def __init__(self, full: FullKVCache, scorer: str, scale: float):
        super().__init__(full)
        self.scorer, self.scale, self.mass = scorer, scale, []

    def choose(self, budget, chunk_size, full_layers):
        full, total = self.full, self.full.length
        complete = total // chunk_size
        out, self.mass = [], []
        for layer, q in enumerate(full.last_query[full_layers:], start=full_layers):
            keys = full.keys[layer, :, :total]
            scores = chunk_scores(self.scorer, q, keys[:, :complete * chunk_size], chunk_size, self.scale)
            scores[:, 0] = scores[:, complete - 1] = float("inf")
            chosen = torch.topk(scores, budget // chunk_size, dim=1, sorted=False).indices
            ids = retrieval_token_ids(chosen, chunk_size, complete, total)
            weights = token_mass(q.reshape(keys.shape[0], -1, q.shape[-1]), keys, self.scale)
            self.mass.append(weights.gather(2, ids[:, None].expand(-1, weights.shape[1], -1)).sum(-1).mean().item())
            out.append(chosen)
        return torch.stack(out)


SCORERS = ("mean", "quest", "softmax", "oracle")


def refreshed(tier, model, full, cache, new, context, every):
    """The tier's (`tier`: the target's weights or its int8 twin) and the target's (`model`) logits of `new`,
    `every` tokens at a time: the tier reads a block, the
    target checks and commits it, the tier rebuilds from the last committed token's query (the engine's
    static policy with a rebuild after every check). The full cache is put back as it was."""
    cache.refresh_every = every - 1
    state = full.query_state()
    mine, theirs = [], []
    for i in range(0, len(new), every):
        block = new[i:i + every]
        mine.append(tier(Step.chain(block, context + i), cache).float())
        cache.rollback(len(block))
        theirs.append(model(Step.chain(block, context + i), full).float())
        cache.sync()
    full.rollback(len(new))
    full.restore_query_state(state)
    return torch.cat(mine), torch.cat(theirs)


def compare(scorer, budget, full_layers, logits, targets, source) -> dict:
    mass = getattr(source, "mass", [])
    row = {"scorer": scorer, "budget": budget, "full_layers": full_layers,
           "greedy_agreement": round((logits.argmax(-1) == targets.argmax(-1)).float().mean().item(), 3),
           "agreement_first16": round((logits[:16].argmax(-1) == targets[:16].argmax(-1)).float().mean().item(), 3),
           "attention_mass": round(sum(mass) / len(mass), 3) if mass else None}
    for t in (1.0, 0.6):
        row[f"acceptance_t{t}"] = round(acceptance(torch.softmax(targets / t, -1), torch.softmax(logits / t, -1)), 3)
    return row


def policy(scorer: str) -> str:
    return "dynamic" if scorer == "dynamic" else "static"


def acceptance(p: torch.Tensor, q: torch.Tensor) -> float:
    """Mean over rows of sum min(p, q): the chance exact speculative sampling accepts a proposal from q."""
    return torch.minimum(p, q).sum(-1).mean().item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True)
    p.add_argument("--context", type=int, default=16000)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--rope-scaling", default="yarn:4")
    p.add_argument("--budgets", type=int, nargs="+", default=[2048])
    p.add_argument("--full-layers", type=int, nargs="+", default=[2])
    p.add_argument("--chunk-size", type=int, default=8)
    p.add_argument("--scorers", nargs="+", default=["mean", "quest", "softmax", "oracle"])
    p.add_argument("--dynamic", action="store_true", help="also the dynamic policy, one token per forward")
    p.add_argument("--refresh", type=int, nargs="*", default=[],
                   help="also the static policy (mean scorer) rebuilt from the last committed token's query "
                        "every R tokens, the target committing each R as it checks them")
    p.add_argument("--int8", action="store_true",
                   help="the tier on the target's int8 twin (--retrieval-weights int8), beside its own weights")
    p.add_argument("--rebuild-timing", action="store_true",
                   help="also time a static rebuild (budgets[0]) after each of 30 commits of 4 random tokens")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    folder = resolve_model("smollm2")
    model = load_model(folder, "bfloat16", "cpu", rope_scaling=args.rope_scaling or None)
    tok = load_tokenizer(folder, model.config.vocab_size)
    with open(args.text, encoding="utf-8") as f:
        ids = tok(f.read()).input_ids[: args.context + args.new]
    prompt, new = ids[: args.context], ids[args.context:]
    full = FullKVCache(model.config, args.context + max(args.new, 120) + 64, model.dtype, "cpu")
    key = hashlib.sha256(f"{args.text}{args.context}{args.rope_scaling}".encode()).hexdigest()[:12]
    stored = f"/tmp/retrieval_fidelity_{key}.pt"
    if os.path.exists(stored):
        k, v = torch.load(stored)
        full.keys[:, :, : args.context - 1], full.values[:, :, : args.context - 1] = k, v
        full.length = args.context - 1
    else:
        for start in range(0, args.context - 1, 512):
            chunk = prompt[start: min(start + 512, args.context - 1)]
            model(Step.chain(chunk, start), full, logits_for="none")
        torch.save((full.keys[:, :, : args.context - 1].clone(), full.values[:, :, : args.context - 1].clone()), stored)
    model(Step.chain(prompt[-1:], args.context - 1), full, logits_for="none")  # the last query, as after a step
    scale = model.config.head_dim ** -0.5
    rows = []
    targets = None
    tiers = {"target": model, **({"int8": int8_twin(model)} if args.int8 else {})}
    for (weights, tier), scorer in itertools.product(tiers.items(), args.scorers + ["dynamic"] * args.dynamic
                                                     + [f"refresh:{r}" for r in args.refresh]):
        for budget in args.budgets:
            for full_layers in args.full_layers:
                source = ScoredSource(full, scorer, scale) if scorer in SCORERS else LocalKVSource(full)
                cache = RetrievalKVCache(source, budget, args.chunk_size, full_layers=full_layers,
                                         max_speculative=args.new + 1, policy=policy(scorer))
                cache.sync()
                if scorer.startswith("refresh:"):
                    logits, blocks = refreshed(tier, model, full, cache, new, args.context, int(scorer.split(":")[1]))
                    row = {"weights": weights, **compare(scorer, budget, full_layers, logits, blocks, source)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                if scorer == "dynamic":  # each token's forward chooses from its own query
                    logits = torch.cat([tier(Step.chain(new[i:i + 1], args.context + i), cache).float()
                                        for i in range(len(new))])
                else:
                    logits = tier(Step.chain(new, args.context), cache).float()
                cache.rollback(len(new))
                if targets is None:  # (its forward moves the last query: put back for the next build)
                    state = full.query_state()
                    targets = model(Step.chain(new, args.context), full).float()
                    full.rollback(len(new))
                    full.restore_query_state(state)
                row = {"weights": weights, **compare(scorer, budget, full_layers, logits, targets, source)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    report = {"context": args.context, "new": len(new), "rope_scaling": args.rope_scaling, "rows": rows}
    if args.rebuild_timing:
        report["rebuild_ms"] = rebuild_ms(model, full, args.budgets[0], args.chunk_size, args.full_layers[0])
    print(json.dumps(report))


def rebuild_ms(model, full, budget, chunk_size, full_layers, commits=30) -> dict:
    """Median and mean ms of sync + rebuild after the target commits 4 random tokens (what a rebuild after
    every check costs); the full cache is put back."""
    start, state = full.length, full.query_state()
    cache = RetrievalKVCache(LocalKVSource(full), budget, chunk_size, full_layers=full_layers,
                             refresh_every=64)  # (rebuilt by hand after every commit)
    cache.sync()
    tokens = torch.randint(0, model.config.vocab_size, (commits, 4), generator=torch.Generator().manual_seed(0))
    spent = []
    for row in tokens.tolist():
        model(Step.chain(row, full.length), full, logits_for="none")
        began = time.perf_counter()
        cache.sync()
        cache.rebuild()
        spent.append(time.perf_counter() - began)
    full.rollback(full.length - start)
    full.restore_query_state(state)
    return {"median": round(sorted(spent)[commits // 2] * 1e3, 1), "mean": round(sum(spent) / commits * 1e3, 1)}


if __name__ == "__main__":
    main()
